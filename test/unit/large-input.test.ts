// Large inputs off the event loop: while a large local config file loads (at startup and on reload) and while a
// large xDS response is applied, the daemon's readiness and metrics servers keep answering. runProxy runs in this
// process against a fake dataplane, so a stalled event loop would stall the probes too: every probe must be
// answered (not refused, not hung), each well within a generous bound. Also: the loader's messages (the dataplane diffs each document),
// a bad large file refused with its file/path/field while the last good config keeps serving, and the chunked xDS
// path (one ACK after every chunk applied; removals and renames across chunks keep the one-batch meaning).
import { fakeDataplane as baseDataplane } from '../helpers/fake-dataplane.js';
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfig } from '../../dist/config/index.js';
import { LocalConfigLoader } from '../../dist/config/local-loader.js';
import { openNativeDataplane } from '../helpers/native-dataplane.js';
import { parseLocalConfig } from '../../dist/config/local.js';
import { LocalConfigError, ZtunnelError } from '../../dist/errors.js';
import { runProxy } from '../../dist/lifecycle/proxy.js';
import { createLogs } from '../../dist/log/logger.js';
import { STATE_CHUNK_RESOURCES } from '../../dist/state/chunks.js';
import { ADDRESS, AUTHORIZATION, ISTIOD_HOSTNAME, startFakeIstiod, workloadResource } from '../helpers/fake-istiod.js';
import { largeConfigYaml, writeLargeConfig } from '../helpers/large-config.js';
import { get, waitUntil } from '../helpers/local-http.js';
import type { ServerAddresses } from '../../dist/lifecycle/servers.js';
import type { ProxyDeps } from '../../dist/lifecycle/proxy.js';
import type { SignedCertificate } from '../../dist/ca/authority.js';
import type { FakeDataplane } from '../helpers/fake-dataplane.js';
import type { StateChange } from '../../dist/state/store.js';
import type { AppliedOut, NativeVersion, Workload } from '../../dist/native/types.js';

/** One JSON log line. */
interface LogLine {
  message: string;
  [key: string]: unknown;
}

/** A probe's answer: its status, or the error that ended it; how long it took. */
interface ProbeAnswer {
  status?: number;
  error?: string;
  ms: number;
}

/** What this file's fake dataplane records of a local document it applies. */
interface AppliedLocal {
  ticket: number;
  policies: { policies?: unknown[] }[];
}

/** The parts of /config_dump read here. */
interface Dump {
  workloads: { canonicalRevision: string }[];
  staticConfig: { workloads: { canonicalRevision: string }[] };
}

const dir = mkdtempSync(join(tmpdir(), 'ztn-large-'));
/** A chunk as it crosses: UTF-8 JSON bytes. */
const parseJson = (bytes: Uint8Array): unknown => JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('utf8'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** Large enough that parsing it on the main thread stalled it for seconds (6k workloads: 3 MiB, ~3 s), small enough for CI. */
const WORKLOADS = 6_000;
/** Generous: the CI machine is loaded. A blocked event loop fails it by seconds. */
const PROBE_BOUND_MS = 1_000;

/** The state is a real native dataplane's; `refuse()` true makes it refuse a local document (nothing applied). */
function fakeDataplane({ refuse = () => false }: { refuse?: () => boolean } = {}): FakeDataplane {
  const dp: FakeDataplane = baseDataplane({
    applyLocal: async (ticket, chunks) => {
      if (refuse()) throw new Error('INVALID_STATE: refused by the test');
      dp.log.push(['applyLocal', { ticket, policies: chunks.map(parseJson) }]);
      return dp.real.applyLocal(ticket, chunks);
    },
  }, { nodeName: 'node-none' });
  return dp;
}

/**
 * runProxy with a fake dataplane. Resolves once it has started (its local config applied); `onListening` gets the
 * servers' addresses as soon as they listen, while the local config still loads.
 */
async function start(
  env: Record<string, string>, dp = fakeDataplane(), onListening: ((addresses: ServerAddresses) => void) | undefined = undefined,
) {
  const lines: LogLine[] = [];
  const logs = createLogs({ filter: { level: 'info', targets: {} }, format: 'json', sink: { write: (l) => lines.push(JSON.parse(l)) } });
  const config = loadConfig({
    env: {
      PROXY_MODE: 'local', NODE_NAME: 'node-none', LOCAL_CA_DIR: '/unused',
      ADMIN_ADDR: '127.0.0.1:0', STATS_ADDR: '127.0.0.1:0', READINESS_ADDR: '127.0.0.1:0', CONNECTION_TERMINATION_DEADLINE: '1s',
      ...env,
    },
  });
  const deps: Partial<ProxyDeps> = {
    openDataplane: () => dp,
    openLocalCa: () => ({ sign: async () => ({ chainPem: '', rootsPem: '' }) }),
    nativeVersion: () => ({ version: '0', cryptoProvider: 'ring', buildProfile: 'debug' }) as NativeVersion, // no rustVersion: not read here
  };
  const proxy = await runProxy(config, logs, { deps, handleSignals: false, onListening });
  return { dp, lines, proxy };
}

/** One GET on a fresh connection: { status, ms } or { error, ms }. */
function probe(port: number, path: string): Promise<ProbeAnswer> {
  const t0 = performance.now();
  return new Promise((resolve) => {
    const req = request({ host: '127.0.0.1', port, path, agent: false, timeout: 10_000 }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode, ms: performance.now() - t0 }));
    });
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', (err: NodeJS.ErrnoException) => resolve({ error: err.code ?? err.message, ms: performance.now() - t0 }));
    req.end();
  });
}

/** Probes readiness and /metrics every 50 ms until `stop()`; resolves every answer. `answered`: the first pair is in. */
function prober(addresses: ServerAddresses) {
  const answers: (ProbeAnswer & { what: string })[] = [];
  let running = true;
  let firstAnswers: (() => void) | undefined;
  const answered = new Promise<void>((r) => (firstAnswers = r));
  const loop = (async () => {
    while (running) {
      const [r, m] = await Promise.all([probe(addresses.readiness.port, '/healthz/ready'), probe(addresses.stats.port, '/metrics')]);
      answers.push({ what: 'readiness', ...r }, { what: 'metrics', ...m });
      firstAnswers!();
      await new Promise((res) => setTimeout(res, 50));
    }
  })();
  return {
    answers,
    answered,
    async stop() {
      running = false;
      await loop;
      return answers;
    },
  };
}

function assertResponsive(answers: ProbeAnswer[], phase: string, min = 10) {
  assert.ok(answers.length >= min, `${phase}: at least a few probes ran (${answers.length})`);
  const failed = answers.filter((a) => a.error !== undefined);
  assert.deepEqual(failed, [], `${phase}: every probe was answered (none refused or hung)`);
  const slow = answers.filter((a) => a.ms > PROBE_BOUND_MS);
  assert.deepEqual(slow, [], `${phase}: every probe answered within ${PROBE_BOUND_MS} ms`);
}

test('the loader validates off the main thread, says what an in-thread parse says, and the dataplane applies only what changed', async () => {
  const path = join(dir, 'loader.yaml');
  writeFileSync(path, largeConfigYaml({ workloads: 30 }));
  const loader = LocalConfigLoader.open({ localXdsPath: path, localXds: null })!;
  const dp = openNativeDataplane({ nodeName: 'node-none' });
  try {
    const first = await loader.load();
    assert.equal(first.source, path);
    assert.deepEqual(first.counts, { workloads: 30, services: 3, policies: 1 });
    assert.deepEqual(first.chunks.map(parseJson), [{ policies: [{
      name: 'p0', namespace: 'ns0', scope: 'WorkloadSelector', action: 'Allow', dryRun: false,
      rules: [[[{ principals: [{ prefix: 'cluster.local/ns/ns0/' }] }, { sourceIps: ['10.0.0.0/8'] }], [{ destinationPorts: [8080] }]]],
    }] }], 'only compiled policies cross');
    let out = await dp.applyLocal(first.ticket, first.chunks);
    assert.deepEqual([out.changedWorkloads, out.services, out.policies], [30, 3, 1]);
    assert.deepEqual(dp.localDump().policies.map((p) => p.name), ['p0'], 'staticConfig: the policies the document put in the state');
    loader.commit();

    // Two workloads change and one service goes: the dataplane applies only that (it diffs against what it holds).
    const text = largeConfigYaml({ workloads: 30 }).replace('canonicalRevision: v1', 'canonicalRevision: v2').replace('  name: w29\n', '  name: w29b\n');
    writeFileSync(path, text.replace(/- name: svc2\n( {2}.*\n)+/, ''));
    const second = await loader.load();
    assert.equal(second.chunks.length, 1, 'every policy of the document crosses: the dataplane drops what it holds');
    // Not applied: its document is dropped, and the next load is diffed against the first one again.
    loader.discard();
    await assert.rejects(dp.applyLocal(second.ticket, []), /no local config document is held/);
    const third = await loader.load();
    out = await dp.applyLocal(third.ticket, third.chunks);
    assert.deepEqual([out.changedWorkloads, out.services, out.policies, out.counts], [2, 1, 0, [30, 2, 1]], 'the unchanged policy changed nothing');
    const names = dp.meshDump().workloads.map((w) => w.name);
    assert.ok(names.includes('w29b') && !names.includes('w29'));
    loader.commit();

    // The dataplane keeps the document's policy keys too: one the next document lacks is removed.
    writeFileSync(path, largeConfigYaml({ workloads: 30, policies: 2 }));
    const withTwo = await loader.load();
    out = await dp.applyLocal(withTwo.ticket, withTwo.chunks);
    assert.equal(out.policies, 1, 'p1 added, p0 unchanged');
    loader.commit();
    writeFileSync(path, largeConfigYaml({ workloads: 30 }));
    const back = await loader.load();
    out = await dp.applyLocal(back.ticket, back.chunks);
    assert.deepEqual([out.policies, out.counts[2]], [1, 1], 'p1 removed');
    assert.deepEqual(dp.localDump().policies.map((p) => p.name), ['p0']);
    loader.commit();

    // A refused policy chunk: all or nothing, the held document is dropped with it.
    const fourth = await loader.load();
    await assert.rejects(dp.applyLocal(fourth.ticket, [new TextEncoder().encode('{"policies":[{"bad":1}]}')]), /INVALID_STATE|unknown field/);
    await assert.rejects(dp.applyLocal(fourth.ticket, []), /no local config document is held/);
    assert.equal(dp.meshDump().workloads.length, 30);
    loader.discard();

    // A bad document: exactly the in-thread message (file, path, problem).
    writeFileSync(path, largeConfigYaml({ workloads: 30, badAt: 17 }));
    const expected = (() => {
      try {
        parseLocalConfig(largeConfigYaml({ workloads: 30, badAt: 17 }), path);
      } catch (err) {
        return (err as Error).message;
      }
      return null;
    })();
    assert.equal(expected, `${path}: workloads[17].workloadIps[0]: "10.0.0.300" is not an IP address`);
    await assert.rejects(loader.load(), (err) => err instanceof LocalConfigError && err.message === expected);
    writeFileSync(path, 'workloads:\n- uid: [unclosed\n');
    await assert.rejects(loader.load(), (err) => err instanceof LocalConfigError && /^.+: line \d+, column \d+: invalid YAML: /.test(err.message));
  } finally {
    await loader.close();
    dp.shutdown();
  }
  await assert.rejects(loader.load(), /closed/);
});

test('the first load made with the config\'s parse (one worker for both) is the first load\'s answer; reloads start their own worker', async () => {
  const { startupOffThread } = await import('../../dist/config/off-thread.js');
  const path = join(dir, 'startup.yaml');
  writeFileSync(path, largeConfigYaml({ workloads: 12 }));
  const env = { PROXY_MODE: 'local', NODE_NAME: 'node-none', LOCAL_XDS_PATH: path, LOCAL_CA_DIR: join(dir, 'ca') };
  const { config, firstLocalLoad: first } = await startupOffThread({ env });
  assert.equal(config.localXdsPath, path);
  const firstLocalLoad = first!.answer;
  assert.equal(firstLocalLoad.op, 'loaded', JSON.stringify(firstLocalLoad));
  assert.deepEqual(firstLocalLoad.counts, { workloads: 12, services: 1, policies: 1 });
  const st = statSync(path);
  assert.deepEqual(first!.file, { mtimeMs: st.mtimeMs, size: st.size, ino: st.ino }, 'the file as read: the watch starts from it');
  const loader = LocalConfigLoader.open(config, firstLocalLoad)!;
  const dp = openNativeDataplane({ nodeName: 'node-none' });
  try {
    const first = await loader.load();
    assert.equal(first.ticket, firstLocalLoad.ticket, 'the prefetched answer, not a new load');
    let out = await dp.applyLocal(first.ticket, first.chunks);
    assert.deepEqual([out.changedWorkloads, out.services, out.policies], [12, 1, 1]);
    loader.commit();
    // A reload: a worker of its own; the dataplane diffs it against the first (its policy is unchanged).
    writeFileSync(path, largeConfigYaml({ workloads: 12 }).replace('  name: w11\n', '  name: w11b\n'));
    const second = await loader.load();
    assert.notEqual(second.ticket, first.ticket);
    out = await dp.applyLocal(second.ticket, second.chunks);
    assert.deepEqual([out.changedWorkloads, out.policies, out.counts], [1, 0, [12, 1, 1]]);
    loader.commit();
  } finally {
    await loader.close();
    dp.shutdown();
  }

  // Refused at the first load: the first load's answer is the refusal, with the file, path and problem.
  writeFileSync(path, largeConfigYaml({ workloads: 12, badAt: 3 }));
  const refused = await startupOffThread({ env });
  assert.equal(refused.firstLocalLoad!.answer.op, 'invalid');
  const again = LocalConfigLoader.open(refused.config, refused.firstLocalLoad!.answer)!;
  await assert.rejects(again.load(), (err) => err instanceof LocalConfigError && err.message === `${path}: workloads[3].workloadIps[0]: "10.0.0.300" is not an IP address`);
  await again.close();

  // A bad variable: the config's refusal, as loadConfig words it; no local load is made.
  await assert.rejects(startupOffThread({ env: { ...env, POOL_MAX_STREAMS_PER_CONNECTION: 'many' } }), (err) => err instanceof ZtunnelError && err.code === 'CONFIG_INVALID' && /POOL_MAX_STREAMS_PER_CONNECTION/.test(err.message));
});

test('a large local file: readiness and metrics answer while it loads at startup and while it reloads; a bad one is refused and the last good one keeps serving', async () => {
  const path = join(dir, 'large.yaml');
  const bytes = writeLargeConfig(path, { workloads: WORKLOADS });
  const t0 = performance.now();
  // The servers listen while the worker still validates the file: probing starts then.
  let p: ReturnType<typeof prober> | undefined;
  const { dp, lines, proxy } = await start({ LOCAL_XDS_PATH: path }, undefined, (addresses) => (p = prober(addresses)));
  try {
    await waitUntil(async () => (await get(proxy.addresses.readiness, '/healthz/ready')).status === 200, 'ready', 120_000);
    const loadMs = performance.now() - t0;
    let answers = await p!.stop();
    assertResponsive(answers, 'startup');
    assert.ok(answers.some((a) => a.what === 'readiness' && a.status === 500), 'readiness answered "not ready" while loading');
    const batches = dp.log.filter(([op]) => op === 'applyLocal').map(([, d]) => d as AppliedLocal);
    assert.equal(batches.length, 1, 'one document, applied off the JS thread');
    assert.equal(batches[0].policies.reduce((n, d) => n + (d.policies?.length ?? 0), 0), WORKLOADS / 100, 'the compiled policies cross with it');
    assert.equal(dp.meshDump().workloads.length, WORKLOADS);
    assert.ok(lines.some((l) => l.message === 'local config applied' && l.workloads === WORKLOADS), 'applied, counted');
    assert.ok(!lines.some((l) => /not known/.test(l.message)), 'no policy was transiently missing (policies go first)');
    const slowest = Math.max(...answers.map((a) => a.ms));
    console.log(`# startup: ${(bytes / 2 ** 20).toFixed(1)} MiB, ready after ${Math.round(loadMs)} ms, ${answers.length} probes, slowest ${Math.round(slowest)} ms`);

    // A reload that changes every workload.
    const before = dp.log.length;
    p = prober(proxy.addresses);
    await p.answered; // probing from before the file changes
    writeLargeConfig(path, { workloads: WORKLOADS, revision: 'v2' });
    await waitUntil(() => lines.some((l) => l.message === 'local config reloaded'), 'the reload', 120_000);
    answers = await p.stop();
    assertResponsive(answers, 'reload');
    const reloaded = dp.log.slice(before).filter(([op]) => op === 'applyLocal');
    assert.equal(reloaded.length, 1);
    assert.ok(lines.some((l) => l.message === 'local config reloaded' && l.workloads === WORKLOADS), 'every workload changed');
    assert.ok(dp.meshDump().workloads.every((w) => w.canonicalRevision === 'v2'));
    console.log(`# reload: ${answers.length} probes, slowest ${Math.round(Math.max(...answers.map((a) => a.ms)))} ms`);

    // A bad large file (the error is near its end): refused whole, with file, path and field; nothing applied.
    const beforeBad = dp.log.length;
    p = prober(proxy.addresses);
    await p.answered;
    writeLargeConfig(path, { workloads: WORKLOADS, revision: 'v3', badAt: WORKLOADS - 7 });
    const refused = await waitUntil(() => lines.some((l) => /local config is invalid/.test(l.message)), 'the refusal', 120_000).then(() =>
      lines.find((l) => /local config is invalid/.test(l.message)),
    );
    answers = await p.stop();
    assertResponsive(answers, 'bad reload');
    assert.equal(refused!.err, `${path}: workloads[${WORKLOADS - 7}].workloadIps[0]: "10.0.0.300" is not an IP address`);
    assert.deepEqual(dp.log.slice(beforeBad).filter(([op]) => op.startsWith('apply')), [], 'nothing of the bad file reached the dataplane');
    const ready = await get(proxy.addresses.readiness, '/healthz/ready');
    assert.equal(ready.status, 200);
    const dump = JSON.parse((await get(proxy.addresses.admin, '/config_dump')).body) as Dump;
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
  const opened: string[] = [];
  const logs = createLogs({ filter: { level: 'off', targets: {} }, format: 'json', sink: { write: () => {} } });
  const config = loadConfig({
    env: {
      PROXY_MODE: 'local', NODE_NAME: 'n', LOCAL_CA_DIR: '/unused', LOCAL_XDS_PATH: path,
      ADMIN_ADDR: '127.0.0.1:0', STATS_ADDR: '127.0.0.1:0', READINESS_ADDR: '127.0.0.1:0',
    },
  });
  const deps: Partial<ProxyDeps> = {
    openDataplane: () => (opened.push('dataplane'), dp),
    openLocalCa: () => (opened.push('ca'), { sign: async () => ({}) as SignedCertificate }), // never reached: the start fails first
    nativeVersion: () => ({ version: '0', cryptoProvider: 'ring', buildProfile: 'debug' }) as NativeVersion, // no rustVersion: not read here
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

test('a dataplane refusal of a reload leaves nothing of the reload applied', async () => {
  const path = join(dir, 'rollback.yaml');
  const n = 2 * STATE_CHUNK_RESOURCES;
  writeLargeConfig(path, { workloads: n });
  let refuseV2 = false;
  const dp = fakeDataplane({ refuse: () => refuseV2 });
  const { lines, proxy } = await start({ LOCAL_XDS_PATH: path }, dp);
  try {
    await waitUntil(async () => (await get(proxy.addresses.readiness, '/healthz/ready')).status === 200, 'ready', 60_000);
    refuseV2 = true;
    writeLargeConfig(path, { workloads: n, revision: 'v2' });
    await waitUntil(() => lines.some((l) => /rejected by the dataplane/.test(l.message)), 'the refusal', 60_000);
    const dump = JSON.parse((await get(proxy.addresses.admin, '/config_dump')).body) as Dump;
    assert.ok(dump.workloads.every((w) => w.canonicalRevision === 'v1'), 'every workload is back to the last good config');
    assert.equal(dump.staticConfig.workloads[0].canonicalRevision, 'v1');
    // The next good file is diffed against what is applied (the last good config), and applies.
    refuseV2 = false;
    writeLargeConfig(path, { workloads: n, revision: 'v3' });
    await waitUntil(() => lines.some((l) => l.message === 'local config reloaded'), 'the reload', 60_000);
    const dump2 = JSON.parse((await get(proxy.addresses.admin, '/config_dump')).body) as Dump;
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
    const ip = (i: number) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
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
    assert.deepEqual(dp.meshDump().workloads.find((w) => w.uid === 'Kubernetes//Pod/default/w3')!.workloadIps, ['10.200.0.3'], 'the second response applied last');
    const dump = JSON.parse((await get(proxy.addresses.admin, '/config_dump')).body) as Dump;
    assert.equal(dump.workloads.length, n, 'the removal of a key the same response upserts did not win');
  } finally {
    await proxy.shutdown('immediate', 'test');
    await istiod.close();
  }
});

test('splitChange: the one-batch meaning in reference order', async () => {
  const { splitChange } = await import('../../dist/state/chunks.js');
  const w = (uid: string, v = 'a') => ({ uid, canonicalRevision: v, authorizationPolicies: [] });
  const chunks = splitChange(
    {
      workloads: [w('u1'), w('u2'), w('u1', 'b')],
      removedWorkloads: ['u2', 'u3'],
      services: [{ namespace: 'n', hostname: 'h' }],
      policies: [{ namespace: 'n', name: 'p' }],
      removedPolicies: ['n/q'],
    } as unknown as StateChange, // skeletons: splitChange reads only the keys
    2,
  );
  assert.deepEqual(chunks, [
    { policies: [{ namespace: 'n', name: 'p' }], services: [{ namespace: 'n', hostname: 'h' }] },
    { workloads: [w('u1', 'b'), w('u2')] },
    { removedWorkloads: ['u3'], removedPolicies: ['n/q'] },
  ]);
  assert.deepEqual(splitChange({}), [{}], 'an empty change is still one apply');
});

test('the dataplane tracks unresolved policy references: each reported once, as it appears; counted', async () => {
  const { compilePolicy } = await import('../../dist/policy/compile.js');
  const dp = openNativeDataplane();
  try {
    // The fields the test is about; the dataplane takes the rest as their defaults.
    const w = (uid: string, rev: string, ...policies: string[]) =>
      ({ uid, name: uid, namespace: 'n', workloadIps: [], canonicalRevision: rev, authorizationPolicies: policies }) as Partial<Workload> as Workload;
    const p = compilePolicy({ name: 'p', namespace: 'n', scope: 'WorkloadSelector', action: 'Allow', dryRun: false, rules: [] });
    const sorted = (m: AppliedOut['missing']) => [...m].sort((x, y) => (`${x.uid}${x.policy}` < `${y.uid}${y.policy}` ? -1 : 1));
    let out = dp.applyState({ workloads: [w('a', 'v1', 'n/p'), w('b', 'v1', 'n/p', 'n/r')] });
    assert.deepEqual(sorted(out.missing), [{ uid: 'a', policy: 'n/p' }, { uid: 'b', policy: 'n/p' }, { uid: 'b', policy: 'n/r' }]);
    assert.equal(out.missingReferences, 3);
    assert.equal(out.workloads.length, 0, 'workloads of other nodes are counted, not listed');
    out = dp.applyState({ workloads: [w('a', 'v2', 'n/p')] });
    assert.deepEqual(out.missing, [], 'still missing: not reported again');
    out = dp.applyState({ policies: [p] });
    assert.deepEqual([out.missing, out.missingReferences], [[], 1], 'only b -> n/r is left');
    out = dp.applyState({ removedPolicies: ['n/p'] });
    assert.deepEqual(sorted(out.missing), [{ uid: 'a', policy: 'n/p' }, { uid: 'b', policy: 'n/p' }], 'missing again once removed');
    out = dp.applyState({ removedWorkloads: ['b'] });
    assert.deepEqual([out.missing, out.missingReferences], [[], 1], 'a removed workload names nothing');
    out = dp.applyState({ workloads: [w('a', 'v3')] });
    assert.equal(out.missingReferences, 0, 'a workload that stops naming it');
  } finally {
    dp.shutdown();
  }
});
