// Large changes in event-loop-sized pieces. Converting 100k workloads, applying them to the store and handing them to
// the dataplane costs seconds of main-thread CPU; done in one go it stops readiness, metrics and admin from
// answering for that long. So a large change (a local config file, a first xDS push) is applied as a sequence of
// chunks of at most STATE_CHUNK_RESOURCES resources, one per event-loop turn (`nextTurn` between them).
//
// Invariants:
// - `splitChange` keeps the meaning of the whole change whatever order its chunks go in: it first reads the change
//   the way StateStore.apply reads one batch (the last upsert of a key wins; an upsert cancels a removal of the
//   same key), so no key is both upserted and removed.
// - Chunks follow references: policies, then services, then workloads (a workload never transiently names a policy
//   or service that arrives in a later chunk), then the removals of workloads, services, policies (nothing
//   transiently names a resource the same change removes and stops naming).
// - At least one chunk, possibly empty: the first apply of an empty file still sends the dataplane its full
//   (empty) state, as one unchunked apply did.
import { policyKey, serviceKey, type Policy, type ServiceInfo, type WorkloadInfo } from './model.js';
import type { StateChange } from './store.js';

/**
 * Resources per chunk. Measured on 2 busy cores (bench/large-input.mjs): a resource costs 30-90 µs of main-thread
 * time from its JSON chunk (or protobuf) to the dataplane's return, so 1000 keep one turn under ~100 ms while
 * 100k workloads still take only 100 turns.
 */
export const STATE_CHUNK_RESOURCES = 1000;

/** Resolves on the next turn of the event loop, after pending I/O (an HTTP request waiting to be answered). */
export function nextTurn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/** The resources a change touches (upserts + removals). */
export function changeSize(c: StateChange): number {
  return (
    (c.workloads?.length ?? 0) +
    (c.removedWorkloads?.length ?? 0) +
    (c.services?.length ?? 0) +
    (c.removedServices?.length ?? 0) +
    (c.policies?.length ?? 0) +
    (c.removedPolicies?.length ?? 0)
  );
}

/** `change` as chunks of at most `size` resources, in reference order (see the invariants above). */
export function splitChange(change: StateChange, size = STATE_CHUNK_RESOURCES): StateChange[] {
  const lastWins = <T>(items: T[] | undefined, key: (t: T) => string) => new Map((items ?? []).map((t) => [key(t), t]));
  const policies = lastWins(change.policies, policyKey);
  const services = lastWins(change.services, serviceKey);
  const workloads = lastWins(change.workloads, (w: WorkloadInfo) => w.uid);
  const removed = (keys: string[] | undefined, upserted: ReadonlyMap<string, unknown>) => [...new Set(keys ?? [])].filter((k) => !upserted.has(k));

  type Item =
    | { kind: 'policies'; value: Policy }
    | { kind: 'services'; value: ServiceInfo }
    | { kind: 'workloads'; value: WorkloadInfo }
    | { kind: 'removedWorkloads' | 'removedServices' | 'removedPolicies'; value: string };
  const items: Item[] = [
    ...[...policies.values()].map((value): Item => ({ kind: 'policies', value })),
    ...[...services.values()].map((value): Item => ({ kind: 'services', value })),
    ...[...workloads.values()].map((value): Item => ({ kind: 'workloads', value })),
    ...removed(change.removedWorkloads, workloads).map((value): Item => ({ kind: 'removedWorkloads', value })),
    ...removed(change.removedServices, services).map((value): Item => ({ kind: 'removedServices', value })),
    ...removed(change.removedPolicies, policies).map((value): Item => ({ kind: 'removedPolicies', value })),
  ];
  const chunks: StateChange[] = [];
  for (let i = 0; i < items.length; i += size) {
    const chunk: StateChange = {};
    for (const item of items.slice(i, i + size)) ((chunk[item.kind] ??= []) as unknown[]).push(item.value);
    chunks.push(chunk);
  }
  return chunks.length > 0 ? chunks : [{}];
}
