// The Node lines the daemons are measured on (issue 14: every figure on Node 20 and Node 24). The line of the Node
// running the harness is that Node (process.execPath). Any other line comes from npm only: the `node-linux-<arch>`
// package carries the official binary, installed with `npm install --no-save` into bench/.cache/node/<major>
// (gitignored, kept between runs like bench/.venv) the first time a run asks for it.
//
// A line's topologies are named after the base topology, with `@<major>` for every line but the running Node's:
// `ztunnel-node` and `ztunnel-node@24` when the harness runs on Node 20.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { DAEMON_NODE_FLAGS } from '../daemon-flags.mjs';

/** The running Node's major version, as a string ('20'). */
export const RUNNING_LINE = process.versions.node.split('.')[0];

/** Parses `--node-lines 20,24` into ['20', '24'] (sorted, unique); throws on anything but major versions. */
export function parseNodeLines(spec) {
  const lines = [...new Set(spec.split(',').map((s) => s.trim()).filter(Boolean))];
  if (lines.length === 0 || lines.some((l) => !/^\d+$/.test(l))) throw new Error(`--node-lines takes major versions (20,24), not ${spec}`);
  return lines.sort((a, b) => Number(a) - Number(b));
}

/** `base` on `line`: the plain name on the running Node's line, `base@<major>` on any other. */
export const onLine = (base, line) => (line === RUNNING_LINE ? base : `${base}@${line}`);

/** The base topology of a name (`ztunnel-node@24` → `ztunnel-node`), and its line (a plain name: the running Node's). */
export function splitLine(name) {
  const [base, line] = name.split('@');
  return { base, line: line ?? RUNNING_LINE };
}

function versionOf(binary) {
  const r = spawnSync(binary, ['--version'], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : null;
}

/**
 * The Node binary of one line: { line, binary, version, from } or { line, unavailable: reason }. Never throws: a
 * line that cannot be had leaves its topologies out of the run, with the reason in the result.
 */
export function ensureNodeLine(root, line, { install = true } = {}) {
  if (line === RUNNING_LINE) return { line, binary: process.execPath, version: process.version, from: 'the Node running the harness' };
  const pkg = `node-linux-${process.arch}`;
  const prefix = join(root, 'bench', '.cache', 'node', line);
  const binary = join(prefix, 'node_modules', pkg, 'bin', 'node');
  const started = Date.now();
  let version = existsSync(binary) ? versionOf(binary) : null;
  if (version === null || !version.startsWith(`v${line}.`)) {
    if (!install) return { line, unavailable: `no Node ${line} in ${prefix} (a run without --no-install installs ${pkg}@${line} there from npm)` };
    mkdirSync(prefix, { recursive: true });
    // A package.json of its own: npm would otherwise look for the project upwards and install into the repo's.
    writeFileSync(join(prefix, 'package.json'), '{ "private": true }\n');
    const r = spawnSync('npm', ['install', '--no-save', '--no-package-lock', '--ignore-scripts', '--no-audit', '--no-fund', '--prefix', prefix, `${pkg}@${line}`], { encoding: 'utf8' });
    if (r.status !== 0) return { line, unavailable: `npm install ${pkg}@${line} failed: ${(r.stderr || r.error?.message || '').trim().split('\n').slice(-3).join(' ')}` };
    version = existsSync(binary) ? versionOf(binary) : null;
    if (version === null || !version.startsWith(`v${line}.`)) return { line, unavailable: `${pkg}@${line} installed, but ${binary} does not run as Node ${line} (${version})` };
  }
  return { line, binary, version, from: `npm ${pkg}@${version.slice(1)}`, installSeconds: (Date.now() - started) / 1000 };
}

/** `ztunnel-node proxy` run by a line's binary, with the flags operators run it with: [command, args]. */
export const daemonArgv = (root, line) => [line.binary, [...DAEMON_NODE_FLAGS, join(root, 'bin', 'ztunnel-node.js'), 'proxy']];
