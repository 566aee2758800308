// Readiness from the first moment. Loading the daemon's modules takes about a second (gRPC, the generated protobuf
// code, the schemas); until something listens on READINESS_ADDR the kubelet's probe is refused instead of answered,
// where ztunnel answers 500 from its start. The command's entry binds the readiness address before that (this module
// imports only node:http and small helpers), answering "not ready" with the tasks the daemon is about to register;
// the daemon then takes the listening server over (`takeEarlyReadiness`) and answers from its own readiness.
import type { Server, IncomingMessage, ServerResponse } from 'node:http';
import { parseSocketAddress, type SocketAddress } from '../config/address.js';
import { renderReadiness } from '../lifecycle/readiness.js';
import { MAX_HTTP_CONNECTIONS, createHttpServer, pathOf, reply } from './http.js';

/** What the daemon registers at start (lifecycle/servers.ts): pending until it takes over. */
export const STARTING_TASKS = ['state manager', 'certificates', 'proxy'] as const;

let early: { server: Server; addr: SocketAddress; bound: Promise<boolean> } | null = null;

/** The readiness route, answered from `pending()`. */
export function readinessHandler(pending: () => readonly string[]): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    if (pathOf(req) !== '/healthz/ready') return reply(res, 404, 'not found\n');
    if (req.method !== 'GET') return reply(res, 405, 'method not allowed\n');
    const { status, body } = renderReadiness(pending());
    reply(res, status, body);
  };
}

/**
 * Binds the readiness address the daemon will use, when it can be told from the environment alone (no flags: a
 * flag may change it, and the daemon then binds as usual). Any failure is left to the daemon to report.
 */
export function bindEarlyReadiness(env: Readonly<Record<string, string | undefined>>, args: readonly string[]): void {
  if (early !== null || args.some((a) => a.startsWith('-'))) return;
  const mode = (env.PROXY_MODE ?? 'shared').toLowerCase();
  const text = env.READINESS_ADDR ?? (mode === 'local' ? '127.0.0.1:15021' : '0.0.0.0:15021');
  const addr = parseSocketAddress(text);
  if (typeof addr === 'string' || addr.port === 0) return;
  const server = createHttpServer(readinessHandler(() => STARTING_TASKS));
  server.maxConnections = MAX_HTTP_CONNECTIONS.readiness;
  const bound = new Promise<boolean>((resolve) => {
    server.once('listening', () => resolve(true));
    server.once('error', () => resolve(false)); // e.g. the address is taken: the daemon's own bind reports it
  });
  server.listen({ host: addr.host, port: addr.port });
  server.unref(); // never what keeps the process alive
  early = { server, addr, bound };
}

/**
 * The early server, if it listens on `addr`, now answering `handler`; else null (closed if it listens elsewhere).
 * Waits for a bind still in progress.
 */
export async function takeEarlyReadiness(
  addr: SocketAddress,
  handler: (req: IncomingMessage, res: ServerResponse) => void,
): Promise<Server | null> {
  const e = early;
  early = null;
  if (e === null) return null;
  if (!(await e.bound) || e.addr.host !== addr.host || e.addr.port !== addr.port) {
    if (e.server.listening) e.server.close();
    return null;
  }
  e.server.removeAllListeners('request');
  e.server.on('request', handler);
  e.server.ref();
  return e.server;
}
