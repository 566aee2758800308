// The `config` section of /config_dump as Istio's ztunnel writes it: its runtime `Config` struct through serde_json
// (field order, camelCase names, serde's value forms), filled from our Config. Followed: istio/ztunnel src/config.rs
// at 5e6988cf7784398a9a7ef82c182b2caadd7677aa (`Config`, `construct_config`, `Address`, `RootCert`,
// `MetadataVector`), src/admin.rs (`serde_json::to_string_pretty` of the dump), src/state/workload.rs
// (`WorkloadInfo`, camelCase), src/identity/manager.rs (`Identity` as its spiffe:// string); hickory-dns
// crates/resolver/src/config.rs at 0043a5dede95b0fd2c24063a8586db4d6b7b1537 (`ResolverConfig`, `ResolverOpts`:
// snake_case, no rename). serde's forms: Duration {"secs","nanos"}; SocketAddr "ip:port" ("[ip6]:port"); Option
// null; unit enum variants their name ("Shared"); newtype variants {"Variant": value}, and one whose field is
// skipped (RootCert::Static) its bare name.
//
// Where we have no setting of ztunnel's, the value is what ztunnel derives from the same environment (mostly its
// fixed default). Our own settings, under their own names, sit beside these under `ztunnelNode` (configForDump).
import { readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import type { SocketAddress } from './address.js';
import { formatSocketAddress } from './address.js';
import * as D from './defaults.js';
import type { Config } from './config.js';
import { parseResolvConf } from './resolv-conf.js';

/** What ztunnel reads from the resolver file (hickory's `read_system_conf`) besides our Config. */
export interface ResolverFacts {
  /** "ip:53" (IPv6 as [ip]:53), file order. */
  readonly nameservers: readonly string[];
  readonly search: readonly string[];
  /** The `domain` line, else the part of the host name after its first dot (resolv-conf's `get_system_domain`). */
  readonly domain: string | null;
  /** `options ndots:/timeout:/attempts:` (resolv-conf's defaults 1, 5 s, 2). */
  readonly ndots: number;
  readonly timeoutSecs: number;
  readonly attempts: number;
}

export interface DumpFacts {
  readonly resolver: ResolverFacts;
  /** Whether a file exists: ztunnel's RootCert is File only for a path that exists. */
  readonly exists: (path: string) => boolean;
}

const NO_RESOLVER: ResolverFacts = { nameservers: [], search: [], domain: null, ndots: 1, timeoutSecs: 5, attempts: 2 };
/** Without a file system to ask, no file exists. */
const NO_FILES = (): boolean => false;

/** ztunnel's fixed listener ports (not settings in ztunnel either). */
const INBOUND_PLAINTEXT_PORT = 15006;
const OUTBOUND_PORT = 15001;

/** serde's std::time::Duration. Our durations are whole milliseconds. */
function duration(ms: number): { secs: number; nanos: number } {
  return { secs: Math.floor(ms / 1000), nanos: Math.round((ms % 1000) * 1e6) };
}

/** ztunnel's `Address` enum: `localhost:<port>` is Localhost(ipv6, port) (both loopbacks), else SocketAddr. */
function address(addr: SocketAddress, ipv6: boolean): Record<string, unknown> {
  return addr.host === 'localhost' ? { Localhost: [ipv6, addr.port] } : { SocketAddr: formatSocketAddress(addr) };
}

/** ztunnel's RootCert: an existing file, SYSTEM (Default), else the value as inline PEM (Static, bytes skipped). */
function rootCert(setting: string, exists: (path: string) => boolean): unknown {
  if (exists(setting)) return { File: setting };
  return setting === 'SYSTEM' ? 'Default' : 'Static';
}

/**
 * ztunnel's MetadataVector serializes as [name, value] pairs, values in clear. Ours never leave the process: the
 * values (bearer tokens and the like) are replaced by '<redacted>', as everywhere else in our dumps.
 */
function headers(h: Readonly<Record<string, string>>): [string, string][] {
  return Object.keys(h).map((k) => [k, '<redacted>']);
}

/** Our dataplane's own ports (native config.rs `illegal_ports`): ztunnel's three, SOCKS5, DNS, admin/stats/readiness. */
function illegalPorts(cfg: Config): number[] {
  const ports = [D.HBONE_PORT, INBOUND_PLAINTEXT_PORT, OUTBOUND_PORT];
  if (cfg.socks5Enabled) ports.push(D.SOCKS5_PORT);
  if (cfg.dns.enabled) ports.push(D.DNS_PORT);
  ports.push(cfg.adminAddr.port, cfg.statsAddr.port, cfg.readinessAddr.port);
  return [...new Set(ports.filter((p) => p !== 0))];
}

/** ztunnel adds https:// to an address without a scheme (`validate_uri`); ours are URLs already. */
function uri(addr: string | null): string | null {
  if (addr === null) return null;
  return /^[a-z][a-z0-9+.-]*:\/\//i.test(addr) ? addr : `https://${addr}`;
}

function nameServers(r: ResolverFacts): Record<string, unknown>[] {
  return r.nameservers.flatMap((socketAddr) =>
    ['udp', 'tcp'].map((protocol) => ({
      socket_addr: socketAddr,
      protocol,
      tls_dns_name: null,
      http_endpoint: null,
      trust_negative_responses: false,
      bind_addr: null,
    })),
  );
}

/** hickory's ResolverOpts defaults, resolv.conf's three options, and ztunnel's cache size and lookup strategy. */
function resolverOpts(r: ResolverFacts, ipv6: boolean): Record<string, unknown> {
  return {
    ndots: r.ndots,
    timeout: duration(r.timeoutSecs * 1000),
    attempts: r.attempts,
    rotate: false,
    check_names: true,
    edns0: false,
    validate: false,
    ip_strategy: ipv6 ? 'Ipv4AndIpv6' : 'Ipv4Only',
    cache_size: 4096,
    use_hosts_file: 'Auto',
    positive_min_ttl: null,
    negative_min_ttl: null,
    positive_max_ttl: null,
    negative_max_ttl: null,
    num_concurrent_reqs: 2,
    preserve_intermediates: true,
    try_tcp_on_error: false,
    server_ordering_strategy: 'QueryStatistics',
    recursion_desired: true,
    avoid_local_udp_ports: [],
    os_port_selection: false,
    case_randomization: false,
  };
}

/**
 * Every key of ztunnel's serialized Config, in its order, in its value forms. Pure: what ztunnel reads from the
 * machine (the resolver file, whether root-certificate paths exist) comes in `facts`.
 */
export function ztunnelConfigDump(cfg: Config, facts: Partial<DumpFacts> = {}): Record<string, unknown> {
  const resolver = facts.resolver ?? NO_RESOLVER;
  const exists = facts.exists ?? NO_FILES;
  const ipv6 = cfg.dns.ipv6Enabled;
  // ztunnel binds [::] with IPV6_ENABLED (default), else 0.0.0.0.
  const wildcard = ipv6 ? '[::]' : '0.0.0.0';
  // ztunnel has Shared and Dedicated only. Local mode serves every workload of the node, each connection judged
  // by its own workload, as Shared does; it is never Dedicated (one fixed workload).
  const dedicated = cfg.proxyMode === 'dedicated';
  const pod = cfg.podName !== null && cfg.podNamespace !== null && cfg.serviceAccount !== null
    ? { name: cfg.podName, namespace: cfg.podNamespace, serviceAccount: cfg.serviceAccount }
    : null;
  const workloadInfo = dedicated && cfg.proxyWorkloadInfo !== null
    ? { name: cfg.proxyWorkloadInfo.name, namespace: cfg.proxyWorkloadInfo.namespace, serviceAccount: cfg.proxyWorkloadInfo.serviceAccount }
    : null;
  return {
    proxy: cfg.enableProxy,
    dnsProxy: cfg.dns.enabled,
    transparentNetworkPolicies: false, // TRANSPARENT_NETWORK_POLICIES is refused unless false
    windowSize: cfg.http2.streamWindowSize,
    connectionWindowSize: cfg.http2.connectionWindowSize,
    frameSize: cfg.http2.frameSize,
    poolMaxStreamsPerConn: cfg.poolMaxStreamsPerConnection,
    poolUnusedReleaseTimeout: duration(cfg.poolUnusedReleaseTimeoutMs),
    socks5Addr: cfg.socks5Enabled ? `127.0.0.1:${D.SOCKS5_PORT}` : null,
    adminAddr: address(cfg.adminAddr, ipv6),
    statsAddr: address(cfg.statsAddr, ipv6),
    readinessAddr: address(cfg.readinessAddr, ipv6),
    inboundAddr: `${wildcard}:${D.HBONE_PORT}`,
    inboundPlaintextAddr: `${wildcard}:${INBOUND_PLAINTEXT_PORT}`,
    outboundAddr: `${wildcard}:${OUTBOUND_PORT}`,
    dnsProxyAddr: address(cfg.dns.addr, ipv6),
    illegalPorts: illegalPorts(cfg),
    network: cfg.network,
    localNode: cfg.nodeName,
    proxyMode: dedicated ? 'Dedicated' : 'Shared',
    proxyWorkloadInformation: workloadInfo,
    clusterId: cfg.clusterId,
    clusterDomain: cfg.clusterDomain,
    caAddress: uri(cfg.caAddress),
    caRootCert: rootCert(cfg.caRootCa, exists),
    altCaHostname: cfg.altCaHostname,
    xdsAddress: uri(cfg.xdsAddress),
    xdsRootCert: rootCert(cfg.xdsRootCa, exists),
    altXdsHostname: cfg.altXdsHostname,
    preferedServiceNamespace: cfg.dns.preferedServiceNamespace,
    secretTtl: duration(cfg.secretTtlMs),
    xdsOnDemand: false, // XDS_ON_DEMAND is refused unless false
    fakeCa: cfg.fakeCa,
    fakeSelfInbound: false, // a test-only switch of ztunnel's, always false outside its tests
    selfTerminationDeadline: duration(cfg.terminationDeadlineMs),
    // HashMap<String, String>: ISTIO_META_<K> as strings. ztunnel does not read ISTIO_METAJSON_ (JSON values).
    proxyMetadata: Object.fromEntries(Object.entries(cfg.proxyMetadata).filter(([, v]) => typeof v === 'string')),
    numWorkerThreads: cfg.numWorkerThreads,
    requireOriginalSource: cfg.inpod.origSrc === 'auto' ? null : cfg.inpod.origSrc === 'required',
    proxyArgs: cfg.proxyArgs,
    dnsResolverCfg: { domain: resolver.domain, search: [...resolver.search], name_servers: nameServers(resolver) },
    dnsResolverOpts: resolverOpts(resolver, ipv6),
    inpodUds: cfg.inpod.uds,
    inpodPortReuse: cfg.inpod.portReuse,
    // Every packet of a pod's sockets is marked, dedicated mode too (ztunnel: only when PACKET_MARK is set there);
    // local mode has no pod network namespace and marks nothing.
    packetMark: cfg.proxyMode === 'local' ? null : cfg.inpod.packetMark,
    socketConfig: {
      keepaliveTime: duration(cfg.socketConfig.keepaliveTimeMs),
      keepaliveInterval: duration(cfg.socketConfig.keepaliveIntervalMs),
      keepaliveRetries: cfg.socketConfig.keepaliveRetries,
      keepaliveEnabled: cfg.socketConfig.keepaliveEnabled,
      userTimeoutEnabled: cfg.socketConfig.userTimeoutEnabled,
    },
    xdsHeaders: headers(cfg.xdsHeaders),
    caHeaders: headers(cfg.caHeaders),
    localhostAppTunnel: cfg.localhostAppTunnel,
    // From the downward API (POD_NAMESPACE, SERVICE_ACCOUNT, POD_NAME), all three or neither.
    ztunnelIdentity: pod === null ? null : `spiffe://${cfg.trustDomain}/ns/${pod.namespace}/sa/${pod.serviceAccount}`,
    ztunnelWorkload: pod,
    ipv6Enabled: ipv6,
  };
}

function option(text: string, name: string, fallback: number, max: number): number {
  let value = fallback;
  for (const m of text.matchAll(new RegExp(`^\\s*options\\s.*\\b${name}:(\\d+)`, 'gm'))) value = Math.min(Number(m[1]), max);
  return value;
}

/** The resolver file as hickory reads it for ztunnel (an unreadable file: no servers, the defaults). */
export function readResolverFacts(path: string, host: string = hostname()): ResolverFacts {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch {
    return NO_RESOLVER;
  }
  const { nameservers, search } = parseResolvConf(text);
  const domainLines = [...text.matchAll(/^\s*domain\s+(\S+)/gm)];
  const dot = host.indexOf('.');
  const domain = domainLines.at(-1)?.[1] ?? (dot >= 0 && dot < host.length - 1 ? host.slice(dot + 1) : null);
  return {
    nameservers,
    search,
    domain,
    ndots: option(text, 'ndots', 1, 15),
    timeoutSecs: option(text, 'timeout', 5, 30),
    attempts: option(text, 'attempts', 2, 5),
  };
}
