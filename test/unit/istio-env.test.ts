// Every variable Istio's ztunnel reads is implemented (a key of the one schema) or refused at start by name
// (ts/config/istio-env.ts); README's tables list both, and this walks them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { CONFIG_KEYS, PREFIX_KEYS, loadConfig } from '../../dist/config/index.js';
import { IMPLEMENTED, IMPLEMENTED_PREFIXES, MESH_CONFIG_FILE, REFUSED } from '../../dist/config/istio-env.js';
import { ConfigError } from '../../dist/errors.js';

const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
const section = (title: string): string => {
  const start = readme.indexOf(title);
  assert.ok(start >= 0, `README has "${title}"`);
  const rest = readme.slice(start);
  return rest.slice(0, rest.indexOf('\n\n', rest.indexOf('|---')));
};
const rows = (text: string): string[][] => text.split('\n').filter((l) => l.startsWith('| `')).map((l) => l.split('|').slice(1, -1).map((c) => c.trim()));
const refusedRows = rows(section('ztunnel variables ztunnel-node refuses'));

test('every ztunnel variable implemented is a key of the schema, and none is also refused', () => {
  assert.deepEqual(IMPLEMENTED.filter((k) => !CONFIG_KEYS.includes(k)), []);
  assert.deepEqual(IMPLEMENTED_PREFIXES.filter((p) => !PREFIX_KEYS.includes(p)), []);
  assert.deepEqual(IMPLEMENTED.filter((k) => k in REFUSED), []);
});

test('README lists every refused variable with the values it accepts, and nothing else', () => {
  const names = refusedRows.map((r) => r[0].replaceAll('`', ''));
  assert.deepEqual([...names].sort(), Object.keys(REFUSED).sort());
  for (const [name, accepted] of refusedRows.map((r) => [r[0].replaceAll('`', ''), r[1]])) {
    const want = REFUSED[name].accepts.length === 0 ? '–' : REFUSED[name].accepts.map((a) => `\`${a}\``).join(', ');
    assert.equal(accepted, want, `${name}: the values README says are accepted`);
  }
});

test('each refused variable stops the start, naming it; the values that ask for what ztunnel-node does pass', () => {
  for (const [name, r] of Object.entries(REFUSED)) {
    const opposite: Partial<Record<string, string>> = { true: 'false', false: 'true' };
    const bad = opposite[r.accepts[0]] ?? 'x';
    assert.throws(
      () => loadConfig({ env: { [name]: bad }, exists: () => false }),
      (err) => err instanceof ConfigError && err.message.includes(`${name}=${bad} is not supported`) && err.message.includes(r.reason),
      name,
    );
    for (const ok of [...r.accepts, '']) {
      assert.doesNotThrow(() => loadConfig({ env: { [name]: ok.toUpperCase() }, exists: () => false }), `${name}=${ok}`);
    }
  }
  // Several at once: each is named.
  const err = (() => {
    try {
      loadConfig({ env: { XDS_ON_DEMAND: 'true', TRANSPARENT_NETWORK_POLICIES: 'true' }, exists: () => false });
    } catch (e) {
      return e as Error;
    }
  })();
  assert.match(err?.message ?? '', /XDS_ON_DEMAND=true.*TRANSPARENT_NETWORK_POLICIES=true|TRANSPARENT_NETWORK_POLICIES=true.*XDS_ON_DEMAND=true/);
});

test('a mesh config file where ztunnel reads one is read (test/unit/proxy-config.test.ts), and PROXY_CONFIG is not refused', () => {
  const mesh = 'defaultConfig:\n  proxyAdminPort: 15099\n';
  const c = loadConfig({ env: {}, exists: (p) => p === MESH_CONFIG_FILE, readFile: (p) => (p === MESH_CONFIG_FILE ? mesh : '') });
  assert.equal(c.adminAddr.port, 15099);
  assert.equal(loadConfig({ env: { PROXY_CONFIG: 'statsPort: 15888' }, exists: () => false }).statsAddr.port, 15888);
  assert.ok(!('PROXY_CONFIG' in REFUSED));
});

test('ENABLE_PROXY=false refuses a SOCKS5 entry asked for by name (it is a proxy), and runs without one by default', () => {
  assert.throws(
    () => loadConfig({ exists: () => false, env: { PROXY_MODE: 'local', NODE_NAME: 'n', LOCAL_CA_DIR: '/x', ENABLE_PROXY: 'false', UNSTABLE_ENABLE_SOCKS5: 'true' } }),
    (e) => e instanceof ConfigError && /UNSTABLE_ENABLE_SOCKS5/.test(e.message) && /ENABLE_PROXY=false/.test(e.message),
  );
  assert.equal(loadConfig({ exists: () => false, env: { PROXY_MODE: 'local', NODE_NAME: 'n', LOCAL_CA_DIR: '/x', ENABLE_PROXY: 'false' } }).enableProxy, false);
});
