// The control plane's copy of the mesh state, and the only producer of StateDeltas for the native side.
//
// Invariants:
// - The first delta sent is `full: true`; later ones carry only what changed (upserts + removals), so the
//   native side never has to diff.
// - `apply(change)` costs O(size of the change), never O(size of the state): an xDS update of one workload at
//   100k workloads touches one map entry, one index entry and sends a one-workload delta.
// - The store commits a new state only after `send` returned: if the native side rejects a delta
//   (INVALID_STATE), both sides keep the previous state and the next delta is computed against it.
// - Equality is judged on the native projection (toNativeWorkload/toNativeService): a change in a field the
//   native side does not receive (e.g. a waypoint) updates config_dump but sends no delta.
import type { Service, StateDelta, Workload } from '../native/types.js';
import { compilePolicy, type NativePolicy } from '../policy/compile.js';
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

export interface NativeView {
  workloads: ReadonlyMap<string, Workload>;
  services: ReadonlyMap<string, Service>;
}

/**
 * The delta taking the native side from `prev` to `next`. `prev === null` means nothing was ever applied:
 * the result is a full replacement. Returns null when nothing the native side sees changed.
 */
export function computeDelta(prev: NativeView | null, next: NativeView): StateDelta | null {
  if (prev === null) {
    return { full: true, workloads: [...next.workloads.values()], services: [...next.services.values()] };
  }
  const delta: StateDelta = {};
  const upserts = <T>(before: ReadonlyMap<string, T>, after: ReadonlyMap<string, T>): T[] =>
    [...after].filter(([k, v]) => {
      const old = before.get(k);
      return old === undefined || stableStringify(old) !== stableStringify(v);
    }).map(([, v]) => v);
  const removed = <T>(before: ReadonlyMap<string, T>, after: ReadonlyMap<string, T>): string[] =>
    [...before.keys()].filter((k) => !after.has(k));

  const workloads = upserts(prev.workloads, next.workloads);
  const removedWorkloads = removed(prev.workloads, next.workloads);
  const services = upserts(prev.services, next.services);
  const removedServices = removed(prev.services, next.services);
  if (workloads.length) delta.workloads = workloads;
  if (removedWorkloads.length) delta.removedWorkloads = removedWorkloads;
  if (services.length) delta.services = services;
  if (removedServices.length) delta.removedServices = removedServices;
  return Object.keys(delta).length === 0 ? null : delta;
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

/** One workload whose entry changed: `before` undefined = added, `after` undefined = removed. */
export interface WorkloadTransition {
  uid: string;
  before: WorkloadInfo | undefined;
  after: WorkloadInfo | undefined;
}

export interface AppliedChange {
  /** What was sent to the native side (null: nothing it sees changed). */
  delta: StateDelta | null;
  workloads: WorkloadTransition[];
  services: number;
  policies: number;
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
  private workloads = new Map<string, WorkloadInfo>();
  private services = new Map<string, ServiceInfo>();
  private policies = new Map<string, Policy>();
  /** node name -> uids of the workloads scheduled there (the local-workload reconciler's index). */
  private byNode = new Map<string, Set<string>>();
  private applied = false;

  /**
   * Applies an incremental change. Sends the native side only the resources whose native projection changed
   * (the very first delta is `full: true`), and commits only when `send` returned: a throw propagates and the
   * state is unchanged. Costs O(size of the change).
   */
  apply(change: StateChange, send: (delta: StateDelta) => void): AppliedChange {
    const removedW = new Set(change.removedWorkloads ?? []);
    const removedS = new Set(change.removedServices ?? []);
    // Last upsert of a key in the batch wins.
    const upW = new Map((change.workloads ?? []).map((w) => [w.uid, w]));
    const upS = new Map((change.services ?? []).map((s) => [serviceKey(s), s]));
    for (const uid of upW.keys()) removedW.delete(uid);
    for (const key of upS.keys()) removedS.delete(key);
    // Policies cross compiled (ts/policy/compile.ts); compiling throws on a bad CIDR, before anything is sent.
    const removedP = new Set(change.removedPolicies ?? []);
    const upP = new Map((change.policies ?? []).map((p) => [policyKey(p), p]));
    for (const key of upP.keys()) removedP.delete(key);
    const nativeP: NativePolicy[] = [];
    for (const [key, p] of upP) {
      const next = compilePolicy(p);
      const old = this.policies.get(key);
      if (!this.applied || old === undefined || !sameJson(compilePolicy(old), next)) nativeP.push(next);
    }
    const goneP = [...removedP].filter((key) => this.policies.has(key));

    const delta: StateDelta = {};
    const nativeW: Workload[] = [];
    const nativeS: Service[] = [];
    const goneW = [...removedW].filter((uid) => this.workloads.has(uid));
    const goneS = [...removedS].filter((key) => this.services.has(key));
    for (const w of upW.values()) {
      const next = toNativeWorkload(w);
      const old = this.workloads.get(w.uid);
      if (!this.applied || old === undefined || !sameJson(toNativeWorkload(old), next)) nativeW.push(next);
    }
    for (const [key, s] of upS) {
      const next = toNativeService(s);
      const old = this.services.get(key);
      if (!this.applied || old === undefined || !sameJson(toNativeService(old), next)) nativeS.push(next);
    }
    let sent: StateDelta | null = null;
    if (!this.applied) {
      // Nothing was ever sent: the first delta is a full replacement (here: everything the store will hold).
      const keepW = [...this.workloads.values()].filter((w) => !removedW.has(w.uid) && !upW.has(w.uid)).map(toNativeWorkload);
      const keepS = [...this.services.entries()].filter(([k]) => !removedS.has(k) && !upS.has(k)).map(([, s]) => toNativeService(s));
      const keepP = [...this.policies.entries()].filter(([k]) => !removedP.has(k) && !upP.has(k)).map(([, p]) => compilePolicy(p));
      sent = { full: true, workloads: [...keepW, ...nativeW], services: [...keepS, ...nativeS], policies: [...keepP, ...nativeP] };
    } else {
      if (nativeW.length) delta.workloads = nativeW;
      if (goneW.length) delta.removedWorkloads = goneW;
      if (nativeS.length) delta.services = nativeS;
      if (goneS.length) delta.removedServices = goneS;
      if (nativeP.length) delta.policies = nativeP;
      if (goneP.length) delta.removedPolicies = goneP;
      if (Object.keys(delta).length > 0) sent = delta;
    }
    if (sent !== null) send(sent);

    // Commit.
    const transitions: WorkloadTransition[] = [];
    for (const uid of goneW) {
      const before = this.workloads.get(uid) as WorkloadInfo;
      this.workloads.delete(uid);
      this.unindex(before);
      transitions.push({ uid, before, after: undefined });
    }
    for (const w of upW.values()) {
      const before = this.workloads.get(w.uid);
      if (before) this.unindex(before);
      this.workloads.set(w.uid, w);
      this.index(w);
      transitions.push({ uid: w.uid, before, after: w });
    }
    for (const key of goneS) this.services.delete(key);
    for (const [key, s] of upS) this.services.set(key, s);
    let policies = 0;
    for (const key of goneP) if (this.policies.delete(key)) policies++;
    for (const [key, p] of upP) {
      this.policies.set(key, p);
      policies++;
    }
    this.applied = true;
    return { delta: sent, workloads: transitions, services: goneS.length + upS.size, policies };
  }

  /**
   * The change that undoes `change` if it is applied now: what the store holds for each key it touches (re-upserted),
   * or the removal of keys the store does not hold. A chunked change takes one before each chunk, so that a chunk
   * the dataplane refuses can roll the earlier ones back. O(size of the change).
   */
  inverseOf(change: StateChange): StateChange {
    const undo = <T>(
      held: ReadonlyMap<string, T>,
      keys: Iterable<string>,
    ): { upserts: T[]; removals: string[] } => {
      const upserts: T[] = [];
      const removals: string[] = [];
      for (const key of new Set(keys)) {
        const old = held.get(key);
        if (old === undefined) removals.push(key);
        else upserts.push(old);
      }
      return { upserts, removals };
    };
    const w = undo(this.workloads, [...(change.workloads ?? []).map((x) => x.uid), ...(change.removedWorkloads ?? [])]);
    const s = undo(this.services, [...(change.services ?? []).map(serviceKey), ...(change.removedServices ?? [])]);
    const p = undo(this.policies, [...(change.policies ?? []).map(policyKey), ...(change.removedPolicies ?? [])]);
    return {
      workloads: w.upserts,
      removedWorkloads: w.removals,
      services: s.upserts,
      removedServices: s.removals,
      policies: p.upserts,
      removedPolicies: p.removals,
    };
  }

  private index(w: WorkloadInfo): void {
    let set = this.byNode.get(w.node);
    if (!set) this.byNode.set(w.node, (set = new Set()));
    set.add(w.uid);
  }

  private unindex(w: WorkloadInfo): void {
    const set = this.byNode.get(w.node);
    if (!set) return;
    set.delete(w.uid);
    if (set.size === 0) this.byNode.delete(w.node);
  }

  has(kind: 'workload' | 'service' | 'policy', key: string): boolean {
    return (kind === 'workload' ? this.workloads : kind === 'service' ? this.services : this.policies).has(key);
  }

  get size(): { workloads: number; services: number; policies: number } {
    return { workloads: this.workloads.size, services: this.services.size, policies: this.policies.size };
  }

  /**
   * Replaces the whole state with `next`. Calls `send` with the delta for the native side (if anything it sees
   * changed) and commits only when `send` returns; a throw from `send` propagates and nothing changes.
   * Returns the delta that was sent, or null.
   */
  replace(next: StateSnapshot, send: (delta: StateDelta) => void): StateDelta | null {
    // One code path for every change: the difference between the two snapshots, applied incrementally.
    return this.apply(snapshotChange(this.snapshot(), next), send).delta;
  }

  snapshot(): StateSnapshot {
    return { workloads: [...this.workloads.values()], services: [...this.services.values()], policies: [...this.policies.values()] };
  }

  workload(uid: string): WorkloadInfo | undefined {
    return this.workloads.get(uid);
  }

  /** Workloads scheduled on `node`, sorted by uid (the order listeners are bound in). */
  workloadsOnNode(node: string): WorkloadInfo[] {
    return [...(this.byNode.get(node) ?? [])]
      .map((uid) => this.workloads.get(uid) as WorkloadInfo)
      .sort((a, b) => byString(a.uid, b.uid));
  }

  /** All policies (the L4 authorization compiler's input). */
  policyList(): Policy[] {
    return [...this.policies.values()];
  }

  /**
   * config_dump `stagedServices`: endpoints that name a service the state does not have (yet), keyed by
   * "namespace/hostname" then workload uid, as ztunnel shows them. They join the service when it arrives.
   */
  dumpStagedServices(): Record<string, Record<string, { workloadUid: string; port: Record<string, number>; status: string }>> {
    const staged: Record<string, Record<string, { workloadUid: string; port: Record<string, number>; status: string }>> = {};
    for (const w of [...this.workloads.values()].sort((a, b) => byString(a.uid, b.uid))) {
      for (const [key, port] of Object.entries(w.services)) {
        if (this.services.has(key)) continue;
        (staged[key] ??= {})[w.uid] = { workloadUid: w.uid, port, status: w.status };
      }
    }
    return staged;
  }

  /** config_dump `workloads`: sorted by uid, ztunnel's keys in ztunnel's order. */
  dumpWorkloads(): Array<Record<string, unknown>> {
    return [...this.workloads.values()].sort((a, b) => byString(a.uid, b.uid)).map((w) => ({
      uid: w.uid,
      workloadIps: w.workloadIps,
      waypoint: w.waypoint,
      networkGateway: w.networkGateway,
      protocol: w.protocol,
      networkMode: w.networkMode,
      name: w.name,
      namespace: w.namespace,
      trustDomain: w.trustDomain,
      serviceAccount: w.serviceAccount,
      network: w.network,
      workloadName: w.workloadName,
      workloadType: w.workloadType,
      canonicalName: w.canonicalName,
      canonicalRevision: w.canonicalRevision,
      hostname: w.hostname,
      node: w.node,
      nativeTunnel: w.nativeTunnel,
      applicationTunnel: w.applicationTunnel,
      authorizationPolicies: w.authorizationPolicies,
      status: w.status,
      clusterId: w.clusterId,
      locality: w.locality,
      services: w.services,
      capacity: w.capacity,
    }));
  }

  /**
   * config_dump `services`: sorted by hostname (then namespace). Endpoints are derived from the workloads that
   * name the service in their `services` map, keyed by workload uid as ztunnel does.
   */
  dumpServices(): Array<Record<string, unknown>> {
    const endpoints = new Map<string, Record<string, { workloadUid: string; port: Record<string, number>; status: string }>>();
    for (const w of [...this.workloads.values()].sort((a, b) => byString(a.uid, b.uid))) {
      for (const [key, port] of Object.entries(w.services)) {
        if (!this.services.has(key)) continue;
        const eps = endpoints.get(key) ?? {};
        eps[w.uid] = { workloadUid: w.uid, port, status: w.status };
        endpoints.set(key, eps);
      }
    }
    return [...this.services.values()]
      .sort((a, b) => byString(a.hostname, b.hostname) || byString(a.namespace, b.namespace))
      .map((s) => ({
        name: s.name,
        namespace: s.namespace,
        hostname: s.hostname,
        vips: s.vips,
        cidrVips: s.cidrVips,
        ports: s.ports,
        endpoints: endpoints.get(serviceKey(s)) ?? {},
        subjectAltNames: s.subjectAltNames,
        waypoint: s.waypoint,
        weightedWaypoints: [],
        loadBalancer: s.loadBalancer,
        ipFamilies: s.ipFamilies,
        canonical: s.canonical,
        visibility: s.visibility,
      }));
  }

  /** config_dump `policies`: sorted by "namespace/name". */
  dumpPolicies(): Policy[] {
    return [...this.policies.entries()].sort(([a], [b]) => byString(a, b)).map(([, p]) => p);
  }
}
