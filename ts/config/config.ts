// The daemon's configuration as the rest of ts/ reads it: parsed and validated once (index.ts `loadConfig`), frozen.
// Its own module so that what renders it (ztunnel-dump.ts) needs nothing of the parser.
import type { LogFilter } from '../log/filter.js';
import type { ResilienceConfig } from '../native/generated/ResilienceConfig.js';
import type { SocketAddress } from './address.js';
import type { LogFormat, OTLP_PROTOCOLS, ProxyMode } from './schema.js';
import type { TlsPolicy } from './tls.js';

export interface Config {
  readonly proxyMode: ProxyMode;
  readonly proxyWorkloadInfo: { readonly namespace: string; readonly name: string; readonly serviceAccount: string } | null;
  readonly localXdsPath: string | null;
  readonly localXds: string | null;
  /** null: XDS disabled. */
  readonly xdsAddress: string | null;
  /** null: no remote CA. */
  readonly caAddress: string | null;
  readonly nodeName: string | null;
  readonly clusterId: string;
  readonly clusterDomain: string;
  readonly trustDomain: string;
  /** TRUST_DOMAINS: accepted as aliases of each workload's own trust domain (handshakes and policy principals). */
  readonly trustDomainAliases: readonly string[];
  readonly network: string;
  readonly istioVersion: string | null;
  readonly poolMaxStreamsPerConnection: number;
  readonly poolUnusedReleaseTimeoutMs: number;
  /** KEEPALIVE_* and USER_TIMEOUT_ENABLED: every proxied TCP socket's keepalive (ztunnel's `socketConfig`). */
  readonly socketConfig: {
    readonly keepaliveEnabled: boolean;
    readonly keepaliveTimeMs: number;
    readonly keepaliveIntervalMs: number;
    readonly keepaliveRetries: number;
    readonly userTimeoutEnabled: boolean;
  };
  readonly http2: { readonly streamWindowSize: number; readonly connectionWindowSize: number; readonly frameSize: number };
  /** TLS12_ENABLED and COMPLIANCE_POLICY (pqc, fips-140-2): HBONE's TLS in and out, and the connections to istiod. */
  readonly tls: TlsPolicy;
  /** Bytes of stream data buffered toward HBONE peers across all connections (STREAM_BUFFER_BUDGET). */
  readonly streamBufferBudget: number;
  readonly connectionTimeoutMs: number;
  /** OpenTelemetry export of the access log (OTEL_*); null: none. */
  readonly otlp: OtlpConfig | null;
  /** Connect retry and outlier ejection (CONNECT_RESILIENCE and its settings); off: 1 attempt, no ejection. */
  readonly resilience: ResilienceConfig;
  readonly missingPolicyGraceMs: number;
  readonly localhostAppTunnel: boolean;
  readonly enableResponseBaggage: boolean;
  /** AUTHZ_POLICY_INFO_LOGGING: authorization decisions logged at info (ztunnel's `authpol_log!`), else debug. */
  readonly authzPolicyInfoLogging: boolean;
  /** ENABLE_PROXY: false is ztunnel's DNS-only mode (every workload's DNS proxy, none of its proxies). */
  readonly enableProxy: boolean;
  readonly terminationDeadlineMs: number;
  readonly numWorkerThreads: number;
  readonly secretTtlMs: number;
  readonly logFilter: LogFilter;
  readonly logFormat: LogFormat;
  readonly socks5Enabled: boolean;
  readonly localCaDir: string | null;
  /** ztunnel's FAKE_CA: the built-in CA signs (LOCAL_CA_DIR's root, else one in memory); caAddress is then null. */
  readonly fakeCa: boolean;
  /** The DNS proxy (15053). */
  readonly dns: {
    /** ISTIO_META_DNS_CAPTURE: on unless set to something other than "true". */
    readonly enabled: boolean;
    /** In a pod's namespace: `localhost:<port>` (both loopbacks) or ip:port. Local mode: each workload's IP, this port. */
    readonly addr: SocketAddress;
    readonly ipv6Enabled: boolean;
    readonly preferedServiceNamespace: string | null;
    /** The resolver file read for upstream servers and the search list. */
    readonly resolvConf: string;
  };
  /** CRL_PATH: revocation lists (PEM) the handshakes check peers against; null: none. */
  readonly crlPath: string | null;
  /** Hand-over to a successor daemon (HANDOVER_ENABLED, HANDOVER_SOCKET). */
  readonly handover: { readonly enabled: boolean; readonly socket: string };
  /** Shared (in-pod) mode: the istio-cni ZDS socket, the in-pod mark, SO_REUSEPORT, original source. */
  readonly inpod: {
    readonly uds: string;
    readonly packetMark: number;
    readonly portReuse: boolean;
    readonly origSrc: 'auto' | 'required' | 'never';
  };
  readonly adminAddr: SocketAddress;
  readonly statsAddr: SocketAddress;
  readonly readinessAddr: SocketAddress;
  /** All command-line arguments, space-joined (ztunnel records them the same way). */
  readonly proxyArgs: string;
  /** XDS_ROOT_CA / CA_ROOT_CA as given: a file path, "SYSTEM", or inline PEM (see ts/xds/grpc.ts). */
  readonly xdsRootCa: string;
  readonly caRootCa: string;
  readonly altXdsHostname: string | null;
  readonly altCaHostname: string | null;
  /** AUTH_TOKEN: a file path or the token; null: the default file if it exists, else no token. */
  readonly authToken: string | null;
  readonly xdsHeaders: Readonly<Record<string, string>>;
  readonly caHeaders: Readonly<Record<string, string>>;
  readonly instanceIp: string | null;
  readonly podName: string | null;
  readonly podNamespace: string | null;
  readonly serviceAccount: string | null;
  /** ISTIO_META_<K> (strings) and ISTIO_METAJSON_<K> (parsed JSON), keyed by <K>: XDS node metadata. */
  readonly proxyMetadata: Readonly<Record<string, unknown>>;
}

/** Where and how access records are exported over OTLP (ts/log/otlp.ts adds the daemon's resource attributes). */
export interface OtlpConfig {
  readonly protocol: (typeof OTLP_PROTOCOLS)[number];
  /** The logs endpoint: for HTTP the whole URL, for gRPC the collector's address. */
  readonly url: string;
  readonly maxQueueSize: number;
  readonly maxExportBatchSize: number;
  readonly scheduledDelayMs: number;
  readonly exportTimeoutMs: number;
  readonly serviceName: string;
}

/** Freezes a parsed config and everything in it (the parser's result, and its copy from the config worker). */
export function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === 'object' && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const v of Object.values(value)) deepFreeze(v);
  }
  return value;
}
