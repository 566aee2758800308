// Every environment variable Istio's ztunnel reads, and what ztunnel-node does with it: implemented with ztunnel's
// meaning (a key of schema.ts or one of its prefixes), or refused at start when set to a value ztunnel-node would not
// honour, so that no operator's setting is silently ignored. The sources: ../shared/spec/istio-ambient.md § 6.2, and
// istio/ztunnel's src/config.rs (its env constants and `construct_config`), src/tls (TLS12_ENABLED,
// COMPLIANCE_POLICY) and src/rbac (AUTHZ_POLICY_INFO_LOGGING). README's configuration tables list the same, and
// test/unit/istio-env.test.ts walks both. ztunnel's ProxyConfig (PROXY_CONFIG and the mesh config file) is read as
// ztunnel reads it: proxy-config.ts.

/** A variable ztunnel reads that ztunnel-node does not implement. */
export interface Refusal {
  /** Why, in the words the operator reads at start. */
  readonly reason: string;
  /** Values that ask for what ztunnel-node does anyway (compared trimmed and lower-case); any other is refused. */
  readonly accepts: readonly string[];
}

const refuse = (reason: string, ...accepts: string[]): Refusal => ({ reason, accepts });

/** ztunnel's variables that schema.ts implements (a test checks each is one of its keys). */
export const IMPLEMENTED = [
  'PROXY_MODE', 'PROXY_WORKLOAD_INFO', 'XDS_ADDRESS', 'CA_ADDRESS', 'XDS_ROOT_CA', 'CA_ROOT_CA', 'ALT_XDS_HOSTNAME',
  'ALT_CA_HOSTNAME', 'AUTH_TOKEN', 'CLUSTER_ID', 'ISTIO_META_CLUSTER_ID', 'ISTIO_META_ISTIO_VERSION',
  'ISTIO_META_DNS_CAPTURE', 'ISTIO_META_DNS_PROXY_ADDR', 'CLUSTER_DOMAIN', 'NETWORK', 'NODE_NAME', 'POD_NAME',
  'POD_NAMESPACE', 'SERVICE_ACCOUNT', 'INSTANCE_IP', 'TRUST_DOMAIN', 'PREFERED_SERVICE_NAMESPACE', 'LOCAL_XDS_PATH',
  'LOCAL_XDS', 'SECRET_TTL', 'POOL_MAX_STREAMS_PER_CONNECTION', 'POOL_UNUSED_RELEASE_TIMEOUT',
  'HTTP2_STREAM_WINDOW_SIZE', 'HTTP2_CONNECTION_WINDOW_SIZE', 'HTTP2_FRAME_SIZE', 'CONNECTION_TERMINATION_DEADLINE',
  'TERMINATION_GRACE_PERIOD_SECONDS', 'INPOD_UDS', 'INPOD_PORT_REUSE', 'INPOD_ENABLED', 'PACKET_MARK',
  'ENABLE_ORIG_SRC', 'IPV6_ENABLED', 'UNSTABLE_ENABLE_SOCKS5', 'LOCALHOST_APP_TUNNEL', 'ENABLE_RESPONSE_BAGGAGE',
  'CRL_PATH', 'ZTUNNEL_WORKER_THREADS', 'ZTUNNEL_CPU_LIMIT', 'ZTUNNEL_RESOURCE_CPU_LIMIT',
  'ZTUNNEL_RESOURCE_CPU_REQUEST', 'RUST_LOG', 'LOG_FORMAT', 'KUBERNETES_SERVICE_HOST', 'RUST_BACKTRACE',
  'ENABLE_CLUSTER_TRUST_BUNDLE_API', 'KEEPALIVE_ENABLED', 'KEEPALIVE_TIME', 'KEEPALIVE_INTERVAL', 'KEEPALIVE_RETRIES',
  'USER_TIMEOUT_ENABLED', 'TLS12_ENABLED', 'COMPLIANCE_POLICY', 'AUTHZ_POLICY_INFO_LOGGING',
  'ENABLE_PROXY', 'PROXY_CONFIG', 'FAKE_CA',
] as const;

/** ztunnel's prefix families that schema.ts implements. */
export const IMPLEMENTED_PREFIXES = ['XDS_HEADER_', 'CA_HEADER_', 'ISTIO_META_', 'ISTIO_METAJSON_'] as const;

/** ztunnel's variables that ztunnel-node refuses, unless set to what it does anyway. */
export const REFUSED: Readonly<Record<string, Refusal>> = {
  XDS_ON_DEMAND: refuse('on-demand xDS is not implemented: every address is pushed', 'false'),
  TRANSPARENT_NETWORK_POLICIES: refuse('transparent network policies are not implemented', 'false'),
};

export { MESH_CONFIG_FILE } from './proxy-config.js';

/**
 * One line per refused setting in `env` (empty when none): the variable, its value, and why. An empty value is unset
 * here, as for every other variable.
 */
export function refusedSettings(env: Readonly<Record<string, string | undefined>>): string[] {
  const out: string[] = [];
  for (const [name, r] of Object.entries(REFUSED)) {
    const value = env[name]?.trim();
    if (value === undefined || value === '' || r.accepts.includes(value.toLowerCase())) continue;
    const allowed = r.accepts.length > 0 ? ` (only ${r.accepts.map((a) => `${name}=${a}`).join(' or ')} is accepted)` : '';
    out.push(`${name}=${value} is not supported by ztunnel-node: ${r.reason}${allowed}`);
  }
  return out;
}
