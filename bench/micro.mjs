#!/usr/bin/env node
// `npm run bench:micro`: benchmark.js micro-benchmarks of the control side's hot pure functions and of the native
// boundary (one napi call each way). Run after `npm run build` (release native module). The routing decision and
// the authorization evaluator are Rust: their per-call costs come from the Rust examples (`cargo run --release
// --example route_bench` / `rbac_bench`), printed at the end.
import Benchmark from 'benchmark';
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { nativeVersion } from '../dist/native/index.js';
import { emptyMatch, openBenchDataplane } from './common.mjs';
import { compilePolicy } from '../dist/policy/compile.js';
import { StateStore } from '../dist/state/store.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const WORKLOADS = 10_000;

const workload = (i, ip = `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`) => ({
  uid: `Kubernetes//Pod/ns-${i % 100}/w-${i}`, name: `w-${i}`, namespace: `ns-${i % 100}`, serviceAccount: `sa-${i % 50}`,
  trustDomain: 'cluster.local', workloadIps: [ip], network: '', protocol: 'HBONE', node: `node-${i % 10}`, status: 'Healthy',
  capacity: 1, canonicalName: `w-${i}`, canonicalRevision: 'v1', workloadName: `w-${i}`, workloadType: 'deployment',
  clusterId: 'Kubernetes', locality: { region: '', zone: '', subzone: '' }, services: {}, authorizationPolicies: [], hostname: '',
  networkMode: 'Standard', waypoint: null, networkGateway: null, applicationTunnel: null, nativeTunnel: false,
});
const policy = {
  name: 'p', namespace: 'ns-1', scope: 'Namespace', action: 'Allow', dryRun: false,
  rules: Array.from({ length: 10 }, (_, r) => [[{ ...emptyMatch(), principals: [{ Exact: `spiffe://cluster.local/ns/c/sa/s${r}` }], sourceIps: ['10.0.0.0/8'], destinationPorts: [8000 + r] }]]),
};

const dp = openBenchDataplane();
const store = new StateStore(null);
store.apply({ workloads: Array.from({ length: WORKLOADS }, (_, i) => workload(i)), policies: [policy] }, (d) => dp.applyState(d));
let flip = 0;

const suite = new Benchmark.Suite('ztunnel-node micro');
suite
  .add('napi, Rust → JS: nativeVersion() (one sync call returning a small JSON string)', () => nativeVersion())
  .add('napi, Rust → JS: metrics() snapshot (empty buckets)', () => dp.metrics())
  .add('napi, JS → Rust: applyState(one workload upsert)', () => {
    flip ^= 1;
    dp.applyState({ workloads: [{ ...workload(7), capacity: 1 + flip }] });
  })
  .add(`state update: store.apply(one workload change) at ${WORKLOADS} workloads, through napi`, () => {
    flip ^= 1;
    store.apply({ workloads: [{ ...workload(9), capacity: 1 + flip }] }, (d) => dp.applyState(d));
  })
  .add('authorization compile: compilePolicy(10 rules)', () => compilePolicy(policy))
  .add('authorization explain through napi: authorize({srcIdentity, srcIp, dst})', () =>
    dp.authorize({ srcIdentity: 'spiffe://cluster.local/ns/c/sa/s3', srcIp: '10.0.0.9', dst: '10.0.0.1:8003' }))
  .on('cycle', (e) => {
    const b = e.target;
    console.log(`${(1e9 / b.hz).toFixed(0).padStart(9)} ns/op  ±${b.stats.rme.toFixed(1)}%  ${b.name}`);
  })
  .on('complete', async () => {
    await dp.drain(100);
    dp.shutdown();
    for (const ex of ['route_bench', 'rbac_bench']) {
      const r = spawnSync('cargo', ['run', '--release', '-q', '-p', 'ztunnel-dataplane', '--example', ex], { cwd: root, encoding: 'utf8' });
      console.log(`${ex}: ${r.status === 0 ? r.stdout.trim() : r.stderr.trim()}`);
    }
  })
  .run();
