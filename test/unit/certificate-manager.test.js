// CertificateManager against a fake key store and a fake CA that returns real X.509 certificates (made with the
// openssl CLI via test/helpers/pki.js, so the test needs no native module).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { makeCa, makeLeaf, tempDir } from '../helpers/pki.js';
import { X509Certificate } from 'node:crypto';
import { CertificateManager } from '../../dist/ca/manager.js';
import { splitPem } from '../../dist/ca/pem.js';
import { createLogs } from '../../dist/log/logger.js';

function pki() {
  try {
    const dir = tempDir('ztn-certmgr-');
    const ca = makeCa(dir, 'root');
    const leaf = makeLeaf(dir, ca, ['spiffe://cluster.local/ns/default/sa/sleep']);
    rmSync(dir, { recursive: true, force: true });
    return { leaf: leaf.certPem, root: ca.certPem };
  } catch {
    return null;
  }
}

const PKI = pki();
const LEAF = PKI?.leaf ?? null;
const ROOT = PKI?.root ?? null;
const skip = PKI === null ? 'openssl CLI not available' : false;
const logger = createLogs({ filter: { level: 'off', targets: {} }, format: 'json', sink: { write: () => {} } }).root;
const ID = 'spiffe://cluster.local/ns/default/sa/sleep';

// The manager's timers are unref'd (certificates never keep a process alive), so keep the loop alive while
// the tests wait for retries.
const keepAlive = setInterval(() => {}, 1000);
test.after(() => clearInterval(keepAlive));

function fakes({ failFirst = 0 } = {}) {
  const calls = { csr: [], sign: [], install: [] };
  const keys = {
    createCsr: (identity) => {
      calls.csr.push(identity);
      return `CSR for ${identity}`;
    },
    installCertificate: (identity, chainPem, rootsPem) => calls.install.push({ identity, chainPem, rootsPem }),
  };
  let failures = failFirst;
  const ca = {
    sign: async (csr, identity, ttl) => {
      calls.sign.push({ csr, identity, ttl });
      if (failures-- > 0) throw Object.assign(new Error('CA is down'), { code: 'CA_UNAVAILABLE' });
      return { chainPem: LEAF, rootsPem: ROOT };
    },
  };
  return { keys, ca, calls };
}

test('ensure: CSR → sign → install, then Available with a dump in ztunnel form', { skip }, async () => {
  const { keys, ca, calls } = fakes();
  const m = new CertificateManager({ keys, ca, ttlSeconds: 3600, logger });
  assert.deepEqual(m.dump().map((d) => d.state), []);
  const pending = m.ensure(ID);
  assert.deepEqual(m.dump().map((d) => d.state), ['Initializing']);
  assert.equal(await pending, true);
  assert.deepEqual(calls.csr, [ID]);
  assert.deepEqual(calls.sign, [{ csr: `CSR for ${ID}`, identity: ID, ttl: 3600 }]);
  assert.deepEqual(calls.install, [{ identity: ID, chainPem: LEAF, rootsPem: ROOT }]);
  // A second ensure for the same identity does not fetch again.
  assert.equal(await m.ensure(ID), true);
  assert.equal(calls.sign.length, 1);

  const [d] = m.dump();
  assert.equal(d.identity, ID);
  assert.equal(d.state, 'Available');
  assert.equal(d.certChain.length, 1);
  assert.equal(d.rootCerts.length, 1);
  const leaf = new X509Certificate(LEAF);
  assert.equal(Buffer.from(d.certChain[0].pem, 'base64').toString(), splitPem(LEAF)[0]);
  assert.equal(d.certChain[0].serialNumber, BigInt(`0x${leaf.serialNumber}`).toString(10));
  assert.match(d.certChain[0].validFrom, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
  assert.equal(new Date(d.certChain[0].expirationTime).getTime(), new Date(leaf.validTo).getTime());
  m.stop();
});

test('a failed fetch is Unavailable with the reason, then retried', { skip }, async () => {
  const { keys, ca, calls } = fakes({ failFirst: 1 });
  const m = new CertificateManager({ keys, ca, ttlSeconds: 60, logger });
  const ready = m.ensure(ID);
  await new Promise((r) => setImmediate(r));
  assert.equal(m.dump()[0].state, 'Unavailable: CA is down');
  assert.equal(await ready, true);
  assert.equal(calls.sign.length, 2);
  // Each attempt used a fresh CSR: the pending key is replaced, never reused after a failure.
  assert.equal(calls.csr.length, 2);
  assert.equal(m.dump()[0].state, 'Available');
  m.stop();
});

test('refresh happens at half the lifetime', { skip }, async () => {
  const { keys, ca, calls } = fakes();
  const leaf = new X509Certificate(LEAF);
  const notBefore = new Date(leaf.validFrom).getTime();
  const lifetime = new Date(leaf.validTo).getTime() - notBefore;
  let now = notBefore + lifetime * 0.75; // already past half-life: the refresh is due at once
  const m = new CertificateManager({ keys, ca, ttlSeconds: 60, logger, now: () => now });
  await m.ensure(ID);
  await new Promise((r) => setTimeout(r, 50));
  assert.ok(calls.sign.length >= 2, `expected a refresh, got ${calls.sign.length} sign calls`);
  m.stop();

  const second = fakes();
  now = notBefore + lifetime * 0.25; // before half-life: nothing to do yet
  const m2 = new CertificateManager({ keys: second.keys, ca: second.ca, ttlSeconds: 60, logger, now: () => now });
  await m2.ensure(ID);
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(second.calls.sign.length, 1);
  m2.stop();
});

test('stop() resolves pending ensures with false and stops retrying', { skip }, async () => {
  const { keys, ca, calls } = fakes({ failFirst: 100 });
  const m = new CertificateManager({ keys, ca, ttlSeconds: 60, logger });
  const ready = m.ensure(ID);
  await new Promise((r) => setImmediate(r));
  m.stop();
  assert.equal(await ready, false);
  const attempts = calls.sign.length;
  await new Promise((r) => setTimeout(r, 700));
  assert.equal(calls.sign.length, attempts);
  assert.equal(await m.ensure('spiffe://cluster.local/ns/x/sa/y'), false);
});

function gatedCa() {
  const pending = [];
  const order = [];
  let inflight = 0;
  let maxInflight = 0;
  const ca = {
    sign: (csr, identity) => {
      order.push(identity);
      inflight++;
      maxInflight = Math.max(maxInflight, inflight);
      return new Promise((resolve) => pending.push(() => {
        inflight--;
        resolve({ chainPem: LEAF, rootsPem: ROOT });
      }));
    },
  };
  const release = () => pending.splice(0).forEach((f) => f());
  return { ca, order, release, stats: () => ({ inflight, maxInflight }) };
}

const keysOnly = { createCsr: (id) => `CSR ${id}`, installCertificate: () => {} };
const tick = () => new Promise((r) => setTimeout(r, 5));

test('at most 8 requests in flight; the rest wait their turn', { skip }, async () => {
  const g = gatedCa();
  const m = new CertificateManager({ keys: keysOnly, ca: g.ca, ttlSeconds: 60, logger });
  const ids = Array.from({ length: 20 }, (_, i) => `spiffe://cluster.local/ns/n/sa/s${i}`);
  const all = Promise.all(ids.map((id) => m.ensure(id)));
  await tick();
  assert.equal(g.stats().inflight, 8);
  assert.deepEqual(m.pending(), { queued: 12, inflight: 8 });
  while (g.stats().inflight > 0) {
    g.release();
    await tick();
  }
  assert.deepEqual(await all, ids.map(() => true));
  assert.equal(g.stats().maxInflight, 8);
  m.stop();
});

test('priorities: RealTime before Warmup before Background, ties in arrival order', { skip }, async () => {
  const g = gatedCa();
  const m = new CertificateManager({ keys: keysOnly, ca: g.ca, ttlSeconds: 60, logger, maxConcurrent: 1 });
  const id = (s) => `spiffe://cluster.local/ns/n/sa/${s}`;
  const done = [m.ensure(id('first'))];
  await tick();
  done.push(m.ensure(id('bg'), 'Background'), m.ensure(id('warm1'), 'Warmup'), m.ensure(id('rt'), 'RealTime'), m.ensure(id('warm2'), 'Warmup'));
  // A queued request raised by a more urgent caller moves up (and, queued earlier, goes before rt).
  done.push(m.ensure(id('bg'), 'RealTime'));
  for (let i = 0; i < 6; i++) {
    g.release();
    await tick();
  }
  await Promise.all(done);
  assert.deepEqual(g.order.map((s) => s.split('/').pop()), ['first', 'bg', 'rt', 'warm1', 'warm2']);
  m.stop();
});

test('forget: waiters resolve false, the identity leaves the dump, a late response is dropped', { skip }, async () => {
  const g = gatedCa();
  const installed = [];
  const m = new CertificateManager({ keys: { ...keysOnly, installCertificate: (i) => installed.push(i) }, ca: g.ca, ttlSeconds: 60, logger });
  const p = m.ensure(ID);
  await tick();
  m.forget(ID);
  assert.equal(await p, false);
  assert.deepEqual(m.dump(), []);
  g.release();
  await tick();
  assert.deepEqual(installed, []);
  m.stop();
});

test('failures back off exponentially with jitter, capped', { skip }, async () => {
  const times = [];
  const ca = { sign: async () => { times.push(Date.now()); throw new Error('down'); } };
  const m = new CertificateManager({ keys: keysOnly, ca, ttlSeconds: 60, logger, backoff: { initialMs: 200, maxMs: 800, jitter: 0.2 }, random: () => 0 });
  void m.ensure(ID);
  await new Promise((r) => setTimeout(r, 2_600));
  m.stop();
  const gaps = times.slice(1).map((t, i) => t - times[i]);
  // random() = 0 takes the low end of the jitter: 160, 320, 640, 640, ... Timers never fire early but may fire late
  // on a loaded machine, so each upper bound sits well below the next step (the sizes leave >= 140 ms of slack).
  assert.ok(gaps.length >= 4, `gaps ${gaps}`);
  assert.ok(gaps[0] >= 155 && gaps[0] < 300, `first gap ${gaps[0]}`);
  assert.ok(gaps[1] >= 310 && gaps[1] < 480, `second gap ${gaps[1]}`);
  assert.ok(gaps[2] >= 620 && gaps[3] >= 620 && gaps[3] < 1_000, `capped gaps ${gaps}`);
  assert.match(m.dump()[0].state, /^Unavailable: down$/);
});
