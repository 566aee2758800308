// Go/ztunnel style durations ("500ms", "10s", "1h30m", "1.5h"), the format ztunnel's env vars use.
// Negative durations are rejected: every duration we read is a timeout, a TTL or a deadline.

const UNIT_MS: Record<string, number> = {
  ns: 1e-6,
  us: 1e-3,
  'µs': 1e-3, // U+00B5 micro sign, as Go accepts
  'μs': 1e-3, // U+03BC Greek mu, as Go accepts
  ms: 1,
  s: 1000,
  m: 60_000,
  h: 3_600_000,
};

const PART = /(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)/y;

/** Milliseconds (possibly fractional), or undefined when `text` is not a duration. */
export function parseDurationMs(text: string): number | undefined {
  const s = text.trim();
  if (s === '0') return 0;
  if (s === '') return undefined;
  let total = 0;
  PART.lastIndex = 0;
  while (PART.lastIndex < s.length) {
    const start = PART.lastIndex;
    const m = PART.exec(s);
    if (!m || m.index !== start) return undefined;
    const [, value, unit] = m;
    total += Number(value) * (UNIT_MS[unit as string] as number);
  }
  return Number.isFinite(total) ? total : undefined;
}

/** Renders milliseconds the way Go prints durations ("1h30m0s", "500ms", "0s"), for logs and dumps. */
export function formatDurationMs(ms: number): string {
  if (ms === 0) return '0s';
  if (ms < 1000) return `${ms}ms`;
  let rest = ms / 1000;
  const h = Math.floor(rest / 3600);
  rest -= h * 3600;
  const m = Math.floor(rest / 60);
  rest -= m * 60;
  const sec = Number(rest.toFixed(3));
  if (h > 0) return `${h}h${m}m${sec}s`;
  if (m > 0) return `${m}m${sec}s`;
  return `${sec}s`;
}
