// What the XDS client and the CA client share about talking to istiod: the TLS channel (root CA from a file,
// SYSTEM or inline PEM; the URL's host as server name, plus an optional alternate name), and the per-request
// metadata (bearer token, re-read from its file on every request; clusterid; extra headers).
import { existsSync, readFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { checkServerIdentity, type PeerCertificate } from 'node:tls';
import * as grpc from '@grpc/grpc-js';
import { DEFAULT_AUTH_TOKEN_PATH } from '../config/defaults.js';
import { ConfigError } from '../errors.js';

export interface ControlPlaneTarget {
  /** https://host:port */
  address: string;
  /** A file path, "SYSTEM", or inline PEM. */
  rootCa: string;
  altHostname: string | null;
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

export function channelCredentials(t: ControlPlaneTarget): grpc.ChannelCredentials {
  const { host } = grpcTarget(t.address);
  const alt = t.altHostname;
  return grpc.credentials.createSsl(loadRootCa(t.rootCa), null, null, {
    // The URL's host, or the alternate name (ALT_*_HOSTNAME) when the certificate carries that one instead.
    checkServerIdentity: (_servername: string, cert: PeerCertificate) => {
      const err = checkServerIdentity(host, cert);
      if (err === undefined || alt === null) return err;
      return checkServerIdentity(alt, cert) === undefined ? undefined : err;
    },
  });
}

/** AUTH_TOKEN: a file (read on every call, so a rotated token is used on the next request) or the literal. */
export class TokenSource {
  constructor(private readonly setting: string | null) {}

  /** The token, or null when none is configured. Throws when the token file exists but is empty. */
  read(): string | null {
    const path = this.setting ?? DEFAULT_AUTH_TOKEN_PATH;
    if (existsSync(path)) {
      const token = readFileSync(path, 'utf8').trim();
      if (token === '') throw new Error(`the token file ${path} is empty`);
      return token;
    }
    // A setting that is not an existing file is the token itself; the default path is simply absent.
    return this.setting;
  }
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
