// The Node footprint (bench/idle-rss.mjs): a daemon loads what its mode needs. In local mode with the built-in CA
// there is no istiod to talk to, so gRPC and the generated protobuf code stay unloaded (with XDS_ADDRESS or
// CA_ADDRESS they load, as the xDS suites show by working). The admin's dashboard and policy preview load with their
// first request (and then work), the other commands' modules (demo, authz) never load in the daemon, the schema (zod)
// loads only in the worker threads that parse the config and the local config (never on the main thread, where it
// would stay for good), the admin servers do not pull in undici and http2 (an ESM import of
// node:http does on Node 22 and later), and the metrics do not pull in https, tls and zlib (prom-client's index does).
// The modules are read as Node resolved them, through module hooks (test/helpers/module-log), and the builtins from
// the daemon's process.moduleLoadList as it exits.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { AuthzPreview } from '../../dist/native/types.js';
import { makeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import { BLOCKS, block, httpGet, waitFor } from '../helpers/net.js';

const net = block(BLOCKS['lazy-modules']);
const REGISTER = fileURLToPath(new URL('../helpers/module-log/register.mjs', import.meta.url));
const BUILTINS = fileURLToPath(new URL('../helpers/module-log/builtins.mjs', import.meta.url));

/**
 * The modules the main thread loaded: those reachable from its entry point (bin/ztunnel-node.js) through the
 * resolutions logged (`<parent>\t<url>` lines; a worker's entry point has no parent, so what only a worker imports
 * is not reached).
 */
function mainThreadModules(edgeLines: string[]): Set<string> {
  const children = new Map<string, Set<string>>();
  let root: string | null = null;
  for (const line of edgeLines) {
    const [parent, url] = line.split('\t');
    if (parent === '' && url.endsWith('/bin/ztunnel-node.js')) root = url;
    if (!children.has(parent)) children.set(parent, new Set());
    children.get(parent)!.add(url);
  }
  assert.ok(root !== null, 'the main entry point was logged');
  const seen = new Set([root]);
  const todo = [root];
  while (todo.length > 0) {
    for (const c of children.get(todo.pop()!) ?? []) {
      if (seen.has(c)) continue;
      seen.add(c);
      todo.push(c);
    }
  }
  return seen;
}

/** Loaded only when used: the admin's lazy pieces and the other commands. */
const LAZY = ['/dist/admin/dashboard.js', '/dist/admin/dashboard-page.js', '/dist/admin/authz-preview.js', '/dist/cli/demo.js', '/dist/cli/authz.js'];

function post(url: string, body: string): Promise<{ status: number | undefined; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: 'POST', agent: false }, (res) => {
      let text = '';
      res.on('data', (c) => (text += c));
      res.on('end', () => resolve({ status: res.statusCode, body: text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

test('a local-mode daemon loads only what its mode needs; the lazy admin pieces load and work when asked for', async (t) => {
  const dir = makeTempDir('ztn-lazy-');
  const log = join(dir, 'modules.txt');
  const edgeLog = join(dir, 'edges.txt');
  const builtinLog = join(dir, 'builtins.txt');
  const config = { workloads: [workload({ name: 'a', ip: net.workload(1), node: 'node-a' })] };
  const d = await startDaemon({
    node: 'node-a',
    config,
    caDir: join(dir, 'ca'),
    adminIp: net.admin(1),
    env: { NODE_OPTIONS: `--import=${REGISTER} --import=${BUILTINS}`, ZTN_MODULE_LOG: log, ZTN_MODULE_EDGES: edgeLog, ZTN_BUILTIN_LOG: builtinLog },
    cleanup: t,
  });
  const loaded = () => readFileSync(log, 'utf8').split('\n').filter(Boolean);
  const atReady = loaded();
  // The log is real: the daemon's own modules are in it.
  assert.ok(atReady.some((u) => u.endsWith('/dist/lifecycle/proxy.js')), 'the daemon module was logged');
  assert.ok(atReady.some((u) => u.includes('/node_modules/zod/')), 'the config schema (zod) was logged');
  const edges = () => readFileSync(edgeLog, 'utf8').split('\n').filter(Boolean);
  const workerEntries = edges().filter((l) => l.startsWith('\t')).map((l) => l.slice(1).replace(/^.*\/dist\//, ''));
  assert.ok(workerEntries.includes('config/config-worker.js'), 'the config was parsed in a worker');
  const onMain = mainThreadModules(edges());
  // The first local load is made by the config worker, which has the schema loaded already.
  assert.ok(atReady.some((u) => u.endsWith('/dist/config/local-prepare.js')), 'the local config was read');
  assert.ok(!workerEntries.includes('config/local-worker.js'), 'by the config worker: no second worker');
  assert.ok(onMain.has(atReady.find((u) => u.endsWith('/dist/lifecycle/proxy.js'))!), 'the daemon module is on the main thread');
  assert.deepEqual([...onMain].filter((u) => u.includes('/node_modules/zod/') || /\/dist\/config\/(schema|local|local-prepare|index)\.js$/.test(u)), [], 'no schema on the main thread');
  assert.deepEqual(atReady.filter((u) => u.includes('/@grpc/') || u.includes('/@bufbuild/') || u.includes('/dist/gen/')), []);
  assert.deepEqual(atReady.filter((u) => LAZY.some((m) => u.endsWith(m))), [], 'nothing lazy is loaded at ready');
  await d.waitForLog((l) => l.message === 'local config applied');

  // The dashboard: loaded by its first request, and serving.
  const page = await httpGet(`${d.adminUrl}/dashboard`);
  assert.equal(page.status, 200);
  assert.match(page.body, /<html/i);
  assert.ok(loaded().some((u) => u.endsWith('/dist/admin/dashboard.js')), 'the dashboard loaded with its first request');

  // The policy preview: loaded by its first request, and answering (no connections: nothing to close or allow).
  const candidate = 'name: deny-9\nnamespace: default\nscope: Namespace\naction: Deny\nrules:\n- - - destinationPorts: [9]\n';
  const preview = await post(`${d.adminUrl}/debug/authz/preview`, candidate);
  assert.equal(preview.status, 200, preview.body);
  assert.deepEqual((JSON.parse(preview.body) as AuthzPreview).wouldClose, []);
  assert.ok(loaded().some((u) => u.endsWith('/dist/admin/authz-preview.js')), 'the preview loaded with its first request');
  assert.ok(edges().includes(`\t${new URL('../../dist/admin/preview-worker.js', import.meta.url).href}`), 'the candidate was parsed in a worker');
  assert.deepEqual([...mainThreadModules(edges())].filter((u) => u.includes('/node_modules/zod/')), [], 'still no schema on the main thread');
  const usage = await httpGet(`${d.adminUrl}/debug/authz/preview`);
  assert.equal(usage.status, 405);
  assert.match(usage.body, /usage: POST \/debug\/authz\/preview/);

  await d.stop();
  assert.deepEqual(loaded().filter((u) => u.endsWith('/dist/cli/demo.js') || u.endsWith('/dist/cli/authz.js')), [], 'no other command was loaded');
  const builtins = readFileSync(builtinLog, 'utf8').split('\n').filter(Boolean);
  assert.ok(builtins.includes('http'), 'the builtins log is real: node:http is in it');
  assert.deepEqual(builtins.filter((b) => b.includes('undici') || b.includes('http2')), [], 'no undici, no http2');
  // prom-client is taken by its parts (admin/metrics.ts): its Pushgateway's https, tls and zlib stay unloaded.
  assert.deepEqual(builtins.filter((b) => ['https', 'tls', 'zlib'].includes(b)), [], 'no https, tls or zlib');
});

/** RssFile of a process (kB in /proc/PID/status), in MiB. */
function rssFileMiB(pid: number): number {
  const m = /^RssFile:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  assert.ok(m, 'RssFile in /proc/PID/status');
  return Number(m[1]) / 1024;
}

test('a moment after ready, the code pages startup ran once leave the RSS; the daemon runs on (footprint.rs)', async (t) => {
  const dir = makeTempDir('ztn-cold-');
  const config = { workloads: [workload({ name: 'a', ip: net.workload(2), node: 'node-a' })] };
  const d = await startDaemon({ node: 'node-a', config, caDir: join(dir, 'ca'), adminIp: net.admin(2), cleanup: t });
  const atReady = rssFileMiB(d.child.pid!);
  // Node's binary and the native module alone keep well over 30 MiB of code resident at ready.
  assert.ok(atReady > 30, `RssFile at ready ${atReady.toFixed(1)} MiB`);
  let now = atReady;
  await waitFor(() => (now = rssFileMiB(d.child.pid!)) < atReady - 10, { timeoutMs: 15_000, message: `file-backed RSS ${atReady.toFixed(1)} MiB at ready, ${now.toFixed(1)} since` });
  // What still runs faults back in: readiness, a scrape, a config dump.
  assert.equal((await httpGet(d.readinessUrl)).status, 200);
  assert.match((await httpGet(`${d.statsUrl}/metrics`)).body, /istio_build/);
  assert.equal((await httpGet(`${d.adminUrl}/config_dump`)).status, 200);
  await d.stop();
});
