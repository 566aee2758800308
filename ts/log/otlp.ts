// OpenTelemetry export of the access log (beyond ztunnel, README "Access logs over OpenTelemetry"): every access
// record the dataplane reports is also sent as an OTLP log record, over gRPC or HTTP, by the OpenTelemetry project's
// own export transports (@opentelemetry/otlp-grpc-exporter-base, otlp-exporter-base: retries with backoff on
// retryable answers, timeouts, their standard OTEL_EXPORTER_OTLP_* variables), in batches the dataplane encodes.
//
// - Off the connection path and off JavaScript: the dataplane encodes each access record as an OTLP log record when the
//   event pump drains it (native otlp.rs) and queues it; this module takes whole requests and sends them, one export
//   at a time. (http/json alone is encoded here, as OTLP/JSON.)
// - Bounded: at most `maxQueueSize` records wait to be exported; past that a record is dropped, counted and the drop
//   logged. Memory does not grow while the collector is down.
// - Attributes: the record's fields under ztunnel's names (`src.addr`, `dst.workload`, ...), and the OpenTelemetry
//   semantic conventions' names for what they have (`source.address`, `source.port`, `destination.address`,
//   `destination.port`, `network.transport`).
// - Loaded only when export is configured: a daemon without it loads none of the exporters.
import type { Logger as PinoLogger } from 'pino';
import type { IOtlpExportDelegate } from '@opentelemetry/otlp-exporter-base';
import type { IExporterMetricsHelper, ISerializer } from '@opentelemetry/otlp-transformer';
import { detectResources, envDetector, resourceFromAttributes } from '@opentelemetry/resources';
import type { NativeEvent } from '../native/types.js';

type AttributeValue = string | number | boolean;
type Attributes = Readonly<Record<string, AttributeValue>>;

/** One access record as http/json sends it. */
interface LogRecordIn {
  readonly timeMs: number;
  readonly severityNumber: number;
  readonly severityText: string;
  readonly body: string;
  readonly attributes: Attributes;
  readonly more: Attributes;
}

/** What export needs, from the config (ts/config: OTEL_*). */
export interface OtlpSettings {
  readonly protocol: 'grpc' | 'http/protobuf' | 'http/json';
  /** The logs endpoint: for HTTP the whole URL (…/v1/logs), for gRPC the collector's address. */
  readonly url: string;
  readonly maxQueueSize: number;
  readonly maxExportBatchSize: number;
  readonly scheduledDelayMs: number;
  readonly exportTimeoutMs: number;
  /** Resource attributes of this daemon (service.name, k8s.node.name, ...); OTEL_RESOURCE_ATTRIBUTES adds to them. */
  readonly resource: Readonly<Record<string, string>>;
}

export interface ExportCounters {
  /** Records the collector accepted. */
  exported: number;
  /** Records dropped because the queue was full. */
  dropped: number;
  /** Records whose export failed after the SDK's retries. */
  failed: number;
}

export interface AccessExport {
  /** One batch of the dataplane's events: the access records among them are queued for export. */
  emit(events: readonly NativeEvent[]): void;
  counters(): ExportCounters;
  /** Sends what is queued (within `timeoutMs`), then stops. */
  shutdown(timeoutMs: number): Promise<void>;
}

/** OTLP's SeverityNumber values (logs/v1). */
const SEVERITY_INFO = 9;
const SEVERITY: Readonly<Record<string, number>> = {
  debug: 5,
  info: SEVERITY_INFO,
  warn: 13,
  error: 17,
};

/** `ip:port` or `[ip6]:port` → its parts (null when it is neither). */
export function splitAddress(addr: unknown): { address: string; port: number } | null {
  if (typeof addr !== 'string') return null;
  const colon = addr.lastIndexOf(':');
  if (colon <= 0) return null;
  const port = Number(addr.slice(colon + 1));
  if (!Number.isInteger(port) || port < 0 || colon + 1 === addr.length) return null;
  const host = addr.startsWith('[') && addr[colon - 1] === ']' ? addr.slice(1, colon - 1) : addr.slice(0, colon);
  return host === '' ? null : { address: host, port };
}

/**
 * What the semantic conventions name of an access record (`network.transport`, and the source and destination
 * address and port where its fields carry them), written beside ztunnel's own fields. For http/json only: the
 * dataplane adds the same to the protobuf records (native otlp.rs `log_record`).
 */
export function semconvAttributes(fields: Attributes): Attributes {
  const out: Record<string, AttributeValue> = { 'network.transport': 'tcp' };
  const src = splitAddress(fields['src.addr']);
  if (src !== null) Object.assign(out, { 'source.address': src.address, 'source.port': src.port });
  const dst = splitAddress(fields['dst.addr']);
  if (dst !== null) Object.assign(out, { 'destination.address': dst.address, 'destination.port': dst.port });
  return out;
}

/**
 * One encoded batch as the exporter's transport sends it: protobuf bytes of an ExportLogsServiceRequest, or its
 * OTLP/JSON form.
 */
interface Batch {
  readonly body: Uint8Array;
  readonly count: number;
}

/** The JSON form of an attribute value (OTLP/JSON: 64-bit integers as strings). */
function jsonValue(v: AttributeValue): Record<string, unknown> {
  if (typeof v === 'string') return { stringValue: v };
  if (typeof v === 'boolean') return { boolValue: v };
  return Number.isInteger(v) ? { intValue: String(v) } : { doubleValue: v };
}

const jsonAttributes = (attrs: Attributes): unknown[] => Object.entries(attrs).map(([key, value]) => ({ key, value: jsonValue(value) }));

/**
 * Where the records wait and how a batch of them is encoded: in the dataplane (protobuf: native otlp.rs encodes each
 * access record as it is drained) or here (OTLP/JSON for http/json).
 */
interface RecordQueue {
  /** A drained batch of events: its access records are queued (a no-op where the dataplane queues them itself). */
  add(events: readonly NativeEvent[]): void;
  /** Up to `max` records, encoded as one request (null when none wait), and the records dropped since the last take. */
  take(max: number): { batch: Batch | null; dropped: number };
}

/** What the OTLP export needs of the dataplane (ts/native Dataplane). */
export interface OtlpEncoder {
  exportOtlp(resource: Readonly<Record<string, string | number | boolean>>, scope: string, maxQueue: number): void;
  takeOtlp(max: number): { body: Uint8Array | null; count: number; dropped: number };
}

function nativeQueue(dp: OtlpEncoder, resource: Attributes, scope: string, maxQueue: number): RecordQueue {
  dp.exportOtlp(resource, scope, maxQueue);
  return {
    add: () => undefined,
    take(max) {
      const t = dp.takeOtlp(max);
      return { batch: t.body === null ? null : { body: t.body, count: t.count }, dropped: t.dropped };
    },
  };
}

/** http/json: the records as OTLP/JSON, queued here (bounded) and encoded a batch at a time. */
function jsonQueue(resource: Attributes, scope: string, maxQueue: number): RecordQueue {
  let queue: LogRecordIn[] = [];
  let dropped = 0;
  return {
    add(events) {
      const now = Date.now();
      for (const ev of events) {
        if (ev.kind !== 'access') continue;
        if (queue.length >= maxQueue) {
          dropped++;
          continue;
        }
        queue.push({ timeMs: now, severityNumber: SEVERITY[ev.level] ?? SEVERITY_INFO, severityText: ev.level.toUpperCase(), body: ev.message, attributes: ev.fields, more: semconvAttributes(ev.fields) });
      }
    },
    take(max) {
      const records = queue.slice(0, max);
      queue = queue.slice(records.length);
      const d = dropped;
      dropped = 0;
      return { batch: records.length === 0 ? null : { body: jsonEncode(resource, scope, records), count: records.length }, dropped: d };
    },
  };
}

function jsonEncode(resource: Attributes, scope: string, records: readonly LogRecordIn[]): Uint8Array {
  const logRecords = records.map((r) => {
    const nanos = String(BigInt(r.timeMs) * 1_000_000n);
    return {
      timeUnixNano: nanos,
      observedTimeUnixNano: nanos,
      severityNumber: r.severityNumber,
      severityText: r.severityText,
      body: { stringValue: r.body },
      attributes: [...jsonAttributes(r.attributes), ...jsonAttributes(r.more)],
    };
  });
  const request = { resourceLogs: [{ resource: { attributes: jsonAttributes(resource) }, scopeLogs: [{ scope: { name: scope }, logRecords }] }] };
  return Buffer.from(JSON.stringify(request));
}

/** The transport gets the batch as encoded here; the collector's answer (partial success) is not read. */
const passThrough: ISerializer<Batch, unknown> = {
  serializeRequest: (b) => b.body,
  deserializeResponse: () => ({}),
};
const batchCount: IExporterMetricsHelper<Batch> = { name: 'log', countItems: (b) => b.count };

/**
 * The OpenTelemetry project's export transport for the protocol (its retries with backoff on retryable answers, its
 * timeout, and the standard variables it reads itself: headers, timeout, compression, TLS files).
 */
async function transportFor(s: OtlpSettings): Promise<IOtlpExportDelegate<Batch>> {
  if (s.protocol === 'grpc') {
    const grpc = await import('@opentelemetry/otlp-grpc-exporter-base');
    return grpc.createOtlpGrpcExportDelegate(
      grpc.convertLegacyOtlpGrpcOptions({ url: s.url }, 'LOGS'),
      passThrough,
      'otlp_grpc_log_exporter',
      batchCount,
      undefined,
      'LogsExportService',
      '/opentelemetry.proto.collector.logs.v1.LogsService/Export',
    );
  }
  const http = await import('@opentelemetry/otlp-exporter-base/node-http');
  const contentType = s.protocol === 'http/json' ? 'application/json' : 'application/x-protobuf';
  return http.createOtlpHttpExportDelegate(
    http.convertLegacyHttpOptions({ url: s.url }, 'LOGS', 'v1/logs', { 'Content-Type': contentType }),
    passThrough,
    'otlp_http_log_exporter',
    batchCount,
    undefined,
  );
}

/**
 * Export through the project's transport, one batch at a time, of records the dataplane encodes (or, for http/json,
 * this module). `dp`: the dataplane, which encodes and queues the access records it drains.
 */
export async function startAccessExport(s: OtlpSettings, log: PinoLogger, dp: OtlpEncoder): Promise<AccessExport> {
  const transport = await transportFor(s);
  const detected = resourceFromAttributes({ ...s.resource }).merge(detectResources({ detectors: [envDetector] }));
  await detected.waitForAsyncAttributes?.();
  const resource: Record<string, AttributeValue> = {};
  for (const [k, v] of Object.entries(detected.attributes)) {
    if (typeof v === 'string' || typeof v === 'number' || typeof v === 'boolean') resource[k] = v;
  }
  const queue = s.protocol === 'http/json' ? jsonQueue(resource, SCOPE, s.maxQueueSize) : nativeQueue(dp, resource, SCOPE, s.maxQueueSize);
  return exportWith(queue, transport, s, log);
}

const SCOPE = 'ztunnel-node.access';

function exportWith(queue: RecordQueue, transport: IOtlpExportDelegate<Batch>, s: OtlpSettings, log: PinoLogger): AccessExport {
  const counts: ExportCounters = { exported: 0, dropped: 0, failed: 0 };
  let exporting: Promise<void> | null = null;
  let lastDropWarning = 0;
  log.info({ protocol: s.protocol, url: s.url, maxQueueSize: s.maxQueueSize }, 'exporting access records over OTLP');

  const countDropped = (n: number): void => {
    if (n === 0) return;
    counts.dropped += n;
    const now = Date.now();
    if (now - lastDropWarning > 10_000) {
      lastDropWarning = now;
      log.warn({ dropped: counts.dropped }, 'OTLP export queue full: access records dropped');
    }
  };
  /** The next batch, if any, and whether a full one was taken (more may wait). */
  const next = (): { batch: Batch | null; full: boolean } => {
    const t = queue.take(s.maxExportBatchSize);
    countDropped(t.dropped);
    return { batch: t.batch, full: t.batch !== null && t.batch.count >= s.maxExportBatchSize };
  };
  // One export at a time, as the SDK's batch processor: while the collector is slow or down the queue fills and its
  // excess is dropped, so memory stays bounded.
  const pump = (): void => {
    if (exporting !== null) return;
    const { batch, full } = next();
    if (batch === null) return;
    exporting = new Promise<void>((resolve) => {
      // OTEL_BLRP_EXPORT_TIMEOUT bounds the whole export, retries included, as the SDK's batch processor does (each
      // attempt's own OTEL_EXPORTER_OTLP_TIMEOUT is the transport's); a late answer is then not counted again.
      let done = false;
      // Set before the export starts, so that an answer given at once finds it.
      const deadline = setTimeout(() => finish(false), s.exportTimeoutMs);
      const finish = (ok: boolean): void => {
        if (done) return;
        done = true;
        clearTimeout(deadline);
        if (ok) counts.exported += batch.count;
        else counts.failed += batch.count;
        resolve();
      };
      // ExportResultCode.SUCCESS is 0.
      transport.export(batch, (result) => finish(result.code === 0));
    }).finally(() => {
      exporting = null;
      if (full) pump();
    });
  };
  const timer = setInterval(pump, s.scheduledDelayMs);
  timer.unref();

  return {
    emit(events) {
      queue.add(events);
      // A full batch goes now; the rest at the next tick of the schedule.
      pump();
    },
    counters: () => ({ ...counts }),
    async shutdown(timeoutMs) {
      clearInterval(timer);
      let deadlineTimer: NodeJS.Timeout | undefined;
      const deadline = new Promise<void>((resolve) => (deadlineTimer = setTimeout(resolve, timeoutMs)));
      const flushed = (async () => {
        for (;;) {
          await exporting;
          pump();
          if (exporting === null) break;
        }
        await transport.shutdown();
      })();
      try {
        await Promise.race([flushed, deadline]);
      } catch (err) {
        log.warn({ err: err instanceof Error ? err.message : String(err) }, 'OTLP export did not shut down cleanly');
      } finally {
        clearTimeout(deadlineTimer);
      }
    },
  };
}
