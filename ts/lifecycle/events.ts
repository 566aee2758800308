// Native dataplane events -> logs. Access events go to the `access` target (ztunnel's access log target) so they
// can be filtered separately (RUST_LOG=warn,access=info); the DNS proxy's records to `dns` (ztunnel's target, at
// debug: RUST_LOG=dns=debug); other native logs go to `dataplane`.
import type { Logger } from 'pino';
import type { NativeEvent } from '../native/types.js';

/** Log lines the dataplane's rate limit suppressed, by cause (`<kind>: <message>`): ztunnel_node_log_lines_suppressed_total. */
export type SuppressedCounts = Map<string, number>;

export function logNativeEvent(
  ev: NativeEvent,
  loggers: { access: Logger; dataplane: Logger; dns?: Logger },
  suppressed?: SuppressedCounts,
): void {
  if (ev.kind === 'dropped') {
    loggers.dataplane.warn({ count: ev.count }, 'dataplane event queue overflowed; events dropped');
    return;
  }
  if (ev.kind === 'suppressed') {
    // A suppressed event's fields: `kind`, the cause's kind, and `count`, the lines not logged (events.rs).
    const kind = String(ev.fields.kind);
    const count = Number(ev.fields.count ?? 0);
    const cause = `${kind}: ${ev.message}`;
    suppressed?.set(cause, (suppressed.get(cause) ?? 0) + count);
    (kind === 'access' ? loggers.access : loggers.dataplane).warn(
      { cause: ev.message, suppressed: count },
      'log lines suppressed (more than 100 a second of this cause)',
    );
    return;
  }
  const logger = ev.kind === 'access' ? loggers.access : ev.kind === 'dns' ? (loggers.dns ?? loggers.dataplane) : loggers.dataplane;
  switch (ev.level) {
    case 'error':
      return logger.error(ev.fields, ev.message);
    case 'warn':
      return logger.warn(ev.fields, ev.message);
    case 'debug':
      return logger.debug(ev.fields, ev.message);
    default:
      return logger.info(ev.fields, ev.message);
  }
}

/** How often native events are drained into the logs: frequent enough to read as live, cheap (one JSON call). */
export const EVENT_PUMP_INTERVAL_MS = 250;

/**
 * The event pump: every EVENT_PUMP_INTERVAL_MS it drains the dataplane's events into the logs and hands them to its
 * sinks (the OTLP export, the dashboard). Part of the dataplane's component (dataplane.ts), which reads the last
 * events after its connections have drained and before the dataplane shuts down.
 */
export class EventPump {
  private timer: NodeJS.Timeout | null = null;
  private readonly loggers: { access: Logger; dataplane: Logger; dns: Logger };
  /** Log lines the dataplane suppressed, by cause (read by the metrics). */
  readonly suppressed: SuppressedCounts = new Map();

  constructor(
    /** The dataplane once it is open (null before: nothing to read). */
    private readonly source: () => { drainEvents(): NativeEvent[] } | null,
    logs: { forTarget(target: string): Logger },
    private readonly log: Logger,
    private readonly sinks: ReadonlyArray<(events: NativeEvent[]) => void>,
  ) {
    this.loggers = { access: logs.forTarget('access'), dataplane: logs.forTarget('dataplane'), dns: logs.forTarget('dns') };
  }

  start(): void {
    this.timer ??= setInterval(() => this.pump(), EVENT_PUMP_INTERVAL_MS);
    this.timer.unref();
  }

  /** Stops the timer and reads what is left (the last access records of drained connections). */
  stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    this.pump();
  }

  pump(): void {
    const source = this.source();
    if (source === null) return;
    try {
      const events = source.drainEvents();
      for (const ev of events) logNativeEvent(ev, this.loggers, this.suppressed);
      for (const sink of this.sinks) sink(events);
    } catch (err) {
      this.log.error({ err: (err as Error).message }, 'reading dataplane events failed');
    }
  }
}
