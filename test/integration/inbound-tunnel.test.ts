// Inbound HBONE beyond `ip:port`, end to end against real local-mode daemons, with raw CONNECTs from Node's own
// `tls` + `http2` (test/helpers/hbone.ts) and a client certificate that openssl signs with the built-in CA's root:
//
//   - a hostname `:authority` names a service; its port maps to the endpoint's target port (unknown → 503);
//   - an application tunnel speaking PROXY: the daemon dials 127.0.0.1:<tunnel port> from 127.0.0.1 and starts the
//     stream with a PROXY protocol v2 header, which this file parses with its own parser, written from HAProxy's
//     specification (proxy-protocol.txt §2.2), sharing nothing with the daemon's ppp-based writer;
//   - the waypoint "sandwich": a VIP (or workload) whose waypoint is the local workload is accepted, others 400;
//   - ENABLE_RESPONSE_BAGGAGE: the 200 carries the destination's baggage, unless it is false (a second daemon).
//
// node-a serves echo, wp (the PROXY tunnel) and wp2 (a waypoint without a tunnel); node-q, started with
// ENABLE_RESPONSE_BAGGAGE=false, serves quiet. Both read the same document.
import { after, before, test } from 'node:test';
import type { TestContext } from 'node:test';
import assert from 'node:assert/strict';
import type { ClientHttp2Session } from 'node:http2';
import { makeTempDir, removeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import type { Daemon } from '../helpers/daemon.js';
import { connectRequest, hboneSession } from '../helpers/hbone.js';
import type { ResponseHeaders } from '../helpers/hbone.js';
import { BLOCKS, block, pattern, readAll, startEchoServer, startServer } from '../helpers/net.js';
import type { ConnectionRecord, TestServer } from '../helpers/net.js';
import { builtinCa, builtinLeaf, spiffe } from '../helpers/pki.js';
import type { Leaf } from '../helpers/pki.js';

const net = block(BLOCKS['inbound-tunnel']);
const ECHO_IP = net.workload(1);
const WP_IP = net.workload(2);
const WP2_IP = net.workload(3);
const QUIET_IP = net.workload(4);
const DB_IP = net.workload(5); // on a node nobody serves: only its waypoint matters
const VIP = { echo: '127.65.100.1', reviews: '127.65.100.2', ratings: '127.65.100.3', wp: '127.65.100.10', wp2: '127.65.100.11' };
const ECHO_HOST = 'echo.default.svc.cluster.local';
const REVIEWS_HOST = 'reviews.default.svc.cluster.local';
const WP_HOST = 'wp.default.svc.cluster.local';
const WP2_HOST = 'wp2.default.svc.cluster.local';
const APP_PORT = 8080;
const WAYPOINTED_PORT = 9080;
/** The application tunnel's port: on 127.0.0.1, by design (LOCALHOST_APP_TUNNEL), so outside the block. */
const TUNNEL_PORT = 15088;

const SLEEP_ID = spiffe('default', 'sleep');
const ID = { echo: spiffe('default', 'echo'), wp: spiffe('default', 'wp'), wp2: spiffe('default', 'wp2'), quiet: spiffe('default', 'quiet') };

const waypointVia = (host: string): { destination: string; hboneMtlsPort: number } => ({ destination: `default/${host}`, hboneMtlsPort: 15008 });

// As istiod describes it: a waypoint is a workload that is an endpoint of a service on 15008, and a service or a
// workload names that service's hostname as its waypoint.
const CONFIG = {
  workloads: [
    workload({ name: 'echo', ip: ECHO_IP, node: 'node-a', services: { [`default/${ECHO_HOST}`]: { 80: APP_PORT } } }),
    workload({
      name: 'wp',
      ip: WP_IP,
      node: 'node-a',
      applicationTunnel: { protocol: 'PROXY', port: TUNNEL_PORT },
      services: { [`default/${WP_HOST}`]: { 15008: 15008 } },
    }),
    workload({ name: 'wp2', ip: WP2_IP, node: 'node-a', services: { [`default/${WP2_HOST}`]: { 15008: 15008 } } }),
    workload({ name: 'quiet', ip: QUIET_IP, node: 'node-q' }),
    workload({ name: 'db', ip: DB_IP, node: 'node-z', waypoint: waypointVia(WP2_HOST) }),
  ],
  services: [
    { name: 'echo', namespace: 'default', hostname: ECHO_HOST, vips: [`/${VIP.echo}`], ports: { 80: APP_PORT } },
    {
      name: 'reviews', namespace: 'default', hostname: REVIEWS_HOST, vips: [`/${VIP.reviews}`],
      ports: { [WAYPOINTED_PORT]: WAYPOINTED_PORT }, waypoint: waypointVia(WP_HOST),
    },
    {
      name: 'ratings', namespace: 'default', hostname: 'ratings.default.svc.cluster.local', vips: [`/${VIP.ratings}`],
      ports: { [WAYPOINTED_PORT]: WAYPOINTED_PORT }, waypoint: waypointVia(WP2_HOST),
    },
    { name: 'wp', namespace: 'default', hostname: WP_HOST, vips: [`/${VIP.wp}`], ports: { 15008: 15008 } },
    { name: 'wp2', namespace: 'default', hostname: WP2_HOST, vips: [`/${VIP.wp2}`], ports: { 15008: 15008 } },
  ],
};

// ---- PROXY protocol v2, from the HAProxy specification (not from the daemon's code) ------------------------------

const PP2_SIGNATURE = Buffer.from('0D0A0D0A000D0A515549540A', 'hex');
const PP2_TYPE_PEER_IDENTITY = 0xd0; // Istio's TLV: the peer's SPIFFE identity

function formatIPv6(b: Buffer): string {
  if (b.subarray(0, 10).every((x) => x === 0) && b[10] === 0xff && b[11] === 0xff) return `::ffff:${[...b.subarray(12)].join('.')}`;
  const groups: number[] = [];
  for (let i = 0; i < 16; i += 2) groups.push(b.readUInt16BE(i));
  // RFC 5952: the longest run (≥ 2) of zero groups becomes "::".
  let best = { at: -1, len: 1 };
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) { i++; continue; }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > best.len) best = { at: i, len: j - i };
    i = j;
  }
  const hex = groups.map((g) => g.toString(16));
  if (best.at < 0) return hex.join(':');
  return `${hex.slice(0, best.at).join(':')}::${hex.slice(best.at + best.len).join(':')}`;
}

/** An address of a PROXY v2 header. */
interface ProxyAddress {
  ip: string;
  port: number;
}

/** A parsed PROXY v2 header (see parseProxyV2). */
interface ProxyHeader {
  command: number;
  family: number;
  transport: number;
  src: ProxyAddress | undefined;
  dst: ProxyAddress | undefined;
  tlvs: { type: number; value: Buffer }[];
  rest: Buffer;
}

/**
 * Parses one PROXY protocol v2 header at the start of `buf`: { command, family, transport, src, dst, tlvs, rest }
 * (addresses as { ip, port }; tlvs as [{ type, value }] in order; rest = the bytes after the header). Throws on
 * anything the specification does not allow or this file does not expect.
 */
function parseProxyV2(buf: Buffer): ProxyHeader {
  if (buf.length < 16) throw new Error(`${buf.length} bytes: shorter than a PROXY v2 header`);
  if (!buf.subarray(0, 12).equals(PP2_SIGNATURE)) throw new Error(`no PROXY v2 signature: ${buf.subarray(0, 16).toString('hex')}`);
  const version = buf[12] >> 4;
  const command = buf[12] & 0x0f;
  if (version !== 2) throw new Error(`version ${version}, not 2`);
  if (command > 1) throw new Error(`command ${command} is neither LOCAL (0) nor PROXY (1)`);
  const family = buf[13] >> 4; // 0 UNSPEC, 1 INET, 2 INET6, 3 UNIX
  const transport = buf[13] & 0x0f; // 0 UNSPEC, 1 STREAM, 2 DGRAM
  const len = buf.readUInt16BE(14);
  const end = 16 + len;
  if (buf.length < end) throw new Error(`header announces ${len} bytes after the first 16, only ${buf.length - 16} arrived`);
  let addrLen: number;
  let src: ProxyAddress | undefined;
  let dst: ProxyAddress | undefined;
  if (family === 1) {
    addrLen = 12;
    if (len < addrLen) throw new Error(`INET needs 12 address bytes, length is ${len}`);
    src = { ip: [...buf.subarray(16, 20)].join('.'), port: buf.readUInt16BE(24) };
    dst = { ip: [...buf.subarray(20, 24)].join('.'), port: buf.readUInt16BE(26) };
  } else if (family === 2) {
    addrLen = 36;
    if (len < addrLen) throw new Error(`INET6 needs 36 address bytes, length is ${len}`);
    src = { ip: formatIPv6(buf.subarray(16, 32)), port: buf.readUInt16BE(48) };
    dst = { ip: formatIPv6(buf.subarray(32, 48)), port: buf.readUInt16BE(50) };
  } else if (family === 0) {
    addrLen = 0;
  } else {
    throw new Error(`address family ${family} not expected here`);
  }
  const tlvs: ProxyHeader['tlvs'] = [];
  for (let off = 16 + addrLen; off < end; ) {
    if (end - off < 3) throw new Error(`${end - off} trailing bytes: not a TLV`);
    const type = buf[off];
    const l = buf.readUInt16BE(off + 1);
    if (off + 3 + l > end) throw new Error(`TLV 0x${type.toString(16)} of ${l} bytes overruns the header`);
    tlvs.push({ type, value: buf.subarray(off + 3, off + 3 + l) });
    off += 3 + l;
  }
  return { command, family, transport, src, dst, tlvs, rest: buf.subarray(end) };
}

// ---- the world ---------------------------------------------------------------------------------------------

const tmp = makeTempDir('ztn-inbound-tunnel-');
let a: Daemon; // node-a: echo, wp, wp2
let q: Daemon; // node-q: quiet, ENABLE_RESPONSE_BAGGAGE=false
let root: string;
let client: Leaf; // sleep's certificate, from the built-in CA
// Started by `before`.
const servers = {} as Record<'echo' | 'tunnel' | 'wp2' | 'quiet', TestServer>;

/** A connection of the recording server: `raw` is every byte it received, once the client's FIN arrived. */
type RecordedConnection = ConnectionRecord & { raw?: Buffer };

/** A server that keeps every byte of each connection and, at the client's FIN, answers `got <n>` and closes. */
function startRecordingServer(host: string, port: number): Promise<TestServer> {
  return startServer(host, port, (socket, record: RecordedConnection) => {
    const chunks: Buffer[] = [];
    socket.on('data', (c) => chunks.push(c));
    socket.on('end', () => {
      record.raw = Buffer.concat(chunks);
      socket.end(`got ${record.raw.length}`);
    });
  });
}

before(async () => {
  const caDir = `${tmp}/ca`;
  [servers.echo, servers.tunnel, servers.wp2, servers.quiet] = await Promise.all([
    startEchoServer(ECHO_IP, APP_PORT),
    startRecordingServer('127.0.0.1', TUNNEL_PORT),
    startEchoServer(WP2_IP, WAYPOINTED_PORT),
    startEchoServer(QUIET_IP, APP_PORT),
  ]);
  // The built-in CA's root is created under a file lock: both daemons may start at once.
  [a, q] = await Promise.all([
    startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(1) }),
    startDaemon({ node: 'node-q', config: CONFIG, caDir, adminIp: net.admin(2), env: { ENABLE_RESPONSE_BAGGAGE: 'false' } }),
  ]);
  root = builtinCa(caDir).certPem;
  client = builtinLeaf(tmp, caDir, [SLEEP_ID], 'sleep');
});

after(async () => {
  await Promise.allSettled([a?.kill(), q?.kill(), ...Object.values(servers).map((s) => s.close())]);
  removeTempDir(tmp);
});

async function sessionTo(t: TestContext, ip: string, serverId: string): Promise<ClientHttp2Session> {
  const session = await hboneSession({ host: ip, cert: client.certPem, key: client.keyPem, ca: root, expectServerId: serverId });
  t.after(() => session.close());
  return session;
}

/** What `exchange` resolves: headers and data only when the CONNECT was answered 200. */
interface Exchange {
  status: number | null;
  headers?: ResponseHeaders;
  data?: Buffer;
  error?: NodeJS.ErrnoException;
}

/** CONNECT, send `payload` and our FIN, read to the end: { status, headers, data }. */
async function exchange(session: ClientHttp2Session, authority: string, payload: string | Buffer): Promise<Exchange> {
  const r = await connectRequest(session, authority);
  if (r.status !== 200) {
    r.stream?.close();
    return { status: r.status, error: r.error };
  }
  const back = readAll(r.stream, { keep: true });
  r.stream.end(payload);
  const got = await back;
  return { status: r.status, headers: r.headers, data: got.data, error: got.error };
}

/** Status of a CONNECT that must be refused (the stream is closed either way). */
async function statusOf(session: ClientHttp2Session, authority: string): Promise<number | string> {
  const r = await connectRequest(session, authority);
  r.stream?.close();
  return r.status ?? `no status (${r.error?.message})`;
}

const baggageOf = (name: string): string =>
  `k8s.cluster.name=Kubernetes,k8s.namespace.name=default,k8s.deployment.name=${name},service.name=${name},service.version=v1`;

// ---- the tests ---------------------------------------------------------------------------------------------

test('the PROXY v2 parser of this file reads the specification\'s layout and refuses what it must', () => {
  // Built byte by byte from the specification: INET/STREAM, 10.0.0.1:41000 → 10.96.0.10:80, TLV 0xD0 "id", data.
  const v4 = Buffer.concat([
    PP2_SIGNATURE, Buffer.from([0x21, 0x11, 0x00, 12 + 5]),
    Buffer.from([10, 0, 0, 1, 10, 96, 0, 10, 0xa0, 0x28, 0x00, 0x50]),
    Buffer.from([0xd0, 0x00, 0x02]), Buffer.from('id'), Buffer.from('DATA'),
  ]);
  const p = parseProxyV2(v4);
  assert.deepEqual(
    { command: p.command, family: p.family, transport: p.transport, src: p.src, dst: p.dst },
    { command: 1, family: 1, transport: 1, src: { ip: '10.0.0.1', port: 41000 }, dst: { ip: '10.96.0.10', port: 80 } },
  );
  assert.deepEqual(p.tlvs.map((x) => [x.type, x.value.toString()]), [[0xd0, 'id']]);
  assert.equal(p.rest.toString(), 'DATA');
  const v6 = Buffer.concat([
    PP2_SIGNATURE, Buffer.from([0x21, 0x21, 0x00, 36]),
    Buffer.from('00000000000000000000ffff0a000001', 'hex'), Buffer.from('fd000000000000000000000000000001', 'hex'),
    Buffer.from([0x00, 0x01, 0x00, 0x02]),
  ]);
  assert.deepEqual([parseProxyV2(v6).src, parseProxyV2(v6).dst], [{ ip: '::ffff:10.0.0.1', port: 1 }, { ip: 'fd00::1', port: 2 }]);
  const broken = (f: (b: Buffer) => void): Buffer => { const b = Buffer.from(v4); f(b); return b; };
  assert.throws(() => parseProxyV2(broken((b) => (b[11] = 0x0b))), /signature/);
  assert.throws(() => parseProxyV2(broken((b) => (b[12] = 0x11))), /version 1/);
  assert.throws(() => parseProxyV2(broken((b) => (b[14] = 1))), /only/, 'a length beyond the bytes that arrived');
  assert.throws(() => parseProxyV2(broken((b) => (b[30] = 0x09))), /overruns/);
  assert.throws(() => parseProxyV2(Buffer.from('PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n')), /signature/, 'v1 text is not v2');
});

test('hostname :authority: the service\'s port maps to the endpoint; unknown hostnames and ports are 503', async (t) => {
  const session = await sessionTo(t, ECHO_IP, ID.echo);
  const accepted = servers.echo.stats.accepted;
  const payload = pattern(64 * 1024, 3);
  const r = await exchange(session, `${ECHO_HOST}:80`, payload);
  assert.equal(r.status, 200, r.error?.message);
  // Nothing listens on echo's :80: the bytes came back from :8080, the service's target port.
  assert.ok(r.data!.equals(payload), `echoed ${r.data?.length} bytes, not the ${payload.length} sent`);
  assert.equal(servers.echo.stats.accepted, accepted + 1, 'one upstream connection to echo:8080');
  assert.equal(r.headers!.baggage, baggageOf('echo'), 'ENABLE_RESPONSE_BAGGAGE defaults to true: echo\'s baggage');

  assert.equal(await statusOf(session, `nope.default.svc.cluster.local:80`), 503, 'an unknown hostname');
  assert.equal(await statusOf(session, `${ECHO_HOST}:81`), 503, 'a port the service does not have');
  assert.equal(servers.echo.stats.accepted, accepted + 1, 'the refused CONNECTs reached no application');
  // The refusals did not spoil the connection.
  assert.equal((await exchange(session, `${ECHO_HOST}:80`, 'again')).data!.toString(), 'again');
});

test('application tunnel: PROXY v2 on 127.0.0.1:15088 from 127.0.0.1, naming the client, the authority and the identity', async (t) => {
  const session = await sessionTo(t, WP_IP, ID.wp);
  // The client as the daemon saw it: our end of the TCP connection under TLS.
  const me = { ip: session.socket.localAddress, port: session.socket.localPort };
  const cases: [string, string, ProxyAddress][] = [
    // [why, authority, the destination the header must name]
    ['wp\'s own IP', `${WP_IP}:${WAYPOINTED_PORT}`, { ip: WP_IP, port: WAYPOINTED_PORT }],
    ['the sandwich: a VIP whose waypoint (by hostname) is wp', `${VIP.reviews}:${WAYPOINTED_PORT}`, { ip: VIP.reviews, port: WAYPOINTED_PORT }],
    ['a service hostname: named by its VIP', `${REVIEWS_HOST}:${WAYPOINTED_PORT}`, { ip: VIP.reviews, port: WAYPOINTED_PORT }],
  ];
  for (const [i, [why, authority, dst]] of cases.entries()) {
    const seen = servers.tunnel.stats.connections.length;
    // Bytes that would confuse a reader that scans for the header instead of parsing it: the signature itself.
    const payload = Buffer.concat([PP2_SIGNATURE, pattern(20_000 + i, 20 + i)]);
    const r = await exchange(session, authority, payload);
    assert.equal(r.status, 200, `${why}: ${r.error?.message ?? ''}`);
    assert.equal(servers.tunnel.stats.connections.length, seen + 1, `${why}: one connection to the tunnel`);
    const conn: RecordedConnection = servers.tunnel.stats.connections[seen];
    assert.match(conn.remote, /^127\.0\.0\.1:\d+$/, `${why}: the daemon connects from loopback`);
    const h = parseProxyV2(conn.raw!);
    assert.equal(h.command, 1, `${why}: command PROXY`);
    assert.equal(h.family, 1, `${why}: AF_INET`);
    assert.equal(h.transport, 1, `${why}: STREAM`);
    assert.deepEqual(h.src, me, `${why}: the source is the client's address as the daemon saw it`);
    assert.notEqual(conn.remote, `${me.ip}:${me.port}`, `${why}: (and not the daemon's own upstream socket)`);
    assert.deepEqual(h.dst, dst, `${why}: the destination`);
    assert.deepEqual(h.tlvs.map((x) => [x.type, x.value.toString()]), [[PP2_TYPE_PEER_IDENTITY, SLEEP_ID]], `${why}: TLV 0xD0 = the client's identity`);
    assert.ok(h.rest.equals(payload), `${why}: after the header, exactly the client's ${payload.length} bytes (got ${h.rest.length})`);
    assert.equal(r.data!.toString(), `got ${conn.raw!.length}`, `${why}: the answer counts header + payload`);
  }
});

test('the sandwich without a tunnel: accepted for what wp2 is the waypoint of, 400 for the rest', async (t) => {
  const session = await sessionTo(t, WP2_IP, ID.wp2);
  for (const [why, authority] of [
    ['a VIP whose waypoint (by hostname) is wp2', `${VIP.ratings}:${WAYPOINTED_PORT}`],
    ['a workload whose waypoint (by hostname) is wp2', `${DB_IP}:${WAYPOINTED_PORT}`],
  ]) {
    const accepted = servers.wp2.stats.accepted;
    const r = await exchange(session, authority, `via ${authority}`);
    assert.equal(r.status, 200, `${why}: ${r.error?.message ?? ''}`);
    // No tunnel: the upstream is wp2's own IP and the port of the authority, and no header precedes the bytes.
    assert.equal(r.data!.toString(), `via ${authority}`, `${why}: plain echo`);
    assert.equal(servers.wp2.stats.accepted, accepted + 1, `${why}: one connection to wp2:${WAYPOINTED_PORT}`);
  }
  const accepted = servers.wp2.stats.accepted;
  assert.equal(await statusOf(session, `${VIP.reviews}:${WAYPOINTED_PORT}`), 400, 'a VIP whose waypoint is wp, not wp2');
  assert.equal(await statusOf(session, `${VIP.echo}:80`), 400, 'a VIP with no waypoint');
  assert.equal(await statusOf(session, `${ECHO_IP}:${APP_PORT}`), 400, 'another workload\'s IP');
  assert.equal(servers.wp2.stats.accepted, accepted, 'the refusals reached no application');

  // echo is nobody's waypoint and has no tunnel: a waypointed VIP is refused there too.
  const toEcho = await sessionTo(t, ECHO_IP, ID.echo);
  assert.equal(await statusOf(toEcho, `${VIP.reviews}:${WAYPOINTED_PORT}`), 400, 'echo is not reviews\' waypoint');
});

test('ENABLE_RESPONSE_BAGGAGE=false: the 200 carries no baggage', async (t) => {
  const session = await sessionTo(t, QUIET_IP, ID.quiet);
  const r = await exchange(session, `${QUIET_IP}:${APP_PORT}`, 'quiet please');
  assert.equal(r.status, 200, r.error?.message);
  assert.equal(r.data!.toString(), 'quiet please');
  assert.equal(r.headers!.baggage, undefined, `node-q answered with baggage ${JSON.stringify(r.headers!.baggage)}`);
  // The same request to node-a (default) does carry it: the difference is the setting, not the workload.
  const toEcho = await sessionTo(t, ECHO_IP, ID.echo);
  const e = await exchange(toEcho, `${ECHO_IP}:${APP_PORT}`, 'loud');
  assert.equal(e.headers!.baggage, baggageOf('echo'));
});

test('both daemons exit 0 on SIGTERM', async () => {
  const [ra, rq] = await Promise.all([a.stop(), q.stop()]);
  assert.deepEqual([ra.code, rq.code], [0, 0]);
});
