// One load of the local config, as a worker thread runs it (local-worker.ts; the first load of a daemon may run in the
// config worker instead, config-worker.ts): reads and validates the document OFF the main thread. A 50 MiB file
// (100k workloads) is seconds of parsing; on the main thread those would be seconds in which readiness, metrics and
// admin do not answer, and the schema (zod) would stay loaded there for good. Spoken to by local-loader.ts.
//
// Two ways to read a document, one result:
// - **Fast** (native/mesh/src/state/local.rs, `localPrepare`): the dataplane reads the YAML straight into its
//   validated workloads and services and holds them under a ticket; only the policies come back, as written, for the
//   schema (local.ts `parseLocalPolicies`) and the policy compiler (policy/compile.ts).
// - **Slow** (local.ts `parseLocalConfig`): when the fast path declines (a problem, or something it does not model),
//   the whole document goes through the schema, which refuses it with the file, the path and the problem, or accepts
//   it: its workloads and services are then handed to the dataplane as JSON (`localPrepareRecords`) and held the same
//   way. Every error message is the schema's.
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
//   worker → main  { op: 'loaded', source, ticket, chunks, counts, fast }
//              or  { op: 'invalid', message }   (a LocalConfigError: file, path, problem)
//              or  { op: 'failed', message }    (anything else)
import { LocalConfigError, ZtunnelError } from '../errors.js';
import { localDiscard, localPrepare, localPrepareRecords } from '../native/index.js';
import { compilePolicy } from '../policy/compile.js';
import type { Policy } from '../state/model.js';
import { splitChange } from '../state/chunks.js';
import { parseLocalConfig, parseLocalPolicies, readLocalText } from './local.js';

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
      /** Whether the fast path read it (false: the schema's slow way). */
      fast: boolean;
    }
  | { op: 'invalid'; message: string }
  | { op: 'failed'; message: string };

const utf8 = new TextEncoder();

/** The document's workloads and services held by the dataplane, and its policies, read the fast way or the slow. */
function prepare(text: Buffer, name: string): { ticket: number; workloads: number; services: number; policies: Policy[]; fast: boolean } {
  const fast = localPrepare(text);
  if ('ticket' in fast) {
    try {
      return { ticket: fast.ticket, workloads: fast.workloads, services: fast.services, policies: parseLocalPolicies(fast.policies, name), fast: true };
    } catch (err) {
      localDiscard(fast.ticket);
      if (!(err instanceof LocalConfigError)) throw err;
      // Falls through to the slow way, which reports the same problems (and would only differ if the two disagreed).
    }
  }
  const doc = parseLocalConfig(text.toString('utf8'), name);
  const records = utf8.encode(JSON.stringify({ workloads: doc.workloads, services: doc.services }));
  let ticket: number;
  try {
    ticket = localPrepareRecords(records);
  } catch (err) {
    // Accepted by the schema, refused by the dataplane's validation: still a problem of the file.
    if (err instanceof ZtunnelError) throw new LocalConfigError(`${name}: ${err.message}`, { cause: err });
    throw err;
  }
  return { ticket, workloads: doc.workloads.length, services: doc.services.length, policies: doc.policies, fast: false };
}

/**
 * One load: the message the worker posts, and the buffers it transfers. Never rejects (a failure is a message).
 */
export async function prepareLoad(data: LocalWorkerData): Promise<{ message: FromWorker; transfer: ArrayBuffer[] }> {
  try {
    const read = await readLocalText(data, { reload: data.reload });
    if (read === null) throw new Error('no local config is configured');
    const doc = prepare(read.text, read.source);
    const chunks: Uint8Array[] = [];
    for (const chunk of splitChange({ policies: doc.policies })) {
      if (chunk.policies === undefined) continue;
      chunks.push(utf8.encode(JSON.stringify({ policies: chunk.policies.map(compilePolicy) })));
    }
    const counts = { workloads: doc.workloads, services: doc.services, policies: doc.policies.length };
    const transfer = chunks.map((c) => c.buffer as ArrayBuffer);
    return { message: { op: 'loaded', source: read.source, ticket: doc.ticket, chunks, counts, fast: doc.fast }, transfer };
  } catch (err) {
    if (err instanceof LocalConfigError) return { message: { op: 'invalid', message: err.message }, transfer: [] };
    return { message: { op: 'failed', message: err instanceof Error ? err.message : String(err) }, transfer: [] };
  }
}
