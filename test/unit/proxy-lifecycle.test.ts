// runProxy end to end against a fake dataplane and a fake CA (no native module): what an operator sees through
// readiness, config_dump, metrics and logs, and the shutdown sequence.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { sleepLeafAndRoot } from '../helpers/pki.js';
import { loadConfig } from '../../dist/config/index.js';
import { runProxy } from '../../dist/lifecycle/proxy.js';
import type { ProxyDeps } from '../../dist/lifecycle/proxy.js';
import { createLogs } from '../../dist/log/logger.js';
import type { LogLevel } from '../../dist/log/filter.js';
import type { DataplaneConfig, LocalWorkloadSpec } from '../../dist/native/index.js';
import { ZtunnelError, LocalConfigError } from '../../dist/errors.js';
import { parsePrometheusText, sumSamples } from '../../dist/cli/prom-text.js';
import { get, waitUntil } from '../helpers/local-http.js';
import { fakeDataplane as baseDataplane } from '../helpers/fake-dataplane.js';
import type { FakeDataplane } from '../helpers/fake-dataplane.js';

/** One setEventLevels call: access, dataplane, dns. */
type Levels = [access: LogLevel, dataplane: LogLevel, dns: LogLevel | undefined];
/** The stand-in of this file: the base one, recording the event levels it is given. */
type LifecycleDataplane = FakeDataplane & { levels: Levels[] };

/** One JSON log line, parsed (the fields this file reads by name). */
interface LogLine {
  level: string;
  target: string;
  message: string;
  err?: string;
  [field: string]: unknown;
}

/** The parts of /config_dump this file reads. */
interface Dump {
  workloads: { uid: string }[];
  certificates: { identity: string; state: string }[];
  config: { ztunnelNode: { nodeName: string }; localNode: string };
  version: { cryptoProvider: string; rustVersion: string };
  stagedServices: unknown;
  staticConfig: { workloads: unknown[] };
}

const PKI = sleepLeafAndRoot();
const skip = PKI === null ? 'openssl could not make a test CA (Debian openssl: apt-get install --no-install-recommends openssl)' : false;

const LOCAL_XDS = `
workloads:
- {uid: u-sleep, name: sleep, namespace: default, serviceAccount: sleep, workloadIps: ["127.0.1.10"], protocol: HBONE, node: node-a}
- {uid: u-echo, name: echo, namespace: default, serviceAccount: echo, workloadIps: ["127.0.2.10"], protocol: HBONE, node: node-b}
`;

function fakeDataplane({ bindFails = false }: { bindFails?: boolean } = {}): LifecycleDataplane {
  let events = [{ kind: 'access', level: 'info', message: 'connection complete', fields: { 'src.addr': '127.0.1.10:1234', direction: 'inbound' } }];
  const dp: LifecycleDataplane = baseDataplane({
    addLocalWorkload: async (spec: LocalWorkloadSpec) => {
      dp.log.push(['addLocalWorkload', spec]);
      if (bindFails) throw new ZtunnelError('BIND_FAILED', `${spec.hboneAddr}: address in use`);
      return { hboneAddr: spec.hboneAddr, socksAddr: spec.socksAddr, dnsAddr: spec.dnsAddr };
    },
    // The scrape asks for the traffic counters as the dataplane's OpenMetrics text; other readers get rows.
    metrics: (opts?: { trafficText: boolean }) =>
      opts?.trafficText
        ? { traffic: '# HELP istio_tcp_connections_opened x\n# TYPE istio_tcp_connections_opened counter\nistio_tcp_connections_opened_total{reporter="destination"} 4\n', connections: [], socketsOpen: { source: 0, destination: 0 } }
        : { connections: [{ labels: { reporter: 'destination' }, opened: 4, closed: 4, failed: 0, sent: 1, received: 2 }], socketsOpen: { source: 0, destination: 0 } },
    drainEvents: () => {
      const e = events;
      events = [];
      return e;
    },
    levels: [] as Levels[],
    setEventLevels(access: LogLevel, dataplane: LogLevel, dns?: LogLevel) {
      this.levels.push([access, dataplane, dns]);
    },
    drain: async (ms: number) => (dp.log.push(['drain', ms]), true),
  });
  return dp;
}

function setup({ env = {}, dp = fakeDataplane() }: { env?: Record<string, string>; dp?: LifecycleDataplane } = {}) {
  const lines: LogLine[] = [];
  const logs = createLogs({ filter: { level: 'info', targets: {} }, format: 'json', sink: { write: (l) => lines.push(JSON.parse(l) as LogLine) } });
  const config = loadConfig({
    env: {
      PROXY_MODE: 'local', NODE_NAME: 'node-a', LOCAL_CA_DIR: '/unused', LOCAL_XDS,
      ADMIN_ADDR: '127.0.0.1:0', STATS_ADDR: '127.0.0.1:0', READINESS_ADDR: '127.0.0.1:0', CONNECTION_TERMINATION_DEADLINE: '2s',
      ...env,
    },
  });
  const ca = { sign: async () => ({ chainPem: PKI!.leaf, rootsPem: PKI!.root }) };
  const deps: Partial<ProxyDeps> = {
    openDataplane: (cfg) => (dp.log.push(['open', cfg]), dp),
    openLocalCa: () => ca,
    nativeVersion: () => ({ version: '0.0.0-test', cryptoProvider: 'ring', buildProfile: 'debug', rustVersion: 'rustc 1.95.0 (59807616e 2026-04-14)' }),
  };
  return { dp, lines, logs, config, deps };
}



test('local mode: certificates, then listeners, then ready; dumps and metrics; quitquitquit drains', { skip }, async () => {
  const { dp, lines, logs, config, deps } = setup();
  const proxy = await runProxy(config, logs, { deps, handleSignals: false });
  await waitUntil(async () => (await get(proxy.addresses.readiness, '/healthz/ready')).status === 200, 'ready');

  const ops = dp.log.map(([op]) => op);
  assert.deepEqual(ops.slice(0, 2), ['open', 'applyLocal']);
  assert.equal((dp.log[0][1] as DataplaneConfig).nodeName, 'node-a');
  assert.equal((dp.log[0][1] as DataplaneConfig).socks5Enabled, true);
  // Only node-a's workload gets a certificate and listeners, and the certificate comes first.
  assert.deepEqual(dp.log.filter(([op]) => op === 'createCsr').map(([, id]) => id), ['spiffe://cluster.local/ns/default/sa/sleep']);
  assert.ok(ops.indexOf('installCertificate') < ops.indexOf('addLocalWorkload'));
  assert.deepEqual(dp.log.filter(([op]) => op === 'addLocalWorkload').map(([, s]) => s), [
    // The DNS proxy is on by default (ISTIO_META_DNS_CAPTURE unset), on the workload's IP.
    { uid: 'u-sleep', hboneAddr: '127.0.1.10:15008', socksAddr: '127.0.1.10:15080', dnsAddr: '127.0.1.10:15053' },
  ]);
  assert.equal((dp.log[0][1] as DataplaneConfig).dns.enabled, true);
  assert.equal((dp.log[0][1] as DataplaneConfig).dns.addr, 'localhost:15053');

  const dump = JSON.parse((await get(proxy.addresses.admin, '/config_dump')).body) as Dump;
  assert.deepEqual(dump.workloads.map((w) => w.uid), ['u-echo', 'u-sleep']);
  assert.deepEqual(dump.certificates.map((c) => [c.identity, c.state]), [['spiffe://cluster.local/ns/default/sa/sleep', 'Available']]);
  assert.equal(dump.config.ztunnelNode.nodeName, 'node-a');
  assert.equal(dump.config.localNode, 'node-a', "ztunnel's key");
  assert.equal(dump.version.cryptoProvider, 'tls-ring', "ztunnel's name of the provider (its cargo feature)");
  assert.equal(dump.version.rustVersion, '1.95.0', "the bare version, as ztunnel's");
  assert.deepEqual(dump.stagedServices, {});
  assert.equal(dump.staticConfig.workloads.length, 2);

  const samples = parsePrometheusText((await get(proxy.addresses.stats, '/metrics')).body);
  assert.equal(sumSamples(samples, 'istio_tcp_connections_opened_total', { reporter: 'destination' }), 4);

  await waitUntil(() => lines.some((l) => l.target === 'access' && l.message === 'connection complete'), 'the access log');
  const access = lines.find((l) => l.target === 'access');
  assert.equal(access!['src.addr'], '127.0.1.10:1234');

  const quit = await get(proxy.addresses.admin, '/quitquitquit', { method: 'POST' });
  assert.equal(quit.body, 'shutdown now\n');
  assert.equal(await proxy.closed, 0);
  const tail = dp.log.map(([op]) => op).slice(-2);
  assert.deepEqual(tail, ['drain', 'shutdown']);
  assert.equal(dp.log.find(([op]) => op === 'drain')![1], 2000);
  await assert.rejects(get(proxy.addresses.readiness, '/healthz/ready'), 'servers are closed');
});

test('the dataplane builds only the events the log filter passes, and follows /logging changes', { skip }, async () => {
  const { dp, logs, config, deps } = setup();
  const proxy = await runProxy(config, logs, { deps, handleSignals: false });
  assert.deepEqual(dp.levels, [['info', 'info', 'info']], 'set once at start, from RUST_LOG');
  const r = await get(proxy.addresses.admin, '/logging?level=warn,access=off,dns=debug', { method: 'POST' });
  assert.equal(r.status, 200);
  assert.deepEqual(dp.levels.at(-1), ['off', 'warn', 'debug']);
  await get(proxy.addresses.admin, '/logging?reset', { method: 'POST' });
  assert.deepEqual(dp.levels.at(-1), ['info', 'info', 'info']);
  await get(proxy.addresses.admin, '/quitquitquit', { method: 'POST' });
  assert.equal(await proxy.closed, 0);
  const after = dp.levels.length;
  logs.setFilter({ level: 'debug', targets: {} });
  assert.equal(dp.levels.length, after, 'no calls into a shut-down dataplane');
});

test('a listener that cannot bind shuts the proxy down with exit code 1', { skip }, async () => {
  const { lines, logs, config, deps } = setup({ dp: fakeDataplane({ bindFails: true }) });
  const proxy = await runProxy(config, logs, { deps, handleSignals: false });
  assert.equal(await proxy.closed, 1);
  assert.ok(lines.some((l) => l.level === 'error' && /address in use/.test(l.err!)));
});

test('XDS configured but unreachable: "state manager" stays pending', async () => {
  const { logs, config, deps } = setup({ env: { PROXY_MODE: 'shared', XDS_ADDRESS: 'istiod:15012' } });
  const proxy = await runProxy(config, logs, { deps, handleSignals: false });
  const r = await get(proxy.addresses.readiness, '/healthz/ready');
  assert.deepEqual([r.status, r.body], [500, 'not ready, pending: state manager\n']);
  await proxy.shutdown('immediate', 'test');
  assert.equal(await proxy.closed, 0);
});

test('a bad local config fails before the dataplane opens', async () => {
  const { dp, logs, config, deps } = setup({ env: { LOCAL_XDS: 'workloads: [{uid: a, name: a, namespace: n, workloadIps: ["1.2.3"]}]' } });
  await assert.rejects(runProxy(config, logs, { deps, handleSignals: false }), (err) => {
    assert.ok(err instanceof LocalConfigError);
    assert.equal(err.message, 'LOCAL_XDS: workloads[0].workloadIps[0]: "1.2.3" is not an IP address');
    return true;
  });
  assert.deepEqual(dp.log, []);
});
