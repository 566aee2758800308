// The dashboard's server side (ts/admin/dashboard.ts) behind the real admin server, against a fake source: what the
// events stream carries and when, its bounds (pages, list rows, a page that stops reading), who may read it, and the
// page's own guarantees (no network, no markup from data, a CSP that admits exactly its script and style).
import { request } from 'node:http';
import { connect } from 'node:net';
import { createHash } from 'node:crypto';
import { Script } from 'node:vm';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createAdminServer } from '../../dist/admin/admin-server.js';
import { Dashboard, decisionOf, LIST_LIMIT, MAX_CLIENTS } from '../../dist/admin/dashboard.js';
import { DASHBOARD_CSP, DASHBOARD_HTML } from '../../dist/admin/dashboard-page.js';
import { listen, closeServer } from '../../dist/admin/http.js';
import { createLogs } from '../../dist/log/logger.js';
import type { TestContext } from 'node:test';
import type { DashboardMessage, DashboardSource } from '../../dist/admin/dashboard.js';
import type { CertificateSummary } from '../../dist/ca/manager.js';
import type {
  ConnectionCounters, InPodWorkload, LogEvent, MetricsSnapshot, TrafficLabels, TunnelCounters, Workload,
} from '../../dist/native/types.js';

/** The fake source's figures: only the fields the dashboard reads (of a Workload, of the dataplane's snapshot). */
type FakeWorkload = Pick<Workload, 'uid' | 'name' | 'namespace' | 'serviceAccount' | 'trustDomain' | 'protocol' | 'workloadIps'>;
type FakeCounters = Omit<ConnectionCounters, 'labels'> & { labels: Partial<TrafficLabels> };
type FakeSnapshot = Pick<MetricsSnapshot, 'socketsOpen' | 'authorization' | 'resilience'> & {
  connections: FakeCounters[];
  tunnels: Pick<TunnelCounters, 'inboundActive' | 'outboundActive'>;
};
interface FakeState {
  clock: number;
  workloadMap: Map<string, FakeWorkload>;
  certs: CertificateSummary[];
  snapshot: FakeSnapshot;
  state: Record<string, InPodWorkload>;
}

/** One message of the events stream. */
interface Message {
  event: string | undefined;
  data: DashboardMessage;
}

/** An events stream; one the server refused has its status and body only. */
interface EventStream {
  status: number | undefined;
  body?: string;
  type?: string;
  next: () => Promise<Message>;
  close: () => void;
  closed: Promise<unknown>;
}

const ID = (sa: string) => `spiffe://cluster.local/ns/default/sa/${sa}`;

function labels(reporter: string, over: Partial<TrafficLabels> = {}): Partial<TrafficLabels> {
  return {
    reporter,
    source_workload: 'sleep',
    source_workload_namespace: 'default',
    source_principal: ID('sleep'),
    destination_workload: 'echo',
    destination_workload_namespace: 'default',
    destination_principal: ID('echo'),
    destination_service: 'echo.default.svc.cluster.local',
    connection_security_policy: 'mutual_tls',
    ...over,
  };
}

/** A source whose figures the test sets; `now` is the dashboard's clock. */
function fakeSource() {
  const s: FakeState = {
    clock: 1_000_000,
    workloadMap: new Map(),
    certs: [],
    snapshot: {
      connections: [],
      socketsOpen: { source: 0, destination: 0 },
      tunnels: { inboundActive: 0, outboundActive: 0 },
      authorization: { denied: 0, closedByPolicyChange: 0 },
      resilience: { connectRetries: 0, ejections: 0, ejectedEndpoints: 0 },
    },
    state: {},
  };
  return {
    s,
    source: {
      node: 'node-a',
      mode: 'local',
      workloads: () => s.workloadMap,
      certificates: () => s.certs,
      metrics: () => s.snapshot,
      workloadState: () => s.state,
    } as unknown as DashboardSource, // the fields it reads (FakeState)
  };
}

async function start(t: TestContext, opts: { intervalMs?: number } = {}) {
  const { s, source } = fakeSource();
  const dashboard = new Dashboard(source, { intervalMs: 3_600_000, now: () => s.clock, ...opts });
  const logs = createLogs({ filter: { level: 'info', targets: {} }, format: 'json', sink: { write: () => {} } });
  const server = createAdminServer({ logs, quit: () => {}, configDump: () => ({}), dashboard });
  const addr = await listen(server, { host: '127.0.0.1', port: 0 });
  t.after(async () => {
    dashboard.close();
    await closeServer(server, 0);
  });
  return { s, dashboard, port: addr.port };
}

/** An events stream: `next()` resolves its next message { event, data }. */
function stream(port: number, headers: Record<string, string> = {}): Promise<EventStream> {
  return new Promise<EventStream>((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path: '/dashboard/events', headers, agent: false }, (res) => {
      if (res.statusCode !== 200) {
        let body = '';
        res.on('data', (c) => (body += c));
        // Refused: nothing to read (a test reads such a stream's status and body only).
        res.on('end', () => resolve({ status: res.statusCode, body } as EventStream));
        return;
      }
      let buf = '';
      const queue: Message[] = [];
      const waiters: ((m: Message) => void)[] = [];
      res.setEncoding('utf8');
      res.on('data', (chunk) => {
        buf += chunk;
        let end: number;
        while ((end = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, end);
          buf = buf.slice(end + 2);
          const event = /^event: (.*)$/m.exec(block)?.[1];
          const data = /^data: (.*)$/m.exec(block)?.[1];
          const msg: Message = { event, data: data === undefined ? undefined : JSON.parse(data) };
          const w = waiters.shift();
          if (w) w(msg);
          else queue.push(msg);
        }
      });
      resolve({
        status: 200,
        type: res.headers['content-type'],
        next: () => (queue.length > 0 ? Promise.resolve(queue.shift()!) : new Promise<Message>((r) => waiters.push(r))),
        close: () => req.destroy(),
        closed: new Promise((r) => res.once('close', r)),
      });
    });
    req.on('error', reject);
    req.end();
  });
}

const until = async (fn: () => boolean, what: string): Promise<void> => {
  for (let i = 0; i < 200; i++) {
    if (fn()) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.fail(`timed out waiting for ${what}`);
};

test('a page gets a snapshot on connect, then updates with the rates between metrics snapshots', async (t) => {
  const { s, dashboard, port } = await start(t);
  s.workloadMap.set('u1', { uid: 'u1', name: 'sleep', namespace: 'default', serviceAccount: 'sleep', trustDomain: 'cluster.local', protocol: 'HBONE', workloadIps: ['10.0.0.1'] });
  s.certs = [{ identity: ID('sleep'), state: 'Available', notAfter: s.clock + 86_400_000 }];
  s.snapshot.connections = [
    { labels: labels('source'), opened: 3, closed: 1, failed: 0, sent: 1000, received: 500 },
    { labels: labels('destination'), opened: 2, closed: 2, failed: 0, sent: 100, received: 100 },
  ];
  s.snapshot.tunnels = { inboundActive: 1, outboundActive: 2 };
  s.snapshot.resilience = { connectRetries: 7, ejections: 3, ejectedEndpoints: 2 };
  s.snapshot.socketsOpen = { source: 2, destination: 0 };
  s.state = { u1: { info: { name: 'sleep', namespace: 'default', serviceAccount: 'sleep' }, state: 'Up', connections: { inbound: [], outbound: [{ src: '10.0.0.1:5000', originalDst: '10.0.0.2:80', actualDst: '10.0.0.2:15008', protocol: 'HBONE' }] } } };

  const es = await stream(port);
  assert.equal(es.status, 200);
  assert.match(es.type!, /^text\/event-stream/);
  const snap = await es.next();
  assert.equal(snap.event, 'snapshot');
  assert.equal(snap.data.node, 'node-a');
  assert.deepEqual(snap.data.workloads, { total: 1, items: [{ uid: 'u1', name: 'sleep', namespace: 'default', identity: ID('sleep'), protocol: 'HBONE', ips: ['10.0.0.1'] }] });
  assert.deepEqual(snap.data.certificates.items, s.certs);
  assert.deepEqual(snap.data.tunnels, { inbound: 1, outbound: 2 });
  assert.deepEqual(snap.data.resilience, { retries: 7, ejected: 2 }, 'connect retries and the endpoints ejected now');
  assert.deepEqual(snap.data.open, { inbound: 0, outbound: 2 });
  // Only the label set with connections open now, with both identities.
  assert.deepEqual(snap.data.flows, {
    total: 1,
    items: [{ direction: 'outbound', srcIdentity: ID('sleep'), srcWorkload: 'default/sleep', dstIdentity: ID('echo'), dstWorkload: 'default/echo', dstService: 'echo.default.svc.cluster.local', mtls: true, open: 2, bytes: 1500 }],
  });
  assert.deepEqual(snap.data.connections, { total: 1, items: [{ workload: 'default/sleep', direction: 'outbound', src: '10.0.0.1:5000', dst: '10.0.0.2:15008', protocol: 'HBONE' }] });
  assert.deepEqual(snap.data.points, []);

  // Two seconds later: 4000 more bytes outbound, 2 more opened inbound, 1 denial, 1 closed by a policy change.
  s.clock += 2_000;
  s.snapshot.connections[0].sent += 4000;
  s.snapshot.connections[1].opened += 2;
  s.snapshot.authorization = { denied: 1, closedByPolicyChange: 1 };
  dashboard.tick();
  const up = await es.next();
  assert.equal(up.event, 'update');
  assert.deepEqual(up.data.points, [{ t: s.clock, inboundBps: 0, outboundBps: 2000, inboundCps: 1, outboundCps: 0, deniedPs: 1 }]);

  // A page that connects now gets the ring whole.
  const late = await stream(port);
  assert.equal((await late.next()).data.points.length, 1);
  late.close();
  es.close();
});

test('authorization decisions: observed only while a page watches, sent once, with the policy that decided', async (t) => {
  const { s, dashboard, port } = await start(t);
  const denied: LogEvent = {
    kind: 'access',
    level: 'warn',
    message: 'connection denied',
    fields: { 'src.addr': '10.0.0.1:4000', 'src.identity': ID('sleep'), 'dst.addr': '10.0.0.2:9090', 'dst.workload': 'echo', 'dst.namespace': 'default', 'dst.identity': ID('echo'), direction: 'inbound', error: 'connection denied: explicitly denied by: default/deny-9090', policy: 'default/deny-9090' },
  };
  dashboard.observe([denied]); // nobody watches: not even looked at
  assert.equal(dashboard.watching, 0);
  const es = await stream(port);
  assert.deepEqual((await es.next()).data.decisions, []);
  assert.equal(dashboard.watching, 1);

  dashboard.observe([denied, { kind: 'log', level: 'info', message: 'connection denied', fields: {} }, { kind: 'suppressed', level: 'warn', message: 'connection denied', fields: { kind: 'access', count: 7 } }]);
  // A page that joins before the next update gets the decision with it, not also in its snapshot.
  const second = await stream(port);
  assert.deepEqual((await second.next()).data.decisions, []);
  s.clock += 1_000;
  dashboard.tick();
  const up = (await es.next()).data;
  assert.deepEqual((await second.next()).data.decisions, up.decisions);
  second.close();
  const third = await stream(port);
  assert.deepEqual((await third.next()).data.decisions, up.decisions, 'a page that joins later has it in its snapshot');
  third.close();
  assert.deepEqual(up.decisions, [
    { t: s.clock - 1_000, verdict: 'deny', srcIdentity: ID('sleep'), srcAddr: '10.0.0.1:4000', dstIdentity: ID('echo'), dstWorkload: 'default/echo', dstAddr: '10.0.0.2:9090', policy: 'default/deny-9090', reason: 'explicitly denied by: default/deny-9090' },
  ]);
  assert.equal(up.missedDecisions, 7, 'the denials the dataplane rate-limited are counted');
  dashboard.tick();
  const again = (await es.next()).data;
  assert.deepEqual([again.decisions, again.missedDecisions], [[], 0], 'each decision is sent once');
  es.close();
  await until(() => dashboard.watching === 0, 'the page to leave');
});

test('decisionOf: denied, revoked by a policy change, allowed (an inbound connection that completed); nothing else', () => {
  const t = 5;
  assert.equal(decisionOf('connection denied', { direction: 'inbound', 'src.addr': '1.1.1.1:1', error: 'connection denied: allow policies exist, but none allowed', 'dst.workload': 'echo' }, t)!.reason, 'allow policies exist, but none allowed');
  const revoked = decisionOf('connection closed due to policy change', { 'src.identity': ID('a'), 'dst.workload': 'Kubernetes//Pod/default/echo', policy: 'default/p', reason: 'explicitly denied by: default/p', direction: 'inbound' }, t)!;
  assert.deepEqual([revoked.verdict, revoked.policy, revoked.reason, revoked.dstWorkload], ['revoke', 'default/p', 'explicitly denied by: default/p', 'Kubernetes//Pod/default/echo']);
  const allowed = decisionOf('connection complete', { direction: 'inbound', 'src.identity': ID('a'), 'dst.identity': ID('b'), 'dst.workload': 'b', 'dst.namespace': 'ns', bytes_sent: 3 }, t)!;
  assert.deepEqual([allowed.verdict, allowed.dstWorkload, allowed.policy, allowed.reason], ['allow', 'ns/b', '', '']);
  // The completion of a connection a policy change closed is not a second decision (the revoke was), nor is an
  // outbound completion, nor a failure before authorization.
  assert.equal(decisionOf('connection complete', { direction: 'inbound', error: 'connection closed due to policy change' }, t), null);
  assert.equal(decisionOf('connection complete', { direction: 'outbound' }, t), null);
  assert.equal(decisionOf('connection failed', { direction: 'inbound' }, t), null);
});

test('bounded: lists keep LIST_LIMIT rows with their totals; at most MAX_CLIENTS pages at once', async (t) => {
  const { s, dashboard, port } = await start(t);
  for (let i = 0; i < LIST_LIMIT + 50; i++) {
    s.workloadMap.set(`u${i}`, { uid: `u${i}`, name: `w${i}`, namespace: 'ns', serviceAccount: 'sa', trustDomain: 'td', protocol: 'TCP', workloadIps: [] });
    s.snapshot.connections.push({ labels: labels('source', { source_workload: `w${i}` }), opened: 1, closed: 0, failed: 0, sent: i, received: 0 });
  }
  s.certs = Array.from({ length: LIST_LIMIT + 1 }, (_, i) => ({ identity: `spiffe://td/ns/ns/sa/s${i}`, state: 'Initializing', notAfter: null }));
  const pages: EventStream[] = [];
  for (let i = 0; i < MAX_CLIENTS; i++) pages.push(await stream(port));
  const snap = (await pages[0].next()).data;
  assert.deepEqual([snap.workloads.total, snap.workloads.items.length], [LIST_LIMIT + 50, LIST_LIMIT]);
  assert.deepEqual([snap.flows.total, snap.flows.items.length], [LIST_LIMIT + 50, LIST_LIMIT]);
  assert.deepEqual([snap.certificates.total, snap.certificates.items.length], [LIST_LIMIT + 1, LIST_LIMIT]);

  const refused = await stream(port);
  assert.deepEqual([refused.status, refused.body], [503, `the dashboard serves ${MAX_CLIENTS} pages at once\n`]);
  assert.equal(dashboard.watching, MAX_CLIENTS);
  for (const p of pages) p.close();
  await until(() => dashboard.watching === 0, 'every page to leave');
});

test('the dataplane is read every interval while a page watches, and not at all once none does', async (t) => {
  const { s, dashboard, port } = await start(t, { intervalMs: 20 });
  let reads = 0;
  const snapshot = s.snapshot;
  Object.defineProperty(s, 'snapshot', { get: () => (reads++, snapshot) });
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
  // Negative checks (here and below): 100 ms is 5 intervals in which a running timer would have read.
  await sleep(100);
  assert.equal(reads, 0, 'nobody watches: nothing read');
  const es = await stream(port);
  await es.next();
  await until(() => reads >= 4, 'ticks while watched');
  es.close();
  await until(() => dashboard.watching === 0, 'the page to leave');
  const after = reads;
  await sleep(150);
  assert.equal(reads, after, 'the timer stopped with the last page');
});

test('a page that stops reading is disconnected once MAX_CLIENT_BUFFER is queued to it', async (t) => {
  const { s, dashboard, port } = await start(t);
  // Large updates: LIST_LIMIT rows of long names.
  for (let i = 0; i < LIST_LIMIT; i++) {
    s.workloadMap.set(`u${i}`, { uid: `u${i}`, name: 'x'.repeat(2000), namespace: 'ns', serviceAccount: 'sa', trustDomain: 'td', protocol: 'TCP', workloadIps: [] });
  }
  const sock = connect({ host: '127.0.0.1', port });
  await new Promise((r) => sock.once('connect', r));
  sock.write('GET /dashboard/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n');
  await until(() => dashboard.watching === 1, 'the page to connect');
  sock.pause(); // never reads again
  const closed = new Promise((r) => sock.once('close', r));
  sock.on('error', () => {});
  for (let i = 0; i < 500 && dashboard.watching > 0; i++) {
    dashboard.tick();
    await new Promise((r) => setImmediate(r));
  }
  await until(() => dashboard.watching === 0, 'the stalled page to be dropped');
  sock.destroy();
  await closed;
});

test('the stream answers only what an operator\'s browser asks: not another site, not a DNS-rebound name; GET only', async (t) => {
  const { port, dashboard } = await start(t);
  for (const [headers, why] of [
    [{ host: `evil.example:${port}` }, /Host "evil.example:\d+" is not an IP address or localhost/],
    [{ 'sec-fetch-site': 'cross-site' }, /a cross-site request/],
    [{ origin: 'http://evil.example' }, /cross-origin/],
  ] as const) {
    const r = await stream(port, headers);
    assert.equal(r.status, 403, JSON.stringify(headers));
    assert.match(r.body!, why);
  }
  const post = await fetch(`http://127.0.0.1:${port}/dashboard/events`, { method: 'POST' });
  assert.equal(post.status, 405);
  assert.equal(dashboard.watching, 0);
  // The same-origin stream of the page itself is served.
  const own = await stream(port, { 'sec-fetch-site': 'same-origin' });
  assert.equal(own.status, 200);
  own.close();
});

test('the page: served with its CSP, listed on the admin index, self-contained, data only ever as text', async (t) => {
  const { port } = await start(t);
  const r = await fetch(`http://127.0.0.1:${port}/dashboard`);
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('content-security-policy'), DASHBOARD_CSP);
  assert.equal(r.headers.get('x-frame-options'), 'DENY');
  const html = await r.text();
  assert.equal(html, DASHBOARD_HTML);
  const index = await (await fetch(`http://127.0.0.1:${port}/`)).text();
  assert.match(index, /<a href="\/dashboard">\/dashboard<\/a>/);

  const script = /<script>([\s\S]*)<\/script>/.exec(html)![1];
  const style = /<style>([\s\S]*)<\/style>/.exec(html)![1];
  const hash = (x: string) => `'sha256-${createHash('sha256').update(x).digest('base64')}'`;
  assert.ok(DASHBOARD_CSP.includes(`script-src ${hash(script)}`), 'the CSP admits the inline script by its hash');
  assert.ok(DASHBOARD_CSP.includes(`style-src ${hash(style)}`), 'and the inline style');
  assert.match(DASHBOARD_CSP, /default-src 'none'/);
  assert.match(DASHBOARD_CSP, /connect-src 'self'/);
  new Script(script); // it parses
  // Nothing from elsewhere (the SVG namespace is a name, never fetched), and no markup built from strings.
  assert.deepEqual([...html.matchAll(/(?:https?:)?\/\/[a-z0-9.-]+/gi)].map((m) => m[0]), ['http://www.w3.org']);
  assert.doesNotMatch(script, /innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function/);
  assert.doesNotMatch(html, /@import|url\(/);
});
