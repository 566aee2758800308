// Certificate authorities: what signs our workloads' CSRs. The built-in one wraps the native LocalCa
// (LOCAL_CA_DIR); a client for istiod's CA (CA_ADDRESS) will implement the same interface.
import { ZtunnelError } from '../errors.js';
import { LocalCa } from '../native/index.js';
import { splitPem } from './pem.js';

export interface SignedCertificate {
  /** Leaf first, then intermediates; no roots. */
  chainPem: string;
  /** The trust bundle (one or more roots). */
  rootsPem: string;
}

export interface CertificateAuthority {
  /** Signs `csrPem` for `identity` (a SPIFFE URI). Rejects with a ZtunnelError (CSR_INVALID, CA_ERROR, ...). */
  sign(csrPem: string, identity: string, ttlSeconds: number): Promise<SignedCertificate>;
}

/**
 * The built-in CA: a root kept in a directory shared by the daemons of one host (demo, tests), so workloads on
 * different "nodes" trust each other without istiod.
 */
export class LocalCertificateAuthority implements CertificateAuthority {
  private constructor(private readonly ca: LocalCa, private readonly rootsPem: string) {}

  /** Loads or creates the root in `dir`. Throws ZtunnelError CA_ERROR. */
  static open(dir: string, trustDomain: string): LocalCertificateAuthority {
    const ca = LocalCa.open(dir, trustDomain);
    return new LocalCertificateAuthority(ca, ca.rootPem());
  }

  /** A root made in memory for this daemon's life (FAKE_CA without LOCAL_CA_DIR): only its own workloads trust it. */
  static ephemeral(trustDomain: string): LocalCertificateAuthority {
    const ca = LocalCa.ephemeral(trustDomain);
    return new LocalCertificateAuthority(ca, ca.rootPem());
  }

  async sign(csrPem: string, identity: string, ttlSeconds: number): Promise<SignedCertificate> {
    const signed = this.ca.sign(csrPem, identity, ttlSeconds);
    // The native CA returns leaf then root; the dataplane wants roots separately, so drop the root copies.
    const roots = new Set(splitPem(this.rootsPem).map((p) => p.trim()));
    const chain = splitPem(signed).filter((p) => !roots.has(p.trim()));
    if (chain.length === 0) throw new ZtunnelError('CA_UNAVAILABLE', `the local CA returned no leaf for ${identity}`);
    return { chainPem: chain.join(''), rootsPem: this.rootsPem };
  }
}
