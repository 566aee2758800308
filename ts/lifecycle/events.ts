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
