// A real `ztunnel-node proxy` child process for the integration suites, observed the way an operator would:
// readiness, /metrics, its JSON log lines, its exit code.
//
//   const a = await startDaemon({ node: 'node-a', config, caDir, adminIp: net.admin(1), cleanup: t });
//   await a.metrics();            // parsed Prometheus samples
//   await a.waitForLog((l) => l.target === 'access');
//   await a.stop();               // SIGTERM; asserts exit 0 within a few seconds; resolves { code, signal, ms }
//
// Cleanup is not optional: every daemon is killed (SIGKILL) and its temp directory removed when the `cleanup`
// TestContext ends (or by the file's own top-level `after` hook calling `kill()`; note that an `after` registered
// from inside a `before` hook runs as soon as that hook ends), and, as a last resort, when the test process exits.
import assert from 'node:assert/strict';
import { spawn, type ChildProcessByStdio } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import type { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { stringify } from 'yaml';
import { parsePrometheusText, sumSamples, type Sample } from '../../dist/cli/prom-text.js';
import { httpGet, waitFor } from './net.js';

/** One parsed Prometheus sample, as `metrics()` resolves them (dist/cli/prom-text.js). */
export type { Sample } from '../../dist/cli/prom-text.js';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));
export const BIN = join(ROOT, 'bin', 'ztunnel-node.js');
export const NATIVE_DIR = join(ROOT, 'dist', 'native');

/** First start creates the CA root and signs certificates; on 2 busy cores that can take a while. */
const READY_TIMEOUT_MS = 20_000;
/** SIGTERM → exit 0. The suites use a 2 s drain deadline unless they set their own. */
const STOP_TIMEOUT_MS = 8_000;
/** Tests drain fast: nothing of theirs needs the 5 s default. */
const TEST_TERMINATION_DEADLINE = '2s';

const live = new Set<Daemon>();
const tempDirs = new Set<string>();
process.once('exit', () => {
  for (const d of live) d.child.kill('SIGKILL');
  for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true });
});

export function makeTempDir(prefix = 'ztn-it-'): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  tempDirs.add(dir);
  return dir;
}

export function removeTempDir(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
  tempDirs.delete(dir);
}

/**
 * Where a daemon's (or a collector's) cleanup is registered: a TestContext (`t`), or an object of the suite's own
 * with the same `after(fn)` (functions it runs when the file's tests are done).
 */
export interface Cleanup {
  after(fn: () => unknown): unknown;
}

/** Environment variables for a child: `undefined` leaves a key out (removes a default), others are `String()`ed. */
export type EnvInput = Record<string, string | number | boolean | undefined>;

function registerCleanup(cleanup: Cleanup | undefined, fn: () => unknown): void {
  if (cleanup && typeof cleanup.after === 'function') cleanup.after(fn);
}

/**
 * An environment with nothing of the caller's ztunnel settings: PATH and HOME, then `env`.
 * Every ztunnel-node key a test needs is passed explicitly.
 */
export function cleanEnv(env: EnvInput = {}): Record<string, string> {
  const out: Record<string, string> = { PATH: process.env.PATH ?? '/usr/bin:/bin' };
  if (process.env.HOME) out.HOME = process.env.HOME;
  for (const [k, v] of Object.entries(env)) if (v !== undefined) out[k] = String(v);
  return out;
}

/**
 * A local config: YAML text, or a value serialized to YAML (usually `{ workloads, services, policies }`; any value,
 * as a test of a refused file may write one).
 */
export type LocalConfigInput = unknown;

/** A local config YAML in a temp file; `config` may be an object (serialized) or YAML text. */
export function writeLocalConfig(dir: string, config: LocalConfigInput, name = 'local.yaml'): string {
  const path = join(dir, name);
  writeFileSync(path, typeof config === 'string' ? config : stringify(config));
  return path;
}

export interface RunCliOptions {
  /** On top of PATH and HOME (`cleanEnv`). */
  env?: EnvInput;
  /** Killed (SIGKILL) after this. Default 30 s. */
  timeoutMs?: number;
}

/** How a `ztunnel-node` command ended, and what it printed. */
export interface CliResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  /** From spawn to exit. */
  ms: number;
}

/**
 * Runs `ztunnel-node <args>` to completion (for commands that exit on their own). Resolves
 * { code, signal, stdout, stderr, ms }. Killed after `timeoutMs`.
 */
export function runCli(args: readonly string[], { env = {}, timeoutMs = 30_000 }: RunCliOptions = {}): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const child = spawn(process.execPath, [BIN, ...args], { env: cleanEnv(env), stdio: ['ignore', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (c: Buffer) => out.push(c));
    child.stderr.on('data', (c: Buffer) => err.push(c));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', reject);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString(), ms: Date.now() - started });
    });
  });
}

/** Waits (bounded) for the native module while another build replaces it. */
export async function nativeModuleReady(timeoutMs = 60_000): Promise<void> {
  await waitFor(() => readdirSync(NATIVE_DIR).some((f) => f.endsWith('.node')), {
    timeoutMs,
    intervalMs: 500,
    message: `a native module in ${NATIVE_DIR}`,
  });
}

/** `startDaemon`'s options. */
export interface StartDaemonOptions {
  /** NODE_NAME */
  node: string;
  /** Local config (object or YAML text), written to a temp file (LOCAL_XDS_PATH). */
  config: LocalConfigInput;
  /** LOCAL_CA_DIR (share one between the daemons of a test); none for a daemon whose CA is istiod (`env`). */
  caDir?: string;
  /** Where admin (15000), stats (15020) and readiness (15021) bind. */
  adminIp: string;
  /** More environment (overrides the defaults; `undefined` removes one). */
  env?: EnvInput;
  /** A TestContext: the daemon is killed and its files removed when the test ends. */
  cleanup?: Cleanup;
  /** Until /healthz/ready answers 200. Default 20 s. */
  readyTimeoutMs?: number;
}

/**
 * Starts `ztunnel-node proxy` in local mode as node `node`, and waits until /healthz/ready answers 200.
 *
 * options:
 *   node       NODE_NAME
 *   config     local config (object or YAML text), written to a temp file (LOCAL_XDS_PATH)
 *   caDir      LOCAL_CA_DIR (share one between the daemons of a test)
 *   adminIp    where admin (15000), stats (15020) and readiness (15021) bind
 *   env        more environment (overrides the defaults below)
 *   cleanup    a TestContext: the daemon is killed and its files removed when the test ends
 */
export async function startDaemon({ node, config, caDir, adminIp, env = {}, cleanup, readyTimeoutMs = READY_TIMEOUT_MS }: StartDaemonOptions): Promise<Daemon> {
  await nativeModuleReady();
  const dir = makeTempDir(`ztn-${node}-`);
  const configPath = writeLocalConfig(dir, config);
  const fullEnv = cleanEnv({
    PROXY_MODE: 'local',
    NODE_NAME: node,
    LOCAL_XDS_PATH: configPath,
    LOCAL_CA_DIR: caDir,
    ADMIN_ADDR: `${adminIp}:15000`,
    STATS_ADDR: `${adminIp}:15020`,
    READINESS_ADDR: `${adminIp}:15021`,
    LOG_FORMAT: 'json',
    RUST_LOG: 'info',
    CONNECTION_TERMINATION_DEADLINE: TEST_TERMINATION_DEADLINE,
    // Each daemon its own hand-over socket: two tests' daemons of one node name must not take each other over
    // (the hand-over suite gives two daemons one socket).
    HANDOVER_SOCKET: join(dir, 'handover.sock'),
    ...env,
  });
  const child = spawn(process.execPath, [BIN, 'proxy'], { env: fullEnv, stdio: ['ignore', 'pipe', 'pipe'] });
  const d = new Daemon({ node, child, dir, adminIp, configPath, env: fullEnv });
  live.add(d);
  registerCleanup(cleanup, () => d.kill());
  try {
    await d.waitReady(readyTimeoutMs);
  } catch (err) {
    await d.kill();
    throw err;
  }
  return d;
}

/** The daemon child process: stdin ignored, stdout and stderr piped. */
export type DaemonChild = ChildProcessByStdio<null, Readable, Readable>;

/** What `new Daemon` takes (startDaemon builds it). */
export interface DaemonInit {
  node: string;
  child: DaemonChild;
  /** Its temp directory (config file, hand-over socket), removed with it. */
  dir: string;
  adminIp: string;
  configPath: string;
  /** The whole environment it was started with. */
  env: Record<string, string>;
}

/** One line the daemon printed. */
export interface OutputLine {
  stream: 'stdout' | 'stderr';
  line: string;
}

/**
 * One JSON log record of the daemon (LOG_FORMAT=json: pino's line, fields flattened beside `message`: `target`,
 * `src.addr`, `err`, `bytes_sent`...). The fields vary by record: read them as `unknown` and narrow.
 */
export interface DaemonLogRecord {
  level: string;
  time: string;
  message?: string;
  target?: string;
  [field: string]: unknown;
}

/** How the daemon process ended ('close': its output has all been read by then), and when. */
export interface DaemonExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** Date.now() at the exit. */
  at: number;
}

export interface WaitForLogOptions {
  /** Default 10 s. */
  timeoutMs?: number;
  /** What is waited for, in the time-out's message. Default 'a log record'. */
  message?: string;
}

export interface StopOptions {
  /** From the SIGTERM to the exit. Default 8 s. */
  timeoutMs?: number;
  /** The exit code asserted. Default 0. */
  expectCode?: number;
}

/** What `stop()` resolves: the exit, and `ms` from the SIGTERM to it. */
export interface StopResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  ms: number;
}

export class Daemon {
  node: string;
  child: DaemonChild;
  dir: string;
  adminIp: string;
  configPath: string;
  env: Record<string, string>;
  lines: OutputLine[];
  logs: DaemonLogRecord[];
  exit: DaemonExit | null;
  exited: Promise<DaemonExit>;
  /** When `terminate()` sent the SIGTERM (Date.now()); unset before. */
  declare terminatedAt: number | undefined;

  constructor({ node, child, dir, adminIp, configPath, env }: DaemonInit) {
    this.node = node;
    this.child = child;
    this.dir = dir;
    this.adminIp = adminIp;
    this.configPath = configPath;
    this.env = env;
    /** Every output line, in order: { stream: 'stdout'|'stderr', line }. */
    this.lines = [];
    /** stdout lines that parsed as JSON log records. */
    this.logs = [];
    this.exit = null;
    // 'close', not 'exit': it comes after stdout and stderr ended, so the last log lines are in `logs` by then.
    this.exited = new Promise((resolve) =>
      child.once('close', (code: number | null, signal: NodeJS.Signals | null) => {
        this.exit = { code, signal, at: Date.now() };
        live.delete(this);
        resolve(this.exit);
      }),
    );
    for (const stream of ['stdout', 'stderr'] as const) {
      createInterface({ input: child[stream] }).on('line', (line) => {
        this.lines.push({ stream, line });
        if (stream === 'stdout' && line.startsWith('{')) {
          try {
            this.logs.push(JSON.parse(line) as DaemonLogRecord);
          } catch {
            // not a log record
          }
        }
      });
    }
  }

  get statsUrl(): string {
    return `http://${this.adminIp}:15020`;
  }

  get readinessUrl(): string {
    return `http://${this.adminIp}:15021/healthz/ready`;
  }

  get adminUrl(): string {
    return `http://${this.adminIp}:15000`;
  }

  /** The last lines of output, for failure messages. */
  tail(n = 30): string {
    return this.lines.slice(-n).map((l) => `[${this.node} ${l.stream}] ${l.line}`).join('\n');
  }

  async waitReady(timeoutMs = READY_TIMEOUT_MS): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let last = 'no answer';
    while (Date.now() < deadline) {
      if (this.exit) throw new Error(`${this.node} exited (code ${this.exit.code}, signal ${this.exit.signal}) before it was ready\n${this.tail()}`);
      try {
        const r = await httpGet(this.readinessUrl, { timeoutMs: 2_000 });
        if (r.status === 200) return;
        last = `${r.status} ${r.body.trim()}`;
      } catch (err) {
        last = (err as Error).message;
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    throw new Error(`${this.node} not ready after ${timeoutMs} ms (${last})\n${this.tail()}`);
  }

  /** Scrapes /metrics; resolves the parsed samples. */
  async metrics(): Promise<Sample[]> {
    const r = await httpGet(`${this.statsUrl}/metrics`);
    assert.equal(r.status, 200, `${this.node} /metrics answered ${r.status}`);
    return parsePrometheusText(r.body);
  }

  /** Sum of the samples of `name` whose labels include `match`, from a fresh scrape. */
  async metric(name: string, match: Record<string, string> = {}): Promise<number> {
    return sumSamples(await this.metrics(), name, match);
  }

  /** Resolves the first log record matching `pred` (already logged or yet to come). */
  waitForLog(pred: (record: DaemonLogRecord) => unknown, { timeoutMs = 10_000, message = 'a log record' }: WaitForLogOptions = {}): Promise<DaemonLogRecord> {
    return waitFor(() => this.logs.find(pred), { timeoutMs, intervalMs: 25, message: `${this.node}: ${message}` });
  }

  /** Sends SIGTERM (once) and records when; `stop()` then waits for the exit. */
  terminate(): void {
    if (!this.exit && this.terminatedAt === undefined) {
      this.terminatedAt = Date.now();
      this.child.kill('SIGTERM');
    }
  }

  /**
   * SIGTERM (unless `terminate()` already sent it), then asserts the daemon exits with `expectCode` (0) within
   * `timeoutMs` of the signal. Returns { code, signal, ms } (ms: signal to exit). If it does not exit in time it
   * is killed and the assertion fails.
   */
  async stop({ timeoutMs = STOP_TIMEOUT_MS, expectCode = 0 }: StopOptions = {}): Promise<StopResult> {
    this.terminate();
    const started = this.terminatedAt ?? Date.now();
    const timedOut = Symbol('timeout');
    let timer: NodeJS.Timeout | undefined;
    const left = Math.max(0, started + timeoutMs - Date.now());
    const r = await Promise.race([this.exited, new Promise<typeof timedOut>((resolve) => (timer = setTimeout(() => resolve(timedOut), left)))]);
    clearTimeout(timer);
    if (r === timedOut) {
      await this.kill();
      assert.fail(`${this.node} did not exit within ${timeoutMs} ms of SIGTERM\n${this.tail()}`);
    }
    const ms = r.at - started;
    assert.equal(r.code, expectCode, `${this.node} exit code (signal ${r.signal})\n${this.tail()}`);
    this.removeFiles();
    return { code: r.code, signal: r.signal, ms };
  }

  /** SIGKILL if still running; removes the temp files; resolves once it has exited. Idempotent. */
  kill(): Promise<DaemonExit> {
    if (!this.exit) this.child.kill('SIGKILL');
    this.removeFiles();
    return this.exited;
  }

  removeFiles(): void {
    removeTempDir(this.dir);
  }
}

/** `workload()`'s fields; any other field is added to the workload as given (or overrides a default). */
export interface WorkloadOptions {
  name: string;
  ip: string;
  /** NODE_NAME of the daemon it runs on. */
  node: string;
  /** serviceAccount; default the name. */
  sa?: string;
  /** Default 'default'. */
  namespace?: string;
  /** Default 'HBONE' ('TCP': no tunnel). */
  protocol?: string;
  [field: string]: unknown;
}

/** A workload of a local config, in ztunnel's camelCase YAML fields (plus the extra ones given). */
export interface LocalWorkload {
  uid: string;
  name: string;
  namespace: string;
  serviceAccount: string;
  workloadIps: string[];
  protocol: string;
  node: string;
  canonicalName: string;
  canonicalRevision: string;
  workloadName: string;
  workloadType: string;
  clusterId: string;
  [field: string]: unknown;
}

/** One workload of a local config (ztunnel's camelCase YAML fields); `extra` adds or overrides fields. */
export function workload({ name, ip, node, sa = name, namespace = 'default', protocol = 'HBONE', ...extra }: WorkloadOptions): LocalWorkload {
  return {
    uid: `Kubernetes//Pod/${namespace}/${name}`,
    name,
    namespace,
    serviceAccount: sa,
    workloadIps: [ip],
    protocol,
    node,
    canonicalName: name,
    canonicalRevision: 'v1',
    workloadName: name,
    workloadType: 'deployment',
    clusterId: 'Kubernetes',
    ...extra,
  };
}

/** Waits until a daemon has no open proxied socket and every connection it opened is counted closed. */
export async function settled(daemon: Daemon, reporter: string, { timeoutMs = 10_000 }: { timeoutMs?: number } = {}): Promise<Sample[]> {
  return waitFor(
    async () => {
      const s = await daemon.metrics();
      const open = sumSamples(s, 'istio_tcp_sockets_open', { reporter });
      const opened = sumSamples(s, 'istio_tcp_connections_opened_total', { reporter });
      const closed = sumSamples(s, 'istio_tcp_connections_closed_total', { reporter });
      return open === 0 && opened === closed ? s : false;
    },
    { timeoutMs, message: `${daemon.node}: sockets_open{reporter="${reporter}"} 0 and opened == closed` },
  );
}
