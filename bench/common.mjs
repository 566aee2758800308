// Shared by the in-process benchmarks (bench/authz.mjs, bench/micro.mjs): a dataplane with defaults that bind
// nothing, and the empty policy match the TS model uses.
import { Dataplane } from '../dist/native/index.js';

export function openBenchDataplane() {
  return Dataplane.open({
    nodeName: 'bench', clusterId: 'Kubernetes', network: '', trustDomain: 'cluster.local', workerThreads: 1, hbonePort: 15008,
    poolMaxStreamsPerConnection: 100, poolUnusedReleaseTimeoutMs: 300000,
    http2: { streamWindowSize: 4194304, connectionWindowSize: 16777216, frameSize: 1048576 },
    connectTimeoutMs: 10000, socks5Enabled: false, bindSourceIp: false,
  });
}

/** A policy match with every list empty (ts/state/model.ts PolicyMatch). */
export const emptyMatch = () => ({
  namespaces: [], notNamespaces: [], principals: [], notPrincipals: [], serviceAccounts: [], notServiceAccounts: [],
  sourceIps: [], notSourceIps: [], destinationIps: [], notDestinationIps: [], destinationPorts: [], notDestinationPorts: [],
});
