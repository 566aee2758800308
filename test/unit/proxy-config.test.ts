// ztunnel's ProxyConfig (ts/config/proxy-config.ts): the mesh config file's defaultConfig, PROXY_CONFIG merged over
// it, and the variables over both, as istio/ztunnel's src/config.rs reads them. No file is touched: `exists` and
// `readFile` stand in for the mesh config file.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { loadConfig } from '../../dist/config/index.js';
import type { Config, ConfigInput } from '../../dist/config/index.js';
import { MESH_CONFIG_FILE } from '../../dist/config/proxy-config.js';
import { ConfigError } from '../../dist/errors.js';

/** loadConfig with `mesh` as the mesh config file's text (undefined: no file). */
function load(env: ConfigInput['env'], mesh?: string, extra: Omit<ConfigInput, 'env'> = {}): Config {
  return loadConfig({
    env,
    cpuCount: 8,
    exists: (p) => mesh !== undefined && p === MESH_CONFIG_FILE,
    readFile: (p) => {
      assert.equal(p, MESH_CONFIG_FILE);
      return mesh!;
    },
    ...extra,
  });
}

const yamlMesh = (fields: string[]): string => `defaultConfig:\n${fields.map((f) => `  ${f}\n`).join('')}`;

function throwsConfig(fn: () => unknown, ...parts: string[]): void {
  assert.throws(fn, (err) => {
    assert.ok(err instanceof ConfigError, `a ConfigError, got ${err}`);
    for (const p of parts) assert.ok(err.message.includes(p), `"${err.message}" names ${p}`);
    return true;
  });
}

test('the mesh config file is the one ztunnel reads, relative to the working directory, and only when it exists', () => {
  assert.equal(MESH_CONFIG_FILE, './etc/istio/config/mesh');
  let read = 0;
  loadConfig({ env: {}, exists: () => false, readFile: () => { read += 1; return ''; } });
  assert.equal(read, 0);
  // Gone between the check and the read: absent, as ztunnel's NotFound.
  const gone = () => { throw Object.assign(new Error('ENOENT: no such file'), { code: 'ENOENT' }); };
  assert.equal(loadConfig({ env: {}, exists: () => true, readFile: gone }).adminAddr.port, 15000);
  // Any other read error stops the start, naming the file.
  const denied = () => { throw Object.assign(new Error('EACCES: permission denied'), { code: 'EACCES' }); };
  throwsConfig(() => loadConfig({ env: {}, exists: () => true, readFile: denied }), MESH_CONFIG_FILE, 'EACCES');
});

test('precedence, field by field: variable > PROXY_CONFIG > mesh config file > default', () => {
  const mesh = yamlMesh(['discoveryAddress: mesh.istio-system.svc:15012', 'proxyAdminPort: 15100', 'statsPort: 15200', 'concurrency: 3']);
  const pcEnv = '{"discoveryAddress": "env.istio-system.svc:15012", "proxyAdminPort": 15101}';
  const rows: [env: ConfigInput['env'], mesh: string | undefined, xds: string, admin: number, stats: number, threads: number][] = [
    // [env, mesh, xds, admin port, stats port, threads]
    [{}, undefined, 'https://localhost:15012', 15000, 15020, 2],
    [{}, mesh, 'https://mesh.istio-system.svc:15012', 15100, 15200, 3],
    [{ PROXY_CONFIG: pcEnv }, undefined, 'https://env.istio-system.svc:15012', 15101, 15020, 2],
    // PROXY_CONFIG wins where it has the field; the mesh file's other fields stay.
    [{ PROXY_CONFIG: pcEnv }, mesh, 'https://env.istio-system.svc:15012', 15101, 15200, 3],
    // The variables win over both.
    [
      { PROXY_CONFIG: pcEnv, XDS_ADDRESS: 'var:15012', ADMIN_ADDR: '127.0.0.1:16000', STATS_ADDR: '0.0.0.0:16001', ZTUNNEL_WORKER_THREADS: '5' },
      mesh,
      'https://var:15012',
      16000,
      16001,
      5,
    ],
  ];
  for (const [env, m, xds, admin, stats, threads] of rows) {
    const c = load(env, m);
    const label = `${JSON.stringify(env)} mesh=${m !== undefined}`;
    assert.equal(c.xdsAddress, xds, label);
    assert.equal(c.adminAddr.port, admin, label);
    assert.equal(c.statsAddr.port, stats, label);
    assert.equal(c.numWorkerThreads, threads, label);
  }
  // A flag wins over everything, and a --proxy-config flag is PROXY_CONFIG.
  assert.equal(load({ PROXY_CONFIG: pcEnv }, mesh, { args: ['--xds-address', 'flag:15012'] }).xdsAddress, 'https://flag:15012');
  assert.equal(load({}, mesh, { args: ['--proxy-config', 'proxyAdminPort: 15102'] }).adminAddr.port, 15102);
});

test('discoveryAddress feeds XDS only, normalized as XDS_ADDRESS is; "" disables XDS; XDS_ADDRESS="" still wins', () => {
  const c = load({ PROXY_CONFIG: 'discoveryAddress: istiod-rev0.istio-system-2:15012' });
  assert.equal(c.xdsAddress, 'https://istiod-rev0.istio-system-2:15012');
  assert.equal(c.caAddress, 'https://localhost:15012', 'the CA keeps its default');
  assert.equal(load({ PROXY_CONFIG: 'discoveryAddress: ""' }).xdsAddress, null);
  assert.equal(load({ PROXY_CONFIG: 'discoveryAddress: a:15012', XDS_ADDRESS: '' }).xdsAddress, null);
  assert.equal(load({ PROXY_CONFIG: 'discoveryAddress: a:15012', KUBERNETES_SERVICE_HOST: '10.0.0.1' }).caAddress, 'https://istiod.istio-system.svc:15012');
  // A bad address stops the start, naming where it came from; a bad one that loses is not looked at (as ztunnel).
  throwsConfig(() => load({}, yamlMesh(['discoveryAddress: "http://[bad"'])), MESH_CONFIG_FILE, 'defaultConfig.discoveryAddress');
  assert.equal(load({ XDS_ADDRESS: 'ok:1' }, yamlMesh(['discoveryAddress: "http://[bad"'])).xdsAddress, 'https://ok:1');
});

test('proxyAdminPort and statsPort keep the default host (local mode: loopback stats); readiness has no field', () => {
  const c = load({ PROXY_CONFIG: 'proxyAdminPort: 15099\nstatsPort: 15888\nstatusPort: 15777' });
  assert.deepEqual(c.adminAddr, { host: '127.0.0.1', port: 15099 });
  assert.deepEqual(c.statsAddr, { host: '0.0.0.0', port: 15888 });
  assert.deepEqual(c.readinessAddr, { host: '0.0.0.0', port: 15021 }, 'statusPort is ignored, as by ztunnel');
  const local = load({ PROXY_MODE: 'local', NODE_NAME: 'n', LOCAL_CA_DIR: '/x', PROXY_CONFIG: 'statsPort: 15888' });
  assert.deepEqual(local.statsAddr, { host: '127.0.0.1', port: 15888 });
});

test('concurrency: a thread count under ZTUNNEL_WORKER_THREADS, 0 = all cores; more than the dataplane runs is refused', () => {
  assert.equal(load({ PROXY_CONFIG: 'concurrency: 6' }).numWorkerThreads, 6);
  assert.equal(load({ PROXY_CONFIG: 'concurrency: 0' }).numWorkerThreads, 8);
  assert.equal(load({ PROXY_CONFIG: 'concurrency: 6', ZTUNNEL_WORKER_THREADS: '50%' }).numWorkerThreads, 4);
  throwsConfig(() => load({ PROXY_CONFIG: 'concurrency: 5000' }), 'PROXY_CONFIG: concurrency', '5000', '1024');
  // Not refused where it does not apply.
  assert.equal(load({ PROXY_CONFIG: 'concurrency: 5000', ZTUNNEL_WORKER_THREADS: '2' }).numWorkerThreads, 2);
});

test('proxyMetadata: the union of both sources, ISTIO_META_ stripped, every ISTIO_META_<K> variable over it', () => {
  const mesh = yamlMesh(['proxyMetadata:', '  ISTIO_META_FOO: foo', '  ISTIO_META_FOOBAR: foobar', '  KEEP: mesh']);
  const pcEnv = JSON.stringify({ proxyMetadata: { ISTIO_META_BAR: 'bar', ISTIO_META_FOOBAR: 'foobar-overwritten', NO_PREFIX: 'no-prefix' } });
  const c = load({ PROXY_CONFIG: pcEnv, ISTIO_META_INCLUDE_THIS: 'foobar-env', ISTIO_META_KEEP: 'env', NOT_INCLUDE: 'x', ISTIO_METAJSON_J: '{"a":1}' }, mesh);
  assert.deepEqual(c.proxyMetadata, {
    FOO: 'foo',
    FOOBAR: 'foobar-overwritten',
    BAR: 'bar',
    NO_PREFIX: 'no-prefix',
    KEEP: 'env',
    INCLUDE_THIS: 'foobar-env',
    J: { a: 1 },
  });
  // A YAML number or boolean is its text.
  assert.deepEqual(load({ PROXY_CONFIG: 'proxyMetadata: {N: 1, B: true}' }).proxyMetadata, { N: '1', B: 'true' });
});

test('proxyMetadata feeds what ztunnel reads from it (DNS_CAPTURE, DNS_PROXY_ADDR) where the variable is unset, nothing else', () => {
  assert.equal(load({ PROXY_CONFIG: 'proxyMetadata: {ISTIO_META_DNS_CAPTURE: "false"}' }).dns.enabled, false);
  assert.equal(load({ PROXY_CONFIG: 'proxyMetadata: {DNS_CAPTURE: "false"}' }).dns.enabled, false, 'with or without the prefix');
  assert.equal(load({ PROXY_CONFIG: 'proxyMetadata: {DNS_CAPTURE: "True"}' }).dns.enabled, true, 'compared case-insensitively, as ztunnel');
  assert.equal(load({ PROXY_CONFIG: 'proxyMetadata: {DNS_CAPTURE: "false"}', ISTIO_META_DNS_CAPTURE: 'true' }).dns.enabled, true);
  assert.equal(load({ ISTIO_META_DNS_CAPTURE: 'True' }).dns.enabled, true);

  const addr = 'proxyMetadata: {DNS_PROXY_ADDR: "127.0.0.1:5353"}';
  assert.deepEqual(load({ PROXY_CONFIG: addr }).dns.addr, { host: '127.0.0.1', port: 5353 });
  assert.deepEqual(load({ PROXY_CONFIG: addr, ISTIO_META_DNS_PROXY_ADDR: 'localhost:6000' }).dns.addr, { host: 'localhost', port: 6000 });
  assert.deepEqual(load({ PROXY_CONFIG: addr, DNS_PROXY_ADDR: 'localhost:6001' }).dns.addr, { host: 'localhost', port: 6001 });
  throwsConfig(() => load({}, yamlMesh(['proxyMetadata: {DNS_PROXY_ADDR: "nope"}'])), MESH_CONFIG_FILE, 'defaultConfig.proxyMetadata.DNS_PROXY_ADDR', 'nope');

  // ztunnel's env lookups do not fall back to proxyMetadata: the cluster id and the Istio version are the variables'.
  const c = load({ PROXY_CONFIG: 'proxyMetadata: {ISTIO_META_CLUSTER_ID: meta, ISTIO_META_ISTIO_VERSION: "1.2"}' });
  assert.equal(c.clusterId, 'Kubernetes');
  assert.equal(c.istioVersion, null);
  assert.equal(c.proxyMetadata.CLUSTER_ID, 'meta', 'it is node metadata all the same');
});

test('fields ztunnel does not read are ignored, in either document; empty and null are no ProxyConfig', () => {
  const mesh = 'accessLogFile: /dev/stdout\nenableTracing: true\ndefaultConfig:\n  tracing: {zipkin: {address: z:9411}}\n  terminationDrainDuration: 5s\n  holdApplicationUntilProxyStarts: true\n';
  const c = load({ PROXY_CONFIG: 'image: {imageType: distroless}\nstatusPort: 1' }, mesh);
  assert.equal(c.adminAddr.port, 15000);
  assert.deepEqual(c.proxyMetadata, {});
  for (const m of ['', '# only a comment\n', 'defaultConfig:\n', 'defaultConfig: null\n', 'meshMTLS: {}\n']) {
    assert.equal(load({}, m).adminAddr.port, 15000, JSON.stringify(m));
  }
  for (const e of ['', 'null', '~']) assert.equal(load({ PROXY_CONFIG: e }).adminAddr.port, 15000, JSON.stringify(e));
  // null fields are absent (serde's Option).
  assert.equal(load({ PROXY_CONFIG: 'proxyAdminPort: 15101' }, yamlMesh(['proxyAdminPort: null', 'proxyMetadata: null'])).adminAddr.port, 15101);
});

test('a document that is not YAML stops the start, naming the file or PROXY_CONFIG', () => {
  throwsConfig(() => load({ PROXY_CONFIG: '{proxyAdminPort: [1' }), 'PROXY_CONFIG', 'not valid YAML');
  throwsConfig(() => load({}, 'defaultConfig:\n  statsPort: 1\n statsPort: 2\n'), MESH_CONFIG_FILE, 'not valid YAML');
  throwsConfig(() => load({}, 'a: 1\na: 2\n'), MESH_CONFIG_FILE, 'not valid YAML');
  throwsConfig(() => load({ PROXY_CONFIG: 'just a string' }), 'PROXY_CONFIG', 'must be a YAML mapping');
  throwsConfig(() => load({}, '- a\n- b\n'), MESH_CONFIG_FILE, 'must be a YAML mapping');
  throwsConfig(() => load({}, 'defaultConfig: 3\n'), `${MESH_CONFIG_FILE}: defaultConfig`, 'must be a YAML mapping');
  // The flag is named as the flag.
  throwsConfig(() => load({}, undefined, { args: ['--proxy-config', '{x: [']}), '--proxy-config', 'not valid YAML');
});

test('a field read of the wrong type or out of range stops the start, naming the source, the field and the value', () => {
  const cases: [env: ConfigInput['env'], mesh: string | undefined, parts: string[]][] = [
    [{ PROXY_CONFIG: 'proxyAdminPort: abc' }, undefined, ['PROXY_CONFIG: proxyAdminPort', 'between 0 and 65535', '"abc"']],
    [{ PROXY_CONFIG: 'statsPort: 70000' }, undefined, ['PROXY_CONFIG: statsPort', '70000']],
    [{ PROXY_CONFIG: 'proxyAdminPort: "15000"' }, undefined, ['PROXY_CONFIG: proxyAdminPort', '"15000"']],
    [{ PROXY_CONFIG: 'concurrency: -1' }, undefined, ['PROXY_CONFIG: concurrency', '-1']],
    [{ PROXY_CONFIG: 'concurrency: 1.5' }, undefined, ['PROXY_CONFIG: concurrency', '1.5']],
    [{ PROXY_CONFIG: 'discoveryAddress: [a]' }, undefined, ['PROXY_CONFIG: discoveryAddress', 'must be a string']],
    [{}, yamlMesh(['statsPort: -1']), [`${MESH_CONFIG_FILE}: defaultConfig.statsPort`, '-1']],
    [{}, yamlMesh(['proxyMetadata: [a, b]']), [`${MESH_CONFIG_FILE}: defaultConfig.proxyMetadata`, 'map of strings']],
    [{}, yamlMesh(['proxyMetadata: {FOO: {nested: 1}}']), [`${MESH_CONFIG_FILE}: defaultConfig.proxyMetadata.FOO`, 'must be a string']],
    [{}, yamlMesh(['proxyMetadata: {FOO: null}']), [`${MESH_CONFIG_FILE}: defaultConfig.proxyMetadata.FOO`, 'must be a string']],
  ];
  for (const [env, mesh, parts] of cases) throwsConfig(() => load(env, mesh), ...parts);
  // A type error in a document stops the start even where the other document has the field (serde reads each whole).
  throwsConfig(() => load({ PROXY_CONFIG: 'proxyAdminPort: 15001' }, yamlMesh(['proxyAdminPort: abc'])), MESH_CONFIG_FILE);
});

test('what ztunnel would silently drop or decide by hash order is refused by name', () => {
  throwsConfig(() => load({ PROXY_CONFIG: 'proxy_admin_port: 15001' }), 'PROXY_CONFIG: proxy_admin_port', 'write proxyAdminPort');
  throwsConfig(() => load({}, 'default_config:\n  statsPort: 1\n'), `${MESH_CONFIG_FILE}: default_config`, 'write defaultConfig');
  throwsConfig(() => load({}, yamlMesh(['proxy_metadata: {A: b}'])), 'defaultConfig.proxy_metadata', 'write proxyMetadata');
  throwsConfig(
    () => load({ PROXY_CONFIG: 'proxyMetadata: {ISTIO_META_FOO: b}' }, yamlMesh(['proxyMetadata: {FOO: a}'])),
    `${MESH_CONFIG_FILE}: defaultConfig.proxyMetadata.FOO`,
    'PROXY_CONFIG: proxyMetadata.ISTIO_META_FOO',
  );
});
