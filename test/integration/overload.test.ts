// Hostile HBONE peers (issue: hardening), as an outsider with a valid mesh certificate would attack: HTTP/2 rapid
// reset toward an application that does not accept, and many streams parked on upstream dials. The bounds asserted
// are the daemon's own: its descriptors (/proc/<pid>/fd), the GOAWAY it sends, the streams it refuses, and a
// legitimate round trip that keeps working while the attack runs.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { constants as h2c } from 'node:http2';
import type { ClientHttp2Stream } from 'node:http2';
import { readFileSync, readdirSync } from 'node:fs';
import type { Socket } from 'node:net';
import { makeTempDir, removeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import type { Daemon, DaemonLogRecord } from '../helpers/daemon.js';
import { connectRequest, echoRoundTrip, hboneSession } from '../helpers/hbone.js';
import type { HboneSessionOptions } from '../helpers/hbone.js';
import { BLOCKS, block, startEchoServer, waitFor } from '../helpers/net.js';
import { builtinCa, builtinLeaf, spiffe } from '../helpers/pki.js';
import type { Leaf } from '../helpers/pki.js';
import { PYTHON } from '../helpers/prereqs.js';

const net = block(BLOCKS.overload);
const ECHO_IP = net.workload(1);
const ECHO_PORT = 8080;
/** A listener that never accepts (backlog 0): dials to it hang in SYN retries until the connect timeout. */
const BLACKHOLE_PORT = 8081;
/** An application that accepts at once and counts (the reset floods' upstream dials). */
const COUNTING_PORT = 8082;

let daemon: Daemon;
let caDir: string;
let certDir: string;
let root: string;
let legitimate: Leaf;
const closers: (() => unknown)[] = [];

before(async () => {
  caDir = makeTempDir('ztn-overload-ca-');
  certDir = makeTempDir('ztn-overload-certs-');
  const echo = await startEchoServer(ECHO_IP, ECHO_PORT);
  closers.push(echo.close);
  const hole = spawn(PYTHON, ['-c', `import socket, time
s = socket.socket(); s.bind(("${ECHO_IP}", ${BLACKHOLE_PORT})); s.listen(0); print("listening", flush=True); time.sleep(3600)`], { stdio: ['ignore', 'pipe', 'inherit'] });
  closers.push(() => hole.kill('SIGKILL'));
  await new Promise((resolve) => hole.stdout.once('data', resolve));
  daemon = await startDaemon({
    node: 'node-a',
    config: { workloads: [workload({ name: 'echo', ip: ECHO_IP, node: 'node-a' })] },
    caDir,
    adminIp: net.admin(1),
  });
  root = builtinCa(caDir).certPem;
  legitimate = builtinLeaf(certDir, caDir, [spiffe('default', 'legitimate')], 'legitimate');
});

after(async () => {
  await Promise.all([daemon?.kill(), ...closers.map((c) => c())]);
  for (const d of [caDir, certDir]) if (d) removeTempDir(d);
});

const fds = () => readdirSync(`/proc/${daemon.child.pid}/fd`).length;
/** The never-accepting listener as /proc/net/tcp writes it (address in host byte order, little-endian here). */
const BLACKHOLE_HEX = `${ECHO_IP.split('.').reverse().map((b) => Number(b).toString(16).padStart(2, '0')).join('')}:${BLACKHOLE_PORT.toString(16).padStart(4, '0')}`.toUpperCase();
/** The daemon's dials to the never-accepting listener in progress: its sockets to it in SYN_SENT (state 02). */
const dialing = () =>
  readFileSync('/proc/net/tcp', 'utf8')
    .split('\n')
    .filter((l) => {
      const f = l.trim().split(/\s+/);
      return f[2] === BLACKHOLE_HEX && f[3] === '02';
    }).length;
/**
 * Attacker `n`'s session: an identity and a source address of its own, so that what the node's reset budget holds
 * against one attack (`proxy/resets.rs`: per identity and per source address) does not follow the next test.
 */
const attackers = new Map<number, Leaf>();
const attacker = (n: number): Leaf => {
  if (!attackers.has(n)) attackers.set(n, builtinLeaf(certDir, caDir, [spiffe('default', `attacker-${n}`)], `attacker-${n}`));
  return attackers.get(n)!;
};
const attackerAddress = (n: number) => `127.${ECHO_IP.split('.')[1]}.210.${n}`;
const session = (n: number, opts: Partial<HboneSessionOptions> = {}) =>
  hboneSession({ host: ECHO_IP, ca: root, cert: attacker(n).chainPem, key: attacker(n).keyPem, localAddress: attackerAddress(n), ...opts });

/** One legitimate CONNECT round trip through its own session: resolves the milliseconds it took. */
const roundTrip = () => echoRoundTrip({ host: ECHO_IP, ca: root, cert: legitimate.chainPem, key: legitimate.keyPem }, `${ECHO_IP}:${ECHO_PORT}`);

test('rapid reset toward an application that does not accept: dials end with their streams, descriptors stay at baseline, legitimate traffic is unaffected', async (t) => {
  await roundTrip();
  const baseline = fds();
  const s = await session(1);
  let goaway: number | null = null;
  s.on('goaway', (code) => (goaway = code));
  s.on('error', () => {});
  let sent = 0;
  let peak = 0;
  const legit = [];
  // HEADERS, then RST_STREAM 5 ms later, 10 streams every 10 ms. A reset that lands before the daemon took the stream
  // costs it nothing (h2 drops the stream); one that lands during the dial ends the dial at once.
  while (goaway === null && !s.destroyed && sent < 3_000) {
    for (let i = 0; i < 10; i++) {
      let stream;
      try {
        stream = s.request({ ':method': 'CONNECT', ':authority': `${ECHO_IP}:${BLACKHOLE_PORT}` }, { endStream: false });
      } catch {
        break;
      }
      stream.on('error', () => {});
      setTimeout(() => stream.close(h2c.NGHTTP2_CANCEL), 5);
      sent++;
    }
    await new Promise((r) => setTimeout(r, 10));
    peak = Math.max(peak, fds());
    if (sent % 200 === 0) legit.push(await roundTrip());
  }
  assert.ok(goaway === null || goaway === h2c.NGHTTP2_ENHANCE_YOUR_CALM, `GOAWAY ${goaway}`);
  assert.ok(peak - baseline < 40, `descriptors peaked ${peak - baseline} above the baseline ${baseline} over ${sent} reset streams`);
  s.destroy();
  await waitFor(() => fds() <= baseline + 5, { timeoutMs: 5_000, message: `descriptors back to ${baseline} (now ${fds()})` });
  legit.push(await roundTrip());
  assert.ok(Math.max(...legit) < 1_000, `legitimate round trips during the attack: ${legit.map((ms) => ms.toFixed(0)).join(', ')} ms`);
  t.diagnostic(`${sent} reset streams (GOAWAY: ${goaway}); descriptors peaked ${peak - baseline} above the baseline; legitimate round trips ${legit.map((ms) => ms.toFixed(0)).join(', ')} ms`);
});

test('a peer that keeps resetting streams while their dials are pending is closed with GOAWAY ENHANCE_YOUR_CALM', async () => {
  const s = await session(2);
  let goaway: number | null = null;
  s.on('goaway', (code) => (goaway = code));
  s.on('error', () => {});
  let reset = 0;
  const ended = () => goaway !== null || s.destroyed;
  // Batches of 50 streams (under the 64 being set up), each reset once the daemon is dialing for it (one dial may
  // complete into the listener's backlog), the next once those dials have ended.
  while (!ended() && reset < 400) {
    const batch = [];
    for (let i = 0; i < 50; i++) {
      try {
        const st = s.request({ ':method': 'CONNECT', ':authority': `${ECHO_IP}:${BLACKHOLE_PORT}` }, { endStream: false });
        st.on('error', () => {});
        batch.push(st);
      } catch {
        break;
      }
    }
    await waitFor(() => ended() || dialing() >= batch.length - 1, { timeoutMs: 5_000, intervalMs: 5, message: `the batch's ${batch.length} dials` });
    for (const st of batch) st.close(h2c.NGHTTP2_CANCEL);
    reset += batch.length;
    await waitFor(() => ended() || dialing() === 0, { timeoutMs: 5_000, intervalMs: 5, message: "the batch's dials to end" });
  }
  assert.equal(goaway, h2c.NGHTTP2_ENHANCE_YOUR_CALM, `GOAWAY after ${reset} resets (got ${goaway})`);
  assert.ok(reset <= 200, `closed after ${reset} resets (the allowance is 100)`);
  s.destroy();
  // The connection's own allowance, or the node's reset budget (`proxy/resets.rs`) first: 100 premature resets.
  await daemon.waitForLog((l) => /too many streams reset|HBONE peer banned/.test(l.message ?? ''));
});

/**
 * An attack of premature resets toward an application that accepts at once, reconnecting whenever the daemon closes
 * or refuses it, for `seconds`: `reset(stream)` decides when each stream of a batch is reset. Resolves the resets
 * sent and the connections the application accepted (the daemon's upstream dials).
 */
async function resetFlood(n: number, seconds: number, reset: (stream: ClientHttp2Stream) => Promise<void>) {
  const { createServer } = await import('node:net');
  let dials = 0;
  const app = createServer((c) => {
    dials++;
    c.on('error', () => {});
    c.resume();
  });
  await new Promise<void>((r) => app.listen(COUNTING_PORT, ECHO_IP, r));
  let resets = 0;
  let refused = 0;
  const legit = [];
  const refusedBefore = await daemon.metric('ztunnel_node_hbone_connections_refused_total', { reason: 'premature_resets' });
  const until = Date.now() + seconds * 1000;
  let nextLegit = Date.now() + 500;
  try {
    while (Date.now() < until && resets < 50_000) {
      let s;
      try {
        s = await session(n, { timeoutMs: 2_000 });
      } catch {
        refused++;
        await new Promise((r) => setTimeout(r, 20));
        continue;
      }
      s.on('error', () => {});
      while (!s.closed && !s.destroyed && Date.now() < until && resets < 50_000) {
        const batch = [];
        for (let i = 0; i < 100; i++) {
          try {
            const st = s.request({ ':method': 'CONNECT', ':authority': `${ECHO_IP}:${COUNTING_PORT}` }, { endStream: false });
            st.on('error', () => {});
            batch.push(reset(st).then(() => resets++));
          } catch {
            break;
          }
        }
        await Promise.all(batch);
        if (batch.length === 0) break;
        if (Date.now() > nextLegit) {
          legit.push(await roundTrip());
          nextLegit = Date.now() + 500;
        }
      }
      s.destroy();
    }
  } finally {
    app.close();
  }
  const refusedByDaemon = (await daemon.metric('ztunnel_node_hbone_connections_refused_total', { reason: 'premature_resets' })) - refusedBefore;
  return { resets, dials, refused, refusedByDaemon, legit };
}

test('premature resets are counted per peer across reconnects, and after the 200: paced and 200-then-reset floods cost a few hundred dials (issue 29)', async (t) => {
  // Paced rapid reset: each stream reset 5 ms after it was sent (its dial to a fast application has completed).
  const paced = await resetFlood(5, 6, (st) => new Promise<void>((r) => setTimeout(() => (st.close(h2c.NGHTTP2_CANCEL), r()), 5)));
  // Wait for the 200, then reset: the stream was established, yet carried nothing.
  const after200 = await resetFlood(6, 6, (st) =>
    new Promise<void>((r) => {
      const done = () => (st.close(h2c.NGHTTP2_CANCEL), r());
      st.once('response', done);
      st.once('close', r);
      setTimeout(done, 1_000);
    }));
  for (const [name, a] of [['paced', paced], ['200 then reset', after200]] as const) {
    t.diagnostic(`${name}: ${a.resets} streams sent and reset, ${a.dials} dials, ${a.refusedByDaemon} connections refused or closed by the daemon; legitimate round trips ${a.legit.map((ms) => ms.toFixed(0)).join(', ')} ms`);
    assert.ok(a.dials <= 1_000, `${name}: ${a.dials} upstream dials for ${a.resets} resets`);
    assert.ok(a.legit.length > 0 && Math.max(...a.legit) < 1_000, `${name}: another peer is served meanwhile (${a.legit.map((ms) => ms.toFixed(0)).join(', ')} ms)`);
  }
  // Resets before a stream is taken end the connection in h2 itself (its pending-accept reset limit); the streams
  // established and then reset are the node's budget's to count: the after-200 flood's peer is banned.
  assert.ok(after200.refusedByDaemon > 0, 'the banned peer\'s connections were refused or closed');
  assert.ok(daemon.logs.some((l) => /HBONE peer banned/.test(l.message ?? '') && /attacker-6/.test(String(l.peer ?? ''))), 'the ban is logged');
});

test('streams parked on dials are bounded per connection (64 dial, the rest wait), and all end when the peer disappears', async () => {
  const baseline = fds();
  const s = await session(3);
  s.on('error', () => {});
  const closed = [];
  for (let i = 0; i < 100; i++) {
    const stream = s.request({ ':method': 'CONNECT', ':authority': `${ECHO_IP}:${BLACKHOLE_PORT}` }, { endStream: false });
    stream.on('error', () => {});
    stream.on('close', () => closed.push(stream.rstCode));
  }
  await waitFor(() => dialing() >= 63, { timeoutMs: 10_000, intervalMs: 10, message: 'the 64 dials the connection may have' });
  // Then a negative check: 300 ms in which a stream beyond the bound would have dialed or been refused.
  await new Promise((r) => setTimeout(r, 300));
  // 64 streams hold a dial each (plus the connection's own descriptor); the other 36 wait, neither dialing nor
  // refused (one dial may complete into the never-accepting listener's backlog and free its place for another).
  const parked = fds() - baseline;
  assert.ok(parked >= 30 && parked <= 64 + 10, `${parked} descriptors for 100 streams (64 may dial)`);
  assert.ok(closed.length <= 1, `streams beyond the bound wait rather than fail (${closed.length} closed)`);
  // The peer disappears: every parked dial and every waiting stream ends at once, not after the 10 s connect timeout.
  const gone = performance.now();
  s.destroy();
  await waitFor(() => fds() <= baseline + 2, { timeoutMs: 3_000, message: `descriptors back to ${baseline} (now ${fds()})` });
  assert.ok(performance.now() - gone < 3_000);
  assert.ok((await roundTrip()) < 1_000);
});

test('2,000 slow partial requests to stats: capped and timed out, descriptors bounded, tunnels unaffected, drops counted', async (t) => {
  const { connect } = await import('node:net');
  const baseline = fds();
  const logged = daemon.logs.length;
  const slow: Socket[] = [];
  const closed: number[] = [];
  for (let i = 0; i < 2_000; i++) {
    const c = connect(15020, net.admin(1));
    c.on('error', () => {});
    c.on('connect', () => c.write('GET /metrics HTTP/1.1\r\nHost: x\r\n'));
    const t0 = performance.now();
    c.on('close', () => closed.push(performance.now() - t0));
    slow.push(c);
  }
  const drip = setInterval(() => {
    for (const c of slow) if (!c.destroyed) c.write('X-Slow: 1\r\n');
  }, 300);
  const atCap = (l: DaemonLogRecord) => /connection limit/.test(l.message ?? '') && l.server === 'stats';
  try {
    // The attack in full swing: the server is at its cap and refusing.
    await waitFor(() => daemon.logs.slice(logged).some(atCap), { timeoutMs: 10_000, message: "stats' connection limit reached" });
    const during = fds() - baseline;
    assert.ok(during <= 128 + 20, `${during} descriptors above the baseline while 2,000 slow clients knock (cap 128)`);
    assert.ok((await roundTrip()) < 1_000, 'a tunnel works during the attack');
    // Every slow client is cut: at the cap at once, the others by the 2 s header timeout.
    await waitFor(() => closed.length === 2_000, { timeoutMs: 8_000, message: `all slow clients closed (${closed.length})` });
    assert.ok(Math.max(...closed) < 4_000, `the slowest was closed after ${Math.max(...closed).toFixed(0)} ms`);
  } finally {
    clearInterval(drip);
    for (const c of slow) c.destroy();
  }
  await waitFor(() => fds() <= baseline + 5, { timeoutMs: 5_000, message: `descriptors back to ${baseline} (now ${fds()})` });
  const dropped = await daemon.metric('ztunnel_node_http_connections_dropped_total', { server: 'stats' });
  const histogram = closed.reduce<Record<number, number>>((m, ms) => ((m[Math.floor(ms / 500) * 500] = (m[Math.floor(ms / 500) * 500] ?? 0) + 1), m), {});
  t.diagnostic(`dropped ${dropped}; closed after (ms: count) ${JSON.stringify(histogram)}`);
  // Each connection past the source's share closes its oldest waiting one, counted; how many of the 2,000 reach the
  // server at all depends on how fast the kernel's accept queue drains here (1,087 to 1,408 on the dev machine, fewer
  // in CI): the others are refused by the kernel or reach the header timeout.
  assert.ok(dropped > 200, `${dropped} dropped`);
  assert.ok(daemon.logs.some(atCap), 'the refusals are logged');
});

/**
 * 300 partial requests held on `port` from `sources` source addresses, each re-opened 100 ms after it is closed, while
 * 149 probes (a fresh connection each, from an address of their own, as kubelet's) ask `path`: how many are answered.
 */
async function probesUnderSlowClients(port: number, path: string, sources: number): Promise<number> {
  const { connect } = await import('node:net');
  const { request } = await import('node:http');
  const octet = net.workload(1).split('.')[1];
  const host = net.admin(1);
  let stop = false;
  const held = new Set<Socket>();
  const connected = new Set<number>();
  const open = (i: number) => {
    if (stop) return;
    const c = connect({ host, port, localAddress: `127.${octet}.200.${1 + (i % sources)}` });
    held.add(c);
    c.on('error', () => {});
    c.on('connect', () => (connected.add(i), c.write(`GET ${path} HTTP/1.1\r\nHost: ${host}\r\n`)));
    c.on('close', () => {
      held.delete(c);
      // Re-opened 100 ms after it is closed: up to 3,000 connections a second (the attack re-opened 64 a
      // second); faster churn only fills the machine's TIME_WAIT table for the tests that follow.
      setTimeout(() => open(i), 100);
    });
  };
  for (let i = 0; i < 300; i++) open(i);
  const drip = setInterval(() => {
    for (const c of held) if (!c.destroyed && c.writable) c.write('X-Slow: 1\r\n');
  }, 500);
  // The probes start once every slow client has connected (and sent its partial request).
  await waitFor(() => connected.size === 300, { timeoutMs: 10_000, message: 'the 300 slow clients connected' });
  const probe = () =>
    new Promise<boolean>((resolve) => {
      const r = request({ host, port, path, localAddress: `127.${octet}.201.1`, agent: false, timeout: 2_000, headers: { host: `${host}:${port}` } }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode === 200));
      });
      r.on('timeout', () => r.destroy());
      r.on('error', () => resolve(false));
      r.end();
    });
  let answered = 0;
  try {
    for (let i = 0; i < 149; i++) {
      answered += Number(await probe());
      await new Promise((r) => setTimeout(r, 10));
    }
  } finally {
    stop = true;
    clearInterval(drip);
    for (const c of held) c.destroy();
  }
  return answered;
}

test('readiness, stats and admin answer 99 % of probes while 300 partial requests are held on each (issue 29)', async () => {
  for (const [port, path, sources] of [
    [15021, '/healthz/ready', 4],
    [15021, '/healthz/ready', 150], // from many addresses: the full server closes its oldest waiting connection
    [15020, '/metrics', 4],
    [15000, '/config_dump', 4],
  ] as const) {
    const answered = await probesUnderSlowClients(port, path, sources);
    assert.ok(answered >= 148, `${port}${path} (slow clients from ${sources} addresses): ${answered} of 149 probes answered`);
  }
  assert.ok((await daemon.metric('ztunnel_node_http_connections_dropped_total', { server: 'readiness' })) > 0);
});

test('a flood of failing streams: at most 100 error lines a second per cause, the rest counted', async () => {
  const s = await session(4);
  s.on('error', () => {});
  const before = daemon.logs.filter((l) => l.message === 'connection complete' && l.target === 'access').length;
  // Port 9 on the workload: nothing listens, every CONNECT fails at once (503) and would log one error line.
  const results = [];
  const t0 = performance.now();
  for (let batch = 0; batch < 20; batch++) {
    results.push(...(await Promise.all(Array.from({ length: 50 }, () => connectRequest(s, `${ECHO_IP}:9`)))));
  }
  // The rate limit's one-second windows the flood can have touched (a line of an earlier test may share the first).
  const windows = Math.ceil((performance.now() - t0) / 1000) + 1;
  s.destroy();
  assert.equal(results.filter((r) => r.status === 503).length, 1_000);
  await waitFor(async () => (await daemon.metric('ztunnel_node_log_lines_suppressed_total', { cause: 'access: connection complete' })) > 0, {
    timeoutMs: 5_000,
    message: 'suppressed lines counted',
  });
  // The lines reach the log as the events are drained: wait until every failure is accounted for.
  const count = () => daemon.logs.filter((l) => l.message === 'connection complete' && l.target === 'access').length - before;
  let suppressed = 0;
  await waitFor(
    async () => {
      suppressed = await daemon.metric('ztunnel_node_log_lines_suppressed_total', { cause: 'access: connection complete' });
      return count() + suppressed >= 1_000;
    },
    { timeoutMs: 5_000, message: 'every failure logged or counted' },
  ).catch(() => undefined);
  const logged = count();
  assert.ok(logged >= 1 && logged <= 100 * windows, `${logged} lines logged of 1,000 failures (at most 100 in each of ${windows} seconds)`);
  assert.ok(logged + suppressed >= 1_000, `${logged} logged + ${suppressed} suppressed account for every failure`);
  assert.ok(daemon.logs.some((l) => l.message?.startsWith('log lines suppressed') && l.cause === 'connection complete'));
});

test('one peer IP holds at most 512 connections to a listener (the rest closed at accept, before TLS); other peers are unaffected', async () => {
  const { connect } = await import('node:net');
  const baseline = fds();
  const held = [];
  let closed = 0;
  // Connections that never start TLS, from one attacker address; in batches the listen backlog (128) can take, so
  // no SYN waits for a retransmission.
  for (let batch = 0; batch < 530; batch += 100) {
    const opened = [];
    for (let i = batch; i < Math.min(batch + 100, 530); i++) {
      const c = connect({ host: ECHO_IP, port: 15008, localAddress: '127.68.9.1' });
      c.on('error', () => {});
      c.on('close', () => closed++);
      held.push(c);
      opened.push(new Promise((resolve) => (c.once('connect', resolve), c.once('close', resolve))));
    }
    await Promise.all(opened);
  }
  try {
    await waitFor(() => closed >= 18, { timeoutMs: 5_000, message: 'the 18 connections over the limit closed' }).catch(async (e: Error) => {
      const refused = await daemon.metric('ztunnel_node_hbone_connections_refused_total', { reason: 'peer_limit' });
      throw new Error(`${e.message}: ${closed} closed, ${fds() - baseline} descriptors, ${refused} refused`);
    });
    // A negative check: 300 ms in which a connection under the limit, wrongly closed, would have been.
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(closed, 18, 'exactly the connections over 512 were closed; the others wait for their handshake deadline');
    assert.ok(fds() - baseline <= 512 + 10);
    assert.ok((await roundTrip()) < 1_000, 'another peer (127.0.0.1) is served meanwhile');
    assert.equal(await daemon.metric('ztunnel_node_hbone_connections_refused_total', { reason: 'peer_limit' }), 18);
  } finally {
    for (const c of held) c.destroy();
  }
  await waitFor(() => fds() <= baseline + 5, { timeoutMs: 5_000, message: `descriptors back to ${baseline} (now ${fds()})` });
});

test('handshake slowloris: 10,000 connections from 100 addresses that never finish TLS are closed at the 10 s deadline; legitimate handshakes go on', { timeout: 90_000 }, async () => {
  const { connect } = await import('node:net');
  const baseline = fds();
  const held = [];
  let closed = 0;
  const t0 = performance.now();
  // Half send nothing, half stall mid-handshake (the first bytes of a ClientHello record); in batches the listen
  // backlog can take, from 100 source addresses (each under the per-peer limit).
  for (let batch = 0; batch < 10_000; batch += 200) {
    const opened = [];
    for (let i = batch; i < batch + 200; i++) {
      const c = connect({ host: ECHO_IP, port: 15008, localAddress: `127.68.3.${1 + (i % 100)}` });
      c.on('error', () => {});
      c.on('close', () => closed++);
      if (i % 2 === 1) c.once('connect', () => c.write(Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01])));
      held.push(c);
      opened.push(new Promise((resolve) => (c.once('connect', resolve), c.once('close', resolve))));
    }
    await Promise.all(opened);
  }
  try {
    const during = [];
    for (let i = 0; i < 5; i++) during.push(await roundTrip());
    assert.ok(Math.max(...during) < 2_000, `legitimate round trips while 10,000 handshakes hang: ${during.map(Math.round).join(', ')} ms`);
    await waitFor(() => closed === 10_000, { timeoutMs: 30_000, intervalMs: 250, message: 'all 10,000 closed by the daemon' }).catch(async (err: Error) => {
      // The figures at the timeout (the message above is written when the wait starts): failed once in CI.
      const accepts = await daemon.metric('ztunnel_node_accept_errors_total');
      const failures = await daemon.metric('ztunnel_node_tls_handshake_failures_total', { direction: 'inbound' });
      throw new Error(`${err.message}: ${closed} closed, ${failures} handshake failures, ${accepts} accept errors, ${fds()} daemon descriptors`);
    });
    const secs = (performance.now() - t0) / 1000;
    assert.ok(secs >= 9, `closed at the deadline, not before (${secs.toFixed(1)} s)`);
    assert.ok(secs < 25, `closed within the deadline and some slack (${secs.toFixed(1)} s)`);
  } finally {
    for (const c of held) c.destroy();
  }
  await waitFor(() => fds() <= baseline + 5, { timeoutMs: 5_000, message: `descriptors back to ${baseline} (now ${fds()})` });
  assert.ok(await daemon.metric('ztunnel_node_tls_handshake_failures_total', { direction: 'inbound' }) >= 10_000, 'counted as handshake failures');
});

test('descriptors exhausted: failed accepts are counted and logged (rate-limited), and the daemon recovers', async () => {
  const { connect } = await import('node:net');
  const { execFileSync } = await import('node:child_process');
  const pid = daemon.child.pid;
  const base = fds();
  const soft = /Max open files\s+(\d+)/.exec(readFileSync(`/proc/${pid}/limits`, 'utf8'))![1];
  // Lower the daemon's (soft) descriptor limit to just above what it holds now (util-linux prlimit on the live process).
  execFileSync('prlimit', [`--pid=${pid}`, `--nofile=${base + 20}:`]);
  const held = [];
  try {
    for (let i = 0; i < 60; i++) {
      const c = connect({ host: ECHO_IP, port: 15008, localAddress: '127.68.9.2' });
      c.on('error', () => {});
      held.push(c);
    }
    // The log line needs no new descriptor (a scrape would: the stats server shares the process's limit).
    await daemon.waitForLog((l) => l.message === 'accept failed' && /Too many open files/.test(String(l.error ?? '')));
  } finally {
    for (const c of held) c.destroy();
    execFileSync('prlimit', [`--pid=${pid}`, `--nofile=${soft}:`]);
  }
  await waitFor(() => fds() <= base + 5, { timeoutMs: 5_000, message: `descriptors back to ${base} (now ${fds()})` });
  assert.ok((await roundTrip()) < 1_000, 'served again once descriptors are free');
  assert.ok((await daemon.metric('ztunnel_node_accept_errors_total')) > 0, 'accept errors counted');
  const lines = daemon.logs.filter((l) => l.message === 'accept failed').length;
  assert.ok(lines <= 110, `${lines} "accept failed" lines: rate-limited per cause`);
});
