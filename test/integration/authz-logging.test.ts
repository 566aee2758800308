// AUTHZ_POLICY_INFO_LOGGING as ztunnel's `authpol_log!`: each inbound connection's authorization (the deciding policy
// and its reason) and each dry-run policy it matched are logged at info with it, at debug without it, so a daemon at
// the default RUST_LOG=info shows them only when asked to.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { makeTempDir, startDaemon, workload, type Daemon } from '../helpers/daemon.js';
import { tunnelAttempt } from '../helpers/hbone.js';
import { BLOCKS, block, startEchoServer } from '../helpers/net.js';
import { builtinCa, builtinLeaf, spiffe } from '../helpers/pki.js';

const net = block(BLOCKS['authz-logging']);
const ECHO = net.workload(1);
const principal = (sa: string) => ({ principals: [{ Exact: `cluster.local/ns/default/sa/${sa}` }] });
const CONFIG = {
  workloads: [workload({ name: 'echo', ip: ECHO, node: 'node-a' })],
  policies: [
    { name: 'deny-sleep', namespace: 'default', scope: 'Namespace', action: 'Deny', rules: [[[principal('sleep')]]] },
    { name: 'watch-other', namespace: 'default', scope: 'Namespace', action: 'Deny', dryRun: true, rules: [[[principal('other')]]] },
  ],
};

test('authorization decisions and dry-run matches are info lines only with AUTHZ_POLICY_INFO_LOGGING', async (t) => {
  const app = await startEchoServer(ECHO, 8080);
  t.after(() => app.close());
  const caDir = makeTempDir('ztn-authz-logging-ca-');
  const certs = makeTempDir('ztn-authz-logging-certs-');
  const decisions = (d: Daemon) => d.logs.filter((l) => /^authorization policy (allowed|denied) the connection$|^dry-run policy matched$/.test(l.message ?? ''));
  for (const [i, on] of [[1, true], [2, false]] as const) {
    const d = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(i), env: on ? { AUTHZ_POLICY_INFO_LOGGING: 'true' } : {}, cleanup: t });
    const root = builtinCa(caDir).certPem;
    const as = (sa: string) => {
      const leaf = builtinLeaf(certs, caDir, [spiffe('default', sa)], `${sa}-${i}`);
      return tunnelAttempt({ host: ECHO, ca: root, cert: leaf.certPem, key: leaf.keyPem, target: `${ECHO}:8080` });
    };
    assert.match(await as('sleep'), /^refused: status 401/);
    assert.equal(await as('other'), 'tunnel open', 'a dry-run DENY changes no decision');
    if (!on) {
      await d.waitForLog((l) => l.target === 'access' && (l['src.identity'] as string | undefined)?.endsWith('/sa/other'), { message: 'the allowed connection\'s record' });
      assert.deepEqual(decisions(d), [], 'nothing at info without the setting');
      await d.stop();
      continue;
    }
    const denied = await d.waitForLog((l) => l.message === 'authorization policy denied the connection', { message: 'the denial at info' });
    assert.equal(denied.level, 'info');
    assert.deepEqual([denied.policy, denied.reason, denied['src.identity']], ['default/deny-sleep', 'explicitly denied by: default/deny-sleep', spiffe('default', 'sleep')]);
    const dry = await d.waitForLog((l) => l.message === 'dry-run policy matched', { message: 'the dry-run match at info' });
    assert.deepEqual([dry.policy, dry.action, dry['src.identity']], ['default/watch-other', 'Deny', spiffe('default', 'other')]);
    const allowed = await d.waitForLog((l) => l.message === 'authorization policy allowed the connection', { message: 'the allow at info' });
    assert.equal(allowed.reason, 'no allow policies, allow');
    await d.stop();
  }
});
