// The local config watcher reads a changed file only once it has held still: a truncate-then-write must not be
// seen as an empty config (which would remove every workload and tear their listeners down).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { LOCAL_CONFIG_SETTLE_MS, watchLocalConfig } from '../../dist/config/watch.js';

const doc = (name) => `workloads:\n- uid: u-${name}\n  name: ${name}\n  namespace: default\n  workloadIps: ["127.0.0.9"]\n`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test('a truncate-then-write is read once, whole; an invalid file is reported, not applied', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'ztn-watch-'));
  const path = join(dir, 'local.yaml');
  writeFileSync(path, doc('a'));
  const seen = [];
  const errors = [];
  const w = watchLocalConfig(path, (c) => seen.push(c.workloads.map((x) => x.name)), (e) => errors.push(String(e)));
  try {
    await sleep(300);
    writeFileSync(path, ''); // the truncation a writer does first
    await sleep(120); // longer than a poll interval: the empty file is observed
    writeFileSync(path, doc('bb'));
    await sleep(LOCAL_CONFIG_SETTLE_MS + 600);
    assert.deepEqual(seen, [['bb']], 'only the finished file was applied');
    writeFileSync(path, 'workloads: [{uid: x, workloadIps: ["999.1.1.1"]}]\n');
    await sleep(LOCAL_CONFIG_SETTLE_MS + 600);
    assert.deepEqual(seen, [['bb']]);
    assert.equal(errors.length, 1);
    assert.match(errors[0], /workloadIps\[0\]/);
  } finally {
    w.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
