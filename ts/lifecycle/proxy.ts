// The daemon (`ztunnel-node proxy`): wires config, state, certificates, the native dataplane, the XDS client and
// the admin servers together, and owns the lifecycle (readiness while starting, drain on the way out).
//
// Start order, and why:
//  1. Local config is loaded and validated before anything binds: a bad file must exit 2 with nothing to undo.
//  2. The dataplane opens and receives the local config's state, then the admin/stats/readiness servers bind
//     (readiness answers "not ready" until the tasks below finish), then the XDS client starts.
//  3. Every state change, whatever its source, goes through ONE entry point, `applyStateChange(source, change)`:
//     the store applies it incrementally and sends the dataplane a delta of what changed, then the local-workload
//     reconciler (local-workloads.ts) adds/removes certificates and listeners for the workloads on this node.
//     Certificates are installed BEFORE listeners bind, so the first inbound handshake already has one.
// Readiness tasks: "state manager" (the local config applied and, with XDS, both types received and ACKed),
// "certificates" and "proxy" (the local workloads known when the state became ready have certificates and
// listeners).
// Shutdown: SIGTERM, SIGINT or POST /quitquitquit start a graceful drain (a second SIGINT exits at once); the XDS
// client stops, admin servers stop accepting while the dataplane drains up to the termination deadline, then the
// runtime is joined.
import type { Server } from 'node:http';
import { configForDump, type Config } from '../config/index.js';
import { HBONE_PORT } from '../config/defaults.js';
import { formatSocketAddress, type SocketAddress } from '../config/address.js';
import { loadLocalConfig, type LocalConfig } from '../config/local.js';
import { createAdminServer } from '../admin/admin-server.js';
import { closeServer, listen } from '../admin/http.js';
import { Metrics } from '../admin/metrics.js';
import { createReadinessServer } from '../admin/readiness-server.js';
import { createStatsServer } from '../admin/stats-server.js';
import { LocalCertificateAuthority, type CertificateAuthority } from '../ca/authority.js';
import { IstiodCertificateAuthority } from '../ca/istiod.js';
import { CertificateManager } from '../ca/manager.js';
import { ConfigError } from '../errors.js';
import type { Logs } from '../log/logger.js';
import { Dataplane, nativeVersion } from '../native/index.js';
import type { DataplaneConfig, NativeVersion } from '../native/types.js';
import { StateStore, snapshotChange, type AppliedChange, type StateChange } from '../state/store.js';
import { XdsClient, ztunnelNodeId, ztunnelNodeMetadata } from '../xds/client.js';
import { TokenSource } from '../xds/grpc.js';
import { XdsMetrics } from '../xds/metrics.js';
import { LocalWorkloads } from './local-workloads.js';
import { answerCertificateRequests } from './certificates-on-demand.js';
import { startCapture, type Capture } from './capture.js';
import { watchLocalConfig, type LocalConfigWatch } from '../config/watch.js';
import { missingPolicyReferences } from '../policy/compile.js';
import { buildInfo } from '../version.js';
import { Drain, type DrainMode } from './drain.js';
import { logNativeEvent } from './events.js';
import { Readiness } from './readiness.js';

/** How often native events are drained into the logs: frequent enough to read as live, cheap (one JSON call). */
export const EVENT_PUMP_INTERVAL_MS = 250;

/** The dataplane methods the daemon uses (the native Dataplane; a fake in tests). */
export type DataplanePort = Pick<
  Dataplane,
  | 'applyState'
  | 'createCsr'
  | 'installCertificate'
  | 'forgetIdentity'
  | 'nextCertificateRequests'
  | 'addLocalWorkload'
  | 'removeLocalWorkload'
  | 'metrics'
  | 'authorize'
  | 'startInpod'
  | 'startDedicated'
  | 'inpodState'
  | 'drainEvents'
  | 'setEventLevels'
  | 'drain'
  | 'shutdown'
>;

/** What runProxy needs from the native module; injectable so the lifecycle can run against fakes. */
export interface ProxyDeps {
  openDataplane(cfg: DataplaneConfig): DataplanePort;
  openLocalCa(dir: string, trustDomain: string): CertificateAuthority;
  nativeVersion(): NativeVersion;
}

const NATIVE_DEPS: ProxyDeps = {
  openDataplane: (cfg) => Dataplane.open(cfg),
  openLocalCa: (dir, td) => LocalCertificateAuthority.open(dir, td),
  nativeVersion,
};

export interface ProxyOptions {
  deps?: Partial<ProxyDeps>;
  /** Install SIGTERM/SIGINT handlers (the CLI does; tests do not). Default true. */
  handleSignals?: boolean;
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

/** The native dataplane's config, derived from the daemon's Config. */
export function dataplaneConfig(config: Config): DataplaneConfig {
  return {
    nodeName: config.nodeName ?? '',
    clusterId: config.clusterId,
    network: config.network,
    trustDomain: config.trustDomain,
    workerThreads: config.numWorkerThreads,
    hbonePort: HBONE_PORT,
    poolMaxStreamsPerConnection: config.poolMaxStreamsPerConnection,
    poolUnusedReleaseTimeoutMs: config.poolUnusedReleaseTimeoutMs,
    http2: { ...config.http2 },
    connectTimeoutMs: config.connectionTimeoutMs,
    terminationDeadlineMs: config.terminationDeadlineMs,
    missingPolicyGraceMs: config.missingPolicyGraceMs,
    localhostAppTunnel: config.localhostAppTunnel,
    enableResponseBaggage: config.enableResponseBaggage,
    socks5Enabled: config.socks5Enabled,
    bindSourceIp: config.proxyMode === 'local',
  };
}

export async function runProxy(config: Config, logs: Logs, options: ProxyOptions = {}): Promise<ProxyHandle> {
  const deps: ProxyDeps = { ...NATIVE_DEPS, ...options.deps };
  const log = logs.root;
  log.info({ config: configForDump(config) }, 'starting ztunnel-node');

  const local: LocalConfig | null = await loadLocalConfig(config);
  let ca: CertificateAuthority | null = null;
  const token = new TokenSource(config.authToken);
  if (config.caAddress !== null && config.nodeName !== null) {
    // One daemon asks for many identities (local and shared modes): istiod must let it impersonate them.
    ca = new IstiodCertificateAuthority({
      target: { address: config.caAddress, rootCa: config.caRootCa, altHostname: config.altCaHostname },
      token,
      clusterId: config.clusterId,
      headers: config.caHeaders,
      impersonate: config.proxyMode !== 'dedicated',
    });
  }
  if (config.proxyMode === 'local') {
    // Validated by the config schema; re-checked so a programmatic Config cannot slip through.
    if ((config.localCaDir === null && config.caAddress === null) || config.nodeName === null) {
      throw new ConfigError('NODE_NAME, and LOCAL_CA_DIR or CA_ADDRESS, are required when PROXY_MODE=local');
    }
    if (local === null && config.xdsAddress === null) {
      log.warn('PROXY_MODE=local without LOCAL_XDS_PATH, LOCAL_XDS or XDS_ADDRESS: there are no workloads to serve');
    }
    if (ca === null) ca = deps.openLocalCa(config.localCaDir as string, config.trustDomain);
  }

  // The built-in CA serves any mode when LOCAL_CA_DIR is set and no remote CA is (e.g. the namespace tests).
  if (ca === null && config.localCaDir !== null) ca = deps.openLocalCa(config.localCaDir, config.trustDomain);

  const readiness = new Readiness();
  const stateTask = readiness.register('state manager');
  const certTask = readiness.register('certificates');
  const proxyTask = readiness.register('proxy');
  const drain = new Drain(config.terminationDeadlineMs, log);
  const store = new StateStore();
  const xdsMetrics = new XdsMetrics();
  const loggers = { access: logs.forTarget('access'), dataplane: logs.forTarget('dataplane') };

  const dp = deps.openDataplane(dataplaneConfig(config));
  // The dataplane builds only the events the log filter lets through, and follows its changes (admin /logging).
  const syncEventLevels = () => dp.setEventLevels(logs.levelOf('access'), logs.levelOf('dataplane'));
  syncEventLevels();
  const stopEventLevels = logs.onChange(syncEventLevels);
  const servers: Server[] = [];
  const pump = () => {
    try {
      for (const ev of dp.drainEvents()) logNativeEvent(ev, loggers);
    } catch (err) {
      log.error({ err: (err as Error).message }, 'reading dataplane events failed');
    }
  };

  // Shutdown is defined before any server can call it (POST /quitquitquit).
  let exitCode = 0;
  let removeSignals: () => void = () => undefined;
  let resolveClosed!: (code: number) => void;
  const closed = new Promise<number>((resolve) => (resolveClosed = resolve));
  function shutdown(mode: DrainMode = 'graceful', reason = 'requested'): Promise<void> {
    return drain.trigger(mode, reason).then(() => {
      removeSignals();
      log.info({ exitCode }, 'shutdown complete');
      resolveClosed(exitCode);
    });
  }
  function fatal(what: string, err: unknown): void {
    if (drain.signal.aborted) return;
    log.error({ err: err instanceof Error ? err.message : String(err), code: (err as { code?: string }).code }, `${what}; shutting down`);
    exitCode = 1;
    void shutdown('immediate', 'fatal error');
  }

  // Certificates and listeners for the workloads on this node (local mode), or certificate prefetch only
  // (shared mode, whose listeners live in pod network namespaces: a later issue).
  let certs: CertificateManager | null = null;
  let certAsks: { stop(): void } | null = null;
  let localWorkloads: LocalWorkloads | null = null;
  let proxyReady = false;
  if (ca !== null) {
    certs = new CertificateManager({
      keys: dp,
      ca,
      ttlSeconds: Math.max(1, Math.round(config.secretTtlMs / 1000)),
      logger: logs.forTarget('ca'),
    });
    // Certificates on demand: a handshake that finds none asks, and waits (prefetch stays an optimisation).
    certAsks = answerCertificateRequests(dp, certs, logs.forTarget('ca'));
  }
  if (certs !== null && config.nodeName !== null && config.proxyMode !== 'dedicated') {
    localWorkloads = new LocalWorkloads({
      nodeName: config.nodeName,
      certs: certs as CertificateManager,
      listeners:
        config.proxyMode === 'local'
          ? { socks5: config.socks5Enabled, add: (spec) => dp.addLocalWorkload(spec), remove: (uid) => dp.removeLocalWorkload(uid) }
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

  let missingPolicies: Array<{ uid: string; policy: string }> = [];
  /** uid -> the policy keys it names, for the workloads that name any (the missing-policy check's index). */
  const policyRefs = new Map<string, string[]>();
  function applyStateChange(source: StateSource, change: StateChange): AppliedChange {
    const applied = store.apply(change, (d) => dp.applyState(d));
    localWorkloads?.reconcile(applied.workloads);
    // Kept O(change): only workloads that name policies are indexed, and only re-checked when a policy or one of
    // them changed (a full scan here cost ~6 ms per xDS update at 100k workloads).
    let refsChanged = false;
    for (const t of applied.workloads) {
      if ((t.before?.authorizationPolicies.length ?? 0) > 0 || (t.after?.authorizationPolicies.length ?? 0) > 0) refsChanged = true;
      if (t.after !== undefined && t.after.authorizationPolicies.length > 0) policyRefs.set(t.uid, t.after.authorizationPolicies);
      else policyRefs.delete(t.uid);
    }
    if (applied.policies > 0 || refsChanged) {
      // Fail closed (README "Authorization"): a named WORKLOAD_SELECTOR policy that has not arrived denies.
      const referencing = [...policyRefs].map(([uid, authorizationPolicies]) => ({ uid, authorizationPolicies }));
      const now = missingPolicyReferences(referencing, (key) => store.has('policy', key));
      const seen = new Set(missingPolicies.map((m) => `${m.uid}|${m.policy}`));
      for (const m of now) {
        if (!seen.has(`${m.uid}|${m.policy}`)) {
          log.warn({ uid: m.uid, policy: m.policy }, 'workload names an authorization policy that is not known: denying its inbound traffic until it arrives');
        }
      }
      missingPolicies = now;
    }
    return applied;
  }

  let xds: XdsClient | null = null;
  let capture: Capture | null = null;
  let localWatch: LocalConfigWatch | null = null;
  let markSynced: () => void = () => undefined;
  const stateReady = new Promise<void>((resolve) => (markSynced = resolve));
  let addresses: ProxyHandle['addresses'];
  try {
    if (local) {
      const applied = applyStateChange('local', snapshotChange({ workloads: [], services: [], policies: [] }, local));
      log.info(
        { source: local.source, workloads: local.workloads.length, services: local.services.length, policies: local.policies.length, full: applied.delta?.full ?? false },
        'local config applied',
      );
    }
    if (config.xdsAddress === null) markSynced();

    const version = safeVersion(deps, log);
    const metrics = new Metrics({
      snapshot: () => dp.metrics(),
      istioVersion: config.istioVersion,
      xds: () => xdsMetrics.snapshot(),
      missingPolicies: () => missingPolicies.length,
      ...(config.proxyMode === 'local' ? {} : { workloadManager: () => capture?.counters() ?? null }),
    });
    const admin = createAdminServer({
      logs,
      quit: (reason) => void shutdown('graceful', reason),
      authorize: (r) => dp.authorize(r),
      configDump: () => ({
        workloads: store.dumpWorkloads(),
        services: store.dumpServices(),
        policies: store.dumpPolicies(),
        stagedServices: store.dumpStagedServices(),
        staticConfig: local?.raw ?? null,
        certificates: certs?.dump() ?? [],
        config: configForDump(config),
        version: buildInfo(version, config.istioVersion),
        ...(config.proxyMode === 'shared' ? { workloadState: capture?.workloadState() ?? {} } : {}),
      }),
    });
    const stats = createStatsServer(metrics);
    const ready = createReadinessServer(readiness);
    servers.push(ready, admin, stats);
    addresses = {
      readiness: await listen(ready, config.readinessAddr),
      admin: await listen(admin, config.adminAddr),
      stats: await listen(stats, config.statsAddr),
    };
    log.info(
      { admin: formatSocketAddress(addresses.admin), stats: formatSocketAddress(addresses.stats), readiness: formatSocketAddress(addresses.readiness) },
      'admin servers listening',
    );
  } catch (err) {
    await Promise.all(servers.map((s) => closeServer(s, 0)));
    stopEventLevels();
    pump();
    dp.shutdown();
    throw err;
  }

  const pumpTimer = setInterval(pump, EVENT_PUMP_INTERVAL_MS);
  pumpTimer.unref();

  if (config.xdsAddress !== null) {
    xds = new XdsClient({
      target: { address: config.xdsAddress, rootCa: config.xdsRootCa, altHostname: config.altXdsHostname },
      token,
      clusterId: config.clusterId,
      headers: config.xdsHeaders,
      node: { id: ztunnelNodeId(config), metadata: ztunnelNodeMetadata(config) },
      apply: (change) => {
        applyStateChange('xds', change);
      },
      onSynced: () => markSynced(),
      metrics: xdsMetrics,
      logger: logs.forTarget('xds'),
    });
    xds.start();
  }

  // Drain watchers run concurrently: the servers stop accepting while the dataplane drains its connections.
  drain.watch('xds', () => {
    xds?.stop();
    localWatch?.stop();
    capture?.stop();
  });
  drain.watch('admin servers', () => Promise.all(servers.map((s) => closeServer(s))).then(() => undefined));
  drain.watch('certificates', () => {
    localWorkloads?.stop();
    certAsks?.stop();
    certs?.stop();
  });
  drain.watch('dataplane', async (_mode, deadlineMs) => {
    try {
      const clean = await dp.drain(deadlineMs);
      if (!clean) log.warn({ deadlineMs }, 'drain deadline reached; remaining connections were closed');
    } finally {
      clearInterval(pumpTimer);
      stopEventLevels();
      pump(); // the last access logs of drained connections
      dp.shutdown();
    }
  });
  if (options.handleSignals !== false) removeSignals = installSignals();

  function installSignals(): () => void {
    const onSignal = (signal: NodeJS.Signals) => {
      if (drain.mode !== null) {
        if (signal === 'SIGINT') {
          log.warn('second SIGINT: exiting immediately');
          process.exit(0);
        }
        return;
      }
      void shutdown('graceful', signal);
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
    return () => {
      process.off('SIGTERM', onSignal);
      process.off('SIGINT', onSignal);
    };
  }

  // Reload the local config file when it changes: only what changed is applied; a bad file keeps the last good one.
  if (local !== null && config.localXdsPath !== null) {
    let current: LocalConfig = local;
    localWatch = watchLocalConfig(
      config.localXdsPath,
      (next) => {
        try {
          const applied = applyStateChange('local', snapshotChange(current, next));
          current = next;
          log.info({ source: next.source, policies: applied.policies, workloads: applied.workloads.length, services: applied.services }, 'local config reloaded');
        } catch (err) {
          log.error({ err: err instanceof Error ? err.message : String(err) }, 'local config rejected by the dataplane; keeping the last good config');
        }
      },
      (err) => log.error({ err: err instanceof Error ? err.message : String(err) }, 'local config is invalid; keeping the last good config'),
    );
  }

  // Readiness: the state first, then the local workloads that state places on this node.
  const gatesReadiness = localWorkloads !== null && config.proxyMode === 'local';
  if (!gatesReadiness) {
    // No local-mode listeners: nothing for "certificates"/"proxy" to wait for (prefetch does not gate readiness;
    // in-pod has its own task).
    certTask.done();
    proxyTask.done();
    proxyReady = true;
  }
  void stateReady.then(async () => {
    stateTask.done();
    if (config.proxyMode !== 'local' && !drain.signal.aborted) {
      // ztunnel connects to istio-cni only after the initial state sync.
      capture = startCapture(config, dp, readiness, log, (id) => (certs === null ? Promise.reject(new Error('no CA configured (CA_ADDRESS or LOCAL_CA_DIR)')) : certs.ensure(id)));
    }
    if (localWorkloads === null || !gatesReadiness) return;
    const nodeName = config.nodeName as string;
    if (store.workloadsOnNode(nodeName).length === 0) log.warn({ node: nodeName }, 'no workload in the state runs on this node (yet)');
    await localWorkloads.settled();
    if (drain.signal.aborted || exitCode !== 0) return;
    certTask.done();
    proxyTask.done();
    proxyReady = true;
  });

  return { addresses, readiness, shutdown, closed, applyStateChange };
}

function safeVersion(deps: ProxyDeps, log: Logs['root']): NativeVersion | null {
  try {
    return deps.nativeVersion();
  } catch (err) {
    log.warn({ err: (err as Error).message }, 'native version unavailable');
    return null;
  }
}
