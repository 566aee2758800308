#!/usr/bin/env node
// `npm run bench:captured` (root): pod → pod across two node namespaces, direct vs captured by ztunnel-node in
// in-pod mode, interleaved rounds, as ratios. The cluster is the namespace suite's (test/helpers/netns.js):
//   direct:   pod ua (node a, uncaptured) ──────────────────────────────▶ pod ub (node b, uncaptured)
//   captured: pod a1 (node a, istio-cni rules) ─15001─▶ HBONE (mTLS) ─15008─▶ pod b1 (node b, istio-cni rules)
// The load client and server are bench/loadgen (Rust), run inside the pods; the daemons run in the node namespaces
// with 2 worker threads each.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Cluster, isRoot } from '../test/helpers/netns.js';
import { startCni } from '../test/helpers/fake-cni.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
if (!isRoot()) {
  console.error('bench:captured needs root (network namespaces, iptables); skipped');
  process.exit(0);
}
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const BYTES = Number(process.env.BENCH_BYTES ?? 512 * 1024 ** 2);
const LAT_COUNT = Number(process.env.BENCH_LATENCY_COUNT ?? 2000);
const loadgen = join(root, 'target', 'release', 'ztn-loadgen');

if (spawnSync('cargo', ['build', '--release', '-q', '-p', 'ztunnel-loadgen'], { cwd: root, stdio: 'inherit' }).status !== 0) process.exit(1);

const cluster = new Cluster('ztb', 77);
const tmp = mkdtempSync(join(tmpdir(), 'ztn-bench-captured-'));
const children = [];
const cleanup = () => {
  for (const c of children) c.kill('SIGKILL');
  cluster.destroy();
  rmSync(tmp, { recursive: true, force: true });
};
process.on('exit', cleanup);
process.on('SIGINT', () => process.exit(130));

function run(ns, args) {
  const r = spawnSync('ip', ['netns', 'exec', ns, loadgen, ...args], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`loadgen ${args.join(' ')} in ${ns}: ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop());
}

async function main() {
  cluster.build();
  const p = {
    a1: cluster.addPod('a', 'a1'),
    b1: cluster.addPod('b', 'b1'),
    ua: cluster.addPod('a', 'ua'),
    ub: cluster.addPod('b', 'ub'),
  };
  cluster.capture(p.a1);
  cluster.capture(p.b1);
  const cfg = join(tmp, 'mesh.yaml');
  writeFileSync(cfg, 'workloads:\n' + ['a1', 'b1'].map((n) => `- {uid: bench/${n}, name: ${n}, namespace: default, serviceAccount: ${n}, workloadIps: ["${p[n].ip}"], protocol: HBONE, node: node-${p[n].node}}\n`).join(''));
  const cni = { a: startCni(join(tmp, 'a.sock'), children), b: startCni(join(tmp, 'b.sock'), children) };
  for (const node of ['a', 'b']) {
    const env = {
      PATH: process.env.PATH, PROXY_MODE: 'shared', NODE_NAME: `node-${node}`, LOCAL_XDS_PATH: cfg, LOCAL_CA_DIR: join(tmp, 'ca'),
      XDS_ADDRESS: '', CA_ADDRESS: '', INPOD_UDS: join(tmp, `${node}.sock`), RUST_LOG: 'warn', ZTUNNEL_WORKER_THREADS: '2',
    };
    children.push(cluster.spawn(cluster.nodeNs(node), process.execPath, [join(root, 'bin', 'ztunnel-node.js'), 'proxy'], { env, stdio: ['ignore', 'ignore', 'inherit'] }));
  }
  for (const [node, pod] of [['a', p.a1], ['b', p.b1]]) {
    await cni[node].next((e) => e.event === 'connected', `node-${node} connected`, 30_000);
    const ack = await cni[node].send({ op: 'add', uid: `uid-${pod.name}`, netns: pod.netnsPath, name: pod.name, namespace: 'default', serviceAccount: pod.name });
    if (ack.error) throw new Error(`add ${pod.name}: ${ack.error}`);
    await cni[node].send({ op: 'snapshot' });
  }
  for (const pod of [p.b1, p.ub]) {
    const srv = spawn('ip', ['netns', 'exec', pod.ns, loadgen, 'serve', '--listen', '0.0.0.0:9000'], { stdio: ['ignore', 'pipe', 'inherit'] });
    children.push(srv);
    await new Promise((resolve) => srv.stdout.once('data', resolve));
  }
  // Warm the tunnel.
  run(p.a1.ns, ['latency', '--target', `${p.b1.ip}:9000`, '--count', '200']);
  const paths = { direct: [p.ua.ns, `${p.ub.ip}:9000`], captured: [p.a1.ns, `${p.b1.ip}:9000`] };
  const s = { direct: { gbps: [], p50: [], p99: [] }, captured: { gbps: [], p50: [], p99: [] } };
  for (let r = 0; r < ROUNDS; r++) {
    for (const [name, [ns, target]] of Object.entries(paths)) s[name].gbps.push(run(ns, ['throughput', '--target', target, '--bytes', String(BYTES)]).gbps);
    for (const [name, [ns, target]] of Object.entries(paths)) {
      const l = run(ns, ['latency', '--target', target, '--size', '1024', '--count', String(LAT_COUNT)]);
      s[name].p50.push(l.p50_us);
      s[name].p99.push(l.p99_us);
    }
    process.stderr.write(`round ${r + 1}/${ROUNDS}\n`);
  }
  const median = (xs) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
  const rows = [
    ['throughput, 1 stream (Gbit/s)', median(s.direct.gbps), median(s.captured.gbps)],
    ['1 KiB req/resp p50 (µs)', median(s.direct.p50), median(s.captured.p50)],
    ['1 KiB req/resp p99 (µs)', median(s.direct.p99), median(s.captured.p99)],
  ];
  console.log(`\npod → pod across two node namespaces, ${ROUNDS} interleaved rounds, ${cpus().length} cores\n`);
  console.log('| measurement | direct | captured (HBONE) | captured / direct |\n|---|---|---|---|');
  for (const [n, d, c] of rows) console.log(`| ${n} | ${d.toFixed(1)} | ${c.toFixed(1)} | ${(c / d).toFixed(2)} |`);
  writeFileSync(join(root, 'bench', 'results', 'captured.json'), JSON.stringify({ when: new Date().toISOString(), rounds: ROUNDS, bytes: BYTES, samples: s }, null, 2) + '\n');
}

main().then(() => process.exit(0), (err) => {
  console.error(err.message);
  process.exit(1);
});
