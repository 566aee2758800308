// The local config file: strict validation with file + path + problem in every message, and conversion to the
// state model.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadLocalConfig, parseLocalConfig } from '../../dist/config/local.js';
import { LocalConfigError } from '../../dist/errors.js';

const dir = mkdtempSync(join(tmpdir(), 'ztn-local-'));
test.after(() => rmSync(dir, { recursive: true, force: true }));

function writeYaml(name: string, text: string): string {
  const path = join(dir, name);
  writeFileSync(path, text);
  return path;
}

async function loadError(path: string): Promise<string> {
  try {
    await loadLocalConfig({ localXdsPath: path, localXds: null });
  } catch (err) {
    assert.ok(err instanceof LocalConfigError, `expected LocalConfigError, got ${err}`);
    assert.equal(err.code, 'LOCAL_CONFIG_INVALID');
    return err.message;
  }
  assert.fail(`${path} should not load`);
}

/** The message parsing `text` (as x.yaml) fails with. */
function msg(text: string): string {
  try {
    parseLocalConfig(text, 'x.yaml');
  } catch (err) {
    return (err as Error).message;
  }
  assert.fail('should not parse');
}

const GOOD_WORKLOAD = `
- uid: c1//v1/Pod/default/a
  name: a
  namespace: default
  workloadIps: ["10.0.0.1"]
`;

test('bad IP: file, path and problem', async () => {
  const path = writeYaml('bad-ip.yaml', `workloads:${GOOD_WORKLOAD}- uid: b
  name: b
  namespace: default
  workloadIps: ["300.1.1.1"]
`);
  assert.equal(await loadError(path), `${path}: workloads[1].workloadIps[0]: "300.1.1.1" is not an IP address`);
});

test('unknown field is rejected, with its path', async () => {
  const path = writeYaml('unknown.yaml', `workloads:
- uid: a
  name: a
  namespace: default
  serviceAcount: typo
`);
  assert.equal(await loadError(path), `${path}: workloads[0].serviceAcount: unknown field "serviceAcount"`);
  const top = writeYaml('unknown-top.yaml', 'workload: []\n');
  assert.equal(await loadError(top), `${top}: workload: unknown field "workload"`);
});

test('bad CIDR in a policy and in cidrVips', async () => {
  const path = writeYaml('bad-cidr.yaml', `policies:
- name: p
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - sourceIps: ["10.0.0.0/8", "10.0.0.0/40"]
`);
  assert.equal(await loadError(path), `${path}: policies[0].rules[0][0][0].sourceIps[1]: "10.0.0.0/40" is not a CIDR (e.g. 10.0.0.0/8)`);
  const svc = writeYaml('bad-cidr-vip.yaml', `services:
- {name: s, namespace: ns, hostname: s.example, cidrVips: ["net/10.0.0.0/33"]}
`);
  assert.match(await loadError(svc), /services\[0\]\.cidrVips\[0\]: "net\/10\.0\.0\.0\/33" is not a CIDR/);
});

test('duplicate uid names both entries', async () => {
  const path = writeYaml('dup.yaml', `workloads:${GOOD_WORKLOAD}${GOOD_WORKLOAD}`);
  assert.equal(await loadError(path), `${path}: workloads[1].uid: duplicate uid "c1//v1/Pod/default/a" (also workloads[0])`);
});

test('missing file names the file', async () => {
  const path = join(dir, 'does-not-exist.yaml');
  assert.equal(await loadError(path), `${path}: cannot read the local config: no such file`);
});

test('YAML syntax errors carry a position', async () => {
  const path = writeYaml('syntax.yaml', 'workloads:\n  - uid: [a\n');
  assert.match(await loadError(path), new RegExp(`^${path.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: line \\d+, column \\d+: invalid YAML`));
});

test('type errors, enums, missing required fields, bad keys', () => {
  assert.equal(msg('workloads: [{uid: a, name: a, namespace: n, capacity: "two"}]'), 'x.yaml: workloads[0].capacity: invalid type: string "two", expected u32');
  assert.equal(msg('workloads: [{uid: a, name: a, namespace: n, protocol: UDP}]'), 'x.yaml: workloads[0].protocol: unknown variant `UDP`, expected `HBONE` or `TCP`');
  assert.equal(msg('workloads: [{uid: a, namespace: n}]'), 'x.yaml: workloads[0].name: missing required field');
  assert.equal(
    msg('workloads: [{uid: a, name: a, namespace: n, services: {"no-slash": {80: 8080}}}]'),
    'x.yaml: workloads[0].services: "no-slash" is not <namespace>/<hostname>',
  );
  assert.equal(msg('services: [{name: s, namespace: n, hostname: h, vips: ["10.0.0.1"]}]'), 'x.yaml: services[0].vips[0]: "10.0.0.1" is not <network>/<ip> (e.g. "/10.0.0.1")');
  assert.equal(msg('policies: [{name: p, scope: Namespace, action: Audit}]'), 'x.yaml: policies[0].action: "Audit" is not one of Allow|Deny');
  // Every record's problem is reported (its first), one per line.
  assert.equal(msg('workloads: [{uid: a, name: a, namespace: n, workloadIps: ["x", "y"]}, {uid: b, name: b, namespace: n, capacity: -1}]'), [
    'x.yaml: workloads[0].workloadIps[0]: "x" is not an IP address',
    'x.yaml: workloads[1].capacity: invalid value: integer `-1`, expected u32',
  ].join('\n'));
});

test('values that end up in headers: a forged baggage key or a control character is refused with its path', () => {
  assert.equal(
    msg('workloads: [{uid: a, name: a, namespace: n, canonicalName: "app,k8s.namespace.name=kube-system"}]'),
    'x.yaml: workloads[0].canonicalName: "app,k8s.namespace.name=kube-system" has the character ",", which cannot go into a header',
  );
  assert.match(msg('workloads: [{uid: a, name: a, namespace: "n\\a"}]'), /^x\.yaml: workloads\[0\]\.namespace: .*cannot go into a header/);
  assert.match(msg('services: [{name: s, namespace: n, hostname: "s n"}]'), /^x\.yaml: services\[0\]\.hostname: "s n" has the character " "/);
  assert.equal(parseLocalConfig('workloads: [{uid: a, name: a, namespace: n, canonicalRevision: v1.2_rc-3}]', 'x.yaml').workloads.length, 1);
});

test('inline LOCAL_XDS is named LOCAL_XDS in errors', async () => {
  await assert.rejects(loadLocalConfig({ localXdsPath: null, localXds: 'workloads: [{uid: a}]' }), /^LocalConfigError: LOCAL_XDS: workloads\[0\]\.name: missing required field/);
});

test('nothing configured → null; an empty file is an empty config', async () => {
  assert.equal(await loadLocalConfig({ localXdsPath: null, localXds: null }), null);
  const empty = await loadLocalConfig({ localXdsPath: writeYaml('empty.yaml', ''), localXds: null });
  assert.deepEqual([empty!.workloads, empty!.services, empty!.policies], [[], [], []]);
});

test("ztunnel's tagged YAML dialect (serde's enum tags) loads as the mapping form", () => {
  const doc = (matches: string): string => `
policies:
- name: deny-some
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - principals: ${matches}
        notNamespaces: [!Exact kube-system]
`;
  const tagged = parseLocalConfig(doc('[!Exact "cluster.local/ns/default/sa/a", !Prefix "cluster.local/ns/x/", !Suffix /sa/z, !Presence []]'), 'tagged.yaml');
  const mapping = parseLocalConfig(doc('[{Exact: cluster.local/ns/default/sa/a}, {Prefix: cluster.local/ns/x/}, {Suffix: /sa/z}, {Presence: []}]'), 'mapping.yaml');
  const [match] = tagged.policies[0].rules[0][0];
  assert.deepEqual(match.principals, [{ Exact: 'cluster.local/ns/default/sa/a' }, { Prefix: 'cluster.local/ns/x/' }, { Suffix: '/sa/z' }, { Presence: [] }]);
  assert.deepEqual(match.notNamespaces, [{ Exact: 'kube-system' }]);
  assert.deepEqual(tagged.policies, mapping.policies);
  // An unknown tag is a clear error, where it is.
  assert.throws(() => parseLocalConfig(doc('[!Regex "a.*"]'), 'bad.yaml'), /bad\.yaml: policies\[0\]\.rules\[0\]\[0\]\[0\]\.principals\[0\]/);
});

test('a good file converts to the model, with defaults filled in', () => {
  const cfg = parseLocalConfig(`
workloads:
- uid: Kubernetes//Pod/default/sleep
  name: sleep
  namespace: default
  serviceAccount: sleep
  workloadIps: ["127.0.1.10"]
  protocol: HBONE
  node: node-a
  workloadType: Deployment
  waypoint: {destination: "/10.0.0.9"}
  locality: {region: r1}
  services:
    "default/echo.default.svc.cluster.local": {80: 8080}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/127.10.0.10"]
  cidrVips: ["10.1.0.0/16"]
  ports: {80: 8080}
policies:
- name: allow-sleep
  namespace: default
  scope: WorkloadSelector
  action: Allow
  rules:
  - - - principals: [{Exact: cluster.local/ns/default/sa/sleep}, {Presence: []}]
        destinationPorts: [8080]
`, 'good.yaml');
  // The records as the dataplane holds them, Istio's defaults filled in; a default value is left out as ztunnel
  // writes it, except those Istio fills in (trust domain, service account, workload type) and capacity.
  assert.deepEqual(cfg.workloads, [{
    uid: 'Kubernetes//Pod/default/sleep',
    workloadIps: ['127.0.1.10'],
    waypoint: { destination: '/10.0.0.9', hboneMtlsPort: 15008 },
    protocol: 'HBONE',
    networkMode: 'Standard',
    name: 'sleep',
    namespace: 'default',
    trustDomain: 'cluster.local',
    serviceAccount: 'sleep',
    workloadType: 'deployment',
    node: 'node-a',
    status: 'Healthy',
    clusterId: '',
    locality: { region: 'r1', zone: '', subzone: '' },
    capacity: 1,
    services: { 'default/echo.default.svc.cluster.local': { 80: 8080 } },
  }]);
  assert.deepEqual(cfg.services, [{
    name: 'echo',
    namespace: 'default',
    hostname: 'echo.default.svc.cluster.local',
    vips: ['/127.10.0.10'],
    cidrVips: ['/10.1.0.0/16'],
    ports: { 80: 8080 },
    subjectAltNames: [],
    canonical: false,
    visibility: 'Public',
  }]);
  const [policy] = cfg.policies;
  assert.equal(policy.dryRun, false);
  assert.deepEqual(policy.rules[0][0][0].principals, [{ Exact: 'cluster.local/ns/default/sa/sleep' }, { Presence: [] }]);
  assert.deepEqual(policy.rules[0][0][0].destinationPorts, [8080]);
  assert.deepEqual(policy.rules[0][0][0].notSourceIps, []);
});

test('the shipped examples are valid', async () => {
  const example = (name: string): string => fileURLToPath(new URL(`../../examples/${name}`, import.meta.url));
  for (const file of [example('demo.yaml'), example('localhost.yaml')]) {
    const cfg = await loadLocalConfig({ localXdsPath: file, localXds: null });
    assert.ok(cfg!.workloads.length > 0, file);
  }
  const demo = await loadLocalConfig({ localXdsPath: example('demo.yaml'), localXds: null });
  assert.deepEqual(demo!.workloads.map((w) => [w.name, w.node, w.workloadIps[0], w.protocol]), [
    ['sleep', 'node-a', '127.0.1.10', 'HBONE'],
    ['echo', 'node-b', '127.0.2.10', 'HBONE'],
  ]);
});

test('a document with thousands of problems is refused in a screenful: the first 100, then how many more (issue 29)', () => {
  const workloads = Array.from({ length: 5000 }, (_, i) => ({ uid: `w${i}`, name: `w${i}`, namespace: 'ns', workloadIps: ['not-an-ip'] }));
  assert.throws(() => parseLocalConfig(JSON.stringify({ workloads }), 'many.yaml'), (e) => {
    assert.ok(e instanceof LocalConfigError);
    const lines = e.message.split('\n');
    assert.equal(lines.length, 101, e.message.slice(0, 500));
    assert.match(lines[0], /^many\.yaml: workloads\[0\]\.workloadIps\[0\]/);
    assert.equal(lines.at(-1), 'many.yaml: and 4900 more problems');
    return true;
  });
  // A few problems are all listed.
  assert.throws(() => parseLocalConfig(JSON.stringify({ workloads: workloads.slice(0, 3) }), 'few.yaml'), (e) => e instanceof LocalConfigError && e.message.split('\n').length === 3 && !/more problem/.test(e.message));
});

test('a file of 100,000 nested brackets is refused in well under a second, saying where (issue 29)', () => {
  const deep = `workloads: ${'['.repeat(100_000)}${']'.repeat(100_000)}\n`;
  const t0 = performance.now();
  assert.throws(() => parseLocalConfig(deep, 'deep.yaml'), (e) => {
    assert.ok(e instanceof LocalConfigError);
    assert.equal(e.message, 'deep.yaml: line 1, column 76: invalid YAML: collections nested deeper than 64 levels');
    return true;
  });
  assert.ok(performance.now() - t0 < 1_000, `refused after ${(performance.now() - t0).toFixed(0)} ms (a minute before)`);
});
