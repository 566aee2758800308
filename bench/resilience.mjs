// Connect retry and outlier ejection (issue 28), measured: a service of three endpoints on node-b, one dead (its
// application's port closed: node-b answers 503), reached from sleep on node-a through its SOCKS5 entry, one
// connection at a time. Per round and for each daemon pair (resilience on, the default; and CONNECT_RESILIENCE=false,
// ztunnel's connect): the client-visible failures over N connections, and the connect latency (SOCKS5 request to
// the tunnel's success reply) after a warm-up that lets the dead endpoint be ejected, beside the same figure for a
// service of the two live endpoints only, measured by the same daemons in the same round. Rounds interleave the pairs.
//
//   node bench/resilience.mjs                       1,000 connections, 3 rounds
//   node bench/resilience.mjs --connections 300 --rounds 1
//   node bench/resilience.mjs --json bench/results/resilience.json   (npm run bench:resilience)
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { socks5Connect } from '../dist/cli/socks5-client.js';
import { localDaemons } from './local-daemons.mjs';

const IP = { sleep: '127.50.28.10', good1: '127.50.28.21', good2: '127.50.28.22', dead: '127.50.28.23' };
const VIP = { withDead: '127.50.28.100', live: '127.50.28.101' };
const admin = (k) => `127.50.28.${200 + k}`;

const { values: opts } = parseArgs({
  options: {
    connections: { type: 'string', default: '1000' },
    warmup: { type: 'string', default: '100' },
    rounds: { type: 'string', default: '3' },
    json: { type: 'string' },
  },
});
const N = Number(opts.connections);
const WARMUP = Number(opts.warmup);

const tmp = mkdtempSync(join(tmpdir(), 'ztn-resilience-bench-'));
process.on('exit', () => rmSync(tmp, { recursive: true, force: true }));

const member = (svc) => ({ [`default/${svc}.default.svc.cluster.local`]: { 80: 8080 } });
const workload = (name, ip, node, services = {}) => ({
  uid: `Kubernetes//Pod/default/${name}`, name, namespace: 'default', serviceAccount: name, workloadIps: [ip],
  protocol: 'HBONE', node, canonicalName: name, canonicalRevision: 'v1', workloadName: name, workloadType: 'deployment',
  clusterId: 'Kubernetes', services,
});
const config = join(tmp, 'mesh.json');
writeFileSync(config, JSON.stringify({
  workloads: [
    workload('sleep', IP.sleep, 'node-a'),
    workload('good1', IP.good1, 'node-b', { ...member('echo'), ...member('live') }),
    workload('good2', IP.good2, 'node-b', { ...member('echo'), ...member('live') }),
    workload('dead', IP.dead, 'node-b', member('echo')),
  ],
  services: [
    { name: 'echo', namespace: 'default', hostname: 'echo.default.svc.cluster.local', vips: [`/${VIP.withDead}`], ports: { 80: 8080 } },
    { name: 'live', namespace: 'default', hostname: 'live.default.svc.cluster.local', vips: [`/${VIP.live}`], ports: { 80: 8080 } },
  ],
}));

const daemons = localDaemons({ tmp, config, adminIp: admin });

/** One connection: its connect time in ms, or null when it failed. */
async function once(vip) {
  const started = process.hrtime.bigint();
  try {
    const s = await socks5Connect({ proxyHost: IP.sleep, proxyPort: 15080, destHost: vip, destPort: 80, timeoutMs: 15_000 });
    const ms = Number(process.hrtime.bigint() - started) / 1e6;
    await new Promise((resolve, reject) => {
      s.once('data', resolve);
      s.once('error', reject);
      s.once('close', () => reject(new Error('closed before the echo')));
      s.resume(); // socks5Connect hands the socket over paused
      s.write('ping');
    });
    s.destroy();
    return ms;
  } catch {
    return null;
  }
}

function percentile(sorted, p) {
  return sorted.length === 0 ? null : sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function measure(vip, n) {
  const times = [];
  let failed = 0;
  for (let i = 0; i < n; i++) {
    const ms = await once(vip);
    if (ms === null) failed++;
    else times.push(ms);
  }
  times.sort((a, b) => a - b);
  return { failed, p50: percentile(times, 50), p99: percentile(times, 99) };
}

const echo = [IP.good1, IP.good2].map((ip) => {
  const server = createServer((s) => {
    s.on('error', () => undefined);
    s.pipe(s);
  });
  server.listen(8080, ip);
  return server;
});

const rounds = [];
for (let r = 0; r < Number(opts.rounds); r++) {
  for (const [mode, extra] of [['on', {}], ['off', { CONNECT_RESILIENCE: 'false' }]]) {
    const a = await daemons.start('node-a', 1, extra);
    const b = await daemons.start('node-b', 2, extra);
    process.stderr.write(`round ${r + 1}, resilience ${mode}: daemons ready\n`);
    await measure(VIP.withDead, WARMUP); // the dead endpoint is ejected here (resilience on)
    const withDead = await measure(VIP.withDead, N);
    const live = await measure(VIP.live, N);
    rounds.push({ round: r + 1, mode, withDead, live });
    console.log(JSON.stringify(rounds.at(-1)));
    await a.stop();
    await b.stop();
  }
}
for (const s of echo) s.close();

const median = (xs) => {
  const v = xs.filter((x) => x !== null).sort((a, b) => a - b);
  return v.length === 0 ? null : v[Math.floor(v.length / 2)];
};
const of = (mode) => rounds.filter((x) => x.mode === mode);
const summary = Object.fromEntries(
  ['on', 'off'].map((mode) => {
    const rs = of(mode);
    return [mode, {
      failedPerConnection: median(rs.map((x) => x.withDead.failed / N)),
      p50WithDeadMs: median(rs.map((x) => x.withDead.p50)),
      p99WithDeadMs: median(rs.map((x) => x.withDead.p99)),
      p50LiveOnlyMs: median(rs.map((x) => x.live.p50)),
      p99LiveOnlyMs: median(rs.map((x) => x.live.p99)),
      addedP99Ms: median(rs.map((x) => (x.withDead.p99 ?? 0) - (x.live.p99 ?? 0))),
    }];
  }),
);
console.log(JSON.stringify({ connections: N, warmup: WARMUP, rounds: Number(opts.rounds), summary }, null, 2));
if (opts.json) writeFileSync(opts.json, `${JSON.stringify({ date: new Date().toISOString(), connections: N, warmup: WARMUP, rounds, summary }, null, 2)}\n`);
process.exit(0);
