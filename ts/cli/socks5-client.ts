// A minimal SOCKS5 client (RFC 1928: no authentication, CONNECT only), enough to send traffic through a
// local workload's SOCKS5 listener in the demo and the tests. Resolves with the connected socket, PAUSED so no
// application byte is lost between the handshake and the caller's listeners: attach them, then resume() (or
// pipe()). Bytes that arrived together with the reply are pushed back into the socket first.
import { connect, isIP, type Socket } from 'node:net';

export interface Socks5ConnectOptions {
  proxyHost: string;
  proxyPort: number;
  /** An IP address (v4/v6) or a hostname (sent as ATYP domain). */
  destHost: string;
  destPort: number;
  /** Whole handshake budget (connect + greeting + request). Default 10 s. */
  timeoutMs?: number;
}

/** RFC 1928 reply codes, for error messages. */
export const SOCKS5_REPLIES: Readonly<Record<number, string>> = {
  1: 'general SOCKS server failure',
  2: 'connection not allowed by ruleset',
  3: 'network unreachable',
  4: 'host unreachable',
  5: 'connection refused',
  6: 'TTL expired',
  7: 'command not supported',
  8: 'address type not supported',
};

export function encodeConnectRequest(host: string, port: number): Buffer {
  let addr: Buffer;
  const family = isIP(host);
  if (family === 4) {
    addr = Buffer.from([0x01, ...host.split('.').map(Number)]);
  } else if (family === 6) {
    addr = Buffer.concat([Buffer.from([0x04]), ipv6Bytes(host)]);
  } else {
    const name = Buffer.from(host);
    if (name.length > 255) throw new Error(`hostname too long for SOCKS5: ${host}`);
    addr = Buffer.concat([Buffer.from([0x03, name.length]), name]);
  }
  const p = Buffer.alloc(2);
  p.writeUInt16BE(port);
  return Buffer.concat([Buffer.from([0x05, 0x01, 0x00]), addr, p]);
}

function ipv6Bytes(ip: string): Buffer {
  const [head = '', tail = ''] = ip.split('::') as [string?, string?];
  const parse = (s: string) => (s === '' ? [] : s.split(':'));
  let groups = parse(head);
  let rest = ip.includes('::') ? parse(tail) : [];
  // An embedded IPv4 tail ("::ffff:1.2.3.4") is two groups.
  const fix = (gs: string[]) => gs.flatMap((g) => (g.includes('.') ? v4Groups(g) : [g]));
  groups = fix(groups);
  rest = fix(rest);
  const zeros = ip.includes('::') ? Array<string>(8 - groups.length - rest.length).fill('0') : [];
  const all = [...groups, ...zeros, ...rest];
  const out = Buffer.alloc(16);
  all.forEach((g, i) => out.writeUInt16BE(parseInt(g, 16), i * 2));
  return out;
}

function v4Groups(v4: string): string[] {
  const [a = 0, b = 0, c = 0, d = 0] = v4.split('.').map(Number);
  return [((a << 8) | b).toString(16), ((c << 8) | d).toString(16)];
}

/** Length of a complete CONNECT reply at the start of `buf`, or 0 if more bytes are needed. */
function replyLength(buf: Buffer): number {
  if (buf.length < 5) return 0;
  const atyp = buf[3];
  const addrLen = atyp === 0x01 ? 4 : atyp === 0x04 ? 16 : atyp === 0x03 ? 1 + (buf[4] as number) : -1;
  if (addrLen < 0) throw new Error(`SOCKS5 reply has unknown address type ${String(atyp)}`);
  const total = 4 + addrLen + 2;
  return buf.length >= total ? total : 0;
}

export function socks5Connect(opts: Socks5ConnectOptions): Promise<Socket> {
  const timeoutMs = opts.timeoutMs ?? 10_000;
  return new Promise((resolve, reject) => {
    const socket = connect({ host: opts.proxyHost, port: opts.proxyPort });
    let stage: 'greeting' | 'reply' = 'greeting';
    let buf = Buffer.alloc(0);
    const where = `SOCKS5 ${opts.proxyHost}:${opts.proxyPort} -> ${opts.destHost}:${opts.destPort}`;
    const fail = (message: string) => {
      cleanup();
      socket.destroy();
      reject(new Error(`${where}: ${message}`));
    };
    const timer = setTimeout(() => fail(`no answer within ${timeoutMs} ms`), timeoutMs);
    const onError = (err: Error) => fail(err.message);
    const onClose = () => fail('the proxy closed the connection during the handshake');
    const onData = (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      try {
        if (stage === 'greeting') {
          if (buf.length < 2) return;
          if (buf[0] !== 0x05) return fail(`not a SOCKS5 server (version byte ${String(buf[0])})`);
          if (buf[1] !== 0x00) return fail('the proxy requires authentication');
          buf = buf.subarray(2);
          stage = 'reply';
          socket.write(encodeConnectRequest(opts.destHost, opts.destPort));
        }
        const n = replyLength(buf);
        if (n === 0) return;
        const rep = buf[1] as number;
        if (rep !== 0x00) return fail(`CONNECT refused: ${SOCKS5_REPLIES[rep] ?? `reply code ${rep}`}`);
        const rest = buf.subarray(n);
        cleanup();
        socket.pause();
        if (rest.length > 0) socket.unshift(rest);
        resolve(socket);
      } catch (err) {
        fail((err as Error).message);
      }
    };
    function cleanup() {
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('error', onError);
      socket.off('close', onClose);
    }
    socket.on('data', onData);
    socket.on('error', onError);
    socket.on('close', onClose);
    socket.once('connect', () => socket.write(Buffer.from([0x05, 0x01, 0x00])));
  });
}
