// HBONE against an independent implementation: Node's own `tls` + `http2`, with certificates made by openssl
// from the built-in CA's root in LOCAL_CA_DIR. One daemon (node-a) hosts `sleep` and `echo`; `peer` is a workload
// the state places on node-b, which has no daemon: the test plays node-b with a Node HTTP/2 server.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { constants as h2c } from 'node:http2';
import type { ClientHttp2Session, OutgoingHttpHeaders } from 'node:http2';
import type { TLSSocket } from 'node:tls';
import { socks5Connect } from '../../dist/cli/socks5-client.js';
import { makeTempDir, removeTempDir, settled, startDaemon, workload } from '../helpers/daemon.js';
import type { Daemon } from '../helpers/daemon.js';
import { connectRequest, hboneSession, request, spiffeSans, startHboneServer } from '../helpers/hbone.js';
import { BLOCKS, block, closeSocket, echoOnce, pattern, readAll, sha256, startCountingServer, startEchoServer, startStallingRelay } from '../helpers/net.js';
import { builtinCa, builtinLeaf, spiffe } from '../helpers/pki.js';
import type { Leaf } from '../helpers/pki.js';

const net = block(BLOCKS['hbone-peer']);
const SLEEP_IP = net.workload(1);
const ECHO_IP = net.workload(2);
const PEER_IP = net.workload(3);
/** A peer on node-b reached through a relay that can go silent (a node that vanished), and where its server runs. */
const GHOST_IP = net.workload(4);
const GHOST_BACKEND_IP = net.workload(5);
/** A peer on node-b whose HBONE server refuses streams (REFUSED_STREAM), as a daemon handing its connection over does. */
const REFUSER_IP = net.workload(6);
const ECHO_PORT = 8080;
const REFUSED_PORT = 8083;
const PEER_APP_PORT = 9000;

const ECHO_ID = spiffe('default', 'echo');
const SLEEP_ID = spiffe('default', 'sleep');
const PEER_ID = spiffe('default', 'peer');
const GHOST_ID = spiffe('default', 'ghost');
const CLIENT_ID = spiffe('default', 'client');

const CONFIG = {
  workloads: [
    workload({ name: 'sleep', ip: SLEEP_IP, node: 'node-a' }),
    workload({ name: 'echo', ip: ECHO_IP, node: 'node-a' }),
    workload({ name: 'peer', ip: PEER_IP, node: 'node-b' }),
    workload({ name: 'ghost', ip: GHOST_IP, node: 'node-b' }),
    workload({ name: 'refuser', ip: REFUSER_IP, node: 'node-b' }),
  ],
};

let daemon: Daemon;
let caDir: string;
let certDir: string;
let root: string;
let clientCert: Leaf;
const closers: (() => Promise<void>)[] = [];

after(async () => {
  await Promise.all([daemon?.kill(), ...closers.map((c) => c())]);
  for (const d of [caDir, certDir]) if (d) removeTempDir(d);
});

before(async () => {
  caDir = makeTempDir('ztn-peer-ca-');
  certDir = makeTempDir('ztn-peer-certs-');
  const echo = await startEchoServer(ECHO_IP, ECHO_PORT);
  closers.push(echo.close);
  daemon = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(1) });
  // The daemon created the built-in CA; openssl signs our peers' certificates with that same root.
  root = builtinCa(caDir).certPem;
  clientCert = builtinLeaf(certDir, caDir, [CLIENT_ID], 'client');
});

async function clientSession(): Promise<ClientHttp2Session> {
  const session = await hboneSession({ host: ECHO_IP, cert: clientCert.certPem, key: clientCert.keyPem, ca: root, expectServerId: ECHO_ID });
  return session;
}

test('as a client: CONNECT to the workload\'s own ip:port answers 200, and the tunnel echoes', async (t) => {
  const session = await clientSession();
  t.after(() => session.close());
  // An HBONE session runs over TLS.
  const sock = session.socket as TLSSocket;
  assert.equal(sock.alpnProtocol, 'h2');
  assert.equal(sock.getProtocol(), 'TLSv1.3');
  assert.deepEqual(spiffeSans(sock.getPeerCertificate()), [ECHO_ID], 'the daemon presents echo\'s identity');

  const before0 = await daemon.metric('istio_tcp_connections_opened_total', { reporter: 'destination', source_principal: CLIENT_ID });
  const r = await connectRequest(session, `${ECHO_IP}:${ECHO_PORT}`);
  assert.equal(r.status, 200, r.error?.message);
  const payload = pattern(300_000, 11);
  const back = readAll(r.stream);
  r.stream.end(payload);
  const got = await back;
  assert.equal(got.bytes, payload.length);
  assert.equal(got.sha256, sha256(payload));
  // The daemon took the identity from our certificate (the only place it may come from).
  await settled(daemon, 'destination');
  const opened = await daemon.metric('istio_tcp_connections_opened_total', { reporter: 'destination', source_principal: CLIENT_ID, destination_principal: ECHO_ID });
  assert.equal(opened, before0 + 1);
});

test('as a client: what the daemon refuses, and with which status', async (t) => {
  const session = await clientSession();
  t.after(() => session.close());
  const cases: [string, OutgoingHttpHeaders, number][] = [
    ['GET', { ':method': 'GET', ':scheme': 'https', ':path': '/', ':authority': `${ECHO_IP}:${ECHO_PORT}` }, 400],
    ['POST', { ':method': 'POST', ':scheme': 'https', ':path': '/', ':authority': `${ECHO_IP}:${ECHO_PORT}` }, 400],
    ['CONNECT to an IP that is not the workload\'s', { ':method': 'CONNECT', ':authority': `${SLEEP_IP}:${ECHO_PORT}` }, 400],
    ['CONNECT to 127.0.0.1', { ':method': 'CONNECT', ':authority': `127.0.0.1:${ECHO_PORT}` }, 400],
    ['CONNECT to a refused upstream', { ':method': 'CONNECT', ':authority': `${ECHO_IP}:${REFUSED_PORT}` }, 503],
    ['CONNECT to port 15008', { ':method': 'CONNECT', ':authority': `${ECHO_IP}:15008` }, 503],
    ['CONNECT to port 15080', { ':method': 'CONNECT', ':authority': `${ECHO_IP}:15080` }, 503],
  ];
  for (const [what, headers, want] of cases) {
    const r = await request(session, headers);
    assert.equal(r.status, want, `${what}: ${r.error?.message ?? ''}`);
    r.stream?.close();
  }
  // The refusals did not break the connection: a good CONNECT still works on it.
  const ok = await connectRequest(session, `${ECHO_IP}:${ECHO_PORT}`);
  assert.equal(ok.status, 200);
  const back = readAll(ok.stream, { keep: true });
  ok.stream.end('still here');
  assert.equal((await back).data.toString(), 'still here');
});

test('as a server: our daemon\'s CONNECT carries the authority, baggage, forwarded and traceparent, and echoes', async () => {
  const app = await startCountingServer(PEER_IP, PEER_APP_PORT);
  closers.push(app.close);
  const peerCert = builtinLeaf(certDir, caDir, [PEER_ID], 'peer');
  const peer = await startHboneServer({ host: PEER_IP, cert: peerCert.certPem, key: peerCert.keyPem, ca: root });
  closers.push(peer.close);

  const socket = await socks5Connect({ proxyHost: SLEEP_IP, proxyPort: 15080, destHost: PEER_IP, destPort: PEER_APP_PORT });
  const client = `${socket.localAddress}:${socket.localPort}`;
  await echoOnce(socket, 'through a Node HBONE server\n');
  await echoOnce(socket, 'and again\n');
  await closeSocket(socket);

  assert.equal(peer.record.streams.length, 1, 'one CONNECT stream for one connection');
  const s = peer.record.streams[0];
  const h = s.headers;
  assert.equal(h[':method'], 'CONNECT');
  assert.equal(h[':authority'], `${PEER_IP}:${PEER_APP_PORT}`);
  assert.equal(h[':scheme'], undefined, 'no :scheme (authority-form CONNECT)');
  assert.equal(h[':path'], undefined, 'no :path (authority-form CONNECT)');
  assert.equal(h.baggage, 'k8s.cluster.name=Kubernetes,k8s.namespace.name=default,k8s.deployment.name=sleep,service.name=sleep,service.version=v1');
  assert.equal(h.forwarded, `for="${client}"`);
  assert.match(h.traceparent as string, /^00-[0-9a-f]{32}-[0-9a-f]{16}-00$/);
  const names = Object.keys(h).filter((k) => typeof h[k] === 'string').sort();
  assert.deepEqual(names, [':authority', ':method', 'baggage', 'forwarded', 'traceparent'], 'no other headers');
  // mTLS: TLS 1.3, h2, sleep's certificate, dialed from sleep's IP.
  assert.equal(s.protocol, 'TLSv1.3');
  assert.equal(s.alpn, 'h2');
  assert.deepEqual(spiffeSans(s.peerCert), [SLEEP_ID]);
  assert.equal(s.remoteAddress, SLEEP_IP);
  assert.equal(app.stats.accepted, 0, 'the bytes went through the HBONE server, not straight to the app');

  const ma = await settled(daemon, 'source');
  // The request direction (client -> server) is istio_tcp_received_bytes_total on both reporters, as in ztunnel.
  const outbound = ma.filter((x) => x.name === 'istio_tcp_received_bytes_total' && x.labels.destination_workload === 'peer');
  assert.equal(outbound.length, 1);
  assert.equal(outbound[0].labels.destination_principal, PEER_ID);
  assert.equal(outbound[0].labels.connection_security_policy, 'mutual_tls');
  assert.equal(outbound[0].value, 'through a Node HBONE server\nand again\n'.length);
});

test('a stream the peer refuses (REFUSED_STREAM: not processed) is asked again once, on a new connection; refused twice, the connection fails', async () => {
  const cert = builtinLeaf(certDir, caDir, [spiffe('default', 'refuser')], 'refuser');
  let refuse = 1;
  const peer = await startHboneServer({
    host: REFUSER_IP,
    cert: cert.certPem,
    key: cert.keyPem,
    ca: root,
    onStream: (stream) => {
      if (refuse > 0) {
        refuse -= 1;
        stream.close(h2c.NGHTTP2_REFUSED_STREAM);
        return;
      }
      stream.respond({ ':status': 200 });
      stream.pipe(stream);
    },
  });
  closers.push(peer.close);
  const socket = await socks5Connect({ proxyHost: SLEEP_IP, proxyPort: 15080, destHost: REFUSER_IP, destPort: PEER_APP_PORT });
  await echoOnce(socket, 'asked twice, answered once\n');
  await closeSocket(socket);
  assert.equal(peer.record.streams.length, 2, 'the refused stream was asked again');
  assert.equal(peer.record.sessions, 2, 'on another connection: the refusing one takes no new stream');

  refuse = 2;
  await assert.rejects(
    socks5Connect({ proxyHost: SLEEP_IP, proxyPort: 15080, destHost: REFUSER_IP, destPort: PEER_APP_PORT }),
    'refused again on the retry: the client is refused',
  );
  assert.equal(peer.record.streams.length, 4, 'one retry, not more');
  assert.equal(refuse, 0);
});

test('a peer node that goes silent is found dead by the keepalive (≤ 30 s); its tunnel is not reused and a new occupant of its IP gets nothing', { timeout: 90_000 }, async () => {
  const ghostCert = builtinLeaf(certDir, caDir, [GHOST_ID], 'ghost');
  const backend = await startHboneServer({ host: GHOST_BACKEND_IP, cert: ghostCert.certPem, key: ghostCert.keyPem, ca: root });
  closers.push(backend.close);
  const relay = await startStallingRelay({ host: GHOST_IP, port: 15008 }, { host: GHOST_BACKEND_IP, port: 15008 });
  closers.push(relay.close);
  const opened0 = await daemon.metric('ztunnel_node_hbone_connections_opened_total', { direction: 'outbound' });
  const socket = await socks5Connect({ proxyHost: SLEEP_IP, proxyPort: 15080, destHost: GHOST_IP, destPort: PEER_APP_PORT });
  await echoOnce(socket, 'before the node vanishes\n');
  assert.equal(await daemon.metric('ztunnel_node_hbone_connections_opened_total', { direction: 'outbound' }), opened0 + 1);
  // The node vanishes: nothing it sends arrives any more (no PING answer, no data, no FIN).
  const closed = new Promise((resolve) => {
    socket.on('error', () => undefined);
    socket.once('close', resolve);
  });
  relay.stall();
  const stalledAt = performance.now();
  await closed;
  const secs = (performance.now() - stalledAt) / 1000;
  assert.ok(secs <= 32, `the tunnel over the dead connection ended ${secs.toFixed(1)} s after the node went silent`);
  // A new occupant of the address (another pod, another identity) gets no CONNECT: the old tunnel is gone, and a
  // new one must present ghost's identity.
  await relay.close();
  const occupantCert = builtinLeaf(certDir, caDir, [spiffe('default', 'occupant')], 'occupant');
  const occupant = await startHboneServer({ host: GHOST_IP, cert: occupantCert.certPem, key: occupantCert.keyPem, ca: root });
  closers.push(occupant.close);
  await assert.rejects(socks5Connect({ proxyHost: SLEEP_IP, proxyPort: 15080, destHost: GHOST_IP, destPort: PEER_APP_PORT }));
  assert.equal(occupant.record.streams.length, 0, 'no stream reached the new occupant');
  assert.equal(await daemon.metric('ztunnel_node_hbone_connections_opened_total', { direction: 'outbound' }), opened0 + 1, 'no HBONE connection to the occupant was established');
  assert.equal(backend.record.streams.length, 1, 'the one stream of before');
});

test('the daemon exits 0 on SIGTERM', async () => {
  assert.equal((await daemon.stop()).code, 0);
});
