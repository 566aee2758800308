// Small helpers shared by the admin, stats and readiness servers (plain node:http; no framework for three routes).
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { formatSocketAddress, type SocketAddress } from '../config/address.js';

export function reply(res: ServerResponse, status: number, body: string, contentType = 'text/plain; charset=utf-8'): void {
  res.writeHead(status, { 'content-type': contentType, 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

/** The request path without the query string. */
export function pathOf(req: IncomingMessage): string {
  const url = req.url ?? '/';
  const q = url.indexOf('?');
  return q < 0 ? url : url.slice(0, q);
}

export function queryOf(req: IncomingMessage): URLSearchParams {
  const url = req.url ?? '/';
  const q = url.indexOf('?');
  return new URLSearchParams(q < 0 ? '' : url.slice(q + 1));
}

/** Listens on `addr`; resolves the bound address ("127.0.0.1:15000"; the real port when `addr.port` is 0). */
export function listen(server: Server, addr: SocketAddress): Promise<SocketAddress> {
  return new Promise((resolve, reject) => {
    const onError = (err: Error) => reject(new Error(`cannot listen on ${formatSocketAddress(addr)}: ${err.message}`, { cause: err }));
    server.once('error', onError);
    server.listen({ host: addr.host, port: addr.port }, () => {
      server.off('error', onError);
      const bound = server.address() as AddressInfo;
      resolve({ host: bound.address, port: bound.port });
    });
  });
}

/**
 * Stops accepting, lets in-flight requests finish, and drops idle keep-alive connections so close() can
 * complete; whatever is still open after `graceMs` is cut.
 */
export function closeServer(server: Server, graceMs = 1_000): Promise<void> {
  if (!server.listening) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => server.closeAllConnections(), graceMs);
    timer.unref();
    server.close(() => {
      clearTimeout(timer);
      resolve();
    });
    server.closeIdleConnections();
  });
}
