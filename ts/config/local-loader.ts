// The main thread's handle on the local config: `load()` has a worker thread (local-worker.ts) read and validate
// LOCAL_XDS_PATH / LOCAL_XDS, and resolves with the ticket under which the dataplane holds the document's workloads
// and services plus its compiled policies (the dataplane's JSON deltas, handed over unparsed); `commit()` or
// `discard()` then says whether it was applied. The main thread never parses YAML or runs the schema, so a large file
// costs it only the hand-over.
//
// Invariants:
// - A refused document rejects `load()` with a LocalConfigError carrying exactly the message local.ts's
//   `parseLocalConfig` throws: the file, the path inside it and the problem.
// - One load at a time: `load()` calls are queued, and each must be followed by `commit()` or `discard()` (the
//   dataplane diffs a document against the last one it applied).
// - One worker per load, ended when the load is: between loads nothing of the document is held but what the
//   dataplane holds (config_dump's `staticConfig` is rendered from the state).
//   A worker keeps the process alive while it runs; `close()` ends it.
// - Every load is in a worker, however small the document: the schema (zod, ~4 MiB of heap, 5-6 MiB of the
//   process's anonymous memory) then never loads on the main thread, which keeps nothing of it after start (the
//   daemon's own configuration is parsed in a worker too, config/off-thread.ts). A worker that ends is not all given
//   back at once (Node 24 pools its V8 pages for some seconds; its thread's malloc arena stays for the next one), but
//   the schema loaded on the main thread would stay for good (bench/idle-rss.mjs, bench/results/README.md).
import { Worker } from 'node:worker_threads';
import { LocalConfigError } from '../errors.js';
import { localDiscard } from '../native/index.js';
import type { FromWorker, LoadedCounts, LocalWorkerData } from './local-prepare.js';

export interface LocalLoad {
  /** The file path, or "LOCAL_XDS" for inline YAML. */
  source: string;
  /** How many of each the new document holds. */
  counts: LoadedCounts;
  /** The dataplane's ticket for the document's workloads and services (`Dataplane.applyLocal`). */
  ticket: number;
  /** The document's compiled policies: StateDelta chunks (UTF-8 JSON). */
  chunks: Uint8Array[];
}

interface InFlight {
  /** null: the first load, answered before the loader was opened (`open`'s `first`). */
  worker: Worker | null;
  resolve(load: LocalLoad): void;
  reject(err: Error): void;
  settled: boolean;
}


export class LocalConfigLoader {
  private inFlight: InFlight | null = null;
  private queue: Promise<unknown> = Promise.resolve();
  private closed = false;
  private loads = 0;
  /** The ticket of the last load, until it is committed or discarded. */
  private ticket: number | null = null;

  /**
   * A loader; null when neither LOCAL_XDS nor LOCAL_XDS_PATH is set. `first`: the answer of the first load, already
   * made (by the config worker, config/off-thread.ts, from the same settings: not a reload);
   * the first `load()` takes it instead of starting a worker.
   */
  static open(cfg: { localXdsPath: string | null; localXds: string | null }, first: FromWorker | null = null): LocalConfigLoader | null {
    if (cfg.localXds === null && cfg.localXdsPath === null) {
      // Nothing will take it: the dataplane would hold its document.
      if (first?.op === 'loaded') localDiscard(first.ticket);
      return null;
    }
    return new LocalConfigLoader(cfg.localXdsPath, cfg.localXds, first);
  }

  private constructor(
    private readonly localXdsPath: string | null,
    private readonly localXds: string | null,
    private first: FromWorker | null,
  ) {}

  /**
   * Reads and validates the document in a worker thread; resolves the change to apply, or rejects. Every load after
   * the first is a reload: an empty file is then refused (a truncated write), not applied as "no workloads".
   */
  load(): Promise<LocalLoad> {
    const next = this.queue.then(() => new Promise<LocalLoad>((resolve, reject) => this.begin(resolve, reject)));
    this.queue = next.catch(() => undefined);
    return next;
  }

  /** Starts one load: the first one's answer if it was made already, else a worker's. */
  private begin(resolve: (load: LocalLoad) => void, reject: (err: Error) => void): void {
    if (this.closed) return reject(new Error('the local config loader is closed'));
    const first = this.first;
    if (first !== null) {
      this.first = null;
      this.loads++;
      const load: InFlight = { worker: null, resolve, reject, settled: false };
      this.inFlight = load;
      return this.onMessage(load, first);
    }
    const data: LocalWorkerData = { localXdsPath: this.localXdsPath, localXds: this.localXds, reload: this.loads++ > 0 };
    const worker = new Worker(new URL('./local-worker.js', import.meta.url), { workerData: data });
    const load: InFlight = { worker, resolve, reject, settled: false };
    this.inFlight = load;
    worker.on('message', (m: FromWorker) => this.onMessage(load, m));
    worker.on('error', (err: Error) => this.end(load, new Error(`the local config worker failed: ${err.message}`, { cause: err })));
    worker.on('exit', (code) => this.end(load, new Error(`the local config worker exited (code ${code})`)));
  }

  /** The last load was applied (the dataplane took its document). */
  commit(): void {
    this.ticket = null;
  }

  /** The last load was not applied: its document is dropped. */
  discard(): void {
    // The dataplane takes a document when it applies it; one that was not applied would stay held.
    if (this.ticket !== null) localDiscard(this.ticket);
    this.ticket = null;
  }

  /** Ends a load in flight (it rejects); later loads reject. A load already resolved has ended its worker. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.first?.op === 'loaded') localDiscard(this.first.ticket);
    this.first = null;
    const load = this.inFlight;
    if (load !== null && !load.settled) {
      this.end(load, new Error('the local config loader is closed'));
      await load.worker?.terminate();
    }
  }

  private onMessage(load: InFlight, m: FromWorker): void {
    switch (m.op) {
      case 'loaded':
        if (load.settled || this.closed) {
          // Closed while its answer was on its way: the dataplane would hold its document.
          localDiscard(m.ticket);
          return;
        }
        load.settled = true;
        this.ticket = m.ticket;
        load.resolve({ source: m.source, counts: m.counts, ticket: m.ticket, chunks: m.chunks });
        return;
      case 'invalid':
        this.end(load, new LocalConfigError(m.message));
        return;
      case 'failed':
        this.end(load, new Error(`cannot load the local config: ${m.message}`));
        return;
    }
  }

  /** The worker ended or failed: a load not settled yet rejects with `err`. */
  private end(load: InFlight, err: Error): void {
    if (this.inFlight === load) this.inFlight = null;
    if (load.settled) return;
    load.settled = true;
    load.reject(err);
  }
}
