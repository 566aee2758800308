// A real OpenTelemetry Collector for the OTLP export tests: built from the collector project's Go modules
// (test/helpers/otelcol: the OTLP receiver and the debug exporter, every collector module at one release) into
// .tmp/tools/otelcol-ztn. npm test builds it (scripts/tools.mjs); a suite run alone builds it at first use (the Go
// toolchain is required: a test that needs the collector fails, saying so, without it). The debug exporter prints every record it receives;
// this reads them back from its output.
import { spawn, type ChildProcessByStdio } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import type { Cleanup } from './daemon.js';
import { waitFor } from './net.js';
import { tools } from './prereqs.js';

export const COLLECTOR = tools.COLLECTOR;

/** The collector's path, built first when it is missing or older than its sources (npm test builds it up front). */
export function collectorBinary(): string {
  tools.ensureCollector();
  return COLLECTOR;
}

/** A value as the debug exporter printed it, read back: `Int` and `Double` a number, `Bool` a boolean, else text. */
export type DebugValue = string | number | boolean;

/** One log record the collector received. */
export interface DebugRecord {
  /** Its resource's attributes. */
  resource: Record<string, DebugValue>;
  body: DebugValue | null;
  severity: string | null;
  attributes: Record<string, DebugValue>;
}

/** `Str(text)`, `Int(3)`, `Bool(true)`... as the debug exporter prints values → the value. */
function value(printed: string): DebugValue {
  const m = /^(\w+)\((.*)\)$/s.exec(printed.trim());
  if (m === null) return printed.trim();
  const [, type, v] = m;
  if (type === 'Int' || type === 'Double') return Number(v);
  if (type === 'Bool') return v === 'true';
  return v;
}

/**
 * The records in the debug exporter's detailed output: { resource, body, severity, attributes } each. A resource's
 * attributes precede its records ("Resource attributes:"), a record's follow "Attributes:"; each is "-> key: Type(v)".
 */
export function parseDebugOutput(text: string): DebugRecord[] {
  const records: DebugRecord[] = [];
  let resource: Record<string, DebugValue> = {};
  let current: DebugRecord | null = null;
  let section: 'resource' | 'record' | null = null;
  for (const line of text.split('\n')) {
    if (/^ResourceLog #\d+/.test(line) || /\tResourceLog #\d+/.test(line)) {
      resource = {};
      section = null;
    } else if (line.startsWith('Resource attributes:')) {
      section = 'resource';
    } else if (/^LogRecord #\d+/.test(line)) {
      current = { resource, body: null, severity: null, attributes: {} };
      records.push(current);
      section = null;
    } else if (line.startsWith('Body: ') && current !== null) {
      current.body = value(line.slice('Body: '.length));
    } else if (line.startsWith('SeverityText: ') && current !== null) {
      current.severity = line.slice('SeverityText: '.length).trim();
    } else if (line.startsWith('Attributes:') && current !== null) {
      section = 'record';
    } else if (/^\s+-> /.test(line)) {
      const m = /^\s+-> ([^:]+): (.*)$/.exec(line);
      if (m === null) continue;
      if (section === 'resource') resource[m[1]] = value(m[2]);
      else if (section === 'record' && current !== null) current.attributes[m[1]] = value(m[2]);
    } else if (!line.startsWith(' ')) {
      section = section === 'resource' && line.startsWith('ScopeLogs') ? null : section;
    }
  }
  return records;
}

/** `startCollector`'s options (described below). */
export interface StartCollectorOptions {
  ip: string;
  /** Where its config goes. */
  dir: string;
  cleanup?: Cleanup;
  /** Default 'detailed'. */
  verbosity?: 'basic' | 'normal' | 'detailed';
}

/** A running collector. */
export interface Collector {
  /** What it received so far (parsed from its detailed output). */
  records(): DebugRecord[];
  /** Everything it printed so far. */
  output(): string;
  /** SIGTERM; resolves once it has exited. */
  stop(): Promise<void>;
  child: ChildProcessByStdio<null, Readable, Readable>;
}

/**
 * A collector with the OTLP receiver on `ip` (gRPC on 4317, HTTP on 4318) and the debug exporter. `records()` is what
 * it received so far; `stop()` ends it. `cleanup`: a TestContext. `verbosity`: the debug exporter's (`detailed`, which
 * `records()` parses; `basic` prints a line per batch, for the benchmark).
 */
export async function startCollector({ ip, dir, cleanup, verbosity = 'detailed' }: StartCollectorOptions): Promise<Collector> {
  const binary = collectorBinary();
  mkdirSync(dir, { recursive: true });
  const config = join(dir, 'otelcol.yaml');
  writeFileSync(config, [
    'receivers:',
    '  otlp:',
    '    protocols:',
    `      grpc: { endpoint: "${ip}:4317" }`,
    `      http: { endpoint: "${ip}:4318" }`,
    'exporters:',
    `  debug: { verbosity: ${verbosity} }`,
    'service:',
    '  telemetry: { metrics: { level: none } }',
    '  pipelines:',
    '    logs: { receivers: [otlp], exporters: [debug] }',
    '',
  ].join('\n'));
  const child = spawn(binary, ['--config', config], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  for (const s of [child.stdout, child.stderr]) s.on('data', (d: Buffer) => (out += d.toString()));
  let exited = false;
  child.once('exit', () => (exited = true));
  const stop = () =>
    new Promise<void>((resolve) => {
      if (exited) return resolve();
      child.once('exit', () => resolve());
      child.kill('SIGTERM');
    });
  cleanup?.after(stop);
  await waitFor(() => exited || out.includes('Everything is ready'), { timeoutMs: 30_000, message: 'the collector ready' });
  if (exited) throw new Error(`the collector exited:\n${out}`);
  return { records: () => parseDebugOutput(out), output: () => out, stop, child };
}
