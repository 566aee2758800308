// The admin server's routes and answers (ztunnel's), against fake handlers.
import { request } from 'node:http';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createAdminServer } from '../../dist/admin/admin-server.js';
import { listen, closeServer } from '../../dist/admin/http.js';
import { createLogs } from '../../dist/log/logger.js';
import { waitFor } from '../helpers/net.js';
import type { TestContext } from 'node:test';
import type { AdminHandlers } from '../../dist/admin/admin-server.js';
import type { AuthzPreviewRequest } from '../../dist/native/types.js';

/** A raw request's answer. */
interface RawAnswer {
  status: number | undefined;
  body: string;
}

async function start(t: TestContext, overrides: Partial<AdminHandlers> = {}) {
  const quits: string[] = [];
  const logs = createLogs({ filter: { level: 'info', targets: {} }, format: 'json', sink: { write: () => {} } });
  const server = createAdminServer({
    logs,
    quit: (reason) => quits.push(reason),
    configDump: () => ({ workloads: [], services: [], policies: [], stagedServices: [], staticConfig: null, certificates: [], config: {}, version: {} }),
    ...overrides,
  });
  const addr = await listen(server, { host: '127.0.0.1', port: 0 });
  t.after(() => closeServer(server));
  const req = async (path: string, method = 'GET') => {
    const res = await fetch(`http://127.0.0.1:${addr.port}${path}`, { method });
    return { status: res.status, body: await res.text(), type: res.headers.get('content-type') };
  };
  return { req, quits, logs, port: addr.port };
}

test('/quitquitquit: POST starts the shutdown and says so; other methods 405', async (t) => {
  const { req, quits } = await start(t);
  assert.equal((await req('/quitquitquit', 'GET')).status, 405);
  assert.deepEqual(quits, []);
  const r = await req('/quitquitquit', 'POST');
  assert.deepEqual([r.status, r.body], [200, 'shutdown now\n']);
  assert.deepEqual(quits, ['admin /quitquitquit']);
});

/** A raw request with the headers a browser (or a DNS-rebinding page) would send. */
function raw(method: string, port: number, path: string, headers: Record<string, string>): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const r = request({ host: '127.0.0.1', port, path, method, headers, agent: false }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode, body }));
    });
    r.on('error', reject);
    r.end();
  });
}

test('mutating endpoints refuse what a web page can send: cross-origin, cross-site, a DNS name in Host', async (t) => {
  const { quits, logs, port } = await start(t);
  const ok = `127.0.0.1:${port}`;
  for (const [headers, why] of [
    [{ host: ok, origin: 'http://evil.example' }, /cross-origin request \(Origin http:\/\/evil.example\)/],
    [{ host: ok, 'sec-fetch-site': 'cross-site' }, /a cross-site request/],
    [{ host: `evil.example:${port}` }, /Host "evil.example:\d+" is not an IP address or localhost/],
  ] as const) {
    for (const path of ['/quitquitquit', '/logging?level=debug']) {
      const r = await rawPost(port, path, headers);
      assert.equal(r.status, 403, `${path} ${JSON.stringify(headers)}`);
      assert.match(r.body, why);
    }
  }
  assert.deepEqual(quits, [], 'no shutdown');
  assert.equal(logs.levelOf('ztunnel'), 'info', 'the log filter is unchanged');
  // What operators' tools send: an IP or localhost in Host, the admin's own origin if any.
  assert.equal((await rawPost(port, '/logging?level=debug', { host: `localhost:${port}` })).status, 200);
  assert.equal((await rawPost(port, '/logging?reset', { host: ok, origin: `http://${ok}`, 'sec-fetch-site': 'same-origin' })).status, 200);
  assert.equal((await rawPost(port, '/quitquitquit', { host: `[::1]:${port}` })).status, 200);
  assert.deepEqual(quits, ['admin /quitquitquit']);
});

const rawPost = (port: number, path: string, headers: Record<string, string>) => raw('POST', port, path, headers);
const rawGet = (port: number, path: string, headers: Record<string, string>) => raw('GET', port, path, headers);

test('every GET answers only a Host that is an address (DNS rebinding); profile GETs take the mutating guard (issue 29)', async (t) => {
  let profiles = 0;
  const { port } = await start(t, {
    cpuProfile: async () => (profiles++, new Uint8Array([1])),
    heapProfile: async () => (profiles++, new Uint8Array([2])),
  });
  for (const path of ['/', '/config_dump', '/debug/pprof/profile?seconds=1', '/debug/pprof/heap', '/nowhere']) {
    const r = await rawGet(port, path, { host: `rebound.example:${port}` });
    assert.equal(r.status, 403, path);
    assert.match(r.body, /Host "rebound\.example:\d+" is not an IP address or localhost/);
  }
  for (const path of ['/debug/pprof/profile?seconds=1', '/debug/pprof/heap']) {
    const r = await rawGet(port, path, { host: `127.0.0.1:${port}`, 'sec-fetch-site': 'cross-site' });
    assert.equal(r.status, 403, `${path} cross-site`);
  }
  assert.equal(profiles, 0, 'no profile was taken for a refused request');
  assert.equal((await rawGet(port, '/config_dump', { host: `localhost:${port}` })).status, 200);
  assert.equal((await rawGet(port, '/debug/pprof/profile?seconds=1', { host: `127.0.0.1:${port}` })).status, 200);
  assert.equal(profiles, 1);
});

test('a CPU profile is cancelled when its requester goes away; a second request meanwhile is 409 and cancels nothing (issue 29)', async (t) => {
  let cancelled = 0;
  let finish: { resolve: (profile: Uint8Array) => void; reject: (err: Error) => void } | null = null;
  const { port } = await start(t, {
    cpuProfile: () => new Promise((resolve, reject) => (finish = { resolve, reject })),
    cancelCpuProfile: () => {
      cancelled++;
      finish?.reject(new Error('PROFILE: the profile was cancelled'));
    },
  });
  const aborter = new AbortController();
  const first = fetch(`http://127.0.0.1:${port}/debug/pprof/profile?seconds=300`, { signal: aborter.signal }).catch((e) => e);
  await waitFor(() => finish !== null, { timeoutMs: 5_000, intervalMs: 5, message: 'the profile to start' });
  const second = await rawGet(port, '/debug/pprof/profile?seconds=1', { host: `127.0.0.1:${port}` });
  assert.equal(second.status, 409);
  assert.equal(cancelled, 0, 'the busy answer cancels nothing');
  aborter.abort();
  assert.ok((await first) instanceof Error);
  await waitFor(() => cancelled > 0, { timeoutMs: 5_000, intervalMs: 5, message: 'the profile to be cancelled' });
  assert.equal(cancelled, 1, 'the requester went away: the profile was stopped');
  // The next request starts a profile of its own.
  finish = null;
  const next = fetch(`http://127.0.0.1:${port}/debug/pprof/profile?seconds=1`);
  await waitFor(() => finish !== null, { timeoutMs: 5_000, intervalMs: 5, message: 'the profile to start' });
  finish!.resolve(new Uint8Array([7]));
  assert.equal((await next).status, 200);
  assert.equal(cancelled, 1, 'a profile that finished is not cancelled');
});

test('/config_dump is pretty JSON with the top-level keys in order', async (t) => {
  const { req } = await start(t);
  const r = await req('/config_dump');
  assert.equal(r.status, 200);
  assert.equal(r.type, 'application/json');
  assert.match(r.body, /^\{\n {2}"workloads": \[\]/);
  assert.deepEqual(Object.keys(JSON.parse(r.body)), ['workloads', 'services', 'policies', 'stagedServices', 'staticConfig', 'certificates', 'config', 'version']);
});

test('/config_dump failures are a 500 with the reason', async (t) => {
  const { req } = await start(t, {
    configDump: () => {
      throw new Error('boom');
    },
  });
  const r = await req('/config_dump');
  assert.deepEqual([r.status, r.body], [500, 'config dump failed: boom\n']);
});

test('/logging: POST shows and changes the filter; bad levels 400; GET 405', async (t) => {
  const { req, logs } = await start(t);
  assert.equal((await req('/logging', 'POST')).body, 'current log level is info\n');
  assert.equal((await req('/logging?level=access=debug', 'POST')).body, 'current log level is info,access=debug\n');
  assert.equal(logs.forTarget('access').level, 'debug');
  assert.equal((await req('/logging?level=warn', 'POST')).body, 'current log level is warn\n');
  assert.equal(logs.forTarget('access').level, 'warn');
  assert.equal(logs.root.level, 'warn');
  const bad = await req('/logging?level=chatty', 'POST');
  assert.equal(bad.status, 400);
  assert.match(bad.body, /"chatty" is not a level/);
  assert.equal((await req('/logging?reset', 'POST')).body, 'current log level is info\n');
  assert.equal((await req('/logging', 'GET')).status, 405);
});

test('/ is an HTML index; unknown paths 404', async (t) => {
  const { req } = await start(t);
  const index = await req('/');
  assert.equal(index.status, 200);
  assert.match(index.type!, /text\/html/);
  assert.match(index.body, /href="\/config_dump"/);
  assert.equal((await req('/stats')).status, 404);
});

test('/debug/authz/preview: the body parsed by the local config schema (both string-match dialects) and compiled; bad input 400 naming the field', async (t) => {
  const asked: AuthzPreviewRequest[] = [];
  const answer = { candidates: ['default/p'], judgedAsEnforced: [], connectionsJudged: 0, denialsJudged: 0, wouldClose: [], wouldCloseConnections: 0, wouldAllow: [], wouldAllowAttempts: 0, truncated: false };
  const { port } = await start(t, { previewAuthz: async (r) => (asked.push(r), answer) });
  const post = async (path: string, body: string) => {
    const res = await fetch(`http://127.0.0.1:${port}${path}`, { method: 'POST', body });
    return { status: res.status, body: await res.text() };
  };
  const tagged = 'name: p\nnamespace: default\nscope: Namespace\naction: Deny\nrules: [[[{principals: [!Exact "spiffe://cluster.local/ns/a/sa/b"], sourceIps: ["10.0.0.0/8"]}]]]\n';
  const mapping = 'name: p\nnamespace: default\nscope: Namespace\naction: Deny\nrules: [[[{principals: [{Exact: "spiffe://cluster.local/ns/a/sa/b"}], sourceIps: ["10.0.0.0/8"]}]]]\n';
  for (const body of [tagged, mapping]) {
    const r = await post('/debug/authz/preview', body);
    assert.equal(r.status, 200, r.body);
    assert.deepEqual(JSON.parse(r.body), answer);
  }
  // Compiled as applying it compiles it (principals without spiffe://).
  const compiled = { name: 'p', namespace: 'default', scope: 'Namespace', action: 'Deny', dryRun: false, rules: [[[{ principals: [{ exact: 'cluster.local/ns/a/sa/b' }], sourceIps: ['10.0.0.0/8'] }]]] };
  assert.deepEqual(asked, [{ policies: [compiled], selects: {} }, { policies: [compiled], selects: {} }]);

  const wrapped = JSON.stringify({ policies: [{ name: 'w', namespace: 'default', scope: 'WorkloadSelector', action: 'Allow' }], selects: { 'default/w': ['uid-1'] } });
  assert.equal((await post('/debug/authz/preview?limit=5', wrapped)).status, 200);
  assert.deepEqual(asked.at(-1), { policies: [{ name: 'w', namespace: 'default', scope: 'WorkloadSelector', action: 'Allow', dryRun: false, rules: [] }], selects: { 'default/w': ['uid-1'] }, limit: 5 });

  const bad = await post('/debug/authz/preview', '- name: p\n  scope: Namespace\n  action: Deny\n  rules: [[[{destinationPorts: [70000]}]]]\n');
  assert.equal(bad.status, 400);
  assert.match(bad.body, /^request body: \[0\]\.rules\[0\]\[0\]\[0\]\.destinationPorts\[0\]: 70000 is not a port \(1-65535\)/);
  assert.equal((await post('/debug/authz/preview?limit=lots', mapping)).status, 400);
  assert.equal(asked.length, 3, 'nothing bad reached the dataplane');
  assert.equal((await fetch(`http://127.0.0.1:${port}/debug/authz/preview`)).status, 405);
});

test('/debug/authz/preview: one at a time, a second meanwhile is 409 (issue 29)', async (t) => {
  let release: (() => void) | undefined;
  const { port } = await start(t, { previewAuthz: () => new Promise((r) => (release = () => r({ candidates: [], judgedAsEnforced: [], connectionsJudged: 0, denialsJudged: 0, wouldClose: [], wouldCloseConnections: 0, wouldAllow: [], wouldAllowAttempts: 0, truncated: false }))) });
  const body = 'name: p\nnamespace: n\nscope: Global\naction: Deny\n';
  const first = fetch(`http://127.0.0.1:${port}/debug/authz/preview`, { method: 'POST', body });
  await waitFor(() => release !== undefined, { timeoutMs: 5_000, intervalMs: 5, message: 'the preview to reach the dataplane' });
  const second = await fetch(`http://127.0.0.1:${port}/debug/authz/preview`, { method: 'POST', body });
  assert.equal(second.status, 409);
  release!();
  assert.equal((await first).status, 200);
  release = undefined;
  const third = fetch(`http://127.0.0.1:${port}/debug/authz/preview`, { method: 'POST', body });
  await waitFor(() => release !== undefined, { timeoutMs: 5_000, intervalMs: 5, message: 'the preview to reach the dataplane' });
  release!();
  assert.equal((await third).status, 200, 'the slot is free again once the first is answered');
});

test('/debug/authz/preview without a dataplane: 503', async (t) => {
  const { port } = await start(t);
  const res = await fetch(`http://127.0.0.1:${port}/debug/authz/preview`, { method: 'POST', body: 'name: p\nscope: Global\naction: Deny\n' });
  assert.equal(res.status, 503);
});

test('while the dataplane is not open yet (NOT_RUNNING), authorize, preview and the profiles answer 503', async (t) => {
  const { ZtunnelError } = await import('../../dist/errors.js');
  const notYet = () => new ZtunnelError('NOT_RUNNING', 'the dataplane is not running yet (the local config is loading)');
  const { req, port } = await start(t, {
    authorize: () => {
      throw notYet();
    },
    previewAuthz: async () => {
      throw notYet();
    },
    cpuProfile: async () => {
      throw notYet();
    },
    heapProfiling: () => {
      throw notYet();
    },
    heapProfile: async () => {
      throw notYet();
    },
  });
  const authorize = await req('/debug/authorize?dst=10.0.0.1:80');
  assert.deepEqual([authorize.status, authorize.body], [503, 'the dataplane is not running yet (the local config is loading)\n']);
  const preview = await fetch(`http://127.0.0.1:${port}/debug/authz/preview`, { method: 'POST', body: 'name: p\nnamespace: n\nscope: Global\naction: Deny\n' });
  assert.equal(preview.status, 503);
  assert.equal((await req('/debug/pprof/profile?seconds=1')).status, 503);
  assert.equal((await req('/debug/pprof/heap/profiling?activate=true', 'POST')).status, 503);
  assert.equal((await req('/debug/pprof/heap')).status, 503);
  // Any other failure of the dataplane stays what it was: a refused authorize request is the caller's (400).
  const { req: req2 } = await start(t, {
    authorize: () => {
      throw new ZtunnelError('INVALID_SPEC', 'no workload has the address 10.0.0.1');
    },
  });
  assert.equal((await req2('/debug/authorize?dst=10.0.0.1:80')).status, 400);
});
