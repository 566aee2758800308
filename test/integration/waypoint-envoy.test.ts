// A real waypoint: Envoy configured as Istio configures one (test/fixtures/envoy/waypoint.yaml: HBONE terminated on
// its :15008 with mTLS as the waypoint's identity, dispatched through internal listeners, HBONE originated to the
// chosen endpoint's node), between two local-mode daemons. node-a serves `sleep`; node-b serves `echo` (an endpoint
// of service echo, whose waypoint is the Envoy) and `echo-w` (a workload with its own waypoint, the same Envoy);
// the waypoint is a workload and a service of the local config on a node neither daemon serves, as istiod would
// describe it. A destination policy on both echo workloads admits only the waypoint's identity.
//
// Through the waypoint, each hop is checked where an operator would look: node-a's access log (where it sent the
// connection and whom it expected), Envoy's admin /stats (which listener and cluster carried it), node-b's metrics
// and access log (the source principal it authorized), and the bytes back at the client.
//
// Envoy comes from the project's virtual environment (npm test installs it: scripts/tools.mjs). Without it this
// suite fails under CI and is skipped, saying why, elsewhere.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { sumSamples } from '../../dist/cli/prom-text.js';
import { makeTempDir, removeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import type { Daemon } from '../helpers/daemon.js';
import { envoyForSuite, startEnvoyWaypoint, waypointedService } from '../helpers/envoy-waypoint.js';
import type { EnvoyHandle } from '../helpers/envoy-waypoint.js';
import { connectRequest, hboneSession } from '../helpers/hbone.js';
import { block, BLOCKS, pattern, sha256, socks5Request, socksRoundTrip, startEchoServer, waitFor } from '../helpers/net.js';
import type { TestServer } from '../helpers/net.js';
import { builtinCa, builtinLeaf, spiffe } from '../helpers/pki.js';
import type { Leaf } from '../helpers/pki.js';

const B = block(BLOCKS['waypoint-envoy']);
const SLEEP = B.workload(1);
const ECHO = B.workload(2);
const WAYPOINT = B.workload(3);
const ECHO_W = B.workload(4);
const ECHO_VIP = '127.64.100.1';
const WAYPOINT_VIP = '127.64.100.2';
const SERVICE_PORT = 80;
const PORT = 8080;
const ECHO_HOST = 'echo.default.svc.cluster.local';
const WAYPOINT_HOST = 'waypoint.default.svc.cluster.local';
const ENVOY_ADMIN = { ip: B.admin(3), port: 15000 };
const SOCKS = { host: SLEEP, port: 15080 };
const ID = { sleep: spiffe('default', 'sleep'), echo: spiffe('default', 'echo'), waypoint: spiffe('default', 'waypoint') };
/** Envoy's stat names for the service chain and cluster (Istio's naming: inbound-vip|<port>|tcp|<hostname>). */
const VIP_CLUSTER = `inbound-vip|${SERVICE_PORT}|tcp|${ECHO_HOST}`;

// As istiod describes it: the service echo and the workload echo-w name the waypoint (by address, by hostname);
// the waypoint is an HBONE workload (Envoy's IP, its own service account) behind a service with port 15008.
const mesh = waypointedService(
  { ip: WAYPOINT, node: 'node-w', host: WAYPOINT_HOST, vip: WAYPOINT_VIP },
  { name: 'echo', host: ECHO_HOST, vip: ECHO_VIP, port: SERVICE_PORT, targetPort: PORT },
);
const config = {
  workloads: [
    workload({ name: 'sleep', ip: SLEEP, node: 'node-a' }),
    workload({
      name: 'echo',
      ip: ECHO,
      node: 'node-b',
      services: { [`default/${ECHO_HOST}`]: { [SERVICE_PORT]: PORT } },
      authorizationPolicies: ['default/only-waypoint'],
    }),
    workload({
      name: 'echo-w',
      ip: ECHO_W,
      node: 'node-b',
      sa: 'echo',
      waypoint: { destination: `default/${WAYPOINT_HOST}`, hboneMtlsPort: 15008 },
      authorizationPolicies: ['default/only-waypoint'],
    }),
    mesh.waypoint,
  ],
  services: mesh.services,
  policies: [
    {
      name: 'only-waypoint',
      namespace: 'default',
      scope: 'WorkloadSelector',
      action: 'Allow',
      rules: [[[{ principals: [{ Exact: ID.waypoint.slice('spiffe://'.length) }] }]]],
    },
  ],
};

const envoy = envoyForSuite('an Envoy waypoint between two daemons');

if (envoy !== null) {
  const tmp = makeTempDir('ztn-waypoint-');
  const caDir = join(tmp, 'ca');
  let a: Daemon;
  let b: Daemon;
  let waypoint: EnvoyHandle;
  let echo: TestServer;
  let echoW: TestServer;

  before(async () => {
    [echo, echoW] = await Promise.all([startEchoServer(ECHO, PORT), startEchoServer(ECHO_W, PORT)]);
    // node-a first: it creates the built-in CA that signs everyone, the Envoy waypoint included.
    a = await startDaemon({ node: 'node-a', config, caDir, adminIp: B.admin(1) });
    b = await startDaemon({ node: 'node-b', config, caDir, adminIp: B.admin(2) });
    const dir = join(tmp, 'envoy');
    mkdirSync(dir);
    waypoint = await startEnvoyWaypoint({
      binary: envoy.binary,
      dir,
      caDir,
      ip: WAYPOINT,
      admin: ENVOY_ADMIN,
      service: { vip: ECHO_VIP, port: SERVICE_PORT, hostname: ECHO_HOST, endpoints: [`${ECHO}:${PORT}`] },
      workloadIp: ECHO_W,
    });
  });

  after(async () => {
    await Promise.allSettled([a?.stop(), b?.stop(), waypoint?.stop()]);
    await Promise.allSettled([echo?.close(), echoW?.close()]);
    removeTempDir(tmp);
  });

  /** node-b's inbound connections to `workloadName`, opened and denied, by source principal; and the source
   *  workloads it named for the waypoint's connections. */
  const inbound = async (workloadName: string) => {
    const s = await b.metrics();
    const dst = { reporter: 'destination', destination_workload: workloadName };
    const by = (principal: string) => ({
      opened: sumSamples(s, 'istio_tcp_connections_opened_total', { ...dst, source_principal: principal }),
      denied: sumSamples(s, 'istio_tcp_connections_failed_total', { ...dst, source_principal: principal, response_flags: 'DENY' }),
    });
    const fromWaypoint = s.filter((x) => x.name === 'istio_tcp_connections_opened_total' && x.labels.reporter === 'destination'
      && x.labels.destination_workload === workloadName && x.labels.source_principal === ID.waypoint);
    return { waypoint: by(ID.waypoint), sleep: by(ID.sleep), sourceWorkloads: [...new Set(fromWaypoint.map((x) => x.labels.source_workload))] };
  };

  /** Envoy's counters on the waypoint path. */
  const envoyPath = async () => {
    const s = await waypoint.stats(/^(http\.connect_terminate\.downstream_rq_total|tcp\..*\.downstream_cx_total|cluster\.(connect_originate|main_internal|encap|inbound-vip.*)\.upstream_(cx|rq)_total)$/);
    const get = (name: string) => s[name] ?? 0;
    return {
      terminated: get('http.connect_terminate.downstream_rq_total'),
      vipChain: get(`tcp.${VIP_CLUSTER}.downstream_cx_total`),
      directChain: get('tcp.direct-tcp.downstream_cx_total'),
      originated: get('cluster.connect_originate.upstream_rq_total'),
      all: s,
    };
  };

  /** Through sleep's SOCKS5 entry to `host:port`: `size` bytes out, the same bytes back (the echo). */
  async function roundTrip(host: string, port: number, size: number, seed: number) {
    const payload = pattern(size, seed);
    const r = await socksRoundTrip({ socks: SOCKS, dest: { host, port }, payload });
    assert.equal(r.error, undefined, `round trip to ${host}:${port}: ${r.error?.message}`);
    assert.equal(r.bytes, size, `bytes back from ${host}:${port}`);
    assert.equal(r.sha256, sha256(payload), `the echoed bytes are the ones sent to ${host}:${port}`);
    return r;
  }

  test('service waypoint: sleep → echo\'s VIP goes through the Envoy waypoint; node-b authorizes the waypoint\'s identity', async () => {
    const [e0, b0, accepted0] = [await envoyPath(), await inbound('echo'), echo.stats.accepted];
    const r = await roundTrip(ECHO_VIP, SERVICE_PORT, 256 * 1024, 1);

    // node-a sent it over HBONE to the waypoint (by the waypoint service's VIP → its one endpoint), :authority the
    // VIP, expecting the waypoint's identity.
    const out = await a.waitForLog((l) => l.target === 'access' && l.message === 'connection complete' && l['src.addr'] === r.local, {
      message: 'node-a\'s outbound access log of the connection',
    });
    assert.equal(out['dst.addr'], `${ECHO_VIP}:${SERVICE_PORT}`);
    assert.equal(out['dst.hbone_addr'], `${WAYPOINT}:15008`);
    assert.equal(out['dst.identity'], ID.waypoint);
    assert.equal(out['dst.workload'], 'waypoint');
    assert.equal(out['dst.service'], ECHO_HOST);

    // Envoy terminated the CONNECT, dispatched it by the VIP to the service's cluster, and originated HBONE.
    const e1 = await envoyPath();
    assert.equal(e1.terminated - e0.terminated, 1, `CONNECTs terminated by the waypoint: ${JSON.stringify(e1.all)}`);
    assert.equal(e1.vipChain - e0.vipChain, 1, `connections through the ${VIP_CLUSTER} chain: ${JSON.stringify(e1.all)}`);
    assert.equal(e1.directChain - e0.directChain, 0, 'nothing through the direct-workload chain');
    assert.equal(e1.originated - e0.originated, 1, `CONNECTs originated by the waypoint: ${JSON.stringify(e1.all)}`);

    // node-b authorized it as the waypoint (the policy admits nothing else), from the waypoint's IP, to echo:8080.
    const inb = await b.waitForLog((l) => l.target === 'access' && l.message === 'connection complete' && l['dst.addr'] === `${ECHO}:${PORT}`, {
      message: 'node-b\'s inbound access log of the connection',
    });
    assert.equal(inb['src.identity'], ID.waypoint);
    assert.equal((inb['src.addr'] as string).split(':')[0], WAYPOINT, 'the waypoint dials from its own IP');
    assert.equal(inb.bytes_recv, 256 * 1024);
    const b1 = await waitFor(async () => {
      const x = await inbound('echo');
      return x.waypoint.opened > b0.waypoint.opened && x;
    }, { message: 'node-b counting the connection from the waypoint' });
    assert.equal(b1.waypoint.opened - b0.waypoint.opened, 1);
    assert.equal(b1.sleep.opened - b0.sleep.opened, 0, 'no connection reached node-b as sleep');
    assert.deepEqual(b1.sourceWorkloads, ['waypoint'], 'node-b knows the source workload: the waypoint');
    assert.equal(echo.stats.accepted - accepted0, 1, 'echo accepted the connection');
  });

  test('workload waypoint: sleep → echo-w\'s own IP goes through the Envoy waypoint (its direct-workload chain)', async () => {
    const [e0, b0, accepted0] = [await envoyPath(), await inbound('echo-w'), echoW.stats.accepted];
    const r = await roundTrip(ECHO_W, PORT, 64 * 1024, 2);

    const out = await a.waitForLog((l) => l.target === 'access' && l.message === 'connection complete' && l['src.addr'] === r.local, {
      message: 'node-a\'s outbound access log of the connection',
    });
    assert.equal(out['dst.addr'], `${ECHO_W}:${PORT}`);
    assert.equal(out['dst.hbone_addr'], `${WAYPOINT}:15008`);
    assert.equal(out['dst.identity'], ID.waypoint);
    assert.equal(out['dst.service'], undefined, 'addressed as a workload, not a service');

    const e1 = await envoyPath();
    assert.equal(e1.terminated - e0.terminated, 1, `CONNECTs terminated by the waypoint: ${JSON.stringify(e1.all)}`);
    assert.equal(e1.directChain - e0.directChain, 1, `connections through the direct-workload chain: ${JSON.stringify(e1.all)}`);
    assert.equal(e1.vipChain - e0.vipChain, 0, 'nothing through the service chain');
    assert.equal(e1.originated - e0.originated, 1);

    const inb = await b.waitForLog((l) => l.target === 'access' && l.message === 'connection complete' && l['dst.addr'] === `${ECHO_W}:${PORT}`, {
      message: 'node-b\'s inbound access log of the connection',
    });
    assert.equal(inb['src.identity'], ID.waypoint);
    assert.equal((inb['src.addr'] as string).split(':')[0], WAYPOINT);
    const b1 = await waitFor(async () => {
      const x = await inbound('echo-w');
      return x.waypoint.opened > b0.waypoint.opened && x;
    }, { message: 'node-b counting the connection from the waypoint' });
    assert.equal(b1.waypoint.opened - b0.waypoint.opened, 1);
    assert.equal(b1.sleep.opened - b0.sleep.opened, 0);
    assert.equal(echoW.stats.accepted - accepted0, 1, 'echo-w accepted the connection');
  });

  test('bypassing the waypoint is refused by the destination policy; the waypoint\'s identity is admitted', async () => {
    // 1. sleep addresses echo's pod IP. echo has no workload waypoint, so node-a goes direct, as sleep: node-b
    //    answers 401, node-a replies SOCKS5 2 (not allowed), and neither the waypoint nor echo sees anything.
    const [e0, b0, accepted0] = [await envoyPath(), await inbound('echo'), echo.stats.accepted];
    const refused = await socks5Request({ socks: SOCKS, dest: { host: ECHO, port: PORT } });
    refused.socket?.destroy();
    assert.equal(refused.code, 2, `SOCKS5 reply for sleep → ${ECHO}:${PORT} (error: ${refused.error?.message})`);
    const denied = await b.waitForLog((l) => l.message === 'connection denied' && l['src.identity'] === ID.sleep && l['dst.addr'] === `${ECHO}:${PORT}`, {
      message: 'node-b denying sleep',
    });
    assert.match(denied.error as string, /none allowed/, 'denied for want of an ALLOW match (only-waypoint)');
    const b1 = await waitFor(async () => {
      const x = await inbound('echo');
      return x.sleep.denied > b0.sleep.denied && x;
    }, { message: 'node-b counting the denial of sleep' });
    assert.equal(b1.sleep.denied - b0.sleep.denied, 1);
    assert.equal(b1.waypoint.opened - b0.waypoint.opened, 0);
    const e1 = await envoyPath();
    assert.equal(e1.terminated - e0.terminated, 0, 'the direct attempt did not touch the waypoint');
    assert.equal(echo.stats.accepted - accepted0, 0, 'echo saw nothing');

    // 2. An HBONE CONNECT straight to node-b for echo-w (which has a workload waypoint), presenting sleep's identity:
    //    401. The same request presenting the waypoint's identity: 200. Only the identity differs.
    const ca = builtinCa(caDir).certPem;
    const connectAs = async (identityLeaf: Leaf) => {
      const session = await hboneSession({ host: ECHO_W, cert: identityLeaf.chainPem, key: identityLeaf.keyPem, ca, expectServerId: spiffe('default', 'echo') });
      try {
        const res = await connectRequest(session, `${ECHO_W}:${PORT}`);
        res.stream?.close();
        return res.status;
      } finally {
        session.close();
      }
    };
    const leafDir = join(tmp, 'leaves');
    mkdirSync(leafDir, { recursive: true });
    assert.equal(await connectAs(builtinLeaf(leafDir, caDir, [ID.sleep], 'direct-sleep')), 401, 'sleep\'s identity, straight to node-b');
    assert.equal(await connectAs(builtinLeaf(leafDir, caDir, [ID.waypoint], 'direct-waypoint')), 200, 'the waypoint\'s identity, straight to node-b');
  });
}
