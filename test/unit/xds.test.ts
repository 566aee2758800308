// The xDS and CA clients below the daemon: conversion failures (the NACK reasons; workloads and services are decoded
// by the dataplane, native-wds.ts), the
// XdsClient and the istiod CA client against the fake istiod in-process (no native module: the CA signs with the
// openssl CLI), and the node identity sent to istiod.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { create, fromBinary } from '@bufbuild/protobuf';
import type { MessageInitShape } from '@bufbuild/protobuf';
import { WorkloadSchema, ServiceSchema } from '../../dist/gen/istio/workload/workload_pb.js';
import type { Service_Visibility, TunnelProtocol, WorkloadStatus, WorkloadType } from '../../dist/gen/istio/workload/workload_pb.js';
import { AuthorizationSchema } from '../../dist/gen/istio/security/authorization_pb.js';
import type { Action } from '../../dist/gen/istio/security/authorization_pb.js';
import { ResourceSchema } from '../../dist/gen/envoy/service/discovery/v3/discovery_pb.js';
import { convertAuthorization, ipFromBytes } from '../../dist/xds/convert.js';
import { nativeService as convertService, nativeWorkload as convertWorkload } from '../helpers/native-wds.js';
import { XdsClient, ztunnelNodeId, ztunnelNodeMetadata } from '../../dist/xds/client.js';
import { TokenSource } from '../../dist/xds/token.js';
import { XdsMetrics } from '../../dist/xds/metrics.js';
import { IstiodCertificateAuthority, checkCertificateChain } from '../../dist/ca/istiod.js';
import { createLogs } from '../../dist/log/logger.js';
import { loadConfig } from '../../dist/config/index.js';
import { ZtunnelError } from '../../dist/errors.js';
import type { StateChange } from '../../dist/state/store.js';
import { makeCa, makeLeaf, tempDir } from '../helpers/pki.js';
import type { Ca } from '../helpers/pki.js';
import { ADDRESS, AUTHORIZATION, ISTIOD_HOSTNAME, startFakeIstiod, workloadResource, serviceResource, policyResource } from '../helpers/fake-istiod.js';
import type { Signer } from '../helpers/fake-istiod.js';

const logger = createLogs({ filter: { level: 'off', targets: {} }, format: 'json', sink: { write: () => {} } }).root;
const wl = (fields: MessageInitShape<typeof WorkloadSchema>) => create(WorkloadSchema, { uid: 'u1', name: 'w', namespace: 'ns', addresses: [Uint8Array.from([10, 0, 0, 1])], ...fields });
const reason = (fn: () => unknown): string | null => {
  try {
    fn();
  } catch (err) {
    return (err as Error).message;
  }
  return null;
};

test('conversion: each invalid resource is rejected with a reason naming the field', () => {
  assert.equal(reason(() => convertWorkload(wl({ uid: '' }))), 'workload has no uid');
  assert.equal(reason(() => convertWorkload(wl({ addresses: [Uint8Array.from([1, 2, 3, 4, 5])] }))), 'addresses[0]: 5 bytes is not an IPv4 (4) or IPv6 (16) address');
  assert.equal(reason(() => convertWorkload(wl({ tunnelProtocol: 2 }))), 'tunnelProtocol LEGACY_ISTIO_MTLS is not supported (only NONE and HBONE)');
  assert.equal(reason(() => convertWorkload(wl({ tunnelProtocol: 7 as TunnelProtocol }))), 'tunnelProtocol: unknown enum value 7');
  assert.equal(reason(() => convertWorkload(wl({ status: 5 as WorkloadStatus }))), 'status: unknown enum value 5');
  assert.equal(reason(() => convertWorkload(wl({ workloadType: 9 as WorkloadType }))), 'workloadType: unknown enum value 9');
  assert.equal(reason(() => convertWorkload(wl({ services: { bad: { ports: [] } } }))), 'services: key "bad" is not <namespace>/<hostname>');
  assert.equal(reason(() => convertService(create(ServiceSchema, { namespace: 'ns', hostname: 'h', addresses: [{ address: Uint8Array.from([1]) }] }))), 'addresses[0].address: 1 bytes is not an IPv4 (4) or IPv6 (16) address');
  assert.equal(reason(() => convertService(create(ServiceSchema, { namespace: 'ns' }))), 'service has no hostname');
  assert.equal(reason(() => convertAuthorization(create(AuthorizationSchema, { name: 'p', action: 3 as Action }))), 'action: unknown enum value 3');
  // Defaults istiod leaves out: trust domain, service account, capacity 1; an unknown visibility is Public.
  const w = convertWorkload(wl({}));
  assert.deepEqual([w.trustDomain, w.serviceAccount, w.capacity, w.protocol], ['cluster.local', 'default', 1, 'TCP']);
  assert.equal(convertWorkload(wl({ capacity: 0 })).capacity, 0);
  const s = convertService(create(ServiceSchema, {
    namespace: 'ns', hostname: 'h', visibility: 7 as Service_Visibility,
    addresses: [{ network: 'n', address: Uint8Array.from([10, 96, 0, 1]) }, { network: '', address: Uint8Array.from([10, 97, 0, 0]), length: 16 }, { address: Uint8Array.from([10, 98, 0, 1]), length: 32 }],
    ports: [{ servicePort: 80, targetPort: 8080 }],
  }));
  assert.deepEqual([s.vips, s.cidrVips, s.ports, s.visibility], [['n/10.96.0.1', '/10.98.0.1'], ['/10.97.0.0/16'], { 80: 8080 }, 'Public']);
  assert.equal(ipFromBytes(Uint8Array.from([0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1]), 'x'), '2001:db8::1:0:0:1');
});

test('weighted waypoints convert with their weights; a destination-less entry is refused', () => {
  const host = (hostname: string) => ({ destination: { case: 'hostname' as const, value: { namespace: 'ns', hostname } }, hboneMtlsPort: 0 });
  const svc = convertService(create(ServiceSchema, {
    name: 's', namespace: 'ns', hostname: 's.ns',
    weightedWaypoints: [{ destination: host('wp-a'), weight: 1 }, { destination: host('wp-b'), weight: 0 }],
  }));
  assert.deepEqual(svc.weightedWaypoints, [
    { waypoint: { destination: 'ns/wp-a', hboneMtlsPort: 15008 }, weight: 1 },
    { waypoint: { destination: 'ns/wp-b', hboneMtlsPort: 15008 }, weight: 0 },
  ]);
  assert.throws(
    () => convertService(create(ServiceSchema, { name: 's', namespace: 'ns', hostname: 's.ns', weightedWaypoints: [{ weight: 3 }] })),
    /weightedWaypoints\[0\]/,
  );
});

test('node id and metadata as istiod expects them', () => {
  const cfg = loadConfig({
    env: {
      INSTANCE_IP: '10.1.2.3', POD_NAME: 'ztunnel-abc', POD_NAMESPACE: 'istio-system', NODE_NAME: 'node-1',
      ISTIO_META_CLUSTER_ID: 'c1', ISTIO_META_DNS_CAPTURE: 'true', ISTIO_METAJSON_LABELS: '{"a":1}',
      XDS_HEADER_X_One: 'v1', CA_HEADER_Y: 'v2',
    },
  });
  assert.equal(ztunnelNodeId(cfg), 'ztunnel~10.1.2.3~ztunnel-abc.istio-system~istio-system.svc.cluster.local');
  assert.deepEqual(ztunnelNodeMetadata(cfg), {
    CLUSTER_ID: 'c1', DNS_CAPTURE: 'true', LABELS: { a: 1 }, NAME: 'ztunnel-abc', NAMESPACE: 'istio-system', INSTANCE_IPS: '10.1.2.3', NODE_NAME: 'node-1',
  });
  assert.deepEqual(cfg.xdsHeaders, { x_one: 'v1' });
  assert.deepEqual(cfg.caHeaders, { y: 'v2' });
  assert.equal(ztunnelNodeId(loadConfig({ env: {} })), 'ztunnel~1.1.1.1~.~.svc.cluster.local');
  assert.throws(() => loadConfig({ env: { ISTIO_METAJSON_X: '{' } }), /ISTIO_METAJSON_X: "\{" is not JSON/);
});

let pkiDir: string;
let foreign: Ca;
function opensslSigner(identityOverride?: string): Signer {
  return (rec) => {
    const leaf = makeLeaf(pkiDir, foreign, [identityOverride ?? rec.identity!]);
    return [leaf.certPem, foreign.certPem];
  };
}

test('XdsClient: ACK/NACK per response, versions kept for the next connect, synced only after both ACKs', async () => {
  pkiDir = tempDir('ztn-xds-unit-');
  foreign = makeCa(pkiDir, 'unit-root');
  const istiod = await startFakeIstiod({ dir: pkiDir });
  const changes: StateChange[] = [];
  const addressCalls: { names: string[]; removed: readonly string[] }[] = [];
  let synced = 0;
  let refuse = false;
  const metrics = new XdsMetrics();
  const client = new XdsClient({
    target: { address: istiod.address, rootCa: istiod.rootCaPath, altHostname: ISTIOD_HOSTNAME },
    token: new TokenSource('t0k'),
    clusterId: 'c1',
    headers: { 'x-extra': '1' },
    node: { id: 'ztunnel~1.1.1.1~p.ns~ns.svc.cluster.local', metadata: { NAME: 'p' } },
    apply: (c) => {
      if (refuse) throw new Error('INVALID_STATE: refused');
      changes.push(c);
    },
    // Address resources go to the dataplane still encoded; this stand-in reads their envelopes.
    applyAddresses: async (resources, removed) => {
      if (refuse) throw new Error('INVALID_STATE: refused');
      const rs = resources.map((b) => fromBinary(ResourceSchema, b));
      addressCalls.push({ names: rs.map((r) => r.name), removed });
      const bad = rs.filter((r) => r.name.endsWith('/bad'));
      return { accepted: rs.filter((r) => !bad.includes(r)).map((r) => [r.name, r.version]), rejected: bad.map((r) => `${r.name}: no good`) };
    },
    onSynced: () => synced++,
    metrics,
    logger,
  });
  try {
    client.start();
    const s = await istiod.nextStream();
    assert.deepEqual([s.metadata.authorization, s.metadata.clusterid, s.metadata['x-extra']], ['Bearer t0k', 'c1', '1']);
    await s.nextRequest(ADDRESS);
    await s.nextRequest(AUTHORIZATION);
    const w1 = workloadResource({ name: 'w1', ip: '10.0.0.1', node: 'n', version: 'a' });
    const svc = serviceResource({ name: 's', vip: '10.96.0.1', ports: { 80: 8080 }, version: 'b' });
    assert.equal((await s.pushAndWait(ADDRESS, { resources: [w1, svc] })).errorDetail, undefined);
    assert.deepEqual(addressCalls.at(-1), { names: ['Kubernetes//Pod/default/w1', 'default/s.default.svc.cluster.local'], removed: [] });
    assert.equal(synced, 0, 'not synced before the Authorization type was ACKed');
    assert.equal((await s.pushAndWait(AUTHORIZATION, { resources: [policyResource({ name: 'p' })] })).errorDetail, undefined);
    assert.equal(synced, 1);
    // The dataplane refuses the whole batch: everything in it is NACKed, nothing recorded.
    refuse = true;
    const nack = await s.pushAndWait(ADDRESS, { resources: [workloadResource({ name: 'w2', ip: '10.0.0.2', node: 'n', version: 'x' })] });
    assert.equal(nack.errorDetail!.message, "the response's 1 resource(s): INVALID_STATE: refused");
    refuse = false;
    // A resource the dataplane refuses is NACKed by name; the others of the response apply.
    const partial = await s.pushAndWait(ADDRESS, { resources: [workloadResource({ name: 'bad', ip: '10.0.0.3', node: 'n', version: 'y' }), workloadResource({ name: 'w3', ip: '10.0.0.3', node: 'n', version: 'z' })] });
    assert.equal(partial.errorDetail!.message, 'Kubernetes//Pod/default/bad: no good');
    // Removal by name: the dataplane knows what each name denotes.
    assert.equal((await s.pushAndWait(ADDRESS, { removed: ['default/s.default.svc.cluster.local', 'Kubernetes//Pod/default/w3'] })).errorDetail, undefined);
    assert.deepEqual(addressCalls.at(-1), { names: [], removed: ['default/s.default.svc.cluster.local', 'Kubernetes//Pod/default/w3'] });
    assert.deepEqual(client.resourceVersions(), {
      [ADDRESS]: { 'Kubernetes//Pod/default/w1': 'a' },
      [AUTHORIZATION]: { 'default/p': 'v1' },
    });
    // A graceful end: the next stream carries initial_resource_versions and is opened at once.
    const endedAt = Date.now();
    s.end();
    const s2 = await istiod.nextStream();
    const r = await s2.nextRequest(ADDRESS);
    assert.ok(Date.now() - endedAt < 1000);
    assert.deepEqual(r.initialResourceVersions, { 'Kubernetes//Pod/default/w1': 'a' });
    assert.deepEqual((await s2.nextRequest(AUTHORIZATION)).initialResourceVersions, { 'default/p': 'v1' });
    assert.equal(metrics.snapshot().terminations.Complete, 1);
    assert.ok(metrics.snapshot().messages[ADDRESS] >= 3);
  } finally {
    client.stop();
    await istiod.close();
  }
});

test('istiod CA client: ImpersonatedIdentity in shared mode only; the response is checked', async () => {
  const istiod = await startFakeIstiod({ dir: pkiDir });
  istiod.signer = opensslSigner();
  const target = { address: istiod.address, rootCa: istiod.rootCaPath, altHostname: ISTIOD_HOSTNAME };
  const id = 'spiffe://cluster.local/ns/default/sa/sleep';
  const csr = makeCsr();
  try {
    const shared = new IstiodCertificateAuthority({ target, token: new TokenSource('tk'), clusterId: 'c9', headers: { 'x-ca': 'y' }, impersonate: true });
    const signed = await shared.sign(csr, id, 600);
    assert.match(signed.chainPem, /BEGIN CERTIFICATE/);
    assert.equal(signed.rootsPem, foreign.certPem);
    const req = istiod.certRequests.at(-1)!;
    assert.deepEqual(req.requestMetadata, { ImpersonatedIdentity: id });
    assert.equal(req.ttlSeconds, 600);
    assert.deepEqual([req.metadata.authorization, req.metadata.clusterid, req.metadata['x-ca']], ['Bearer tk', 'c9', 'y']);

    // A token file is re-read for every request: a rotated token is used by the next one.
    const tokenFile = join(pkiDir, 'ca-token');
    writeFileSync(tokenFile, 'first\n');
    const fromFile = new IstiodCertificateAuthority({ target, token: new TokenSource(tokenFile), clusterId: 'c9', headers: {}, impersonate: true });
    await fromFile.sign(csr, id, 600);
    assert.equal(istiod.certRequests.at(-1)!.metadata.authorization, 'Bearer first');
    writeFileSync(tokenFile, 'second\n');
    await fromFile.sign(csr, id, 600);
    assert.equal(istiod.certRequests.at(-1)!.metadata.authorization, 'Bearer second');
    writeFileSync(tokenFile, '');
    await assert.rejects(fromFile.sign(csr, id, 600), /is empty/);

    const dedicated = new IstiodCertificateAuthority({ target, token: new TokenSource(null), clusterId: 'c9', headers: {}, impersonate: false });
    await dedicated.sign(csr, id, 600);
    assert.equal(istiod.certRequests.at(-1)!.requestMetadata, null);
    assert.equal(istiod.certRequests.at(-1)!.metadata.authorization, undefined, 'no token configured: no authorization header');

    istiod.signer = opensslSigner('spiffe://cluster.local/ns/default/sa/other');
    await assert.rejects(shared.sign(csr, id, 600), /issued a certificate for spiffe:\/\/cluster\.local\/ns\/default\/sa\/other, not spiffe:\/\/cluster\.local\/ns\/default\/sa\/sleep/);
    istiod.caUp = false;
    await assert.rejects(shared.sign(csr, id, 600), (err) => err instanceof ZtunnelError && err.code === 'CA_UNAVAILABLE' && /UNAVAILABLE/.test(err.message));
  } finally {
    await istiod.close();
  }
});

function makeCsr(): string {
  // The fake istiod reads the identity from the CSR (openssl), as istiod does.
  return execFileSync('openssl', ['req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', join(pkiDir, 'csr.key'),
    '-subj', '/O=test', '-addext', 'subjectAltName=URI:spiffe://cluster.local/ns/default/sa/sleep'], { stdio: ['ignore', 'pipe', 'pipe'] }).toString();
}

test('checkCertificateChain: chain to the roots, several roots allowed, wrong identity and broken chains refused', () => {
  const id = 'spiffe://cluster.local/ns/a/sa/b';
  const other = makeCa(pkiDir, 'other-root');
  const leaf = makeLeaf(pkiDir, foreign, [id]);
  // Several roots in the last element (root rotation): the chain verifies against one of them.
  const ok = checkCertificateChain([leaf.certPem, other.certPem + foreign.certPem], id);
  assert.equal(ok.chainPem, leaf.certPem);
  assert.equal((ok.rootsPem.match(/BEGIN CERTIFICATE/g) ?? []).length, 2);
  // One element holding leaf + root.
  assert.equal(checkCertificateChain([leaf.certPem + foreign.certPem], id).rootsPem, foreign.certPem);
  assert.throws(() => checkCertificateChain([leaf.certPem, other.certPem], id), /does not verify against the returned root/);
  assert.throws(() => checkCertificateChain([leaf.certPem, foreign.certPem], 'spiffe://cluster.local/ns/a/sa/c'), /not spiffe:\/\/cluster\.local\/ns\/a\/sa\/c/);
  assert.throws(() => checkCertificateChain([], id), /empty/);
});

test('root CA settings: a file, SYSTEM, inline PEM; anything else is an error naming it', async () => {
  const { loadRootCa } = await import('../../dist/xds/grpc.js');
  assert.equal(loadRootCa(foreign.certPath)!.toString(), foreign.certPem);
  assert.equal(loadRootCa('SYSTEM'), null);
  assert.equal(loadRootCa(foreign.certPem)!.toString(), foreign.certPem);
  assert.throws(() => loadRootCa('/no/such/root.pem'), /root CA "\/no\/such\/root.pem": no such file, and not inline PEM/);
});
