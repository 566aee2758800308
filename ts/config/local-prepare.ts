// One load of the local config, as a worker thread runs it (local-worker.ts; the first load of a daemon may run in the
// config worker instead, config-worker.ts): reads and validates the document OFF the main thread. A 50 MiB file
// (100k workloads) is seconds of parsing; on the main thread those would be seconds in which readiness, metrics and
// admin do not answer, and the schema (zod) would stay loaded there for good. Spoken to by local-loader.ts.
//
// The document's workloads and services are read by the dataplane (native/mesh/src/state/local.rs, `localPrepare`):
// straight from the YAML into its validated records, judged by their own types, held under a ticket; only the
// policies come back, as written, for the policy schema (local.ts `parseLocalPolicies`) and the policy compiler
// (policy/compile.ts). A refused document comes back as its problems, each with its path (local.ts `prepareLocal`).
//
// Invariants:
// - One worker per load (local-loader.ts starts it and it ends when the load is done): the document's text, its
//   parse, the schema and its objects live and die with it.
// - The whole document is validated before anything is sent: a refused document sends only `invalid`, so the
//   main thread applies nothing of it.
// - The dataplane diffs the document itself: it knows which keys the last applied local document put in its state,
//   and drops what equals what it holds. So every policy of the document crosses, compiled, as the dataplane's own
//   deltas (UTF-8 JSON in transferred buffers); nothing of the document is kept on this side between loads, and its
//   text stays here: config_dump's `staticConfig` is rendered from what the document put in the state.
//
// Protocol (local-worker.ts): started with `LocalWorkerData`;
//   worker → main  { op: 'loaded', source, ticket, chunks, counts }
//              or  { op: 'invalid', message }   (a LocalConfigError: file, path, problem)
//              or  { op: 'failed', message }    (anything else)
import { LocalConfigError } from '../errors.js';
import { compilePolicy } from '../policy/compile.js';
import { splitChange } from '../state/chunks.js';
import { prepareLocal, readLocalText } from './local.js';

/** What the worker is started with (workerData). */
export interface LocalWorkerData {
  localXdsPath: string | null;
  localXds: string | null;
  /** A reload: an empty file is refused, not an empty config. */
  reload: boolean;
}

export interface LoadedCounts {
  workloads: number;
  services: number;
  policies: number;
}

export type FromWorker =
  | {
      op: 'loaded';
      source: string;
      /** The dataplane's ticket for the document's workloads and services. */
      ticket: number;
      /** The document's policies: StateDelta chunks of compiled policies, UTF-8 JSON. */
      chunks: Uint8Array[];
      counts: LoadedCounts;
    }
  | { op: 'invalid'; message: string }
  | { op: 'failed'; message: string };

const utf8 = new TextEncoder();

/**
 * One load: the message the worker posts, and the buffers it transfers. Never rejects (a failure is a message).
 */
export async function prepareLoad(data: LocalWorkerData): Promise<{ message: FromWorker; transfer: ArrayBuffer[] }> {
  try {
    const read = await readLocalText(data, { reload: data.reload });
    if (read === null) throw new Error('no local config is configured');
    const doc = prepareLocal(read.text, read.source);
    const chunks: Uint8Array[] = [];
    for (const chunk of splitChange({ policies: doc.compiled })) {
      if (chunk.policies === undefined) continue;
      chunks.push(utf8.encode(JSON.stringify({ policies: chunk.policies.map(compilePolicy) })));
    }
    const counts = { workloads: doc.workloads, services: doc.services, policies: doc.compiled.length };
    const transfer = chunks.map((c) => c.buffer as ArrayBuffer);
    return { message: { op: 'loaded', source: read.source, ticket: doc.ticket, chunks, counts }, transfer };
  } catch (err) {
    if (err instanceof LocalConfigError) return { message: { op: 'invalid', message: err.message }, transfer: [] };
    return { message: { op: 'failed', message: err instanceof Error ? err.message : String(err) }, transfer: [] };
  }
}
