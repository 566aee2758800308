// The local config watcher calls `reload` for a changed file only once it has held still: a truncate-then-write
// must not be seen as an empty config (which would remove every workload and tear their listeners down). Reloads
// never overlap, and a failing one is reported, not fatal to the watch.
//
// The polls and the settle delay run on node:test's mock timers: each tick of one poll interval is one poll, however
// busy the machine. The file and its stats are real; after each tick the test waits for that poll's stat to complete.
import { test } from 'node:test';
import type { TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, renameSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import type { Stats } from 'node:fs';
import { stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { LOCAL_CONFIG_POLL_MS, LOCAL_CONFIG_SETTLE_MS, watchLocalConfig } from '../../dist/config/watch.js';
import type { LocalConfigWatch, LocalConfigWatchOptions } from '../../dist/config/watch.js';

const doc = (name: string): string => `workloads:\n- uid: u-${name}\n  name: ${name}\n  namespace: default\n  workloadIps: ["127.0.0.9"]\n`;
/** Poll intervals from the poll that sees a change to the one by which its settle delay has run out. */
const SETTLE_POLLS = Math.ceil(LOCAL_CONFIG_SETTLE_MS / LOCAL_CONFIG_POLL_MS);
/** A whole second, so two files given it have the same mtime to the nanosecond. */
const ONE_TIME = 1_700_000_000;

/**
 * The real stat, recorded (the sizes each poll saw, the stats still in flight), and `polls(n)`: `n` poll intervals on
 * the mock timers, each followed by its stat and what the watcher does with it.
 */
function pollDriver(t: TestContext): {
  sizes: number[];
  recordedStat: (p: string) => Promise<Stats>;
  polls: (n: number) => Promise<void>;
} {
  const sizes: number[] = [];
  const inFlight = new Set<Promise<Stats>>();
  const recordedStat = (p: string): Promise<Stats> => {
    const s = stat(p).then((st) => (sizes.push(st.size), st));
    inFlight.add(s);
    void s.catch(() => {}).finally(() => inFlight.delete(s));
    return s;
  };
  const polls = async (n: number): Promise<void> => {
    for (let i = 0; i < n; i++) {
      t.mock.timers.tick(LOCAL_CONFIG_POLL_MS);
      while (inFlight.size > 0) await Promise.allSettled(inFlight);
      await new Promise((r) => setImmediate(r));
    }
  };
  return { sizes, recordedStat, polls };
}

test('a truncate-then-write is read once, whole; reloads do not overlap; a failing reload is reported', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout', 'setInterval'] });
  const dir = mkdtempSync(join(tmpdir(), 'ztn-watch-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'local.yaml');
  writeFileSync(path, doc('a'));

  const { sizes, recordedStat, polls } = pollDriver(t);

  const seen: string[] = [];
  const errors: string[] = [];
  let running = 0;
  let overlapped = false;
  let fail = false;
  /** A slow load: it ends when the test says so. */
  let finishLoad: (() => void) | null = null;
  const w = watchLocalConfig(
    path,
    async () => {
      overlapped ||= running > 0;
      running++;
      seen.push(readFileSync(path, 'utf8'));
      if (seen.length === 2) await new Promise<void>((r) => (finishLoad = r));
      running--;
      if (fail) throw new Error('refused');
    },
    (e) => errors.push(String(e)),
    { stat: recordedStat },
  );
  t.after(() => w.stop());
  await w.ready;

  await polls(SETTLE_POLLS + 1);
  assert.deepEqual(seen, [], 'the starting state is not a change');

  writeFileSync(path, ''); // the truncation a writer does first
  await polls(1);
  assert.equal(sizes.at(-1), 0, 'a poll saw the empty file');
  writeFileSync(path, doc('a'.repeat(10)));
  utimesSync(path, ONE_TIME, ONE_TIME);
  await polls(SETTLE_POLLS); // the poll that sees it, then all but the last one of its settle delay
  assert.deepEqual(seen, [], 'not read before it has held still for the settle delay');
  await polls(1);
  assert.deepEqual(seen, [doc('a'.repeat(10))], 'read once it held still, whole: the empty file was never read');

  // Replaced by rename (as a ConfigMap update does) with the same size and mtime: only the inode tells.
  writeFileSync(`${path}.tmp`, doc('b'.repeat(10)));
  utimesSync(`${path}.tmp`, ONE_TIME, ONE_TIME);
  renameSync(`${path}.tmp`, path);
  await polls(SETTLE_POLLS + 1);
  assert.deepEqual(seen.slice(1), [doc('b'.repeat(10))], 'a rename into place is a change');
  assert.equal(running, 1, 'that load is still running');

  // A change seen while that slow load runs: it settles, and waits for the load.
  writeFileSync(path, doc('ccc'));
  await polls(SETTLE_POLLS + 2);
  assert.equal(seen.length, 2, 'not read while the previous load runs');
  finishLoad!();
  await polls(1);
  assert.deepEqual(seen.slice(2), [doc('ccc')], 'read after it, in order');
  assert.equal(overlapped, false, 'reloads did not overlap');

  fail = true;
  writeFileSync(path, doc('dddd'));
  await polls(SETTLE_POLLS + 1);
  assert.equal(seen.length, 4);
  assert.deepEqual(errors, ['Error: refused']);

  // The watch goes on after a failure, and ends with stop().
  fail = false;
  writeFileSync(path, doc('eeeee'));
  await polls(SETTLE_POLLS + 1);
  assert.deepEqual(seen.slice(4), [doc('eeeee')]);
  w.stop();
  writeFileSync(path, doc('ffffff'));
  await polls(SETTLE_POLLS + 1);
  assert.equal(seen.length, 5, 'nothing is read after stop()');
});

test('a watch started from the state of an earlier read reloads a change made between that read and the watch', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout', 'setInterval'] });
  const dir = mkdtempSync(join(tmpdir(), 'ztn-watch-since-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'local.yaml');
  writeFileSync(path, doc('a'));
  utimesSync(path, ONE_TIME, ONE_TIME);
  // The daemon's first load read this state (config/off-thread.ts), then the file changed before the watch began.
  const read = await stat(path);
  const since = { mtimeMs: read.mtimeMs, size: read.size, ino: read.ino };
  writeFileSync(path, doc('bb'));
  utimesSync(path, ONE_TIME + 1, ONE_TIME + 1);

  const { recordedStat, polls } = pollDriver(t);
  const seen: string[] = [];
  const start = (opts: LocalConfigWatchOptions): LocalConfigWatch => watchLocalConfig(path, async () => void seen.push(readFileSync(path, 'utf8')), (e) => assert.fail(String(e)), { stat: recordedStat, ...opts });

  // Without `since` the starting state is the changed file: the change is lost (what `since` is for).
  const plain = start({});
  await plain.ready;
  await polls(SETTLE_POLLS + 2);
  plain.stop();
  assert.deepEqual(seen, [], 'a watch from its own start sees no change');

  const w = start({ since });
  t.after(() => w.stop());
  await w.ready;
  await polls(SETTLE_POLLS + 2);
  assert.deepEqual(seen, [doc('bb')], 'the change since the read is reloaded, once');
  await polls(SETTLE_POLLS + 2);
  assert.deepEqual(seen, [doc('bb')], 'and only once');
});

