// Large inputs off the event loop: while a large local config file loads (at startup and on reload) and while a
// large xDS response is applied, the daemon's readiness and metrics servers keep answering. runProxy runs in this
// process against a fake dataplane, so a stalled event loop would stall the probes too: every probe must be
// answered (not refused, not hung), each well within a generous bound. Also: the loader's diff and its messages,
// a bad large file refused with its file/path/field while the last good config keeps serving, and the chunked xDS
// path (one ACK after every chunk applied; removals and renames across chunks keep the one-batch meaning).
import { fakeDataplane as baseDataplane } from '../helpers/fake-dataplane.js';
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfig } from '../../dist/config/index.js';
import { LocalConfigLoader, parseJson } from '../../dist/config/local-loader.js';
import { parseLocalConfig } from '../../dist/config/local.js';
import { LocalConfigError } from '../../dist/errors.js';
import { runProxy } from '../../dist/lifecycle/proxy.js';
import { createLogs } from '../../dist/log/logger.js';
import { STATE_CHUNK_RESOURCES } from '../../dist/state/chunks.js';
import { ADDRESS, AUTHORIZATION, ISTIOD_HOSTNAME, startFakeIstiod, workloadResource } from '../helpers/fake-istiod.js';
import { largeConfigYaml, writeLargeConfig } from '../helpers/large-config.js';
import { get, waitUntil } from '../helpers/local-http.js';

const dir = mkdtempSync(join(tmpdir(), 'ztn-large-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** Large enough that parsing it on the main thread stalled it for seconds (6k workloads: 3 MiB, ~3 s), small enough for CI. */
const WORKLOADS = 6_000;
/** Generous: the CI machine is loaded. A blocked event loop fails it by seconds. */
const PROBE_BOUND_MS = 1_000;

/** The state is a real native dataplane's; `refuse(delta)` makes it refuse a batch holding such a chunk. */
function fakeDataplane({ refuse = () => false } = {}) {
  const dp = baseDataplane({
    applyStateBatches: async (chunks) => {
      const deltas = chunks.map((c) => JSON.parse(Buffer.from(c).toString('utf8')));
      if (deltas.some(refuse)) throw new Error('INVALID_STATE: refused by the test');
      dp.log.push(['applyStateBatches', deltas]);
      return dp.real.applyStateBatches(chunks);
    },
  }, { nodeName: 'node-none' });
  return dp;
}

/**
 * runProxy with a fake dataplane. Resolves once it has started (its local config applied); `onListening` gets the
 * servers' addresses as soon as they listen, while the local config still loads.
 */
async function start(env, dp = fakeDataplane(), onListening = undefined) {
  const lines = [];
  const logs = createLogs({ filter: { level: 'info', targets: {} }, format: 'json', sink: { write: (l) => lines.push(JSON.parse(l)) } });
  const config = loadConfig({
    env: {
      PROXY_MODE: 'local', NODE_NAME: 'node-none', LOCAL_CA_DIR: '/unused',
      ADMIN_ADDR: '127.0.0.1:0', STATS_ADDR: '127.0.0.1:0', READINESS_ADDR: '127.0.0.1:0', CONNECTION_TERMINATION_DEADLINE: '1s',
      ...env,
    },
  });
  const deps = {
    openDataplane: () => dp,
    openLocalCa: () => ({ sign: async () => ({ chainPem: '', rootsPem: '' }) }),
    nativeVersion: () => ({ version: '0', cryptoProvider: 'ring', buildProfile: 'debug' }),
  };
  const proxy = await runProxy(config, logs, { deps, handleSignals: false, onListening });
  return { dp, lines, proxy };
}

/** One GET on a fresh connection: { status, ms } or { error, ms }. */
function probe(port, path) {
  const t0 = performance.now();
  return new Promise((resolve) => {
    const req = request({ host: '127.0.0.1', port, path, agent: false, timeout: 10_000 }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode, ms: performance.now() - t0 }));
    });
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', (err) => resolve({ error: err.code ?? err.message, ms: performance.now() - t0 }));
    req.end();
  });
}

/** Probes readiness and /metrics every 50 ms until `stop()`; resolves every answer. */
function prober(addresses) {
  const answers = [];
  let running = true;
  const loop = (async () => {
    while (running) {
      const [r, m] = await Promise.all([probe(addresses.readiness.port, '/healthz/ready'), probe(addresses.stats.port, '/metrics')]);
      answers.push({ what: 'readiness', ...r }, { what: 'metrics', ...m });
      await new Promise((res) => setTimeout(res, 50));
    }
  })();
  return {
    answers,
    async stop() {
      running = false;
      await loop;
      return answers;
    },
  };
}

function assertResponsive(answers, phase, min = 10) {
  assert.ok(answers.length >= min, `${phase}: at least a few probes ran (${answers.length})`);
  const failed = answers.filter((a) => a.error !== undefined);
  assert.deepEqual(failed, [], `${phase}: every probe was answered (none refused or hung)`);
  const slow = answers.filter((a) => a.ms > PROBE_BOUND_MS);
  assert.deepEqual(slow, [], `${phase}: every probe answered within ${PROBE_BOUND_MS} ms`);
}

test('the loader validates off the main thread, says what an in-thread parse says, and sends only what changed', async () => {
  const path = join(dir, 'loader.yaml');
  writeFileSync(path, largeConfigYaml({ workloads: 30 }));
  const loader = LocalConfigLoader.open({ localXdsPath: path, localXds: null });
  try {
    const first = await loader.load();
    assert.equal(first.source, path);
    assert.deepEqual(first.counts, { workloads: 30, services: 3, policies: 1 });
    const changes = first.chunks.map(parseJson);
    assert.deepEqual(changes.map((c) => Object.keys(c).filter((k) => c[k].length > 0).sort()), [['policies', 'services', 'workloads']]);
    assert.deepEqual(first.policies.upserts.map((p) => p.name), ['p0'], 'the policy part as written, for the main thread');
    assert.equal(parseJson(first.raw).workloads.length, 30);
    loader.commit();

    // Two workloads change and one service goes: the next load carries only that.
    const text = largeConfigYaml({ workloads: 30 }).replace('canonicalRevision: v1', 'canonicalRevision: v2').replace('  name: w29\n', '  name: w29b\n');
    writeFileSync(path, text.replace(/- name: svc2\n( {2}.*\n)+/, ''));
    const second = await loader.load();
    const change = parseJson(second.chunks[0]);
    assert.deepEqual(change.workloads.map((w) => w.name), ['w0', 'w29b']);
    assert.deepEqual(change.removedServices, ['ns2/svc2.ns2.svc.cluster.local']);
    assert.deepEqual(Object.keys(change).sort(), ['removedServices', 'workloads']);
    // Not applied: the next load is diffed against the first one again.
    loader.discard();
    const third = await loader.load();
    assert.deepEqual(parseJson(third.chunks[0]).workloads.map((w) => w.name), ['w0', 'w29b']);

    // A bad document: exactly the in-thread message (file, path, problem).
    writeFileSync(path, largeConfigYaml({ workloads: 30, badAt: 17 }));
    const expected = (() => {
      try {
        parseLocalConfig(largeConfigYaml({ workloads: 30, badAt: 17 }), path);
      } catch (err) {
        return err.message;
      }
      return null;
    })();
    assert.equal(expected, `${path}: workloads[17].workloadIps[0]: "10.0.0.300" is not an IP address`);
    await assert.rejects(loader.load(), (err) => err instanceof LocalConfigError && err.message === expected);
    writeFileSync(path, 'workloads:\n- uid: [unclosed\n');
    await assert.rejects(loader.load(), (err) => err instanceof LocalConfigError && /^.+: line \d+, column \d+: invalid YAML: /.test(err.message));
  } finally {
    await loader.close();
  }
  await assert.rejects(loader.load(), /closed/);
});

test('a large local file: readiness and metrics answer while it loads at startup and while it reloads; a bad one is refused and the last good one keeps serving', async () => {
  const path = join(dir, 'large.yaml');
  const bytes = writeLargeConfig(path, { workloads: WORKLOADS });
  const t0 = performance.now();
  // The servers listen while the worker still validates the file: probing starts then.
  let p;
  const { dp, lines, proxy } = await start({ LOCAL_XDS_PATH: path }, undefined, (addresses) => (p = prober(addresses)));
  try {
    await waitUntil(async () => (await get(proxy.addresses.readiness, '/healthz/ready')).status === 200, 'ready', 120_000);
    const loadMs = performance.now() - t0;
    let answers = await p.stop();
    assertResponsive(answers, 'startup');
    assert.ok(answers.some((a) => a.what === 'readiness' && a.status === 500), 'readiness answered "not ready" while loading');
    const batches = dp.log.filter(([op]) => op === 'applyStateBatches').map(([, d]) => d);
    assert.equal(batches.length, 1, 'one batch, applied off the JS thread');
    assert.ok(batches[0].length >= Math.ceil(WORKLOADS / STATE_CHUNK_RESOURCES), `carried in chunks (${batches[0].length})`);
    assert.equal(batches[0].reduce((n, d) => n + (d.workloads?.length ?? 0), 0), WORKLOADS);
    assert.equal(dp.meshDump().workloads.length, WORKLOADS);
    assert.ok(lines.some((l) => l.message === 'local config applied' && l.workloads === WORKLOADS));
    assert.ok(!lines.some((l) => /not known/.test(l.message)), 'no policy was transiently missing (policies go first)');
    const slowest = Math.max(...answers.map((a) => a.ms));
    console.log(`# startup: ${(bytes / 2 ** 20).toFixed(1)} MiB, ready after ${Math.round(loadMs)} ms, ${answers.length} probes, slowest ${Math.round(slowest)} ms`);

    // A reload that changes every workload.
    const before = dp.log.length;
    p = prober(proxy.addresses);
    await new Promise((r) => setTimeout(r, 300));
    writeLargeConfig(path, { workloads: WORKLOADS, revision: 'v2' });
    await waitUntil(() => lines.some((l) => l.message === 'local config reloaded'), 'the reload', 120_000);
    answers = await p.stop();
    assertResponsive(answers, 'reload');
    const reloaded = dp.log.slice(before).filter(([op]) => op === 'applyStateBatches').map(([, d]) => d);
    assert.equal(reloaded.length, 1);
    assert.ok(reloaded[0].every((d) => (d.workloads ?? []).every((w) => w.canonicalRevision === 'v2')));
    assert.ok(dp.meshDump().workloads.every((w) => w.canonicalRevision === 'v2'));
    console.log(`# reload: ${answers.length} probes, slowest ${Math.round(Math.max(...answers.map((a) => a.ms)))} ms`);

    // A bad large file (the error is near its end): refused whole, with file, path and field; nothing applied.
    const beforeBad = dp.log.length;
    p = prober(proxy.addresses);
    await new Promise((r) => setTimeout(r, 300));
    writeLargeConfig(path, { workloads: WORKLOADS, revision: 'v3', badAt: WORKLOADS - 7 });
    const refused = await waitUntil(() => lines.some((l) => /local config is invalid/.test(l.message)), 'the refusal', 120_000).then(() =>
      lines.find((l) => /local config is invalid/.test(l.message)),
    );
    answers = await p.stop();
    assertResponsive(answers, 'bad reload');
    assert.equal(refused.err, `${path}: workloads[${WORKLOADS - 7}].workloadIps[0]: "10.0.0.300" is not an IP address`);
    assert.deepEqual(dp.log.slice(beforeBad).filter(([op]) => op.startsWith('apply')), [], 'nothing of the bad file reached the dataplane');
    const ready = await get(proxy.addresses.readiness, '/healthz/ready');
    assert.equal(ready.status, 200);
    const dump = JSON.parse((await get(proxy.addresses.admin, '/config_dump')).body);
    assert.equal(dump.workloads.length, WORKLOADS);
    assert.ok(dump.workloads.every((w) => w.canonicalRevision === 'v2'), 'the last good config keeps serving');
    assert.equal(dump.staticConfig.workloads[0].canonicalRevision, 'v2', 'staticConfig is the file last applied');
  } finally {
    await proxy.shutdown('immediate', 'test');
  }
});

test('a bad large file at startup: a config error naming the file, path and field; nothing created', async () => {
  const path = join(dir, 'bad-start.yaml');
  writeLargeConfig(path, { workloads: 3_000, badAt: 2_999 });
  const dp = fakeDataplane();
  const opened = [];
  const logs = createLogs({ filter: { level: 'off', targets: {} }, format: 'json', sink: { write: () => {} } });
  const config = loadConfig({
    env: {
      PROXY_MODE: 'local', NODE_NAME: 'n', LOCAL_CA_DIR: '/unused', LOCAL_XDS_PATH: path,
      ADMIN_ADDR: '127.0.0.1:0', STATS_ADDR: '127.0.0.1:0', READINESS_ADDR: '127.0.0.1:0',
    },
  });
  const deps = {
    openDataplane: () => (opened.push('dataplane'), dp),
    openLocalCa: () => (opened.push('ca'), { sign: async () => ({}) }),
    nativeVersion: () => ({ version: '0', cryptoProvider: 'ring', buildProfile: 'debug' }),
  };
  await assert.rejects(runProxy(config, logs, { deps, handleSignals: false }), (err) => {
    assert.ok(err instanceof LocalConfigError);
    assert.equal(err.message, `${path}: workloads[2999].workloadIps[0]: "10.0.0.300" is not an IP address`);
    return true;
  });
  assert.deepEqual(opened, []);
  assert.deepEqual(dp.log, []);
  dp.shutdown();
});

test('a dataplane refusal of one chunk of a reload leaves nothing of the reload applied', async () => {
  const path = join(dir, 'rollback.yaml');
  const n = 2 * STATE_CHUNK_RESOURCES; // with its services and policies: three chunks, the refused one last (validated before any applies)
  writeLargeConfig(path, { workloads: n });
  let refuseV2 = false;
  const dp = fakeDataplane({ refuse: (d) => refuseV2 && (d.workloads ?? []).some((w) => w.uid === `Kubernetes//Pod/ns${(n - 1) % 50}/w${n - 1}` && w.canonicalRevision === 'v2') });
  const { lines, proxy } = await start({ LOCAL_XDS_PATH: path }, dp);
  try {
    await waitUntil(async () => (await get(proxy.addresses.readiness, '/healthz/ready')).status === 200, 'ready', 60_000);
    refuseV2 = true;
    writeLargeConfig(path, { workloads: n, revision: 'v2' });
    await waitUntil(() => lines.some((l) => /rejected by the dataplane/.test(l.message)), 'the refusal', 60_000);
    const dump = JSON.parse((await get(proxy.addresses.admin, '/config_dump')).body);
    assert.ok(dump.workloads.every((w) => w.canonicalRevision === 'v1'), 'every workload is back to the last good config');
    assert.equal(dump.staticConfig.workloads[0].canonicalRevision, 'v1');
    // The next good file is diffed against what is applied (the last good config), and applies.
    refuseV2 = false;
    writeLargeConfig(path, { workloads: n, revision: 'v3' });
    await waitUntil(() => lines.some((l) => l.message === 'local config reloaded'), 'the reload', 60_000);
    const dump2 = JSON.parse((await get(proxy.addresses.admin, '/config_dump')).body);
    assert.ok(dump2.workloads.every((w) => w.canonicalRevision === 'v3'));
  } finally {
    await proxy.shutdown('immediate', 'test');
  }
});

test('a large xDS push crosses in one call, is ACKed once, in order with the next response; the servers answer meanwhile', async () => {
  const istiod = await startFakeIstiod({ dir: mkdtempSync(join(dir, 'istiod-')) });
  const n = 16 * STATE_CHUNK_RESOURCES;
  const { dp, proxy } = await start({ XDS_ADDRESS: istiod.address, XDS_ROOT_CA: istiod.rootCaPath, ALT_XDS_HOSTNAME: ISTIOD_HOSTNAME });
  try {
    const s = await istiod.nextStream();
    await s.nextRequest(ADDRESS);
    await s.nextRequest(AUTHORIZATION);
    const ip = (i) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
    const resources = Array.from({ length: n }, (_, i) => workloadResource({ name: `w${i}`, ip: ip(i), node: 'elsewhere' }));
    // The response also removes a key that it upserts (in its last chunk): as within one batch, the upsert wins.
    const p = prober(proxy.addresses);
    const first = s.push(ADDRESS, { resources, removed: [`Kubernetes//Pod/default/w${n - 1}`] });
    const second = s.push(ADDRESS, { resources: [workloadResource({ name: 'w3', ip: '10.200.0.3', node: 'elsewhere', version: 'v2' })] });
    const ack1 = await s.nextRequest(ADDRESS, 120_000);
    const ack2 = await s.nextRequest(ADDRESS, 60_000);
    const answers = await p.stop();
    assert.deepEqual([ack1.responseNonce, ack1.errorDetail], [first, undefined]);
    assert.deepEqual([ack2.responseNonce, ack2.errorDetail], [second, undefined]);
    assertResponsive(answers, 'xDS push', 4);
    // Each response is one call, still encoded; the second applies after the first.
    assert.deepEqual(dp.log.filter(([op]) => op === 'applyAddresses').map(([, x]) => x), [
      { resources: n, removed: [`Kubernetes//Pod/default/w${n - 1}`] },
      { resources: 1, removed: [] },
    ]);
    assert.deepEqual(dp.meshDump().workloads.find((w) => w.uid === 'Kubernetes//Pod/default/w3').workloadIps, ['10.200.0.3'], 'the second response applied last');
    const dump = JSON.parse((await get(proxy.addresses.admin, '/config_dump')).body);
    assert.equal(dump.workloads.length, n, 'the removal of a key the same response upserts did not win');
  } finally {
    await proxy.shutdown('immediate', 'test');
    await istiod.close();
  }
});

test('splitChange: the one-batch meaning in reference order; PolicyReferences follows chunks without full scans', async () => {
  const { splitChange } = await import('../../dist/state/chunks.js');
  const { PolicyReferences } = await import('../../dist/policy/references.js');
  const w = (uid, v = 'a') => ({ uid, canonicalRevision: v, authorizationPolicies: [] });
  const chunks = splitChange(
    {
      workloads: [w('u1'), w('u2'), w('u1', 'b')],
      removedWorkloads: ['u2', 'u3'],
      services: [{ namespace: 'n', hostname: 'h' }],
      policies: [{ namespace: 'n', name: 'p' }],
      removedPolicies: ['n/q'],
    },
    2,
  );
  assert.deepEqual(chunks, [
    { policies: [{ namespace: 'n', name: 'p' }], services: [{ namespace: 'n', hostname: 'h' }] },
    { workloads: [w('u1', 'b'), w('u2')] },
    { removedWorkloads: ['u3'], removedPolicies: ['n/q'] },
  ]);
  assert.deepEqual(splitChange({}), [{}], 'an empty change is still one apply');

  const known = new Set();
  const refs = new PolicyReferences((k) => known.has(k));
  const names = (uid, ...p) => ({ uid, after: { authorizationPolicies: p } });
  assert.deepEqual(refs.update([names('a', 'n/p'), names('b', 'n/p', 'n/r')], []), [
    { uid: 'a', policy: 'n/p' },
    { uid: 'b', policy: 'n/p' },
    { uid: 'b', policy: 'n/r' },
  ]);
  assert.deepEqual(refs.update([names('a', 'n/p')], []), [], 'still missing: not reported again');
  known.add('n/p');
  assert.deepEqual(refs.update([], ['n/p']), []);
  assert.equal(refs.size, 1, 'only b -> n/r is left');
  known.delete('n/p');
  const again = refs.update([], ['n/p']).sort((x, y) => (x.uid < y.uid ? -1 : 1));
  assert.deepEqual(again, [{ uid: 'a', policy: 'n/p' }, { uid: 'b', policy: 'n/p' }], 'missing again once removed');
  assert.deepEqual(refs.update([{ uid: 'b', after: undefined }], []), []);
  assert.equal(refs.size, 1, 'a removed workload names nothing');
});
