// Wire check: a Workload and an Authorization encoded by an independent encoder (`protoc --encode`, from the
// `protoc` npm package, with protos written from Istio's field numbers in test/fixtures/wire/) are decoded by
// ztunnel-node's generated code (from proto/) and compared field by field; the Workload's bytes are also decoded by
// the dataplane (prost, native/mesh/src/state/wds.rs) and compared with the state model; the Authorization is
// converted at the edge and compared with what the local config file produces for the same policy.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { fromBinary } from '@bufbuild/protobuf';
import { WorkloadSchema, TunnelProtocol, WorkloadType, WorkloadStatus, NetworkMode, AppProtocol, ApplicationTunnel_Protocol } from '../../dist/gen/istio/workload/workload_pb.js';
import { AuthorizationSchema, Scope, Action } from '../../dist/gen/istio/security/authorization_pb.js';
import { convertAuthorization } from '../../dist/xds/convert.js';
import { decodeAddress } from '../../dist/native/index.js';
import { addressBody } from '../helpers/native-wds.js';
import { parseLocalConfig } from '../../dist/config/local.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const fixtures = join(root, 'test/fixtures/wire');

function encode(type: string, textFile: string): Buffer {
  return execFileSync(
    join(root, 'node_modules/.bin/protoc'),
    ['-I', fixtures, '-I', join(root, 'node_modules/protoc/include'), `--encode=${type}`, join(fixtures, 'istio_spec.proto')],
    { input: readFileSync(join(fixtures, textFile)), stdio: ['pipe', 'pipe', 'pipe'] },
  );
}

test('Workload: every field decodes to what protoc encoded', () => {
  const encoded = encode('istio.workload.Workload', 'workload.txtpb');
  const w = fromBinary(WorkloadSchema, encoded);
  assert.equal(w.uid, 'Kubernetes//Pod/default/echo-7d4b9');
  assert.equal(w.name, 'echo-7d4b9');
  assert.equal(w.namespace, 'default');
  assert.deepEqual(w.addresses.map((a) => [...a]), [[127, 0, 0, 1], [0xfd, ...Array(14).fill(0), 1]]);
  assert.equal(w.hostname, 'echo.example');
  assert.equal(w.network, 'net1');
  assert.equal(w.tunnelProtocol, TunnelProtocol.HBONE);
  assert.equal(w.trustDomain, 'td.example');
  assert.equal(w.serviceAccount, 'echo-sa');
  assert.equal(w.waypoint!.destination.case, 'address');
  assert.equal(w.waypoint!.destination.value.network, 'net1');
  assert.deepEqual([...w.waypoint!.destination.value.address], [10, 0, 0, 7]);
  assert.equal(w.waypoint!.hboneMtlsPort, 15008);
  assert.equal(w.networkGateway!.destination.case, 'hostname');
  assert.deepEqual([w.networkGateway!.destination.value.namespace, w.networkGateway!.destination.value.hostname], ['istio-system', 'eastwest.example']);
  assert.equal(w.networkGateway!.hboneMtlsPort, 15009);
  assert.equal(w.node, 'node-b');
  assert.equal(w.canonicalName, 'echo');
  assert.equal(w.canonicalRevision, 'v2');
  assert.equal(w.workloadType, WorkloadType.POD);
  assert.equal(w.workloadName, 'echo-deploy');
  assert.equal(w.nativeTunnel, true);
  assert.equal(w.applicationTunnel!.protocol, ApplicationTunnel_Protocol.PROXY);
  assert.equal(w.applicationTunnel!.port, 15088);
  const ports = w.services['default/echo.default.svc.cluster.local'].ports;
  assert.deepEqual(ports.map((p) => [p.servicePort, p.targetPort, p.appProtocol]), [[80, 8080, AppProtocol.HTTP2], [443, 0, AppProtocol.UNKNOWN]]);
  assert.deepEqual(w.authorizationPolicies, ['default/allow-sleep']);
  assert.equal(w.status, WorkloadStatus.UNHEALTHY);
  assert.equal(w.clusterId, 'cluster-2');
  assert.deepEqual([w.locality!.region, w.locality!.zone, w.locality!.subzone], ['eu', 'eu-1', 'rack-3']);
  assert.equal(w.networkMode, NetworkMode.HOST_NETWORK);
  assert.equal(w.capacity, 3);

  // ... and the dataplane's own decoder (prost) reads the same bytes into the state model.
  const info = decodeAddress(addressBody('workload', encoded)).workload;
  assert.deepEqual(info, {
    uid: 'Kubernetes//Pod/default/echo-7d4b9',
    name: 'echo-7d4b9',
    namespace: 'default',
    serviceAccount: 'echo-sa',
    trustDomain: 'td.example',
    workloadIps: ['127.0.0.1', 'fd00::1'],
    network: 'net1',
    protocol: 'HBONE',
    node: 'node-b',
    status: 'Unhealthy',
    capacity: 3,
    canonicalName: 'echo',
    canonicalRevision: 'v2',
    workloadName: 'echo-deploy',
    workloadType: 'pod',
    clusterId: 'cluster-2',
    locality: { region: 'eu', zone: 'eu-1', subzone: 'rack-3' },
    services: { 'default/echo.default.svc.cluster.local': { 80: 8080, 443: 0 } },
    authorizationPolicies: ['default/allow-sleep'],
    hostname: 'echo.example',
    networkMode: 'HostNetwork',
    waypoint: { destination: 'net1/10.0.0.7', hboneMtlsPort: 15008 },
    networkGateway: { destination: 'istio-system/eastwest.example', hboneMtlsPort: 15009 },
    applicationTunnel: { protocol: 'PROXY', port: 15088 },
    nativeTunnel: true,
  });
});

test('Authorization: every field decodes to what protoc encoded, and converts to the local config\'s Policy', () => {
  const a = fromBinary(AuthorizationSchema, encode('istio.workload.AuthorizationSpec', 'authorization.txtpb'));
  assert.equal(a.name, 'allow-sleep');
  assert.equal(a.namespace, 'default');
  assert.equal(a.scope, Scope.WORKLOAD_SELECTOR);
  assert.equal(a.action, Action.DENY);
  assert.equal(a.dryRun, true);
  assert.equal(a.rules.length, 2);
  assert.equal(a.rules[0].clauses.length, 2);
  const m = a.rules[0].clauses[0].matches[0];
  assert.deepEqual(m.namespaces.map((x) => x.matchType), [{ case: 'exact', value: 'default' }]);
  assert.deepEqual(m.notNamespaces.map((x) => x.matchType), [{ case: 'prefix', value: 'kube-' }]);
  assert.deepEqual(m.principals.map((x) => x.matchType), [{ case: 'suffix', value: '/sa/sleep' }]);
  assert.equal(m.notPrincipals[0].matchType.case, 'presence');
  assert.deepEqual(m.sourceIps.map((x) => [[...x.address], x.length]), [[[10, 0, 0, 0], 8]]);
  assert.deepEqual(m.notSourceIps.map((x) => [[...x.address], x.length]), [[[10, 1, 0, 0], 16]]);
  assert.deepEqual(m.destinationIps.map((x) => [[...x.address], x.length]), [[[192, 168, 1, 1], 32]]);
  assert.equal(m.notDestinationIps[0].length, 8);
  assert.deepEqual(m.destinationPorts, [8080]);
  assert.deepEqual(m.notDestinationPorts, [9999]);
  assert.deepEqual(m.serviceAccounts.map((x) => [x.namespace, x.serviceAccount]), [['default', 'sleep']]);
  assert.deepEqual(m.notServiceAccounts.map((x) => [x.namespace, x.serviceAccount]), [['other', 'bad']]);
  assert.deepEqual(a.rules[0].clauses[0].matches[1].destinationPorts, [80]);

  // The same policy written in the local config format gives the identical Policy value.
  const local = parseLocalConfig(
    `
policies:
- name: allow-sleep
  namespace: default
  scope: WorkloadSelector
  action: Deny
  dryRun: true
  rules:
  - - - namespaces: [{Exact: default}]
        notNamespaces: [{Prefix: kube-}]
        principals: [{Suffix: /sa/sleep}]
        notPrincipals: [{Presence: []}]
        sourceIps: [10.0.0.0/8]
        notSourceIps: [10.1.0.0/16]
        destinationIps: [192.168.1.1/32]
        notDestinationIps: [fd00::/8]
        destinationPorts: [8080]
        notDestinationPorts: [9999]
        serviceAccounts: [{namespace: default, serviceAccount: sleep}]
        notServiceAccounts: [{namespace: other, serviceAccount: bad}]
      - destinationPorts: [80]
    - - principals: [{Exact: spiffe://td.example/ns/default/sa/sleep}]
  - - - notDestinationPorts: [22]
`,
    'inline',
  );
  assert.deepEqual(convertAuthorization(a), local.policies[0]);
});
