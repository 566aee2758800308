// POST /debug/authz/preview: the policy impact preview. The body holds candidate policies as a user has them (the
// local config's policy form, string matches in either YAML dialect, or JSON); they are parsed by the local config's
// schema and compiled by the policy compiler in a worker thread (preview-worker.ts), and handed to the dataplane,
// which judges this node's live inbound connections and recent denied attempts with them laid over its policies,
// without applying them (native/dataplane/src/preview.rs). The admin server routes here after its method and CSRF
// checks.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { LocalConfigError, ZtunnelError } from '../errors.js';
import type { AuthzPreview, AuthzPreviewRequest } from '../native/types.js';
import { workerAnswer } from '../worker-answer.js';
import { notRunning, queryOf, readBody, reply } from './http.js';

/** Candidate policies are a few KiB; a whole namespace's worth fits many times over. */
export const PREVIEW_BODY_LIMIT = 1 << 20;

export const PREVIEW_HELP = `usage: POST /debug/authz/preview[?limit=<n>] with a body of candidate policies (YAML or JSON):
  one policy as the local config writes it, a list of them, or { policies: [...], selects: { "<ns>/<name>": [<uid>, ...] } }
  (selects: the workloads a new WorkloadSelector policy is to select; those naming it already are selected anyway).
Answers what applying them would do here: the live inbound connections they would close, the recent denied attempts
they would allow. Nothing is applied. A dry-run candidate is judged as if enforced.
`;

/**
 * The dataplane's request from a body, made on a worker thread (preview-worker.ts `previewRequest`) whatever the
 * body's size: a 1 MiB candidate is about 0.3 s of YAML, schema and compiler work in which readiness, metrics and
 * admin would not answer here, and the schema (zod, ~4 MiB of heap) would stay loaded on this thread for good once
 * used. Rejects with a LocalConfigError on bad input.
 */
async function previewRequestOffThread(body: string, query: URLSearchParams): Promise<AuthzPreviewRequest> {
  type Answer = { ok: true; request: AuthzPreviewRequest } | { ok: false; invalid: boolean; message: string };
  const url = new URL('./preview-worker.js', import.meta.url);
  const m = await workerAnswer<Answer>(url, { body, query: query.toString() }, 'preview');
  if (m.ok) return m.request;
  throw m.invalid ? new LocalConfigError(m.message) : new Error(m.message);
}

/**
 * Whether a preview is being read, parsed or judged. One at a time, as profiles (409 otherwise): a 1 MiB candidate
 * costs the main thread about 0.3 s and a few hundred MiB while it is parsed, and eight at once stalled it 0.9 s
 * (issue 29); a second waits for its turn at the client's, not the daemon's, expense.
 */
let previewing = false;

/** Reads, parses and answers one preview request; never rejects (every failure is an answer). */
export function servePreview(req: IncomingMessage, res: ServerResponse, preview: (r: AuthzPreviewRequest) => Promise<AuthzPreview>): void {
  if (previewing) {
    req.resume();
    res.setHeader('connection', 'close');
    return reply(res, 409, 'a preview is already being made: ask again when it is done\n');
  }
  previewing = true;
  const query = queryOf(req);
  readBody(req, PREVIEW_BODY_LIMIT)
    .then(async (body) => {
      if (body === null) {
        res.setHeader('connection', 'close');
        return reply(res, 413, `the body is larger than ${PREVIEW_BODY_LIMIT} bytes\n`);
      }
      let request: AuthzPreviewRequest;
      try {
        request = await previewRequestOffThread(body, query);
      } catch (err) {
        if (err instanceof LocalConfigError) return reply(res, 400, `${err.message}\n\n${PREVIEW_HELP}`);
        throw err;
      }
      const answer = await preview(request);
      reply(res, 200, `${JSON.stringify(answer, null, 2)}\n`, 'application/json');
    })
    .then(undefined, (err: unknown) => {
      // The dataplane refusing a candidate (INVALID_STATE names the policy and the field) or the request
      // (INVALID_SPEC: a selects entry) is the caller's to fix; anything else is ours.
      const theirs = err instanceof ZtunnelError && (err.code === 'INVALID_STATE' || err.code === 'INVALID_SPEC');
      const message = err instanceof Error ? err.message : String(err);
      if (res.headersSent) return;
      if (notRunning(err)) return reply(res, 503, `${message}\n`);
      reply(res, theirs ? 400 : 500, `${theirs ? message : `preview failed: ${message}`}\n`);
    })
    .finally(() => (previewing = false));
}
