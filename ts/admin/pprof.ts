// ztunnel's profile endpoints, the same parameters and answers (pprof protobuf profiles, which `go tool pprof` reads):
// - /debug/pprof/profile: a CPU profile, seconds 1-300 (default 10), frequency 1-1000 Hz (default 100); the dataplane
//   samples the whole process (native host/src/profile.rs);
// - /debug/pprof/heap/profiling?activate=true|false: turns the heap profile's sampling on or off;
// - /debug/pprof/heap: the dataplane's live sampled allocations (native host/src/heap_profile.rs).
// This module only reads the queries and sends the bytes.
import type { ServerResponse } from 'node:http';
import { notRunning, reply } from './http.js';

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

/** Whether this process's admin is taking a CPU profile. */
let profiling = false;

/**
 * Answers a profile request: 200 with the profile, 400 for bad parameters, 409 while another profile runs; the
 * profile stops when its requester goes away.
 */
export function serveCpuProfile(
  q: URLSearchParams,
  res: ServerResponse,
  profile: (seconds: number, frequency: number) => Promise<Uint8Array>,
  /** Stops the profile: called when the requester goes away before it is done (no one would read it). */
  cancel?: () => void,
): void {
  const p = profileParams(q);
  if (typeof p === 'string') return reply(res, 400, p);
  // One profile at a time (the profiler is process-wide): a second request is answered here, so that only the
  // request that started the profile can cancel it.
  if (profiling) return reply(res, 409, 'a profile is already being taken\n');
  profiling = true;
  let done = false;
  res.once('close', () => {
    if (!done) cancel?.();
  });
  profile(p.seconds, p.frequency)
    .finally(() => {
      done = true;
      profiling = false;
    })
    .then(
      (bytes) => sendProfile(res, bytes),
      (err: unknown) => {
        const message = err instanceof Error ? err.message : String(err);
        reply(res, notRunning(err) ? 503 : /already being taken/.test(message) ? 409 : 500, `${message}\n`);
      },
    );
}

function sendProfile(res: ServerResponse, bytes: Uint8Array): void {
  res.writeHead(200, {
    'content-type': 'application/octet-stream',
    'content-disposition': 'attachment; filename="profile.pb"',
    'content-length': bytes.byteLength,
  });
  res.end(bytes);
}

/** /debug/pprof/heap/profiling: `activate` must be `true` or `false`; answers the state it leaves. */
export function serveHeapProfiling(q: URLSearchParams, res: ServerResponse, toggle: (on: boolean) => boolean): void {
  const activate = q.get('activate');
  if (activate !== 'true' && activate !== 'false') {
    return reply(res, 400, 'usage: /debug/pprof/heap/profiling?activate=true|false\n');
  }
  let on: boolean;
  try {
    on = toggle(activate === 'true');
  } catch (err) {
    return reply(res, 503, `${err instanceof Error ? err.message : String(err)}\n`);
  }
  reply(res, 200, on ? 'heap profiling is active\n' : 'heap profiling is inactive\n');
}

/** /debug/pprof/heap: 200 with the profile; 500 while the sampling is off, as ztunnel answers when jemalloc's is. */
export function serveHeapProfile(res: ServerResponse, profile: () => Promise<Uint8Array>): void {
  profile().then(
    (bytes) => sendProfile(res, bytes),
    (err: unknown) => {
      const message = err instanceof Error ? err.message : String(err);
      reply(res, notRunning(err) ? 503 : 500, `${message}\n`);
    },
  );
}
