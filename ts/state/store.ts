// What the control side keeps of the mesh state. The mesh itself (every workload, service and policy) lives once,
// in the dataplane (ARCHITECTURE.md): it is the store that indexes, diffs, writes config_dump and reports what
// changed. This side keeps only what its own control loop needs:
// - the workloads on this node (the local-workload reconciler's index), fed by the transitions the dataplane
//   reports;
// - the state's sizes.
// Policies are compiled here (policy/compile.ts, the one policy compiler) and cross compiled; the dataplane drops an
// upsert equal to what it holds, so a policy pushed again unchanged closes no connection.
//
// Invariants:
// - Every change, from any source, crosses as one delta (`apply`) or one batch (the dataplane's asynchronous
//   `applyLocal` / `applyAddresses`, whose answer goes through `absorb`); the dataplane answers with what
//   changed (`AppliedOut`), and an upsert equal to what it holds reports nothing.
// - A delta the dataplane rejects (INVALID_STATE) changes nothing on either side.
// - Work here is O(size of the change), never O(size of the state).
import type { AppliedOut, StateDelta, Workload } from '../native/types.js';
import { compilePolicy } from '../policy/compile.js';
import {
  policyKey,
  serviceKey,
  type Policy,
  type ServiceInfo,
  type WorkloadInfo,
} from './model.js';

const byString = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

/**
 * An incremental change to the state, from any source (the xDS client, a reloaded local config file). Removals
 * are applied before upserts, so a batch may remove and re-add one key.
 */
export interface StateChange {
  workloads?: WorkloadInfo[];
  /** workload uids */
  removedWorkloads?: string[];
  services?: ServiceInfo[];
  /** "namespace/hostname" */
  removedServices?: string[];
  policies?: Policy[];
  /** "namespace/name" */
  removedPolicies?: string[];
}

/**
 * One workload on this node (before or after) whose entry changed: `before` undefined = added, `after` undefined =
 * removed. Workloads elsewhere are counted (`AppliedChange.changedWorkloads`), not listed.
 */
export interface WorkloadTransition {
  uid: string;
  before: Workload | undefined;
  after: Workload | undefined;
}

export interface AppliedChange {
  /** What was sent to the native side (null: nothing was, or the change went as a batch). */
  delta: StateDelta | null;
  workloads: WorkloadTransition[];
  /** Workloads whose record changed, listed or not. */
  changedWorkloads: number;
  services: number;
  policies: number;
  /** The (workload, policy) references the change made unresolved (the dataplane tracks them). */
  missing: Array<{ uid: string; policy: string }>;
  /** The references it resolved (unresolved before it, not after: the policy arrived, or is no longer named). */
  resolved: Array<{ uid: string; policy: string }>;
}

export class StateStore {
  /** The workloads on this node, by uid (the local-workload reconciler's index). */
  private readonly local = new Map<string, WorkloadInfo>();
  private counts: readonly [number, number, number] = [0, 0, 0];
  private missingRefs = 0;

  /** `nodeName`: this node (NODE_NAME); null: no workload is local. */
  constructor(private readonly nodeName: string | null) {}

  /**
   * Applies an incremental change as one delta: workloads and services as given, policies compiled (the dataplane
   * drops what it already holds). A throw (a bad CIDR, a refused delta) propagates and nothing changes.
   */
  apply(change: StateChange, send: (delta: StateDelta) => AppliedOut): AppliedChange {
    const delta = this.prepare(change);
    return { ...this.absorb(send(delta)), delta };
  }

  /**
   * The native delta of `change`. Compiling throws on a bad CIDR, before anything is sent. The last upsert of a key
   * wins; an upsert cancels a removal of it.
   */
  prepare(change: StateChange): StateDelta {
    const upW = new Map((change.workloads ?? []).map((w) => [w.uid, w]));
    const upS = new Map((change.services ?? []).map((s) => [serviceKey(s), s]));
    const upP = new Map((change.policies ?? []).map((p) => [policyKey(p), p]));
    const goneW = [...new Set(change.removedWorkloads ?? [])].filter((k) => !upW.has(k));
    const goneS = [...new Set(change.removedServices ?? [])].filter((k) => !upS.has(k));
    const goneP = [...new Set(change.removedPolicies ?? [])].filter((k) => !upP.has(k));
    const delta: StateDelta = {};
    if (upW.size) delta.workloads = [...upW.values()];
    if (goneW.length) delta.removedWorkloads = goneW;
    if (upS.size) delta.services = [...upS.values()];
    if (goneS.length) delta.removedServices = goneS;
    if (upP.size) delta.policies = [...upP.values()].map(compilePolicy);
    if (goneP.length) delta.removedPolicies = goneP;
    return delta;
  }

  /** Follows what the dataplane reports it changed: the local index and the sizes. */
  absorb(out: AppliedOut): AppliedChange {
    const workloads: WorkloadTransition[] = out.workloads.map((t) => ({ uid: t.uid, before: t.before ?? undefined, after: t.after ?? undefined }));
    for (const t of workloads) {
      const after = t.after;
      if (after !== undefined && this.nodeName !== null && after.node === this.nodeName) this.local.set(t.uid, after);
      else this.local.delete(t.uid);
    }
    this.counts = out.counts;
    this.missingRefs = out.missingReferences;
    return { delta: null, workloads, changedWorkloads: out.changedWorkloads, services: out.services, policies: out.policies, missing: out.missing, resolved: out.resolved };
  }

  /** How many (workload, policy) references do not resolve (as of the last change). */
  get missingReferences(): number {
    return this.missingRefs;
  }

  /** What the dataplane holds, as of the last change. */
  get size(): { workloads: number; services: number; policies: number } {
    return { workloads: this.counts[0], services: this.counts[1], policies: this.counts[2] };
  }

  /** This node's workloads by uid, unsorted: for a view that shows a few of them (the dashboard) at any size. */
  get onThisNode(): ReadonlyMap<string, WorkloadInfo> {
    return this.local;
  }

  /** Workloads scheduled on `node` (this node; any other has none here), sorted by uid (the order listeners are bound in). */
  workloadsOnNode(node: string): WorkloadInfo[] {
    if (node !== this.nodeName) return [];
    return [...this.local.values()].sort((a, b) => byString(a.uid, b.uid));
  }
}
