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
import { create, fromBinary, toBinary, toJson, type JsonObject, type MessageInitShape } from '@bufbuild/protobuf';
import { anyPack, type Any } from '@bufbuild/protobuf/wkt';
import * as grpc from '@grpc/grpc-js';
import {
  DeltaDiscoveryRequestSchema,
  DeltaDiscoveryResponseSchema,
  type DeltaDiscoveryRequest,
  type DeltaDiscoveryResponse,
  type ResourceSchema,
} from '../../dist/gen/envoy/service/discovery/v3/discovery_pb.js';
import {
  IstioCertificateRequestSchema,
  IstioCertificateResponseSchema,
  type IstioCertificateRequest,
  type IstioCertificateResponse,
} from '../../dist/gen/istio/ca/ca_pb.js';
import { AuthorizationSchema, type RuleSchema } from '../../dist/gen/istio/security/authorization_pb.js';
import { AddressSchema, TunnelProtocol, type WorkloadSchema } from '../../dist/gen/istio/workload/workload_pb.js';
import type { LocalCa } from '../../dist/native/index.js';
import type { EnvInput } from './daemon.js';

export const ADDRESS = 'type.googleapis.com/istio.workload.Address';
export const AUTHORIZATION = 'type.googleapis.com/istio.security.Authorization';
export const ISTIOD_HOSTNAME = 'istiod.istio-system.svc';

function openssl(args: string[], cwd: string): Buffer {
  return execFileSync('openssl', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
}

/** The fake istiod's TLS: its server certificate and key, and the root that signed it (PEM). */
export interface ServerPki {
  /** The root's PEM file: XDS_ROOT_CA / CA_ROOT_CA of the daemons. */
  rootCaPath: string;
  cert: Buffer;
  key: Buffer;
  root: Buffer;
}

/** A root and a server certificate for istiod (DNS istiod.istio-system.svc, IP 127.0.0.1). */
export function makeServerPki(dir: string): ServerPki {
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
export function istiodEnv(istiod: Pick<FakeIstiod, 'address' | 'rootCaPath'>, node: string, extra: EnvInput = {}): EnvInput {
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

/** One item of an Inbox; `taken` once a `next` has resolved it. */
interface InboxItem<T> {
  value: T;
  taken?: boolean;
}

/** One pending `next` of an Inbox. */
interface InboxWaiter<T> {
  pred: (value: T) => unknown;
  resolve: (value: T) => void;
  timer?: NodeJS.Timeout;
}

/** A queue whose `next(pred)` resolves with the first (past or future) item matching `pred`, once. */
class Inbox<T> {
  items: InboxItem<T>[];
  waiters: InboxWaiter<T>[];

  constructor() {
    this.items = [];
    this.waiters = [];
  }
  put(item: InboxItem<T>): void {
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
  next(pred: (value: T) => unknown = () => true, timeoutMs = 10_000, what = 'an item'): Promise<T> {
    const found = this.items.find((i) => !i.taken && pred(i.value));
    if (found) {
      found.taken = true;
      return Promise.resolve(found.value);
    }
    return new Promise((resolve, reject) => {
      const w: InboxWaiter<T> = { pred, resolve };
      w.timer = setTimeout(() => {
        this.waiters.splice(this.waiters.indexOf(w), 1);
        reject(new Error(`fake istiod: no ${what} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiters.push(w);
    });
  }
}

function metadataObject(md: grpc.Metadata): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(md.getMap())) out[k] = String(v);
  return out;
}

/** A DeltaAggregatedResources call: requests in, responses (or responses encoded ahead: a Buffer) out. */
export type AdsCall = grpc.ServerDuplexStream<DeltaDiscoveryRequest, DeltaDiscoveryResponse | Buffer>;

/** One DeltaDiscoveryRequest as the fake istiod records it (plain values, proto3 JSON names). */
export interface AdsRequest {
  typeUrl: string;
  /** The node (on a stream's first request): its id and metadata (google.protobuf.Struct as JSON). */
  node?: { id: string; metadata: JsonObject };
  initialResourceVersions: Record<string, string>;
  resourceNamesSubscribe: string[];
  resourceNamesUnsubscribe: string[];
  /** The nonce this request answers ('' for none). */
  responseNonce: string;
  /** Present on a NACK. */
  errorDetail?: { code: number; message: string };
  /** Date.now() when it arrived. */
  at: number;
}

/** A resource of a push: what `workloadResource`, `serviceResource`, `policyResource` and `rawResource` return. */
export interface XdsResource {
  name: string;
  version: string;
  resource: Any;
}

/** What `push` sends: resources (any envoy Resource init) and the names of removed ones. */
export interface PushBody {
  resources?: MessageInitShape<typeof ResourceSchema>[];
  removed?: string[];
}

/** A DeltaDiscoveryResponse encoded ahead of time (`prepareResponse`), for `pushPreparedAndWait`. */
export interface PreparedResponse {
  nonce: string;
  bytes: Buffer;
}

/** One DeltaAggregatedResources stream from a client. */
class AdsStream {
  call: AdsCall;
  index: number;
  /** The call's gRPC metadata (headers). */
  metadata: Record<string, string>;
  requests: AdsRequest[];
  inbox: Inbox<AdsRequest>;
  nonce: number;
  ended: boolean;
  closed: Promise<void>;

  constructor(call: AdsCall, index: number) {
    this.call = call;
    this.index = index;
    this.metadata = metadataObject(call.metadata);
    /** Every request, decoded to plain JSON-ish objects (proto3 JSON names). */
    this.requests = [];
    this.inbox = new Inbox();
    this.nonce = 0;
    this.ended = false;
    this.closed = new Promise((resolve) => call.on('close', resolve));
    call.on('data', (req: DeltaDiscoveryRequest) => {
      const r: AdsRequest = {
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
  nextRequest(typeUrl?: string, timeoutMs = 10_000): Promise<AdsRequest> {
    return this.inbox.next((r) => typeUrl === undefined || r.typeUrl === typeUrl, timeoutMs, `request for ${typeUrl ?? 'any type'} on stream ${this.index}`);
  }

  /** Sends a DeltaDiscoveryResponse; `resources` are { name, version, resource: Any }. Returns its nonce. */
  push(typeUrl: string, { resources = [], removed = [] }: PushBody = {}): string {
    const nonce = `n${this.index}-${++this.nonce}`;
    this.call.write(create(DeltaDiscoveryResponseSchema, { typeUrl, nonce, resources, removedResources: removed, systemVersionInfo: 'fake' }));
    return nonce;
  }

  /** Pushes and waits for the answer to that nonce (ACK when no errorDetail). */
  async pushAndWait(typeUrl: string, body?: PushBody, timeoutMs = 10_000): Promise<AdsRequest> {
    const nonce = this.push(typeUrl, body);
    return this.inbox.next((r) => r.responseNonce === nonce, timeoutMs, `answer to ${nonce}`);
  }

  /** Sends a response encoded ahead of time (`prepareResponse`) and waits for its answer. */
  async pushPreparedAndWait({ nonce, bytes }: PreparedResponse, timeoutMs = 10_000): Promise<AdsRequest> {
    this.call.write(bytes);
    return this.inbox.next((r) => r.responseNonce === nonce, timeoutMs, `answer to ${nonce}`);
  }

  /** Ends the stream as istiod does on a graceful restart (OK status). */
  end(): void {
    this.call.end();
  }
}

export type { AdsStream, Inbox };

let prepared = 0;

/**
 * A DeltaDiscoveryResponse encoded now, for `pushPreparedAndWait` later: a benchmark's first push of 100k workloads
 * takes this process's protobuf-es over 2 s to encode, time istiod (which keeps its resources encoded) does not
 * spend and that would otherwise count in the daemon's time to ready and take a core from it.
 */
export function prepareResponse(typeUrl: string, { resources = [], removed = [] }: PushBody = {}): PreparedResponse {
  const nonce = `prepared-${++prepared}`;
  const msg = create(DeltaDiscoveryResponseSchema, { typeUrl, nonce, resources, removedResources: removed, systemVersionInfo: 'fake' });
  return { nonce, bytes: Buffer.from(toBinary(DeltaDiscoveryResponseSchema, msg)) };
}

const ADS_SERVICE = {
  DeltaAggregatedResources: {
    path: '/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources',
    requestStream: true,
    responseStream: true,
    requestSerialize: (m: DeltaDiscoveryRequest) => Buffer.from(toBinary(DeltaDiscoveryRequestSchema, m)),
    requestDeserialize: (b: Buffer) => fromBinary(DeltaDiscoveryRequestSchema, b),
    // A Buffer is a response already encoded (prepareResponse).
    responseSerialize: (m: DeltaDiscoveryResponse | Buffer) => (Buffer.isBuffer(m) ? m : Buffer.from(toBinary(DeltaDiscoveryResponseSchema, m))),
    responseDeserialize: (b: Buffer) => fromBinary(DeltaDiscoveryResponseSchema, b),
  },
};

const CA_SERVICE = {
  CreateCertificate: {
    path: '/istio.v1.auth.IstioCertificateService/CreateCertificate',
    requestStream: false,
    responseStream: false,
    requestSerialize: (m: IstioCertificateRequest) => Buffer.from(toBinary(IstioCertificateRequestSchema, m)),
    requestDeserialize: (b: Buffer) => fromBinary(IstioCertificateRequestSchema, b),
    responseSerialize: (m: IstioCertificateResponse) => Buffer.from(toBinary(IstioCertificateResponseSchema, m)),
    responseDeserialize: (b: Buffer) => fromBinary(IstioCertificateResponseSchema, b),
  },
};

/** The SPIFFE URI SAN of a PEM CSR (openssl CLI, independent of our code). */
export function csrIdentity(csrPem: string): string | null {
  try {
    const text = execFileSync('openssl', ['req', '-noout', '-text'], { input: csrPem, stdio: ['pipe', 'pipe', 'pipe'] }).toString();
    return /URI:(spiffe:\/\/[^\s,]+)/.exec(text)?.[1] ?? null;
  } catch {
    return null;
  }
}

/** One CreateCertificate call as the fake istiod records it. */
export interface CertRequest {
  /** The call's gRPC metadata (headers). */
  metadata: Record<string, string>;
  csr: string;
  /** The CSR's SPIFFE URI SAN (read by openssl); null when it has none. */
  identity: string | null;
  ttlSeconds: number;
  /** The request's own metadata (google.protobuf.Struct as JSON), null when absent. */
  requestMetadata: JsonObject | null;
  /** Date.now() when it arrived. */
  at: number;
}

/** Signs a CreateCertificate: resolves the cert_chain of the answer (Istio's shape: [leaf, root]). */
export type Signer = (request: CertRequest) => string[] | Promise<string[]>;

/** What `new FakeIstiod` takes (startFakeIstiod builds it). */
export interface FakeIstiodInit {
  dir: string;
  pki: ServerPki;
  /** Default 0 (any). */
  port?: number;
  /** Where the built-in CA code keeps the root it signs with. */
  caDir: string;
}

export class FakeIstiod {
  dir: string;
  pki: ServerPki;
  requestedPort: number;
  caDir: string;
  streams: AdsStream[];
  streamInbox: Inbox<AdsStream>;
  certRequests: CertRequest[];
  caUp: boolean;
  signer: Signer | null;
  server: grpc.Server | null;
  /** The port it serves on, once `start()` has bound it. */
  declare port: number;
  /** The built-in CA code that signs, loaded on first use. */
  declare localCa: LocalCa | undefined;

  constructor({ dir, pki, port = 0, caDir }: FakeIstiodInit) {
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

  get address(): string {
    return `https://127.0.0.1:${this.port}`;
  }

  get rootCaPath(): string {
    return this.pki.rootCaPath;
  }

  async start(): Promise<this> {
    const server = new grpc.Server();
    server.addService(ADS_SERVICE, {
      DeltaAggregatedResources: (call: AdsCall) => {
        const s = new AdsStream(call, this.streams.length);
        this.streams.push(s);
        this.streamInbox.put({ value: s });
      },
    });
    server.addService(CA_SERVICE, {
      CreateCertificate: (
        call: grpc.ServerUnaryCall<IstioCertificateRequest, IstioCertificateResponse>,
        callback: grpc.sendUnaryData<IstioCertificateResponse>,
      ) => {
        const req = call.request;
        const rec: CertRequest = {
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
          (err: Error) => callback({ code: grpc.status.INTERNAL, details: err.message }),
        );
      },
    });
    const creds = grpc.ServerCredentials.createSsl(null, [{ cert_chain: this.pki.cert, private_key: this.pki.key }], false);
    this.port = await new Promise<number>((resolve, reject) =>
      server.bindAsync(`127.0.0.1:${this.port ?? this.requestedPort}`, creds, (err, port) => (err ? reject(err) : resolve(port))),
    );
    this.server = server;
    return this;
  }

  /** Istio's response shape: [leaf, root] (each its own element; the last holds the roots). */
  async sign(rec: CertRequest): Promise<string[]> {
    if (!this.localCa) {
      // Loaded on first use: unit tests that bring their own signer need no native module.
      const { LocalCa } = await import('../../dist/native/index.js');
      this.localCa = LocalCa.open(this.caDir, 'cluster.local');
    }
    // A CSR without a SPIFFE SAN (identity null) is refused by the CA code: the call fails INTERNAL.
    const pem = this.localCa.sign(rec.csr, rec.identity!, rec.ttlSeconds);
    const blocks = pem.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g)!.map((b) => `${b}\n`);
    return [blocks[0], this.localCa.rootPem()];
  }

  /** The next stream opened (past or future). */
  nextStream(timeoutMs = 15_000): Promise<AdsStream> {
    return this.streamInbox.next(() => true, timeoutMs, 'new stream');
  }

  /** Kills every stream and the server at once (an istiod crash); `start()` again serves on the same port. */
  async crash(): Promise<void> {
    this.server?.forceShutdown();
    this.server = null;
  }

  async close(): Promise<void> {
    await this.crash();
  }
}

export interface StartFakeIstiodOptions {
  /** Certificates are written there (istiod-pki/, istiod-ca/). */
  dir: string;
  /** Default 0 (any). */
  port?: number;
}

export async function startFakeIstiod({ dir, port = 0 }: StartFakeIstiodOptions): Promise<FakeIstiod> {
  const pki = makeServerPki(join(dir, 'istiod-pki'));
  const caDir = join(dir, 'istiod-ca');
  return new FakeIstiod({ dir, pki, port, caDir }).start();
}

// ---- resources ------------------------------------------------------------------------------------------------

function ipBytes(ip: string): Uint8Array {
  return Uint8Array.from(ip.split('.').map(Number));
}

/** Service port → target port. */
export type PortMap = Record<number, number>;

/** `workloadResource`'s options. */
export interface WorkloadResourceOptions {
  name: string;
  /** Its one address; none: no address. */
  ip?: string;
  node?: string;
  /** Default 'default'. */
  ns?: string;
  /** serviceAccount; default the name. */
  sa?: string;
  /** 'HBONE' (default), 'TCP' (TunnelProtocol.NONE), or a TunnelProtocol value. */
  protocol?: 'HBONE' | 'TCP' | TunnelProtocol;
  /** Default 'v1'. */
  version?: string;
  /** Default `Kubernetes//Pod/<ns>/<name>`. */
  uid?: string;
  /** { "ns/host": { servicePort: targetPort } } */
  services?: Record<string, PortMap>;
  /** More Workload fields (or overrides), as `create(WorkloadSchema, ...)` takes them. */
  extra?: MessageInitShape<typeof WorkloadSchema>;
}

/**
 * An Address resource holding a workload. `services`: { "ns/host": { servicePort: targetPort } }.
 * Returns { name, version, resource } for `push`.
 */
export function workloadResource({ name, ip, node, ns = 'default', sa = name, protocol = 'HBONE', version = 'v1', uid, services = {}, extra = {} }: WorkloadResourceOptions): XdsResource {
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

/** `serviceResource`'s options. */
export interface ServiceResourceOptions {
  name: string;
  /** Default 'default'. */
  ns?: string;
  /** Default `<name>.<ns>.svc.cluster.local`. */
  hostname?: string;
  /** Its one VIP (network ''); none: no address. */
  vip?: string;
  ports?: PortMap;
  /** subjectAltNames */
  sans?: string[];
  /** Default 'v1'. */
  version?: string;
}

/** An Address resource holding a service with one VIP. */
export function serviceResource({ name, ns = 'default', hostname = `${name}.${ns}.svc.cluster.local`, vip, ports = {}, sans = [], version = 'v1' }: ServiceResourceOptions): XdsResource {
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

/** `policyResource`'s options. */
export interface PolicyResourceOptions {
  name: string;
  /** Default 'default'. */
  ns?: string;
  /** The Scope enum's value (proto3 enums are open: any number goes on the wire). Default 1. */
  scope?: number;
  /** The Action enum's value. Default 0. */
  action?: number;
  rules?: MessageInitShape<typeof RuleSchema>[];
  /** Default 'v1'. */
  version?: string;
}

/** An Authorization resource; `rules` in the wire shape ({ clauses: [{ matches: [...] }] }). */
export function policyResource({ name, ns = 'default', scope = 1, action = 0, rules = [], version = 'v1' }: PolicyResourceOptions): XdsResource {
  const a = create(AuthorizationSchema, { name, namespace: ns, scope, action, rules });
  return { name: `${ns}/${name}`, version, resource: anyPack(AuthorizationSchema, a) };
}

/** `rawResource`'s options. */
export interface RawResourceOptions {
  name: string;
  /** Default ADDRESS. */
  typeUrl?: string;
  bytes: Uint8Array;
  /** Default 'v1'. */
  version?: string;
}

/** A resource whose body is not what its type says: a raw Any with arbitrary bytes. */
export function rawResource({ name, typeUrl = ADDRESS, bytes, version = 'v1' }: RawResourceOptions): XdsResource {
  return { name, version, resource: { $typeName: 'google.protobuf.Any', typeUrl, value: bytes } };
}

export { toJson };
