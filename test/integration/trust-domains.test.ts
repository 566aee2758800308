// TRUST_DOMAINS, beyond ztunnel (its open proposal, istio/ztunnel#2092, and Istio's trustDomainAliases for sidecars):
// the listed trust domains are aliases of each workload's own. Inbound, a client of an alias is accepted and a policy
// principal written in the workload's domain matches it; outbound, a server presenting the expected identity in an
// alias is accepted. Without the setting, as ztunnel: the peer's trust domain must be the workload's. A domain not
// listed is refused either way. Clients and the outbound server are Node TLS peers with leaves from openssl.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { makeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import { startHboneServer, tunnelAttempt } from '../helpers/hbone.js';
import { BLOCKS, block, startEchoServer, throughSocks5 } from '../helpers/net.js';
import { builtinCa, builtinLeaf, spiffe } from '../helpers/pki.js';

const net = block(BLOCKS['trust-domains']);
const ECHO = net.workload(1); // new.td, served by the daemon
const CLIENT = net.workload(2); // new.td, on the daemon's node: the outbound side
const PEER = net.workload(3); // declared new.td on node-c; its server presents old.td
const CONFIG = {
  workloads: [
    workload({ name: 'echo', ip: ECHO, node: 'node-b', trustDomain: 'new.td' }),
    workload({ name: 'client', ip: CLIENT, node: 'node-b', trustDomain: 'new.td' }),
    workload({ name: 'peer', ip: PEER, node: 'node-c', trustDomain: 'new.td' }),
  ],
  policies: [
    {
      name: 'only-sleep',
      namespace: 'default',
      scope: 'WorkloadSelector',
      action: 'Allow',
      rules: [[[{ principals: [{ Exact: 'new.td/ns/default/sa/sleep' }] }]]],
    },
  ],
};
CONFIG.workloads[0].authorizationPolicies = ['default/only-sleep'];

test('TRUST_DOMAINS: peers of an alias accepted both ways and matched by policy; other domains refused', async (t) => {
  const app = await startEchoServer(ECHO, 8080);
  t.after(() => app.close());
  const caDir = makeTempDir('ztn-td-ca-');
  const certs = makeTempDir('ztn-td-certs-');
  let n = 0;
  const as = async (td: string, sa: string) => {
    const leaf = builtinLeaf(certs, caDir, [spiffe('default', sa, td)], `${sa}-${td}-${n++}`);
    return tunnelAttempt({ host: ECHO, ca: builtinCa(caDir).certPem, cert: leaf.certPem, key: leaf.keyPem, target: `${ECHO}:8080` });
  };
  for (const [i, aliases] of [[1, null], [2, 'old.td, partner.td']] as const) {
    const d = await startDaemon({
      node: 'node-b',
      config: CONFIG,
      caDir,
      adminIp: net.admin(i),
      env: aliases === null ? {} : { TRUST_DOMAINS: aliases },
      cleanup: t,
    });
    // The outbound peer: presents `peer` in old.td, with the built-in root (so only the trust domain differs).
    const peerLeaf = builtinLeaf(certs, caDir, [spiffe('default', 'peer', 'old.td')], `peer-${i}`);
    const peer = await startHboneServer({ host: PEER, cert: peerLeaf.certPem, key: peerLeaf.keyPem, ca: builtinCa(caDir).certPem });
    assert.equal(await as('new.td', 'sleep'), 'tunnel open', 'the workload\'s own trust domain');
    assert.match(await as('evil.td', 'sleep'), /^refused: .*certificate unknown/, 'an unlisted trust domain, refused at the handshake');
    if (aliases === null) {
      assert.match(await as('old.td', 'sleep'), /^refused: .*certificate unknown/, 'without TRUST_DOMAINS, as ztunnel');
      assert.notEqual(await throughSocks5(CLIENT, PEER), 0, 'outbound: old.td is not the expected identity');
      assert.equal(peer.record.streams.length, 0);
    } else {
      assert.equal(await as('old.td', 'sleep'), 'tunnel open', 'an alias, and the policy\'s new.td principal matches it');
      assert.equal(await as('partner.td', 'sleep'), 'tunnel open');
      assert.match(await as('old.td', 'other'), /^refused: status 401/, 'the policy still judges who it is');
      assert.equal(await throughSocks5(CLIENT, PEER), 0, 'outbound: the expected identity in an alias');
      assert.equal(peer.record.streams.length, 1);
      const { config } = JSON.parse(await (await fetch(`${d.adminUrl}/config_dump`)).text()) as {
        config: { ztunnelNode: { trustDomainAliases: string[] } };
      };
      assert.deepEqual(config.ztunnelNode.trustDomainAliases, ['old.td', 'partner.td']);
    }
    await peer.close();
    assert.equal((await d.stop()).code, 0);
  }
});

test('TRUST_DOMAINS refuses "*" and malformed names at start', async () => {
  const { loadConfig } = await import('../../dist/config/index.js');
  for (const [value, word] of [['*', 'every trust domain'], ['a.td,Bad Domain', 'not a trust domain']]) {
    assert.throws(() => loadConfig({ env: { TRUST_DOMAINS: value }, exists: () => false }), (e) => e instanceof Error && e.message.includes('TRUST_DOMAINS') && e.message.includes(word));
  }
});
