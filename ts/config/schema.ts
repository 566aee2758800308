// The ONE schema for ztunnel-node's configuration. Keys are environment variable names (ztunnel's names where
// ztunnel has the knob); every key also has a CLI flag derived mechanically from it
// (NODE_NAME <-> --node-name), so docs, `--help` and parsing cannot drift apart. Values arrive as strings from
// either source and each field schema converts and validates its own string; cross-field rules live in
// `superRefine` below. Defaults are NOT here: they depend on other fields (mode, CPU count) and live, named and
// explained, in defaults.ts and are applied in index.ts.
import { z } from 'zod';
import { MIN_CONNECTION_TIMEOUT_MS, MIN_SECRET_TTL_MS } from './defaults.js';
import { formatDurationMs, parseDurationMs } from './duration.js';
import { parseSocketAddress, type SocketAddress } from './address.js';
import { parseLogFilter, type LogFilter } from '../log/filter.js';

type Ctx = z.core.$RefinementCtx<string>;

function fail(ctx: Ctx, input: string, message: string): never {
  ctx.issues.push({ code: 'custom', input, message });
  return z.NEVER as never;
}

const text = () => z.string();

const nonEmpty = () =>
  z.string().transform((s, ctx) => (s.trim() === '' ? fail(ctx, s, 'must not be empty') : s.trim()));

/** A Kubernetes node's name: a DNS subdomain (RFC 1123: lowercase letters, digits, '-' and '.', at most 253). */
const DNS_SUBDOMAIN = /^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const nodeName = () =>
  z.string().transform((s, ctx) =>
    DNS_SUBDOMAIN.test(s.trim())
      ? s.trim()
      : fail(ctx, s, `${JSON.stringify(s)} is not a Kubernetes node name (lowercase letters, digits, '-' and '.', at most 253 characters)`),
  );

const positiveInt = (max = Number.MAX_SAFE_INTEGER, min = 1) =>
  z.string().transform((s, ctx) => {
    const n = /^\d+$/.test(s.trim()) ? Number(s) : NaN;
    if (!Number.isSafeInteger(n) || n < min || n > max) {
      return fail(ctx, s, `"${s}" is not an integer between ${min} and ${max}`);
    }
    return n;
  });

const nonNegativeInt = (max = Number.MAX_SAFE_INTEGER) =>
  z.string().transform((s, ctx) => {
    const n = /^\d+$/.test(s.trim()) ? Number(s) : NaN;
    return Number.isSafeInteger(n) && n <= max ? n : fail(ctx, s, `"${s}" is not an integer between 0 and ${max}`);
  });

const cpuQuantity = () =>
  z.string().transform((s, ctx) => {
    const n = /^\d+(\.\d+)?$/.test(s.trim()) ? Number(s) : NaN;
    return n > 0 ? n : fail(ctx, s, `"${s}" is not a positive number of cores`);
  });

/** `minMs`: a floor below which the value is refused (it is a named constant in defaults.ts, with its reason). */
const duration = (minMs = 0) =>
  z.string().transform((s, ctx) => {
    const ms = parseDurationMs(s);
    if (ms === undefined) return fail(ctx, s, `"${s}" is not a duration (e.g. 500ms, 10s, 5m, 1h30m)`);
    return ms < minMs ? fail(ctx, s, `"${s}" is below the minimum of ${formatDurationMs(minMs)}`) : ms;
  });

const bool = () =>
  z.string().transform((s, ctx) => {
    const v = s.trim().toLowerCase();
    if (v === 'true' || v === '1') return true;
    if (v === 'false' || v === '0') return false;
    return fail(ctx, s, `"${s}" is not a boolean (true|false)`);
  });

const address = () =>
  z.string().transform((s, ctx): SocketAddress => {
    const a = parseSocketAddress(s);
    return typeof a === 'string' ? fail(ctx, s, a) : a;
  });

const oneOf = <const T extends readonly [string, ...string[]]>(values: T) =>
  z.string().transform((s, ctx): T[number] => {
    const v = s.trim();
    return (values as readonly string[]).includes(v)
      ? (v as T[number])
      : fail(ctx, s, `"${s}" is not one of ${values.join('|')}`);
  });

/** "N" threads, "N%" of the cores, or "0" for all cores (ztunnel's ZTUNNEL_WORKER_THREADS). */
export type WorkerThreadsSetting = { kind: 'count'; count: number } | { kind: 'percent'; percent: number };

/** The dataplane's limit (native/dataplane/src/config.rs). */
export const MAX_WORKER_THREADS = 1024;

const workerThreads = () =>
  z.string().transform((s, ctx): WorkerThreadsSetting => {
    const v = s.trim();
    const pct = /^(\d+(?:\.\d+)?)%$/.exec(v);
    if (pct) {
      const percent = Number(pct[1]);
      if (percent > 0 && percent <= 100) return { kind: 'percent', percent };
      return fail(ctx, s, `"${s}": a percentage must be in (0, 100]`);
    }
    if (/^\d+$/.test(v) && Number.isSafeInteger(Number(v))) {
      if (Number(v) > MAX_WORKER_THREADS) return fail(ctx, s, `"${s}": at most ${MAX_WORKER_THREADS} threads`);
      return { kind: 'count', count: Number(v) };
    }
    return fail(ctx, s, `"${s}" is not a thread count, "N%" of the cores, or 0 (all cores)`);
  });

/**
 * TRUST_DOMAINS: trust domains, comma separated (istio/ztunnel#2092's form). Each as SPIFFE spells one: lowercase
 * letters, digits, `.`, `-`, `_`. `*` (every trust domain) is refused: it would make any trusted issuer's domain an
 * alias of the mesh's in policies.
 */
const trustDomains = () =>
  z.string().transform((s, ctx): string[] => {
    const list = s.split(',').map((d) => d.trim()).filter((d) => d !== '');
    const star = list.find((d) => d.includes('*'));
    if (star !== undefined) return fail(ctx, s, `"${star}": accepting every trust domain is not supported; list them`);
    const bad = list.find((d) => !/^[a-z0-9._-]+$/.test(d));
    if (bad !== undefined) return fail(ctx, s, `"${bad}" is not a trust domain (lowercase letters, digits, ".", "-", "_")`);
    return [...new Set(list)];
  });

/** An OTLP endpoint: an http or https URL (OpenTelemetry's exporter spec). */
const otlpUrl = () =>
  z.string().transform((s, ctx) => {
    const v = s.trim();
    try {
      const u = new URL(v);
      if (u.protocol === 'http:' || u.protocol === 'https:') return v;
    } catch {
      // below
    }
    return fail(ctx, s, `"${s}" is not an http or https URL (e.g. http://otel-collector:4317)`);
  });

/** OTLP's transports (OTEL_EXPORTER_OTLP_PROTOCOL). */
export const OTLP_PROTOCOLS = ['grpc', 'http/protobuf', 'http/json'] as const;

const logFilter = () =>
  z.string().transform((s, ctx): LogFilter => {
    const f = parseLogFilter(s);
    return typeof f === 'string' ? fail(ctx, s, f) : f;
  });

const workloadInfo = () =>
  z.string().transform((s, ctx) => {
    const parts = s.trim().split('/');
    if (parts.length !== 3 || parts.some((p) => p === '')) {
      return fail(ctx, s, `"${s}" is not namespace/name/serviceaccount`);
    }
    const [namespace, name, serviceAccount] = parts as [string, string, string];
    return { namespace, name, serviceAccount };
  });

const url = () =>
  z.string().transform((s, ctx) => {
    const v = s.trim();
    if (v === '') return ''; // "" disables the client (ztunnel semantics)
    // ztunnel accepts "host:port" and assumes https.
    const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(v) ? v : `https://${v}`;
    try {
      return new URL(withScheme).toString().replace(/\/$/, '');
    } catch {
      return fail(ctx, s, `"${s}" is not an address (https://host:port)`);
    }
  });

export const PROXY_MODES = ['shared', 'dedicated', 'local'] as const;
export type ProxyMode = (typeof PROXY_MODES)[number];
export const LOG_FORMATS = ['plain', 'json'] as const;
/** ztunnel's COMPLIANCE_POLICY values ztunnel-node implements (`fips-140-2` on its FIPS build only). */
export const COMPLIANCE_POLICIES = ['pqc', 'fips-140-2'] as const;
export type LogFormat = (typeof LOG_FORMATS)[number];

// Every field is optional: absence means "use the default" (defaults.ts). The description is the --help text.
const fields = {
  PROXY_MODE: oneOf(PROXY_MODES).optional().describe('shared (in-pod, default) | dedicated | local (loopback demo mode)'),
  PROXY_WORKLOAD_INFO: workloadInfo().optional().describe('namespace/name/serviceaccount (required in dedicated mode)'),
  LOCAL_XDS_PATH: nonEmpty().optional().describe('local config YAML file (workloads, services, policies)'),
  LOCAL_XDS: nonEmpty().optional().describe('local config YAML inline (exclusive with LOCAL_XDS_PATH)'),
  XDS_ADDRESS: url().optional().describe('istiod XDS address; "" disables XDS (default: istiod, none in local mode)'),
  CA_ADDRESS: url().optional().describe('istiod CA address; "" disables (default: istiod, none in local mode)'),
  NODE_NAME: nodeName().optional().describe('this node; workloads with this node are local (required in local mode)'),
  CLUSTER_ID: nonEmpty().optional().describe('cluster id (default Kubernetes; ISTIO_META_CLUSTER_ID wins over env)'),
  ISTIO_META_CLUSTER_ID: nonEmpty().optional().describe('cluster id from proxy metadata (wins over CLUSTER_ID env)'),
  ISTIO_META_ISTIO_VERSION: nonEmpty().optional().describe('Istio version for the istio_build metric tag'),
  CLUSTER_DOMAIN: nonEmpty().optional().describe('cluster DNS domain (default cluster.local)'),
  TRUST_DOMAIN: nonEmpty().optional().describe('trust domain of our own identity (default cluster.local)'),
  TRUST_DOMAINS: trustDomains().optional().describe("trust domains accepted as aliases of each workload's own, comma separated: peers of any accepted both ways, and policy principals match across them (none)"),
  NETWORK: text().optional().describe('network of this node (default "")'),
  KUBERNETES_SERVICE_HOST: text().optional().describe('set inside Kubernetes; selects the in-cluster istiod address'),
  POOL_MAX_STREAMS_PER_CONNECTION: positiveInt(2 ** 31 - 1).optional().describe('HBONE streams per pooled connection (100)'),
  POOL_UNUSED_RELEASE_TIMEOUT: duration().optional().describe('idle pooled connection eviction (5m)'),
  KEEPALIVE_ENABLED: bool().optional().describe('TCP keepalive on every proxied socket (true)'),
  KEEPALIVE_TIME: duration(1_000).optional().describe('idle time before the first keepalive probe (180s)'),
  KEEPALIVE_INTERVAL: duration(1_000).optional().describe('time between keepalive probes (180s)'),
  KEEPALIVE_RETRIES: positiveInt(127).optional().describe('unanswered probes before the connection is dropped (9)'),
  USER_TIMEOUT_ENABLED: bool().optional().describe('TCP_USER_TIMEOUT = time + interval x retries (false)'),
  TLS12_ENABLED: bool().optional().describe('TLS 1.2 too (ECDHE AES-GCM), HBONE in and out and toward istiod (false)'),
  COMPLIANCE_POLICY: oneOf(COMPLIANCE_POLICIES)
    .optional()
    .describe('pqc: X25519MLKEM768 the only key exchange; fips-140-2: the FIPS build\'s validated module, P-256 the only key exchange; HBONE in and out and toward istiod (unset: none)'),
  HTTP2_STREAM_WINDOW_SIZE: positiveInt(2 ** 31 - 1).optional().describe('HTTP/2 stream window bytes (4194304)'),
  HTTP2_CONNECTION_WINDOW_SIZE: positiveInt(2 ** 31 - 1).optional().describe('HTTP/2 connection window bytes (16777216)'),
  // RFC 9113 §6.5.2: 2^14 to 2^24-1 (the dataplane would refuse anything else, naming its own field).
  HTTP2_FRAME_SIZE: positiveInt(2 ** 24 - 1, 2 ** 14).optional().describe('HTTP/2 max frame size bytes (1048576)'),
  STREAM_BUFFER_BUDGET: positiveInt(Number.MAX_SAFE_INTEGER, 2 ** 20)
    .optional()
    .describe("ztunnel-node's own: bytes of stream data buffered toward HBONE peers across all connections (268435456)"),
  CONNECTION_TIMEOUT: duration(MIN_CONNECTION_TIMEOUT_MS).optional().describe('upstream connect timeout (10s; at least 100ms)'),
  CONNECT_RESILIENCE: bool().optional().describe('connect retry and outlier ejection of service-addressed connections; false: ztunnel\'s behaviour (true)'),
  CONNECT_ATTEMPTS: positiveInt(10).optional().describe('attempts of a service-addressed connect, each on another endpoint, within CONNECTION_TIMEOUT (3)'),
  OUTLIER_CONSECUTIVE_FAILURES: nonNegativeInt(1000).optional().describe('consecutive connect failures that eject an endpoint; 0: no ejection (5)'),
  OUTLIER_BASE_EJECTION_TIME: duration(1_000).optional().describe('the first ejection\'s length; the n-th lasts n times as long (30s)'),
  OUTLIER_MAX_EJECTION_TIME: duration(1_000).optional().describe('the longest ejection (300s)'),
  OUTLIER_MAX_EJECTION_PERCENT: nonNegativeInt(100).optional().describe('the share of a service\'s endpoints that may be skipped for being ejected, rounded up, never all (50)'),
  // OpenTelemetry export of the access log (beyond ztunnel; ts/log/otlp.ts). The SDK reads its other standard
  // variables itself (headers, timeout, compression, TLS files, OTEL_RESOURCE_ATTRIBUTES).
  OTEL_EXPORTER_OTLP_ENDPOINT: otlpUrl().optional().describe('OTLP collector base URL: access records are exported to it (gRPC: as is; HTTP: + /v1/logs)'),
  OTEL_EXPORTER_OTLP_LOGS_ENDPOINT: otlpUrl().optional().describe('OTLP logs endpoint, whole (wins over OTEL_EXPORTER_OTLP_ENDPOINT)'),
  OTEL_EXPORTER_OTLP_PROTOCOL: oneOf(OTLP_PROTOCOLS).optional().describe('grpc, http/protobuf or http/json (http/protobuf)'),
  OTEL_EXPORTER_OTLP_LOGS_PROTOCOL: oneOf(OTLP_PROTOCOLS).optional().describe('the logs exporter\'s protocol (wins over OTEL_EXPORTER_OTLP_PROTOCOL)'),
  OTEL_LOGS_EXPORTER: oneOf(['otlp', 'none'] as const).optional().describe('otlp: export access records (to localhost\'s collector without an endpoint); none: do not'),
  OTEL_SDK_DISABLED: bool().optional().describe('true: no OpenTelemetry export at all (false)'),
  OTEL_TRACES_EXPORTER: oneOf(['none'] as const).optional().describe('ztunnel-node exports no traces: only none is accepted'),
  OTEL_METRICS_EXPORTER: oneOf(['none'] as const).optional().describe('ztunnel-node exports no metrics over OTLP (Prometheus on the stats port): only none is accepted'),
  OTEL_SERVICE_NAME: nonEmpty().optional().describe('the exported records\' service.name (ztunnel-node)'),
  OTEL_BLRP_MAX_QUEUE_SIZE: positiveInt(1_000_000).optional().describe('access records waiting for export; more are dropped and counted (2048)'),
  OTEL_BLRP_MAX_EXPORT_BATCH_SIZE: positiveInt(1_000_000).optional().describe('access records per export (512; at most the queue size)'),
  OTEL_BLRP_SCHEDULE_DELAY: positiveInt(3_600_000).optional().describe('milliseconds between exports (1000)'),
  OTEL_BLRP_EXPORT_TIMEOUT: positiveInt(3_600_000).optional().describe('milliseconds one export may take (30000)'),
  MISSING_POLICY_GRACE: duration().optional().describe('how long live connections wait for a named policy that has not arrived (1s)'),
  CONNECTION_TERMINATION_DEADLINE: duration().optional().describe('drain deadline (default from TERMINATION_GRACE_PERIOD_SECONDS, else 5s)'),
  TERMINATION_GRACE_PERIOD_SECONDS: nonNegativeInt().optional().describe('pod grace period; drain deadline N-5s if N>10 else N-1s (min 1s)'),
  ZTUNNEL_WORKER_THREADS: workerThreads().optional().describe('dataplane threads: N, N% of cores, or 0 = all cores'),
  ZTUNNEL_CPU_LIMIT: cpuQuantity().optional().describe('cores to size thread pools by (default: all)'),
  ZTUNNEL_RESOURCE_CPU_LIMIT: cpuQuantity().optional().describe('container CPU limit (cores); wins over ZTUNNEL_CPU_LIMIT'),
  ZTUNNEL_RESOURCE_CPU_REQUEST: cpuQuantity().optional().describe('container CPU request (cores)'),
  SECRET_TTL: duration(MIN_SECRET_TTL_MS).optional().describe('requested certificate lifetime (24h, at least 1m)'),
  RUST_LOG: logFilter().optional().describe('log filter: level[,target=level...] (info)'),
  LOG_FORMAT: oneOf(LOG_FORMATS).optional().describe('plain | json (plain)'),
  UNSTABLE_ENABLE_SOCKS5: bool().optional().describe('SOCKS5 listener on :15080 per local workload (default: on in local mode)'),
  LOCAL_CA_DIR: nonEmpty().optional().describe('directory of the built-in CA root (created if absent; required in local mode)'),
  FAKE_CA: bool().optional().describe("ztunnel's fake CA: certificates signed in the daemon by the built-in CA instead of istiod's (LOCAL_CA_DIR's root, else one made in memory); not for production (false)"),
  CRL_PATH: nonEmpty().optional().describe('certificate revocation lists (PEM) checked in every HBONE handshake; reloaded when the file changes'),
  ENABLE_CLUSTER_TRUST_BUNDLE_API: bool().optional().describe("chart switch: istiod's root comes from a ClusterTrustBundle, mounted where the ConfigMap would be; nothing changes for the daemon"),
  INPOD_ENABLED: bool().optional().describe("set by Istio's chart; accepted and ignored, as by ztunnel (shared mode is always in-pod)"),
  RUST_BACKTRACE: text().optional().describe("backtrace on a panic in the native core, read by Rust's runtime itself (Istio's chart sets 1)"),
  INPOD_UDS: nonEmpty().optional().describe('ZDS socket of the istio-cni node agent (/var/run/ztunnel/ztunnel.sock; shared mode)'),
  PACKET_MARK: nonNegativeInt(0xffffffff).optional().describe('SO_MARK on every socket in a pod netns (1337 = 0x539)'),
  HANDOVER_ENABLED: bool().optional().describe("ztunnel-node's own: a new daemon takes the established connections of the one it replaces (true)"),
  HANDOVER_SOCKET: nonEmpty().optional().describe("ztunnel-node's own: the hand-over Unix socket (handover.sock beside INPOD_UDS; local and dedicated: per NODE_NAME in the runtime or temp directory)"),
  INPOD_PORT_REUSE: bool().optional().describe('SO_REUSEPORT on in-pod listeners, so a new daemon binds beside a draining one (true)'),
  LOCALHOST_APP_TUNNEL: bool().optional().describe('reach PROXY application tunnels on loopback, from loopback (true)'),
  ENABLE_RESPONSE_BAGGAGE: bool().optional().describe("the inbound CONNECT's 200 carries the destination's baggage (true)"),
  ENABLE_PROXY: bool().optional().describe("the proxies (false: ztunnel's DNS-only mode, each workload's DNS proxy alone) (true)"),
  AUTHZ_POLICY_INFO_LOGGING: bool().optional().describe('authorization decisions and dry-run matches logged at info, not debug (false)'),
  ENABLE_ORIG_SRC: bool().optional().describe('keep the client source IP toward local apps: unset = when possible, true = required, false = never'),
  ADMIN_ADDR: address().optional().describe('admin server (127.0.0.1:15000)'),
  STATS_ADDR: address().optional().describe('Prometheus server (0.0.0.0:15020)'),
  READINESS_ADDR: address().optional().describe('readiness server (0.0.0.0:15021)'),
  XDS_ROOT_CA: nonEmpty().optional().describe('root CA to verify istiod (XDS): a file, SYSTEM (OS roots) or inline PEM (./var/run/secrets/istio/root-cert.pem)'),
  CA_ROOT_CA: nonEmpty().optional().describe('root CA to verify the CA (CA_ADDRESS): a file, SYSTEM or inline PEM (./var/run/secrets/istio/root-cert.pem)'),
  ALT_XDS_HOSTNAME: nonEmpty().optional().describe('another server name accepted in istiod\'s XDS certificate'),
  ALT_CA_HOSTNAME: nonEmpty().optional().describe('another server name accepted in the CA\'s certificate'),
  AUTH_TOKEN: nonEmpty().optional().describe('bearer token for istiod: a file (re-read per request) or the token itself (./var/run/secrets/tokens/istio-token if it exists)'),
  INSTANCE_IP: nonEmpty().optional().describe('this ztunnel pod\'s IP (XDS node id and INSTANCE_IPS metadata; 1.1.1.1 when unset)'),
  POD_NAME: nonEmpty().optional().describe('this ztunnel pod\'s name (XDS node id and NAME metadata)'),
  POD_NAMESPACE: nonEmpty().optional().describe('this ztunnel pod\'s namespace (XDS node id and NAMESPACE metadata)'),
  SERVICE_ACCOUNT: nonEmpty().optional().describe('this ztunnel pod\'s service account'),
  ISTIO_META_DNS_CAPTURE: text().optional().describe('DNS proxy on :15053 per workload: on unless set to something other than "true"'),
  ISTIO_META_DNS_PROXY_ADDR: address().optional().describe('where each pod\'s DNS proxy listens (localhost:15053); wins over DNS_PROXY_ADDR'),
  DNS_PROXY_ADDR: address().optional().describe('where each pod\'s DNS proxy listens (localhost:15053: 127.0.0.1, and ::1 when the pod has it)'),
  IPV6_ENABLED: bool().optional().describe('AAAA questions answered from the mesh (true)'),
  PREFERED_SERVICE_NAMESPACE: nonEmpty().optional().describe('DNS proxy tie-breaker among services with the same hostname (sic, as ztunnel)'),
  DNS_RESOLV_CONF: nonEmpty().optional().describe('resolver file whose nameservers get the questions the mesh does not answer (/etc/resolv.conf)'),
  // Parsed and merged over the mesh config file's defaultConfig in proxy-config.ts (it is YAML, not one value).
  PROXY_CONFIG: text().optional().describe('YAML ProxyConfig merged over the mesh config file\'s defaultConfig: discoveryAddress, proxyAdminPort, statsPort, concurrency, proxyMetadata (variables win over both)'),
};

/**
 * Families of variables named by a prefix (`XDS_HEADER_<name>`): environment only (no flags), each collected into
 * a map keyed by the rest of the name. Part of the one schema: the values are validated here too.
 */
const headerName = (s: string) => /^[A-Za-z0-9_-]+$/.test(s);
const jsonValue = () =>
  z.string().transform((s, ctx): unknown => {
    try {
      return JSON.parse(s) as unknown;
    } catch {
      return fail(ctx, s, `"${s}" is not JSON`);
    }
  });
const prefixFields = {
  XDS_HEADER_: z
    .record(z.string().refine(headerName, { error: 'is not a header name' }), z.string())
    .describe('extra gRPC metadata `<name>: <value>` on the XDS stream (name lowercased)'),
  CA_HEADER_: z
    .record(z.string().refine(headerName, { error: 'is not a header name' }), z.string())
    .describe('extra gRPC metadata `<name>: <value>` on CA requests (name lowercased)'),
  ISTIO_META_: z.record(z.string(), z.string()).describe('XDS node metadata `<K>` = value (string)'),
  ISTIO_METAJSON_: z.record(z.string(), jsonValue()).describe('XDS node metadata `<K>` = the value parsed as JSON'),
};

export type PrefixKey = keyof typeof prefixFields;
export const PREFIX_KEYS = Object.keys(prefixFields) as PrefixKey[];
export const prefixSchema = z.object(prefixFields);
export type RawPrefixed = z.output<typeof prefixSchema>;

export function describePrefix(key: PrefixKey): string {
  return prefixFields[key].description ?? '';
}

export type ConfigKey = keyof typeof fields;

/**
 * One key's string through its own schema, for a value that came from elsewhere than env or flags (a ProxyConfig
 * field feeding the same setting): the parsed value, or the problem in the words the schema uses.
 */
export function parseField<K extends ConfigKey>(
  key: K,
  value: string,
): { ok: true; value: Exclude<z.output<(typeof fields)[K]>, undefined> } | { ok: false; message: string } {
  const r = fields[key].safeParse(value);
  if (r.success) return { ok: true, value: r.data as Exclude<z.output<(typeof fields)[K]>, undefined> };
  return { ok: false, message: r.error.issues.map((i) => i.message).join('; ') };
}

/** Keys whose CLI flag may be given without a value (`--unstable-enable-socks5` means true). */
export const BOOLEAN_KEYS: ReadonlySet<ConfigKey> = new Set<ConfigKey>([
  'UNSTABLE_ENABLE_SOCKS5',
  'INPOD_PORT_REUSE',
  'ENABLE_ORIG_SRC',
  'LOCALHOST_APP_TUNNEL',
  'ENABLE_RESPONSE_BAGGAGE',
  'AUTHZ_POLICY_INFO_LOGGING',
  'ENABLE_PROXY',
  'IPV6_ENABLED',
  'KEEPALIVE_ENABLED',
  'USER_TIMEOUT_ENABLED',
  'TLS12_ENABLED',
]);

/**
 * Keys where an empty string is a value, not "unset". Kubernetes manifests often carry `value: ""`; for every
 * other key that means "use the default".
 */
export const EMPTY_IS_VALUE: ReadonlySet<ConfigKey> = new Set<ConfigKey>(['XDS_ADDRESS', 'CA_ADDRESS', 'NETWORK']);

export const configSchema = z.object(fields).superRefine((raw, ctx) => {
  if (raw.LOCAL_XDS_PATH !== undefined && raw.LOCAL_XDS !== undefined) {
    ctx.addIssue({ code: 'custom', path: ['LOCAL_XDS'], message: 'is exclusive with LOCAL_XDS_PATH; set only one' });
  }
  if (raw.ENABLE_PROXY === false && raw.UNSTABLE_ENABLE_SOCKS5 === true) {
    ctx.addIssue({ code: 'custom', path: ['UNSTABLE_ENABLE_SOCKS5'], message: 'is a proxy: ENABLE_PROXY=false runs the DNS proxy alone (unset one of them)' });
  }
  if ((raw.OTEL_BLRP_MAX_EXPORT_BATCH_SIZE ?? 512) > (raw.OTEL_BLRP_MAX_QUEUE_SIZE ?? 2048)) {
    ctx.addIssue({ code: 'custom', path: ['OTEL_BLRP_MAX_EXPORT_BATCH_SIZE'], message: 'is larger than OTEL_BLRP_MAX_QUEUE_SIZE' });
  }
  if (raw.CONNECT_RESILIENCE === false) {
    // Off is ztunnel's behaviour: a setting of the feature beside it would be ignored, so neither is.
    for (const k of ['CONNECT_ATTEMPTS', 'OUTLIER_CONSECUTIVE_FAILURES', 'OUTLIER_BASE_EJECTION_TIME', 'OUTLIER_MAX_EJECTION_TIME', 'OUTLIER_MAX_EJECTION_PERCENT'] as const) {
      if (raw[k] !== undefined) ctx.addIssue({ code: 'custom', path: [k], message: 'is a setting of CONNECT_RESILIENCE, which is false (unset one of them)' });
    }
  }
  if (raw.OUTLIER_BASE_EJECTION_TIME !== undefined && raw.OUTLIER_MAX_EJECTION_TIME !== undefined && raw.OUTLIER_MAX_EJECTION_TIME < raw.OUTLIER_BASE_EJECTION_TIME) {
    ctx.addIssue({ code: 'custom', path: ['OUTLIER_MAX_EJECTION_TIME'], message: 'is shorter than OUTLIER_BASE_EJECTION_TIME' });
  }
  if (raw.FAKE_CA === true && raw.CA_ADDRESS !== undefined) {
    // ztunnel drops CA_ADDRESS under FAKE_CA without a word; here one of them would be ignored, so neither is.
    ctx.addIssue({ code: 'custom', path: ['CA_ADDRESS'], message: 'names a CA, and FAKE_CA=true signs certificates in the daemon instead (unset one of them)' });
  }
  const mode = raw.PROXY_MODE ?? 'shared';
  if (mode === 'dedicated' && raw.PROXY_WORKLOAD_INFO === undefined) {
    ctx.addIssue({ code: 'custom', path: ['PROXY_WORKLOAD_INFO'], message: 'is required when PROXY_MODE=dedicated' });
  }
  if (mode === 'local') {
    if (raw.NODE_NAME === undefined) {
      ctx.addIssue({ code: 'custom', path: ['NODE_NAME'], message: 'is required when PROXY_MODE=local (it selects the local workloads)' });
    }
    if (raw.LOCAL_CA_DIR === undefined && raw.FAKE_CA !== true && (raw.CA_ADDRESS === undefined || raw.CA_ADDRESS === '')) {
      ctx.addIssue({ code: 'custom', path: ['LOCAL_CA_DIR'], message: 'is required when PROXY_MODE=local without CA_ADDRESS (the built-in CA signs the local workloads\' certificates)' });
    }
  }
});

export type RawConfig = z.output<typeof configSchema>;

export const CONFIG_KEYS = Object.keys(fields) as ConfigKey[];

export function describeKey(key: ConfigKey): string {
  return fields[key].description ?? '';
}

/** NODE_NAME -> --node-name */
export function flagFor(key: ConfigKey): string {
  return `--${key.toLowerCase().replace(/_/g, '-')}`;
}
