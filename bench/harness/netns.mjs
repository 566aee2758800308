// The namespace topologies (root only): pod → pod across two node network namespaces, the cluster of the namespace
// suite (test/helpers/netns.ts: node a and node b joined by a veth, /32 pods routed by their node):
//
//   direct-netns           pod ua ─────────────────────────────────────────────────────────────────▶ pod ub
//   ztunnel-node-captured  pod a1 ─istio-cni in-pod rules─▶ node-a daemon's 15001 in a1 ══ HBONE ══▶ node-b
//                          daemon's 15008 in b1 ─▶ b1
//   envoy-captured         pod ea ─nat OUTPUT REDIRECT─▶ Envoy in ea (original_dst listener) ══ HBONE ══▶ Envoy in
//                          eb (15008) ─▶ eb
//
// The daemons run in the node namespaces in shared (in-pod) mode, handed the captured pods by a fake istio-cni agent
// per node (test/helpers/fake-cni.ts); their listeners and upstream sockets live in the pods' namespaces. Envoy has
// no in-pod mode, so it runs inside the pods as a sidecar would, and one nat rule sends the client pod's connections
// to the application port to its original-destination listener (Envoy's own upstream goes to 15008: not matched).
// Either way a packet takes the same path: app → proxy in the client pod → pod veth → node a → node link → node b →
// pod veth → proxy in the server pod → app. The load client and servers run inside the pods (`exec`), and every
// certificate comes from the same built-in CA as the loopback topologies'. ztunnel-node-captured runs once per Node
// line (`ztunnel-node-captured@24`), each line with its own pods and its own pair of daemons in the node namespaces.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parsePrometheusText, sumSamples } from '../../dist/cli/prom-text.js';
import { startCni } from '../../dist-test/helpers/fake-cni.js';
import { Cluster, isRoot } from '../../dist-test/helpers/netns.js';
import { makeCa } from '../../dist-test/helpers/pki.js';
import { clientConfig, envoyCertificates, envoyStats, serverConfig } from './envoy.mjs';
import { daemonArgv, onLine } from './node-lines.mjs';
import { poll, waitLine } from './processes.mjs';

export const NETNS_TOPOLOGIES = ['direct-netns', 'ztunnel-node-captured', 'envoy-captured'];
const APP_PORT = 9000;
const ENVOY_OUTBOUND_PORT = 15001;

/**
 * GET a URL from inside namespace `ns` (the daemons' admin servers listen on the node namespace's loopback);
 * resolves { status, body }.
 */
function getIn(ns, url) {
  const script = `fetch(${JSON.stringify(url)}).then(async (r) => console.log(JSON.stringify({ status: r.status, body: await r.text() })),` +
    ' (e) => console.log(JSON.stringify({ status: 0, body: String(e) })))';
  const r = spawnSync('ip', ['netns', 'exec', ns, process.execPath, '-e', script], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`GET ${url} in ${ns}: ${(r.stderr || r.error?.message || '').trim()}`);
  return JSON.parse(r.stdout.trim().split('\n').pop());
}

async function waitReadyIn(ns, adminIp, what, ms = 30_000) {
  const deadline = Date.now() + ms;
  let last;
  while (Date.now() < deadline) {
    last = getIn(ns, `http://${adminIp}:15021/healthz/ready`);
    if (last.status === 200) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`${what} not ready after ${ms} ms (${last.status} ${last.body.trim().slice(0, 200)})`);
}

/**
 * Builds the cluster and starts what the wanted netns topologies need; resolves { topologies, unavailable }.
 * Without root every netns topology is unavailable, with the reason. The namespaces (and every veth, rule and route
 * in them) are deleted by the function handed to `atStop`, which runs after the children have stopped.
 */
export async function startNetns({ root, tmp, loadgen, workers, envoy, want, children, atStop, caDir, lines, prefix = 'ztb', block = 77 }) {
  const wanted = NETNS_TOPOLOGIES.flatMap((b) => (b === 'ztunnel-node-captured' ? lines.map((l) => onLine(b, l.line)) : [b])).filter(want);
  const unavailable = {};
  if (wanted.length === 0) return { topologies: {}, unavailable };
  if (!isRoot()) {
    for (const n of wanted) unavailable[n] = 'needs root (network namespaces, iptables)';
    return { topologies: {}, unavailable };
  }
  if (want('envoy-captured') && envoy.unavailable) unavailable['envoy-captured'] = `Envoy unavailable: ${envoy.unavailable}`;
  const on = (n) => want(n) && !unavailable[n];

  const cluster = new Cluster(prefix, block);
  const destroy = () => {
    cluster.destroy();
    process.removeListener('exit', destroy);
  };
  process.once('exit', destroy);
  atStop(destroy);
  const inNs = (ns) => ['ip', 'netns', 'exec', ns];
  const topologies = {};
  cluster.build();
  const serve = async (pod) => {
    const s = children.track(cluster.spawn(pod.ns, loadgen, ['serve', '--listen', `0.0.0.0:${APP_PORT}`]), `load server in ${pod.name}`);
    await waitLine(s, /listening/, `load server in ${pod.name}`);
  };

  if (on('direct-netns')) {
    const [ua, ub] = [cluster.addPod('a', 'ua'), cluster.addPod('b', 'ub')];
    await serve(ub);
    topologies['direct-netns'] = { name: 'direct-netns', base: 'direct-netns', target: `${ub.ip}:${APP_PORT}`, socks: null, pids: [], roles: [], exec: inNs(ua.ns) };
  }

  // ztunnel-node-captured once per Node line: the line's own pods (a<k>, b<k>) and pair of daemons (one per node
  // namespace, each with its own fake CNI agent; their admin, stats and readiness servers on 127.0.0.<k> there).
  for (const [slot, line] of lines.entries()) {
    const name = onLine('ztunnel-node-captured', line.line);
    if (!want(name)) continue;
    if (line.unavailable) {
      unavailable[name] = `Node ${line.line} unavailable: ${line.unavailable}`;
      continue;
    }
    const [pa, pb] = [cluster.addPod('a', `a${slot + 1}`), cluster.addPod('b', `b${slot + 1}`)];
    cluster.capture(pa);
    cluster.capture(pb);
    await serve(pb);
    const cfg = join(tmp, `netns-workloads-${line.line}.yaml`);
    writeFileSync(cfg, 'workloads:\n' + [pa, pb].map((p) => `- {uid: bench/${p.name}, name: ${p.name}, namespace: default, serviceAccount: ${p.name}, workloadIps: ["${p.ip}"], protocol: HBONE, node: node-${p.node}}\n`).join(''));
    const adminIp = `127.0.0.${slot + 1}`;
    const cni = {};
    const daemons = {};
    for (const node of ['a', 'b']) {
      const agents = [];
      const sock = join(tmp, `cni-${node}-${line.line}.sock`);
      cni[node] = startCni(sock, agents);
      children.track(agents[0], `fake CNI agent of node ${node} (Node ${line.line})`);
      await cni[node].next((e) => e.event === 'listening', `fake CNI of node ${node} listening`);
      const env = {
        PATH: process.env.PATH, HOME: process.env.HOME ?? '/tmp',
        PROXY_MODE: 'shared', NODE_NAME: `node-${node}`, LOCAL_XDS_PATH: cfg, LOCAL_CA_DIR: caDir,
        XDS_ADDRESS: '', CA_ADDRESS: '', INPOD_UDS: sock, HANDOVER_SOCKET: join(tmp, `handover-${node}-${line.line}.sock`),
        ADMIN_ADDR: `${adminIp}:15000`, STATS_ADDR: `${adminIp}:15020`, READINESS_ADDR: `${adminIp}:15021`,
        RUST_LOG: 'warn', ZTUNNEL_WORKER_THREADS: String(workers),
      };
      // `ip netns exec` execs the command: the child's pid is the daemon's.
      daemons[node] = children.track(cluster.spawn(cluster.nodeNs(node), ...daemonArgv(root, line), { env, stdio: ['ignore', 'ignore', 'pipe'] }), `node-${node} (in-pod, Node ${line.line})`);
    }
    for (const [node, pod] of [['a', pa], ['b', pb]]) {
      await cni[node].next((e) => e.event === 'connected', `node-${node} connected to its CNI agent`, 30_000).catch((err) => {
        throw new Error(`${err.message}\n${daemons[node].tail()}`);
      });
      const ack = await cni[node].send({ op: 'add', uid: `uid-${pod.name}`, netns: pod.netnsPath, name: pod.name, namespace: 'default', serviceAccount: pod.name });
      if (ack.error) throw new Error(`node-${node} refused pod ${pod.name}: ${ack.error}`);
      const snap = await cni[node].send({ op: 'snapshot' });
      if (snap.error) throw new Error(`node-${node} refused the snapshot: ${snap.error}`);
      await waitReadyIn(cluster.nodeNs(node), adminIp, `node-${node} (in-pod, Node ${line.line})`);
    }
    const nodeB = cluster.nodeNs('b');
    topologies[name] = {
      name, base: 'ztunnel-node-captured', line: line.line, target: `${pb.ip}:${APP_PORT}`, socks: null, exec: inNs(pa.ns),
      pids: [daemons.a.pid, daemons.b.pid], roles: ['node-a (in-pod)', 'node-b (in-pod)'],
      /** What node-b saw arrive: connections over mTLS from the client pod's identity, and HBONE connections accepted. */
      async proof() {
        const m = parsePrometheusText(getIn(nodeB, `http://${adminIp}:15020/metrics`).body);
        return {
          tunneled: sumSamples(m, 'istio_tcp_connections_opened_total', { reporter: 'destination', connection_security_policy: 'mutual_tls', source_principal: `spiffe://cluster.local/ns/default/sa/${pa.name}` }),
          handshakes: sumSamples(m, 'ztunnel_node_hbone_connections_opened_total', { direction: 'inbound' }),
        };
      },
    };
  }

  if (on('envoy-captured')) {
    const [ea, eb] = [cluster.addPod('a', 'ea'), cluster.addPod('b', 'eb')];
    await serve(eb);
    const dir = join(tmp, 'envoy-captured');
    mkdirSync(dir, { recursive: true });
    if (!existsSync(join(caDir, 'root-cert.pem'))) {
      // No daemon started (--only without ztunnel-node): a root of our own, under the built-in CA's file names.
      mkdirSync(caDir, { recursive: true });
      makeCa(caDir, 'root');
      renameSync(join(caDir, 'root.crt'), join(caDir, 'root-cert.pem'));
      renameSync(join(caDir, 'root.key'), join(caDir, 'root-key.pem'));
    }
    const certs = envoyCertificates(dir, caDir, { clientSa: 'ea', serverSa: 'eb' });
    const admins = { client: join(dir, 'client-admin.sock'), server: join(dir, 'server-admin.sock') };
    const configs = {
      client: clientConfig({
        admin: { pipe: admins.client }, server: { port: 15008 }, certs: certs.client, serverId: certs.serverId,
        targets: [{ listenIp: '0.0.0.0', listenPort: ENVOY_OUTBOUND_PORT, originalDst: true }],
      }),
      server: serverConfig({ admin: { pipe: admins.server }, listen: { ip: eb.ip, port: 15008 }, workload: { ip: eb.ip, port: APP_PORT }, certs: certs.server }),
    };
    // The client pod's connections to the application port go to Envoy; Envoy's own (to 15008) do not.
    cluster.exec(ea.ns, 'iptables', '-t', 'nat', '-A', 'OUTPUT', '-p', 'tcp', '--dport', String(APP_PORT), '-j', 'REDIRECT', '--to-ports', String(ENVOY_OUTBOUND_PORT));
    const pids = [];
    for (const [role, pod] of [['client', ea], ['server', eb]]) {
      const path = join(dir, `${role}.json`);
      writeFileSync(path, JSON.stringify(configs[role], null, 2));
      const child = children.track(cluster.spawn(pod.ns, envoy.binary, ['-c', path, '--concurrency', String(workers), '--disable-hot-restart', '-l', 'warning', '--log-path', join(dir, `${role}.log`)], { stdio: ['ignore', 'ignore', 'pipe'] }), `envoy-${role} in ${pod.name}`);
      await poll(`unix:${admins[role]}`, '/ready', (s) => s === 200, `envoy-${role} in ${pod.name}`).catch((err) => {
        throw new Error(`${err.message}\n${child.tail()}`);
      });
      pids.push(child.pid);
    }
    const base = { client: `unix:${admins.client}`, server: `unix:${admins.server}` };
    topologies['envoy-captured'] = {
      name: 'envoy-captured', base: 'envoy-captured', target: `${eb.ip}:${APP_PORT}`, socks: null, exec: inNs(ea.ns),
      pids, roles: ['envoy-client (in pod ea)', 'envoy-server (in pod eb)'], envoyAdmins: base,
      /** What the server Envoy saw arrive: CONNECT requests, and TLS handshakes. */
      async proof() {
        const s = await envoyStats(base.server, /^(http\.inbound_hbone\.downstream_rq_total|listener\..*\.ssl\.handshake)$/);
        return {
          tunneled: s['http.inbound_hbone.downstream_rq_total'] ?? 0,
          handshakes: Object.entries(s).filter(([k]) => k.endsWith('.ssl.handshake')).reduce((a, [, v]) => a + v, 0),
        };
      },
    };
  }
  return { topologies, unavailable };
}
