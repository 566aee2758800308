// An independent HBONE peer built only on Node's own `tls` and `http2`: it shares no code with ztunnel-node, so a
// daemon that talks to it interoperates with HTTP/2 CONNECT over mutual TLS as Istio's HBONE defines it (TLS 1.3,
// ALPN h2, SPIFFE URI SANs, one CONNECT stream per TCP connection), not merely with itself.
import { connect as http2Connect, createSecureServer } from 'node:http2';
import { connect as tlsConnect } from 'node:tls';
import assert from 'node:assert/strict';
import { readAll } from './net.js';

/** The SPIFFE URI SANs of a peer certificate as Node reports it ("URI:spiffe://..., DNS:..."). */
export function spiffeSans(peerCert) {
  return (peerCert?.subjectaltname ?? '')
    .split(', ')
    .filter((s) => s.startsWith('URI:spiffe://'))
    .map((s) => s.slice('URI:'.length));
}

/**
 * Opens a TLS 1.3 + h2 session to `host:port` as an HBONE client. `cert`/`key` may be omitted (no client
 * certificate). `via`: the TCP connection goes to this `{ host, port }` instead (a relay in front of the daemon);
 * `settings`: the client's HTTP/2 SETTINGS. `expectServerId`: the server's single SPIFFE SAN must be this identity (DNS names are ignored, as
 * in ztunnel). Resolves the ClientHttp2Session once the TLS handshake and the h2 preface are done, or rejects.
 */
export function hboneSession({ host, port = 15008, cert, key, ca, expectServerId, maxVersion = 'TLSv1.3', minVersion = 'TLSv1.3', ecdhCurve, ciphers, timeoutMs = 10_000, alpn = ['h2'], via, settings, localAddress }) {
  return new Promise((resolve, reject) => {
    let tlsSocket;
    const session = http2Connect(`https://${host}:${port}`, {
      ...(settings ? { settings } : {}),
      createConnection: () => {
        tlsSocket = tlsConnect({
          host: via?.host ?? host,
          port: via?.port ?? port,
          ...(localAddress ? { localAddress } : {}),
          ...(cert ? { cert, key } : {}),
          ca,
          ...(alpn === null ? {} : { ALPNProtocols: alpn }),
          minVersion,
          maxVersion,
          ...(ecdhCurve ? { ecdhCurve } : {}),
          ...(ciphers ? { ciphers } : {}),
          checkServerIdentity: (_name, peer) => {
            const ids = spiffeSans(peer);
            if (expectServerId && (ids.length !== 1 || ids[0] !== expectServerId)) {
              return new Error(`server identity ${JSON.stringify(ids)} is not ${expectServerId}`);
            }
            return undefined;
          },
        });
        return tlsSocket;
      },
    });
    const timer = setTimeout(() => {
      session.destroy();
      reject(new Error(`no h2 session with ${host}:${port} within ${timeoutMs} ms`));
    }, timeoutMs);
    session.once('connect', () => {
      clearTimeout(timer);
      session.off('error', onError);
      session.on('error', () => undefined);
      resolve(session);
    });
    const onError = (err) => {
      clearTimeout(timer);
      session.destroy();
      reject(err);
    };
    session.once('error', onError);
    session.once('close', () => onError(new Error('the session closed before it was established')));
  });
}

/**
 * Sends one request on `session` and resolves { status, headers, stream } once response headers arrive, or
 * { status: null, error } if the stream or the session fails first.
 */
export function request(session, headers, { timeoutMs = 10_000 } = {}) {
  return new Promise((resolve) => {
    let stream;
    try {
      stream = session.request(headers, { endStream: false });
    } catch (error) {
      resolve({ status: null, error });
      return;
    }
    const timer = setTimeout(() => {
      stream.close();
      resolve({ status: null, error: new Error(`no response within ${timeoutMs} ms`) });
    }, timeoutMs);
    stream.once('response', (h) => {
      clearTimeout(timer);
      resolve({ status: h[':status'], headers: h, stream });
    });
    stream.once('error', (error) => {
      clearTimeout(timer);
      resolve({ status: null, error });
    });
    stream.once('close', () => {
      clearTimeout(timer);
      resolve({ status: null, error: new Error(`stream closed (rst code ${stream.rstCode}) before a response`) });
    });
  });
}

/** CONNECT `authority` (authority-form: no :scheme, no :path). */
export const connectRequest = (session, authority, extra = {}) =>
  request(session, { ':method': 'CONNECT', ':authority': authority, ...extra });

/**
 * An HBONE server on `host:port` (TLS 1.3, ALPN h2, client certificate required and verified against `ca`).
 * `onStream(stream, headers, session)` answers each request; the default answers CONNECT with 200 and echoes.
 * Records every session and stream: { sessions, streams: [{ headers, peerCert, remoteAddress, alpn, protocol }],
 * tlsErrors, secureConnections }.
 */
export function startHboneServer({ host, port = 15008, cert, key, ca, onStream = echoConnect }) {
  const record = { secureConnections: 0, tlsErrors: [], streams: [], sessions: 0 };
  const server = createSecureServer({
    cert,
    key,
    ca,
    requestCert: true,
    rejectUnauthorized: true,
    ALPNProtocols: ['h2'],
    minVersion: 'TLSv1.3',
    allowHTTP1: false,
  });
  const sessions = new Set();
  server.on('secureConnection', () => record.secureConnections++);
  server.on('tlsClientError', (err) => record.tlsErrors.push(err.message));
  server.on('session', (s) => {
    record.sessions++;
    sessions.add(s);
    s.on('close', () => sessions.delete(s));
    s.on('error', () => undefined);
  });
  server.on('stream', (stream, headers) => {
    const sock = stream.session.socket;
    record.streams.push({
      headers: { ...headers },
      peerCert: sock.getPeerCertificate(),
      remoteAddress: sock.remoteAddress,
      alpn: sock.alpnProtocol,
      protocol: sock.getProtocol(),
    });
    stream.on('error', () => undefined);
    onStream(stream, headers, stream.session);
  });
  return new Promise((resolve, reject) => {
    server.once('error', (err) => reject(new Error(`cannot listen on ${host}:${port}: ${err.message}`)));
    server.listen({ host, port, exclusive: true }, () =>
      resolve({
        record,
        server,
        close: () =>
          new Promise((done) => {
            for (const s of sessions) s.destroy();
            server.close(() => done());
          }),
      }),
    );
  });
}

/** CONNECT → 200 and echo every byte; anything else → 400. */
export function echoConnect(stream, headers) {
  if (headers[':method'] !== 'CONNECT') {
    stream.respond({ ':status': 400 }, { endStream: true });
    return;
  }
  stream.respond({ ':status': 200 });
  stream.pipe(stream);
}

/**
 * A legitimate CONNECT round trip through a fresh session (`opts` as hboneSession's): "ping" to an echo server at
 * `authority`, asserted to come back. Resolves the milliseconds it took.
 */
export async function echoRoundTrip(opts, authority) {
  const t0 = performance.now();
  const s = await hboneSession(opts);
  try {
    const r = await connectRequest(s, authority);
    assert.equal(r.status, 200, `legitimate CONNECT: ${r.status} ${r.error?.message ?? ''}`);
    const got = readAll(r.stream, { keep: true });
    r.stream.end('ping');
    assert.equal((await got).data.toString(), 'ping');
    return performance.now() - t0;
  } finally {
    s.destroy();
  }
}

/**
 * The whole HBONE exchange with `host:15008` (handshake with `opts` as hboneSession's, h2, a CONNECT to `target`,
 * some bytes written). Resolves 'refused: <code> <message>' or 'tunnel open' (a 200, and the bytes went).
 */
export async function tunnelAttempt({ target, ...opts }) {
  let session;
  try {
    session = await hboneSession(opts);
  } catch (err) {
    return `refused: ${err.code ?? ''} ${err.message}`;
  }
  try {
    const r = await connectRequest(session, target);
    if (r.status !== 200) return `refused: status ${r.status} ${r.error?.message ?? ''}`;
    const done = readAll(r.stream);
    r.stream.end('these bytes must never reach the app');
    await done;
    return 'tunnel open';
  } finally {
    session.destroy();
  }
}
