#!/usr/bin/env node
// `npm run bench:authz`: authorization at scale (issue 4). 10,000 policies of 10 rules across 1,000 namespaces.
//   1. decision latency (p50, p99) of one inbound connection: the Rust evaluator (examples/rbac_bench.rs, release)
//   2. time to recompile and apply one changed policy: TS compile + the delta across napi + Rust validation, index
//      update and the re-evaluation of tracked connections (store.apply → Dataplane.applyState), p50/p99 of 200.
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { emptyMatch, openBenchDataplane } from './common.mjs';
import { StateStore } from '../dist/state/store.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const NAMESPACES = 1_000;
const POLICIES = 10_000;
const RULES = 10;

const r = spawnSync('cargo', ['run', '--release', '-q', '-p', 'ztunnel-dataplane', '--example', 'rbac_bench'], { cwd: root, encoding: 'utf8' });
if (r.status !== 0) throw new Error(`rbac_bench failed: ${r.stderr}`);
const decision = JSON.parse(r.stdout.trim().split('\n').pop());

function policy(i, port = 8000) {
  return {
    name: `p-${i}`,
    namespace: `ns-${i % NAMESPACES}`,
    scope: 'Namespace',
    action: i % 10 === 0 ? 'Deny' : 'Allow',
    dryRun: false,
    rules: Array.from({ length: RULES }, (_, r) => [
      [{ ...emptyMatch(), principals: [{ Exact: `cluster.local/ns/client-${r}/sa/sa-${i}` }], sourceIps: [`10.${r}.${i % 250}.0/24`], destinationPorts: [port + r] }],
    ]),
  };
}

const dp = openBenchDataplane();
const store = new StateStore(null);
const started = performance.now();
store.apply({ policies: Array.from({ length: POLICIES }, (_, i) => policy(i)) }, (d) => dp.applyState(d));
const loadMs = performance.now() - started;

const samples = [];
for (let n = 0; n < 200; n++) {
  const i = (n * 37) % POLICIES;
  const t = performance.now();
  store.apply({ policies: [policy(i, 9000 + (n % 50))] }, (d) => dp.applyState(d));
  samples.push(performance.now() - t);
}
samples.sort((x, y) => x - y);
const pct = (p) => samples[Math.min(samples.length - 1, Math.round((p / 100) * (samples.length - 1)))];
await dp.drain(100);
dp.shutdown();

const result = {
  policies: POLICIES, rulesPerPolicy: RULES, namespaces: NAMESPACES,
  decision: { allowedP50Ns: decision.allowedP50Ns, allowedP99Ns: decision.allowedP99Ns, deniedP50Ns: decision.deniedP50Ns, deniedP99Ns: decision.deniedP99Ns },
  bigPolicy: { rules: decision.bigPolicyRules, deniedP50Ns: decision.bigPolicyDeniedP50Ns, deniedP99Ns: decision.bigPolicyDeniedP99Ns },
  initialLoadMs: Math.round(loadMs),
  policyChangeMs: { p50: Number(pct(50).toFixed(3)), p99: Number(pct(99).toFixed(3)) },
};
console.log(JSON.stringify(result, null, 2));
console.log(`\ndecision: ${decision.allowedP50Ns} ns (allowed, p50) / ${decision.deniedP50Ns} ns (denied after every rule, p50); ` +
  `one policy change: ${result.policyChangeMs.p50} ms p50, ${result.policyChangeMs.p99} ms p99 (targets: < 1 µs, < 10 ms)`);
