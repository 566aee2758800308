// The state store: deltas for the native side (full first, then diffs) and the config_dump renderings.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { StateStore, computeDelta, sameJson, stableStringify } from '../../dist/state/store.js';
import { parseLocalConfig } from '../../dist/config/local.js';

const model = (yaml) => parseLocalConfig(yaml, 'test.yaml');

const BASE = `
workloads:
- {uid: w2, name: b, namespace: ns, workloadIps: ["10.0.0.2"], node: n1, services: {"ns/svc.example": {80: 8080}}}
- {uid: w1, name: a, namespace: ns, workloadIps: ["10.0.0.1"], node: n1, protocol: HBONE}
services:
- {name: zsvc, namespace: ns, hostname: svc.example, vips: ["/10.96.0.1"], ports: {80: 8080}}
- {name: asvc, namespace: ns, hostname: a.example, vips: ["/10.96.0.2"], ports: {443: 0}}
policies:
- {name: p2, namespace: ns, scope: Namespace, action: Deny}
- {name: p1, namespace: ns, scope: Namespace, action: Allow}
`;

function record() {
  const sent = [];
  return { sent, send: (d) => sent.push(d) };
}

test('the first apply is a full replacement carrying only native fields', () => {
  const store = new StateStore();
  const { sent, send } = record();
  const delta = store.replace(model(BASE), send);
  assert.equal(sent.length, 1);
  assert.equal(delta, sent[0]);
  assert.equal(delta.full, true);
  assert.deepEqual(delta.workloads.map((w) => w.uid).sort(), ['w1', 'w2']);
  assert.deepEqual(delta.services.map((s) => s.hostname).sort(), ['a.example', 'svc.example']);
  // The routing fields cross the boundary (the dataplane routes on them); nothing else does.
  assert.equal('waypoint' in delta.workloads[0], true);
  assert.equal('networkMode' in delta.workloads[0], true);
  assert.deepEqual(Object.keys(delta.services[0]).sort(), [
    'canonical', 'cidrVips', 'hostname', 'ipFamilies', 'loadBalancer', 'name', 'namespace', 'ports', 'subjectAltNames',
    'vips', 'visibility', 'waypoint', 'weightedWaypoints',
  ]);
});

test('later applies send only what changed, and nothing when nothing changed', () => {
  const store = new StateStore();
  store.replace(model(BASE), () => {});
  const { sent, send } = record();
  assert.equal(store.replace(model(BASE), send), null);
  assert.equal(sent.length, 0);

  const changed = model(BASE);
  changed.workloads[0].status = 'Unhealthy'; // w2 changes
  changed.workloads.pop(); // w1 removed
  changed.workloads.push({ ...changed.workloads[0], uid: 'w3', name: 'c' }); // w3 added
  changed.services = changed.services.filter((s) => s.hostname !== 'a.example'); // service removed
  const delta = store.replace(changed, send);
  assert.equal(delta.full, undefined);
  assert.deepEqual(delta.workloads.map((w) => w.uid).sort(), ['w2', 'w3']);
  assert.equal(delta.workloads.find((w) => w.uid === 'w2').status, 'Unhealthy');
  assert.deepEqual(delta.removedWorkloads, ['w1']);
  assert.deepEqual(delta.removedServices, ['ns/a.example']);
  assert.equal(delta.services, undefined);
});

test('a waypoint change reaches the dataplane and the dump', () => {
  const store = new StateStore();
  store.replace(model(BASE), () => {});
  const next = model(BASE);
  next.workloads[1].waypoint = { destination: '/10.0.0.9', hboneMtlsPort: 15008 };
  const { sent, send } = record();
  const delta = store.replace(next, send);
  assert.equal(sent.length, 1);
  assert.deepEqual(delta.workloads.map((w) => [w.uid, w.waypoint]), [['w1', { destination: '/10.0.0.9', hboneMtlsPort: 15008 }]]);
  assert.deepEqual(store.dumpWorkloads().find((w) => w.uid === 'w1').waypoint, { destination: '/10.0.0.9', hboneMtlsPort: 15008 });
});

test('a rejected delta changes nothing; the next delta is computed against the old state', () => {
  const store = new StateStore();
  assert.throws(() => store.replace(model(BASE), () => {
    throw new Error('INVALID_STATE: nope');
  }), /INVALID_STATE/);
  // Nothing was applied, so the retry is still a full replacement.
  const { sent, send } = record();
  store.replace(model(BASE), send);
  assert.equal(sent[0].full, true);
  assert.equal(store.dumpWorkloads().length, 2);
});

test('computeDelta ignores key order inside maps', () => {
  const a = { workloads: new Map([['w', { uid: 'w', services: { 'ns/a': { 80: 1, 81: 2 } } }]]), services: new Map() };
  const b = { workloads: new Map([['w', { services: { 'ns/a': { 81: 2, 80: 1 } }, uid: 'w' }]]), services: new Map() };
  assert.equal(computeDelta(a, b), null);
  assert.equal(stableStringify({ b: 1, a: [{ d: 1, c: 2 }] }), '{"a":[{"c":2,"d":1}],"b":1}');
});

test('sameJson judges equality as stableStringify renders it, without rendering', () => {
  const cases = [
    [{ b: 1, a: [{ d: 1, c: 2 }] }, { a: [{ c: 2, d: 1 }], b: 1 }],
    [{ a: 1, u: undefined }, { a: 1 }],
    [{ a: 1 }, { a: 1, b: null }],
    [[1, 2], [2, 1]],
    [{ a: [] }, { a: {} }],
    [{ a: '1' }, { a: 1 }],
    [null, {}],
    [{ a: { x: [1, { y: 'z' }] } }, { a: { x: [1, { y: 'z' }] } }],
    [{ a: { x: [1, { y: 'z' }] } }, { a: { x: [1, { y: 'w' }] } }],
  ];
  for (const [x, y] of cases) {
    const same = stableStringify(x) === stableStringify(y);
    assert.equal(sameJson(x, y), same, `${JSON.stringify(x)} vs ${JSON.stringify(y)}`);
    assert.equal(sameJson(y, x), same);
  }
});

test('dumpWorkloads: sorted by uid, ztunnel keys in order', () => {
  const store = new StateStore();
  store.replace(model(BASE), () => {});
  const dump = store.dumpWorkloads();
  assert.deepEqual(dump.map((w) => w.uid), ['w1', 'w2']);
  assert.deepEqual(Object.keys(dump[0]), [
    'uid', 'workloadIps', 'waypoint', 'networkGateway', 'protocol', 'networkMode', 'name', 'namespace', 'trustDomain',
    'serviceAccount', 'network', 'workloadName', 'workloadType', 'canonicalName', 'canonicalRevision', 'hostname', 'node',
    'nativeTunnel', 'applicationTunnel', 'authorizationPolicies', 'status', 'clusterId', 'locality', 'services', 'capacity',
  ]);
});

test('dumpServices: sorted by hostname, endpoints derived from workloads', () => {
  const store = new StateStore();
  store.replace(model(BASE), () => {});
  const dump = store.dumpServices();
  assert.deepEqual(dump.map((s) => s.hostname), ['a.example', 'svc.example']);
  assert.deepEqual(Object.keys(dump[0]), [
    'name', 'namespace', 'hostname', 'vips', 'cidrVips', 'ports', 'endpoints', 'subjectAltNames', 'waypoint',
    'weightedWaypoints', 'loadBalancer', 'ipFamilies', 'canonical', 'visibility',
  ]);
  assert.deepEqual(dump[0].endpoints, {});
  assert.deepEqual(dump[1].endpoints, { w2: { workloadUid: 'w2', port: { 80: 8080 }, status: 'Healthy' } });
});

test('dumpPolicies sorted by namespace/name; workloadsOnNode', () => {
  const store = new StateStore();
  store.replace(model(BASE), () => {});
  assert.deepEqual(store.dumpPolicies().map((p) => p.name), ['p1', 'p2']);
  assert.deepEqual(store.workloadsOnNode('n1').map((w) => w.uid), ['w1', 'w2']);
  assert.deepEqual(store.workloadsOnNode('other'), []);
});
