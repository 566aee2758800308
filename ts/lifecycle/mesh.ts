// The one path a state change takes into the daemon, whatever its source (xDS, the local config file): the mesh lives
// once, in the dataplane (state/store.ts keeps the policies and this node's workloads). A change crosses as one delta
// (`applyStateChange`: policies, small changes) or one batch applied off the JS thread (the local config's document,
// all or nothing; an xDS Address response, still encoded, resource by resource). The dataplane answers with what
// changed, and every answer is followed the same way: this node's workloads reconciled (certificates before
// listeners, local-workloads.ts) and the policy references the change left unresolved followed (warned of if they stay
// unresolved: MissingReferences). Batches are applied one at a time, in the order they were asked for.
import type { Logger } from 'pino';
import type { LocalLoad } from '../config/local-loader.js';
import type { AppliedOut } from '../native/types.js';
import type { AppliedChange, StateChange, StateStore, WorkloadTransition } from '../state/store.js';
import type { DataplanePort } from './dataplane.js';

/** Where a state change comes from (logged, and the key a reloaded local file diffs against). */
export type StateSource = 'xds' | 'local';

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

/**
 * The policy references left unresolved, told apart from istiod's push order. istiod sends a workload's new policy
 * reference about half a millisecond before the policy itself, on every `kubectl apply` of a selector policy (seen
 * with a real istiod: test/e2e); a warning then would be a false alarm each time. So a reference is logged at debug
 * when it appears, and warned of (warnMissingReferences) only if it is still unresolved once MISSING_POLICY_GRACE has
 * passed, the grace live connections get for it. The workload denies new inbound connections from the first moment
 * either way (README "Authorization"); the gauge `ztunnel_node_authorization_missing_policies` counts every one.
 */
export class MissingReferences {
  /** Unresolved references not warned of yet, by `uid policy`, in the order they appeared (so, of their due time). */
  private readonly pending = new Map<string, { uid: string; policy: string; due: number }>();
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly log: Logger,
    private readonly graceMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  /** One applied change's references: those it made unresolved and those it resolved. */
  follow(missing: ReadonlyArray<{ uid: string; policy: string }>, resolved: ReadonlyArray<{ uid: string; policy: string }>): void {
    for (const r of resolved) this.pending.delete(`${r.uid} ${r.policy}`);
    const due = this.now() + this.graceMs;
    for (const m of missing) {
      const key = `${m.uid} ${m.policy}`;
      this.pending.delete(key);
      this.pending.set(key, { uid: m.uid, policy: m.policy, due });
    }
    if (missing.length > 0) this.log.debug({ references: missing.length, first: missing[0] }, 'workloads name authorization policies not known yet: denying their inbound traffic until they arrive');
    this.schedule();
  }

  /** How many references wait for their grace to pass. */
  get waiting(): number {
    return this.pending.size;
  }

  close(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.pending.clear();
  }

  private schedule(): void {
    if (this.timer !== null) return;
    const first = this.pending.values().next();
    if (first.done) return;
    this.timer = setTimeout(() => this.check(), Math.max(0, first.value.due - this.now()));
    this.timer.unref?.();
  }

  private check(): void {
    this.timer = null;
    const now = this.now();
    const overdue: { uid: string; policy: string }[] = [];
    for (const [key, r] of this.pending) {
      if (r.due > now) break;
      overdue.push({ uid: r.uid, policy: r.policy });
      this.pending.delete(key);
    }
    warnMissingReferences(this.log, overdue);
    this.schedule();
  }
}

export interface MeshOptions {
  store: StateStore;
  /** The dataplane; throws while it is not open. */
  plane(): DataplanePort;
  /** This node's workloads that a change touched (certificates and listeners follow them). */
  reconcile(workloads: WorkloadTransition[]): void;
  log: Logger;
  /** MISSING_POLICY_GRACE: how long a policy reference may stay unresolved before it is warned of. */
  missingPolicyGraceMs: number;
  /** Ends the references' follow-up (the daemon's drain). */
  signal?: AbortSignal;
}

export class Mesh {
  private batches: Promise<unknown> = Promise.resolve();
  private readonly references: MissingReferences;

  constructor(private readonly o: MeshOptions) {
    this.references = new MissingReferences(o.log, o.missingPolicyGraceMs);
    o.signal?.addEventListener('abort', () => this.references.close(), { once: true });
  }

  get store(): StateStore {
    return this.o.store;
  }

  /**
   * Applies `change` to the store and sends the dataplane one delta of what changed, then follows the answer.
   * Synchronous up to the reconciliation (which continues asynchronously); throws (nothing applied) when the
   * dataplane refuses the delta. Fail closed (README "Authorization"): a named WORKLOAD_SELECTOR policy that has not
   * arrived denies; the dataplane tracks the references that do not resolve, in O(change).
   */
  applyStateChange(_source: StateSource, change: StateChange): AppliedChange {
    const plane = this.o.plane();
    const applied = this.o.store.apply(change, (d) => plane.applyState(d));
    this.follow(applied);
    return applied;
  }

  /** One xDS Address response, still encoded: decoded and applied by the dataplane, resource by resource. */
  applyAddresses(resources: readonly Uint8Array[], removed: string[]): Promise<AppliedOut> {
    return this.serially(async () => {
      const out = await this.o.plane().applyAddresses(resources, removed);
      this.follow(this.o.store.absorb(out));
      return out;
    });
  }

  /**
   * A loaded local config document, all or nothing: the dataplane parses and validates every chunk before it applies
   * any (off the JS thread); a refusal rejects and changes nothing.
   */
  applyLocal(load: LocalLoad, signal: AbortSignal): Promise<AppliedChange> {
    return this.serially(async () => {
      const plane = this.o.plane();
      if (signal.aborted) throw new Error('shutting down');
      const out = await plane.applyLocal(load.ticket, load.chunks);
      const applied = this.o.store.absorb(out);
      this.follow(applied);
      return applied;
    });
  }

  /** What every applied change is followed by: listeners and certificates of local workloads, policy references. */
  private follow(applied: AppliedChange): void {
    this.o.reconcile(applied.workloads);
    this.references.follow(applied.missing, applied.resolved);
  }

  private serially<T>(run: () => Promise<T>): Promise<T> {
    const next = this.batches.then(run);
    // The chain keeps no batch's answer (a first push's answer names every resource: 100k entries held until the
    // next batch otherwise).
    this.batches = next.then(
      () => undefined,
      () => undefined,
    );
    return next;
  }
}
