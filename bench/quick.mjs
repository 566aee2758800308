#!/usr/bin/env node
// `npm run bench`: direct loopback vs two ztunnel-node daemons over HBONE, interleaved in one run.
//
//   direct: loadgen client ─────────────────────────────────────────────▶ loadgen server (echo's IP)
//   tunnel: loadgen client ─SOCKS5▶ node-a ══ HBONE (mTLS, h2 CONNECT) ══▶ node-b ─▶ loadgen server
//
// Measures single-stream throughput and 1 KiB request/response latency (p50, p99), ROUNDS times each, alternating
// direct and tunnel so drift on this shared machine hits both alike; prints medians and ratios and writes
// bench/results/quick.json. Uses the release native module (npm install builds it) and the Rust load client.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const BYTES = Number(process.env.BENCH_BYTES ?? 1024 ** 3);
const LAT_COUNT = Number(process.env.BENCH_LATENCY_COUNT ?? 3000);
const SLEEP_IP = '127.50.1.10';
const ECHO_IP = '127.50.2.10';
const APP = `${ECHO_IP}:8080`;
const SOCKS = `${SLEEP_IP}:15080`;
const loadgen = join(root, 'target', 'release', 'ztn-loadgen');

const children = [];
const tmp = mkdtempSync(join(tmpdir(), 'ztn-bench-'));
function cleanup() {
  for (const c of children) c.kill('SIGTERM');
  rmSync(tmp, { recursive: true, force: true });
}
process.on('exit', cleanup);
process.on('SIGINT', () => process.exit(130));

function build() {
  const r = spawnSync('cargo', ['build', '--release', '-p', 'ztunnel-loadgen'], { cwd: root, stdio: 'inherit' });
  if (r.status !== 0) throw new Error('building the load client failed');
}

function waitLine(child, pattern, what) {
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`${what} did not start: ${out}`)), 20_000);
    const on = (d) => {
      out += d;
      if (pattern.test(out)) {
        clearTimeout(timer);
        resolve();
      }
    };
    child.stdout?.on('data', on);
    child.stderr?.on('data', on);
    child.on('exit', (code) => reject(new Error(`${what} exited ${code}: ${out}`)));
  });
}

async function waitReady(addr) {
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    try {
      const r = await fetch(`http://${addr}/healthz/ready`);
      if (r.status === 200) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`daemon at ${addr} never became ready`);
}

function startDaemon(node, n) {
  const cfg = join(tmp, 'bench.yaml');
  writeFileSync(cfg, `workloads:
- {uid: bench/sleep, name: sleep, namespace: default, serviceAccount: sleep, workloadIps: ["${SLEEP_IP}"], protocol: HBONE, node: node-a}
- {uid: bench/echo, name: echo, namespace: default, serviceAccount: echo, workloadIps: ["${ECHO_IP}"], protocol: HBONE, node: node-b}
`);
  const ip = `127.50.255.${n}`;
  const env = {
    ...process.env, PROXY_MODE: 'local', NODE_NAME: node, LOCAL_XDS_PATH: cfg, LOCAL_CA_DIR: join(tmp, 'ca'),
    ADMIN_ADDR: `${ip}:15000`, STATS_ADDR: `${ip}:15020`, READINESS_ADDR: `${ip}:15021`, RUST_LOG: 'warn',
    XDS_ADDRESS: '', CA_ADDRESS: '',
  };
  const child = spawn(process.execPath, [join(root, 'bin', 'ztunnel-node.js'), 'proxy'], { env, stdio: ['ignore', 'ignore', 'inherit'] });
  children.push(child);
  return { child, ready: `${ip}:15021`, pid: child.pid };
}

function run(args) {
  const r = spawnSync(loadgen, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`ztn-loadgen ${args.join(' ')}: ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop());
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const spread = (xs) => `${Math.min(...xs).toFixed(1)}–${Math.max(...xs).toFixed(1)}`;

async function main() {
  build();
  const server = spawn(loadgen, ['serve', '--listen', APP], { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(server);
  await waitLine(server, /listening/, 'load server');
  const a = startDaemon('node-a', 1);
  const b = startDaemon('node-b', 2);
  await Promise.all([waitReady(a.ready), waitReady(b.ready)]);
  // Warm the tunnel (the first connection pays for the TLS handshake).
  run(['latency', '--target', APP, '--socks', SOCKS, '--count', '100']);

  const samples = { direct: { gbps: [], p50: [], p99: [] }, tunnel: { gbps: [], p50: [], p99: [] } };
  for (let round = 0; round < ROUNDS; round++) {
    for (const [name, via] of [['direct', []], ['tunnel', ['--socks', SOCKS]]]) {
      const t = run(['throughput', '--target', APP, ...via, '--bytes', String(BYTES)]);
      samples[name].gbps.push(t.gbps);
    }
    for (const [name, via] of [['direct', []], ['tunnel', ['--socks', SOCKS]]]) {
      const l = run(['latency', '--target', APP, ...via, '--size', '1024', '--count', String(LAT_COUNT)]);
      samples[name].p50.push(l.p50_us);
      samples[name].p99.push(l.p99_us);
    }
    process.stderr.write(`round ${round + 1}/${ROUNDS} done\n`);
  }
  const d = samples.direct;
  const t = samples.tunnel;
  const rows = [
    ['single-stream throughput (Gbit/s)', median(d.gbps), median(t.gbps), median(t.gbps) / median(d.gbps), spread(d.gbps), spread(t.gbps)],
    ['1 KiB req/resp p50 (µs)', median(d.p50), median(t.p50), median(t.p50) / median(d.p50), spread(d.p50), spread(t.p50)],
    ['1 KiB req/resp p99 (µs)', median(d.p99), median(t.p99), median(t.p99) / median(d.p99), spread(d.p99), spread(t.p99)],
  ];
  console.log(`\nztunnel-node quick benchmark: ${ROUNDS} interleaved rounds, ${cpus().length} cores, ${(BYTES / 1024 ** 3).toFixed(2)} GiB per throughput run, ${LAT_COUNT} exchanges per latency run\n`);
  console.log('| measurement | direct | through 2 daemons (HBONE) | tunnel / direct | direct range | tunnel range |');
  console.log('|---|---|---|---|---|---|');
  for (const [name, dv, tv, ratio, dr, tr] of rows) {
    console.log(`| ${name} | ${dv.toFixed(1)} | ${tv.toFixed(1)} | ${ratio.toFixed(2)} | ${dr} | ${tr} |`);
  }
  console.log(`\nlatency added by the two hops: p50 +${(median(t.p50) - median(d.p50)).toFixed(0)} µs, p99 +${(median(t.p99) - median(d.p99)).toFixed(0)} µs`);
  const result = {
    when: new Date().toISOString(),
    machine: { cores: cpus().length, cpu: cpus()[0]?.model, node: process.version },
    params: { rounds: ROUNDS, bytes: BYTES, latencyCount: LAT_COUNT },
    samples,
  };
  writeFileSync(join(root, 'bench', 'results', 'quick.json'), JSON.stringify(result, null, 2) + '\n');
}

main().then(() => process.exit(0), (err) => {
  console.error(err.message);
  process.exit(1);
});
