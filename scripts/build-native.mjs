#!/usr/bin/env node
// Builds the napi-rs binding into ts/native/ (the loader `binding.cjs`, its `binding.d.cts`, and the
// platform `.node`), then copies the loader and the binary next to the compiled TypeScript in dist/native/.
// Usage: node scripts/build-native.mjs [--release] [--features ring]
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, readdirSync, renameSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const args = process.argv.slice(2);
const napiArgs = [
  'napi', 'build', '--platform',
  '--manifest-path', 'native/binding/Cargo.toml',
  '--package-json-path', 'package.json',
  '--output-dir', 'ts/native',
  '--js', 'binding.cjs',
  '--dts', 'binding.d.cts',
  ...args,
];
const r = spawnSync('npx', napiArgs, { cwd: root, stdio: 'inherit' });
if (r.status !== 0) {
  console.error(`native build failed (napi build exited ${r.status ?? r.signal})`);
  process.exit(r.status ?? 1);
}
const out = join(root, 'dist', 'native');
mkdirSync(out, { recursive: true });
// Copy then rename: a running daemon has the old .node mapped; overwriting it in place would corrupt it under the
// process, while a rename leaves the old inode intact until the process exits.
for (const f of readdirSync(join(root, 'ts', 'native'))) {
  if (!(f.endsWith('.node') || f === 'binding.cjs')) continue;
  const tmp = join(out, `.${f}.${process.pid}.tmp`);
  copyFileSync(join(root, 'ts', 'native', f), tmp);
  renameSync(tmp, join(out, f));
}
