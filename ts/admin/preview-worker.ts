// The policy preview's parsing and compiling OFF the main thread, for a large body (authz-preview.ts): a 1 MiB
// candidate is about 0.3 s of YAML, schema and compiler work, in which readiness, metrics and admin would not answer
// on the main thread, and a few hundred MiB of garbage that dies with this thread (issue 29).
//
// Protocol: started with { body, query } (workerData); answers one message and ends:
//   { ok: true, request }                 the dataplane's preview request
//   { ok: false, invalid: true, message } the caller's mistake (a LocalConfigError: what is wrong, and where)
//   { ok: false, invalid: false, message } anything else
import { parentPort, workerData } from 'node:worker_threads';
import { LocalConfigError } from '../errors.js';
import { previewRequest } from './authz-preview.js';

const { body, query } = workerData as { body: string; query: string };
try {
  parentPort?.postMessage({ ok: true, request: previewRequest(body, new URLSearchParams(query)) });
} catch (err) {
  parentPort?.postMessage({ ok: false, invalid: err instanceof LocalConfigError, message: err instanceof Error ? err.message : String(err) });
}
