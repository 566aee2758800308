// OpenTelemetry export of the access log (beyond ztunnel, README "Access logs over OpenTelemetry"): every access
// record the dataplane reports is also sent as an OTLP log record, over gRPC or HTTP, by the OpenTelemetry project's
// own SDK (batching, retries with backoff on retryable answers, its standard OTEL_EXPORTER_OTLP_* variables).
//
// - Off the connection path: records leave the dataplane in batches (the event pump's drainEvents), and this module
//   only turns them into log records for the SDK's batch processor.
// - Bounded: at most `maxQueueSize` records wait to be exported; past that a record is dropped and counted (the
//   SDK's processor would drop it too, silently). Memory does not grow while the collector is down.
// - Attributes: the record's fields under ztunnel's names (`src.addr`, `dst.workload`, ...), and the OpenTelemetry
//   semantic conventions' names for what they have (`source.address`, `source.port`, `destination.address`,
//   `destination.port`, `network.transport`).
// - Loaded only when export is configured: a daemon without it loads none of the SDK.
import type { Logger as PinoLogger } from 'pino';
import { SeverityNumber, type Logger as OtelLogger, type LogAttributes } from '@opentelemetry/api-logs';
import { detectResources, envDetector, resourceFromAttributes } from '@opentelemetry/resources';
import { BatchLogRecordProcessor, LoggerProvider, type LogRecordExporter, type ReadableLogRecord } from '@opentelemetry/sdk-logs';
import type { NativeEvent } from '../native/types.js';

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

const SEVERITY: Readonly<Record<string, SeverityNumber>> = {
  debug: SeverityNumber.DEBUG,
  info: SeverityNumber.INFO,
  warn: SeverityNumber.WARN,
  error: SeverityNumber.ERROR,
};

/** `ip:port` or `[ip6]:port` → its parts (null when it is neither). */
export function splitAddress(addr: unknown): { address: string; port: number } | null {
  if (typeof addr !== 'string') return null;
  const m = /^\[?([^\]]+?)\]?:(\d+)$/.exec(addr);
  return m === null ? null : { address: m[1] as string, port: Number(m[2]) };
}

/** An access record's OTLP attributes: ztunnel's fields as they are, and the semantic conventions' names. */
export function accessAttributes(fields: Readonly<Record<string, string | number | boolean>>): LogAttributes {
  const out: LogAttributes = { ...fields, 'network.transport': 'tcp' };
  const src = splitAddress(fields['src.addr']);
  if (src !== null) Object.assign(out, { 'source.address': src.address, 'source.port': src.port });
  const dst = splitAddress(fields['dst.addr']);
  if (dst !== null) Object.assign(out, { 'destination.address': dst.address, 'destination.port': dst.port });
  return out;
}

type ExportDone = Parameters<LogRecordExporter['export']>[1];

/** Counts what the SDK's processor hands the exporter: the records leaving the queue, and how their export ended. */
class CountingExporter implements LogRecordExporter {
  queued = 0;
  readonly counts: ExportCounters = { exported: 0, dropped: 0, failed: 0 };
  constructor(private readonly inner: LogRecordExporter) {}

  export(logs: ReadableLogRecord[], done: ExportDone): void {
    this.queued = Math.max(0, this.queued - logs.length);
    this.inner.export(logs, (result) => {
      // ExportResultCode.SUCCESS is 0.
      if (result.code === 0) this.counts.exported += logs.length;
      else this.counts.failed += logs.length;
      done(result);
    });
  }

  shutdown(): Promise<void> {
    return this.inner.shutdown();
  }

  forceFlush(): Promise<void> {
    return this.inner.forceFlush();
  }
}

async function exporterFor(s: OtlpSettings): Promise<LogRecordExporter> {
  // The SDK reads the rest of its standard variables itself (headers, timeout, compression, TLS files).
  switch (s.protocol) {
    case 'grpc': {
      const { OTLPLogExporter } = await import('@opentelemetry/exporter-logs-otlp-grpc');
      return new OTLPLogExporter({ url: s.url });
    }
    case 'http/json': {
      const { OTLPLogExporter } = await import('@opentelemetry/exporter-logs-otlp-http');
      return new OTLPLogExporter({ url: s.url });
    }
    case 'http/protobuf': {
      const { OTLPLogExporter } = await import('@opentelemetry/exporter-logs-otlp-proto');
      return new OTLPLogExporter({ url: s.url });
    }
  }
}

export async function startAccessExport(s: OtlpSettings, log: PinoLogger): Promise<AccessExport> {
  const exporter = new CountingExporter(await exporterFor(s));
  const resource = resourceFromAttributes({ ...s.resource }).merge(detectResources({ detectors: [envDetector] }));
  const provider = new LoggerProvider({
    resource,
    processors: [
      new BatchLogRecordProcessor({
        exporter,
        maxQueueSize: s.maxQueueSize,
        maxExportBatchSize: s.maxExportBatchSize,
        scheduledDelayMillis: s.scheduledDelayMs,
        exportTimeoutMillis: s.exportTimeoutMs,
      }),
    ],
  });
  const logger: OtelLogger = provider.getLogger('ztunnel-node.access');
  log.info({ protocol: s.protocol, url: s.url, maxQueueSize: s.maxQueueSize }, 'exporting access records over OTLP');
  let lastDropWarning = 0;
  return {
    emit(events) {
      const now = Date.now();
      for (const ev of events) {
        if (ev.kind !== 'access') continue;
        if (exporter.queued >= s.maxQueueSize) {
          exporter.counts.dropped++;
          if (now - lastDropWarning > 10_000) {
            lastDropWarning = now;
            log.warn({ queued: exporter.queued, dropped: exporter.counts.dropped }, 'OTLP export queue full: access records dropped');
          }
          continue;
        }
        exporter.queued++;
        logger.emit({
          timestamp: now,
          severityNumber: SEVERITY[ev.level] ?? SeverityNumber.INFO,
          severityText: ev.level.toUpperCase(),
          body: ev.message,
          attributes: accessAttributes(ev.fields),
        });
      }
    },
    counters: () => ({ ...exporter.counts }),
    async shutdown(timeoutMs) {
      let timer: NodeJS.Timeout | undefined;
      const deadline = new Promise<void>((resolve) => (timer = setTimeout(resolve, timeoutMs)));
      try {
        await Promise.race([provider.shutdown(), deadline]);
      } catch (err) {
        log.warn({ err: err instanceof Error ? err.message : String(err) }, 'OTLP export did not shut down cleanly');
      } finally {
        clearTimeout(timer);
      }
    },
  };
}
