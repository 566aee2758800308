// RUST_LOG-style log filters ("info", "warn,access=debug", "off"), so operators keep ztunnel's knob.
// A filter is a default level plus per-target overrides; targets are the names of our child loggers
// (e.g. `access` for access logs, `dataplane` for native logs).

export const LOG_LEVELS = ['off', 'error', 'warn', 'info', 'debug', 'trace'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

export interface LogFilter {
  level: LogLevel;
  targets: Record<string, LogLevel>;
}

function isLevel(s: string): s is LogLevel {
  return (LOG_LEVELS as readonly string[]).includes(s);
}

/** Parses a filter, or returns an error string naming the bad directive. */
export function parseLogFilter(text: string, base?: LogFilter): LogFilter | string {
  const out: LogFilter = { level: base?.level ?? 'info', targets: { ...base?.targets } };
  for (const raw of text.split(',')) {
    const directive = raw.trim();
    if (directive === '') continue;
    const eq = directive.indexOf('=');
    if (eq < 0) {
      const level = directive.toLowerCase();
      if (!isLevel(level)) return `"${directive}" is not a level (${LOG_LEVELS.join('|')})`;
      out.level = level;
      continue;
    }
    const target = directive.slice(0, eq).trim();
    const level = directive.slice(eq + 1).trim().toLowerCase();
    if (target === '' || !isLevel(level)) {
      return `"${directive}" is not a directive (<target>=<${LOG_LEVELS.join('|')}>)`;
    }
    out.targets[target] = level;
  }
  return out;
}

export function formatLogFilter(filter: LogFilter): string {
  return [filter.level, ...Object.entries(filter.targets).map(([t, l]) => `${t}=${l}`)].join(',');
}
