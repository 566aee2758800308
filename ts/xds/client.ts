// The delta ADS client (spec §3.1): one DeltaAggregatedResources stream to istiod carrying both watched types,
// Address (workloads and services) and Authorization (policies).
//
// Invariants:
// - Every response is answered: ACK `{type_url, response_nonce}`, or NACK with `error_detail.message` =
//   "<name>: <reason>; ..." naming each rejected resource. The good resources of a NACKed response still apply;
//   a rejected resource keeps its previous version (state and `initial_resource_versions`).
// - The state only changes through `apply` (the daemon's one entry point for state changes); it is called once
//   per response with the whole batch, and if it throws (the dataplane refused the delta) the whole response is
//   NACKed and nothing is recorded.
// - `versions` holds, per type, name -> version of what is applied; it is sent as `initial_resource_versions` on
//   every (re)connect, so istiod only re-sends what changed while we were away.
// - While disconnected the state is left exactly as it was: the last good state keeps serving.
// - Reconnect: a graceful end (OK, or a GOAWAY/transport closing, Cancelled, Unknown, DeadlineExceeded) retries
//   at once (10 ms); any other failure waits a backoff doubling from 10 ms to 15 s, reset by a good response.
//   Every attempt builds a fresh channel (own subchannel pool), so grpc-js's own reconnect backoff never stacks
//   on top of ours, and a rotated root CA or token is picked up.
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import * as grpc from '@grpc/grpc-js';
import type { Logger } from 'pino';
import {
  CONTROL_PLANE_KEEPALIVE_MS,
  CONTROL_PLANE_KEEPALIVE_TIMEOUT_MS,
  XDS_BACKOFF_INITIAL_MS,
  XDS_BACKOFF_MAX_MS,
  XDS_MAX_MESSAGE_BYTES,
} from '../config/defaults.js';
import {
  DeltaDiscoveryRequestSchema,
  DeltaDiscoveryResponseSchema,
  type DeltaDiscoveryRequest,
  type DeltaDiscoveryResponse,
} from '../gen/envoy/service/discovery/v3/discovery_pb.js';
import type { StateChange } from '../state/store.js';
import { serviceKey } from '../state/model.js';
import {
  ADDRESS_TYPE_URL,
  AUTHORIZATION_TYPE_URL,
  convertAddressResource,
  convertAuthorizationResource,
} from './convert.js';
import { channelCredentials, grpcTarget, requestMetadata, serverNameOptions, type ControlPlaneTarget, type TokenSource } from './grpc.js';
import type { XdsMetrics } from './metrics.js';

export const DELTA_ADS_PATH = '/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources';
/** Watched at connect, in this order (ztunnel's). */
export const WATCHED_TYPES = [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL] as const;

const round3 = (ms: number) => Math.round(ms * 1000) / 1000;

export type TerminationReason = 'ConnectionError' | 'Error' | 'Reconnect' | 'Complete';

export interface XdsNode {
  id: string;
  metadata: Record<string, unknown>;
}

/** ztunnel's node id: istiod keys the node type on the `ztunnel` prefix. */
export function ztunnelNodeId(c: { instanceIp: string | null; podName: string | null; podNamespace: string | null }): string {
  const ns = c.podNamespace ?? '';
  return `ztunnel~${c.instanceIp ?? '1.1.1.1'}~${c.podName ?? ''}.${ns}~${ns}.svc.cluster.local`;
}

/** Node metadata (spec §3.2): NAME, NAMESPACE, INSTANCE_IPS, NODE_NAME, then ISTIO_META_* / ISTIO_METAJSON_*. */
export function ztunnelNodeMetadata(c: {
  podName: string | null;
  podNamespace: string | null;
  instanceIp: string | null;
  nodeName: string | null;
  proxyMetadata: Readonly<Record<string, unknown>>;
}): Record<string, unknown> {
  const md: Record<string, unknown> = { ...c.proxyMetadata };
  if (c.podName !== null) md.NAME = c.podName;
  if (c.podNamespace !== null) md.NAMESPACE = c.podNamespace;
  if (c.instanceIp !== null) md.INSTANCE_IPS = c.instanceIp;
  if (c.nodeName !== null) md.NODE_NAME = c.nodeName;
  return md;
}

export interface XdsClientOptions {
  target: ControlPlaneTarget;
  token: TokenSource;
  clusterId: string;
  headers: Readonly<Record<string, string>>;
  node: XdsNode;
  /** The daemon's entry point for state changes; throws when the change was refused (nothing applied). */
  apply(change: StateChange): void;
  /** Called once, when both types got their first response and it was ACKed. */
  onSynced(): void;
  metrics: XdsMetrics;
  logger: Logger;
  /** Test hook: the backoff bounds. */
  backoff?: { initialMs: number; maxMs: number };
}

interface AddressName {
  kind: 'workload' | 'service';
  key: string;
}

interface TypeState {
  url: string;
  /** name -> version of every applied resource */
  versions: Map<string, string>;
  firstAcked: boolean;
}

/** A decoded response, its size on the wire and how long decoding took (for the debug log and the benchmark). */
interface Received {
  msg: DeltaDiscoveryResponse;
  bytes: number;
  decodeMs: number;
}

type Call = grpc.ClientDuplexStream<DeltaDiscoveryRequest, Received>;

export class XdsClient {
  private readonly types = new Map<string, TypeState>(
    WATCHED_TYPES.map((url) => [url, { url, versions: new Map(), firstAcked: false }]),
  );
  /** Address resource name -> what it named (a workload uid or a service key), for removals by name. */
  private readonly addressNames = new Map<string, AddressName>();
  private client: grpc.Client | null = null;
  private call: Call | null = null;
  private timer: NodeJS.Timeout | null = null;
  private backoffMs: number;
  private stopped = false;
  private synced = false;
  private attempt = 0;

  constructor(private readonly opts: XdsClientOptions) {
    this.backoffMs = this.initialBackoff;
  }

  private get initialBackoff(): number {
    return this.opts.backoff?.initialMs ?? XDS_BACKOFF_INITIAL_MS;
  }

  start(): void {
    this.connect();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.call?.cancel();
    this.client?.close();
  }

  /** name -> version currently applied, per type (what the next connect sends as initial_resource_versions). */
  resourceVersions(): Record<string, Record<string, string>> {
    return Object.fromEntries([...this.types].map(([url, t]) => [url, Object.fromEntries(t.versions)]));
  }

  private connect(): void {
    if (this.stopped) return;
    const attempt = ++this.attempt;
    const { opts } = this;
    let metadata: grpc.Metadata;
    let client: grpc.Client;
    try {
      metadata = requestMetadata(opts.token, opts.clusterId, opts.headers);
      client = new grpc.Client(grpcTarget(opts.target.address).target, channelCredentials(opts.target), {
        'grpc.max_receive_message_length': XDS_MAX_MESSAGE_BYTES,
        'grpc.max_send_message_length': XDS_MAX_MESSAGE_BYTES,
        'grpc.keepalive_time_ms': CONTROL_PLANE_KEEPALIVE_MS,
        'grpc.keepalive_timeout_ms': CONTROL_PLANE_KEEPALIVE_TIMEOUT_MS,
        'grpc.use_local_subchannel_pool': 1,
        ...serverNameOptions(opts.target),
      });
    } catch (err) {
      opts.logger.warn({ err: (err as Error).message }, 'XDS connection not attempted');
      this.terminated('ConnectionError', false);
      return;
    }
    this.client = client;
    let gotResponse = false;
    const call: Call = client.makeBidiStreamRequest(
      DELTA_ADS_PATH,
      (req: DeltaDiscoveryRequest) => Buffer.from(toBinary(DeltaDiscoveryRequestSchema, req)),
      (buf: Buffer): Received => {
        const t0 = performance.now();
        const msg = fromBinary(DeltaDiscoveryResponseSchema, buf);
        return { msg, bytes: buf.length, decodeMs: performance.now() - t0 };
      },
      metadata,
    );
    this.call = call;
    call.on('data', (r: Received) => {
      if (attempt !== this.attempt) return;
      gotResponse = true;
      this.onResponse(call, r);
    });
    // 'error' carries the same status as 'status'; a listener is required so grpc-js does not throw it.
    call.on('error', () => undefined);
    call.on('status', (status: grpc.StatusObject) => {
      if (attempt !== this.attempt) return;
      this.call = null;
      client.close();
      if (this.stopped) return;
      const graceful =
        status.code === grpc.status.OK ||
        status.code === grpc.status.CANCELLED ||
        status.code === grpc.status.UNKNOWN ||
        status.code === grpc.status.DEADLINE_EXCEEDED ||
        (status.code === grpc.status.UNAVAILABLE && /transport is closing|prior goaway|goaway/i.test(status.details));
      const reason: TerminationReason =
        status.code === grpc.status.OK
          ? 'Complete'
          : graceful
            ? 'Reconnect'
            : !gotResponse && status.code === grpc.status.UNAVAILABLE
              ? 'ConnectionError'
              : 'Error';
      opts.logger.warn({ code: grpc.status[status.code], details: status.details, reason }, 'XDS stream ended');
      this.terminated(reason, graceful);
    });
    for (const t of this.types.values()) {
      call.write(
        create(DeltaDiscoveryRequestSchema, {
          node: { id: opts.node.id, metadata: opts.node.metadata as never },
          typeUrl: t.url,
          initialResourceVersions: Object.fromEntries(t.versions),
        }),
      );
    }
    opts.logger.info({ address: opts.target.address, initialResources: this.resourceCount() }, 'XDS stream started');
  }

  private resourceCount(): number {
    let n = 0;
    for (const t of this.types.values()) n += t.versions.size;
    return n;
  }

  private terminated(reason: TerminationReason, graceful: boolean): void {
    this.opts.metrics.termination(reason);
    let delay: number;
    if (graceful) {
      delay = this.initialBackoff;
      this.backoffMs = this.initialBackoff;
    } else {
      delay = this.backoffMs;
      this.backoffMs = Math.min(this.backoffMs * 2, this.opts.backoff?.maxMs ?? XDS_BACKOFF_MAX_MS);
    }
    this.opts.logger.debug({ delayMs: delay }, 'XDS reconnect scheduled');
    this.timer = setTimeout(() => {
      this.timer = null;
      this.connect();
    }, delay);
    this.timer.unref();
  }

  private onResponse(call: Call, { msg: resp, bytes, decodeMs }: Received): void {
    const { opts } = this;
    const t0 = performance.now();
    opts.metrics.message(resp.typeUrl, bytes);
    const t = this.types.get(resp.typeUrl);
    if (t === undefined) {
      this.send(call, resp, [`type ${resp.typeUrl} is not watched`]);
      return;
    }
    const errors: string[] = [];
    const change: StateChange = {};
    const accepted: Array<{ name: string; version: string; address?: AddressName }> = [];
    const removedNames: string[] = [];
    for (const r of resp.resources) {
      try {
        if (t.url === ADDRESS_TYPE_URL) {
          const res = convertAddressResource(r.resource);
          const named: AddressName =
            res.kind === 'workload'
              ? { kind: 'workload', key: res.workload.uid }
              : { kind: 'service', key: serviceKey(res.service) };
          if (res.kind === 'workload') (change.workloads ??= []).push(res.workload);
          else (change.services ??= []).push(res.service);
          // A name that used to denote another key (istiod renamed a resource in place): drop the old key.
          const old = this.addressNames.get(r.name);
          if (old && (old.kind !== named.kind || old.key !== named.key)) this.removeAddress(change, old);
          accepted.push({ name: r.name, version: r.version, address: named });
        } else {
          const p = convertAuthorizationResource(r.resource);
          (change.policies ??= []).push(p);
          accepted.push({ name: r.name, version: r.version });
        }
      } catch (err) {
        errors.push(`${r.name}: ${(err as Error).message}`);
      }
    }
    for (const name of resp.removedResources) {
      removedNames.push(name);
      if (t.url === AUTHORIZATION_TYPE_URL) {
        (change.removedPolicies ??= []).push(name);
        continue;
      }
      const known = this.addressNames.get(name);
      if (known) this.removeAddress(change, known);
      // Unknown name: try it as a workload uid, then as a namespace/hostname service (ztunnel's order); the store
      // ignores keys it does not hold.
      else {
        (change.removedWorkloads ??= []).push(name);
        (change.removedServices ??= []).push(name);
      }
    }
    try {
      opts.apply(change);
    } catch (err) {
      const message = (err as Error).message;
      opts.logger.error({ typeUrl: t.url, err: message }, 'XDS update refused by the dataplane; nothing applied');
      this.send(call, resp, [...errors, ...accepted.map((a) => `${a.name}: ${message}`)]);
      return;
    }
    for (const a of accepted) {
      t.versions.set(a.name, a.version);
      if (a.address) this.addressNames.set(a.name, a.address);
    }
    for (const name of removedNames) {
      t.versions.delete(name);
      this.addressNames.delete(name);
    }
    this.backoffMs = this.initialBackoff;
    if (errors.length > 0) {
      opts.logger.warn({ typeUrl: t.url, rejected: errors }, 'XDS resources rejected (NACK); their previous versions keep serving');
    }
    opts.logger.debug(
      {
        typeUrl: t.url,
        resources: resp.resources.length,
        removed: resp.removedResources.length,
        rejected: errors.length,
        bytes,
        decodeMs: round3(decodeMs),
        // response decoded -> converted, in the store, and the delta returned from the dataplane
        applyMs: round3(performance.now() - t0),
      },
      'XDS response applied',
    );
    this.send(call, resp, errors);
    if (!t.firstAcked) {
      t.firstAcked = true;
      if (!this.synced && [...this.types.values()].every((x) => x.firstAcked)) {
        this.synced = true;
        opts.logger.info({ resources: this.resourceCount() }, 'XDS synced');
        opts.onSynced();
      }
    }
  }

  private removeAddress(change: StateChange, a: AddressName): void {
    if (a.kind === 'workload') (change.removedWorkloads ??= []).push(a.key);
    else (change.removedServices ??= []).push(a.key);
  }

  /** ACK (no errors) or NACK naming each rejected resource. */
  private send(call: Call, resp: DeltaDiscoveryResponse, errors: string[]): void {
    call.write(
      create(DeltaDiscoveryRequestSchema, {
        typeUrl: resp.typeUrl,
        responseNonce: resp.nonce,
        ...(errors.length > 0 ? { errorDetail: { code: grpc.status.INVALID_ARGUMENT, message: errors.join('; ') } } : {}),
      }),
    );
  }
}

