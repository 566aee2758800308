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
import { spawn } from 'node:child_process';
import { connect } from 'node:net';
import { mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { DAEMON_NODE_FLAGS } from '../daemon-flags.mjs';
import { sumSamples, parsePrometheusText } from '../../dist/cli/prom-text.js';
import { clientConfig, envoyCertificates, envoyStats, handshakeCounts, serverConfig } from './envoy.mjs';
import { NETNS_TOPOLOGIES, startNetns } from './netns.mjs';
import { Children, httpGet, poll, waitLine } from './processes.mjs';

/**
 * The topologies in two groups, each compared against its own direct path: `subject` is ztunnel-node's path,
 * `envoy` Envoy's in the same setting.
 */
export const GROUPS = [
  { name: 'loopback', baseline: 'direct', subject: 'ztunnel-node', envoy: 'envoy', topologies: ['direct', 'ztunnel-node', 'ztunnel-node-tcp', 'envoy'] },
  { name: 'netns', baseline: 'direct-netns', subject: 'ztunnel-node-captured', envoy: 'envoy-captured', topologies: NETNS_TOPOLOGIES },
];
export const TOPOLOGIES = GROUPS.flatMap((g) => g.topologies);
const APP_PORT = 8080;

export function layout(block) {
  const ip = (c, d) => `127.${block}.${c}.${d}`;
  return {
    sleep: ip(1, 10),
    echo: ip(2, 10),
    echoTcp: ip(2, 11),
    admin: [ip(255, 1), ip(255, 2)],
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

/** The local config: the bench's workloads, plus `sources` tunnel-source workloads on node-a. */
function workloadsYaml(net, sources) {
  const w = (uid, ip, protocol, node) => `- {uid: bench/${uid}, name: ${uid}, namespace: default, serviceAccount: ${uid}, workloadIps: ["${ip}"], protocol: ${protocol}, node: ${node}}\n`;
  let out = 'workloads:\n' + w('sleep', net.sleep, 'HBONE', 'node-a') + w('echo', net.echo, 'HBONE', 'node-b') + w('echo-tcp', net.echoTcp, 'TCP', 'node-c');
  for (let i = 0; i < sources; i++) out += w(`src-${i}`, net.tunnelSource(i), 'HBONE', 'node-a');
  return out;
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

/**
 * The loopback topologies: the load servers, both daemons and (when available) both Envoys. Resolves
 * { topologies, unavailable, tunnelSourceRange(), enableTunnelSources() }.
 */
async function startLoopback({ root, tmp, block, loadgen, workers, envoy, want, children, caDir, tunnelSources, daemonEnv }) {
  if (tunnelSources > TUNNEL_SOURCES_MAX) throw new Error(`at most ${TUNNEL_SOURCES_MAX} tunnel sources (asked for ${tunnelSources})`);
  const net = layout(block);
  const unavailable = {};
  if (!GROUPS[0].topologies.some(want)) return { topologies: {}, unavailable };
  // The application: one load server per workload IP (sink / checked sink / echo by the connection's first byte).
  for (const ip of [net.echo, net.echoTcp]) {
    const s = children.track(spawn(loadgen, ['serve', '--listen', `${ip}:${APP_PORT}`], { stdio: ['ignore', 'pipe', 'pipe'] }), `load server ${ip}`);
    await waitLine(s, /listening/, `load server on ${ip}`);
  }

  // Two daemons, local mode, one built-in CA (its root also signs Envoy's leaves).
  const cfg = join(tmp, 'workloads.yaml');
  writeFileSync(cfg, workloadsYaml(net, 0));
  const daemons = [];
  for (const [i, node] of ['node-a', 'node-b'].entries()) {
    const ip = net.admin[i];
    const env = {
      PATH: process.env.PATH, HOME: process.env.HOME ?? '/tmp',
      PROXY_MODE: 'local', NODE_NAME: node, LOCAL_XDS_PATH: cfg, LOCAL_CA_DIR: caDir,
      ADMIN_ADDR: `${ip}:15000`, STATS_ADDR: `${ip}:15020`, READINESS_ADDR: `${ip}:15021`,
      RUST_LOG: 'warn', ZTUNNEL_WORKER_THREADS: String(workers), XDS_ADDRESS: '', CA_ADDRESS: '',
      ...daemonEnv,
    };
    const child = children.track(spawn(process.execPath, [...DAEMON_NODE_FLAGS, join(root, 'bin', 'ztunnel-node.js'), 'proxy'], { env, stdio: ['ignore', 'ignore', 'pipe'] }), node);
    daemons.push({ node, child, ready: `http://${ip}:15021` });
    // node-a creates the CA root; node-b starting at the same time waits on its file lock.
  }
  await Promise.all(daemons.map((d) => poll(d.ready, '/healthz/ready', (s) => s === 200, d.node).catch((err) => {
    throw new Error(`${err.message}\n${d.child.tail()}`);
  })));
  const [a, b] = daemons.map((d) => d.child.pid);

  const stats = net.admin.map((ip) => `http://${ip}:15020`);
  const topologies = {
    direct: { name: 'direct', target: `${net.echo}:${APP_PORT}`, socks: null, pids: [], roles: [] },
    'ztunnel-node': {
      name: 'ztunnel-node', target: `${net.echo}:${APP_PORT}`, socks: `${net.sleep}:${SOCKS5_PORT}`, pids: [a, b], roles: ['node-a', 'node-b'],
      // New tunnels: each source enters through its own workload's SOCKS5 listener (that listener is the identity).
      tunnel: {
        args: ['--target', `${net.echo}:${APP_PORT}`, '--socks-port', String(SOCKS5_PORT)],
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
    // One proxy on the path: node-b is not involved with a TCP destination.
    'ztunnel-node-tcp': { name: 'ztunnel-node-tcp', target: `${net.echoTcp}:${APP_PORT}`, socks: `${net.sleep}:${SOCKS5_PORT}`, pids: [a], roles: ['node-a'] },
  };
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
      name: 'envoy', target: `${net.envoyClient}:18080`, socks: null, pids, roles: ['envoy-client', 'envoy-server'], envoyAdmins: admins,
      tunnel: {
        // The sources are bound here too (Envoy ignores them): the same client work as ztunnel-node's.
        args: ['--target', `${net.envoyClient}:18081`],
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
    /** `count` tunnel sources from index `from`, as a loadgen --sources range. */
    tunnelSourceRange: (from, count) => `${net.tunnelSource(from)}-${net.tunnelSource(from + count - 1)}`,
    /**
     * Adds the `tunnelSources` source workloads to the local config (replaced by rename: the daemons never read
     * half a file) and resolves once every one's SOCKS5 listener accepts: a workload's listeners bind only after
     * its certificate is installed, so no certificate is issued during the measurement.
     */
    async enableTunnelSources() {
      if (tunnelSources === 0) return;
      const next = `${cfg}.next`;
      writeFileSync(next, workloadsYaml(net, tunnelSources));
      renameSync(next, cfg);
      for (let i = 0; i < tunnelSources; i++) await accepting(net.tunnelSource(i), SOCKS5_PORT, `tunnel source ${i}'s SOCKS5 listener`);
    },
  };
}

/**
 * Starts every wanted topology: the loopback ones, and with `netns` ({ prefix, block } of the namespace cluster)
 * the namespace ones. Resolves { topologies: { name: { name, target, socks, pids, roles, exec?, tunnel?,
 * envoyAdmins?, proof? } }, unavailable: { name: reason }, tunnelSourceRange(), enableTunnelSources(),
 * envoyHandshakes(), stop() }. `exec` prefixes the load client's command (ip netns exec POD); a topology with
 * `tunnel` ({ args, counters() }) takes part in the new-tunnel measurement; `proof()` counts what its proxies saw.
 */
export async function startAll({ root, tmp, block, loadgen, workers, envoy, only, netns = null, tunnelSources = 0, daemonEnv = {} }) {
  const children = new Children();
  const cleanups = [];
  const stop = async () => {
    await children.stop();
    for (const fn of cleanups) fn();
  };
  const want = (name) => (!only || only.includes(name)) && (netns !== null || !NETNS_TOPOLOGIES.includes(name));
  const caDir = join(tmp, 'ca');
  try {
    const common = { root, tmp, loadgen, workers, envoy, want, children, caDir };
    const loopback = await startLoopback({ ...common, block, tunnelSources, daemonEnv });
    const ns = await startNetns({ ...common, atStop: (fn) => cleanups.push(fn), ...(netns ?? {}) });
    const topologies = { ...loopback.topologies, ...ns.topologies };
    const unavailable = { ...loopback.unavailable, ...ns.unavailable };
    for (const name of TOPOLOGIES) {
      if (!want(name)) {
        delete topologies[name];
        unavailable[name] ??= NETNS_TOPOLOGIES.includes(name) && netns === null ? 'not selected (--netns, or the full profile)' : 'not selected';
      }
    }
    children.watch();
    return {
      topologies,
      unavailable,
      caDir,
      tunnelSourceRange: loopback.tunnelSourceRange,
      enableTunnelSources: loopback.enableTunnelSources ?? (async () => {}),
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
