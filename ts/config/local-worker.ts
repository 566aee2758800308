// The local config worker thread: reads, parses, validates and diffs the local config OFF the main thread. A 50 MiB
// file (100k workloads) is about a minute of YAML parsing and validation on a busy core; on the main thread that
// minute is a minute in which readiness, metrics and admin do not answer. Started and spoken to by
// local-loader.ts; runs the same code as an in-thread load (local.ts), so every error message is the same.
//
// Invariants:
// - The whole document is validated before anything is sent: a refused document sends only `invalid`, so the
//   main thread applies nothing of it.
// - The worker keeps the last COMMITTED document, as the stable JSON of each resource by key (what snapshotChange
//   compares, in less memory than the objects), and sends the change from it to the new one, so a reload
//   costs the main thread only what changed. `commit` makes the last load the base of the next diff; `discard` (the
//   main thread could not apply it) keeps the previous base.
// - The change crosses as the dataplane's own deltas (native workloads and services, compiled policies), UTF-8 JSON
//   in transferred buffers, one message per chunk (ts/state/chunks.ts): the main thread never parses them, it hands
//   them to the dataplane (`applyStateBatches`, which parses, validates and applies them as one, off the JS thread).
//   Only the policy part crosses as written (small), for the main thread's policy index and config_dump. The raw
//   document crosses as a buffer too.
//
// Protocol, one load at a time:
//   main → worker  { op: 'load', reload }  (reload: an empty file is refused, not an empty config)
//   worker → main  { op: 'chunk', json } (one or more, in apply order), then { op: 'loaded', source, counts, raw,
//                   policies }
//              or  { op: 'invalid', message }   (a LocalConfigError: file, path, problem)
//              or  { op: 'failed', message }    (anything else)
//   main → worker  { op: 'commit' } | { op: 'discard' }
import { parentPort, workerData } from 'node:worker_threads';
import { LocalConfigError } from '../errors.js';
import { compilePolicy } from '../policy/compile.js';
import { splitChange } from '../state/chunks.js';
import { toNativeService, toNativeWorkload } from '../state/model.js';
import { diffKept, EMPTY_KEPT, type Kept } from '../state/store.js';
import { loadLocalConfig } from './local.js';

/** What the worker is started with (workerData). */
export interface LocalWorkerData {
  localXdsPath: string | null;
  localXds: string | null;
}

export type ToWorker = { op: 'load'; reload: boolean } | { op: 'commit' } | { op: 'discard' };

export interface LoadedCounts {
  workloads: number;
  services: number;
  policies: number;
}

export type FromWorker =
  | { op: 'chunk'; json: Uint8Array }
  | { op: 'loaded'; source: string; counts: LoadedCounts; raw: Uint8Array; policies: Uint8Array }
  | { op: 'invalid'; message: string }
  | { op: 'failed'; message: string };

if (parentPort !== null) {
  const port = parentPort;
  const source = workerData as LocalWorkerData;
  let committed: Kept = EMPTY_KEPT;
  let pending: Kept | null = null;
  const post = (m: FromWorker, transfer: ArrayBuffer[] = []) => port.postMessage(m, transfer);
  const utf8 = new TextEncoder();

  port.on('message', (m: ToWorker) => {
    switch (m.op) {
      case 'load':
        void load(m.reload);
        return;
      case 'commit':
        if (pending !== null) committed = pending;
        pending = null;
        return;
      case 'discard':
        pending = null;
        return;
    }
  });

  async function load(reload: boolean): Promise<void> {
    try {
      const next = await loadLocalConfig(source, { reload });
      if (next === null) throw new Error('no local config is configured');
      const { change, kept } = diffKept(committed, next);
      for (const chunk of splitChange(change)) {
        const native = {
          workloads: chunk.workloads?.map(toNativeWorkload),
          removedWorkloads: chunk.removedWorkloads,
          services: chunk.services?.map(toNativeService),
          removedServices: chunk.removedServices,
          policies: chunk.policies?.map(compilePolicy),
          removedPolicies: chunk.removedPolicies,
        };
        const json = utf8.encode(JSON.stringify(native));
        post({ op: 'chunk', json }, [json.buffer as ArrayBuffer]);
      }
      pending = kept;
      const raw = utf8.encode(JSON.stringify(next.raw));
      const policies = utf8.encode(JSON.stringify({ upserts: change.policies ?? [], removed: change.removedPolicies ?? [] }));
      const counts = { workloads: next.workloads.length, services: next.services.length, policies: next.policies.length };
      post({ op: 'loaded', source: next.source, counts, raw, policies }, [raw.buffer as ArrayBuffer, policies.buffer as ArrayBuffer]);
    } catch (err) {
      if (err instanceof LocalConfigError) post({ op: 'invalid', message: err.message });
      else post({ op: 'failed', message: err instanceof Error ? err.message : String(err) });
    }
  }
}
