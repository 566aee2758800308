// TLS12_ENABLED and COMPLIANCE_POLICY on the connections to istiod (xDS and CA), as ztunnel's control-plane client
// applies its one crypto provider (istio/ztunnel src/tls/control.rs and lib.rs): TLS 1.3 only unless TLS 1.2 is
// enabled, AES-GCM suites (and TLS 1.2's ECDHE AES-GCM), X25519MLKEM768 the only key exchange under pqc, P-256 under
// fips-140-2 (which also needs Node's OpenSSL in FIPS mode: these connections are Node's). The HBONE side of the same
// policy is the dataplane's (`tls::provider_for`).
import type { SecureContextOptions } from 'node:tls';
import type { TlsPolicy } from '../native/generated/TlsPolicy.js';

export type { TlsPolicy };

const TLS13_SUITES = ['TLS_AES_256_GCM_SHA384', 'TLS_AES_128_GCM_SHA256'];
const TLS12_SUITES = ['ECDHE-ECDSA-AES256-GCM-SHA384', 'ECDHE-ECDSA-AES128-GCM-SHA256', 'ECDHE-RSA-AES256-GCM-SHA384', 'ECDHE-RSA-AES128-GCM-SHA256'];
const PQC_GROUP = 'X25519MLKEM768';
const FIPS_GROUP = 'P-256';

/** The secure-context options of a connection to istiod under `policy`. */
export function controlPlaneTls(policy: TlsPolicy): SecureContextOptions {
  return {
    minVersion: policy.tls12 ? 'TLSv1.2' : 'TLSv1.3',
    ciphers: [...TLS13_SUITES, ...(policy.tls12 ? TLS12_SUITES : [])].join(':'),
    ...(policy.pqc && { ecdhCurve: PQC_GROUP }),
    ...(policy.fips && { ecdhCurve: FIPS_GROUP }),
  };
}

/**
 * Why `policy` cannot be kept toward istiod from this Node (null when it can, or when no connection to istiod is
 * configured): pqc needs an OpenSSL with X25519MLKEM768 (3.5 and later: Node 24), which Node 20's lacks; fips-140-2
 * needs Node's OpenSSL in FIPS mode (`node --enable-fips` with a FIPS provider configured).
 */
export function controlPlaneTlsProblem(policy: TlsPolicy, addresses: readonly (string | null)[]): string | null {
  if ((!policy.pqc && !policy.fips) || addresses.every((a) => a === null)) return null;
  if (policy.fips) {
    // node:crypto only here, as node:tls below.
    if (process.getBuiltinModule('node:crypto').getFips() === 1) return null;
    return "this Node's OpenSSL is not in FIPS mode for the connections to istiod (XDS_ADDRESS, CA_ADDRESS); start Node with --enable-fips and a FIPS provider (OpenSSL 3's fips module), or run without istiod";
  }
  try {
    // node:tls only here (a daemon without istiod never loads it: test/integration/lazy-modules.test.ts).
    process.getBuiltinModule('node:tls').createSecureContext(controlPlaneTls(policy));
    return null;
  } catch {
    return `this Node's OpenSSL ${process.versions.openssl} has no ${PQC_GROUP} for the connections to istiod (XDS_ADDRESS, CA_ADDRESS); run ztunnel-node on a Node whose OpenSSL has it (Node 24), or without istiod`;
  }
}

/** Why this native build cannot keep `policy` (null when it can): fips-140-2 needs the FIPS build. */
export function nativeTlsProblem(policy: TlsPolicy, cryptoProvider: string): string | null {
  if (!policy.fips || cryptoProvider.endsWith('-fips')) return null;
  return `COMPLIANCE_POLICY=fips-140-2 needs ztunnel-node's FIPS build (the release's -fips image; cargo feature fips); this build's crypto provider is ${cryptoProvider}`;
}
