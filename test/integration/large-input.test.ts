// A large local config file, as an operator sees it: while a real daemon (native dataplane) loads it at startup and
// reloads it, readiness and /metrics answer (readiness 500 "not ready" until the state is in, then 200), never
// refused once the daemon is listening and never stuck; a bad large file is refused with its file, path and field,
// and the last good config keeps serving.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import type { MeshDump } from '../../dist/native/types.js';
import { makeTempDir, removeTempDir, startDaemon } from '../helpers/daemon.js';
import { writeLargeConfig, largeConfigYaml } from '../helpers/large-config.js';
import { BLOCKS, block, httpGet } from '../helpers/net.js';

const net = block(BLOCKS['large-input']);
/**
 * 40k workloads (20 MiB): about a second of loading, so that the startup phase has a load to observe /metrics
 * through. With 6k (3 MiB: a few seconds of parsing once, 0.2 s since the reader got faster) the load ended before
 * the stats server had bound, and whether /metrics answered before ready was a race (it failed 1 run in 3).
 */
const WORKLOADS = 40_000;
/** Generous (the CI machine is loaded); a blocked event loop misses it by seconds. */
const PROBE_BOUND_MS = 1_000;
/** The probes each phase needs at least (some before the file changes, as the test waits for them). */
const MIN_PROBES = 6;

/** One probe: its HTTP status, or the error code (message) it failed with; `ms` from request to answer. */
interface Answer {
  what: string;
  status?: number;
  error?: string;
  ms: number;
}

/**
 * Probes readiness and /metrics on fresh connections, back to back with a 50 ms pause (the probing rate), until
 * stopped. `answered(n)` resolves once `n` probes have been answered or have failed.
 */
function prober(adminIp: string): { answered(n: number): Promise<void>; stop(): Promise<Answer[]> } {
  const answers: Answer[] = [];
  const waiters: { n: number; resolve: () => void }[] = [];
  let running = true;
  const once = async (what: string, url: string): Promise<void> => {
    const t0 = performance.now();
    try {
      const r = await httpGet(url, { timeoutMs: 10_000 });
      answers.push({ what, status: r.status, ms: performance.now() - t0 });
    } catch (err) {
      // httpGet rejects with the request's Error (a system error carries its code).
      answers.push({ what, error: (err as NodeJS.ErrnoException).code ?? (err as Error).message, ms: performance.now() - t0 });
    }
    for (const w of waiters.filter((x) => answers.length >= x.n)) {
      waiters.splice(waiters.indexOf(w), 1);
      w.resolve();
    }
  };
  const loop = (async () => {
    while (running) {
      await Promise.all([once('readiness', `http://${adminIp}:15021/healthz/ready`), once('metrics', `http://${adminIp}:15020/metrics`)]);
      await new Promise((r) => setTimeout(r, 50));
    }
  })();
  return {
    answered: (n) => (answers.length >= n ? Promise.resolve() : new Promise<void>((resolve) => waiters.push({ n, resolve }))),
    async stop() {
      running = false;
      await loop;
      return answers;
    },
  };
}

/**
 * From each server's first answer on, every probe of it answered in time (the process needs a moment to start
 * listening: readiness is bound first, before the daemon's modules load; /metrics once they have).
 */
function assertResponsive(answers: Answer[], phase: string): Answer[] {
  const after: Answer[] = [];
  for (const what of ['readiness', 'metrics']) {
    const mine = answers.filter((a) => a.what === what);
    const first = mine.findIndex((a) => a.error === undefined);
    assert.ok(first >= 0, `${phase}: ${what} answered at all`);
    after.push(...mine.slice(first));
  }
  assert.ok(after.length >= MIN_PROBES, `${phase}: probes ran while it worked (${after.length})`);
  assert.deepEqual(after.filter((a) => a.error !== undefined), [], `${phase}: none refused or stuck`);
  assert.deepEqual(after.filter((a) => a.ms > PROBE_BOUND_MS), [], `${phase}: each answered within ${PROBE_BOUND_MS} ms`);
  return after;
}

test('readiness and /metrics answer while a large local file loads and reloads; a bad one is refused and the last good one serves', async (t) => {
  const caDir = makeTempDir('ztn-large-ca-');
  t.after(() => removeTempDir(caDir));
  const adminIp = net.admin(1);

  // Startup: probing starts with the process; the daemon's node runs none of the workloads (no listeners to bind).
  let p = prober(adminIp);
  const d = await startDaemon({ node: 'large-node', config: largeConfigYaml({ workloads: WORKLOADS }), caDir, adminIp, cleanup: t, readyTimeoutMs: 120_000 });
  const answers = assertResponsive(await p.stop(), 'startup');
  assert.ok(answers.some((a) => a.what === 'readiness' && a.status === 500), 'readiness said "not ready" while loading');
  assert.ok(answers.some((a) => a.what === 'metrics' && a.status === 200), '/metrics answered while loading');
  await d.waitForLog((l) => l.message === 'local config applied' && l.workloads === WORKLOADS, { message: 'the load' });

  // A reload that changes every workload.
  p = prober(adminIp);
  await p.answered(MIN_PROBES); // probing from before the file changes
  writeLargeConfig(d.configPath, { workloads: WORKLOADS, revision: 'v2' });
  await d.waitForLog((l) => l.message === 'local config reloaded' && l.workloads === WORKLOADS, { timeoutMs: 120_000, message: 'the reload' });
  assertResponsive(await p.stop(), 'reload');

  // A bad large file: named by file, path and field; the last good config keeps serving.
  p = prober(adminIp);
  await p.answered(MIN_PROBES); // probing from before the file changes
  writeLargeConfig(d.configPath, { workloads: WORKLOADS, revision: 'v3', badAt: WORKLOADS - 3 });
  const refused = await d.waitForLog((l) => l.message === 'local config is invalid; keeping the last good config', { timeoutMs: 120_000, message: 'the refusal' });
  assertResponsive(await p.stop(), 'bad file');
  assert.equal(refused.err, `${d.configPath}: workloads[${WORKLOADS - 3}].workloadIps[0]: "10.0.0.300" is not an IP address`);
  assert.equal((await httpGet(d.readinessUrl)).status, 200);
  const dump = JSON.parse((await httpGet(`${d.adminUrl}/config_dump`, { timeoutMs: 30_000 })).body) as MeshDump;
  assert.equal(dump.workloads.length, WORKLOADS);
  assert.ok(dump.workloads.every((w) => w.canonicalRevision === 'v2'), 'the last good config keeps serving');
  assert.equal(d.logs.filter((l) => l.message === 'local config reloaded').length, 1, 'the bad file applied nothing');

  // 200 KB of nested brackets (issue 29: the YAML parser took about 20 s to refuse it, with readiness and /metrics
  // blocked meanwhile): refused at once, naming where, while both keep answering.
  p = prober(adminIp);
  await p.answered(MIN_PROBES); // probing from before the file changes
  const refusals = d.logs.length;
  const written = performance.now();
  writeFileSync(d.configPath, `workloads: ${'['.repeat(100_000)}${']'.repeat(100_000)}\n`);
  const deep = await d.waitForLog(
    (l) => d.logs.indexOf(l) >= refusals && l.message === 'local config is invalid; keeping the last good config',
    { timeoutMs: 30_000, message: 'the deep file refused' },
  );
  const took = performance.now() - written;
  assertResponsive(await p.stop(), 'deep file');
  assert.equal(deep.err, `${d.configPath}: line 1, column 76: invalid YAML: collections nested deeper than 64 levels`);
  // The file watcher's own delay included; parsing it took about 20 s before the nesting check.
  assert.ok(took < 5_000, `refused ${took.toFixed(0)} ms after it was written`);
  console.log(`# deep file refused ${took.toFixed(0)} ms after it was written`);
  assert.equal((await httpGet(d.readinessUrl)).status, 200);
  await d.stop();
});
