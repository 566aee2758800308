// The idle footprint of one daemon (issue 14): `ztunnel-node proxy` in local mode (built-in CA, examples/localhost.yaml:
// one workload, one service, one policy), started with the Node flags operators run it with (daemon-flags.mjs), read
// SETTLE seconds after /healthz/ready answers 200. A bare Node (`node -e 'setTimeout(()=>{},1e6)'`, same flags) is
// measured the same way, for the share that is Node's own.
//
//   node bench/idle-rss.mjs --node /path/to/node20 --node /path/to/node24 --rounds 3
//   node bench/idle-rss.mjs --root /tmp/ztn-before --root . --rounds 3      (A/B of two trees: bin/ + dist/ each)
//   node bench/idle-rss.mjs --flags= --flags=--v8-pool-size=1 --rounds 3    (A/B of extra Node flags)
//
// Options (each repeatable one gives one more variant; every node × root × flags is run once per round, in the same
// order each round, so the variants interleave and share the machine's state):
//   --node PATH     a Node binary (default: the one running this script)
//   --root DIR      a tree with bin/ztunnel-node.js and dist/ (default: this repository)
//   --flags STR     Node flags added after daemon-flags.mjs's (default: none)
//   --rounds N      rounds (default 3); the table shows medians
//   --settle S      seconds between ready and the reading (default 10)
//   --no-bare       skip the bare Node
//   --smaps         print each run's largest mappings too
//   --json FILE     write every run's readings
//   --workloads N   the daemon loads a local config of N workloads, N/10 services and N/100 policies instead of
//                   examples/localhost.yaml (test/helpers/large-config.ts, as bench/xds-scale.mjs's local file): the
//                   state's footprint at rest (issue 31's 20k figure), read the same way
//
// Each run reads, in this order (the scrape allocates, so it comes last): /proc/PID/status (VmRSS, RssAnon, RssFile),
// /proc/PID/smaps grouped by what is mapped (Node's binary, the native module, other files, the malloc heap, anonymous
// memory: V8's heap, thread stacks and malloc's mmapped arenas), then the daemon's /metrics (the main thread's JS heap
// as V8 reports it: committed, used, per space, and external memory).
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { DAEMON_NODE_FLAGS } from './daemon-flags.mjs';
import { writeLargeConfig } from '../dist-test/helpers/large-config.js';

const here = dirname(fileURLToPath(import.meta.url));
const repo = join(here, '..');
const ADMIN_IP = '127.50.255.14';
const READY_TIMEOUT_MS = 30_000;

const { values: opts } = parseArgs({
  options: {
    node: { type: 'string', multiple: true },
    root: { type: 'string', multiple: true },
    flags: { type: 'string', multiple: true },
    rounds: { type: 'string', default: '3' },
    settle: { type: 'string', default: '10' },
    'no-bare': { type: 'boolean', default: false },
    smaps: { type: 'boolean', default: false },
    json: { type: 'string' },
    workloads: { type: 'string' },
  },
});
const nodes = (opts.node ?? [process.execPath]).map((p) => realpathSync(p));
const roots = (opts.root ?? [repo]).map((r) => resolve(r));
const flagSets = (opts.flags ?? ['']).map((f) => f.split(' ').filter(Boolean));
const rounds = Number(opts.rounds);
const settleMs = Number(opts.settle) * 1000;

const tmp = mkdtempSync(join(tmpdir(), 'ztn-idle-rss-'));
const localConfig = opts.workloads === undefined ? join(repo, 'examples', 'localhost.yaml') : join(tmp, 'workloads.yaml');
if (opts.workloads !== undefined) writeLargeConfig(localConfig, { workloads: Number(opts.workloads) });
const children = new Set();
const cleanup = () => {
  for (const c of children) c.kill('SIGKILL');
  rmSync(tmp, { recursive: true, force: true });
};
process.on('exit', cleanup);
for (const s of ['SIGINT', 'SIGTERM']) process.on(s, () => process.exit(130));

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const mib = (kb) => Math.round((kb / 1024) * 10) / 10;
const versions = new Map(nodes.map((n) => [n, execFileSync(n, ['--version'], { encoding: 'utf8' }).trim()]));

/** VmRSS and its three parts, kB. */
function status(pid) {
  const text = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (key) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? NaN);
  const threads = Number(/^Threads:\s+(\d+)/m.exec(text)?.[1] ?? NaN);
  return { rss: kb('VmRSS'), anon: kb('RssAnon'), file: kb('RssFile'), shmem: kb('RssShmem'), threads };
}

/** Resident kB by what is mapped, from /proc/PID/smaps; and the largest mappings. */
function smaps(pid, nodeBinary) {
  const text = readFileSync(`/proc/${pid}/smaps`, 'utf8');
  const groups = {};
  const maps = [];
  let current = null;
  for (const line of text.split('\n')) {
    const header = /^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \d+\s*(.*)$/.exec(line);
    if (header) {
      const path = header[4];
      const group =
        path === nodeBinary ? 'node binary'
        : path.endsWith('.node') ? 'native module'
        : path === '[heap]' ? 'malloc heap (brk)'
        : path === '' ? 'anonymous'
        : path.startsWith('[stack') ? 'main stack'
        : path.startsWith('[') ? 'other'
        : /\.so(\.|$)/.test(path) ? 'shared libraries'
        : 'other files';
      current = { group, path, perms: header[3], sizeKb: (parseInt(header[2], 16) - parseInt(header[1], 16)) / 1024, rss: 0, anon: 0 };
      maps.push(current);
      continue;
    }
    const field = /^(Rss|Anonymous):\s+(\d+) kB/.exec(line);
    if (field && current) current[field[1] === 'Rss' ? 'rss' : 'anon'] = Number(field[2]);
  }
  for (const m of maps) {
    const g = (groups[m.group] ??= { rss: 0, anon: 0 });
    g.rss += m.rss;
    g.anon += m.anon;
  }
  return { groups, largest: maps.sort((a, b) => b.rss - a.rss).slice(0, 12) };
}

/** The main thread's JS heap from the daemon's own metrics (prom-client's default metrics), MiB. */
async function jsHeap() {
  const text = await fetch(`http://${ADMIN_IP}:15020/metrics`).then((r) => r.text(), () => '');
  const value = (re) => Math.round((Number(re.exec(text)?.[1] ?? NaN) / 2 ** 20) * 10) / 10;
  const spaces = {};
  for (const m of text.matchAll(/^nodejs_heap_space_size_used_bytes\{space="(\w+)"\} (\S+)$/gm)) {
    spaces[m[1]] = Math.round((Number(m[2]) / 2 ** 20) * 10) / 10;
  }
  return {
    committed: value(/^nodejs_heap_size_total_bytes (\S+)$/m),
    used: value(/^nodejs_heap_size_used_bytes (\S+)$/m),
    external: value(/^nodejs_external_memory_bytes (\S+)$/m),
    spaces,
  };
}

async function waitReady(child) {
  const deadline = Date.now() + READY_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`the daemon exited (${child.exitCode})`);
    const ok = await fetch(`http://${ADMIN_IP}:15021/healthz/ready`).then((r) => r.status === 200, () => false);
    if (ok) return;
    await sleep(50);
  }
  throw new Error('the daemon was not ready in time');
}

async function stop(child) {
  if (child.exitCode === null && child.signalCode === null) {
    child.kill('SIGTERM');
    const killer = setTimeout(() => child.kill('SIGKILL'), 5_000);
    await new Promise((r) => child.once('close', r));
    clearTimeout(killer);
  }
  children.delete(child);
}

/** One run: a daemon (root set) or a bare Node (root null). */
async function measure(node, root, flags) {
  const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', ...(process.env.HOME ? { HOME: process.env.HOME } : {}) };
  let args;
  if (root === null) {
    args = [...DAEMON_NODE_FLAGS, ...flags, '-e', 'setTimeout(() => {}, 1e6)'];
  } else {
    Object.assign(env, {
      PROXY_MODE: 'local',
      NODE_NAME: 'local',
      LOCAL_XDS_PATH: localConfig,
      LOCAL_CA_DIR: join(tmp, 'ca'),
      // Its own: the daemons of other Node lines must not take this one over.
      HANDOVER_SOCKET: join(tmp, 'handover.sock'),
      ADMIN_ADDR: `${ADMIN_IP}:15000`,
      STATS_ADDR: `${ADMIN_IP}:15020`,
      READINESS_ADDR: `${ADMIN_IP}:15021`,
      LOG_FORMAT: 'json',
      RUST_LOG: 'info',
      CONNECTION_TERMINATION_DEADLINE: '1s',
    });
    args = [...DAEMON_NODE_FLAGS, ...flags, join(root, 'bin', 'ztunnel-node.js'), 'proxy'];
  }
  const t0 = performance.now();
  const child = spawn(node, args, { env, stdio: ['ignore', 'ignore', 'inherit'] });
  children.add(child);
  try {
    if (root !== null) await waitReady(child);
    else await sleep(200);
    const readyMs = Math.round(performance.now() - t0);
    await sleep(settleMs);
    const st = status(child.pid);
    const sm = smaps(child.pid, node);
    const heap = root === null ? null : await jsHeap();
    return { readyMs, status: st, smaps: sm, heap };
  } finally {
    const s0 = performance.now();
    await stop(child);
    if (process.env.IDLE_RSS_DEBUG) process.stderr.write(`  stopped in ${Math.round(performance.now() - s0)} ms\n`);
  }
}

const variants = [];
for (const node of nodes) {
  if (!opts['no-bare']) for (const flags of flagSets) variants.push({ node, root: null, flags });
  for (const root of roots) for (const flags of flagSets) variants.push({ node, root, flags });
}
const name = (v) => [versions.get(v.node), v.root === null ? 'bare node' : roots.length > 1 ? v.root : 'daemon', v.flags.join(' ')].filter(Boolean).join(' ');

const runs = [];
for (let r = 0; r < rounds; r++) {
  for (const v of variants) {
    const m = await measure(v.node, v.root, v.flags);
    runs.push({ round: r, variant: name(v), ...m });
    process.stderr.write(
      `round ${r + 1}/${rounds} ${name(v)}: RSS ${mib(m.status.rss)} MiB (anon ${mib(m.status.anon)}, file ${mib(m.status.file)})` +
        (m.heap ? `, JS heap ${m.heap.committed} MiB committed / ${m.heap.used} used` : '') +
        '\n',
    );
    if (opts.smaps) {
      for (const map of m.smaps.largest) process.stderr.write(`    ${mib(map.rss).toString().padStart(6)} MiB  ${map.perms} ${map.path || '(anonymous)'} (${mib(map.sizeKb)} MiB mapped)\n`);
    }
  }
}

const median = (xs) => {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const round1 = (x) => Math.round(x * 10) / 10;
const GROUPS = ['node binary', 'native module', 'shared libraries', 'other files', 'malloc heap (brk)', 'anonymous', 'main stack', 'other'];
const summary = [];
for (const v of variants) {
  const rs = runs.filter((x) => x.variant === name(v));
  const row = {
    variant: name(v),
    rssMiB: mib(median(rs.map((x) => x.status.rss))),
    rssMiBAll: rs.map((x) => mib(x.status.rss)),
    anonMiB: mib(median(rs.map((x) => x.status.anon))),
    fileMiB: mib(median(rs.map((x) => x.status.file))),
    threads: median(rs.map((x) => x.status.threads)),
    smapsMiB: Object.fromEntries(GROUPS.map((g) => [g, mib(median(rs.map((x) => x.smaps.groups[g]?.rss ?? 0)))])),
    jsHeapCommittedMiB: round1(median(rs.map((x) => x.heap?.committed ?? NaN))),
    jsHeapUsedMiB: round1(median(rs.map((x) => x.heap?.used ?? NaN))),
    externalMiB: round1(median(rs.map((x) => x.heap?.external ?? NaN))),
    spacesUsedMiB: rs[0]?.heap
      ? Object.fromEntries(Object.keys(rs[0].heap.spaces).map((s) => [s, round1(median(rs.map((x) => x.heap?.spaces[s] ?? NaN)))]))
      : null,
    readyMs: median(rs.map((x) => x.readyMs)),
  };
  summary.push(row);
}

const cols = [
  ['variant', 44],
  ['RSS', 7],
  ['anon', 6],
  ['file', 6],
  ['thr', 4],
  ['node', 6],
  ['.node', 6],
  ['libs', 6],
  ['brk', 6],
  ['anon maps', 10],
  ['JS heap', 8],
  ['JS used', 8],
  ['ready ms', 9],
  ['runs', 20],
];
const line = (vals) => vals.map((v, i) => (i === 0 ? String(v).padEnd(cols[i][1]) : String(v).padStart(cols[i][1]))).join(' ');
console.log(`\nidle RSS, MiB (median of ${rounds}; ${settleMs / 1000} s after ready; ${opts.workloads === undefined ? 'examples/localhost.yaml' : `${opts.workloads} workloads`}; flags ${DAEMON_NODE_FLAGS.join(' ')})`);
console.log(line(cols.map((c) => c[0])));
for (const s of summary) {
  console.log(
    line([
      s.variant,
      s.rssMiB,
      s.anonMiB,
      s.fileMiB,
      s.threads,
      s.smapsMiB['node binary'],
      s.smapsMiB['native module'],
      s.smapsMiB['shared libraries'],
      s.smapsMiB['malloc heap (brk)'],
      s.smapsMiB.anonymous,
      Number.isFinite(s.jsHeapCommittedMiB) ? s.jsHeapCommittedMiB : '-',
      Number.isFinite(s.jsHeapUsedMiB) ? s.jsHeapUsedMiB : '-',
      s.readyMs,
      s.rssMiBAll.join('/'),
    ]),
  );
}
if (opts.json) writeFileSync(opts.json, `${JSON.stringify({ flags: DAEMON_NODE_FLAGS, settleMs, rounds, summary, runs }, null, 2)}\n`);
