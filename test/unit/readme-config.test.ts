// README's configuration table documents every key of the one config schema (ts/config/schema.ts), the
// prefix families included (`XDS_HEADER_<name>`): a new variable without a row fails here.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { CONFIG_KEYS, PREFIX_KEYS } from '../../dist/config/index.js';

const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
const firstCells = readme
  .split('\n')
  .filter((l) => l.startsWith('| `'))
  .map((l) => l.split('|')[1]);

test('every schema key has a row in README\'s configuration table', () => {
  const missing = CONFIG_KEYS.filter((k) => !firstCells.some((c) => c.includes(`\`${k}\``)));
  assert.deepEqual(missing, []);
});

test('every prefix family has a row (as PREFIX<name>)', () => {
  const missing = PREFIX_KEYS.filter((p) => !firstCells.some((c) => c.includes(`\`${p}<`)));
  assert.deepEqual(missing, []);
});
