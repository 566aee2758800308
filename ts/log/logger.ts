// Logging: pino, writing one line per event to stdout (like ztunnel, which logs to stdout), in ztunnel's two
// formats: `plain` (time  level  target  message  key=value...) and `json`. Each log line carries a `target`
// (ztunnel's tracing target: `ztunnel` for the daemon, `access` for access logs, `dataplane` for native logs), and
// RUST_LOG-style filters set a level per target. The admin /logging endpoint changes the filter at run time.
import { pino, type DestinationStream, type Logger, type LevelWithSilent } from 'pino';
import type { LogFormat } from '../config/schema.js';
import type { LogFilter, LogLevel } from './filter.js';

export interface Sink {
  write(line: string): void;
}

export interface Logs {
  /** The daemon's logger (target `ztunnel`). */
  readonly root: Logger;
  /** The logger of one target, created on first use; its level follows the filter. */
  forTarget(target: string): Logger;
  filter(): LogFilter;
  /** The level in force for a target (its override, or the default). */
  levelOf(target: string): LogLevel;
  setFilter(filter: LogFilter): void;
  /** Calls `listener` after every filter change; returns the unsubscribe function. */
  onChange(listener: () => void): () => void;
  /** Back to the filter given at start. */
  reset(): void;
}

const ROOT_TARGET = 'ztunnel';

function pinoLevel(level: LogLevel): LevelWithSilent {
  return level === 'off' ? 'silent' : level;
}

function plainValue(v: unknown): string {
  if (typeof v === 'string') return /^[^\s"=]+$/.test(v) ? v : JSON.stringify(v);
  if (v !== null && typeof v === 'object' && 'message' in v && typeof v.message === 'string') return JSON.stringify(v.message);
  return typeof v === 'object' ? JSON.stringify(v) : String(v);
}

/** Renders one pino JSON line as ztunnel's plain format. */
export function toPlain(jsonLine: string): string {
  let rec: Record<string, unknown>;
  try {
    rec = JSON.parse(jsonLine) as Record<string, unknown>;
  } catch {
    return jsonLine;
  }
  const { time, level, target, message, ...fields } = rec;
  const kv = Object.entries(fields).map(([k, v]) => `${k}=${plainValue(v)}`);
  return `${[time, level, target ?? ROOT_TARGET, message ?? '', ...kv].join('  ').trimEnd()}\n`;
}

export function createLogs(opts: { filter: LogFilter; format: LogFormat; sink?: Sink }): Logs {
  const sink: Sink = opts.sink ?? { write: (line) => void process.stdout.write(line) };
  const dest: DestinationStream = opts.format === 'plain' ? { write: (line) => sink.write(toPlain(line)) } : sink;
  const base = pino(
    {
      level: 'trace', // per-target loggers carry the effective level
      base: undefined,
      messageKey: 'message',
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    dest,
  );
  const initial = opts.filter;
  let current: LogFilter = initial;
  const loggers = new Map<string, Logger>();
  const listeners = new Set<() => void>();
  const filterLevel = (target: string): LogLevel => current.targets[target] ?? current.level;
  const levelOf = (target: string) => pinoLevel(filterLevel(target));
  const forTarget = (target: string): Logger => {
    let l = loggers.get(target);
    if (!l) {
      l = base.child({ target }, { level: levelOf(target) });
      loggers.set(target, l);
    }
    return l;
  };
  const setFilter = (filter: LogFilter) => {
    current = filter;
    for (const [target, l] of loggers) l.level = levelOf(target);
    for (const listener of listeners) listener();
  };
  return {
    root: forTarget(ROOT_TARGET),
    forTarget,
    filter: () => current,
    levelOf: filterLevel,
    setFilter,
    onChange: (listener) => {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    reset: () => setFilter(initial),
  };
}
