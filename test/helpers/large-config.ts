// A large local config file (LOCAL_XDS_PATH) for the "large inputs off the event loop" tests and bench/large-input.mjs:
// `workloads` workloads (every field ztunnel's YAML has, each an endpoint of one service and naming one policy),
// workloads/10 services and workloads/100 policies, in the block style of examples/*.yaml. Written as text, not via
// yaml.stringify, so that generating 100k workloads (~60 MiB) takes well under a second.
//
// Nothing binds or dials these addresses: workload IPs are 10.x (the `base` octet), VIPs 11.x, and the workloads
// live on node `node-<i % 500>`, so no workload is on the daemon's own node unless `localNode` names one.
import { writeFileSync } from 'node:fs';

/** 10.a.b.c for index i (up to 16M distinct). */
export const indexIp = (i: number, base = 10): string => `${base}.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;

/** `largeConfigYaml`'s and `writeLargeConfig`'s options. */
export interface LargeConfigOptions {
  workloads: number;
  /** Default workloads/10 (at least 1). */
  services?: number;
  /** Default workloads/100 (at least 1). */
  policies?: number;
  /** Every workload's canonicalRevision. Default 'v1'. */
  revision?: string;
  /** The index of the workload given an invalid IP; default -1 (none). */
  badAt?: number;
}

/** How many services and policies a file of these options has (its defaults: a tenth and a hundredth, at least 1). */
export function largeConfigCounts({ workloads: n, services, policies }: LargeConfigOptions): { services: number; policies: number } {
  return { services: services ?? Math.max(1, Math.floor(n / 10)), policies: policies ?? Math.max(1, Math.floor(n / 100)) };
}

/**
 * The YAML text. `revision` changes every workload's canonicalRevision (a reload that touches every workload);
 * `badAt` (a workload index) gives that workload an invalid IP (a file that must be refused with its path).
 */
export function largeConfigYaml(opts: LargeConfigOptions): string {
  const { workloads: n, revision = 'v1', badAt = -1 } = opts;
  const { services: s, policies: p } = largeConfigCounts(opts);
  const parts = ['workloads:\n'];
  for (let i = 0; i < n; i++) {
    const ns = `ns${i % 50}`;
    const svc = i % s;
    parts.push(
      `- uid: Kubernetes//Pod/${ns}/w${i}\n`,
      `  name: w${i}\n`,
      `  namespace: ${ns}\n`,
      `  serviceAccount: sa${i % 200}\n`,
      `  trustDomain: cluster.local\n`,
      `  workloadIps: ["${i === badAt ? '10.0.0.300' : indexIp(i)}"]\n`,
      `  network: ""\n`,
      `  protocol: HBONE\n`,
      `  node: node-${i % 500}\n`,
      `  status: Healthy\n`,
      `  canonicalName: app${i % 1000}\n`,
      `  canonicalRevision: ${revision}\n`,
      `  workloadName: app${i % 1000}\n`,
      `  workloadType: deployment\n`,
      `  clusterId: Kubernetes\n`,
      `  locality: {region: region-${i % 3}, zone: zone-${i % 9}, subzone: ""}\n`,
      `  services:\n`,
      `    "ns${svc % 50}/svc${svc}.ns${svc % 50}.svc.cluster.local": {80: 8080, 443: 8443}\n`,
      `  authorizationPolicies: ["ns${(i % p) % 50}/p${i % p}"]\n`,
    );
  }
  parts.push('services:\n');
  for (let j = 0; j < s; j++) {
    const ns = `ns${j % 50}`;
    parts.push(
      `- name: svc${j}\n`,
      `  namespace: ${ns}\n`,
      `  hostname: svc${j}.${ns}.svc.cluster.local\n`,
      `  vips: ["/${indexIp(j, 11)}"]\n`,
      `  ports: {80: 8080, 443: 8443}\n`,
      `  subjectAltNames: ["spiffe://cluster.local/ns/${ns}/sa/sa${j % 200}"]\n`,
    );
  }
  parts.push('policies:\n');
  for (let k = 0; k < p; k++) {
    // Policy k is "ns<k % 50>/p<k>", the key the workloads name: no reference dangles.
    parts.push(
      `- name: p${k}\n`,
      `  namespace: ns${k % 50}\n`,
      `  scope: WorkloadSelector\n`,
      `  action: Allow\n`,
      `  rules:\n`,
      `  - - - principals: [{Prefix: "spiffe://cluster.local/ns/ns${k % 50}/"}]\n`,
      `      - sourceIps: ["10.0.0.0/8"]\n`,
      `    - - destinationPorts: [${8080 + (k % 10)}]\n`,
    );
  }
  return parts.join('');
}

/** Writes the file; returns its size in bytes. */
export function writeLargeConfig(path: string, opts: LargeConfigOptions): number {
  const text = largeConfigYaml(opts);
  writeFileSync(path, text);
  return Buffer.byteLength(text);
}
