// A fake istiod for the tests: a REAL gRPC server (grpc-js, TLS, 127.0.0.1:0) serving delta ADS
// (DeltaAggregatedResources) and the CA (CreateCertificate). Each test scripts it turn by turn: wait for a
// stream, read its requests one by one, push responses; every request and its metadata is recorded.
//
//   const istiod = await startFakeIstiod({ dir });          // dir: certificates are written there
//   const s = await istiod.nextStream();                      // the daemon connected
//   await s.nextRequest(ADDRESS);                             // its initial Address request
//   const nonce = s.push(ADDRESS, { resources: [workloadResource({...})] });
//   const ack = await s.nextRequest(ADDRESS);                 // ack.responseNonce === nonce
//
// The server's certificate is for `istiod.istio-system.svc` and 127.0.0.1, signed by a root at `rootCaPath`.
// Certificates are signed with the built-in CA code (dist/native LocalCa: it accepts TTLs in seconds) under a
// root in `<dir>/ca`, unless a test replaces `istiod.signer`.
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { create, fromBinary, toBinary, toJson } from '@bufbuild/protobuf';
import { anyPack } from '@bufbuild/protobuf/wkt';
import * as grpc from '@grpc/grpc-js';
import {
  DeltaDiscoveryRequestSchema,
  DeltaDiscoveryResponseSchema,
} from '../../dist/gen/envoy/service/discovery/v3/discovery_pb.js';
import { IstioCertificateRequestSchema, IstioCertificateResponseSchema } from '../../dist/gen/istio/ca/ca_pb.js';
import { AuthorizationSchema } from '../../dist/gen/istio/security/authorization_pb.js';
import { AddressSchema, TunnelProtocol } from '../../dist/gen/istio/workload/workload_pb.js';

export const ADDRESS = 'type.googleapis.com/istio.workload.Address';
export const AUTHORIZATION = 'type.googleapis.com/istio.security.Authorization';
export const ISTIOD_HOSTNAME = 'istiod.istio-system.svc';

function openssl(args, cwd) {
  return execFileSync('openssl', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
}

/** A root and a server certificate for istiod (DNS istiod.istio-system.svc, IP 127.0.0.1). */
export function makeServerPki(dir) {
  mkdirSync(dir, { recursive: true });
  openssl(['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', 'root.key',
    '-out', 'root.pem', '-days', '2', '-subj', '/O=fake-istiod-root',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign'], dir);
  openssl(['req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', 'server.key',
    '-out', 'server.csr', '-subj', '/O=istiod'], dir);
  writeFileSync(join(dir, 'server.ext'), `subjectAltName=DNS:${ISTIOD_HOSTNAME},IP:127.0.0.1\nextendedKeyUsage=serverAuth\n`);
  openssl(['x509', '-req', '-in', 'server.csr', '-CA', 'root.pem', '-CAkey', 'root.key', '-set_serial', '7',
    '-days', '1', '-extfile', 'server.ext', '-out', 'server.pem'], dir);
  return {
    rootCaPath: join(dir, 'root.pem'),
    cert: readFileSync(join(dir, 'server.pem')),
    key: readFileSync(join(dir, 'server.key')),
    root: readFileSync(join(dir, 'root.pem')),
  };
}

/**
 * The env of a daemon fed only by `istiod` (xDS and CA over TLS, verified as ISTIOD_HOSTNAME), as node `node`,
 * with `extra` on top.
 */
export function istiodEnv(istiod, node, extra = {}) {
  return {
    LOCAL_XDS_PATH: undefined,
    XDS_ADDRESS: istiod.address,
    XDS_ROOT_CA: istiod.rootCaPath,
    CA_ADDRESS: istiod.address,
    CA_ROOT_CA: istiod.rootCaPath,
    ALT_XDS_HOSTNAME: ISTIOD_HOSTNAME,
    CLUSTER_ID: 'Kubernetes',
    INSTANCE_IP: node === 'node-a' ? '10.0.0.1' : '10.0.0.2',
    POD_NAME: `ztunnel-${node}`,
    POD_NAMESPACE: 'istio-system',
    ...extra,
  };
}

/** A queue whose `next(pred)` resolves with the first (past or future) item matching `pred`, once. */
class Inbox {
  constructor() {
    this.items = [];
    this.waiters = [];
  }
  put(item) {
    this.items.push(item);
    for (const w of [...this.waiters]) {
      if (!item.taken && w.pred(item.value)) {
        item.taken = true;
        this.waiters.splice(this.waiters.indexOf(w), 1);
        clearTimeout(w.timer);
        w.resolve(item.value);
      }
    }
  }
  next(pred = () => true, timeoutMs = 10_000, what = 'an item') {
    const found = this.items.find((i) => !i.taken && pred(i.value));
    if (found) {
      found.taken = true;
      return Promise.resolve(found.value);
    }
    return new Promise((resolve, reject) => {
      const w = { pred, resolve };
      w.timer = setTimeout(() => {
        this.waiters.splice(this.waiters.indexOf(w), 1);
        reject(new Error(`fake istiod: no ${what} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiters.push(w);
    });
  }
}

function metadataObject(md) {
  const out = {};
  for (const [k, v] of Object.entries(md.getMap())) out[k] = String(v);
  return out;
}

/** One DeltaAggregatedResources stream from a client. */
class AdsStream {
  constructor(call, index) {
    this.call = call;
    this.index = index;
    this.metadata = metadataObject(call.metadata);
    /** Every request, decoded to plain JSON-ish objects (proto3 JSON names). */
    this.requests = [];
    this.inbox = new Inbox();
    this.nonce = 0;
    this.ended = false;
    this.closed = new Promise((resolve) => call.on('close', resolve));
    call.on('data', (req) => {
      const r = {
        typeUrl: req.typeUrl,
        node: req.node ? { id: req.node.id, metadata: req.node.metadata ?? {} } : undefined,
        initialResourceVersions: { ...req.initialResourceVersions },
        resourceNamesSubscribe: [...req.resourceNamesSubscribe],
        resourceNamesUnsubscribe: [...req.resourceNamesUnsubscribe],
        responseNonce: req.responseNonce,
        errorDetail: req.errorDetail ? { code: req.errorDetail.code, message: req.errorDetail.message } : undefined,
        at: Date.now(),
      };
      this.requests.push(r);
      this.inbox.put({ value: r });
    });
    call.on('end', () => {
      this.ended = true;
      if (!call.destroyed) call.end();
    });
    call.on('error', () => undefined);
  }

  /** The next request of `typeUrl` (any type when omitted). */
  nextRequest(typeUrl, timeoutMs = 10_000) {
    return this.inbox.next((r) => typeUrl === undefined || r.typeUrl === typeUrl, timeoutMs, `request for ${typeUrl ?? 'any type'} on stream ${this.index}`);
  }

  /** Sends a DeltaDiscoveryResponse; `resources` are { name, version, resource: Any }. Returns its nonce. */
  push(typeUrl, { resources = [], removed = [] } = {}) {
    const nonce = `n${this.index}-${++this.nonce}`;
    this.call.write(create(DeltaDiscoveryResponseSchema, { typeUrl, nonce, resources, removedResources: removed, systemVersionInfo: 'fake' }));
    return nonce;
  }

  /** Pushes and waits for the answer to that nonce (ACK when no errorDetail). */
  async pushAndWait(typeUrl, body, timeoutMs = 10_000) {
    const nonce = this.push(typeUrl, body);
    return this.inbox.next((r) => r.responseNonce === nonce, timeoutMs, `answer to ${nonce}`);
  }

  /** Sends a response encoded ahead of time (`prepareResponse`) and waits for its answer. */
  async pushPreparedAndWait({ nonce, bytes }, timeoutMs = 10_000) {
    this.call.write(bytes);
    return this.inbox.next((r) => r.responseNonce === nonce, timeoutMs, `answer to ${nonce}`);
  }

  /** Ends the stream as istiod does on a graceful restart (OK status). */
  end() {
    this.call.end();
  }
}

let prepared = 0;

/**
 * A DeltaDiscoveryResponse encoded now, for `pushPreparedAndWait` later: a benchmark's first push of 100k workloads
 * takes this process's protobuf-es over 2 s to encode, time istiod (which keeps its resources encoded) does not
 * spend and that would otherwise count in the daemon's time to ready and take a core from it.
 */
export function prepareResponse(typeUrl, { resources = [], removed = [] } = {}) {
  const nonce = `prepared-${++prepared}`;
  const msg = create(DeltaDiscoveryResponseSchema, { typeUrl, nonce, resources, removedResources: removed, systemVersionInfo: 'fake' });
  return { nonce, bytes: Buffer.from(toBinary(DeltaDiscoveryResponseSchema, msg)) };
}

const ADS_SERVICE = {
  DeltaAggregatedResources: {
    path: '/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources',
    requestStream: true,
    responseStream: true,
    requestSerialize: (m) => Buffer.from(toBinary(DeltaDiscoveryRequestSchema, m)),
    requestDeserialize: (b) => fromBinary(DeltaDiscoveryRequestSchema, b),
    // A Buffer is a response already encoded (prepareResponse).
    responseSerialize: (m) => (Buffer.isBuffer(m) ? m : Buffer.from(toBinary(DeltaDiscoveryResponseSchema, m))),
    responseDeserialize: (b) => fromBinary(DeltaDiscoveryResponseSchema, b),
  },
};

const CA_SERVICE = {
  CreateCertificate: {
    path: '/istio.v1.auth.IstioCertificateService/CreateCertificate',
    requestStream: false,
    responseStream: false,
    requestSerialize: (m) => Buffer.from(toBinary(IstioCertificateRequestSchema, m)),
    requestDeserialize: (b) => fromBinary(IstioCertificateRequestSchema, b),
    responseSerialize: (m) => Buffer.from(toBinary(IstioCertificateResponseSchema, m)),
    responseDeserialize: (b) => fromBinary(IstioCertificateResponseSchema, b),
  },
};

/** The SPIFFE URI SAN of a PEM CSR (openssl CLI, independent of our code). */
export function csrIdentity(csrPem) {
  try {
    const text = execFileSync('openssl', ['req', '-noout', '-text'], { input: csrPem, stdio: ['pipe', 'pipe', 'pipe'] }).toString();
    return /URI:(spiffe:\/\/[^\s,]+)/.exec(text)?.[1] ?? null;
  } catch {
    return null;
  }
}

export class FakeIstiod {
  constructor({ dir, pki, port = 0, caDir }) {
    this.dir = dir;
    this.pki = pki;
    this.requestedPort = port;
    this.caDir = caDir;
    this.streams = [];
    this.streamInbox = new Inbox();
    /** Every CreateCertificate: { metadata (headers), csr, identity (from the CSR), ttlSeconds, requestMetadata, at }. */
    this.certRequests = [];
    /** false: CreateCertificate answers UNAVAILABLE (the CA is down). */
    this.caUp = true;
    /** (request) => Promise<string[]> cert_chain; default: the built-in CA code signs the CSR. */
    this.signer = null;
    this.server = null;
  }

  get address() {
    return `https://127.0.0.1:${this.port}`;
  }

  get rootCaPath() {
    return this.pki.rootCaPath;
  }

  async start() {
    const server = new grpc.Server();
    server.addService(ADS_SERVICE, {
      DeltaAggregatedResources: (call) => {
        const s = new AdsStream(call, this.streams.length);
        this.streams.push(s);
        this.streamInbox.put({ value: s });
      },
    });
    server.addService(CA_SERVICE, {
      CreateCertificate: (call, callback) => {
        const req = call.request;
        const rec = {
          metadata: metadataObject(call.metadata),
          csr: req.csr,
          identity: csrIdentity(req.csr),
          ttlSeconds: Number(req.validityDuration),
          requestMetadata: req.metadata ?? null,
          at: Date.now(),
        };
        this.certRequests.push(rec);
        if (!this.caUp) {
          callback({ code: grpc.status.UNAVAILABLE, details: 'fake CA is down' });
          return;
        }
        Promise.resolve()
          .then(() => (this.signer ? this.signer(rec) : this.sign(rec)))
          .then(
          (certChain) => callback(null, create(IstioCertificateResponseSchema, { certChain })),
          (err) => callback({ code: grpc.status.INTERNAL, details: err.message }),
        );
      },
    });
    const creds = grpc.ServerCredentials.createSsl(null, [{ cert_chain: this.pki.cert, private_key: this.pki.key }], false);
    this.port = await new Promise((resolve, reject) =>
      server.bindAsync(`127.0.0.1:${this.port ?? this.requestedPort}`, creds, (err, port) => (err ? reject(err) : resolve(port))),
    );
    this.server = server;
    return this;
  }

  /** Istio's response shape: [leaf, root] (each its own element; the last holds the roots). */
  async sign(rec) {
    if (!this.localCa) {
      // Loaded on first use: unit tests that bring their own signer need no native module.
      const { LocalCa } = await import('../../dist/native/index.js');
      this.localCa = LocalCa.open(this.caDir, 'cluster.local');
    }
    const pem = this.localCa.sign(rec.csr, rec.identity, rec.ttlSeconds);
    const blocks = pem.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g).map((b) => `${b}\n`);
    return [blocks[0], this.localCa.rootPem()];
  }

  /** The next stream opened (past or future). */
  nextStream(timeoutMs = 15_000) {
    return this.streamInbox.next(() => true, timeoutMs, 'new stream');
  }

  /** Kills every stream and the server at once (an istiod crash); `start()` again serves on the same port. */
  async crash() {
    this.server?.forceShutdown();
    this.server = null;
  }

  async close() {
    await this.crash();
  }
}

export async function startFakeIstiod({ dir, port = 0 }) {
  const pki = makeServerPki(join(dir, 'istiod-pki'));
  const caDir = join(dir, 'istiod-ca');
  return new FakeIstiod({ dir, pki, port, caDir }).start();
}

// ---- resources ------------------------------------------------------------------------------------------------

function ipBytes(ip) {
  return Uint8Array.from(ip.split('.').map(Number));
}

/**
 * An Address resource holding a workload. `services`: { "ns/host": { servicePort: targetPort } }.
 * Returns { name, version, resource } for `push`.
 */
export function workloadResource({ name, ip, node, ns = 'default', sa = name, protocol = 'HBONE', version = 'v1', uid, services = {}, extra = {} }) {
  const w = {
    uid: uid ?? `Kubernetes//Pod/${ns}/${name}`,
    name,
    namespace: ns,
    addresses: ip === undefined ? [] : [ipBytes(ip)],
    tunnelProtocol: protocol === 'HBONE' ? TunnelProtocol.HBONE : protocol === 'TCP' ? TunnelProtocol.NONE : protocol,
    serviceAccount: sa,
    trustDomain: 'cluster.local',
    node,
    canonicalName: name,
    canonicalRevision: 'v1',
    workloadName: name,
    clusterId: 'Kubernetes',
    services: Object.fromEntries(
      Object.entries(services).map(([k, ports]) => [k, { ports: Object.entries(ports).map(([sp, tp]) => ({ servicePort: Number(sp), targetPort: tp })) }]),
    ),
    ...extra,
  };
  const addr = create(AddressSchema, { type: { case: 'workload', value: w } });
  return { name: w.uid, version, resource: anyPack(AddressSchema, addr) };
}

/** An Address resource holding a service with one VIP. */
export function serviceResource({ name, ns = 'default', hostname = `${name}.${ns}.svc.cluster.local`, vip, ports = {}, sans = [], version = 'v1' }) {
  const s = {
    name,
    namespace: ns,
    hostname,
    addresses: vip ? [{ network: '', address: ipBytes(vip) }] : [],
    ports: Object.entries(ports).map(([sp, tp]) => ({ servicePort: Number(sp), targetPort: tp })),
    subjectAltNames: sans,
  };
  const addr = create(AddressSchema, { type: { case: 'service', value: s } });
  return { name: `${ns}/${hostname}`, version, resource: anyPack(AddressSchema, addr) };
}

/** An Authorization resource; `rules` in the wire shape ({ clauses: [{ matches: [...] }] }). */
export function policyResource({ name, ns = 'default', scope = 1, action = 0, rules = [], version = 'v1' }) {
  const a = create(AuthorizationSchema, { name, namespace: ns, scope, action, rules });
  return { name: `${ns}/${name}`, version, resource: anyPack(AuthorizationSchema, a) };
}

/** A resource whose body is not what its type says: a raw Any with arbitrary bytes. */
export function rawResource({ name, typeUrl = ADDRESS, bytes, version = 'v1' }) {
  return { name, version, resource: { $typeName: 'google.protobuf.Any', typeUrl, value: bytes } };
}

export { toJson };
