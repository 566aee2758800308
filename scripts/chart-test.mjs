#!/usr/bin/env node
// The Helm chart's tests (deploy/ztunnel-node), run by `npm test` after the build (it imports dist/config):
//   1. helm lint --strict, with the default values and with deploy/ztunnel-node/ci/nondefault-values.yaml; the
//      values schema (values.schema.json) rejects a misspelt key and a wrong type
//   2. helm template with both, then on each rendering:
//      - the DaemonSet keeps Istio's ztunnel pod contract: args, ports, readiness probe, capabilities, the
//        ServiceAccount `ztunnel`, priority class, tolerations, grace period, mounts;
//      - every env var it sets is in the README configuration table AND is a key the daemon's schema reads, and the
//        daemon's own config loader accepts the rendered environment (field refs given sample values);
//      - the files the env vars name (XDS_ROOT_CA, CA_ROOT_CA, AUTH_TOKEN) are where the volumes are mounted;
//   3. kubeconform -strict against the Kubernetes JSON schemas, offline: kubeconform downloads schemas by default,
//      and this machine reaches only package registries, so the schemas come from the PyPI package
//      `kubernetes-validate`, which bundles them per Kubernetes version (see prepareSchemas).
// Without helm (or kubeconform / the schemas) the check is skipped with a message; under CI it fails instead.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { parseAllDocuments } from 'yaml';
import { CONFIG_KEYS, loadConfig } from '../dist/config/index.js';
import { PINS, TOOLS_DIR, capture, findTool, installHint, missing, root } from './tools.mjs';

const CHECK = 'chart checks';
const chart = join(root, 'deploy', 'ztunnel-node');
const k8sVersion = PINS.kubernetesSchemas.kubernetes;
const started = Date.now();

function step(label, fn) {
  const t = Date.now();
  try {
    fn();
  } catch (err) {
    if (!(err instanceof assert.AssertionError)) throw err;
    const detail = err.generatedMessage ? '' : `\n  actual: ${JSON.stringify(err.actual)}\n  expected: ${JSON.stringify(err.expected)}`;
    console.error(`  FAILED  ${label}: ${err.message.split('\n')[0]}${detail}`);
    process.exit(1);
  }
  console.log(`  ok  ${label} (${((Date.now() - t) / 1000).toFixed(1)}s)`);
}

function run(cmd, args) {
  const r = capture(cmd, args, { cwd: root });
  if (r.status !== 0) {
    console.error(`${CHECK} FAILED: ${cmd} ${args.join(' ')} exited ${r.status ?? r.signal}\n${r.stdout}\n${r.stderr}`);
    process.exit(1);
  }
  return r.stdout;
}

/** Env var names in the README's "## Configuration" table (first column; a cell may name several). */
function readmeConfigNames() {
  const readme = readFileSync(join(root, 'README.md'), 'utf8');
  const start = readme.indexOf('\n## Configuration');
  assert.ok(start >= 0, 'README.md has no "## Configuration" section');
  const end = readme.indexOf('\n## ', start + 1);
  const names = new Set();
  for (const line of readme.slice(start, end < 0 ? undefined : end).split('\n')) {
    if (!line.startsWith('| `')) continue;
    const first = line.split('|')[1] ?? '';
    for (const m of first.matchAll(/`([A-Z][A-Z0-9_]*)`/g)) names.add(m[1]);
  }
  return names;
}

/** Sample values for what Kubernetes fills in from field references. */
const FIELD_SAMPLES = {
  'metadata.name': 'ztunnel-x7k2p',
  'metadata.namespace': 'istio-system',
  'spec.nodeName': 'node-1',
  'status.podIP': '10.244.1.7',
  'spec.serviceAccountName': 'ztunnel',
  'limits.cpu': '2',
};

function renderedEnv(container) {
  const env = {};
  for (const e of container.env) {
    if ('value' in e) env[e.name] = String(e.value);
    else {
      const ref = e.valueFrom?.fieldRef?.fieldPath ?? e.valueFrom?.resourceFieldRef?.resource;
      assert.ok(ref in FIELD_SAMPLES, `${e.name}: unexpected valueFrom ${JSON.stringify(e.valueFrom)}`);
      env[e.name] = FIELD_SAMPLES[ref];
    }
  }
  return env;
}

/** Checks one rendering against Istio's ztunnel pod contract and the daemon's configuration. */
function checkRendering(label, yamlText, expect) {
  const objects = parseAllDocuments(yamlText).map((d) => d.toJS()).filter(Boolean);
  const ds = objects.find((o) => o.kind === 'DaemonSet');
  const sa = objects.find((o) => o.kind === 'ServiceAccount');
  assert.ok(ds, `${label}: no DaemonSet`);
  assert.deepEqual(objects.map((o) => o.kind).sort(), ['DaemonSet', 'ServiceAccount']);
  assert.equal(ds.metadata.namespace, expect.namespace);
  assert.equal(sa.metadata.name, 'ztunnel', 'istiod trusts the ServiceAccount named ztunnel');
  assert.equal(sa.metadata.namespace, expect.namespace);
  const pod = ds.spec.template.spec;
  assert.equal(ds.spec.template.metadata.labels.app, 'ztunnel');
  assert.equal(ds.spec.template.metadata.labels['sidecar.istio.io/inject'], 'false');
  assert.equal(pod.serviceAccountName, 'ztunnel');
  assert.equal(pod.priorityClassName, expect.priorityClassName);
  assert.equal(pod.terminationGracePeriodSeconds, expect.grace);
  assert.equal(pod.nodeSelector['kubernetes.io/os'], 'linux');
  assert.ok(pod.tolerations.length > 0);
  assert.equal(pod.hostNetwork, undefined, 'the node proxy runs in its own pod network namespace, as ztunnel does');

  assert.equal(pod.containers.length, 1);
  const [c] = pod.containers;
  assert.deepEqual(c.args, ['proxy', 'ztunnel']);
  assert.equal(c.image, expect.image);
  assert.deepEqual(c.ports.map((p) => p.containerPort).sort(), [15008, 15020, 15021]);
  assert.deepEqual(c.readinessProbe.httpGet, { path: '/healthz/ready', port: 15021 });
  assert.equal(c.securityContext.privileged, false);
  assert.deepEqual(c.securityContext.capabilities, { drop: ['ALL'], add: ['NET_ADMIN', 'SYS_ADMIN', 'NET_RAW'] });
  assert.ok(c.resources?.requests?.cpu && c.resources.requests.memory, 'resource requests are set');

  // Environment: Istio's variables, all documented and read by the daemon.
  const names = c.env.map((e) => e.name);
  assert.equal(new Set(names).size, names.length, `${label}: an env var is set twice: ${names}`);
  for (const required of ['XDS_ADDRESS', 'CA_ADDRESS', 'ISTIO_META_CLUSTER_ID', 'POD_NAME', 'POD_NAMESPACE', 'NODE_NAME',
    'INSTANCE_IP', 'SERVICE_ACCOUNT', 'TERMINATION_GRACE_PERIOD_SECONDS', 'NETWORK', 'LOG_FORMAT', 'RUST_LOG',
    'XDS_ROOT_CA', 'CA_ROOT_CA', 'AUTH_TOKEN']) {
    assert.ok(names.includes(required), `${label}: ${required} is not set`);
  }
  const documented = readmeConfigNames();
  const read = new Set(CONFIG_KEYS);
  const undocumented = names.filter((n) => !documented.has(n));
  const unread = names.filter((n) => !read.has(n));
  assert.deepEqual(undocumented, [], `${label}: the chart sets env vars the README configuration table does not document`);
  assert.deepEqual(unread, [], `${label}: the chart sets env vars the daemon's config schema (ts/config/schema.ts) does not read`);
  const env = renderedEnv(c);
  assert.equal(env.TERMINATION_GRACE_PERIOD_SECONDS, String(pod.terminationGracePeriodSeconds));
  const cfg = loadConfig({ env, args: ['ztunnel'], allArgs: ['proxy', 'ztunnel'], cpuCount: 4 });
  assert.equal(cfg.proxyMode, 'shared');
  assert.equal(cfg.xdsAddress, expect.xds);
  assert.equal(cfg.caAddress, expect.ca);
  assert.equal(cfg.clusterId, expect.clusterId);
  assert.equal(cfg.logFormat, expect.logFormat);
  assert.equal(cfg.terminationDeadlineMs, expect.drainMs);

  // Mounts: the files the env vars name live in the volumes Istio's chart mounts.
  const mountOf = (volume) => c.volumeMounts.find((m) => m.name === volume.name)?.mountPath;
  const vol = (pred, what) => {
    const v = pod.volumes.find(pred);
    assert.ok(v, `${label}: no ${what} volume`);
    assert.ok(mountOf(v), `${label}: the ${what} volume is not mounted`);
    return v;
  };
  const rootCert = vol((v) => v.configMap?.name === 'istio-ca-root-cert', 'istio-ca-root-cert');
  assert.equal(env.XDS_ROOT_CA, `${mountOf(rootCert)}/root-cert.pem`);
  assert.equal(env.CA_ROOT_CA, `${mountOf(rootCert)}/root-cert.pem`);
  const token = vol((v) => v.projected?.sources?.some((s) => s.serviceAccountToken), 'projected token');
  const sat = token.projected.sources.find((s) => s.serviceAccountToken).serviceAccountToken;
  assert.equal(sat.audience, 'istio-ca');
  assert.equal(dirname(env.AUTH_TOKEN), mountOf(token));
  assert.equal(basename(env.AUTH_TOKEN), sat.path);
  const zds = vol((v) => v.hostPath?.path === '/var/run/ztunnel', 'ZDS hostPath');
  assert.equal(zds.hostPath.type, 'DirectoryOrCreate');
  assert.equal(mountOf(zds), '/var/run/ztunnel', 'istio-cni connects to /var/run/ztunnel/ztunnel.sock (INPOD_UDS default)');
  assert.equal(mountOf(vol((v) => v.emptyDir, '/tmp emptyDir')), '/tmp');
  return names;
}

/**
 * kubernetes-validate's wheel holds `kubernetes-json-schema/v<version>-local-strict/*.json`: draft 2020-12 schemas
 * whose $refs point at "/api/_definitions.json" (resolved by that package's own loader). kubeconform resolves $refs
 * as URLs against each schema's $id, so the refs are rewritten to the absolute file:// URL of _definitions.json, and
 * the directory is named the way kubeconform's -schema-location template expects. Done once, cached in .tmp/tools.
 */
function prepareSchemas() {
  const { pypi, version } = PINS.kubernetesSchemas;
  const out = join(TOOLS_DIR, 'k8s-schemas', `v${k8sVersion}-standalone-strict`);
  if (existsSync(join(out, '.complete'))) return join(TOOLS_DIR, 'k8s-schemas');
  const wheel = join(TOOLS_DIR, `${pypi.replace(/-/g, '_')}-${version}-py3-none-any.whl`);
  const python = findTool('python3');
  if (!existsSync(wheel) || !python) missing(CHECK, `the Kubernetes schemas (${wheel})`, installHint('kubernetesSchemas'));
  rmSync(out, { recursive: true, force: true });
  mkdirSync(out, { recursive: true });
  const extract = `
import sys, zipfile, os
wheel, prefix, out = sys.argv[1], sys.argv[2], sys.argv[3]
defs = 'file://' + os.path.join(out, '_definitions.json')
n = 0
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and name.endswith('.json'):
            text = z.read(name).decode('utf-8').replace('"/api/_definitions.json', '"' + defs)
            with open(os.path.join(out, name[len(prefix):]), 'w') as f:
                f.write(text)
            n += 1
print(n)
`;
  const prefix = `kubernetes_validate/kubernetes-json-schema/v${k8sVersion}-local-strict/`;
  const n = Number(run(python, ['-c', extract, wheel, prefix, out]).trim());
  assert.ok(n > 100, `only ${n} schemas for Kubernetes ${k8sVersion} in ${wheel}`);
  writeFileSync(join(out, '.complete'), `${n} schemas from ${pypi}==${version}\n`);
  return join(TOOLS_DIR, 'k8s-schemas');
}

const helm = findTool('helm') ?? missing(CHECK, 'helm', installHint('helm'));
console.log(`${CHECK}: ${helm} (${run(helm, ['version', '--short']).trim()})`);
const nondefault = join(chart, 'ci', 'nondefault-values.yaml');
const work = mkdtempSync(join(tmpdir(), 'ztn-chart-'));
try {
  const renders = {};
  step('helm lint --strict (default values)', () => run(helm, ['lint', '--strict', chart]));
  step('helm lint --strict (ci/nondefault-values.yaml)', () => run(helm, ['lint', '--strict', chart, '-f', nondefault]));
  step('values.schema.json rejects a misspelt key and a wrong type', () => {
    for (const bad of ['logAsJSON=true', 'terminationGracePeriodSeconds=thirty']) {
      const r = capture(helm, ['lint', '--strict', chart, '--set', bad], { cwd: root });
      assert.notEqual(r.status, 0, `helm lint accepted --set ${bad}`);
    }
  });
  step('helm template (default values)', () => {
    renders.default = join(work, 'default.yaml');
    writeFileSync(renders.default, run(helm, ['template', 'ztunnel', chart, '--namespace', 'istio-system', '--kube-version', k8sVersion]));
  });
  step('helm template (ci/nondefault-values.yaml)', () => {
    renders.nondefault = join(work, 'nondefault.yaml');
    writeFileSync(renders.nondefault, run(helm, ['template', 'ztunnel', chart, '--namespace', 'mesh-system', '--kube-version', k8sVersion, '-f', nondefault]));
  });
  const istiod = 'https://istiod.istio-system.svc:15012';
  step('default rendering: Istio ztunnel pod contract; env documented, read and accepted by the daemon', () => {
    checkRendering('default', readFileSync(renders.default, 'utf8'), {
      namespace: 'istio-system', image: 'ztunnel-node:0.1.0', priorityClassName: 'system-node-critical', grace: 30,
      xds: istiod, ca: istiod, clusterId: 'Kubernetes', logFormat: 'plain', drainMs: 25_000,
    });
  });
  step('non-default rendering: values reach the pod; env documented, read and accepted by the daemon', () => {
    const names = checkRendering('nondefault', readFileSync(renders.nondefault, 'utf8'), {
      namespace: 'mesh-system', image: 'registry.example.com/mesh/ztunnel-node:0.1.0-rc1',
      priorityClassName: 'system-cluster-critical', grace: 45,
      xds: 'https://istiod-canary.mesh-system.svc:15012', ca: 'https://istiod-ca.mesh-system.svc:15012',
      clusterId: 'east', logFormat: 'json', drainMs: 40_000,
    });
    for (const n of ['ISTIO_META_ISTIO_VERSION', 'ZTUNNEL_WORKER_THREADS', 'SECRET_TTL']) assert.ok(names.includes(n), n);
  });

  step('Dockerfile agrees with the chart (runtime, entrypoint, ports, working directory)', () => {
    const docker = readFileSync(join(root, 'Dockerfile'), 'utf8');
    const runtime = docker.slice(docker.lastIndexOf('\nFROM '));
    assert.match(runtime, /^\nFROM node:20[-\w.]*slim/, 'the runtime stage is a slim Node 20 image');
    assert.match(runtime, /apt-get install [^\n]*iptables iproute2/);
    assert.match(runtime, /^ENTRYPOINT \["node", "\/opt\/ztunnel-node\/bin\/ztunnel-node\.js"\]$/m);
    assert.match(runtime, /^CMD \["proxy", "ztunnel"\]$/m, 'the chart passes the same args as Istio\'s chart');
    // ztunnel's default file locations are relative to /; the chart names them absolutely, but keep both true.
    assert.match(runtime, /^WORKDIR \/$/m);
    assert.deepEqual(runtime.match(/^EXPOSE (.*)$/m)?.[1].split(/\s+/).map(Number).sort(), [15008, 15020, 15021]);
    // The image carries what the npm package ships (package.json "files"), next to its node_modules.
    const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
    for (const dir of pkg.files.filter((f) => f.endsWith('/') && !f.startsWith('!'))) {
      assert.match(runtime, new RegExp(`^COPY .* /opt/ztunnel-node/${dir.slice(0, -1)}$`, 'm'), `the image lacks ${dir}`);
    }
    assert.match(runtime, /^COPY --from=build \/src\/node_modules \/opt\/ztunnel-node\/node_modules$/m);
  });

  const kubeconform = findTool('kubeconform') ?? missing(`${CHECK} (kubeconform)`, 'kubeconform', installHint('kubeconform'));
  const schemas = prepareSchemas();
  step(`kubeconform -strict, Kubernetes ${k8sVersion} schemas from ${PINS.kubernetesSchemas.pypi}==${PINS.kubernetesSchemas.version} (offline)`, () => {
    const out = run(kubeconform, [
      '-strict', '-summary', '-kubernetes-version', k8sVersion,
      '-schema-location', `${schemas}/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json`,
      renders.default, renders.nondefault,
    ]);
    assert.match(out, /Summary: 4 resources found in 2 files - Valid: 4, Invalid: 0, Errors: 0, Skipped: 0/, out);
    // The schemas really are applied (a missing schema would be an error, but prove it on a broken rendering).
    const broken = join(work, 'broken.yaml');
    writeFileSync(broken, readFileSync(renders.default, 'utf8').replace('containerPort: 15020', 'containerPort: "15020"\n              hostPorts: 1'));
    const bad = capture(kubeconform, ['-strict', '-summary', '-kubernetes-version', k8sVersion, '-schema-location',
      `${schemas}/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json`, broken]);
    assert.notEqual(bad.status, 0, 'kubeconform accepted a DaemonSet with a string containerPort and an unknown field');
    assert.match(bad.stdout, /got string, want integer/);
    assert.match(bad.stdout, /additional properties 'hostPorts' not allowed/);
  });
  console.log(`${CHECK} ok (${((Date.now() - started) / 1000).toFixed(1)}s)`);
} finally {
  rmSync(work, { recursive: true, force: true });
}
