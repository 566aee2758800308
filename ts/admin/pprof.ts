// GET /debug/pprof/profile: ztunnel's CPU profile endpoint, the same parameters and bounds (seconds 1-300, default 10;
// frequency 1-1000 Hz, default 100) and the same answer, a pprof protobuf profile (`go tool pprof` reads it). The
// dataplane samples the whole process (native profile.rs); this module only reads the query and sends the bytes.
import type { ServerResponse } from 'node:http';
import { reply } from './http.js';

export const PROFILE_USAGE = 'usage: GET /debug/pprof/profile[?seconds=<1-300, default 10>][&frequency=<1-1000 Hz, default 100>]\n';

/** The profile's parameters from the query, or the problem (ztunnel's bounds). */
export function profileParams(q: URLSearchParams): { seconds: number; frequency: number } | string {
  const read = (name: string, dflt: number, max: number): number | string => {
    const raw = q.get(name);
    if (raw === null || raw === '') return dflt;
    const v = Number(raw);
    return /^\d+$/.test(raw) && v >= 1 && v <= max ? v : `${name} must be an integer in 1..${max}, got ${JSON.stringify(raw)}\n`;
  };
  const seconds = read('seconds', 10, 300);
  const frequency = read('frequency', 100, 1000);
  if (typeof seconds === 'string') return seconds + PROFILE_USAGE;
  if (typeof frequency === 'string') return frequency + PROFILE_USAGE;
  return { seconds, frequency };
}

/** Answers a profile request: 200 with the profile, 400 for bad parameters, 409 while another profile runs. */
export function serveCpuProfile(
  q: URLSearchParams,
  res: ServerResponse,
  profile: (seconds: number, frequency: number) => Promise<Uint8Array>,
): void {
  const p = profileParams(q);
  if (typeof p === 'string') return reply(res, 400, p);
  profile(p.seconds, p.frequency).then(
    (bytes) => {
      res.writeHead(200, {
        'content-type': 'application/octet-stream',
        'content-disposition': 'attachment; filename="profile.pb"',
        'content-length': bytes.byteLength,
      });
      res.end(bytes);
    },
    (err: unknown) => {
      const message = err instanceof Error ? err.message : String(err);
      reply(res, /already being taken/.test(message) ? 409 : 500, `${message}\n`);
    },
  );
}
