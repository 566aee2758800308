#!/usr/bin/env node
// `npm run bench:xds`: one ztunnel-node daemon (PROXY_MODE=local, workloads only from xDS) against the fake istiod
// (test/helpers/fake-istiod.ts, a real gRPC server over TLS in this process).
//
//   first push: N workloads, N/10 services (each workload an endpoint of one), N/100 policies
//   then:       UPDATES single-workload updates (one workload changes IP), one at a time
//
// The same daemon also starts from a local config file of the same scale (LOCAL_XDS_PATH, test/helpers/large-config.ts:
// N workloads, N/10 services, N/100 policies), for the local path's time to ready and its RSS. BENCH_XDS_SOURCES
// (default xds,local) picks the two.
//
// Reports, for each scale (SCALES, default 1000 and 100000): time from the daemon's start to /healthz/ready 200,
// the first push's size, the daemon's peak RSS (VmHWM) and its RSS after the load and the updates (VmRSS), and the p50/p99 latency of one update: measured inside
// the daemon from "response decoded" to "delta returned by the native dataplane" (the `applyMs` of its debug log),
// and from this process, push -> ACK. Ratios compare the largest scale with the smallest (an O(change) update
// path keeps the ratio near 1). Writes bench/results/xds-scale.json. Needs the native module (dist/native).
// The daemon runs with bench/daemon-flags.mjs's flags; DAEMON_NODE_ARGS adds Node flags (e.g. `--cpu-prof --cpu-prof-dir=/tmp/prof` to see where its
// main thread spends the first push). Measures; asserts nothing.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { ADDRESS, AUTHORIZATION, ISTIOD_HOSTNAME, policyResource, prepareResponse, serviceResource, startFakeIstiod, workloadResource } from '../dist-test/helpers/fake-istiod.js';
import { writeLargeConfig } from '../dist-test/helpers/large-config.js';
import { DAEMON_NODE_FLAGS } from './daemon-flags.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const SCALES = (process.env.BENCH_XDS_SCALES ?? '1000,100000').split(',').map(Number);
const UPDATES = Number(process.env.BENCH_XDS_UPDATES ?? 300);
const ADMIN_IP = '127.50.255.9';

const tmp = mkdtempSync(join(tmpdir(), 'ztn-bench-xds-'));
const children = new Set();
process.on('exit', () => {
  for (const c of children) c.kill('SIGKILL');
  rmSync(tmp, { recursive: true, force: true });
});

/** 10.a.b.c for workload i; VIPs in 11.x; nothing binds or dials these: they only exist in the state. */
const ip = (i, base = 10) => `${base}.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;

function firstPush(n) {
  const services = Math.max(1, Math.floor(n / 10));
  const policies = Math.max(1, Math.floor(n / 100));
  const svc = [];
  for (let s = 0; s < services; s++) svc.push(serviceResource({ name: `svc${s}`, vip: ip(s, 11), ports: { 80: 8080 } }));
  const wl = [];
  for (let i = 0; i < n; i++) {
    wl.push(workload(i, 'v1', ip(i)));
  }
  const pol = [];
  for (let p = 0; p < policies; p++) {
    pol.push(policyResource({ name: `p${p}`, ns: `ns${p % 50}`, rules: [{ clauses: [{ matches: [{ destinationPorts: [8080 + (p % 10)] }] }] }] }));
  }
  return { address: [...wl, ...svc], authz: pol, services, policies };
}

function workload(i, version, address) {
  return workloadResource({
    name: `w${i}`,
    ns: 'default',
    sa: `sa${i % 200}`,
    ip: address,
    node: `node-${i % 500}`,
    version,
    services: { [`default/svc${i % Math.max(1, Math.floor(SCALE_N / 10))}.default.svc.cluster.local`]: { 80: 8080 } },
  });
}

let SCALE_N = 0;

function quantile(sorted, q) {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

async function run(n) {
  SCALE_N = n;
  const istiod = await startFakeIstiod({ dir: mkdtempSync(join(tmp, `istiod-${n}-`)) });
  const t0 = performance.now();
  const push = firstPush(n);
  // Encoded before the daemon starts: what is timed is the daemon's work and the transfer, not this process's encoder.
  const addressResponse = prepareResponse(ADDRESS, { resources: push.address });
  const authzResponse = prepareResponse(AUTHORIZATION, { resources: push.authz });
  const buildMs = performance.now() - t0;

  const env = {
    PATH: process.env.PATH,
    PROXY_MODE: 'local',
    NODE_NAME: 'bench-node',
    HANDOVER_ENABLED: 'false',
    XDS_ADDRESS: istiod.address,
    XDS_ROOT_CA: istiod.rootCaPath,
    ALT_XDS_HOSTNAME: ISTIOD_HOSTNAME,
    CA_ADDRESS: istiod.address,
    CA_ROOT_CA: istiod.rootCaPath,
    ALT_CA_HOSTNAME: ISTIOD_HOSTNAME,
    ADMIN_ADDR: `${ADMIN_IP}:15000`,
    STATS_ADDR: `${ADMIN_IP}:15020`,
    READINESS_ADDR: `${ADMIN_IP}:15021`,
    LOG_FORMAT: 'json',
    RUST_LOG: 'warn,xds=debug',
    CONNECTION_TERMINATION_DEADLINE: '1s',
  };
  const started = performance.now();
  const child = spawn(process.execPath, [...DAEMON_NODE_FLAGS, join(root, 'bin', 'ztunnel-node.js'), 'proxy'], { env, stdio: ['ignore', 'pipe', 'inherit'] });
  children.add(child);
  const applied = [];
  createInterface({ input: child.stdout }).on('line', (line) => {
    if (!line.includes('XDS response applied')) return;
    try {
      applied.push(JSON.parse(line));
    } catch {
      // not JSON
    }
  });

  const stream = await istiod.nextStream(60_000);
  await stream.nextRequest(ADDRESS, 60_000);
  await stream.nextRequest(AUTHORIZATION, 60_000);
  const pushAt = performance.now();
  await stream.pushPreparedAndWait(addressResponse, 300_000);
  const firstAckMs = performance.now() - pushAt;
  await stream.pushPreparedAndWait(authzResponse, 60_000);
  for (;;) {
    const ok = await fetch(`http://${ADMIN_IP}:15021/healthz/ready`).then((r) => r.status === 200, () => false);
    if (ok) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  const readyMs = performance.now() - started;
  const first = applied.find((a) => a.typeUrl === ADDRESS);

  // Single updates: one workload moves to another IP; wait for its ACK before the next.
  const roundTrips = [];
  const before = applied.length;
  for (let u = 0; u < UPDATES; u++) {
    const i = (u * 7919) % n;
    const at = performance.now();
    const ack = await stream.pushAndWait(ADDRESS, { resources: [workload(i, `v${u + 2}`, ip(i, 12))] });
    roundTrips.push(performance.now() - at);
    if (ack.errorDetail) throw new Error(`update NACKed: ${ack.errorDetail.message}`);
  }
  // Settled, as the local part reads it (2 s after ready): the daemon collects a large push's garbage and returns the
  // free heap within about a quarter of a second after the response that follows it (ts/heap.ts).
  await new Promise((r) => setTimeout(r, 2000));
  const applyMs = applied.slice(before).filter((a) => a.typeUrl === ADDRESS).map((a) => a.applyMs).sort((x, y) => x - y);
  const rtt = roundTrips.sort((x, y) => x - y);
  const status = readFileSync(`/proc/${child.pid}/status`, 'utf8');
  const peakRssMiB = Number(/VmHWM:\s+(\d+) kB/.exec(status)?.[1] ?? 0) / 1024;
  // After the load and the updates (the "RSS after the load"): what the daemon keeps, not its transient peak.
  const rssAfterMiB = Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? 0) / 1024;
  const heap = await jsHeapOf();
  child.kill('SIGTERM');
  await new Promise((r) => child.once('close', r));
  children.delete(child);
  await istiod.close();

  return {
    workloads: n,
    services: push.services,
    policies: push.policies,
    buildFirstPushMs: Math.round(buildMs),
    firstPushBytes: first?.bytes ?? null,
    firstPushDecodeMs: first?.decodeMs ?? null,
    firstPushApplyMs: first?.applyMs ?? null,
    firstPushAckMs: Math.round(firstAckMs),
    timeToReadyMs: Math.round(readyMs),
    peakRssMiB: Math.round(peakRssMiB),
    rssAfterMiB: Math.round(rssAfterMiB),
    ...heap,
    updates: applyMs.length,
    updateApplyMs: { p50: quantile(applyMs, 0.5), p99: quantile(applyMs, 0.99), max: applyMs.at(-1) },
    updateRoundTripMs: { p50: round(quantile(rtt, 0.5)), p99: round(quantile(rtt, 0.99)) },
  };
}

const round = (x) => Math.round(x * 1000) / 1000;

/**
 * The share of the daemon's RSS that is its main thread's JavaScript heap (V8's committed heap, MiB) and the memory
 * outside it that JS objects hold (Buffers), from its Prometheus endpoint: the rest is the native dataplane, Node's
 * own code and the allocator.
 */
async function jsHeapOf() {
  const text = await fetch(`http://${ADMIN_IP}:15020/metrics`).then((r) => r.text(), () => '');
  const metric = (name) => Math.round(Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1] ?? NaN) / 2 ** 20);
  return { jsHeapMiB: metric('nodejs_heap_size_total_bytes'), jsExternalMiB: metric('nodejs_external_memory_bytes') };
}

/** VmHWM (peak) and VmRSS of a process, in MiB. */
function rssOf(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const mib = (key) => Math.round(Number(new RegExp(`${key}:\\s+(\\d+) kB`).exec(status)?.[1] ?? 0) / 1024);
  return { peakRssMiB: mib('VmHWM'), rssMiB: mib('VmRSS') };
}

/** The daemon started from a local config file of `n` workloads: time to ready, peak RSS, RSS 2 s after ready. */
async function runLocal(n) {
  const path = join(tmp, `local-${n}.yaml`);
  const bytes = writeLargeConfig(path, { workloads: n });
  const env = {
    PATH: process.env.PATH,
    PROXY_MODE: 'local',
    NODE_NAME: 'bench-node',
    HANDOVER_ENABLED: 'false',
    LOCAL_XDS_PATH: path,
    LOCAL_CA_DIR: mkdtempSync(join(tmp, 'ca-')),
    ADMIN_ADDR: `${ADMIN_IP}:15000`,
    STATS_ADDR: `${ADMIN_IP}:15020`,
    READINESS_ADDR: `${ADMIN_IP}:15021`,
    LOG_FORMAT: 'json',
    RUST_LOG: 'warn',
    CONNECTION_TERMINATION_DEADLINE: '1s',
  };
  const started = performance.now();
  const child = spawn(process.execPath, [...DAEMON_NODE_FLAGS, join(root, 'bin', 'ztunnel-node.js'), 'proxy'], { env, stdio: ['ignore', 'ignore', 'inherit'] });
  children.add(child);
  for (;;) {
    const ok = await fetch(`http://${ADMIN_IP}:15021/healthz/ready`).then((r) => r.status === 200, () => false);
    if (ok) break;
    if (child.exitCode !== null) throw new Error(`the daemon exited (${child.exitCode})`);
    await new Promise((r) => setTimeout(r, 20));
  }
  const readyMs = performance.now() - started;
  await new Promise((r) => setTimeout(r, 2000));
  const rss = rssOf(child.pid);
  const heap = await jsHeapOf();
  child.kill('SIGTERM');
  await new Promise((r) => child.once('close', r));
  children.delete(child);
  return { workloads: n, fileMiB: round(bytes / 2 ** 20), timeToReadyMs: Math.round(readyMs), peakRssMiB: rss.peakRssMiB, rssAfterMiB: rss.rssMiB, ...heap };
}

const SOURCES = (process.env.BENCH_XDS_SOURCES ?? 'xds,local').split(',');
const results = [];
for (const n of SOURCES.includes('xds') ? SCALES : []) {
  const r = await run(n);
  results.push(r);
  console.log(JSON.stringify(r));
}
const local = [];
if (SOURCES.includes('local')) {
  for (const n of SCALES) {
    const r = await runLocal(n);
    local.push(r);
    console.log(JSON.stringify({ source: 'local file', ...r }));
  }
}
const small = results[0] ?? null;
const large = results.at(-1) ?? null;
const ratios = small === null || large === null ? null : {
  scale: large.workloads / small.workloads,
  timeToReady: round(large.timeToReadyMs / small.timeToReadyMs),
  updateApplyP50: round(large.updateApplyMs.p50 / small.updateApplyMs.p50),
  updateApplyP99: round(large.updateApplyMs.p99 / small.updateApplyMs.p99),
  updateRoundTripP50: round(large.updateRoundTripMs.p50 / small.updateRoundTripMs.p50),
};
console.log(`\n${'workloads'.padStart(10)} ${'ready ms'.padStart(9)} ${'push MB'.padStart(8)} ${'peak MiB'.padStart(8)} ${'after MiB'.padStart(9)} ${'upd p50 ms'.padStart(11)} ${'upd p99 ms'.padStart(11)} ${'rtt p50 ms'.padStart(11)}`);
for (const r of results) {
  console.log(
    `${String(r.workloads).padStart(10)} ${String(r.timeToReadyMs).padStart(9)} ${((r.firstPushBytes ?? 0) / 1e6).toFixed(1).padStart(8)} ${String(r.peakRssMiB).padStart(8)} ${String(r.rssAfterMiB).padStart(9)} ${String(r.updateApplyMs.p50).padStart(11)} ${String(r.updateApplyMs.p99).padStart(11)} ${String(r.updateRoundTripMs.p50).padStart(11)}`,
  );
}
if (ratios !== null) console.log(`ratios ${large.workloads}/${small.workloads}: ${JSON.stringify(ratios)}`);
for (const r of local) {
  console.log(`local file ${String(r.workloads).padStart(7)}: ready ${r.timeToReadyMs} ms, peak ${r.peakRssMiB} MiB, after ${r.rssAfterMiB} MiB (${r.fileMiB} MiB file)`);
}
writeFileSync(join(root, 'bench', 'results', 'xds-scale.json'), `${JSON.stringify({ at: new Date().toISOString(), results, ratios, local }, null, 2)}\n`);
process.exit(0);
