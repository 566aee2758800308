// The control side of the hand-over (ts/lifecycle/handover.ts) against a scripted dataplane: when it takes the
// socket's name, which peers end the daemon, and what it counts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { HandoverTally, takeOverThenServe } from '../../dist/lifecycle/handover.js';
import { waitFor } from '../helpers/net.js';
import type { HandoverOptions, HandoverPort } from '../../dist/lifecycle/handover.js';
import type { HandoverReport } from '../../dist/native/types.js';

/** One pino line of the daemon's log. */
interface LogLine {
  msg: string;
  [key: string]: unknown;
}

// Without an `error` unless given: the dataplane leaves it out (undefined, as handover.ts reads it) when there is none.
const report = (r: Partial<HandoverReport>): HandoverReport => ({ role: 'give', found: false, connections: 0, kept: 0, durationMs: 1, pauseMs: 0, peerPid: 1, peerVersion: 1, peerNode: 'node-a', otherNode: false, phasesMs: [1, 2, 3], waves: 1, ...r }) as HandoverReport;

/** A dataplane whose take answers `taken`, whose listen fails `failListens` times, then hands out `given` in turn. */
function port(
  { taken, given = [], failListens = 0 }: { taken: HandoverReport; given?: HandoverReport[]; failListens?: number },
): HandoverPort & { calls: [string, string | boolean][] } {
  const calls: [string, string | boolean][] = [];
  let fails = failListens;
  const queue = [...given];
  return {
    calls,
    handoverTake: async (path) => (calls.push(['take', path]), taken),
    handoverListen: (path, replace) => {
      calls.push(['listen', replace]);
      if (fails-- > 0) throw new Error('INVALID_SPEC: HANDOVER_SOCKET x: x is served by a running daemon');
    },
    nextHandover: async () => queue.shift() ?? new Promise<never>(() => {}),
  };
}

function run(dp: HandoverPort, extra: Partial<HandoverOptions> = {}) {
  const lines: LogLine[] = [];
  const log = pino({ level: 'debug' }, { write: (l) => lines.push(JSON.parse(l)) });
  const tally = new HandoverTally();
  const successors: HandoverReport[] = [];
  const controller = new AbortController();
  const done = takeOverThenServe({ dp, socket: '/x', nodeName: 'node-a', log, counts: tally, onSuccessor: (r) => successors.push(r), signal: controller.signal, ...extra });
  return { done, lines, tally, successors, stop: () => controller.abort() };
}

const tick = () => new Promise((r) => setTimeout(r, 20));

test('after taking over from a daemon of this node the socket name is taken over; a stranger or another node does not end the daemon, a successor does', async () => {
  const dp = port({
    taken: report({ role: 'take', found: true, connections: 3 }),
    given: [report({ peerVersion: 0, error: 'not a hand-over frame' }), report({ otherNode: true, peerNode: 'node-b', error: 'refused' }), report({ connections: 5 })],
  });
  const r = run(dp);
  const taken = await r.done;
  assert.equal(taken.connections, 3);
  // The scripted peers are served in turn; the successor (the last) is announced after each is logged and counted.
  await waitFor(() => r.successors.length > 0, { timeoutMs: 5_000, intervalMs: 1, message: 'the successor' });
  assert.deepEqual(dp.calls, [['take', '/x'], ['listen', true]]);
  assert.equal(r.successors.length, 1, 'only the real successor ends this daemon');
  assert.equal(r.successors[0].connections, 5);
  assert.ok(r.lines.some((l) => l.msg === 'hand-over taken' && l.connections === 3));
  assert.ok(r.lines.some((l) => /another node/.test(l.msg)));
  assert.deepEqual(Object.fromEntries(r.tally.connections), { taken: 3, given: 5, kept: 0 });
  assert.equal(r.tally.exchanges.get('give/failed'), 2);
  assert.equal(r.tally.exchanges.get('give/done'), 1);
  r.stop();
});

test('with no predecessor the socket is taken only if free, and one that is served is waited for', async () => {
  // (Real timers: Node 20's mock timers do not clear an interval from its own callback.)
  const dp = port({ taken: report({ role: 'take', found: false, peerVersion: 0 }), failListens: 2 });
  const r = run(dp, { listenRetryMs: 5 });
  await r.done;
  assert.deepEqual(dp.calls.map((c) => c[0] + ':' + c[1]), ['take:/x', 'listen:false']);
  assert.ok(r.lines.some((l) => /listening once it is gone/.test(l.msg)));
  const listens = () => dp.calls.filter((c) => c[0] === 'listen').length;
  for (let i = 0; i < 100 && listens() < 3; i++) await tick();
  assert.equal(listens(), 3, 'retried until it listened');
  // A negative check: 40 ms is 8 retry periods in which a retry that kept going would have listened again.
  await tick();
  await tick();
  assert.equal(listens(), 3, 'and no more');
  assert.equal(r.tally.exchanges.size, 0, 'nothing found, nothing counted');
  r.stop();
});
