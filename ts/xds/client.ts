// The delta ADS client, as ztunnel's: one DeltaAggregatedResources stream to istiod carrying both watched types,
// Address (workloads and services) and Authorization (policies).
//
// Invariants:
// - Every response is answered: ACK `{type_url, response_nonce}`, or NACK with `error_detail.message` =
//   "<name>: <reason>; ..." naming each rejected resource. The good resources of a NACKed response still apply;
//   a rejected resource keeps its previous version (state and `initial_resource_versions`).
// - Responses are handled strictly one at a time, in arrival order, and ACKed or NACKed once.
// - Address responses (workloads and services) are never decoded here: their resources go, still encoded, to the
//   dataplane (`applyAddresses`), which decodes, judges and applies them resource by resource off the JS thread and
//   names what it refused; it also keeps what each resource name denotes (a removal names the resource). A first
//   push of 100k workloads costs this thread one buffer copy.
// - Authorization responses are decoded and converted here (the policy compiler is on this side), in chunks of
//   STATE_CHUNK_RESOURCES resources, one per event-loop turn, then go to `apply` in units of that many resources
//   (removals last). A removal of a key that the same response upserts is dropped. If `apply` throws (the dataplane
//   refused the delta), that unit's resources are NACKed and keep their previous versions.
// - `versions` holds, per type, name -> version of what is applied; it is sent as `initial_resource_versions` on
//   every (re)connect, so istiod only re-sends what changed while we were away.
// - While disconnected the state is left exactly as it was: the last good state keeps serving.
// - Reconnect: a graceful end (OK, or a GOAWAY/transport closing, Cancelled, Unknown, DeadlineExceeded) retries
//   at once (10 ms); any other failure waits a backoff doubling from 10 ms to 15 s, reset by a good response.
//   Every attempt builds a fresh channel (own subchannel pool), so grpc-js's own reconnect backoff never stacks
//   on top of ours, and a rotated root CA or token is picked up.
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { BinaryReader, WireType } from '@bufbuild/protobuf/wire';
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
  ResourceSchema,
  type DeltaDiscoveryRequest,
  type DeltaDiscoveryResponse,
} from '../gen/envoy/service/discovery/v3/discovery_pb.js';
import { STATE_CHUNK_RESOURCES, nextTurn } from '../state/chunks.js';
import type { StateChange } from '../state/store.js';
import { policyKey, type Policy } from '../state/model.js';
import type { AppliedOut } from '../native/types.js';
import { ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL, convertAuthorizationResource } from './convert.js';
import { channelCredentials, grpcTarget, requestMetadata, serverNameOptions, type ControlPlaneTarget } from './grpc.js';
import type { TokenSource } from './token.js';
import type { XdsMetrics } from './metrics.js';
import { responseCollector } from '../heap.js';

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

/** ztunnel's node metadata: NAME, NAMESPACE, INSTANCE_IPS, NODE_NAME, then ISTIO_META_* / ISTIO_METAJSON_*. */
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
  /** The daemon's entry point for policy changes; throws when the change was refused (nothing applied). */
  apply(change: StateChange): void;
  /**
   * One Address response's resources (encoded envoy Resources) and removed names, for the dataplane to decode and
   * apply resource by resource; resolves what applied and what was refused, rejects when nothing applied.
   */
  applyAddresses(resources: readonly Uint8Array[], removed: string[]): Promise<Pick<AppliedOut, 'accepted' | 'rejected'>>;
  /** Called once, when both types got their first response and it was ACKed. */
  onSynced(): void;
  metrics: XdsMetrics;
  logger: Logger;
  /** Test hook: the backoff bounds. */
  backoff?: { initialMs: number; maxMs: number };
}

interface TypeState {
  url: string;
  /** name -> version of every applied resource */
  versions: Map<string, string>;
  firstAcked: boolean;
}

/**
 * A received response: its envelope decoded, its resources still encoded (each is decoded in its chunk), its size
 * on the wire and how long the envelope took (for the debug log and the benchmark).
 */
interface Received {
  /** Without `resources`. */
  msg: DeltaDiscoveryResponse;
  /** Each an encoded envoy.service.discovery.v3.Resource, in response order. */
  resources: Uint8Array[];
  bytes: number;
  decodeMs: number;
}

/** A converted Authorization resource of a response. */
interface Accepted {
  name: string;
  version: string;
  policy: Policy;
}

/** One `apply` call of a response: its change and the names it records (or NACKs) when it applies (or not). */
interface Unit {
  change: StateChange;
  accepted: Accepted[];
  removed: string[];
}

const RESOURCES_FIELD = (() => {
  const f = DeltaDiscoveryResponseSchema.fields.find((x) => x.localName === 'resources');
  if (f === undefined) throw new Error('DeltaDiscoveryResponse has no resources field');
  return f.number;
})();

/**
 * Decodes a DeltaDiscoveryResponse's envelope and leaves its resources encoded: decoding a first push of 100k
 * workloads and 10k services at once took 0.65 s on a busy core, in grpc-js's deserializer where nothing can yield;
 * walking the envelope takes 20-40 ms.
 */
export function decodeResponse(buf: Uint8Array): { msg: DeltaDiscoveryResponse; resources: Uint8Array[] } {
  const reader = new BinaryReader(buf);
  const resources: Uint8Array[] = [];
  const rest: Uint8Array[] = [];
  while (reader.pos < reader.len) {
    const start = reader.pos;
    const [no, wireType] = reader.tag();
    if (no === RESOURCES_FIELD && wireType === WireType.LengthDelimited) {
      resources.push(reader.bytes());
    } else {
      reader.skip(wireType, no);
      rest.push(buf.subarray(start, reader.pos));
    }
  }
  return { msg: fromBinary(DeltaDiscoveryResponseSchema, Buffer.concat(rest)), resources };
}

type Call = grpc.ClientDuplexStream<DeltaDiscoveryRequest, Received>;

export class XdsClient {
  private readonly types = new Map<string, TypeState>(
    WATCHED_TYPES.map((url) => [url, { url, versions: new Map(), firstAcked: false }]),
  );
  private client: grpc.Client | null = null;
  private call: Call | null = null;
  private timer: NodeJS.Timeout | null = null;
  private backoffMs: number;
  private stopped = false;
  private synced = false;
  private attempt = 0;
  /** The response being handled (then the ones queued behind it): responses never interleave. */
  private handling: Promise<void> = Promise.resolve();

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
        const { msg, resources } = decodeResponse(buf);
        return { msg, resources, bytes: buf.length, decodeMs: performance.now() - t0 };
      },
      metadata,
    );
    this.call = call;
    const handled = responseCollector();
    call.on('data', (r: Received) => {
      if (attempt !== this.attempt) return;
      gotResponse = true;
      const bytes = r.bytes;
      this.handling = this.handling
        .then(() => this.onResponse(call, r))
        .catch((err: unknown) => opts.logger.error({ err: err instanceof Error ? err.message : String(err) }, 'XDS response handling failed'))
        .then(() => handled(bytes));
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

  private async onResponse(call: Call, { msg: resp, resources, bytes, decodeMs }: Received): Promise<void> {
    const { opts } = this;
    // A response of a stream that has ended is dropped, even mid-way: what applied is recorded, and istiod re-sends
    // the rest on the next stream (it sees what we hold in initial_resource_versions).
    const live = () => !this.stopped && this.call === call;
    if (!live()) return;
    const t0 = performance.now();
    opts.metrics.message(resp.typeUrl, bytes);
    const t = this.types.get(resp.typeUrl);
    if (t === undefined) {
      this.send(call, resp, [`type ${resp.typeUrl} is not watched`]);
      return;
    }

    let longest = 0;
    let chunks = 1;
    let errors: string[];
    let refused: boolean;
    if (t.url === ADDRESS_TYPE_URL) {
      // Workloads and services: decoded, judged and applied by the dataplane, resource by resource, off the JS
      // thread (the mesh lives there; this side keeps only name -> version).
      errors = [];
      refused = false;
      try {
        const out = await opts.applyAddresses(resources, resp.removedResources);
        for (const name of resp.removedResources) t.versions.delete(name);
        for (const [name, version] of out.accepted) t.versions.set(name, version);
        errors.push(...out.rejected);
      } catch (err) {
        refused = true;
        const message = (err as Error).message;
        opts.logger.error({ typeUrl: t.url, err: message, resources: resources.length + resp.removedResources.length }, 'XDS update refused by the dataplane; nothing of it applied');
        errors.push(...resp.removedResources.map((name) => `${name}: ${message}`));
        if (resources.length > 0) errors.push(`the response's ${resources.length} resource(s): ${message}`);
      }
      if (!live()) return;
    } else {
      const r = await this.applyPolicies(t, resources, resp, live);
      if (r === null) return;
      ({ errors, refused, longest, chunks } = r);
    }
    if (refused) {
      // As for a response refused whole: NACKed, no backoff reset, and it does not count as the type's first ACK.
      this.send(call, resp, errors);
      return;
    }
    this.backoffMs = this.initialBackoff;
    if (errors.length > 0) {
      opts.logger.warn({ typeUrl: t.url, rejected: errors }, 'XDS resources rejected (NACK); their previous versions keep serving');
    }
    opts.logger.debug(
      {
        typeUrl: t.url,
        resources: resources.length,
        removed: resp.removedResources.length,
        rejected: errors.length,
        bytes,
        decodeMs: round3(decodeMs),
        // response decoded -> converted, in the store, and the delta returned from the dataplane (wall time: with
        // several chunks it includes the event-loop turns between them)
        applyMs: round3(performance.now() - t0),
        chunks,
        longestChunkMs: round3(longest),
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

  /**
   * An Authorization response: each resource decoded and converted here, a chunk per event-loop turn, then applied
   * in units of at most STATE_CHUNK_RESOURCES (then the removals). Null when the stream ended mid-way.
   */
  private async applyPolicies(
    t: TypeState,
    resources: Uint8Array[],
    resp: DeltaDiscoveryResponse,
    live: () => boolean,
  ): Promise<{ errors: string[]; refused: boolean; longest: number; chunks: number } | null> {
    const { opts } = this;
    // `longest`: the longest the event loop was held by one chunk (in the debug log; bench/large-input.mjs reads it).
    let longest = 0;
    let chunkStart = performance.now();
    const turn = async () => {
      longest = Math.max(longest, performance.now() - chunkStart);
      await nextTurn();
      chunkStart = performance.now();
    };
    const errors: string[] = [];
    const accepted: Accepted[] = [];
    for (let i = 0; i < resources.length; i++) {
      if (i > 0 && i % STATE_CHUNK_RESOURCES === 0) {
        await turn();
        if (!live()) return null;
      }
      let name = `resources[${i}]`;
      try {
        const r = fromBinary(ResourceSchema, resources[i] as Uint8Array);
        name = r.name;
        accepted.push({ name, version: r.version, policy: convertAuthorizationResource(r.resource) });
      } catch (err) {
        errors.push(`${name}: ${(err as Error).message}`);
      }
    }
    // A removal of a key that any resource of this response upserts is dropped (the store reads one batch that way;
    // across units it must be done here).
    const upserted = new Set(accepted.map((a) => policyKey(a.policy)));
    const units: Unit[] = [];
    for (let i = 0; i < accepted.length; i += STATE_CHUNK_RESOURCES) {
      const unit: Unit = { change: {}, accepted: accepted.slice(i, i + STATE_CHUNK_RESOURCES), removed: [] };
      unit.change.policies = unit.accepted.map((a) => a.policy);
      units.push(unit);
    }
    if (resp.removedResources.length > 0) {
      const removed = resp.removedResources.filter((name) => !upserted.has(name));
      units.push({ change: { removedPolicies: removed }, accepted: [], removed: resp.removedResources });
    }
    if (units.length === 0) units.push({ change: {}, accepted: [], removed: [] });
    let refused = false;
    for (const [k, unit] of units.entries()) {
      if (k > 0) {
        await turn();
        if (!live()) return null;
      }
      try {
        opts.apply(unit.change);
      } catch (err) {
        const message = (err as Error).message;
        refused = true;
        opts.logger.error(
          { typeUrl: t.url, err: message, resources: unit.accepted.length + unit.removed.length },
          'XDS update refused by the dataplane; nothing of it applied',
        );
        for (const a of unit.accepted) errors.push(`${a.name}: ${message}`);
        for (const name of unit.removed) errors.push(`${name}: ${message}`);
        continue;
      }
      for (const a of unit.accepted) t.versions.set(a.name, a.version);
      for (const name of unit.removed) t.versions.delete(name);
    }
    longest = Math.max(longest, performance.now() - chunkStart);
    return { errors, refused, longest, chunks: units.length };
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

