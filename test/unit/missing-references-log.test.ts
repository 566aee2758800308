// A change that leaves many policy references unresolved (a file or a push whose workloads name a policy that is
// not there yet) is warned of in a bounded number of lines: the first few one by one, then one line with the rest;
// and only once the grace has passed without the policy arriving.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Logger } from 'pino';
import { createLogs } from '../../dist/log/logger.js';
import { MISSING_REFERENCES_LOGGED, MissingReferences, warnMissingReferences } from '../../dist/lifecycle/mesh.js';

/** One JSON log line, parsed. */
type LogLine = Record<string, unknown>;

function recordingLog(): { log: Logger; lines: LogLine[] } {
  const lines: LogLine[] = [];
  const logs = createLogs({ filter: { level: 'info', targets: {} }, format: 'json', sink: { write: (l) => void lines.push(JSON.parse(l) as LogLine) } });
  return { log: logs.root, lines };
}

const refs = (n: number, policies = 3): { uid: string; policy: string }[] => Array.from({ length: n }, (_, i) => ({ uid: `Kubernetes//Pod/ns/w${i}`, policy: `ns/p${i % policies}` }));

test('a few unresolved references: one warning each, naming the workload and the policy', () => {
  const { log, lines } = recordingLog();
  warnMissingReferences(log, refs(3));
  assert.equal(lines.length, 3);
  assert.deepEqual(lines.map((l) => [l.uid, l.policy]), [['Kubernetes//Pod/ns/w0', 'ns/p0'], ['Kubernetes//Pod/ns/w1', 'ns/p1'], ['Kubernetes//Pod/ns/w2', 'ns/p2']]);
  assert.ok(lines.every((l) => l.level === 'warn' || l.level === 40));
});

test('100k unresolved references: the first few, then one line with how many more', () => {
  const { log, lines } = recordingLog();
  warnMissingReferences(log, refs(100_000, 7));
  assert.equal(lines.length, MISSING_REFERENCES_LOGGED + 1);
  const last = lines.at(-1)!;
  assert.equal(last.more, 100_000 - MISSING_REFERENCES_LOGGED);
  assert.equal(last.references, 100_000);
  assert.equal(last.policies, 7);
});

test('none: nothing logged', () => {
  const { log, lines } = recordingLog();
  warnMissingReferences(log, []);
  assert.deepEqual(lines, []);
});

// istiod names a new policy in a workload about half a millisecond before it sends the policy (every `kubectl apply`
// of a selector policy; seen with a real istiod in test/e2e): MissingReferences warns only of references still
// unresolved once the grace has passed. Time is mocked (the grace's timer) and injected (its clock).
test('a reference resolved within the grace is never warned of; one still unresolved after it is, once', (t) => {
  t.mock.timers.enable({ apis: ['setTimeout'] });
  let now = 1_000;
  const { log, lines } = recordingLog();
  const refsTracker = new MissingReferences(log, 1_000, () => now);
  const [a, b] = refs(2);
  refsTracker.follow([a!, b!], []);
  assert.equal(refsTracker.waiting, 2);
  now += 1; // the policy of `a` arrives a moment later (istiod's push order)
  refsTracker.follow([], [a!]);
  now += 998;
  t.mock.timers.tick(999);
  assert.equal(lines.length, 0, 'nothing before the grace has passed');
  now += 1;
  t.mock.timers.tick(1);
  assert.deepEqual(lines.map((l) => [l.uid, l.policy, l.level]), [[b!.uid, b!.policy, 'warn']], 'the one still unresolved, warned of once');
  now += 10_000;
  t.mock.timers.tick(10_000);
  assert.equal(lines.length, 1, 'warned of once');
  assert.equal(refsTracker.waiting, 0);
  refsTracker.close();
});

test('references made unresolved again restart their grace; close() forgets them', (t) => {
  t.mock.timers.enable({ apis: ['setTimeout'] });
  let now = 0;
  const { log, lines } = recordingLog();
  const tracker = new MissingReferences(log, 1_000, () => now);
  const [a] = refs(1);
  tracker.follow([a!], []);
  now = 900;
  t.mock.timers.tick(900);
  tracker.follow([], [a!]);
  tracker.follow([a!], []); // named again (the policy removed, say): a new grace from here
  now = 1_100;
  t.mock.timers.tick(200);
  assert.equal(lines.length, 0, 'its first grace does not count');
  now = 1_900;
  t.mock.timers.tick(800);
  assert.equal(lines.length, 1);
  tracker.follow([a!], []);
  tracker.close();
  now = 5_000;
  t.mock.timers.tick(5_000);
  assert.equal(lines.length, 1, 'nothing after close()');
});
