// The daemon (`ztunnel-node proxy`): wires config, state, certificates, the native dataplane, the XDS client and
// the admin servers together, and owns the lifecycle (readiness while starting, drain on the way out).
//
// Start order, and why:
//  1. The local config worker (config/local-loader.ts) starts reading and validating the local config, and the
//     admin/stats/readiness servers bind at once: a 50 MiB file takes a minute to validate, and the servers answer
//     throughout (readiness "not ready" until the tasks below finish; metrics without traffic yet).
//  2. Only once the file is valid does anything get created: a bad file closes the servers and exits 2 with no CA
//     directory, no dataplane and no state to undo. Then the CA and the dataplane open, the local config's state is
//     applied, and the XDS client starts.
//  3. The mesh lives once, in the dataplane (state/store.ts). Every state change crosses to it as one delta
//     (`applyStateChange`: policies, small changes) or one batch applied off the JS thread (the local config's
//     document, all or nothing; an xDS Address response, still encoded, resource by resource). The dataplane answers
//     with what changed, and `afterApply` follows it: the local-workload reconciler (local-workloads.ts)
//     adds/removes certificates and listeners for the workloads on this node, and the policy references the change
//     left unresolved are warned of. Certificates are installed BEFORE listeners bind, so the first inbound handshake already has one.
//     Batches are applied one at a time, in the order they were asked for.
// Readiness tasks: "state manager" (the local config applied and, with XDS, both types received and ACKed),
// "certificates" and "proxy" (the local workloads known when the state became ready have certificates and
// listeners).
// Shutdown: SIGTERM, SIGINT or POST /quitquitquit start a graceful drain (a second SIGINT exits at once); the XDS
// client stops, admin servers stop accepting while the dataplane drains up to the termination deadline, then the
// runtime is joined.
import type { Server } from 'node:http';
import { configForDump, type Config } from '../config/index.js';
import { HANDSHAKE_TIMEOUT_MS, HBONE_PORT } from '../config/defaults.js';
import { formatSocketAddress, type SocketAddress } from '../config/address.js';
import { LocalConfigLoader, type LocalLoad } from '../config/local-loader.js';
import { followCrls } from '../ca/crl.js';
import { readResolvConf, type ResolvConf } from '../config/resolv-conf.js';
import { nativeTlsProblem } from '../config/tls.js';
import { createAdminServer } from '../admin/admin-server.js';
import type { Dashboard } from '../admin/dashboard.js';
import { MAX_HTTP_CONNECTIONS, boundAddress, capConnections, closeServer, listen, reply, type ServerName } from '../admin/http.js';
import { Metrics } from '../admin/metrics.js';
import { createReadinessServer } from '../admin/readiness-server.js';
import { readinessHandler, takeEarlyReadiness } from '../admin/early-readiness.js';
import { createStatsServer } from '../admin/stats-server.js';
import { LocalCertificateAuthority, type CertificateAuthority } from '../ca/authority.js';
import { CertificateManager } from '../ca/manager.js';
import { ConfigError, LocalConfigError, ZtunnelError } from '../errors.js';
import type { Logs } from '../log/logger.js';
import { LOG_LEVELS, type LogLevel } from '../log/filter.js';
import type { AccessExport } from '../log/otlp.js';
import type { Logger } from 'pino';
import { Dataplane, nativeVersion, releaseColdCode } from '../native/index.js';
import type { AppliedOut, DataplaneConfig, InPodWorkload, NativeVersion } from '../native/types.js';
import { StateStore, type AppliedChange, type StateChange } from '../state/store.js';
import type { XdsClient } from '../xds/client.js';
import { TokenSource } from '../xds/token.js';
import { XdsMetrics } from '../xds/metrics.js';
import { LocalWorkloads } from './local-workloads.js';
import { answerCertificateRequests } from './certificates-on-demand.js';
import { startCapture, type Capture } from './capture.js';
import { watchLocalConfig, type LocalConfigWatch } from '../config/watch.js';
import { buildInfo, packageVersion } from '../version.js';
import { Drain, type DrainMode } from './drain.js';
import { collectAfterBatch } from '../heap.js';
import { logNativeEvent, type SuppressedCounts } from './events.js';
import { Readiness } from './readiness.js';
import { HandoverTally, takeOverThenServe } from './handover.js';

/** How often native events are drained into the logs: frequent enough to read as live, cheap (one JSON call). */
export const EVENT_PUMP_INTERVAL_MS = 250;

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

/** What runProxy needs from the native module; injectable so the lifecycle can run against fakes. */
export interface ProxyDeps {
  openDataplane(cfg: DataplaneConfig): DataplanePort;
  /** The built-in CA: its root in `dir`, or (null) made in memory for this process. */
  openLocalCa(dir: string | null, trustDomain: string): CertificateAuthority;
  nativeVersion(): NativeVersion;
}

const NATIVE_DEPS: ProxyDeps = {
  openDataplane: (cfg) => Dataplane.open(cfg),
  openLocalCa: (dir, td) => (dir === null ? LocalCertificateAuthority.ephemeral(td) : LocalCertificateAuthority.open(dir, td)),
  nativeVersion,
};

export interface ProxyOptions {
  deps?: Partial<ProxyDeps>;
  /** Install SIGTERM/SIGINT handlers (the CLI does; tests do not). Default true. */
  handleSignals?: boolean;
  /**
   * Called once the admin, stats and readiness servers listen: before the local config has loaded and been applied
   * (runProxy resolves after that, or rejects for a bad file). Lets a caller watch a long startup.
   */
  onListening?(addresses: ProxyHandle['addresses']): void;
}

/** Where a state change comes from (logged, and the key a reloaded local file diffs against). */
export type StateSource = 'xds' | 'local';

export interface ProxyHandle {
  /** Where the servers actually listen (ports resolved when configured as 0). */
  readonly addresses: { readonly admin: SocketAddress; readonly stats: SocketAddress; readonly readiness: SocketAddress };
  readonly readiness: Readiness;
  /** Starts the drain (idempotent); resolves when it is complete. */
  shutdown(mode?: DrainMode, reason?: string): Promise<void>;
  /** Resolves with the process exit code once the proxy has shut down (0 clean, 1 after a fatal error). */
  readonly closed: Promise<number>;
  /**
   * THE entry point for state changes (xDS responses, a reloaded local config file): applies `change` to the
   * store, sends the dataplane one delta of what changed, then reconciles certificates and listeners of the
   * workloads on this node. Synchronous up to the reconciliation (which continues asynchronously); throws
   * (nothing applied) when the dataplane refuses the delta.
   */
  applyStateChange(source: StateSource, change: StateChange): AppliedChange;
}

/** Policy references one change made unresolved that are warned of one by one; the rest are counted in one line. */
export const MISSING_REFERENCES_LOGGED = 10;

/**
 * Warns of the (workload, policy) references a change made unresolved (each such workload denies its inbound
 * traffic until the policy arrives): the first few one per line, then one line with how many more. A file or a push
 * whose 100k workloads name a policy not (yet) there made 100k warnings. The gauge
 * `ztunnel_node_authorization_missing_policies` counts them all.
 */
export function warnMissingReferences(log: Logger, missing: ReadonlyArray<{ uid: string; policy: string }>): void {
  for (const m of missing.slice(0, MISSING_REFERENCES_LOGGED)) {
    log.warn({ uid: m.uid, policy: m.policy }, 'workload names an authorization policy that is not known: denying its inbound traffic until it arrives');
  }
  if (missing.length > MISSING_REFERENCES_LOGGED) {
    const policies = new Set(missing.map((m) => m.policy)).size;
    log.warn(
      { more: missing.length - MISSING_REFERENCES_LOGGED, references: missing.length, policies },
      'more workloads name authorization policies that are not known: denying their inbound traffic until they arrive',
    );
  }
}

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

/**
 * Connections the admin, stats and readiness servers closed at their cap, per server; logged at most once per
 * 10 s per server, with how many went unlogged.
 */
class DropCounter {
  readonly counts: Record<ServerName, number> = { admin: 0, stats: 0, readiness: 0 };
  private readonly lastLog: Record<ServerName, number> = { admin: 0, stats: 0, readiness: 0 };
  private readonly unlogged: Record<ServerName, number> = { admin: 0, stats: 0, readiness: 0 };
  constructor(private readonly log: Logger) {}
  drop(name: ServerName): void {
    this.counts[name]++;
    this.unlogged[name]++;
    const now = Date.now();
    if (now - this.lastLog[name] < 10_000) return;
    this.log.warn({ server: name, dropped: this.unlogged[name], limit: MAX_HTTP_CONNECTIONS[name] }, 'connections refused at the server\'s connection limit');
    this.lastLog[name] = now;
    this.unlogged[name] = 0;
  }
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

/** How long after readiness the code pages startup ran once are released. */
export const COLD_CODE_RELEASE_MS = 3_000;

export async function runProxy(config: Config, logs: Logs, options: ProxyOptions = {}): Promise<ProxyHandle> {
  const deps: ProxyDeps = { ...NATIVE_DEPS, ...options.deps };
  const log = logs.root;
  log.info({ config: configForDump(config) }, 'starting ztunnel-node');

  if (config.proxyMode === 'local') {
    // Validated by the config schema; re-checked so a programmatic Config cannot slip through.
    if ((config.localCaDir === null && config.caAddress === null && !config.fakeCa) || config.nodeName === null) {
      throw new ConfigError('NODE_NAME, and LOCAL_CA_DIR, FAKE_CA or CA_ADDRESS, are required when PROXY_MODE=local');
    }
    if (config.localXds === null && config.localXdsPath === null && config.xdsAddress === null) {
      log.warn('PROXY_MODE=local without LOCAL_XDS_PATH, LOCAL_XDS or XDS_ADDRESS: there are no workloads to serve');
    }
  }
  // COMPLIANCE_POLICY=fips-140-2 is the FIPS build's alone: refused by name before anything is bound.
  const unmet = config.tls.fips ? nativeTlsProblem(config.tls, deps.nativeVersion().cryptoProvider) : null;
  if (unmet !== null) throw new ConfigError(`invalid configuration: ${unmet}`);
  // Read and validated off the main thread while the servers come up; awaited before anything is created.
  const loader = LocalConfigLoader.open(config);
  const firstLoad: Promise<LocalLoad | null> = loader?.load() ?? Promise.resolve(null);
  firstLoad.catch(() => undefined); // awaited below, once the servers listen

  const readiness = new Readiness();
  const stateTask = readiness.register('state manager');
  const certTask = readiness.register('certificates');
  const proxyTask = readiness.register('proxy');
  const drain = new Drain(config.terminationDeadlineMs, log);
  // Ready, and a moment on: the code pages startup ran once (Node's bootstrap and loader, V8's compilers, the config's
  // validation) leave the RSS; what runs again faults back in from the page cache (native footprint.rs).
  readiness.whenReady().then(() => {
    setTimeout(() => {
      try {
        const r = releaseColdCode();
        log.debug({ mappings: r.mappings, skipped: r.skipped, releasedMiB: Math.round(r.residentBytes / 2 ** 17) / 8 }, 'cold code pages released');
      } catch (err) {
        log.debug({ err: (err as Error).message }, 'releasing cold code pages failed');
      }
    }, COLD_CODE_RELEASE_MS).unref();
  }, () => undefined);
  const store = new StateStore(config.nodeName);
  const xdsMetrics = new XdsMetrics();
  const handovers = new HandoverTally();
  const loggers = { access: logs.forTarget('access'), dataplane: logs.forTarget('dataplane'), dns: logs.forTarget('dns') };
  const suppressedLogs: SuppressedCounts = new Map();

  // Opened once the local config is valid (a bad file must create nothing); the servers bind before, and see null.
  let dp: DataplanePort | null = null;
  let stopEventLevels: () => void = () => undefined;
  const servers: Server[] = [];
  // The admin port's live view: it reads what the daemon has (and the events the pump drains) only while watched.
  // Its module (and the page it serves) loads with the first request for it.
  let dashboard: Dashboard | null = null;
  /** OpenTelemetry export of the access log (OTEL_*), once the dataplane is open. */
  let accessExport: AccessExport | null = null;
  let dashboardLoad: Promise<Dashboard> | null = null;
  const openDashboard = (): Promise<Dashboard> =>
    (dashboardLoad ??= import('../admin/dashboard.js').then(
      ({ Dashboard }) =>
        (dashboard = new Dashboard({
          node: config.nodeName ?? '',
          mode: config.proxyMode,
          workloads: () => store.onThisNode,
          certificates: () => certs?.states() ?? [],
          metrics: () => dp?.metrics() ?? null,
          workloadState: () => workloadState(),
        })),
    ));
  const pump = () => {
    if (dp === null) return;
    try {
      const events = dp.drainEvents();
      for (const ev of events) logNativeEvent(ev, loggers, suppressedLogs);
      accessExport?.emit(events);
      dashboard?.observe(events);
    } catch (err) {
      log.error({ err: (err as Error).message }, 'reading dataplane events failed');
    }
  };

  // Shutdown is defined before any server can call it (POST /quitquitquit).
  let exitCode = 0;
  let removeSignals: () => void = () => undefined;
  let resolveClosed!: (code: number) => void;
  const closed = new Promise<number>((resolve) => (resolveClosed = resolve));
  // A daemon that handed over under an orchestrator (every mode but local) stays, drained, until its own SIGTERM: one
  // that exits by itself is restarted by the kubelet (restartPolicy Always) and would take over from its successor.
  let signalled = false;
  let releaseHold: (() => void) | null = null;
  function shutdown(mode: DrainMode = 'graceful', reason = 'requested', holdUntilSignal = false): Promise<void> {
    return drain.trigger(mode, reason).then(async () => {
      if (holdUntilSignal && options.handleSignals !== false && !signalled) {
        log.info('handed over and drained: exiting on SIGTERM (an orchestrator would restart a daemon that exits)');
        // Nothing else keeps the event loop alive now; a signal handler does not.
        const alive = setInterval(() => undefined, 1 << 30);
        await new Promise<void>((resolve) => (releaseHold = resolve));
        clearInterval(alive);
      }
      removeSignals();
      log.info({ exitCode }, 'shutdown complete');
      resolveClosed(exitCode);
    });
  }
  /** shutdown() from a callback that cannot wait for it: a failure of the drain itself is logged, and still exits. */
  function shutdownSoon(mode: DrainMode, reason: string): void {
    shutdown(mode, reason).catch((err: unknown) => {
      log.error({ err: err instanceof Error ? err.message : String(err) }, 'shutdown failed');
      resolveClosed(1);
    });
  }
  function fatal(what: string, err: unknown): void {
    if (drain.signal.aborted) return;
    log.error({ err: err instanceof Error ? err.message : String(err), code: (err as { code?: string }).code }, `${what}; shutting down`);
    exitCode = 1;
    shutdownSoon('immediate', 'fatal error');
  }

  // Certificates and listeners for the workloads on this node (local mode), or certificate prefetch only
  // (shared mode, whose listeners live in pod network namespaces: a later issue). Set up with the dataplane.
  let certs: CertificateManager | null = null;
  let certAsks: { stop(): void } | null = null;
  let localWorkloads: LocalWorkloads | null = null;
  let proxyReady = false;

  /** The CRL_PATH watch, once the dataplane is open. */
  let crlWatch: { stop(): void } | null = null;

  /**
   * config_dump's `workloadState`, in every mode, as istioctl's `ztunnel-config connections` reads it: the pods the
   * in-pod manager serves, or the workloads whose listeners local mode binds; with their live connections.
   */
  function workloadState(): Record<string, InPodWorkload> {
    return (config.proxyMode === 'local' ? dp?.localWorkloadState() : capture?.workloadState()) ?? {};
  }

  /** The dataplane, or the admin API's NOT_RUNNING error (answered 503) while it is not open yet. */
  function running(): DataplanePort {
    if (dp === null) throw new ZtunnelError('NOT_RUNNING', 'the dataplane is not running yet (the local config is loading)');
    return dp;
  }

  /** config_dump's `staticConfig`: the policy keys of the local document last applied (null: none applied yet). */
  let localPolicyKeys: Set<string> | null = null;

  /**
   * config_dump's `staticConfig`, as ztunnel shows its local config: the last applied local document as parsed (its
   * workloads and services from the dataplane's state, its policies from the store). Without one (xDS, or before the
   * first applies) the empty document, as ztunnel's admin writes its LocalConfig's default.
   */
  function staticConfigDump(): Record<string, unknown> {
    if (localPolicyKeys === null || dp === null) return { workloads: [], policies: [], services: [] };
    const { workloads, services } = dp.localDump();
    return { workloads, policies: store.dumpPolicies(localPolicyKeys), services };
  }

  // Fail closed (README "Authorization"): a named WORKLOAD_SELECTOR policy that has not arrived denies. The dataplane
  // tracks the references that do not resolve, in O(change), and reports those each change makes missing.
  function applyStateChange(_source: StateSource, change: StateChange): AppliedChange {
    const plane = dp;
    if (plane === null) throw new Error('the dataplane is not open yet');
    const applied = store.apply(change, (d) => plane.applyState(d));
    afterApply(applied);
    return applied;
  }

  /** What every applied change is followed by: listeners and certificates of local workloads, policy references. */
  function afterApply(applied: AppliedChange): void {
    localWorkloads?.reconcile(applied.workloads);
    warnMissingReferences(log, applied.missing);
  }

  /** Batches go to the dataplane one at a time, in the order asked (their answers are followed in that order). */
  let batches: Promise<unknown> = Promise.resolve();
  function serially<T>(run: () => Promise<T>): Promise<T> {
    const next = batches.then(run);
    // The chain keeps no batch's answer (a first push's answer names every resource: 100k entries held until the
    // next batch otherwise).
    batches = next.then(
      () => undefined,
      () => undefined,
    );
    return next;
  }

  /** One xDS Address response, still encoded: decoded and applied by the dataplane, resource by resource. */
  function applyAddresses(resources: readonly Uint8Array[], removed: string[]): Promise<AppliedOut> {
    return serially(async () => {
      const plane = dp;
      if (plane === null) throw new Error('the dataplane is not open yet');
      const out = await plane.applyAddresses(resources, removed);
      afterApply(store.absorb(out));
      return out;
    });
  }

  // Reload the local config file when it changes: only what changed is applied; a bad file keeps the last good one.
  // Watched from before the first read, so that a change made while the first load runs (a minute for a large
  // file) is not missed; a reload waits until the first load has been applied.
  let firstApplied!: (ok: boolean) => void;
  const started = new Promise<boolean>((resolve) => (firstApplied = resolve));
  const localWatch: LocalConfigWatch | null =
    loader === null || config.localXdsPath === null
      ? null
      : watchLocalConfig(
          config.localXdsPath,
          async () => {
            if (!(await started) || drain.signal.aborted) return;
            let next: LocalLoad;
            try {
              next = await loader.load();
            } catch (err) {
              if (drain.signal.aborted) return;
              const invalid = err instanceof LocalConfigError;
              log.error(
                { err: err instanceof Error ? err.message : String(err) },
                invalid ? 'local config is invalid; keeping the last good config' : 'local config could not be loaded; keeping the last good config',
              );
              return;
            }
            try {
              const applied = await applyLocalLoad(next);
              log.info({ source: next.source, ...applied }, 'local config reloaded');
            } catch (err) {
              if (drain.signal.aborted) return;
              log.error({ err: err instanceof Error ? err.message : String(err) }, 'local config rejected by the dataplane; keeping the last good config');
            }
          },
          (err) => log.error({ err: err instanceof Error ? err.message : String(err) }, 'local config reload failed'),
        );

  /**
   * Applies a loaded local config and commits it as the base of the next reload. All or nothing: the dataplane
   * parses and validates every chunk before it applies any (off the JS thread); a refusal rejects, and the loader
   * keeps the previous base.
   */
  async function applyLocalLoad(load: LocalLoad): Promise<{ workloads: number; services: number; policies: number; chunks: number; applyMs: number }> {
    const t0 = performance.now();
    let applied: AppliedChange;
    try {
      applied = await serially(async () => {
        const plane = dp;
        if (plane === null) throw new Error('the dataplane is not open yet');
        if (drain.signal.aborted) throw new Error('shutting down');
        const out = await plane.applyLocal(load.ticket, load.chunks);
        store.commitPolicies(load.policies);
        const a = store.absorb(out);
        afterApply(a);
        return a;
      });
    } catch (err) {
      loader?.discard();
      throw err;
    }
    loader?.commit();
    localPolicyKeys = new Set(loader?.committedPolicyKeys() ?? []);
    collectAfterBatch(load.counts.workloads + load.counts.services + load.counts.policies);
    return {
      workloads: applied.changedWorkloads,
      services: applied.services,
      policies: applied.policies,
      chunks: load.chunks.length,
      applyMs: Math.round(performance.now() - t0),
    };
  }

  let xds: XdsClient | null = null;
  let capture: Capture | null = null;
  let pumpTimer: NodeJS.Timeout | null = null;
  let markSynced: () => void = () => undefined;
  const stateReady = new Promise<void>((resolve) => (markSynced = resolve));
  let addresses: ProxyHandle['addresses'];
  const version = safeVersion(deps, log);
  try {
    const httpDrops = new DropCounter(logs.forTarget('admin'));
    const metrics = new Metrics({
      httpDropped: () => httpDrops.counts,
      suppressedLogs: () => suppressedLogs,
      snapshot: () => dp?.metrics({ trafficText: true }) ?? { socketsOpen: { source: 0, destination: 0 } },
      istioVersion: config.istioVersion,
      xds: () => xdsMetrics.snapshot(),
      missingPolicies: () => store.missingReferences,
      handover: () => handovers,
      otlp: () => accessExport?.counters() ?? null,
      ...(config.proxyMode === 'local' ? {} : { workloadManager: () => capture?.counters() ?? null }),
    });
    const admin = createAdminServer({
      logs,
      quit: (reason) => shutdownSoon('graceful', reason),
      // Before the dataplane opens (a large local config loading) these answer 503, as a not-ready service should.
      authorize: (r) => running().authorize(r),
      previewAuthz: async (r) => running().previewAuthz(r),
      cpuProfile: async (seconds, frequency) => running().cpuProfile(seconds, frequency),
      cancelCpuProfile: () => running().cancelCpuProfile(),
      heapProfiling: (activate) => running().heapProfiling(activate),
      heapProfile: async () => running().heapProfile(),
      configDump: () => {
        // The mesh is rendered by the dataplane, its only holder (before it opens: empty).
        const mesh = dp?.meshDump() ?? { workloads: [], services: [], stagedServices: {} };
        return {
        workloads: mesh.workloads,
        services: mesh.services,
        policies: store.dumpPolicies(),
        stagedServices: mesh.stagedServices,
        staticConfig: staticConfigDump(),
        certificates: certs?.dump() ?? [],
        config: configForDump(config),
        version: buildInfo(version, config.istioVersion),
        workloadState: workloadState(),
        // Beyond ztunnel, after its keys: the endpoints outlier detection tracks (ejected ones with the time left).
        outliers: dp?.outliers() ?? [],
        };
      },
      dashboard: {
        serve: (req, res, path, refused) => {
          openDashboard().then(
            (d) => {
              // Its streams are ended by the drain; one that would start after it never would be.
              if (drain.signal.aborted) return reply(res, 503, 'shutting down\n');
              d.serve(req, res, path, refused);
            },
            (err: unknown) => reply(res, 500, `the dashboard failed to load: ${err instanceof Error ? err.message : String(err)}\n`),
          );
        },
      },
    });
    const stats = createStatsServer(metrics);
    // The entry may have bound the readiness address already (admin/early-readiness.ts): take that server over.
    const early = await takeEarlyReadiness(config.readinessAddr, readinessHandler(() => readiness.pending()));
    const ready = early ?? createReadinessServer(readiness);
    // Connection caps: a flood of slow clients on a port open to the network cannot take the daemon's descriptors.
    for (const [server, name] of [[admin, 'admin'], [stats, 'stats'], [ready, 'readiness']] as const) {
      capConnections(server, name, (n) => httpDrops.drop(n));
    }
    servers.push(ready, admin, stats);
    addresses = {
      readiness: early ? boundAddress(early) : await listen(ready, config.readinessAddr),
      admin: await listen(admin, config.adminAddr),
      stats: await listen(stats, config.statsAddr),
    };
    log.info(
      { admin: formatSocketAddress(addresses.admin), stats: formatSocketAddress(addresses.stats), readiness: formatSocketAddress(addresses.readiness) },
      'admin servers listening',
    );
    options.onListening?.(addresses);
  } catch (err) {
    await abandonStart();
    throw err;
  }

  // Drain watchers run concurrently: the servers stop accepting while the dataplane drains its connections. They
  // are in place before the local config has loaded: /quitquitquit and signals work while it loads.
  drain.watch('xds', () => {
    firstApplied(false);
    xds?.stop();
    localWatch?.stop();
    crlWatch?.stop();
    capture?.stop();
    return loader?.close();
  });
  drain.watch('admin servers', () => {
    dashboard?.close(); // its streams never end on their own
    return Promise.all(servers.map((s) => closeServer(s))).then(() => undefined);
  });
  drain.watch('certificates', () => {
    localWorkloads?.stop();
    certAsks?.stop();
    certs?.stop();
  });
  drain.watch('dataplane', async (_mode, deadlineMs) => {
    const plane = dp;
    if (plane === null) return;
    try {
      const clean = await plane.drain(deadlineMs);
      if (!clean) log.warn({ deadlineMs }, 'drain deadline reached; remaining connections were closed');
    } finally {
      if (pumpTimer !== null) clearInterval(pumpTimer);
      stopEventLevels();
      pump(); // the last access logs of drained connections
      plane.shutdown();
      // What is queued for the collector goes out, within a bound.
      await accessExport?.shutdown(OTLP_SHUTDOWN_MS);
    }
  });
  if (options.handleSignals !== false) removeSignals = installSignals();

  function installSignals(): () => void {
    const onSignal = (signal: NodeJS.Signals) => {
      signalled = true;
      if (releaseHold !== null) {
        releaseHold();
        return;
      }
      if (drain.mode !== null) {
        if (signal === 'SIGINT') {
          log.warn('second SIGINT: exiting immediately');
          process.exit(0);
        }
        return;
      }
      shutdownSoon('graceful', signal);
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
    return () => {
      process.off('SIGTERM', onSignal);
      process.off('SIGINT', onSignal);
    };
  }

  const handle: ProxyHandle = { addresses, readiness, shutdown, closed, applyStateChange };
  /** Startup failed (a bad file, a refused state): undo what was set up, so that runProxy can reject. */
  async function abandonStart(): Promise<void> {
    firstApplied(false);
    localWatch?.stop();
    crlWatch?.stop();
    removeSignals();
    dashboard?.close();
    await Promise.all(servers.map((s) => closeServer(s, 0)));
    await loader?.close();
    localWorkloads?.stop();
    certAsks?.stop();
    certs?.stop();
    if (pumpTimer !== null) clearInterval(pumpTimer);
    stopEventLevels();
    pump();
    dp?.shutdown();
    await accessExport?.shutdown(OTLP_SHUTDOWN_MS);
  }
  let local: LocalLoad | null;
  try {
    local = await firstLoad;
  } catch (err) {
    // Shut down while loading: the drain is under way and resolves `closed`.
    if (drain.signal.aborted) return handle;
    // A bad file: nothing was created; the servers that answered "not ready" meanwhile close.
    await abandonStart();
    throw err;
  }
  if (drain.signal.aborted) return handle;

  // The local config is valid: from here on things get created.
  let ca: CertificateAuthority | null = null;
  const token = new TokenSource(config.authToken);
  try {
    if (config.caAddress !== null && config.nodeName !== null) {
      // gRPC and the CA's protobuf code load only when istiod is the CA (bench/results/README.md, the Node footprint).
      const { IstiodCertificateAuthority } = await import('../ca/istiod.js');
      // One daemon asks for many identities (local and shared modes): istiod must let it impersonate them.
      ca = new IstiodCertificateAuthority({
        target: { address: config.caAddress, rootCa: config.caRootCa, altHostname: config.altCaHostname, tls: config.tls },
        token,
        clusterId: config.clusterId,
        headers: config.caHeaders,
        impersonate: config.proxyMode !== 'dedicated',
      });
    }
    if (config.fakeCa) {
      // ztunnel's FAKE_CA: no istiod CA (CA_ADDRESS is refused beside it), certificates signed in the daemon.
      log.warn(
        { rootDir: config.localCaDir },
        config.localCaDir === null
          ? 'FAKE_CA=true: certificates are signed by a built-in CA whose root exists only in this process; only its own workloads trust it (not for production)'
          : 'FAKE_CA=true: certificates are signed by the built-in CA of LOCAL_CA_DIR; peers trust only that root (not for production)',
      );
      ca = deps.openLocalCa(config.localCaDir, config.trustDomain);
    }
    if (config.proxyMode === 'local' && ca === null) ca = deps.openLocalCa(config.localCaDir as string, config.trustDomain);
    // The built-in CA serves any mode when LOCAL_CA_DIR is set and no remote CA is (e.g. the namespace tests).
    if (ca === null && config.localCaDir !== null) ca = deps.openLocalCa(config.localCaDir, config.trustDomain);

    // The ports the servers are bound to (an address with port 0 got one from the OS).
    const bound = [addresses.admin.port, addresses.stats.port, addresses.readiness.port];
    let resolv: ResolvConf = { nameservers: [], search: [] };
    if (config.dns.enabled) {
      const read = readResolvConf(config.dns.resolvConf);
      if (read.error !== null) log.warn({ error: read.error }, 'DNS proxy: no upstream resolvers; questions the mesh does not answer get SERVFAIL');
      else log.info({ upstreams: read.nameservers, search: read.search }, 'DNS proxy upstream resolvers');
      resolv = read;
    }
    const plane = deps.openDataplane({ ...dataplaneConfig(config, resolv), ownPorts: bound });
    dp = plane;
    // Revocation lists before any listener or certificate: no handshake happens without them.
    if (config.crlPath !== null) crlWatch = await followCrls(config.crlPath, plane, logs.forTarget('ca'));
    if (config.otlp !== null) {
      // The exporters load only here: a daemon without export never does.
      const { startAccessExport } = await import('../log/otlp.js');
      accessExport = await startAccessExport({ ...config.otlp, resource: otlpResource(config) }, logs.forTarget('access'), plane);
    }
    // The dataplane builds only the events the log filter lets through, and follows its changes (admin /logging);
    // access records at info at least while they are exported, whatever the access log shows.
    const accessLevel = (): LogLevel => {
      const level = logs.levelOf('access');
      return accessExport !== null && LOG_LEVELS.indexOf(level) < LOG_LEVELS.indexOf('info') ? 'info' : level;
    };
    const syncEventLevels = () => plane.setEventLevels(accessLevel(), logs.levelOf('dataplane'), logs.levelOf('dns'));
    syncEventLevels();
    stopEventLevels = logs.onChange(syncEventLevels);
    if (ca !== null) {
      certs = new CertificateManager({
        keys: plane,
        ca,
        ttlSeconds: Math.max(1, Math.round(config.secretTtlMs / 1000)),
        logger: logs.forTarget('ca'),
      });
      // Certificates on demand: a handshake that finds none asks, and waits (prefetch stays an optimisation).
      certAsks = answerCertificateRequests(plane, certs, logs.forTarget('ca'));
    }
    if (certs !== null && config.nodeName !== null && config.proxyMode !== 'dedicated') {
      localWorkloads = new LocalWorkloads({
        nodeName: config.nodeName,
        certs,
        listeners:
          config.proxyMode === 'local'
            ? {
                proxies: config.enableProxy,
                socks5: config.socks5Enabled,
                dnsPort: config.dns.enabled ? config.dns.addr.port : null,
                add: (spec) => plane.addLocalWorkload(spec),
                remove: (uid) => plane.removeLocalWorkload(uid),
              }
            : null,
        logger: log,
        onError: (uid, err) => {
          // At startup a workload that cannot be served is fatal (the operator sees it at once); later, one bad
          // workload must not take the node's other workloads down.
          if (!proxyReady) fatal(`cannot start local workload ${uid}`, err);
          else log.error({ uid, err: err instanceof Error ? err.message : String(err) }, 'cannot serve local workload');
        },
      });
    }
    pumpTimer = setInterval(pump, EVENT_PUMP_INTERVAL_MS);
    pumpTimer.unref();

    if (local !== null) {
      const applied = await applyLocalLoad(local);
      log.info(
        { source: local.source, ...local.counts, fast: local.fast, worker: local.worker, chunks: applied.chunks, applyMs: applied.applyMs },
        'local config applied',
      );
    }
  } catch (err) {
    if (drain.signal.aborted) return handle;
    await abandonStart();
    throw err;
  }
  firstApplied(true);
  // Inline LOCAL_XDS never changes: its worker (and the policies it keeps for diffs) can go.
  if (localWatch === null) loader?.close().catch((err: unknown) => log.warn({ err: err instanceof Error ? err.message : String(err) }, 'closing the local config loader failed'));
  if (config.xdsAddress === null) markSynced();

  if (config.xdsAddress !== null) {
    // The xDS client, gRPC and the envoy/istio protobuf code load only when there is an istiod to talk to.
    const { XdsClient, ztunnelNodeId, ztunnelNodeMetadata } = await import('../xds/client.js');
    xds = new XdsClient({
      target: { address: config.xdsAddress, rootCa: config.xdsRootCa, altHostname: config.altXdsHostname, tls: config.tls },
      token,
      clusterId: config.clusterId,
      headers: config.xdsHeaders,
      node: { id: ztunnelNodeId(config), metadata: ztunnelNodeMetadata(config) },
      apply: (change) => {
        applyStateChange('xds', change);
      },
      applyAddresses,
      onSynced: () => markSynced(),
      metrics: xdsMetrics,
      logger: logs.forTarget('xds'),
    });
    xds.start();
  }

  /**
   * Hand-over (HANDOVER_ENABLED): take the connections of the daemon this one replaces, then serve the socket for the
   * next one; a successor that speaks to this daemon drains it. A failure here is logged: the daemon serves anyway.
   */
  const takeOver = async (): Promise<void> => {
    if (!config.handover.enabled || dp === null || drain.signal.aborted) return;
    try {
      await takeOverThenServe({
        dp,
        socket: config.handover.socket,
        nodeName: config.nodeName ?? '',
        log,
        counts: handovers,
        signal: drain.signal,
        // Local mode exits 0 once drained; under an orchestrator the daemon waits for its SIGTERM (see shutdown).
        onSuccessor: () => {
          shutdown('graceful', 'a successor took over', config.proxyMode !== 'local').catch((err: unknown) => {
            log.error({ err: err instanceof Error ? err.message : String(err) }, 'shutdown failed');
            resolveClosed(1);
          });
        },
      });
    } catch (err) {
      log.error({ err: err instanceof Error ? err.message : String(err), socket: config.handover.socket }, 'hand-over socket not served: an upgrade of this daemon will drain its connections');
    }
  };

  // Readiness: the state first, then the local workloads that state places on this node.
  const gatesReadiness = localWorkloads !== null && config.proxyMode === 'local';
  if (!gatesReadiness) {
    // No local-mode listeners: nothing for "certificates"/"proxy" to wait for (prefetch does not gate readiness;
    // in-pod has its own task). The hand-over follows readiness here (in-pod connections are not handed over yet).
    certTask.done();
    proxyTask.done();
    proxyReady = true;
    readiness.whenReady().then(takeOver, () => undefined);
  }
  stateReady
    .then(async () => {
      stateTask.done();
      if (config.proxyMode !== 'local' && !drain.signal.aborted) {
        // ztunnel connects to istio-cni only after the initial state sync.
        capture = startCapture(config, dp as DataplanePort, readiness, log, (id) => (certs === null ? Promise.reject(new Error('no CA configured (CA_ADDRESS or LOCAL_CA_DIR)')) : certs.ensure(id)));
      }
      if (localWorkloads === null || !gatesReadiness) return;
      const nodeName = config.nodeName as string;
      if (store.workloadsOnNode(nodeName).length === 0) log.warn({ node: nodeName }, 'no workload in the state runs on this node (yet)');
      await localWorkloads.settled();
      if (drain.signal.aborted || exitCode !== 0) return;
      // The predecessor's connections are carried on here before this daemon reports ready.
      await takeOver();
      if (drain.signal.aborted || exitCode !== 0) return;
      certTask.done();
      proxyTask.done();
      proxyReady = true;
    })
    // Capture or the local listeners failing to start after the first sync ends the daemon, as at startup.
    .catch((err: unknown) => fatal('starting after the initial state sync failed', err));

  return handle;
}

function safeVersion(deps: ProxyDeps, log: Logs['root']): NativeVersion | null {
  try {
    return deps.nativeVersion();
  } catch (err) {
    log.warn({ err: (err as Error).message }, 'native version unavailable');
    return null;
  }
}
