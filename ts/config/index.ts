// Config is parsed once (here), validated once (schema.ts), frozen, and passed in. Nothing else in ts/ reads
// process.env. Precedence: CLI flag > environment variable > ztunnel's ProxyConfig (PROXY_CONFIG over the mesh
// config file's defaultConfig, for the few settings it has: proxy-config.ts) > default (defaults.ts).
import { availableParallelism } from 'node:os';
import type { z } from 'zod';
import { ConfigError } from '../errors.js';
import * as D from './defaults.js';
import { parseFlags } from './flags.js';
import { refusedSettings } from './istio-env.js';
import { loadProxyConfig, proxyConfigSettings, withPort, type ProxyConfigSettings } from './proxy-config.js';
import { controlPlaneTlsProblem } from './tls.js';
import type { ResilienceConfig } from '../native/generated/ResilienceConfig.js';
import {
  CONFIG_KEYS,
  MAX_WORKER_THREADS,
  EMPTY_IS_VALUE,
  configSchema,
  flagFor,
  PREFIX_KEYS,
  prefixSchema,
  type RawPrefixed,
  type ConfigKey,
  type RawConfig,
  type WorkerThreadsSetting,
} from './schema.js';

export type { LogFormat, ProxyMode } from './schema.js';
export type { SocketAddress } from './address.js';
export type { Config, OtlpConfig } from './config.js';
import { deepFreeze, type Config, type OtlpConfig } from './config.js';
export { flagFor, CONFIG_KEYS, describeKey, PREFIX_KEYS, describePrefix } from './schema.js';
export { configForDump } from './dump.js';


export interface ConfigInput {
  env: Readonly<Record<string, string | undefined>>;
  /** Arguments after the subcommand. */
  args?: readonly string[];
  /** All command-line arguments, recorded as `proxyArgs`; defaults to `args`. */
  allArgs?: readonly string[];
  /** Cores of this machine (tests pass a fixed number). */
  cpuCount?: number;
  /** Whether a file exists (the mesh config file ztunnel would read; tests pass their own). */
  exists?: (path: string) => boolean;
  /** A file's text (the mesh config file, when `exists` says it is there; tests pass their own). */
  readFile?: (path: string) => string;
}

/** Parses env + flags into a frozen Config. Throws ConfigError naming every bad variable/flag. */
export function loadConfig(input: ConfigInput): Config {
  // ztunnel's settings that ztunnel-node does not implement are refused by name, never ignored (istio-env.ts).
  const refused = refusedSettings(input.env);
  if (refused.length > 0) throw new ConfigError(`unsupported configuration: ${refused.join('; ')}`);
  const args = input.args ?? [];
  const flags = parseFlags(args);
  const raw: Partial<Record<ConfigKey, string>> = {};
  const fromFlag = new Set<ConfigKey>();
  for (const key of CONFIG_KEYS) {
    const envValue = input.env[key];
    if (envValue !== undefined && (envValue !== '' || EMPTY_IS_VALUE.has(key))) raw[key] = envValue;
    const flagValue = flags.values[key];
    if (flagValue !== undefined) {
      raw[key] = flagValue;
      fromFlag.add(key);
    }
  }
  const parsed = configSchema.safeParse(raw);
  if (!parsed.success) throw new ConfigError(formatIssues(parsed.error.issues, raw, fromFlag));
  const families: Record<string, Record<string, string>> = {};
  for (const prefix of PREFIX_KEYS) {
    const family: Record<string, string> = {};
    for (const [k, v] of Object.entries(input.env)) {
      if (k.startsWith(prefix) && k.length > prefix.length && v !== undefined) family[k.slice(prefix.length)] = v;
    }
    families[prefix] = family;
  }
  const prefixed = prefixSchema.safeParse(families);
  if (!prefixed.success) {
    const lines = prefixed.error.issues.map((i) => `${String(i.path[0])}${String(i.path[1] ?? '')}: ${i.message}`);
    throw new ConfigError(`invalid configuration: ${lines.join('; ')}`);
  }
  // ztunnel's ProxyConfig, for the settings no variable or flag gave (proxy-config.ts).
  const proxyConfig = loadProxyConfig({
    env: parsed.data.PROXY_CONFIG,
    envName: fromFlag.has('PROXY_CONFIG') ? flagFor('PROXY_CONFIG') : 'PROXY_CONFIG',
    exists: input.exists,
    readFile: input.readFile,
  });
  const pc = proxyConfigSettings(proxyConfig, parsed.data);
  const config = resolve(parsed.data, pc, fromFlag, input.cpuCount ?? availableParallelism(), input.allArgs ?? args, input.env.XDG_RUNTIME_DIR);
  const inert = inertOtlpSettings(config.otlp, parsed.data, input.env);
  if (inert.length > 0) {
    throw new ConfigError(
      `invalid configuration: ${inert.join(', ')} configure${inert.length === 1 ? 's' : ''} the OTLP export of the access log, which is off: set OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_LOGS_EXPORTER=otlp), or unset ${inert.length === 1 ? 'it' : 'them'}`,
    );
  }
  const unmet = controlPlaneTlsProblem(config.tls, [config.xdsAddress, config.caAddress]);
  if (unmet !== null) throw new ConfigError(`invalid configuration: COMPLIANCE_POLICY=${parsed.data.COMPLIANCE_POLICY ?? ''}: ${unmet}`);
  return deepFreeze({ ...config, ...resolvePrefixed(prefixed.data, pc.metadata) });
}

function lowerKeys(r: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(r).map(([k, v]) => [k.toLowerCase(), v]));
}

function resolvePrefixed(
  p: RawPrefixed,
  /** ProxyConfig's proxyMetadata (prefix stripped): under the variables, as in ztunnel. */
  fromProxyConfig: Readonly<Record<string, string>>,
): Pick<Config, 'xdsHeaders' | 'caHeaders' | 'proxyMetadata'> {
  return {
    xdsHeaders: lowerKeys(p.XDS_HEADER_),
    caHeaders: lowerKeys(p.CA_HEADER_),
    // ISTIO_METAJSON_ values are not strings, and win over an ISTIO_META_ of the same key (as in ztunnel).
    proxyMetadata: { ...fromProxyConfig, ...p.ISTIO_META_, ...p.ISTIO_METAJSON_ },
  };
}

function formatIssues(issues: readonly z.core.$ZodIssue[], raw: Partial<Record<ConfigKey, string>>, fromFlag: Set<ConfigKey>): string {
  const lines = issues.map((issue) => {
    const key = issue.path[0] as ConfigKey | undefined;
    if (key === undefined) return issue.message;
    const name = fromFlag.has(key) ? flagFor(key) : key;
    // Custom messages already quote the value; zod's built-in ones do not.
    const value = raw[key];
    const quoted = issue.code === 'custom' || value === undefined ? '' : ` (got "${value}")`;
    return `${name}: ${issue.message}${quoted}`;
  });
  return `invalid configuration: ${lines.join('; ')}`;
}

function resolve(
  raw: RawConfig,
  /** What ztunnel's ProxyConfig sets where no variable or flag did. */
  pc: ProxyConfigSettings,
  fromFlag: Set<ConfigKey>,
  cpuCount: number,
  allArgs: readonly string[],
  /** XDG_RUNTIME_DIR, where the default hand-over socket of local and dedicated mode goes (else the temp dir). */
  runtimeDir: string | undefined,
): Omit<Config, 'xdsHeaders' | 'caHeaders' | 'proxyMetadata'> {
  const proxyMode = raw.PROXY_MODE ?? D.DEFAULT_PROXY_MODE;
  // Local mode is loopback-only: no istiod unless asked for explicitly.
  const istiod = proxyMode === 'local'
    ? ''
    : raw.KUBERNETES_SERVICE_HOST
      ? D.DEFAULT_ISTIOD_IN_CLUSTER
      : D.DEFAULT_ISTIOD_LOCAL;
  const xds = raw.XDS_ADDRESS ?? pc.xdsAddress ?? istiod;
  // FAKE_CA: no CA address, as ztunnel's (CA_ADDRESS beside it is refused by the schema).
  const ca = raw.FAKE_CA === true ? '' : (raw.CA_ADDRESS ?? istiod);
  // ISTIO_META_CLUSTER_ID wins over CLUSTER_ID (ztunnel), except that a --cluster-id flag wins over any env.
  const clusterId =
    (fromFlag.has('CLUSTER_ID') ? raw.CLUSTER_ID : undefined) ??
    raw.ISTIO_META_CLUSTER_ID ??
    raw.CLUSTER_ID ??
    D.DEFAULT_CLUSTER_ID;
  return {
    proxyMode,
    proxyWorkloadInfo: raw.PROXY_WORKLOAD_INFO ?? null,
    localXdsPath: raw.LOCAL_XDS_PATH ?? null,
    localXds: raw.LOCAL_XDS ?? null,
    xdsAddress: xds === '' ? null : xds,
    caAddress: ca === '' ? null : ca,
    nodeName: raw.NODE_NAME ?? null,
    clusterId,
    clusterDomain: raw.CLUSTER_DOMAIN ?? D.DEFAULT_CLUSTER_DOMAIN,
    trustDomain: raw.TRUST_DOMAIN ?? D.DEFAULT_TRUST_DOMAIN,
    trustDomainAliases: raw.TRUST_DOMAINS ?? [],
    network: raw.NETWORK ?? '',
    istioVersion: raw.ISTIO_META_ISTIO_VERSION ?? null,
    poolMaxStreamsPerConnection: raw.POOL_MAX_STREAMS_PER_CONNECTION ?? D.DEFAULT_POOL_MAX_STREAMS_PER_CONNECTION,
    poolUnusedReleaseTimeoutMs: Math.ceil(raw.POOL_UNUSED_RELEASE_TIMEOUT ?? D.DEFAULT_POOL_UNUSED_RELEASE_TIMEOUT_MS),
    socketConfig: {
      keepaliveEnabled: raw.KEEPALIVE_ENABLED ?? D.DEFAULT_SOCKET.keepaliveEnabled,
      keepaliveTimeMs: Math.ceil(raw.KEEPALIVE_TIME ?? D.DEFAULT_SOCKET.keepaliveTimeMs),
      keepaliveIntervalMs: Math.ceil(raw.KEEPALIVE_INTERVAL ?? D.DEFAULT_SOCKET.keepaliveIntervalMs),
      keepaliveRetries: raw.KEEPALIVE_RETRIES ?? D.DEFAULT_SOCKET.keepaliveRetries,
      userTimeoutEnabled: raw.USER_TIMEOUT_ENABLED ?? D.DEFAULT_SOCKET.userTimeoutEnabled,
    },
    tls: { tls12: raw.TLS12_ENABLED ?? false, pqc: raw.COMPLIANCE_POLICY === 'pqc', fips: raw.COMPLIANCE_POLICY === 'fips-140-2' },
    http2: {
      streamWindowSize: raw.HTTP2_STREAM_WINDOW_SIZE ?? D.DEFAULT_HTTP2_STREAM_WINDOW_SIZE,
      connectionWindowSize: raw.HTTP2_CONNECTION_WINDOW_SIZE ?? D.DEFAULT_HTTP2_CONNECTION_WINDOW_SIZE,
      frameSize: raw.HTTP2_FRAME_SIZE ?? D.DEFAULT_HTTP2_FRAME_SIZE,
    },
    streamBufferBudget: raw.STREAM_BUFFER_BUDGET ?? D.DEFAULT_STREAM_BUFFER_BUDGET,
    connectionTimeoutMs: Math.ceil(raw.CONNECTION_TIMEOUT ?? D.DEFAULT_CONNECTION_TIMEOUT_MS),
    resilience: resilience(raw),
    otlp: otlp(raw),
    missingPolicyGraceMs: Math.ceil(raw.MISSING_POLICY_GRACE ?? D.DEFAULT_MISSING_POLICY_GRACE_MS),
    localhostAppTunnel: raw.LOCALHOST_APP_TUNNEL ?? true,
    enableResponseBaggage: raw.ENABLE_RESPONSE_BAGGAGE ?? true,
    authzPolicyInfoLogging: raw.AUTHZ_POLICY_INFO_LOGGING ?? false,
    enableProxy: raw.ENABLE_PROXY ?? true,
    terminationDeadlineMs: terminationDeadlineMs(raw.CONNECTION_TERMINATION_DEADLINE, raw.TERMINATION_GRACE_PERIOD_SECONDS),
    numWorkerThreads: workerThreads({ ...raw, ZTUNNEL_WORKER_THREADS: raw.ZTUNNEL_WORKER_THREADS ?? pc.workerThreads }, cpuCount),
    secretTtlMs: Math.ceil(raw.SECRET_TTL ?? D.DEFAULT_SECRET_TTL_MS),
    logFilter: raw.RUST_LOG ?? { level: 'info', targets: {} },
    logFormat: raw.LOG_FORMAT ?? 'plain',
    // Local mode has no traffic capture: SOCKS5 is the only way a local workload's traffic enters the mesh.
    socks5Enabled: raw.UNSTABLE_ENABLE_SOCKS5 ?? proxyMode === 'local',
    localCaDir: raw.LOCAL_CA_DIR ?? null,
    fakeCa: raw.FAKE_CA ?? false,
    crlPath: raw.CRL_PATH ?? null,
    dns: {
      enabled: dnsCaptureEnabled(raw.ISTIO_META_DNS_CAPTURE ?? pc.dnsCapture),
      addr: raw.ISTIO_META_DNS_PROXY_ADDR ?? raw.DNS_PROXY_ADDR ?? pc.dnsProxyAddr ?? D.DEFAULT_DNS_PROXY_ADDR,
      ipv6Enabled: raw.IPV6_ENABLED ?? true,
      preferedServiceNamespace: raw.PREFERED_SERVICE_NAMESPACE ?? null,
      resolvConf: raw.DNS_RESOLV_CONF ?? D.DEFAULT_RESOLV_CONF,
    },
    handover: {
      enabled: raw.HANDOVER_ENABLED ?? true,
      socket:
        raw.HANDOVER_SOCKET ??
        D.defaultHandoverSocket(proxyMode, raw.INPOD_UDS ?? D.DEFAULT_INPOD_UDS, raw.NODE_NAME ?? null, runtimeDir),
    },
    inpod: {
      uds: raw.INPOD_UDS ?? D.DEFAULT_INPOD_UDS,
      packetMark: raw.PACKET_MARK ?? D.DEFAULT_PACKET_MARK,
      portReuse: raw.INPOD_PORT_REUSE ?? true,
      origSrc: raw.ENABLE_ORIG_SRC === undefined ? 'auto' : raw.ENABLE_ORIG_SRC ? 'required' : 'never',
    },
    adminAddr: raw.ADMIN_ADDR ?? withPort(D.DEFAULT_ADMIN_ADDR, pc.adminPort),
    statsAddr: raw.STATS_ADDR ?? withPort(proxyMode === 'local' ? D.LOCAL_STATS_ADDR : D.DEFAULT_STATS_ADDR, pc.statsPort),
    readinessAddr: raw.READINESS_ADDR ?? (proxyMode === 'local' ? D.LOCAL_READINESS_ADDR : D.DEFAULT_READINESS_ADDR),
    proxyArgs: allArgs.join(' '),
    xdsRootCa: raw.XDS_ROOT_CA ?? D.DEFAULT_ROOT_CA_PATH,
    caRootCa: raw.CA_ROOT_CA ?? D.DEFAULT_ROOT_CA_PATH,
    altXdsHostname: raw.ALT_XDS_HOSTNAME ?? null,
    altCaHostname: raw.ALT_CA_HOSTNAME ?? null,
    authToken: raw.AUTH_TOKEN ?? null,
    instanceIp: raw.INSTANCE_IP ?? null,
    podName: raw.POD_NAME ?? null,
    podNamespace: raw.POD_NAMESPACE ?? null,
    serviceAccount: raw.SERVICE_ACCOUNT ?? null,
  };
}

/**
 * OpenTelemetry's exporter rules: on with an endpoint (or OTEL_LOGS_EXPORTER=otlp), off with OTEL_LOGS_EXPORTER=none
 * or OTEL_SDK_DISABLED; the logs variables win over the general ones; the general endpoint gets `/v1/logs` over HTTP;
 * http/protobuf by default; without an endpoint, the local collector's default port.
 */
function otlp(raw: RawConfig): OtlpConfig | null {
  const endpoint = raw.OTEL_EXPORTER_OTLP_LOGS_ENDPOINT ?? raw.OTEL_EXPORTER_OTLP_ENDPOINT;
  if (raw.OTEL_SDK_DISABLED === true || raw.OTEL_LOGS_EXPORTER === 'none') return null;
  if (endpoint === undefined && raw.OTEL_LOGS_EXPORTER !== 'otlp') return null;
  const protocol = raw.OTEL_EXPORTER_OTLP_LOGS_PROTOCOL ?? raw.OTEL_EXPORTER_OTLP_PROTOCOL ?? 'http/protobuf';
  const base = raw.OTEL_EXPORTER_OTLP_ENDPOINT ?? (protocol === 'grpc' ? 'http://localhost:4317' : 'http://localhost:4318');
  const url =
    raw.OTEL_EXPORTER_OTLP_LOGS_ENDPOINT ?? (protocol === 'grpc' ? base : `${base.replace(/\/+$/, '')}/v1/logs`);
  return {
    protocol,
    url,
    maxQueueSize: raw.OTEL_BLRP_MAX_QUEUE_SIZE ?? 2048,
    maxExportBatchSize: raw.OTEL_BLRP_MAX_EXPORT_BATCH_SIZE ?? 512,
    scheduledDelayMs: raw.OTEL_BLRP_SCHEDULE_DELAY ?? 1000,
    exportTimeoutMs: raw.OTEL_BLRP_EXPORT_TIMEOUT ?? 30_000,
    serviceName: raw.OTEL_SERVICE_NAME ?? 'ztunnel-node',
  };
}

/** The OpenTelemetry exporter's variables its transports read themselves (ts/log/otlp.ts), general and logs forms. */
const TRANSPORT_READ_OTLP_VARIABLES = ['HEADERS', 'TIMEOUT', 'COMPRESSION', 'CERTIFICATE', 'CLIENT_KEY', 'CLIENT_CERTIFICATE', 'INSECURE'].flatMap((v) => [
  `OTEL_EXPORTER_OTLP_${v}`,
  `OTEL_EXPORTER_OTLP_LOGS_${v}`,
]);

/**
 * The export's settings given while nothing turns export on (no endpoint, no OTEL_LOGS_EXPORTER=otlp): they would be
 * ignored, so they are refused by name. An explicit off switch (OTEL_SDK_DISABLED=true, OTEL_LOGS_EXPORTER=none)
 * keeps them, as OpenTelemetry's spec means it to.
 */
function inertOtlpSettings(otlp: OtlpConfig | null, raw: RawConfig, env: Readonly<Record<string, string | undefined>>): string[] {
  if (otlp !== null || raw.OTEL_SDK_DISABLED === true || raw.OTEL_LOGS_EXPORTER === 'none') return [];
  const ours = (
    ['OTEL_EXPORTER_OTLP_PROTOCOL', 'OTEL_EXPORTER_OTLP_LOGS_PROTOCOL', 'OTEL_SERVICE_NAME', 'OTEL_BLRP_MAX_QUEUE_SIZE', 'OTEL_BLRP_MAX_EXPORT_BATCH_SIZE', 'OTEL_BLRP_SCHEDULE_DELAY', 'OTEL_BLRP_EXPORT_TIMEOUT'] as const
  ).filter((k) => raw[k] !== undefined);
  const theirs = [...TRANSPORT_READ_OTLP_VARIABLES, 'OTEL_RESOURCE_ATTRIBUTES'].filter((k) => (env[k] ?? '') !== '');
  return [...ours, ...theirs];
}

/** CONNECT_RESILIENCE and its settings; off is one attempt and no ejection (ztunnel's connect). */
function resilience(raw: RawConfig): ResilienceConfig {
  const d = D.DEFAULT_RESILIENCE;
  if (raw.CONNECT_RESILIENCE === false) return { ...d, connectAttempts: 1, consecutiveFailures: 0 };
  const base = raw.OUTLIER_BASE_EJECTION_TIME ?? d.baseEjectionMs;
  return {
    connectAttempts: raw.CONNECT_ATTEMPTS ?? d.connectAttempts,
    consecutiveFailures: raw.OUTLIER_CONSECUTIVE_FAILURES ?? d.consecutiveFailures,
    baseEjectionMs: Math.ceil(base),
    // A base set above the default maximum raises the maximum with it.
    maxEjectionMs: Math.ceil(raw.OUTLIER_MAX_EJECTION_TIME ?? Math.max(d.maxEjectionMs, base)),
    maxEjectionPercent: raw.OUTLIER_MAX_EJECTION_PERCENT ?? d.maxEjectionPercent,
  };
}

/**
 * ISTIO_META_DNS_CAPTURE, or proxyMetadata DNS_CAPTURE: the DNS proxy is on unless set to other than "true", compared
 * case-insensitively as ztunnel does (`True` is on).
 */
function dnsCaptureEnabled(value: string | undefined): boolean {
  return value === undefined || value.toLowerCase() === 'true';
}

/**
 * ztunnel's rule: an explicit deadline wins; else from the pod's grace period leave time for the
 * kubelet's SIGKILL (N-5 s for long grace periods, N-1 s for short ones), never under 1 s; else 5 s.
 */
export function terminationDeadlineMs(explicitMs: number | undefined, gracePeriodSeconds: number | undefined): number {
  if (explicitMs !== undefined) return Math.ceil(explicitMs);
  if (gracePeriodSeconds !== undefined) {
    const seconds = gracePeriodSeconds > 10 ? gracePeriodSeconds - 5 : gracePeriodSeconds - 1;
    return Math.max(seconds, 1) * 1000;
  }
  return D.DEFAULT_TERMINATION_DEADLINE_MS;
}

/** Worker threads by ztunnel's rule. The core count honours container CPU limits before the machine's count. */
export function workerThreads(
  raw: Pick<RawConfig, 'ZTUNNEL_WORKER_THREADS' | 'ZTUNNEL_CPU_LIMIT' | 'ZTUNNEL_RESOURCE_CPU_LIMIT' | 'ZTUNNEL_RESOURCE_CPU_REQUEST'>,
  cpuCount: number,
): number {
  const cores = Math.max(1, Math.ceil(raw.ZTUNNEL_RESOURCE_CPU_LIMIT ?? raw.ZTUNNEL_CPU_LIMIT ?? cpuCount));
  const setting: WorkerThreadsSetting | undefined = raw.ZTUNNEL_WORKER_THREADS;
  let n: number;
  if (setting?.kind === 'count') {
    n = setting.count === 0 ? cores : setting.count;
  } else if (setting?.kind === 'percent') {
    n = Math.ceil((cores * setting.percent) / 100);
  } else {
    const request = Math.ceil(raw.ZTUNNEL_RESOURCE_CPU_REQUEST ?? 0);
    n = raw.ZTUNNEL_RESOURCE_CPU_LIMIT !== undefined
      ? Math.max(Math.ceil(raw.ZTUNNEL_RESOURCE_CPU_LIMIT), request)
      : Math.max(Math.ceil(cores * D.DEFAULT_WORKER_CORE_FRACTION), request, D.MIN_DEFAULT_WORKER_THREADS);
  }
  // "0" or a percentage on a very large machine: the dataplane's limit, not an error.
  return Math.min(MAX_WORKER_THREADS, Math.max(1, n));
}
