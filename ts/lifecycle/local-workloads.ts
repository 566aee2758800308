// The local-workload reconciler: after every state change, makes certificates and listeners follow the workloads
// scheduled on this node (`node == NODE_NAME`), whatever source they came from (xDS or the local config file).
//
// Invariants:
// - Work is O(changed workloads): it is driven by the store's WorkloadTransitions, never by a scan of the state.
// - Operations on one workload are serialized (a chain per uid), so an add racing a remove cannot leave a
//   listener behind; operations on different workloads run concurrently.
// - A workload's certificate is installed BEFORE its listeners bind, so the first handshake already has one.
// - Which workload uses which identity is bookkept synchronously in `reconcile` (the claims): an identity is
//   tracked by the certificate manager while at least one local workload claims it, and forgotten as soon as the
//   last one goes, even while a request for it is still pending (its waiters resolve false, so the chain of a
//   workload that left is never stuck behind a CA that does not answer).
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
    /** false: ENABLE_PROXY=false, the DNS proxy alone (no HBONE or SOCKS5 listener, no certificate needed). */
    proxies?: boolean;
    socks5: boolean;
    /** The DNS proxy's port on each workload's IP; null: none. Optional (none) for callers without DNS. */
    dnsPort?: number | null;
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
  key: string;
}

/** What the listeners depend on; a change here rebinds. */
function servingKey(w: WorkloadInfo): string {
  return `${workloadIdentity(w)}|${w.protocol}|${w.workloadIps[0] ?? ''}`;
}

/** Whether a workload on this node needs a certificate: every one with listeners; else HBONE/native tunnel. */
function wantsCertificate(w: WorkloadInfo, listeners: boolean): boolean {
  return listeners || w.protocol === 'HBONE' || w.nativeTunnel === true;
}

export class LocalWorkloads {
  /** uid -> what is bound for it (set by the asynchronous part). */
  private readonly served = new Map<string, Served>();
  /** uid -> the latest serving key asked for (set synchronously by reconcile). */
  private readonly wanted = new Map<string, string>();
  private readonly chains = new Map<string, Promise<void>>();
  /** uid -> the identity it claims; identity -> the uids claiming it */
  private readonly claims = new Map<string, string>();
  private readonly users = new Map<string, Set<string>>();
  private stopped = false;

  constructor(private readonly opts: LocalWorkloadsOptions) {}

  /** Applies the workload transitions of one state change. Returns at once; the work is asynchronous. */
  reconcile(transitions: readonly WorkloadTransition[]): void {
    const { nodeName, listeners } = this.opts;
    for (const t of transitions) {
      const wasLocal = t.before?.node === nodeName;
      const isLocal = t.after?.node === nodeName;
      if (!wasLocal && !isLocal) continue;
      const after = isLocal ? (t.after as WorkloadInfo) : undefined;
      const key = after === undefined ? null : servingKey(after);
      if ((this.wanted.get(t.uid) ?? null) === key) continue;
      if (key === null) this.wanted.delete(t.uid);
      else this.wanted.set(t.uid, key);
      // DNS alone (ENABLE_PROXY=false) needs no certificate.
      const proxies = listeners?.proxies !== false;
      this.claim(t.uid, proxies && after !== undefined && wantsCertificate(after, listeners !== null) ? workloadIdentity(after) : null);
      this.enqueue(t.uid, () => this.converge(t.uid, after));
    }
  }

  /** Resolves when every queued operation has finished (readiness: the local workloads are served). */
  async settled(): Promise<void> {
    while (this.chains.size > 0) await Promise.all([...this.chains.values()]);
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
    // `next` never rejects (its failures went to onError above).
    next.then(
      () => {
        if (this.chains.get(uid) === next) this.chains.delete(uid);
      },
      () => undefined,
    );
  }

  /** Brings one uid's listeners to `want` (undefined: none). Certificates were claimed in `reconcile`. */
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
    }
    if (want === undefined) return;
    const key = servingKey(want);
    const served: Served = { spec: null, key };
    this.served.set(uid, served);
    const identity = workloadIdentity(want);
    const proxies = listeners?.proxies !== false;
    if (proxies) {
      if (this.claims.get(uid) !== identity) return; // no certificate needed (prefetch only), or no longer wanted
      const ok = await certs.ensure(identity, 'Warmup');
      if (!ok || this.stopped || this.served.get(uid) !== served || this.wanted.get(uid) !== key) return;
    }
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
      ...(proxies && want.protocol === 'HBONE' ? { hboneAddr: joinHostPort(ip, HBONE_PORT) } : {}),
      ...(proxies && listeners.socks5 ? { socksAddr: joinHostPort(ip, SOCKS5_PORT) } : {}),
      ...(listeners.dnsPort != null ? { dnsAddr: joinHostPort(ip, listeners.dnsPort) } : {}),
    };
    const bound = await listeners.add(spec);
    served.spec = spec;
    logger.info({ identity, ...bound }, 'local workload listening');
  }

  /** Moves uid's claim to `identity` (null: none). Starts the certificate fetch for a new claim at once. */
  private claim(uid: string, identity: string | null): void {
    const old = this.claims.get(uid) ?? null;
    if (old === identity) return;
    if (identity !== null) {
      this.claims.set(uid, identity);
      let set = this.users.get(identity);
      if (!set) this.users.set(identity, (set = new Set()));
      set.add(uid);
      // A warm-up only: the listener that needs it asks again and reports a failure (converge).
      this.opts.certs.ensure(identity, 'Warmup').catch(() => undefined);
    } else {
      this.claims.delete(uid);
    }
    if (old !== null) {
      const set = this.users.get(old);
      set?.delete(uid);
      if (set !== undefined && set.size === 0) {
        this.users.delete(old);
        this.opts.certs.forget(old);
      }
    }
  }
}
