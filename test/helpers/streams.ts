// Long-lived streams for the hand-over suites: a server that, per connection, tallies what it receives and streams
// random bytes back; a client through a daemon's SOCKS5 entry that does the same; checkpoints that stop both
// directions and compare every byte's sha256 (nothing lost, duplicated or reordered, no reset).
import assert from 'node:assert/strict';
import { createHash, randomBytes, type Hash } from 'node:crypto';
import { createServer, type Socket } from 'node:net';
import { socks5Request, waitFor, type HostPort } from './net.js';

/** One direction of a stream: what was written (or read) so far, and its running sha256. */
export class Tally {
  bytes: number;
  hash: Hash;

  constructor() {
    this.bytes = 0;
    this.hash = createHash('sha256');
  }
  add(buf: Uint8Array): void {
    this.bytes += buf.length;
    this.hash.update(buf);
  }
  digest(): string {
    return this.hash.copy().digest('hex');
  }
}

/** The server's side of one stream. */
export interface ServerConn {
  socket: Socket;
  received: Tally;
  sent: Tally;
  /** The client's FIN arrived. */
  ended: boolean;
  /** Socket errors (their codes, or messages). */
  errors: string[];
}

/** A listening `startServer`. */
export interface StreamServer {
  /** Every accepted connection, in order. */
  conns: ServerConn[];
  /** Destroys every connection and closes the server. */
  close(): Promise<void>;
}

/** A server that, per connection, tallies what it receives and streams random bytes back until told to stop. */
export function startServer(port: number, host?: string): Promise<StreamServer> {
  const conns: ServerConn[] = [];
  // Half-open allowed: a client's half-close must not end the server's direction.
  const server = createServer({ allowHalfOpen: true }, (socket) => {
    const c: ServerConn = { socket, received: new Tally(), sent: new Tally(), ended: false, errors: [] };
    conns.push(c);
    socket.on('data', (b: Buffer) => c.received.add(b));
    socket.on('end', () => (c.ended = true));
    socket.on('error', (e: NodeJS.ErrnoException) => c.errors.push(e.code ?? e.message));
  });
  return new Promise((resolve) =>
    server.listen(port, host, () =>
      resolve({
        conns,
        close: () => {
          for (const c of conns) c.socket.destroy();
          return new Promise<void>((r) => server.close(() => r()));
        },
      }),
    ),
  );
}

export interface PumpOptions {
  /** Bytes per block. Default 8 KiB. */
  chunk?: number;
  /** Default 5 ms. */
  everyMs?: number;
}

/** Writes `chunk`-byte random blocks every `everyMs` on `socket`, tallying them, until `stop()`. */
export function pump(socket: Socket, tally: Tally, { chunk = 8 * 1024, everyMs = 5 }: PumpOptions = {}): () => void {
  let timer: NodeJS.Timeout | null = setInterval(() => {
    const b = randomBytes(chunk);
    tally.add(b);
    socket.write(b);
  }, everyMs);
  timer.unref();
  return () => {
    // null after the first stop (clearInterval ignores it).
    clearInterval(timer!);
    timer = null;
  };
}

/** A client's stream (`openStream`) and the server's side of it. */
export interface ClientStream {
  socket: Socket;
  /** The client's own address, `ip:port`. */
  local: string;
  sent: Tally;
  received: Tally;
  /** Socket errors (their codes, or messages). */
  errors: string[];
  closed: boolean;
  /** The server's side of the stream. */
  server: ServerConn;
  /** Stops the client's writing (up) or the server's (down). */
  stopUp: () => void;
  stopDown: () => void;
}

/** A client connection through the SOCKS5 entry `socks` to `dest`, accepted by `srv`, both directions streaming. */
export async function openStream(socks: HostPort, srv: StreamServer, dest: HostPort): Promise<ClientStream> {
  const before = srv.conns.length;
  const { code, socket } = await socks5Request({ socks, dest });
  assert.equal(code, 0, 'SOCKS5 CONNECT succeeded');
  // `server`, `stopUp` and `stopDown` are set below, before it is returned.
  const s: Omit<ClientStream, 'server' | 'stopUp' | 'stopDown'> & Partial<ClientStream> = { socket, local: `${socket.localAddress}:${socket.localPort}`, sent: new Tally(), received: new Tally(), errors: [], closed: false };
  socket.on('data', (b: Buffer) => s.received.add(b));
  socket.on('error', (e: NodeJS.ErrnoException) => s.errors.push(e.code ?? e.message));
  socket.on('close', () => (s.closed = true));
  socket.resume();
  await waitFor(() => srv.conns.length > before, { message: 'the server accepted' });
  s.server = srv.conns[srv.conns.length - 1];
  s.stopUp = pump(socket, s.sent);
  s.stopDown = pump(s.server.socket, s.server.sent);
  return s as ClientStream;
}

/**
 * Resolves once each of `streams` has delivered `bytes` more in each direction still written (a half-closed side
 * is skipped) than when called: traffic flows through whichever daemon holds the streams now.
 */
export function flowed(streams: readonly ClientStream[], what: string, { bytes = 128 * 1024, timeoutMs = 10_000 }: { bytes?: number; timeoutMs?: number } = {}): Promise<true> {
  const since = streams.map((s) => ({ up: s.server.received.bytes, down: s.received.bytes }));
  const short = () =>
    streams.flatMap((s, i) => {
      const moved = { up: s.server.received.bytes - since[i].up, down: s.received.bytes - since[i].down };
      const open = { up: !s.socket.writableEnded, down: !s.server.socket.writableEnded };
      return (['up', 'down'] as const).filter((d) => open[d] && moved[d] < bytes).map((d) => `#${i} ${d} +${moved[d]}`);
    });
  return waitFor(
    () => {
      const left = short();
      // Thrown, so that a time-out says which stream fell short.
      if (left.length > 0) throw new Error(left.join(', '));
      return true;
    },
    { timeoutMs, message: `${what}: ${bytes} more bytes each way` },
  );
}

/** Both directions stop writing; once each receiver has every byte, the digests must match. */
export async function checkpoint(s: ClientStream, what: string): Promise<void> {
  s.stopUp();
  s.stopDown();
  await waitFor(() => s.server.received.bytes === s.sent.bytes && s.received.bytes === s.server.sent.bytes, {
    timeoutMs: 15_000,
    message: `${what}: every byte arrived (up ${s.server.received.bytes}/${s.sent.bytes}, down ${s.received.bytes}/${s.server.sent.bytes})`,
  });
  assert.equal(s.server.received.digest(), s.sent.digest(), `${what}: client → server sha256`);
  assert.equal(s.received.digest(), s.server.sent.digest(), `${what}: server → client sha256`);
  assert.deepEqual([s.errors, s.server.errors, s.closed], [[], [], false], `${what}: no reset, no close`);
}
