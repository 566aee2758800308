// A change that leaves many policy references unresolved (a file or a push whose workloads name a policy that is
// not there yet) is warned of in a bounded number of lines: the first few one by one, then one line with the rest.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Logger } from 'pino';
import { createLogs } from '../../dist/log/logger.js';
import { MISSING_REFERENCES_LOGGED, warnMissingReferences } from '../../dist/lifecycle/mesh.js';

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
