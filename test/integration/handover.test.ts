// Hand-over between two daemons of one node (local mode): a second node-a daemon started on the first one's
// HANDOVER_SOCKET takes its established connections, and the first exits 0. The connections are long-lived streams
// of random bytes both ways, each direction's sha256 and length checked after the restart and at the end: nothing
// lost, duplicated or reordered, no reset. What is asserted is what an operator sees: the bytes, exit codes, the log
// lines and the metrics.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import type { Socket } from 'node:net';
import { writeFileSync } from 'node:fs';
import { setTimeout as delay } from 'node:timers/promises';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { sumSamples } from '../../dist/cli/prom-text.js';
import type { InPodConnections, InPodWorkload } from '../../dist/native/types.js';
import { makeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import type { Daemon, EnvInput } from '../helpers/daemon.js';
import { BLOCKS, block, httpGet, socks5Request, waitFor } from '../helpers/net.js';
import type { HostPort } from '../helpers/net.js';
import { checkpoint, flowed, openStream as openStreamVia, pump, startServer as startStreamServer } from '../helpers/streams.js';
import type { ClientStream, StreamServer } from '../helpers/streams.js';

const net = block(BLOCKS.handover);
const SLEEP_IP = net.workload(1);
const SOCKS = { host: SLEEP_IP, port: 15080 };
// Outside the mesh: the connection is passthrough TCP from node-a (a TCP ⇄ TCP relay).
const SERVER = { host: net.workload(9), port: 9000 };
const CONFIG = { workloads: [workload({ name: 'sleep', ip: SLEEP_IP, node: 'node-a' })] };

const cleanups: (() => Promise<unknown>)[] = [];
after(async () => {
  for (const c of cleanups.reverse()) await c();
});

/** A stream through node-a's SOCKS5 entry (to the server outside the mesh unless told). */
const openStream = (srv: StreamServer, dest: HostPort = SERVER): Promise<ClientStream> => openStreamVia(SOCKS, srv, dest);
const startServer = (port = SERVER.port, host = SERVER.host): Promise<StreamServer> => startStreamServer(port, host);

test('a restart of the node hands its established connections to the new daemon, byte-exact, and the old one exits 0', async (t) => {
  const caDir = makeTempDir('ztn-handover-ca-');
  const socketDir = makeTempDir('ztn-handover-');
  const env = { HANDOVER_SOCKET: join(socketDir, 'handover.sock') };
  const srv = await startServer();
  cleanups.push(() => srv.close());

  const first = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(1), env, cleanup: t });
  const streams = [await openStream(srv), await openStream(srv), await openStream(srv)];
  // One stream is half-closed by the client before the restart: the other direction must still flow after it.
  const half = streams[2];
  half.stopUp();
  half.socket.end();
  await waitFor(() => half.server.ended, { message: 'the half-close reached the server' });
  await flowed(streams, 'before the restart'); // the hand-over then happens with traffic in flight both ways

  const second = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(2), env, cleanup: t });
  // The deadlines of such races are unref'd: once the exit has won, the timer must not hold the process open.
  const exit = await Promise.race([first.exited, delay(10_000, null, { ref: false })]);
  assert.deepEqual(exit && { code: exit.code, signal: exit.signal }, { code: 0, signal: null }, 'the predecessor exits 0 by itself');
  const given = first.logs.find((l) => l.message === 'hand-over given');
  assert.ok(given, `the predecessor logged the hand-over: ${first.tail()}`);
  assert.equal(given.connections, 3);
  assert.equal(given.kept, 0);
  const taken = second.logs.find((l) => l.message === 'hand-over taken');
  assert.ok(taken, 'the successor logged it');
  assert.equal(taken.connections, 3);
  assert.ok(!first.logs.some((l) => l.message === 'connection complete'), 'the predecessor wrote no record for them');

  // The streams go on through the successor alone.
  await flowed(streams, 'through the successor');
  for (const s of streams.slice(0, 2)) await checkpoint(s, 'after the restart');
  // The half-closed one: the server's direction flowed on after the hand-over.
  half.stopDown();
  await waitFor(() => half.received.bytes === half.server.sent.bytes, { message: 'the half-closed stream delivered' });
  assert.equal(half.received.digest(), half.server.sent.digest());
  assert.equal(half.server.received.digest(), half.sent.digest());

  // A new connection works on the successor.
  const fresh = await openStream(srv);
  await flowed([fresh], 'a new connection');
  await checkpoint(fresh, 'a new connection');

  // A second restart: the successor hands over in turn (the third daemon takes the socket over).
  for (const s of streams.slice(0, 2)) {
    s.stopUp = pump(s.socket, s.sent);
    s.stopDown = pump(s.server.socket, s.server.sent);
  }
  const third = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(3), env, cleanup: t });
  const exit2 = await Promise.race([second.exited, delay(10_000, null, { ref: false })]);
  assert.equal(exit2?.code, 0, 'the second daemon exits 0 after handing over');
  assert.equal(third.logs.find((l) => l.message === 'hand-over taken')?.connections, 4, 'two streams, the half-closed one and the new one');
  for (const s of streams.slice(0, 2)) await checkpoint(s, 'after the second restart');

  // The end: each connection's record is written once, by the daemon that saw it end, with every byte.
  streams[0].socket.end();
  streams[0].server.socket.end();
  await waitFor(() => streams[0].closed, { message: 'the stream closed' });
  const record = await third.waitForLog((l) => l.message === 'connection complete' && l['src.addr'] === streams[0].local);
  assert.equal(record.bytes_sent, streams[0].sent.bytes, 'bytes toward the server, over three daemons');
  assert.equal(record.bytes_recv, streams[0].server.sent.bytes, 'bytes from the server, over three daemons');
  assert.equal(record.direction, 'outbound');
  const s = await third.metrics();
  assert.equal(sumSamples(s, 'ztunnel_node_handover_connections_total', { outcome: 'taken' }), 4);
  assert.equal(sumSamples(s, 'ztunnel_node_handovers_total', { role: 'take', result: 'done' }), 1);
  for (const x of [streams[1], half, fresh]) {
    x.socket.destroy();
    x.server.socket.destroy();
  }
  await third.stop();
});

test('with HANDOVER_ENABLED=false a second daemon takes nothing and the first keeps serving', async (t) => {
  const caDir = makeTempDir('ztn-handover-ca-');
  const socketDir = makeTempDir('ztn-handover-');
  const env = { HANDOVER_SOCKET: join(socketDir, 'handover.sock') };
  const first = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(4), env, cleanup: t });
  const second = await startDaemon({
    node: 'node-a',
    config: CONFIG,
    caDir,
    adminIp: net.admin(5),
    env: { ...env, HANDOVER_ENABLED: 'false' },
    cleanup: t,
  });
  // A negative check, so a fixed time: had the second taken over (before its readiness), the first would exit now.
  await delay(500);
  assert.equal(first.exit, null, 'the first daemon still runs');
  assert.ok(!second.logs.some((l) => /hand-over/.test(l.message ?? '')), 'nothing was handed over');
  await second.stop();
  await first.stop();
});

test('1,000 connections at once: every one is handed over and echoes intact afterwards', async (t) => {
  const caDir = makeTempDir('ztn-handover-ca-');
  const socketDir = makeTempDir('ztn-handover-');
  const env = { HANDOVER_SOCKET: join(socketDir, 'handover.sock') };
  const ECHO = { host: SERVER.host, port: SERVER.port + 1 };
  const sockets = await echoFor(ECHO);
  const first = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(6), env, cleanup: t });
  const N = 1000;
  sockets.push(...(await openMany(N, ECHO)));
  // Each one has carried a message before the restart.
  assert.deepEqual(new Set(await Promise.all(sockets.map((s, i) => roundTrip(s, `before-${i}`)))), new Set([true]));
  const second = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(7), env, cleanup: t });
  const exit = await Promise.race([first.exited, delay(15_000, null, { ref: false })]);
  assert.equal(exit?.code, 0);
  const given = first.logs.find((l) => l.message === 'hand-over given');
  assert.equal(given?.connections, N, `every connection was handed over: ${JSON.stringify(first.logs.filter((l) => /hand-over/.test(l.message ?? "")))}`);
  t.diagnostic(`1,000 connections: given in ${given.durationMs} ms, paused at most ${given.pauseMs} ms`);
  const after = await Promise.all(sockets.map((s, i) => roundTrip(s, `after-${i}`)));
  assert.equal(after.filter((ok) => !ok).length, 0, 'none lost or garbled');
  assert.equal(sockets.filter((s) => s.destroyed).length, 0, 'none closed');
  await second.stop();
});

/** An echo server on `at` until the file's end; the returned list's sockets are destroyed with it. */
async function echoFor(at: HostPort): Promise<Socket[]> {
  const echo = createServer({ allowHalfOpen: true }, (x) => {
    x.on('error', () => undefined);
    x.pipe(x);
  });
  await new Promise<void>((r) => echo.listen(at.port, at.host, r));
  const sockets: Socket[] = [];
  cleanups.push(() => {
    for (const x of sockets) x.destroy();
    return new Promise<void>((r) => echo.close(() => r()));
  });
  return sockets;
}

/** One message through `s` and back: resolves whether it came back whole. */
function roundTrip(s: Socket, tag: string): Promise<boolean> {
  return new Promise((resolve) => {
    const msg = Buffer.from(tag.padEnd(24, '.'));
    let got = Buffer.alloc(0);
    const onData = (d: Buffer) => {
      got = Buffer.concat([got, d]);
      if (got.length >= msg.length) {
        s.off('data', onData);
        s.pause();
        resolve(got.equals(msg));
      }
    };
    s.on('data', onData);
    s.resume();
    s.write(msg);
  });
}

/** `n` connections through node-a's SOCKS5 entry to `dest`, opened 100 at a time. */
async function openMany(n: number, dest: HostPort): Promise<Socket[]> {
  const sockets: Socket[] = [];
  for (let i = 0; i < n; i += 100) {
    const batch = await Promise.all(Array.from({ length: Math.min(100, n - i) }, () => socks5Request({ socks: SOCKS, dest })));
    for (const { code, socket } of batch) {
      assert.equal(code, 0);
      socket.on('error', () => undefined);
      sockets.push(socket);
    }
  }
  return sockets;
}

/** A successor played by the test over the predecessor's socket: Hello, then it reads frames until `kind`, and dies. */
async function failingSuccessor(path: string, dieAfter: number, node = 'node-a'): Promise<number[]> {
  const { connect } = await import('node:net');
  const frame = (kind: number, body: unknown): Buffer => {
    const payload = Buffer.from(JSON.stringify(body));
    const h = Buffer.alloc(12);
    h.write('ZTHO', 0, 'latin1');
    h[4] = kind;
    h.writeUInt32LE(payload.length, 8);
    return Buffer.concat([h, payload]);
  };
  const s = connect(path);
  await new Promise((r, j) => s.once('connect', r).once('error', j));
  s.write(frame(1, { version: 1, pid: process.pid, node }));
  // Reading with plain reads, the kernel closes the descriptors that come with the frames: what a successor that
  // dies holding them leaves behind.
  const seen: number[] = [];
  let buf = Buffer.alloc(0);
  await new Promise<void>((resolve) => {
    s.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 12) {
        const len = buf.readUInt32LE(8);
        if (buf.length < 12 + len) break;
        seen.push(buf[4]);
        buf = buf.subarray(12 + len);
        if (seen.at(-1) === dieAfter) return resolve();
      }
    });
    s.on('close', resolve);
  });
  s.destroy();
  return seen;
}

test('a successor that dies after the offers leaves every connection with the predecessor, intact', async (t) => {
  const caDir = makeTempDir('ztn-handover-ca-');
  const socketDir = makeTempDir('ztn-handover-');
  const path = join(socketDir, 'handover.sock');
  const dest = { host: SERVER.host, port: SERVER.port + 2 };
  const srv = await startServer(dest.port);
  cleanups.push(() => srv.close());
  const first = await startDaemon({
    node: 'node-a',
    config: CONFIG,
    caDir,
    adminIp: net.admin(8),
    env: { HANDOVER_SOCKET: path, CONNECTION_TERMINATION_DEADLINE: '10s' },
    cleanup: t,
  });
  const streams = [await openStream(srv, dest), await openStream(srv, dest)];
  await flowed(streams, 'before the hand-over');
  const OFFERED = 4;
  const seen = await failingSuccessor(path, OFFERED);
  assert.ok(seen.includes(3) && seen.at(-1) === OFFERED, `it got the connections and the offer: kinds ${seen}`);
  const failed = await first.waitForLog((l) => l.message === 'hand-over failed: every connection stays here and drains');
  assert.equal(failed.kept, 2, 'both were paused, then kept');
  assert.equal(failed.connections, 0);
  // They go on through the predecessor (which drains, as on SIGTERM: its stats are closed), every byte once and in
  // order.
  await flowed(streams, 'after the failed hand-over');
  for (const s of streams) await checkpoint(s, 'after the failed hand-over');
  for (const s of streams) {
    s.socket.destroy();
    s.server.socket.destroy();
  }
  await first.stop({ timeoutMs: 15_000 });
});

// In the mesh: sleep on node-a, `store` on node-b; each stream is a CONNECT stream of an HBONE connection from
// node-a's pool to node-b's 15008, and a restart of either node hands the whole HBONE connection over (TLS session,
// HTTP/2 state, the streams' sockets and bytes).
const STORE_IP = net.workload(3);
const STORE = { host: STORE_IP, port: 9100 };
const MESH = {
  workloads: [
    workload({ name: 'sleep', ip: SLEEP_IP, node: 'node-a' }),
    workload({ name: 'store', ip: STORE_IP, node: 'node-b' }),
  ],
};

test('HBONE streams survive restarts of the source node and of the destination node, twice each, byte-exact, and stay under authorization', async (t) => {
  const caDir = makeTempDir('ztn-handover-ca-');
  const socketDir = makeTempDir('ztn-handover-');
  const envA = { HANDOVER_SOCKET: join(socketDir, 'a.sock') };
  const envB = { HANDOVER_SOCKET: join(socketDir, 'b.sock') };
  const srv = await startServer(STORE.port, STORE.host);
  cleanups.push(() => srv.close());
  const start = (node: string, i: number, env: EnvInput): Promise<Daemon> =>
    startDaemon({ node, config: MESH, caDir, adminIp: net.admin(i), env, cleanup: t });
  const [a1, b1] = await Promise.all([start('node-a', 9, envA), start('node-b', 10, envB)]);
  const streams = [await openStream(srv, STORE), await openStream(srv, STORE)];
  await flowed(streams, 'before the restarts');
  const sum = (d: Daemon, name: string, labels: Record<string, string>): Promise<number> =>
    d.metrics().then((s) => sumSamples(s, name, labels));
  assert.ok((await sum(a1, 'istio_tcp_connections_opened_total', { reporter: 'source' })) >= 2, 'they went over HBONE');

  // The source node restarts: its pooled HBONE connection, with both streams, goes to the successor.
  const a2 = await start('node-a', 11, envA);
  const exitA = await Promise.race([a1.exited, delay(10_000, null, { ref: false })]);
  assert.equal(exitA?.code, 0, `the source node's predecessor exits 0: ${a1.tail()}`);
  const givenA = a1.logs.find((l) => l.message === 'hand-over given');
  assert.equal(givenA?.connections, 2, `both streams were handed over: ${a1.tail()}`);
  assert.equal(a2.logs.find((l) => l.message === 'hand-over taken')?.connections, 2);
  assert.ok(!a1.logs.some((l) => l.message === 'connection complete'), 'the predecessor wrote no record for them');
  await flowed(streams, 'after the source node restarted');
  for (const s of streams) await checkpoint(s, 'after the source node restarted');
  const fresh = await openStream(srv, STORE);
  await flowed([fresh], 'a new stream after the source node restarted');
  await checkpoint(fresh, 'a new stream after the source node restarted');

  // Then the destination node: node-b's HBONE connections (the handed-over one, and the fresh one's) go too.
  for (const s of [...streams, fresh]) {
    s.stopUp = pump(s.socket, s.sent);
    s.stopDown = pump(s.server.socket, s.server.sent);
  }
  await flowed([...streams, fresh], 'before the destination node restarts');
  const b2 = await start('node-b', 12, envB);
  const exitB = await Promise.race([b1.exited, delay(10_000, null, { ref: false })]);
  assert.equal(exitB?.code, 0, `the destination node's predecessor exits 0: ${b1.tail()}`);
  const givenB = b1.logs.find((l) => l.message === 'hand-over given');
  assert.equal(givenB?.connections, 3, `every stream was handed over: ${b1.tail()}`);
  await flowed([...streams, fresh], 'after the destination node restarted');
  for (const s of [...streams, fresh]) await checkpoint(s, 'after the destination node restarted');
  const last = await openStream(srv, STORE);
  await flowed([last], 'a new stream after both restarts');
  await checkpoint(last, 'a new stream after both restarts');

  // Each successor is succeeded in turn: the connections it took (now carried on outside h2) and those it opened
  // itself go again, node-a's and then node-b's.
  const all = [...streams, fresh, last];
  const a3 = await restartWith(a2, () => start('node-a', 13, envA), all, 'the source node, again');
  for (const s of all) await checkpoint(s, 'after the source node restarted again');
  const b3 = await restartWith(b2, () => start('node-b', 14, envB), all, 'the destination node, again');
  for (const s of all) await checkpoint(s, 'after the destination node restarted again');
  const again = await openStream(srv, STORE);
  await flowed([again], 'a new stream after four restarts');
  await checkpoint(again, 'a new stream after four restarts');

  // The streams taken in are live connections of the successors: listed in config_dump on both nodes.
  // (config_dump lists each workload's connections.)
  type Served = Record<string, (InPodWorkload & { connections: InPodConnections }) | undefined>;
  const dump = async (d: Daemon): Promise<Served> =>
    (JSON.parse((await httpGet(`${d.adminUrl}/config_dump`)).body) as { workloadState: Served }).workloadState;
  const outbound = (await dump(a3))['Kubernetes//Pod/default/sleep']?.connections.outbound ?? [];
  const inbound = (await dump(b3))['Kubernetes//Pod/default/store']?.connections.inbound ?? [];
  for (const [side, list] of [['source', outbound], ['destination', inbound]] as const) {
    assert.equal(list.filter((c) => c.originalDst === `${STORE.host}:${STORE.port}` && c.protocol === 'HBONE').length, 5, `${side}: ${JSON.stringify(list)}`);
  }

  // The end: each side's record once, by the daemon that saw the stream end, with every byte of every process.
  const s0 = streams[0];
  s0.socket.end();
  s0.server.socket.end();
  await waitFor(() => s0.closed, { message: 'the stream closed' });
  const out = await a3.waitForLog((l) => l.message === 'connection complete' && l['src.addr'] === s0.local);
  assert.equal(out.bytes_sent, s0.sent.bytes, 'source: bytes toward the server, over every daemon');
  assert.equal(out.bytes_recv, s0.server.sent.bytes, 'source: bytes from the server');
  const inb = await b3.waitForLog((l) => l.message === 'connection complete' && l.direction === 'inbound');
  assert.equal(inb.bytes_recv, s0.sent.bytes, 'destination: bytes from the peer, over every daemon');
  assert.equal(inb.bytes_sent, s0.server.sent.bytes, 'destination: bytes back to the peer');
  for (const d of [a1, a2, b1, b2]) {
    assert.ok(!d.logs.some((l) => l.message === 'connection complete' && l.direction !== 'inbound' && l['src.addr'] === s0.local), `no record of it from a predecessor (${d.node})`);
  }

  // Authorization goes on for the streams taken in: a DENY for sleep on node-b closes every one of them.
  const left = [streams[1], fresh, last, again];
  const closed = left.map((x) => new Promise((r) => x.socket.once('close', r)));
  const deny = { name: 'deny-sleep', namespace: 'default', scope: 'Namespace', action: 'Deny', rules: [[[{ principals: [{ Exact: 'cluster.local/ns/default/sa/sleep' }] }]]] };
  writeFileSync(b3.configPath, stringify({ ...MESH, policies: [deny] }));
  const cut = await Promise.race([Promise.all(closed), delay(5_000, null, { ref: false })]);
  assert.notEqual(cut, null, 'every stream was closed by the policy, the handed-over ones too');
  await b3.waitForLog((l) => l.message === 'connection complete' && l.direction === 'inbound' && /policy change/.test((l.error as string | undefined) ?? ''));
  for (const x of left) x.server.socket.destroy();
  await Promise.all([a3.stop(), b3.stop()]);
});

/** With `live` streaming both ways, start a successor beside `prev`, which must hand over every one of them and
 * exit 0; the successor is returned. */
async function restartWith(prev: Daemon, start: () => Promise<Daemon>, live: ClientStream[], what: string): Promise<Daemon> {
  const n = live.length;
  for (const s of live) {
    s.stopUp = pump(s.socket, s.sent);
    s.stopDown = pump(s.server.socket, s.server.sent);
  }
  await flowed(live, `${what}: before`);
  const next = await start();
  const exit = await Promise.race([prev.exited, delay(10_000, null, { ref: false })]);
  assert.equal(exit?.code, 0, `${what}: the predecessor exits 0: ${prev.tail()}`);
  const given = prev.logs.find((l) => l.message === 'hand-over given');
  assert.equal(given?.connections, n, `${what}: every stream was handed over: ${prev.tail()}`);
  assert.equal(given.kept, 0);
  assert.equal(next.logs.find((l) => l.message === 'hand-over taken')?.connections, n);
  await flowed(live, `${what}: through the successor`);
  return next;
}

test('1,000 HBONE streams at once: handed over whole at a restart of the source node and then of the destination node, every one intact', async (t) => {
  const caDir = makeTempDir('ztn-handover-ca-');
  const socketDir = makeTempDir('ztn-handover-');
  const envA = { HANDOVER_SOCKET: join(socketDir, 'a.sock') };
  const envB = { HANDOVER_SOCKET: join(socketDir, 'b.sock') };
  const ECHO = { host: STORE_IP, port: STORE.port + 1 };
  const sockets = await echoFor(ECHO);
  const start = (node: string, i: number, env: EnvInput): Promise<Daemon> =>
    startDaemon({ node, config: MESH, caDir, adminIp: net.admin(i), env, cleanup: t });
  const [a1, b1] = await Promise.all([start('node-a', 15, envA), start('node-b', 16, envB)]);
  const N = 1000;
  sockets.push(...(await openMany(N, ECHO)));
  const all = async (tag: string): Promise<number> => (await Promise.all(sockets.map((x, i) => roundTrip(x, `${tag}-${i}`)))).filter((ok) => !ok).length;
  assert.equal(await all('before'), 0);
  const tunnels = await a1.metrics().then((m) => sumSamples(m, 'istio_tcp_connections_opened_total', { reporter: 'source', destination_workload: 'store' }));
  assert.equal(tunnels, N, 'every one is an HBONE stream to store');
  let next = 17;
  const successors: Daemon[] = [];
  for (const [prev, node, env] of [[a1, 'node-a', envA], [b1, 'node-b', envB]] as const) {
    const successor = await start(node, next++, env);
    const exit = await Promise.race([prev.exited, delay(15_000, null, { ref: false })]);
    assert.equal(exit?.code, 0, `${node}: the predecessor exits 0: ${prev.tail()}`);
    const given = prev.logs.find((l) => l.message === 'hand-over given');
    assert.equal(given?.connections, N, `${node}: every stream was handed over: ${JSON.stringify(given)}`);
    assert.equal(given.kept, 0);
    t.diagnostic(`${node}: 1,000 HBONE streams given in ${given.durationMs} ms, paused at most ${given.pauseMs} ms`);
    assert.equal(await all(`after-${node}`), 0, `${node}: none lost or garbled`);
    assert.equal(sockets.filter((x) => x.destroyed).length, 0, `${node}: none closed`);
    successors.push(successor);
  }
  for (const x of sockets) x.destroy();
  await Promise.all(successors.map((d) => d.stop()));
});

test('a successor that dies after the offers of HBONE connections: the predecessor carries them on itself, intact', async (t) => {
  const caDir = makeTempDir('ztn-handover-ca-');
  const socketDir = makeTempDir('ztn-handover-');
  const path = join(socketDir, 'b.sock');
  const dest = { host: STORE_IP, port: STORE.port + 2 };
  const srv = await startServer(dest.port, dest.host);
  cleanups.push(() => srv.close());
  const start = (node: string, i: number, env: EnvInput): Promise<Daemon> =>
    startDaemon({ node, config: MESH, caDir, adminIp: net.admin(i), env, cleanup: t });
  const [a, b] = await Promise.all([start('node-a', 19, {}), start('node-b', 20, { HANDOVER_SOCKET: path, CONNECTION_TERMINATION_DEADLINE: '20s' })]);
  const streams = [await openStream(srv, dest), await openStream(srv, dest)];
  await flowed(streams, 'before the hand-over');
  // node-b's inbound HBONE connection leaves h2 and rustls for the offer; the successor dies holding it.
  const OFFERED = 4;
  const seen = await failingSuccessor(path, OFFERED, 'node-b');
  assert.ok(seen.at(-1) === OFFERED, `it got the connection and the offer: kinds ${seen}`);
  const failed = await b.waitForLog((l) => l.message === 'hand-over failed: every connection stays here and drains');
  assert.equal(failed.kept, 2, 'both streams were paused, then kept');
  assert.equal(failed.connections, 0);
  await flowed(streams, 'after the failed hand-over');
  for (const x of streams) await checkpoint(x, 'after the failed hand-over');
  const s0 = streams[0];
  s0.socket.end();
  s0.server.socket.end();
  await waitFor(() => s0.closed, { message: 'the stream closed' });
  const inb = await b.waitForLog((l) => l.message === 'connection complete' && l.direction === 'inbound');
  assert.equal(inb.bytes_recv, s0.sent.bytes, 'its record, written once by the predecessor, with every byte');
  assert.equal(inb.bytes_sent, s0.server.sent.bytes);
  for (const x of streams) {
    x.socket.destroy();
    x.server.socket.destroy();
  }
  // Drained (nothing left), it exits 0 by itself, as on SIGTERM.
  const exit = await Promise.race([b.exited, delay(10_000, null, { ref: false })]);
  assert.equal(exit?.code, 0, `the predecessor exits 0 once drained: ${b.tail()}`);
  await a.stop();
});

test('a predecessor that dies midway: the successor takes nothing, says so, serves, and then waits for its own successor on the socket', async (t) => {
  const caDir = makeTempDir('ztn-handover-ca-');
  const socketDir = makeTempDir('ztn-handover-');
  const path = join(socketDir, 'handover.sock');
  const { createServer: createUnixServer, connect } = await import('node:net');
  // The predecessor, played by the test: it answers Hello, starts a Meta frame (its header promises 4 KiB), sends
  // 10 bytes of it and dies.
  const header = (kind: number, len: number): Buffer => {
    const h = Buffer.alloc(12);
    h.write('ZTHO', 0, 'latin1');
    h[4] = kind;
    h.writeUInt32LE(len, 8);
    return h;
  };
  const hello = Buffer.from(JSON.stringify({ version: 1, pid: process.pid, node: 'node-a' }));
  let greeted = false;
  const fake = createUnixServer((s) => {
    s.once('data', () => {
      greeted = true;
      // Dies once the bytes are out (destroy() would drop a write still queued).
      s.write(Buffer.concat([header(1, hello.length), hello, header(9, 4096), Buffer.alloc(10)]), () => s.destroy());
    });
  });
  await new Promise<void>((r) => fake.listen(path, r));
  const successor = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(13), env: { HANDOVER_SOCKET: path }, cleanup: t });
  // (Closed at the end: libuv unlinks a closing server's path, which by now names the successor's socket.)
  cleanups.push(() => new Promise((r) => fake.close(r)));
  assert.ok(greeted, 'the successor spoke to the predecessor');
  const notTaken = successor.logs.find((l) => l.message === 'hand-over not taken: the predecessor keeps its connections and drains them');
  assert.ok(notTaken?.error, `it says why: ${successor.tail()}`);
  assert.equal(notTaken.connections, 0);
  // It serves: a new connection through it, byte-exact.
  const dest = { host: SERVER.host, port: SERVER.port + 3 };
  const srv = await startServer(dest.port);
  cleanups.push(() => srv.close());
  const s = await openStream(srv, dest);
  await flowed([s], 'a connection through the successor');
  await checkpoint(s, 'a connection through the successor');
  s.socket.destroy();
  s.server.socket.destroy();
  // And it took the socket over: the next daemon finds it there (Hello answered by it, with its node).
  await waitFor(async () => {
    const c = connect(path);
    const ok = await new Promise((r) => c.once('connect', () => r(true)).once('error', () => r(false)));
    c.destroy();
    return ok;
  }, { message: `the successor listens on the hand-over socket: ${JSON.stringify(successor.logs.filter((l) => /hand-over/.test(l.message ?? '')))}` });
  await successor.stop();
});
