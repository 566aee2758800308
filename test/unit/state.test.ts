// The state: the mesh lives in the dataplane (a real native one here), which drops what changes nothing and reports
// what changed; the control side's store compiles policies and keeps this node's workloads. Also the config_dump
// renderings, which the dataplane writes.
import { test } from 'node:test';
import type { TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { StateStore } from '../../dist/state/store.js';
import type { AppliedChange } from '../../dist/state/store.js';
import { parseLocalConfig } from '../../dist/config/local.js';
import type { LocalConfig } from '../../dist/config/local.js';
import { ZtunnelError } from '../../dist/errors.js';
import type { AppliedOut, Dataplane, StateDelta } from '../../dist/native/index.js';
import { openNativeDataplane } from '../helpers/native-dataplane.js';

const model = (yaml: string): LocalConfig => parseLocalConfig(yaml, 'test.yaml');

const BASE = `
workloads:
- {uid: w2, name: b, namespace: ns, workloadIps: ["10.0.0.2"], node: n1, services: {"ns/svc.example": {80: 8080}}}
- {uid: w1, name: a, namespace: ns, workloadIps: ["10.0.0.1"], node: n1, protocol: HBONE}
- {uid: w9, name: z, namespace: ns, workloadIps: ["10.0.0.9"], node: n2}
services:
- {name: zsvc, namespace: ns, hostname: svc.example, vips: ["/10.96.0.1"], ports: {80: 8080}}
- {name: asvc, namespace: ns, hostname: a.example, vips: ["/10.96.0.2"], ports: {443: 0}}
policies:
- {name: p2, namespace: ns, scope: Namespace, action: Deny}
- {name: p1, namespace: ns, scope: Namespace, action: Allow}
`;

/** A store on node n1 over a real dataplane; `sent` records every delta that crossed. */
function setup(t: TestContext): {
  dp: Dataplane;
  store: StateStore;
  sent: StateDelta[];
  send: (d: StateDelta) => AppliedOut;
  load: (yaml: string) => AppliedChange;
} {
  const dp = openNativeDataplane({ nodeName: 'n1' });
  t.after(() => dp.shutdown());
  const store = new StateStore('n1');
  const sent: StateDelta[] = [];
  const send = (d: StateDelta): AppliedOut => (sent.push(d), dp.applyState(d));
  const load = (yaml: string): AppliedChange => store.apply(model(yaml), send);
  return { dp, store, sent, send, load };
}

test('an apply reports the workloads that changed; the whole record only for this node\'s', (t) => {
  const { store, sent, load } = setup(t);
  const applied = load(BASE);
  assert.equal(sent.length, 1);
  assert.equal(sent[0].full, undefined, 'the dataplane holds the state: no full replacement');
  assert.equal(applied.changedWorkloads, 3);
  // Only this node's workloads are listed (w9 is on n2 and names no policy), with their whole record.
  assert.deepEqual(applied.workloads.map((t) => t.uid).sort(), ['w1', 'w2']);
  assert.equal(applied.workloads.find((t) => t.uid === 'w1')!.after!.protocol, 'HBONE');
  assert.deepEqual(store.workloadsOnNode('n1').map((w) => w.uid), ['w1', 'w2']);
  assert.deepEqual(store.workloadsOnNode('n2'), [], 'no index of other nodes');
  assert.deepEqual(store.size, { workloads: 3, services: 2, policies: 2 });
});

test('an upsert equal to what the dataplane holds reports nothing; a change reports before and after', (t) => {
  const { store, send, load } = setup(t);
  load(BASE);
  const same = store.apply(model(BASE), send);
  assert.deepEqual([same.changedWorkloads, same.workloads.length, same.services, same.policies], [0, 0, 0, 0]);
  const next = model(BASE);
  next.workloads[1].waypoint = { destination: '/10.0.0.9', hboneMtlsPort: 15008 };
  next.workloads[0].node = 'n2'; // w2 leaves this node
  const moved = store.apply(next, send);
  assert.deepEqual(moved.workloads.map((t) => t.uid).sort(), ['w1', 'w2']);
  const w1 = moved.workloads.find((t) => t.uid === 'w1')!;
  assert.deepEqual([w1.before!.waypoint, w1.after!.waypoint], [undefined, { destination: '/10.0.0.9', hboneMtlsPort: 15008 }], 'ztunnel leaves out an absent waypoint');
  assert.deepEqual(store.workloadsOnNode('n1').map((w) => w.uid), ['w1']);
  // Off this node, a change is counted, not listed; a policy it names that is not held is reported missing.
  const named = store.apply({ workloads: [{ ...model(BASE).workloads[2], authorizationPolicies: ['ns/p1', 'ns/none'] }] }, send);
  assert.deepEqual([named.changedWorkloads, named.workloads], [1, []]);
  assert.deepEqual(named.missing, [{ uid: 'w9', policy: 'ns/none' }], 'ns/p1 is held');
  assert.equal(store.missingReferences, 1);
  // Removals of unknown keys change nothing.
  assert.equal(store.apply({ removedWorkloads: ['nope'] }, send).changedWorkloads, 0);
});

test('a rejected delta changes nothing on either side', (t) => {
  const { dp, store, send, load } = setup(t);
  load(BASE);
  const bad = model(BASE);
  assert.throws(
    () => store.apply({ workloads: [{ ...bad.workloads[0], workloadIps: ['10.0.0.300'] }], removedPolicies: ['ns/p1'] }, send),
    (err) => err instanceof ZtunnelError && err.code === 'INVALID_STATE' && /^workloads\[0\]\.workloadIps\[0\]: "10\.0\.0\.300" is not an IP address/.test(err.message),
  );
  assert.deepEqual(dp.meshDump().policies.map((p) => p.name), ['p1', 'p2'], 'ns/p1 is still held');
  assert.deepEqual(dp.meshDump().workloads.find((w) => w.uid === 'w2')!.workloadIps, ['10.0.0.2']);
});

test('policies cross compiled; one sent again unchanged changes nothing, a changed one is applied', (t) => {
  const { dp, store, sent, send, load } = setup(t);
  load(BASE);
  const p1 = model(BASE).policies[1];
  assert.equal(store.apply({ policies: [p1] }, send).policies, 0);
  const [written] = model(`
policies:
- {name: p1, namespace: ns, scope: Namespace, action: Deny, rules: [[[{principals: [{Exact: "spiffe://td/ns/a/sa/b"}], sourceIps: ["10.1.2.3/8"]}]]]}
`).policies;
  const changed = store.apply({ policies: [written] }, send);
  assert.equal(changed.policies, 1);
  const [compiled] = sent.at(-1)!.policies!;
  assert.deepEqual([compiled.action, compiled.rules[0][0][0].principals, compiled.rules[0][0][0].sourceIps], ['Deny', [{ exact: 'td/ns/a/sa/b' }], ['10.1.2.3/8']]);
  // config_dump shows the compiled form the dataplane holds: the CIDR as written (not masked), as ztunnel's does.
  const [dumped] = dp.meshDump().policies;
  assert.deepEqual(dumped.rules, [[[{ principals: [{ Exact: 'td/ns/a/sa/b' }], sourceIps: ['10.1.2.3/8'] }]]]);
  assert.equal(store.apply({ removedPolicies: ['ns/none'] }, send).policies, 0, 'a removal of a policy not held');
  assert.equal(store.size.policies, 2);
});

test('config_dump workloads: sorted by uid, ztunnel keys in order, defaults left out as ztunnel does (rendered by the dataplane)', (t) => {
  const { dp, load } = setup(t);
  load(BASE);
  const dump = dp.meshDump().workloads;
  assert.deepEqual(dump.map((w) => w.uid), ['w1', 'w2', 'w9']);
  const order = [
    'uid', 'workloadIps', 'waypoint', 'networkGateway', 'protocol', 'networkMode', 'name', 'namespace', 'trustDomain',
    'serviceAccount', 'network', 'workloadName', 'workloadType', 'canonicalName', 'canonicalRevision', 'hostname', 'node',
    'nativeTunnel', 'applicationTunnel', 'authorizationPolicies', 'status', 'clusterId', 'locality', 'services', 'capacity',
  ];
  for (const w of dump) {
    const keys = Object.keys(w);
    assert.deepEqual(keys, order.filter((k) => keys.includes(k)), `${w.uid}: keys in ztunnel's order`);
    // Always written, default or not.
    for (const k of ['workloadIps', 'protocol', 'networkMode', 'name', 'namespace', 'status', 'clusterId', 'capacity']) assert.ok(keys.includes(k), `${w.uid}: ${k}`);
    // Unset here, so left out.
    for (const k of ['waypoint', 'networkGateway', 'hostname', 'nativeTunnel', 'applicationTunnel', 'authorizationPolicies', 'locality']) assert.ok(!keys.includes(k), `${w.uid}: no ${k}`);
  }
  // `services`: the "namespace/hostname" list of what the workload is an endpoint of (its ports are in the service's endpoints).
  assert.deepEqual(dump.map((w) => w.services), [undefined, ['ns/svc.example'], undefined]);
});

test('config_dump services: sorted by hostname, endpoints derived from workloads; staged endpoints', (t) => {
  const { dp, store, send, load } = setup(t);
  load(BASE);
  const dump = dp.meshDump().services;
  assert.deepEqual(dump.map((s) => s.hostname), ['a.example', 'svc.example']);
  // Unset waypoint, weighted waypoints, load balancer, IP families and CIDR VIPs are left out; `canonical` is
  // written always, as ztunnel writes it (istio/ztunnel src/state/service.rs).
  assert.deepEqual(Object.keys(dump[0]), ['name', 'namespace', 'hostname', 'vips', 'ports', 'endpoints', 'subjectAltNames', 'canonical', 'visibility']);
  assert.equal(dump[0].canonical, false);
  assert.equal(dump[0].visibility, 'Public');
  assert.deepEqual(dump[0].endpoints, {});
  assert.deepEqual(dump[1].endpoints, { w2: { workloadUid: 'w2', port: { 80: 8080 }, status: 'Healthy' } });
  // An endpoint naming a service that is not there (yet) is staged.
  store.apply({ workloads: [{ ...model(BASE).workloads[2], services: { 'ns/later.example': { 80: 9090 } } }] }, send);
  assert.deepEqual(dp.meshDump().stagedServices, { 'ns/later.example': { w9: { workloadUid: 'w9', port: { 80: 9090 }, status: 'Healthy' } } });
});

test('config_dump policies: written by the dataplane from what it holds, sorted by namespace/name', (t) => {
  const { dp, load } = setup(t);
  load(BASE);
  assert.deepEqual(dp.meshDump().policies, [
    { name: 'p1', namespace: 'ns', scope: 'Namespace', action: 'Allow', rules: [], dryRun: false },
    { name: 'p2', namespace: 'ns', scope: 'Namespace', action: 'Deny', rules: [], dryRun: false },
  ]);
});
