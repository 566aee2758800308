#!/usr/bin/env node
// `npm run bench:dns`: the DNS proxy (15053) against the upstream resolver it forwards to, side by side in one run.
//
//   local      a mesh name answered by the proxy from the mesh state (echo.default.svc.cluster.local)
//   forwarded  a name the mesh does not know, forwarded by the proxy to the upstream (forwarded.bench)
//   upstream   the same name asked of the upstream directly
//
// The upstream is dnsmasq (Debian `dnsmasq-base`) answering forwarded.bench from its own configuration, on
// 127.50.53.1:53 (port 53: the proxy reads its upstream from a resolv.conf, which has no port; so this needs root).
// The load is dnsperf (Debian `dnsperf`) over UDP: a throughput run (no rate limit, 64 queries outstanding) and a
// latency run (2,000 queries/s, p50 and p99 from each response's own latency, `dnsperf -v`). Each target is measured
// in each round, rounds interleaved, so drift on this shared machine hits all three alike; the ratios are the result.
// The proxy is a release build (npm run build) of a local-mode daemon with the default two dataplane threads.
import { spawn, spawnSync } from 'node:child_process';
import { DAEMON_NODE_FLAGS } from './daemon-flags.mjs';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const UPSTREAM = '127.50.53.1';
const CLIENT_IP = '127.50.53.10';
const ADMIN = '127.50.53.250';
const ROUNDS = Number(process.env.DNS_BENCH_ROUNDS ?? 3);
const SECONDS = Number(process.env.DNS_BENCH_SECONDS ?? 5);

for (const tool of ['dnsperf', 'dnsmasq']) {
  if (spawnSync('sh', ['-c', `command -v ${tool}`]).status !== 0) {
    console.error(`bench:dns needs ${tool} (Debian: apt-get install dnsperf dnsmasq-base)`);
    process.exit(2);
  }
}
if (process.getuid?.() !== 0) {
  console.error('bench:dns needs root (the upstream resolver listens on port 53)');
  process.exit(2);
}

const dir = mkdtempSync(join(tmpdir(), 'ztn-bench-dns-'));
const children = [];
const cleanup = () => {
  for (const c of children) c.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
};
process.on('exit', cleanup);

const dnsmasq = spawn('dnsmasq', [
  '--keep-in-foreground', '--no-resolv', '--no-hosts', '--no-poll', '--bind-interfaces', `--listen-address=${UPSTREAM}`,
  '--port=53', '--address=/forwarded.bench/192.0.2.7', '--cache-size=10000', '--user=root', `--pid-file=${join(dir, 'dnsmasq.pid')}`,
], { stdio: 'ignore' });
children.push(dnsmasq);

writeFileSync(join(dir, 'resolv.conf'), `nameserver ${UPSTREAM}\n`);
writeFileSync(
  join(dir, 'mesh.yaml'),
  `workloads:
- {uid: client, name: client, namespace: default, serviceAccount: client, workloadIps: ["${CLIENT_IP}"], protocol: HBONE, node: node-a, canonicalName: client}
- {uid: echo, name: echo, namespace: default, workloadIps: ["127.50.53.20"], protocol: HBONE, node: node-b, services: {"default/echo.default.svc.cluster.local": {80: 8080}}}
services:
- {name: echo, namespace: default, hostname: echo.default.svc.cluster.local, vips: ["/127.50.53.100"], ports: {80: 8080}}
`,
);
const daemon = spawn(process.execPath, [...DAEMON_NODE_FLAGS, join(root, 'bin', 'ztunnel-node.js'), 'proxy'], {
  env: {
    PATH: process.env.PATH, PROXY_MODE: 'local', NODE_NAME: 'node-a', LOCAL_XDS_PATH: join(dir, 'mesh.yaml'), HANDOVER_ENABLED: 'false',
    LOCAL_CA_DIR: join(dir, 'ca'), DNS_RESOLV_CONF: join(dir, 'resolv.conf'), ADMIN_ADDR: `${ADMIN}:15000`,
    STATS_ADDR: `${ADMIN}:15020`, READINESS_ADDR: `${ADMIN}:15021`, RUST_LOG: 'warn',
  },
  stdio: 'ignore',
});
children.push(daemon);

const deadline = Date.now() + 30_000;
for (;;) {
  const ok = await fetch(`http://${ADMIN}:15021/healthz/ready`).then((r) => r.status === 200, () => false);
  if (ok) break;
  if (Date.now() > deadline) throw new Error('the daemon did not become ready');
  await new Promise((r) => setTimeout(r, 200));
}

const TARGETS = {
  local: { server: CLIENT_IP, port: 15053, query: 'echo.default.svc.cluster.local A' },
  forwarded: { server: CLIENT_IP, port: 15053, query: 'forwarded.bench A' },
  upstream: { server: UPSTREAM, port: 53, query: 'forwarded.bench A' },
};

function dnsperf(t, extra) {
  const file = join(dir, 'queries.txt');
  writeFileSync(file, `${t.query}\n`);
  const r = spawnSync('dnsperf', ['-s', t.server, '-p', String(t.port), '-d', file, '-l', String(SECONDS), '-c', '4', ...extra], {
    encoding: 'utf8',
    maxBuffer: 512 * 1024 * 1024,
  });
  if (r.status !== 0) throw new Error(`dnsperf failed: ${r.stderr}`);
  const qps = Number(/Queries per second:\s+([\d.]+)/.exec(r.stdout)?.[1]);
  const lost = Number(/Queries lost:\s+(\d+)/.exec(r.stdout)?.[1]);
  const codes = /Response codes:\s+(.*)/.exec(r.stdout)?.[1] ?? '';
  const lat = [];
  for (const m of r.stdout.matchAll(/^> \S+ \S+ \S+ ([\d.]+)$/gm)) lat.push(Number(m[1]) * 1e6);
  lat.sort((a, b) => a - b);
  const pct = (p) => (lat.length ? lat[Math.min(lat.length - 1, Math.floor((p / 100) * lat.length))] : NaN);
  return { qps, lost, codes, p50us: pct(50), p99us: pct(99) };
}

const rounds = [];
for (let i = 0; i < ROUNDS; i++) {
  const round = {};
  for (const [name, t] of Object.entries(TARGETS)) {
    const throughput = dnsperf(t, ['-q', '64']);
    const latency = dnsperf(t, ['-q', '10', '-Q', '2000', '-v']);
    round[name] = { qps: Math.round(throughput.qps), lost: throughput.lost, codes: throughput.codes, p50us: Math.round(latency.p50us), p99us: Math.round(latency.p99us) };
  }
  rounds.push(round);
  console.error(`round ${i + 1}: ${JSON.stringify(round)}`);
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const summary = {};
for (const name of Object.keys(TARGETS)) {
  summary[name] = {
    qps: median(rounds.map((r) => r[name].qps)),
    p50us: median(rounds.map((r) => r[name].p50us)),
    p99us: median(rounds.map((r) => r[name].p99us)),
  };
}
const ratio = (a, b) => Number((a / b).toFixed(2));
const result = {
  rounds: ROUNDS,
  secondsPerRun: SECONDS,
  summary,
  ratios: {
    localQpsVsUpstream: ratio(summary.local.qps, summary.upstream.qps),
    forwardedQpsVsUpstream: ratio(summary.forwarded.qps, summary.upstream.qps),
    localP99VsUpstream: ratio(summary.local.p99us, summary.upstream.p99us),
    forwardedP99VsUpstream: ratio(summary.forwarded.p99us, summary.upstream.p99us),
  },
  raw: rounds,
};
writeFileSync(join(root, 'bench', 'results', 'dns.json'), JSON.stringify(result, null, 2) + '\n');
console.log(JSON.stringify({ summary, ratios: result.ratios }, null, 2));
process.exit(0);
