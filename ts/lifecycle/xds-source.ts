// istiod's xDS (XDS_ADDRESS) as a mesh source: the client, gRPC and the envoy/istio protobuf code load only when
// there is an istiod to talk to. Without one, the state is complete once the local config is applied.
import type { Config } from '../config/index.js';
import type { Logs } from '../log/logger.js';
import type { XdsClient } from '../xds/client.js';
import type { XdsMetrics } from '../xds/metrics.js';
import type { TokenSource } from '../xds/token.js';
import type { Component } from './daemon.js';
import type { Mesh } from './mesh.js';

export interface XdsSourceOptions {
  config: Config;
  logs: Logs;
  token: TokenSource;
  mesh: Mesh;
  metrics: XdsMetrics;
  /** Both types received and ACKed (at once when there is no istiod). */
  onSynced(): void;
}

export class XdsSource implements Component {
  readonly name = 'xds';
  private client: XdsClient | null = null;

  constructor(private readonly o: XdsSourceOptions) {}

  async start(): Promise<void> {
    const { config, mesh } = this.o;
    if (config.xdsAddress === null) {
      this.o.onSynced();
      return;
    }
    const { XdsClient, ztunnelNodeId, ztunnelNodeMetadata } = await import('../xds/client.js');
    this.client = new XdsClient({
      target: { address: config.xdsAddress, rootCa: config.xdsRootCa, altHostname: config.altXdsHostname, tls: config.tls },
      token: this.o.token,
      clusterId: config.clusterId,
      headers: config.xdsHeaders,
      node: { id: ztunnelNodeId(config), metadata: ztunnelNodeMetadata(config) },
      apply: (change) => {
        mesh.applyStateChange('xds', change);
      },
      applyAddresses: (resources, removed) => mesh.applyAddresses(resources, removed),
      onSynced: () => this.o.onSynced(),
      metrics: this.o.metrics,
      logger: this.o.logs.forTarget('xds'),
    });
    this.client.start();
  }

  stop(): void {
    this.client?.stop();
  }
}
