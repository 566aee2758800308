// L4 authorization end to end (README "Authorization"): policies from the local config file, reloaded while the
// daemons run; live HBONE connections cut when a policy turns against them; 401 on the CONNECT; the explain
// endpoint and `ztunnel-node authz check` agree with enforcement; headers never change a decision.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { stringify } from 'yaml';
import { makeTempDir, removeTempDir, runCli, startDaemon, workload, type Daemon } from '../helpers/daemon.js';
import { connectRequest, hboneSession } from '../helpers/hbone.js';
import {
  block,
  BLOCKS,
  httpGet,
  socks5Request,
  startEchoServer,
  waitFor,
  echoOnce,
  type TestServer,
} from '../helpers/net.js';
import { builtinCa, builtinLeaf, spiffe, type Leaf } from '../helpers/pki.js';
import type { AuthorizeExplanation } from '../../dist/native/types.js';
import type { LocalPolicyInput } from '../../dist/config/local.js';

const B = block(BLOCKS.authz);
const SLEEP = B.workload(1);
const ECHO = B.workload(2);
const PORT = 8080;
const socks = { host: SLEEP, port: 15080 };
const dest = { host: ECHO, port: PORT };

const tmp = makeTempDir('ztn-authz-');
const caDir = `${tmp}/ca`;
let a: Daemon;
let b: Daemon;
let echo: TestServer;
let leaf: Leaf;

type LocalPolicy = LocalPolicyInput;

/** `config()`'s policies (node-b's `policies`) and echo's `authorizationPolicies`. */
interface ConfigOptions {
  policies?: readonly LocalPolicy[];
  echoPolicies?: string[];
}

const denySleep: LocalPolicy = { name: 'deny-sleep', namespace: 'default', scope: 'Namespace', action: 'Deny', rules: [[[{ principals: [{ Exact: 'cluster.local/ns/default/sa/sleep' }] }]]] };
const allowOnlyOther: LocalPolicy = {
  name: 'allow-other',
  namespace: 'default',
  scope: 'Namespace',
  action: 'Allow',
  rules: [[[{ principals: [{ Exact: 'cluster.local/ns/default/sa/other' }] }]]],
};

function config({ policies = [], echoPolicies = [] }: ConfigOptions = {}) {
  return {
    workloads: [
      workload({ name: 'sleep', ip: SLEEP, node: 'node-a' }),
      workload({ name: 'echo', ip: ECHO, node: 'node-b', authorizationPolicies: echoPolicies }),
    ],
    policies,
  };
}

/** Rewrite node-b's local config file (the daemon polls it). */
function rewrite(cfg: string | ReturnType<typeof config>): void {
  writeFileSync(b.configPath, typeof cfg === 'string' ? cfg : stringify(cfg));
}

async function reloaded(n: number): Promise<void> {
  await waitFor(() => b.logs.filter((l) => l.message === 'local config reloaded').length >= n, { timeoutMs: 5_000, message: `reload #${n}` });
}

let reloads = 0;
async function apply(cfg: ReturnType<typeof config>): Promise<void> {
  rewrite(cfg);
  reloads += 1;
  await reloaded(reloads);
}

before(async () => {
  echo = await startEchoServer(ECHO, PORT);
  a = await startDaemon({ node: 'node-a', config: config(), caDir, adminIp: B.admin(1) });
  b = await startDaemon({ node: 'node-b', config: config(), caDir, adminIp: B.admin(2) });
  leaf = builtinLeaf(tmp, caDir, [spiffe('default', 'sleep')], 'sleep-peer');
});

after(async () => {
  await Promise.allSettled([a?.stop(), b?.stop()]);
  await echo?.close?.();
  removeTempDir(tmp);
});

test('a DENY added by rewriting the file cuts the live HBONE connection within a second; new ones get refused; removing it lets them through', async () => {
  const open = await socks5Request({ socks, dest });
  assert.equal(open.code, 0);
  await echoOnce(open.socket, Buffer.from('before the policy'));
  const closed = new Promise<number>((resolve) => open.socket.once('close', () => resolve(Date.now())));
  open.socket.on('data', () => undefined);
  open.socket.resume();
  const t0 = Date.now();
  await apply(config({ policies: [denySleep] }));
  const closedAt = await Promise.race([closed, new Promise<null>((r) => setTimeout(() => r(null), 3_000))]);
  assert.notEqual(closedAt, null, 'the live connection was closed');
  assert.ok(closedAt! - t0 < 1_000, `closed ${closedAt! - t0} ms after the file was written`);
  await b.waitForLog((l) => l.message === 'connection closed due to policy change');

  // New connections: the CONNECT gets 401, which node-a reports as SOCKS5 "not allowed" (2).
  const refused = await socks5Request({ socks, dest });
  assert.equal(refused.code, 2);
  assert.ok((await b.metric('istio_tcp_connections_failed_total', { reporter: 'destination', response_flags: 'DENY' })) >= 2);
  assert.ok((await b.metric('ztunnel_node_connections_closed_by_policy_total')) >= 1);
  assert.ok((await b.metric('ztunnel_node_authorization_denied_total')) >= 1);

  await apply(config());
  const again = await socks5Request({ socks, dest });
  assert.equal(again.code, 0);
  await echoOnce(again.socket, Buffer.from('after the policy is gone'));
  again.socket.destroy();
});

test('an invalid file is refused with file and path named; the last good config keeps serving', async () => {
  await apply(config({ policies: [denySleep] }));
  rewrite('workloads:\n- uid: x\n  workloadIps: ["999.1.1.1"]\n');
  await b.waitForLog((l) => l.message === 'local config is invalid; keeping the last good config' && /workloadIps\[0\]/.test(l.err as string) && (l.err as string).includes(b.configPath));
  assert.equal((await socks5Request({ socks, dest })).code, 2, 'the DENY of the last good config still applies');
  await apply(config());
  assert.equal((await socks5Request({ socks, dest })).code, 0);
});

test('an empty file on reload (a truncated write) is refused; the last good config keeps serving', async () => {
  await apply(config({ policies: [denySleep] }));
  rewrite('');
  await b.waitForLog((l) => l.message === 'local config is invalid; keeping the last good config' && l.err === `${b.configPath}: the file is empty (an empty file is an empty config only at startup)`);
  assert.equal((await socks5Request({ socks, dest })).code, 2, 'the workloads and the DENY of the last good config still apply');
  await apply(config());
  assert.equal((await socks5Request({ socks, dest })).code, 0);
});

test('a named WORKLOAD_SELECTOR policy that has not arrived denies (fail closed); its arrival allows', async () => {
  await apply(config({ echoPolicies: ['default/not-yet'] }));
  assert.equal((await socks5Request({ socks, dest })).code, 2);
  assert.equal(await b.metric('ztunnel_node_authorization_missing_policies'), 1);
  await b.waitForLog((l) => l.policy === 'default/not-yet' && /not known/.test(l.message!));
  const allowAll: LocalPolicy = { name: 'not-yet', namespace: 'default', scope: 'WorkloadSelector', action: 'Allow', rules: [[]] };
  await apply(config({ echoPolicies: ['default/not-yet'], policies: [allowAll] }));
  assert.equal(await b.metric('ztunnel_node_authorization_missing_policies'), 0);
  const ok = await socks5Request({ socks, dest });
  assert.equal(ok.code, 0);
  ok.socket.destroy();
  await apply(config());
});

test('randomized forwarded, baggage and traceparent never change a decision', async () => {
  const ca = builtinCa(caDir).certPem;
  const decide = async (headers: Record<string, string>) => {
    const session = await hboneSession({ host: ECHO, cert: leaf.chainPem, key: leaf.keyPem, ca, expectServerId: spiffe('default', 'echo') });
    try {
      const r = await connectRequest(session, `${ECHO}:${PORT}`, headers);
      r.stream?.close();
      return r.status;
    } finally {
      session.close();
    }
  };
  const random = () => ({
    forwarded: `for="${randomBytes(1)[0]}.${randomBytes(1)[0]}.0.1:${1000 + randomBytes(1)[0]}";host=evil.example`,
    baggage: `k8s.namespace.name=${randomBytes(3).toString('hex')},k8s.deployment.name=other,service.name=x`,
    traceparent: `00-${randomBytes(16).toString('hex')}-${randomBytes(8).toString('hex')}-01`,
  });
  for (const [policies, want] of [[[], 200], [[denySleep], 401], [[allowOnlyOther], 401]] as const) {
    await apply(config({ policies }));
    for (let i = 0; i < 8; i++) assert.equal(await decide(random()), want, `policies ${JSON.stringify(policies.map((p) => p.name))}`);
    assert.equal(await decide({}), want);
  }
  await apply(config());
});

test('/debug/authorize and `authz check` give the answers enforcement gives', async () => {
  await apply(config({ policies: [denySleep, allowOnlyOther] }));
  const table = [
    { id: spiffe('default', 'sleep'), allowed: false, policy: 'default/deny-sleep' },
    { id: spiffe('default', 'other'), allowed: true, policy: 'default/allow-other' },
    { id: spiffe('default', 'third'), allowed: false },
    { id: null, allowed: false },
  ];
  for (const row of table) {
    const q = new URLSearchParams({ dst: `${ECHO}:${PORT}`, src_ip: SLEEP, ...(row.id ? { src_identity: row.id } : {}) });
    const r = await httpGet(`${b.adminUrl}/debug/authorize?${q}`);
    assert.equal(r.status, 200, r.body);
    const answer = JSON.parse(r.body) as AuthorizeExplanation;
    assert.equal(answer.decision.allowed, row.allowed, JSON.stringify(answer));
    if (row.policy) assert.equal(answer.decision.policy, row.policy);
    assert.deepEqual(answer.considered.map((c) => c.policy).sort(), ['default/allow-other', 'default/deny-sleep']);
    const cli = await runCli(['authz', 'check', '--admin', `${B.admin(2)}:15000`, '--dst', `${ECHO}:${PORT}`, '--src-ip', SLEEP, ...(row.id ? ['--src-identity', row.id] : [])]);
    assert.equal(cli.code, row.allowed ? 0 : 3, cli.stdout + cli.stderr);
    assert.match(cli.stdout, row.allowed ? /decision:\s+ALLOW/ : /decision:\s+DENY/);
  }
  // Enforcement on the same table, for the identity the daemon can present (sleep): denied.
  assert.equal((await socks5Request({ socks, dest })).code, 2);
  await apply(config());
});
