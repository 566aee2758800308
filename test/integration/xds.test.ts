// Two real daemons whose workloads, services and policies come ONLY from a fake istiod (a real gRPC server with
// TLS, scripted turn by turn): first sync and readiness, traffic, ACK/NACK, removals, services before and after
// their workloads, headers and token rotation, and an istiod crash mid-traffic. Certificates come from the fake
// istiod's CA too (CA_ADDRESS). Block 127.60.0.0/16 (test/helpers/net.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { makeTempDir, startDaemon } from '../helpers/daemon.js';
import type { Daemon, EnvInput } from '../helpers/daemon.js';
import { block, closeSocket, echoOnce, httpGet, socks5Request, startEchoServer, throughSocks5, waitFor } from '../helpers/net.js';
import type { TestServer } from '../helpers/net.js';
import {
  ADDRESS,
  AUTHORIZATION,
  istiodEnv,
  policyResource,
  rawResource,
  serviceResource,
  startFakeIstiod,
  workloadResource,
} from '../helpers/fake-istiod.js';
import type { AdsStream, FakeIstiod, PortMap, XdsResource } from '../helpers/fake-istiod.js';
import { sumSamples } from '../../dist/cli/prom-text.js';
import type { IdentityDump } from '../../dist/ca/manager.js';
import type { MeshDump } from '../../dist/native/types.js';

const net = block(60);
const A = net.admin(1);
const B = net.admin(2);
const SLEEP = net.workload(1); // on node-a
const ECHO = net.workload(2); // on node-b
const ECHO2 = net.workload(3); // on node-b, arrives later
const VIP = '127.60.100.1';
const VIP2 = '127.60.100.2';

const dir = makeTempDir('ztn-xds-');
const tokenPath = join(dir, 'istio-token');
writeFileSync(tokenPath, 'token-one\n');

let istiod: FakeIstiod;
const echoServers: TestServer[] = [];
// Daemons live across this file's tests: they are killed when the FILE ends (a test's own `after` would kill
// them after the test that started them).
const cleanups: (() => unknown)[] = [];
const fileCleanup = { after: (fn: () => unknown) => cleanups.push(fn) };

test.before(async () => {
  istiod = await startFakeIstiod({ dir });
  for (const ip of [ECHO, ECHO2]) echoServers.push(await startEchoServer(ip, 8080));
});
test.after(async () => {
  for (const fn of cleanups) await fn();
  await istiod?.close();
  for (const s of echoServers) await s.close?.();
});

function daemonEnv(node: string, extra: EnvInput = {}) {
  return istiodEnv(istiod, node, {
    AUTH_TOKEN: tokenPath,
    XDS_HEADER_X_TENANT: 'blue',
    CA_HEADER_X_CA_TENANT: 'green',
    ISTIO_META_DNS_CAPTURE: 'true',
    ISTIO_METAJSON_LABELS: '{"app":"ztunnel"}',
    RUST_LOG: 'info,xds=debug',
    ...extra,
  });
}

const sleepW = (version = 'v1') => workloadResource({ name: 'sleep', ip: SLEEP, node: 'node-a', version });
const echoW = (version = 'v1', services: Record<string, PortMap> = {}) =>
  workloadResource({ name: 'echo', ip: ECHO, node: 'node-b', version, services });

/** What these tests read of /config_dump: the mesh state and the certificates. */
type ConfigDump = MeshDump & { certificates: IdentityDump[] };

async function dump(d: Daemon): Promise<ConfigDump> {
  return JSON.parse((await httpGet(`${d.adminUrl}/config_dump`)).body);
}

/** Answers the initial requests of a new stream with `address` and `authz` resources, and waits for both ACKs. */
async function serve(stream: AdsStream, address: XdsResource[], authz: XdsResource[] = []) {
  const a = await stream.nextRequest(ADDRESS);
  const z = await stream.nextRequest(AUTHORIZATION);
  const ackA = await stream.pushAndWait(ADDRESS, { resources: address });
  const ackZ = await stream.pushAndWait(AUTHORIZATION, { resources: authz });
  return { initial: { [ADDRESS]: a, [AUTHORIZATION]: z }, acks: [ackA, ackZ] };
}

const through = throughSocks5;

let a: Daemon;
let b: Daemon;
let streamA: AdsStream;
let streamB: AdsStream;

test('first sync: pending until both types are ACKed, then ready; traffic between two xDS-only daemons', async (t) => {
  const startA = startDaemon({ node: 'node-a', config: {}, adminIp: A, env: daemonEnv('node-a'), cleanup: fileCleanup });
  streamA = await istiod.nextStream();
  const initA = { [ADDRESS]: await streamA.nextRequest(ADDRESS), [AUTHORIZATION]: await streamA.nextRequest(AUTHORIZATION) };

  await t.test('the stream carries the token, clusterid and XDS_HEADER_*', () => {
    assert.equal(streamA.metadata.authorization, 'Bearer token-one');
    assert.equal(streamA.metadata.clusterid, 'Kubernetes');
    assert.equal(streamA.metadata['x_tenant'], 'blue');
  });
  await t.test('node id, metadata, both type URLs in order, wildcard subscription, no versions yet', () => {
    assert.deepEqual(streamA.requests.slice(0, 2).map((r) => r.typeUrl), [ADDRESS, AUTHORIZATION]);
    const req = initA[ADDRESS];
    assert.equal(req.node!.id, 'ztunnel~10.0.0.1~ztunnel-node-a.istio-system~istio-system.svc.cluster.local');
    assert.equal(req.node!.metadata.NAME, 'ztunnel-node-a');
    assert.equal(req.node!.metadata.NAMESPACE, 'istio-system');
    assert.equal(req.node!.metadata.INSTANCE_IPS, '10.0.0.1');
    assert.equal(req.node!.metadata.NODE_NAME, 'node-a');
    assert.equal(req.node!.metadata.DNS_CAPTURE, 'true');
    assert.equal(req.node!.metadata.CLUSTER_ID, undefined);
    assert.deepEqual(req.node!.metadata.LABELS, { app: 'ztunnel' });
    for (const r of Object.values(initA)) {
      assert.deepEqual(r.resourceNamesSubscribe, []);
      assert.deepEqual(r.initialResourceVersions, {});
      assert.equal(r.responseNonce, '');
    }
  });

  // Only the Address type answered: still pending.
  const ackA = await streamA.pushAndWait(ADDRESS, { resources: [sleepW(), echoW()] });
  assert.equal(ackA.errorDetail, undefined);
  const r = await httpGet(`http://${A}:15021/healthz/ready`);
  assert.equal(r.status, 500);
  assert.match(r.body, /state manager/);
  const ackZ = await streamA.pushAndWait(AUTHORIZATION, { resources: [] });
  assert.equal(ackZ.errorDetail, undefined);
  a = await startA;

  const startB = startDaemon({ node: 'node-b', config: {}, adminIp: B, env: daemonEnv('node-b'), cleanup: fileCleanup });
  streamB = await istiod.nextStream();
  await serve(streamB, [sleepW(), echoW()]);
  b = await startB;

  // Certificates were asked for the local workloads only, each by its own daemon, with the CA headers.
  const ids = istiod.certRequests.map((c) => c.identity).sort();
  assert.deepEqual(ids, ['spiffe://cluster.local/ns/default/sa/echo', 'spiffe://cluster.local/ns/default/sa/sleep']);
  for (const c of istiod.certRequests) {
    assert.equal(c.metadata.authorization, 'Bearer token-one');
    assert.equal(c.metadata['x_ca_tenant'], 'green');
    assert.equal(c.ttlSeconds, 86400);
    assert.deepEqual(c.requestMetadata, { ImpersonatedIdentity: c.identity });
  }
  const dA = await dump(a);
  assert.deepEqual(dA.certificates.map((c) => [c.identity, c.state]), [['spiffe://cluster.local/ns/default/sa/sleep', 'Available']]);
  assert.equal(dA.certificates[0].rootCerts.length, 1);

  assert.equal(await through(SLEEP, ECHO), 0);
  const s = await a.metrics();
  assert.ok(sumSamples(s, 'istio_tcp_connections_opened_total', { reporter: 'source', connection_security_policy: 'mutual_tls', destination_workload: 'echo' }) >= 1);
  assert.ok(sumSamples(s, 'istio_xds_message_total', { url: ADDRESS }) >= 1);
  assert.ok(sumSamples(s, 'istio_xds_message_bytes_total', { url: ADDRESS }) > 0);
});

test('a batch with one bad workload: the rest applies, the NACK names the bad one, which keeps its old version', async () => {
  const bad = rawResource({ name: 'Kubernetes//Pod/default/echo', bytes: Uint8Array.from([0x0a, 0x03, 0xa2, 0x01, 0x00]), version: 'v2' });
  const legacy = workloadResource({ name: 'legacy', ip: '127.60.9.10', node: 'node-x', protocol: 2 });
  const noUid = workloadResource({ name: 'nouid', ip: '127.60.9.11', node: 'node-x', uid: '' });
  const badIp = workloadResource({ name: 'badip', node: 'node-x', extra: { addresses: [Uint8Array.from([1, 2, 3])] } });
  const good = workloadResource({ name: 'extra', ip: '127.60.9.12', node: 'node-x', version: 'v1' });
  const reply = await streamB.pushAndWait(ADDRESS, { resources: [bad, legacy, noUid, badIp, good] });
  assert.ok(reply.errorDetail, 'expected a NACK');
  const msg = reply.errorDetail.message;
  assert.match(msg, /Kubernetes\/\/Pod\/default\/echo: /);
  assert.match(msg, /Kubernetes\/\/Pod\/default\/legacy: tunnelProtocol LEGACY_ISTIO_MTLS/);
  assert.match(msg, /: workload has no uid/);
  assert.match(msg, /Kubernetes\/\/Pod\/default\/badip: addresses\[0\]: 3 bytes is not an IPv4/);
  assert.doesNotMatch(msg, /extra/);
  const d = await dump(b);
  const uids = d.workloads.map((w) => w.uid);
  assert.ok(uids.includes('Kubernetes//Pod/default/extra'), 'the good resource applied');
  assert.ok(!uids.includes('Kubernetes//Pod/default/legacy'));
  // echo keeps serving at its previous version.
  assert.equal(await through(SLEEP, ECHO), 0);

  // A later good version of echo applies (ACK).
  const ack = await streamB.pushAndWait(ADDRESS, { resources: [echoW('v3')] });
  assert.equal(ack.errorDetail, undefined);
  const ack2 = await streamA.pushAndWait(ADDRESS, { resources: [echoW('v3')] });
  assert.equal(ack2.errorDetail, undefined);
  // A bad policy is NACKed by name too.
  const z = await streamB.pushAndWait(AUTHORIZATION, {
    resources: [policyResource({ name: 'bad-scope', scope: 9 }), policyResource({ name: 'ok', rules: [{ clauses: [{ matches: [{ destinationPorts: [8080] }] }] }] })],
  });
  assert.match(z.errorDetail!.message, /^default\/bad-scope: scope: unknown enum value 9$/);
  assert.deepEqual((await dump(b)).policies.map((p) => `${p.namespace}/${p.name}`), ['default/ok']);
  const removeP = await streamB.pushAndWait(AUTHORIZATION, { removed: ['default/ok'] });
  assert.equal(removeP.errorDetail, undefined);
  assert.deepEqual((await dump(b)).policies, []);
});

test('services before and after their workloads; removals by name', async () => {
  // Service first: no endpoints yet.
  const svc = serviceResource({ name: 'echo2', vip: VIP2, ports: { 80: 8080 } });
  for (const s of [streamA, streamB]) assert.equal((await s.pushAndWait(ADDRESS, { resources: [svc] })).errorDetail, undefined);
  let d = await dump(a);
  assert.deepEqual(d.services.find((s) => s.name === 'echo2')!.endpoints, {});
  // Then its workload (a new local workload on node-b: certificate and listener follow).
  const echo2 = workloadResource({ name: 'echo2', ip: ECHO2, node: 'node-b', services: { 'default/echo2.default.svc.cluster.local': { 80: 8080 } } });
  for (const s of [streamA, streamB]) assert.equal((await s.pushAndWait(ADDRESS, { resources: [echo2] })).errorDetail, undefined);
  d = await dump(a);
  assert.deepEqual(Object.keys(d.services.find((s) => s.name === 'echo2')!.endpoints), ['Kubernetes//Pod/default/echo2']);
  await waitFor(async () => (await dump(b)).certificates.some((c) => c.identity.endsWith('/sa/echo2') && c.state === 'Available'), { message: 'echo2 certificate' });
  await waitFor(async () => (await through(SLEEP, VIP2, 80)) === 0, { message: 'traffic to the echo2 VIP', timeoutMs: 10_000 });

  // Workload first: its endpoint is staged until the service arrives.
  const echoSvc = serviceResource({ name: 'echo', vip: VIP, ports: { 80: 8080 } });
  const echoWithSvc = echoW('v4', { 'default/echo.default.svc.cluster.local': { 80: 8080 } });
  for (const s of [streamA, streamB]) assert.equal((await s.pushAndWait(ADDRESS, { resources: [echoWithSvc] })).errorDetail, undefined);
  d = await dump(a);
  assert.deepEqual(Object.keys(d.stagedServices), ['default/echo.default.svc.cluster.local']);
  for (const s of [streamA, streamB]) assert.equal((await s.pushAndWait(ADDRESS, { resources: [echoSvc] })).errorDetail, undefined);
  d = await dump(a);
  assert.deepEqual(d.stagedServices, {});
  assert.equal(await through(SLEEP, VIP, 80), 0);

  // Removals by name: the service (namespace/hostname) and the workload (uid). echo2's certificate goes with its
  // last workload, and so do its listeners.
  for (const s of [streamA, streamB]) {
    const r = await s.pushAndWait(ADDRESS, { removed: ['default/echo2.default.svc.cluster.local', 'Kubernetes//Pod/default/echo2'] });
    assert.equal(r.errorDetail, undefined);
  }
  d = await dump(b);
  assert.ok(!d.services.some((s) => s.name === 'echo2'));
  assert.ok(!d.workloads.some((w) => w.name === 'echo2'));
  await waitFor(async () => !(await dump(b)).certificates.some((c) => c.identity.endsWith('/sa/echo2')), { message: 'echo2 certificate forgotten' });
  assert.notEqual(await through(SLEEP, VIP2, 80), 0, 'the removed VIP no longer routes to echo2');
});

test('istiod crashes mid-traffic: live connections untouched, new ones route on the last state, reconnect with versions and backoff', async () => {
  const live = await socks5Request({ socks: { host: SLEEP, port: 15080 }, dest: { host: ECHO, port: 8080 } });
  assert.equal(live.code, 0);
  await echoOnce(live.socket, 'before');
  const versionsBefore = Object.fromEntries((await dump(a)).workloads.map((w) => [w.uid, true]));

  await istiod.crash();
  const crashedAt = Date.now();
  await echoOnce(live.socket, 'during');
  assert.equal(await through(SLEEP, ECHO), 0, 'a new connection routes on the last state');
  assert.equal(await through(SLEEP, VIP, 80), 0);
  // Down for ~2.5 s: the reconnect attempts back off (10 ms doubling), no tight loop.
  await new Promise((r) => setTimeout(r, 2500));
  const s = await a.metrics();
  const failures = sumSamples(s, 'istio_xds_connection_terminations_total', { reason: 'ConnectionError' });
  const all = ['ConnectionError', 'Error', 'Reconnect', 'Complete'].reduce((n, reason) => n + sumSamples(s, 'istio_xds_connection_terminations_total', { reason }), 0);
  assert.ok(all >= 2 && all <= 15, `terminations while down: ${all} (ConnectionError ${failures})`);
  assert.equal(await readiness(a), 200, 'the last good state keeps the node ready');
  // The gaps between failed attempts grow (10 ms doubling): the last gap is several times the first.
  const times = a.logs.filter((l) => l.message === 'XDS stream ended' && l.reason === 'ConnectionError').map((l) => Date.parse(l.time));
  const gaps = times.slice(1).map((t, i) => t - times[i]);
  assert.ok(gaps.length >= 3 && gaps[gaps.length - 1] >= 4 * Math.max(gaps[0], 10), `gaps between attempts: ${gaps.join(', ')} ms`);

  await istiod.start();
  const [sa, sb] = await Promise.all([istiod.nextStream(), istiod.nextStream()]);
  const byNode: [string, AdsStream][] = (await Promise.all([sa, sb].map(async (st) => [(await st.nextRequest(ADDRESS)).node!.id, st])));
  const newA = byNode.find(([id]) => id.includes('node-a'))![1];
  const newB = byNode.find(([id]) => id.includes('node-b'))![1];
  const reconnectReq = newA.requests.find((r) => r.typeUrl === ADDRESS)!;
  assert.ok(reconnectReq.at - crashedAt < 20_000);
  // initial_resource_versions names what the daemon holds, with the versions it accepted (not the NACKed v2).
  assert.equal(reconnectReq.initialResourceVersions['Kubernetes//Pod/default/echo'], 'v4');
  assert.equal(reconnectReq.initialResourceVersions['Kubernetes//Pod/default/sleep'], 'v1');
  assert.equal(reconnectReq.initialResourceVersions['default/echo.default.svc.cluster.local'], 'v1');
  for (const uid of Object.keys(versionsBefore)) assert.ok(uid in reconnectReq.initialResourceVersions || !uid.startsWith('Kubernetes'), uid);
  await echoOnce(live.socket, 'after');
  await closeSocket(live.socket);
  // The new istiod answers; everything still works, and the token file rotation shows on the next stream.
  writeFileSync(tokenPath, 'token-two\n');
  for (const st of [newA, newB]) {
    await st.nextRequest(AUTHORIZATION);
    assert.equal((await st.pushAndWait(ADDRESS, { resources: [] })).errorDetail, undefined);
    assert.equal((await st.pushAndWait(AUTHORIZATION, { resources: [] })).errorDetail, undefined);
  }
  assert.equal(await through(SLEEP, ECHO), 0);
  newA.end(); // graceful close: immediate reconnect, with the rotated token
  const again = await istiod.nextStream();
  assert.equal(again.metadata.authorization, 'Bearer token-two');
  const s2 = await a.metrics();
  assert.ok(sumSamples(s2, 'istio_xds_connection_terminations_total', { reason: 'Complete' }) >= 1);
});

test.afterEach(() => {
  if (process.env.XDS_TEST_DEBUG) for (const d of [a, b]) if (d) console.log(d.tail(60));
});

async function readiness(d: Daemon): Promise<number> {
  return (await httpGet(d.readinessUrl)).status;
}
