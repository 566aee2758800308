// The daemon (`ztunnel-node proxy`): its components (daemon.ts), composed here in start order; the drain stops them
// in reverse, and a start that fails part-way is undone by the same drain.
//
// Start order, and why:
//  1. The local config (local-source.ts) starts reading and validating the document off the main thread, and the
//     admin, stats and readiness servers (servers.ts) bind at once: a 50 MiB file takes a while to validate, and the
//     servers answer throughout (readiness "not ready" until the tasks below finish; metrics without traffic yet).
//     The dashboard (dashboard.ts) loads with its first request.
//  2. Only once the document is valid does anything get created: a bad file closes the servers and exits 2 with no CA
//     directory, no dataplane and no state to undo. Then the dataplane (dataplane.ts: revocation lists, OTLP export,
//     the event pump) and the certificates (certificates.ts: the CA, the manager, this node's workloads) start, the
//     local document is applied, and the xDS client (xds-source.ts) starts.
//  3. Every state change, from either source, takes one path (mesh.ts): the dataplane holds the mesh and answers
//     with what changed; this node's workloads get certificates before listeners bind.
//  4. After the initial state sync, capture (capture.ts: in-pod or dedicated) starts, as ztunnel connects to
//     istio-cni only then; with HANDOVER_ENABLED the predecessor's connections are taken over (handover.ts).
// Readiness tasks: "state manager" (the local config applied and, with XDS, both types received and ACKed),
// "certificates" and "proxy" (the local workloads known when the state became ready have certificates and
// listeners).
// Shutdown (exit.ts): SIGTERM, SIGINT or POST /quitquitquit start a graceful drain (a second SIGINT exits at once).
import type { Config } from '../config/index.js';
import { configForDump } from '../config/dump.js';
import type { FirstLocalLoad } from '../config/off-thread.js';
import { nativeTlsProblem } from '../config/tls.js';
import { LocalCertificateAuthority, type CertificateAuthority } from '../ca/authority.js';
import { ConfigError } from '../errors.js';
import { settleHeap } from '../heap.js';
import type { Logs } from '../log/logger.js';
import type { Logger } from 'pino';
import { Dataplane, nativeVersion, releaseColdCode } from '../native/index.js';
import type { DataplaneConfig, InPodWorkload, NativeVersion } from '../native/types.js';
import { StateStore, type AppliedChange, type StateChange } from '../state/store.js';
import { TokenSource } from '../xds/token.js';
import { XdsMetrics } from '../xds/metrics.js';
import { buildInfo } from '../version.js';
import { CaptureComponent } from './capture.js';
import { Certificates } from './certificates.js';
import { Daemon } from './daemon.js';
import { DashboardComponent } from './dashboard.js';
import { DataplaneComponent, type DataplanePort } from './dataplane.js';
import { Drain, type DrainMode } from './drain.js';
import { Exit } from './exit.js';
import { HandoverTally, takeOverThenServe } from './handover.js';
import { LocalSource } from './local-source.js';
import { Mesh, type StateSource } from './mesh.js';
import { Readiness } from './readiness.js';
import { Servers, type ServerAddresses } from './servers.js';
import { XdsSource } from './xds-source.js';

export type { DataplanePort } from './dataplane.js';
export type { StateSource } from './mesh.js';

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
  /** The first local config load, made with the config's parse (config/off-thread.ts `startupOffThread`). */
  firstLocalLoad?: FirstLocalLoad | null;
}

export interface ProxyHandle {
  /** Where the servers actually listen (ports resolved when configured as 0). */
  readonly addresses: ServerAddresses;
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

/** How long after readiness the heap is settled and the code pages startup ran once are released. */
export const COLD_CODE_RELEASE_MS = 3_000;

/**
 * Ready, and a moment on: what startup left behind goes. The JavaScript heap is collected thoroughly and the free
 * malloc heap trimmed (heap.ts `settleHeap`), then the code pages startup ran once (Node's bootstrap and loader, V8's
 * compilers) leave the RSS; what runs again faults back in from the page cache (native host/src/footprint.rs).
 */
function settleOnceReady(readiness: Readiness, log: Logger): void {
  readiness.whenReady().then(() => {
    setTimeout(() => {
      const gcMs = settleHeap();
      log.debug({ ms: Math.round(gcMs * 10) / 10 }, 'heap settled after start');
      try {
        const r = releaseColdCode();
        log.debug({ mappings: r.mappings, skipped: r.skipped, releasedMiB: Math.round(r.residentBytes / 2 ** 17) / 8 }, 'cold code pages released');
      } catch (err) {
        log.debug({ err: (err as Error).message }, 'releasing cold code pages failed');
      }
    }, COLD_CODE_RELEASE_MS).unref();
  }, () => undefined);
}

/** The config's own consistency, checked before anything is bound. */
function checkStartable(config: Config, deps: ProxyDeps, log: Logger): void {
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
}

export async function runProxy(config: Config, logs: Logs, options: ProxyOptions = {}): Promise<ProxyHandle> {
  const deps: ProxyDeps = { ...NATIVE_DEPS, ...options.deps };
  const log = logs.root;
  log.info({ config: configForDump(config) }, 'starting ztunnel-node');
  checkStartable(config, deps, log);

  const readiness = new Readiness();
  const stateTask = readiness.register('state manager');
  const certTask = readiness.register('certificates');
  const proxyTask = readiness.register('proxy');
  settleOnceReady(readiness, log);
  const drain = new Drain(config.terminationDeadlineMs, log);
  const daemon = new Daemon(drain);
  const exit = new Exit(drain, log, options.handleSignals !== false);
  const store = new StateStore(config.nodeName);
  const xdsMetrics = new XdsMetrics();
  const handovers = new HandoverTally();
  const token = new TokenSource(config.authToken);
  const version = safeVersion(deps, log);
  let synced!: () => void;
  const stateReady = new Promise<void>((resolve) => (synced = resolve));
  // At startup a local workload that cannot be served is fatal (the operator sees it at once); once the proxy is
  // ready, one bad workload must not take the node's other workloads down.
  let proxyReady = false;

  // The components. Each reads the others through what they expose; those not started yet expose nothing.
  const dataplane: DataplaneComponent = new DataplaneComponent({
    config,
    logs,
    open: (cfg) => deps.openDataplane(cfg),
    ownPorts: () => [servers.addresses.admin.port, servers.addresses.stats.port, servers.addresses.readiness.port],
    observe: (events) => dashboard.observe(events),
  });
  const certificates = new Certificates({
    config,
    logs,
    token,
    plane: () => dataplane.running(),
    openLocalCa: (dir, td) => deps.openLocalCa(dir, td),
    onWorkloadError: (uid, err) => {
      if (!proxyReady) exit.fatal(`cannot start local workload ${uid}`, err);
      else log.error({ uid, err: err instanceof Error ? err.message : String(err) }, 'cannot serve local workload');
    },
  });
  const mesh = new Mesh({
    store,
    plane: () => dataplane.running(),
    reconcile: (w) => certificates.localWorkloads?.reconcile(w),
    log,
    missingPolicyGraceMs: config.missingPolicyGraceMs,
    signal: drain.signal,
  });
  const local = new LocalSource(config, log, mesh, drain.signal, options.firstLocalLoad ?? null);
  const xds = new XdsSource({ config, logs, token, mesh, metrics: xdsMetrics, onSynced: () => synced() });
  const capture = new CaptureComponent(config, () => dataplane.running(), readiness, log, (id) => certificates.ensure(id));
  /**
   * config_dump's `workloadState`, in every mode, as istioctl's `ztunnel-config connections` reads it: the pods the
   * in-pod manager serves, or the workloads whose listeners local mode binds; with their live connections.
   */
  const workloadState = (): Record<string, InPodWorkload> =>
    config.proxyMode === 'local' ? (dataplane.plane?.localWorkloadState() ?? {}) : capture.workloadState();
  const dashboard = new DashboardComponent({
    node: config.nodeName ?? '',
    mode: config.proxyMode,
    workloads: () => store.onThisNode,
    certificates: () => certificates.manager?.states() ?? [],
    metrics: () => dataplane.plane?.metrics() ?? null,
    workloadState,
  });
  const servers: Servers = new Servers({
    config,
    logs,
    readiness,
    admin: {
      quit: (reason) => exit.soon('graceful', reason),
      // Before the dataplane opens (a large local config loading) these answer 503, as a not-ready service should.
      authorize: (r) => dataplane.running().authorize(r),
      previewAuthz: async (r) => dataplane.running().previewAuthz(r),
      cpuProfile: async (seconds, frequency) => dataplane.running().cpuProfile(seconds, frequency),
      cancelCpuProfile: () => dataplane.running().cancelCpuProfile(),
      heapProfiling: (activate) => dataplane.running().heapProfiling(activate),
      heapProfile: async () => dataplane.running().heapProfile(),
      configDump: () => {
        // The mesh is rendered by the dataplane, its only holder (before it opens: empty).
        const plane = dataplane.plane;
        const dumped = plane?.meshDump() ?? { workloads: [], services: [], policies: [], stagedServices: {} };
        return {
          workloads: dumped.workloads,
          services: dumped.services,
          policies: dumped.policies,
          stagedServices: dumped.stagedServices,
          staticConfig: local.staticConfig(plane),
          certificates: certificates.manager?.dump() ?? [],
          config: configForDump(config),
          version: buildInfo(version, config.istioVersion),
          workloadState: workloadState(),
          // Beyond ztunnel, after its keys: the endpoints outlier detection tracks (ejected ones with the time left).
          outliers: plane?.outliers() ?? [],
        };
      },
      dashboard,
    },
    metrics: {
      suppressedLogs: () => dataplane.pump.suppressed,
      snapshot: () => dataplane.plane?.metrics({ trafficText: true }) ?? { socketsOpen: { source: 0, destination: 0 } },
      istioVersion: config.istioVersion,
      xds: () => xdsMetrics.snapshot(),
      missingPolicies: () => store.missingReferences,
      handover: () => handovers,
      otlp: () => dataplane.accessExport?.counters() ?? null,
      ...(config.proxyMode === 'local' ? {} : { workloadManager: () => capture.counters() }),
    },
  });

  const handle: ProxyHandle = {
    get addresses() {
      return servers.addresses;
    },
    readiness,
    shutdown: (mode, reason) => exit.shutdown(mode, reason),
    closed: exit.closed,
    applyStateChange: (source, change) => mesh.applyStateChange(source, change),
  };

  try {
    // The drain can begin from here on (/quitquitquit, signals), also while the local config loads.
    if (!(await daemon.start(local, servers, dashboard))) return handle;
    exit.installSignals();
    options.onListening?.(servers.addresses);
    // The local config is valid: from here on things get created.
    await local.first;
    if (!(await daemon.start(dataplane, certificates))) return handle;
    await local.applyFirst();
    if (!(await daemon.start(xds))) return handle;
  } catch (err) {
    // Shut down while starting: the drain under way resolves `closed`.
    if (daemon.stopping) return handle;
    // A bad file, a refused state, a port in use: what started is stopped, and runProxy rejects.
    await drain.trigger('immediate', 'start failed');
    exit.release();
    throw err;
  }

  /**
   * Hand-over (HANDOVER_ENABLED): take the connections of the daemon this one replaces, then serve the socket for the
   * next one; a successor that speaks to this daemon drains it. A failure here is logged: the daemon serves anyway.
   */
  const takeOver = async (): Promise<void> => {
    const plane = dataplane.plane;
    if (!config.handover.enabled || plane === null || daemon.stopping) return;
    try {
      await takeOverThenServe({
        dp: plane,
        socket: config.handover.socket,
        nodeName: config.nodeName ?? '',
        log,
        counts: handovers,
        signal: drain.signal,
        // Local mode exits 0 once drained; under an orchestrator the daemon waits for its SIGTERM (see exit.ts).
        onSuccessor: () => exit.soon('graceful', 'a successor took over', config.proxyMode !== 'local'),
      });
    } catch (err) {
      log.error({ err: err instanceof Error ? err.message : String(err), socket: config.handover.socket }, 'hand-over socket not served: an upgrade of this daemon will drain its connections');
    }
  };

  // Readiness: the state first, then the local workloads that state places on this node.
  const localWorkloads = certificates.localWorkloads;
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
      // ztunnel connects to istio-cni only after the initial state sync.
      if (config.proxyMode !== 'local') await daemon.start(capture);
      if (localWorkloads === null || !gatesReadiness) return;
      const nodeName = config.nodeName as string;
      if (store.workloadsOnNode(nodeName).length === 0) log.warn({ node: nodeName }, 'no workload in the state runs on this node (yet)');
      await localWorkloads.settled();
      if (daemon.stopping || exit.failed) return;
      // The predecessor's connections are carried on here before this daemon reports ready.
      await takeOver();
      if (daemon.stopping || exit.failed) return;
      certTask.done();
      proxyTask.done();
      proxyReady = true;
    })
    // Capture or the local listeners failing to start after the first sync ends the daemon, as at startup.
    .catch((err: unknown) => exit.fatal('starting after the initial state sync failed', err));

  return handle;
}

function safeVersion(deps: ProxyDeps, log: Logger): NativeVersion | null {
  try {
    return deps.nativeVersion();
  } catch (err) {
    log.warn({ err: (err as Error).message }, 'native version unavailable');
    return null;
  }
}
