// The live dashboard on the admin port: GET /dashboard (one static page, dashboard-page.ts) and GET
// /dashboard/events, server-sent events: a `snapshot` when a page connects, then an `update` about once a second.
//
// Invariants:
// - It reads only what the daemon already has, in batches: the dataplane's metrics snapshot and its live
//   connections (one native call each per tick), the control side's list of this node's workloads and its
//   certificate states, and the access events the event pump drains anyway. Nothing is asked of the dataplane per
//   connection, and nothing at all while no page is connected: the tick timer runs only while one is, and events
//   are looked at only then.
// - Everything is bounded: at most MAX_CLIENTS pages at once (more get 503), at most LIST_LIMIT rows of each list
//   (with the total), a ring of POINTS_KEPT chart points (~10 minutes) and one of DECISIONS_KEPT authorization
//   decisions; a page that does not read (more than MAX_CLIENT_BUFFER bytes queued to it) is disconnected.
// - Read-only: the events stream changes nothing, and answers only requests an operator's browser makes (the admin
//   server's notFromAnOperator: no other site's page, no DNS rebinding) since it shows the mesh's identities.
// - Mesh strings (names, identities) are data: they travel as JSON and the page renders them as text only.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { CertificateSummary } from '../ca/manager.js';
import type { InPodWorkload, MetricsSnapshot, NativeEvent, Workload } from '../native/types.js';
import { workloadIdentity } from '../state/model.js';
import { DASHBOARD_CSP, DASHBOARD_HTML } from './dashboard-page.js';
import { reply } from './http.js';

/** How often a connected page is updated. */
export const DASHBOARD_INTERVAL_MS = 1_000;
/** Pages connected at once; the admin server holds 32 connections in all (http.ts), so operators' tools keep room. */
export const MAX_CLIENTS = 8;
/** Rows of each list sent (workloads, certificates, connections, flows); the totals are sent too. */
export const LIST_LIMIT = 100;
/** Chart points kept: 10 minutes at one a second. */
export const POINTS_KEPT = 600;
/** Authorization decisions kept for a page that connects, and at most sent in one update. */
export const DECISIONS_KEPT = 100;
/** Bytes queued to a page that is not reading before it is disconnected (a snapshot is well under this). */
export const MAX_CLIENT_BUFFER = 1 << 20;

/** What the dashboard reads; the daemon (lifecycle/proxy.ts, through lifecycle/dashboard.ts) provides it. */
export interface DashboardSource {
  readonly node: string;
  readonly mode: string;
  /** This node's workloads (unsorted; only the first LIST_LIMIT are read). */
  workloads(): ReadonlyMap<string, Workload>;
  certificates(): CertificateSummary[];
  /** The dataplane's counters; null before it opens. */
  metrics(): MetricsSnapshot | null;
  /** config_dump's `workloadState`: the workloads served here, with their live connections. */
  workloadState(): Record<string, InPodWorkload | undefined>;
}

export interface Listed<T> {
  total: number;
  items: T[];
}

/** One chart point: rates over the interval that ended at `t` (ms since the epoch). */
export interface Point {
  t: number;
  /** Bytes per second, both directions of the connections each side reports. */
  inboundBps: number;
  outboundBps: number;
  /** Connections opened per second. */
  inboundCps: number;
  outboundCps: number;
  /** Connections denied per second (at their start; live ones a policy change closed are counted too). */
  deniedPs: number;
}

export interface Decision {
  t: number;
  verdict: 'allow' | 'deny' | 'revoke';
  srcIdentity: string;
  srcAddr: string;
  dstIdentity: string;
  dstWorkload: string;
  dstAddr: string;
  /** The deciding policy (namespace/name), when one decided. */
  policy: string;
  reason: string;
}

/** Live connections of one label set (Istio's traffic labels): who talks to whom, with identities, right now. */
export interface Flow {
  direction: 'inbound' | 'outbound';
  srcIdentity: string;
  srcWorkload: string;
  dstIdentity: string;
  dstWorkload: string;
  dstService: string;
  mtls: boolean;
  open: number;
  /** Bytes both ways since the dataplane started. */
  bytes: number;
}

export interface LiveConnection {
  /** The workload served here (uid key of workloadState) and its name. */
  workload: string;
  direction: 'inbound' | 'outbound';
  src: string;
  dst: string;
  protocol: string;
}

export interface DashboardState {
  at: number;
  node: string;
  mode: string;
  intervalMs: number;
  workloads: Listed<{ uid: string; name: string; namespace: string; identity: string; protocol: string; ips: string[] }>;
  certificates: Listed<CertificateSummary>;
  tunnels: { inbound: number; outbound: number };
  open: { inbound: number; outbound: number };
  /** Connect retries so far, and endpoints ejected now (README "Resilience"). */
  resilience: { retries: number; ejected: number };
  flows: Listed<Flow>;
  connections: Listed<LiveConnection>;
}

/** A `snapshot` carries the rings whole; an `update` the points and decisions since the last one. */
export interface DashboardMessage extends DashboardState {
  points: Point[];
  decisions: Decision[];
  /** Decisions that happened but are not listed (the dataplane's log rate limit, or more than one update holds). */
  missedDecisions: number;
}

interface Totals {
  t: number;
  inBytes: number;
  outBytes: number;
  inOpened: number;
  outOpened: number;
  denied: number;
}

/** A ring of at most `size` items, oldest first, each numbered. */
class Ring<T> {
  private readonly items: T[] = [];
  private seq = 0;
  constructor(private readonly size: number) {}
  push(item: T): void {
    this.items.push(item);
    if (this.items.length > this.size) this.items.shift();
    this.seq++;
  }
  /** The items pushed after sequence number `after` that are still held, and how many were already dropped. */
  since(after: number): { items: T[]; lost: number } {
    const fresh = this.seq - after;
    const items = fresh <= 0 ? [] : this.items.slice(-Math.min(fresh, this.items.length));
    return { items, lost: Math.max(0, fresh - items.length) };
  }
  get last(): number {
    return this.seq;
  }
  /** The items held that were pushed up to sequence number `upTo`. */
  until(upTo: number): T[] {
    return this.items.slice(0, Math.max(0, this.items.length - (this.seq - upTo)));
  }
}

interface Client {
  res: ServerResponse;
}

export class Dashboard {
  private readonly clients = new Set<Client>();
  private timer: NodeJS.Timeout | null = null;
  private readonly points = new Ring<Point>(POINTS_KEPT);
  private readonly decisions = new Ring<Decision>(DECISIONS_KEPT);
  private prev: Totals | null = null;
  private sentPoints = 0;
  private sentDecisions = 0;
  /** Decisions the dataplane counted but did not report one by one (its per-cause log rate limit). */
  private suppressed = 0;

  constructor(
    private readonly source: DashboardSource,
    private readonly opts: { intervalMs?: number; now?: () => number } = {},
  ) {}

  private get now(): number {
    return (this.opts.now ?? Date.now)();
  }

  /** Pages connected now. */
  get watching(): number {
    return this.clients.size;
  }

  /** GET /dashboard (the page) and /dashboard/events (the stream). `refused`: why the stream is not served, or null. */
  serve(req: IncomingMessage, res: ServerResponse, path: string, refused: string | null): void {
    if (req.method !== 'GET' && (req.method !== 'HEAD' || path !== '/dashboard')) return reply(res, 405, 'GET only\n');
    if (path === '/dashboard') {
      res.writeHead(200, {
        'content-type': 'text/html; charset=utf-8',
        'content-length': Buffer.byteLength(DASHBOARD_HTML),
        'content-security-policy': DASHBOARD_CSP,
        'cache-control': 'no-store',
        'referrer-policy': 'no-referrer',
        'x-content-type-options': 'nosniff',
        'x-frame-options': 'DENY',
      });
      res.end(req.method === 'HEAD' ? undefined : DASHBOARD_HTML);
      return;
    }
    if (refused !== null) return reply(res, 403, refused);
    if (this.clients.size >= MAX_CLIENTS) return reply(res, 503, `the dashboard serves ${MAX_CLIENTS} pages at once\n`);
    this.connect(res);
  }

  /** The access events of one pump batch: authorization decisions, looked at only while a page is connected. */
  observe(events: readonly NativeEvent[]): void {
    if (this.clients.size === 0) return;
    for (const ev of events) {
      if (ev.kind === 'suppressed') {
        if (ev.fields.kind === 'access' && DENIALS.has(ev.message)) this.suppressed += Number(ev.fields.count ?? 0);
        continue;
      }
      if (ev.kind !== 'access') continue;
      const d = decisionOf(ev.message, ev.fields, this.now);
      if (d !== null) this.decisions.push(d);
    }
  }

  /** Ends every stream (the daemon is shutting down) and stops the timer. */
  close(): void {
    for (const c of this.clients) c.res.end();
    this.clients.clear();
    this.stop();
  }

  private connect(res: ServerResponse): void {
    const client: Client = { res };
    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-store',
      'x-content-type-options': 'nosniff',
    });
    res.socket?.setNoDelay(true);
    const leave = () => {
      this.clients.delete(client);
      if (this.clients.size === 0) this.stop();
    };
    res.once('close', leave);
    this.clients.add(client);
    const metrics = this.source.metrics();
    if (this.timer === null) {
      // A first page: start from fresh counters, so the first point covers one interval of this session.
      this.prev = this.totals(metrics);
      this.sentPoints = this.points.last;
      this.sentDecisions = this.decisions.last;
      this.timer = setInterval(() => this.tick(), this.opts.intervalMs ?? DASHBOARD_INTERVAL_MS);
      this.timer.unref();
    }
    // What the pages have been sent so far; the next update brings the rest to this page too.
    const snapshot: DashboardMessage = {
      ...this.state(metrics),
      points: this.points.until(this.sentPoints),
      decisions: this.decisions.until(this.sentDecisions),
      missedDecisions: 0,
    };
    this.send(client, `retry: 2000\nevent: snapshot\ndata: ${JSON.stringify(snapshot)}\n\n`);
  }

  private stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  /** One update: sample, then the same text to every page. */
  tick(): void {
    if (this.clients.size === 0) return;
    const metrics = this.source.metrics();
    const totals = this.totals(metrics);
    if (this.prev !== null && totals !== null && totals.t > this.prev.t) this.points.push(rates(this.prev, totals));
    if (totals !== null) this.prev = totals;
    const points = this.points.since(this.sentPoints);
    const decisions = this.decisions.since(this.sentDecisions);
    this.sentPoints = this.points.last;
    this.sentDecisions = this.decisions.last;
    const update: DashboardMessage = {
      ...this.state(metrics),
      points: points.items,
      decisions: decisions.items,
      missedDecisions: decisions.lost + this.suppressed,
    };
    this.suppressed = 0;
    const text = `event: update\ndata: ${JSON.stringify(update)}\n\n`;
    for (const c of this.clients) this.send(c, text);
  }

  private send(client: Client, text: string): void {
    const { res } = client;
    if (res.destroyed) return;
    res.write(text);
    // A page that stopped reading (a frozen tab, a stalled network) would make this buffer grow with every update.
    if (res.writableLength > MAX_CLIENT_BUFFER) res.destroy();
  }

  private totals(metrics: MetricsSnapshot | null): Totals | null {
    if (metrics === null) return null;
    const t: Totals = { t: this.now, inBytes: 0, outBytes: 0, inOpened: 0, outOpened: 0, denied: 0 };
    for (const c of metrics.connections) {
      if (c.labels.reporter === 'destination') {
        t.inBytes += c.sent + c.received;
        t.inOpened += c.opened;
      } else {
        t.outBytes += c.sent + c.received;
        t.outOpened += c.opened;
      }
    }
    t.denied = metrics.authorization.denied + metrics.authorization.closedByPolicyChange;
    return t;
  }

  private state(metrics: MetricsSnapshot | null): DashboardState {
    const source = this.source;
    const all = source.workloads();
    const workloads = [...first(all.values(), LIST_LIMIT)]
      .sort((a, b) => a.namespace.localeCompare(b.namespace) || a.name.localeCompare(b.name))
      .map((w) => ({ uid: w.uid, name: w.name, namespace: w.namespace, identity: workloadIdentity(w), protocol: w.protocol, ips: w.workloadIps }));
    const certificates = source.certificates();
    return {
      at: this.now,
      node: source.node,
      mode: source.mode,
      intervalMs: this.opts.intervalMs ?? DASHBOARD_INTERVAL_MS,
      workloads: { total: all.size, items: workloads },
      certificates: { total: certificates.length, items: certificates.slice(0, LIST_LIMIT) },
      tunnels: { inbound: metrics?.tunnels.inboundActive ?? 0, outbound: metrics?.tunnels.outboundActive ?? 0 },
      open: { inbound: metrics?.socketsOpen.destination ?? 0, outbound: metrics?.socketsOpen.source ?? 0 },
      resilience: { retries: metrics?.resilience.connectRetries ?? 0, ejected: metrics?.resilience.ejectedEndpoints ?? 0 },
      flows: flowsOf(metrics),
      connections: connectionsOf(source.workloadState()),
    };
  }
}

/** The denials' access events (warnings, so the dataplane's per-cause log rate limit may count them instead). */
const DENIALS = new Set(['connection denied', 'connection closed due to policy change']);

/**
 * An access event as an authorization decision, or null. Denied: "connection denied" (at the connection's start);
 * revoked: "connection closed due to policy change" (a live one a new policy denies); allowed: an inbound
 * "connection complete" (the connection was let in; it is reported when it ends, as ztunnel's access log is).
 */
export function decisionOf(message: string, f: Record<string, string | number | boolean>, t: number): Decision | null {
  const s = (k: string) => {
    const v = f[k];
    return v === undefined ? '' : String(v);
  };
  let verdict: Decision['verdict'];
  if (message === 'connection denied') verdict = 'deny';
  else if (message === 'connection closed due to policy change') verdict = 'revoke';
  else if (message === 'connection complete' && s('direction') === 'inbound' && s('error') !== 'connection closed due to policy change') verdict = 'allow';
  else return null;
  const error = s('error');
  return {
    t,
    verdict,
    srcIdentity: s('src.identity'),
    srcAddr: s('src.addr'),
    dstIdentity: s('dst.identity'),
    dstWorkload: s('dst.namespace') === '' ? s('dst.workload') : `${s('dst.namespace')}/${s('dst.workload')}`,
    dstAddr: s('dst.addr'),
    policy: s('policy'),
    reason: verdict === 'allow' ? error : s('reason') || error.replace(/^connection denied: /, ''),
  };
}

function rates(a: Totals, b: Totals): Point {
  const secs = (b.t - a.t) / 1000;
  const rate = (x: number, y: number) => Math.max(0, y - x) / secs;
  return {
    t: b.t,
    inboundBps: rate(a.inBytes, b.inBytes),
    outboundBps: rate(a.outBytes, b.outBytes),
    inboundCps: rate(a.inOpened, b.inOpened),
    outboundCps: rate(a.outOpened, b.outOpened),
    deniedPs: rate(a.denied, b.denied),
  };
}

/** The label sets with connections open now, most connections first. */
function flowsOf(metrics: MetricsSnapshot | null): Listed<Flow> {
  const flows: Flow[] = [];
  for (const c of metrics?.connections ?? []) {
    const open = c.opened - c.closed;
    if (open <= 0) continue;
    const l = c.labels;
    flows.push({
      direction: l.reporter === 'destination' ? 'inbound' : 'outbound',
      srcIdentity: l.source_principal,
      srcWorkload: qualified(l.source_workload_namespace, l.source_workload),
      dstIdentity: l.destination_principal,
      dstWorkload: qualified(l.destination_workload_namespace, l.destination_workload),
      dstService: l.destination_service,
      mtls: l.connection_security_policy === 'mutual_tls',
      open,
      bytes: c.sent + c.received,
    });
  }
  flows.sort((a, b) => b.open - a.open || b.bytes - a.bytes);
  return { total: flows.length, items: flows.slice(0, LIST_LIMIT) };
}

function connectionsOf(state: Record<string, InPodWorkload | undefined>): Listed<LiveConnection> {
  const items: LiveConnection[] = [];
  let total = 0;
  for (const [uid, w] of Object.entries(state)) {
    if (w?.connections === undefined) continue;
    const name = w.info.name === '' ? uid : qualified(w.info.namespace, w.info.name);
    for (const [direction, list] of [['inbound', w.connections.inbound], ['outbound', w.connections.outbound]] as const) {
      total += list.length;
      for (const c of list) {
        if (items.length >= LIST_LIMIT) break;
        items.push({ workload: name, direction, src: c.src, dst: c.actualDst, protocol: c.protocol });
      }
    }
  }
  return { total, items };
}

function qualified(namespace: string, name: string): string {
  if (name === '') return '';
  return namespace === '' ? name : `${namespace}/${name}`;
}

function* first<T>(it: Iterable<T>, n: number): Generator<T> {
  if (n <= 0) return;
  let i = 0;
  for (const x of it) {
    yield x;
    if (++i >= n) return;
  }
}
