// The policy preview's parsing and compiling, on a worker thread started for each request (authz-preview.ts): off
// the main thread, a 1 MiB candidate's 0.3 s of YAML, schema and compiler work does not hold up readiness, metrics
// and admin, its few hundred MiB of garbage die with this thread (issue 29), and the schema (zod) never loads on the
// daemon's main thread.
//
// Protocol: started with { body, query } (workerData); answers one message and ends:
//   { ok: true, request }                 the dataplane's preview request
//   { ok: false, invalid: true, message } the caller's mistake (a LocalConfigError: what is wrong, and where)
//   { ok: false, invalid: false, message } anything else
import { parentPort, workerData } from 'node:worker_threads';
import { parsePolicyCandidates } from '../config/local.js';
import { LocalConfigError } from '../errors.js';
import type { AuthzPreviewRequest } from '../native/types.js';
import { compilePolicy } from '../policy/compile.js';

/** The request body → the dataplane's request; throws LocalConfigError (what is wrong, and where) on bad input. */
export function previewRequest(body: string, query: URLSearchParams): AuthzPreviewRequest {
  const { policies, selects } = parsePolicyCandidates(body, 'request body');
  const request: AuthzPreviewRequest = { policies: policies.map(compilePolicy), selects };
  const limit = query.get('limit');
  if (limit !== null) {
    if (!/^\d{1,9}$/.test(limit)) throw new LocalConfigError(`limit: ${JSON.stringify(limit)} is not a count`);
    request.limit = Number(limit);
  }
  return request;
}

if (parentPort !== null) {
  const { body, query } = workerData as { body: string; query: string };
  try {
    parentPort.postMessage({ ok: true, request: previewRequest(body, new URLSearchParams(query)) });
  } catch (err) {
    parentPort.postMessage({ ok: false, invalid: err instanceof LocalConfigError, message: err instanceof Error ? err.message : String(err) });
  }
}
