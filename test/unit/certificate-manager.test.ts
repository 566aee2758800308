// CertificateManager against a fake key store and a fake CA that returns real X.509 certificates (made with the
// openssl CLI via test/helpers/pki.ts, so the test needs no native module). The refresh schedule is tested on a
// fake clock (the manager's injectable `now` and `timers`) with certificates dated on that clock, never by sleeping.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { makeCa, sleepLeafAndRoot, tempDir } from '../helpers/pki.js';
import { X509Certificate } from 'node:crypto';
import { CertificateManager, refreshDelayMs } from '../../dist/ca/manager.js';
import { splitPem } from '../../dist/ca/pem.js';
import { createLogs } from '../../dist/log/logger.js';
import { waitFor } from '../helpers/net.js';
import type { CertificateAuthority } from '../../dist/ca/authority.js';
import type { KeyStore } from '../../dist/ca/manager.js';


const PKI = sleepLeafAndRoot();
const LEAF = PKI?.leaf ?? null;
const ROOT = PKI?.root ?? null;
const skip = PKI === null ? 'openssl could not make a test CA (Debian openssl: apt-get install --no-install-recommends openssl)' : false;
const logger = createLogs({ filter: { level: 'off', targets: {} }, format: 'json', sink: { write: () => {} } }).root;
const ID = 'spiffe://cluster.local/ns/default/sa/sleep';

// The manager's timers are unref'd (certificates never keep a process alive), so keep the loop alive while
// the tests wait for retries.
const keepAlive = setInterval(() => {}, 1000);
test.after(() => clearInterval(keepAlive));

function fakes({ failFirst = 0 } = {}) {
  const calls: {
    csr: string[];
    sign: { csr: string; identity: string; ttl: number }[];
    install: { identity: string; chainPem: string; rootsPem: string }[];
  } = { csr: [], sign: [], install: [] };
  const keys: KeyStore = {
    createCsr: (identity) => {
      calls.csr.push(identity);
      return `CSR for ${identity}`;
    },
    installCertificate: (identity, chainPem, rootsPem) => calls.install.push({ identity, chainPem, rootsPem }),
  };
  let failures = failFirst;
  const ca: CertificateAuthority = {
    sign: async (csr, identity, ttl) => {
      calls.sign.push({ csr, identity, ttl });
      if (failures-- > 0) throw Object.assign(new Error('CA is down'), { code: 'CA_UNAVAILABLE' });
      return { chainPem: LEAF!, rootsPem: ROOT! }; // the tests that sign are skipped without them
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
  const leaf = new X509Certificate(LEAF!);
  assert.equal(Buffer.from(d.certChain[0].pem, 'base64').toString(), splitPem(LEAF!)[0]);
  assert.equal(d.certChain[0].serialNumber, BigInt(`0x${leaf.serialNumber}`).toString(10));
  assert.match(d.certChain[0].validFrom, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
  assert.equal(new Date(d.certChain[0].expirationTime).getTime(), new Date(leaf.validTo).getTime());
  m.stop();
});

test('a failed fetch is Unavailable with the reason, then retried', { skip }, async () => {
  const { keys, ca, calls } = fakes({ failFirst: 1 });
  const clock = fakeClock(Date.now());
  const m = new CertificateManager({ keys, ca, ttlSeconds: 60, logger, now: clock.now, timers: clock.timers });
  const ready = m.ensure(ID);
  await new Promise((r) => setImmediate(r));
  assert.equal(m.dump()[0].state, 'Unavailable: CA is down');
  // The retry waits its backoff (1 s +-20 %) on the fake clock.
  await clock.advance(1_200);
  assert.equal(await ready, true);
  assert.equal(calls.sign.length, 2);
  // Each attempt used a fresh CSR: the pending key is replaced, never reused after a failure.
  assert.equal(calls.csr.length, 2);
  assert.equal(m.dump()[0].state, 'Available');
  m.stop();
});

test('stop() resolves pending ensures with false and stops retrying', { skip }, async () => {
  const { keys, ca, calls } = fakes({ failFirst: 100 });
  const clock = fakeClock(Date.now());
  const m = new CertificateManager({ keys, ca, ttlSeconds: 60, logger, now: clock.now, timers: clock.timers });
  const ready = m.ensure(ID);
  await new Promise((r) => setImmediate(r));
  assert.equal(clock.armed().length, 1, 'a retry is armed');
  m.stop();
  assert.equal(await ready, false);
  assert.deepEqual(clock.armed(), [], 'stop() cancels the retry');
  const attempts = calls.sign.length;
  await clock.advance(10_000);
  assert.equal(calls.sign.length, attempts);
  assert.equal(await m.ensure('spiffe://cluster.local/ns/x/sa/y'), false);
});

function gatedCa() {
  const pending: (() => void)[] = [];
  const order: string[] = [];
  let inflight = 0;
  let maxInflight = 0;
  const ca: CertificateAuthority = {
    sign: (csr, identity) => {
      order.push(identity);
      inflight++;
      maxInflight = Math.max(maxInflight, inflight);
      return new Promise((resolve) => pending.push(() => {
        inflight--;
        resolve({ chainPem: LEAF!, rootsPem: ROOT! });
      }));
    },
  };
  const release = () => pending.splice(0).forEach((f) => f());
  /** Resolves once the CA has been asked `n` times in all (a request reached it). */
  const asked = (n: number) => waitFor(() => order.length >= n, { timeoutMs: 5_000, intervalMs: 1, message: `CA request ${n}` });
  return { ca, order, release, asked, stats: () => ({ inflight, maxInflight }) };
}

const keysOnly: KeyStore = { createCsr: (id) => `CSR ${id}`, installCertificate: () => {} };

test('at most 8 requests in flight; the rest wait their turn', { skip }, async () => {
  const g = gatedCa();
  const m = new CertificateManager({ keys: keysOnly, ca: g.ca, ttlSeconds: 60, logger });
  const ids = Array.from({ length: 20 }, (_, i) => `spiffe://cluster.local/ns/n/sa/s${i}`);
  const all = Promise.all(ids.map((id) => m.ensure(id)));
  await g.asked(8);
  assert.equal(g.stats().inflight, 8);
  assert.deepEqual(m.pending(), { queued: 12, inflight: 8 });
  // Each answer frees a slot for the next queued request: 8 answered, 8 more asked; then the last 4.
  for (const n of [16, 20]) {
    g.release();
    await g.asked(n);
    assert.ok(g.stats().inflight <= 8);
  }
  g.release();
  assert.deepEqual(await all, ids.map(() => true));
  assert.equal(g.stats().maxInflight, 8);
  m.stop();
});

test('priorities: RealTime before Warmup before Background, ties in arrival order', { skip }, async () => {
  const g = gatedCa();
  const m = new CertificateManager({ keys: keysOnly, ca: g.ca, ttlSeconds: 60, logger, maxConcurrent: 1 });
  const id = (s: string) => `spiffe://cluster.local/ns/n/sa/${s}`;
  const done = [m.ensure(id('first'))];
  await g.asked(1);
  done.push(m.ensure(id('bg'), 'Background'), m.ensure(id('warm1'), 'Warmup'), m.ensure(id('rt'), 'RealTime'), m.ensure(id('warm2'), 'Warmup'));
  // A queued request raised by a more urgent caller moves up (and, queued earlier, goes before rt).
  done.push(m.ensure(id('bg'), 'RealTime'));
  // One slot: each answer lets the next request by priority reach the CA.
  for (let n = 2; n <= 5; n++) {
    g.release();
    await g.asked(n);
  }
  g.release();
  await Promise.all(done);
  assert.deepEqual(g.order.map((s) => s.split('/').pop()), ['first', 'bg', 'rt', 'warm1', 'warm2']);
  m.stop();
});

test('forget: waiters resolve false, the identity leaves the dump, a late response is dropped', { skip }, async () => {
  const g = gatedCa();
  const installed: string[] = [];
  const m = new CertificateManager({ keys: { ...keysOnly, installCertificate: (i) => installed.push(i) }, ca: g.ca, ttlSeconds: 60, logger });
  const p = m.ensure(ID);
  await g.asked(1);
  m.forget(ID);
  assert.equal(await p, false);
  assert.deepEqual(m.dump(), []);
  g.release();
  // The late response has been handled once its request left the in-flight count.
  await waitFor(() => m.pending().inflight === 0, { timeoutMs: 5_000, intervalMs: 1, message: 'the late response to be handled' });
  assert.deepEqual(installed, []);
  m.stop();
});

test('failures back off exponentially with jitter, capped', { skip }, async () => {
  // On a fake clock: the delays are the manager's own, not what a loaded machine's timers made of them.
  const clock = fakeClock(T0);
  const times: number[] = [];
  const ca = { sign: async () => { times.push(clock.now()); throw new Error('down'); } };
  const m = new CertificateManager({ keys: keysOnly, ca, ttlSeconds: 60, logger, backoff: { initialMs: 200, maxMs: 800, jitter: 0.2 }, random: () => 0, now: clock.now, timers: clock.timers });
  void m.ensure(ID);
  await clock.advance(2_600);
  const gaps = times.slice(1).map((t, i) => t - times[i]);
  // random() = 0 takes the low end of the jitter (-20%) of 200, 400, then 800 (the cap) again and again: attempts at
  // 0, 160, 480, 1120, 1760 and 2400 ms.
  assert.deepEqual(gaps, [160, 320, 640, 640, 640]);
  assert.match(m.dump()[0].state, /^Unavailable: down$/);
  m.stop();
});

// ---- The refresh schedule, on a fake clock ----

const SEC = 1_000;
const MIN = 60 * SEC;
const HOUR = 60 * MIN;

/** A clock and the timers the manager schedules on it; `advance` fires due timers in order, letting each settle. */
/** A timer armed on the fake clock. */
interface FakeTimer {
  at: number;
  fn: () => void;
}

function fakeClock(start: number) {
  let now = start;
  let seq = 0;
  const timers = new Map<number, FakeTimer>();
  /** Every delay the manager asked for, in order. */
  const requested: number[] = [];
  const settle = () => new Promise((r) => setImmediate(r));
  return {
    now: () => now,
    requested,
    timers: {
      set(fn: () => void, ms: number) {
        requested.push(ms);
        timers.set(++seq, { at: now + ms, fn });
        return seq;
      },
      clear(id: number) {
        timers.delete(id);
      },
    },
    /** Delays from now of the armed timers. */
    armed: () => [...timers.values()].map((t) => t.at - now),
    async advance(ms: number) {
      const until = now + ms;
      let sameInstant = 0;
      for (;;) {
        await settle();
        let next: { id: number; t: FakeTimer } | null = null;
        for (const [id, t] of timers) if (t.at <= until && (next === null || t.at < next.t.at)) next = { id, t };
        if (next === null) break;
        // A refresh loop fires timer after timer without time passing; fail instead of spinning.
        sameInstant = next.t.at > now ? 0 : sameInstant + 1;
        if (sameInstant > 100) throw new Error(`timers loop at ${new Date(now).toISOString()} without time passing`);
        timers.delete(next.id);
        now = Math.max(now, next.t.at);
        next.t.fn();
      }
      now = until;
      await settle();
    },
  };
}

/** Leaf certificates with any validity window (openssl ca -startdate/-enddate), for the fake CA. */
function datedCerts() {
  const dir = tempDir('ztn-certmgr-dated-');
  const ca = makeCa(dir, 'root');
  execFileSync('openssl', ['req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
    '-keyout', 'leaf.key', '-out', 'leaf.csr', '-subj', '/O=test'], { cwd: dir, stdio: 'ignore' });
  writeFileSync(join(dir, 'ca.cnf'), [
    '[ca]', 'default_ca = d', '[d]', 'database = index.txt', 'new_certs_dir = .', 'serial = serial',
    'default_md = sha256', 'policy = p', 'unique_subject = no', '[p]', 'organizationName = optional', '',
  ].join('\n'));
  writeFileSync(join(dir, 'index.txt'), '');
  writeFileSync(join(dir, 'serial'), '1000\n');
  // UTCTime, YYMMDDHHMMSSZ (whole seconds).
  const asn1 = (ms: number) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z').replace(/[-:T]/g, '').slice(2);
  let n = 0;
  return {
    root: ca.certPem,
    issue(notBefore: number, notAfter: number) {
      const out = `leaf${n++}.pem`;
      execFileSync('openssl', ['ca', '-batch', '-config', 'ca.cnf', '-cert', ca.certPath, '-keyfile', ca.keyPath,
        '-in', 'leaf.csr', '-out', out, '-notext', '-startdate', asn1(notBefore), '-enddate', asn1(notAfter)],
      { cwd: dir, stdio: 'ignore' });
      return readFileSync(join(dir, out), 'utf8');
    },
    close: () => rmSync(dir, { recursive: true, force: true }),
  };
}

let DATED: ReturnType<typeof datedCerts> | null = null;
try {
  DATED = datedCerts();
} catch {
  DATED = null;
}
test.after(() => DATED?.close());
const skipDated = DATED === null ? 'openssl ca could not sign a dated leaf (Debian openssl: apt-get install --no-install-recommends openssl)' : false;

/**
 * A fake CA issuing, at the clock's now, a certificate valid [now - backdateMs, now + validMs] (rounded outward to
 * whole seconds, the precision of X.509 times).
 */
/** How a fake CA dates what it issues. */
interface Validity {
  backdateMs: number;
  validMs: number;
}

type FakeClock = ReturnType<typeof fakeClock>;

function datedCa(clock: FakeClock, validity: Validity | ((n: number) => Validity)) {
  const calls: number[] = [];
  const ca = {
    sign: async () => {
      const at = clock.now();
      const { backdateMs, validMs } = typeof validity === 'function' ? validity(calls.length) : validity;
      calls.push(at);
      const notBefore = Math.floor((at - backdateMs) / SEC) * SEC;
      const notAfter = Math.ceil((at + validMs) / SEC) * SEC;
      return { chainPem: DATED!.issue(notBefore, notAfter), rootsPem: DATED!.root }; // skipped without DATED
    },
  };
  return { ca, calls };
}

// 2030-01-01T00:00:00Z: a whole second, so certificates dated on the clock are exact.
const T0 = Date.UTC(2030, 0, 1);
const ISTIOD_60S = { backdateMs: 2 * MIN, validMs: 60 * SEC };

function managerOn(
  clock: FakeClock, ca: CertificateAuthority, { random = () => 0.5, keys = keysOnly }: { random?: () => number; keys?: KeyStore } = {},
) {
  return new CertificateManager({ keys, ca, ttlSeconds: 60, logger, now: clock.now, timers: clock.timers, random });
}

test('refreshDelayMs: half-life, floored at min(5 min, half the remaining validity), jittered, clamped', () => {
  const r = T0;
  // istiod, SECRET_TTL=60s: notBefore 2 min back, so the half-life was 30 s before receipt. Refresh after 30 s.
  assert.equal(refreshDelayMs(r - 2 * MIN, r + 60 * SEC, r, 0.5), 30 * SEC);
  assert.equal(refreshDelayMs(r - 2 * MIN, r + 60 * SEC, r, 0), 28.5 * SEC); // -5 %
  assert.ok(Math.abs(refreshDelayMs(r - 2 * MIN, r + 60 * SEC, r, 1 - 1e-12) - 31.5 * SEC) < 1); // +5 %
  // 24 h backdated 2 min: its half-life (12 h after notBefore), the floor (5 min) does not matter.
  assert.equal(refreshDelayMs(r - 2 * MIN, r + 24 * HOUR, r, 0.5), 12 * HOUR - 1 * MIN);
  // Past its half-life (an old certificate re-read, a slow CA): the floor is 5 min when validity allows.
  assert.equal(refreshDelayMs(r - 20 * HOUR, r + 4 * HOUR, r, 0.5), 5 * MIN);
  // Short validity: half of what remains, never 0, never past expiry, never under 1 s.
  assert.equal(refreshDelayMs(r - 2 * MIN, r + 10 * SEC, r, 0.5), 5 * SEC);
  assert.equal(refreshDelayMs(r - 2 * MIN, r + 3 * SEC, r, 0), 1_425);
  assert.equal(refreshDelayMs(r - 2 * MIN, r + 2 * SEC, r, 0), 1 * SEC); // 950 ms raised to the 1 s minimum
  // A certificate from the future (the CA's clock ahead): the half-life is late, but the refresh is not after expiry.
  assert.equal(refreshDelayMs(r + 100 * SEC, r + 110 * SEC, r, 1 - 1e-12), 110 * SEC);
  // Any window with at least 2 s left: within [1 s, expiry], and at least the jittered floor.
  let seed = 42;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  for (let i = 0; i < 5_000; i++) {
    const notAfter = r + 2 * SEC + rnd() * 48 * HOUR;
    const notBefore = notAfter - rnd() * 72 * HOUR - 1;
    const remaining = notAfter - r;
    const d = refreshDelayMs(notBefore, notAfter, r, rnd());
    const floor = Math.min(5 * MIN, remaining / 2);
    assert.ok(d >= 1 * SEC && d <= remaining, `delay ${d} outside [1 s, ${remaining}]`);
    assert.ok(d >= Math.min(floor * 0.95, remaining) - 1e-6, `delay ${d} under the floor ${floor}`);
  }
});

test('istiod with a 60 s TTL backdated 2 min: the refresh is ~30 s after receipt, not immediately', { skip: skipDated }, async () => {
  const clock = fakeClock(T0);
  const { ca, calls } = datedCa(clock, ISTIOD_60S);
  const m = managerOn(clock, ca);
  const ready = m.ensure(ID);
  await clock.advance(0);
  assert.equal(await ready, true);
  assert.deepEqual(clock.armed(), [30 * SEC]);
  await clock.advance(29 * SEC);
  assert.equal(calls.length, 1, 'no refresh before the floor');
  await clock.advance(1 * SEC);
  assert.equal(calls.length, 2);
  m.stop();

  // The jitter moves it by at most 5 % either way.
  for (const [random, expected] of [[0, 28.5 * SEC], [1 - 1e-12, 31.5 * SEC]]) {
    const c = fakeClock(T0);
    const m2 = managerOn(c, datedCa(c, ISTIOD_60S).ca, { random: () => random });
    void m2.ensure(ID);
    await c.advance(0);
    const [delay] = c.armed();
    assert.ok(Math.abs(delay - expected) < 1, `random ${random}: delay ${delay}, expected ${expected}`);
    m2.stop();
  }
});

test('a 24 h certificate is refreshed at its half-life, within the jitter', { skip: skipDated }, async () => {
  for (const [random, factor] of [[0, 0.95], [0.5, 1], [1 - 1e-12, 1.05]]) {
    const clock = fakeClock(T0);
    const { ca, calls } = datedCa(clock, { backdateMs: 2 * MIN, validMs: 24 * HOUR });
    const m = managerOn(clock, ca, { random: () => random });
    void m.ensure(ID);
    await clock.advance(0);
    const [delay] = clock.armed();
    const halfLife = 12 * HOUR - 1 * MIN; // (24 h + 2 min) / 2 after notBefore
    assert.ok(Math.abs(delay - halfLife * factor) < 1, `random ${random}: delay ${delay}`);
    await clock.advance(delay - 1);
    assert.equal(calls.length, 1);
    await clock.advance(1);
    assert.equal(calls.length, 2);
    m.stop();
  }
});

test('short validity: refreshed after about half of what remains, never at once, never after expiry', { skip: skipDated }, async () => {
  for (const validMs of [10 * SEC, 4 * SEC, 2 * SEC]) {
    for (const random of [0, 0.5, 1 - 1e-12]) {
      const clock = fakeClock(T0);
      const m = managerOn(clock, datedCa(clock, { backdateMs: 2 * MIN, validMs }).ca, { random: () => random });
      void m.ensure(ID);
      await clock.advance(0);
      assert.equal(m.dump()[0].state, 'Available');
      const [delay] = clock.armed();
      const what = `valid ${validMs} ms, random ${random}: delay ${delay}`;
      assert.ok(delay >= 1 * SEC, `${what} is under 1 s`);
      assert.ok(delay < validMs, `${what} is not before expiry`);
      assert.ok(delay >= Math.max(1 * SEC, (validMs / 2) * 0.95) - 1 && delay <= (validMs / 2) * 1.05 + 1, `${what} is not ~half`);
      m.stop();
    }
  }
});

test('refreshes that keep landing backdated never loop: one per ~30 s over 10 minutes', { skip: skipDated }, async () => {
  const clock = fakeClock(T0);
  const { ca, calls } = datedCa(clock, ISTIOD_60S);
  const expiries: number[] = [];
  const keys: KeyStore = {
    createCsr: (id) => `CSR ${id}`,
    installCertificate: (id, chainPem) => expiries.push(new Date(new X509Certificate(chainPem).validTo).getTime()),
  };
  let seed = 7;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const m = managerOn(clock, ca, { random, keys });
  void m.ensure(ID);
  await clock.advance(10 * MIN);
  // Each certificate has 60-61 s left (whole seconds), so each delay is 30-30.5 s +-5 %: 19 to 21 refreshes in
  // 600 s after the first fetch.
  assert.ok(calls.length >= 20 && calls.length <= 22, `${calls.length} CA calls in 10 simulated minutes`);
  assert.ok(clock.requested.every((d) => d >= 28.5 * SEC - 1 && d <= 32.025 * SEC + 1), `delays ${clock.requested}`);
  // Each refresh asked before the certificate in use expired.
  for (let i = 1; i < calls.length; i++) assert.ok(calls[i] < expiries[i - 1], `refresh ${i} after expiry`);
  assert.equal(m.dump()[0].state, 'Available');
  m.stop();
});

test('a certificate already expired (or about to) at receipt is not installed: a failure with backoff, no loop', { skip: skipDated }, async () => {
  const clock = fakeClock(T0);
  const { ca, calls } = datedCa(clock, { backdateMs: 3 * MIN, validMs: -1 * MIN });
  const installed: string[] = [];
  const m = managerOn(clock, ca, { keys: { ...keysOnly, installCertificate: (id) => installed.push(id) } });
  let resolved = false;
  void m.ensure(ID).then(() => (resolved = true));
  await clock.advance(0);
  assert.match(m.dump()[0].state, /^Unavailable: the CA returned a certificate valid until 2029-12-31T23:59:00\.000Z, already expired when received at 2030-01-01T00:00:00\.000Z/);
  assert.deepEqual(installed, []);
  assert.deepEqual(clock.armed(), [1 * SEC], 'the first backoff step (1 s, jitter pinned to the middle)');
  // Backoff 1, 2, 4, 8, 16 s: attempts at 0, 1, 3, 7, 15 and 31 s in the first minute (the next is at 63 s).
  await clock.advance(1 * MIN);
  assert.equal(calls.length, 6);
  assert.equal(resolved, false);
  m.stop();

  // 1 s of validity left is refused too (half of it would be under the 1 s minimum delay).
  const c2 = fakeClock(T0);
  const m2 = managerOn(c2, datedCa(c2, { backdateMs: 2 * MIN, validMs: 1 * SEC }).ca);
  void m2.ensure(ID);
  await c2.advance(0);
  assert.match(m2.dump()[0].state, /^Unavailable: .*only 1000 ms when received .* \(at least 2000 ms needed\)/);
  m2.stop();
});

test('an unusable certificate from a refresh leaves the working one installed and Available', { skip: skipDated }, async () => {
  const clock = fakeClock(T0);
  // First a good 60 s certificate, then expired ones.
  const { ca, calls } = datedCa(clock, (n) => (n === 0 ? ISTIOD_60S : { backdateMs: 3 * MIN, validMs: -1 * MIN }));
  const installed: string[] = [];
  const m = managerOn(clock, ca, { keys: { ...keysOnly, installCertificate: (id) => installed.push(id) } });
  assert.equal(await Promise.all([m.ensure(ID), clock.advance(0)]).then(([ok]) => ok), true);
  await clock.advance(30 * SEC); // the refresh, which gets an expired certificate
  assert.equal(calls.length, 2);
  assert.equal(m.dump()[0].state, 'Available');
  assert.equal(installed.length, 1);
  // The retry is at the backoff (1 s), not at once.
  assert.deepEqual(clock.armed(), [1 * SEC]);
  m.stop();
});
