// OpenTelemetry export of the access log, beyond ztunnel (README "Access logs over OpenTelemetry"), into a real
// OpenTelemetry Collector built from its own Go modules (test/helpers/otelcol): node-a exports over OTLP/gRPC with its
// access log itself off (RUST_LOG access=warn), node-b over OTLP/HTTP (protobuf); both records of one tunnel arrive
// with ztunnel's field names and the semantic conventions'. With the collector gone, the daemon keeps serving, its
// queue stays bounded and the drop counter counts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { sumSamples } from '../../dist/cli/prom-text.js';
import { makeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import { BLOCKS, block, startEchoServer, throughSocks5, waitFor } from '../helpers/net.js';
import { startCollector } from '../helpers/otelcol.js';

const net = block(BLOCKS['otlp-export']);
const SLEEP = net.workload(1);
const ECHO = net.workload(2);
const COLLECTOR = net.admin(9);
const CONFIG = { workloads: [workload({ name: 'sleep', ip: SLEEP, node: 'node-a' }), workload({ name: 'echo', ip: ECHO, node: 'node-b' })] };

const rss = (pid: number): number => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0) * 1024;

test('access records reach a real collector over OTLP/gRPC and OTLP/HTTP, with ztunnel\'s and the semantic conventions\' names', async (t) => {
  const app = await startEchoServer(ECHO, 8080);
  t.after(() => app.close());
  const collector = await startCollector({ ip: COLLECTOR, dir: makeTempDir('ztn-otelcol-'), cleanup: t });
  const caDir = makeTempDir('ztn-otlp-ca-');
  const quick = { OTEL_BLRP_SCHEDULE_DELAY: '100' };
  const a = await startDaemon({
    node: 'node-a',
    config: CONFIG,
    caDir,
    adminIp: net.admin(1),
    env: { ...quick, OTEL_EXPORTER_OTLP_ENDPOINT: `http://${COLLECTOR}:4317`, OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc', RUST_LOG: 'info,access=warn' },
    cleanup: t,
  });
  const b = await startDaemon({
    node: 'node-b',
    config: CONFIG,
    caDir,
    adminIp: net.admin(2),
    env: { ...quick, OTEL_EXPORTER_OTLP_ENDPOINT: `http://${COLLECTOR}:4318`, OTEL_SERVICE_NAME: 'ztn-b' },
    cleanup: t,
  });
  assert.equal(await throughSocks5(SLEEP, ECHO, 8080, 'exported'), 0);
  const complete = (direction: string) => collector.records().find((r) => r.body === 'connection complete' && r.attributes.direction === direction);
  const out = await waitFor(() => complete('outbound'), { timeoutMs: 15_000, message: 'node-a\'s record at the collector' });
  const inb = await waitFor(() => complete('inbound'), { timeoutMs: 15_000, message: 'node-b\'s record at the collector' });
  // ztunnel's names, as the access log has them.
  assert.equal(out.attributes['src.workload'], 'sleep');
  assert.equal(out.attributes['dst.workload'], 'echo');
  assert.equal(out.attributes['dst.addr'], `${ECHO}:8080`);
  assert.equal(out.attributes['src.identity'], 'spiffe://cluster.local/ns/default/sa/sleep');
  assert.equal(inb.attributes['src.identity'], 'spiffe://cluster.local/ns/default/sa/sleep');
  // The semantic conventions' names.
  assert.equal(out.attributes['destination.address'], ECHO);
  assert.equal(out.attributes['destination.port'], 8080);
  assert.equal(out.attributes['network.transport'], 'tcp');
  assert.equal(typeof out.attributes['source.port'], 'number');
  assert.equal(out.severity, 'INFO');
  // Each daemon as its resource.
  assert.equal(out.resource['service.name'], 'ztunnel-node');
  assert.equal(out.resource['k8s.node.name'], 'node-a');
  assert.equal(inb.resource['service.name'], 'ztn-b');
  // node-a's access log itself is off (access=warn): exported all the same.
  assert.ok(!a.logs.some((l) => l.message === 'connection complete'), 'node-a logged no access record');
  assert.ok(b.logs.some((l) => l.message === 'connection complete'), 'node-b logs its own');
  await waitFor(async () => sumSamples(await a.metrics(), 'ztunnel_node_otlp_log_records_total', { result: 'exported' }) >= 1, {
    message: 'node-a counted the export',
  });
  for (const d of [a, b]) assert.equal((await d.stop()).code, 0);
});

test('OTLP/HTTP with JSON bodies (http/json): the same record and resource', async (t) => {
  const app = await startEchoServer(ECHO, 8080);
  t.after(() => app.close());
  const collector = await startCollector({ ip: COLLECTOR, dir: makeTempDir('ztn-otelcol-json-'), cleanup: t });
  const caDir = makeTempDir('ztn-otlp-json-ca-');
  const env = { OTEL_BLRP_SCHEDULE_DELAY: '100', OTEL_EXPORTER_OTLP_ENDPOINT: `http://${COLLECTOR}:4318`, OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json', OTEL_RESOURCE_ATTRIBUTES: 'deployment.environment=test' };
  const a = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(1), env, cleanup: t });
  const b = await startDaemon({ node: 'node-b', config: CONFIG, caDir, adminIp: net.admin(2), cleanup: t });
  assert.equal(await throughSocks5(SLEEP, ECHO, 8080, 'json'), 0);
  const out = await waitFor(() => collector.records().find((r) => r.body === 'connection complete' && r.attributes.direction === 'outbound'), {
    timeoutMs: 15_000,
    message: 'node-a\'s record at the collector',
  });
  assert.equal(out.attributes['dst.addr'], `${ECHO}:8080`);
  assert.equal(out.attributes['destination.port'], 8080);
  assert.equal(typeof out.attributes['source.port'], 'number');
  assert.equal(out.severity, 'INFO');
  assert.equal(out.resource['k8s.node.name'], 'node-a');
  assert.equal(out.resource['deployment.environment'], 'test');
  for (const d of [a, b]) assert.equal((await d.stop()).code, 0);
});

test('with the collector down the daemon keeps serving; the queue stays bounded and the drop counter counts', async (t) => {
  const app = await startEchoServer(ECHO, 8080);
  t.after(() => app.close());
  const caDir = makeTempDir('ztn-otlp-down-ca-');
  const env = {
    OTEL_EXPORTER_OTLP_ENDPOINT: `http://${COLLECTOR}:4317`, // nothing listens
    OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc',
    OTEL_BLRP_MAX_QUEUE_SIZE: '32',
    OTEL_BLRP_MAX_EXPORT_BATCH_SIZE: '16',
    OTEL_BLRP_SCHEDULE_DELAY: '100',
  };
  const a = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(1), env, cleanup: t });
  const b = await startDaemon({ node: 'node-b', config: CONFIG, caDir, adminIp: net.admin(2), cleanup: t });
  for (let i = 0; i < 50; i++) assert.equal(await throughSocks5(SLEEP, ECHO, 8080), 0, `warm-up ${i}`);
  const before = rss(a.child.pid!);
  for (let i = 0; i < 300; i++) assert.equal(await throughSocks5(SLEEP, ECHO, 8080), 0, `connection ${i}`);
  const counted = async (result: string): Promise<number> => sumSamples(await a.metrics(), 'ztunnel_node_otlp_log_records_total', { result });
  // 350 records against a queue of 32 whose exports never succeed: nearly all are dropped (a few batches of 16 may be
  // in the SDK's retries meanwhile).
  await waitFor(async () => (await counted('dropped')) >= 200, { timeoutMs: 20_000, message: 'records dropped at the full queue' });
  assert.equal(await counted('exported'), 0);
  const grew = rss(a.child.pid!) - before;
  assert.ok(grew < 32 * 1024 * 1024, `resident memory grew ${grew} bytes over 300 connections`);
  assert.ok(a.logs.some((l) => l.message === 'OTLP export queue full: access records dropped'), 'the drop is logged');
  for (const d of [a, b]) assert.equal((await d.stop()).code, 0);
});
