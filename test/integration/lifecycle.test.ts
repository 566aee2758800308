// The daemon's life as an operator sees it: SIGTERM with a live tunnelled connection (drain, deadline, exit 0),
// `ztunnel-node version`, and the one-command demo.
import { test } from 'node:test';
import type { TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import type { Socket } from 'node:net';
import { join } from 'node:path';
import { socks5Connect } from '../../dist/cli/socks5-client.js';
import { makeTempDir, removeTempDir, runCli, startDaemon, workload } from '../helpers/daemon.js';
import type { Daemon, EnvInput } from '../helpers/daemon.js';
import { BLOCKS, block, echoOnce, httpGet, socks5Request, startEchoServer } from '../helpers/net.js';
import type { TestServer } from '../helpers/net.js';

const net = block(BLOCKS.lifecycle);
const BIN = join(import.meta.dirname, '..', '..', 'bin', 'ztunnel-node.js');
const SLEEP_IP = net.workload(1);
const ECHO_IP = net.workload(2);
const ECHO_PORT = 8080;
const SOCKS = { host: SLEEP_IP, port: 15080 };

const CONFIG = {
  workloads: [
    workload({ name: 'sleep', ip: SLEEP_IP, node: 'node-a' }),
    workload({ name: 'echo', ip: ECHO_IP, node: 'node-b' }),
  ],
};

/** Two nodes and the echo app, torn down with the test. `env` per node. */
async function topology(
  t: TestContext,
  { envA = {}, envB = {} }: { envA?: EnvInput; envB?: EnvInput } = {},
): Promise<{ a: Daemon; b: Daemon; echo: TestServer }> {
  const caDir = makeTempDir('ztn-lifecycle-ca-');
  const echo = await startEchoServer(ECHO_IP, ECHO_PORT);
  t.after(async () => {
    await echo.close();
    removeTempDir(caDir);
  });
  const [a, b] = await Promise.all([
    startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(1), env: envA, cleanup: t }),
    startDaemon({ node: 'node-b', config: CONFIG, caDir, adminIp: net.admin(2), env: envB, cleanup: t }),
  ]);
  return { a, b, echo };
}

/** Resolves the time at which `socket` closed (it must not be closed yet). */
const closedAt = (socket: Socket): Promise<number> =>
  new Promise((resolve) => {
    socket.on('error', () => undefined);
    socket.once('close', () => resolve(Date.now()));
  });

/**
 * SIGTERM to `victim` while a tunnelled connection is open: the connection keeps working during the drain, new
 * connections are refused, the connection is closed at the deadline, and the daemon exits 0.
 */
async function drainWithLiveConnection(
  { victim, deadlineMs, other }: { victim: Daemon; deadlineMs: number; other: Daemon },
): Promise<void> {
  const socket = await socks5Connect({ proxyHost: SOCKS.host, proxyPort: SOCKS.port, destHost: ECHO_IP, destPort: ECHO_PORT });
  const closed = closedAt(socket);
  await echoOnce(socket, 'before SIGTERM\n');

  victim.terminate();
  const sigterm = victim.terminatedAt!;
  const draining = await victim.waitForLog((l) => l.message === 'draining', { message: 'the "draining" log' });
  assert.equal(draining.deadlineMs, deadlineMs, 'the drain deadline the daemon announced');

  // Draining is not dropping: the live connection still carries bytes both ways.
  await echoOnce(socket, 'during the drain\n');
  assert.ok(Date.now() - sigterm < deadlineMs, 'the exchange happened before the deadline (the test was too slow to prove anything)');
  // The readiness probe no longer says ready (the admin servers stop at the start of the drain).
  const ready = await httpGet(victim.readinessUrl, { timeoutMs: 1_000 }).catch((err) => ({ status: err.code }));
  assert.notEqual(ready.status, 200, 'readiness during the drain');

  const at = await closed;
  const { code, ms } = await victim.stop({ timeoutMs: deadlineMs + 5_000 });
  assert.equal(code, 0);
  const closedAfter = at - sigterm;
  assert.ok(closedAfter >= deadlineMs - 100, `the live connection was closed ${closedAfter} ms after SIGTERM, before the ${deadlineMs} ms deadline`);
  assert.ok(closedAfter <= deadlineMs + 2_500, `the live connection was still open ${closedAfter} ms after SIGTERM (deadline ${deadlineMs} ms)`);
  assert.ok(ms <= deadlineMs + 4_000, `exit ${ms} ms after SIGTERM`);
  assert.ok(
    victim.logs.some((l) => l.message === 'drain deadline reached; remaining connections were closed'),
    'the daemon logged that it closed connections at the deadline',
  );
  assert.ok(victim.logs.some((l) => l.message === 'shutdown complete'), 'the daemon logged the end of the shutdown');
  // The other node is unaffected.
  await other.waitReady(2_000);
}

test('SIGTERM on the source node (TERMINATION_GRACE_PERIOD_SECONDS=3): drains, closes the connection at 2 s, exits 0', async (t) => {
  const { a, b } = await topology(t, { envA: { CONNECTION_TERMINATION_DEADLINE: undefined, TERMINATION_GRACE_PERIOD_SECONDS: '3' } });
  await drainWithLiveConnection({ victim: a, deadlineMs: 2_000, other: b });
  // Its SOCKS5 entry is gone with it.
  const r = await socks5Request({ socks: SOCKS, dest: { host: ECHO_IP, port: ECHO_PORT }, timeoutMs: 2_000 });
  assert.equal(r.code, null, 'a new SOCKS5 connection after shutdown');
  assert.equal(r.error?.code, 'ECONNREFUSED');
  assert.equal((await b.stop()).code, 0);
});

test('SIGTERM on the destination node (CONNECTION_TERMINATION_DEADLINE=2000ms): drains, closes the connection at the deadline, exits 0', async (t) => {
  const { a, b } = await topology(t, { envB: { CONNECTION_TERMINATION_DEADLINE: '2000ms' } });
  await drainWithLiveConnection({ victim: b, deadlineMs: 2_000, other: a });

  // node-b comes back: node-a must not reuse the pooled connection node-b closed, but open a new one.
  const opened0 = await a.metric('ztunnel_node_hbone_connections_opened_total', { direction: 'outbound' });
  const b2 = await startDaemon({ node: 'node-b', config: CONFIG, caDir: b.env.LOCAL_CA_DIR, adminIp: net.admin(2), cleanup: t });
  const socket = await socks5Connect({ proxyHost: SOCKS.host, proxyPort: SOCKS.port, destHost: ECHO_IP, destPort: ECHO_PORT });
  await echoOnce(socket, 'after node-b restarted\n');
  socket.destroy();
  assert.equal(await a.metric('ztunnel_node_hbone_connections_opened_total', { direction: 'outbound' }), opened0 + 1);
  assert.equal(await a.metric('ztunnel_node_hbone_connections_active', { direction: 'outbound' }), 1, 'the connection to the old node-b is gone');
  const [ra, rb] = await Promise.all([a.stop(), b2.stop()]);
  assert.equal(ra.code, 0);
  assert.equal(rb.code, 0);
});

test('readiness answers from the first moment: "not ready" while the daemon loads, on the same server once it runs', async (t) => {
  const caDir = makeTempDir('ztn-lifecycle-early-');
  t.after(() => removeTempDir(caDir));
  const addr = `${net.admin(3)}:15021`;
  const child = spawn(process.execPath, [BIN, 'proxy'], {
    env: { PATH: process.env.PATH, PROXY_MODE: 'local', NODE_NAME: 'node-c', LOCAL_CA_DIR: caDir, LOG_FORMAT: 'json', XDS_ADDRESS: '', CA_ADDRESS: '', READINESS_ADDR: addr, ADMIN_ADDR: `${net.admin(3)}:15000`, STATS_ADDR: `${net.admin(3)}:15020` },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  t.after(() => child.kill('SIGKILL'));
  let listeningLogged: number | null = null;
  let out = '';
  child.stdout.on('data', (d) => {
    out += d;
    if (listeningLogged === null && out.includes('"admin servers listening"')) listeningLogged = performance.now();
  });
  const answers: { status: number; body: string; at: number }[] = [];
  for (let i = 0; i < 2000; i++) {
    const r = await httpGet(`http://${addr}/healthz/ready`, { timeoutMs: 1_000 }).catch(() => null);
    if (r !== null && answers.at(-1)?.body !== r.body) answers.push({ status: r.status, body: r.body, at: performance.now() });
    if (r?.status === 200) break;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  assert.deepEqual(answers.map((a) => `${a.status} ${a.body}`).at(-1), '200 ready\n');
  // Answered before the daemon's modules had loaded and its servers were set up, with what it is about to do.
  assert.deepEqual([answers[0].status, answers[0].body], [500, 'not ready, pending: certificates, proxy, state manager\n']);
  assert.ok(listeningLogged !== null && answers[0].at < listeningLogged, 'the first answer came before "admin servers listening"');
});

test('`ztunnel-node version` prints the version and the crypto provider', async () => {
  const r = await runCli(['version']);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /^ztunnel-node \d+\.\d+\.\d+/m);
  assert.match(r.stdout, /^crypto provider: (aws-lc-rs|ring)$/m);
});

test('`ztunnel-node demo --no-wait` exits 0 and prints both identities', async () => {
  const caDir = makeTempDir('ztn-demo-ca-');
  try {
    const r = await runCli(['demo', '--no-wait', '--ca-dir', caDir], { timeoutMs: 40_000 });
    assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, /source identity\s+spiffe:\/\/cluster\.local\/ns\/default\/sa\/sleep\n/);
    assert.match(r.stdout, /destination identity\s+spiffe:\/\/cluster\.local\/ns\/default\/sa\/echo\n/);
    assert.match(r.stdout, /mTLS\s+yes/);
    assert.match(r.stdout, /messages echoed\s+3\/3/);
    // The name was resolved through sleep's DNS proxy, and the connection went to the answer (the service VIP).
    assert.match(r.stdout, /DNS\s+echo\.default\.svc\.cluster\.local -> 127\.10\.0\.10 \(sleep's DNS proxy 127\.0\.1\.10:15053/);
    assert.match(r.stdout, /connected to\s+127\.10\.0\.10:80, the service VIP/);
  } finally {
    removeTempDir(caDir);
  }
});
