// Small helpers shared by the admin, stats and readiness servers (plain node:http; no framework for three routes).
import type { IncomingMessage, RequestListener, Server, ServerOptions, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { formatSocketAddress, type SocketAddress } from '../config/address.js';
import { ZtunnelError } from '../errors.js';

/**
 * What every one of the three servers allows a client (README "Limits and overload"): the request headers within 2 s
 * (ztunnel's admin header timeout) and the whole request within 10 s, checked every 250 ms (Node checks every 30 s
 * by default, so a slow client was answered after up to 30 s); an idle keep-alive connection is closed after 5 s.
 */
export const HTTP_HEADERS_TIMEOUT_MS = 2_000;
export const HTTP_REQUEST_TIMEOUT_MS = 10_000;
export const HTTP_KEEPALIVE_TIMEOUT_MS = 5_000;
const HTTP_TIMEOUT_CHECK_MS = 250;

/** Connections each server holds at once (README "Limits and overload"). */
export const MAX_HTTP_CONNECTIONS = { admin: 32, stats: 128, readiness: 128 } as const;
export type ServerName = keyof typeof MAX_HTTP_CONNECTIONS;
/** The share of a server's connections one source address may hold while they wait (a quarter of the cap). */
export const SOURCE_SHARE_DIVISOR = 4;

export function serverOptions(): ServerOptions {
  return {
    headersTimeout: HTTP_HEADERS_TIMEOUT_MS,
    requestTimeout: HTTP_REQUEST_TIMEOUT_MS,
    keepAliveTimeout: HTTP_KEEPALIVE_TIMEOUT_MS,
    connectionsCheckingInterval: HTTP_TIMEOUT_CHECK_MS,
  };
}

/**
 * An HTTP server with `serverOptions()`. node:http is taken with process.getBuiltinModule, never an ESM import: from
 * Node 22 on, importing a builtin from ESM reads every one of its exports, and node:http's lazy `WebSocket`,
 * `CloseEvent` and `MessageEvent` getters then load undici, and with it http2, tls, zlib and the web streams: 66
 * more builtin modules for servers that use none of them, 2.6-2.8 MiB of the idle daemon's RSS on Node 22 and 24
 * (bench/idle-rss.mjs; test/integration/lazy-modules.test.ts keeps undici out).
 */
export function createHttpServer(handler: RequestListener): Server {
  return process.getBuiltinModule('node:http').createServer(serverOptions(), handler);
}

/**
 * Caps `server` at its MAX_HTTP_CONNECTIONS with a fair share per source address, so that a flood of slow or idle
 * connections cannot keep kubelet's probe or Prometheus's scrape out (issue 29; RFC 7766 § 6.2.3's rule for DNS over
 * TCP: when full, close the oldest idle connection first):
 * - a connection waiting for its request (partial or idle keep-alive) may be closed to make room; one whose request
 *   is being answered never is;
 * - a source at its share (a quarter of the cap) makes room among its own connections, the oldest waiting one first;
 * - a full server makes room at the source holding the most connections, closing its oldest waiting one (so a
 *   source with few, a probe's, is the last to lose one);
 * - with no waiting connection to close, the new one is closed at once.
 * Every connection closed this way is reported (`onDrop`: the drop counter, a rate-limited warning).
 */
export function capConnections(server: Server, name: ServerName, onDrop: (name: ServerName) => void): Server {
  const cap = MAX_HTTP_CONNECTIONS[name];
  // Node's own cap (the early readiness server's, admin/early-readiness.ts) would refuse before the fair choice.
  server.maxConnections = Number.POSITIVE_INFINITY;
  const share = Math.max(1, Math.floor(cap / SOURCE_SHARE_DIVISOR));
  // Insertion order is age: the first waiting one found is the oldest.
  const open = new Set<Socket>();
  const bySource = new Map<string, Set<Socket>>();
  const answering = new Set<Socket>();
  const oldestWaiting = (among: Iterable<Socket>): Socket | undefined => {
    for (const s of among) if (!answering.has(s)) return s;
    return undefined;
  };
  const makeRoom = (among: Iterable<Socket>): boolean => {
    const victim = oldestWaiting(among);
    if (victim === undefined) return false;
    forget(victim);
    victim.destroy();
    onDrop(name);
    return true;
  };
  /** The connections of the source that holds the most with one of them waiting (oldest connection breaks ties). */
  const heaviestWaiting = (): Iterable<Socket> => {
    let best: Set<Socket> | undefined;
    for (const mine of bySource.values()) {
      if (best !== undefined && mine.size <= best.size) continue;
      if (oldestWaiting(mine) !== undefined) best = mine;
    }
    return best ?? [];
  };
  const forget = (socket: Socket) => {
    if (!open.delete(socket)) return;
    answering.delete(socket);
    const source = socket.remoteAddress ?? '';
    const mine = bySource.get(source);
    mine?.delete(socket);
    if (mine?.size === 0) bySource.delete(source);
  };
  server.on('connection', (socket: Socket) => {
    const source = socket.remoteAddress ?? '';
    const mine = bySource.get(source);
    const roomAtSource = mine === undefined || mine.size < share || makeRoom(mine) || open.size < cap;
    if (!roomAtSource || (open.size >= cap && !makeRoom(heaviestWaiting()))) {
      socket.destroy();
      onDrop(name);
      return;
    }
    open.add(socket);
    if (mine === undefined) bySource.set(source, new Set([socket]));
    else mine.add(socket);
    socket.once('close', () => forget(socket));
  });
  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    const socket = req.socket;
    if (!open.has(socket)) return;
    answering.add(socket);
    res.once('close', () => answering.delete(socket));
  });
  return server;
}

/** True for the error a handler throws while the dataplane is not open yet: answered 503, as a not-ready service. */
export function notRunning(err: unknown): boolean {
  return err instanceof ZtunnelError && err.code === 'NOT_RUNNING';
}

/**
 * Answer `body`, compressed when the request's Accept-Encoding asks for gzip, br or deflate (as ztunnel's admin and
 * stats servers do, through tower-http's compression layer) and the body is worth it. The compression runs on libuv's
 * thread pool, never on the main thread; node:zlib is loaded at the first compressed answer (the idle daemon does not
 * load it).
 */
export function reply(res: ServerResponse, status: number, body: string, contentType = 'text/plain; charset=utf-8'): void {
  const encoding = Buffer.byteLength(body) >= MIN_COMPRESSED_BYTES ? pickEncoding(res.req?.headers['accept-encoding']) : null;
  if (encoding === null) {
    res.writeHead(status, { 'content-type': contentType, 'content-length': Buffer.byteLength(body) });
    res.end(body);
    return;
  }
  compress(encoding, body).then(
    (bytes) => {
      res.writeHead(status, { 'content-type': contentType, 'content-encoding': encoding, vary: 'accept-encoding', 'content-length': bytes.length });
      res.end(bytes);
    },
    () => {
      // Not compressed after all: the same answer, plain.
      res.writeHead(status, { 'content-type': contentType, vary: 'accept-encoding', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    },
  );
}

/** Bodies below this go plain (tower-http's default predicate: larger than 32 bytes). */
export const MIN_COMPRESSED_BYTES = 32;
export type Encoding = 'gzip' | 'br' | 'deflate';
/** Preferred in this order where the client weighs several the same (gzip first: the fastest of the three here). */
const ENCODINGS: readonly Encoding[] = ['gzip', 'br', 'deflate'];

/** The encoding to answer with for an Accept-Encoding header (RFC 9110 § 12.5.3: highest q, `q=0` refuses, `*`). */
export function pickEncoding(header: string | string[] | undefined): Encoding | null {
  if (header === undefined) return null;
  const q = new Map<string, number>();
  for (const part of (Array.isArray(header) ? header.join(',') : header).split(',')) {
    const [name, ...params] = part.trim().toLowerCase().split(';');
    if (name === undefined || name === '') continue;
    const qp = params.map((p) => p.trim()).find((p) => p.startsWith('q='));
    const weight = qp === undefined ? 1 : Number(qp.slice(2));
    q.set(name, Number.isFinite(weight) ? weight : 0);
  }
  let best: Encoding | null = null;
  let bestQ = 0;
  for (const e of ENCODINGS) {
    const w = q.get(e) ?? q.get('*') ?? 0;
    if (w > bestQ) [best, bestQ] = [e, w];
  }
  return best;
}

function compress(encoding: Encoding, body: string): Promise<Buffer> {
  const zlib = process.getBuiltinModule('node:zlib');
  return new Promise((resolve, reject) => {
    const done = (err: Error | null, out: Buffer) => (err === null ? resolve(out) : reject(err));
    if (encoding === 'gzip') zlib.gzip(body, done);
    else if (encoding === 'deflate') zlib.deflate(body, done);
    // Quality 4, not zlib's default 11: a multi-megabyte config_dump at 11 takes seconds of a pool thread.
    else zlib.brotliCompress(body, { params: { [zlib.constants.BROTLI_PARAM_QUALITY]: 4 } }, done);
  });
}

/**
 * The request's body as UTF-8 text, or null when it is larger than `limit` bytes (then the rest is read and dropped,
 * never held; the server's request timeout bounds how long).
 */
export function readBody(req: IncomingMessage, limit: number): Promise<string | null> {
  return new Promise((resolve, reject) => {
    if (Number(req.headers['content-length'] ?? 0) > limit) {
      req.resume();
      return resolve(null);
    }
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size <= limit) chunks.push(chunk);
      else chunks.length = 0;
    });
    req.on('end', () => resolve(size <= limit ? Buffer.concat(chunks).toString('utf8') : null));
    req.on('error', reject);
  });
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

/** Where a listening server is bound. */
export function boundAddress(server: Server): SocketAddress {
  const bound = server.address() as AddressInfo;
  return { host: bound.address, port: bound.port };
}

/** Listens on `addr`; resolves the bound address ("127.0.0.1:15000"; the real port when `addr.port` is 0). */
export function listen(server: Server, addr: SocketAddress): Promise<SocketAddress> {
  return new Promise((resolve, reject) => {
    const onError = (err: Error) => reject(new Error(`cannot listen on ${formatSocketAddress(addr)}: ${err.message}`, { cause: err }));
    server.once('error', onError);
    server.listen({ host: addr.host, port: addr.port }, () => {
      server.off('error', onError);
      resolve(boundAddress(server));
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
