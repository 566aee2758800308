// What the XDS client and the CA client share about talking to istiod: the TLS channel (root CA from a file,
// SYSTEM or inline PEM; the URL's host as server name, plus an optional alternate name), and the per-request
// metadata (bearer token, re-read from its file on every request; clusterid; extra headers).
//
// Invariants of the TLS channel:
// - The server is verified against the roots, then its certificate must name the URL's host, or the alternate
//   name (ALT_*_HOSTNAME) when one is set. Nothing else is accepted, whatever name was sent as SNI.
// - An IP literal is never sent as SNI (RFC 6066 forbids it; Node warns, DEP0123). grpc-js always sends the
//   target's host (or `grpc.ssl_target_name_override`), so the TLS connect is ours (`ControlPlaneCredentials`):
//   SNI is the alternate name for an IP target that has one, the host for a DNS name, and none otherwise.
import { existsSync, readFileSync } from 'node:fs';
import { isIP, type Socket } from 'node:net';
import { checkServerIdentity, connect as tlsConnect, createSecureContext, type PeerCertificate, type SecureContext } from 'node:tls';
import * as grpc from '@grpc/grpc-js';
import { ConfigError } from '../errors.js';
import { controlPlaneTls, type TlsPolicy } from '../config/tls.js';
import type { TokenSource } from './token.js';

export interface ControlPlaneTarget {
  /** https://host:port */
  address: string;
  /** A file path, "SYSTEM", or inline PEM. */
  rootCa: string;
  altHostname: string | null;
  /** TLS12_ENABLED and COMPLIANCE_POLICY (none: TLS 1.3, classical key exchange). */
  tls?: TlsPolicy;
}

/** host:port for grpc-js, from an https URL. */
export function grpcTarget(address: string): { target: string; host: string } {
  const url = new URL(address);
  const port = url.port || '443';
  return { target: `${url.hostname.includes(':') ? `[${url.hostname}]` : url.hostname}:${port}`, host: url.hostname.replace(/^\[|\]$/g, '') };
}

/** The trust roots: null = the OS/Node default roots (SYSTEM). A path that does not exist is inline PEM. */
export function loadRootCa(setting: string): Buffer | null {
  if (setting === 'SYSTEM') return null;
  if (existsSync(setting)) return readFileSync(setting);
  if (setting.includes('-----BEGIN CERTIFICATE-----')) return Buffer.from(setting);
  throw new ConfigError(`root CA ${JSON.stringify(setting)}: no such file, and not inline PEM`);
}

/**
 * Channel options for the TLS server name: an IP target with an alternate name uses that name for SNI (SNI may
 * not carry an IP); verification is ours either way (channelCredentials).
 */
export function serverNameOptions(t: ControlPlaneTarget): grpc.ChannelOptions {
  const { host } = grpcTarget(t.address);
  return isIP(host) !== 0 && t.altHostname !== null ? { 'grpc.ssl_target_name_override': t.altHostname } : {};
}

type ServerIdentityCheck = (hostname: string, cert: PeerCertificate) => Error | undefined;

/**
 * grpc-js's TLS credentials (createSsl) with one difference: an IP literal is never sent as SNI. They connect as
 * grpc-js's own do (the socket grpc-js opened, ALPN h2, the roots, rejectUnauthorized, the identity check) and
 * use grpc-js's extension point for credentials (`_createSecureConnector`, as grpc-js-xds's credentials do).
 */
class ControlPlaneCredentials extends grpc.ChannelCredentials {
  constructor(
    private readonly context: SecureContext,
    private readonly host: string,
    private readonly checkIdentity: ServerIdentityCheck,
  ) {
    super();
  }

  _isSecure(): boolean {
    return true;
  }

  _equals(other: grpc.ChannelCredentials): boolean {
    return other === this;
  }

  _createSecureConnector(
    _target: grpc.experimental.GrpcUri,
    options: grpc.ChannelOptions,
    callCredentials?: grpc.CallCredentials,
  ): grpc.experimental.SecureConnector {
    const override = options['grpc.ssl_target_name_override'] as unknown;
    const name = typeof override === 'string' && override !== '' ? override : this.host;
    const servername = isIP(name) === 0 ? name : undefined;
    const { context, checkIdentity } = this;
    return {
      connect: (socket: Socket) =>
        new Promise<grpc.experimental.SecureConnectResult>((resolve, reject) => {
          const tlsSocket = tlsConnect(
            { socket, secureContext: context, ALPNProtocols: ['h2'], checkServerIdentity: checkIdentity, ...(servername !== undefined && { servername }) },
            () => {
              // rejectUnauthorized (Node's default) fails the handshake first; grpc-js checks again, so do we.
              if (!tlsSocket.authorized) reject(tlsSocket.authorizationError);
              else resolve({ socket: tlsSocket, secure: true });
            },
          );
          tlsSocket.on('error', reject);
        }),
      waitForReady: () => Promise.resolve(),
      getCallCredentials: () => callCredentials ?? grpc.CallCredentials.createEmpty(),
      destroy: () => {},
    };
  }
}

export function channelCredentials(t: ControlPlaneTarget): grpc.ChannelCredentials {
  const { host } = grpcTarget(t.address);
  const alt = t.altHostname;
  const roots = loadRootCa(t.rootCa);
  // The URL's host, or the alternate name (ALT_*_HOSTNAME) when the certificate carries that one instead.
  const checkIdentity: ServerIdentityCheck = (_servername, cert) => {
    const err = checkServerIdentity(host, cert);
    if (err === undefined || alt === null) return err;
    return checkServerIdentity(alt, cert) === undefined ? undefined : err;
  };
  // No `ca` (SYSTEM) is Node's default roots, as grpc-js's createSsl(null).
  const context = createSecureContext({ ...controlPlaneTls(t.tls ?? { tls12: false, pqc: false, fips: false }), ...(roots !== null && { ca: roots }) });
  return new ControlPlaneCredentials(context, host, checkIdentity);
}

/** Metadata for one request: `authorization: Bearer` and `clusterid` when a token is configured, then extras. */
export function requestMetadata(token: TokenSource, clusterId: string, headers: Readonly<Record<string, string>>): grpc.Metadata {
  const md = new grpc.Metadata();
  const t = token.read();
  if (t !== null) {
    md.set('authorization', `Bearer ${t}`);
    md.set('clusterid', clusterId);
  }
  for (const [k, v] of Object.entries(headers)) md.set(k, v);
  return md;
}
