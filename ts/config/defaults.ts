// Default values, each with the reason it is what it is. Most are ztunnel's own defaults, so that a chart written
// for ztunnel behaves the same with ztunnel-node.
//
// The dataplane's settings take their defaults from the dataplane itself (DATAPLANE_DEFAULTS, generated from the Rust
// `Default` of native/dataplane/src/config.rs): one table, with the reasons written here.
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { DATAPLANE_DEFAULTS as DP } from '../native/generated/dataplaneDefaults.js';
import type { SocketAddress } from './address.js';

/** ztunnel's default; `shared` is what the Istio chart deploys (one proxy per node serving pods in-pod). */
export const DEFAULT_PROXY_MODE = 'shared';
/** What istiod calls a cluster when nobody named it (ztunnel and istiod agree on this literal). */
export const DEFAULT_CLUSTER_ID = DP.clusterId;
/** Kubernetes' default cluster DNS domain. */
export const DEFAULT_CLUSTER_DOMAIN = DP.dns.clusterDomain;
/** Istio's default trust domain; SPIFFE ids are spiffe://<td>/ns/<ns>/sa/<sa>. */
export const DEFAULT_TRUST_DOMAIN = DP.trustDomain;
/** istiod inside the cluster (chosen when KUBERNETES_SERVICE_HOST is set, as ztunnel does). */
export const DEFAULT_ISTIOD_IN_CLUSTER = 'https://istiod.istio-system.svc:15012';
/** istiod port-forwarded for development outside a cluster. */
export const DEFAULT_ISTIOD_LOCAL = 'https://localhost:15012';
/** Port dialed on HBONE peers; fixed by the HBONE protocol. */
export const HBONE_PORT = DP.hbonePort;
/** SOCKS5 listener port of each local workload (ztunnel's unstable SOCKS5 port). */
export const SOCKS5_PORT = 15080;
/** The DNS proxy's port (ztunnel's), and where each pod's server listens: both loopbacks of the pod. */
export const DNS_PORT = 15053;
export const DEFAULT_DNS_PROXY_ADDR: SocketAddress = { host: 'localhost', port: DNS_PORT };
/** Where the DNS proxy learns its upstream servers (ztunnel reads the same file). */
export const DEFAULT_RESOLV_CONF = '/etc/resolv.conf';
/** Streams multiplexed on one pooled HBONE connection before a new one is opened (ztunnel's default). */
export const DEFAULT_POOL_MAX_STREAMS_PER_CONNECTION = DP.poolMaxStreamsPerConnection;
/** TCP keepalive 180 s / 180 s / 9 probes, no user timeout: ztunnel's `SocketConfig` defaults. */
export const DEFAULT_SOCKET = DP.socket;
/** Idle pooled connections are released after 5 minutes (ztunnel's default). */
export const DEFAULT_POOL_UNUSED_RELEASE_TIMEOUT_MS = DP.poolUnusedReleaseTimeoutMs;
/** HTTP/2 windows and frame size: ztunnel's values, sized for bulk TCP over one multiplexed connection. */
export const DEFAULT_HTTP2_STREAM_WINDOW_SIZE = DP.http2.streamWindowSize;
export const DEFAULT_HTTP2_CONNECTION_WINDOW_SIZE = DP.http2.connectionWindowSize;
export const DEFAULT_HTTP2_FRAME_SIZE = DP.http2.frameSize;
/** STREAM_BUFFER_BUDGET: the node's budget for stream data buffered toward HBONE peers (native budget.rs). */
export const DEFAULT_STREAM_BUFFER_BUDGET = DP.streamBufferBudget;
/**
 * How long an inbound HBONE peer may take to finish the TLS handshake and the HTTP/2 preface. ztunnel has no such
 * deadline on 15008; without one a peer holds sockets open for free. Not a setting: a fixed protection.
 */
export const HANDSHAKE_TIMEOUT_MS = DP.handshakeTimeoutMs;
/** Upstream connect timeout (ztunnel's); long enough for a cold peer, short enough to surface NetworkPolicy drops. */
export const DEFAULT_CONNECTION_TIMEOUT_MS = DP.connectTimeoutMs;
/**
 * Connect retry and outlier ejection (beyond ztunnel): three attempts in all (a dead endpoint of three costs no
 * client connection), ejection after five consecutive failures for 30 s × the ejections so far, at most 300 s (Envoy's
 * consecutive_gateway_failure, base_ejection_time and max_ejection_time); at most half a service's candidates
 * skipped (Envoy's max_ejection_percent is 10, which on the handful of endpoints a node proxy picks among would
 * leave a dead one of three in play).
 */
export const DEFAULT_RESILIENCE = DP.resilience;
/**
 * How long a live inbound connection is left unjudged while its workload names an authorization policy that has not
 * arrived. istiod sends the workload's new reference about half a millisecond before the policy itself; a second
 * covers that and a loaded control plane, and bounds how long a policy that never comes can leave traffic unjudged.
 */
export const DEFAULT_MISSING_POLICY_GRACE_MS = DP.missingPolicyGraceMs;
/** Drain deadline when neither CONNECTION_TERMINATION_DEADLINE nor the grace period is given (ztunnel's 5 s). */
export const DEFAULT_TERMINATION_DEADLINE_MS = 5_000;
/** Requested certificate lifetime: 24 h, what istiod issues by default. */
export const DEFAULT_SECRET_TTL_MS = 24 * 3_600_000;
/**
 * The shortest SECRET_TTL accepted. istiod backdates notBefore by 2 min, so below a minute a certificate is
 * refreshed every few seconds per identity: more often than a CA round trip is worth, and a load on istiod that
 * grows with the number of identities on the node.
 */
export const MIN_SECRET_TTL_MS = 60_000;
/**
 * CONNECTION_TIMEOUT's floor: below it no connect across nodes completes (a TLS and HTTP/2 handshake is a few round
 * trips), so every connection would fail; `0s` (which ztunnel accepts) is refused rather than served that way.
 */
export const MIN_CONNECTION_TIMEOUT_MS = 100;
/** Default thread floor: one thread is a single point of latency for every connection on the node. */
export const MIN_DEFAULT_WORKER_THREADS = 2;
/** Without a CPU limit ztunnel takes a quarter of the node's cores; the node runs the workloads too. */
export const DEFAULT_WORKER_CORE_FRACTION = 0.25;
/** Admin is local-only: it can shut the proxy down and dump config. */
export const DEFAULT_ADMIN_ADDR: SocketAddress = { host: '127.0.0.1', port: 15000 };
/**
 * ztunnel binds [::]:15020; we bind 0.0.0.0 because an IPv6-disabled host would fail to bind [::] and a scraper
 * on IPv4 is the common case. Set STATS_ADDR=[::]:15020 for dual stack.
 */
export const DEFAULT_STATS_ADDR: SocketAddress = { host: '0.0.0.0', port: 15020 };
/** Readiness must be reachable by the kubelet on the pod IP; same IPv4 reasoning as stats. */
export const DEFAULT_READINESS_ADDR: SocketAddress = { host: '0.0.0.0', port: 15021 };
/** Local mode has no kubelet or Prometheus on the network: its stats and readiness servers stay on loopback. */
export const LOCAL_STATS_ADDR: SocketAddress = { host: '127.0.0.1', port: 15020 };
export const LOCAL_READINESS_ADDR: SocketAddress = { host: '127.0.0.1', port: 15021 };
/** Where the Istio chart mounts istiod's root certificate (ztunnel's default for XDS_ROOT_CA and CA_ROOT_CA). */
export const DEFAULT_ROOT_CA_PATH = './var/run/secrets/istio/root-cert.pem';
/** Where the Istio chart mounts the projected service-account token (audience istio-ca); used if it exists. */
export const DEFAULT_AUTH_TOKEN_PATH = './var/run/secrets/tokens/istio-token';
/** XDS reconnect backoff (ztunnel's): first retry soon, doubling, capped so a long outage costs little. */
export const XDS_BACKOFF_INITIAL_MS = 10;
export const XDS_BACKOFF_MAX_MS = 15_000;
/** istiod's first push for a large cluster is one message; ztunnel accepts up to 200 MiB. */
export const XDS_MAX_MESSAGE_BYTES = 200 * 1024 * 1024;
/** HTTP/2 keepalive to the control plane (ztunnel's): ping every 30 s, give up after 10 s. */
export const CONTROL_PLANE_KEEPALIVE_MS = 30_000;
export const CONTROL_PLANE_KEEPALIVE_TIMEOUT_MS = 10_000;
/** Certificate requests in flight at once (ztunnel's SecretManager). */
export const CA_MAX_CONCURRENT_REQUESTS = 8;
/** Certificate fetch retry: ~1 s doubling to 150 s, +-20 % jitter (ztunnel's). */
export const CA_BACKOFF_INITIAL_MS = 1_000;
export const CA_BACKOFF_MAX_MS = 150_000;
export const CA_BACKOFF_JITTER = 0.2;
/**
 * A certificate is refreshed at half its lifetime, but never sooner than this after we received it (or half its
 * remaining validity, when that is shorter). istiod backdates notBefore by 2 min, so with a short SECRET_TTL the
 * half-life is already past at issuance; without this floor every refresh would be due at once, in a loop.
 * 5 min: well below the default 24 h half-life (so it never delays a normal refresh), well above a CA round trip.
 */
export const CERT_MIN_REFRESH_INTERVAL_MS = 5 * 60_000;
/** Refresh times get +-5 % jitter so identities issued together do not ask the CA together again. */
export const CERT_REFRESH_JITTER = 0.05;
/**
 * No refresh is scheduled sooner than this after a certificate arrives, whatever its validity; a certificate
 * valid for less than twice this is refused as unusable (it is retried with backoff, not installed).
 */
export const CERT_MIN_REFRESH_DELAY_MS = 1_000;

/** Where istio-cni's node agent listens for ZDS (its default `ztunnel-uds-address`). */
export const DEFAULT_INPOD_UDS = '/var/run/ztunnel/ztunnel.sock';

/**
 * Where a daemon meets its successor (HANDOVER_SOCKET). Shared mode: beside INPOD_UDS, a directory both pods of a
 * surge rollout mount. Local and dedicated: one per node name (its unsafe characters replaced) and user, under
 * XDG_RUNTIME_DIR or the temp directory, so two daemons of one node find each other and other nodes do not.
 */
export function defaultHandoverSocket(mode: string, inpodUds: string, nodeName: string | null, runtimeDir: string | undefined): string {
  if (mode === 'shared') return join(dirname(inpodUds), 'handover.sock');
  const uid = typeof process.getuid === 'function' ? process.getuid() : 0;
  const node = (nodeName ?? 'node').replace(/[^A-Za-z0-9._-]/g, '_');
  return join(runtimeDir !== undefined && runtimeDir !== '' ? runtimeDir : tmpdir(), `ztunnel-node-${uid}`, `handover-${node}.sock`);
}
/** istio-cni's InpodMark: its iptables rules let packets carrying it through uncaptured. */
export const DEFAULT_PACKET_MARK = 1337;
