// An independent HBONE peer built only on Node's own `tls` and `http2`: it shares no code with ztunnel-node, so a
// daemon that talks to it interoperates with HTTP/2 CONNECT over mutual TLS as Istio's HBONE defines it (TLS 1.3,
// ALPN h2, SPIFFE URI SANs, one CONNECT stream per TCP connection), not merely with itself.
import {
  connect as http2Connect,
  createSecureServer,
  type ClientHttp2Session,
  type ClientHttp2Stream,
  type Http2SecureServer,
  type Http2Session,
  type IncomingHttpHeaders,
  type IncomingHttpStatusHeader,
  type OutgoingHttpHeaders,
  type ServerHttp2Stream,
  type Settings,
} from 'node:http2';
import { connect as tlsConnect, type PeerCertificate, type SecureContextOptions, type SecureVersion, type TLSSocket } from 'node:tls';
import assert from 'node:assert/strict';
import { readAll, type HostPort } from './net.js';

/** The SPIFFE URI SANs of a peer certificate as Node reports it ("URI:spiffe://..., DNS:..."). */
export function spiffeSans(peerCert: { subjectaltname?: string } | null | undefined): string[] {
  return (peerCert?.subjectaltname ?? '')
    .split(', ')
    .filter((s) => s.startsWith('URI:spiffe://'))
    .map((s) => s.slice('URI:'.length));
}

/** `hboneSession`'s options (also `echoRoundTrip`'s and, with `target`, `tunnelAttempt`'s). */
export interface HboneSessionOptions {
  host: string;
  /** Default 15008. */
  port?: number;
  /** The client certificate (chain) and key; none: no client certificate. */
  cert?: SecureContextOptions['cert'];
  key?: SecureContextOptions['key'];
  /** The roots the server's certificate is verified against. */
  ca?: SecureContextOptions['ca'];
  /** The server's single SPIFFE SAN must be this identity. */
  expectServerId?: string;
  /** Default 'TLSv1.3'. */
  maxVersion?: SecureVersion;
  /** Default 'TLSv1.3'. */
  minVersion?: SecureVersion;
  ecdhCurve?: string;
  ciphers?: string;
  /** For the TLS handshake and the h2 preface. Default 10 s. */
  timeoutMs?: number;
  /** ALPN protocols offered; null: no ALPN extension at all. Default ['h2']. */
  alpn?: string[] | null;
  /** The TCP connection goes here instead (a relay in front of the daemon). */
  via?: HostPort;
  /** The client's HTTP/2 SETTINGS. */
  settings?: Settings;
  localAddress?: string;
}

/**
 * Opens a TLS 1.3 + h2 session to `host:port` as an HBONE client. `cert`/`key` may be omitted (no client
 * certificate). `via`: the TCP connection goes to this `{ host, port }` instead (a relay in front of the daemon);
 * `settings`: the client's HTTP/2 SETTINGS. `expectServerId`: the server's single SPIFFE SAN must be this identity (DNS names are ignored, as
 * in ztunnel). Resolves the ClientHttp2Session once the TLS handshake and the h2 preface are done, or rejects.
 */
export function hboneSession({ host, port = 15008, cert, key, ca, expectServerId, maxVersion = 'TLSv1.3', minVersion = 'TLSv1.3', ecdhCurve, ciphers, timeoutMs = 10_000, alpn = ['h2'], via, settings, localAddress }: HboneSessionOptions): Promise<ClientHttp2Session> {
  return new Promise((resolve, reject) => {
    let tlsSocket: TLSSocket;
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
          checkServerIdentity: (_name: string, peer: PeerCertificate) => {
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
    const onError = (err: Error) => {
      clearTimeout(timer);
      session.destroy();
      reject(err);
    };
    session.once('error', onError);
    session.once('close', () => onError(new Error('the session closed before it was established')));
  });
}

/** The response headers of a request. */
export type ResponseHeaders = IncomingHttpHeaders & IncomingHttpStatusHeader;

/**
 * What `request` resolves: the response's status, headers and the stream (open), or `status: null` and the error
 * when the stream or the session failed first. `assert.equal(r.status, 200)` (or `if (r.status !== 200) return`)
 * narrows it to the answered case.
 */
export type HboneResponse =
  | { status: number; headers: ResponseHeaders; stream: ClientHttp2Stream; error?: undefined }
  | { status: null; headers?: undefined; stream?: undefined; error: NodeJS.ErrnoException };

export interface RequestOptions {
  /** For the response headers. Default 10 s. */
  timeoutMs?: number;
}

/**
 * Sends one request on `session` and resolves { status, headers, stream } once response headers arrive, or
 * { status: null, error } if the stream or the session fails first.
 */
export function request(session: ClientHttp2Session, headers: OutgoingHttpHeaders, { timeoutMs = 10_000 }: RequestOptions = {}): Promise<HboneResponse> {
  return new Promise((resolve) => {
    let stream: ClientHttp2Stream;
    try {
      stream = session.request(headers, { endStream: false });
    } catch (error) {
      resolve({ status: null, error: error as NodeJS.ErrnoException });
      return;
    }
    const timer = setTimeout(() => {
      stream.close();
      resolve({ status: null, error: new Error(`no response within ${timeoutMs} ms`) });
    }, timeoutMs);
    stream.once('response', (h) => {
      clearTimeout(timer);
      resolve({ status: h[':status']!, headers: h, stream });
    });
    stream.once('error', (error: NodeJS.ErrnoException) => {
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
export const connectRequest = (session: ClientHttp2Session, authority: string, extra: OutgoingHttpHeaders = {}): Promise<HboneResponse> =>
  request(session, { ':method': 'CONNECT', ':authority': authority, ...extra });

/** Answers one request on a test HBONE server (`startHboneServer`'s `onStream`). */
export type OnHboneStream = (stream: ServerHttp2Stream, headers: IncomingHttpHeaders, session: Http2Session) => void;

/** `startHboneServer`'s options. */
export interface HboneServerOptions {
  host: string;
  /** Default 15008. */
  port?: number;
  cert: SecureContextOptions['cert'];
  key: SecureContextOptions['key'];
  /** The roots client certificates are verified against. */
  ca: SecureContextOptions['ca'];
  /** Default `echoConnect`. */
  onStream?: OnHboneStream;
}

/** What a test HBONE server saw of one request. */
export interface HboneStreamRecord {
  headers: IncomingHttpHeaders;
  peerCert: PeerCertificate;
  remoteAddress: string | undefined;
  alpn: string | false | null;
  /** The TLS version ('TLSv1.3'). */
  protocol: string | null;
}

/** What a test HBONE server saw. */
export interface HboneServerRecord {
  secureConnections: number;
  /** The messages of the TLS handshakes that failed. */
  tlsErrors: string[];
  streams: HboneStreamRecord[];
  sessions: number;
}

/** A listening `startHboneServer`. */
export interface HboneServer {
  record: HboneServerRecord;
  server: Http2SecureServer;
  /** Destroys every session and closes the server. */
  close(): Promise<void>;
}

/**
 * An HBONE server on `host:port` (TLS 1.3, ALPN h2, client certificate required and verified against `ca`).
 * `onStream(stream, headers, session)` answers each request; the default answers CONNECT with 200 and echoes.
 * Records every session and stream: { sessions, streams: [{ headers, peerCert, remoteAddress, alpn, protocol }],
 * tlsErrors, secureConnections }.
 */
export function startHboneServer({ host, port = 15008, cert, key, ca, onStream = echoConnect }: HboneServerOptions): Promise<HboneServer> {
  const record: HboneServerRecord = { secureConnections: 0, tlsErrors: [], streams: [], sessions: 0 };
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
  const sessions = new Set<Http2Session>();
  server.on('secureConnection', () => record.secureConnections++);
  server.on('tlsClientError', (err) => record.tlsErrors.push(err.message));
  server.on('session', (s) => {
    record.sessions++;
    sessions.add(s);
    s.on('close', () => sessions.delete(s));
    s.on('error', () => undefined);
  });
  server.on('stream', (stream, headers) => {
    // A secure server's sessions run over TLS.
    const sock = stream.session!.socket as TLSSocket;
    record.streams.push({
      headers: { ...headers },
      peerCert: sock.getPeerCertificate(),
      remoteAddress: sock.remoteAddress,
      alpn: sock.alpnProtocol,
      protocol: sock.getProtocol(),
    });
    stream.on('error', () => undefined);
    onStream(stream, headers, stream.session!);
  });
  return new Promise((resolve, reject) => {
    server.once('error', (err) => reject(new Error(`cannot listen on ${host}:${port}: ${err.message}`)));
    server.listen({ host, port, exclusive: true }, () =>
      resolve({
        record,
        server,
        close: () =>
          new Promise<void>((done) => {
            for (const s of sessions) s.destroy();
            server.close(() => done());
          }),
      }),
    );
  });
}

/** CONNECT → 200 and echo every byte; anything else → 400. */
export function echoConnect(stream: ServerHttp2Stream, headers: IncomingHttpHeaders): void {
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
export async function echoRoundTrip(opts: HboneSessionOptions, authority: string): Promise<number> {
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

/** `tunnelAttempt`'s options: `hboneSession`'s and the CONNECT's target. */
export interface TunnelAttemptOptions extends HboneSessionOptions {
  /** The CONNECT's authority (`ip:port`). */
  target: string;
}

/**
 * The whole HBONE exchange with `host:15008` (handshake with `opts` as hboneSession's, h2, a CONNECT to `target`,
 * some bytes written). Resolves 'refused: <code> <message>' or 'tunnel open' (a 200, and the bytes went).
 */
export async function tunnelAttempt({ target, ...opts }: TunnelAttemptOptions): Promise<string> {
  let session: ClientHttp2Session;
  try {
    session = await hboneSession(opts);
  } catch (err) {
    return `refused: ${(err as NodeJS.ErrnoException).code ?? ''} ${(err as Error).message}`;
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
