// istiod's push order and continuous authorization (README "Authorization", stricter case 2). When a selector
// AuthorizationPolicy (or a STRICT PeerAuthentication) is added, istiod sends the workload's new
// `authorization_policies` in an Address response about half a millisecond BEFORE the Authorization response that
// carries the policy. New connections are refused in between (fail closed), but a LIVE connection is not judged
// on a named policy that has not arrived until it arrives or a grace period (MISSING_POLICY_GRACE, 1 s by
// default) has passed: the connections the final policy allows must survive; a policy that never arrives closes
// them after the grace, with a log line naming it.
//
// Two real daemons fed ONLY by the fake istiod (a real gRPC server, scripted turn by turn); live connections go
// SOCKS5 entry of a source workload on node-a → HBONE (mTLS) → echo on node-b. Every scenario puts the Address
// back without the policy reference (and removes the policy) when it ends, and starts by opening its connections,
// which checks that reset.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as delay } from 'node:timers/promises';
import type { Socket } from 'node:net';
import { makeTempDir, startDaemon, type Daemon } from '../helpers/daemon.js';
import {
  BLOCKS,
  block,
  echoOnce,
  closeSocket,
  httpGet,
  socks5Request,
  startEchoServer,
  type TestServer,
} from '../helpers/net.js';
import {
  ADDRESS,
  AUTHORIZATION,
  istiodEnv,
  policyResource,
  startFakeIstiod,
  workloadResource,
  type AdsRequest,
  type AdsStream,
  type FakeIstiod,
  type PushBody,
} from '../helpers/fake-istiod.js';
import type { AuthorizeExplanation } from '../../dist/native/types.js';

const net = block(BLOCKS['authz-push-order']);
const SLEEP = net.workload(1); // on node-a, service account sleep
const ECHO = net.workload(2); // on node-b
const OTHER = net.workload(3); // on node-a, service account other
const ADMIN_A = net.admin(1);
const ADMIN_B = net.admin(2);
const PORT = 8080;
const NS = 'default';

/** The default MISSING_POLICY_GRACE (not set here: the tests rely on the default). */
const GRACE_MS = 1_000;
/** SOCKS5 reply when node-b answered the CONNECT with 401 (authz.test.ts). */
const SOCKS_NOT_ALLOWED = 2;

const SCOPE_WORKLOAD_SELECTOR = 2;
const ACTION_ALLOW = 0;
const ACTION_DENY = 1;

const ALLOW_SLEEP = `${NS}/allow-sleep`;
const STRICT = `${NS}/istio_converted_static_strict`;
const NEVER_SENT = `${NS}/never-sent`;

/** ALLOW, selector-scoped, only sleep's principal (compared without `spiffe://`). */
const allowSleep = (version: string) =>
  policyResource({
    name: 'allow-sleep',
    ns: NS,
    scope: SCOPE_WORKLOAD_SELECTOR,
    action: ACTION_ALLOW,
    version,
    rules: [{ clauses: [{ matches: [{ principals: [{ matchType: { case: 'exact', value: `cluster.local/ns/${NS}/sa/sleep` } }] }] }] }],
  });

/** What istiod converts a STRICT PeerAuthentication into: DENY when the source has no principal at all. */
const strict = (version: string) =>
  policyResource({
    name: 'istio_converted_static_strict',
    ns: NS,
    scope: SCOPE_WORKLOAD_SELECTOR,
    action: ACTION_DENY,
    version,
    rules: [{ clauses: [{ matches: [{ notPrincipals: [{ matchType: { case: 'presence', value: {} } }] }] }] }],
  });

const dir = makeTempDir('ztn-authz-push-order-');
let istiod: FakeIstiod;
let echo: TestServer;
let a: Daemon;
let b: Daemon;
let streamA: AdsStream;
let streamB: AdsStream;
// Daemons live across this file's tests: killed when the FILE ends.
const cleanups: (() => unknown)[] = [];
const fileCleanup = { after: (fn: () => unknown) => cleanups.push(fn) };

let versions = 0;
const nextVersion = () => `v${++versions}`;

const sleepW = () => workloadResource({ name: 'sleep', ip: SLEEP, node: 'node-a', ns: NS });
const otherW = () => workloadResource({ name: 'other', ip: OTHER, node: 'node-a', ns: NS });
/** echo, naming `policies` (its `authorization_policies`). */
const echoW = (policies: string[] = [], version = nextVersion()) =>
  workloadResource({ name: 'echo', ip: ECHO, node: 'node-b', ns: NS, version, extra: { authorizationPolicies: policies } });

const daemonEnv = (node: string) => istiodEnv(istiod, node, { AUTH_TOKEN: 'literal-token' });

/** Starts a daemon and answers its stream's initial requests (both types), so that it turns ready. */
async function startXdsDaemon(node: string, adminIp: string) {
  const starting = startDaemon({ node, config: {}, adminIp, env: daemonEnv(node), cleanup: fileCleanup });
  const stream = await istiod.nextStream();
  await stream.nextRequest(ADDRESS);
  await stream.nextRequest(AUTHORIZATION);
  assertAck(await stream.pushAndWait(ADDRESS, { resources: [sleepW(), otherW(), echoW([])] }), `${node} initial Address`);
  assertAck(await stream.pushAndWait(AUTHORIZATION, { resources: [] }), `${node} initial Authorization`);
  return { daemon: await starting, stream };
}

test.before(async () => {
  istiod = await startFakeIstiod({ dir });
  echo = await startEchoServer(ECHO, PORT);
  ({ daemon: a, stream: streamA } = await startXdsDaemon('node-a', ADMIN_A));
  ({ daemon: b, stream: streamB } = await startXdsDaemon('node-b', ADMIN_B));
});
test.after(async () => {
  for (const fn of cleanups) await fn();
  await istiod?.close();
  await echo?.close();
});
test.afterEach(() => {
  if (process.env.AUTHZ_PUSH_ORDER_DEBUG) for (const d of [a, b]) if (d) console.log(d.tail(60));
});

function assertAck(reply: AdsRequest, what: string): void {
  assert.equal(reply.errorDetail, undefined, `${what}: NACK ${reply.errorDetail?.message}`);
}

/** The ACK of `nonce` (the next request of that type: nothing else is outstanding on the stream). */
async function acked(stream: AdsStream, typeUrl: string, nonce: string, what: string): Promise<AdsRequest> {
  const r = await stream.nextRequest(typeUrl);
  assert.equal(r.responseNonce, nonce, `${what}: the answer is to ${nonce}`);
  assertAck(r, what);
  return r;
}

/** node-a gets the same resources (istiod pushes every ztunnel); its outbound does not use them. */
async function mirrorToA(address: PushBody, authz: PushBody): Promise<void> {
  if (address) assertAck(await streamA.pushAndWait(ADDRESS, address), 'node-a Address');
  if (authz) assertAck(await streamA.pushAndWait(AUTHORIZATION, authz), 'node-a Authorization');
}

/** Puts echo back without policy references and removes `policyKeys`, on both daemons (ACKed). */
async function reset(policyKeys: string[] = []): Promise<void> {
  for (const s of [streamB, streamA]) {
    assertAck(await s.pushAndWait(ADDRESS, { resources: [echoW([])] }), 'reset Address');
    if (policyKeys.length > 0) assertAck(await s.pushAndWait(AUTHORIZATION, { removed: policyKeys }), 'reset Authorization');
  }
}

// ---- live connections ------------------------------------------------------------------------------------------

/** A live connection of `openLive`. */
interface Live {
  label: string;
  socket: Socket;
  /** When the client saw it close (epoch ms); null while open. */
  closedAt: number | null;
  /** Resolves `closedAt` once it closed. */
  closed: Promise<number>;
}

/**
 * Opens a connection from `srcIp`'s SOCKS5 entry to echo through the tunnel, checks it echoes, and keeps it
 * reading so that a close by the proxies is seen at once ({ closedAt } is set by then).
 */
async function openLive(srcIp: string, label: string): Promise<Live> {
  const r = await socks5Request({ socks: { host: srcIp, port: 15080 }, dest: { host: ECHO, port: PORT } });
  assert.equal(r.code, 0, `${label}: SOCKS5 reply ${r.code} ${r.error?.message ?? ''}`);
  await echoOnce(r.socket, `${label}: hello`);
  // `closed` is set right below, once `h` exists for its callback.
  const h = { label, socket: r.socket, closedAt: null } as Live;
  h.closed = new Promise((resolve) =>
    r.socket.once('close', () => {
      h.closedAt = Date.now();
      resolve(h.closedAt);
    }),
  );
  r.socket.on('data', () => undefined);
  r.socket.resume();
  return h;
}

/** Resolves when `h` closed, or null if it is still open at `deadline` (epoch ms). */
async function closedBy(h: Live, deadline: number): Promise<number | null> {
  if (h.closedAt !== null) return h.closedAt;
  const timer = delay(Math.max(0, deadline - Date.now()), null);
  return Promise.race([h.closed, timer]);
}

/** `h` is open and its bytes still make the round trip. `ref`: { name, at } for the failure message. */
async function passesBytes(h: Live, ref: { name: string; at: number }): Promise<void> {
  assert.equal(
    h.closedAt,
    null,
    `${h.label}'s live connection was closed ${h.closedAt! - ref.at} ms after ${ref.name} (it should still pass bytes)`,
  );
  try {
    await echoOnce(h.socket, `${h.label}: still here ${Date.now() - ref.at} ms after ${ref.name}`, { timeoutMs: 5_000 });
  } finally {
    if (!h.socket.destroyed) h.socket.resume();
  }
}

function release(...hs: Live[]): void {
  for (const h of hs) if (h && !h.socket.destroyed) h.socket.destroy();
}

/** A NEW connection from `srcIp` to echo: 0 when it echoes, else the SOCKS5 reply code (null: no reply). */
async function newConnection(srcIp: string, label: string): Promise<number | null> {
  const r = await socks5Request({ socks: { host: srcIp, port: 15080 }, dest: { host: ECHO, port: PORT }, timeoutMs: 5_000 });
  if (r.code !== 0) {
    r.socket?.destroy();
    return r.code;
  }
  await echoOnce(r.socket, `${label}: new`, { timeoutMs: 5_000 });
  await closeSocket(r.socket);
  return 0;
}

async function untilAt(at: number): Promise<void> {
  await delay(Math.max(0, at - Date.now()));
}

/** A probe's outcome and when it came. */
interface Timed<T> {
  value?: T;
  error?: unknown;
  at: number;
}

// ---- scenarios ----------------------------------------------------------------------------------------------------

test('istiod order (Address naming allow-sleep, then the policy, two responses): the live connection the policy allows survives, the other one is closed', async (t) => {
  const sleep = await openLive(SLEEP, 'sleep');
  const other = await openLive(OTHER, 'other');
  try {
    // As istiod sends them: two DeltaDiscoveryResponses, the reference first, the policy right after (~0.5 ms).
    const v = nextVersion();
    const addressAt = Date.now();
    const nAddr = streamB.push(ADDRESS, { resources: [echoW([ALLOW_SLEEP])] });
    await delay(1);
    const nAuthz = streamB.push(AUTHORIZATION, { resources: [allowSleep(v)] });
    const policyAt = Date.now();
    await acked(streamB, ADDRESS, nAddr, 'node-b Address');
    await acked(streamB, AUTHORIZATION, nAuthz, 'node-b Authorization');
    await mirrorToA({ resources: [echoW([ALLOW_SLEEP])] }, { resources: [allowSleep(v)] });
    const policy = { name: 'the Authorization push', at: policyAt };

    await t.test(`other's live connection is closed within grace + 1.5 s of the Authorization push`, async () => {
      const closedAt = await closedBy(other, policyAt + GRACE_MS + 1_500);
      assert.notEqual(closedAt, null, `other's connection (not allowed by ${ALLOW_SLEEP}) is still open ${Date.now() - policyAt} ms after the policy`);
    });
    await t.test(`sleep's live connection still passes bytes 3 s after the Authorization push (grace + 2 s)`, async () => {
      await untilAt(policyAt + 3_000);
      await passesBytes(sleep, policy);
      assert.ok(Date.now() - addressAt >= GRACE_MS + 1_000, 'checked well after the grace');
    });
    await t.test('a new connection from other is refused (401 → SOCKS5 2)', async () => {
      assert.equal(await newConnection(OTHER, 'other'), SOCKS_NOT_ALLOWED);
    });
    await t.test('a new connection from sleep is allowed and echoes', async () => {
      assert.equal(await newConnection(SLEEP, 'sleep'), 0);
    });
  } finally {
    release(sleep, other);
    await reset([ALLOW_SLEEP]);
  }
});

test('between the two responses: new connections are refused while the live ones wait for the policy; then the policy decides', async (t) => {
  const sleep = await openLive(SLEEP, 'sleep');
  const other = await openLive(OTHER, 'other');
  try {
    const v = nextVersion();
    const addressAt = Date.now();
    assertAck(await streamB.pushAndWait(ADDRESS, { resources: [echoW([ALLOW_SLEEP])] }), 'node-b Address');
    const address = { name: 'the Address push', at: addressAt };
    // The grace clock is running: probe quickly (all at once, at most 500 ms), then push the policy regardless.
    const timed = <T>(p: Promise<T>): Promise<Timed<T>> =>
      p.then((value) => ({ value, at: Date.now() }), (error: unknown) => ({ error, at: Date.now() }));
    const probes = {
      newSleep: timed(newConnection(SLEEP, 'sleep')),
      newOther: timed(newConnection(OTHER, 'other')),
      liveSleep: timed(passesBytes(sleep, address)),
      liveOther: timed(passesBytes(other, address)),
    };
    await Promise.race([Promise.allSettled(Object.values(probes)), delay(500)]);
    const nAuthz = streamB.push(AUTHORIZATION, { resources: [allowSleep(v)] });
    const policyAt = Date.now();
    await acked(streamB, AUTHORIZATION, nAuthz, 'node-b Authorization');
    await mirrorToA({ resources: [echoW([ALLOW_SLEEP])] }, { resources: [allowSleep(v)] });
    const policy = { name: 'the Authorization push', at: policyAt };
    const probed = async (name: keyof typeof probes) => {
      const r = await probes[name];
      assert.ok(r.at <= policyAt, `${name}: answered ${r.at - policyAt} ms after the policy was pushed (the probe was too slow)`);
      if (r.error) throw r.error;
      return r.value;
    };

    await t.test(`the policy was pushed within the grace (${policyAt - addressAt} ms after the Address)`, () => {
      assert.ok(policyAt - addressAt < GRACE_MS - 200, `${policyAt - addressAt} ms`);
    });
    await t.test('before the policy: a new connection from sleep is refused (fail closed)', async () => {
      assert.equal(await probed('newSleep'), SOCKS_NOT_ALLOWED);
    });
    await t.test('before the policy: a new connection from other is refused (fail closed)', async () => {
      assert.equal(await probed('newOther'), SOCKS_NOT_ALLOWED);
    });
    await t.test(`before the policy: sleep's live connection still passes bytes (not judged yet)`, async () => {
      await probed('liveSleep');
    });
    await t.test(`before the policy: other's live connection still passes bytes (not judged yet)`, async () => {
      await probed('liveOther');
    });
    await t.test(`other's live connection is closed within grace + 1.5 s of the Authorization push`, async () => {
      const closedAt = await closedBy(other, policyAt + GRACE_MS + 1_500);
      assert.notEqual(closedAt, null, `other's connection is still open ${Date.now() - policyAt} ms after the policy`);
    });
    await t.test(`sleep's live connection still passes bytes 3 s after the Authorization push`, async () => {
      await untilAt(policyAt + 3_000);
      await passesBytes(sleep, policy);
    });
  } finally {
    release(sleep, other);
    await reset([ALLOW_SLEEP]);
  }
});

test('STRICT (istio_converted_static_strict: DENY notPrincipals presence), reference then policy: the live mTLS connection survives', async (t) => {
  const sleep = await openLive(SLEEP, 'sleep');
  try {
    const v = nextVersion();
    // Two responses; the policy only once the reference is ACKed, so the daemon has judged the gap for sure.
    const addressAt = Date.now();
    assertAck(await streamB.pushAndWait(ADDRESS, { resources: [echoW([STRICT])] }), 'node-b Address');
    const nAuthz = streamB.push(AUTHORIZATION, { resources: [strict(v)] });
    const policyAt = Date.now();
    await acked(streamB, AUTHORIZATION, nAuthz, 'node-b Authorization');
    await mirrorToA({ resources: [echoW([STRICT])] }, { resources: [strict(v)] });
    const policy = { name: 'the Authorization push', at: policyAt };

    await t.test('the policy pushed is STRICT: /debug/authorize denies plaintext by it and allows sleep\'s identity', async () => {
      const ask = async (identity: string | null) => {
        const q = new URLSearchParams({ dst: `${ECHO}:${PORT}`, src_ip: SLEEP, ...(identity ? { src_identity: identity } : {}) });
        const r = await httpGet(`${b.adminUrl}/debug/authorize?${q}`);
        assert.equal(r.status, 200, r.body);
        return (JSON.parse(r.body) as AuthorizeExplanation).decision;
      };
      const plaintext = await ask(null);
      assert.equal(plaintext.allowed, false, JSON.stringify(plaintext));
      assert.equal(plaintext.policy, STRICT);
      const mtls = await ask(`spiffe://cluster.local/ns/${NS}/sa/sleep`);
      assert.equal(mtls.allowed, true, JSON.stringify(mtls));
    });
    await t.test('the live mTLS connection still passes bytes grace + 2 s after the Authorization push', async () => {
      await untilAt(policyAt + GRACE_MS + 2_000);
      await passesBytes(sleep, policy);
      assert.ok(Date.now() - addressAt >= GRACE_MS + 2_000);
    });
    await t.test('a new mTLS connection is allowed', async () => {
      assert.equal(await newConnection(SLEEP, 'sleep'), 0);
    });
  } finally {
    release(sleep);
    await reset([STRICT]);
  }
});

test('a named policy that never arrives: the live connection is closed after the grace, not before, and that is logged', async (t) => {
  const sleep = await openLive(SLEEP, 'sleep');
  try {
    const pushAt = Date.now();
    const nAddr = streamB.push(ADDRESS, { resources: [echoW([NEVER_SENT])] });
    await acked(streamB, ADDRESS, nAddr, 'node-b Address');
    const ackAt = Date.now();
    const address = { name: 'the Address push', at: pushAt };

    await t.test('within the grace the live connection still passes bytes', async () => {
      await passesBytes(sleep, address);
    });
    await t.test('a new connection is refused meanwhile (fail closed)', async () => {
      assert.equal(await newConnection(SLEEP, 'sleep'), SOCKS_NOT_ALLOWED);
    });
    const closedAt = await closedBy(sleep, pushAt + GRACE_MS + 1_500);
    await t.test('it is closed by grace + 1.5 s after the Address push', () => {
      assert.notEqual(closedAt, null, `still open ${Date.now() - pushAt} ms after the Address push`);
      assert.ok(closedAt! - pushAt <= GRACE_MS + 1_500, `closed ${closedAt! - pushAt} ms after the push`);
    });
    await t.test('it is not closed before ~0.5 s after the Address was applied (ACKed)', () => {
      if (closedAt === null) return; // the previous subtest fails
      assert.ok(closedAt - ackAt >= 500, `closed ${closedAt - ackAt} ms after the ACK (${closedAt - pushAt} ms after the push)`);
    });
    await t.test(`the cut is logged at warn, naming ${NEVER_SENT}`, async () => {
      assert.notEqual(closedAt, null, 'no cut to log');
      // A line logged at (or after) the cut: the event pump runs every 250 ms; the client sees the close a little
      // after the cut itself, hence the slack.
      const rec = await b.waitForLog(
        (l) => l.level === 'warn' && JSON.stringify(l).includes(NEVER_SENT) && Date.parse(l.time) >= closedAt! - 250,
        { timeoutMs: 3_000, message: `a warn line naming ${NEVER_SENT} at the cut` },
      );
      assert.ok(rec);
    });
  } finally {
    release(sleep);
    await reset();
  }
});
