// Where the tail of request/response latency goes (issue 14's p99 target): 1 KiB exchanges at a fixed rate through
// ztunnel-node (two daemons, SOCKS5 → HBONE) and through Envoy (client → HBONE → server), the harness's loopback
// topologies, each run under `perf sched record` (the whole machine: the scheduler's view of every thread). For each
// path it prints the load client's latency percentiles and, per process group (the proxies, the load client and
// server), what `perf sched latency` reports: how often their threads were woken and how long a woken thread waited
// for a CPU (average and maximum), and from `perf sched timehist` the distribution of those waits (p50, p99 of every
// switch-in of the group's threads). Root, perf and the harness's Envoy (bench/.venv) needed.
//
//   node bench/profile-rr.mjs [--rate 1000] [--count 5000] [--rounds 2] [--neighbours N] [--json FILE]
//
// --neighbours N: N CPU-bound processes run through the rounds (as `run.mjs --neighbours`: a busy node).
// --json FILE: the rows written to FILE too, with the run's settings (bench/results/rr-profile*.json).
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { ensureEnvoy } from './harness/envoy.mjs';
import { startNeighbours, stopNeighbours } from './harness/neighbours.mjs';
import { wholeNumber } from './harness/processes.mjs';
import { startAll } from './harness/topologies.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const { values: opts } = parseArgs({
  options: {
    rate: { type: 'string', default: '1000' },
    count: { type: 'string', default: '5000' },
    rounds: { type: 'string', default: '2' },
    neighbours: { type: 'string', default: '0' },
    json: { type: 'string' },
  },
});
const rate = wholeNumber('--rate', opts.rate, 1);
const count = wholeNumber('--count', opts.count, 1);
const rounds = wholeNumber('--rounds', opts.rounds, 1);
const neighbourCount = wholeNumber('--neighbours', opts.neighbours);
const jsonFile = opts.json ?? null;
const loadgen = join(root, 'target', 'release', 'ztn-loadgen');
if (spawnSync('cargo', ['build', '--release', '-q', '-p', 'ztunnel-loadgen'], { cwd: root, stdio: 'inherit' }).status !== 0) throw new Error('building the load client failed');
const tmp = mkdtempSync(join(tmpdir(), 'ztn-rr-'));
const env = await startAll({ root, tmp, block: 61, loadgen, workers: 2, envoy: ensureEnvoy(), only: ['direct', 'ztunnel-node', 'envoy'], tunnelSources: 0 });
await env.idleDaemons(0);

/** `perf sched latency` rows: task name, runtime ms, switches, average and maximum wait after a wake (ms). */
function schedLatency(file) {
  const r = spawnSync('perf', ['sched', 'latency', '-i', file, '--sort', 'max'], { encoding: 'utf8', maxBuffer: 64 << 20 });
  const rows = [];
  for (const line of r.stdout.split('\n')) {
    const m = /^\s*(\S.*?):(\d+|\(\d+\))\s*\|\s*([\d.]+) ms\s*\|\s*(\d+)\s*\|\s*avg:\s*([\d.]+) ms\s*\|\s*max:\s*([\d.]+) ms/.exec(line);
    if (m) rows.push({ task: m[1].trim(), runMs: Number(m[3]), switches: Number(m[4]), avgMs: Number(m[5]), maxMs: Number(m[6]) });
  }
  return rows;
}

/**
 * Per `group`, from `perf sched timehist` (one line per run slice of a thread): the scheduling delay before each slice
 * (from the wake, `sched_waking` on the waker's CPU, to running: the IPI and a halted vCPU's return are in it) and the
 * slice's run time, in µs.
 */
function schedSlices(file) {
  const r = spawnSync('perf', ['sched', 'timehist', '-i', file], { encoding: 'utf8', maxBuffer: 256 << 20 });
  const slices = {};
  for (const line of r.stdout.split('\n')) {
    const m = /^\s*[\d.]+\s+\[\d+\]\s+(.+?)\[\d+(?:\/\d+)?\]\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)/.exec(line);
    const g = m && group(m[1].trim());
    if (!g) continue;
    const x = (slices[g] ??= { delays: [], runs: [] });
    x.delays.push(Number(m[3]) * 1000);
    x.runs.push(Number(m[4]) * 1000);
  }
  return slices;
}

const quantile = (sorted, q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];

const group = (task) => (/^ztunnel-\d|^ztunnel-control|^node$|^libuv|^V8/.test(task) ? 'ztunnel-node' : /^envoy|^wrk:|^dispatcher|^worker_/.test(task) ? 'envoy' : /^ztn-loadgen/.test(task) ? 'loadgen' : null);
const out = [];
const neighbours = startNeighbours(neighbourCount);
for (let round = 0; round < rounds; round++) {
  for (const name of ['direct', 'ztunnel-node', 'envoy']) {
    const t = env.topologies[name];
    const via = ['--target', t.target, ...(t.socks ? ['--socks', t.socks] : [])];
    spawnSync(loadgen, ['latency', ...via, '--size', '1024', '--count', '200']);
    const file = join(tmp, `${name}-${round}.data`);
    const perf = spawn('perf', ['sched', 'record', '-o', file, '-a'], { stdio: 'ignore' });
    await new Promise((r) => setTimeout(r, 500));
    const lg = spawnSync(loadgen, ['latency', ...via, '--size', '1024', '--count', String(count), '--rate', String(rate)], { encoding: 'utf8' });
    perf.kill('SIGINT');
    await new Promise((r) => perf.on('exit', r));
    const lat = JSON.parse(lg.stdout.trim().split('\n').pop());
    const groups = {};
    for (const row of schedLatency(file)) {
      const g = group(row.task);
      if (!g) continue;
      const x = (groups[g] ??= { switches: 0, waitMs: 0, maxMs: 0 });
      x.switches += row.switches;
      x.waitMs += row.avgMs * row.switches;
      x.maxMs = Math.max(x.maxMs, row.maxMs);
    }
    const slices = schedSlices(file);
    const sched = Object.fromEntries(Object.entries(groups).map(([g, x]) => {
      const d = (slices[g]?.delays ?? []).sort((a, b) => a - b);
      const run = (slices[g]?.runs ?? []).sort((a, b) => a - b);
      const dist = d.length ? {
        p50WaitUs: Math.round(quantile(d, 0.5)),
        p99WaitUs: Math.round(quantile(d, 0.99)),
        // CPU time of the group's threads per request, and the median slice: the work a hop does once running.
        runUsPerRequest: Math.round(run.reduce((a, b) => a + b, 0) / count),
        p50RunUs: Math.round(quantile(run, 0.5)),
      } : {};
      return [g, { wakesPerRequest: +(x.switches / count).toFixed(2), avgWaitUs: +((x.waitMs / Math.max(x.switches, 1)) * 1000).toFixed(1), ...dist, maxWaitUs: Math.round(x.maxMs * 1000) }];
    }));
    out.push({ round, path: name, p50: lat.p50_us, p99: lat.p99_us, p999: lat.p999_us, sched });
    console.log(JSON.stringify(out.at(-1)));
  }
}
await stopNeighbours(neighbours);
await env.stop();
if (jsonFile) {
  const settings = { rate, count, rounds, neighbours: neighbourCount, when: new Date().toISOString(), loadavg: loadavg() };
  writeFileSync(jsonFile, `${JSON.stringify({ settings, rows: out }, null, 2)}\n`);
}
rmSync(tmp, { recursive: true, force: true });
