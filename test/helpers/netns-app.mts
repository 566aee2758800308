#!/usr/bin/env node
// Plain TCP programs that know nothing of the mesh, run inside namespaces by the netns suite.
//   serve <port>                      echo server on 0.0.0.0; prints {"event":"listening"} then one
//                                     {"event":"conn","remote":"ip:port"} line per connection
//   send <host> <port> <bytes>        connect, send <bytes> pseudo-random bytes, half-close, read the echo to EOF;
//                                     prints {"ok":true,"sent":N,"received":N,"same":bool,"ms":T} or {"ok":false,...}
//   hold <host> <port>                connect and keep sending a byte every 50 ms; prints {"event":"open"} and
//                                     {"event":"closed","error":...} when the connection ends
//   stream <host> <port>              connect, send pseudo-random bytes paced (8 KiB every 10 ms) and read the echo
//                                     until SIGUSR2, then half-close and read to EOF; prints {"event":"open"},
//                                     {"event":"echoed","received":N} at the first echoed bytes and every 256 KiB
//                                     after, then {"ok":true,"sent":N,"received":N,"same":bool} (sha256 of both
//                                     ways) or {"ok":false,"error":...}
//   probe <host> <port> <timeoutMs>   connect and wait for EOF/error/timeout; prints {"result":"closed"|"refused"|
//                                     "reset"|"timeout"|"data","ms":T}
import { createHash, randomBytes } from 'node:crypto';
import { createServer, connect } from 'node:net';

const [mode, ...args] = process.argv.slice(2);
const out = (o: object) => process.stdout.write(JSON.stringify(o) + '\n');

if (mode === 'serve') {
  const srv = createServer((s) => {
    out({ event: 'conn', remote: `${s.remoteAddress}:${s.remotePort}` });
    s.on('error', () => {});
    s.pipe(s);
  });
  srv.listen(Number(args[0]), '0.0.0.0', () => out({ event: 'listening' }));
} else if (mode === 'send') {
  const [host, port, bytes] = args;
  const payload = randomBytes(Number(bytes));
  const started = Date.now();
  const chunks: Buffer[] = [];
  const s = connect({ host, port: Number(port) });
  s.on('connect', () => s.end(payload));
  s.on('data', (d: Buffer) => chunks.push(d));
  s.on('end', () => {
    const got = Buffer.concat(chunks);
    const h = (b: Buffer) => createHash('sha256').update(b).digest('hex');
    out({ ok: true, sent: payload.length, received: got.length, same: h(got) === h(payload), ms: Date.now() - started });
    process.exit(0);
  });
  s.on('error', (e: NodeJS.ErrnoException) => {
    out({ ok: false, error: e.code ?? e.message, ms: Date.now() - started });
    process.exit(0);
  });
} else if (mode === 'hold') {
  const [host, port] = args;
  const s = connect({ host, port: Number(port) });
  let timer: NodeJS.Timeout | undefined;
  s.on('connect', () => {
    out({ event: 'open' });
    timer = setInterval(() => s.write('x'), 50);
  });
  s.on('data', () => {});
  const closed = (error: string | null) => {
    clearInterval(timer);
    out({ event: 'closed', error });
    process.exit(0);
  };
  s.on('close', () => closed(null));
  s.on('error', (e: NodeJS.ErrnoException) => closed(e.code ?? e.message));
} else if (mode === 'stream') {
  const [host, port] = args;
  const sent = createHash('sha256');
  const received = createHash('sha256');
  let [nSent, nReceived] = [0, 0];
  let report = 1;
  const s = connect({ host, port: Number(port) });
  let timer: NodeJS.Timeout | undefined;
  s.on('connect', () => {
    out({ event: 'open' });
    timer = setInterval(() => {
      const b = randomBytes(8192);
      sent.update(b);
      nSent += b.length;
      s.write(b);
    }, 10);
  });
  s.on('data', (d: Buffer) => {
    received.update(d);
    nReceived += d.length;
    if (nReceived >= report) {
      out({ event: 'echoed', received: nReceived });
      report = nReceived + 256 * 1024;
    }
  });
  process.on('SIGUSR2', () => {
    clearInterval(timer);
    s.end();
  });
  s.on('end', () => {
    out({ ok: true, sent: nSent, received: nReceived, same: nSent === nReceived && sent.digest('hex') === received.digest('hex') });
    process.exit(0);
  });
  s.on('error', (e: NodeJS.ErrnoException) => {
    clearInterval(timer);
    out({ ok: false, error: e.code ?? e.message });
    process.exit(0);
  });
} else if (mode === 'probe') {
  const [host, port, timeoutMs] = args;
  const started = Date.now();
  const done = (result: string) => {
    out({ result, ms: Date.now() - started });
    process.exit(0);
  };
  const s = connect({ host, port: Number(port) });
  s.setTimeout(Number(timeoutMs), () => done('timeout'));
  s.on('connect', () => s.write('hello\r\n\r\n'));
  s.on('data', () => done('data'));
  s.on('end', () => done('closed'));
  s.on('error', (e: NodeJS.ErrnoException) => done(e.code === 'ECONNREFUSED' ? 'refused' : e.code === 'ECONNRESET' ? 'reset' : e.code ?? 'error'));
} else {
  process.stderr.write('usage: netns-app.mjs serve|send|hold|stream|probe ...\n');
  process.exit(2);
}
