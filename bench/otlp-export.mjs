// Access-log export over OTLP (issue 28), measured: what does exporting every connection's records cost? Per round and
// for each daemon pair (export off, the default; export on, OTLP/gRPC to a real OpenTelemetry Collector built from
// its Go modules, test/helpers/otelcol), both with access logs at RUST_LOG=info (ztunnel's default, so "off" writes
// the same records to stdout that "on" also exports), between sleep on node-a and echo on node-b over HBONE:
//   1. a storm of short connections alone (--storms clients, --connections each): connections per second, from the
//      daemons' own istio_tcp_connections_opened_total, and the two daemons' CPU time per connection;
//   2. one bulk stream of --bytes through the tunnel, quiet;
//   3. the same bulk stream while the storm clients open connections back to back for as long as it runs.
// Each connection makes two records (source on node-a, destination on node-b). The collector runs in both modes (idle
// when export is off) with the debug exporter at `basic` verbosity, a cheap sink; it still shares the machine's two
// cores, which counts against the "on" figures. Rounds interleave the modes.
//
//   node bench/otlp-export.mjs                         1 GiB, 4 storm clients x 2,000 connections, 3 rounds
//   node bench/otlp-export.mjs --bytes 268435456 --rounds 1
//   node bench/otlp-export.mjs --json bench/results/otlp-export.json   (npm run bench:otlp, with --connections 1500)
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { sumSamples } from '../dist/cli/prom-text.js';
import { startCollector } from '../dist-test/helpers/otelcol.js';
import { children, localDaemons } from './local-daemons.mjs';
import { totalCpu } from './harness/proc.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const repo = join(here, '..');
const IP = { sleep: '127.50.29.10', echo: '127.50.29.20', collector: '127.50.29.30' };
const admin = (k) => `127.50.29.${200 + k}`;

const { values: opts } = parseArgs({
  options: {
    bytes: { type: 'string', default: String(1 << 30) },
    storms: { type: 'string', default: '4' },
    connections: { type: 'string', default: '2000' },
    rounds: { type: 'string', default: '3' },
    'rust-log': { type: 'string', default: 'info' },
    modes: { type: 'string', default: 'off,on' },
    json: { type: 'string' },
  },
});

const tmp = mkdtempSync(join(tmpdir(), 'ztn-otlp-bench-'));
process.on('exit', () => rmSync(tmp, { recursive: true, force: true }));

const built = spawnSync('cargo', ['build', '--release', '-q', '-p', 'ztunnel-loadgen'], { cwd: repo, stdio: 'inherit' });
if (built.status !== 0) throw new Error('building the load client failed');
const loadgen = join(repo, 'target', 'release', 'ztn-loadgen');

const workload = (name, ip, node) => ({
  uid: `Kubernetes//Pod/default/${name}`, name, namespace: 'default', serviceAccount: name, workloadIps: [ip],
  protocol: 'HBONE', node, canonicalName: name, canonicalRevision: 'v1', workloadName: name, workloadType: 'deployment',
  clusterId: 'Kubernetes',
});
const config = join(tmp, 'mesh.json');
writeFileSync(config, JSON.stringify({ workloads: [workload('sleep', IP.sleep, 'node-a'), workload('echo', IP.echo, 'node-b')] }));

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function run(argv, { keep = false } = {}) {
  const child = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'inherit'] });
  children.add(child);
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  const done = new Promise((resolve) => child.once('exit', (code, signal) => (children.delete(child), resolve({ code, signal, out }))));
  return keep ? { child, done } : done;
}

const daemons = localDaemons({ tmp, config, adminIp: admin, rustLog: opts['rust-log'] });

const server = run([loadgen, 'serve', '--listen', `${IP.echo}:8080`], { keep: true });
const collector = await startCollector({ ip: IP.collector, dir: join(tmp, 'otelcol'), verbosity: 'basic' });
children.add(collector.child);
await sleep(300);

const target = ['--target', `${IP.echo}:8080`, '--socks', `${IP.sleep}:15080`];
const rounds = [];
for (let r = 0; r < Number(opts.rounds); r++) {
  for (const mode of opts.modes.split(',')) {
    const extra = mode === 'on' ? { OTEL_EXPORTER_OTLP_ENDPOINT: `http://${IP.collector}:4317`, OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' } : {};
    const a = await daemons.start('node-a', 1, extra);
    const b = await daemons.start('node-b', 2, extra);
    await run([loadgen, 'connections', ...target, '--count', '200']); // warm: certificates, the pooled tunnel
    const pids = [a.child.pid, b.child.pid];
    // 1. The storm alone: --storms clients, --connections each; the daemons' CPU per connection.
    let opened0 = sumSamples(await a.metrics(), 'istio_tcp_connections_opened_total', { reporter: 'source' });
    let cpu0 = totalCpu(pids);
    let started = process.hrtime.bigint();
    await Promise.all(Array.from({ length: Number(opts.storms) }, () => run([loadgen, 'connections', ...target, '--count', opts.connections])));
    let seconds = Number(process.hrtime.bigint() - started) / 1e9;
    const stormOpened = sumSamples(await a.metrics(), 'istio_tcp_connections_opened_total', { reporter: 'source' }) - opened0;
    const cpuPerConnectionUs = ((totalCpu(pids) - cpu0) / stormOpened) * 1e6;
    const cps = stormOpened / seconds;
    // 2. The bulk stream alone, then 3. under the storm.
    const quiet = JSON.parse((await run([loadgen, 'throughput', ...target, '--bytes', opts.bytes])).out).gbps;
    opened0 = sumSamples(await a.metrics(), 'istio_tcp_connections_opened_total', { reporter: 'source' });
    let bulkDone = false;
    const storms = Array.from({ length: Number(opts.storms) }, async () => {
      while (!bulkDone) {
        const s = await run([loadgen, 'connections', ...target, '--count', '200']);
        if (s.code !== 0) throw new Error(`a storm client failed: ${s.out}`);
      }
    });
    started = process.hrtime.bigint();
    const bulk = await run([loadgen, 'throughput', ...target, '--bytes', opts.bytes]);
    seconds = Number(process.hrtime.bigint() - started) / 1e9;
    const underStormCps = (sumSamples(await a.metrics(), 'istio_tcp_connections_opened_total', { reporter: 'source' }) - opened0) / seconds;
    bulkDone = true;
    await Promise.all(storms);
    if (bulk.code !== 0) throw new Error(`the bulk stream failed: ${bulk.out}`);
    await sleep(mode === 'on' ? 2000 : 0); // the last batches leave
    const records = async (result) => sumSamples(await a.metrics(), 'ztunnel_node_otlp_log_records_total', { result }) + sumSamples(await b.metrics(), 'ztunnel_node_otlp_log_records_total', { result });
    const row = {
      round: r + 1, mode, cps, cpuPerConnectionUs, gbpsQuiet: quiet, gbpsUnderStorm: JSON.parse(bulk.out).gbps, underStormCps,
      recordsExported: await records('exported'), recordsDropped: await records('dropped'), recordsFailed: await records('failed'),
    };
    rounds.push(row);
    console.log(JSON.stringify(row));
    await a.stop();
    await b.stop();
  }
}
await collector.stop();
server.child.kill('SIGTERM');

const median = (xs) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
const of = (mode, k) => median(rounds.filter((x) => x.mode === mode).map((x) => x[k]));
const summary = {
  cpsOff: of('off', 'cps'), cpsOn: of('on', 'cps'), cpsRatioOnOff: of('on', 'cps') / of('off', 'cps'),
  cpuPerConnectionUsOff: of('off', 'cpuPerConnectionUs'), cpuPerConnectionUsOn: of('on', 'cpuPerConnectionUs'),
  gbpsQuietOff: of('off', 'gbpsQuiet'), gbpsQuietOn: of('on', 'gbpsQuiet'),
  gbpsUnderStormOff: of('off', 'gbpsUnderStorm'), gbpsUnderStormOn: of('on', 'gbpsUnderStorm'),
  underStormThroughputRatioOnOff: of('on', 'gbpsUnderStorm') / of('off', 'gbpsUnderStorm'),
  dropped: rounds.reduce((n, x) => n + x.recordsDropped, 0),
};
console.log(JSON.stringify({ bytes: Number(opts.bytes), storms: Number(opts.storms), rounds: Number(opts.rounds), summary }, null, 2));
if (opts.json) writeFileSync(opts.json, `${JSON.stringify({ date: new Date().toISOString(), bytes: Number(opts.bytes), storms: Number(opts.storms), rounds, summary }, null, 2)}\n`);
process.exit(0);
