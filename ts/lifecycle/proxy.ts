// The daemon (`ztunnel-node proxy`): wires config, state, certificates, the native dataplane and the admin
// servers together, and owns the lifecycle (readiness while starting, drain on the way out).
//
// Start order, and why:
//  1. Local config is loaded and validated before anything binds: a bad file must exit 2 with nothing to undo.
//  2. The dataplane opens and receives the full state, then the admin/stats/readiness servers bind (readiness
//     answers "not ready" until the tasks below finish).
//  3. Local mode: certificates for every local identity are installed BEFORE listeners bind, so the first
//     inbound handshake already has a certificate.
// Readiness tasks: "state manager" (state applied; stays pending while XDS is configured, there is no XDS client
// yet), "certificates", "proxy" (listeners bound).
// Shutdown: SIGTERM, SIGINT or POST /quitquitquit start a graceful drain (a second SIGINT exits at once); admin
// servers stop accepting while the dataplane drains up to the termination deadline, then the runtime is joined.
import type { Server } from 'node:http';
import { configForDump, type Config } from '../config/index.js';
import { HBONE_PORT, SOCKS5_PORT } from '../config/defaults.js';
import { formatSocketAddress, joinHostPort, type SocketAddress } from '../config/address.js';
import { loadLocalConfig, type LocalConfig } from '../config/local.js';
import { createAdminServer } from '../admin/admin-server.js';
import { closeServer, listen } from '../admin/http.js';
import { Metrics } from '../admin/metrics.js';
import { createReadinessServer } from '../admin/readiness-server.js';
import { createStatsServer } from '../admin/stats-server.js';
import { LocalCertificateAuthority, type CertificateAuthority } from '../ca/authority.js';
import { CertificateManager } from '../ca/manager.js';
import { ConfigError } from '../errors.js';
import type { Logs } from '../log/logger.js';
import { Dataplane, nativeVersion } from '../native/index.js';
import type { DataplaneConfig, NativeVersion } from '../native/types.js';
import { workloadIdentity } from '../state/model.js';
import { StateStore } from '../state/store.js';
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
  | 'addLocalWorkload'
  | 'metrics'
  | 'authorize'
  | 'drainEvents'
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

export interface ProxyHandle {
  /** Where the servers actually listen (ports resolved when configured as 0). */
  readonly addresses: { readonly admin: SocketAddress; readonly stats: SocketAddress; readonly readiness: SocketAddress };
  readonly readiness: Readiness;
  /** Starts the drain (idempotent); resolves when it is complete. */
  shutdown(mode?: DrainMode, reason?: string): Promise<void>;
  /** Resolves with the process exit code once the proxy has shut down (0 clean, 1 after a fatal error). */
  readonly closed: Promise<number>;
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
  if (config.proxyMode === 'local') {
    // Validated by the config schema; re-checked so a programmatic Config cannot slip through.
    if (config.localCaDir === null || config.nodeName === null) {
      throw new ConfigError('LOCAL_CA_DIR and NODE_NAME are required when PROXY_MODE=local');
    }
    if (local === null) log.warn('PROXY_MODE=local without LOCAL_XDS_PATH or LOCAL_XDS: there are no workloads to serve');
    ca = deps.openLocalCa(config.localCaDir, config.trustDomain);
  }

  const readiness = new Readiness();
  const stateTask = readiness.register('state manager');
  const certTask = readiness.register('certificates');
  const proxyTask = readiness.register('proxy');
  const drain = new Drain(config.terminationDeadlineMs, log);
  const store = new StateStore();
  const loggers = { access: logs.forTarget('access'), dataplane: logs.forTarget('dataplane') };

  const dp = deps.openDataplane(dataplaneConfig(config));
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

  let certs: CertificateManager | null = null;
  let addresses: ProxyHandle['addresses'];
  try {
    if (local) {
      const delta = store.replace(local, (d) => dp.applyState(d));
      log.info(
        { source: local.source, workloads: local.workloads.length, services: local.services.length, policies: local.policies.length, full: delta?.full ?? false },
        'local config applied',
      );
    }
    if (config.xdsAddress === null) {
      stateTask.done();
    } else {
      // Honest readiness: istiod's state has not arrived (there is no XDS client in this build yet).
      log.warn({ xdsAddress: config.xdsAddress }, 'XDS is configured but not supported yet; "state manager" stays pending (set XDS_ADDRESS="" to disable)');
    }

    const version = safeVersion(deps, log);
    const metrics = new Metrics({ snapshot: () => dp.metrics(), istioVersion: config.istioVersion });
    const admin = createAdminServer({
      logs,
      quit: (reason) => void shutdown('graceful', reason),
      authorize: (r) => dp.authorize(r),
      configDump: () => ({
        workloads: store.dumpWorkloads(),
        services: store.dumpServices(),
        policies: store.dumpPolicies(),
        stagedServices: [],
        staticConfig: local?.raw ?? null,
        certificates: certs?.dump() ?? [],
        config: configForDump(config),
        version: buildInfo(version, config.istioVersion),
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
    pump();
    dp.shutdown();
    throw err;
  }

  const pumpTimer = setInterval(pump, EVENT_PUMP_INTERVAL_MS);
  pumpTimer.unref();

  // Drain watchers run concurrently: the servers stop accepting while the dataplane drains its connections.
  drain.watch('admin servers', () => Promise.all(servers.map((s) => closeServer(s))).then(() => undefined));
  drain.watch('certificates', () => certs?.stop());
  drain.watch('dataplane', async (_mode, deadlineMs) => {
    try {
      const clean = await dp.drain(deadlineMs);
      if (!clean) log.warn({ deadlineMs }, 'drain deadline reached; remaining connections were closed');
    } finally {
      clearInterval(pumpTimer);
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

  if (ca !== null && config.nodeName !== null) {
    certs = new CertificateManager({
      keys: dp,
      ca,
      ttlSeconds: Math.max(1, Math.round(config.secretTtlMs / 1000)),
      logger: logs.forTarget('ca'),
    });
    const manager = certs;
    const nodeName = config.nodeName;
    startLocalWorkloads().catch((err: unknown) => {
      if (drain.signal.aborted) return;
      log.error({ err: err instanceof Error ? err.message : String(err), code: (err as { code?: string }).code }, 'cannot start local workloads; shutting down');
      exitCode = 1;
      void shutdown('immediate', 'fatal error');
    });

    async function startLocalWorkloads(): Promise<void> {
      const workloads = store.workloadsOnNode(nodeName);
      if (workloads.length === 0) log.warn({ node: nodeName }, 'no workload in the local config runs on this node');
      const identities = [...new Set(workloads.map(workloadIdentity))];
      const ok = await Promise.all(identities.map((id) => manager.ensure(id)));
      if (drain.signal.aborted || ok.includes(false)) return;
      certTask.done();
      for (const w of workloads) {
        const ip = w.workloadIps[0];
        if (ip === undefined) {
          log.warn({ uid: w.uid }, 'local workload has no IP; no listeners for it');
          continue;
        }
        // Only HBONE workloads accept tunnels; every local workload gets a SOCKS5 entry, since its outbound traffic
        // may go to HBONE destinations (and so it holds a certificate too).
        const bound = await dp.addLocalWorkload({
          uid: w.uid,
          ...(w.protocol === 'HBONE' ? { hboneAddr: joinHostPort(ip, HBONE_PORT) } : {}),
          ...(config.socks5Enabled ? { socksAddr: joinHostPort(ip, SOCKS5_PORT) } : {}),
        });
        if (drain.signal.aborted) return;
        log.info({ identity: workloadIdentity(w), ...bound }, 'local workload listening');
      }
      proxyTask.done();
    }
  } else {
    // Shared and dedicated modes have no local listeners in this build (in-pod/ZDS is a later issue).
    certTask.done();
    proxyTask.done();
  }

  return { addresses, readiness, shutdown, closed };
}

function safeVersion(deps: ProxyDeps, log: Logs['root']): NativeVersion | null {
  try {
    return deps.nativeVersion();
  } catch (err) {
    log.warn({ err: (err as Error).message }, 'native version unavailable');
    return null;
  }
}
