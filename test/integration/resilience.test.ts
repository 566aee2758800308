// Connect retry and outlier ejection, beyond ztunnel (README "Resilience"): a service with three HBONE endpoints,
// one serving, one refusing (its application's port is closed, so its node answers 503) and one blackholed (its node
// accepts TCP and never speaks TLS). 200 sequential client connections through sleep's SOCKS5 entry all succeed;
// both dead endpoints are ejected (config_dump, metrics) and the access log names the attempts. A DENY is an answer
// and a workload-addressed connection names its endpoint: neither is ever retried. (The ejection times, driven by
// the detector's own clock, and the Strict scope: native/dataplane/tests/resilience.rs.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { makeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import { BLOCKS, block, httpGet, socks5Request, startEchoServer, throughSocks5 } from '../helpers/net.js';
import { sumSamples } from '../../dist/cli/prom-text.js';
import type { OutlierEndpoint } from '../../dist/native/types.js';

const net = block(BLOCKS.resilience);
const SLEEP = net.workload(1);
const GOOD = net.workload(2);
const REFUSING = net.workload(3);
const HOLE = net.workload(4); // on node-c: no daemon, a silent TCP server at :15008
const GUARDED = net.workload(5); // denies sleep
const VIP = '127.87.100.1';
const DENY_VIP = '127.87.100.2';
const member = (svc: string) => ({ services: { [`default/${svc}.default.svc.cluster.local`]: { 80: 8080 } } });
const CONFIG = {
  workloads: [
    workload({ name: 'sleep', ip: SLEEP, node: 'node-a' }),
    workload({ name: 'good', ip: GOOD, node: 'node-b', services: { ...member('echo').services, ...member('guarded').services } }),
    workload({ name: 'refusing', ip: REFUSING, node: 'node-b', ...member('echo') }),
    workload({ name: 'hole', ip: HOLE, node: 'node-c', ...member('echo') }),
    workload({ name: 'guarded', ip: GUARDED, node: 'node-b', ...member('guarded'), authorizationPolicies: ['default/deny-sleep'] }),
  ],
  services: [
    { name: 'echo', namespace: 'default', hostname: 'echo.default.svc.cluster.local', vips: [`/${VIP}`], ports: { 80: 8080 } },
    { name: 'guarded', namespace: 'default', hostname: 'guarded.default.svc.cluster.local', vips: [`/${DENY_VIP}`], ports: { 80: 8080 } },
  ],
  policies: [
    {
      name: 'deny-sleep',
      namespace: 'default',
      scope: 'WorkloadSelector',
      action: 'Deny',
      rules: [[[{ principals: [{ Exact: 'cluster.local/ns/default/sa/sleep' }] }]]],
    },
  ],
};

test('a dead endpoint of three costs no client connection; both are ejected; DENY and workload-addressed are never retried', async (t) => {
  for (const ip of [GOOD, GUARDED]) {
    const app = await startEchoServer(ip, 8080);
    t.after(() => app.close());
  }
  const silent = createServer(() => undefined);
  await new Promise<void>((resolve) => silent.listen(15008, HOLE, resolve));
  t.after(() => silent.close());
  const caDir = makeTempDir('ztn-resilience-ca-');
  const env = { CONNECTION_TIMEOUT: '1500ms' };
  const a = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(1), env, cleanup: t });
  await startDaemon({ node: 'node-b', config: CONFIG, caDir, adminIp: net.admin(2), env, cleanup: t });

  for (let i = 0; i < 200; i++) assert.equal(await throughSocks5(SLEEP, VIP, 80, `ping ${i}`), 0, `connection ${i}`);
  const { outliers } = JSON.parse((await httpGet(`${a.adminUrl}/config_dump`)).body) as { outliers: OutlierEndpoint[] };
  const ejected = outliers.filter((o) => (o.ejectedForMs ?? 0) > 0).map((o) => o.uid).sort();
  assert.deepEqual(ejected, ['Kubernetes//Pod/default/hole', 'Kubernetes//Pod/default/refusing'], JSON.stringify(outliers));
  const m = await a.metrics();
  const retries = sumSamples(m, 'ztunnel_node_connect_retries_total');
  assert.ok(retries >= 10, `each failure of the dead endpoints retried: ${retries}`);
  assert.equal(sumSamples(m, 'ztunnel_node_outlier_ejections_total'), 2);
  assert.equal(sumSamples(m, 'ztunnel_node_outlier_ejected_endpoints'), 2);
  assert.equal(sumSamples(m, 'istio_tcp_connections_failed_total', { reporter: 'source' }), 0, 'no client connection failed');
  const retried = await a.waitForLog((l) => l.target === 'access' && l.message === 'connection complete' && typeof l.attempts === 'number' && l.attempts >= 2, { message: 'a record naming its attempts' });
  assert.equal(retried['dst.workload'], 'good');

  // DENY is an answer: a connection the guarded endpoint refuses by policy fails, and is not tried elsewhere.
  let denied = 0;
  for (let i = 0; i < 20; i++) {
    const r = await socks5Request({ socks: { host: SLEEP, port: 15080 }, dest: { host: DENY_VIP, port: 80 } });
    r.socket?.destroy();
    denied += Number(r.code !== 0);
  }
  assert.ok(denied > 0, 'some connections landed on the denying endpoint and failed');
  // Workload-addressed: the refusing endpoint itself, never another.
  assert.notEqual(await throughSocks5(SLEEP, REFUSING, 8080), 0);
  const after = await a.metrics();
  assert.equal(sumSamples(after, 'ztunnel_node_connect_retries_total'), retries, 'neither was retried');
  assert.ok(sumSamples(after, 'istio_tcp_connections_failed_total', { reporter: 'source', response_flags: 'DENY' }) >= denied);
});

test('CONNECT_RESILIENCE=false is ztunnel\'s connect: the dead endpoints fail client connections, nothing is ejected', async (t) => {
  const app = await startEchoServer(GOOD, 8080);
  t.after(() => app.close());
  const caDir = makeTempDir('ztn-resilience-off-ca-');
  const env = { CONNECTION_TIMEOUT: '500ms', CONNECT_RESILIENCE: 'false' };
  const a = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(1), env, cleanup: t });
  await startDaemon({ node: 'node-b', config: CONFIG, caDir, adminIp: net.admin(2), env, cleanup: t });
  let failed = 0;
  for (let i = 0; i < 30; i++) failed += Number((await throughSocks5(SLEEP, VIP, 80)) !== 0);
  assert.ok(failed >= 8, `about two in three fail: ${failed} of 30`);
  const { outliers } = JSON.parse((await httpGet(`${a.adminUrl}/config_dump`)).body) as { outliers: OutlierEndpoint[] };
  assert.deepEqual(outliers, []);
  assert.equal(sumSamples(await a.metrics(), 'ztunnel_node_connect_retries_total'), 0);
});
