// The native loader: which platforms get a prebuilt package, and what the user reads when no binary loads.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  PREBUILT_PLATFORMS,
  nativeUnavailableMessage,
  platformPackage,
  platformTag,
} from '../../dist/native/index.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
/** The parts of package.json this file reads. */
interface PackageJson {
  name: string;
  napi: { targets: string[]; binaryName: string };
  files: string[];
  scripts: Record<string, string>;
}
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as PackageJson;

/** x86_64-unknown-linux-musl -> linux-x64-musl (napi-rs's platformArchABI for the targets we publish). */
function napiTag(triple: string): string {
  const m = /^(x86_64|aarch64)-unknown-linux-(gnu|musl)$/.exec(triple);
  assert.ok(m, `unexpected target ${triple}: extend napiTag and PREBUILT_PLATFORMS together`);
  return `linux-${m[1] === 'x86_64' ? 'x64' : 'arm64'}-${m[2]}`;
}

test('the prebuilt platforms are exactly package.json napi.targets, and the binary name matches', () => {
  assert.deepEqual([...PREBUILT_PLATFORMS].sort(), pkg.napi.targets.map(napiTag).sort());
  assert.equal(pkg.napi.binaryName, 'ztunnel-node');
  assert.equal(platformPackage('linux-arm64-musl'), `${pkg.name}-linux-arm64-musl`);
});

test('the root package ships the loader but no binary, and builds nothing at install time', () => {
  assert.ok(pkg.files.includes('dist/'));
  assert.ok(pkg.files.includes('!dist/native/*.node'), 'binaries travel in the platform packages only');
  for (const s of ['preinstall', 'install', 'postinstall']) assert.equal(pkg.scripts[s], undefined, `no ${s} script`);
});

test('a supported platform: the message names the platform, its package, and both ways out', () => {
  const m = nativeUnavailableMessage('linux-arm64-musl', ["Cannot find module 'ztunnel-node-linux-arm64-musl'"]);
  assert.match(m, /^no native binary for linux-arm64-musl: neither the prebuilt package ztunnel-node-linux-arm64-musl nor a local build/);
  assert.match(m, /optional dependencies enabled/);
  assert.match(m, /npm run build:native/);
  assert.match(m, /tried: Cannot find module 'ztunnel-node-linux-arm64-musl'/);
});

test('an unsupported platform: the message says nothing is published for it and lists what is', () => {
  const m = nativeUnavailableMessage('darwin-arm64');
  assert.match(m, /^no native binary for darwin-arm64: no prebuilt package is published for darwin-arm64 \(prebuilt: linux-x64-gnu, /);
  assert.match(m, /npm run build:native/);
  assert.doesNotMatch(m, /tried:/);
});

test('NAPI_RS_NATIVE_LIBRARY_PATH pointing nowhere: the CLI exits 1 with the message, naming this platform', () => {
  const missing = '/nonexistent/ztunnel-node.node';
  const r = spawnSync(process.execPath, [join(root, 'bin', 'ztunnel-node.js'), 'version'], {
    env: { ...process.env, NAPI_RS_NATIVE_LIBRARY_PATH: missing },
    encoding: 'utf8',
  });
  assert.equal(r.status, 1, r.stderr);
  assert.ok(r.stderr.includes(`no native binary for ${platformTag()}: NAPI_RS_NATIVE_LIBRARY_PATH=${missing} is set`), r.stderr);
  assert.ok(r.stderr.includes(platformPackage(platformTag())), r.stderr);
  assert.ok(r.stderr.includes(`Cannot find module '${missing}'`), r.stderr);
  assert.doesNotMatch(r.stderr, /wasi/i);
});
