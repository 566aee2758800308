// CONNECT_RESILIENCE and its settings (README "Resilience"): the defaults, off as ztunnel's connect, and what would
// be ignored refused by name.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { loadConfig } from '../../dist/config/index.js';
import { dataplaneConfig } from '../../dist/lifecycle/proxy.js';
import { ConfigError } from '../../dist/errors.js';

const LOCAL = { PROXY_MODE: 'local', NODE_NAME: 'node-a', LOCAL_CA_DIR: '/nonexistent' };
const load = (env) => loadConfig({ env: { ...LOCAL, ...env }, exists: () => false });

test('on by default: three attempts, ejection after five failures for 30 s × n up to 300 s, at most half skipped', () => {
  assert.deepEqual(load({}).resilience, { connectAttempts: 3, consecutiveFailures: 5, baseEjectionMs: 30_000, maxEjectionMs: 300_000, maxEjectionPercent: 50 });
  assert.deepEqual(dataplaneConfig(load({})).resilience, load({}).resilience, 'handed to the dataplane as is');
});

test('each setting by its variable; a base above the default maximum raises the maximum', () => {
  const r = load({ CONNECT_ATTEMPTS: '5', OUTLIER_CONSECUTIVE_FAILURES: '0', OUTLIER_BASE_EJECTION_TIME: '10m', OUTLIER_MAX_EJECTION_PERCENT: '100' }).resilience;
  assert.deepEqual(r, { connectAttempts: 5, consecutiveFailures: 0, baseEjectionMs: 600_000, maxEjectionMs: 600_000, maxEjectionPercent: 100 });
});

test('CONNECT_RESILIENCE=false is one attempt and no ejection; a setting beside it, or a maximum under the base, is refused', () => {
  const off = load({ CONNECT_RESILIENCE: 'false' }).resilience;
  assert.equal(off.connectAttempts, 1);
  assert.equal(off.consecutiveFailures, 0);
  const refused = (env, ...words) =>
    assert.throws(() => load(env), (e) => e instanceof ConfigError && words.every((w) => e.message.includes(w)), JSON.stringify(env));
  refused({ CONNECT_RESILIENCE: 'false', CONNECT_ATTEMPTS: '2' }, 'CONNECT_ATTEMPTS', 'CONNECT_RESILIENCE');
  refused({ OUTLIER_BASE_EJECTION_TIME: '60s', OUTLIER_MAX_EJECTION_TIME: '30s' }, 'OUTLIER_MAX_EJECTION_TIME', 'shorter');
  refused({ CONNECT_ATTEMPTS: '0' }, 'CONNECT_ATTEMPTS');
  refused({ CONNECT_ATTEMPTS: '11' }, 'CONNECT_ATTEMPTS');
  refused({ OUTLIER_MAX_EJECTION_PERCENT: '101' }, 'OUTLIER_MAX_EJECTION_PERCENT');
});
