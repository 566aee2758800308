// HTTP/2 floods from an authenticated peer, the known attack classes on an h2 server (issue: hardening): frames no
// client library sends, written by hand (test/helpers/h2raw.ts). Each must end in GOAWAY or a close, with the
// daemon's memory flat and a legitimate round trip working meanwhile. Asserted on the daemon's own figures: the
// GOAWAY code it sends, when it closes, its RSS (/proc/<pid>/status).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { makeTempDir, removeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import type { Daemon } from '../helpers/daemon.js';
import { echoRoundTrip } from '../helpers/hbone.js';
import { connectBlock, FLAG, FRAME, frame, indexed, indexedLiteral, literal, rawSession } from '../helpers/h2raw.js';
import type { RawSession } from '../helpers/h2raw.js';
import { BLOCKS, block, startEchoServer } from '../helpers/net.js';
import { builtinCa, builtinLeaf, spiffe } from '../helpers/pki.js';

const net = block(BLOCKS['h2-floods']);
const ECHO_IP = net.workload(1);
const ECHO = `${ECHO_IP}:8080`;
const ENHANCE_YOUR_CALM = 0xb;
/**
 * The daemon's GOAWAY, when the client got to read it: the daemon closes right after it, with the client's flood still
 * unread, so the kernel may reset the connection and drop the GOAWAY from the client's receive queue first.
 */
const calmOrReset = (s: RawSession): void => assert.ok(s.goaway === ENHANCE_YOUR_CALM || s.goaway === null, `GOAWAY ${s.goaway}`);
const MiB = 1024 * 1024;

let daemon: Daemon;
let caDir: string;
let certDir: string;
let tls: { host: string; ca: string; cert: string; key: string };
const closers: (() => Promise<void>)[] = [];

before(async () => {
  caDir = makeTempDir('ztn-floods-ca-');
  certDir = makeTempDir('ztn-floods-certs-');
  const echo = await startEchoServer(ECHO_IP, 8080);
  closers.push(echo.close);
  daemon = await startDaemon({ node: 'node-a', config: { workloads: [workload({ name: 'echo', ip: ECHO_IP, node: 'node-a' })] }, caDir, adminIp: net.admin(1) });
  const leaf = builtinLeaf(certDir, caDir, [spiffe('default', 'attacker')], 'attacker');
  tls = { host: ECHO_IP, ca: builtinCa(caDir).certPem, cert: leaf.chainPem, key: leaf.keyPem };
});

after(async () => {
  await Promise.all([daemon?.kill(), ...closers.map((c) => c())]);
  for (const d of [caDir, certDir]) if (d) removeTempDir(d);
});

const rss = (): number => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${daemon.child.pid}/status`, 'utf8'))![1]) * 1024;
const within = (p: Promise<unknown>, ms: number): Promise<boolean> =>
  Promise.race([p.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), ms))]);

const roundTrip = () => echoRoundTrip(tls, ECHO);

/** Writes `next()` until the connection ends or `limit` frames went out; resolves the count. */
async function flood(s: RawSession, next: (sent: number) => Buffer, limit: number): Promise<number> {
  let sent = 0;
  while (sent < limit && s.goaway === null && (await s.write(next(sent)))) sent++;
  return sent;
}

test('CONTINUATION without end: GOAWAY ENHANCE_YOUR_CALM after a bounded header block', async () => {
  const before = rss();
  const s = await rawSession(tls);
  await s.write(frame(FRAME.HEADERS, 0, 1, connectBlock(ECHO)));
  const piece = frame(FRAME.CONTINUATION, 0, 1, literal('x-a', 'a'.repeat(1000)));
  const sent = await flood(s, () => piece, 100_000);
  assert.ok(await within(s.closed, 5_000), 'the connection is closed');
  calmOrReset(s);
  assert.ok(sent < 1_000, `closed after ${sent} CONTINUATION frames of 1 KB`);
  assert.ok(rss() - before < 16 * MiB);
  await roundTrip();
});

test('HPACK amplification (a 4 KB entry referenced 8,000 times a block): refused, then GOAWAY ENHANCE_YOUR_CALM', async () => {
  const before = rss();
  const s = await rawSession(tls);
  const refs = Buffer.concat(Array.from({ length: 8_000 }, () => indexed(62)));
  // Each block goes out once the daemon has answered the one before (its stream refused, or the GOAWAY), so the count
  // is the blocks the daemon decoded, not the ones the kernel buffered ahead of a busy daemon.
  let sent = 0;
  while (sent < 1_000 && s.goaway === null) {
    const id = 1 + 2 * sent;
    const block = Buffer.concat([sent === 0 ? indexedLiteral('x-big', 'b'.repeat(4_000)) : Buffer.alloc(0), connectBlock(ECHO), refs]);
    if (!(await s.write(frame(FRAME.HEADERS, FLAG.END_HEADERS, id, block)))) break;
    sent++;
    while (!s.resets.has(id) && s.goaway === null && !s.socket.destroyed) await s.nextFrame();
  }
  assert.ok(await within(s.closed, 5_000), 'the connection is closed');
  calmOrReset(s);
  // The first block that decodes past the header list limit is answered with GOAWAY ENHANCE_YOUR_CALM (no stream).
  assert.equal(sent, 1, `closed after ${sent} blocks that each decode to 32 MB`);
  assert.ok(rss() - before < 16 * MiB);
  await roundTrip();
});

test('empty DATA frames on an established stream: GOAWAY ENHANCE_YOUR_CALM', async () => {
  const s = await rawSession(tls);
  await s.write(frame(FRAME.HEADERS, FLAG.END_HEADERS, 1, connectBlock(ECHO)));
  const empty = frame(FRAME.DATA, 0, 1);
  const sent = await flood(s, () => empty, 1_000_000);
  assert.ok(await within(s.closed, 5_000), 'the connection is closed');
  calmOrReset(s);
  assert.ok(sent < 100_000, `closed after ${sent} empty frames`);
  await roundTrip();
});

// The close is read from the daemon's own gauge of inbound HBONE connections, not from the client's socket: the
// daemon closes with the flood still unread in its receive queue, so the kernel answers with a reset, and a paused
// socket with no write pending never polls the connection, so it never learns of it (its 'close' came only when the
// last flood batch was still queued when the reset arrived: the earlier 40 s wait on it failed when that batch had
// gone out).
test('PING and SETTINGS floods from peers that never read: the daemon stops reading, memory stays flat, keepalive closes them', { timeout: 60_000 }, async () => {
  const inbound = () => daemon.metric('ztunnel_node_hbone_connections_active', { direction: 'inbound' });
  const baseline = await inbound();
  const before = rss();
  const t0 = performance.now();
  const sessions: RawSession[] = [];
  const floods = [frame(FRAME.PING, 0, 0, Buffer.alloc(8)), frame(FRAME.SETTINGS, 0, 0, Buffer.from([0, 3, 0, 0, 0, 100]))].map(async (f) => {
    const s = await rawSession(tls);
    sessions.push(s);
    s.socket.pause(); // never read: the daemon's ACKs pile up in the kernel, then it must stop reading
    const batch = Buffer.concat(Array.from({ length: 1_000 }, () => f));
    let sent = 0;
    // Writes until the daemon stops taking them (a batch not taken within 2 s).
    while (await Promise.race([s.write(batch), new Promise((r) => setTimeout(() => r(false), 2_000))])) sent += batch.length;
    return sent;
  });
  await new Promise((r) => setTimeout(r, 3_000));
  await roundTrip(); // during the floods
  const grown = rss() - before;
  const sent = await Promise.all(floods);
  assert.equal(await inbound(), baseline + 2, 'both flooding connections are open once the daemon stopped reading');
  for (const n of sent) assert.ok(n < 64 * MiB, `the daemon stopped reading after ${(n / MiB).toFixed(1)} MiB of control frames`);
  // Closed by the HTTP/2 keepalive (a PING after 10 s, 20 s for its answer): the daemon drops both connections.
  while ((await inbound()) > baseline) await new Promise((r) => setTimeout(r, 250));
  const closedAfter = performance.now() - t0;
  assert.ok(closedAfter >= 20_000, `closed after ${Math.round(closedAfter)} ms: by the keepalive, not before its PING was due`);
  for (const s of sessions) s.socket.destroy();
  assert.ok(grown < 16 * MiB, `RSS grew ${(grown / MiB).toFixed(1)} MiB`);
  await roundTrip();
});
