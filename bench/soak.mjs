#!/usr/bin/env node
// `npm run bench:soak` (not in CI): legitimate traffic and the overload attacks of test/integration/overload.test.ts,
// for SOAK_MINUTES (default 60), against two local-mode daemons (node-a hosts `sleep`, node-b hosts `echo` and a
// never-accepting port). Every 10 s it samples both daemons' descriptors and RSS and the legitimate round trips of
// the interval; at the end it writes bench/results/soak.json and prints whether descriptors and RSS stayed flat
// (the last quarter's mean against the second quarter's: the first quarter is warm-up).
// Each attack runs in a child process of its own (this script with `--attack NAME`): an attacker that crashes
// (Node's HTTP/2 client aborted once under these patterns) is reported and the soak goes on.
//
//   legitimate  8 concurrent SOCKS5 → HBONE round trips of 1 KiB to 1 MiB, sleep → echo, all the time
//   attacks     one every 15 s, in turn: rapid reset toward the never-accepting port; 100 streams parked on dials
//               then the peer gone; 2,000 slow partial requests to node-b's stats; 1,000 failing streams; 530
//               handshake-less connections from one address; 4 connections × 100 streams to an endless sender whose
//               client stops reading, for 8 s (node-b's STREAM_BUFFER_BUDGET is 64 MiB here: about 160 MiB asked)
import { spawn } from 'node:child_process';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { constants as h2c } from 'node:http2';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sumSamples } from '../dist/cli/prom-text.js';
import { makeTempDir, ROOT, startDaemon, workload } from '../dist-test/helpers/daemon.js';
import { connectRequest, hboneSession } from '../dist-test/helpers/hbone.js';
import { pattern, socksRoundTrip, startEchoServer, startFirehoseServer, startStallingRelay } from '../dist-test/helpers/net.js';
import { builtinCa, builtinLeaf, spiffe } from '../dist-test/helpers/pki.js';

const MINUTES = Number(process.env.SOAK_MINUTES ?? 60);
const SLEEP_IP = '127.50.70.10';
const ECHO_IP = '127.50.71.10';
const ADMIN = (k) => `127.50.72.${k}`;
const HOLE = 8081;
const FIREHOSE = 8082;
const RELAY = { host: '127.50.74.1', port: 15008 };
const BUDGET = 64 * 2 ** 20;

const child = process.argv[2] === '--attack' ? process.argv[3] : null;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let session;
if (child !== null) {
  // An attack in a child process: the credentials come from the parent.
  const { root, cert, key } = JSON.parse(readFileSync(process.env.SOAK_CREDENTIALS, 'utf8'));
  session = (opts = {}) => hboneSession({ host: ECHO_IP, ca: root, cert, key, ...opts });
  await ATTACKS()[child]();
  process.exit(0);
}

const caDir = makeTempDir('ztn-soak-ca-');
const certDir = makeTempDir('ztn-soak-certs-');
const config = {
  workloads: [workload({ name: 'sleep', ip: SLEEP_IP, node: 'node-a' }), workload({ name: 'echo', ip: ECHO_IP, node: 'node-b' })],
};
const echo = await startEchoServer(ECHO_IP, 8080);
const firehose = await startFirehoseServer(ECHO_IP, FIREHOSE);
const hole = spawn('python3', ['-c', `import socket, time
s = socket.socket(); s.bind(("${ECHO_IP}", ${HOLE})); s.listen(0); print("listening", flush=True); time.sleep(10**6)`], { stdio: ['ignore', 'pipe', 'inherit'] });
await new Promise((r) => hole.stdout.once('data', r));
const a = await startDaemon({ node: 'node-a', config, caDir, adminIp: ADMIN(1), env: { RUST_LOG: 'warn' } });
const b = await startDaemon({ node: 'node-b', config, caDir, adminIp: ADMIN(2), env: { RUST_LOG: 'warn', STREAM_BUFFER_BUDGET: String(BUDGET) } });
const root = builtinCa(caDir).certPem;
const leaf = builtinLeaf(certDir, caDir, [spiffe('default', 'attacker')], 'attacker');
const credentials = join(certDir, 'attacker.json');
writeFileSync(credentials, JSON.stringify({ root, cert: leaf.chainPem, key: leaf.keyPem }));

const fds = (d) => readdirSync(`/proc/${d.child.pid}/fd`).length;
const rss = (d) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${d.child.pid}/status`, 'utf8'))[1]) * 1024;
const end = Date.now() + MINUTES * 60_000;

// Legitimate traffic.
const interval = { ok: 0, failed: 0, ms: [] };
async function legit() {
  while (Date.now() < end) {
    const size = 1024 * (1 + Math.floor(Math.random() * 1024));
    const t0 = performance.now();
    try {
      const r = await socksRoundTrip({ socks: { host: SLEEP_IP, port: 15080 }, dest: { host: ECHO_IP, port: 8080 }, payload: pattern(size, 1) });
      if (r.bytes === size) interval.ok++;
      else interval.failed++;
      interval.ms.push(performance.now() - t0);
    } catch {
      interval.failed++;
    }
  }
}

/** The attacks, by name (a function: hoisted, so a child process can run one before the soak's setup). */
function ATTACKS() {
  return {
    async rapidReset() {
      const s = await session();
      s.on('error', () => {});
      for (let sent = 0; sent < 2_000 && !s.destroyed; sent += 10) {
        for (let i = 0; i < 10; i++) {
          try {
            const st = s.request({ ':method': 'CONNECT', ':authority': `${ECHO_IP}:${HOLE}` }, { endStream: false });
            st.on('error', () => {});
            setTimeout(() => st.close(h2c.NGHTTP2_CANCEL), 5);
          } catch {
            break;
          }
        }
        await sleep(10);
      }
      s.destroy();
    },
    async parkedDials() {
      const s = await session();
      s.on('error', () => {});
      for (let i = 0; i < 100; i++) s.request({ ':method': 'CONNECT', ':authority': `${ECHO_IP}:${HOLE}` }, { endStream: false }).on('error', () => {});
      await sleep(2_000);
      s.destroy();
    },
    async slowStats() {
      const socks = [];
      for (let i = 0; i < 2_000; i++) {
        const c = connect(15020, ADMIN(2));
        c.on('error', () => {});
        c.on('connect', () => c.write('GET /metrics HTTP/1.1\r\nHost: x\r\n'));
        socks.push(c);
      }
      await sleep(4_000);
      for (const c of socks) c.destroy();
    },
    async failingStreams() {
      const s = await session();
      s.on('error', () => {});
      for (let batch = 0; batch < 20; batch++) await Promise.all(Array.from({ length: 50 }, () => connectRequest(s, `${ECHO_IP}:9`)));
      s.destroy();
    },
    async nonReading() {
      const relay = await startStallingRelay(RELAY, { host: ECHO_IP, port: 15008 });
      const sessions = [];
      try {
        for (let i = 0; i < 4; i++) {
          const s = await session({ via: RELAY, settings: { initialWindowSize: 2 ** 31 - 1 } });
          s.setLocalWindowSize(2 ** 31 - 1);
          s.on('error', () => {});
          sessions.push(s);
        }
        relay.stall();
        for (const s of sessions) {
          for (let k = 0; k < 100; k++) s.request({ ':method': 'CONNECT', ':authority': `${ECHO_IP}:${FIREHOSE}` }, { endStream: false }).on('error', () => {});
        }
        await sleep(8_000);
      } finally {
        for (const s of sessions) s.destroy();
        await relay.close();
      }
    },
    async peerFlood() {
      const socks = [];
      for (let i = 0; i < 530; i++) {
        const c = connect({ host: ECHO_IP, port: 15008, localAddress: '127.50.73.1' });
        c.on('error', () => {});
        socks.push(c);
        if (i % 100 === 99) await sleep(50);
      }
      await sleep(3_000);
      for (const c of socks) c.destroy();
    },
  };
}

/** Runs one attack in a child process; resolves its exit code (an attacker's crash is the attacker's). */
function runAttack(name) {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [fileURLToPath(import.meta.url), '--attack', name], {
      env: { ...process.env, SOAK_CREDENTIALS: credentials },
      stdio: ['ignore', 'inherit', 'inherit'],
    });
    p.on('exit', (code, signal) => resolve(code ?? signal));
  });
}

const attackerExits = {};
async function attacks() {
  const names = Object.keys(ATTACKS());
  for (let i = 0; Date.now() < end; i++) {
    const name = names[i % names.length];
    const code = await runAttack(name);
    if (code !== 0) {
      attackerExits[name] = [...(attackerExits[name] ?? []), code];
      console.error(`attack ${name}: the attacker process exited ${code}`);
    }
    await sleep(15_000);
  }
}

const samples = [];
async function sampler() {
  const t0 = Date.now();
  while (Date.now() < end) {
    await sleep(10_000);
    const ms = interval.ms.sort((x, y) => x - y);
    samples.push({
      s: Math.round((Date.now() - t0) / 1000),
      fds: [fds(a), fds(b)],
      rssMiB: [rss(a), rss(b)].map((x) => Math.round(x / 2 ** 20)),
      legit: { ok: interval.ok, failed: interval.failed, p99ms: Math.round(ms[Math.floor(ms.length * 0.99)] ?? 0) },
    });
    console.error(JSON.stringify(samples.at(-1)));
    Object.assign(interval, { ok: 0, failed: 0, ms: [] });
  }
}

await Promise.all([...Array.from({ length: 8 }, legit), attacks(), sampler()]);

const quarter = (q, f) => {
  const part = samples.slice(Math.floor((samples.length * q) / 4), Math.floor((samples.length * (q + 1)) / 4));
  return part.reduce((sum, s) => sum + f(s), 0) / Math.max(1, part.length);
};
const scraped = await b.metrics();
const summary = {
  minutes: MINUTES,
  attackerExits,
  nodeB: Object.fromEntries(
    ['ztunnel_node_buffer_shed_connections_total', 'ztunnel_node_buffer_backpressured_streams_total', 'ztunnel_node_buffered_bytes', 'ztunnel_node_hbone_connections_refused_total', 'ztunnel_node_log_lines_suppressed_total'].map((n) => [n, sumSamples(scraped, n)]),
  ),
  legitimate: { ok: samples.reduce((n, s) => n + s.legit.ok, 0), failed: samples.reduce((n, s) => n + s.legit.failed, 0) },
  fds: { second: [0, 1].map((i) => quarter(1, (s) => s.fds[i])), last: [0, 1].map((i) => quarter(3, (s) => s.fds[i])), max: [0, 1].map((i) => Math.max(...samples.map((s) => s.fds[i]))) },
  rssMiB: { second: [0, 1].map((i) => quarter(1, (s) => s.rssMiB[i])), last: [0, 1].map((i) => quarter(3, (s) => s.rssMiB[i])), max: [0, 1].map((i) => Math.max(...samples.map((s) => s.rssMiB[i]))) },
};
writeFileSync(join(ROOT, 'bench', 'results', 'soak.json'), JSON.stringify({ summary, samples }, null, 2) + '\n');
console.log(JSON.stringify(summary, null, 2));
await Promise.all([a.kill(), b.kill()]);
hole.kill();
await echo.close();
await firehose.close();
process.exit(0);
