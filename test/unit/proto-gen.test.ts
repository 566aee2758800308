// ts/gen/ is generated from proto/ by `npm run gen:proto` and committed; this regenerates into a temporary
// directory (offline: buf and protoc-gen-es come from node_modules) and fails on any difference.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../..', import.meta.url));

function files(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((d) => d.isFile())
    .map((d) => relative(dir, join(d.parentPath ?? d.path, d.name)))
    .sort();
}

test('ts/gen matches what proto/ generates', () => {
  const out = mkdtempSync(join(tmpdir(), 'ztn-gen-'));
  try {
    execFileSync(join(root, 'node_modules/.bin/buf'), ['generate', '--output', out], { cwd: root, stdio: 'pipe' });
    const fresh = join(out, 'ts/gen');
    const committed = join(root, 'ts/gen');
    assert.deepEqual(files(committed), files(fresh), 'generated file list drifted: run `npm run gen:proto`');
    for (const f of files(fresh)) {
      assert.equal(readFileSync(join(committed, f), 'utf8'), readFileSync(join(fresh, f), 'utf8'), `${f} drifted: run \`npm run gen:proto\``);
    }
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
});
