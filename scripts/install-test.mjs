#!/usr/bin/env node
// The install test: what a user gets from `npm install ztunnel-node` on a machine without Rust.
//   1. Stage the release the way the release workflow makes it, for this machine's platform only: the root package
//      (bin/, dist/, examples/, README.md) and, through napi-rs (`create-npm-dirs`, `artifacts`, `prepublish
//      --skip-optional-publish`), the platform package `ztunnel-node-<platform>` holding the already built
//      ts/native/ztunnel-node.<platform>.node; prepublish writes the root's optionalDependencies.
//   2. `npm pack` both (scripts ignored: packing must not build anything).
//   3. Install both tarballs into an empty directory with a PATH of only node's directory + /usr/bin:/bin, where
//      `cargo` and `rustc` are asserted absent.
//   4. Through the installed package: `npx ztunnel-node version`, then `npx ztunnel-node demo --no-wait` (two
//      daemons, one mTLS HBONE tunnel over loopback; both identities must come from the metrics).
//   5. Without the platform package, the CLI must fail with the message naming the platform and its package.
// Needs `npm run build` first (dist/ and ts/native/*.node); `npm test` runs it after the build.
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { PREBUILT_PLATFORMS, platformPackage, platformTag } from '../dist/native/index.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const started = Date.now();
const tag = platformTag();
const keep = process.env.ZTN_INSTALL_TEST_KEEP === '1';
const rustTriple = {
  'linux-x64-gnu': 'x86_64-unknown-linux-gnu',
  'linux-arm64-gnu': 'aarch64-unknown-linux-gnu',
  'linux-x64-musl': 'x86_64-unknown-linux-musl',
  'linux-arm64-musl': 'aarch64-unknown-linux-musl',
}[tag];

function fail(msg) {
  console.error(`install test FAILED: ${msg}`);
  process.exit(1);
}

function sh(cmd, args, opts = {}) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 120_000, ...opts });
  if (r.status !== 0 && !opts.allowFail) {
    fail(`${cmd} ${args.join(' ')} exited ${r.status ?? r.signal}\n${r.stdout ?? ''}\n${r.stderr ?? ''}`);
  }
  return r;
}

if (!PREBUILT_PLATFORMS.includes(tag) || !rustTriple) {
  console.log(`install test SKIPPED: no prebuilt package is made for ${tag}`);
  process.exit(0);
}
const binary = `ztunnel-node.${tag}.node`;
if (!existsSync(join(root, 'ts', 'native', binary)) || !existsSync(join(root, 'dist', 'cli', 'main.js'))) {
  fail(`ts/native/${binary} or dist/ is missing: run \`npm run build\` first`);
}

const work = mkdtempSync(join(tmpdir(), 'ztn-install-'));
const napi = join(root, 'node_modules', '.bin', 'napi');
try {
  // 1. Stage. The root package.json is the repo's, with napi.targets narrowed to this platform (napi artifacts and
  // prepublish insist on a binary for every target; the build matrix has them all, this machine has one).
  const stage = join(work, 'stage');
  mkdirSync(stage);
  const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
  pkg.napi.targets = [rustTriple];
  writeFileSync(join(stage, 'package.json'), `${JSON.stringify(pkg, null, 2)}\n`);
  for (const f of ['bin', 'dist', 'examples', 'README.md']) cpSync(join(root, f), join(stage, f), { recursive: true });
  mkdirSync(join(stage, 'artifacts'));
  cpSync(join(root, 'ts', 'native', binary), join(stage, 'artifacts', binary));
  sh(napi, ['create-npm-dirs'], { cwd: stage });
  sh(napi, ['artifacts', '--output-dir', 'artifacts'], { cwd: stage });
  sh(napi, ['prepublish', '-t', 'npm', '--skip-optional-publish', '--no-gh-release'], { cwd: stage });
  const staged = JSON.parse(readFileSync(join(stage, 'package.json'), 'utf8'));
  if (staged.optionalDependencies?.[platformPackage(tag)] !== pkg.version) {
    fail(`napi prepublish did not add ${platformPackage(tag)}@${pkg.version} to optionalDependencies: ${JSON.stringify(staged.optionalDependencies)}`);
  }

  // 2. Pack.
  const tarballs = join(work, 'tarballs');
  mkdirSync(tarballs);
  const pack = (dir) => {
    const r = sh('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', tarballs], { cwd: dir });
    const [info] = JSON.parse(r.stdout);
    return { file: join(tarballs, info.filename), files: info.files.map((f) => f.path), size: info.size };
  };
  const rootTgz = pack(stage);
  const platTgz = pack(join(stage, 'npm', tag));
  if (rootTgz.files.some((f) => f.endsWith('.node'))) fail(`the root tarball carries a binary: ${rootTgz.files.filter((f) => f.endsWith('.node'))}`);
  if (!rootTgz.files.includes('dist/native/binding.cjs')) fail('the root tarball lacks dist/native/binding.cjs');
  if (!platTgz.files.includes(binary)) fail(`the platform tarball lacks ${binary}: ${platTgz.files}`);
  console.log(`packed ${rootTgz.file} (${rootTgz.size} B) and ${platTgz.file} (${platTgz.size} B)`);

  // 3. Install into an empty directory, no Rust on PATH.
  const app = join(work, 'app');
  mkdirSync(app);
  writeFileSync(join(app, 'package.json'), '{ "name": "ztn-install-test", "version": "1.0.0", "private": true }\n');
  const PATH = [dirname(process.execPath), '/usr/bin', '/bin'].join(':');
  const env = { HOME: process.env.HOME ?? work, PATH, TMPDIR: tmpdir(), LANG: 'C.UTF-8' };
  for (const tool of ['cargo', 'rustc']) {
    const found = spawnSync('sh', ['-c', `command -v ${tool}`], { env, encoding: 'utf8' });
    if (found.status === 0) fail(`${tool} is on the test PATH (${found.stdout.trim()}); the install must be proven without Rust`);
  }
  const installStarted = Date.now();
  sh('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', platTgz.file, rootTgz.file], { cwd: app, env, timeout: 180_000 });
  console.log(`installed both tarballs with PATH=${PATH} (no cargo, no rustc) in ${((Date.now() - installStarted) / 1000).toFixed(1)}s`);
  const installed = join(app, 'node_modules', 'ztunnel-node');
  if (readdirSync(join(installed, 'dist', 'native')).some((f) => f.endsWith('.node'))) fail('the installed root package has a binary in dist/native');

  // 4. Run through the installed package.
  const npx = (args, opts = {}) => sh('npx', ['--no-install', 'ztunnel-node', ...args], { cwd: app, env, ...opts });
  const version = npx(['version']);
  if (!version.stdout.includes(`ztunnel-node ${pkg.version}`)) fail(`unexpected \`version\` output:\n${version.stdout}`);
  console.log(version.stdout.trim());
  const demo = npx(['demo', '--no-wait', '--ca-dir', join(work, 'ca')], { timeout: 60_000 });
  for (const [label, id] of [['source identity', 'sa/sleep'], ['destination identity', 'sa/echo']]) {
    const line = demo.stdout.split('\n').find((l) => l.trimStart().startsWith(label));
    if (!line || !line.includes(`spiffe://cluster.local/ns/default/${id}`) || line.includes('expected; not in metrics')) {
      fail(`the demo did not report the ${label} from its metrics:\n${demo.stdout}\n${demo.stderr}`);
    }
    console.log(line.trim());
  }

  // 5. The platform package removed: a clear failure naming the platform.
  rmSync(join(app, 'node_modules', platformPackage(tag)), { recursive: true });
  const missing = npx(['version'], { allowFail: true });
  const expected = `no native binary for ${tag}: neither the prebuilt package ${platformPackage(tag)} nor a local build`;
  if (missing.status !== 1 || !missing.stderr.includes(expected)) {
    fail(`without ${platformPackage(tag)}, expected exit 1 and "${expected}", got exit ${missing.status}:\n${missing.stderr}`);
  }
  console.log(`without ${platformPackage(tag)}: exit 1, "${missing.stderr.split('\n')[0].replace(/^ztunnel-node: /, '')}"`);
  console.log(`install test ok (${((Date.now() - started) / 1000).toFixed(1)}s)`);
} finally {
  if (keep) console.log(`kept ${work}`);
  else rmSync(work, { recursive: true, force: true });
}
