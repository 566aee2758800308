// A source this node does not know (another cluster's workload, a peer behind an east-west gateway) is described by
// the baggage its CONNECT carries, as ztunnel derives it (src/baggage.rs, the metrics' derived source): the
// destination's metrics carry its workload, namespace, canonical service and revision, cluster and locality instead of
// `unknown`. The client is a plain Node HBONE peer with a certificate of the built-in CA, declared nowhere.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { makeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import { connectRequest, hboneSession } from '../helpers/hbone.js';
import { BLOCKS, block, readAll, startEchoServer } from '../helpers/net.js';
import { builtinCa, builtinLeaf, spiffe } from '../helpers/pki.js';

const net = block(BLOCKS['baggage-labels']);
const ECHO = net.workload(1);
const BAGGAGE = 'k8s.cluster.name=east,k8s.namespace.name=shop,k8s.deployment.name=cart,service.name=cart-svc,service.version=v7,cloud.region=eu-1,cloud.availability_zone=eu-1a';

test('an unknown source is labelled from its baggage at the destination; without baggage it stays unknown', async (t) => {
  const app = await startEchoServer(ECHO, 8080);
  t.after(() => app.close());
  const caDir = makeTempDir('ztn-baggage-ca-');
  const d = await startDaemon({ node: 'node-a', config: { workloads: [workload({ name: 'echo', ip: ECHO, node: 'node-a' })] }, caDir, adminIp: net.admin(1), cleanup: t });
  const leaf = builtinLeaf(makeTempDir('ztn-baggage-certs-'), caDir, [spiffe('shop', 'cart')], 'cart');
  for (const baggage of [BAGGAGE, null]) {
    const session = await hboneSession({ host: ECHO, ca: builtinCa(caDir).certPem, cert: leaf.certPem, key: leaf.keyPem });
    const r = await connectRequest(session, `${ECHO}:8080`, baggage === null ? {} : { baggage });
    assert.equal(r.status, 200);
    const done = readAll(r.stream);
    r.stream.end('hello');
    await done;
    session.destroy();
  }
  const opened = (labels: Record<string, string>) => d.metric('istio_tcp_connections_opened_total', { reporter: 'destination', destination_workload: 'echo', ...labels });
  const derived = {
    source_workload: 'cart',
    source_workload_namespace: 'shop',
    source_canonical_service: 'cart-svc',
    source_canonical_revision: 'v7',
    source_app: 'cart',
    source_version: 'v7',
    source_cluster: 'east',
    source_region: 'eu-1',
    source_zone: 'eu-1a',
    source_principal: spiffe('shop', 'cart'),
  };
  assert.equal(await opened(derived), 1, 'labelled from the baggage');
  assert.equal(await opened({ source_workload: 'unknown', source_cluster: 'unknown', source_principal: spiffe('shop', 'cart') }), 1, 'no baggage: unknown');
});
