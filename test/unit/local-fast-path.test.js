// The local config's fast path (native/mesh/src/state/local.rs: the YAML read straight into the dataplane's
// records) against the schema's slow way (ts/config/local.ts): the schema stays the judge. Properties, over the
// repository's example files, a document with every field, and generated documents written both as JSON and as
// block YAML (plain scalars: the resolution rules matter there):
// - what the fast path accepts, the schema accepts, and both give the dataplane the same state (its config_dump
//   rendering) and the same policies as written;
// - the examples and the every-field document are read the fast way (a decline would only cost time, but these are
//   the shapes people write).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import fc from 'fast-check';
import YAML from 'yaml';
import { parseLocalConfig, parseLocalPolicies } from '../../dist/config/local.js';
import { LocalConfigError } from '../../dist/errors.js';
import { localDiscard, localPrepare, localPrepareRecords, yamlToJson } from '../../dist/native/index.js';
import { largeConfigYaml } from '../helpers/large-config.js';
import { openNativeDataplane } from '../helpers/native-dataplane.js';

const RUNS = Number(process.env.FUZZ_RUNS ?? 300);
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const fastDp = openNativeDataplane();
const slowDp = openNativeDataplane();
after(() => {
  fastDp.shutdown();
  slowDp.shutdown();
});
const utf8 = (s) => new TextEncoder().encode(s);

/** The schema's verdict: the parsed document, or null (refused with a LocalConfigError). */
function slow(text) {
  try {
    return parseLocalConfig(text, 'doc.yaml');
  } catch (err) {
    assert.ok(err instanceof LocalConfigError, `${err?.constructor?.name}: ${err?.message}`);
    return null;
  }
}

/** The loader worker's fast way: the dataplane's read, then the schema over the policies it hands back. */
function fastWay(text) {
  const fast = localPrepare(utf8(text));
  if (!('ticket' in fast)) return fast;
  try {
    parseLocalPolicies(fast.policies, 'doc.yaml');
    return fast;
  } catch (err) {
    localDiscard(fast.ticket);
    assert.ok(err instanceof LocalConfigError, err.message);
    return { declined: 'policies' };
  }
}

/**
 * Checks one document; returns 'fast' (read the fast way, and agreeing with the schema), 'declined' or
 * 'refused' (the schema refuses it too).
 */
async function compare(text) {
  const fast = fastWay(text);
  const doc = slow(text);
  if (!('ticket' in fast)) return doc === null ? 'refused' : 'declined';
  if (doc === null) {
    localDiscard(fast.ticket);
    assert.fail(`the fast path accepted what the schema refuses:\n${text}`);
  }
  assert.deepEqual([fast.workloads, fast.services], [doc.workloads.length, doc.services.length]);
  assert.deepEqual(fast.policies, JSON.parse(yamlToJson(text))?.policies ?? [], 'the policies as written');
  let slowTicket;
  try {
    slowTicket = localPrepareRecords(utf8(JSON.stringify({ workloads: doc.workloads, services: doc.services })));
  } catch (err) {
    localDiscard(fast.ticket);
    // The dataplane refuses what the schema let through (the fuzz test's property says it must not): the fast path
    // must have declined it then.
    assert.fail(`the fast path accepted what the dataplane refuses from the schema's records: ${err.message}\n${text}`);
  }
  await fastDp.applyLocal(fast.ticket, []);
  await slowDp.applyLocal(slowTicket, []);
  assert.deepEqual(fastDp.meshDump(), slowDp.meshDump(), `the same state for:\n${text}`);
  return 'fast';
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

test('the examples and a document with every field are read the fast way, with the schema\'s result', async () => {
  const examples = readdirSync(join(root, 'examples')).filter((f) => f.endsWith('.yaml'));
  assert.ok(examples.length > 0);
  for (const f of examples) assert.equal(await compare(readFileSync(join(root, 'examples', f), 'utf8')), 'fast', f);
  assert.equal(await compare(EVERY_FIELD), 'fast', 'every field');
  assert.equal(await compare(largeConfigYaml({ workloads: 40 })), 'fast', 'the large-input shape');
  for (const empty of ['', '~\n', '# only a comment\n', '{}\n']) assert.equal(await compare(empty), 'fast', JSON.stringify(empty));
});

test('a large document is read in pieces with the same result as in one', async () => {
  // 4 MiB and more is split at its top-level list items (state/local.rs `sections`); the comparison is the schema's.
  const text = largeConfigYaml({ workloads: 9_000 });
  assert.ok(text.length > 4 << 20, `${text.length} bytes`);
  assert.equal(await compare(text), 'fast');
});

test('declined or refused, never different: hand-picked documents around the resolution rules', async () => {
  const base = (extra) => `workloads:\n- {uid: a, name: a, namespace: ns${extra}}\n`;
  const cases = [
    base(', capacity: 1.0'), // a float the schema takes as an integer: declined, the slow way accepts
    base(', capacity: "1"'),
    base(', node: 0123'), // YAML 1.2: a string; declined here
    base(', node: 12'),
    base(', node: yes'),
    base(', node: 1e3'),
    base(', node: 8_080'),
    base(', node: .inf'),
    base(', workloadIps: [010.0.0.1]'),
    base(', workloadIps: ["fe80::1%eth0"]'),
    base(', workloadIps: ["::ffff:10.0.0.1"]'),
    base(', workloadType: POD'),
    base(', workloadType: pods'),
    base(', services: {"ns/a": {080: 1}}'),
    base(', services: {"ns/a": {"080": 1}}'),
    base(', services: {"ns/a/b": {80: 1}}'),
    base(', services: {"ns/a": {80: 1, "80": 2}}'),
    base(', locality: {region: "a b"}'),
    base(', waypoint: {destination: "/"}'),
    base(', waypoint: {destination: "a/"}'),
    base(', waypoint: {destination: "/10.0.0.1", hboneMtlsPort: 0}'),
    base(', !!str node: x'),
    base(', name: !!str 80'),
    'workloads:\n- &w {uid: a, name: a, namespace: ns}\n- *w\n',
    'services:\n- {name: s, namespace: ns, hostname: h, cidrVips: ["net/10.0.0.0/8", "10.0.0.0/8", "a/b/10.0.0.0/8", "10.0.0.0/08"]}\n',
    'services:\n- {name: s, namespace: ns, hostname: h, vips: ["10.0.0.1"]}\n',
    'policies:\n- {name: p, scope: Global, action: Allow, rules: [[[{destinationPorts: [1.0]}]]]}\n',
    'policies:\n- {name: p, scope: Global, action: Allow, rules: [[[{principals: [!Regex a]}]]]}\n',
    'policies: [{name: p, scope: Global, action: Allow}, {name: p, scope: Global, action: Deny}]\n',
    '--- {}\n--- {}\n',
    'workloads: []\nworkloads: []\n',
  ];
  const seen = { fast: 0, declined: 0, refused: 0 };
  for (const text of cases) seen[await compare(text)]++;
  assert.ok(seen.declined > 0 && seen.refused > 0 && seen.fast > 0, JSON.stringify(seen));
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

test('generated documents, as JSON and as block YAML: what the fast path accepts, the schema accepts, with the same state', async () => {
  const seen = { fast: 0, declined: 0, refused: 0 };
  await fc.assert(
    fc.asyncProperty(documents, async (doc) => {
      seen[await compare(JSON.stringify(doc))]++;
      seen[await compare(YAML.stringify(doc))]++;
    }),
    { numRuns: RUNS },
  );
  assert.ok(seen.fast > 0 && seen.refused > 0, `both verdicts were exercised: ${JSON.stringify(seen)}`);
});
