// The daemon's components (ts/lifecycle/daemon.ts): started in order, stopped in reverse by the drain, a failed start
// undone by the same drain, a stop that waits for its own start.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Daemon } from '../../dist/lifecycle/daemon.js';
import { Drain } from '../../dist/lifecycle/drain.js';
import { createLogs } from '../../dist/log/logger.js';
import type { Component } from '../../dist/lifecycle/daemon.js';

const quiet = () => createLogs({ filter: { level: 'off', targets: {} }, format: 'json', sink: { write: () => {} } }).root;

/** A component that records its start and stop in `seen`; `start` may be replaced. */
function part(name: string, seen: string[], start: () => unknown = () => undefined): Component {
  return {
    name,
    start: async () => {
      seen.push(`start ${name}`);
      await start();
    },
    stop: (mode, deadline) => void seen.push(`stop ${name} ${mode} ${deadline}`),
  };
}

test('components start in order; the drain begins their stops in reverse, with its mode and deadline', async () => {
  const seen: string[] = [];
  const drain = new Drain(40, quiet());
  const daemon = new Daemon(drain);
  assert.equal(await daemon.start(part('a', seen), part('b', seen)), true);
  assert.equal(await daemon.start(part('c', seen)), true);
  await drain.trigger('graceful', 'test');
  assert.deepEqual(seen, ['start a', 'start b', 'start c', 'stop c graceful 40', 'stop b graceful 40', 'stop a graceful 40']);
  // Nothing starts once the drain has begun.
  assert.equal(await daemon.start(part('late', seen)), false);
  assert.equal(seen.includes('start late'), false);
});

test('a start that fails: that component and those before it are stopped by the drain, those after never start', async () => {
  const seen: string[] = [];
  const drain = new Drain(1000, quiet());
  const daemon = new Daemon(drain);
  await assert.rejects(
    daemon.start(part('a', seen), part('b', seen, () => Promise.reject(new Error('port in use'))), part('c', seen)),
    /port in use/,
  );
  await drain.trigger('immediate', 'start failed');
  assert.deepEqual(seen, ['start a', 'start b', 'stop b immediate 0', 'stop a immediate 0']);
});

test('a drain that begins during a start stops that component once its start has settled', async () => {
  const seen: string[] = [];
  const drain = new Drain(1000, quiet());
  const daemon = new Daemon(drain);
  let finish: (() => void) | undefined;
  const slow = part('slow', seen, () => new Promise<void>((resolve) => (finish = resolve)));
  const starting = daemon.start(part('a', seen), slow, part('never', seen));
  while (finish === undefined) await new Promise(setImmediate);
  const drained = drain.trigger('graceful', 'signal');
  await new Promise(setImmediate);
  assert.deepEqual(seen, ['start a', 'start slow', 'stop a graceful 1000'], 'the slow one is not stopped mid-start');
  finish();
  assert.equal(await starting, false, 'the start reports the drain');
  await drained;
  assert.deepEqual(seen, ['start a', 'start slow', 'stop a graceful 1000', 'stop slow graceful 1000']);
});
