// TLS12_ENABLED and COMPLIANCE_POLICY=pqc as ztunnel's (istio/ztunnel src/tls/lib.rs: `provider` and `tls_versions`),
// on HBONE in and out. Three daemons share one built-in CA: node-a and node-b under pqc, node-c with TLS 1.2 enabled.
// `plain` is declared on node-x and played by a Node HBONE server whose OpenSSL (3.0 on Node 20) has no ML-KEM.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { makeTempDir, removeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import type { Daemon, EnvInput } from '../helpers/daemon.js';
import { startHboneServer, tunnelAttempt } from '../helpers/hbone.js';
import type { HboneServer, HboneSessionOptions } from '../helpers/hbone.js';
import { BLOCKS, block, socks5Request, socksRoundTrip, startEchoServer, waitFor } from '../helpers/net.js';
import { builtinCa, builtinLeaf, spiffe } from '../helpers/pki.js';
import type { Leaf } from '../helpers/pki.js';

const net = block(BLOCKS['tls-policy']);
const IP = { sleep: net.workload(1), echoA: net.workload(2), echoB: net.workload(3), plain: net.workload(4), echoC: net.workload(5) };
const APP_PORT = 8080;
const CONFIG = {
  workloads: [
    workload({ name: 'sleep', ip: IP.sleep, node: 'node-a' }),
    workload({ name: 'echo-a', sa: 'echo', ip: IP.echoA, node: 'node-a' }),
    workload({ name: 'echo-b', sa: 'echo', ip: IP.echoB, node: 'node-b' }),
    workload({ name: 'plain', ip: IP.plain, node: 'node-x' }),
    workload({ name: 'echo-c', sa: 'echo', ip: IP.echoC, node: 'node-c' }),
  ],
};
const PQC = { COMPLIANCE_POLICY: 'pqc' };

let caDir: string | undefined;
let certDir: string | undefined;
let root: string;
let leaf: Leaf;
let plain: HboneServer;
const daemons: Record<string, Daemon> = {};
const closers: (() => Promise<void>)[] = [];

before(async () => {
  caDir = makeTempDir('ztn-tls-policy-ca-');
  certDir = makeTempDir('ztn-tls-policy-certs-');
  for (const ip of [IP.echoA, IP.echoB, IP.echoC]) closers.push((await startEchoServer(ip, APP_PORT)).close);
  const start = (node: string, i: number, env: EnvInput) =>
    startDaemon({ node, config: CONFIG, caDir, adminIp: net.admin(i), env });
  [daemons.a, daemons.b, daemons.c] = await Promise.all([start('node-a', 1, PQC), start('node-b', 2, PQC), start('node-c', 3, { TLS12_ENABLED: 'true' })]);
  root = builtinCa(caDir).certPem;
  leaf = builtinLeaf(certDir, caDir, [spiffe('default', 'sleep')], 'client');
  const plainLeaf = builtinLeaf(certDir, caDir, [spiffe('default', 'plain')], 'plain');
  plain = await startHboneServer({ host: IP.plain, cert: plainLeaf.certPem, key: plainLeaf.keyPem, ca: root });
  closers.push(plain.close);
});

after(async () => {
  await Promise.all([...Object.values(daemons).map((d) => d.kill()), ...closers.map((c) => c())]);
  for (const d of [caDir, certDir]) if (d) removeTempDir(d);
});

/** The whole HBONE exchange with the daemon serving `ip`, as `sleep`, to its echo app. */
const attempt = (ip: string, opts: Partial<HboneSessionOptions> = {}) =>
  tunnelAttempt({ host: ip, ca: root, cert: leaf.certPem, key: leaf.keyPem, expectServerId: spiffe('default', 'echo'), target: `${ip}:${APP_PORT}`, ...opts });

test('pqc: a client that offers only X25519 is refused at the handshake; without pqc the same client is served', async () => {
  const failures0 = await daemons.a.metric('ztunnel_node_tls_handshake_failures_total', { direction: 'inbound' });
  const refused = await attempt(IP.echoA, { ecdhCurve: 'X25519' });
  assert.match(refused, /^refused: .*handshake failure/, refused);
  await waitFor(async () => (await daemons.a.metric('ztunnel_node_tls_handshake_failures_total', { direction: 'inbound' })) > failures0, {
    message: 'the refusal counted as an inbound handshake failure',
  });
  // Every group this Node's OpenSSL has (none of them ML-KEM on Node 20): refused too.
  assert.match(await attempt(IP.echoA, { ecdhCurve: 'X25519:P-256:P-384' }), /^refused: /);
  assert.equal(await attempt(IP.echoC, { ecdhCurve: 'X25519' }), 'tunnel open', 'node-c (no pqc) serves the X25519 client');
});

test('pqc in and out: node-a reaches node-b, both speaking X25519MLKEM768 only', async () => {
  const payload = Buffer.alloc(256 * 1024, 7);
  const r = await socksRoundTrip({ socks: { host: IP.sleep, port: 15080 }, dest: { host: IP.echoB, port: APP_PORT }, payload });
  assert.equal(r.error, undefined, `the tunnel failed: ${r.error?.message}`);
  assert.equal(r.bytes, payload.length);
  assert.equal(r.sha256, createHash('sha256').update(payload).digest('hex'));
  const opened = await daemons.b.metric('istio_tcp_connections_opened_total', { reporter: 'destination', source_workload: 'sleep' });
  assert.equal(opened, 1, 'node-b counted the inbound HBONE connection');
});

test('pqc outbound: a peer without X25519MLKEM768 gets no session, and nothing falls back', async () => {
  const failedTls = () =>
    daemons.a.metric('istio_tcp_connections_failed_total', { reporter: 'source', destination_workload: 'plain', response_flags: 'TLS_FAILURE' });
  const r = await socks5Request({ socks: { host: IP.sleep, port: 15080 }, dest: { host: IP.plain, port: APP_PORT } });
  r.socket?.destroy();
  assert.notEqual(r.code, null, `the SOCKS5 entry answered (${r.error?.message})`);
  assert.notEqual(r.code, 0x00, 'the SOCKS5 request failed');
  await waitFor(async () => (await failedTls()) >= 1, { message: 'istio_tcp_connections_failed_total{response_flags="TLS_FAILURE"}' });
  assert.equal(plain.record.sessions, 0, 'the classical peer got an HTTP/2 session');
  assert.equal(plain.record.streams.length, 0);
});

test('TLS12_ENABLED: a TLS 1.2 client is served (ECDHE AES-GCM) beside TLS 1.3; under pqc it is refused', async () => {
  const tls12 = { minVersion: 'TLSv1.2', maxVersion: 'TLSv1.2' } as const;
  assert.equal(await attempt(IP.echoC, tls12), 'tunnel open');
  assert.equal(await attempt(IP.echoC), 'tunnel open', 'TLS 1.3 as ever');
  // Only the suites ztunnel enables: a TLS 1.2 client offering CBC alone finds none.
  assert.match(await attempt(IP.echoC, { ...tls12, ciphers: 'ECDHE-ECDSA-AES128-SHA256' }), /^refused: .*handshake failure/);
  assert.match(await attempt(IP.echoA, tls12), /^refused: .*protocol version/, 'node-a (pqc, no TLS 1.2)');
});

test('the daemons exit 0 on SIGTERM', async () => {
  for (const d of Object.values(daemons)) assert.equal((await d.stop()).code, 0);
});
