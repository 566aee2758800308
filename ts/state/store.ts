// The control plane's copy of the mesh state, and the only producer of StateDeltas for the native side.
//
// Invariants:
// - The first delta sent is `full: true`; later ones carry only what changed (upserts + removals), so the
//   native side never has to diff.
// - The store commits a new state only after `send` returned: if the native side rejects a delta
//   (INVALID_STATE), both sides keep the previous state and the next delta is computed against it.
// - Equality is judged on the native projection (toNativeWorkload/toNativeService): a change in a field the
//   native side does not receive (e.g. a waypoint) updates config_dump but sends no delta.
import type { Service, StateDelta, Workload } from '../native/types.js';
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

function nativeView(s: { workloads: Iterable<WorkloadInfo>; services: Iterable<ServiceInfo> }): NativeView {
  return {
    workloads: new Map([...s.workloads].map((w) => [w.uid, toNativeWorkload(w)])),
    services: new Map([...s.services].map((x) => [serviceKey(x), toNativeService(x)])),
  };
}

const byString = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

export class StateStore {
  private workloads = new Map<string, WorkloadInfo>();
  private services = new Map<string, ServiceInfo>();
  private policies = new Map<string, Policy>();
  private applied = false;

  /**
   * Replaces the whole state with `next`. Calls `send` with the delta for the native side (if anything it sees
   * changed) and commits only when `send` returns; a throw from `send` propagates and nothing changes.
   * Returns the delta that was sent, or null.
   */
  replace(next: StateSnapshot, send: (delta: StateDelta) => void): StateDelta | null {
    const delta = computeDelta(this.applied ? nativeView(this.snapshot()) : null, nativeView(next));
    if (delta !== null) send(delta);
    this.workloads = new Map(next.workloads.map((w) => [w.uid, w]));
    this.services = new Map(next.services.map((s) => [serviceKey(s), s]));
    this.policies = new Map(next.policies.map((p) => [policyKey(p), p]));
    this.applied = true;
    return delta;
  }

  snapshot(): StateSnapshot {
    return { workloads: [...this.workloads.values()], services: [...this.services.values()], policies: [...this.policies.values()] };
  }

  workload(uid: string): WorkloadInfo | undefined {
    return this.workloads.get(uid);
  }

  /** Workloads scheduled on `node`, sorted by uid (the order listeners are bound in). */
  workloadsOnNode(node: string): WorkloadInfo[] {
    return [...this.workloads.values()].filter((w) => w.node === node).sort((a, b) => byString(a.uid, b.uid));
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
