// The benchmark's topologies on loopback, all started once per run and driven by the same load client:
//
//   direct            loadgen ─────────────────────────────────────────────────────────────▶ server (echo's IP)
//   ztunnel-node      loadgen ─SOCKS5▶ node-a ══ HBONE (TLS 1.3 mTLS, h2 CONNECT) ══▶ node-b ─▶ server (echo)
//   ztunnel-node-tcp  loadgen ─SOCKS5▶ node-a ───────── plain TCP (protocol: TCP workload) ──▶ server (echo-tcp)
//   envoy             loadgen ─TCP▶ envoy client ══ HBONE (same CA, same SPIFFE ids) ══▶ envoy server ─▶ server
//
// The daemons are two real `ztunnel-node proxy` processes in local mode (two "nodes" on loopback aliases, one built-in
// CA). Envoy's client side has a plain TCP listener per target because it has no SOCKS5 entry: the load client dials
// it directly, which spares Envoy the SOCKS5 handshake ztunnel-node's entry costs (one round trip per connection).
// Everything binds inside 127.<block>.0.0/16 (bench: 50; the smoke test has its own block).
//
// New mTLS tunnels (the `tunnels` measurement) need a source whose connection cannot be pooled: node-a's pool key
// holds the source identity and IP, so each such connection comes from its own workload (127.<block>.10.1 onwards,
// serviceAccount src-<i>, entered through that workload's own SOCKS5 listener). These workloads join the local
// config only when `enableTunnelSources()` is called (a config reload): each local workload costs node-a memory
// (its certificate and listeners), which must not count in the idle and peak RSS measured before. Envoy's
// equivalent is a second client listener whose cluster carries one request per connection, without TLS session
// resumption (ztunnel-node resumes none either), so every connection makes a full handshake.
//
// With root, the namespace topologies (netns.mjs) run in the same harness: pod → pod across two node network
// namespaces, uncaptured, captured by istio-cni's in-pod rules into ztunnel-node, and through Envoy with an
// original-destination listener.
//
// Node lines (node-lines.mjs): every daemon topology runs once per Node line asked for, each line with its own pair
// of daemons started by that line's Node binary (same flags, daemon-flags.mjs), its own workload addresses (slot k
// of the layout below) and its own load servers; the plain name is the line of the Node running the harness,
// `ztunnel-node@24` another. One more daemon per line, alone in local mode with one workload and never sent
// traffic, gives the idle RSS of one daemon (`idleDaemons()`).
import { spawn } from 'node:child_process';
import { connect } from 'node:net';
import { mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { largeConfigCounts, writeLargeConfig } from '../../dist-test/helpers/large-config.js';
import { sumSamples, parsePrometheusText } from '../../dist/cli/prom-text.js';
import { clientConfig, envoyCertificates, envoyStats, handshakeCounts, serverConfig } from './envoy.mjs';
import { NETNS_TOPOLOGIES, startNetns } from './netns.mjs';
import { daemonArgv, onLine, RUNNING_LINE, splitLine } from './node-lines.mjs';
import { memory } from './proc.mjs';
import { Children, httpGet, poll, waitLine } from './processes.mjs';

/**
 * Resolves once `seconds` have passed since `since` (a performance.now() time). A timer may fire a moment early on
 * the loop's clock (a 2 s wait read 1.9999 s once), so the wait is checked and resumed, not trusted.
 */
async function settled(since, seconds) {
  while (performance.now() - since < seconds * 1000) await new Promise((r) => setTimeout(r, Math.max(1, since + seconds * 1000 - performance.now())));
}

/**
 * The topologies in two groups, each compared against its own direct path: `subject` is ztunnel-node's path,
 * `envoy` Envoy's in the same setting.
 */
export const GROUPS = [
  { name: 'loopback', baseline: 'direct', subject: 'ztunnel-node', envoy: 'envoy', topologies: ['direct', 'ztunnel-node', 'ztunnel-node-tcp', 'envoy'] },
  { name: 'netns', baseline: 'direct-netns', subject: 'ztunnel-node-captured', envoy: 'envoy-captured', topologies: NETNS_TOPOLOGIES },
];
export const TOPOLOGIES = GROUPS.flatMap((g) => g.topologies);
/** The topologies whose proxies are ztunnel-node daemons: they run once per Node line. */
export const DAEMON_TOPOLOGIES = ['ztunnel-node', 'ztunnel-node-tcp', 'ztunnel-node-captured'];
const APP_PORT = 8080;

/** Every topology name for these Node lines, in TOPOLOGIES' order, a daemon topology's lines next to each other. */
export function topologyNames(lines) {
  return TOPOLOGIES.flatMap((t) => (DAEMON_TOPOLOGIES.includes(t) ? lines.map((l) => onLine(t, l)) : [t]));
}

/**
 * The loopback addresses; `slot` k is the k-th Node line's daemons and workloads (slot 0's addresses are the ones
 * the harness had before there were lines). The idle daemon of slot k: workload 127.<block>.5.<10+k>, admin
 * 127.<block>.254.<1+k>.
 */
export function layout(block, slot = 0) {
  const ip = (c, d) => `127.${block}.${c}.${d}`;
  return {
    sleep: ip(1, 10 + slot),
    echo: ip(2, 10 + 2 * slot),
    echoTcp: ip(2, 11 + 2 * slot),
    admin: [ip(255, 1 + 2 * slot), ip(255, 2 + 2 * slot)],
    idle: { workload: ip(5, 10 + slot), admin: ip(254, 1 + slot) },
    state: { admin: ip(254, 101 + slot) },
    envoyClient: ip(3, 1),
    envoyServer: ip(4, 1),
    /** The i-th (0-based) source workload of the `tunnels` measurement: 127.<block>.10.1, consecutive addresses. */
    tunnelSource: (i) => {
      const n = ((127 << 24) | (block << 16) | (10 << 8)) + 1 + i;
      return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
    },
  };
}

const TUNNEL_SOURCES_MAX = 256 * 200; // 127.<block>.10.1 up to 127.<block>.209.x: below the admin addresses
const SOCKS5_PORT = 15080;

const workloadYaml = (uid, ip, protocol, node) => `- {uid: bench/${uid}, name: ${uid}, namespace: default, serviceAccount: ${uid}, workloadIps: ["${ip}"], protocol: ${protocol}, node: ${node}}\n`;

/**
 * One line's local config: the bench's workloads, plus `sources` tunnel-source workloads on node-a, the line's own
 * addresses from source index `first` on.
 */
function workloadsYaml(net, sources, first) {
  const w = workloadYaml;
  let out = 'workloads:\n' + w('sleep', net.sleep, 'HBONE', 'node-a') + w('echo', net.echo, 'HBONE', 'node-b') + w('echo-tcp', net.echoTcp, 'TCP', 'node-c');
  for (let i = 0; i < sources; i++) out += w(`src-${i}`, net.tunnelSource(first + i), 'HBONE', 'node-a');
  return out;
}

/** The environment of a daemon in local mode whose admin, stats and readiness servers listen on `ip`. */
function localEnv({ node, cfg, caDir, ip, workers, daemonEnv }) {
  return {
    PATH: process.env.PATH, HOME: process.env.HOME ?? '/tmp',
    PROXY_MODE: 'local', NODE_NAME: node, LOCAL_XDS_PATH: cfg, LOCAL_CA_DIR: caDir,
    ADMIN_ADDR: `${ip}:15000`, STATS_ADDR: `${ip}:15020`, READINESS_ADDR: `${ip}:15021`,
    RUST_LOG: 'warn', ZTUNNEL_WORKER_THREADS: String(workers), XDS_ADDRESS: '', CA_ADDRESS: '',
    // Beside its config: daemons of one node name on other Node lines run at the same time and must not take each
    // other over.
    HANDOVER_SOCKET: `${cfg}.${node}.handover.sock`,
    ...daemonEnv,
  };
}

/** Resolves once a TCP connection to host:port is accepted (closed at once: no SOCKS5 request, nothing pooled). */
async function accepting(host, port, what, ms = 60_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const err = await new Promise((resolve) => {
      const s = connect({ host, port }, () => {
        s.destroy();
        resolve(null);
      });
      s.once('error', resolve);
    });
    if (err === null) return;
    if (Date.now() > deadline) throw new Error(`${what} not accepting on ${host}:${port} after ${ms} ms: ${err.message}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function metricsOf(base) {
  return parsePrometheusText((await httpGet(base, '/metrics')).body);
}

/** The application of a slot: one load server per workload IP (sink / checked sink / echo by the first byte). */
async function serve({ net, loadgen, children }) {
  for (const ip of [net.echo, net.echoTcp]) {
    const s = children.track(spawn(loadgen, ['serve', '--listen', `${ip}:${APP_PORT}`], { stdio: ['ignore', 'pipe', 'pipe'] }), `load server ${ip}`);
    await waitLine(s, /listening/, `load server on ${ip}`);
  }
}

/**
 * One Node line's pair of daemons (local mode, one built-in CA) and their load servers, on slot `slot` of the
 * layout; resolves the line's `ztunnel-node` and `ztunnel-node-tcp` topologies and what enables its tunnel sources.
 */
async function startLine({ root, tmp, net, line, slot, loadgen, workers, want, children, caDir, tunnelSources, daemonEnv }) {
  const names = { hbone: onLine('ztunnel-node', line.line), tcp: onLine('ztunnel-node-tcp', line.line) };
  if (slot > 0) await serve({ net, loadgen, children }); // slot 0's load servers (direct's and Envoy's too) are up already
  const cfg = join(tmp, `workloads-${line.line}.yaml`);
  const firstSource = slot * tunnelSources;
  writeFileSync(cfg, workloadsYaml(net, 0, firstSource));
  const daemons = [];
  for (const [i, node] of ['node-a', 'node-b'].entries()) {
    const env = localEnv({ node, cfg, caDir, ip: net.admin[i], workers, daemonEnv });
    const child = children.track(spawn(...daemonArgv(root, line), { env, stdio: ['ignore', 'ignore', 'pipe'] }), `${node} (Node ${line.line})`);
    daemons.push({ node, child, ready: `http://${net.admin[i]}:15021` });
    // The first daemon creates the CA root; the others starting at the same time wait on its file lock.
  }
  await Promise.all(daemons.map((d) => poll(d.ready, '/healthz/ready', (s) => s === 200, `${d.node} (Node ${line.line})`).catch((err) => {
    throw new Error(`${err.message}\n${d.child.tail()}`);
  })));
  const [a, b] = daemons.map((d) => d.child.pid);
  const stats = net.admin.map((ip) => `http://${ip}:15020`);
  const common = { line: line.line, socks: `${net.sleep}:${SOCKS5_PORT}` };
  const topologies = {
    [names.hbone]: {
      ...common, name: names.hbone, base: 'ztunnel-node', target: `${net.echo}:${APP_PORT}`, pids: [a, b], roles: ['node-a', 'node-b'],
      // New tunnels: each source enters through its own workload's SOCKS5 listener (that listener is the identity).
      tunnel: {
        args: ['--target', `${net.echo}:${APP_PORT}`, '--socks-port', String(SOCKS5_PORT)],
        /** `count` of this line's tunnel sources from index `from`, as a loadgen --sources range. */
        sources: (from, count) => `${net.tunnelSource(firstSource + from)}-${net.tunnelSource(firstSource + from + count - 1)}`,
        /** HBONE connections node-a opened and node-b accepted, and TLS handshakes that failed on either. */
        async counters() {
          const [ma, mb] = await Promise.all(stats.map(metricsOf));
          return {
            opened: sumSamples(ma, 'ztunnel_node_hbone_connections_opened_total', { direction: 'outbound' }),
            accepted: sumSamples(mb, 'ztunnel_node_hbone_connections_opened_total', { direction: 'inbound' }),
            handshakeFailures: sumSamples(ma, 'ztunnel_node_tls_handshake_failures_total') + sumSamples(mb, 'ztunnel_node_tls_handshake_failures_total'),
          };
        },
      },
    },
    // One proxy on the path: node-b is not involved with a TCP destination. Its memory is ztunnel-node's (same daemon).
    [names.tcp]: { ...common, name: names.tcp, base: 'ztunnel-node-tcp', target: `${net.echoTcp}:${APP_PORT}`, pids: [a], roles: ['node-a'], sharesDaemonsWith: names.hbone },
  };
  for (const n of Object.values(names)) if (!want(n)) delete topologies[n];
  return {
    topologies,
    /** The line's tunnel sources into its config (replaced by rename: the daemons never read half a file). */
    async enableTunnelSources() {
      const next = `${cfg}.next`;
      writeFileSync(next, workloadsYaml(net, tunnelSources, firstSource));
      renameSync(next, cfg);
      for (let i = 0; i < tunnelSources; i++) await accepting(net.tunnelSource(firstSource + i), SOCKS5_PORT, `Node ${line.line}'s tunnel source ${i}'s SOCKS5 listener`);
    },
  };
}

/**
 * The loopback topologies: per Node line a pair of daemons with its load servers, and (when available) both
 * Envoys. Resolves { topologies, unavailable, enableTunnelSources() }.
 */
async function startLoopback({ root, tmp, block, loadgen, workers, envoy, want, children, caDir, tunnelSources, daemonEnv, lines }) {
  if (tunnelSources * lines.length > TUNNEL_SOURCES_MAX) throw new Error(`at most ${TUNNEL_SOURCES_MAX} tunnel sources over all Node lines (asked for ${tunnelSources} × ${lines.length})`);
  const unavailable = {};
  const topologies = {};
  const enablers = [];
  if (!topologyNames(lines.map((l) => l.line)).filter((n) => GROUPS[0].topologies.includes(splitLine(n).base)).some(want)) return { topologies, unavailable };
  const net = layout(block, 0);
  await serve({ net, loadgen, children });
  if (want('direct')) topologies.direct = { name: 'direct', base: 'direct', target: `${net.echo}:${APP_PORT}`, socks: null, pids: [], roles: [] };
  for (const [slot, line] of lines.entries()) {
    const names = ['ztunnel-node', 'ztunnel-node-tcp'].map((b) => onLine(b, line.line)).filter(want);
    if (names.length === 0) continue;
    if (line.unavailable) {
      for (const n of names) unavailable[n] = `Node ${line.line} unavailable: ${line.unavailable}`;
      continue;
    }
    const started = await startLine({ root, tmp, net: layout(block, slot), line, slot, loadgen, workers, want, children, caDir, tunnelSources, daemonEnv });
    Object.assign(topologies, started.topologies);
    enablers.push(started.enableTunnelSources);
  }
  if (!want('envoy')) unavailable.envoy = 'not selected';
  else if (envoy.unavailable) unavailable.envoy = `Envoy unavailable: ${envoy.unavailable}`;
  else {
    const dir = join(tmp, 'envoy');
    mkdirSync(dir, { recursive: true });
    const certs = envoyCertificates(dir, caDir);
    const adminPort = 19000;
    const server = serverConfig({
      admin: { ip: net.envoyServer, port: adminPort }, listen: { ip: net.envoyServer, port: 15008 },
      workload: { ip: net.echo, port: APP_PORT }, certs: certs.server,
    });
    const client = clientConfig({
      admin: { ip: net.envoyClient, port: adminPort }, server: { ip: net.envoyServer, port: 15008 }, certs: certs.client,
      serverId: certs.serverId,
      targets: [
        { listenIp: net.envoyClient, listenPort: 18080, authority: `${net.echo}:${APP_PORT}` },
        { listenIp: net.envoyClient, listenPort: 18081, authority: `${net.echo}:${APP_PORT}`, perConnection: true },
      ],
    });
    const pids = [];
    for (const [role, conf, ip] of [['envoy-client', client, net.envoyClient], ['envoy-server', server, net.envoyServer]]) {
      const path = join(dir, `${role}.json`);
      writeFileSync(path, JSON.stringify(conf, null, 2));
      const child = children.track(spawn(envoy.binary, ['-c', path, '--concurrency', String(workers), '--disable-hot-restart', '-l', 'warning', '--log-path', join(dir, `${role}.log`)], { stdio: ['ignore', 'ignore', 'pipe'] }), role);
      await poll(`http://${ip}:${adminPort}`, '/ready', (s) => s === 200, role).catch((err) => {
        throw new Error(`${err.message}\n${child.tail()}`);
      });
      pids.push(child.pid);
    }
    const admins = { client: `http://${net.envoyClient}:${adminPort}`, server: `http://${net.envoyServer}:${adminPort}` };
    topologies.envoy = {
      name: 'envoy', base: 'envoy', target: `${net.envoyClient}:18080`, socks: null, pids, roles: ['envoy-client', 'envoy-server'], envoyAdmins: admins,
      tunnel: {
        // The sources are bound here too (Envoy ignores them): the same client work as ztunnel-node's.
        args: ['--target', `${net.envoyClient}:18081`],
        sources: (from, count) => `${net.tunnelSource(from)}-${net.tunnelSource(from + count - 1)}`,
        /** The per-connection cluster's handshakes and resumed sessions (client), all handshakes (server). */
        async counters() {
          const c = await envoyStats(admins.client, /^cluster\.hbone_per_connection\.ssl\.(handshake|session_reused)$/);
          const sv = await envoyStats(admins.server, /ssl\.handshake$/);
          return {
            opened: c['cluster.hbone_per_connection.ssl.handshake'] ?? 0,
            accepted: Object.values(sv).reduce((x, y) => x + y, 0),
            sessionReused: c['cluster.hbone_per_connection.ssl.session_reused'] ?? 0,
          };
        },
      },
    };
  }
  return {
    topologies,
    unavailable,
    /**
     * Adds the `tunnelSources` source workloads to each line's local config and resolves once every one's SOCKS5
     * listener accepts: a workload's listeners bind only after its certificate is installed, so no certificate is
     * issued during the measurement.
     */
    async enableTunnelSources() {
      if (tunnelSources > 0) await Promise.all(enablers.map((fn) => fn()));
    },
  };
}

/**
 * The idle daemon of each available line: alone in local mode, one workload of its own (its SOCKS5, inbound and
 * outbound listeners bound, its certificate issued), never sent traffic. Returns { line: { child, admin, ready } }
 * where `ready` resolves with the time /healthz/ready first answered 200.
 */
function startIdleDaemons({ root, tmp, block, workers, children, caDir, daemonEnv, lines }) {
  const out = {};
  for (const [slot, line] of lines.entries()) {
    if (line.unavailable) continue;
    const net = layout(block, slot);
    const cfg = join(tmp, `idle-${line.line}.yaml`);
    writeFileSync(cfg, 'workloads:\n' + workloadYaml('idle', net.idle.workload, 'HBONE', 'node-idle'));
    const env = localEnv({ node: 'node-idle', cfg, caDir, ip: net.idle.admin, workers, daemonEnv });
    const child = children.track(spawn(...daemonArgv(root, line), { env, stdio: ['ignore', 'ignore', 'pipe'] }), `idle daemon (Node ${line.line})`);
    const ready = poll(`http://${net.idle.admin}:15021`, '/healthz/ready', (s) => s === 200, `idle daemon (Node ${line.line})`)
      .then(() => Date.now(), (err) => {
        throw new Error(`${err.message}\n${child.tail()}`);
      });
    ready.catch(() => {}); // awaited by idleDaemons(); a failure before then must not be an unhandled rejection
    out[line.line] = { child, admin: net.idle.admin, ready };
  }
  return out;
}

/**
 * The state daemon of each line, one after the other: alone in local mode with a file of `workloads` workloads
 * (workloads/10 services, workloads/100 policies: test/helpers/large-config.ts), none of them on its node, so it holds
 * the mesh state and serves no workload. Timed from its spawn to /healthz/ready's first 200 (polled every 5 ms), its
 * memory read `settleSeconds` after that, then stopped: { line: { workloads, services, readyMs, rssMiB, rssAnonMiB,
 * rssFileMiB, secondsAfterReady } }. The other topologies are up and idle meanwhile.
 */
async function runStateDaemons({ root, tmp, block, workers, children, caDir, daemonEnv, lines }, workloads, settleSeconds) {
  const cfg = join(tmp, `state-${workloads}.yaml`);
  writeLargeConfig(cfg, { workloads });
  const out = {};
  for (const [slot, line] of lines.entries()) {
    if (line.unavailable) continue;
    const admin = layout(block, slot).state.admin;
    const env = localEnv({ node: 'node-state', cfg, caDir, ip: admin, workers, daemonEnv });
    const what = `state daemon, ${workloads} workloads (Node ${line.line})`;
    const started = performance.now();
    const child = children.track(spawn(...daemonArgv(root, line), { env, stdio: ['ignore', 'ignore', 'pipe'] }), what);
    try {
      await poll(`http://${admin}:15021`, '/healthz/ready', (st) => st === 200, what, 120_000, 5);
    } catch (err) {
      throw new Error(`${err.message}\n${child.tail()}`);
    }
    const readyMs = performance.now() - started;
    await settled(started + readyMs, settleSeconds);
    const m = memory(child.pid);
    const MiB = 1024 ** 2;
    out[line.line] = {
      workloads, services: largeConfigCounts({ workloads }).services, readyMs,
      rssMiB: m.rss / MiB, rssAnonMiB: m.rssAnon / MiB, rssFileMiB: m.rssFile / MiB, secondsAfterReady: (performance.now() - started - readyMs) / 1000,
    };
    await children.retire(child);
  }
  return out;
}

/**
 * Starts every wanted topology: the loopback ones, and with `netns` ({ prefix, block } of the namespace cluster)
 * the namespace ones, each daemon topology once per Node line of `lines` ([{ line, binary } or { line,
 * unavailable }], from node-lines.mjs; default: the running Node). Resolves { topologies: { name: { name, base,
 * line?, target, socks, pids, roles, exec?, tunnel?, sharesDaemonsWith?, envoyAdmins?, proof? } }, unavailable:
 * { name: reason }, enableTunnelSources(), idleDaemons(settleSeconds), envoyHandshakes(), stop() }. `exec` prefixes
 * the load client's command (ip netns exec POD); a topology with `tunnel` ({ args, sources(from, count),
 * counters() }) takes part in the new-tunnel measurement; `proof()` counts what its proxies saw.
 */
export async function startAll({ root, tmp, block, loadgen, workers, envoy, only, netns = null, tunnelSources = 0, daemonEnv = {}, lines = [{ line: RUNNING_LINE, binary: process.execPath }] }) {
  const children = new Children();
  const cleanups = [];
  const stop = async () => {
    await children.stop();
    for (const fn of cleanups) fn();
  };
  // `--only ztunnel-node` selects it on every line; `--only ztunnel-node@24` on that line only.
  const want = (name) => (!only || only.includes(name) || only.includes(splitLine(name).base)) && (netns !== null || !NETNS_TOPOLOGIES.includes(splitLine(name).base));
  const names = topologyNames(lines.map((l) => l.line));
  const caDir = join(tmp, 'ca');
  try {
    // The idle daemons first: they settle while everything else starts.
    const wantedLines = lines.filter((l) => DAEMON_TOPOLOGIES.some((b) => want(onLine(b, l.line))));
    const idle = startIdleDaemons({ root, tmp, block, workers, children, caDir, daemonEnv, lines: wantedLines });
    const common = { root, tmp, loadgen, workers, envoy, want, children, caDir, lines };
    const loopback = await startLoopback({ ...common, block, tunnelSources, daemonEnv });
    const ns = await startNetns({ ...common, atStop: (fn) => cleanups.push(fn), ...(netns ?? {}) });
    // In `names`' order: a topology's Node lines run next to each other in every round.
    const started = { ...loopback.topologies, ...ns.topologies };
    const topologies = Object.fromEntries(names.filter((n) => started[n]).map((n) => [n, started[n]]));
    const unavailable = { ...loopback.unavailable, ...ns.unavailable };
    for (const name of names) {
      if (!want(name)) {
        delete topologies[name];
        unavailable[name] ??= NETNS_TOPOLOGIES.includes(splitLine(name).base) && netns === null ? 'not selected (--netns, or the full profile)' : 'not selected';
      }
    }
    children.watch();
    return {
      topologies,
      unavailable,
      names,
      caDir,
      enableTunnelSources: loopback.enableTunnelSources ?? (async () => {}),
      /**
       * Each line's idle daemon, read `settleSeconds` after it was ready (waiting as long as that takes), then
       * stopped: { line: { rssMiB, rssAnonMiB, rssFileMiB, secondsAfterReady } }.
       */
      async idleDaemons(settleSeconds) {
        const out = {};
        for (const [l, d] of Object.entries(idle)) {
          const readyAt = await d.ready;
          while (Date.now() - readyAt < settleSeconds * 1000) await new Promise((r) => setTimeout(r, Math.max(1, readyAt + settleSeconds * 1000 - Date.now())));
          const m = memory(d.child.pid);
          const MiB = 1024 ** 2;
          out[l] = { rssMiB: m.rss / MiB, rssAnonMiB: m.rssAnon / MiB, rssFileMiB: m.rssFile / MiB, secondsAfterReady: (Date.now() - readyAt) / 1000, workloads: 1 };
        }
        await Promise.all(Object.values(idle).map((d) => children.retire(d.child)));
        return out;
      },
      /** `runStateDaemons` on each line that has daemon topologies. */
      stateDaemons: (workloads, settleSeconds) =>
        runStateDaemons({ root, tmp, block, workers, children, caDir, daemonEnv, lines: wantedLines }, workloads, settleSeconds),
      /** Each Envoy topology's TLS handshake counters: { topology: { client, server } }. */
      async envoyHandshakes() {
        const out = {};
        for (const t of Object.values(topologies).filter((x) => x.envoyAdmins)) {
          out[t.name] = { client: await handshakeCounts(t.envoyAdmins.client), server: await handshakeCounts(t.envoyAdmins.server) };
        }
        return out;
      },
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}
