// The benchmark harness (bench/harness/*.mjs) for the suites that drive it: the Envoy waypoint helpers (its Envoy
// install and admin counters) and the harness's own smoke test.
//
// The harness is JavaScript that node runs directly, outside this typed build: it imports the compiled helpers in
// dist-test/, and TypeScript cannot compile a file outside test/ into dist-test/ beside them. So it is loaded here at
// run time, from the source tree (the same path from test/helpers and dist-test/helpers), and the suites see it
// through the types below: the part of its interface they use, written once.

/** A harness module by file name, loaded from bench/harness. */
async function harness<T>(name: string): Promise<T> {
  return (await import(new URL(`../../bench/harness/${name}`, import.meta.url).href)) as T;
}

/** bench/harness/envoy.mjs's `ensureEnvoy`: the Envoy in the project's virtual environment, or why there is none. */
export type EnvoyInstall =
  | { binary: string; version: string; pipVersion: string; installSeconds: number; unavailable?: undefined }
  | { unavailable: string; binary?: undefined; version?: undefined };

interface EnvoyModule {
  ensureEnvoy(opts?: { install?: boolean }): EnvoyInstall;
  /** Envoy's counters whose names match `pattern`, from its admin /stats. */
  envoyStats(adminBase: string, pattern: RegExp): Promise<Record<string, number>>;
}

interface ProcessesModule {
  /** Polls `base + path` every 100 ms until `ok(status, body)`; throws naming `what` after `ms`. */
  poll(base: string, path: string, ok: (status: number, body: string) => boolean, what: string, ms?: number): Promise<void>;
}

/** One benchmark profile (bench/harness/run.mjs PROFILES). */
export interface BenchProfile {
  rounds: number;
  bytes: number;
  bytes4: number;
  cps: number;
  tunnels: number;
  hold: number[];
  idleSettle: number;
  /** The state daemons' workload counts. */
  state: number[];
}

export interface BenchOptions {
  profile: string;
  name: string;
  out: string;
  block: number;
  install: boolean;
  quiet: boolean;
  netns?: { prefix: string; block: number };
  only?: string[];
}

/** A statistic of one measurement for one topology. */
export interface Summary {
  median: number;
}

export interface BenchTarget {
  id: string;
  line: string;
  text: string;
  value: number | null;
  met: boolean | null;
}

export interface IdleDaemon {
  rssMiB: number;
  rssAnonMiB: number;
  rssFileMiB: number;
  secondsAfterReady: number;
}

/** A state daemon (a local file of `workloads` workloads), read `secondsAfterReady` after it was ready. */
export interface StateDaemon extends IdleDaemon {
  workloads: number;
  services: number;
  readyMs: number;
}

/** The result runBench resolves and writes as <name>.json (the fields the suites read). */
export interface BenchResult {
  topologies: Record<string, { available: boolean; reason: string }>;
  nodeLines: { line: string; binary: string; running: boolean; version?: string; from?: string }[];
  idleDaemons: Record<string, IdleDaemon>;
  /** Per Node line, per workload count. */
  stateDaemons: Record<string, Record<string, StateDaemon>>;
  envoy: { available: boolean; version: string; handshakesAfter: Record<string, { client: number; server: number }> };
  samples: Record<string, Record<string, number[]>>;
  tunnels: {
    counted: Record<string, { connections: number; opened: number; accepted: number; handshakeFailures?: number; sessionReused?: number }>;
  };
  memory: Record<string, { idleRss: number[]; holding: Record<string, { during: number[] }> }>;
  summary: Record<string, Record<string, Summary>>;
  ratios: Record<string, Record<string, { vsDirect: number; vsEnvoy?: number }>>;
  targets: BenchTarget[];
  proof: Record<string, { tunneled: number; handshakes: number }>;
}

interface RunModule {
  PROFILES: Record<'smoke' | 'quick' | 'full', BenchProfile>;
  runBench(opts: BenchOptions): Promise<BenchResult>;
}

interface ReportModule {
  /** [key, title, unit, better] per measurement. */
  METRICS: [string, string, string, string][];
  TARGET_IDS: string[];
  /** The summary, ratios and targets of a result's samples. */
  summarize(result: BenchResult): Pick<BenchResult, 'summary' | 'ratios' | 'targets'>;
  renderMarkdown(result: BenchResult): string;
}

export const { ensureEnvoy, envoyStats } = await harness<EnvoyModule>('envoy.mjs');
export const { poll } = await harness<ProcessesModule>('processes.mjs');

/** The harness's runner, report and topology names (loaded on first use: only its smoke test needs them). */
export async function benchHarness(): Promise<
  RunModule & ReportModule & { NETNS_TOPOLOGIES: string[]; RUNNING_LINE: string; TOPOLOGIES: string[] }
> {
  const [run, report, netns, lines, topologies] = await Promise.all([
    harness<RunModule>('run.mjs'),
    harness<ReportModule>('report.mjs'),
    harness<{ NETNS_TOPOLOGIES: string[] }>('netns.mjs'),
    harness<{ RUNNING_LINE: string }>('node-lines.mjs'),
    harness<{ TOPOLOGIES: string[] }>('topologies.mjs'),
  ]);
  return { ...run, ...report, ...netns, ...lines, ...topologies };
}
