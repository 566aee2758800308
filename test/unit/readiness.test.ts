// Readiness: named pending tasks, the /healthz/ready answer, and the readiness server over real HTTP.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Readiness, renderReadiness } from '../../dist/lifecycle/readiness.js';
import { createReadinessServer } from '../../dist/admin/readiness-server.js';
import { listen, closeServer } from '../../dist/admin/http.js';

test('renderReadiness: 200 ready, or 500 with the pending tasks sorted', () => {
  assert.deepEqual(renderReadiness([]), { status: 200, body: 'ready\n' });
  assert.deepEqual(renderReadiness(['state manager', 'certificates', 'proxy']), {
    status: 500,
    body: 'not ready, pending: certificates, proxy, state manager\n',
  });
});

test('a task name stays pending until every registration of it is done; done() is idempotent', () => {
  const r = new Readiness();
  const a1 = r.register('certificates');
  const a2 = r.register('certificates');
  const b = r.register('proxy');
  assert.deepEqual(r.pending(), ['certificates', 'proxy']);
  a1.done();
  a1.done();
  assert.deepEqual(r.pending(), ['certificates', 'proxy']);
  a2.done();
  b.done();
  assert.deepEqual(r.pending(), []);
  assert.equal(r.isReady(), true);
});

test('whenReady resolves once the last pending task is done (at once when nothing is pending)', async () => {
  const r = new Readiness();
  await r.whenReady();
  const a = r.register('a');
  const b = r.register('b');
  let ready = false;
  const waiting = r.whenReady().then(() => (ready = true));
  a.done();
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(ready, false, 'b is still pending');
  b.done();
  await waiting;
  assert.equal(ready, true);
});

test('the readiness server answers GET /healthz/ready; other methods 405; other paths 404', async (t) => {
  const r = new Readiness();
  const task = r.register('proxy');
  const server = createReadinessServer(r);
  const addr = await listen(server, { host: '127.0.0.1', port: 0 });
  t.after(() => closeServer(server));
  const base = `http://127.0.0.1:${addr.port}`;

  let res = await fetch(`${base}/healthz/ready`);
  assert.equal(res.status, 500);
  assert.equal(await res.text(), 'not ready, pending: proxy\n');
  task.done();
  res = await fetch(`${base}/healthz/ready`);
  assert.equal(res.status, 200);
  assert.equal(await res.text(), 'ready\n');
  res = await fetch(`${base}/healthz/ready`, { method: 'POST' });
  assert.equal(res.status, 405);
  await res.text();
  res = await fetch(`${base}/nope`);
  assert.equal(res.status, 404);
  await res.text();
});
