// The JSON shapes that cross the native boundary (docs/native-api.md), every one generated from the Rust type that
// reads or writes it (ts-rs, written to ./generated/ by `cargo test`; `npm test` fails when the committed files
// differ from what the Rust types generate). Edit the Rust type, never these.

// The dataplane's configuration: generated from the Rust types (native/dataplane/src/config.rs, ts-rs, written by
// `cargo test`; CI fails when the committed files differ). Every field is required: the daemon sends them all. The
// defaults have one table, Rust's `Default`: written out as DATAPLANE_DEFAULTS (./generated/dataplaneDefaults.ts),
// which ts/config/defaults.ts reads and gives its reasons for.
export type { ColdCodeReleased } from './generated/ColdCodeReleased.js';
export type { DataplaneConfig } from './generated/DataplaneConfig.js';
export type { DnsConfig } from './generated/DnsConfig.js';
export type { Http2Config } from './generated/Http2Config.js';

// The mesh records (native/mesh/src/state/model.rs, policy.rs) and what a state change or config_dump hands
// back (state/dump.rs), generated like the above. `Workload` types both directions: a Rust test checks that the
// dataplane hands a workload back with the keys and values it was sent with.
export type { Workload } from './generated/Workload.js';
export type { WorkloadProtocol } from './generated/WorkloadProtocol.js';
export type { HealthStatus } from './generated/HealthStatus.js';
export type { Locality } from './generated/Locality.js';
export type { GatewayAddress } from './generated/GatewayAddress.js';
export type { WeightedWaypoint } from './generated/WeightedWaypoint.js';
export type { ApplicationTunnel } from './generated/ApplicationTunnel.js';
export type { ApplicationTunnelProtocol } from './generated/ApplicationTunnelProtocol.js';
export type { NetworkMode } from './generated/NetworkMode.js';
export type { LoadBalancer } from './generated/LoadBalancer.js';
export type { LoadBalancerMode } from './generated/LoadBalancerMode.js';
export type { RoutingPreference } from './generated/RoutingPreference.js';
export type { HealthPolicy } from './generated/HealthPolicy.js';
export type { IpFamilies } from './generated/IpFamilies.js';
export type { Visibility } from './generated/Visibility.js';
export type { Service } from './generated/Service.js';
export type { NativePolicy } from './generated/NativePolicy.js';
export type { NativeMatch } from './generated/NativeMatch.js';
export type { NativeStringMatch } from './generated/NativeStringMatch.js';
export type { ServiceAccountMatch } from './generated/ServiceAccountMatch.js';
export type { PolicyScope } from './generated/PolicyScope.js';
export type { PolicyAction } from './generated/PolicyAction.js';
export type { StateDelta } from './generated/StateDelta.js';
export type { AppliedOut } from './generated/AppliedOut.js';
export type { WorkloadTransition } from './generated/WorkloadTransition.js';
export type { MissingReference } from './generated/MissingReference.js';
export type { MeshDump } from './generated/MeshDump.js';
export type { WorkloadDump } from './generated/WorkloadDump.js';
export type { PolicyDump } from './generated/PolicyDump.js';
export type { MatchDump } from './generated/MatchDump.js';
export type { StringMatchDump } from './generated/StringMatchDump.js';
export type { WorkloadRecord } from './generated/WorkloadRecord.js';
export type { LocalDump } from './generated/LocalDump.js';
export type { ServiceDump } from './generated/ServiceDump.js';
export type { EndpointDump } from './generated/EndpointDump.js';

// What the admin API's calls take and answer (lib.rs, rbac.rs), generated like the above.
export type { AuthorizeRequest } from './generated/AuthorizeRequest.js';
export type { AuthorizeExplanation } from './generated/AuthorizeExplanation.js';
export type { AuthorizeWorkload } from './generated/AuthorizeWorkload.js';
export type { AuthorizeDecision } from './generated/AuthorizeDecision.js';
export type { ConsideredPolicy } from './generated/ConsideredPolicy.js';
export type { AuthzPreviewRequest } from './generated/AuthzPreviewRequest.js';
export type { AuthzPreview } from './generated/AuthzPreview.js';
export type { PreviewFlow } from './generated/PreviewFlow.js';
export type { InstalledCertificate } from './generated/InstalledCertificate.js';
export type { NativeVersion } from './generated/NativeVersion.js';

// The dataplane's counters (native/dataplane/src/metrics.rs and dns/metrics.rs), generated like the config above.
export type { MetricsSnapshot } from './generated/MetricsSnapshot.js';
export type { ConnectionCounters } from './generated/ConnectionCounters.js';
export type { TrafficLabels } from './generated/TrafficLabels.js';
export type { TunnelCounters } from './generated/TunnelCounters.js';
export type { AuthorizationCounters } from './generated/AuthorizationCounters.js';
export type { CrlCounters } from './generated/CrlCounters.js';
export type { BufferCounters } from './generated/BufferCounters.js';
export type { RuntimeCounters } from './generated/RuntimeCounters.js';
export type { DnsCounters } from './generated/DnsCounters.js';

// Events (events.rs): each batch of `drainEvents()` is events, then a `DroppedEvents` when the queue overflowed.
import type { DroppedEvents } from './generated/DroppedEvents.js';
import type { LogEvent } from './generated/LogEvent.js';
export type { DroppedEvents, LogEvent };
export type { EventLevel } from './generated/EventLevel.js';
export type NativeEvent = LogEvent | DroppedEvents;

// Local mode's listeners (lib.rs), generated like the above.
export type { LocalWorkloadSpec } from './generated/LocalWorkloadSpec.js';
export type { BoundListeners } from './generated/BoundListeners.js';

// What startInpod and startDedicated take, and what inpodState answers (native/dataplane/src/inpod/), generated
// like the above.
export type { InPodConfig } from './generated/InPodConfig.js';
export type { DedicatedSpec } from './generated/DedicatedSpec.js';
export type { SelfInboundSpec } from './generated/SelfInboundSpec.js';
export type { OutlierEndpoint } from './generated/OutlierEndpoint.js';
export type { ResilienceConfig } from './generated/ResilienceConfig.js';
export type { OrigSrc } from './generated/OrigSrc.js';
export type { InPodState } from './generated/InPodState.js';
export type { InPodWorkload } from './generated/InPodWorkload.js';
export type { InPodWorkloadInfo } from './generated/InPodWorkloadInfo.js';
export type { InPodConnections } from './generated/InPodConnections.js';
export type { ConnectionInfo } from './generated/ConnectionInfo.js';
export type { PodPhase } from './generated/PodPhase.js';
export type { HandoverReport } from './generated/HandoverReport.js';
