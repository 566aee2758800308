#!/usr/bin/env node
// Lints .github/workflows with actionlint (expressions, job graph, action inputs, runner labels, and the `run:`
// scripts through shellcheck when it is on PATH). Skipped with a message when actionlint is absent locally; under CI
// (CI set) that is a failure. .ci/run installs the pinned version (scripts/tools.mjs).
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { capture, findTool, installHint, missing, root } from './tools.mjs';

const CHECK = 'actionlint';
const dir = join(root, '.github', 'workflows');
const files = existsSync(dir) ? readdirSync(dir).filter((f) => /\.ya?ml$/.test(f)).map((f) => join('.github', 'workflows', f)) : [];
if (files.length === 0) {
  console.error(`${CHECK} FAILED: no workflows in .github/workflows`);
  process.exit(1);
}
const actionlint = findTool('actionlint') ?? missing(CHECK, 'actionlint', installHint('actionlint'));
const shellcheck = findTool('shellcheck');
const args = ['-no-color', ...(shellcheck ? ['-shellcheck', shellcheck] : []), ...files];
const r = capture(actionlint, args, { cwd: root });
process.stdout.write(r.stdout);
process.stderr.write(r.stderr);
if (r.status !== 0) {
  console.error(`${CHECK} FAILED on ${files.length} workflow(s)`);
  process.exit(1);
}
const version = capture(actionlint, ['-version'], { cwd: root }).stdout.split('\n')[0];
console.log(`${CHECK} ${version}: ${files.length} workflow(s) clean (${files.join(', ')})${shellcheck ? ', run: scripts checked by shellcheck' : '; shellcheck absent, run: scripts not checked'}`);
