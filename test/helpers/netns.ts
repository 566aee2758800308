// A small cluster on one machine, built from real network namespaces (root only):
//
//   node namespaces  <pfx>-node-a (10.200.<b>.1) ═══ veth ═══ <pfx>-node-b (10.200.<b>.2)
//   pod namespaces   on each node, /32 addresses routed by their node (node a: 10.<b>.1.x, node b: 10.<b>.2.x)
//
// Each pod reaches its node through a veth whose node side answers on 169.254.1.1 (Calico style), so any number of
// pods share one gateway address. Nodes forward between pods and across the node link. `capture(pod)` installs
// istio-cni's in-pod redirection (scripts/inpod-redirect.sh). Every namespace (and so every veth and rule in it) is
// deleted by `destroy()`, which tests call in `after` so it also runs when a test fails.
import { execFileSync, spawn, type ChildProcessWithoutNullStreams, type SpawnOptionsWithoutStdio } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

export { isRoot } from './prereqs.js';

function sh(cmd: string, args: string[]): string {
  return execFileSync(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] }).toString();
}

const ip = (...args: string[]) => sh('ip', args);
const inNs = (ns: string, ...args: string[]) => sh('ip', ['netns', 'exec', ns, ...args]);

/** One of the two nodes. */
export type NodeName = 'a' | 'b';

/** A pod namespace (`addPod`). */
export interface Pod {
  /** Its network namespace's name. */
  ns: string;
  ip: string;
  node: NodeName;
  name: string;
  /** /run/netns/<ns>: what istio-cni hands the daemon. */
  netnsPath: string;
  /** Its Kubernetes namespace, when a test sets one (the suites default to 'default'). */
  namespace?: string;
}

export class Cluster {
  prefix: string;
  block: number;
  namespaces: string[];
  pods: Map<string, Pod>;
  podCount: Map<NodeName, number>;

  /** @param {string} prefix unique per test file (namespaces are global); @param {number} block 1..250 */
  constructor(prefix: string, block: number) {
    this.prefix = prefix;
    this.block = block;
    this.namespaces = [];
    this.pods = new Map();
    this.podCount = new Map();
  }

  nodeNs(node: NodeName): string {
    return `${this.prefix}-node-${node}`;
  }

  nodeIp(node: NodeName): string {
    return `10.200.${this.block}.${node === 'a' ? 1 : 2}`;
  }

  addNs(name: string): void {
    try {
      ip('netns', 'del', name);
    } catch {
      // not left over from an earlier run
    }
    ip('netns', 'add', name);
    this.namespaces.push(name);
    inNs(name, 'ip', 'link', 'set', 'lo', 'up');
  }

  /** Two nodes joined by a veth. */
  build(): this {
    const a = this.nodeNs('a');
    const b = this.nodeNs('b');
    this.addNs(a);
    this.addNs(b);
    const va = `${this.prefix}-na`;
    const vb = `${this.prefix}-nb`;
    ip('link', 'add', va, 'netns', a, 'type', 'veth', 'peer', 'name', vb, 'netns', b);
    inNs(a, 'ip', 'addr', 'add', `${this.nodeIp('a')}/24`, 'dev', va);
    inNs(b, 'ip', 'addr', 'add', `${this.nodeIp('b')}/24`, 'dev', vb);
    inNs(a, 'ip', 'link', 'set', va, 'up');
    inNs(b, 'ip', 'link', 'set', vb, 'up');
    for (const [ns, other, otherIp] of [[a, 'b', this.nodeIp('b')], [b, 'a', this.nodeIp('a')]]) {
      inNs(ns, 'sysctl', '-qw', 'net.ipv4.ip_forward=1');
      inNs(ns, 'ip', 'route', 'add', `10.${this.block}.${other === 'a' ? 1 : 2}.0/24`, 'via', otherIp);
    }
    return this;
  }

  /** A pod namespace on `node` ('a' | 'b'); returns { ns, ip }. */
  addPod(node: NodeName, name: string): Pod {
    const n = (this.podCount.get(node) ?? 0) + 1;
    this.podCount.set(node, n);
    const ns = `${this.prefix}-${name}`;
    const podIp = `10.${this.block}.${node === 'a' ? 1 : 2}.${10 + n}`;
    this.addNs(ns);
    const host = `${this.prefix}-${node}${n}`;
    ip('link', 'add', host, 'netns', this.nodeNs(node), 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
    inNs(ns, 'ip', 'addr', 'add', `${podIp}/32`, 'dev', 'eth0');
    inNs(ns, 'ip', 'link', 'set', 'eth0', 'up');
    inNs(ns, 'ip', 'route', 'add', '169.254.1.1', 'dev', 'eth0');
    inNs(ns, 'ip', 'route', 'add', 'default', 'via', '169.254.1.1', 'dev', 'eth0');
    const nodeNs = this.nodeNs(node);
    inNs(nodeNs, 'ip', 'addr', 'add', '169.254.1.1/32', 'dev', host);
    inNs(nodeNs, 'ip', 'link', 'set', host, 'up');
    inNs(nodeNs, 'ip', 'route', 'add', `${podIp}/32`, 'dev', host);
    const pod: Pod = { ns, ip: podIp, node, name, netnsPath: `/run/netns/${ns}` };
    this.pods.set(name, pod);
    return pod;
  }

  /** istio-cni's in-pod iptables and routing for `pod`. */
  capture(pod: Pod): void {
    sh('bash', [join(root, 'scripts', 'inpod-redirect.sh'), pod.ns]);
  }

  /** Run a command in a namespace and wait (throws on non-zero exit). */
  exec(ns: string, cmd: string, ...args: string[]): string {
    return inNs(ns, cmd, ...args);
  }

  /** Start a process in a namespace. */
  spawn(ns: string, cmd: string, args: readonly string[], opts: SpawnOptionsWithoutStdio = {}): ChildProcessWithoutNullStreams {
    return spawn('ip', ['netns', 'exec', ns, cmd, ...args], { stdio: ['pipe', 'pipe', 'pipe'], ...opts });
  }

  destroy(): void {
    for (const ns of this.namespaces.reverse()) {
      try {
        ip('netns', 'del', ns);
      } catch {
        // already gone
      }
    }
    this.namespaces = [];
  }
}
