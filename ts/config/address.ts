// "host:port" socket addresses for the admin/stats/readiness listeners. IPv6 hosts are bracketed ("[::]:15020").
import { isIP } from 'node:net';

export interface SocketAddress {
  /** An IP literal (no brackets) or "localhost". */
  readonly host: string;
  /** 0 asks the OS for a free port (tests use it). */
  readonly port: number;
}

/** Parses "host:port", or returns a string saying what is wrong. */
export function parseSocketAddress(text: string): SocketAddress | string {
  const m = /^(?:\[([^\]]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(text.trim());
  if (!m) return `"${text}" is not host:port (IPv6 as [addr]:port)`;
  const host = (m[1] ?? m[2]) as string;
  const port = Number(m[3]);
  if (port > 65535) return `"${text}": port ${port} is out of range`;
  if (m[1] !== undefined && isIP(host) !== 6) return `"${text}": ${host} is not an IPv6 address`;
  if (m[2] !== undefined && isIP(host) !== 4 && host !== 'localhost') {
    return `"${text}": ${host} is not an IPv4 address (or localhost)`;
  }
  return { host, port };
}

export function formatSocketAddress(addr: SocketAddress): string {
  return isIP(addr.host) === 6 ? `[${addr.host}]:${addr.port}` : `${addr.host}:${addr.port}`;
}

/** "ip:port" for an IP that may be IPv6, the format the native listeners take. */
export function joinHostPort(host: string, port: number): string {
  return formatSocketAddress({ host, port });
}
