// TLS12_ENABLED and COMPLIANCE_POLICY: parsed into one policy, and applied to the connections to istiod as ztunnel's
// control-plane client applies its provider (TLS 1.3 only unless TLS 1.2 is enabled, AES-GCM, X25519MLKEM768 alone
// under pqc). Whether this Node's OpenSSL has ML-KEM decides whether pqc can start with an istiod.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createSecureContext } from 'node:tls';
import { loadConfig } from '../../dist/config/index.js';
import type { Config } from '../../dist/config/index.js';
import { controlPlaneTls, nativeTlsProblem } from '../../dist/config/tls.js';
import { ConfigError } from '../../dist/errors.js';

const LOCAL = { PROXY_MODE: 'local', NODE_NAME: 'node-a', LOCAL_CA_DIR: '/nonexistent' };
const load = (env: Record<string, string>): Config => loadConfig({ env: { ...LOCAL, ...env }, exists: () => false });

test('the policy: off by default, each variable by its own', () => {
  const none = { tls12: false, pqc: false, fips: false };
  assert.deepEqual(load({}).tls, none);
  assert.deepEqual(load({ TLS12_ENABLED: 'true' }).tls, { ...none, tls12: true });
  assert.deepEqual(load({ COMPLIANCE_POLICY: 'pqc' }).tls, { ...none, pqc: true });
  assert.deepEqual(load({ COMPLIANCE_POLICY: 'fips-140-2' }).tls, { ...none, fips: true }, 'local mode: no istiod to ask FIPS of');
  assert.deepEqual(load({ COMPLIANCE_POLICY: '' }).tls, none, 'empty is unset');
  assert.throws(() => load({ COMPLIANCE_POLICY: 'fips-140-3' }), (e) => e instanceof ConfigError && /COMPLIANCE_POLICY/.test(e.message) && /pqc\|fips-140-2/.test(e.message));
  assert.throws(() => load({ TLS12_ENABLED: 'maybe' }), (e) => e instanceof ConfigError && /TLS12_ENABLED/.test(e.message));
});

test('toward istiod: TLS 1.3 and AES-GCM only, TLS 1.2 with ECDHE AES-GCM when enabled, X25519MLKEM768 alone under pqc', () => {
  assert.deepEqual(controlPlaneTls({ tls12: false, pqc: false, fips: false }), { minVersion: 'TLSv1.3', ciphers: 'TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256' });
  const t12 = controlPlaneTls({ tls12: true, pqc: false, fips: false });
  assert.equal(t12.minVersion, 'TLSv1.2');
  assert.deepEqual(t12.ciphers!.split(':').slice(2), ['ECDHE-ECDSA-AES256-GCM-SHA384', 'ECDHE-ECDSA-AES128-GCM-SHA256', 'ECDHE-RSA-AES256-GCM-SHA384', 'ECDHE-RSA-AES128-GCM-SHA256']);
  assert.equal(controlPlaneTls({ tls12: false, pqc: true, fips: false }).ecdhCurve, 'X25519MLKEM768');
  assert.equal(controlPlaneTls({ tls12: false, pqc: false, fips: true }).ecdhCurve, 'P-256');
  // Node accepts every option set it may be given but pqc's group, which needs OpenSSL 3.5.
  for (const tls12 of [false, true]) {
    for (const fips of [false, true]) assert.doesNotThrow(() => createSecureContext(controlPlaneTls({ tls12, pqc: false, fips })));
  }
});

test('pqc with an istiod starts only on a Node whose OpenSSL has X25519MLKEM768; without one it needs none', () => {
  const hasGroup = (() => {
    try {
      createSecureContext({ ecdhCurve: 'X25519MLKEM768' });
      return true;
    } catch {
      return false;
    }
  })();
  const withIstiod = () => load({ COMPLIANCE_POLICY: 'pqc', XDS_ADDRESS: 'https://istiod.example:15012' });
  if (hasGroup) assert.equal(withIstiod().tls.pqc, true);
  else {
    assert.throws(withIstiod, (e) => e instanceof ConfigError && e.message.includes('COMPLIANCE_POLICY=pqc') && e.message.includes(process.versions.openssl));
  }
  assert.equal(load({ COMPLIANCE_POLICY: 'pqc' }).tls.pqc, true, 'local mode, no istiod');
});

test('fips-140-2 needs the FIPS build, and with an istiod a Node whose OpenSSL is in FIPS mode', async () => {
  const fips = { tls12: false, pqc: false, fips: true };
  assert.equal(nativeTlsProblem(fips, 'aws-lc-rs-fips'), null);
  assert.match(nativeTlsProblem(fips, 'aws-lc-rs')!, /needs ztunnel-node's FIPS build.*aws-lc-rs$/);
  assert.equal(nativeTlsProblem({ ...fips, fips: false }, 'aws-lc-rs'), null, 'no policy, any build');
  const { getFips } = await import('node:crypto');
  const withIstiod = () => load({ COMPLIANCE_POLICY: 'fips-140-2', XDS_ADDRESS: 'https://istiod.example:15012' });
  if (getFips() === 1) assert.equal(withIstiod().tls.fips, true);
  else assert.throws(withIstiod, (e) => e instanceof ConfigError && e.message.includes('COMPLIANCE_POLICY=fips-140-2') && e.message.includes('FIPS mode'));
});
