import type { NativePolicy } from '../policy/compile.js';
// The JSON shapes that cross the native boundary, as docs/native-api.md describes them. The generated ones below come
// from the Rust types; the hand-written ones must be kept identical to their Rust counterparts by hand (the Rust side
// deserializes these names, so a renamed field is a silent protocol break).

// The dataplane's configuration: generated from the Rust types (native/dataplane/src/config.rs, ts-rs, written by
// `cargo test`; CI fails when the committed files differ). Every field is required: the daemon sends them all, so
// the defaults that apply are ts/config/defaults.ts's (Rust's `Default` serves its own tests and examples).
export type { DataplaneConfig } from './generated/DataplaneConfig.js';
export type { DnsConfig } from './generated/DnsConfig.js';
export type { Http2Config } from './generated/Http2Config.js';

export type WorkloadProtocol = 'HBONE' | 'TCP';
export type HealthStatus = 'Healthy' | 'Unhealthy';
export type WorkloadType = 'deployment' | 'cronjob' | 'pod' | 'job';

export interface Locality {
  region: string;
  zone: string;
  subzone: string;
}

/** Where a waypoint or network gateway is: "<network>/<ip>" or "<namespace>/<hostname>". */
export interface GatewayAddress {
  destination: string;
  hboneMtlsPort: number;
}

export interface ApplicationTunnel {
  protocol: 'NONE' | 'PROXY';
  port: number | null;
}

export type NetworkMode = 'Standard' | 'HostNetwork';

export interface LoadBalancer {
  routingPreferences: Array<'Region' | 'Zone' | 'Subzone' | 'Node' | 'Cluster' | 'Network'>;
  mode: 'Standard' | 'Strict' | 'Failover' | 'Passthrough';
  healthPolicy: 'OnlyHealthy' | 'AllowAll';
}

export interface Workload {
  uid: string;
  name: string;
  namespace: string;
  serviceAccount: string;
  trustDomain: string;
  workloadIps: string[];
  network: string;
  protocol: WorkloadProtocol;
  node: string;
  status: HealthStatus;
  capacity: number;
  canonicalName: string;
  canonicalRevision: string;
  workloadName: string;
  workloadType: WorkloadType;
  clusterId: string;
  locality: Locality;
  /** "ns/hostname" -> { "<servicePort>": targetPort } */
  services: Record<string, Record<string, number>>;
  authorizationPolicies: string[];
  hostname: string;
  /** HostNetwork workloads share the node's IP and are not found by it. */
  networkMode: NetworkMode;
  waypoint: GatewayAddress | null;
  networkGateway: GatewayAddress | null;
  applicationTunnel: ApplicationTunnel | null;
  nativeTunnel: boolean;
}

export interface Service {
  name: string;
  namespace: string;
  hostname: string;
  /** "<network>/<ip>" */
  vips: string[];
  /** "<network>/<cidr>" */
  cidrVips: string[];
  /** "<servicePort>" -> targetPort (0 = not set: each endpoint's own port map must name the port) */
  ports: Record<string, number>;
  subjectAltNames: string[];
  waypoint: GatewayAddress | null;
  /** Traffic split across waypoints by weight (0: described, no traffic); all zero → `waypoint`. */
  weightedWaypoints: Array<{ waypoint: GatewayAddress; weight: number }>;
  loadBalancer: LoadBalancer | null;
  ipFamilies: 'Dual' | 'IPv4' | 'IPv6' | null;
  /** Wins a VIP shared with services of other namespaces. */
  canonical: boolean;
  visibility: 'Public' | 'Namespace' | null;
}

export interface StateDelta {
  /** true: replace the whole state with what follows. */
  full?: boolean;
  workloads?: Workload[];
  removedWorkloads?: string[];
  services?: Service[];
  /** "namespace/hostname" */
  removedServices?: string[];
  /** Compiled authorization policies (ts/policy/compile.ts), upserts by namespace/name. */
  policies?: NativePolicy[];
  /** "namespace/name" */
  removedPolicies?: string[];
}

/** What the dataplane reports a state change did (`applyState`, `applyStateBatches`, `applyAddresses`). */
export interface AppliedOut {
  /** Workloads whose record changed and that are (or were) on this node, whole. */
  workloads: Array<{ uid: string; before: Workload | null; after: Workload | null }>;
  /** Workloads whose record changed, listed or not. */
  changedWorkloads: number;
  services: number;
  policies: number;
  /** What the dataplane holds after the change: [workloads, services, policies]. */
  counts: [number, number, number];
  /**
   * The (workload, policy) references this change made unresolved: such a workload denies every inbound connection
   * until the policy arrives (fail closed).
   */
  missing: Array<{ uid: string; policy: string }>;
  /** How many (workload, policy) references are unresolved after the change. */
  missingReferences: number;
  /** WDS batches: [name, version] of each resource that applied. */
  accepted: Array<[string, string]>;
  /** WDS batches: "<name>: <reason>" of each resource refused (NACKed; its previous version keeps serving). */
  rejected: string[];
}

/** config_dump's mesh part, rendered by the dataplane. */
export interface MeshDump {
  workloads: Array<Record<string, unknown>>;
  services: Array<Record<string, unknown>>;
  stagedServices: Record<string, Record<string, unknown>>;
}

/** The answer of `authorize()` (admin /debug/authorize). */
export interface AuthorizeExplanation {
  workload: { uid: string; name: string; namespace: string };
  decision: { allowed: boolean; policy?: string; rule?: number; reason: string };
  considered: Array<{ policy: string; action: 'Allow' | 'Deny'; dryRun: boolean; via: 'global' | 'namespace' | 'workload'; matchedRule: number | null; known: boolean }>;
}

export interface AuthorizeRequest {
  /** The source SPIFFE identity; absent for plaintext. */
  srcIdentity?: string;
  srcIp: string;
  /** The destination workload address and target port, "ip:port". */
  dst: string;
}

// The dataplane's counters (native/dataplane/src/metrics.rs and dns/metrics.rs), generated like the config above.
export type { MetricsSnapshot } from './generated/MetricsSnapshot.js';
export type { ConnectionCounters } from './generated/ConnectionCounters.js';
export type { TrafficLabels } from './generated/TrafficLabels.js';
export type { TunnelCounters } from './generated/TunnelCounters.js';
export type { AuthorizationCounters } from './generated/AuthorizationCounters.js';
export type { BufferCounters } from './generated/BufferCounters.js';
export type { RuntimeCounters } from './generated/RuntimeCounters.js';
export type { DnsCounters } from './generated/DnsCounters.js';

export type EventLevel = 'info' | 'error' | 'debug' | 'warn';

export type NativeEvent =
  | { kind: 'access'; level: EventLevel; message: string; fields: Record<string, string | number> }
  | { kind: 'log'; level: EventLevel; message: string; fields: Record<string, string | number> }
  | { kind: 'dns'; level: EventLevel; message: string; fields: Record<string, string | number> }
  | { kind: 'dropped'; count: number }
  /** Warnings/errors of one cause (kind + message) over the dataplane's rate limit, counted instead of logged. */
  | { kind: 'suppressed'; level: EventLevel; message: string; fields: { kind: string; count: number } };

export interface LocalWorkloadSpec {
  uid: string;
  /** Inbound HBONE listener (HBONE workloads only). */
  hboneAddr?: string;
  /** SOCKS5 entry for the workload's outbound traffic. */
  socksAddr?: string;
  /** The workload's DNS proxy (UDP and TCP). */
  dnsAddr?: string;
}

export interface BoundListeners {
  uid: string;
  hboneAddr?: string;
  socksAddr?: string;
  dnsAddr?: string;
}

export type ListenerInfo = BoundListeners;

export interface InstalledCertificate {
  identity: string;
  chainPem: string;
  rootsPem: string;
  notBefore: string;
  notAfter: string;
  serial: string;
}

export interface NativeVersion {
  version: string;
  cryptoProvider: 'aws-lc-rs' | 'ring';
  buildProfile: 'release' | 'debug';
  /** In docs/native-api.md, but the current native build omits it; readers fall back to "unknown". */
  rustVersion?: string;
}

/** Shared mode: `startInpod`. */

/** Dedicated mode: `startDedicated` (PROXY_WORKLOAD_INFO). */
// What startInpod and startDedicated take (native/dataplane/src/inpod/mod.rs, lib.rs), generated like the above.
export type { InPodConfig } from './generated/InPodConfig.js';
export type { DedicatedSpec } from './generated/DedicatedSpec.js';
export type { OrigSrc } from './generated/OrigSrc.js';

/** `inpodState()`: the workload proxy manager, for readiness, config_dump `workloadState` and metrics. */
export interface InPodState {
  connected: boolean;
  snapshotReceived: boolean;
  ready: boolean;
  lastError: string | null;
  activeProxies: number;
  pendingProxies: number;
  proxiesStarted: number;
  proxiesStopped: number;
  workloads: Record<
    string,
    {
      state: 'Pending' | 'Up';
      info: { name: string; namespace: string; serviceAccount: string };
      error?: string;
      /** Only when asked for (`inpodState({ connections: true })`, the default). */
      connections?: { inbound: unknown[]; outbound: unknown[] };
    }
  >;
}
