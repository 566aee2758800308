// The main thread's handle on the local config worker (local-worker.ts): `load()` has the worker read and validate
// LOCAL_XDS_PATH / LOCAL_XDS, and resolves with the ticket under which the dataplane holds the document's workloads
// and services plus the policy part of the change (the dataplane's JSON deltas, handed over unparsed); `commit()` or
// `discard()` then says whether it was applied. The main thread never parses YAML or runs the schema, so a large file
// costs it only the hand-over.
//
// Invariants:
// - A refused document rejects `load()` with a LocalConfigError carrying exactly the message an in-thread load
//   (local.ts) throws: the file, the path inside it and the problem.
// - One load at a time: `load()` calls are queued, and each must be followed by `commit()` or `discard()` before
//   the next load's diff is computed (the worker diffs against the last committed document).
// - The worker keeps the process alive only while a load is in flight, and `close()` ends it.
import { Worker } from 'node:worker_threads';
import { deflateRaw, inflateRawSync } from 'node:zlib';
import { LocalConfigError } from '../errors.js';
import { localDiscard, yamlToJson } from '../native/index.js';
import type { PolicyChange } from '../state/store.js';
import type { FromWorker, LoadedCounts, LocalWorkerData, ToWorker } from './local-worker.js';

export interface LocalLoad {
  /** The file path, or "LOCAL_XDS" for inline YAML. */
  source: string;
  /** How many of each the new document holds. */
  counts: LoadedCounts;
  /** The dataplane's ticket for the document's workloads and services (`Dataplane.applyLocal`). */
  ticket: number;
  /** The policy part of the change from the last committed document: StateDelta chunks (UTF-8 JSON), in apply order. */
  chunks: Uint8Array[];
  /** The policy part of the change, as written. */
  policies: PolicyChange;
  /** The document's text as read (UTF-8): config_dump's `staticConfig` (taken by `AppliedText` once applied). */
  text: Uint8Array;
  /** Read by the dataplane's fast path (false: by the schema's slow way). */
  fast: boolean;
}

/** Parses UTF-8 JSON bytes (a chunk or the raw document of a LocalLoad). */
export function parseJson(bytes: Uint8Array): unknown {
  return JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('utf8'));
}

/**
 * config_dump's `staticConfig`: the applied document as written, as JSON (rendered when asked: a large file's JSON
 * would otherwise be held all along). An empty document is `{}`, as it loads.
 */
export function renderStaticConfig(text: Uint8Array): unknown {
  const yaml = Buffer.from(text.buffer, text.byteOffset, text.byteLength).toString('utf8');
  try {
    return (JSON.parse(yamlToJson(yaml)) as unknown) ?? {};
  } catch (err) {
    // Read the fast way, but not by the slower parser (the two differ on rare syntax): show what was applied's text.
    return { text: yaml, renderError: err instanceof Error ? err.message : String(err) };
  }
}

/** Documents at least this large are kept deflated once applied (a 51 MiB file deflates to a few MiB). */
const DEFLATE_FROM_BYTES = 1 << 20;

/**
 * The text of the local document last applied, for config_dump's `staticConfig`: a large one is deflated off the JS
 * thread (zlib on libuv's pool) once applied, and rendered only when a dump asks.
 */
export class AppliedText {
  private text: Uint8Array | null;
  private deflated: Buffer | null = null;

  /** Takes the load's text (the load keeps an empty one: a retained load must not keep 50 MiB alive). */
  constructor(load: { text: Uint8Array }) {
    const text = load.text;
    load.text = new Uint8Array(0);
    this.text = text;
    if (text.byteLength < DEFLATE_FROM_BYTES) return;
    deflateRaw(text, { level: 1 }, (err, deflated) => {
      if (err !== null) return; // kept as it is
      this.deflated = deflated;
      this.text = null;
    });
  }

  render(): unknown {
    return renderStaticConfig(this.text ?? inflateRawSync(this.deflated ?? Buffer.alloc(0)));
  }
}

interface InFlight {
  resolve(load: LocalLoad): void;
  reject(err: Error): void;
}

export class LocalConfigLoader {
  private readonly worker: Worker;
  private inFlight: InFlight | null = null;
  private queue: Promise<unknown> = Promise.resolve();
  private dead: Error | null = null;
  private loads = 0;
  /** The ticket of the last load, until it is committed or discarded. */
  private ticket: number | null = null;

  /** Starts the worker; null when neither LOCAL_XDS nor LOCAL_XDS_PATH is set. */
  static open(cfg: { localXdsPath: string | null; localXds: string | null }): LocalConfigLoader | null {
    if (cfg.localXds === null && cfg.localXdsPath === null) return null;
    return new LocalConfigLoader({ localXdsPath: cfg.localXdsPath, localXds: cfg.localXds });
  }

  private constructor(data: LocalWorkerData) {
    this.worker = new Worker(new URL('./local-worker.js', import.meta.url), { workerData: data });
    this.worker.unref();
    this.worker.on('message', (m: FromWorker) => this.onMessage(m));
    this.worker.on('error', (err: Error) => this.fail(new Error(`the local config worker failed: ${err.message}`, { cause: err })));
    this.worker.on('exit', (code) => this.fail(new Error(`the local config worker exited (code ${code})`)));
  }

  /**
   * Reads and validates the document off the main thread; resolves the change to apply, or rejects. Every load
   * after the first is a reload: an empty file is then refused (a truncated write), not applied as "no workloads".
   */
  load(): Promise<LocalLoad> {
    const next = this.queue.then(
      () =>
        new Promise<LocalLoad>((resolve, reject) => {
          if (this.dead !== null) return reject(this.dead);
          this.inFlight = { resolve, reject };
          this.worker.ref();
          this.send({ op: 'load', reload: this.loads++ > 0 });
        }),
    );
    this.queue = next.catch(() => undefined);
    return next;
  }

  /** The last load was applied: the next load is diffed against it. */
  commit(): void {
    this.ticket = null;
    this.send({ op: 'commit' });
  }

  /** The last load was not applied: the next load is diffed against the one before it. */
  discard(): void {
    // The dataplane takes a document when it applies it; one that was not applied would stay held.
    if (this.ticket !== null) localDiscard(this.ticket);
    this.ticket = null;
    this.send({ op: 'discard' });
  }

  /** Ends the worker; a load in flight rejects. */
  async close(): Promise<void> {
    if (this.dead !== null) return;
    this.fail(new Error('the local config loader is closed'));
    await this.worker.terminate();
  }

  private send(m: ToWorker): void {
    if (this.dead === null) this.worker.postMessage(m);
  }

  private onMessage(m: FromWorker): void {
    const load = this.inFlight;
    if (load === null) return;
    this.settle();
    if (m.op === 'loaded') {
      this.ticket = m.ticket;
      load.resolve({ source: m.source, counts: m.counts, ticket: m.ticket, chunks: m.chunks, text: m.text, fast: m.fast, policies: parseJson(m.policies) as PolicyChange });
    }
    else if (m.op === 'invalid') load.reject(new LocalConfigError(m.message));
    else load.reject(new Error(`cannot load the local config: ${m.message}`));
  }

  private settle(): void {
    this.inFlight = null;
    this.worker.unref();
  }

  private fail(err: Error): void {
    if (this.dead !== null) return;
    this.dead = err;
    const load = this.inFlight;
    this.settle();
    load?.reject(err);
  }
}
