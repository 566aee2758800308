// Traffic capture: shared (in-pod) mode hands the dataplane's workload proxy manager the istio-cni ZDS socket, and,
// when the daemon knows its own pod (POD_NAMESPACE, POD_NAME, SERVICE_ACCOUNT), serves that pod's inbound HBONE as
// ztunnel's self-proxy does (its metrics reached through the mesh, with policy); dedicated mode starts capture
// listeners for the one PROXY_WORKLOAD_INFO workload in the daemon's own namespace.
//
// Readiness (as in ztunnel): shared mode registers "workload proxy manager", which is done only while the manager is
// connected to istio-cni, has received the snapshot and has no pending pod; it turns pending again when the CNI
// connection drops, and done again when it recovers, without a restart. The manager's state is polled (one native
// call per tick, with the event pump), never pushed per pod; polls and metric scrapes leave the pods' live
// connections out (their cost is O(pods)), only config_dump lists them.
import type { Logger } from 'pino';
import type { Config } from '../config/index.js';
import type { DedicatedSpec, InPodConfig, InPodState, InPodWorkload, SelfInboundSpec } from '../native/types.js';
import type { Component } from './daemon.js';
import type { PendingTask, Readiness } from './readiness.js';

export const CAPTURE_POLL_MS = 250;
const SUMMARY = { connections: false };

export interface CapturePort {
  startInpod(cfg: InPodConfig): void;
  startDedicated(spec: DedicatedSpec): Promise<void>;
  startSelfInbound(spec: SelfInboundSpec): Promise<string>;
  inpodState(opts?: { connections: boolean }): InPodState | null;
}

export interface Capture {
  /** config_dump `workloadState` (pod uid → state, info). */
  workloadState(): Record<string, InPodWorkload>;
  /** The workload_manager_* metrics. */
  counters(): InPodState | null;
  stop(): void;
}

export function startCapture(
  config: Config,
  dp: CapturePort,
  readiness: Readiness,
  log: Logger,
  /** Resolves once the dedicated workload's certificate is installed. */
  ensureCertificate: (identity: string) => Promise<unknown>,
): Capture {
  let last: InPodState | null = null;
  let timer: NodeJS.Timeout | null = null;
  const origSrc = config.inpod.origSrc;
  if (config.proxyMode === 'shared') {
    let task: PendingTask | null = readiness.register('workload proxy manager');
    dp.startInpod({ uds: config.inpod.uds, mark: config.inpod.packetMark, reusePort: config.inpod.portReuse, origSrc, dedicated: false });
    log.info({ uds: config.inpod.uds }, 'in-pod mode: waiting for the istio-cni node agent');
    startSelfInbound(config, dp, log);
    const poll = () => {
      const s = dp.inpodState(SUMMARY);
      if (s === null) return;
      if (last !== null && last.connected !== s.connected) {
        if (s.connected) log.info('connected to the istio-cni node agent');
        else log.warn({ error: s.lastError }, 'lost the istio-cni node agent; reconnecting');
      }
      last = s;
      if (s.ready && task !== null) {
        task.done();
        task = null;
        log.info({ pods: s.activeProxies }, 'workload proxy manager ready');
      } else if (!s.ready && task === null) {
        task = readiness.register('workload proxy manager');
      }
    };
    timer = setInterval(poll, CAPTURE_POLL_MS);
    timer.unref();
  } else if (config.proxyMode === 'dedicated') {
    const info = config.proxyWorkloadInfo;
    if (info !== null) {
      const task = readiness.register('proxy');
      const identity = `spiffe://${config.trustDomain}/ns/${info.namespace}/sa/${info.serviceAccount}`;
      void ensureCertificate(identity)
        .then(() => dp.startDedicated({ ...info, mark: config.inpod.packetMark, origSrc }))
        .then(
          () => {
            task.done();
            log.info({ workload: `${info.namespace}/${info.name}`, identity }, 'dedicated mode: capture listeners bound');
          },
          (err: unknown) => log.error({ err: err instanceof Error ? err.message : String(err) }, 'dedicated mode: cannot start the capture listeners'),
        );
      timer = setInterval(() => (last = dp.inpodState(SUMMARY)), CAPTURE_POLL_MS);
      timer.unref();
    }
  }
  return {
    // config_dump reads the manager fresh (an operator expects what is true now, not up to one poll ago).
    workloadState: () => (dp.inpodState()?.workloads ?? {}) as Record<string, InPodWorkload>,
    // Read fresh per scrape (one native call), like the workload state: a poll's copy may be 250 ms old.
    counters: () => dp.inpodState(SUMMARY),
    stop: () => {
      if (timer !== null) clearInterval(timer);
    },
  };
}

/**
 * ztunnel's self-proxy: the daemon's own pod's inbound HBONE on [::]:15008 of its namespace, for the stats and
 * readiness ports (never the admin's or the proxies'), when the pod is known and the proxies are on. A bind failure
 * is logged as an error and changes nothing else (the daemon's own ports stay reachable directly).
 */
function startSelfInbound(config: Config, dp: CapturePort, log: Logger): void {
  const { podName, podNamespace, serviceAccount } = config;
  if (podName === null || podNamespace === null || serviceAccount === null || !config.enableProxy) return;
  const spec: SelfInboundSpec = {
    namespace: podNamespace,
    name: podName,
    serviceAccount,
    reachablePorts: [config.statsAddr.port, config.readinessAddr.port],
    reusePort: config.inpod.portReuse,
  };
  const workload = `${podNamespace}/${podName}`;
  dp.startSelfInbound(spec).then(
    (addr) => log.info({ addr, workload, reachablePorts: spec.reachablePorts }, "serving the daemon's own pod's inbound HBONE"),
    (err: unknown) =>
      log.error({ workload, err: err instanceof Error ? err.message : String(err) }, "cannot serve the daemon's own pod's inbound HBONE"),
  );
}

/** Capture as a component of the daemon: started after the initial state sync (ztunnel connects to istio-cni then). */
export class CaptureComponent implements Component {
  readonly name = 'capture';
  private current: Capture | null = null;

  constructor(
    private readonly config: Config,
    private readonly dp: () => CapturePort,
    private readonly readiness: Readiness,
    private readonly log: Logger,
    private readonly ensureCertificate: (identity: string) => Promise<unknown>,
  ) {}

  start(): void {
    this.current = startCapture(this.config, this.dp(), this.readiness, this.log, this.ensureCertificate);
  }

  stop(): void {
    this.current?.stop();
  }

  /** config_dump's `workloadState`: the pods the in-pod manager serves (empty before capture starts). */
  workloadState(): Record<string, InPodWorkload> {
    return this.current?.workloadState() ?? {};
  }

  /** The workload_manager_* metrics (null before capture starts). */
  counters(): InPodState | null {
    return this.current?.counters() ?? null;
  }
}
