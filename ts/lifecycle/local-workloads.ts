// The local-workload reconciler: after every state change, makes certificates and listeners follow the workloads
// scheduled on this node (`node == NODE_NAME`), whatever source they came from (xDS or the local config file).
//
// Invariants:
// - Work is O(changed workloads): it is driven by the store's WorkloadTransitions, never by a scan of the state.
// - Operations on one workload are serialized (a chain per uid), so an add racing a remove cannot leave a
//   listener behind; operations on different workloads run concurrently.
// - A workload's certificate is installed BEFORE its listeners bind, so the first handshake already has one.
// - An identity is tracked by the certificate manager while at least one local workload uses it, and forgotten
//   when the last one goes.
// - A workload is (re)bound only when what its listeners depend on changed: IP, protocol or identity.
import { HBONE_PORT, SOCKS5_PORT } from '../config/defaults.js';
import { joinHostPort } from '../config/address.js';
import type { Logger } from 'pino';
import type { CertificateManager } from '../ca/manager.js';
import type { BoundListeners, LocalWorkloadSpec } from '../native/types.js';
import { workloadIdentity, type WorkloadInfo } from '../state/model.js';
import type { WorkloadTransition } from '../state/store.js';

export interface LocalWorkloadsOptions {
  nodeName: string;
  certs: CertificateManager;
  /** Bind per-workload listeners (local mode); false: certificates only (prefetch, shared mode). */
  listeners: {
    socks5: boolean;
    add(spec: LocalWorkloadSpec): Promise<BoundListeners>;
    remove(uid: string): Promise<void>;
  } | null;
  logger: Logger;
  /** A workload could not be served (certificate never came, bind failed). */
  onError(uid: string, err: unknown): void;
}

interface Served {
  /** What the listeners were bound for; null when nothing is bound. */
  spec: LocalWorkloadSpec | null;
  identity: string;
  key: string;
}

/** What the listeners depend on; a change here rebinds. */
function servingKey(w: WorkloadInfo): string {
  return `${workloadIdentity(w)}|${w.protocol}|${w.workloadIps[0] ?? ''}`;
}

/** Whether a workload on this node needs a certificate: every one with listeners; else HBONE/native tunnel. */
function wantsCertificate(w: WorkloadInfo, listeners: boolean): boolean {
  return listeners || w.protocol === 'HBONE' || w.nativeTunnel;
}

export class LocalWorkloads {
  private readonly served = new Map<string, Served>();
  private readonly chains = new Map<string, Promise<void>>();
  /** identity -> uids of the local workloads using it */
  private readonly users = new Map<string, Set<string>>();
  private stopped = false;

  constructor(private readonly opts: LocalWorkloadsOptions) {}

  /** Applies the workload transitions of one state change. Returns at once; the work is asynchronous. */
  reconcile(transitions: readonly WorkloadTransition[]): void {
    const { nodeName } = this.opts;
    for (const t of transitions) {
      const wasLocal = t.before?.node === nodeName;
      const isLocal = t.after?.node === nodeName;
      if (!wasLocal && !isLocal) continue;
      const after = isLocal ? (t.after as WorkloadInfo) : undefined;
      const current = this.served.get(t.uid);
      if (after !== undefined && current !== undefined && current.key === servingKey(after)) continue;
      this.enqueue(t.uid, () => this.converge(t.uid, after));
    }
  }

  /** Resolves when every queued operation has finished (readiness: the local workloads are served). */
  async settled(): Promise<void> {
    while (this.chains.size > 0) await Promise.all([...this.chains.values()]);
  }

  /** uids currently served (listeners bound, or certificate tracked without listeners). */
  servedUids(): string[] {
    return [...this.served.keys()].sort();
  }

  stop(): void {
    this.stopped = true;
  }

  private enqueue(uid: string, op: () => Promise<void>): void {
    const prev = this.chains.get(uid) ?? Promise.resolve();
    const next = prev.then(op).catch((err: unknown) => {
      if (!this.stopped) this.opts.onError(uid, err);
    });
    this.chains.set(uid, next);
    void next.then(() => {
      if (this.chains.get(uid) === next) this.chains.delete(uid);
    });
  }

  /** Brings one uid to `want` (undefined: not served). */
  private async converge(uid: string, want: WorkloadInfo | undefined): Promise<void> {
    if (this.stopped) return;
    const { certs, listeners, logger } = this.opts;
    const current = this.served.get(uid);
    if (current !== undefined) {
      if (want !== undefined && current.key === servingKey(want)) return;
      this.served.delete(uid);
      if (current.spec !== null && listeners) {
        await listeners.remove(uid);
        logger.info({ uid }, 'local workload listeners removed');
      }
      this.release(uid, current.identity);
    }
    if (want === undefined) return;
    const identity = workloadIdentity(want);
    const served: Served = { spec: null, identity, key: servingKey(want) };
    if (!wantsCertificate(want, listeners !== null)) {
      this.served.set(uid, served);
      return;
    }
    this.retain(uid, identity);
    this.served.set(uid, served);
    const ok = await certs.ensure(identity, 'Warmup');
    if (!ok || this.stopped || this.served.get(uid) !== served) return;
    if (listeners === null) return;
    const ip = want.workloadIps[0];
    if (ip === undefined) {
      logger.warn({ uid }, 'local workload has no IP; no listeners for it');
      return;
    }
    // Only HBONE workloads accept tunnels; every local workload gets a SOCKS5 entry, since its outbound traffic
    // may go to HBONE destinations (and so it holds a certificate too).
    const spec: LocalWorkloadSpec = {
      uid,
      ...(want.protocol === 'HBONE' ? { hboneAddr: joinHostPort(ip, HBONE_PORT) } : {}),
      ...(listeners.socks5 ? { socksAddr: joinHostPort(ip, SOCKS5_PORT) } : {}),
    };
    const bound = await listeners.add(spec);
    served.spec = spec;
    logger.info({ identity, ...bound }, 'local workload listening');
  }

  private retain(uid: string, identity: string): void {
    let set = this.users.get(identity);
    if (!set) this.users.set(identity, (set = new Set()));
    set.add(uid);
  }

  private release(uid: string, identity: string): void {
    const set = this.users.get(identity);
    if (!set) return;
    set.delete(uid);
    if (set.size === 0) {
      this.users.delete(identity);
      this.opts.certs.forget(identity);
    }
  }
}
