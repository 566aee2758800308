// The admin server (ADMIN_ADDR, default 127.0.0.1:15000; local-only because it can stop the proxy).
// Routes and answers follow ztunnel's admin API so istioctl and existing runbooks keep working.
import type { IncomingMessage, Server } from 'node:http';
import { isIP } from 'node:net';
import { formatLogFilter, parseLogFilter } from '../log/filter.js';
import type { Logs } from '../log/logger.js';
import type { AuthorizeExplanation, AuthorizeRequest, AuthzPreview, AuthzPreviewRequest } from '../native/types.js';
import type { Dashboard } from './dashboard.js';
import { createHttpServer, notRunning, pathOf, queryOf, reply } from './http.js';
import { serveCpuProfile, serveHeapProfile, serveHeapProfiling } from './pprof.js';

export interface AdminHandlers {
  /** The whole /config_dump document, keys in output order. */
  configDump(): Promise<Record<string, unknown>> | Record<string, unknown>;
  /** Starts a graceful shutdown; must return promptly (the reply is sent after it returns). */
  quit(reason: string): void;
  logs: Logs;
  /** Explain an authorization decision with the dataplane's own evaluation (absent: 503). */
  authorize?(req: AuthorizeRequest): AuthorizeExplanation;
  /** The policy impact preview of candidate policies, judged by the dataplane without applying them (absent: 503). */
  previewAuthz?(req: AuthzPreviewRequest): Promise<AuthzPreview>;
  /** The process's CPU profile, pprof protobuf (the dataplane samples it; absent: 503). */
  cpuProfile?(seconds: number, frequency: number): Promise<Uint8Array>;
  /** Stops the profile being taken (its requester went away). */
  cancelCpuProfile?(): void;
  /** Turns the heap profile's sampling on or off; returns whether it is on (absent: 503). */
  heapProfiling?(activate: boolean): boolean;
  /** The dataplane's live sampled allocations, pprof protobuf (absent: 503). */
  heapProfile?(): Promise<Uint8Array>;
  /** The live dashboard (dashboard.ts): its page and its events stream (absent: 404). */
  dashboard?: Pick<Dashboard, 'serve'>;
}

const ENDPOINTS: ReadonlyArray<[string, string]> = [
  ['/config_dump', 'dump the current state: workloads, services, policies, certificates, config, version'],
  ['/logging', 'POST: show the log filter; ?level=<level> or ?level=<target>=<level>,... to change it; ?reset'],
  ['/quitquitquit', 'POST: start a graceful shutdown'],
  ['/debug/authorize', '?src_identity=<spiffe id>&src_ip=<ip>&dst=<ip:port>: the L4 authorization decision and why'],
  ['/debug/authz/preview', 'POST candidate policies (YAML or JSON): the live connections they would close and the recent denials they would allow, without applying them'],
  ['/debug/pprof/profile', '?seconds=<1-300, default 10>&frequency=<1-1000, default 100>: a CPU profile of the process (pprof protobuf)'],
  ['/debug/pprof/heap/profiling', '?activate=true|false: turn the heap profile\'s sampling on or off'],
  ['/debug/pprof/heap', "the dataplane's live sampled allocations (pprof protobuf; sampling must be on)"],
  ['/dashboard', 'a live view of this node: workloads, connections and their identities, authorization decisions, throughput, certificates'],
];

const AUTHORIZE_HELP =
  'usage: GET /debug/authorize?dst=<workload ip:port>[&src_ip=<ip>][&src_identity=<spiffe://...>] (no identity = plaintext)\n';

/** Parse /debug/authorize's query. Returns the request, or the problem. */
export function authorizeRequest(q: URLSearchParams): AuthorizeRequest | string {
  const dst = q.get('dst');
  if (dst === null || dst === '') return `dst is required\n${AUTHORIZE_HELP}`;
  const srcIdentity = q.get('src_identity') ?? q.get('srcIdentity') ?? '';
  const srcIp = q.get('src_ip') ?? q.get('srcIp') ?? '0.0.0.0';
  return srcIdentity === '' ? { srcIp, dst } : { srcIdentity, srcIp, dst };
}

const LOGGING_HELP =
  'usage: POST /logging[?level=<off|error|warn|info|debug|trace> | ?level=<target>=<level>,... | ?reset]\n';

function indexHtml(): string {
  const rows = ENDPOINTS.map(([path, what]) => `<li><a href="${path}">${path}</a>: ${what}</li>`).join('\n');
  return `<!doctype html>\n<html><head><title>ztunnel-node admin</title></head><body>\n<h1>ztunnel-node admin</h1>\n<ul>\n${rows}\n</ul>\n</body></html>\n`;
}

export function createAdminServer(h: AdminHandlers): Server {
  const server = createHttpServer((req, res) => {
    const path = pathOf(req);
    // Every request names the admin by address: a DNS-rebinding page, which reaches it under its own host name, is
    // answered nothing (not even a GET: config_dump and the dashboard show the node's whole mesh).
    const badHost = hostRefusal(req);
    if (badHost !== null) return reply(res, 403, badHost);
    switch (path) {
      case '/':
        return reply(res, 200, indexHtml(), 'text/html; charset=utf-8');
      case '/config_dump':
        Promise.resolve()
          .then(() => h.configDump())
          .then(
            (dump) => reply(res, 200, `${JSON.stringify(dump, null, 2)}\n`, 'application/json'),
            (err: unknown) => reply(res, 500, `config dump failed: ${err instanceof Error ? err.message : String(err)}\n`),
          );
        return;
      case '/quitquitquit': {
        if (req.method !== 'POST') return reply(res, 405, 'Invalid HTTP method\n');
        const refused = notFromAnOperator(req);
        if (refused !== null) return reply(res, 403, refused);
        reply(res, 200, 'shutdown now\n');
        h.quit('admin /quitquitquit');
        return;
      }
      case '/debug/pprof/profile': {
        if (h.cpuProfile === undefined) return reply(res, 503, 'profiling is not available\n');
        // A GET that starts work (the process sampled for up to 300 s, symbols read after): an operator's request,
        // never a web page's.
        const refused = notFromAnOperator(req);
        if (refused !== null) return reply(res, 403, refused);
        return serveCpuProfile(queryOf(req), res, h.cpuProfile, h.cancelCpuProfile);
      }
      case '/debug/pprof/heap/profiling': {
        if (h.heapProfiling === undefined) return reply(res, 503, 'profiling is not available\n');
        // It changes what the process does on every allocation: an operator's request, never a web page's.
        const refused = notFromAnOperator(req);
        if (refused !== null) return reply(res, 403, refused);
        return serveHeapProfiling(queryOf(req), res, h.heapProfiling);
      }
      case '/debug/pprof/heap': {
        if (h.heapProfile === undefined) return reply(res, 503, 'profiling is not available\n');
        const refused = notFromAnOperator(req);
        if (refused !== null) return reply(res, 403, refused);
        return serveHeapProfile(res, h.heapProfile);
      }
      case '/debug/authorize': {
        if (req.method !== 'GET') return reply(res, 405, AUTHORIZE_HELP);
        if (h.authorize === undefined) return reply(res, 503, 'authorization is not available\n');
        const r = authorizeRequest(queryOf(req));
        if (typeof r === 'string') return reply(res, 400, r);
        try {
          return reply(res, 200, `${JSON.stringify(h.authorize(r), null, 2)}\n`, 'application/json');
        } catch (err) {
          return reply(res, notRunning(err) ? 503 : 400, `${err instanceof Error ? err.message : String(err)}\n`);
        }
      }
      case '/dashboard':
      case '/dashboard/events':
        if (h.dashboard === undefined) return reply(res, 404, 'Not found\n');
        return h.dashboard.serve(req, res, path, notFromAnOperator(req));
      case '/debug/authz/preview': {
        // Loaded with its first request: it parses candidates with the local config's schema, which the daemon's
        // main thread otherwise loads only to read a small local config (config/local-loader.ts).
        const previewAuthz = h.previewAuthz;
        import('./authz-preview.js').then(
          ({ PREVIEW_HELP, servePreview }) => {
            if (req.method !== 'POST') return reply(res, 405, PREVIEW_HELP);
            const refused = notFromAnOperator(req);
            if (refused !== null) return reply(res, 403, refused);
            if (previewAuthz === undefined) return reply(res, 503, 'authorization is not available\n');
            servePreview(req, res, previewAuthz);
          },
          (err: unknown) => reply(res, 500, `preview failed: ${err instanceof Error ? err.message : String(err)}\n`),
        );
        return;
      }
      case '/logging': {
        const refused = req.method === 'POST' ? notFromAnOperator(req) : null;
        if (refused !== null) return reply(res, 403, refused);
        return logging(h.logs, req.method, queryOf(req), (status, body) => reply(res, status, body));
      }
      default:
        return reply(res, 404, 'Not found\n');
    }
  });
  return server;
}

/**
 * Why a mutating request (POST /quitquitquit, /logging) is refused, or null. The admin port has no credentials, so
 * a web page must not be able to drive it: a browser marks its cross-site requests (Origin other than the admin's
 * own, Sec-Fetch-Site other than same-origin/none), and a DNS-rebinding page reaches it with its own host name in
 * Host, where operators' tools (curl, istioctl, kubectl port-forward) send an IP address or localhost.
 */
export function notFromAnOperator(req: IncomingMessage): string | null {
  const badHost = hostRefusal(req);
  if (badHost !== null) return badHost;
  const host = req.headers.host ?? '';
  const origin = req.headers.origin;
  if (origin !== undefined && origin !== `http://${host}`) return `refused: a cross-origin request (Origin ${origin})\n`;
  const site = req.headers['sec-fetch-site'];
  if (site !== undefined && site !== 'same-origin' && site !== 'none') return `refused: a ${site} request\n`;
  return null;
}

/** Why a request's Host is refused (it is not an IP address or localhost: a DNS name, as a rebinding page's), or null. */
export function hostRefusal(req: IncomingMessage): string | null {
  const host = req.headers.host ?? '';
  const hostname = host.startsWith('[') ? host.slice(1, host.indexOf(']')) : host.replace(/:\d+$/, '');
  return hostname === 'localhost' || isIP(hostname) !== 0 ? null : `refused: Host ${JSON.stringify(host)} is not an IP address or localhost\n`;
}

function logging(logs: Logs, method: string | undefined, query: URLSearchParams, send: (status: number, body: string) => void): void {
  if (method !== 'POST') return send(405, LOGGING_HELP);
  if (query.has('reset')) {
    logs.reset();
  } else if (query.has('level')) {
    const value = query.get('level') ?? '';
    // A bare level replaces the filter (like RUST_LOG=debug); target directives are added to the current one.
    const replaces = value.split(',').some((d) => d.trim() !== '' && !d.includes('='));
    const next = parseLogFilter(value, replaces ? undefined : logs.filter());
    if (typeof next === 'string') return send(400, `invalid level: ${next}\n${LOGGING_HELP}`);
    logs.setFilter(next);
  }
  send(200, `current log level is ${formatLogFilter(logs.filter())}\n`);
}
