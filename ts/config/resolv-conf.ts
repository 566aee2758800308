// The daemon's resolver configuration (resolv.conf(5)): where the DNS proxy forwards what the mesh does not answer,
// and the search list that dedicated mode strips. Written by hand: the format is a few keywords per line, and the
// npm parsers for it either pull in a resolver or drop IPv6 scope handling.
import { readFileSync } from 'node:fs';
import { isIP } from 'node:net';

export interface ResolvConf {
  /** "ip:port" (IPv6 as [ip]:port), port 53, in file order. */
  nameservers: string[];
  search: string[];
}

export function parseResolvConf(text: string): ResolvConf {
  const nameservers: string[] = [];
  let search: string[] = [];
  let domain: string | null = null;
  for (const raw of text.split('\n')) {
    const line = raw.replace(/[#;].*$/, '').trim();
    if (line === '') continue;
    const [keyword, ...args] = line.split(/\s+/);
    if (keyword === 'nameserver' && args[0] !== undefined) {
      // A link-local IPv6 server may carry a zone (fe80::1%eth0): the dataplane dials it without one.
      const ip = args[0].replace(/%.*$/, '');
      const family = isIP(ip);
      if (family === 4) nameservers.push(`${ip}:53`);
      else if (family === 6) nameservers.push(`[${ip}]:53`);
    } else if (keyword === 'search') {
      search = args;
      domain = null;
    } else if (keyword === 'domain' && args[0] !== undefined) {
      // The last of `domain` and `search` wins (resolv.conf(5)).
      domain = args[0];
      search = [];
    }
  }
  return { nameservers, search: domain !== null ? [domain] : search };
}

/** The file parsed; a file that cannot be read has no servers (forwarded questions then get SERVFAIL). */
export function readResolvConf(path: string): ResolvConf & { error: string | null } {
  try {
    return { ...parseResolvConf(readFileSync(path, 'utf8')), error: null };
  } catch (e) {
    return { nameservers: [], search: [], error: `${path}: ${(e as Error).message}` };
  }
}
