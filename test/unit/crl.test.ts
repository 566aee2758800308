// CRL_PATH on the control side (ts/ca/crl.ts): read at start and handed to the dataplane, followed afterwards.
// The dataplane's side (parsing, and handshakes refusing revoked peers both ways) is tested in Rust with real TLS
// (native/dataplane/tests/crl.rs); here the real native dataplane judges the PEM.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync, mkdirSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { followCrls } from '../../dist/ca/crl.js';
import { ConfigError, ZtunnelError } from '../../dist/errors.js';
import type { CrlTarget } from '../../dist/ca/crl.js';
import { createLogs } from '../../dist/log/logger.js';
import { openNativeDataplane } from '../helpers/native-dataplane.js';

/** One JSON log line. */
interface LogLine {
  message: string;
  level: string;
  [key: string]: unknown;
}

/** A wait for a line `match` accepts. */
interface Waiter {
  match: (line: LogLine) => boolean;
  found: (line: LogLine) => void;
}

const dir = mkdtempSync(join(tmpdir(), 'ztn-crl-'));
test.after(() => rmSync(dir, { recursive: true, force: true }));

/**
 * The log lines, and `logged(match, what)`: resolves with the first line `match` accepts, once it is logged. The
 * file is polled and read once settled (config/watch.ts) on real timers here: a bound that allows for a loaded
 * machine (unit files run in parallel) fails the wait, naming `what`.
 */
function recordingLogs() {
  const lines: LogLine[] = [];
  const waiters = new Set<Waiter>();
  const write = (l: string) => {
    const line = JSON.parse(l) as LogLine;
    lines.push(line);
    for (const w of waiters) if (w.match(line)) w.found(line);
  };
  const logs = createLogs({ filter: { level: 'info', targets: {} }, format: 'json', sink: { write } });
  const logged = (match: (line: LogLine) => boolean, what: string): Promise<LogLine> => {
    const already = lines.find(match);
    if (already !== undefined) return Promise.resolve(already);
    return new Promise((resolve, reject) => {
      const w: Waiter = {
        match,
        found: (line) => (waiters.delete(w), clearTimeout(bound), resolve(line)),
      };
      const bound = setTimeout(() => (waiters.delete(w), reject(new Error(`not logged within 15 s: ${what}`))), 15_000);
      waiters.add(w);
    });
  };
  return { log: logs.root, lines, logged };
}

/** A dataplane stand-in that judges PEM the way the native one does (see the native test below), and records. */
function target(native: CrlTarget) {
  const calls: string[] = [];
  return { calls, setCrls: (pem: string) => (calls.push(pem), native.setCrls(pem)) };
}

test('the native dataplane refuses a PEM that is not a CRL, and takes an empty one as "no lists"', (t) => {
  const dp = openNativeDataplane();
  t.after(() => dp.shutdown());
  assert.equal(dp.setCrls(''), 0);
  assert.throws(() => dp.setCrls('-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n'), (e) => e instanceof ZtunnelError && e.code === 'INVALID_CRL');
  assert.throws(() => dp.setCrls('garbage'), (e) => e instanceof ZtunnelError && e.code === 'INVALID_CRL' && e.message === 'holds no X509 CRL block');
});

test('an invalid or unreadable CRL_PATH stops the start, naming the file', async (t) => {
  const dp = openNativeDataplane();
  t.after(() => dp.shutdown());
  const { log } = recordingLogs();
  const bad = join(dir, 'bad.pem');
  writeFileSync(bad, 'garbage');
  await assert.rejects(followCrls(bad, dp, log), (err) => err instanceof ConfigError && err.message === `CRL_PATH ${bad}: holds no X509 CRL block`);
  const notAFile = join(dir, 'a-directory');
  mkdirSync(notAFile);
  await assert.rejects(followCrls(notAFile, dp, log), (err) => err instanceof ConfigError && err.message.includes(`CRL_PATH ${notAFile}: cannot read it`));
});

test('an absent CRL_PATH warns, is watched for, and a bad update keeps the lists in force', async (t) => {
  const dp = openNativeDataplane();
  t.after(() => dp.shutdown());
  const tg = target(dp);
  const { log, lines, logged } = recordingLogs();
  const path = join(dir, 'later.pem');
  const watch = await followCrls(path, tg, log);
  t.after(() => watch.stop());
  assert.equal(tg.calls.length, 0);
  assert.ok(lines.some((l) => l.message.includes('does not exist') && l.level === 'warn'));
  // The watch's first stat is its starting point: a file created before it completes is no change.
  await watch.ready;
  // Created (as a ConfigMap update does: written aside, renamed into place): loaded.
  writeFileSync(`${path}.tmp`, '');
  renameSync(`${path}.tmp`, path);
  await logged((l) => l.message === 'certificate revocation lists reloaded', 'the new file is read');
  assert.deepEqual(tg.calls, ['']);
  // A bad update: refused, logged, and nothing else changes.
  writeFileSync(`${path}.tmp`, 'garbage');
  renameSync(`${path}.tmp`, path);
  await logged((l) => l.message.includes('could not be reloaded'), 'the refusal is logged');
  assert.deepEqual(tg.calls, ['', 'garbage']);
  assert.equal(lines.filter((l) => l.message === 'certificate revocation lists reloaded').length, 1);
  // Removed: the lists in force stay (no call).
  rmSync(path);
  await logged((l) => l.message.includes('disappeared'), 'the disappearance is logged');
  assert.equal(tg.calls.length, 2);
});
