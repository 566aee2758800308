// The native dataplane as a component: opened once the local config is valid (a bad file must create nothing), with
// what follows it: the revocation lists (before any handshake), the access records' OTLP export, the log levels it
// builds events for, and the event pump. Its stop drains the connections, reads the last events, then shuts the
// runtime down and flushes the export.
import type { Config } from '../config/index.js';
import { HANDSHAKE_TIMEOUT_MS, HBONE_PORT } from '../config/defaults.js';
import { formatSocketAddress } from '../config/address.js';
import { readResolvConf, type ResolvConf } from '../config/resolv-conf.js';
import { followCrls } from '../ca/crl.js';
import { ZtunnelError } from '../errors.js';
import type { Logs } from '../log/logger.js';
import { LOG_LEVELS, type LogLevel } from '../log/filter.js';
import type { AccessExport } from '../log/otlp.js';
import type { Dataplane } from '../native/index.js';
import type { DataplaneConfig, NativeEvent } from '../native/types.js';
import { packageVersion } from '../version.js';
import type { Component } from './daemon.js';
import type { DrainMode } from './drain.js';
import { EventPump } from './events.js';

/** The dataplane methods the daemon uses (the native Dataplane; a fake in tests). */
export type DataplanePort = Pick<
  Dataplane,
  | 'applyState'
  | 'applyLocal'
  | 'applyAddresses'
  | 'meshDump'
  | 'localDump'
  | 'cpuProfile'
  | 'cancelCpuProfile'
  | 'heapProfiling'
  | 'heapProfile'
  | 'localWorkloadState'
  | 'createCsr'
  | 'installCertificate'
  | 'setCrls'
  | 'forgetIdentity'
  | 'nextCertificateRequests'
  | 'addLocalWorkload'
  | 'removeLocalWorkload'
  | 'metrics'
  | 'authorize'
  | 'previewAuthz'
  | 'startInpod'
  | 'startDedicated'
  | 'startSelfInbound'
  | 'outliers'
  | 'inpodState'
  | 'drainEvents'
  | 'exportOtlp'
  | 'takeOtlp'
  | 'setEventLevels'
  | 'handoverTake'
  | 'handoverListen'
  | 'nextHandover'
  | 'drain'
  | 'shutdown'
>;

/** The native dataplane's config, derived from the daemon's Config (and the resolver file it names). */
export function dataplaneConfig(config: Config, resolv: ResolvConf = { nameservers: [], search: [] }): DataplaneConfig {
  return {
    nodeName: config.nodeName ?? '',
    clusterId: config.clusterId,
    network: config.network,
    trustDomain: config.trustDomain,
    trustDomainAliases: [...config.trustDomainAliases],
    workerThreads: config.numWorkerThreads,
    hbonePort: HBONE_PORT,
    poolMaxStreamsPerConnection: config.poolMaxStreamsPerConnection,
    poolUnusedReleaseTimeoutMs: config.poolUnusedReleaseTimeoutMs,
    socket: { ...config.socketConfig },
    tls: { ...config.tls },
    http2: { ...config.http2 },
    connectTimeoutMs: config.connectionTimeoutMs,
    resilience: { ...config.resilience },
    handshakeTimeoutMs: HANDSHAKE_TIMEOUT_MS,
    missingPolicyGraceMs: config.missingPolicyGraceMs,
    localhostAppTunnel: config.localhostAppTunnel,
    enableResponseBaggage: config.enableResponseBaggage,
    authzPolicyInfoLogging: config.authzPolicyInfoLogging,
    proxyEnabled: config.enableProxy,
    socks5Enabled: config.socks5Enabled,
    bindSourceIp: config.proxyMode === 'local',
    ownPorts: [config.adminAddr.port, config.statsAddr.port, config.readinessAddr.port].filter((p) => p !== 0),
    dns: {
      enabled: config.dns.enabled,
      addr: formatSocketAddress(config.dns.addr),
      clusterDomain: config.clusterDomain,
      ipv6Enabled: config.dns.ipv6Enabled,
      upstreams: resolv.nameservers,
      searchDomains: resolv.search,
      preferedServiceNamespace: config.dns.preferedServiceNamespace ?? '',
    },
    streamBufferBudget: config.streamBufferBudget,
  };
}

/** How long a stopping daemon gives the OTLP exporter to send what is queued. */
const OTLP_SHUTDOWN_MS = 2_000;

/** This daemon as the exported records' resource (OTEL_RESOURCE_ATTRIBUTES adds to it: ts/log/otlp.ts). */
function otlpResource(config: Config): Record<string, string> {
  const r: Record<string, string> = { 'service.name': config.otlp?.serviceName ?? 'ztunnel-node', 'service.version': packageVersion() };
  if (config.nodeName !== null) r['k8s.node.name'] = config.nodeName;
  if (config.podName !== null) r['k8s.pod.name'] = config.podName;
  if (config.podNamespace !== null) r['k8s.namespace.name'] = config.podNamespace;
  r['k8s.cluster.name'] = config.clusterId;
  return r;
}

export interface DataplaneOptions {
  config: Config;
  logs: Logs;
  open(cfg: DataplaneConfig): DataplanePort;
  /** The ports the daemon's servers are bound to (an address with port 0 got one from the OS). */
  ownPorts(): number[];
  /** Another reader of the events the pump drains (the dashboard). */
  observe(events: NativeEvent[]): void;
}

export class DataplaneComponent implements Component {
  readonly name = 'dataplane';
  /** The dataplane, once open. */
  plane: DataplanePort | null = null;
  /** OpenTelemetry export of the access log (OTEL_*), when configured. */
  accessExport: AccessExport | null = null;
  readonly pump: EventPump;
  private crlWatch: { stop(): void } | null = null;
  private stopEventLevels: () => void = () => undefined;

  constructor(private readonly o: DataplaneOptions) {
    this.pump = new EventPump(() => this.plane, o.logs, o.logs.root, [(events) => this.accessExport?.emit(events), (events) => o.observe(events)]);
  }

  /** The dataplane, or the admin API's NOT_RUNNING error (answered 503) while it is not open yet. */
  running(): DataplanePort {
    if (this.plane === null) throw new ZtunnelError('NOT_RUNNING', 'the dataplane is not running yet (the local config is loading)');
    return this.plane;
  }

  async start(): Promise<void> {
    const { config, logs } = this.o;
    const log = logs.root;
    let resolv: ResolvConf = { nameservers: [], search: [] };
    if (config.dns.enabled) {
      const read = readResolvConf(config.dns.resolvConf);
      if (read.error !== null) log.warn({ error: read.error }, 'DNS proxy: no upstream resolvers; questions the mesh does not answer get SERVFAIL');
      else log.info({ upstreams: read.nameservers, search: read.search }, 'DNS proxy upstream resolvers');
      resolv = read;
    }
    const plane = this.o.open({ ...dataplaneConfig(config, resolv), ownPorts: this.o.ownPorts() });
    this.plane = plane;
    // Revocation lists before any listener or certificate: no handshake happens without them.
    if (config.crlPath !== null) this.crlWatch = await followCrls(config.crlPath, plane, logs.forTarget('ca'));
    if (config.otlp !== null) {
      // The exporters load only here: a daemon without export never does.
      const { startAccessExport } = await import('../log/otlp.js');
      this.accessExport = await startAccessExport({ ...config.otlp, resource: otlpResource(config) }, logs.forTarget('access'), plane);
    }
    // The dataplane builds only the events the log filter lets through, and follows its changes (admin /logging);
    // access records at info at least while they are exported, whatever the access log shows.
    const accessLevel = (): LogLevel => {
      const level = logs.levelOf('access');
      return this.accessExport !== null && LOG_LEVELS.indexOf(level) < LOG_LEVELS.indexOf('info') ? 'info' : level;
    };
    const syncEventLevels = () => plane.setEventLevels(accessLevel(), logs.levelOf('dataplane'), logs.levelOf('dns'));
    syncEventLevels();
    this.stopEventLevels = logs.onChange(syncEventLevels);
    this.pump.start();
  }

  async stop(_mode: DrainMode, deadlineMs: number): Promise<void> {
    this.crlWatch?.stop();
    const plane = this.plane;
    if (plane === null) return;
    try {
      const clean = await plane.drain(deadlineMs);
      if (!clean) this.o.logs.root.warn({ deadlineMs }, 'drain deadline reached; remaining connections were closed');
    } finally {
      this.pump.stop(); // the last access records of drained connections
      this.stopEventLevels();
      plane.shutdown();
      // What is queued for the collector goes out, within a bound.
      await this.accessExport?.shutdown(OTLP_SHUTDOWN_MS);
    }
  }
}
