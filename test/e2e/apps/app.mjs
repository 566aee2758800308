// The e2e cluster's test application (the image ztn-e2e/app): plain TCP programs that know nothing of the mesh.
//
//   echo [--port 8080]                      echoes every connection; logs `{"accepted": peer}` per connection
//   stream --target host:port [--every ms]  one long-lived connection: a 64-byte numbered record every `every` ms
//                                           (100), each echo checked byte for byte, in order; prints its counters as a
//                                           JSON line every second; connects again after a failure (counted)
//   connect --target host:port [--bytes n] [--timeout ms]
//                                           one connection, `n` bytes (1024) out and back; prints
//                                           {"ok": bool, "ms": n, "error"?: text} and exits 0 either way (the caller
//                                           judges)
//   sleep                                   does nothing, forever (a pod to exec in)
//
// Host names are resolved by the system resolver (the pod's resolv.conf: in an ambient namespace, ztunnel-node's DNS
// proxy answers through istio-cni's DNS capture).
import { createServer, connect } from 'node:net';
import { parseArgs } from 'node:util';

const [mode, ...rest] = process.argv.slice(2);
const { values } = parseArgs({
  args: rest,
  options: {
    port: { type: 'string', default: '8080' },
    target: { type: 'string' },
    every: { type: 'string', default: '100' },
    bytes: { type: 'string', default: '1024' },
    timeout: { type: 'string', default: '5000' },
  },
});
const print = (o) => process.stdout.write(`${JSON.stringify(o)}\n`);
const RECORD = 64;

function target() {
  if (!values.target) throw new Error(`${mode}: --target host:port is required`);
  const i = values.target.lastIndexOf(':');
  return { host: values.target.slice(0, i), port: Number(values.target.slice(i + 1)) };
}

/** Record `n`: its number, then bytes derived from it, so a byte out of place is seen. */
function record(n) {
  const b = Buffer.alloc(RECORD);
  b.writeBigUInt64BE(BigInt(n));
  for (let i = 8; i < RECORD; i++) b[i] = (n * 31 + i * 7) & 0xff;
  return b;
}

if (mode === 'echo') {
  createServer((s) => {
    print({ accepted: `${s.remoteAddress}:${s.remotePort}`, at: new Date().toISOString() });
    s.on('error', () => {});
    s.pipe(s);
  }).listen(Number(values.port), () => print({ listening: Number(values.port) }));
} else if (mode === 'stream') {
  const { host, port } = target();
  const every = Number(values.every);
  const c = { connected: false, connects: 0, sent: 0, echoed: 0, mismatches: 0, errors: 0, lastError: null, since: null };
  let seq = 0;
  const open = () => {
    const s = connect({ host, port });
    let pending = Buffer.alloc(0);
    let expect = seq;
    let timer = null;
    s.on('connect', () => {
      c.connected = true;
      c.connects++;
      c.since = new Date().toISOString();
      timer = setInterval(() => {
        s.write(record(seq++));
        c.sent++;
      }, every);
    });
    s.on('data', (d) => {
      pending = Buffer.concat([pending, d]);
      while (pending.length >= RECORD) {
        if (!pending.subarray(0, RECORD).equals(record(expect))) c.mismatches++;
        expect++;
        c.echoed++;
        pending = pending.subarray(RECORD);
      }
    });
    const closed = (err) => {
      if (timer) clearInterval(timer);
      timer = null;
      if (c.connected || err) {
        c.errors++;
        c.lastError = err ? `${err.code ?? ''} ${err.message}`.trim() : 'closed by the peer';
      }
      c.connected = false;
      // Records sent on this connection and never echoed are lost with it: start the next one from here.
      seq = Math.max(seq, expect);
      setTimeout(open, 500);
    };
    s.on('error', (err) => { s.destroy(); closed(err); });
    s.on('end', () => { s.destroy(); });
    s.on('close', (hadError) => { if (!hadError) closed(null); });
  };
  open();
  setInterval(() => print({ ...c, at: new Date().toISOString() }), 1000);
} else if (mode === 'connect') {
  const { host, port } = target();
  const n = Number(values.bytes);
  const payload = Buffer.alloc(n, 0x5a);
  const t0 = performance.now();
  const s = connect({ host, port });
  let got = Buffer.alloc(0);
  const done = (o) => {
    print({ ...o, ms: Math.round(performance.now() - t0) });
    s.destroy();
    process.exit(0);
  };
  setTimeout(() => done({ ok: false, error: `timed out after ${got.length} of ${n} bytes` }), Number(values.timeout));
  s.on('connect', () => s.write(payload));
  s.on('data', (d) => {
    got = Buffer.concat([got, d]);
    if (got.length >= n) done(got.equals(payload) ? { ok: true } : { ok: false, error: 'the echo differs' });
  });
  s.on('error', (err) => done({ ok: false, error: `${err.code ?? ''} ${err.message}`.trim() }));
  s.on('close', () => done({ ok: false, error: `closed after ${got.length} of ${n} bytes` }));
} else if (mode === 'sleep') {
  setInterval(() => {}, 1 << 30);
} else {
  console.error('usage: app.mjs echo|stream|connect|sleep [options]');
  process.exit(2);
}
