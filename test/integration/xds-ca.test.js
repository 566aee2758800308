// Certificates from istiod's CA protocol (the fake istiod's CreateCertificate, real gRPC over TLS): a response
// for the wrong identity is refused; with a short TTL certificates rotate at half life under steady traffic with
// no failed connection; with the CA down, unexpired certificates keep serving and retries back off.
// Workloads come from a local config file (LOCAL_XDS_PATH, no XDS), certificates from CA_ADDRESS.
// Block 127.61.0.0/16 (test/helpers/net.js).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { makeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import { block, closeSocket, echoOnce, httpGet, socks5Request, startEchoServer, throughSocks5, waitFor } from '../helpers/net.js';
import { makeCa, makeLeaf } from '../helpers/pki.js';
import { ISTIOD_HOSTNAME, startFakeIstiod } from '../helpers/fake-istiod.js';
import { sumSamples } from '../../dist/cli/prom-text.js';

const net = block(61);
const SLEEP = net.workload(1);
const ECHO = net.workload(2);
const config = {
  workloads: [workload({ name: 'sleep', ip: SLEEP, node: 'node-a' }), workload({ name: 'echo', ip: ECHO, node: 'node-b' })],
};
const SLEEP_ID = 'spiffe://cluster.local/ns/default/sa/sleep';
const ECHO_ID = 'spiffe://cluster.local/ns/default/sa/echo';

const dir = makeTempDir('ztn-xds-ca-');
let istiod;
let echo;
const cleanups = [];
const fileCleanup = { after: (fn) => cleanups.push(fn) };

test.before(async () => {
  istiod = await startFakeIstiod({ dir });
  echo = await startEchoServer(ECHO, 8080);
});
test.after(async () => {
  for (const fn of cleanups) await fn();
  await istiod?.close();
  await echo?.close();
});

function env(extra = {}) {
  return {
    CA_ADDRESS: istiod.address,
    CA_ROOT_CA: istiod.rootCaPath,
    ALT_CA_HOSTNAME: ISTIOD_HOSTNAME,
    AUTH_TOKEN: 'literal-token',
    ...extra,
  };
}

async function dump(d) {
  return JSON.parse((await httpGet(`${d.adminUrl}/config_dump`)).body);
}

const through = (message = 'ping') => throughSocks5(SLEEP, ECHO, 8080, message);

let a;
let b;

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
      const c = r && JSON.parse(r.body).certificates.find((x) => x.identity === SLEEP_ID);
      return c && /^Unavailable: .*intruder.*not spiffe:\/\/cluster\.local\/ns\/default\/sa\/sleep/.test(c.state);
    },
    { message: 'sleep Unavailable naming the wrong identity' },
  );
  const r = await httpGet(`http://${net.admin(1)}:15021/healthz/ready`);
  assert.equal(r.status, 500);
  assert.match(r.body, /certificates/);
  // Local mode asks on the workloads' behalf; the request names the identity, with the token.
  const req = istiod.certRequests.find((x) => x.identity === SLEEP_ID);
  assert.deepEqual(req.requestMetadata, { ImpersonatedIdentity: SLEEP_ID });
  assert.equal(req.metadata.authorization, 'Bearer literal-token');
  assert.equal(req.ttlSeconds, 66);

  istiod.signer = null; // the next retry (about 1 s later) gets a good certificate
  a = await starting;
  const c = (await dump(a)).certificates.find((x) => x.identity === SLEEP_ID);
  assert.equal(c.state, 'Available');
  b = await startDaemon({ node: 'node-b', config, adminIp: net.admin(2), env: env({ SECRET_TTL: '66s' }), cleanup: fileCleanup });
  // Each daemon asked only for its own workloads' identities.
  assert.deepEqual([...new Set(istiod.certRequests.map((x) => x.identity))].sort(), [ECHO_ID, SLEEP_ID]);
  assert.equal(await through(), 0);
});

test('short TTL: certificates rotate at half life under steady traffic, no connection fails', async () => {
  // The CA backdates notBefore by 60 s, so a 66 s TTL has its half life ~3 s after issue.
  const before = istiod.certRequests.filter((x) => x.identity === ECHO_ID).length;
  const serial = async (d, id) => (await dump(d)).certificates.find((x) => x.identity === id).certChain[0].serialNumber;
  const firstSerial = await serial(b, ECHO_ID);
  const live = await socks5Request({ socks: { host: SLEEP, port: 15080 }, dest: { host: ECHO, port: 8080 } });
  assert.equal(live.code, 0);
  const until = Date.now() + 8_000;
  let n = 0;
  while (Date.now() < until) {
    assert.equal(await through(`steady ${n}`), 0, `connection ${n} failed`);
    await echoOnce(live.socket, `live ${n}`);
    n++;
    await new Promise((r) => setTimeout(r, 100));
  }
  await closeSocket(live.socket);
  const rotations = istiod.certRequests.filter((x) => x.identity === ECHO_ID).length - before;
  assert.ok(rotations >= 2, `echo's certificate was renewed ${rotations} times in 8 s`);
  assert.notEqual(await serial(b, ECHO_ID), firstSerial);
  for (const d of [a, b]) {
    const s = await d.metrics();
    assert.equal(sumSamples(s, 'istio_tcp_connections_failed_total', {}), 0);
  }
});

test('CA down: unexpired certificates keep serving, retries back off', async () => {
  istiod.caUp = false;
  const downAt = Date.now();
  // Refreshes are due every ~3 s; failed ones retry after ~1 s, ~2 s, ~4 s (+-20 %), capped by the expiry.
  await new Promise((r) => setTimeout(r, 9_000));
  for (let i = 0; i < 3; i++) assert.equal(await through(`down ${i}`), 0);
  const failed = istiod.certRequests.filter((x) => x.identity === SLEEP_ID && x.at >= downAt).map((x) => x.at);
  assert.ok(failed.length >= 3 && failed.length <= 6, `attempts while down: ${failed.length}`);
  const gaps = failed.slice(1).map((t, i) => t - failed[i]);
  // Each step doubles with +-20 % jitter, so one step grows the gap by at least 0.8 * 2 / 1.2 = 1.33x (the exact
  // sequence is the certificate-manager unit test's, with the jitter pinned).
  assert.ok(gaps[gaps.length - 1] > gaps[0] * 1.2, `gaps ${gaps.join(', ')} ms should grow`);
  const c = (await dump(a)).certificates.find((x) => x.identity === SLEEP_ID);
  assert.equal(c.state, 'Available', 'a failed refresh keeps the unexpired certificate');
  assert.equal((await httpGet(a.readinessUrl)).status, 200);
  istiod.caUp = true;
});
