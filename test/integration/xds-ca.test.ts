// Certificates from istiod's CA protocol (the fake istiod's CreateCertificate, real gRPC over TLS): a response
// for the wrong identity is refused; short certificates rotate under steady traffic with no failed connection and
// no refresh loop; with the CA down, unexpired certificates keep serving and retries back off.
// The fake CA backdates notBefore by 60 s, and the manager refreshes at max(half life, received + min(5 min, half of
// what remains)) +-5 %: a short certificate is renewed after about half of what remained when it arrived. The
// tests make the CA issue short certificates (`validFor`) whatever TTL the daemon asks for (SECRET_TTL 66 s).
// Workloads come from a local config file (LOCAL_XDS_PATH, no XDS), certificates from CA_ADDRESS.
// Block 127.61.0.0/16 (test/helpers/net.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { makeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import type { Daemon, EnvInput } from '../helpers/daemon.js';
import { block, closeSocket, echoOnce, httpGet, socks5Request, startEchoServer, throughSocks5, waitFor } from '../helpers/net.js';
import type { TestServer } from '../helpers/net.js';
import { makeCa, makeLeaf } from '../helpers/pki.js';
import { ISTIOD_HOSTNAME, startFakeIstiod } from '../helpers/fake-istiod.js';
import type { CertRequest, FakeIstiod } from '../helpers/fake-istiod.js';
import { sumSamples } from '../../dist/cli/prom-text.js';
import type { IdentityDump } from '../../dist/ca/manager.js';

const net = block(61);
const SLEEP = net.workload(1);
const ECHO = net.workload(2);
const config = {
  workloads: [workload({ name: 'sleep', ip: SLEEP, node: 'node-a' }), workload({ name: 'echo', ip: ECHO, node: 'node-b' })],
};
const SLEEP_ID = 'spiffe://cluster.local/ns/default/sa/sleep';
const ECHO_ID = 'spiffe://cluster.local/ns/default/sa/echo';

const dir = makeTempDir('ztn-xds-ca-');
let istiod: FakeIstiod;
let echo: TestServer;
const cleanups: (() => unknown)[] = [];
const fileCleanup = { after: (fn: () => unknown) => cleanups.push(fn) };

test.before(async () => {
  istiod = await startFakeIstiod({ dir });
  echo = await startEchoServer(ECHO, 8080);
});
test.after(async () => {
  for (const fn of cleanups) await fn();
  await istiod?.close();
  await echo?.close();
});

function env(extra: EnvInput = {}): EnvInput {
  return {
    CA_ADDRESS: istiod.address,
    CA_ROOT_CA: istiod.rootCaPath,
    ALT_CA_HOSTNAME: ISTIOD_HOSTNAME,
    AUTH_TOKEN: 'literal-token',
    ...extra,
  };
}

async function dump(d: Daemon): Promise<{ certificates: IdentityDump[] }> {
  return JSON.parse((await httpGet(`${d.adminUrl}/config_dump`)).body);
}

const through = (message = 'ping') => throughSocks5(SLEEP, ECHO, 8080, message);

/** A signer whose certificates are valid `seconds` from issue (notBefore still backdated 60 s), whatever TTL was asked. */
const validFor = (seconds: number) => (rec: CertRequest) => istiod.sign({ ...rec, ttlSeconds: seconds });

async function certificate(d: Daemon, identity: string): Promise<IdentityDump> {
  return (await dump(d)).certificates.find((x) => x.identity === identity)!;
}

/** CreateCertificate calls for `identity` recorded from index `from` of `istiod.certRequests` on. */
const requestsFor = (identity: string, from = 0) =>
  istiod.certRequests.slice(from).filter((x) => x.identity === identity);

let a: Daemon;
let b: Daemon;

test('a certificate for the wrong identity is refused; readiness waits; the right one is installed', async () => {
  const foreign = makeCa(dir, 'foreign');
  istiod.signer = () => {
    const leaf = makeLeaf(dir, foreign, ['spiffe://cluster.local/ns/default/sa/intruder']);
    return [leaf.certPem, foreign.certPem];
  };
  const starting = startDaemon({ node: 'node-a', config, adminIp: net.admin(1), env: env({ SECRET_TTL: '66s' }), cleanup: fileCleanup });
  await waitFor(() => istiod.certRequests.some((r) => r.identity === SLEEP_ID), { message: 'a CSR for sleep' });
  await waitFor(
    async () => {
      const r = await httpGet(`http://${net.admin(1)}:15000/config_dump`).catch(() => null);
      const c = r && JSON.parse(r.body).certificates.find((x: IdentityDump) => x.identity === SLEEP_ID);
      return c && /^Unavailable: .*intruder.*not spiffe:\/\/cluster\.local\/ns\/default\/sa\/sleep/.test(c.state);
    },
    { message: 'sleep Unavailable naming the wrong identity' },
  );
  const r = await httpGet(`http://${net.admin(1)}:15021/healthz/ready`);
  assert.equal(r.status, 500);
  assert.match(r.body, /certificates/);
  // Local mode asks on the workloads' behalf; the request names the identity, with the token.
  const req = istiod.certRequests.find((x) => x.identity === SLEEP_ID)!;
  assert.deepEqual(req.requestMetadata, { ImpersonatedIdentity: SLEEP_ID });
  assert.equal(req.metadata.authorization, 'Bearer literal-token');
  assert.equal(req.ttlSeconds, 66);

  // The next retry (about 1 s later) gets a good certificate; valid for 6 s, so the next test sees it rotate.
  istiod.signer = validFor(6);
  a = await starting;
  const c = (await dump(a)).certificates.find((x) => x.identity === SLEEP_ID)!;
  assert.equal(c.state, 'Available');
  b = await startDaemon({ node: 'node-b', config, adminIp: net.admin(2), env: env({ SECRET_TTL: '66s' }), cleanup: fileCleanup });
  // Each daemon asked only for its own workloads' identities.
  assert.deepEqual([...new Set(istiod.certRequests.map((x) => x.identity))].sort(), [ECHO_ID, SLEEP_ID]);
  assert.equal(await through(), 0);
});

test('short certificates rotate under steady traffic: new serials, no failed connection, no refresh loop', async () => {
  // 6 s certificates (notAfter is whole seconds, so 5-6 s remain on receipt) are renewed after half of that, +-5 %:
  // every 2.4-3.2 s. Under "half life" alone they would be renewed as soon as allowed (the half life is 27 s before
  // issue), in a loop.
  const from = istiod.certRequests.length;
  const lastBefore: Record<string, number> = {
    [SLEEP_ID]: requestsFor(SLEEP_ID).at(-1)!.at,
    [ECHO_ID]: requestsFor(ECHO_ID).at(-1)!.at,
  };
  const serials: Record<string, Set<string>> = { [SLEEP_ID]: new Set(), [ECHO_ID]: new Set() };
  const record = async () => {
    serials[SLEEP_ID].add((await certificate(a, SLEEP_ID)).certChain[0].serialNumber);
    serials[ECHO_ID].add((await certificate(b, ECHO_ID)).certChain[0].serialNumber);
  };
  await record();
  const live = await socks5Request({ socks: { host: SLEEP, port: 15080 }, dest: { host: ECHO, port: 8080 } });
  assert.equal(live.code, 0);
  const until = Date.now() + 8_000;
  let n = 0;
  while (Date.now() < until) {
    assert.equal(await through(`steady ${n}`), 0, `connection ${n} failed`);
    await echoOnce(live.socket, `live ${n}`);
    await record();
    n++;
    await new Promise((r) => setTimeout(r, 100));
  }
  await closeSocket(live.socket);
  for (const id of [SLEEP_ID, ECHO_ID]) {
    const times = [lastBefore[id], ...requestsFor(id, from).map((x) => x.at)];
    const gaps = times.slice(1).map((t, i) => t - times[i]);
    // At most one request per ~2.4 s: 8 s hold 2 to 4 renewals, never the dozens of a loop.
    assert.ok(gaps.length >= 2 && gaps.length <= 4, `${id} renewed ${gaps.length} times in 8 s`);
    assert.ok(gaps.every((g) => g >= 2_000), `${id}: requests ${gaps.join(', ')} ms apart (at least ~2.4 s expected)`);
    // Each renewal is installed: the first serial and at least two new ones were in use.
    assert.ok(serials[id].size >= 3, `${id} used ${serials[id].size} certificates`);
  }
  for (const d of [a, b]) {
    const s = await d.metrics();
    assert.equal(sumSamples(s, 'istio_tcp_connections_failed_total', {}), 0);
  }
});

test('CA down: unexpired certificates keep serving, retries back off', async () => {
  // sleep gets 22 s certificates: one is renewed ~11 s after it arrives (half of 21-22 s, +-5 %), and when that fails
  // the retries follow ~1, ~2, ~4 s apart (+-20 %), all before it expires (at worst 11.6 + 8.4 = 20 s < 21 s).
  // echo gets 66 s ones, renewed after ~33 s (past this test), so the other end of the connections stays valid.
  const from = istiod.certRequests.length;
  istiod.signer = (rec) => (rec.identity === SLEEP_ID ? validFor(22)(rec) : istiod.sign(rec));
  const kept = await waitFor(
    async () => {
      const c = await certificate(a, SLEEP_ID);
      return requestsFor(SLEEP_ID, from).length > 0 && Date.parse(c.certChain[0].expirationTime) - Date.now() > 15_000 && c;
    },
    { message: "sleep's 22 s certificate" },
  );
  await waitFor(async () => Date.parse((await certificate(b, ECHO_ID)).certChain[0].expirationTime) - Date.now() > 60_000, {
    message: "echo's 66 s certificate",
  });
  istiod.caUp = false;
  const issued = requestsFor(SLEEP_ID, from);
  assert.equal(issued.length, 1, 'one request for sleep got its 22 s certificate');
  const expiry = Date.parse(kept.certChain[0].expirationTime);
  const serial = kept.certChain[0].serialNumber;
  const attempts = () => requestsFor(SLEEP_ID, from).slice(1).map((x) => x.at);
  const untilExpiry = (marginMs: number) => ({ timeoutMs: Math.max(0, expiry - Date.now() - marginMs) });

  await waitFor(() => attempts().length >= 3, { ...untilExpiry(1_500), message: 'a failed refresh and two retries' });
  // Between the second and the third retry (>= 3.2 s): the kept certificate still serves.
  for (let i = 0; i < 3; i++) assert.equal(await through(`down ${i}`), 0);
  let c = await certificate(a, SLEEP_ID);
  assert.equal(c.state, 'Available', 'a failed refresh keeps the unexpired certificate');
  assert.equal(c.certChain[0].serialNumber, serial);
  assert.equal((await httpGet(a.readinessUrl)).status, 200);

  await waitFor(() => attempts().length >= 4, { ...untilExpiry(300), message: 'the third retry' });
  const failed = attempts();
  c = await certificate(a, SLEEP_ID);
  istiod.caUp = true;
  assert.equal(failed.length, 4, `attempts while down: ${failed.length}`);
  // The refresh is due at about half the remaining validity, not seconds after the certificate arrived.
  assert.ok(failed[0] - issued[0].at >= 9_000, `refreshed ${failed[0] - issued[0].at} ms after issue (~11 s expected)`);
  const gaps = failed.slice(1).map((t, i) => t - failed[i]);
  // Each step doubles with +-20 % jitter, so one step grows the gap by at least 0.8 * 2 / 1.2 = 1.33x (the exact
  // sequence is the certificate-manager unit test's, with the jitter pinned).
  assert.ok(gaps[0] >= 700, `first retry ${gaps[0]} ms after the failure (~1 s expected)`);
  assert.ok(gaps[1] > gaps[0] * 1.2 && gaps[2] > gaps[1] * 1.2, `gaps ${gaps.join(', ')} ms should grow`);
  assert.equal(c.state, 'Available', 'still Available after three failed retries');
  assert.equal(c.certChain[0].serialNumber, serial);
});
