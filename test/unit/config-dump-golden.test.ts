// config_dump against the document ztunnel's serializers make of the same local config (test/fixtures/config-dump):
// the keys, their order, the omission of default values, the formats (string matches as tagged values, ports as
// string keys, "network/ip" addresses, `services` as a list in the mesh dump and as port maps in staticConfig).
// Written by hand from ztunnel's serde rules, not from our output: a difference is ours to explain.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, rmSync } from 'node:fs';
import { loadConfig } from '../../dist/config/index.js';
import { runProxy } from '../../dist/lifecycle/proxy.js';
import { createLogs } from '../../dist/log/logger.js';
import { fakeDataplane } from '../helpers/fake-dataplane.js';
import { get, waitUntil } from '../helpers/local-http.js';
import { makeCa, makeLeaf, tempDir } from '../helpers/pki.js';
import type { ProxyDeps } from '../../dist/lifecycle/proxy.js';

/** A fixture in the source tree (fixtures are not compiled): the same path from test/unit and dist-test/unit. */
const fixture = (name: string) => new URL(`../../test/fixtures/config-dump/${name}`, import.meta.url);

test('config_dump of a ztunnel-written local config has the shape ztunnel gives it', async () => {
  const dir = tempDir('ztn-golden-');
  const ca = makeCa(dir, 'root');
  const leaf = makeLeaf(dir, ca, ['spiffe://cluster.local/ns/default/sa/sleep']);
  rmSync(dir, { recursive: true, force: true });
  const dp = fakeDataplane({}, { nodeName: 'node-a' });
  const logs = createLogs({ filter: { level: 'off', targets: {} }, format: 'json', sink: { write: () => {} } });
  const config = loadConfig({
    env: {
      PROXY_MODE: 'local', NODE_NAME: 'node-a', LOCAL_CA_DIR: '/unused', LOCAL_XDS_PATH: fixture('local.yaml').pathname,
      ADMIN_ADDR: '127.0.0.1:0', STATS_ADDR: '127.0.0.1:0', READINESS_ADDR: '127.0.0.1:0',
    },
  });
  const deps: Partial<ProxyDeps> = {
    openDataplane: () => dp,
    openLocalCa: () => ({ sign: async () => ({ chainPem: leaf.certPem, rootsPem: ca.certPem }) }),
    nativeVersion: () => ({ version: '0.0.0-test', cryptoProvider: 'ring', buildProfile: 'debug', rustVersion: '1.0' }),
  };
  const proxy = await runProxy(config, logs, { deps, handleSignals: false });
  try {
    await waitUntil(async () => (await get(proxy.addresses.readiness, '/healthz/ready')).status === 200, 'ready');
    const dump = JSON.parse((await get(proxy.addresses.admin, '/config_dump')).body);
    const expected = JSON.parse(readFileSync(fixture('expected.json'), 'utf8'));
    for (const key of Object.keys(expected)) {
      // Compared as text too: deepEqual ignores key order, which is part of the shape.
      assert.deepEqual(dump[key], expected[key], key);
      assert.equal(JSON.stringify(dump[key]), JSON.stringify(expected[key]), `${key}: key order`);
    }
    // ztunnel's keys in its order, then ours (README "Resilience").
    assert.deepEqual(Object.keys(dump), [
      'workloads', 'services', 'policies', 'stagedServices', 'staticConfig', 'certificates', 'config', 'version', 'workloadState',
      'outliers',
    ]);
  } finally {
    await proxy.shutdown('immediate', 'test');
    dp.shutdown();
  }
});
