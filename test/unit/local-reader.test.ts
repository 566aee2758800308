// The local config's reader (native/mesh/src/state/local.rs): the YAML read straight into the dataplane's records,
// whose own serde shapes (native/mesh/src/state/model.rs) are the schema of a document's workloads and services.
// Properties, over the repository's example files, a document with every field, hand-picked documents around YAML's
// resolution rules and generated documents written both as JSON and as block YAML:
// - the notation does not matter: a document written as JSON and as block YAML gets the same verdict, the same
//   problems, or the same state;
// - one record type, both ways: the records of an accepted document, handed back in a delta's form
//   (`parseLocalConfig`) and sent again as a JSON delta, give the dataplane the state the document gave it (what
//   the record writes, it reads);
// - a large document read in pieces gives what it gives read whole.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import fc from 'fast-check';
import YAML from 'yaml';
import { parseLocalConfig, prepareLocal } from '../../dist/config/local.js';
import { LocalConfigError } from '../../dist/errors.js';
import { largeConfigYaml } from '../helpers/large-config.js';
import { openNativeDataplane } from '../helpers/native-dataplane.js';

const RUNS = Number(process.env.FUZZ_RUNS ?? 300);
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const fileDp = openNativeDataplane();
const deltaDp = openNativeDataplane();
after(() => {
  fileDp.shutdown();
  deltaDp.shutdown();
});
const utf8 = (s: string): Uint8Array => new TextEncoder().encode(s);

/**
 * One document's verdict: `{ problems }` (the LocalConfigError's message), or `{ state }`: the dataplane's mesh
 * after applying it, which is also checked to be what its records give sent back as a JSON delta.
 */
async function verdict(text: string) {
  let prepared;
  try {
    prepared = prepareLocal(utf8(text), 'doc.yaml');
  } catch (err) {
    assert.ok(err instanceof LocalConfigError, `${err?.constructor?.name}: ${(err as Error | null)?.message}`);
    assert.ok(err.message.startsWith('doc.yaml: '), err.message);
    return { problems: err.message };
  }
  await fileDp.applyLocal(prepared.ticket, []);
  const state = fileDp.meshDump();
  const records = parseLocalConfig(text, 'doc.yaml');
  deltaDp.applyState({ full: true, workloads: records.workloads, services: records.services });
  const again = deltaDp.meshDump();
  assert.deepEqual([again.workloads, again.services], [state.workloads, state.services], `the records read back as they were written:\n${text}`);
  return { state: [state.workloads, state.services], policies: prepared.compiled };
}

const EVERY_FIELD = `
workloads:
- uid: Kubernetes//Pod/default/a
  name: a
  namespace: default
  serviceAccount: sa-a
  trustDomain: td.example
  workloadIps: [10.0.0.1, "fd00::1"]
  network: net1
  protocol: HBONE
  networkMode: Standard
  node: node-1
  hostname: ""
  status: Unhealthy
  capacity: 7
  canonicalName: app
  canonicalRevision: v1.2_rc-3
  workloadName: app
  workloadType: CronJob
  clusterId: Kubernetes
  locality: {region: r1, zone: z1, subzone: s1}
  services:
    default/echo.default.svc.cluster.local: {80: 8080, "443": 8443}
  authorizationPolicies: [default/allow-a]
  waypoint: {destination: default/waypoint.default.svc.cluster.local, hboneMtlsPort: 15009}
  networkGateway: {destination: net2/10.9.9.9}
  applicationTunnel: {protocol: PROXY, port: 15088}
  nativeTunnel: true
- uid: Kubernetes//Pod/default/b
  name: b
  namespace: default
  networkMode: HostNetwork
  hostname: b.example.com
  applicationTunnel: ~
  waypoint: null
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: [/10.96.0.1, net1/10.96.0.2]
  cidrVips: [10.97.0.0/16, net1/10.98.0.0/24]
  ports: {80: 8080, 443: 0}
  subjectAltNames: [spiffe://td.example/ns/default/sa/sa-a, not-spiffe]
  canonical: true
  waypoint: {destination: /10.0.0.5}
  weightedWaypoints:
  - {waypoint: {destination: /10.0.0.6}, weight: 3}
  - waypoint: {destination: default/w2.default.svc.cluster.local}
    weight: 0
  loadBalancer: {routingPreferences: [Network, Region, Zone, Subzone, Node, Cluster], mode: Failover, healthPolicy: AllowAll}
  ipFamilies: IPv4
  visibility: Namespace
- name: plain
  namespace: other
  hostname: plain.other
  loadBalancer: null
  ipFamilies: ~
policies:
- name: allow-a
  namespace: default
  scope: WorkloadSelector
  action: Allow
  dryRun: true
  rules:
  - - - principals: [!Exact "td.example/ns/default/sa/sa-a", !Prefix td.example/ns/x/, {Suffix: /sa/z}, !Presence []]
        sourceIps: [10.0.0.0/8]
      - destinationPorts: [8080, 8443]
`;

test('the examples and a document with every field are read, and their records read back the same', async () => {
  const examples = readdirSync(join(root, 'examples')).filter((f) => f.endsWith('.yaml'));
  assert.ok(examples.length > 0);
  for (const f of examples) assert.ok('state' in (await verdict(readFileSync(join(root, 'examples', f), 'utf8'))), f);
  const every = await verdict(EVERY_FIELD);
  assert.ok('state' in every, every.problems);
  assert.equal(every.state![0].length, 2);
  assert.equal(every.state![1].length, 2);
  assert.ok('state' in (await verdict(largeConfigYaml({ workloads: 40 }))), 'the large-input shape');
  for (const empty of ['', '~\n', '# only a comment\n', '{}\n']) assert.deepEqual((await verdict(empty)).state, [[], []], JSON.stringify(empty));
});

test('a large document is read in pieces with the same result as in one', async () => {
  // 4 MiB and more is split at its top-level list items (state/local.rs `sections`); the same text with its first
  // item indented is one piece.
  const text = largeConfigYaml({ workloads: 9_000 });
  assert.ok(text.length > 4 << 20, `${text.length} bytes`);
  const pieces = await verdict(text);
  const whole = await verdict(`# not split: the items are indented\n${text.replace(/^(- | {2})/gm, '  $1').replace(/^ {2}(workloads|services|policies):/gm, '$1:')}`);
  assert.ok('state' in pieces && 'state' in whole);
  assert.deepEqual(pieces.state, whole.state);
});

test('hand-picked documents around the resolution rules: the same verdict whether written as flow or block YAML', async () => {
  const base = (extra: string): string => `workloads:\n- {uid: a, name: a, namespace: ns${extra}}\n`;
  const cases: [string, string | null][] = [
    [base(', capacity: 1.0'), 'workloads[0].capacity: invalid type: floating point `1.0`, expected u32'],
    [base(', capacity: "1"'), 'workloads[0].capacity: invalid type: string "1", expected u32'],
    [base(', capacity: 0x10'), null],
    [base(', node: 0123'), 'workloads[0].node: invalid type: integer `123`, expected a string'],
    [base(', node: yes'), null], // YAML 1.2: a string
    [base(', node: 1e3'), 'workloads[0].node: invalid type: floating point `1000.0`, expected a string'],
    [base(', node: 8_080'), null],
    [base(', node: .inf'), 'workloads[0].node: invalid type: floating point `inf`, expected a string'],
    [base(', workloadIps: [010.0.0.1]'), 'workloads[0].workloadIps[0]: "010.0.0.1" is not an IP address'],
    [base(', workloadIps: ["fe80::1%eth0"]'), 'workloads[0].workloadIps[0]: "fe80::1%eth0" is not an IP address'],
    [base(', workloadIps: ["::ffff:10.0.0.1"]'), null],
    [base(', workloadType: POD'), null],
    [base(', workloadType: pods'), 'workloads[0].workloadType: "pods" is not one of deployment|cronjob|pod|job (any case)'],
    [base(', services: {"ns/a": {080: 1}}'), null],
    [base(', services: {"ns/a/b": {80: 1}}'), 'workloads[0].services: "ns/a/b" is not <namespace>/<hostname>'],
    [base(', services: {"ns/a": {80: 1, "80": 2}}'), 'workloads[0].services["ns/a"]: the key "80" is given twice'],
    [base(', locality: {region: "a b"}'), 'workloads[0].locality.region: "a b" has the character " ", which cannot go into a header'],
    [base(', waypoint: {destination: "/"}'), 'workloads[0].waypoint: "/" is not <network>/<ip> or <namespace>/<hostname>'],
    [base(', waypoint: {destination: "/10.0.0.1", hboneMtlsPort: 0}'), null],
    [base(', !!str node: x'), 'workloads[0]: a tagged mapping key is not supported'],
    [base(', name: !!str 80'), 'workloads[0]: the key "name" is given twice'],
    ['workloads:\n- &w {uid: a, name: a, namespace: ns}\n- *w\n', 'workloads[1].uid: duplicate uid "a" (also workloads[0])'],
    ['workloads:\n- &w {uid: a, name: a, namespace: ns}\n- {uid: b, name: b, namespace: ns, locality: *w}\n', 'workloads[1].locality.uid: unknown field "uid"'],
    ['services:\n- {name: s, namespace: ns, hostname: h, cidrVips: ["net/10.0.0.0/8", "10.0.0.0/8", "a/b/10.0.0.0/8"]}\n', 'services[0].cidrVips[2]: "a/b/10.0.0.0/8" is not a CIDR (e.g. 10.0.0.0/24 or net/10.0.0.0/24)'],
    ['services:\n- {name: s, namespace: ns, hostname: h, vips: ["10.0.0.1"]}\n', 'services[0].vips[0]: "10.0.0.1" is not <network>/<ip> (e.g. "/10.0.0.1")'],
    ['policies:\n- {name: p, scope: Global, action: Allow, rules: [[[{principals: [!Regex a]}]]]}\n', 'policies[0].rules[0][0][0].principals[0].Regex: unknown field "Regex"\ndoc.yaml: policies[0].rules[0][0][0].principals[0]: expected exactly one of Exact, Prefix, Suffix, Presence'],
    ['policies: [{name: p, scope: Global, action: Allow}, {name: p, scope: Global, action: Deny}]\n', 'policies[1]: duplicate policy "/p" (also policies[0])'],
    ['--- {}\n--- {}\n', 'invalid YAML: more than one document'],
    ['workloads: []\nworkloads: []\n', '(document): the key "workloads" is given twice'],
  ];
  for (const [text, problem] of cases) {
    const v = await verdict(text);
    if (problem === null) {
      assert.ok('state' in v, `${text}: ${v.problems}`);
    } else {
      assert.equal(v.problems, `doc.yaml: ${problem}`, text);
    }
  }
});

// Generated documents: values a careless or hostile author could write, in both notations.
const value = fc.oneof(
  fc.stringMatching(/^[a-z0-9-]{1,10}$/),
  fc.string({ maxLength: 8 }),
  fc.constantFrom('', 'a,b', 'x/y', 'ns/h', '10.0.0.1', '::1', '0x1f', '012', '1.5', 'true', 'null', '~', 'Yes', '-', '.inf'),
  fc.integer({ min: -1, max: 70000 }),
  fc.constantFrom(true, null, 1.5),
);
const port = fc.oneof(fc.integer({ min: -1, max: 70000 }), fc.constantFrom('80', '080', 'x', 1.0));
const gateway = fc.oneof(fc.constant(null), fc.record({ destination: fc.oneof(value, fc.constantFrom('/10.0.0.1', 'ns/h.example', 'net/::1')), hboneMtlsPort: port }, { requiredKeys: [] }));
const workload = fc.record(
  {
    uid: value,
    name: value,
    namespace: value,
    serviceAccount: value,
    workloadIps: fc.array(fc.oneof(fc.ipV4(), fc.ipV6(), value), { maxLength: 2 }),
    protocol: fc.constantFrom('HBONE', 'TCP', 'hbone'),
    networkMode: fc.constantFrom('Standard', 'HostNetwork', 'Host'),
    node: value,
    capacity: port,
    workloadType: fc.constantFrom('deployment', 'Pod', 'JOB', 'x'),
    locality: fc.record({ region: value, zone: value }, { requiredKeys: [] }),
    services: fc.dictionary(fc.oneof(fc.constant('default/echo.example'), value.map(String)), fc.dictionary(fc.constantFrom('80', '0', '070', '70000', 'x'), port), { maxKeys: 2 }),
    authorizationPolicies: fc.array(value, { maxLength: 2 }),
    waypoint: gateway,
    applicationTunnel: fc.oneof(fc.constant(null), fc.record({ protocol: fc.constantFrom('NONE', 'PROXY', 'proxy'), port: fc.oneof(fc.constant(null), port) }, { requiredKeys: [] })),
    nativeTunnel: fc.oneof(fc.boolean(), value),
  },
  { requiredKeys: ['uid', 'name', 'namespace'] },
);
const service = fc.record(
  {
    name: value,
    namespace: value,
    hostname: value,
    vips: fc.array(fc.oneof(fc.ipV4().map((a) => `/${a}`), fc.ipV6().map((a) => `net/${a}`), value), { maxLength: 2 }),
    cidrVips: fc.array(fc.oneof(fc.constantFrom('10.0.0.0/8', 'n/10.0.0.0/16', '::/0', '10.0.0.0/33', '10.0.0.0'), value), { maxLength: 2 }),
    ports: fc.dictionary(fc.constantFrom('80', '443', '0', 'x'), port, { maxKeys: 2 }),
    weightedWaypoints: fc.array(fc.record({ waypoint: gateway, weight: port }, { requiredKeys: [] }), { maxLength: 2 }),
    loadBalancer: fc.oneof(fc.constant(null), fc.record({ mode: fc.constantFrom('Strict', 'Failover', 'x'), routingPreferences: fc.array(fc.constantFrom('Zone', 'Node', 'zone'), { maxLength: 2 }) }, { requiredKeys: [] })),
    ipFamilies: fc.constantFrom('Dual', 'IPv4', 'Both', null),
    visibility: fc.constantFrom('Public', 'Namespace', null),
    canonical: fc.oneof(fc.boolean(), value),
  },
  { requiredKeys: ['name', 'namespace', 'hostname'] },
);
const policy = fc.record(
  {
    name: value,
    namespace: value,
    scope: fc.constantFrom('Global', 'Namespace', 'WorkloadSelector', 'x'),
    action: fc.constantFrom('Allow', 'Deny'),
    rules: fc.array(fc.array(fc.array(fc.record({ principals: fc.array(fc.oneof(fc.record({ Exact: value }), fc.record({ Prefix: value })), { maxLength: 2 }), destinationPorts: fc.array(port, { maxLength: 2 }) }, { requiredKeys: [] }), { maxLength: 2 }), { maxLength: 1 }), { maxLength: 1 }),
  },
  { requiredKeys: ['name', 'scope', 'action'] },
);
const documents = fc.record({ workloads: fc.array(workload, { maxLength: 3 }), services: fc.array(service, { maxLength: 2 }), policies: fc.array(policy, { maxLength: 2 }) }, { requiredKeys: [] });

test('generated documents, as JSON and as block YAML: the same verdict, and records that read back the same', async () => {
  const seen = { read: 0, refused: 0 };
  await fc.assert(
    fc.asyncProperty(documents, async (doc) => {
      const json = await verdict(JSON.stringify(doc));
      const yaml = await verdict(YAML.stringify(doc));
      assert.deepEqual(yaml, json, `the notation changed the verdict for ${JSON.stringify(doc)}`);
      seen['state' in json ? 'read' : 'refused']++;
    }),
    { numRuns: RUNS },
  );
  assert.ok(seen.read > 0 && seen.refused > 0, `both verdicts were exercised: ${JSON.stringify(seen)}`);
});
