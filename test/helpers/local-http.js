// Small helpers for unit tests that run the daemon in-process against fakes: an HTTP GET to one of its servers
// (bound on 127.0.0.1 with a port the test reads back) and a bounded poll.
import assert from 'node:assert/strict';

export async function get(addr, path, init) {
  const res = await fetch(`http://127.0.0.1:${addr.port}${path}`, init);
  return { status: res.status, body: await res.text() };
}

export async function waitUntil(fn, what, timeoutMs = 5_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
