// mTLS refusals, both directions. The target application behind each refusal is a counting server: a refusal is
// only a refusal if ZERO connections and ZERO bytes reach it. A final control proves the same path does deliver
// when the certificate is right, so the zeros above cannot come from a broken harness.
//
// One daemon (node-a) hosts `echo` (inbound target) and `sleep` (outbound source). `impostor` is declared on
// node-b as serviceAccount echo; the test plays node-b with a Node HTTP/2 server whose certificate chains to the
// built-in CA but says .../sa/evil.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { makeTempDir, removeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import type { Daemon } from '../helpers/daemon.js';
import { startHboneServer, tunnelAttempt } from '../helpers/hbone.js';
import type { HboneSessionOptions } from '../helpers/hbone.js';
import { BLOCKS, block, socks5Request, startCountingServer, waitFor } from '../helpers/net.js';
import type { TestServer } from '../helpers/net.js';
import { builtinCa, builtinLeaf, makeCa, makeLeaf, spiffe } from '../helpers/pki.js';

const net = block(BLOCKS['tls-refusals']);
const SLEEP_IP = net.workload(1);
const ECHO_IP = net.workload(2);
const IMPOSTOR_IP = net.workload(3);
const APP_PORT = 8080;

const ECHO_ID = spiffe('default', 'echo');

const CONFIG = {
  workloads: [
    workload({ name: 'sleep', ip: SLEEP_IP, node: 'node-a' }),
    workload({ name: 'echo', ip: ECHO_IP, node: 'node-a' }),
    // Declared as .../sa/echo: that is the only identity node-a may accept at IMPOSTOR_IP:15008.
    workload({ name: 'impostor', sa: 'echo', ip: IMPOSTOR_IP, node: 'node-b' }),
  ],
};

let daemon: Daemon;
let caDir: string;
let certDir: string;
let root: string;
let app: TestServer;
const closers: (() => Promise<void>)[] = [];

after(async () => {
  await Promise.all([daemon?.kill(), ...closers.map((c) => c())]);
  for (const d of [caDir, certDir]) if (d) removeTempDir(d);
});

before(async () => {
  caDir = makeTempDir('ztn-refusals-ca-');
  certDir = makeTempDir('ztn-refusals-certs-');
  app = await startCountingServer(ECHO_IP, APP_PORT);
  closers.push(app.close);
  daemon = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(1) });
  root = builtinCa(caDir).certPem;
});

const handshakeFailures = (direction: string) =>
  daemon.metric('ztunnel_node_tls_handshake_failures_total', { direction });

/** The whole HBONE exchange to the echo app (`tunnelAttempt`). */
const attempt = (opts: Partial<HboneSessionOptions>) =>
  tunnelAttempt({ host: ECHO_IP, ca: root, target: `${ECHO_IP}:${APP_PORT}`, ...opts });

/**
 * Asserts the attempt is refused during the TLS handshake (the daemon's alert matches `alert`), counted as an
 * inbound handshake failure, and that the app saw nothing.
 */
async function assertRefused(opts: Partial<HboneSessionOptions>, what: string, alert: RegExp): Promise<void> {
  const failures0 = await handshakeFailures('inbound');
  const outcome = await attempt(opts);
  assert.match(outcome, /^refused: /, `${what}: ${outcome}`);
  assert.match(outcome, alert, `${what}: the TLS alert the daemon sent`);
  await waitFor(async () => (await handshakeFailures('inbound')) > failures0, {
    message: `${what}: ztunnel_node_tls_handshake_failures_total{direction="inbound"} to go up`,
  });
  assert.equal(app.stats.accepted, 0, `${what}: a connection reached the app`);
  assert.equal(app.stats.bytes, 0, `${what}: bytes reached the app`);
  const opened = await daemon.metric('istio_tcp_connections_opened_total', { reporter: 'destination' });
  assert.equal(opened, 0, `${what}: the daemon counted an inbound connection`);
}

test('inbound: no client certificate', async () => {
  await assertRefused({}, 'no client certificate', /alert certificate required/);
});

test('inbound: a client certificate from another CA', async () => {
  const foreign = makeCa(certDir, 'foreign-ca');
  const leaf = makeLeaf(certDir, foreign, [spiffe('default', 'sleep')], 'foreign-leaf');
  await assertRefused({ cert: leaf.chainPem, key: leaf.keyPem }, 'certificate from another CA', /alert unknown ca/);
});

test('inbound: a built-in CA certificate in another trust domain (spiffe://evil.local/...)', async () => {
  const leaf = builtinLeaf(certDir, caDir, [spiffe('default', 'sleep', 'evil.local')], 'evil-td');
  await assertRefused({ cert: leaf.certPem, key: leaf.keyPem }, 'other trust domain', /alert (certificate unknown|bad certificate)/);
});

test('inbound: a TLS 1.2-only client with a valid certificate', async () => {
  const leaf = builtinLeaf(certDir, caDir, [spiffe('default', 'sleep')], 'tls12');
  await assertRefused({ cert: leaf.certPem, key: leaf.keyPem, minVersion: 'TLSv1.2', maxVersion: 'TLSv1.2' }, 'TLS 1.2 only', /alert protocol version/);
});

test('inbound: a built-in CA certificate with two SPIFFE SANs', async () => {
  const leaf = builtinLeaf(certDir, caDir, [spiffe('default', 'sleep'), spiffe('default', 'admin')], 'two-sans');
  await assertRefused({ cert: leaf.certPem, key: leaf.keyPem }, 'two SPIFFE SANs', /alert (certificate unknown|bad certificate)/);
});

test('inbound: a valid certificate without ALPN h2 is closed before any HTTP/2', async () => {
  const leaf = builtinLeaf(certDir, caDir, [spiffe('default', 'sleep')], 'no-alpn');
  const failures0 = await handshakeFailures('inbound');
  const outcome = await attempt({ cert: leaf.certPem, key: leaf.keyPem, expectServerId: ECHO_ID, alpn: null });
  assert.match(outcome, /^refused: /, outcome);
  await waitFor(async () => (await handshakeFailures('inbound')) > failures0, { message: 'the refusal counted as an inbound handshake failure' });
  const log = await daemon.waitForLog((l) => l.target === 'access' && l.error === 'the client did not negotiate ALPN h2', { message: 'the refusal logged' });
  assert.equal(log.direction, 'inbound');
  assert.equal(app.stats.accepted, 0, 'a connection reached the app');
});

test('outbound: a server with a built-in CA certificate but the wrong identity gets no CONNECT, and nothing falls back to plaintext', async () => {
  const realApp = await startCountingServer(IMPOSTOR_IP, APP_PORT);
  closers.push(realApp.close);
  const evil = builtinLeaf(certDir, caDir, [spiffe('default', 'evil')], 'evil');
  const impostor = await startHboneServer({ host: IMPOSTOR_IP, cert: evil.certPem, key: evil.keyPem, ca: root });
  closers.push(impostor.close);
  const failures0 = await handshakeFailures('outbound');

  const r = await socks5Request({ socks: { host: SLEEP_IP, port: 15080 }, dest: { host: IMPOSTOR_IP, port: APP_PORT } });
  r.socket?.destroy();
  assert.notEqual(r.code, null, `the SOCKS5 entry answered (${r.error?.message})`);
  assert.notEqual(r.code, 0x00, 'the SOCKS5 request failed');

  assert.ok((await handshakeFailures('outbound')) > failures0, 'ztunnel_node_tls_handshake_failures_total{direction="outbound"} went up');
  const failedTls = () =>
    daemon.metric('istio_tcp_connections_failed_total', { reporter: 'source', destination_workload: 'impostor', response_flags: 'TLS_FAILURE' });
  // Counted as the failed connection is dropped, just after the reply: poll briefly.
  await waitFor(async () => (await failedTls()) >= 1, { message: 'istio_tcp_connections_failed_total{response_flags="TLS_FAILURE"}' });
  assert.equal(await failedTls(), 1);
  assert.equal(impostor.record.streams.length, 0, 'the impostor received a CONNECT stream');
  assert.equal(impostor.record.sessions, 0, 'the impostor got an HTTP/2 session');
  assert.equal(realApp.stats.accepted, 0, 'the app behind the impostor was reached directly (plaintext fallback)');
  assert.equal(realApp.stats.bytes, 0);
});

test('control: the same inbound path delivers with a valid built-in CA certificate', async () => {
  const leaf = builtinLeaf(certDir, caDir, [spiffe('default', 'sleep')], 'good');
  const outcome = await attempt({ cert: leaf.certPem, key: leaf.keyPem, expectServerId: ECHO_ID });
  assert.equal(outcome, 'tunnel open');
  await waitFor(() => app.stats.bytes === 'these bytes must never reach the app'.length, { message: 'the bytes at the app' });
  assert.equal(app.stats.accepted, 1);
});

test('the daemon exits 0 on SIGTERM', async () => {
  assert.equal((await daemon.stop()).code, 0);
});
