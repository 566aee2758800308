// ts/heap.ts: a large state batch's garbage is collected right after it, not ~20 s later when V8's memory reducer
// notices the daemon is idle. Observed through WeakRefs: an object only the test's WeakRef reaches is gone after the
// collection (a quiet test process allocates nothing that would collect it by itself within the wait).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { collectAfterBatch, responseCollector, LARGE_BATCH, LARGE_RESPONSE_BYTES } from '../../dist/heap.js';

/** A WeakRef to an old-generation-sized object nothing else holds. */
function garbage() {
  return new WeakRef({ blob: new Array(200_000).fill(0).map((_, i) => ({ i })) });
}

test('a large batch is followed by a full collection', async () => {
  const small = garbage();
  collectAfterBatch(LARGE_BATCH - 1);
  await sleep(100);
  const large = garbage();
  collectAfterBatch(LARGE_BATCH);
  await sleep(100);
  assert.equal(large.deref(), undefined, 'collected after a large batch');
  // Whatever the small batch left is gone too by now (a full collection); what is checked is that the large one ran.
  assert.equal(small.deref(), undefined);
});

test('a large xDS response is collected after, and again after the response that follows it', async () => {
  const handled = responseCollector();
  const first = garbage();
  handled(LARGE_RESPONSE_BYTES);
  await sleep(100);
  assert.equal(first.deref(), undefined, 'after the large response');
  // grpc-js keeps the large response's chunks until the next message begins: a second collection after it.
  const second = garbage();
  handled(100);
  await sleep(100);
  assert.equal(second.deref(), undefined, 'after the response following a large one');
});
