// Prometheus metrics, with ztunnel's names and labels. The dataplane counts in Rust; this module only renders.
//
// Invariants:
// - The native MetricsSnapshot is read ONCE per scrape, and every istio_ metric of that scrape comes from that
//   one snapshot (a lock serializes scrapes, so two concurrent scrapes cannot mix snapshots).
// - Counters are set to the native cumulative values (reset + inc in collect()), never accumulated here, so a
//   scrape is a pure function of the snapshot.
// - The traffic counters (istio_tcp_connections_*, istio_tcp_*_bytes) are rendered by the dataplane, where they are
//   counted, as OpenMetrics text in the same snapshot (`traffic`, native metrics.rs `traffic_openmetrics`: every one of
//   ztunnel's 27 labels, empty values `unknown`); this module puts that text first in the body, as it is.
// - The HBONE tunnel counters (the snapshot's `tunnels`: pooled outbound connections, accepted inbound ones, TLS
//   handshake failures) are ztunnel-node's own, so they carry the `ztunnel_node_` prefix, not `istio_`. A snapshot
//   without `tunnels` renders them as 0.
//
// prom-client is required by its parts (registry, counter, gauge, default metrics): its index also loads the
// Pushgateway (node:https, hence node:tls, and node:zlib), the cluster aggregator, Histogram and Summary (tdigest),
// none of which the daemon uses. Idle RSS 0.4 MiB lower on Node 20, 1.3 on Node 22, 0.9 on Node 24
// (bench/idle-rss.mjs). The lib/ paths are prom-client's own layout (15.x has no "exports" map); a release that
// moves them fails this module's import, and with it test/unit/metrics.test.ts; package.json pins the version exactly.
import { createRequire } from 'node:module';
import type * as PromClient from 'prom-client';
import type { RegistryContentType } from 'prom-client';
import type { AuthorizationCounters, CrlCounters, DnsCounters, MetricsSnapshot, TunnelCounters } from '../native/types.js';
import type { XdsCounters } from '../xds/metrics.js';

export type { TunnelCounters };

const require = createRequire(import.meta.url);
/** The prom-client parts this module uses. */
interface PromParts {
  Registry: typeof PromClient.Registry;
  Counter: typeof PromClient.Counter;
  Gauge: typeof PromClient.Gauge;
}
let parts: PromParts | undefined;
/**
 * prom-client, required at the first scrape, when the registries are built: nothing renders before one, so a daemon
 * nobody scrapes never loads it (bench/idle-rss.mjs, 15 s after ready, anonymous memory: Node 20 12.9 -> 12.3 MiB,
 * Node 24 16.8 -> 16.5).
 */
function prom(): PromParts {
  parts ??= {
    Registry: require('prom-client/lib/registry.js') as typeof PromClient.Registry,
    Counter: require('prom-client/lib/counter.js') as typeof PromClient.Counter,
    Gauge: require('prom-client/lib/gauge.js') as typeof PromClient.Gauge,
  };
  return parts;
}

/**
 * prom-client's default collectors (lib/defaultMetrics.js's list), each required by its module, but for
 * processCpuTotal: that one requires @opentelemetry/api (44 modules, for exemplars, which the daemon does not use)
 * on every daemon's first scrape. Its three counters are `registerProcessCpu`'s (a daemon scraped at ready and 15 s
 * later, read 2 s after: anonymous memory 13.6 -> 13.4 MiB on Node 20, with the lazy load above). Node >= 17 has
 * process.getActiveResourcesInfo, so processResources is always in prom-client's list. test/unit/metrics.test.ts
 * compares the names with prom-client's own collectDefaultMetrics.
 */
const DEFAULT_COLLECTORS = [
  'processStartTime',
  'osMemoryHeap',
  'processOpenFileDescriptors',
  'processMaxFileDescriptors',
  'eventLoopLag',
  'processResources',
  'processHandles',
  'processRequests',
  'heapSizeAndUsed',
  'heapSpacesSizeAndUsed',
  'version',
  'gc',
] as const;

/** prom-client's default metrics (as `collectDefaultMetrics` registers them, its default options) in `reg`. */
function registerDefaultMetrics(reg: Registry<ContentType>): void {
  for (const name of DEFAULT_COLLECTORS) {
    const collector = require(`prom-client/lib/metrics/${name}.js`) as (r: Registry<ContentType>, config: object) => void;
    collector(reg, { eventLoopMonitoringPrecision: 10 });
  }
  registerProcessCpu(reg);
}

/**
 * process_cpu_user_seconds_total, process_cpu_system_seconds_total and process_cpu_seconds_total, with prom-client's
 * names and help: the process's CPU time (process.cpuUsage, every thread's, since it started) at the scrape, read
 * once by the first counter's collect for all three (as prom-client's collector does), so total = user + system.
 */
function registerProcessCpu(reg: Registry<ContentType>): void {
  const { Counter } = prom();
  const counter = (name: string, help: string, collect?: () => void) => new Counter({ name, help, registers: [reg], ...(collect ? { collect } : {}) });
  const set = (c: PromClient.Counter, micros: number) => {
    c.reset();
    c.inc(micros / 1e6);
  };
  const user = counter('process_cpu_user_seconds_total', 'Total user CPU time spent in seconds.', () => {
    const u = process.cpuUsage();
    set(user, u.user);
    set(system, u.system);
    set(total, u.user + u.system);
  });
  // Registered (and so collected) after the user counter, which sets them.
  const system = counter('process_cpu_system_seconds_total', 'Total system CPU time spent in seconds.');
  const total = counter('process_cpu_seconds_total', 'Total user and system CPU time spent in seconds.');
}

type Registry<T extends RegistryContentType> = PromClient.Registry<T>;

/**
 * What one scrape reads: the native snapshot (its type generated from metrics.rs), taken with `trafficText`. Only the
 * open sockets are always there: before the first read, and from test doubles, the rest may be missing.
 */
export type ScrapeSnapshot = Pick<MetricsSnapshot, 'socketsOpen'> &
  Partial<Pick<MetricsSnapshot, 'runtime' | 'dns' | 'buffers' | 'traffic' | 'resilience'>> & {
    tunnels?: Partial<TunnelCounters>;
    authorization?: Partial<AuthorizationCounters>;
    crl?: CrlCounters;
  };

/** The in-pod workload proxy manager's counters (native inpodState), rendered under ztunnel's names. */
export interface WorkloadManagerCounters {
  activeProxies: number;
  pendingProxies: number;
  proxiesStarted: number;
  proxiesStopped: number;
}

const NO_TUNNELS: TunnelCounters = {
  outboundOpened: 0,
  outboundActive: 0,
  inboundAccepted: 0,
  inboundActive: 0,
  inboundHandshakeFailures: 0,
  outboundHandshakeFailures: 0,
  inboundRefusedPeerLimit: 0,
  inboundRefusedResets: 0,
  acceptErrors: 0,
};

/** name, type, help, and which snapshot field each direction reads. */
const TUNNEL_METRICS: ReadonlyArray<{
  name: string;
  type: 'counter' | 'gauge';
  help: string;
  outbound: keyof TunnelCounters;
  inbound: keyof TunnelCounters;
}> = [
  {
    name: 'ztunnel_node_hbone_connections_opened_total',
    type: 'counter',
    help: 'HBONE (mTLS + HTTP/2) connections established: outbound by the pool, inbound accepted on 15008',
    outbound: 'outboundOpened',
    inbound: 'inboundAccepted',
  },
  {
    name: 'ztunnel_node_hbone_connections_active',
    type: 'gauge',
    help: 'HBONE (mTLS + HTTP/2) connections currently open',
    outbound: 'outboundActive',
    inbound: 'inboundActive',
  },
  {
    name: 'ztunnel_node_tls_handshake_failures_total',
    type: 'counter',
    help: 'HBONE TLS handshakes that failed (peer certificate refused, protocol mismatch, timeout)',
    outbound: 'outboundHandshakeFailures',
    inbound: 'inboundHandshakeFailures',
  },
];

/** ztunnel's two content types (src/metrics/server.rs): the body is OpenMetrics text either way. */
export const PROMETHEUS_CONTENT_TYPE = 'text/plain; charset=utf-8';
export const OPENMETRICS_CONTENT_TYPE = 'application/openmetrics-text;charset=utf-8;version=1.0.0';

/** As ztunnel decides: some Accept entry's media type (before any `;`) is application/openmetrics-text. */
export function wantsOpenMetrics(accept: string | undefined): boolean {
  return (accept ?? '')
    .split(',')
    .some((entry) => (entry.split(';')[0] ?? '').trim().toLowerCase() === 'application/openmetrics-text');
}

export interface MetricsOptions {
  /** Reads the native counters (Dataplane.metrics). */
  snapshot: () => ScrapeSnapshot;
  /** ISTIO_META_ISTIO_VERSION, the istio_build tag. */
  istioVersion: string | null;
  /** process_open_fds, process_max_fds and the other prom-client process metrics (off in unit tests). */
  defaultMetrics?: boolean;
  /** The in-pod manager (shared and dedicated modes); absent or null: the workload_manager_* metrics are not rendered. */
  workloadManager?: () => WorkloadManagerCounters | null;
  /** WORKLOAD_SELECTOR policies named by workloads but not known (each denies its workload's inbound; fail closed). */
  missingPolicies?: () => number;
  /** The XDS client's counters (ts/xds/metrics.ts); absent: no XDS metrics are rendered. */
  xds?: () => XdsCounters;
  /** Connections the admin, stats and readiness servers closed at their connection cap, per server. */
  httpDropped?: () => Record<string, number>;
  /** Dataplane log lines suppressed by its per-cause rate limit, by cause. */
  suppressedLogs?: () => ReadonlyMap<string, number>;
  /** Hand-overs to and from other daemons of this node (ts/lifecycle/handover.ts). */
  handover?: () => HandoverTotals;
  /** The OTLP export of the access log (ts/log/otlp.ts); null while it is off. */
  otlp?: () => { exported: number; dropped: number; failed: number } | null;
}

/** What the hand-over metrics read: every hand-over this daemon took part in, by role (`take`, `give`). */
export interface HandoverTotals {
  /** Hand-overs by role and result (`done`, `failed`). */
  readonly exchanges: ReadonlyMap<string, number>;
  /** Connections by what became of them: `taken` (here from a predecessor), `given` (to a successor), `kept`
   * (paused for a successor that did not take them; they drain here). */
  readonly connections: ReadonlyMap<string, number>;
  /** The last hand-over's duration by role, seconds; and the longest pause one of its connections saw. */
  readonly lastDurationSeconds: ReadonlyMap<string, number>;
  readonly lastPauseSeconds: number | null;
}

type ContentType = RegistryContentType;

const DNS_LABELS = ['request_query_type', 'request_protocol', 'source_canonical_service', 'source_canonical_revision'] as const;
/** ztunnel's HELP texts (src/dns/metrics.rs), so dashboards built on them read the same. */
const DNS_DURATION_HELP = 'Total time in seconds Istio takes to get DNS response from upstream (unstable)';
/**
 * ztunnel's buckets for the upstream duration histogram, in seconds. Its source (src/dns/metrics.rs) writes the first
 * as 0.005, which breaks the ascending order; 0.0005 is taken as meant.
 */
export const DNS_DURATION_BUCKETS = [0.0005, 0.001, 0.01, 0.1, 1, 5] as const;
const DNS_COUNTERS = [
  { name: 'istio_dns_requests_total', help: 'Total number of DNS requests (unstable)', field: 'requests' },
  { name: 'istio_dns_upstream_requests_total', help: 'Total number of DNS requests forwarded to upstream (unstable)', field: 'upstreamRequests' },
  { name: 'istio_dns_upstream_failures_total', help: 'Total number of DNS requests that failed to forward upstream (unstable)', field: 'upstreamFailures' },
] as const;

function dnsLabels(l: Record<(typeof DNS_LABELS)[number], string>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const k of DNS_LABELS) out[k] = l[k] === '' ? 'unknown' : l[k];
  return out;
}

/** Counters without labels, each a running total the snapshot `read` returns (0 while there is none). */
function registerTotals<F extends string>(
  reg: Registry<ContentType>,
  counters: readonly { readonly name: string; readonly help: string; readonly field: F }[],
  read: () => Readonly<Record<F, number>> | null | undefined,
): void {
  const { Counter } = prom();
  for (const c of counters) {
    new Counter({
      name: c.name,
      help: c.help,
      registers: [reg],
      collect() {
        this.reset();
        this.inc(read()?.[c.field] ?? 0);
      },
    });
  }
}

/**
 * The DNS proxy's metrics (ztunnel's names and labels). The histogram's buckets are counted in Rust, so it is a
 * metric object of our own that renders them as they are (prom-client's Histogram can only observe values).
 */
function registerDnsMetrics(reg: Registry<ContentType>, dns: () => DnsCounters | undefined): void {
  const { Counter, Gauge } = prom();
  for (const c of DNS_COUNTERS) {
    new Counter({
      name: c.name,
      help: c.help,
      labelNames: DNS_LABELS,
      registers: [reg],
      collect() {
        this.reset();
        for (const row of dns()?.rows ?? []) this.inc(dnsLabels(row.labels), row[c.field]);
      },
    });
  }
  // ztunnel-node's own: the DNS proxies' caches of forwarded answers (native/dataplane/src/dns/cache.rs).
  const cache = [
    { name: 'ztunnel_node_dns_cache_hits_total', help: 'DNS questions the mesh does not answer, answered from a cache of forwarded answers', field: 'cacheHits' },
    { name: 'ztunnel_node_dns_cache_misses_total', help: 'DNS questions the mesh does not answer that no cache held, forwarded upstream', field: 'cacheMisses' },
    { name: 'ztunnel_node_dns_requests_dropped_total', help: "DNS questions dropped over a proxy's rate budget or in-flight cap, and TCP connections refused or closed at its cap", field: 'dropped' },
  ] as const;
  registerTotals(reg, cache, () => dns());
  new Gauge({
    name: 'ztunnel_node_dns_cache_entries',
    help: "Forwarded DNS answers held in the DNS proxies' caches",
    registers: [reg],
    collect() {
      this.set(dns()?.cacheEntries ?? 0);
    },
  });
  const name = 'istio_dns_upstream_request_duration_seconds';
  reg.registerMetric({
    name,
    help: DNS_DURATION_HELP,
    type: 'histogram',
    get: () => {
      const values: Array<{ metricName: string; labels: Record<string, string | number>; value: number }> = [];
      for (const row of dns()?.rows ?? []) {
        if (row.durationCount === 0) continue;
        const labels = dnsLabels(row.labels);
        DNS_DURATION_BUCKETS.forEach((le, i) => {
          values.push({ metricName: `${name}_bucket`, labels: { ...labels, le }, value: row.durationBuckets[i] ?? 0 });
        });
        values.push({ metricName: `${name}_bucket`, labels: { ...labels, le: '+Inf' }, value: row.durationCount });
        values.push({ metricName: `${name}_sum`, labels, value: row.durationSum });
        values.push({ metricName: `${name}_count`, labels, value: row.durationCount });
      }
      return Promise.resolve({ name, help: DNS_DURATION_HELP, type: 'histogram', values, aggregator: 'sum' });
    },
  } as unknown as Parameters<Registry<ContentType>['registerMetric']>[0]);
}

/** ztunnel's tokio_* metrics (src/metrics/tokio_runtime.rs: names and HELP texts), for the dataplane's runtime. */
function registerRuntimeMetrics(reg: Registry<ContentType>, runtime: () => MetricsSnapshot['runtime']): void {
  const { Counter, Gauge } = prom();
  const gauges = [
    { name: 'tokio_num_workers', help: 'the number of worker threads used by the runtime', field: 'workers' },
    { name: 'tokio_global_queue_depth', help: "the number of tasks currently scheduled in the runtime's global queue", field: 'globalQueueDepth' },
    { name: 'tokio_num_alive_tasks', help: 'the number of alive tasks in the runtime', field: 'aliveTasks' },
  ] as const;
  for (const g of gauges) {
    new Gauge({
      name: g.name,
      help: g.help,
      registers: [reg],
      collect() {
        const r = runtime();
        if (r) this.set(r[g.field]);
      },
    });
  }
  const perWorker = [
    { name: 'tokio_worker_total_busy_duration_seconds', help: 'the amount of time worker threads have been busy', field: 'busySeconds' },
    { name: 'tokio_worker_park_count', help: 'the total number of times the given worker thread has parked', field: 'parks' },
    {
      name: 'tokio_worker_park_unpark_count',
      help: 'the total number of times the given worker thread has parked and unparked',
      field: 'parkUnparks',
    },
  ] as const;
  for (const c of perWorker) {
    new Counter({
      name: c.name,
      help: c.help,
      labelNames: ['worker'],
      registers: [reg],
      collect() {
        this.reset();
        runtime()?.[c.field].forEach((v, worker) => this.inc({ worker: String(worker) }, v));
      },
    });
  }
}

export class Metrics {
  private current: ScrapeSnapshot = { socketsOpen: { source: 0, destination: 0 } };
  // prom-client renames counters in place when rendering OpenMetrics, so each format gets its own registry
  // (built on first use) instead of switching one registry's content type.
  private readonly registries = new Map<ContentType, Registry<ContentType>>();
  private lock: Promise<unknown> = Promise.resolve();

  constructor(private readonly opts: MetricsOptions) {}

  /**
   * Renders all metrics as ztunnel does: the body is always OpenMetrics text (counter families named without
   * `_total`, samples with it, `# EOF` last); the content type is OpenMetrics when `accept` asks for it, else plain
   * text, which Prometheus reads the same.
   */
  render(accept?: string): Promise<{ contentType: string; body: string }> {
    const contentType = wantsOpenMetrics(accept) ? OPENMETRICS_CONTENT_TYPE : PROMETHEUS_CONTENT_TYPE;
    const run = this.lock.then(async () => {
      this.current = this.opts.snapshot();
      const rest = await this.registry(prom().Registry.OPENMETRICS_CONTENT_TYPE).metrics();
      return { contentType, body: (this.current.traffic ?? '') + rest };
    });
    this.lock = run.catch(() => undefined);
    return run;
  }

  private registry(type: ContentType): Registry<ContentType> {
    let reg = this.registries.get(type);
    if (reg) return reg;
    const { Registry, Counter, Gauge } = prom();
    reg = new Registry<ContentType>();
    reg.setContentType(type);
    // An accessor, because prom-client calls collect() with `this` bound to the metric.
    const current = () => this.current;
    new Gauge({
      name: 'istio_tcp_sockets_open',
      help: 'The current number of open TCP sockets (unstable)',
      labelNames: ['reporter'],
      registers: [reg],
      collect() {
        this.set({ reporter: 'source' }, current().socketsOpen.source);
        this.set({ reporter: 'destination' }, current().socketsOpen.destination);
      },
    });
    const tunnels = (): TunnelCounters => ({ ...NO_TUNNELS, ...current().tunnels });
    for (const t of TUNNEL_METRICS) {
      const common = { name: t.name, help: t.help, labelNames: ['direction'] as const, registers: [reg] };
      if (t.type === 'gauge') {
        new Gauge({
          ...common,
          collect() {
            const now = tunnels();
            this.set({ direction: 'outbound' }, now[t.outbound]);
            this.set({ direction: 'inbound' }, now[t.inbound]);
          },
        });
      } else {
        new Counter({
          ...common,
          collect() {
            const now = tunnels();
            this.reset();
            this.inc({ direction: 'outbound' }, now[t.outbound]);
            this.inc({ direction: 'inbound' }, now[t.inbound]);
          },
        });
      }
    }
    const xds = this.opts.xds;
    if (xds !== undefined) {
      const XDS_COUNTERS = [
        { name: 'istio_xds_connection_terminations_total', help: 'The total number of completed connections to xds server (unstable)', label: 'reason', field: 'terminations' },
        { name: 'istio_xds_message_total', help: 'Total number of messages received (unstable)', label: 'url', field: 'messages' },
        { name: 'istio_xds_message_bytes_total', help: 'Total number of bytes received (unstable)', label: 'url', field: 'bytes' },
      ] as const;
      for (const c of XDS_COUNTERS) {
        new Counter({
          name: c.name,
          help: c.help,
          labelNames: [c.label],
          registers: [reg],
          collect() {
            this.reset();
            for (const [k, v] of Object.entries(xds()[c.field])) this.inc({ [c.label]: k }, v);
          },
        });
      }
    }
    const authz = [
      { name: 'ztunnel_node_authorization_denied_total', help: 'Inbound connections refused by L4 authorization', field: 'denied' },
      {
        name: 'ztunnel_node_connections_closed_by_policy_total',
        help: 'Live inbound connections closed because a policy change denied them',
        field: 'closedByPolicyChange',
      },
    ] as const;
    for (const a of authz) {
      new Counter({
        name: a.name,
        help: a.help,
        registers: [reg],
        collect() {
          this.reset();
          this.inc(current().authorization?.[a.field] ?? 0);
        },
      });
    }
    // ztunnel's CRL counters (src/proxy/metrics.rs), by reporter: source outbound, destination inbound.
    const CRL = [
      { name: 'istio_crl_policy_rejections_total', help: 'Connections refused or closed because a certificate revocation list revokes the peer', field: 'policyRejections' },
      { name: 'istio_crl_untracked_connections_total', help: 'HBONE connections whose peer chain could not be followed for revocation', field: 'untrackedConnections' },
    ] as const;
    for (const c of CRL) {
      new Counter({
        name: c.name,
        help: c.help,
        labelNames: ['reporter'],
        registers: [reg],
        collect() {
          this.reset();
          const n = current().crl?.[c.field];
          this.inc({ reporter: 'source' }, n?.source ?? 0);
          this.inc({ reporter: 'destination' }, n?.destination ?? 0);
        },
      });
    }
    // Beyond ztunnel: connect retries and outlier ejection (native proxy/outlier.rs).
    new Counter({
      name: 'ztunnel_node_connect_retries_total',
      help: 'Service-addressed connects tried again on another endpoint after the chosen one failed before the tunnel',
      registers: [reg],
      collect() {
        this.reset();
        this.inc(current().resilience?.connectRetries ?? 0);
      },
    });
    new Counter({
      name: 'ztunnel_node_outlier_ejections_total',
      help: 'Endpoints ejected after consecutive connect failures',
      registers: [reg],
      collect() {
        this.reset();
        this.inc(current().resilience?.ejections ?? 0);
      },
    });
    new Gauge({
      name: 'ztunnel_node_outlier_ejected_endpoints',
      help: 'Endpoints ejected now (skipped by load balancing until their ejection time is up)',
      registers: [reg],
      collect() {
        this.set(current().resilience?.ejectedEndpoints ?? 0);
      },
    });
    const otlp = this.opts.otlp;
    if (otlp !== undefined) {
      new Counter({
        name: 'ztunnel_node_otlp_log_records_total',
        help: 'Access records sent to the OTLP collector, by result (exported; dropped: the export queue was full; failed: the export failed after its retries)',
        labelNames: ['result'],
        registers: [reg],
        collect() {
          this.reset();
          const c = otlp();
          if (c === null) return;
          for (const result of ['exported', 'dropped', 'failed'] as const) this.inc({ result }, c[result]);
        },
      });
    }
    registerDnsMetrics(reg, () => current().dns);
    new Counter({
      name: 'ztunnel_node_hbone_connections_refused_total',
      help:
        'Inbound HBONE connections closed at accept, by reason (peer_limit: the peer IP held 512 connections to the listener; premature_resets: the peer is banned for resetting most of its recent streams prematurely)',
      labelNames: ['reason'],
      registers: [reg],
      collect() {
        this.reset();
        this.inc({ reason: 'peer_limit' }, tunnels().inboundRefusedPeerLimit);
        this.inc({ reason: 'premature_resets' }, tunnels().inboundRefusedResets);
      },
    });
    const handover = this.opts.handover;
    if (handover !== undefined) registerHandoverMetrics(reg, handover);
    registerRuntimeMetrics(reg, () => current().runtime ?? null);
    const buffers = (): Partial<NonNullable<MetricsSnapshot['buffers']>> => current().buffers ?? {};
    new Gauge({
      name: 'ztunnel_node_buffered_bytes',
      help: 'Stream data read for HBONE peers and not yet written to them, across all connections',
      registers: [reg],
      collect() {
        this.set(buffers().buffered ?? 0);
      },
    });
    new Gauge({
      name: 'ztunnel_node_buffer_budget_bytes',
      help: 'The budget for ztunnel_node_buffered_bytes (STREAM_BUFFER_BUDGET)',
      registers: [reg],
      collect() {
        this.set(buffers().budget ?? 0);
      },
    });
    new Counter({
      name: 'ztunnel_node_buffer_backpressured_streams_total',
      help: 'Streams that stopped reading from their application while the node was over its buffer budget',
      registers: [reg],
      collect() {
        this.reset();
        this.inc(buffers().backpressuredStreams ?? 0);
      },
    });
    new Counter({
      name: 'ztunnel_node_buffer_shed_connections_total',
      help: 'HBONE connections closed because the node stayed over its buffer budget (the largest holder first)',
      registers: [reg],
      collect() {
        this.reset();
        this.inc(buffers().shedConnections ?? 0);
      },
    });
    new Counter({
      name: 'ztunnel_node_accept_errors_total',
      help: "Failed accepts on the dataplane's listeners (descriptor or buffer exhaustion); each is logged, rate-limited",
      registers: [reg],
      collect() {
        this.reset();
        this.inc(tunnels().acceptErrors);
      },
    });
    const suppressedLogs = this.opts.suppressedLogs;
    if (suppressedLogs !== undefined) {
      new Counter({
        name: 'ztunnel_node_log_lines_suppressed_total',
        help: 'Dataplane warnings and errors not logged: more than 100 a second of one cause',
        labelNames: ['cause'],
        registers: [reg],
        collect() {
          this.reset();
          for (const [cause, n] of suppressedLogs()) this.inc({ cause }, n);
        },
      });
    }
    const httpDropped = this.opts.httpDropped;
    if (httpDropped !== undefined) {
      new Counter({
        name: 'ztunnel_node_http_connections_dropped_total',
        help: 'Connections the admin, stats and readiness servers closed at their connection limit',
        labelNames: ['server'],
        registers: [reg],
        collect() {
          this.reset();
          for (const [server, n] of Object.entries(httpDropped())) this.inc({ server }, n);
        },
      });
    }
    const missing = this.opts.missingPolicies;
    if (missing !== undefined) {
      new Gauge({
        name: 'ztunnel_node_authorization_missing_policies',
        help: 'Policy references (workload, WORKLOAD_SELECTOR policy) whose policy has not arrived: that workload denies inbound until it does',
        registers: [reg],
        collect() {
          this.set(missing());
        },
      });
    }
    const wm = this.opts.workloadManager;
    if (wm !== undefined) {
      const gauges = [
        { name: 'workload_manager_active_proxy_count', help: 'The total number current workloads with active proxies', field: 'activeProxies' },
        { name: 'workload_manager_pending_proxy_count', help: 'The total number current workloads with pending proxies', field: 'pendingProxies' },
      ] as const;
      for (const g of gauges) {
        new Gauge({ name: g.name, help: g.help, registers: [reg], collect() { this.set(wm()?.[g.field] ?? 0); } });
      }
      const counters = [
        { name: 'workload_manager_proxies_started_total', help: 'The total number of proxies that were started', field: 'proxiesStarted' },
        { name: 'workload_manager_proxies_stopped_total', help: 'The total number of proxies that were stopped', field: 'proxiesStopped' },
      ] as const;
      registerTotals(reg, counters, () => wm());
    }
    const build = new Gauge({
      name: 'istio_build',
      help: 'Istio component build info',
      labelNames: ['component', 'tag'],
      registers: [reg],
    });
    build.set({ component: 'ztunnel', tag: this.opts.istioVersion ?? 'unknown' }, 1);
    if (this.opts.defaultMetrics ?? true) registerDefaultMetrics(reg);
    this.registries.set(type, reg);
    return reg;
  }
}

function registerHandoverMetrics(reg: Registry<ContentType>, totals: () => HandoverTotals): void {
  const { Counter, Gauge } = prom();
  new Counter({
    name: 'ztunnel_node_handovers_total',
    help: 'Hand-overs between two daemons of this node this daemon took part in, by role (take: as the successor, give: as the predecessor) and result',
    labelNames: ['role', 'result'],
    registers: [reg],
    collect() {
      this.reset();
      for (const [key, n] of totals().exchanges) {
        const [role, result] = key.split('/');
        this.inc({ role, result }, n);
      }
    },
  });
  new Counter({
    name: 'ztunnel_node_handover_connections_total',
    help: 'Established connections by hand-over outcome (taken: from a predecessor; given: to a successor; kept: paused for a successor that did not take them)',
    labelNames: ['outcome'],
    registers: [reg],
    collect() {
      this.reset();
      for (const [outcome, n] of totals().connections) this.inc({ outcome }, n);
    },
  });
  new Gauge({
    name: 'ztunnel_node_handover_duration_seconds',
    help: "The last hand-over's duration, from the first frame to the last, by role",
    labelNames: ['role'],
    registers: [reg],
    collect() {
      this.reset();
      for (const [role, s] of totals().lastDurationSeconds) this.set({ role }, s);
    },
  });
  new Gauge({
    name: 'ztunnel_node_handover_pause_seconds',
    help: 'The longest a connection was paused in the last hand-over this daemon gave',
    registers: [reg],
    collect() {
      this.reset();
      const p = totals().lastPauseSeconds;
      if (p !== null) this.set(p);
    },
  });
}
