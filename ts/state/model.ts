// The TS-side model of the mesh state. WorkloadInfo/ServiceInfo are the native Workload/Service
// (docs/native-api.md): the dataplane routes on every field (waypoints, gateways, load balancing). The native side
// receives exactly its own fields: see toNativeWorkload/toNativeService.
import type { Service, Workload } from '../native/types.js';

export type { ApplicationTunnel, GatewayAddress, LoadBalancer, NetworkMode } from '../native/types.js';

/** The dataplane's workload is the whole workload record (the model lives once, in the dataplane). */
export type WorkloadInfo = Workload;
export type ServiceInfo = Service;

export type StringMatch = { Exact: string } | { Prefix: string } | { Suffix: string } | { Presence: [] };

export interface ServiceAccountMatch {
  namespace: string;
  serviceAccount: string;
}

/** One match of a policy clause; every list empty means "no constraint", as in ztunnel. */
export interface PolicyMatch {
  namespaces: StringMatch[];
  notNamespaces: StringMatch[];
  principals: StringMatch[];
  notPrincipals: StringMatch[];
  serviceAccounts: ServiceAccountMatch[];
  notServiceAccounts: ServiceAccountMatch[];
  sourceIps: string[];
  notSourceIps: string[];
  destinationIps: string[];
  notDestinationIps: string[];
  destinationPorts: number[];
  notDestinationPorts: number[];
}

export interface Policy {
  name: string;
  namespace: string;
  scope: 'Global' | 'Namespace' | 'WorkloadSelector';
  action: 'Allow' | 'Deny';
  dryRun: boolean;
  /** rules[rule][clause][match] */
  rules: PolicyMatch[][][];
}

/** Everything the control plane knows, as one value (a local config file or an XDS snapshot). */
export interface StateSnapshot {
  workloads: WorkloadInfo[];
  services: ServiceInfo[];
  policies: Policy[];
}

export function serviceKey(s: { namespace: string; hostname: string }): string {
  return `${s.namespace}/${s.hostname}`;
}

export function policyKey(p: { namespace: string; name: string }): string {
  return `${p.namespace}/${p.name}`;
}

/** The SPIFFE identity a workload's certificate carries. */
export function workloadIdentity(w: Pick<Workload, 'trustDomain' | 'namespace' | 'serviceAccount'>): string {
  return `spiffe://${w.trustDomain}/ns/${w.namespace}/sa/${w.serviceAccount}`;
}

/** Exactly the native Workload fields: the native side may reject unknown fields. */
export function toNativeWorkload(w: Workload): Workload {
  return {
    uid: w.uid,
    name: w.name,
    namespace: w.namespace,
    serviceAccount: w.serviceAccount,
    trustDomain: w.trustDomain,
    workloadIps: w.workloadIps,
    network: w.network,
    protocol: w.protocol,
    node: w.node,
    status: w.status,
    capacity: w.capacity,
    canonicalName: w.canonicalName,
    canonicalRevision: w.canonicalRevision,
    workloadName: w.workloadName,
    workloadType: w.workloadType,
    clusterId: w.clusterId,
    locality: w.locality,
    services: w.services,
    authorizationPolicies: w.authorizationPolicies,
    hostname: w.hostname,
    networkMode: w.networkMode,
    waypoint: w.waypoint,
    networkGateway: w.networkGateway,
    applicationTunnel: w.applicationTunnel,
    nativeTunnel: w.nativeTunnel,
  };
}

export function toNativeService(s: Service): Service {
  return {
    name: s.name,
    namespace: s.namespace,
    hostname: s.hostname,
    vips: s.vips,
    cidrVips: s.cidrVips,
    ports: s.ports,
    subjectAltNames: s.subjectAltNames,
    waypoint: s.waypoint,
    weightedWaypoints: s.weightedWaypoints,
    loadBalancer: s.loadBalancer,
    ipFamilies: s.ipFamilies,
    canonical: s.canonical,
    visibility: s.visibility,
  };
}
