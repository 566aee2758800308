// A raw HTTP/2 client over mTLS for hostile-peer tests: frames are written by hand (RFC 9113 §4.1), header blocks
// with HPACK's literal and indexed representations (RFC 7541 §6), so a test can send what no well-behaved client
// library would (endless CONTINUATION, a header block that decodes to megabytes, floods of PING, SETTINGS or empty
// DATA frames). It reads the peer's frames and records GOAWAY and RST_STREAM.
import { connect as tlsConnect, type SecureContextOptions, type TLSSocket } from 'node:tls';

export const FRAME = Object.freeze({ DATA: 0x0, HEADERS: 0x1, RST_STREAM: 0x3, SETTINGS: 0x4, PING: 0x6, GOAWAY: 0x7, WINDOW_UPDATE: 0x8, CONTINUATION: 0x9 });
export const FLAG = Object.freeze({ END_STREAM: 0x1, ACK: 0x1, END_HEADERS: 0x4 });
const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');

export function frame(type: number, flags: number, stream: number, payload: Uint8Array = Buffer.alloc(0)): Buffer {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(stream & 0x7fffffff, 5);
  return Buffer.concat([h, payload]);
}

/** An HPACK integer with an `n`-bit prefix whose high bits are `mask` (RFC 7541 §5.1). */
function integer(value: number, n: number, mask: number): Buffer {
  const max = (1 << n) - 1;
  if (value < max) return Buffer.from([mask | value]);
  const out = [mask | max];
  let v = value - max;
  while (v >= 128) {
    out.push((v % 128) + 128);
    v = Math.floor(v / 128);
  }
  out.push(v);
  return Buffer.from(out);
}

const str = (s: string) => {
  const b = Buffer.from(s);
  return Buffer.concat([integer(b.length, 7, 0x00), b]);
};

/** A literal header field without indexing, new name (§6.2.2). */
export const literal = (name: string, value: string): Buffer => Buffer.concat([Buffer.from([0x00]), str(name), str(value)]);
/** A literal header field with incremental indexing, new name (§6.2.1): it enters the dynamic table at index 62. */
export const indexedLiteral = (name: string, value: string): Buffer => Buffer.concat([Buffer.from([0x40]), str(name), str(value)]);
/** An indexed header field (§6.1): one or two bytes that decode to the whole entry. */
export const indexed = (index: number): Buffer => integer(index, 7, 0x80);

/** A CONNECT request's header block for `authority`. */
export const connectBlock = (authority: string): Buffer => Buffer.concat([literal(':method', 'CONNECT'), literal(':authority', authority)]);

export interface RawSessionOptions {
  host: string;
  /** Default 15008. */
  port?: number;
  cert: SecureContextOptions['cert'];
  key: SecureContextOptions['key'];
  ca: SecureContextOptions['ca'];
}

/** An open raw HTTP/2 connection (`rawSession`) and what the peer sent on it. */
export interface RawSession {
  socket: TLSSocket;
  /** The first GOAWAY's error code; null before one. */
  goaway: number | null;
  /** RST_STREAM error codes by stream id. */
  resets: Map<number, number>;
  /** Frames received so far. */
  frames: number;
  /** Resolves (with `hadError`) once the connection has closed. */
  closed: Promise<boolean>;
  /** Resolves once the next frame arrives or the connection closes. */
  nextFrame(): Promise<unknown>;
  /** Writes bytes; resolves true once they are taken, false if the connection is gone. */
  write(bytes: Uint8Array): Promise<boolean>;
}

/** A RawSession being opened: `closed` unset at first, `nextFrame` and `write` until the handshake is done. */
type RawSessionState = Omit<RawSession, 'closed' | 'nextFrame' | 'write'> & { closed: Promise<boolean> | null } & Partial<Pick<RawSession, 'nextFrame' | 'write'>>;

/**
 * Opens an mTLS session with ALPN h2, sends the preface and an empty SETTINGS. Resolves
 * `{ socket, write(buf) → Promise, goaway, resets, closed }`: `goaway` is the first GOAWAY's error code (or null),
 * `resets` the RST_STREAM codes by stream, `closed` a promise that resolves when the connection ends.
 */
export function rawSession({ host, port = 15008, cert, key, ca }: RawSessionOptions): Promise<RawSession> {
  return new Promise((resolve, reject) => {
    const socket = tlsConnect({ host, port, cert, key, ca, ALPNProtocols: ['h2'], checkServerIdentity: () => undefined });
    // `closed` is set next, `nextFrame` and `write` below, before it is resolved.
    const state: RawSessionState = { socket, goaway: null, resets: new Map(), frames: 0, closed: null };
    state.closed = new Promise((r) => socket.once('close', r));
    // Resolves with the next frame the daemon sends (or the close).
    const waiting: (() => void)[] = [];
    state.nextFrame = () => Promise.race([new Promise<void>((r) => waiting.push(r)), state.closed]);
    let buf = Buffer.alloc(0);
    socket.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 9) {
        const len = buf.readUIntBE(0, 3);
        if (buf.length < 9 + len) break;
        const type = buf[3];
        const stream = buf.readUInt32BE(5) & 0x7fffffff;
        const payload = buf.subarray(9, 9 + len);
        state.frames++;
        if (type === FRAME.GOAWAY && state.goaway === null) state.goaway = payload.readUInt32BE(4);
        if (type === FRAME.RST_STREAM) state.resets.set(stream, payload.readUInt32BE(0));
        buf = buf.subarray(9 + len);
        for (const w of waiting.splice(0)) w();
      }
    });
    socket.on('error', () => undefined);
    socket.once('secureConnect', () => {
      socket.write(Buffer.concat([PREFACE, frame(FRAME.SETTINGS, 0, 0)]));
      // Resolves once the bytes are taken (or the connection is gone: false).
      state.write = (b: Uint8Array) =>
        socket.destroyed
          ? Promise.resolve(false)
          : new Promise((r) => {
              if (socket.write(b)) return r(true);
              const done = (ok: boolean) => {
                socket.off('drain', onDrain);
                socket.off('close', onClose);
                r(ok);
              };
              const onDrain = () => done(true);
              const onClose = () => done(false);
              socket.once('drain', onDrain);
              socket.once('close', onClose);
            });
      resolve(state as RawSession);
    });
    socket.once('error', reject);
  });
}
