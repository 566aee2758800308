// Metrics rendering is a pure function of the native MetricsSnapshot (no native module needed).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import type * as PromClient from 'prom-client';
import { Metrics, wantsOpenMetrics } from '../../dist/admin/metrics.js';
import type { ScrapeSnapshot } from '../../dist/admin/metrics.js';
import { createStatsServer } from '../../dist/admin/stats-server.js';
import { listen, closeServer } from '../../dist/admin/http.js';
import { parsePrometheusText, sumSamples } from '../../dist/cli/prom-text.js';
import type { Sample } from '../../dist/cli/prom-text.js';

/** One reporter's row of the traffic counters. */
interface TrafficRow {
  reporter: string;
  opened: number;
  closed: number;
  failed: number;
  sent: number;
  received: number;
}

// The traffic counters come rendered by the dataplane (native metrics.rs `traffic_openmetrics`, whose own test checks
// the 27 labels, their order and escaping); here, text in that shape stands for it.
function traffic(rows: TrafficRow[]): string {
  const families = [
    ['istio_tcp_connections_opened', 'opened'],
    ['istio_tcp_connections_closed', 'closed'],
    ['istio_tcp_connections_failed', 'failed'],
    ['istio_tcp_sent_bytes', 'sent'],
    ['istio_tcp_received_bytes', 'received'],
  ] as const;
  return families
    .map(([f, field]) => [`# HELP ${f} help`, `# TYPE ${f} counter`, ...rows.map((r) => `${f}_total{reporter="${r.reporter}"} ${r[field]}`)].join('\n') + '\n')
    .join('');
}
const INBOUND = { reporter: 'destination', opened: 3, closed: 2, failed: 1, sent: 1000, received: 250 };
const OUTBOUND = { reporter: 'source', opened: 7, closed: 7, failed: 0, sent: 10, received: 20 };

function fakeSource(snapshots: ScrapeSnapshot[]): { readonly calls: number; snapshot: () => ScrapeSnapshot } {
  let calls = 0;
  return {
    get calls() {
      return calls;
    },
    snapshot: () => snapshots[Math.min(calls++, snapshots.length - 1)],
  };
}

const snap = (rows: TrafficRow[], source = 0, destination = 0): ScrapeSnapshot => ({ traffic: traffic(rows), socketsOpen: { source, destination } });

const require = createRequire(import.meta.url);
/** The CommonJS modules this process has loaded whose path contains `part`. */
const loadedCjs = (part: string): string[] => Object.keys(require.cache).filter((k) => k.includes(part));

// First in this file: nothing before it has rendered, so what it sees loaded is what rendering loaded.
test('prom-client loads with the first scrape, never before; its default metrics are all there without @opentelemetry/api', async () => {
  const m = new Metrics({ snapshot: () => snap([OUTBOUND]), istioVersion: null, defaultMetrics: true });
  assert.deepEqual(loadedCjs('/node_modules/prom-client/'), [], 'a daemon nobody scrapes has not loaded prom-client');
  const before = process.cpuUsage();
  const samples = parsePrometheusText((await m.render()).body);
  const after = process.cpuUsage();
  assert.ok(loadedCjs('/node_modules/prom-client/').length > 0, 'the scrape loaded it');
  assert.deepEqual(loadedCjs('/node_modules/@opentelemetry/'), [], 'prom-client\'s CPU collector (and @opentelemetry/api with it) stays unloaded');

  // The same metric names as prom-client's own collectDefaultMetrics (its list, its CPU collector included).
  const registry = require('prom-client/lib/registry.js') as typeof PromClient.Registry;
  const collectDefaultMetrics = require('prom-client/lib/defaultMetrics.js') as typeof PromClient.collectDefaultMetrics;
  const theirs = new registry();
  collectDefaultMetrics({ register: theirs });
  // Family names without `_total` (the daemon renders OpenMetrics, whose counter families drop it; theirs is text 0.0.4).
  const names = (text: string): string[] => [...new Set([...text.matchAll(/^# TYPE (\S+) /gm)].map((x) => x[1]!.replace(/_total$/, '')))].sort();
  const ours = names((await m.render()).body);
  const defaults = names(await theirs.metrics());
  assert.deepEqual(defaults.filter((n) => !ours.includes(n)), [], 'every default metric prom-client registers');

  // process_cpu_*: the process's CPU seconds at the scrape (process.cpuUsage: since it started), user + system = total.
  const value = (name: string): number => sumSamples(samples, name);
  const [user, system, total] = ['process_cpu_user_seconds_total', 'process_cpu_system_seconds_total', 'process_cpu_seconds_total'].map(value);
  assert.ok(user! >= before.user / 1e6 && user! <= after.user / 1e6, `user ${user} s`);
  assert.ok(system! >= before.system / 1e6 && system! <= after.system / 1e6, `system ${system} s`);
  assert.ok(Math.abs(total! - (user! + system!)) < 1e-6, `total ${total} = ${user} + ${system}`);
});

test("the dataplane's traffic text opens the body, from the scrape's one snapshot; the rest is rendered here", async () => {
  const src = fakeSource([snap([INBOUND, OUTBOUND], 1, 2)]);
  const m = new Metrics({ snapshot: src.snapshot, istioVersion: '1.24.0', defaultMetrics: false });
  const { contentType, body } = await m.render();
  assert.equal(contentType, 'text/plain; charset=utf-8');
  assert.equal(src.calls, 1, 'one native read per scrape');
  assert.ok(body.startsWith(traffic([INBOUND, OUTBOUND])), 'the text as the dataplane gave it, first');
  assert.equal(body.match(/# TYPE istio_tcp_connections_opened counter/g)!.length, 1, 'declared once');
  const samples = parsePrometheusText(body);
  assert.equal(sumSamples(samples, 'istio_tcp_connections_opened_total', { reporter: 'destination' }), 3);
  assert.equal(sumSamples(samples, 'istio_tcp_received_bytes_total', { reporter: 'destination' }), 250);
  assert.equal(sumSamples(samples, 'istio_tcp_sockets_open', { reporter: 'source' }), 1);
  assert.equal(sumSamples(samples, 'istio_tcp_sockets_open', { reporter: 'destination' }), 2);
  assert.equal(sumSamples(samples, 'istio_build', { component: 'ztunnel', tag: '1.24.0' }), 1);
  assert.match(body, /# EOF\n$/);
  assert.equal(body.match(/# EOF/g)!.length, 1);
});

test('a scrape reflects the latest snapshot, not a running sum', async () => {
  const src = fakeSource([snap([INBOUND]), snap([{ ...INBOUND, opened: 5 }]), snap([])]);
  const m = new Metrics({ snapshot: src.snapshot, istioVersion: null, defaultMetrics: false });
  const opened = async () => sumSamples(parsePrometheusText((await m.render()).body), 'istio_tcp_connections_opened_total');
  assert.equal(await opened(), 3);
  assert.equal(await opened(), 5);
  assert.equal(await opened(), 0);
  const body = (await m.render()).body;
  assert.match(body, /istio_build\{component="ztunnel",tag="unknown"\} 1/);
});

test('concurrent scrapes each read one snapshot', async () => {
  const src = fakeSource([snap([INBOUND]), snap([{ ...INBOUND, opened: 9, closed: 9 }])]);
  const m = new Metrics({ snapshot: src.snapshot, istioVersion: null, defaultMetrics: false });
  const [a, b] = await Promise.all([m.render(), m.render()]);
  assert.equal(src.calls, 2);
  const sa = parsePrometheusText(a.body);
  const sb = parsePrometheusText(b.body);
  assert.deepEqual([sumSamples(sa, 'istio_tcp_connections_opened_total'), sumSamples(sa, 'istio_tcp_connections_closed_total')], [3, 2]);
  assert.deepEqual([sumSamples(sb, 'istio_tcp_connections_opened_total'), sumSamples(sb, 'istio_tcp_connections_closed_total')], [9, 9]);
});

test("the body is OpenMetrics text whatever the Accept header; the content type follows it, as ztunnel's", async () => {
  const m = new Metrics({ snapshot: () => snap([OUTBOUND]), istioVersion: null, defaultMetrics: false });
  // Prometheus's own Accept header: openmetrics is one of several entries, with parameters.
  const om = await m.render('application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;q=0.6,application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.2');
  assert.equal(om.contentType, 'application/openmetrics-text;charset=utf-8;version=1.0.0');
  for (const accept of [undefined, 'text/plain', 'application/json', 'text/plain;q=0.5, application/openmetrics-textual']) {
    const r = await m.render(accept);
    assert.equal(r.contentType, 'text/plain; charset=utf-8', String(accept));
    assert.equal(r.body, om.body, 'one body');
  }
  assert.match(om.body, /# TYPE istio_tcp_sockets_open gauge/);
  assert.match(om.body, /^istio_tcp_connections_opened_total\{reporter="source"/m);
  assert.match(om.body, /# EOF\n$/);
  assert.equal(wantsOpenMetrics('Application/OpenMetrics-Text; version=1.0.0'), true);
});

test("the dataplane runtime renders as ztunnel's tokio_* metrics", async () => {
  const runtime = { workers: 2, globalQueueDepth: 3, aliveTasks: 40, busySeconds: [1.5, 2.25], parks: [10, 20], parkUnparks: [9, 19] };
  const m = new Metrics({ snapshot: () => ({ ...snap([]), runtime }), istioVersion: null, defaultMetrics: false });
  const samples = parsePrometheusText((await m.render()).body);
  assert.equal(sumSamples(samples, 'tokio_num_workers'), 2);
  assert.equal(sumSamples(samples, 'tokio_global_queue_depth'), 3);
  assert.equal(sumSamples(samples, 'tokio_num_alive_tasks'), 40);
  assert.equal(sumSamples(samples, 'tokio_worker_total_busy_duration_seconds_total', { worker: '1' }), 2.25);
  assert.equal(sumSamples(samples, 'tokio_worker_park_count_total', { worker: '0' }), 10);
  assert.equal(sumSamples(samples, 'tokio_worker_park_unpark_count_total', { worker: '1' }), 19);
});

test('the HBONE tunnel counters render per direction, and as 0 when the snapshot has none', async () => {
  const tunnels = {
    outboundOpened: 2,
    outboundActive: 1,
    inboundAccepted: 5,
    inboundActive: 3,
    inboundHandshakeFailures: 4,
    outboundHandshakeFailures: 6,
  };
  const src = fakeSource([{ ...snap([OUTBOUND]), tunnels }, { ...snap([OUTBOUND]), tunnels: { ...tunnels, outboundActive: 0 } }, snap([])]);
  const m = new Metrics({ snapshot: src.snapshot, istioVersion: null, defaultMetrics: false });
  const render = async () => parsePrometheusText((await m.render()).body);
  const value = (samples: Sample[], name: string, direction: string): number => {
    const found = samples.filter((s) => s.name === name && s.labels.direction === direction);
    assert.equal(found.length, 1, `${name}{direction="${direction}"} present once`);
    assert.deepEqual(Object.keys(found[0].labels), ['direction']);
    return found[0].value;
  };
  let s = await render();
  assert.equal(value(s, 'ztunnel_node_hbone_connections_opened_total', 'outbound'), 2);
  assert.equal(value(s, 'ztunnel_node_hbone_connections_opened_total', 'inbound'), 5);
  assert.equal(value(s, 'ztunnel_node_hbone_connections_active', 'outbound'), 1);
  assert.equal(value(s, 'ztunnel_node_hbone_connections_active', 'inbound'), 3);
  assert.equal(value(s, 'ztunnel_node_tls_handshake_failures_total', 'outbound'), 6);
  assert.equal(value(s, 'ztunnel_node_tls_handshake_failures_total', 'inbound'), 4);
  s = await render();
  assert.equal(value(s, 'ztunnel_node_hbone_connections_active', 'outbound'), 0, 'the gauge follows the snapshot down');
  assert.equal(value(s, 'ztunnel_node_hbone_connections_opened_total', 'outbound'), 2, 'counters are not accumulated');
  s = await render();
  for (const name of ['ztunnel_node_hbone_connections_opened_total', 'ztunnel_node_hbone_connections_active', 'ztunnel_node_tls_handshake_failures_total']) {
    assert.equal(value(s, name, 'outbound'), 0);
    assert.equal(value(s, name, 'inbound'), 0);
  }
  const body = (await m.render()).body;
  assert.match(body, /# TYPE ztunnel_node_hbone_connections_opened counter/);
  assert.match(body, /# TYPE ztunnel_node_hbone_connections_active gauge/);
  assert.match(body, /# TYPE ztunnel_node_tls_handshake_failures counter/);
});

test('the stats server serves /metrics and /stats/prometheus, with process fd gauges', async (t) => {
  const m = new Metrics({ snapshot: () => snap([OUTBOUND]), istioVersion: null, defaultMetrics: true });
  const server = createStatsServer(m);
  const addr = await listen(server, { host: '127.0.0.1', port: 0 });
  t.after(() => closeServer(server));
  for (const path of ['/metrics', '/stats/prometheus']) {
    const res = await fetch(`http://127.0.0.1:${addr.port}${path}`);
    assert.equal(res.status, 200);
    const samples = parsePrometheusText(await res.text());
    assert.equal(sumSamples(samples, 'istio_tcp_connections_opened_total'), 7);
    if (process.platform === 'linux') assert.ok(samples.some((s) => s.name === 'process_open_fds' && s.value > 0));
  }
  const res = await fetch(`http://127.0.0.1:${addr.port}/other`);
  assert.equal(res.status, 404);
  await res.text();
});
