// The local config watcher calls `reload` for a changed file only once it has held still: a truncate-then-write
// must not be seen as an empty config (which would remove every workload and tear their listeners down). Reloads
// never overlap, and a failing one is reported, not fatal to the watch.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { LOCAL_CONFIG_SETTLE_MS, watchLocalConfig } from '../../dist/config/watch.js';

const doc = (name) => `workloads:\n- uid: u-${name}\n  name: ${name}\n  namespace: default\n  workloadIps: ["127.0.0.9"]\n`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test('a truncate-then-write is read once, whole; reloads do not overlap; a failing reload is reported', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'ztn-watch-'));
  const path = join(dir, 'local.yaml');
  writeFileSync(path, doc('a'));
  const seen = [];
  const errors = [];
  let running = 0;
  let overlapped = false;
  let fail = false;
  const w = watchLocalConfig(
    path,
    async () => {
      overlapped ||= running > 0;
      running++;
      seen.push(readFileSync(path, 'utf8'));
      await sleep(400); // a slow load: a change seen meanwhile must wait for it
      running--;
      if (fail) throw new Error('refused');
    },
    (e) => errors.push(String(e)),
  );
  try {
    await sleep(300);
    writeFileSync(path, ''); // the truncation a writer does first
    await sleep(120); // longer than a poll interval: the empty file is observed
    writeFileSync(path, doc('bb'));
    await sleep(LOCAL_CONFIG_SETTLE_MS + 200);
    writeFileSync(path, doc('ccc')); // while the reload of 'bb' runs
    await sleep(LOCAL_CONFIG_SETTLE_MS + 1_200);
    assert.deepEqual(seen, [doc('bb'), doc('ccc')], 'only finished files were read, in order');
    assert.equal(overlapped, false, 'reloads did not overlap');
    fail = true;
    writeFileSync(path, doc('dddd'));
    await sleep(LOCAL_CONFIG_SETTLE_MS + 900);
    assert.equal(seen.length, 3);
    assert.deepEqual(errors, ['Error: refused']);
  } finally {
    w.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
