// What the control side keeps of the mesh state. The mesh itself (every workload and service) lives once, in the
// dataplane (ARCHITECTURE.md): it is the store that indexes, diffs and reports what changed. This side keeps
// only what its own control loop needs:
// - the authorization policies as written (the policy compiler's input, and config_dump's `policies`; about 1% of
//   the resources), so that only policies whose compiled form changed cross the boundary;
// - the workloads on this node (the local-workload reconciler's index), fed by the transitions the dataplane
//   reports;
// - the state's sizes.
//
// Invariants:
// - Every change, from any source, crosses as one delta (`apply`) or one batch (the dataplane's asynchronous
//   `applyLocal` / `applyAddresses`, whose answer goes through `absorb`); the dataplane answers with what
//   changed (`AppliedOut`), and an upsert equal to what it holds reports nothing.
// - `apply` commits its policies only after `send` returned: if the dataplane rejects a delta (INVALID_STATE), both
//   sides keep the previous state.
// - Work here is O(size of the change), never O(size of the state).
import type { AppliedOut, NativePolicy, StateDelta, Workload } from '../native/types.js';
import { compilePolicy } from '../policy/compile.js';
import {
  policyKey,
  serviceKey,
  toNativeService,
  toNativeWorkload,
  type Policy,
  type ServiceInfo,
  type StateSnapshot,
  type WorkloadInfo,
} from './model.js';

/** JSON with object keys sorted, so two equal values always compare equal as strings. */
export function stableStringify(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(stableStringify).join(',')}]`;
  if (value !== null && typeof value === 'object') {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${stableStringify(v)}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

/**
 * Whether two JSON-shaped values are equal as stableStringify would render them (key order and undefined-valued
 * keys ignored), without rendering them: about 10x cheaper, and the store compares every resource of a change.
 */
export function sameJson(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) || Array.isArray(b)) {
    if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length) return false;
    for (let i = 0; i < a.length; i++) if (!sameJson(a[i], b[i])) return false;
    return true;
  }
  const x = a as Record<string, unknown>;
  const y = b as Record<string, unknown>;
  let defined = 0;
  for (const k in x) {
    if (x[k] === undefined) continue;
    defined++;
    if (!Object.hasOwn(y, k) || !sameJson(x[k], y[k])) return false;
  }
  for (const k in y) if (y[k] !== undefined) defined--;
  return defined === 0;
}

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
}

/** A document as the worker keeps it: per kind, key -> stable JSON of the resource. */
export interface Kept {
  workloads: Map<string, string>;
  services: Map<string, string>;
  policies: Map<string, string>;
}

export const EMPTY_KEPT: Kept = { workloads: new Map(), services: new Map(), policies: new Map() };

/** The change from `prev` to `next` (the resources whose stable JSON differ, and the removed keys), and `next` as the worker keeps it. */
export function diffKept(prev: Kept, next: StateSnapshot): { change: StateChange; kept: Kept } {
  const kind = <T>(before: Map<string, string>, items: T[], key: (t: T) => string) => {
    const now = new Map<string, string>();
    const upserts: T[] = [];
    for (const item of items) {
      const k = key(item);
      const json = stableStringify(item);
      now.set(k, json);
      if (before.get(k) !== json) upserts.push(item);
    }
    return { now, upserts, removed: [...before.keys()].filter((k) => !now.has(k)) };
  };
  const w = kind(prev.workloads, next.workloads, (x) => x.uid);
  const s = kind(prev.services, next.services, serviceKey);
  const p = kind(prev.policies, next.policies, policyKey);
  return {
    change: {
      workloads: w.upserts,
      removedWorkloads: w.removed,
      services: s.upserts,
      removedServices: s.removed,
      policies: p.upserts,
      removedPolicies: p.removed,
    },
    kept: { workloads: w.now, services: s.now, policies: p.now },
  };
}

/** `snapshot` as `diffKept` keeps it. */
export function keptOf(snapshot: StateSnapshot): Kept {
  return diffKept(EMPTY_KEPT, snapshot).kept;
}

/** The change that turns snapshot `prev` into `next` (a reloaded local file: only what the file changed). */
export function snapshotChange(prev: StateSnapshot, next: StateSnapshot): StateChange {
  return diffKept(keptOf(prev), next).change;
}

export class StateStore {
  private readonly policies = new Map<string, Policy>();
  /** The workloads on this node, by uid (the local-workload reconciler's index). */
  private readonly local = new Map<string, WorkloadInfo>();
  private counts: readonly [number, number, number] = [0, 0, 0];
  private missingRefs = 0;

  /** `nodeName`: this node (NODE_NAME); null: no workload is local. */
  constructor(private readonly nodeName: string | null) {}

  /**
   * Applies an incremental change as one delta: workloads and services as given (the dataplane drops what it already
   * holds), policies compiled, only those whose compiled form changed. Commits only when `send` returned; a throw
   * propagates and nothing changes.
   */
  apply(change: StateChange, send: (delta: StateDelta) => AppliedOut): AppliedChange {
    const { delta, policies } = this.prepare(change);
    const out = send(delta);
    this.commitPolicies(policies);
    return { ...this.absorb(out), delta };
  }

  /**
   * The native delta of `change`, and its policy part for `commitPolicies` once the dataplane took it. Compiling
   * throws on a bad CIDR, before anything is sent. The last upsert of a key wins; an upsert cancels a removal of it.
   */
  prepare(change: StateChange): { delta: StateDelta; policies: PolicyChange } {
    const upW = new Map((change.workloads ?? []).map((w) => [w.uid, w]));
    const upS = new Map((change.services ?? []).map((s) => [serviceKey(s), s]));
    const upP = new Map((change.policies ?? []).map((p) => [policyKey(p), p]));
    const goneW = [...new Set(change.removedWorkloads ?? [])].filter((k) => !upW.has(k));
    const goneS = [...new Set(change.removedServices ?? [])].filter((k) => !upS.has(k));
    const goneP = [...new Set(change.removedPolicies ?? [])].filter((k) => !upP.has(k) && this.policies.has(k));
    const nativeP: NativePolicy[] = [];
    for (const [key, p] of upP) {
      const next = compilePolicy(p);
      const old = this.policies.get(key);
      if (old === undefined || !sameJson(compilePolicy(old), next)) nativeP.push(next);
    }
    const delta: StateDelta = {};
    if (upW.size) delta.workloads = [...upW.values()].map(toNativeWorkload);
    if (goneW.length) delta.removedWorkloads = goneW;
    if (upS.size) delta.services = [...upS.values()].map(toNativeService);
    if (goneS.length) delta.removedServices = goneS;
    if (nativeP.length) delta.policies = nativeP;
    if (goneP.length) delta.removedPolicies = goneP;
    return { delta, policies: { upserts: [...upP.values()], removed: goneP } };
  }

  /** Records the policy part of a change the dataplane took. Returns how many policies it touched. */
  commitPolicies(change: PolicyChange): number {
    for (const key of change.removed) this.policies.delete(key);
    for (const p of change.upserts) this.policies.set(policyKey(p), p);
    return change.removed.length + change.upserts.length;
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
    return { delta: null, workloads, changedWorkloads: out.changedWorkloads, services: out.services, policies: out.policies, missing: out.missing };
  }

  /** How many (workload, policy) references do not resolve (as of the last change). */
  get missingReferences(): number {
    return this.missingRefs;
  }

  has(kind: 'policy', key: string): boolean {
    return this.policies.has(key);
  }

  /** What the dataplane holds (as of the last change) and the policies held here. */
  get size(): { workloads: number; services: number; policies: number } {
    return { workloads: this.counts[0], services: this.counts[1], policies: this.policies.size };
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

  /** config_dump `policies`: sorted by "namespace/name". */
  /**
   * config_dump's `policies` (those keyed in `only`, when given), sorted by key, as ztunnel writes them: a match's
   * empty lists are left out, and `dryRun` only when set.
   */
  dumpPolicies(only?: ReadonlySet<string>): Array<Record<string, unknown>> {
    return [...this.policies.entries()]
      .filter(([key]) => only === undefined || only.has(key))
      .sort(([a], [b]) => byString(a, b))
      .map(([, p]) => dumpPolicy(p));
  }
}

/** The policy part of a change: upserts as written, and removed "namespace/name" keys. */
export interface PolicyChange {
  upserts: Policy[];
  removed: string[];
}

function dumpPolicy(p: Policy): Record<string, unknown> {
  const rules = p.rules.map((rule) =>
    rule.map((clause) => clause.map((m) => Object.fromEntries(Object.entries(m).filter(([, list]) => (list as unknown[]).length > 0)))),
  );
  return { name: p.name, namespace: p.namespace, scope: p.scope, action: p.action, ...(p.dryRun ? { dryRun: true } : {}), rules };
}
