// What the e2e scenarios share: the test namespace's workloads (pods the node's runtime runs, from Pod objects bound to
// the node), and what a scenario reads of them: a one-shot connection made inside a pod (`runc exec`, as `kubectl
// exec` would), a long-lived stream's counters (its container log), and ztunnel-node's own view (metrics,
// config_dump).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { parsePrometheusText, sumSamples } from '../../dist/cli/prom-text.js';
import { apiPath } from './lib/kube.js';
import { NODE_NAME, type Cluster } from './lib/cluster.js';

export const NS = 'e2e';
export const APP_IMAGE = 'ztn-e2e/app:1';
export const TRUST_DOMAIN = 'cluster.local';
export const spiffe = (sa: string, ns = NS): string => `spiffe://${TRUST_DOMAIN}/ns/${ns}/sa/${sa}`;

export interface AppPod {
  name: string;
  sa: string;
  labels: Record<string, string>;
  args: string[];
}

/** The Pod object of a test application, bound to the node (no scheduler involved). */
export function appPod({ name, sa, labels, args }: AppPod): object {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, namespace: NS, labels },
    spec: {
      nodeName: NODE_NAME,
      serviceAccountName: sa,
      terminationGracePeriodSeconds: 5,
      containers: [{ name: 'app', image: APP_IMAGE, args, ports: [{ containerPort: 8080 }] }],
    },
  };
}

/** The test namespace (ambient), its service accounts, and a Service per entry of `services` (name → app label). */
export async function namespace(c: Cluster, serviceAccounts: string[], services: Record<string, string>): Promise<void> {
  const docs: object[] = [
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: NS, labels: { 'istio.io/dataplane-mode': 'ambient' } } },
    ...serviceAccounts.map((name) => ({ apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name, namespace: NS } })),
    ...Object.entries(services).map(([name, app]) => ({
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name, namespace: NS },
      spec: { selector: { app }, ports: [{ name: 'tcp-echo', port: 8080, targetPort: 8080, protocol: 'TCP' }] },
    })),
  ];
  await c.apply(docs.map((d) => JSON.stringify(d)).join('\n---\n'));
}

export async function createPods(c: Cluster, pods: AppPod[]): Promise<void> {
  for (const p of pods) await c.admin.create(apiPath('pods', { namespace: NS }), appPod(p));
}

export interface ConnectResult {
  ok: boolean;
  ms: number;
  error?: string;
}

/** One connection from inside `pod` to `target` (host:port), `bytes` out and echoed back. */
export async function connectFrom(c: Cluster, pod: string, target: string, { bytes = 1024, timeoutMs = 5_000 } = {}): Promise<ConnectResult> {
  const out = await c.runtime.exec(NS, pod, 'app', ['node', '/app/app.mjs', 'connect', '--target', target, '--bytes', String(bytes), '--timeout', String(timeoutMs)], timeoutMs + 10_000);
  return JSON.parse(out.trim().split('\n').pop()!) as ConnectResult;
}

/** Polls `check` every 250 ms until it returns true (or a truthy value), failing with `what` after `timeoutMs`. */
export async function eventually<T>(what: string, check: () => Promise<T | false | null | undefined>, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const v = await check();
      if (v) return v;
      last = v;
    } catch (err) {
      last = err;
    }
    await sleep(250);
  }
  throw new Error(`${what}: not within ${timeoutMs / 1000} s (last: ${last instanceof Error ? last.message : JSON.stringify(last)})`);
}

/** A stream app's counters (its last JSON line). */
export interface StreamCounters {
  connected: boolean;
  connects: number;
  sent: number;
  echoed: number;
  mismatches: number;
  errors: number;
  lastError: string | null;
  since: string | null;
  at: string;
}

export function streamCounters(c: Cluster, pod: string): StreamCounters {
  const running = c.runtime.running(NS, pod);
  const log = running?.containers.find((x) => x.name === 'app')?.log;
  if (!log) throw new Error(`no running pod ${NS}/${pod}`);
  const lines = readFileSync(log, 'utf8').trim().split('\n').filter((l) => l.startsWith('{"connected"'));
  if (lines.length === 0) throw new Error(`${pod} has printed no counters yet (${log})`);
  return JSON.parse(lines.at(-1)!) as StreamCounters;
}

/** Waits for `pod`'s stream to be connected and echoing; resolves its counters then. */
export async function streamFlowing(c: Cluster, pod: string, timeoutMs = 60_000): Promise<StreamCounters> {
  return eventually(`${pod}'s stream connected and echoing`, async () => {
    const s = streamCounters(c, pod);
    return s.connected && s.echoed > 0 ? s : false;
  }, timeoutMs);
}

/**
 * The stream of `pod` crossed what happened since `before` on the same connection, byte-exact: no new connection, no
 * error, no mismatch, and it went on echoing (at least `minMore` more records).
 */
export async function assertStreamSurvived(c: Cluster, pod: string, before: StreamCounters, minMore = 10): Promise<StreamCounters> {
  const now = await eventually(`${pod}'s stream echoing ${minMore} more records`, async () => {
    const s = streamCounters(c, pod);
    return s.echoed >= before.echoed + minMore || s.connects !== before.connects || s.errors !== before.errors ? s : false;
  });
  assert.equal(now.connects, before.connects, `${pod}: the connection was made again (${now.lastError ?? ''})`);
  assert.equal(now.errors, before.errors, `${pod}: the connection failed (${now.lastError ?? ''})`);
  assert.equal(now.mismatches, 0, `${pod}: a record came back different`);
  assert.ok(now.connected, `${pod}: not connected`);
  assert.ok(now.sent - now.echoed < 50, `${pod}: ${now.sent - now.echoed} records sent and not echoed`);
  return now;
}

/** ztunnel-node's metrics (the node's stats port) as text. */
export async function metricsText(c: Cluster): Promise<string> {
  const r = await c.ztunnelGet(15020, '/metrics');
  assert.equal(r.status, 200);
  return r.body;
}

/** The sum of the samples of `name` whose labels include `labels` (the daemon's own Prometheus text reader). */
export function metricSum(text: string, name: string, labels: Record<string, string>): number {
  return sumSamples(parsePrometheusText(text), name, labels);
}

/** ztunnel-node's config_dump. */
export async function configDump(c: Cluster): Promise<ConfigDump> {
  const r = await c.ztunnelGet(15000, '/config_dump');
  assert.equal(r.status, 200, r.body);
  return JSON.parse(r.body) as ConfigDump;
}

/** A certificate as config_dump shows it: `pem` is the base64 of the PEM text. */
export interface DumpedCert {
  pem: string;
  serialNumber: string;
  validFrom: string;
  expirationTime: string;
}

export interface ConfigDump {
  workloads: { name: string; namespace: string; workloadIps: string[]; serviceAccount: string; node: string; uid: string }[];
  services: { name: string; namespace: string; vips: string[]; endpoints: Record<string, unknown> }[];
  policies: { name: string; namespace: string; action: string }[];
  certificates: { identity: string; state: string; certChain: DumpedCert[]; rootCerts: DumpedCert[] }[];
  [key: string]: unknown;
}
