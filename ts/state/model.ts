// The TS-side model of the mesh state. WorkloadInfo/ServiceInfo are the native Workload/Service (docs/native-api.md),
// generated from the dataplane's own record types: the dataplane routes on every field (waypoints, gateways, load
// balancing). The local file's schema produces exactly these records (ts/config/local.ts proves it at compile time),
// and they cross as they are.
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
