// Real TCP servers and clients for the integration suites: the applications behind the proxies (echo, sink then
// report, greet then close, count), SOCKS5 clients that go through a workload's entry, and polling.
//
// UNIQUE ADDRESSES. node --test runs each file in its own process, two at a time, so two files must never bind the
// same address. Every test FILE owns one 127.<N>.0.0/16 block (any 127.0.0.0/8 address binds on Linux without
// root), and everything it starts lives in that block:
//
//   N   file                                   what lives there
//   11  test/integration/tunnel.test.ts        workloads 127.11.{1,2}.10, daemons' admin 127.11.255.{1,2}
//   12  test/integration/hbone-peer.test.ts    workloads 127.12.{1..5}.10 (4: a relay to 5), daemon's admin 127.12.255.1
//   13  test/integration/tls-refusals.test.ts  workloads 127.13.{1,2,3}.10, daemon's admin 127.13.255.1
//   14  test/integration/config-errors.test.ts daemons that must fail before binding: 127.14.255.1
//   15  test/integration/lifecycle.test.ts     workloads 127.15.{1,2}.10, daemons' admin 127.15.255.{1,2}
//   17  test/integration/authz.test.ts         workloads 127.17.{1,2}.10, daemons' admin 127.17.255.{1,2}
//       (the demo it runs uses the fixed 127.0.{1,2}.10 of examples/demo.yaml; nothing else uses 127.0.x.x)
//   18  test/integration/bench-harness.test.ts the bench harness's smoke run (bench/harness/topologies.mjs layout:
//                                              workloads 127.18.{1,2}.x, Envoys 127.18.{3,4}.1, admin 127.18.255.x,
//                                              new-tunnel source workloads from 127.18.10.1)
//   60  test/integration/xds.test.ts          workloads 127.60.{1..4}.10, VIPs 127.60.100.x, admin 127.60.255.{1,2}
//   61  test/integration/xds-ca.test.ts       workloads 127.61.{1,2,3}.10, daemons' admin 127.61.255.{1,2}
//   62  test/integration/authz-push-order.test.ts  workloads 127.62.{1,2,3}.10, daemons' admin 127.62.255.{1,2}
//   63  test/integration/large-input.test.ts  daemon's admin 127.63.255.1 (its workloads are 10.x: state only)
//   64  test/integration/waypoint-envoy.test.ts  workloads 127.64.{1,2,4}.10, Envoy waypoint 127.64.3.10, VIPs
//                                              127.64.100.x, admin 127.64.255.{1,2} (daemons), 127.64.255.3 (Envoy)
//   65  test/integration/inbound-tunnel.test.ts  workloads 127.65.{1..5}.10, VIPs 127.65.100.x, admin 127.65.255.{1,2};
//                                              and 127.0.0.1:15088, its PROXY application tunnel (loopback by design)
//   66  test/integration/double-hbone.test.ts  workloads 127.66.{1,2,4}.10, Envoy E/W gateway 127.66.3.10, VIPs
//                                              127.66.100.x, admin 127.66.255.{1,2} (daemons), 127.66.255.3 (Envoy)
//   67  test/integration/dns.test.ts          client workloads 127.67.1.{10,11} (their DNS proxies on :15053),
//                                              remote endpoints 127.67.2.x, VIPs 127.67.100.x, admin 127.67.255.1
//   68  test/integration/overload.test.ts     workload 127.68.1.10 (echo app :8080, a never-accepting :8081),
//                                              daemon's admin 127.68.255.1
//   69  test/integration/buffer-budget.test.ts  workload 127.69.1.10 (an endless sender :8082, echo :8080), relays
//                                              127.69.2.10 (the non-reading clients), daemon's admin 127.69.255.1
//   70  test/unit/early-readiness.test.ts     readiness addresses 127.70.255.{1,2,3} (fixed port 15021)
//   71  test/integration/h2-floods.test.ts    workload 127.71.1.10 (echo app :8080), daemon's admin 127.71.255.1
//   73  test/integration/dashboard.test.ts    workloads 127.73.{1,2}.10 (echo app :8080), daemon's admin 127.73.255.1
//   74  test/integration/authz-preview.test.ts  sources 127.74.{1,2,3}.10, destinations 127.74.{4,5,6}.10
//                                              (echo apps :8080, :9090), daemons' admin 127.74.255.{1,2}
//
// Taken elsewhere: 127.0.0.0/16 (the demo, examples/), 127.50.0.0/16 (bench/). Inside a block, 127.N.255.k is
// node k's admin (15000), stats (15020) and readiness (15021) servers; 127.N.<w>.10 are workload IPs.
import { createHash, type BinaryLike, type Hash } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { connect as tcpConnect, createServer, isIP, type Server, type Socket } from 'node:net';
import type { Duplex, Readable } from 'node:stream';
import { setTimeout as delay } from 'node:timers/promises';
import { encodeConnectRequest, socks5Connect } from '../../dist/cli/socks5-client.js';

export const BLOCKS = Object.freeze({
  tunnel: 11,
  'hbone-peer': 12,
  'tls-refusals': 13,
  'config-errors': 14,
  lifecycle: 15,
  authz: 17,
  'bench-harness': 18,
  xds: 60,
  'xds-ca': 61,
  'authz-push-order': 62,
  'large-input': 63,
  'waypoint-envoy': 64,
  'inbound-tunnel': 65,
  'double-hbone': 66,
  dns: 67,
  overload: 68,
  'buffer-budget': 69,
  'early-readiness': 70,
  'h2-floods': 71,
  'lazy-modules': 72,
  dashboard: 73,
  'authz-preview': 74,
  handover: 75,
  'handover-envoy': 76,
  'socket-keepalive': 77,
  'compressed-answers': 78,
  'tls-policy': 79,
  'authz-logging': 80,
  'dns-only': 81,
  'baggage-labels': 82,
  'crl-live': 83,
  'fake-ca': 84,
  'root-rotation': 85,
  'trust-domains': 86,
  resilience: 87,
  'otlp-export': 88,
});

/** The name of a test file's block in BLOCKS. */
export type BlockName = keyof typeof BLOCKS;

/** The addresses of one file's 127.<N>.0.0/16 block. */
export interface BlockAddresses {
  /** The IP of workload `w` (1, 2, 3...). */
  workload(w: number): string;
  /** The IP the admin/stats/readiness servers of daemon `k` (1, 2...) bind. */
  admin(k: number): string;
}

/** A host and a port: where a server listens, where a client connects. */
export interface HostPort {
  host: string;
  port: number;
}

/** Addresses of one file's block. */
export function block(n: number): BlockAddresses {
  if (!Object.values<number>(BLOCKS).includes(n)) throw new Error(`127.${n}.0.0/16 is not in the table of test/helpers/net.ts`);
  return {
    /** The IP of workload `w` (1, 2, 3...). */
    workload: (w: number) => `127.${n}.${w}.10`,
    /** The IP the admin/stats/readiness servers of daemon `k` (1, 2...) bind. */
    admin: (k: number) => `127.${n}.255.${k}`,
  };
}

export const sha256 = (buf: BinaryLike): string => createHash('sha256').update(buf).digest('hex');

/** Deterministic bytes of any size (cheap; not all zeros, so a misplaced chunk changes the hash). */
export function pattern(size: number, seed = 1): Buffer {
  const out = Buffer.allocUnsafe(size);
  const unit = Buffer.alloc(4096);
  for (let i = 0; i < unit.length; i++) unit[i] = (i * 31 + seed * 17 + (i >> 8)) & 0xff;
  for (let off = 0; off < size; off += unit.length) unit.copy(out, off, 0, Math.min(unit.length, size - off));
  return out;
}

/** `T` without its falsy values: what `waitFor` resolves. */
export type Truthy<T> = Exclude<T, false | 0 | 0n | '' | null | undefined>;

export interface WaitForOptions {
  /** Default 10 s. */
  timeoutMs?: number;
  /** Default 50 ms. */
  intervalMs?: number;
  /** What is waited for, in the time-out's message. Default 'condition'. */
  message?: string;
}

/** Polls `fn` until it returns a truthy value; throws `message` (with the last value) after `timeoutMs`. */
export async function waitFor<T>(
  fn: () => T | PromiseLike<T>,
  { timeoutMs = 10_000, intervalMs = 50, message = 'condition' }: WaitForOptions = {},
): Promise<Truthy<T>> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      last = await fn();
      if (last) return last as Truthy<T>;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) {
      const detail = last instanceof Error ? last.message : JSON.stringify(last);
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${message} (last: ${detail})`);
    }
    await delay(intervalMs);
  }
}

export interface HttpGetOptions {
  /** Default 5 s. */
  timeoutMs?: number;
}

/** What `httpGet` resolves: the status code and the body as text. */
export interface HttpGetResult {
  status: number;
  body: string;
}

/** GET over a fresh connection (no keep-alive agent holding the test process open). */
export function httpGet(url: string | URL, { timeoutMs = 5_000 }: HttpGetOptions = {}): Promise<HttpGetResult> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { agent: false, timeout: timeoutMs }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, body: Buffer.concat(chunks).toString() }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`GET ${url}: no answer within ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end();
  });
}

// ---- servers -----------------------------------------------------------------------------------------------

/** What a test server saw of one connection. */
export interface ConnectionRecord {
  /** The client's address, `ip:port`. */
  remote: string;
  /** Bytes received so far. */
  bytes: number;
  /** The running sha256 of what was received. */
  hash: Hash;
  /** The client's FIN arrived. */
  ended: boolean;
  /** The hex sha256 of everything received, set by the sink server at the client's FIN. */
  sha256?: string;
}

/** What a test server saw: accepted connections, bytes received, per-connection summaries. */
export interface ServerStats {
  accepted: number;
  bytes: number;
  /** Connections open now. */
  open: number;
  connections: ConnectionRecord[];
}

/** A listening test server (`startServer` and the applications built on it). */
export interface TestServer {
  host: string;
  port: number;
  stats: ServerStats;
  server: Server;
  /** Destroys every connection and closes the server. */
  close(): Promise<void>;
}

/** The application of a `startServer`: called with each accepted connection and its record. */
export type OnConnection = (socket: Socket, record: ConnectionRecord) => void;

/**
 * A TCP server that records what it saw: accepted connections, bytes received, per-connection summaries.
 * `onConnection(socket, record)` is the application; `record.bytes` is kept up to date by the server.
 */
export function startServer(host: string, port: number, onConnection: OnConnection): Promise<TestServer> {
  const stats: ServerStats = { accepted: 0, bytes: 0, open: 0, connections: [] };
  const sockets = new Set<Socket>();
  const server = createServer({ allowHalfOpen: true }, (socket) => {
    stats.accepted++;
    stats.open++;
    sockets.add(socket);
    const record: ConnectionRecord = { remote: `${socket.remoteAddress}:${socket.remotePort}`, bytes: 0, hash: createHash('sha256'), ended: false };
    stats.connections.push(record);
    socket.on('data', (chunk: Buffer) => {
      record.bytes += chunk.length;
      stats.bytes += chunk.length;
      record.hash.update(chunk);
    });
    socket.on('end', () => (record.ended = true));
    socket.on('error', () => socket.destroy());
    socket.on('close', () => {
      stats.open--;
      sockets.delete(socket);
    });
    onConnection(socket, record);
  });
  return new Promise((resolve, reject) => {
    server.once('error', (err) => reject(new Error(`cannot listen on ${host}:${port}: ${err.message}`)));
    server.listen({ host, port, exclusive: true }, () => {
      resolve({
        host,
        port,
        stats,
        server,
        close: () =>
          new Promise<void>((done) => {
            for (const s of sockets) s.destroy();
            server.close(() => done());
          }),
      });
    });
  });
}

/** Echo: every byte back; our FIN after theirs. */
export function startEchoServer(host: string, port: number): Promise<TestServer> {
  return startServer(host, port, (socket) => {
    socket.pipe(socket);
  });
}

/**
 * Sink then report: reads to EOF, then writes `reply(record)` and closes. The default reply is one JSON line
 * `{"bytes":N,"sha256":"..."}` describing what arrived; pass a Buffer-returning function to send something else
 * (e.g. N bytes after the client's FIN, for half-close tests).
 */
export function startSinkServer(
  host: string,
  port: number,
  reply: (record: ConnectionRecord) => string | Uint8Array = (r) => Buffer.from(`${JSON.stringify({ bytes: r.bytes, sha256: r.sha256 })}\n`),
): Promise<TestServer> {
  return startServer(host, port, (socket, record) => {
    socket.on('end', () => {
      record.sha256 = record.hash.digest('hex');
      socket.end(reply(record));
    });
  });
}

/** An application that streams without end: writes `chunk` for as long as each connection takes it; closes on the
 * client's FIN. */
export function startFirehoseServer(host: string, port: number, chunk: string | Uint8Array = Buffer.alloc(64 * 1024, 0x5a)): Promise<TestServer> {
  return startServer(host, port, (socket) => {
    const pump = () => {
      while (!socket.destroyed && socket.write(chunk));
    };
    socket.on('drain', pump);
    socket.on('end', () => socket.destroy());
    pump();
  });
}

/** A running `startStallingRelay`. */
export interface StallingRelay {
  /** Stops reading what the target sends, on every relayed connection, present and future. */
  stall(): void;
  /** Destroys every relayed connection and closes the listener. */
  close(): Promise<void>;
}

/**
 * A TCP relay from `listen` ({ host, port }) to `target`; `stall()` stops reading what the target sends on every
 * relayed connection, present and future (a client that never reads, as the target sees it).
 */
export function startStallingRelay(listen: HostPort, target: HostPort): Promise<StallingRelay> {
  const pairs = new Set<{ up: Socket; down: Socket }>();
  let stalled = false;
  const server = createServer((down) => {
    const up = tcpConnect(target.port, target.host);
    const pair = { up, down };
    pairs.add(pair);
    down.pipe(up);
    up.on('data', (chunk: Buffer) => down.write(chunk));
    if (stalled) up.pause();
    const end = () => {
      pairs.delete(pair);
      up.destroy();
      down.destroy();
    };
    for (const s of [up, down]) {
      s.on('error', end);
      s.on('close', end);
    }
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(listen.port, listen.host, () =>
      resolve({
        stall() {
          stalled = true;
          for (const { up } of pairs) up.pause();
        },
        close() {
          for (const { up, down } of pairs) {
            up.destroy();
            down.destroy();
          }
          return new Promise<void>((r) => server.close(() => r()));
        },
      }),
    );
  });
}

/** Greet then close: writes `greeting` and its FIN at once, without waiting for the client. */
export function startGreeterServer(host: string, port: number, greeting: string | Uint8Array): Promise<TestServer> {
  return startServer(host, port, (socket) => {
    socket.resume();
    socket.end(greeting);
  });
}

/**
 * Counts connections and bytes and never answers a byte; closes its side after the client's FIN. The target of
 * refusal tests, where everything must stay at zero.
 */
export function startCountingServer(host: string, port: number): Promise<TestServer> {
  return startServer(host, port, (socket) => {
    socket.resume();
    socket.on('end', () => socket.end());
  });
}

// ---- clients -----------------------------------------------------------------------------------------------

export interface ReadAllOptions {
  /** Keep the bytes (`data`), not only their count and hash. Default false. */
  keep?: boolean;
}

/** What `readAll` resolves once the stream has closed. */
export interface ReadAllResult {
  bytes: number;
  /** Hex sha256 of every byte read. */
  sha256: string;
  /** The peer's FIN arrived ('end'). */
  ended: boolean;
  /** The stream's error, if it failed. */
  error?: NodeJS.ErrnoException;
  /** Every byte read, with `keep`. */
  data?: Buffer;
}

/** `readAll`'s result with `keep: true`. */
export interface KeptReadAllResult extends ReadAllResult {
  data: Buffer;
}

/**
 * Reads a connected socket to EOF, hashing as it goes (64 MiB need not sit in memory twice). Resolves
 * { bytes, sha256, data? (when keep), error? } once the socket has closed.
 */
export function readAll(socket: Readable, options: ReadAllOptions & { keep: true }): Promise<KeptReadAllResult>;
export function readAll(socket: Readable, options?: ReadAllOptions): Promise<ReadAllResult>;
export function readAll(socket: Readable, { keep = false }: ReadAllOptions = {}): Promise<ReadAllResult> {
  return new Promise((resolve) => {
    const hash = createHash('sha256');
    const chunks: Buffer[] = [];
    let bytes = 0;
    let ended = false;
    let error: NodeJS.ErrnoException | undefined;
    socket.on('data', (c: Buffer) => {
      bytes += c.length;
      hash.update(c);
      if (keep) chunks.push(c);
    });
    socket.on('end', () => (ended = true));
    socket.on('error', (err: NodeJS.ErrnoException) => (error = err));
    socket.on('close', () =>
      resolve({ bytes, sha256: hash.digest('hex'), ended, error, ...(keep ? { data: Buffer.concat(chunks) } : {}) }),
    );
    socket.resume();
  });
}

export interface SocksRoundTripOptions {
  /** The workload's SOCKS5 entry. */
  socks: HostPort;
  dest: HostPort;
  /** Written, then our FIN. */
  payload: string | Uint8Array;
  /** Keep the bytes that came back (`data`). Default false. */
  keep?: boolean;
  /** Until EOF. Default 30 s. */
  timeoutMs?: number;
}

/** What `socksRoundTrip` resolves: what came back, and the client's own address. */
export interface SocksRoundTripResult extends ReadAllResult {
  /** The client's own address (`ip:port`), as the proxy saw it. */
  local: string;
}

/**
 * Through a workload's SOCKS5 entry to `dest`: send `payload`, FIN, and read to EOF. Resolves what came back
 * ({ bytes, sha256, ended, error }) plus `local` (the client's own address, as the proxy saw it).
 */
export async function socksRoundTrip(options: SocksRoundTripOptions & { keep: true }): Promise<SocksRoundTripResult & KeptReadAllResult>;
export async function socksRoundTrip(options: SocksRoundTripOptions): Promise<SocksRoundTripResult>;
export async function socksRoundTrip({ socks, dest, payload, keep = false, timeoutMs = 30_000 }: SocksRoundTripOptions): Promise<SocksRoundTripResult> {
  const socket = await socks5Connect({ proxyHost: socks.host, proxyPort: socks.port, destHost: dest.host, destPort: dest.port });
  const local = `${socket.localAddress}:${socket.localPort}`;
  socket.setTimeout(timeoutMs, () => socket.destroy(new Error(`no EOF within ${timeoutMs} ms`)));
  const result = readAll(socket, { keep });
  socket.end(payload);
  return { ...(await result), local };
}

export interface Socks5RequestOptions {
  /** The workload's SOCKS5 entry. */
  socks: HostPort;
  /** `host` must be an IP literal. */
  dest: HostPort;
  /** For the reply. Default 15 s. */
  timeoutMs?: number;
}

/**
 * What `socks5Request` resolves: the proxy's reply code and the socket (paused; open when the code is 0), or
 * `code: null` and the error when the proxy closed or failed before replying. `assert.equal(r.code, 0)` narrows it.
 */
export type Socks5Reply =
  | { code: number; socket: Socket; error?: undefined }
  | { code: null; socket?: undefined; error: NodeJS.ErrnoException };

/**
 * A raw SOCKS5 CONNECT that reports the reply code instead of throwing: resolves { code, socket } (socket paused,
 * open when code is 0) or { code: null, error } when the proxy closed or failed before replying.
 */
export function socks5Request({ socks, dest, timeoutMs = 15_000 }: Socks5RequestOptions): Promise<Socks5Reply> {
  if (isIP(dest.host) === 0) throw new Error('socks5Request takes IP literals');
  return new Promise((resolve) => {
    const socket = tcpConnect({ host: socks.host, port: socks.port });
    let buf = Buffer.alloc(0);
    let stage = 'greeting';
    const finish = (r: Socks5Reply) => {
      clearTimeout(timer);
      socket.removeAllListeners('data');
      resolve(r);
    };
    const timer = setTimeout(() => {
      socket.destroy();
      finish({ code: null, error: new Error(`no SOCKS5 reply within ${timeoutMs} ms`) });
    }, timeoutMs);
    socket.on('error', (error: NodeJS.ErrnoException) => finish({ code: null, error }));
    socket.on('close', () => finish({ code: null, error: new Error('closed before the reply') }));
    socket.on('connect', () => socket.write(Buffer.from([5, 1, 0])));
    socket.on('data', (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      if (stage === 'greeting' && buf.length >= 2) {
        buf = buf.subarray(2);
        stage = 'reply';
        socket.write(encodeConnectRequest(dest.host, dest.port));
      }
      // IPv4 BND.ADDR: 10 bytes; IPv6: 22.
      const need = buf[3] === 4 ? 22 : 10;
      if (stage === 'reply' && buf.length >= need) {
        socket.pause();
        socket.removeAllListeners('close');
        socket.removeAllListeners('error');
        socket.on('error', () => undefined);
        if (buf.length > need) socket.unshift(buf.subarray(need));
        finish({ code: buf[1], socket });
      }
    });
  });
}

/** Options of the socket helpers that wait: `echoOnce`, `closeSocket`. */
export interface SocketWaitOptions {
  /** Default 15 s for `echoOnce`, 10 s for `closeSocket`. */
  timeoutMs?: number;
}

/** Writes `message` on an open (paused) socket and resolves once the same bytes came back. */
export function echoOnce(socket: Duplex, message: string | Uint8Array, { timeoutMs = 15_000 }: SocketWaitOptions = {}): Promise<Buffer> {
  const expected = Buffer.from(message);
  return new Promise((resolve, reject) => {
    let got = Buffer.alloc(0);
    const done = (err: Error | null) => {
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('close', onClose);
      socket.off('error', onError);
      socket.pause();
      if (err) reject(err);
      else resolve(got);
    };
    const onData = (chunk: Buffer) => {
      got = Buffer.concat([got, chunk]);
      if (got.length >= expected.length) done(got.equals(expected) ? null : new Error(`echo mismatch: ${JSON.stringify(got.toString())}`));
    };
    const onClose = () => done(new Error(`closed after ${got.length} of ${expected.length} echoed bytes`));
    const onError = (err: Error) => done(err);
    const timer = setTimeout(() => done(new Error(`echo not back within ${timeoutMs} ms`)), timeoutMs);
    socket.on('data', onData);
    socket.on('close', onClose);
    socket.on('error', onError);
    socket.resume();
    socket.write(expected);
  });
}

/** Ends our side and resolves once the socket has fully closed (the peer's FIN or reset included). */
export function closeSocket(socket: Duplex, { timeoutMs = 10_000 }: SocketWaitOptions = {}): Promise<void> {
  if (socket.destroyed) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`socket not closed within ${timeoutMs} ms`)), timeoutMs);
    socket.once('close', () => {
      clearTimeout(timer);
      resolve();
    });
    socket.on('error', () => undefined);
    socket.resume();
    socket.end();
  });
}

/**
 * One echoed exchange through a workload's SOCKS5 entry (`socksIp`:15080) to `dest`:`port`, then a clean close.
 * Resolves 0, or the SOCKS5 reply code when the connection was refused.
 */
export async function throughSocks5(socksIp: string, dest: string, port = 8080, message: string | Uint8Array = 'ping'): Promise<number | null> {
  const r = await socks5Request({ socks: { host: socksIp, port: 15080 }, dest: { host: dest, port } });
  if (r.code !== 0) return r.code;
  await echoOnce(r.socket, message);
  await closeSocket(r.socket);
  return 0;
}
