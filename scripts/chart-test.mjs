#!/usr/bin/env node
// The Helm chart's tests (deploy/ztunnel-node), run by `npm test` after the build (it imports dist/config). The
// chart is a drop-in for Istio's ztunnel chart: the same values interface and, for the same values, the same
// DaemonSet. Checked here:
//   1. helm lint --strict with the default values and with ci/nondefault-values.yaml (every key turned); the values
//      schema refuses a misspelt key, a wrong type and the old object-valued `image`; an unknown profile, platform,
//      compatibility version or resource scope fails with a message;
//   2. helm template for the ways Istio documents installing its ztunnel chart (the default, --set profile=ambient, a
//      revision, multi-network through global.*, OpenShift, GKE, a compatibility version) and the non-default file;
//      on each rendering:
//      - the resources rendered, and the DaemonSet field by field against what Istio's chart renders for the same
//        values (ISTIO below: facts read from Istio's templates and values, with the version they come from),
//        allowing only the documented differences (DIFFERENCES; README lists them too);
//      - every env var it sets is in the README configuration table and is a key the daemon's schema reads, and the
//        daemon's own config loader accepts the rendered environment (field refs given sample values);
//      - the files the daemon reads by default (root certificate, token: ztunnel's relative paths, from the image's
//        working directory /) are where the volumes are mounted;
//   3. kubeconform -strict on every rendering, against the Kubernetes JSON schemas, offline: kubeconform downloads
//      schemas by default, and this machine reaches only package registries, so the schemas come from the PyPI
//      package `kubernetes-validate`, which bundles them per Kubernetes version (see prepareSchemas).
// Without helm (or kubeconform / the schemas) the check is skipped with a message; under CI it fails instead.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, posix } from 'node:path';
import { parseAllDocuments } from 'yaml';
import { CONFIG_KEYS, loadConfig } from '../dist/config/index.js';
import { DEFAULT_AUTH_TOKEN_PATH, DEFAULT_ROOT_CA_PATH } from '../dist/config/defaults.js';
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


// ---- what Istio's chart renders (facts) ------------------------------------------------------------------------

/**
 * Where the facts come from: Istio's ztunnel chart (istio/istio manifests/charts/ztunnel), templates/daemonset.yaml
 * and values.yaml at 8dbacc5236eb (Istio 1.28 development); the keys Istio 1.29 added (dnsPolicy, dnsConfig,
 * peerCaCrl, resourceQuotas, ZTUNNEL_RESOURCE_CPU_REQUEST/_LIMIT from the resources) as its 1.29 values describe
 * them; templates/serviceaccount.yaml, rbac.yaml (OpenShift), resourcequota.yaml, networkpolicy.yaml; the value
 * layering of its zzz_profile.yaml; the presets of manifests/helm-profiles (ambient, openshift-ambient,
 * platform-gke, platform-openshift).
 */
const ISTIO = {
  tolerations: [
    { effect: 'NoSchedule', operator: 'Exists' },
    { key: 'CriticalAddonsOnly', operator: 'Exists' },
    { effect: 'NoExecute', operator: 'Exists' },
  ],
  podAnnotations: { 'prometheus.io/port': '15020', 'prometheus.io/scrape': 'true' },
  resources: { requests: { cpu: '200m', memory: '512Mi' } },
  updateStrategy: { type: 'RollingUpdate', rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } },
  securityContext: {
    allowPrivilegeEscalation: true,
    privileged: false,
    capabilities: { drop: ['ALL'], add: ['NET_ADMIN', 'SYS_ADMIN', 'NET_RAW'] },
    readOnlyRootFilesystem: true,
    runAsGroup: 1337,
    runAsNonRoot: false,
    runAsUser: 0,
  },
  mounts: [
    { mountPath: '/var/run/secrets/istio', name: 'istiod-ca-cert' },
    { mountPath: '/var/run/secrets/tokens', name: 'istio-token' },
    { mountPath: '/var/run/ztunnel', name: 'cni-ztunnel-sock-dir' },
    { mountPath: '/tmp', name: 'tmp' },
  ],
  tokenVolume: {
    name: 'istio-token',
    projected: { sources: [{ serviceAccountToken: { path: 'istio-token', expirationSeconds: 43200, audience: 'istio-ca' } }] },
  },
  rootConfigMap: (name = 'istio-ca-root-cert') => ({ name: 'istiod-ca-cert', configMap: { name } }),
  rootTrustBundle: (name = 'root-cert') => ({
    name: 'istiod-ca-cert',
    projected: { sources: [{ clusterTrustBundle: { name: `istio.io:istiod-ca:${name}`, path: 'root-cert.pem' } }] },
  }),
  zdsVolume: { name: 'cni-ztunnel-sock-dir', hostPath: { path: '/var/run/ztunnel', type: 'DirectoryOrCreate' } },
  // peerCaCrl.enabled: istiod's CRL ConfigMap (istio-ca-crl, key ca-crl.pem), mounted where Istio's proxies read it.
  crl: {
    env: { name: 'CRL_PATH', value: '/var/run/secrets/istio/crl/ca-crl.pem' },
    mount: { mountPath: '/var/run/secrets/istio/crl', name: 'istio-ca-crl' },
    volume: { name: 'istio-ca-crl', configMap: { name: 'istio-ca-crl', optional: true } },
  },
  tmpVolume: { name: 'tmp', emptyDir: {} },
  openshiftRule: { apiGroups: ['security.openshift.io'], resources: ['securitycontextconstraints'], resourceNames: ['privileged'], verbs: ['use'] },
};

const fieldRef = (name, fieldPath) => ({ name, valueFrom: { fieldRef: { fieldPath } } });
const resourceRef = (name, resource) => ({ name, valueFrom: { resourceFieldRef: { resource } } });

/** Istio's container env, in its order. `own` are ztunnel-node's own additions (documented), `env` the `env` value. */
function istioEnv({ ca, xds = ca, json = false, network = '', rustLog = 'info', clusterId = 'Kubernetes', grace = '30',
  proxyMetadata = {}, cpuRequest = true, cpuLimit = false, crl = false, own = [], env = {} }) {
  const pairs = (m) => Object.keys(m).sort().map((name) => ({ name, value: String(m[name]) }));
  return [
    { name: 'CA_ADDRESS', value: ca },
    { name: 'XDS_ADDRESS', value: xds },
    ...(json ? [{ name: 'LOG_FORMAT', value: 'json' }] : []),
    ...(network ? [{ name: 'NETWORK', value: network }] : []),
    { name: 'RUST_LOG', value: rustLog },
    { name: 'RUST_BACKTRACE', value: '1' },
    { name: 'ISTIO_META_CLUSTER_ID', value: clusterId },
    { name: 'INPOD_ENABLED', value: 'true' },
    { name: 'TERMINATION_GRACE_PERIOD_SECONDS', value: grace },
    fieldRef('POD_NAME', 'metadata.name'),
    fieldRef('POD_NAMESPACE', 'metadata.namespace'),
    fieldRef('NODE_NAME', 'spec.nodeName'),
    fieldRef('INSTANCE_IP', 'status.podIP'),
    fieldRef('SERVICE_ACCOUNT', 'spec.serviceAccountName'),
    ...pairs(proxyMetadata),
    resourceRef('ZTUNNEL_CPU_LIMIT', 'limits.cpu'),
    ...(cpuRequest ? [resourceRef('ZTUNNEL_RESOURCE_CPU_REQUEST', 'requests.cpu')] : []),
    ...(cpuLimit ? [resourceRef('ZTUNNEL_RESOURCE_CPU_LIMIT', 'limits.cpu')] : []),
    ...(crl ? [ISTIO.crl.env] : []),
    ...own,
    ...pairs(env),
  ];
}

/** Istio's labels of every resource (`istio.labels`), for a release named ztunnel. */
const istioLabels = (revision = '') => ({
  'app.kubernetes.io/managed-by': 'Helm',
  'app.kubernetes.io/instance': 'ztunnel',
  'app.kubernetes.io/part-of': 'istio',
  'app.kubernetes.io/version': CHART.appVersion,
  'istio.io/rev': revision || 'default',
  'helm.sh/chart': `${CHART.name}-${CHART.version}`,
});

/** The DaemonSet Istio's chart renders; every argument is a value of the chart with Istio's default. */
function istioDaemonSet({ name = 'ztunnel', namespace = 'istio-system', revision = '', labels = {}, annotations = {},
  podLabels = {}, podAnnotations = ISTIO.podAnnotations, nodeSelector = {}, affinity = null, tolerations = ISTIO.tolerations,
  resources = ISTIO.resources, imagePullPolicy = '', seLinuxOptions = null, env, volumeMounts = [], volumes = [],
  grace = 30, priorityClassName = 'system-node-critical', dnsPolicy = '', dnsConfig = null, updateStrategy = ISTIO.updateStrategy,
  rootVolume = ISTIO.rootConfigMap(), readinessProbe = {}, crl = false }) {
  const rev = revision ? { 'istio.io/rev': revision } : {};
  return {
    apiVersion: 'apps/v1',
    kind: 'DaemonSet',
    metadata: {
      name,
      namespace,
      labels: { 'app.kubernetes.io/name': 'ztunnel', ...istioLabels(revision), ...labels },
      annotations: { ...annotations, ...rev },
    },
    spec: {
      updateStrategy,
      selector: { matchLabels: { app: 'ztunnel' } },
      template: {
        metadata: {
          labels: {
            'sidecar.istio.io/inject': 'false',
            'istio.io/dataplane-mode': 'none',
            app: 'ztunnel',
            'app.kubernetes.io/name': 'ztunnel',
            ...istioLabels(revision),
            ...podLabels,
          },
          annotations: { 'sidecar.istio.io/inject': 'false', ...rev, ...podAnnotations },
        },
        spec: {
          nodeSelector: { 'kubernetes.io/os': 'linux', ...nodeSelector },
          ...(affinity ? { affinity } : {}),
          serviceAccountName: name,
          tolerations,
          containers: [{
            name: 'istio-proxy',
            ports: [{ containerPort: 15020, name: 'ztunnel-stats', protocol: 'TCP' }],
            resources,
            ...(imagePullPolicy ? { imagePullPolicy } : {}),
            securityContext: { ...ISTIO.securityContext, ...(seLinuxOptions ? { seLinuxOptions } : {}) },
            readinessProbe: { httpGet: { port: 15021, path: '/healthz/ready' }, ...readinessProbe },
            args: ['proxy', 'ztunnel'],
            env,
            volumeMounts: [...ISTIO.mounts, ...(crl ? [ISTIO.crl.mount] : []), ...volumeMounts],
          }],
          priorityClassName,
          terminationGracePeriodSeconds: grace,
          ...(dnsPolicy ? { dnsPolicy } : {}),
          ...(dnsConfig ? { dnsConfig } : {}),
          volumes: [ISTIO.tokenVolume, rootVolume, ISTIO.zdsVolume, ISTIO.tmpVolume, ...(crl ? [ISTIO.crl.volume] : []), ...volumes],
        },
      },
    },
  };
}

/**
 * The documented differences (README "Run it in an Istio ambient cluster"): the image (ztunnel-node's, from
 * hub/image/tag with ztunnel-node's defaults; `variant` and `global.tag` do not apply), the two labels that name
 * the chart and its version, and ztunnel-node's own keys (istioVersion → ISTIO_META_ISTIO_VERSION,
 * priorityClassName, readinessProbe timing), which the cases below pass as such.
 */
const DIFFERENCES = ['spec.template.spec.containers[0].image'];

/** Paths where `actual` and `expected` differ (leaves compared with ===; arrays element by element). */
function differences(actual, expected, path = '', out = []) {
  if (expected !== null && typeof expected === 'object') {
    if (actual === null || typeof actual !== 'object' || Array.isArray(actual) !== Array.isArray(expected)) {
      out.push(`${path}: got ${JSON.stringify(actual)}, Istio's chart renders ${JSON.stringify(expected)}`);
      return out;
    }
    const keys = new Set([...Object.keys(expected), ...Object.keys(actual)]);
    for (const k of keys) {
      const p = Array.isArray(expected) ? `${path}[${k}]` : path ? `${path}.${k}` : k;
      if (DIFFERENCES.includes(p)) continue;
      if (!(k in actual)) out.push(`${p}: missing (Istio's chart renders ${JSON.stringify(expected[k])})`);
      else if (!(k in expected)) out.push(`${p}: ${JSON.stringify(actual[k])} is not rendered by Istio's chart`);
      else differences(actual[k], expected[k], p, out);
    }
    return out;
  }
  if (actual !== expected) out.push(`${path}: got ${JSON.stringify(actual)}, Istio's chart renders ${JSON.stringify(expected)}`);
  return out;
}

// ---- the daemon's side ----------------------------------------------------------------------------------------

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
    for (const m of first.matchAll(/`([A-Z][A-Z0-9_]*)(<K>)?`/g)) names.add(m[2] ? `${m[1]}*` : m[1]);
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
  'requests.cpu': '1',
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

/** The daemon reads every variable the rendering sets, documents it, and accepts the environment. */
function checkDaemonSide(label, ds, expect) {
  const pod = ds.spec.template.spec;
  const [c] = pod.containers;
  const names = c.env.map((e) => e.name);
  assert.equal(new Set(names).size, names.length, `${label}: an env var is set twice: ${names}`);
  const documented = readmeConfigNames();
  const read = new Set(CONFIG_KEYS);
  const byPrefix = (n) => (n.startsWith('ISTIO_META_') ? 'ISTIO_META_*' : n);
  assert.deepEqual(names.filter((n) => !documented.has(n) && !documented.has(byPrefix(n))), [],
    `${label}: the chart sets env vars the README configuration table does not document`);
  assert.deepEqual(names.filter((n) => !read.has(n) && byPrefix(n) === n), [],
    `${label}: the chart sets env vars the daemon's config schema (ts/config/schema.ts) does not read`);
  const env = renderedEnv(c);
  const cfg = loadConfig({ env, args: ['ztunnel'], allArgs: ['proxy', 'ztunnel'], cpuCount: 4 });
  assert.equal(cfg.proxyMode, 'shared');
  assert.equal(cfg.xdsAddress, expect.xds);
  assert.equal(cfg.caAddress, expect.ca);
  assert.equal(cfg.clusterId, expect.clusterId);
  assert.equal(cfg.network, expect.network ?? '');
  assert.equal(cfg.terminationDeadlineMs, expect.drainMs);
  for (const [k, v] of Object.entries(expect.metadata ?? {})) assert.equal(cfg.proxyMetadata[k], v, `metadata ${k}`);
  // The files the daemon reads by default (ztunnel's relative paths, from the image's working directory /) are
  // in the volumes Istio's chart mounts.
  const mounted = (file) => c.volumeMounts.find((m) => posix.dirname(posix.resolve('/', file)) === m.mountPath)?.name;
  assert.equal(cfg.xdsRootCa, DEFAULT_ROOT_CA_PATH);
  assert.equal(mounted(DEFAULT_ROOT_CA_PATH), 'istiod-ca-cert');
  assert.equal(mounted(DEFAULT_AUTH_TOKEN_PATH), 'istio-token');
  const token = pod.volumes.find((v) => v.name === 'istio-token').projected.sources[0].serviceAccountToken;
  assert.equal(token.path, posix.basename(DEFAULT_AUTH_TOKEN_PATH));
  const root = pod.volumes.find((v) => v.name === 'istiod-ca-cert');
  const rootFile = root.configMap ? 'root-cert.pem' : root.projected.sources[0].clusterTrustBundle.path;
  assert.equal(rootFile, posix.basename(DEFAULT_ROOT_CA_PATH));
  if (cfg.crlPath !== null) assert.equal(mounted(cfg.crlPath), 'istio-ca-crl', 'CRL_PATH is in the istio-ca-crl volume');
  assert.equal(c.volumeMounts.find((m) => m.name === 'cni-ztunnel-sock-dir').mountPath, posix.dirname(cfg.inpod.uds),
    'istio-cni connects to /var/run/ztunnel/ztunnel.sock (INPOD_UDS)');
  // The rollout hands over (README "Hitless restarts"): the new pod finds the old one on the hand-over socket,
  // handover.sock beside INPOD_UDS, in the node's directory (a hostPath both pods of a surge rollout mount), starts
  // beside it (maxSurge 1), and the old one is stopped only once the new one is ready (maxUnavailable 0, readiness).
  assert.equal(cfg.handover.enabled, true, `${label}: the hand-over is on`);
  assert.equal(posix.dirname(cfg.handover.socket), posix.dirname(cfg.inpod.uds), `${label}: the hand-over socket is beside INPOD_UDS`);
  assert.ok(pod.volumes.find((v) => v.name === 'cni-ztunnel-sock-dir')?.hostPath, `${label}: its directory is the node's (hostPath)`);
  assert.equal(c.readinessProbe?.httpGet?.path, '/healthz/ready', `${label}: the kubelet waits for readiness`);
  if (expect.surge !== false) {
    assert.deepEqual(ds.spec.updateStrategy, { type: 'RollingUpdate', rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } }, `${label}: a surge rollout`);
  }
}

// ---- the cases --------------------------------------------------------------------------------------------------

const CHART = (() => {
  const text = readFileSync(join(chart, 'Chart.yaml'), 'utf8');
  const field = (k) => new RegExp(`^${k}:\\s*"?([^"\\n]+)"?$`, 'm').exec(text)?.[1];
  return { name: field('name'), version: field('version'), appVersion: field('appVersion') };
})();
const IMAGE = `ghcr.io/ztunnel-node/ztunnel-node:${CHART.appVersion}`;
const ISTIOD = 'istiod.istio-system.svc:15012';
const HTTPS_ISTIOD = `https://${ISTIOD}`;
const HBONE_META = { ISTIO_META_ENABLE_HBONE: 'true' };
const daemon = (o = {}) => ({ xds: HTTPS_ISTIOD, ca: HTTPS_ISTIOD, clusterId: 'Kubernetes', drainMs: 25_000, ...o });

const valuesFile = join(tmpdir(), `ztn-chart-values-${process.pid}.yaml`);

/**
 * A values file as an operator has it for Istio's chart: `helm show values istio/ztunnel` (Istio's defaults, under
 * _internal_defaults_do_not_set; the values of its values.yaml @ 8dbacc5236eb), with their own settings on top.
 */
const ISTIO_VALUES_FILE = {
  _internal_defaults_do_not_set: {
    hub: 'gcr.io/istio-testing', tag: 'latest', variant: '', image: 'ztunnel', network: '', resourceName: '', labels: {},
    annotations: {}, volumeMounts: [], volumes: [], tolerations: ISTIO.tolerations, podAnnotations: ISTIO.podAnnotations,
    podLabels: {}, resources: ISTIO.resources, resourceQuotas: { enabled: false, pods: 5000 }, imagePullSecrets: [], env: {},
    imagePullPolicy: '', multiCluster: { clusterName: '' }, meshConfig: { defaultConfig: { proxyMetadata: {} } },
    terminationGracePeriodSeconds: 30, revision: '', caAddress: '', xdsAddress: '', istioNamespace: 'istio-system',
    logLevel: 'info', logAsJson: false, seLinuxOptions: {}, resourceScope: 'ALL', updateStrategy: ISTIO.updateStrategy,
  },
  hub: 'docker.io/istio',
  tag: '1.28.0',
  logLevel: 'debug',
};

/**
 * How Istio documents installing its ztunnel chart, and what its chart renders for each. `args` are helm template's
 * (release ztunnel); `kinds` every resource rendered; `ds` Istio's DaemonSet; `daemon` what the daemon's config
 * must say of the rendered environment.
 */
const CASES = [
  {
    label: 'default values',
    args: ['--namespace', 'istio-system'],
    kinds: ['DaemonSet', 'ServiceAccount'],
    image: IMAGE,
    ds: istioDaemonSet({ env: istioEnv({ ca: ISTIOD }) }),
    daemon: daemon(),
  },
  {
    label: 'profile=ambient (Istio\'s ambient install)',
    args: ['--namespace', 'istio-system', '--set', 'profile=ambient'],
    kinds: ['DaemonSet', 'ServiceAccount'],
    image: IMAGE,
    ds: istioDaemonSet({ env: istioEnv({ ca: ISTIOD, proxyMetadata: HBONE_META }) }),
    daemon: daemon({ metadata: { ENABLE_HBONE: 'true' } }),
  },
  {
    label: 'an existing Istio ztunnel values file (helm show values istio/ztunnel, edited)',
    args: ['--namespace', 'istio-system', '--set', 'profile=ambient', '-f', valuesFile],
    values: JSON.stringify(ISTIO_VALUES_FILE),
    kinds: ['DaemonSet', 'ServiceAccount'],
    // Istio's chart would run docker.io/istio/ztunnel:1.28.0-distroless; this one runs ztunnel-node (documented).
    image: IMAGE,
    ds: istioDaemonSet({ env: istioEnv({ ca: ISTIOD, rustLog: 'debug', proxyMetadata: HBONE_META }) }),
    daemon: daemon(),
  },
  {
    label: 'a revision',
    args: ['--namespace', 'istio-system', '--set', 'profile=ambient', '--set', 'revision=1-28'],
    kinds: ['DaemonSet', 'ServiceAccount'],
    image: IMAGE,
    ds: istioDaemonSet({ revision: '1-28', env: istioEnv({ ca: 'istiod-1-28.istio-system.svc:15012', proxyMetadata: HBONE_META }) }),
    daemon: daemon({ xds: 'https://istiod-1-28.istio-system.svc:15012', ca: 'https://istiod-1-28.istio-system.svc:15012' }),
    sa: { annotations: { 'istio.io/rev': '1-28' } },
  },
  {
    label: 'multi-network through global.* (a values file shared with istiod)',
    args: ['--namespace', 'istio-system', '--set', 'profile=ambient', '-f', valuesFile],
    values: 'global:\n  network: network2\n  multiCluster:\n    clusterName: cluster2\n  meshID: mesh1\n  hub: mirror.example.com/istio\n  tag: 1.28.0\n',
    kinds: ['DaemonSet', 'ServiceAccount'],
    // global.hub and global.tag name Istio's images, not the one this chart runs (documented).
    image: IMAGE,
    ds: istioDaemonSet({ env: istioEnv({ ca: ISTIOD, network: 'network2', clusterId: 'cluster2', proxyMetadata: HBONE_META }) }),
    daemon: daemon({ network: 'network2', clusterId: 'cluster2' }),
  },
  {
    label: 'a top-level value wins over global.*',
    args: ['--namespace', 'istio-system', '--set', 'global.network=network2', '--set', 'network=network3'],
    kinds: ['DaemonSet', 'ServiceAccount'],
    image: IMAGE,
    ds: istioDaemonSet({ env: istioEnv({ ca: ISTIOD, network: 'network3' }) }),
    daemon: daemon({ network: 'network3' }),
  },
  {
    label: 'OpenShift (profile=ambient, global.platform=openshift)',
    args: ['--namespace', 'istio-system', '--set', 'profile=ambient', '--set', 'global.platform=openshift'],
    kinds: ['ClusterRole', 'ClusterRoleBinding', 'DaemonSet', 'ServiceAccount'],
    image: IMAGE,
    ds: istioDaemonSet({ seLinuxOptions: { type: 'spc_t' }, env: istioEnv({ ca: ISTIOD, proxyMetadata: HBONE_META }) }),
    daemon: daemon(),
    openshift: true,
  },
  {
    label: 'OpenShift (profile=openshift-ambient)',
    args: ['--namespace', 'istio-system', '--set', 'profile=openshift-ambient'],
    kinds: ['ClusterRole', 'ClusterRoleBinding', 'DaemonSet', 'ServiceAccount'],
    image: IMAGE,
    ds: istioDaemonSet({ seLinuxOptions: { type: 'spc_t' }, env: istioEnv({ ca: ISTIOD, proxyMetadata: HBONE_META }) }),
    daemon: daemon(),
    openshift: true,
  },
  {
    label: 'GKE (profile=ambient, global.platform=gke)',
    args: ['--namespace', 'istio-system', '--set', 'profile=ambient', '--set', 'global.platform=gke'],
    kinds: ['DaemonSet', 'ResourceQuota', 'ServiceAccount'],
    image: IMAGE,
    ds: istioDaemonSet({ env: istioEnv({ ca: ISTIOD, proxyMetadata: HBONE_META }) }),
    daemon: daemon(),
    quota: { pods: '5000', priorityClass: 'system-node-critical' },
  },
  {
    label: 'compatibilityVersion=1.27 (no ztunnel chart key changes)',
    args: ['--namespace', 'istio-system', '--set', 'profile=ambient', '--set', 'compatibilityVersion=1.27'],
    kinds: ['DaemonSet', 'ServiceAccount'],
    image: IMAGE,
    ds: istioDaemonSet({ env: istioEnv({ ca: ISTIOD, proxyMetadata: HBONE_META }) }),
    daemon: daemon(),
  },
  {
    label: 'ci/nondefault-values.yaml (every key turned)',
    args: ['--namespace', 'mesh-system', '-f', join(chart, 'ci', 'nondefault-values.yaml')],
    kinds: ['DaemonSet', 'NetworkPolicy', 'ResourceQuota', 'ServiceAccount'],
    image: 'registry.example.com/mesh/ztunnel-node:0.1.0-rc1',
    ds: istioDaemonSet({
      name: 'ztunnel-east',
      namespace: 'mesh-system',
      revision: 'canary',
      labels: { 'example.com/owner': 'mesh-team' },
      annotations: { 'example.com/ticket': 'MESH-42' },
      podLabels: { 'example.com/tier': 'node' },
      // Maps merge with the defaults (Istio's layering is a deep merge); lists replace them.
      podAnnotations: { ...ISTIO.podAnnotations, 'example.com/team': 'mesh' },
      nodeSelector: { 'mesh.example.com/enabled': 'true' },
      affinity: { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: [{ matchExpressions: [{ key: 'kubernetes.io/arch', operator: 'In', values: ['amd64', 'arm64'] }] }] } } },
      tolerations: [{ key: 'dedicated', operator: 'Equal', value: 'mesh', effect: 'NoSchedule' }],
      resources: { requests: { cpu: '500m', memory: '256Mi' }, limits: { cpu: '2', memory: '1Gi' } },
      imagePullPolicy: 'Always',
      seLinuxOptions: { type: 'spc_t' },
      env: istioEnv({
        ca: 'istiod-ca.mesh-system.svc:15012', xds: 'istiod-canary.mesh-system.svc:15012', json: true, network: 'network-east',
        rustLog: 'info,access=debug', clusterId: 'east', grace: '45', proxyMetadata: HBONE_META, cpuLimit: true, crl: true,
        own: [{ name: 'ISTIO_META_ISTIO_VERSION', value: '1.28.0' }],
        env: { ZTUNNEL_WORKER_THREADS: 4, SECRET_TTL: '12h', ENABLE_CLUSTER_TRUST_BUNDLE_API: true },
      }),
      volumeMounts: [{ name: 'extra-config', mountPath: '/etc/ztunnel-extra' }],
      volumes: [{ name: 'extra-config', configMap: { name: 'ztunnel-extra' } }],
      grace: 45,
      priorityClassName: 'system-cluster-critical',
      dnsPolicy: 'ClusterFirstWithHostNet',
      dnsConfig: { options: [{ name: 'ndots', value: '2' }] },
      updateStrategy: { type: 'RollingUpdate', rollingUpdate: { maxSurge: 0, maxUnavailable: 1 } },
      rootVolume: ISTIO.rootTrustBundle('mesh-root'),
      readinessProbe: { periodSeconds: 5, timeoutSeconds: 2, failureThreshold: 6 },
      crl: true,
    }),
    // An operator's own update strategy is kept: with maxSurge 0 the old pod goes first and there is nobody to hand
    // over to (the README says so).
    daemon: daemon({ xds: 'https://istiod-canary.mesh-system.svc:15012', ca: 'https://istiod-ca.mesh-system.svc:15012', clusterId: 'east', network: 'network-east', drainMs: 40_000, surge: false }),
    sa: { name: 'ztunnel-east', pullSecrets: [{ name: 'registry-creds' }, { name: 'mirror-creds' }], annotations: { 'example.com/ticket': 'MESH-42', 'istio.io/rev': 'canary' } },
    quota: { pods: '200', priorityClass: 'system-cluster-critical' },
    networkPolicy: true,
  },
];

/** One rendering: the resources, the DaemonSet against Istio's, the other resources, the daemon's side. */
function checkCase(c, objects) {
  const kinds = objects.map((o) => o.kind).sort();
  assert.deepEqual(kinds, c.kinds, `${c.label}: resources rendered`);
  const ds = objects.find((o) => o.kind === 'DaemonSet');
  assert.equal(ds.spec.template.spec.containers[0].image, c.image, `${c.label}: image`);
  const diff = differences(ds, c.ds);
  assert.deepEqual(diff, [], `${c.label}: the DaemonSet differs from Istio's chart's:\n    ${diff.join('\n    ')}`);
  const sa = objects.find((o) => o.kind === 'ServiceAccount');
  assert.equal(sa.metadata.name, c.sa?.name ?? 'ztunnel', 'istiod trusts the node proxy ServiceAccount by name');
  assert.equal(sa.metadata.namespace, ds.metadata.namespace);
  assert.deepEqual(sa.metadata.annotations ?? {}, c.sa?.annotations ?? {});
  assert.deepEqual(sa.imagePullSecrets, c.sa?.pullSecrets);
  assert.deepEqual(sa.metadata.labels, ds.metadata.labels);
  if (c.openshift) {
    const role = objects.find((o) => o.kind === 'ClusterRole');
    const binding = objects.find((o) => o.kind === 'ClusterRoleBinding');
    assert.deepEqual(role.rules, [ISTIO.openshiftRule]);
    assert.deepEqual(binding.roleRef, { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: role.metadata.name });
    assert.deepEqual(binding.subjects, [{ kind: 'ServiceAccount', name: sa.metadata.name, namespace: sa.metadata.namespace }]);
  }
  if (c.quota) {
    const q = objects.find((o) => o.kind === 'ResourceQuota');
    assert.deepEqual(q.spec, {
      hard: { pods: c.quota.pods },
      scopeSelector: { matchExpressions: [{ operator: 'In', scopeName: 'PriorityClass', values: [c.quota.priorityClass] }] },
    });
    assert.equal(q.metadata.namespace, ds.metadata.namespace);
  }
  if (c.networkPolicy) {
    const np = objects.find((o) => o.kind === 'NetworkPolicy');
    assert.deepEqual(np.spec.podSelector, { matchLabels: { app: 'ztunnel' } });
    assert.deepEqual(np.spec.policyTypes, ['Ingress', 'Egress']);
    assert.deepEqual(np.spec.ingress.flatMap((r) => r.ports.map((p) => p.port)), [15020, 15021, 15000]);
    assert.deepEqual(np.spec.egress, [{}]);
  }
  checkDaemonSide(c.label, ds, c.daemon);
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
  const renders = [];
  step('helm lint --strict (default values)', () => run(helm, ['lint', '--strict', chart]));
  step('helm lint --strict (ci/nondefault-values.yaml)', () => run(helm, ['lint', '--strict', chart, '-f', nondefault]));
  step('values.schema.json refuses a misspelt key, a wrong type and the old object-valued image', () => {
    for (const bad of ['logAsJSON=true', 'terminationGracePeriodSeconds=thirty', 'image.repository=x', 'global.network=1']) {
      const r = capture(helm, ['lint', '--strict', chart, '--set', bad], { cwd: root });
      assert.notEqual(r.status, 0, `helm lint accepted --set ${bad}`);
    }
  });
  step('an unknown profile, platform, compatibility version or resource scope fails with a message', () => {
    for (const [set, message] of [
      ['profile=ambiant', 'unknown profile "ambiant"'],
      ['global.platform=aks2', 'unknown platform "aks2"'],
      ['compatibilityVersion=1.2', 'unknown compatibility version "1.2"'],
      ['resourceScope=some', 'resourceScope "some" is not one of all, namespace, cluster'],
    ]) {
      const r = capture(helm, ['template', 'ztunnel', chart, '--set', set], { cwd: root });
      assert.notEqual(r.status, 0, `helm template accepted --set ${set}`);
      assert.ok(r.stderr.includes(message), `--set ${set}: ${r.stderr}`);
    }
  });
  for (const c of CASES) {
    step(`helm template, ${c.label}: Istio's DaemonSet field by field; env documented, read and accepted by the daemon`, () => {
      if (c.values) writeFileSync(valuesFile, c.values);
      const file = join(work, `case-${renders.length}.yaml`);
      try {
        writeFileSync(file, run(helm, ['template', 'ztunnel', chart, '--kube-version', k8sVersion, ...c.args]));
      } finally {
        if (c.values) rmSync(valuesFile, { force: true });
      }
      const objects = parseAllDocuments(readFileSync(file, 'utf8')).map((d) => d.toJS()).filter(Boolean);
      renders.push({ file, count: objects.length });
      checkCase(c, objects);
    });
  }
  step('resourceScope splits namespaced from cluster-scoped resources', () => {
    const kinds = (scope) => parseAllDocuments(run(helm, ['template', 'ztunnel', chart, '--set', 'global.platform=openshift', '--set', `resourceScope=${scope}`]))
      .map((d) => d.toJS()).filter(Boolean).map((o) => o.kind).sort();
    assert.deepEqual(kinds('namespace'), ['DaemonSet', 'ServiceAccount']);
    assert.deepEqual(kinds('CLUSTER'), ['ClusterRole', 'ClusterRoleBinding']);
    assert.deepEqual(kinds('all'), ['ClusterRole', 'ClusterRoleBinding', 'DaemonSet', 'ServiceAccount']);
  });

  step('Dockerfile agrees with the chart (runtime on the current Node LTS, entrypoint, port, working directory)', () => {
    const docker = readFileSync(join(root, 'Dockerfile'), 'utf8');
    const runtime = docker.slice(docker.lastIndexOf('\nFROM '));
    assert.match(runtime, /^\nFROM node:24[-\w.]*slim/, 'the runtime stage is a slim Node 24 (current LTS) image');
    assert.match(runtime, /apt-get install [^\n]*iptables iproute2/);
    // The benchmarks start the daemon with the same Node flags (bench/daemon-flags.mjs).
    assert.match(runtime, /^ENTRYPOINT \["node", "--max-semi-space-size=1", "--max-opt=2", "\/opt\/ztunnel-node\/bin\/ztunnel-node\.js"\]$/m);
    assert.match(runtime, /^CMD \["proxy", "ztunnel"\]$/m, 'the chart passes the same args as Istio\'s chart');
    // ztunnel's default file locations are relative to /, and the chart mounts them there (checkDaemonSide).
    assert.match(runtime, /^WORKDIR \/$/m);
    assert.deepEqual(runtime.match(/^EXPOSE (.*)$/m)?.[1].split(/\s+/).map(Number).sort(), [15008, 15020, 15021]);
    // The image carries what the npm package ships (package.json "files"), next to its node_modules.
    const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
    for (const dir of pkg.files.filter((f) => f.endsWith('/') && !f.startsWith('!'))) {
      assert.match(runtime, new RegExp(`^COPY .* /opt/ztunnel-node/${dir.slice(0, -1)}$`, 'm'), `the image lacks ${dir}`);
    }
    assert.match(runtime, /^COPY --from=build \/src\/node_modules \/opt\/ztunnel-node\/node_modules$/m);
  });

  step('the release workflow publishes the image the chart names by default', () => {
    const release = readFileSync(join(root, '.github', 'workflows', 'release.yml'), 'utf8');
    const repository = [...readFileSync(join(chart, 'values.yaml'), 'utf8').matchAll(/^\s+repository: (\S+)$/gm)].map((m) => m[1]);
    assert.deepEqual(repository, ['ghcr.io/ztunnel-node/ztunnel-node'], 'one repository: key (the workflow reads the first)');
    assert.match(release, /image="ghcr\.io\/\$\{GITHUB_REPOSITORY_OWNER,,\}\/ztunnel-node"/);
    assert.match(release, /chart's default image is the one this workflow pushes/, 'the workflow checks the chart names what it pushes');
    assert.match(release, /platform: linux\/amd64/);
    assert.match(release, /platform: linux\/arm64/);
  });

  const kubeconform = findTool('kubeconform') ?? missing(`${CHECK} (kubeconform)`, 'kubeconform', installHint('kubeconform'));
  const schemas = prepareSchemas();
  const location = `${schemas}/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json`;
  step(`kubeconform -strict on every rendering, Kubernetes ${k8sVersion} schemas from ${PINS.kubernetesSchemas.pypi}==${PINS.kubernetesSchemas.version} (offline)`, () => {
    const files = renders.map((r) => r.file);
    const total = renders.reduce((n, r) => n + r.count, 0);
    const out = run(kubeconform, ['-strict', '-summary', '-kubernetes-version', k8sVersion, '-schema-location', location, ...files]);
    assert.match(out, new RegExp(`Summary: ${total} resources found in ${files.length} files - Valid: ${total}, Invalid: 0, Errors: 0, Skipped: 0`), out);
    // The schemas really are applied (a missing schema would be an error, but prove it on a broken rendering).
    const broken = join(work, 'broken.yaml');
    writeFileSync(broken, readFileSync(files[0], 'utf8').replace('- containerPort: 15020', '- containerPort: "15020"\n          hostPorts: 1'));
    const bad = capture(kubeconform, ['-strict', '-summary', '-kubernetes-version', k8sVersion, '-schema-location', location, broken]);
    assert.notEqual(bad.status, 0, 'kubeconform accepted a DaemonSet with a string containerPort and an unknown field');
    assert.match(bad.stdout, /got string, want integer/);
    assert.match(bad.stdout, /additional properties 'hostPorts' not allowed/);
  });
  console.log(`${CHECK} ok (${((Date.now() - started) / 1000).toFixed(1)}s)`);
} finally {
  rmSync(work, { recursive: true, force: true });
}
