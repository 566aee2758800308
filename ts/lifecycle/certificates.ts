// Certificates as a component: the CA (istiod's, or the built-in one), the certificate manager over the dataplane's
// keys, the answers to the handshakes that ask for a certificate they lack, and the reconciler of this node's
// workloads (local-workloads.ts: their certificates and, in local mode, their listeners). Started with the dataplane
// open; without a CA it has nothing to do.
import type { Config } from '../config/index.js';
import type { CertificateAuthority } from '../ca/authority.js';
import { CertificateManager } from '../ca/manager.js';
import type { Logs } from '../log/logger.js';
import type { TokenSource } from '../xds/token.js';
import { answerCertificateRequests } from './certificates-on-demand.js';
import type { Component } from './daemon.js';
import type { DataplanePort } from './dataplane.js';
import { LocalWorkloads } from './local-workloads.js';

export interface CertificatesOptions {
  config: Config;
  logs: Logs;
  token: TokenSource;
  /** The dataplane (open before this starts). */
  plane(): DataplanePort;
  /** The built-in CA: its root in `dir`, or (null) made in memory for this process. */
  openLocalCa(dir: string | null, trustDomain: string): CertificateAuthority;
  /** A local workload that cannot be served (its certificate never came, a bind failed). */
  onWorkloadError(uid: string, err: unknown): void;
}

export class Certificates implements Component {
  readonly name = 'certificates';
  /** The certificate manager; null without a CA. */
  manager: CertificateManager | null = null;
  /** This node's workloads' certificates and listeners; null without a CA, and in dedicated mode. */
  localWorkloads: LocalWorkloads | null = null;
  private asks: { stop(): void } | null = null;

  constructor(private readonly o: CertificatesOptions) {}

  async start(): Promise<void> {
    const { config, logs } = this.o;
    const ca = await this.openCa();
    if (ca === null) return;
    const plane = this.o.plane();
    const certs = new CertificateManager({
      keys: plane,
      ca,
      ttlSeconds: Math.max(1, Math.round(config.secretTtlMs / 1000)),
      logger: logs.forTarget('ca'),
    });
    this.manager = certs;
    // Certificates on demand: a handshake that finds none asks, and waits (prefetch stays an optimisation).
    this.asks = answerCertificateRequests(plane, certs, logs.forTarget('ca'));
    if (config.nodeName === null || config.proxyMode === 'dedicated') return;
    this.localWorkloads = new LocalWorkloads({
      nodeName: config.nodeName,
      certs,
      listeners:
        config.proxyMode === 'local'
          ? {
              proxies: config.enableProxy,
              socks5: config.socks5Enabled,
              dnsPort: config.dns.enabled ? config.dns.addr.port : null,
              add: (spec) => plane.addLocalWorkload(spec),
              remove: (uid) => plane.removeLocalWorkload(uid),
            }
          : null,
      logger: logs.root,
      onError: (uid, err) => this.o.onWorkloadError(uid, err),
    });
  }

  stop(): void {
    this.localWorkloads?.stop();
    this.asks?.stop();
    this.manager?.stop();
  }

  /** Resolves once `identity` has a certificate (the dedicated workload's, before its listeners bind). */
  ensure(identity: string): Promise<boolean> {
    if (this.manager === null) return Promise.reject(new Error('no CA configured (CA_ADDRESS or LOCAL_CA_DIR)'));
    return this.manager.ensure(identity);
  }

  /** The CA the config names: istiod's (CA_ADDRESS), the built-in one (FAKE_CA, local mode, LOCAL_CA_DIR), or none. */
  private async openCa(): Promise<CertificateAuthority | null> {
    const { config, logs } = this.o;
    const openLocal = (dir: string | null) => this.o.openLocalCa(dir, config.trustDomain);
    if (config.fakeCa) {
      // ztunnel's FAKE_CA: no istiod CA (CA_ADDRESS is refused beside it), certificates signed in the daemon.
      logs.root.warn(
        { rootDir: config.localCaDir },
        config.localCaDir === null
          ? 'FAKE_CA=true: certificates are signed by a built-in CA whose root exists only in this process; only its own workloads trust it (not for production)'
          : 'FAKE_CA=true: certificates are signed by the built-in CA of LOCAL_CA_DIR; peers trust only that root (not for production)',
      );
      return openLocal(config.localCaDir);
    }
    if (config.caAddress !== null && config.nodeName !== null) {
      // gRPC and the CA's protobuf code load only when istiod is the CA (bench/results/README.md, the Node footprint).
      const { IstiodCertificateAuthority } = await import('../ca/istiod.js');
      // One daemon asks for many identities (local and shared modes): istiod must let it impersonate them.
      return new IstiodCertificateAuthority({
        target: { address: config.caAddress, rootCa: config.caRootCa, altHostname: config.altCaHostname, tls: config.tls },
        token: this.o.token,
        clusterId: config.clusterId,
        headers: config.caHeaders,
        impersonate: config.proxyMode !== 'dedicated',
      });
    }
    // Local mode's built-in CA (its config requires LOCAL_CA_DIR then); in any mode, LOCAL_CA_DIR without a remote CA
    // (e.g. the namespace tests).
    if (config.localCaDir !== null) return openLocal(config.localCaDir);
    return null;
  }
}
