// CRL_PATH on the control side (ts/ca/crl.ts): read at start and handed to the dataplane, followed afterwards.
// The dataplane's side (parsing, and handshakes refusing revoked peers both ways) is tested in Rust with real TLS
// (native/dataplane/tests/crl.rs); here the real native dataplane judges the PEM.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync, mkdirSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { followCrls } from '../../dist/ca/crl.js';
import { ConfigError } from '../../dist/errors.js';
import { createLogs } from '../../dist/log/logger.js';
import { openNativeDataplane } from '../helpers/native-dataplane.js';

const dir = mkdtempSync(join(tmpdir(), 'ztn-crl-'));
test.after(() => rmSync(dir, { recursive: true, force: true }));

function recordingLogs() {
  const lines = [];
  const logs = createLogs({ filter: { level: 'info', targets: {} }, format: 'json', sink: { write: (l) => void lines.push(JSON.parse(l)) } });
  return { log: logs.root, lines };
}

/** A dataplane stand-in that judges PEM the way the native one does (see the native test below), and records. */
function target(native) {
  const calls = [];
  return { calls, setCrls: (pem) => (calls.push(pem), native.setCrls(pem)) };
}

// The file is polled (watchFile) and read once settled: allow for a loaded machine (unit files run in parallel).
const until = async (cond, what) => {
  const deadline = Date.now() + 15_000;
  while (!cond() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  assert.ok(cond(), what);
};

test('the native dataplane refuses a PEM that is not a CRL, and takes an empty one as "no lists"', (t) => {
  const dp = openNativeDataplane();
  t.after(() => dp.shutdown());
  assert.equal(dp.setCrls(''), 0);
  assert.throws(() => dp.setCrls('-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n'), /INVALID_CRL/);
  assert.throws(() => dp.setCrls('garbage'), /INVALID_CRL: holds no X509 CRL block/);
});

test('an invalid or unreadable CRL_PATH stops the start, naming the file', async (t) => {
  const dp = openNativeDataplane();
  t.after(() => dp.shutdown());
  const { log } = recordingLogs();
  const bad = join(dir, 'bad.pem');
  writeFileSync(bad, 'garbage');
  await assert.rejects(followCrls(bad, dp, log), (err) => err instanceof ConfigError && err.message.startsWith(`CRL_PATH ${bad}: INVALID_CRL`));
  const notAFile = join(dir, 'a-directory');
  mkdirSync(notAFile);
  await assert.rejects(followCrls(notAFile, dp, log), (err) => err instanceof ConfigError && err.message.includes(`CRL_PATH ${notAFile}: cannot read it`));
});

test('an absent CRL_PATH warns, is watched for, and a bad update keeps the lists in force', async (t) => {
  const dp = openNativeDataplane();
  t.after(() => dp.shutdown());
  const tg = target(dp);
  const { log, lines } = recordingLogs();
  const path = join(dir, 'later.pem');
  const watch = await followCrls(path, tg, log);
  t.after(() => watch.stop());
  assert.equal(tg.calls.length, 0);
  assert.ok(lines.some((l) => l.message.includes('does not exist') && l.level === 'warn'));
  // fs.watchFile takes its first stat asynchronously: a file created before that is its starting point, not a change
  // (see the session note). Let the first polls happen before the file appears.
  await new Promise((r) => setTimeout(r, 300));
  // Created (as a ConfigMap update does: written aside, renamed into place): loaded.
  writeFileSync(`${path}.tmp`, '');
  renameSync(`${path}.tmp`, path);
  await until(() => tg.calls.length === 1, 'the new file is read');
  await until(() => lines.some((l) => l.message === 'certificate revocation lists reloaded'), 'and logged');
  // A bad update: refused, logged, and nothing else changes.
  writeFileSync(`${path}.tmp`, 'garbage');
  renameSync(`${path}.tmp`, path);
  await until(() => lines.some((l) => l.message.includes('could not be reloaded')), 'the refusal is logged');
  assert.equal(tg.calls.length, 2);
  // Removed: the lists in force stay (no call).
  rmSync(path);
  await until(() => lines.some((l) => l.message.includes('disappeared')), 'the disappearance is logged');
  assert.equal(tg.calls.length, 2);
});
