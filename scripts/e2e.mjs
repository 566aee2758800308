#!/usr/bin/env node
// `npm run e2e` (root): ztunnel-node in a real control plane on this machine (test/e2e/README.md).
//
//   1. what it needs: root; the Debian packages of scripts/tools.mjs E2E_DEBIAN_PACKAGES (installed when missing);
//      Envoy (the project's virtual environment); this checkout built (`npm install`)
//   2. the binaries, built from the Go module proxy where the cache lacks them: Kubernetes (test/e2e/go/kubernetes:
//      etcd, kube-apiserver, kube-controller-manager, kube-proxy, kubectl) and Istio (test/e2e/go/istio:
//      pilot-discovery, pilot-agent, install-cni, istio-cni, istioctl, the reference CNI plugins and cnitool), each
//      module into ${XDG_CACHE_HOME:-~/.cache}/ztunnel-node/e2e/<module>-<key>/, the key a hash of its go.mod, go.sum,
//      the Go version and the build flags: a warm run builds nothing
//   3. the node: a network namespace (its address, a default route), and inside it a private mount and PID namespace
//      whose PID 1 is a shell: there the suite (dist-test/e2e/cluster.test.js) brings up the control plane, the
//      node's runtime, Istio and ztunnel-node, runs the scenarios and prints the pass/fail count; whatever it leaves
//      running dies with that PID namespace
//   4. teardown: the node's namespace, the pods' namespace files, the cgroups runc left, the mount points made
//
// Logs: test-results/e2e/ (every program, every container, the runtime's own), kept after the run.
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, rmdirSync, statSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { E2E_DEBIAN_PACKAGES, findTool, root } from './tools.mjs';

const started = Date.now();
const say = (line) => console.log(`[e2e ${((Date.now() - started) / 1000).toFixed(0).padStart(4)} s] ${line}`);
const fail = (line) => {
  console.error(`e2e: ${line}`);
  process.exit(1);
};

if (process.getuid?.() !== 0) fail('needs root (network, mount and PID namespaces, iptables, runc): run it as root (sudo npm run e2e), as CI does');

// ---- 1. what it needs ------------------------------------------------------------------------------------------------

const missing = E2E_DEBIAN_PACKAGES.filter((p) => findTool(p.command) === undefined);
if (missing.length > 0) {
  const names = missing.map((p) => p.name);
  say(`installing Debian packages: ${names.join(' ')}`);
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  for (const args of [['update', '-qq'], ['install', '-y', '-qq', '--no-install-recommends', ...names]]) {
    const r = spawnSync('apt-get', args, { stdio: 'inherit', env });
    if (r.status !== 0) fail(`apt-get ${args.join(' ')} failed: install ${names.join(' ')} and run again`);
  }
}
const go = findTool('go') ?? fail('no Go toolchain (go on PATH or /usr/local/go/bin): the control plane is built with it');
for (const f of ['dist/index.js', 'dist-test/e2e/cluster.test.js']) {
  if (!existsSync(join(root, f))) fail(`${f} is missing: build this checkout first (npm install)`);
}
if (!readdirSync(join(root, 'dist', 'native')).some((f) => f.endsWith('.node'))) fail('the native module is not built (npm install builds it)');
const { ensureEnvoy } = await import('../bench/harness/envoy.mjs');
const envoy = ensureEnvoy();
if (envoy.unavailable) say(`Envoy unavailable (${envoy.unavailable}): the waypoint scenario will fail`);

// ---- 2. the binaries ---------------------------------------------------------------------------------------------------

const cacheRoot = join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'ztunnel-node', 'e2e');
const goVersion = execFileSync(go, ['env', 'GOVERSION'], { encoding: 'utf8' }).trim();

/** The pinned version of `module` in a go.mod's require lines. */
function required(gomod, module) {
  const m = new RegExp(`^\\s*(?:require\\s+)?${module.replace(/\./g, '\\.')} (v\\S+)`, 'm').exec(readFileSync(gomod, 'utf8'));
  if (!m) throw new Error(`${gomod} does not require ${module}`);
  return m[1];
}

const modules = [
  {
    name: 'kubernetes',
    dir: join(root, 'test', 'e2e', 'go', 'kubernetes'),
    ldflags: (gomod) => {
      const v = required(gomod, 'k8s.io/kubernetes');
      const [major, minor] = v.slice(1).split('.');
      return ['k8s.io/component-base/version', 'k8s.io/client-go/pkg/version'].flatMap((p) => [
        `-X ${p}.gitVersion=${v}`, `-X ${p}.gitMajor=${major}`, `-X ${p}.gitMinor=${minor}`, `-X ${p}.gitTreeState=clean`,
      ]);
    },
    outputs: { 'go.etcd.io/etcd/server/v3': 'etcd' },
  },
  {
    name: 'istio',
    dir: join(root, 'test', 'e2e', 'go', 'istio'),
    ldflags: (gomod) => {
      const moduleDir = goModuleDir('istio.io/istio', required(gomod, 'istio.io/istio'));
      const version = `${readFileSync(join(moduleDir, 'VERSION'), 'utf8').trim()}-dev`;
      const rev = required(gomod, 'istio.io/istio').split('-').pop();
      return [`-X istio.io/istio/pkg/version.buildVersion=${version}`, `-X istio.io/istio/pkg/version.buildGitRevision=${rev}`,
        '-X istio.io/istio/pkg/version.buildStatus=Clean', `-X istio.io/istio/pkg/version.buildTag=${version}`];
    },
    outputs: {},
  },
];

function goModuleDir(module, version) {
  const out = execFileSync(go, ['mod', 'download', '-json', `${module}@${version}`], { encoding: 'utf8' });
  return JSON.parse(out).Dir;
}

/** The module's tools (its go.mod `tool` lines). */
function tools(gomod) {
  const text = readFileSync(gomod, 'utf8');
  const block = /^tool \(\n([\s\S]*?)\n\)/m.exec(text);
  return (block ? block[1].split('\n') : []).map((l) => l.trim()).filter((l) => l && !l.startsWith('//'));
}

const bins = {};
for (const m of modules) {
  const gomod = join(m.dir, 'go.mod');
  const ldflags = ['-s', '-w', ...m.ldflags(gomod)].join(' ');
  const key = createHash('sha256').update(readFileSync(gomod)).update(readFileSync(join(m.dir, 'go.sum'))).update(goVersion).update(ldflags).digest('hex').slice(0, 16);
  const out = join(cacheRoot, `${m.name}-${key}`);
  bins[m.name] = out;
  if (existsSync(join(out, '.complete'))) {
    say(`${m.name}: built before (${out})`);
    continue;
  }
  const t0 = Date.now();
  say(`${m.name}: building ${tools(gomod).join(', ')} (${goVersion}) into ${out}`);
  rmSync(out, { recursive: true, force: true });
  mkdirSync(join(out, 'tmp'), { recursive: true });
  for (const pkg of tools(gomod)) {
    const name = m.outputs[pkg] ?? pkg.split('/').pop();
    const r = spawnSync(go, ['build', '-trimpath', `-ldflags=${ldflags}`, '-o', join(out, name), pkg], {
      cwd: m.dir,
      stdio: 'inherit',
      env: { ...process.env, GOFLAGS: '-buildvcs=false -mod=readonly', CGO_ENABLED: '0' },
    });
    if (r.status !== 0) fail(`building ${pkg} (${m.dir}) failed`);
  }
  rmSync(join(out, 'tmp'), { recursive: true, force: true });
  writeFileSync(join(out, '.complete'), `${goVersion}\n${ldflags}\n`);
  say(`${m.name}: built in ${((Date.now() - t0) / 1000).toFixed(0)} s`);
}
const istioModule = goModuleDir('istio.io/istio', required(join(root, 'test', 'e2e', 'go', 'istio', 'go.mod'), 'istio.io/istio'));
// The Gateway API's CRDs, at the version Istio requires (its module, in the Go module cache with Istio's).
const gatewayApi = JSON.parse(execFileSync(go, ['mod', 'download', '-json', 'sigs.k8s.io/gateway-api'], { cwd: join(root, 'test', 'e2e', 'go', 'istio'), encoding: 'utf8' })).Dir;
const helm = findTool('helm') ?? fail('helm is missing: npm test builds it (node scripts/tools.mjs ensure)');

// ---- 3. the node -------------------------------------------------------------------------------------------------------

const id = `ztn-e2e-${process.pid}`;
const logDir = join(root, 'test-results', 'e2e');
const work = join('/tmp', id);
rmSync(logDir, { recursive: true, force: true });
mkdirSync(logDir, { recursive: true });
mkdirSync(work, { recursive: true });
const NODE_IP = '172.30.0.10';
const ip = (...args) => execFileSync('ip', args, { stdio: ['ignore', 'pipe', 'pipe'] });
/** Mount points the suite binds the node's directories on, made here on the host where they did not exist. */
const MOUNT_POINTS = ['/etc/cni/net.d', '/opt/cni/bin', '/var/lib/cni', '/run/istio-cni', '/run/ztunnel'];
const madeMountPoints = [];
let code = 1;
try {
  ip('netns', 'add', id);
  ip('-n', id, 'link', 'set', 'lo', 'up');
  // The node's interface: one end of a veth pair whose other end goes nowhere (this kernel has no dummy links). The
  // node's address is on it, and everything the node does not know is routed out of it: a ClusterIP is routed, then
  // rewritten by kube-proxy before it leaves.
  ip('-n', id, 'link', 'add', 'node0', 'type', 'veth', 'peer', 'name', 'node0-peer');
  ip('-n', id, 'addr', 'add', `${NODE_IP}/32`, 'dev', 'node0');
  ip('-n', id, 'link', 'set', 'node0', 'up');
  ip('-n', id, 'link', 'set', 'node0-peer', 'up');
  ip('-n', id, 'route', 'add', 'default', 'dev', 'node0');
  execFileSync('ip', ['netns', 'exec', id, 'sysctl', '-qw', 'net.ipv4.ip_forward=1', 'net.ipv4.conf.all.route_localnet=1']);
  for (const p of MOUNT_POINTS) {
    if (existsSync(p)) continue;
    let top = p;
    while (!existsSync(join(top, '..'))) top = join(top, '..');
    madeMountPoints.push(top);
    mkdirSync(p, { recursive: true });
  }
  say(`node ${id}: ${NODE_IP}; the suite runs in its own mount and PID namespaces (logs: ${logDir})`);
  const env = {
    ...process.env,
    ZTN_E2E_ID: id,
    ZTN_E2E_NODE_IP: NODE_IP,
    ZTN_E2E_WORK: work,
    ZTN_E2E_LOGS: logDir,
    ZTN_E2E_K8S_BIN: bins.kubernetes,
    ZTN_E2E_ISTIO_BIN: bins.istio,
    ZTN_E2E_ISTIO_MODULE: istioModule,
    ZTN_E2E_GATEWAY_API_CRDS: join(gatewayApi, 'config', 'crd', 'standard'),
    ZTN_E2E_ENVOY: envoy.binary ?? '',
    ZTN_E2E_HELM: helm,
    ZTN_E2E_MOUNT_POINTS: MOUNT_POINTS.join(':'),
  };
  // Arguments given to this script go to node --test (`npm run e2e -- --test-name-pattern=waypoint`).
  const extra = process.argv.slice(2).map((a) => `'${a.replace(/'/g, "'\\''")}'`).join(' ');
  const suite = `node --enable-source-maps --test --test-reporter=spec --test-timeout=1800000 ${extra} ${join(root, 'dist-test', 'e2e', 'cluster.test.js')}`;
  // PID 1 of the node's PID namespace is this shell: the node's /proc/1/ns/net is the node's (istio-cni's node
  // agent enters it as the host's), and it reaps what the suite's processes leave.
  // nsenter, not `ip netns exec`: that one mounts a new /sys, and the cgroup hierarchies under it (runc's) with it.
  // --kill-child: if this script dies, the namespace's PID 1 gets SIGKILL, and every process of the node with it.
  const child = spawn('nsenter', [`--net=/run/netns/${id}`, 'unshare', '--mount', '--propagation', 'private', '--pid', '--fork',
    '--mount-proc', '--kill-child=SIGKILL', 'bash', '-c', `${suite}; code=$?; exit $code`], { stdio: 'inherit', env, cwd: root });
  const stop = (signal) => {
    say(`${signal}: stopping the node`);
    child.kill('SIGKILL');
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  const r = await new Promise((resolve) => child.on('exit', (status, signal) => resolve({ status: status ?? (signal ? 1 : 0) })));
  code = r.status ?? 1;
} finally {
  say('teardown');
  spawnSync('ip', ['netns', 'delete', id], { stdio: 'ignore' });
  for (const f of existsSync('/run/netns') ? readdirSync('/run/netns') : []) {
    if (f.startsWith(id)) {
      spawnSync('umount', ['-l', join('/run/netns', f)], { stdio: 'ignore' });
      rmSync(join('/run/netns', f), { force: true });
    }
  }
  for (const ctl of existsSync('/sys/fs/cgroup') ? readdirSync('/sys/fs/cgroup') : []) removeCgroups(join('/sys/fs/cgroup', ctl, id));
  for (const p of madeMountPoints.reverse()) rmSync(p, { recursive: true, force: true });
  rmSync(work, { recursive: true, force: true });
}
say(code === 0 ? 'passed' : `FAILED (exit ${code}); logs in ${logDir}`);
process.exit(code);

/** Removes a cgroup tree runc left (empty once its processes are gone), deepest first. */
function removeCgroups(dir) {
  try {
    if (!statSync(dir).isDirectory()) return;
  } catch {
    return;
  }
  for (const e of readdirSync(dir, { withFileTypes: true })) if (e.isDirectory()) removeCgroups(join(dir, e.name));
  try {
    rmdirSync(dir);
  } catch {
    // still in use, or not ours
  }
}
