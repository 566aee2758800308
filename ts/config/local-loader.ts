// The main thread's handle on the local config worker (local-worker.ts): `load()` has the worker read, parse,
// validate and diff LOCAL_XDS_PATH / LOCAL_XDS, and resolves with the change as the dataplane's JSON deltas for the
// caller to hand over unparsed; `commit()` or `discard()` then says whether it was applied. The main thread never parses
// YAML or runs the schema, so a large file costs it only what applying the change costs, a chunk at a time.
//
// Invariants:
// - A refused document rejects `load()` with a LocalConfigError carrying exactly the message an in-thread load
//   (local.ts) throws: the file, the path inside it and the problem.
// - One load at a time: `load()` calls are queued, and each must be followed by `commit()` or `discard()` before
//   the next load's diff is computed (the worker diffs against the last committed document).
// - The worker keeps the process alive only while a load is in flight, and `close()` ends it.
import { Worker } from 'node:worker_threads';
import { LocalConfigError } from '../errors.js';
import type { PolicyChange } from '../state/store.js';
import type { FromWorker, LoadedCounts, LocalWorkerData, ToWorker } from './local-worker.js';

export interface LocalLoad {
  /** The file path, or "LOCAL_XDS" for inline YAML. */
  source: string;
  /** How many of each the new document holds. */
  counts: LoadedCounts;
  /** The change from the last committed document to this one: the dataplane's StateDelta as UTF-8 JSON, in apply order. */
  chunks: Uint8Array[];
  /** The policy part of the change, as written. */
  policies: PolicyChange;
  /** The document as written (config_dump's `staticConfig`), as UTF-8 JSON. */
  raw: Uint8Array;
}

/** Parses UTF-8 JSON bytes (a chunk or the raw document of a LocalLoad). */
export function parseJson(bytes: Uint8Array): unknown {
  return JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('utf8'));
}

interface InFlight {
  chunks: Uint8Array[];
  resolve(load: LocalLoad): void;
  reject(err: Error): void;
}

export class LocalConfigLoader {
  private readonly worker: Worker;
  private inFlight: InFlight | null = null;
  private queue: Promise<unknown> = Promise.resolve();
  private dead: Error | null = null;
  private loads = 0;

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
          this.inFlight = { chunks: [], resolve, reject };
          this.worker.ref();
          this.send({ op: 'load', reload: this.loads++ > 0 });
        }),
    );
    this.queue = next.catch(() => undefined);
    return next;
  }

  /** The last load was applied: the next load is diffed against it. */
  commit(): void {
    this.send({ op: 'commit' });
  }

  /** The last load was not applied: the next load is diffed against the one before it. */
  discard(): void {
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
    if (m.op === 'chunk') {
      load.chunks.push(m.json);
      return;
    }
    this.settle();
    if (m.op === 'loaded') {
      load.resolve({ source: m.source, counts: m.counts, chunks: load.chunks, raw: m.raw, policies: parseJson(m.policies) as PolicyChange });
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
