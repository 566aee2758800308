// Certificates on demand, control side: every identity the dataplane asks for becomes a RealTime request to the
// certificate manager; the loop ends when the dataplane answers empty (drain/shutdown), rejects, or on stop().
// The dataplane side (a handshake waits and asks; the long poll hears it once) is tested in Rust
// (identity/store.rs); the whole path runs in the integration suites.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { answerCertificateRequests } from '../../dist/lifecycle/certificates-on-demand.js';
import { CertificateManager } from '../../dist/ca/manager.js';
import { createLogs } from '../../dist/log/logger.js';
import { waitFor } from '../helpers/net.js';
import type { CertificateAuthority } from '../../dist/ca/authority.js';
import type { KeyStore, PriorityName } from '../../dist/ca/manager.js';

const logger = createLogs({ filter: { level: 'off', targets: {} }, format: 'json', sink: { write: () => {} } }).root;

/** A dataplane whose long poll answers from a script, one batch per call. */
function plane(batches: (string[] | Error)[]) {
  let calls = 0;
  return {
    get calls() {
      return calls;
    },
    nextCertificateRequests: async () => {
      const next = batches[calls++];
      if (next instanceof Error) throw next;
      return next ?? [];
    },
  };
}

test('each asked identity is ensured at RealTime priority; an empty answer ends the loop', async () => {
  const ensured: [string, PriorityName | undefined][] = [];
  const p = plane([['spiffe://td/ns/a/sa/x'], ['spiffe://td/ns/b/sa/y', 'spiffe://td/ns/c/sa/z'], []]);
  const { done } = answerCertificateRequests(p, { ensure: async (id, prio) => (ensured.push([id, prio]), true) }, logger);
  await done;
  assert.deepEqual(ensured, [
    ['spiffe://td/ns/a/sa/x', 'RealTime'],
    ['spiffe://td/ns/b/sa/y', 'RealTime'],
    ['spiffe://td/ns/c/sa/z', 'RealTime'],
  ]);
  assert.equal(p.calls, 3, 'asked again after each answer, and stopped at the empty one');
});

test('a rejected long poll (the dataplane shut down) ends the loop without throwing', async () => {
  const p = plane([['spiffe://td/ns/a/sa/x'], new Error('runtime gone')]);
  const ensured: string[] = [];
  const { done } = answerCertificateRequests(p, { ensure: async (id) => (ensured.push(id), true) }, logger);
  await done;
  assert.deepEqual(ensured, ['spiffe://td/ns/a/sa/x']);
  assert.equal(p.calls, 2);
});

test('a RealTime ask overtakes queued prefetches, and forget frees the identity in the key store', async () => {
  const order: string[] = [];
  const forgotten: string[] = [];
  let release: (() => void) | undefined;
  const gate = new Promise<void>((r) => (release = r));
  const keys: KeyStore = {
    createCsr: (id) => `csr:${id}`,
    installCertificate: () => {
      throw new Error('not reached');
    },
    forgetIdentity: (id) => forgotten.push(id),
  };
  // One request slot: the first prefetch holds it until released; the others queue.
  const ca: CertificateAuthority = { sign: async (_csr, id) => (order.push(id), await gate, Promise.reject(new Error('stop here'))) };
  const m = new CertificateManager({ keys, ca, ttlSeconds: 3600, logger, maxConcurrent: 1 });
  void m.ensure('spiffe://td/ns/p/sa/first', 'Warmup');
  void m.ensure('spiffe://td/ns/p/sa/second', 'Warmup');
  void m.ensure('spiffe://td/ns/p/sa/third', 'Background');
  void m.ensure('spiffe://td/ns/p/sa/asked', 'RealTime');
  release!();
  // The slot freed by the first request goes to the next sign call.
  await waitFor(() => order.length >= 2, { timeoutMs: 5_000, intervalMs: 1, message: 'the second request to reach the CA' });
  assert.deepEqual(order.slice(0, 2), ['spiffe://td/ns/p/sa/first', 'spiffe://td/ns/p/sa/asked']);
  m.forget('spiffe://td/ns/p/sa/asked');
  assert.deepEqual(forgotten, ['spiffe://td/ns/p/sa/asked']);
  m.stop();
});
