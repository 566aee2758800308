// Config parsing: env + flags through the one schema, defaults, derived values, and error messages.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { loadConfig, configForDump, terminationDeadlineMs, workerThreads } from '../../dist/config/index.js';
import { parseDurationMs } from '../../dist/config/duration.js';
import { ConfigError } from '../../dist/errors.js';
import type { ConfigInput } from '../../dist/config/index.js';

const LOCAL = { PROXY_MODE: 'local', NODE_NAME: 'node-a', LOCAL_CA_DIR: '/tmp/ca' };

test('defaults match ztunnel', () => {
  const c = loadConfig({ env: {}, cpuCount: 4 });
  assert.equal(c.proxyMode, 'shared');
  assert.equal(c.clusterId, 'Kubernetes');
  assert.equal(c.trustDomain, 'cluster.local');
  assert.equal(c.network, '');
  assert.equal(c.poolMaxStreamsPerConnection, 100);
  assert.equal(c.poolUnusedReleaseTimeoutMs, 300_000);
  assert.deepEqual(c.http2, { streamWindowSize: 4194304, connectionWindowSize: 16777216, frameSize: 1048576 });
  assert.equal(c.connectionTimeoutMs, 10_000);
  assert.equal(c.streamBufferBudget, 256 * 1024 * 1024);
  assert.equal(loadConfig({ env: { STREAM_BUFFER_BUDGET: '33554432' } }).streamBufferBudget, 32 * 1024 * 1024);
  assert.equal(c.terminationDeadlineMs, 5_000);
  assert.equal(c.secretTtlMs, 24 * 3600_000);
  assert.equal(c.logFormat, 'plain');
  assert.deepEqual(c.logFilter, { level: 'info', targets: {} });
  assert.equal(c.socks5Enabled, false);
  assert.deepEqual(c.adminAddr, { host: '127.0.0.1', port: 15000 });
  assert.deepEqual(c.statsAddr, { host: '0.0.0.0', port: 15020 });
  assert.deepEqual(c.readinessAddr, { host: '0.0.0.0', port: 15021 });
  assert.equal(c.xdsAddress, 'https://localhost:15012');
  assert.equal(loadConfig({ env: { KUBERNETES_SERVICE_HOST: '10.0.0.1' } }).xdsAddress, 'https://istiod.istio-system.svc:15012');
});

test('the config is frozen', () => {
  const c = loadConfig({ env: {} });
  assert.ok(Object.isFrozen(c));
  assert.ok(Object.isFrozen(c.http2));
  assert.throws(() => {
    // @ts-expect-error the Config is readonly, and frozen: the assignment under test throws
    c.nodeName = 'x';
  }, TypeError);
});

test('flags win over env, in both --flag value and --flag=value forms', () => {
  const c = loadConfig({ env: { NODE_NAME: 'from-env', TRUST_DOMAIN: 'env.td' }, args: ['--node-name', 'from-flag', '--trust-domain=flag.td'] });
  assert.equal(c.nodeName, 'from-flag');
  assert.equal(c.trustDomain, 'flag.td');
  assert.equal(loadConfig({ env: { NODE_NAME: 'from-env' } }).nodeName, 'from-env');
});

test('positional args are recorded in proxyArgs, not parsed', () => {
  const c = loadConfig({ env: {}, args: ['ztunnel', '--network', 'n1'], allArgs: ['proxy', 'ztunnel', '--network', 'n1'] });
  assert.equal(c.proxyArgs, 'proxy ztunnel --network n1');
  assert.equal(c.network, 'n1');
});

test('boolean flag without a value means true', () => {
  assert.equal(loadConfig({ env: {}, args: ['--unstable-enable-socks5'] }).socks5Enabled, true);
  assert.equal(loadConfig({ env: {}, args: ['--unstable-enable-socks5', 'false'] }).socks5Enabled, false);
  // Local mode turns SOCKS5 on unless told otherwise.
  assert.equal(loadConfig({ env: LOCAL }).socks5Enabled, true);
  assert.equal(loadConfig({ env: { ...LOCAL, UNSTABLE_ENABLE_SOCKS5: 'false' } }).socks5Enabled, false);
});

test('ISTIO_META_CLUSTER_ID wins over CLUSTER_ID env; a --cluster-id flag wins over both', () => {
  assert.equal(loadConfig({ env: { CLUSTER_ID: 'a', ISTIO_META_CLUSTER_ID: 'meta' } }).clusterId, 'meta');
  assert.equal(loadConfig({ env: { CLUSTER_ID: 'a' } }).clusterId, 'a');
  assert.equal(loadConfig({ env: { ISTIO_META_CLUSTER_ID: 'meta' }, args: ['--cluster-id', 'flag'] }).clusterId, 'flag');
});

test('XDS_ADDRESS "" disables XDS; local mode disables it by default', () => {
  assert.equal(loadConfig({ env: { XDS_ADDRESS: '' } }).xdsAddress, null);
  assert.equal(loadConfig({ env: LOCAL }).xdsAddress, null);
  assert.equal(loadConfig({ env: { XDS_ADDRESS: 'istiod:15012' } }).xdsAddress, 'https://istiod:15012');
});

test('empty env values mean unset (except where "" is a value)', () => {
  assert.equal(loadConfig({ env: { CONNECTION_TIMEOUT: '' } }).connectionTimeoutMs, 10_000);
  assert.equal(loadConfig({ env: { NETWORK: '' } }).network, '');
});

test('durations in Go syntax', () => {
  assert.equal(parseDurationMs('500ms'), 500);
  assert.equal(parseDurationMs('10s'), 10_000);
  assert.equal(parseDurationMs('5m'), 300_000);
  assert.equal(parseDurationMs('24h'), 86_400_000);
  assert.equal(parseDurationMs('1h30m'), 5_400_000);
  assert.equal(parseDurationMs('1.5h'), 5_400_000);
  assert.equal(parseDurationMs('0'), 0);
  assert.equal(parseDurationMs('1500us'), 1.5);
  for (const bad of ['', '10', 'ms', '-5s', '5 s', '5x', '1h 30m']) assert.equal(parseDurationMs(bad), undefined, bad);
  const c = loadConfig({ env: { CONNECTION_TIMEOUT: '1m30s', POOL_UNUSED_RELEASE_TIMEOUT: '90s', SECRET_TTL: '1h' } });
  assert.equal(c.connectionTimeoutMs, 90_000);
  assert.equal(c.poolUnusedReleaseTimeoutMs, 90_000);
  assert.equal(c.secretTtlMs, 3_600_000);
});

test('CONNECTION_TIMEOUT has a floor of 100ms and NODE_NAME must be a Kubernetes node name (issue 29)', () => {
  const refused = (env: ConfigInput['env'], pattern: RegExp): void => assert.throws(() => loadConfig({ env: { ...LOCAL, ...env }, args: [] }), (e) => {
    assert.ok(e instanceof ConfigError, `expected ConfigError, got ${e}`);
    assert.match(e.message, pattern);
    return true;
  });
  refused({ CONNECTION_TIMEOUT: '0s' }, /CONNECTION_TIMEOUT: "0s" is below the minimum of 100ms/);
  refused({ CONNECTION_TIMEOUT: '99ms' }, /CONNECTION_TIMEOUT: "99ms" is below the minimum/);
  assert.equal(loadConfig({ env: { ...LOCAL, CONNECTION_TIMEOUT: '100ms' }, args: [] }).connectionTimeoutMs, 100);
  refused({ NODE_NAME: 'node-a\u001b[31m' }, /NODE_NAME: "node-a\\u001b\[31m" is not a Kubernetes node name/);
  refused({ NODE_NAME: 'node a' }, /NODE_NAME: "node a" is not a Kubernetes node name/);
  refused({ NODE_NAME: 'Node-A' }, /is not a Kubernetes node name/);
  refused({ NODE_NAME: 'a'.repeat(254) }, /is not a Kubernetes node name/);
  assert.equal(loadConfig({ env: { ...LOCAL, NODE_NAME: 'ip-10-0-0-1.ec2.internal' }, args: [] }).nodeName, 'ip-10-0-0-1.ec2.internal');
});

test('SECRET_TTL below a minute is refused at load, naming the variable, the value and the minimum', () => {
  const refused = (input: ConfigInput, pattern: RegExp): void => assert.throws(() => loadConfig(input), (e) => {
    assert.ok(e instanceof ConfigError, `expected ConfigError, got ${e}`);
    assert.equal(e.code, 'CONFIG_INVALID');
    assert.match(e.message, pattern);
    return true;
  });
  refused({ env: { SECRET_TTL: '1ns' } }, /SECRET_TTL: "1ns" is below the minimum of 1m0s/);
  refused({ env: { SECRET_TTL: '59s' } }, /SECRET_TTL: "59s" is below the minimum of 1m0s/);
  refused({ env: { SECRET_TTL: '59999ms' } }, /SECRET_TTL: "59999ms" is below the minimum of 1m0s/);
  refused({ env: { SECRET_TTL: '0' } }, /SECRET_TTL: "0" is below the minimum/);
  // A flag is named as the flag.
  refused({ env: {}, args: ['--secret-ttl=30s'] }, /--secret-ttl: "30s" is below the minimum of 1m0s/);
  // Not a duration at all stays its own error.
  refused({ env: { SECRET_TTL: '60' } }, /SECRET_TTL: "60" is not a duration/);
  assert.equal(loadConfig({ env: { SECRET_TTL: '60s' } }).secretTtlMs, 60_000);
  assert.equal(loadConfig({ env: { SECRET_TTL: '1m' } }).secretTtlMs, 60_000);
  assert.equal(loadConfig({ env: { SECRET_TTL: '66s' } }).secretTtlMs, 66_000); // test/integration/xds-ca.test.ts
});

test('termination deadline rule: explicit > grace period (N>10: N-5, else N-1, min 1 s) > 5 s', () => {
  assert.equal(terminationDeadlineMs(undefined, undefined), 5_000);
  assert.equal(terminationDeadlineMs(undefined, 30), 25_000);
  assert.equal(terminationDeadlineMs(undefined, 11), 6_000);
  assert.equal(terminationDeadlineMs(undefined, 10), 9_000);
  assert.equal(terminationDeadlineMs(undefined, 2), 1_000);
  assert.equal(terminationDeadlineMs(undefined, 1), 1_000);
  assert.equal(terminationDeadlineMs(undefined, 0), 1_000);
  assert.equal(terminationDeadlineMs(2_500, 30), 2_500);
  assert.equal(loadConfig({ env: { TERMINATION_GRACE_PERIOD_SECONDS: '30' } }).terminationDeadlineMs, 25_000);
  assert.equal(loadConfig({ env: { TERMINATION_GRACE_PERIOD_SECONDS: '30', CONNECTION_TERMINATION_DEADLINE: '3s' } }).terminationDeadlineMs, 3_000);
});

test('worker threads: explicit count, percent, 0 = all, CPU limits, default floor of 2', () => {
  const wt = (env: ConfigInput['env'], cores: number) => loadConfig({ env, cpuCount: cores }).numWorkerThreads;
  assert.equal(wt({}, 16), 4); // ceil(16 * 0.25)
  assert.equal(wt({}, 4), 2); // floor of 2
  assert.equal(wt({}, 1), 2);
  assert.equal(wt({ ZTUNNEL_WORKER_THREADS: '3' }, 16), 3);
  assert.equal(wt({ ZTUNNEL_WORKER_THREADS: '0' }, 16), 16);
  assert.equal(wt({ ZTUNNEL_WORKER_THREADS: '0' }, 4096), 1024, 'all cores of a huge machine: the dataplane\'s limit');
  assert.equal(wt({ ZTUNNEL_WORKER_THREADS: '50%' }, 6), 3);
  assert.equal(wt({ ZTUNNEL_WORKER_THREADS: '10%' }, 4), 1); // ceil, at least 1
  assert.equal(wt({ ZTUNNEL_CPU_LIMIT: '8' }, 64), 2);
  assert.equal(wt({ ZTUNNEL_RESOURCE_CPU_LIMIT: '3' }, 64), 3);
  assert.equal(wt({ ZTUNNEL_RESOURCE_CPU_LIMIT: '2', ZTUNNEL_RESOURCE_CPU_REQUEST: '2.5' }, 64), 3);
  assert.equal(wt({ ZTUNNEL_RESOURCE_CPU_REQUEST: '5' }, 8), 5);
  assert.equal(wt({ ZTUNNEL_WORKER_THREADS: '0', ZTUNNEL_RESOURCE_CPU_LIMIT: '1.5' }, 64), 2);
  assert.equal(workerThreads({}, 40), 10);
});

test('bad values are errors naming the variable or flag and the problem', () => {
  const err = (input: ConfigInput): string => {
    try {
      loadConfig(input);
    } catch (e) {
      assert.ok(e instanceof ConfigError, `expected ConfigError, got ${e}`);
      assert.equal(e.code, 'CONFIG_INVALID');
      return e.message;
    }
    assert.fail('expected a ConfigError');
  };
  assert.match(err({ env: { ZTUNNEL_WORKER_THREADS: 'lots' } }), /ZTUNNEL_WORKER_THREADS: "lots" is not a thread count/);
  // What the dataplane would refuse is refused here, naming the variable (not the dataplane's internal field).
  assert.match(err({ env: { ZTUNNEL_WORKER_THREADS: '5000' } }), /ZTUNNEL_WORKER_THREADS: "5000": at most 1024 threads/);
  assert.match(err({ env: { HTTP2_FRAME_SIZE: '1000' } }), /HTTP2_FRAME_SIZE: "1000" is not an integer between 16384 and 16777215/);
  assert.match(err({ env: { STREAM_BUFFER_BUDGET: '1000' } }), /STREAM_BUFFER_BUDGET: "1000" is not an integer between 1048576 and/);
  assert.match(err({ env: {}, args: ['--ztunnel-worker-threads=150%'] }), /--ztunnel-worker-threads: "150%": a percentage/);
  assert.match(err({ env: { CONNECTION_TIMEOUT: '10' } }), /CONNECTION_TIMEOUT: "10" is not a duration/);
  assert.match(err({ env: { PROXY_MODE: 'sidecar' } }), /PROXY_MODE: "sidecar" is not one of shared\|dedicated\|local/);
  assert.match(err({ env: { ADMIN_ADDR: '127.0.0.1' } }), /ADMIN_ADDR: "127.0.0.1" is not host:port/);
  assert.match(err({ env: { STATS_ADDR: '0.0.0.0:70000' } }), /STATS_ADDR: .*out of range/);
  assert.match(err({ env: { POOL_MAX_STREAMS_PER_CONNECTION: '0' } }), /POOL_MAX_STREAMS_PER_CONNECTION: "0" is not an integer between 1/);
  assert.match(err({ env: { RUST_LOG: 'loud' } }), /RUST_LOG: "loud" is not a level/);
  assert.match(err({ env: { LOG_FORMAT: 'yaml' } }), /LOG_FORMAT: "yaml" is not one of plain\|json/);
  assert.match(err({ env: { UNSTABLE_ENABLE_SOCKS5: 'yes' } }), /UNSTABLE_ENABLE_SOCKS5: "yes" is not a boolean/);
  assert.match(err({ env: { LOCAL_XDS_PATH: 'a.yaml', LOCAL_XDS: 'workloads: []' } }), /LOCAL_XDS: is exclusive with LOCAL_XDS_PATH/);
  assert.match(err({ env: { PROXY_MODE: 'local', NODE_NAME: 'n' } }), /LOCAL_CA_DIR: is required when PROXY_MODE=local/);
  assert.match(err({ env: { PROXY_MODE: 'local', LOCAL_CA_DIR: '/x' } }), /NODE_NAME: is required when PROXY_MODE=local/);
  assert.match(err({ env: { PROXY_MODE: 'dedicated' } }), /PROXY_WORKLOAD_INFO: is required/);
  assert.match(err({ env: {}, args: ['--no-such-flag'] }), /unknown flag --no-such-flag/);
  assert.match(err({ env: {}, args: ['--node-name'] }), /--node-name: needs a value/);
  // Several problems are reported together.
  const both = err({ env: { CONNECTION_TIMEOUT: 'x', HTTP2_FRAME_SIZE: 'y' } });
  assert.match(both, /CONNECTION_TIMEOUT/);
  assert.match(both, /HTTP2_FRAME_SIZE/);
});

test('RUST_LOG with target directives', () => {
  const c = loadConfig({ env: { RUST_LOG: 'warn,access=debug' } });
  assert.deepEqual(c.logFilter, { level: 'warn', targets: { access: 'debug' } });
});

test('IPv6 admin addresses', () => {
  assert.deepEqual(loadConfig({ env: { STATS_ADDR: '[::]:15020' } }).statsAddr, { host: '::', port: 15020 });
});

test('configForDump is camelCase and renders durations and addresses', () => {
  const d = configForDump(loadConfig({ env: { ...LOCAL, CONNECTION_TIMEOUT: '1500ms' }, cpuCount: 8 })).ztunnelNode as Record<string, unknown>;
  assert.equal(d.proxyMode, 'local');
  assert.equal(d.numWorkerThreads, 2);
  assert.equal(d.adminAddr, '127.0.0.1:15000');
  assert.equal(d.connectionTimeout, '1.5s');
  assert.equal(d.selfTerminationDeadline, '5s');
  assert.equal(d.logFilter, 'info');
  for (const key of Object.keys(d)) assert.match(key, /^[a-z][A-Za-z0-9]*$/, `${key} is not camelCase`);
  // The dump is JSON-serializable as-is.
  assert.deepEqual(JSON.parse(JSON.stringify(d)).nodeName, 'node-a');
});

test('in-pod settings: PACKET_MARK must fit SO_MARK (u32), ENABLE_ORIG_SRC maps to auto/required/never', () => {
  assert.throws(() => loadConfig({ env: { PACKET_MARK: '4294967296' }, args: [] }), /PACKET_MARK: "4294967296" is not an integer between 0 and 4294967295/);
  const d = loadConfig({ env: {}, args: [] }).inpod;
  assert.deepEqual(d, { uds: '/var/run/ztunnel/ztunnel.sock', packetMark: 1337, portReuse: true, origSrc: 'auto' });
  assert.equal(loadConfig({ env: { ENABLE_ORIG_SRC: 'true' }, args: [] }).inpod.origSrc, 'required');
  assert.equal(loadConfig({ env: { ENABLE_ORIG_SRC: 'false', INPOD_PORT_REUSE: 'false' }, args: [] }).inpod.origSrc, 'never');
});

test('DNS proxy settings: on by default; ISTIO_META_DNS_CAPTURE other than "true" turns it off; the address and its precedence', () => {
  const d = loadConfig({ env: {} }).dns;
  assert.deepEqual(d, { enabled: true, addr: { host: 'localhost', port: 15053 }, ipv6Enabled: true, preferedServiceNamespace: null, resolvConf: '/etc/resolv.conf' });
  assert.equal(loadConfig({ env: { ISTIO_META_DNS_CAPTURE: 'true' } }).dns.enabled, true);
  for (const off of ['false', 'False', '0', 'no']) assert.equal(loadConfig({ env: { ISTIO_META_DNS_CAPTURE: off } }).dns.enabled, false, off);
  assert.deepEqual(loadConfig({ env: { DNS_PROXY_ADDR: '127.0.0.1:5353' } }).dns.addr, { host: '127.0.0.1', port: 5353 });
  assert.deepEqual(
    loadConfig({ env: { DNS_PROXY_ADDR: '127.0.0.1:5353', ISTIO_META_DNS_PROXY_ADDR: '[::1]:15054' } }).dns.addr,
    { host: '::1', port: 15054 },
    'the proxy metadata wins',
  );
  assert.throws(() => loadConfig({ env: { DNS_PROXY_ADDR: 'nowhere' } }), (e) => e instanceof ConfigError && /DNS_PROXY_ADDR: "nowhere" is not host:port/.test(e.message));
  assert.throws(() => loadConfig({ env: { IPV6_ENABLED: 'maybe' } }), (e) => e instanceof ConfigError && /IPV6_ENABLED/.test(e.message));
  const c = loadConfig({ env: { IPV6_ENABLED: 'false', PREFERED_SERVICE_NAMESPACE: 'prod', DNS_RESOLV_CONF: '/tmp/r.conf' } }).dns;
  assert.deepEqual([c.ipv6Enabled, c.preferedServiceNamespace, c.resolvConf], [false, 'prod', '/tmp/r.conf']);
  assert.equal((configForDump(loadConfig({ env: {} })).ztunnelNode as { dns: { addr: string } }).dns.addr, 'localhost:15053');
});

test('the daemon parses its config in a worker thread with loadConfig\'s answers: the same frozen Config, the same refusals', async () => {
  const { loadConfigOffThread } = await import('../../dist/config/off-thread.js');
  const env = { PROXY_MODE: 'local', NODE_NAME: 'n1', LOCAL_XDS_PATH: '/tmp/x.yaml', LOCAL_CA_DIR: '/tmp/ca', ISTIO_META_FOO: 'bar', XDS_HEADER_X_TEAM: 'a', ZTUNNEL_WORKER_THREADS: '3' };
  const args = ['--log-format', 'json'];
  const inThread = loadConfig({ env, args });
  const offThread = await loadConfigOffThread({ env, args });
  assert.deepEqual(offThread, inThread);
  assert.ok(Object.isFrozen(offThread) && Object.isFrozen(offThread.dns) && Object.isFrozen(offThread.proxyMetadata), 'frozen all the way down');
  assert.equal(offThread.numWorkerThreads, 3);
  assert.equal(offThread.logFormat, 'json');

  const bad = { PROXY_MODE: 'local', POOL_MAX_STREAMS_PER_CONNECTION: 'many' };
  const expected = (() => {
    try {
      loadConfig({ env: bad });
    } catch (err) {
      return err;
    }
    return null;
  })();
  assert.ok(expected instanceof ConfigError);
  await assert.rejects(loadConfigOffThread({ env: bad }), (err) => err instanceof ConfigError && err.message === expected.message);
});
