// The node's buffer budget (issue: hardening, item 2): HBONE clients that open many streams to an application that
// sends without end, then stop reading. Without a budget the daemon buffered 400 KiB per stream (h2's send buffer),
// +80 MiB per connection, and kept the memory after the attacker left. Asserted here, on the daemon's own figures
// (its /metrics and /proc/<pid>/status): the buffered bytes stay near the budget, the largest holders are shed with a
// warning and a counter, a legitimate round trip keeps working, and the buffers and the resident size come back
// once the attackers are gone.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import type { ClientHttp2Session } from 'node:http2';
import { makeTempDir, removeTempDir, startDaemon, workload, type Daemon } from '../helpers/daemon.js';
import { echoRoundTrip, hboneSession } from '../helpers/hbone.js';
import { BLOCKS, block, startEchoServer, startFirehoseServer, startStallingRelay, waitFor } from '../helpers/net.js';
import { builtinCa, builtinLeaf, spiffe, type Leaf } from '../helpers/pki.js';
import { PYTHON } from '../helpers/prereqs.js';

const net = block(BLOCKS['buffer-budget']);
const APP_IP = net.workload(1);
const RELAY_IP = net.workload(2);
const ECHO_PORT = 8080;
const FIREHOSE_PORT = 8082;
/** An application that accepts and never reads (a 4 KiB receive buffer): uploads to it stay in the daemon. */
const SINK_PORT = 8083;
const RELAY_PORT = 15008;
const MiB = 1024 * 1024;
const BUDGET = 32 * MiB;
const CONNECTIONS = 10;
const STREAMS = 100;

let daemon: Daemon;
let caDir: string;
let certDir: string;
let root: string;
let client: Leaf;
const closers: (() => unknown)[] = [];

before(async () => {
  caDir = makeTempDir('ztn-budget-ca-');
  certDir = makeTempDir('ztn-budget-certs-');
  const echo = await startEchoServer(APP_IP, ECHO_PORT);
  closers.push(echo.close);
  const firehose = await startFirehoseServer(APP_IP, FIREHOSE_PORT);
  closers.push(firehose.close);
  const { spawn } = await import('node:child_process');
  const sink = spawn(PYTHON, ['-c', `import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096); s.bind(("${APP_IP}", ${SINK_PORT})); s.listen(1024)
print("listening", flush=True)
held = []
while True:
    c, _ = s.accept(); held.append(c)`], { stdio: ['ignore', 'pipe', 'inherit'] });
  closers.push(() => sink.kill('SIGKILL'));
  await new Promise((resolve) => sink.stdout.once('data', resolve));
  daemon = await startDaemon({
    node: 'node-a',
    config: { workloads: [workload({ name: 'app', ip: APP_IP, node: 'node-a' })] },
    caDir,
    adminIp: net.admin(1),
    env: { STREAM_BUFFER_BUDGET: String(BUDGET) },
  });
  root = builtinCa(caDir).certPem;
  client = builtinLeaf(certDir, caDir, [spiffe('default', 'attacker')], 'attacker');
});

after(async () => {
  await Promise.all([daemon?.kill(), ...closers.map((c) => c())]);
  for (const d of [caDir, certDir]) if (d) removeTempDir(d);
});

const rss = () => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${daemon.child.pid}/status`, 'utf8'))![1]) * 1024;
const gauge = async (name: string) => daemon.metric(name);
const fds = () => readdirSync(`/proc/${daemon.child.pid}/fd`).length;
/** TCP sockets of this block left half-closed (CLOSE-WAIT, FIN-WAIT-2), on either side. */
const halfClosed = () =>
  execFileSync('ss', ['-Htan', 'state', 'close-wait', 'state', 'fin-wait-2'], { encoding: 'utf8' })
    .split('\n')
    .filter((l) => l.includes('127.69.')).length;

const roundTrip = () => echoRoundTrip({ host: APP_IP, ca: root, cert: client.chainPem, key: client.keyPem }, `${APP_IP}:${ECHO_PORT}`);

test('ten connections that stop reading stay within the buffer budget: the largest are shed, legitimate traffic flows, memory comes back', async () => {
  await roundTrip();
  assert.equal(await gauge('ztunnel_node_buffer_budget_bytes'), BUDGET);
  const baseline = rss();
  const baseFds = fds();
  const relay = await startStallingRelay({ host: RELAY_IP, port: RELAY_PORT }, { host: APP_IP, port: 15008 });
  closers.push(relay.close);
  // Windows as large as HTTP/2 allows: only the daemon's own limits bound what it may buffer for these clients.
  const sessions: ClientHttp2Session[] = [];
  for (let i = 0; i < CONNECTIONS; i++) {
    const s = await hboneSession({
      host: APP_IP,
      via: { host: RELAY_IP, port: RELAY_PORT },
      ca: root,
      cert: client.chainPem,
      key: client.keyPem,
      settings: { initialWindowSize: 2 ** 31 - 1 },
    });
    s.setLocalWindowSize(2 ** 31 - 1);
    s.on('error', () => {});
    sessions.push(s);
  }
  relay.stall();
  for (const s of sessions) {
    for (let k = 0; k < STREAMS; k++) {
      const st = s.request({ ':method': 'CONNECT', ':authority': `${APP_IP}:${FIREHOSE_PORT}` }, { endStream: false });
      st.on('error', () => {});
    }
  }
  // 1,000 streams × 400 KiB would be about 400 MiB without the budget. Sample for 8 s.
  let peakBuffered = 0;
  let peakRss = 0;
  const legit: Promise<number>[] = [];
  const until = Date.now() + 8000;
  while (Date.now() < until) {
    peakBuffered = Math.max(peakBuffered, await gauge('ztunnel_node_buffered_bytes'));
    peakRss = Math.max(peakRss, rss());
    legit.push(roundTrip());
    await new Promise((r) => setTimeout(r, 400));
  }
  await Promise.all(legit); // every legitimate round trip during the attack succeeded
  const shed = await gauge('ztunnel_node_buffer_shed_connections_total');
  const backpressured = await gauge('ztunnel_node_buffer_backpressured_streams_total');
  const growth = peakRss - baseline;
  const detail = `peak buffered ${(peakBuffered / MiB).toFixed(1)} MiB, RSS +${(growth / MiB).toFixed(1)} MiB, shed ${shed}, backpressured ${backpressured}`;
  // Over the budget by at most one read per stream (≤ 16 KiB × 1,000) and 1 MiB per light connection.
  assert.ok(peakBuffered > BUDGET / 2, `the attack reached the budget (${detail})`);
  assert.ok(peakBuffered <= 2 * BUDGET, `buffered data stays near the budget (${detail})`);
  assert.ok(growth <= 2 * BUDGET + 48 * MiB, `the daemon's memory follows the budget (${detail})`);
  assert.ok(shed >= 1, `the largest holders were shed (${detail})`);
  assert.ok(backpressured >= 1, `heavy connections were held back first (${detail})`);
  await waitFor(() => daemon.logs.some((l) => /shed: the node's buffered stream data is over its budget/.test(l.message ?? '')), {
    timeoutMs: 5000,
    message: 'the shedding warning',
  });

  for (const s of sessions) s.destroy();
  await relay.close();
  // Everything buffered goes with the connections, and the heap is given back to the kernel.
  await waitFor(async () => (await gauge('ztunnel_node_buffered_bytes')) === 0, { timeoutMs: 10_000, message: 'buffers released' });
  await waitFor(() => rss() <= baseline + 32 * MiB, {
    timeoutMs: 10_000,
    message: `RSS back within 32 MiB of its baseline (${(baseline / MiB).toFixed(0)} MiB)`,
  });
  // Descriptors back to where they were, and no half-closed sockets left behind once the hostile peers are gone.
  await waitFor(() => fds() <= baseFds + 2, { timeoutMs: 10_000, message: `descriptors back to ${baseFds}` });
  await waitFor(() => halfClosed() === 0, { timeoutMs: 10_000, message: 'no CLOSE-WAIT or FIN-WAIT-2 sockets' });
  await roundTrip();
  console.log(`# buffer budget ${BUDGET / MiB} MiB: ${detail}; RSS after ${((rss() - baseline) / MiB).toFixed(1)} MiB over baseline`);
});

test('uploads to an application that does not read: held data counts toward the budget, the largest holders are shed, memory comes back', async () => {
  await roundTrip();
  const baseline = rss();
  const shed0 = await gauge('ztunnel_node_buffer_shed_connections_total');
  // Each connection may send what its windows allow (4 streams × 4 MiB = its 16 MiB connection window): 160 MiB in
  // all, against a 32 MiB budget. The daemon cannot refuse data it granted a window for; it sheds.
  const sessions: ClientHttp2Session[] = [];
  const chunk = Buffer.alloc(4 * MiB, 0x61);
  for (let i = 0; i < CONNECTIONS; i++) {
    const s = await hboneSession({ host: APP_IP, ca: root, cert: client.chainPem, key: client.keyPem });
    s.on('error', () => {});
    sessions.push(s);
    for (let k = 0; k < 4; k++) {
      const st = s.request({ ':method': 'CONNECT', ':authority': `${APP_IP}:${SINK_PORT}` }, { endStream: false });
      st.on('error', () => {});
      st.on('response', () => st.write(chunk));
    }
  }
  let peak = 0;
  await waitFor(
    async () => {
      const b = await gauge('ztunnel_node_buffered_bytes');
      peak = Math.max(peak, b);
      return (await gauge('ztunnel_node_buffer_shed_connections_total')) > shed0 && b <= BUDGET;
    },
    { timeoutMs: 20_000, intervalMs: 200, message: 'shedding until under the budget' },
  );
  assert.ok(peak > BUDGET, `the uploads were counted (peak ${(peak / MiB).toFixed(1)} MiB)`);
  assert.ok(peak <= CONNECTIONS * 16 * MiB + 8 * MiB, `bounded by the windows granted (peak ${(peak / MiB).toFixed(1)} MiB)`);
  await roundTrip();
  // The clients leave: streams still blocked on the application end 5 s after their connection (what h2 held for
  // them goes with them).
  for (const s of sessions) s.destroy();
  await waitFor(async () => (await gauge('ztunnel_node_buffered_bytes')) === 0, { timeoutMs: 15_000, intervalMs: 250, message: 'buffers released' });
  await waitFor(() => rss() <= baseline + 32 * MiB, { timeoutMs: 10_000, message: `RSS back within 32 MiB of its baseline (${(baseline / MiB).toFixed(0)} MiB)` });
  console.log(`# uploads to a non-reading application: peak held ${(peak / MiB).toFixed(1)} MiB, shed ${(await gauge('ztunnel_node_buffer_shed_connections_total')) - shed0}`);
});
