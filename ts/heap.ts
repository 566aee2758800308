// The daemon's JavaScript heap after a large state batch (a first xDS push, a local config file of many thousands
// of records). Decoding such a batch leaves tens of MiB of garbage on the main thread: the response's buffers
// (external memory), the answer's JSON, the per-resource arrays. V8 only collects it when its memory reducer notices
// the daemon went idle, about 20 s later: measured at 100k workloads over xDS, RSS stayed at 272 MiB for 15-20 s and
// then fell to 222 MiB (JS heap 75 -> 27 MiB, external 31 -> 3 MiB). One full collection right after the batch
// gives that memory back at once, so what an operator sees after a push is what the daemon keeps.
//
// grpc-js (1.14.7, the latest) keeps the chunks of a stream's last message (its StreamDecoder's readPartialMessage)
// until the next message on that stream begins: after a 28.5 MB push, 28.5 MB that no collection can free until
// istiod sends anything else. So a large response is collected after twice: once when it is applied, once after
// the response that follows it.
//
// After the collection, the allocator's free heap goes back to the kernel (malloc_trim): the buffers just collected,
// and what the dataplane freed after its own end-of-batch trim (the answer's JSON): 235 -> 202 MiB at 100k.
//
// V8 exposes no collection to a program without `--expose-gc`; the flag is set at run time and the function is
// taken from a fresh context (the way Node's own tests reach it), once, on the first large batch.
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { releaseFreeHeap } from './native/index.js';

/** Batches of at least this many resources, and responses of at least this many bytes, are large. */
export const LARGE_BATCH = 1000;
export const LARGE_RESPONSE_BYTES = 1 << 20;

let gc: (() => void) | null = null;
let scheduled = false;

function collector(): () => void {
  if (gc === null) {
    setFlagsFromString('--expose-gc');
    gc = runInNewContext('gc') as () => void;
  }
  return gc;
}

/** Gives the free heap back; a trim that cannot run (no native module) costs only the memory, never the daemon. */
function trim(): void {
  try {
    releaseFreeHeap();
  } catch {
    // Nothing to give back without the native module: the collection alone has run.
  }
}

/** A full collection on the next turn of the event loop, at most one per turn however many ask. */
function collectSoon(): void {
  if (scheduled) return;
  scheduled = true;
  setTimeout(() => {
    scheduled = false;
    collector()();
    // V8 frees the collected buffers' memory on a background thread (its ArrayBuffer sweeper), after gc() returns.
    setTimeout(trim, 250).unref();
  }, 0).unref();
}

/** After a local config load (or any batch) of `resources` resources: collects when the batch was large. */
export function collectAfterBatch(resources: number): void {
  if (resources >= LARGE_BATCH) collectSoon();
}

/**
 * Follows one xDS stream's responses (sizes in bytes, in order, each called once it has been handled): collects
 * after a large one and after the one that follows it (see above).
 */
export function responseCollector(): (bytes: number) => void {
  let afterLarge = false;
  return (bytes) => {
    const large = bytes >= LARGE_RESPONSE_BYTES;
    if (large || afterLarge) collectSoon();
    afterLarge = large;
  };
}

/**
 * Once, a moment after ready: V8's most thorough collection (the one it runs before giving up on memory: compacting,
 * repeated while it frees more), then the free heap back to the kernel. Startup leaves the old space fragmented and,
 * on Node 22 and later, the V8 pages of the worker threads that ended (the config's and the local config's) pooled
 * for reuse: this collection gives both back, where the memory reducer only would after some tens of seconds. Node 20's
 * V8 (11.3) reads any argument as its older `gc(true)`, a young-generation collection: there only the trim does
 * much, which suits it (a full collection after start grew Node 20's committed heap, issue 14). Measured in
 * bench/results/README.md ("Issue 31: the daemon's private memory").
 * Returns the time it took, ms.
 */
export function settleHeap(): number {
  const t0 = performance.now();
  (collector() as (options?: { type: string; execution: string; flavor: string }) => void)({ type: 'major', execution: 'sync', flavor: 'last-resort' });
  const ms = performance.now() - t0;
  setTimeout(trim, 250).unref();
  return ms;
}
