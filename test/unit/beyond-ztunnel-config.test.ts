// CONNECT_RESILIENCE and its settings (README "Resilience") and the OTLP export's OTEL_* variables (README "Access
// logs over OpenTelemetry"): the defaults, off as ztunnel's behaviour, and what would be ignored refused by name.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { loadConfig } from '../../dist/config/index.js';
import type { ConfigInput } from '../../dist/config/index.js';
import { dataplaneConfig } from '../../dist/lifecycle/dataplane.js';
import { ConfigError } from '../../dist/errors.js';

const LOCAL = { PROXY_MODE: 'local', NODE_NAME: 'node-a', LOCAL_CA_DIR: '/nonexistent' };
const load = (env: ConfigInput['env']) => loadConfig({ env: { ...LOCAL, ...env }, exists: () => false });

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
  const refused = (env: ConfigInput['env'], ...words: string[]): void =>
    assert.throws(() => load(env), (e) => e instanceof ConfigError && words.every((w) => e.message.includes(w)), JSON.stringify(env));
  refused({ CONNECT_RESILIENCE: 'false', CONNECT_ATTEMPTS: '2' }, 'CONNECT_ATTEMPTS', 'CONNECT_RESILIENCE');
  refused({ OUTLIER_BASE_EJECTION_TIME: '60s', OUTLIER_MAX_EJECTION_TIME: '30s' }, 'OUTLIER_MAX_EJECTION_TIME', 'shorter');
  refused({ CONNECT_ATTEMPTS: '0' }, 'CONNECT_ATTEMPTS');
  refused({ CONNECT_ATTEMPTS: '11' }, 'CONNECT_ATTEMPTS');
  refused({ OUTLIER_MAX_EJECTION_PERCENT: '101' }, 'OUTLIER_MAX_EJECTION_PERCENT');
});

test('OTLP export: off without an endpoint; the logs variables win; HTTP gets /v1/logs; only logs are exported', () => {
  assert.equal(load({}).otlp, null);
  const grpc = load({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4317', OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' }).otlp!;
  assert.deepEqual([grpc.protocol, grpc.url], ['grpc', 'http://collector:4317']);
  const http = load({ OTEL_EXPORTER_OTLP_ENDPOINT: 'https://collector:4318/' }).otlp!;
  assert.deepEqual([http.protocol, http.url], ['http/protobuf', 'https://collector:4318/v1/logs'], 'http/protobuf by default');
  const logs = load({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://a:4318', OTEL_EXPORTER_OTLP_LOGS_ENDPOINT: 'http://b:9/logs', OTEL_EXPORTER_OTLP_LOGS_PROTOCOL: 'http/json' }).otlp!;
  assert.deepEqual([logs.protocol, logs.url], ['http/json', 'http://b:9/logs']);
  assert.equal(load({ OTEL_LOGS_EXPORTER: 'otlp' }).otlp!.url, 'http://localhost:4318/v1/logs', 'the local collector by default');
  assert.equal(load({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_SDK_DISABLED: 'true' }).otlp, null);
  assert.equal(load({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_LOGS_EXPORTER: 'none' }).otlp, null);
  const refused = (env: ConfigInput['env'], ...words: string[]): void =>
    assert.throws(() => load(env), (e) => e instanceof ConfigError && words.every((w) => e.message.includes(w)), JSON.stringify(env));
  refused({ OTEL_TRACES_EXPORTER: 'otlp' }, 'OTEL_TRACES_EXPORTER');
  refused({ OTEL_METRICS_EXPORTER: 'otlp' }, 'OTEL_METRICS_EXPORTER');
  refused({ OTEL_EXPORTER_OTLP_ENDPOINT: 'collector:4317' }, 'OTEL_EXPORTER_OTLP_ENDPOINT', 'URL');
  refused({ OTEL_EXPORTER_OTLP_PROTOCOL: 'thrift' }, 'OTEL_EXPORTER_OTLP_PROTOCOL');
  refused({ OTEL_BLRP_MAX_QUEUE_SIZE: '10', OTEL_BLRP_MAX_EXPORT_BATCH_SIZE: '20' }, 'OTEL_BLRP_MAX_EXPORT_BATCH_SIZE');
  // Nothing turns export on: its settings would be ignored, so they are refused by name (ours and the SDK's own).
  refused({ OTEL_SERVICE_NAME: 'zt' }, 'OTEL_SERVICE_NAME', 'which is off', 'OTEL_EXPORTER_OTLP_ENDPOINT');
  refused({ OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc', OTEL_BLRP_SCHEDULE_DELAY: '100' }, 'OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_BLRP_SCHEDULE_DELAY');
  refused({ OTEL_EXPORTER_OTLP_HEADERS: 'a=b' }, 'OTEL_EXPORTER_OTLP_HEADERS');
  refused({ OTEL_RESOURCE_ATTRIBUTES: 'team=x' }, 'OTEL_RESOURCE_ATTRIBUTES');
  // An explicit off switch keeps them (OpenTelemetry's OTEL_SDK_DISABLED is meant for that); with export on they apply.
  assert.equal(load({ OTEL_SERVICE_NAME: 'zt', OTEL_SDK_DISABLED: 'true' }).otlp, null);
  assert.equal(load({ OTEL_SERVICE_NAME: 'zt', OTEL_LOGS_EXPORTER: 'none' }).otlp, null);
  assert.equal(load({ OTEL_SERVICE_NAME: 'zt', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318' }).otlp!.serviceName, 'zt');
});
