// The e2e cluster, brought up inside the node's namespaces (scripts/e2e.mjs made them): the node's directories, the
// control plane, the node's runtime, then Istio (its own charts, from istio.io/istio's module: base, istiod, cni, with
// the ambient profile) and ztunnel-node (this repository's chart, profile=ambient), each installed with `helm install`
// against the API server and run by the node's runtime from the pods the controllers create.
import { execFile, execFileSync } from 'node:child_process';
import { appendFileSync, copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { ControlPlane } from './controlplane.js';
import { images } from './images.js';
import { apiPath, Kube, type KubeObject } from './kube.js';
import { makeControlPlanePki, type ControlPlanePki } from './pki.js';
import { NodeRuntime, type Pod } from './runtime.js';

const execFileP = promisify(execFile);

/** What scripts/e2e.mjs hands the suite. */
export interface E2eEnv {
  id: string;
  nodeIp: string;
  work: string;
  logs: string;
  k8sBin: string;
  istioBin: string;
  istioModule: string;
  /** The Gateway API's CRDs (standard channel), for istiod's waypoints. */
  gatewayApiCrds: string;
  envoy: string | null;
  helm: string;
  repo: string;
  mountPoints: string[];
}

export function e2eEnv(repo: string): E2eEnv {
  const need = (k: string) => {
    const v = process.env[k];
    if (v === undefined) throw new Error(`${k} is not set: run the suite with npm run e2e (scripts/e2e.mjs), as root`);
    return v;
  };
  return {
    id: need('ZTN_E2E_ID'),
    nodeIp: need('ZTN_E2E_NODE_IP'),
    work: need('ZTN_E2E_WORK'),
    logs: need('ZTN_E2E_LOGS'),
    k8sBin: need('ZTN_E2E_K8S_BIN'),
    istioBin: need('ZTN_E2E_ISTIO_BIN'),
    istioModule: need('ZTN_E2E_ISTIO_MODULE'),
    gatewayApiCrds: need('ZTN_E2E_GATEWAY_API_CRDS'),
    envoy: process.env.ZTN_E2E_ENVOY || null,
    helm: need('ZTN_E2E_HELM'),
    repo,
    mountPoints: need('ZTN_E2E_MOUNT_POINTS').split(':'),
  };
}

export const NODE_NAME = 'ztn-e2e-node';
const SERVICE_CIDR = '10.96.0.0/16';
const POD_CIDR = '10.244.0.0/16';
const POD_SUBNET = '10.244.0.0/24';
const API_SERVICE_IP = '10.96.0.1';

export class Cluster {
  readonly env: E2eEnv;
  readonly pki: ControlPlanePki;
  readonly controlPlane: ControlPlane;
  readonly admin: Kube;
  readonly runtime: NodeRuntime;
  private readonly services = new Map<string, string>();
  private stopServices: (() => void) | null = null;
  private readonly runtimeLog: string;

  private constructor(env: E2eEnv) {
    this.env = env;
    const pkiDir = join(env.work, 'pki');
    mkdirSync(pkiDir, { recursive: true });
    this.pki = makeControlPlanePki(pkiDir, { node: NODE_NAME, apiIps: [env.nodeIp, API_SERVICE_IP] });
    mkdirSync(join(env.work, 'control-plane'), { recursive: true });
    this.controlPlane = new ControlPlane({
      bin: env.k8sBin, dir: join(env.work, 'control-plane'), logDir: env.logs, pki: this.pki,
      nodeName: NODE_NAME, nodeIp: env.nodeIp, serviceCidr: SERVICE_CIDR, podCidr: POD_CIDR,
    });
    const server = this.controlPlane.server;
    this.admin = new Kube(server, this.pki.ca.certPath, this.pki.admin);
    this.runtimeLog = join(env.logs, 'node-runtime.log');
    const cniBin = '/opt/cni/bin';
    const kubeletVersion = execFileSync(join(env.k8sBin, 'kube-apiserver'), ['--version'], { encoding: 'utf8' }).trim().split(' ').pop() ?? 'unknown';
    const runcVersion = execFileSync('runc', ['--version'], { encoding: 'utf8' }).split('\n')[0]!.split(' ').pop() ?? 'unknown';
    this.runtime = new NodeRuntime({
      nodeName: NODE_NAME,
      nodeIp: env.nodeIp,
      kubelet: new Kube(server, this.pki.ca.certPath, this.pki.kubelet),
      scheduler: new Kube(server, this.pki.ca.certPath, this.pki.scheduler),
      dir: join(env.work, 'node'),
      logDir: env.logs,
      image: images({ istioBin: env.istioBin, istioModule: env.istioModule, envoy: env.envoy, repo: env.repo, apps: join(env.repo, 'test', 'e2e', 'apps') }),
      cni: { binDir: cniBin, confDir: '/etc/cni/net.d', cnitool: join(env.istioBin, 'cnitool'), network: 'e2e' },
      apiService: { host: API_SERVICE_IP, port: 443 },
      hosts: () => [...this.services].map(([name, ip]) => `${ip}\t${name}.svc ${name}.svc.cluster.local`),
      resolvConf: (ns) => `nameserver 10.96.0.10\nsearch ${ns}.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n`,
      capacity: { cpu: '2', memory: '8Gi', pods: '110' },
      versions: { kubelet: kubeletVersion, runtime: `runc://${runcVersion}` },
      netnsPrefix: env.id,
      cgroupParent: `/${env.id}`,
      log: (line) => appendFileSync(this.runtimeLog, `${new Date().toISOString()} ${line}\n`),
    });
  }

  /** Brings the whole cluster up; `step` is told each stage. */
  static async up(env: E2eEnv, step: (line: string) => void): Promise<Cluster> {
    Cluster.nodeFilesystem(env);
    const c = new Cluster(env);
    step('control plane: etcd, kube-apiserver, kube-controller-manager');
    await c.controlPlane.start();
    c.stopServices = c.admin.watch<KubeObject & { spec: { clusterIP?: string } }>('/api/v1/services', (e) => {
      const key = `${e.object.metadata.name}.${e.object.metadata.namespace}`;
      if (e.type === 'DELETED' || !e.object.spec.clusterIP || e.object.spec.clusterIP === 'None') c.services.delete(key);
      else c.services.set(key, e.object.spec.clusterIP);
    });
    step('node: registered, runtime and scheduler running; kube-proxy');
    await c.runtime.start();
    await c.controlPlane.startKubeProxy();
    const charts = join(env.istioModule, 'manifests', 'charts');
    step('the Gateway API\'s CRDs; Istio: base (CRDs), istiod (ambient)');
    await c.kubectl(['apply', '--server-side', '-f', env.gatewayApiCrds]);
    await c.helm('install', 'istio-base', join(charts, 'base'), '-n', 'istio-system', '--create-namespace');
    await c.helm('install', 'istiod', join(charts, 'istio-control', 'istio-discovery'), '-n', 'istio-system', '--set', 'profile=ambient');
    await c.waitPodsReady('istio-system', 'app=istiod', 1, 300_000);
    step('Istio: istio-cni (ambient)');
    await c.helm('install', 'istio-cni', join(charts, 'istio-cni'), '-n', 'istio-system', '--set', 'profile=ambient');
    await c.waitPodsReady('istio-system', 'k8s-app=istio-cni-node', 1, 300_000);
    step('ztunnel-node: deploy/ztunnel-node, profile=ambient');
    await c.helm('install', 'ztunnel', join(env.repo, 'deploy', 'ztunnel-node'), '-n', 'istio-system', '--set', 'profile=ambient',
      // Short-lived certificates, so that rotation happens during the run (scenario 4).
      '--set', 'env.SECRET_TTL=2m');
    await c.waitPodsReady('istio-system', 'app=ztunnel', 1, 300_000);
    return c;
  }

  /**
   * The node's directories (its CNI configuration and binaries, istio-cni's and ztunnel's socket directories), bound
   * over the host's paths in this mount namespace only; the node's CNI network: the reference ptp plugin with
   * host-local addresses, which istio-cni's installer then chains itself onto.
   */
  private static nodeFilesystem(env: E2eEnv): void {
    const nodeRoot = join(env.work, 'node-root');
    for (const p of env.mountPoints) {
      mkdirSync(join(nodeRoot, p), { recursive: true });
      execFileSync('mount', ['--bind', join(nodeRoot, p), p]);
    }
    for (const plugin of ['ptp', 'host-local', 'loopback']) copyFileSync(join(env.istioBin, plugin), join('/opt/cni/bin', plugin));
    execFileSync('chmod', ['755', ...['ptp', 'host-local', 'loopback'].map((p) => join('/opt/cni/bin', p))]);
    writeFileSync('/etc/cni/net.d/10-e2e.conflist', JSON.stringify({
      cniVersion: '1.0.0',
      name: 'e2e',
      plugins: [{
        type: 'ptp',
        mtu: 1500,
        ipMasq: false,
        ipam: { type: 'host-local', ranges: [[{ subnet: POD_SUBNET }]], routes: [{ dst: '0.0.0.0/0' }], dataDir: '/var/lib/cni/networks' },
      }],
    }, null, 2));
  }

  async down(): Promise<void> {
    this.stopServices?.();
    await this.runtime.close().catch(() => {});
    await this.controlPlane.stop();
  }

  /** `helm <args>` with the admin's kubeconfig; rejects with helm's output. */
  async helm(...args: string[]): Promise<string> {
    return this.tool(this.env.helm, args);
  }

  /** `kubectl <args>` with the admin's kubeconfig. */
  async kubectl(args: string[], input?: string): Promise<string> {
    return this.tool(join(this.env.k8sBin, 'kubectl'), args, input);
  }

  /** `istioctl <args>` with the admin's kubeconfig: what it printed, on stdout and stderr (where it reports). */
  async istioctl(args: string[]): Promise<string> {
    return this.tool(join(this.env.istioBin, 'istioctl'), args, undefined, true);
  }

  private async tool(bin: string, args: string[], input?: string, withStderr = false): Promise<string> {
    const env = { ...process.env, KUBECONFIG: this.controlPlane.kubeconfigs.admin, HOME: this.env.work };
    try {
      if (input !== undefined) {
        const child = execFile(bin, args, { env, maxBuffer: 32 * 1024 * 1024, timeout: 300_000 });
        child.stdin?.end(input);
        return await new Promise((resolve, reject) => {
          let out = '';
          let err = '';
          child.stdout?.on('data', (d: string) => (out += d));
          child.stderr?.on('data', (d: string) => (err += d));
          child.on('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`${bin} ${args.join(' ')}: exit ${code}\n${err}${out}`))));
        });
      }
      const { stdout, stderr } = await execFileP(bin, args, { env, maxBuffer: 32 * 1024 * 1024, timeout: 300_000 });
      return withStderr ? `${stdout}${stderr}` : stdout;
    } catch (err) {
      const e = err as Error & { stdout?: string; stderr?: string };
      throw new Error(`${bin.split('/').pop()} ${args.join(' ')} failed: ${(e.stderr || e.stdout || e.message).trim()}`);
    }
  }

  /** kubectl apply of YAML or JSON text (server-side: the API server's validation and admission, webhooks included). */
  async apply(manifest: string): Promise<string> {
    return this.kubectl(['apply', '--server-side', '--force-conflicts', '-f', '-'], manifest);
  }

  /** The pods matching `selector` in `namespace`. */
  async pods(namespace: string, selector: string): Promise<Pod[]> {
    return (await this.admin.list<Pod>(`${apiPath('pods', { namespace })}?labelSelector=${encodeURIComponent(selector)}`)).items;
  }

  /** Waits until `count` pods matching `selector` are Ready (and none terminating); fails naming their logs. */
  async waitPodsReady(namespace: string, selector: string, count: number, timeoutMs = 120_000): Promise<Pod[]> {
    const deadline = Date.now() + timeoutMs;
    let last: Pod[] = [];
    while (Date.now() < deadline) {
      last = await this.pods(namespace, selector);
      const ready = last.filter((p) => !p.metadata.deletionTimestamp && p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True'));
      if (ready.length === count && last.length === count) return ready;
      await new Promise((r) => setTimeout(r, 500));
    }
    const logs = last.flatMap((p) => p.spec.containers.map((c) => join(this.env.logs, 'pods', `${p.metadata.namespace}_${p.metadata.name}_${c.name}.log`)));
    throw new Error(`${count} ready pod(s) ${namespace}/${selector} within ${timeoutMs / 1000} s; have ${last.map((p) => `${p.metadata.name} ${p.status?.phase ?? 'unknown'} ${JSON.stringify(p.status?.containerStatuses?.map((s) => [s.ready, s.restartCount]) ?? [])}`).join(', ') || 'none'}; logs: ${logs.join(', ') || '(none yet)'}; the node's runtime: ${this.runtimeLog}\n${tail(this.runtimeLog)}`);
  }

  /** The ztunnel-node pod serving the node (the one Ready, not terminating). */
  async ztunnelPod(): Promise<Pod> {
    const [p] = await this.waitPodsReady('istio-system', 'app=ztunnel', 1);
    return p!;
  }

  /**
   * GET on the node's ztunnel-node, in its pod (ztunnel runs in a pod network namespace of its own, as Istio's does):
   * stats (15020) and readiness (15021) at the pod's address, as Prometheus and the kubelet reach them; admin (15000) on
   * the pod's loopback, reached from inside its network namespace (as `kubectl port-forward` would).
   */
  async ztunnelGet(port: 15000 | 15020 | 15021, path: string): Promise<{ status: number; body: string }> {
    // The node's own view (no API call: this works while the API server is down): the newest ready ztunnel pod.
    const running = this.runtime.runningPods('istio-system', { app: 'ztunnel' }).find((p) => p.ready);
    if (!running?.netns) throw new Error('no ready ztunnel-node pod runs on the node');
    if (port !== 15000) return httpGet(running.ip, port, path);
    return httpGetInNetns(running.netns, '127.0.0.1', port, path);
  }
}

/** GET http://host:port/path from inside the network namespace /run/netns/<netns> (a child `node`, entered with nsenter). */
export async function httpGetInNetns(netns: string, host: string, port: number, path: string): Promise<{ status: number; body: string }> {
  const script = `const r = require('node:http').get({ host: ${JSON.stringify(host)}, port: ${port}, path: ${JSON.stringify(path)}, timeout: 10000 }, (res) => {
  const b = []; res.on('data', (c) => b.push(c)); res.on('end', () => process.stdout.write(JSON.stringify({ status: res.statusCode, body: Buffer.concat(b).toString('utf8') })));
}); r.on('timeout', () => r.destroy(new Error('no answer within 10 s'))); r.on('error', (e) => { console.error(e.message); process.exit(1); });`;
  try {
    const { stdout } = await execFileP('nsenter', [`--net=/run/netns/${netns}`, process.execPath, '-e', script], { maxBuffer: 64 * 1024 * 1024, timeout: 20_000 });
    return JSON.parse(stdout) as { status: number; body: string };
  } catch (err) {
    const e = err as Error & { stderr?: string };
    throw new Error(`GET http://${host}:${port}${path} in ${netns}: ${(e.stderr || e.message).trim()}`);
  }
}

export function httpGet(host: string, port: number, path: string, timeoutMs = 10_000): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host, port, path, timeout: timeoutMs }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`GET http://${host}:${port}${path}: no answer within ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end();
  });
}

function tail(file: string, lines = 30): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).map((l) => `  | ${l}`).join('\n');
  } catch {
    return '  | (no log)';
  }
}
