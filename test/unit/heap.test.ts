// ts/heap.ts: a large state batch's garbage is collected right after it, not ~20 s later when V8's memory reducer
// notices the daemon is idle. Observed through WeakRefs: an object only the test's WeakRef reaches is gone after the
// collection (a quiet test process allocates nothing that would collect it by itself meanwhile).
//
// The collection is a timer on the next turn of the event loop: it runs on node:test's mock timers, so the test fires
// it with a tick instead of waiting. A WeakRef's target stays alive until the end of the turn that made it (the
// language keeps it for that job), so each target is made a turn (a real setImmediate) before its collection.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { collectAfterBatch, responseCollector, LARGE_BATCH, LARGE_RESPONSE_BYTES } from '../../dist/heap.js';

/** A WeakRef to an old-generation-sized object nothing else holds. */
function garbage() {
  return new WeakRef({ blob: new Array(200_000).fill(0).map((_, i) => ({ i })) });
}

const nextTurn = () => new Promise((r) => setImmediate(r));

test('a large batch is followed by a full collection', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout'] });
  const small = garbage();
  collectAfterBatch(LARGE_BATCH - 1);
  await nextTurn();
  t.mock.timers.tick(0);
  const large = garbage();
  collectAfterBatch(LARGE_BATCH);
  await nextTurn();
  t.mock.timers.tick(0);
  assert.equal(large.deref(), undefined, 'collected after a large batch');
  // Whatever the small batch left is gone too by now (a full collection); what is checked is that the large one ran.
  assert.equal(small.deref(), undefined);
});

test('a large xDS response is collected after, and again after the response that follows it', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout'] });
  const handled = responseCollector();
  const first = garbage();
  handled(LARGE_RESPONSE_BYTES);
  await nextTurn();
  t.mock.timers.tick(0);
  assert.equal(first.deref(), undefined, 'after the large response');
  // grpc-js keeps the large response's chunks until the next message begins: a second collection after it.
  const second = garbage();
  handled(100);
  await nextTurn();
  t.mock.timers.tick(0);
  assert.equal(second.deref(), undefined, 'after the response following a large one');
});
