// Small helpers for unit tests that run the daemon in-process against fakes: an HTTP GET to one of its servers
// (bound on 127.0.0.1 with a port the test reads back) and a bounded poll.
import assert from 'node:assert/strict';

/** What `get` resolves: the status code and the body as text. */
export interface GetResult {
  status: number;
  body: string;
}

/** `addr`: where the server listens (an AddressInfo, say): only its port is used, the host is 127.0.0.1. */
export async function get(addr: { port: number }, path: string, init?: RequestInit): Promise<GetResult> {
  const res = await fetch(`http://127.0.0.1:${addr.port}${path}`, init);
  return { status: res.status, body: await res.text() };
}

/** Polls `fn` (sync or async) every 20 ms until it returns a truthy value; fails the test after `timeoutMs`. */
export async function waitUntil(fn: () => unknown, what: string, timeoutMs = 5_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
