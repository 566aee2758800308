// CLI flags. Every config key has exactly one flag, derived from its env name (schema.ts `flagFor`); there are
// no hand-written aliases to keep in sync.
import { ConfigError } from '../errors.js';
import { BOOLEAN_KEYS, CONFIG_KEYS, flagFor, type ConfigKey } from './schema.js';

export interface ParsedArgs {
  /** Flag values by config key, as strings (the schema converts them). */
  values: Partial<Record<ConfigKey, string>>;
  /** Arguments that are not flags (e.g. the chart's `proxy ztunnel`). */
  positionals: string[];
}

const BY_FLAG: ReadonlyMap<string, ConfigKey> = new Map(CONFIG_KEYS.map((k) => [flagFor(k), k]));

/** Parses `--flag value`, `--flag=value` and, for boolean keys, a bare `--flag`. `--` ends the flags. */
export function parseFlags(args: readonly string[]): ParsedArgs {
  const values: Partial<Record<ConfigKey, string>> = {};
  const positionals: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] as string;
    if (arg === '--') {
      positionals.push(...args.slice(i + 1));
      break;
    }
    if (!arg.startsWith('--')) {
      positionals.push(arg);
      continue;
    }
    const eq = arg.indexOf('=');
    const name = eq < 0 ? arg : arg.slice(0, eq);
    const key = BY_FLAG.get(name);
    if (key === undefined) throw new ConfigError(`unknown flag ${name} (see --help)`);
    if (eq >= 0) {
      values[key] = arg.slice(eq + 1);
    } else if (BOOLEAN_KEYS.has(key)) {
      const next = args[i + 1];
      // `--unstable-enable-socks5 false` is accepted; anything else after a bare boolean flag is not its value.
      if (next !== undefined && /^(true|false|1|0)$/i.test(next)) {
        values[key] = next;
        i++;
      } else {
        values[key] = 'true';
      }
    } else {
      const next = args[i + 1];
      if (next === undefined || next.startsWith('--')) throw new ConfigError(`${name}: needs a value`);
      values[key] = next;
      i++;
    }
  }
  return { values, positionals };
}
