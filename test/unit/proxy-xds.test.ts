// runProxy with a dataplane that binds nothing (its state is a real native one) and the fake istiod (real gRPC, TLS):
// the local config file and xDS feed one state, held by the dataplane; readiness waits for the xDS sync; an xDS
// response crosses still encoded, in one call, and what changed is reconciled into certificates and listeners (added
// and removed); XDS_ADDRESS="" disables xDS.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { makeCa, makeLeaf, tempDir } from '../helpers/pki.js';
import { loadConfig } from '../../dist/config/index.js';
import { runProxy } from '../../dist/lifecycle/proxy.js';
import type { ProxyDeps, ProxyHandle } from '../../dist/lifecycle/proxy.js';
import type { LocalWorkloadSpec, NativeVersion } from '../../dist/native/index.js';
import { createLogs } from '../../dist/log/logger.js';
import { ADDRESS, AUTHORIZATION, ISTIOD_HOSTNAME, startFakeIstiod, workloadResource } from '../helpers/fake-istiod.js';
import { get, waitUntil } from '../helpers/local-http.js';
import { fakeDataplane } from '../helpers/fake-dataplane.js';
import type { FakeDataplane } from '../helpers/fake-dataplane.js';

const dir = tempDir('ztn-proxy-xds-');
const root = makeCa(dir, 'root');
const leaf = makeLeaf(dir, root, ['spiffe://cluster.local/ns/default/sa/sleep']);

const LOCAL_XDS = `
workloads:
- {uid: u-file, name: file, namespace: default, serviceAccount: file, workloadIps: ["127.0.9.1"], protocol: HBONE, node: elsewhere}
`;

/** The parts of /config_dump this file reads. */
interface Dump {
  workloads: { uid: string }[];
  certificates: unknown[];
  config: { xdsAddress: string | null };
}

async function start(env: Record<string, string>): Promise<{ dp: FakeDataplane; proxy: ProxyHandle }> {
  const dp = fakeDataplane();
  const logs = createLogs({ filter: { level: 'off', targets: {} }, format: 'json', sink: { write: () => {} } });
  const config = loadConfig({
    env: {
      PROXY_MODE: 'local', NODE_NAME: 'node-a', LOCAL_CA_DIR: '/unused', LOCAL_XDS,
      ADMIN_ADDR: '127.0.0.1:0', STATS_ADDR: '127.0.0.1:0', READINESS_ADDR: '127.0.0.1:0', CONNECTION_TERMINATION_DEADLINE: '1s',
      ...env,
    },
  });
  const deps: Partial<ProxyDeps> = {
    openDataplane: () => dp,
    openLocalCa: () => ({ sign: async () => ({ chainPem: leaf.certPem, rootsPem: root.certPem }) }),
    // Partial (no rustVersion), as it always was: this file does not check the dump's version.
    nativeVersion: () => ({ version: '0', cryptoProvider: 'ring', buildProfile: 'debug' }) as NativeVersion,
  };
  const proxy = await runProxy(config, logs, { deps, handleSignals: false });
  return { dp, proxy };
}



test('the local file and xDS both feed the state; one update is one small delta; listeners follow', async () => {
  const istiod = await startFakeIstiod({ dir });
  const { dp, proxy } = await start({ XDS_ADDRESS: istiod.address, XDS_ROOT_CA: istiod.rootCaPath, ALT_XDS_HOSTNAME: ISTIOD_HOSTNAME });
  try {
    const s = await istiod.nextStream();
    await s.nextRequest(ADDRESS);
    await s.nextRequest(AUTHORIZATION);
    assert.match((await get(proxy.addresses.readiness, '/healthz/ready')).body, /state manager/);
    // The file's workload was applied first, as one batch.
    assert.deepEqual(dp.log.filter(([op]) => op.startsWith('apply')).map(([op]) => op), ['applyLocal']);
    assert.deepEqual(dp.meshDump().workloads.map((w) => w.uid), ['u-file']);

    const sleep = workloadResource({ name: 'sleep', ip: '127.0.9.2', node: 'node-a' });
    const others = Array.from({ length: 50 }, (_, i) => workloadResource({ name: `w${i}`, ip: `127.0.10.${i + 1}`, node: 'node-z' }));
    await s.pushAndWait(ADDRESS, { resources: [sleep, ...others] });
    await s.pushAndWait(AUTHORIZATION, { resources: [] });
    await waitUntil(async () => (await get(proxy.addresses.readiness, '/healthz/ready')).status === 200, 'ready');
    const dump = JSON.parse((await get(proxy.addresses.admin, '/config_dump')).body) as Dump;
    assert.equal(dump.workloads.length, 52);
    assert.ok(dump.workloads.some((w) => w.uid === 'u-file'));
    assert.deepEqual(dp.log.filter(([op]) => op === 'addLocalWorkload').map(([, x]) => (x as LocalWorkloadSpec).uid), ['Kubernetes//Pod/default/sleep']);
    assert.deepEqual(dp.log.filter(([op]) => op === 'createCsr').map(([, x]) => x), ['spiffe://cluster.local/ns/default/sa/sleep']);

    // One workload changes: one call carrying that resource only, still encoded.
    const n = dp.log.length;
    await s.pushAndWait(ADDRESS, { resources: [workloadResource({ name: 'w7', ip: '127.0.11.7', node: 'node-z', version: 'v2' })] });
    assert.deepEqual(dp.log.slice(n).filter(([op]) => op.startsWith('apply')), [['applyAddresses', { resources: 1, removed: [] }]]);
    assert.deepEqual(dp.meshDump().workloads.find((w) => w.uid === 'Kubernetes//Pod/default/w7')!.workloadIps, ['127.0.11.7']);

    // The local workload leaves this node: its listeners go, and its certificate is forgotten.
    await s.pushAndWait(ADDRESS, { resources: [workloadResource({ name: 'sleep', ip: '127.0.9.2', node: 'node-q', version: 'v2' })] });
    await waitUntil(() => dp.log.some(([op, uid]) => op === 'removeLocalWorkload' && uid === 'Kubernetes//Pod/default/sleep'), 'listeners removed');
    await waitUntil(async () => (JSON.parse((await get(proxy.addresses.admin, '/config_dump')).body) as Dump).certificates.length === 0, 'certificate forgotten');
    // It comes back with a new IP: listeners are bound again, on the new IP.
    await s.pushAndWait(ADDRESS, { resources: [workloadResource({ name: 'sleep', ip: '127.0.9.3', node: 'node-a', version: 'v3' })] });
    await waitUntil(() => dp.log.some(([op, x]) => op === 'addLocalWorkload' && (x as LocalWorkloadSpec).hboneAddr === '127.0.9.3:15008'), 'listeners on the new IP');

    const metrics = (await get(proxy.addresses.stats, '/metrics')).body;
    assert.match(metrics, /istio_xds_message_total\{url="type.googleapis.com\/istio.workload.Address"\} [1-9]/);
    assert.match(metrics, /istio_xds_message_bytes_total\{url="type.googleapis.com\/istio.workload.Address"\} [1-9]/);
  } finally {
    await proxy.shutdown('immediate', 'test');
    await istiod.close();
  }
});

test('XDS_ADDRESS="" disables xDS: ready on the local file alone', async () => {
  const { proxy } = await start({ XDS_ADDRESS: '', LOCAL_XDS: LOCAL_XDS.replace('elsewhere', 'node-a') });
  try {
    await waitUntil(async () => (await get(proxy.addresses.readiness, '/healthz/ready')).status === 200, 'ready');
    const dump = JSON.parse((await get(proxy.addresses.admin, '/config_dump')).body) as Dump;
    assert.equal(dump.config.xdsAddress, null);
    assert.doesNotMatch((await get(proxy.addresses.stats, '/metrics')).body, /istio_xds_message_total\{/);
  } finally {
    await proxy.shutdown('immediate', 'test');
  }
});
