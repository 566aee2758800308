// A bad configuration stops `ztunnel-node proxy` before it binds or creates anything, with a non-zero exit code
// and one stderr message that says where the problem is: the file and the path inside it, or the variable.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { makeTempDir, removeTempDir, runCli, workload, writeLocalConfig } from '../helpers/daemon.js';
import { BLOCKS, block } from '../helpers/net.js';

const net = block(BLOCKS['config-errors']);
const dir = makeTempDir('ztn-config-errors-');
after(() => removeTempDir(dir));

const GOOD = workload({ name: 'sleep', ip: net.workload(1), node: 'node-a' });

function env(extra: Record<string, string>) {
  const caDir = join(dir, `ca-${Math.random().toString(36).slice(2)}`);
  return {
    caDir,
    env: {
      PROXY_MODE: 'local',
      NODE_NAME: 'node-a',
      LOCAL_CA_DIR: caDir,
      ADMIN_ADDR: `${net.admin(1)}:15000`,
      STATS_ADDR: `${net.admin(1)}:15020`,
      READINESS_ADDR: `${net.admin(1)}:15021`,
      ...extra,
    },
  };
}

/** Runs the proxy and asserts the operator-facing outcome of a configuration error. */
async function assertConfigError(extraEnv: Record<string, string>, ...mustName: string[]) {
  const { caDir, env: fullEnv } = env(extraEnv);
  const r = await runCli(['proxy'], { env: fullEnv, timeoutMs: 20_000 });
  assert.equal(r.signal, null, `killed by ${r.signal}: it did not exit on its own\n${r.stderr}`);
  assert.notEqual(r.code, 0, 'a configuration error must not exit 0');
  assert.equal(r.code, 2, `exit code 2 is the configuration error code\n${r.stderr}`);
  for (const s of mustName) assert.ok(r.stderr.includes(s), `stderr names ${JSON.stringify(s)}:\n${r.stderr}`);
  assert.doesNotMatch(r.stderr, /\n\s+at /, 'a message, not a stack trace');
  assert.equal(existsSync(caDir), false, 'nothing was created (the built-in CA directory) before the config was checked');
  return r;
}

test('(a) an unknown field in the local config names the file and the field path', async () => {
  const path = writeLocalConfig(dir, { workloads: [GOOD, { ...workload({ name: 'echo', ip: net.workload(2), node: 'node-b' }), colour: 'blue' }] }, 'unknown-field.yaml');
  await assertConfigError({ LOCAL_XDS_PATH: path }, path, 'workloads[1].colour', 'unknown field');
});

test('(b) a bad IP names the file and the field path', async () => {
  const path = writeLocalConfig(dir, { workloads: [{ ...GOOD, workloadIps: ['127.14.1.300'] }] }, 'bad-ip.yaml');
  await assertConfigError({ LOCAL_XDS_PATH: path }, path, 'workloads[0].workloadIps[0]', '127.14.1.300');
});

test('(c) a missing file is named', async () => {
  const path = join(dir, 'does-not-exist.yaml');
  await assertConfigError({ LOCAL_XDS_PATH: path }, path);
});

test('(d) a YAML syntax error names the file', async () => {
  const path = writeLocalConfig(dir, 'workloads:\n- uid: [unclosed\n', 'syntax.yaml');
  const r = await assertConfigError({ LOCAL_XDS_PATH: path }, path, 'invalid YAML');
  assert.match(r.stderr, /line \d+, column \d+/, 'and where in it');
});

test('an unparseable environment variable value names the variable and the value', async () => {
  const path = writeLocalConfig(dir, { workloads: [GOOD] }, 'good.yaml');
  await assertConfigError({ LOCAL_XDS_PATH: path, POOL_MAX_STREAMS_PER_CONNECTION: 'abc' }, 'POOL_MAX_STREAMS_PER_CONNECTION', '"abc"');
  await assertConfigError({ LOCAL_XDS_PATH: path, CONNECTION_TERMINATION_DEADLINE: 'soon' }, 'CONNECTION_TERMINATION_DEADLINE', '"soon"');
});

test('(e) what the dataplane would refuse is a configuration error naming the variable, before anything starts', async () => {
  const frame = await assertConfigError({ HTTP2_FRAME_SIZE: '1000' }, 'HTTP2_FRAME_SIZE', '16384');
  assert.doesNotMatch(frame.stderr, /http2\.frameSize/, 'not the dataplane\'s internal field name');
  const threads = await assertConfigError({ ZTUNNEL_WORKER_THREADS: '5000' }, 'ZTUNNEL_WORKER_THREADS', 'at most 1024');
  assert.doesNotMatch(threads.stderr, /workerThreads/);
});

test('(f) a setting of Istio\'s ztunnel that ztunnel-node does not implement is refused by name at start, exit 2', async () => {
  // A FIPS requirement must not quietly get the default crypto build, nor on-demand xDS be assumed.
  await assertConfigError({ COMPLIANCE_POLICY: 'fips-140-3' }, 'COMPLIANCE_POLICY', 'fips-140-2');
  // fips-140-2 on a build without the validated module: refused by name, before anything is bound.
  if (!(await import('../../dist/native/index.js')).nativeVersion().cryptoProvider.endsWith('-fips')) {
    await assertConfigError({ COMPLIANCE_POLICY: 'fips-140-2' }, 'COMPLIANCE_POLICY=fips-140-2', 'FIPS build');
  }
  await assertConfigError({ TRANSPARENT_NETWORK_POLICIES: 'true', XDS_ON_DEMAND: 'true' }, 'TRANSPARENT_NETWORK_POLICIES=true', 'XDS_ON_DEMAND=true');
  // FAKE_CA names no CA; one named beside it would be ignored, so the pair is refused.
  await assertConfigError({ FAKE_CA: 'true', CA_ADDRESS: 'https://istiod:15012' }, 'CA_ADDRESS', 'FAKE_CA=true');
});
