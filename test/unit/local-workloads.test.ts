// The local-workload reconciler on its own: which workloads get certificates (prefetch) and listeners, in which
// order, and what happens when they move, change identity or leave.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { LocalWorkloads } from '../../dist/lifecycle/local-workloads.js';
import { createLogs } from '../../dist/log/logger.js';
import type { CertificateManager, PriorityName } from '../../dist/ca/manager.js';
import type { LocalWorkloadSpec, Workload, WorkloadProtocol } from '../../dist/native/types.js';

/** One call the fakes saw: the operation, its identity, uid or spec, and (ensure) its priority. */
type Call = [op: string, subject: string | LocalWorkloadSpec, priority?: PriorityName];

const logger = createLogs({ filter: { level: 'off', targets: {} }, format: 'json', sink: { write: () => {} } }).root;

/** A workload with the fields the reconciler reads (it looks at no other, so the record is left partial). */
function w(
  uid: string,
  {
    node = 'me',
    protocol = 'HBONE',
    sa = uid,
    ip = '127.0.0.5',
    nativeTunnel = false,
  }: { node?: string; protocol?: WorkloadProtocol; sa?: string; ip?: string; nativeTunnel?: boolean } = {},
): Workload {
  return { uid, node, protocol, nativeTunnel, namespace: 'ns', serviceAccount: sa, trustDomain: 'td', workloadIps: [ip] } as Workload;
}

function fakes(withListeners: boolean): { lw: LocalWorkloads; log: Call[]; errors: [string, string][] } {
  const log: Call[] = [];
  // Like the real manager, ensure is idempotent: only the first call for an identity fetches ("ensure" here).
  const tracked = new Set<string>();
  const certs = {
    ensure: async (id: string, priority?: PriorityName) => {
      if (!tracked.has(id)) log.push(['ensure', id, priority]);
      tracked.add(id);
      return true;
    },
    forget: (id: string) => {
      tracked.delete(id);
      log.push(['forget', id]);
    },
  };
  const listeners = withListeners
    ? {
        socks5: true,
        add: async (spec: LocalWorkloadSpec) => (log.push(['add', spec]), spec),
        // Resolves to the log's length, which the reconciler ignores (its type says void).
        remove: (async (uid: string) => log.push(['remove', uid])) as unknown as (uid: string) => Promise<void>,
      }
    : null;
  const errors: [string, string][] = [];
  // A stand-in for the certificate manager: the reconciler calls only ensure and forget.
  const lw = new LocalWorkloads({ nodeName: 'me', certs: certs as CertificateManager, listeners, logger, onError: (uid, err) => errors.push([uid, (err as Error).message]) });
  return { lw, log, errors };
}

test('local mode: certificate then listeners for workloads on this node only; identity kept while shared', async () => {
  const { lw, log } = fakes(true);
  lw.reconcile([
    { uid: 'a', before: undefined, after: w('a', { sa: 'shared' }) },
    { uid: 'b', before: undefined, after: w('b', { sa: 'shared', protocol: 'TCP', ip: '127.0.0.6' }) },
    { uid: 'x', before: undefined, after: w('x', { node: 'other' }) },
  ]);
  await lw.settled();
  assert.deepEqual(log.filter(([op]) => op === 'ensure').map(([, id, p]) => [id, p]), [['spiffe://td/ns/ns/sa/shared', 'Warmup']]);
  assert.deepEqual(log.filter(([op]) => op === 'add').map(([, s]) => s), [
    { uid: 'a', hboneAddr: '127.0.0.5:15008', socksAddr: '127.0.0.5:15080' },
    { uid: 'b', socksAddr: '127.0.0.6:15080' },
  ]);
  // An unrelated change (same IP, protocol, identity) does nothing.
  log.length = 0;
  lw.reconcile([{ uid: 'a', before: w('a', { sa: 'shared' }), after: { ...w('a', { sa: 'shared' }), canonicalName: 'new' } }]);
  await lw.settled();
  assert.deepEqual<Call[]>(log, []); // (typed: an assertion of [] would narrow `log` to never[])
  // a leaves: listeners removed, identity still used by b, so not forgotten; then b leaves: forgotten.
  lw.reconcile([{ uid: 'a', before: w('a', { sa: 'shared' }), after: undefined }]);
  await lw.settled();
  assert.deepEqual(log, [['remove', 'a']]);
  lw.reconcile([{ uid: 'b', before: w('b', { sa: 'shared' }), after: w('b', { sa: 'shared', node: 'other' }) }]);
  await lw.settled();
  // The identity is given up at once (even before the listeners go), as it has no other user.
  assert.deepEqual(log.slice(1), [['forget', 'spiffe://td/ns/ns/sa/shared'], ['remove', 'b']]);
  // Nothing is held for either any more: b coming back is set up from scratch.
  log.length = 0;
  lw.reconcile([{ uid: 'b', before: undefined, after: w('b', { sa: 'shared' }) }]);
  await lw.settled();
  assert.deepEqual(log.map(([op]) => op), ['ensure', 'add']);
});

test('an identity change rebinds with the new certificate and forgets the old identity', async () => {
  const { lw, log } = fakes(true);
  lw.reconcile([{ uid: 'a', before: undefined, after: w('a', { sa: 'one' }) }]);
  lw.reconcile([{ uid: 'a', before: w('a', { sa: 'one' }), after: w('a', { sa: 'two' }) }]);
  await lw.settled();
  // Both reconciles happen before any listener work: "one" is claimed, then given up for "two".
  assert.deepEqual(log.map(([op, x]) => [op, typeof x === 'string' ? x : x.uid]), [
    ['ensure', 'spiffe://td/ns/ns/sa/one'],
    ['ensure', 'spiffe://td/ns/ns/sa/two'],
    ['forget', 'spiffe://td/ns/ns/sa/one'],
    ['add', 'a'],
  ]);
  log.length = 0;
  lw.reconcile([{ uid: 'a', before: w('a', { sa: 'two' }), after: w('a', { sa: 'three' }) }]);
  await lw.settled();
  assert.deepEqual(log.map(([op, x]) => [op, typeof x === 'string' ? x : x.uid]), [
    ['ensure', 'spiffe://td/ns/ns/sa/three'],
    ['forget', 'spiffe://td/ns/ns/sa/two'],
    ['remove', 'a'],
    ['add', 'a'],
  ]);
});

test('without listeners (shared mode): prefetch certificates for HBONE or native-tunnel workloads on this node only', async () => {
  const { lw, log } = fakes(false);
  lw.reconcile([
    { uid: 'h', before: undefined, after: w('h') },
    { uid: 't', before: undefined, after: w('t', { protocol: 'TCP' }) },
    { uid: 'n', before: undefined, after: w('n', { protocol: 'TCP', nativeTunnel: true }) },
    { uid: 'o', before: undefined, after: w('o', { node: 'other' }) },
  ]);
  await lw.settled();
  assert.deepEqual(log.map(([op, id]) => [op, id]), [['ensure', 'spiffe://td/ns/ns/sa/h'], ['ensure', 'spiffe://td/ns/ns/sa/n']]);
});

test('a new IP rebinds without fetching the certificate again; a workload leaving while its certificate is pending is not stuck', async () => {
  const { lw, log } = fakes(true);
  lw.reconcile([{ uid: 'a', before: undefined, after: w('a') }]);
  await lw.settled();
  lw.reconcile([{ uid: 'a', before: w('a'), after: w('a', { ip: '127.0.0.9' }) }]);
  await lw.settled();
  assert.deepEqual(log.map(([op, x]) => [op, typeof x === 'string' ? x : x.hboneAddr]), [
    ['ensure', 'spiffe://td/ns/ns/sa/a'],
    ['add', '127.0.0.5:15008'],
    ['remove', 'a'],
    ['add', '127.0.0.9:15008'],
  ]);
  assert.equal(log.filter(([op]) => op === 'forget').length, 0);

  // The CA never answers for "b": when b leaves, forgetting its identity releases the pending request.
  const waiting = new Map<string, ((ok: boolean) => void)[]>();
  const certs = {
    ensure: (id: string) => new Promise<boolean>((resolve) => {
      const all = waiting.get(id) ?? [];
      all.push(resolve);
      waiting.set(id, all);
    }),
    forget: (id: string) => (waiting.get(id) ?? []).forEach((r) => r(false)),
  };
  const lw2 = new LocalWorkloads({ nodeName: 'me', certs: certs as CertificateManager, listeners: null, logger, onError: () => {} });
  lw2.reconcile([{ uid: 'b', before: undefined, after: w('b') }]);
  lw2.reconcile([{ uid: 'b', before: w('b'), after: undefined }]);
  // Settles at once: the forget released the request that would otherwise wait for the CA forever.
  let timer: NodeJS.Timeout | undefined;
  const stuck = new Promise((_, reject) => (timer = setTimeout(() => reject(new Error('the pending certificate request was not released')), 2_000)));
  await Promise.race([lw2.settled(), stuck]).finally(() => clearTimeout(timer));
});
