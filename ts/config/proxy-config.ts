// ztunnel's ProxyConfig: the mesh config file's `defaultConfig` with the PROXY_CONFIG variable (YAML) merged over it,
// read and applied as istio/ztunnel does (src/config.rs at commit 5e6988cf: `parse_proxy_config`,
// `construct_proxy_config`, `ProxyConfig::merge`, `construct_config`). What ztunnel does, and so what this does:
//
// * Sources. The mesh config file is `./etc/istio/config/mesh`, relative to the working directory, a YAML MeshConfig
//   of which only `defaultConfig` is read; absent, it is no ProxyConfig. PROXY_CONFIG is a YAML ProxyConfig; unset,
//   empty or `null`, none. PROXY_CONFIG wins field by field; `proxyMetadata` is the union of both, PROXY_CONFIG's
//   value winning per key.
// * Fields read: `discoveryAddress`, `proxyAdminPort`, `statsPort`, `concurrency`, `proxyMetadata`. Every other field
//   of either document is ignored (serde's default; a mesh config shared with istiod has many, e.g. `tracing`),
//   `statusPort` and `terminationDrainDuration` too (older ztunnels read them; this one does not, and the readiness
//   port has no ProxyConfig field).
// * A document that is not YAML, or a field read of the wrong type or out of range (the ports and `concurrency` are
//   u16), stops ztunnel at start; it stops ztunnel-node too, naming the file or PROXY_CONFIG, the field and the
//   problem. Stricter than ztunnel, as ztunnel would silently drop what the operator asked for: the snake_case
//   spellings of the fields read (`proxy_admin_port`, `default_config`), which istiod's proto parser accepts but
//   ztunnel ignores, are refused, naming the spelling ztunnel reads; a key given both as `K` and `ISTIO_META_K` in
//   `proxyMetadata` is refused (after stripping the prefix ztunnel keeps either, by hash order). A field ztunnel
//   would take but ztunnel-node cannot honour, `concurrency` above the dataplane's thread limit, is refused by name.
//   Two leniencies, neither dropping a setting: a ProxyConfig without `proxyMetadata` is accepted (ztunnel's struct
//   has no serde default for the map, so serde would report it missing), and an empty mesh config file is no
//   ProxyConfig.
// * Precedence. Each variable ztunnel reads wins over the field feeding the same setting, and the field over the
//   default: XDS_ADDRESS over `discoveryAddress` (which only feeds XDS, never CA_ADDRESS; `""` disables XDS as
//   XDS_ADDRESS="" does), ZTUNNEL_WORKER_THREADS over `concurrency` (a thread count over the core-based default;
//   0 = all cores as in ../shared/spec/istio-ambient.md § 0, from ztunnel 62d82653, where 5e6988cf passed 0 on). The ports have no ztunnel variable; ztunnel-node's ADMIN_ADDR and STATS_ADDR (whole
//   addresses) win over them, and a port alone keeps the default host. Flags win over everything, as everywhere.
// * proxyMetadata. Keys lose an `ISTIO_META_` prefix, then every ISTIO_META_<K> variable is merged over them (the
//   variable wins). ztunnel's env lookups do not fall back to it: of its keys ztunnel itself reads only
//   `DNS_CAPTURE` (the DNS proxy, on unless not "true") and `DNS_PROXY_ADDR` (where it listens; a bad address stops
//   ztunnel); CLUSTER_ID and ISTIO_VERSION come from the variables alone. All of it is XDS node metadata.
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { z } from 'zod';
import { ConfigError } from '../errors.js';
import type { SocketAddress } from './address.js';
import { MAX_WORKER_THREADS, parseField, type RawConfig, type WorkerThreadsSetting } from './schema.js';

/** ztunnel reads its mesh config here (relative to its working directory) for ProxyConfig's `defaultConfig`. */
export const MESH_CONFIG_FILE = './etc/istio/config/mesh';

/** The proxyMetadata prefix ztunnel strips (and the variables' prefix). */
const ISTIO_META_PREFIX = 'ISTIO_META_';

/** A value and where it was set, in the words of an error: `PROXY_CONFIG: proxyAdminPort`. */
export interface Sourced<T> {
  readonly value: T;
  readonly where: string;
}

/** The merged ProxyConfig: only the fields ztunnel reads. */
export interface ProxyConfig {
  readonly discoveryAddress?: Sourced<string>;
  readonly proxyAdminPort?: Sourced<number>;
  readonly statsPort?: Sourced<number>;
  readonly concurrency?: Sourced<number>;
  /** Keyed with `ISTIO_META_` stripped (after the merge, as ztunnel). */
  readonly proxyMetadata: Readonly<Record<string, Sourced<string>>>;
}

export interface ProxyConfigInput {
  /** PROXY_CONFIG's text; unset or empty: none. */
  readonly env: string | undefined;
  /** How errors name it (`PROXY_CONFIG`, or `--proxy-config` when the flag gave it). */
  readonly envName?: string;
  /** Whether the mesh config file exists (tests pass their own). */
  readonly exists?: (path: string) => boolean;
  /** The mesh config file's text (tests pass their own). */
  readonly readFile?: (path: string) => string;
}

const SCALAR_FIELDS = ['discoveryAddress', 'proxyAdminPort', 'statsPort', 'concurrency'] as const;
const READ_FIELDS = [...SCALAR_FIELDS, 'proxyMetadata'] as const;

const u16 = () =>
  z
    .number({ error: 'must be an integer between 0 and 65535' })
    .int({ error: 'must be an integer between 0 and 65535' })
    .min(0, { error: 'must be an integer between 0 and 65535' })
    .max(65535, { error: 'must be an integer between 0 and 65535' });

// serde reads a YAML scalar as the String it spells, so a number or boolean is taken as its text.
const metadataValue = z.union([z.string(), z.number(), z.boolean()], { error: 'must be a string' }).transform(String);

// Unknown fields are stripped: ztunnel's ProxyConfig ignores them. `null` is an absent field (serde's Option).
const proxyConfigSchema = z.object({
  discoveryAddress: z.string({ error: 'must be a string (an address, e.g. istiod.istio-system.svc:15012)' }).nullish(),
  proxyAdminPort: u16().nullish(),
  statsPort: u16().nullish(),
  concurrency: u16().nullish(),
  proxyMetadata: z.record(z.string(), metadataValue, { error: 'must be a map of strings' }).nullish(),
});

const isMapping = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);

const snakeCase = (camel: string) => camel.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

function invalid(where: string, problem: string): ConfigError {
  return new ConfigError(`invalid configuration: ${where}: ${problem}`);
}

function quote(v: unknown): string {
  const s = JSON.stringify(v);
  return s === undefined ? String(v) : s;
}

/**
 * The `yaml` package (a dependency for these two documents only), loaded on first use: a daemon without PROXY_CONFIG
 * or a mesh config file never loads it (the local config's YAML is the native module's).
 */
function parseYaml(text: string): unknown {
  const yaml = createRequire(import.meta.url)('yaml') as typeof import('yaml');
  return yaml.parse(text) as unknown;
}

function parseYamlText(text: string, label: string): unknown {
  try {
    return parseYaml(text);
  } catch (err) {
    const first = ((err instanceof Error ? err.message : String(err)).split('\n')[0] ?? '').replace(/:$/, '');
    throw invalid(label, `not valid YAML: ${first}`);
  }
}

interface DocumentConfig {
  readonly scalars: Partial<Record<(typeof SCALAR_FIELDS)[number], Sourced<string | number>>>;
  readonly proxyMetadata: Readonly<Record<string, Sourced<string>>>;
}

/** One document's ProxyConfig mapping; `at` prefixes the field paths in errors (`./etc/...: defaultConfig.`). */
function parseProxyConfigMapping(data: unknown, label: string, at: string): DocumentConfig {
  if (!isMapping(data)) throw invalid(`${label}${at === '' ? '' : `: ${at.slice(0, -1)}`}`, `must be a YAML mapping (a ProxyConfig), got ${quote(data)}`);
  for (const field of READ_FIELDS) {
    const snake = snakeCase(field);
    if (snake in data && !(field in data)) {
      throw invalid(`${label}: ${at}${snake}`, `ztunnel reads only the camelCase name and would ignore this field; write ${field}`);
    }
  }
  const parsed = proxyConfigSchema.safeParse(data);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((i) => {
      const path = i.path.map(String).join('.');
      let got: unknown = data;
      for (const p of i.path) got = isMapping(got) ? got[String(p)] : undefined;
      return `${label}: ${at}${path}: ${i.message} (got ${quote(got)})`;
    });
    throw new ConfigError(`invalid configuration: ${lines.join('; ')}`);
  }
  const scalars: Partial<Record<(typeof SCALAR_FIELDS)[number], Sourced<string | number>>> = {};
  for (const field of SCALAR_FIELDS) {
    const v = parsed.data[field];
    if (v !== undefined && v !== null) scalars[field] = { value: v, where: `${label}: ${at}${field}` };
  }
  const proxyMetadata: Record<string, Sourced<string>> = {};
  for (const [k, v] of Object.entries(parsed.data.proxyMetadata ?? {})) {
    proxyMetadata[k] = { value: v, where: `${label}: ${at}proxyMetadata.${k}` };
  }
  return { scalars, proxyMetadata };
}

function readMeshConfig(exists: (path: string) => boolean, readFile: (path: string) => string): DocumentConfig | null {
  if (!exists(MESH_CONFIG_FILE)) return null;
  let text: string;
  try {
    text = readFile(MESH_CONFIG_FILE);
  } catch (err) {
    // Gone between the two calls: absent, as ztunnel's NotFound. Any other error stops the start, as in ztunnel.
    if ((err as { code?: string }).code === 'ENOENT') return null;
    throw invalid(MESH_CONFIG_FILE, `cannot be read: ${err instanceof Error ? err.message : String(err)}`);
  }
  const data = parseYamlText(text, MESH_CONFIG_FILE);
  if (data === null || data === undefined) return null; // empty, or only comments
  if (!isMapping(data)) throw invalid(MESH_CONFIG_FILE, `must be a YAML mapping (a MeshConfig), got ${quote(data)}`);
  if ('default_config' in data && !('defaultConfig' in data)) {
    throw invalid(`${MESH_CONFIG_FILE}: default_config`, 'ztunnel reads only the camelCase name and would ignore this field; write defaultConfig');
  }
  const pc = data.defaultConfig;
  return pc === null || pc === undefined ? null : parseProxyConfigMapping(pc, MESH_CONFIG_FILE, 'defaultConfig.');
}

function readProxyConfigEnv(text: string | undefined, label: string): DocumentConfig | null {
  if (text === undefined || text === '') return null;
  const data = parseYamlText(text, label);
  return data === null || data === undefined ? null : parseProxyConfigMapping(data, label, '');
}

/**
 * The ProxyConfig ztunnel would build: the mesh config file's `defaultConfig`, PROXY_CONFIG merged over it, and
 * proxyMetadata's `ISTIO_META_` prefixes stripped. Throws ConfigError naming the source, the field and the problem.
 */
export function loadProxyConfig(input: ProxyConfigInput): ProxyConfig {
  const mesh = readMeshConfig(input.exists ?? existsSync, input.readFile ?? ((p) => readFileSync(p, 'utf8')));
  const env = readProxyConfigEnv(input.env, input.envName ?? 'PROXY_CONFIG');
  const docs = [mesh, env].filter((d): d is DocumentConfig => d !== null);
  const scalars: Partial<Record<(typeof SCALAR_FIELDS)[number], Sourced<string | number>>> = {};
  const merged: Record<string, Sourced<string>> = {};
  for (const d of docs) {
    Object.assign(scalars, d.scalars);
    Object.assign(merged, d.proxyMetadata);
  }
  const proxyMetadata: Record<string, Sourced<string>> = {};
  for (const [k, v] of Object.entries(merged)) {
    const key = k.startsWith(ISTIO_META_PREFIX) ? k.slice(ISTIO_META_PREFIX.length) : k;
    const other = proxyMetadata[key];
    if (other !== undefined) {
      throw new ConfigError(
        `invalid configuration: ${other.where} and ${v.where}: both are proxy metadata ${key} (ztunnel strips ISTIO_META_ and keeps either, by hash order); set one`,
      );
    }
    proxyMetadata[key] = v;
  }
  return {
    ...(scalars.discoveryAddress && { discoveryAddress: scalars.discoveryAddress as Sourced<string> }),
    ...(scalars.proxyAdminPort && { proxyAdminPort: scalars.proxyAdminPort as Sourced<number> }),
    ...(scalars.statsPort && { statsPort: scalars.statsPort as Sourced<number> }),
    ...(scalars.concurrency && { concurrency: scalars.concurrency as Sourced<number> }),
    proxyMetadata,
  };
}

/** What a ProxyConfig sets, each only where the variable or flag that wins over it is unset (see the top). */
export interface ProxyConfigSettings {
  /** Normalized as XDS_ADDRESS is; `''` disables XDS. */
  readonly xdsAddress?: string;
  readonly adminPort?: number;
  readonly statsPort?: number;
  readonly workerThreads?: WorkerThreadsSetting;
  /** proxyMetadata DNS_CAPTURE, where ISTIO_META_DNS_CAPTURE is unset. */
  readonly dnsCapture?: string;
  /** proxyMetadata DNS_PROXY_ADDR, where ISTIO_META_DNS_PROXY_ADDR is unset. */
  readonly dnsProxyAddr?: SocketAddress;
  /** XDS node metadata: proxyMetadata, under the ISTIO_META_<K> variables (merged over it by the caller). */
  readonly metadata: Readonly<Record<string, string>>;
}

/** Applies ztunnel's precedence against the parsed variables and flags; throws ConfigError for a value it uses. */
export function proxyConfigSettings(
  pc: ProxyConfig,
  raw: Pick<RawConfig, 'XDS_ADDRESS' | 'ADMIN_ADDR' | 'STATS_ADDR' | 'ZTUNNEL_WORKER_THREADS' | 'ISTIO_META_DNS_CAPTURE' | 'ISTIO_META_DNS_PROXY_ADDR'>,
): ProxyConfigSettings {
  const out: { -readonly [K in keyof ProxyConfigSettings]: ProxyConfigSettings[K] } = {
    metadata: Object.fromEntries(Object.entries(pc.proxyMetadata).map(([k, v]) => [k, v.value])),
  };
  // ztunnel validates the address that wins, and only that one.
  if (raw.XDS_ADDRESS === undefined && pc.discoveryAddress !== undefined) {
    const r = parseField('XDS_ADDRESS', pc.discoveryAddress.value);
    if (!r.ok) throw invalid(pc.discoveryAddress.where, r.message);
    out.xdsAddress = r.value;
  }
  if (raw.ADMIN_ADDR === undefined && pc.proxyAdminPort !== undefined) out.adminPort = pc.proxyAdminPort.value;
  if (raw.STATS_ADDR === undefined && pc.statsPort !== undefined) out.statsPort = pc.statsPort.value;
  if (raw.ZTUNNEL_WORKER_THREADS === undefined && pc.concurrency !== undefined) {
    const n = pc.concurrency.value;
    if (n > MAX_WORKER_THREADS) {
      throw invalid(pc.concurrency.where, `${n} threads cannot be honoured: ztunnel-node's dataplane runs at most ${MAX_WORKER_THREADS} (0 = all cores)`);
    }
    out.workerThreads = { kind: 'count', count: n };
  }
  const capture = pc.proxyMetadata.DNS_CAPTURE;
  if (raw.ISTIO_META_DNS_CAPTURE === undefined && capture !== undefined) out.dnsCapture = capture.value;
  const dnsAddr = pc.proxyMetadata.DNS_PROXY_ADDR;
  if (raw.ISTIO_META_DNS_PROXY_ADDR === undefined && dnsAddr !== undefined) {
    const r = parseField('ISTIO_META_DNS_PROXY_ADDR', dnsAddr.value);
    if (!r.ok) throw invalid(dnsAddr.where, r.message);
    out.dnsProxyAddr = r.value;
  }
  return out;
}

/** A ProxyConfig port on a default address: the default's host, the port if one was given. */
export function withPort(addr: SocketAddress, port: number | undefined): SocketAddress {
  return port === undefined ? addr : { host: addr.host, port };
}
