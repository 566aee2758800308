// The control plane of the e2e cluster, run as a control-plane node runs its static pods: etcd, kube-apiserver,
// kube-controller-manager and kube-proxy, each a process under its own binary name, with its log in <logs>/<name>.log.
// A program that fails to start (exits, or does not answer its health check in time) fails the run naming itself and
// its log, with the log's last lines.
import { spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync, closeSync, mkdirSync, openSync, readFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { join } from 'node:path';
import { kubeconfig, type ControlPlanePki } from './pki.js';

/** One program of the control plane: its process, and how to start it again with the same arguments. */
export class Program {
  readonly name: string;
  readonly log: string;
  private readonly binary: string;
  private readonly args: string[];
  private readonly env: NodeJS.ProcessEnv;
  private child: ChildProcess | null = null;
  private exited: Promise<number | null> = Promise.resolve(null);

  constructor(name: string, binary: string, args: string[], logDir: string, env: NodeJS.ProcessEnv = {}) {
    this.name = name;
    this.binary = binary;
    this.args = args;
    this.env = env;
    this.log = join(logDir, `${name}.log`);
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  start(): void {
    appendFileSync(this.log, `\n---- ${new Date().toISOString()} ${this.binary} ${this.args.join(' ')}\n`);
    const out = openSync(this.log, 'a');
    const child = spawn(this.binary, this.args, { stdio: ['ignore', out, out], env: { PATH: process.env.PATH, HOME: process.env.HOME, ...this.env } });
    closeSync(out);
    this.child = child;
    this.exited = new Promise((resolve) => child.on('exit', (code, signal) => {
      if (this.child === child) this.child = null;
      resolve(code ?? (signal ? -1 : null));
    }));
  }

  /** SIGTERM, then SIGKILL after `graceMs`; resolves once it has exited. */
  async stop(graceMs = 10_000): Promise<void> {
    const child = this.child;
    if (!child) return;
    child.kill('SIGTERM');
    const t = setTimeout(() => child.kill('SIGKILL'), graceMs);
    await this.exited;
    clearTimeout(t);
  }

  /**
   * Polls `healthy` every 250 ms until it resolves true; fails naming the program and its log when the process exits
   * first or `timeoutMs` passes.
   */
  async waitHealthy(healthy: () => Promise<boolean>, timeoutMs = 120_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let dead = false;
    void this.exited.then((code) => { if (code !== null || this.child === null) dead = true; });
    while (Date.now() < deadline) {
      if (dead || this.child === null) throw new Error(`${this.name} exited before it was healthy: see ${this.log}\n${this.tail()}`);
      if (await healthy().catch(() => false)) return;
      await new Promise((r) => setTimeout(r, 250));
    }
    throw new Error(`${this.name} not healthy within ${timeoutMs / 1000} s: see ${this.log}\n${this.tail()}`);
  }

  /** The log's last lines. */
  tail(lines = 25): string {
    try {
      return readFileSync(this.log, 'utf8').trimEnd().split('\n').slice(-lines).map((l) => `  | ${l}`).join('\n');
    } catch {
      return '  | (no log)';
    }
  }
}

/**
 * GET `url` (HTTP, or HTTPS with the admin's certificate, or, with `tls` 'self-signed', without verifying a serving
 * certificate the program made itself); true on 200.
 */
function healthz(url: string, tls?: { ca: Buffer; cert: Buffer; key: Buffer } | 'self-signed'): Promise<boolean> {
  const opts = tls === 'self-signed' ? { rejectUnauthorized: false } : { ...tls };
  return new Promise((resolve) => {
    const req = (url.startsWith('https:') ? httpsRequest : httpRequest)(url, { ...opts, timeout: 2_000 }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(false));
    req.end();
  });
}

export interface ControlPlaneOptions {
  bin: string;
  dir: string;
  logDir: string;
  pki: ControlPlanePki;
  nodeName: string;
  nodeIp: string;
  serviceCidr: string;
  podCidr: string;
}

export class ControlPlane {
  readonly etcd: Program;
  readonly apiserver: Program;
  readonly controllerManager: Program;
  readonly kubeProxy: Program;
  readonly server: string;
  readonly kubeconfigs: { admin: string; controllerManager: string; kubeProxy: string };
  private readonly tls: { ca: Buffer; cert: Buffer; key: Buffer };

  constructor(o: ControlPlaneOptions) {
    const { bin, dir, logDir, pki } = o;
    mkdirSync(logDir, { recursive: true });
    this.server = `https://${o.nodeIp}:6443`;
    this.kubeconfigs = {
      admin: kubeconfig(join(dir, 'admin.kubeconfig'), this.server, pki.ca, pki.admin),
      controllerManager: kubeconfig(join(dir, 'controller-manager.kubeconfig'), this.server, pki.ca, pki.controllerManager),
      kubeProxy: kubeconfig(join(dir, 'kube-proxy.kubeconfig'), this.server, pki.ca, pki.kubeProxy),
    };
    this.tls = { ca: readFileSync(pki.ca.certPath), cert: readFileSync(pki.admin.cert), key: readFileSync(pki.admin.key) };
    this.etcd = new Program('etcd', join(bin, 'etcd'), [
      '--name', 'e2e', '--data-dir', join(dir, 'etcd'),
      '--listen-client-urls', 'http://127.0.0.1:2379', '--advertise-client-urls', 'http://127.0.0.1:2379',
      '--listen-peer-urls', 'http://127.0.0.1:2380', '--initial-advertise-peer-urls', 'http://127.0.0.1:2380',
      '--initial-cluster', 'e2e=http://127.0.0.1:2380', '--listen-metrics-urls', 'http://127.0.0.1:2381',
      '--log-level', 'warn',
    ], logDir);
    this.apiserver = new Program('kube-apiserver', join(bin, 'kube-apiserver'), [
      '--etcd-servers=http://127.0.0.1:2379',
      `--advertise-address=${o.nodeIp}`,
      '--bind-address=0.0.0.0',
      '--secure-port=6443',
      `--tls-cert-file=${pki.apiserver.cert}`,
      `--tls-private-key-file=${pki.apiserver.key}`,
      `--client-ca-file=${pki.ca.certPath}`,
      `--service-account-key-file=${pki.saPub}`,
      `--service-account-signing-key-file=${pki.saKey}`,
      '--service-account-issuer=https://kubernetes.default.svc.cluster.local',
      '--api-audiences=https://kubernetes.default.svc.cluster.local',
      `--service-cluster-ip-range=${o.serviceCidr}`,
      '--authorization-mode=Node,RBAC',
      '--enable-admission-plugins=NodeRestriction',
      '--allow-privileged=true',
      // Webhooks (istiod's) are called at their Service's endpoints, not its ClusterIP (this node's kube-proxy is in
      // the node's network namespace; the API server reaches pods directly).
      '--enable-aggregator-routing=true',
      '--profiling=false',
      '--v=1',
    ], logDir);
    this.controllerManager = new Program('kube-controller-manager', join(bin, 'kube-controller-manager'), [
      `--kubeconfig=${this.kubeconfigs.controllerManager}`,
      `--authentication-kubeconfig=${this.kubeconfigs.controllerManager}`,
      `--authorization-kubeconfig=${this.kubeconfigs.controllerManager}`,
      `--service-account-private-key-file=${pki.saKey}`,
      `--root-ca-file=${pki.ca.certPath}`,
      '--use-service-account-credentials=true',
      `--cluster-signing-cert-file=${pki.ca.certPath}`,
      `--cluster-signing-key-file=${pki.ca.keyPath}`,
      `--service-cluster-ip-range=${o.serviceCidr}`,
      `--cluster-cidr=${o.podCidr}`,
      '--leader-elect=false',
      '--bind-address=127.0.0.1',
      '--secure-port=10257',
      '--v=1',
    ], logDir);
    this.kubeProxy = new Program('kube-proxy', join(bin, 'kube-proxy'), [
      `--kubeconfig=${this.kubeconfigs.kubeProxy}`,
      `--hostname-override=${o.nodeName}`,
      '--proxy-mode=iptables',
      `--cluster-cidr=${o.podCidr}`,
      '--metrics-bind-address=127.0.0.1:10249',
      '--healthz-bind-address=127.0.0.1:10256',
      // Leave the machine's conntrack table size alone.
      '--conntrack-max-per-core=0',
      '--v=1',
    ], logDir);
  }

  /** etcd, then the API server (ready), then the controller manager (healthy); kube-proxy once the node exists. */
  async start(): Promise<void> {
    this.etcd.start();
    await this.etcd.waitHealthy(() => healthz('http://127.0.0.1:2379/health'));
    await this.startApiserver();
    this.controllerManager.start();
    await this.controllerManager.waitHealthy(() => healthz('https://127.0.0.1:10257/healthz', 'self-signed'));
  }

  /** kube-proxy, on a node that is registered (its /healthz is 503 until its Node exists). */
  async startKubeProxy(): Promise<void> {
    this.kubeProxy.start();
    await this.kubeProxy.waitHealthy(() => healthz('http://127.0.0.1:10256/healthz'));
  }

  async startApiserver(): Promise<void> {
    this.apiserver.start();
    await this.apiserver.waitHealthy(() => healthz(`${this.server}/readyz`, this.tls));
  }

  /** Every program, last started first. */
  async stop(): Promise<void> {
    for (const p of [this.kubeProxy, this.controllerManager, this.apiserver, this.etcd]) await p.stop().catch(() => {});
  }
}
