#!/usr/bin/env node
// `npm test`: every check, in the order that fails fastest.
//   1. lint: rustfmt, clippy -D warnings, eslint, tsc --noEmit
//   2. cargo test (the Rust crates, unit and in-process integration)
//   3. build: the native module (release, incremental) and the TypeScript, so the suites run what is checked in
//   4. distribution: the install test (packed tarballs installed without Rust, then run) and the Helm chart checks
//      (lint, template, schema validation, env vs. the daemon's config); actionlint runs with step 1. A missing
//      helm/kubeconform/actionlint skips its check with a message, except under CI (.ci/run installs them).
//   5. node:test suites: test/unit, test/integration (real daemons on unique 127.x addresses), and test/netns
//      (real network namespaces; root only: elsewhere it prints that it was skipped and why)
// Set ZTN_TEST_SKIP_LINT=1 to skip step 1 while iterating locally.
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

function run(label, cmd, args, opts = {}) {
  const started = Date.now();
  console.log(`\n=== ${label}: ${cmd} ${args.join(' ')}`);
  const r = spawnSync(cmd, args, { cwd: root, stdio: 'inherit', ...opts });
  const secs = ((Date.now() - started) / 1000).toFixed(1);
  if (r.status !== 0) {
    console.error(`=== ${label} FAILED (exit ${r.status ?? r.signal}) after ${secs}s`);
    process.exit(r.status || 1);
  }
  console.log(`=== ${label} ok (${secs}s)`);
}

function testFiles(dir) {
  const abs = join(root, dir);
  if (!existsSync(abs)) return [];
  return readdirSync(abs, { recursive: true })
    .map(String)
    .filter((f) => f.endsWith('.test.js') || f.endsWith('.test.mjs'))
    .sort()
    .map((f) => join(dir, f));
}

/** Fails (listing them) when ts/native/generated holds files git does not track: a new Rust type's TS not committed. */
const UNTRACKED_GENERATED = `
const out = require('node:child_process').execFileSync('git', ['ls-files', '--others', '--exclude-standard', '--', 'ts/native/generated']).toString().trim();
if (out !== '') { console.error('generated but not committed:\\n' + out); process.exit(1); }`;

if (!process.env.ZTN_TEST_SKIP_LINT) {
  run('rustfmt', 'cargo', ['fmt', '--all', '--check']);
  run('clippy', 'cargo', ['clippy', '--workspace', '--all-targets', '--', '-D', 'warnings']);
  run('eslint', 'npx', ['eslint', '.']);
  run('tsc', 'npx', ['tsc', '-p', 'tsconfig.json', '--noEmit']);
  run('actionlint', 'node', ['scripts/actionlint.mjs']);
}
run('cargo test', 'cargo', ['test', '--workspace']);
run('build native', 'node', ['scripts/build-native.mjs', '--release']);
run('build ts', 'npx', ['tsc', '-p', 'tsconfig.json']);
// The generated loader and .d.ts are checked in (reviewable, usable without a Rust build); after the build above
// they must be unchanged, or the checked-in copies drifted from native/binding.
// So are the boundary's TypeScript types generated from the Rust ones (ts-rs, written by `cargo test` above into
// ts/native/generated): a Rust type changed without its TS copy committed fails here.
if (existsSync(join(root, '.git'))) {
  run('generated binding is current', 'git', ['diff', '--exit-code', '--', 'ts/native/binding.d.cts', 'ts/native/binding.cjs', 'ts/native/generated']);
  run('no generated boundary type is uncommitted', 'node', ['-e', UNTRACKED_GENERATED]);
}
// Distribution, after the build it uses, before the long suites (whose summary stays the run's last words).
run('install test', 'node', ['scripts/install-test.mjs']);
run('chart checks', 'node', ['scripts/chart-test.mjs']);

const suites = [...testFiles('test/unit'), ...testFiles('test/integration')];
const isRoot = typeof process.getuid === 'function' && process.getuid() === 0;
const netns = testFiles('test/netns');
if (netns.length > 0) {
  if (isRoot) suites.push(...netns);
  else console.log(`\n=== netns suite SKIPPED: ${netns.length} file(s) in test/netns need root (network namespaces, iptables); CI runs them as root`);
}
run('node:test', 'node', ['--test', '--test-concurrency=2', '--test-timeout=180000', ...suites]);
