// Two daemons on one machine, as two nodes: `sleep` on node-a, `echo` on node-b, both HBONE, one shared built-in
// CA. Applications on echo's IP are plain Node TCP servers; the client is the test, entering the mesh through
// sleep's SOCKS5 listener. Everything asserted is what an operator sees: the bytes the apps got, /metrics of
// both nodes, the access logs, the exit codes.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { join } from 'node:path';
import { sumSamples } from '../../dist/cli/prom-text.js';
import type { Sample } from '../../dist/cli/prom-text.js';
import { socks5Connect } from '../../dist/cli/socks5-client.js';
import type { InPodWorkload } from '../../dist/native/types.js';
import { makeTempDir, removeTempDir, settled, startDaemon, workload } from '../helpers/daemon.js';
import type { Daemon } from '../helpers/daemon.js';
import {
  BLOCKS,
  block,
  closeSocket,
  echoOnce,
  pattern,
  readAll,
  sha256,
  socks5Request,
  socksRoundTrip,
  startEchoServer,
  startGreeterServer,
  startSinkServer,
  httpGet,
  waitFor,
} from '../helpers/net.js';
import type { TestServer } from '../helpers/net.js';

const net = block(BLOCKS.tunnel);

/** The Go toolchain (its `go tool pprof` reads the CPU profile): required under CI, which installs Go. */
const GO = (() => {
  for (const go of ['go', '/usr/local/go/bin/go']) {
    try {
      execFileSync(go, ['version'], { stdio: 'ignore' });
      return go;
    } catch {
      // not this one
    }
  }
  if (process.env.CI) throw new Error('CI: the go toolchain is missing (the CPU profile test reads profiles with go tool pprof)');
  return null;
})();

function httpPost(url: string): Promise<{ status: number | undefined; body: string }> {
  return new Promise((resolve, reject) => {
    httpRequest(url, { method: 'POST', agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }));
      res.on('error', reject);
    })
      .on('error', reject)
      .end();
  });
}

function httpGetBytes(url: string): Promise<{ status: number | undefined; body: Buffer }> {
  return new Promise((resolve, reject) => {
    httpRequest(url, { agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks) }));
      res.on('error', reject);
    })
      .on('error', reject)
      .end();
  });
}
const SLEEP_IP = net.workload(1);
const ECHO_IP = net.workload(2);
const SOCKS = { host: SLEEP_IP, port: 15080 };
const PORT = { echo: 8080, halfClose: 8081, greet: 8082, refused: 8083, report: 8084, service: 8085 };
const dest = (port: number) => ({ host: ECHO_IP, port });

const SLEEP_ID = 'spiffe://cluster.local/ns/default/sa/sleep';
const ECHO_ID = 'spiffe://cluster.local/ns/default/sa/echo';

const HALF_CLOSE_REPLY = pattern(3 * 1024 * 1024 + 17, 7);
const REPORT_REQUEST = pattern(100_000, 3);
const REPORT_REPLY = pattern(54_321, 5);
const GREETING = Buffer.from('hello from the server, goodbye\n');

// echo is the endpoint of one service (VIP port 80 -> PORT.service); the other ports are reached by address only.
const ECHO_HOST = 'echo.default.svc.cluster.local';
const VIP = `${ECHO_IP.split('.').slice(0, 2).join('.')}.200.1`;
const CONFIG = {
  workloads: [
    workload({ name: 'sleep', ip: SLEEP_IP, node: 'node-a', locality: { region: 'region-a', zone: 'zone-a' } }),
    workload({
      name: 'echo',
      ip: ECHO_IP,
      node: 'node-b',
      locality: { region: 'region-b', zone: 'zone-b' },
      services: { [`default/${ECHO_HOST}`]: { 80: PORT.service } },
    }),
  ],
  services: [{ name: 'echo', namespace: 'default', hostname: ECHO_HOST, vips: [`/${VIP}`], ports: { 80: PORT.service } }],
};

let a: Daemon;
let b: Daemon;
let caDir: string | undefined;
const apps: Record<string, TestServer> = {};

// Registered at the top level: hooks registered from inside `before` would run when `before` ends.
after(async () => {
  await Promise.all([a?.kill(), b?.kill(), ...Object.values(apps).map((s) => s.close())]);
  if (caDir) removeTempDir(caDir);
});

before(async () => {
  caDir = makeTempDir('ztn-tunnel-ca-');
  apps.echo = await startEchoServer(ECHO_IP, PORT.echo);
  apps.halfClose = await startSinkServer(ECHO_IP, PORT.halfClose, () => HALF_CLOSE_REPLY);
  apps.greet = await startGreeterServer(ECHO_IP, PORT.greet, GREETING);
  apps.report = await startSinkServer(ECHO_IP, PORT.report, () => REPORT_REPLY);
  apps.service = await startSinkServer(ECHO_IP, PORT.service, () => REPORT_REPLY);
  [a, b] = await Promise.all([
    startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(1) }),
    startDaemon({ node: 'node-b', config: CONFIG, caDir, adminIp: net.admin(2) }),
  ]);
});

for (const size of [1, 1024 * 1024, 64 * 1024 * 1024]) {
  test(`a ${size} byte payload goes SOCKS5 -> HBONE -> echo and comes back intact`, { timeout: 40_000 }, async () => {
    const payload = pattern(size, size % 251);
    const acceptedBefore = apps.echo.stats.accepted;
    const r = await socksRoundTrip({ socks: SOCKS, dest: dest(PORT.echo), payload });
    assert.equal(r.error, undefined, `the tunnel failed: ${r.error?.message}`);
    assert.equal(r.ended, true, 'EOF after the echo');
    assert.equal(r.bytes, size);
    assert.equal(r.sha256, sha256(payload));
    assert.equal(apps.echo.stats.accepted, acceptedBefore + 1, 'exactly one connection reached the echo app');
    const rec = apps.echo.stats.connections.at(-1)!;
    assert.equal(rec.bytes, size, 'the echo app received every byte');
  });
}

test("client half-close: after its FIN the client still gets everything the server sends", async () => {
  const request = pattern(1000, 9);
  const r = await socksRoundTrip({ socks: SOCKS, dest: dest(PORT.halfClose), payload: request });
  assert.equal(r.error, undefined);
  assert.equal(r.ended, true);
  assert.equal(r.bytes, HALF_CLOSE_REPLY.length, 'every byte sent after the client FIN arrived');
  assert.equal(r.sha256, sha256(HALF_CLOSE_REPLY));
  const rec = apps.halfClose.stats.connections.at(-1)!;
  assert.equal(rec.ended, true, 'the app saw the client FIN (it only answers after EOF)');
  assert.equal(rec.bytes, request.length);
  assert.equal(rec.sha256, sha256(request));
});

test('server closes first: the client gets the data then EOF, and both nodes count the connection closed', async () => {
  const [sa, sb] = await Promise.all([settled(a, 'source'), settled(b, 'destination')]);
  const closedA = sumSamples(sa, 'istio_tcp_connections_closed_total', { reporter: 'source' });
  const closedB = sumSamples(sb, 'istio_tcp_connections_closed_total', { reporter: 'destination' });
  const socket = await socks5Connect({ proxyHost: SOCKS.host, proxyPort: SOCKS.port, destHost: ECHO_IP, destPort: PORT.greet });
  // The client never writes: the only FIN that starts the close is the server's.
  const r = await readAll(socket, { keep: true });
  assert.equal(r.error, undefined);
  assert.equal(r.ended, true, 'EOF reached the client');
  assert.equal(r.data.toString(), GREETING.toString());
  const [ma, mb] = await Promise.all([settled(a, 'source'), settled(b, 'destination')]);
  assert.equal(sumSamples(ma, 'istio_tcp_connections_closed_total', { reporter: 'source' }), closedA + 1);
  assert.equal(sumSamples(mb, 'istio_tcp_connections_closed_total', { reporter: 'destination' }), closedB + 1);
  assert.equal(sumSamples(ma, 'istio_tcp_sockets_open', { reporter: 'source' }), 0);
  assert.equal(sumSamples(mb, 'istio_tcp_sockets_open', { reporter: 'destination' }), 0);
});

test("config_dump's workloadState lists a live tunnel on both nodes (local mode), and forgets it once closed", async () => {
  const socket = await socks5Connect({ proxyHost: SOCKS.host, proxyPort: SOCKS.port, destHost: ECHO_IP, destPort: PORT.echo });
  const dump = async (d: Daemon): Promise<Record<string, InPodWorkload>> =>
    JSON.parse((await httpGet(`${d.adminUrl}/config_dump`)).body).workloadState;
  const outbound = () => dump(a).then((s) => s['Kubernetes//Pod/default/sleep']?.connections!.outbound ?? []);
  const inbound = () => dump(b).then((s) => s['Kubernetes//Pod/default/echo']?.connections!.inbound ?? []);
  try {
    await waitFor(async () => (await outbound()).length === 1 && (await inbound()).length === 1, { timeoutMs: 5_000, message: 'the tunnel in both dumps' });
    const [out] = await outbound();
    assert.equal(out.originalDst, `${ECHO_IP}:${PORT.echo}`);
    assert.equal(out.actualDst, `${ECHO_IP}:15008`);
    assert.equal(out.protocol, 'HBONE');
    // The SOCKS5 client's own address (the test connects from loopback); the peer sees the workload's IP.
    assert.match(out.src, /^127\.0\.0\.1:\d+$/);
    const [inb] = await inbound();
    assert.equal(inb.originalDst, `${ECHO_IP}:${PORT.echo}`);
    assert.equal(inb.protocol, 'HBONE');
    assert.ok(inb.src.startsWith(`${SLEEP_IP}:`), inb.src);
    const state = await dump(a);
    assert.deepEqual(state['Kubernetes//Pod/default/sleep'].info, { name: 'sleep', namespace: 'default', serviceAccount: 'sleep' });
    assert.equal(state['Kubernetes//Pod/default/sleep'].state, 'Up');
    assert.equal(state['Kubernetes//Pod/default/echo'], undefined, 'only the workloads this node serves');
  } finally {
    socket.destroy();
  }
  await waitFor(async () => (await outbound()).length === 0 && (await inbound()).length === 0, { timeoutMs: 5_000, message: 'the tunnel gone from both dumps' });
});

// The daemons run two connection workers (silos, ZTUNNEL_WORKER_THREADS=2), each with its own pool: 200 streams need
// two connections of 100, plus at most one partly filled connection per further silo.
const WORKERS = 2;
const MAX_POOLED = 2 + (WORKERS - 1);

test('200 concurrent connections all succeed over at most one more pooled HBONE connection than they fill', { timeout: 40_000 }, async () => {
  const N = 200;
  const openedA0 = await a.metric('ztunnel_node_hbone_connections_opened_total', { direction: 'outbound' });
  const acceptedB0 = await b.metric('ztunnel_node_hbone_connections_opened_total', { direction: 'inbound' });
  const echoAccepted0 = apps.echo.stats.accepted;
  const results = await Promise.allSettled(
    Array.from({ length: N }, (_, i) =>
      socks5Connect({ proxyHost: SOCKS.host, proxyPort: SOCKS.port, destHost: ECHO_IP, destPort: PORT.echo }).then(async (s) => {
        await echoOnce(s, `connection ${i} of ${N}\n`);
        return s;
      }),
    ),
  );
  const sockets = results.filter((r) => r.status === 'fulfilled').map((r) => r.value);
  try {
    const failures = results.filter((r) => r.status === 'rejected').map((r) => r.reason.message);
    assert.deepEqual(failures.slice(0, 5), [], `${failures.length} of ${N} connections failed`);
    // All N streams are open right now. At most 100 streams per connection (POOL_MAX_STREAMS_PER_CONNECTION), so
    // two connections are needed, and pooling means no more than one partly filled connection per silo.
    const activeA = await a.metric('ztunnel_node_hbone_connections_active', { direction: 'outbound' });
    assert.ok(activeA >= 2 && activeA <= MAX_POOLED, `node-a has ${activeA} HBONE connections open for ${N} concurrent streams`);
    assert.equal(apps.echo.stats.accepted - echoAccepted0, N, 'the echo app accepted every connection');
    assert.equal(await a.metric('istio_tcp_sockets_open', { reporter: 'source' }), N);
  } finally {
    await Promise.all(sockets.map((s) => closeSocket(s)));
  }
  const openedA = (await a.metric('ztunnel_node_hbone_connections_opened_total', { direction: 'outbound' })) - openedA0;
  const acceptedB = (await b.metric('ztunnel_node_hbone_connections_opened_total', { direction: 'inbound' })) - acceptedB0;
  assert.ok(openedA <= MAX_POOLED, `node-a opened ${openedA} HBONE connections for ${N} concurrent streams`);
  assert.ok(acceptedB <= MAX_POOLED, `node-b accepted ${acceptedB} HBONE connections for ${N} concurrent streams`);
  assert.equal(acceptedB, openedA, 'every connection node-a opened, node-b accepted');
  await Promise.all([settled(a, 'source'), settled(b, 'destination')]);
});

test('the daemon\'s own admin, stats and readiness ports are no tunnel destination: SOCKS5 reply 0x02', async () => {
  for (const port of [15000, 15020, 15021]) {
    const r = await socks5Request({ socks: SOCKS, dest: { host: net.admin(1), port } });
    r.socket?.destroy();
    assert.equal(r.code, 0x02, `node-a's own ${port} (error: ${r.error?.message})`);
  }
});

test('upstream refused: SOCKS5 reply 0x05 and a failed connection in node-a metrics', async () => {
  const failedA0 = await a.metric('istio_tcp_connections_failed_total', { reporter: 'source' });
  const failedB0 = await b.metric('istio_tcp_connections_failed_total', { reporter: 'destination' });
  const r = await socks5Request({ socks: SOCKS, dest: dest(PORT.refused) });
  r.socket?.destroy();
  assert.equal(r.code, 0x05, `SOCKS5 reply code (error: ${r.error?.message})`);
  // Counted as the failed connection is dropped, just after the reply: poll briefly.
  await waitFor(async () => (await a.metric('istio_tcp_connections_failed_total', { reporter: 'source', response_flags: 'CONNECT' })) > failedA0, {
    message: 'istio_tcp_connections_failed_total{reporter="source",response_flags="CONNECT"} to go up on node-a',
  });
  await waitFor(async () => (await b.metric('istio_tcp_connections_failed_total', { reporter: 'destination' })) > failedB0, {
    message: 'node-b counting the refused upstream as failed',
  });
});

test('through a service VIP: ztunnel\'s 27 labels on both reporters, destination_service inferred at the destination', async () => {
  const labels = {
    source_workload: 'sleep',
    destination_workload: 'echo',
    destination_service: ECHO_HOST,
    destination_service_namespace: 'default',
    destination_service_name: 'echo',
    source_region: 'region-a',
    source_zone: 'zone-a',
    destination_region: 'region-b',
    destination_zone: 'zone-b',
  };
  const received = (s: Sample[], reporter: string) =>
    sumSamples(s, 'istio_tcp_received_bytes_total', { ...labels, reporter });
  const [a0, b0] = await Promise.all([settled(a, 'source'), settled(b, 'destination')]);
  const r = await socksRoundTrip({ socks: SOCKS, dest: { host: VIP, port: 80 }, payload: REPORT_REQUEST });
  assert.equal(r.sha256, sha256(REPORT_REPLY));
  const [a1, b1] = await Promise.all([settled(a, 'source'), settled(b, 'destination')]);
  // The destination knew only echo's address and port: the service is the one of echo's that delivers to it.
  assert.equal(received(a1, 'source') - received(a0, 'source'), REPORT_REQUEST.length);
  assert.equal(received(b1, 'destination') - received(b0, 'destination'), REPORT_REQUEST.length);
  const sample = b1.find((s) => s.name === 'istio_tcp_received_bytes_total' && s.labels.destination_service === ECHO_HOST)!;
  assert.equal(Object.keys(sample.labels).length, 27);
  // A port no service of echo delivers to has none (address-only traffic stays unknown).
  const direct = b1.filter((s) => s.name === 'istio_tcp_connections_opened_total' && s.labels.destination_workload === 'echo'
    && s.labels.reporter === 'destination' && s.labels.destination_service === 'unknown');
  assert.ok(direct.length > 0, 'the earlier address-only connections are counted without a service');
});

test('SOCKS5 CONNECT to a domain name: resolved as the workload\'s DNS proxy answers it (a mesh name its VIP) and tunneled; a name with no address is host unreachable', async () => {
  // The FQDN, and the short forms the DNS proxy expands from the client's namespace.
  for (const host of [ECHO_HOST, 'echo.default', 'echo']) {
    const r = await socksRoundTrip({ socks: SOCKS, dest: { host, port: 80 }, payload: REPORT_REQUEST });
    assert.equal(r.error, undefined, `${host}: ${r.error?.message}`);
    assert.equal(r.sha256, sha256(REPORT_REPLY), host);
  }
  // invalid. is NXDOMAIN without asking anyone (RFC 6761).
  await assert.rejects(
    socks5Connect({ proxyHost: SOCKS.host, proxyPort: SOCKS.port, destHost: 'nothing.invalid', destPort: 80 }),
    /host unreachable/i,
  );
});

test('metrics and access logs of both nodes match a known transfer, from each reporter\'s perspective', async () => {
  const labels = {
    source_workload: 'sleep',
    source_principal: SLEEP_ID,
    destination_workload: 'echo',
    destination_principal: ECHO_ID,
    connection_security_policy: 'mutual_tls',
    response_flags: '-',
  };
  const A = { ...labels, reporter: 'source' };
  const B = { ...labels, reporter: 'destination' };
  const read = (s: Sample[], match: Record<string, string>) => ({
    opened: sumSamples(s, 'istio_tcp_connections_opened_total', match),
    closed: sumSamples(s, 'istio_tcp_connections_closed_total', match),
    sent: sumSamples(s, 'istio_tcp_sent_bytes_total', match),
    received: sumSamples(s, 'istio_tcp_received_bytes_total', match),
  });
  const [a0, b0] = await Promise.all([settled(a, 'source'), settled(b, 'destination')]);

  const r = await socksRoundTrip({ socks: SOCKS, dest: dest(PORT.report), payload: REPORT_REQUEST });
  assert.equal(r.bytes, REPORT_REPLY.length);
  assert.equal(r.sha256, sha256(REPORT_REPLY));

  const [a1, b1] = await Promise.all([settled(a, 'source'), settled(b, 'destination')]);
  const diff = (x: Record<string, number>, y: Record<string, number>) =>
    Object.fromEntries(Object.keys(x).map((k) => [k, y[k] - x[k]]));
  // Both reporters, as Istio's ztunnel: received = the request direction (client -> server), sent = the response.
  assert.deepEqual(diff(read(a0, A), read(a1, A)), { opened: 1, closed: 1, sent: REPORT_REPLY.length, received: REPORT_REQUEST.length });
  assert.deepEqual(diff(read(b0, B), read(b1, B)), { opened: 1, closed: 1, sent: REPORT_REPLY.length, received: REPORT_REQUEST.length });
  const sample = a1.find((s) => s.name === 'istio_tcp_sent_bytes_total' && s.labels.reporter === 'source' && s.labels.source_workload === 'sleep')!;
  assert.equal(sample.labels.request_protocol, 'tcp');

  // The access logs say the same, per connection.
  const outbound = await a.waitForLog((l) => l.target === 'access' && l.message === 'connection complete' && l['src.addr'] === r.local, {
    message: 'the outbound access log of the transfer',
  });
  assert.equal(outbound.direction, 'outbound');
  assert.equal(outbound.bytes_sent, REPORT_REQUEST.length);
  assert.equal(outbound.bytes_recv, REPORT_REPLY.length);
  assert.equal(outbound['src.identity'], SLEEP_ID);
  assert.equal(outbound['dst.identity'], ECHO_ID);
  assert.equal(outbound['dst.hbone_addr'], `${ECHO_IP}:15008`);
  const inbound = await b.waitForLog(
    (l) => l.target === 'access' && l.message === 'connection complete' && l['dst.addr'] === `${ECHO_IP}:${PORT.report}`,
    { message: 'the inbound access log of the transfer' },
  );
  assert.equal(inbound.direction, 'inbound');
  assert.equal(inbound['src.identity'], SLEEP_ID);
  assert.equal(inbound.bytes_recv, REPORT_REQUEST.length);
  assert.equal(inbound.bytes_sent, REPORT_REPLY.length);
});

test('/debug/pprof/profile: a CPU profile of the process under traffic that go tool pprof reads, with ztunnel\'s bounds', { skip: GO ? false : 'no Go toolchain (go, or /usr/local/go/bin/go): go tool pprof reads the profile' }, async () => {
  assert.equal((await httpGet(`${a.adminUrl}/debug/pprof/profile?seconds=0`)).status, 400);
  assert.equal((await httpGet(`${a.adminUrl}/debug/pprof/profile?frequency=5000`)).status, 400);
  // Two requests at once: whichever the admin takes first is profiled, and the other is refused while it runs (no
  // sleep to order them; the daemon shows no sign of a profile having started but the refusal itself).
  const url = `${a.adminUrl}/debug/pprof/profile?seconds=2&frequency=250`;
  const requests = [httpGetBytes(url), httpGetBytes(url)];
  assert.equal((await Promise.race(requests)).status, 409, 'one profile at a time');
  // Traffic meanwhile, so the dataplane's tunnel has samples.
  const payload = pattern(4 * 1024 * 1024, 11);
  const until = Date.now() + 1_500;
  while (Date.now() < until) await socksRoundTrip({ socks: SOCKS, dest: dest(PORT.echo), payload });
  const answers = await Promise.all(requests);
  assert.deepEqual(answers.map((r) => r.status).sort(), [200, 409]);
  const { body } = answers.find((r) => r.status === 200)!;
  const file = join(makeTempDir('ztn-pprof-'), 'profile.pb');
  writeFileSync(file, body);
  // An independent reader: Go's pprof, as an operator would run it.
  const top = execFileSync(GO!, ['tool', 'pprof', '-top', '-nodecount=400', file], { encoding: 'utf8', env: { ...process.env, HOME: process.env.HOME ?? '/tmp' } });
  assert.match(top, /Type: cpu/);
  assert.match(top, /Duration: 2(\.\d+)?s/);
  assert.match(top, /ztunnel_dataplane::|dataplane::/, 'the dataplane\'s own functions are in it');
  assert.match(top, /tokio::/);
});

test("/debug/pprof/heap: the dataplane's live sampled allocations, toggled by /debug/pprof/heap/profiling, read by go tool pprof", { skip: GO ? false : 'no Go toolchain (go, or /usr/local/go/bin/go): go tool pprof reads the profile' }, async () => {
  const toggle = (v: string) => httpPost(`${a.adminUrl}/debug/pprof/heap/profiling?activate=${v}`);
  assert.equal((await httpGet(`${a.adminUrl}/debug/pprof/heap`)).status, 500, 'off: nothing to show (ztunnel answers 500 while its profiler is off)');
  assert.equal((await toggle('maybe')).status, 400);
  const on = await toggle('true');
  assert.deepEqual([on.status, on.body], [200, 'heap profiling is active\n']);
  try {
    // Connections held open while the profile is taken: their buffers and TLS state are live allocations.
    const held = await Promise.all(
      Array.from({ length: 20 }, () => socks5Connect({ proxyHost: SOCKS.host, proxyPort: SOCKS.port, destHost: ECHO_IP, destPort: PORT.echo })),
    );
    try {
      const echoed = apps.echo.stats.bytes + held.length * 256 * 1024;
      for (const s of held) s.write(pattern(256 * 1024, 3));
      // Through both daemons to the application (its echo stays in the tunnels: the sockets are not read).
      await waitFor(() => apps.echo.stats.bytes >= echoed, { timeoutMs: 10_000, intervalMs: 10, message: 'the held connections\' bytes at the echo server' });
      const { status, body } = await httpGetBytes(`${a.adminUrl}/debug/pprof/heap`);
      assert.equal(status, 200);
      const file = join(makeTempDir('ztn-heap-'), 'heap.pb');
      writeFileSync(file, body);
      const top = execFileSync(GO!, ['tool', 'pprof', '-top', '-sample_index=inuse_space', '-nodecount=400', file], {
        encoding: 'utf8',
        env: { ...process.env, HOME: process.env.HOME ?? '/tmp' },
      });
      assert.match(top, /Type: inuse_space/);
      assert.match(top, /ztunnel_dataplane::|dataplane::|h2::|rustls::|tokio::/, 'the dataplane\'s allocation sites are in it');
    } finally {
      for (const s of held) s.destroy();
    }
  } finally {
    const off = await toggle('false');
    assert.deepEqual([off.status, off.body], [200, 'heap profiling is inactive\n']);
  }
  assert.equal((await httpGet(`${a.adminUrl}/debug/pprof/heap`)).status, 500, 'off again');
});

test("/metrics is ztunnel's exposition: OpenMetrics text, its content types, the runtime and process gauges", async () => {
  const plain = await fetch(`${a.statsUrl}/metrics`);
  assert.equal(plain.headers.get('content-type'), 'text/plain; charset=utf-8');
  const body = await plain.text();
  assert.match(body, /^# TYPE istio_tcp_connections_opened counter$/m);
  assert.match(body, /# EOF\n$/);
  const om = await fetch(`${a.statsUrl}/stats/prometheus`, { headers: { accept: 'application/openmetrics-text;version=1.0.0;q=0.5,text/plain;q=0.2' } });
  assert.equal(om.headers.get('content-type'), 'application/openmetrics-text;charset=utf-8;version=1.0.0');
  await om.text();
  const workers = await a.metric('tokio_num_workers');
  assert.ok(workers >= 1, `tokio_num_workers ${workers}`);
  assert.ok((await a.metric('tokio_num_alive_tasks')) >= 1, 'the listeners are tasks');
  assert.ok((await a.metric('tokio_worker_total_busy_duration_seconds_total')) > 0, 'the workers have run');
  assert.ok((await a.metric('tokio_worker_park_count_total', { worker: String(workers - 1) })) > 0, 'each worker is labelled');
  assert.ok((await a.metric('process_open_fds')) > 0 && (await a.metric('process_max_fds')) > 0);
});

test('both daemons exit 0 on SIGTERM', async () => {
  const [ra, rb] = await Promise.all([a.stop(), b.stop()]);
  assert.equal(ra.code, 0);
  assert.equal(rb.code, 0);
});
