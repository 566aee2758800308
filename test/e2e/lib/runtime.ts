// The e2e node's runtime: what a kubelet, a container runtime and a scheduler do for the one node of the environment,
// as far as Istio's components and ztunnel-node can tell, with the real pieces underneath.
//
//   scheduler  every pod of the default scheduler without a node is bound to this node (pods/binding, with the
//              scheduler's own credentials): the Deployments' and DaemonSets' pods land here as on a one-node cluster
//   node       registered as a kubelet registers (its Node, status, and a Lease renewed every 10 s), with the kubelet's
//              identity (system:node:<name>): the Node authorizer and NodeRestriction judge every call below
//   sandbox    a network namespace per pod (`ip netns add`), set up by the node's CNI configuration through cnitool
//              (libcni: the chained plugins, with the pod's K8S_POD_* arguments), so istio-cni's real plugin runs for
//              every pod, and torn down with CNI DEL; hostNetwork pods share the node's namespace
//   volumes    emptyDir, hostPath, configMap, secret, downwardAPI and projected ones (a ServiceAccount token from the
//              TokenRequest API bound to the pod, refreshed at 80 % of its life as the kubelet does)
//   containers runc, one OCI bundle per container: the image's files (images.ts) bound read-only over the host's
//              /usr and /etc, the pod's volumes, its security context (user, capabilities, no_new_privs, read-only
//              root), its own PID, IPC and UTS namespaces, a cgroup <run>/kubepods/besteffort/pod<uid>/<container> (where
//              istio-cni's node agent finds a pod's processes); restarted on exit with a back-off, as restartPolicy
//              Always does
//   status     phase, IPs, container states and restart counts, and Ready from the readiness probes (httpGet and
//              tcpSocket, run from the node's namespace as the kubelet runs them), written to pods/status
//   deletion   SIGTERM, the grace period, SIGKILL, CNI DEL, then the pod's final delete with grace 0
//
// Container logs are files (<logs>/pods/<namespace>_<pod>_<container>.log), named in every failure.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, closeSync, existsSync, mkdirSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { connect } from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { apiPath, KubeError, type Kube, type KubeObject, type WatchEvent } from './kube.js';

const execFileP = promisify(execFile);

/** What an image holds, as far as this runtime needs it: its entrypoint, command, user and files. */
export interface ImageSpec {
  entrypoint: string[];
  cmd: string[];
  /** The image's USER (0:0 when unset). */
  user?: { uid: number; gid: number };
  env?: Record<string, string>;
  /** The image's own files, bound read-only over the host's system directories (source on this machine). */
  files: { source: string; destination: string }[];
  workingDir?: string;
}

export interface RuntimeOptions {
  nodeName: string;
  nodeIp: string;
  /** The kubelet's client (system:node:<nodeName>). */
  kubelet: Kube;
  /** The scheduler's client (system:kube-scheduler). */
  scheduler: Kube;
  /** Scratch: bundles, volumes, runc's state. */
  dir: string;
  logDir: string;
  /** An image reference → its spec, or null for an image this node cannot run. */
  image: (ref: string) => ImageSpec | null;
  cni: { binDir: string; confDir: string; cnitool: string; network: string };
  /** The `kubernetes` Service's address, as the kubelet puts it in every container's environment. */
  apiService: { host: string; port: number };
  /** /etc/hosts lines every pod gets beside its own (the stand-in for cluster DNS: see e2e/README). */
  hosts: () => string[];
  /** The pod's resolv.conf (dnsPolicy ClusterFirst). */
  resolvConf: (namespace: string) => string;
  capacity: { cpu: string; memory: string; pods: string };
  /** The pods' network namespaces are /run/netns/<prefix>-<hash of the pod's uid>. */
  netnsPrefix: string;
  /** The cgroup every pod's goes under (`<parent>/kubepods/besteffort/pod<uid>/<container>`): the run's own. */
  cgroupParent: string;
  versions: { kubelet: string; runtime: string };
  log: (line: string) => void;
}

/** The Docker default capabilities, which containerd also gives a container that asks for nothing else. */
const DEFAULT_CAPS = ['CHOWN', 'DAC_OVERRIDE', 'FSETID', 'FOWNER', 'MKNOD', 'NET_RAW', 'SETGID', 'SETUID', 'SETFCAP', 'SETPCAP', 'NET_BIND_SERVICE', 'SYS_CHROOT', 'KILL', 'AUDIT_WRITE'];
const ALL_CAPS = ['AUDIT_CONTROL', 'AUDIT_READ', 'AUDIT_WRITE', 'BLOCK_SUSPEND', 'BPF', 'CHECKPOINT_RESTORE', 'CHOWN', 'DAC_OVERRIDE', 'DAC_READ_SEARCH', 'FOWNER', 'FSETID', 'IPC_LOCK', 'IPC_OWNER', 'KILL', 'LEASE', 'LINUX_IMMUTABLE', 'MAC_ADMIN', 'MAC_OVERRIDE', 'MKNOD', 'NET_ADMIN', 'NET_BIND_SERVICE', 'NET_BROADCAST', 'NET_RAW', 'PERFMON', 'SETFCAP', 'SETGID', 'SETPCAP', 'SETUID', 'SYSLOG', 'SYS_ADMIN', 'SYS_BOOT', 'SYS_CHROOT', 'SYS_MODULE', 'SYS_NICE', 'SYS_PACCT', 'SYS_PTRACE', 'SYS_RAWIO', 'SYS_RESOURCE', 'SYS_TIME', 'SYS_TTY_CONFIG', 'WAKE_ALARM'];
/**
 * The host's system directories every container sees read-only (the "base image"): /usr's, not /usr itself, so that an
 * image's own files can be placed under /usr/local (a mount point cannot be made inside a read-only bind). /etc is
 * copied into each container's root instead (3 MB): volumes are mounted under it (/etc/istio, /etc/cacerts).
 */
const BASE = ['/usr/bin', '/usr/sbin', '/usr/lib', '/usr/lib64', '/usr/libexec', '/usr/share', '/bin', '/sbin', '/lib', '/lib64'];

// ---- The parts of a Pod this runtime reads ------------------------------------------------------------------------

interface EnvVar {
  name: string;
  value?: string;
  valueFrom?: {
    fieldRef?: { fieldPath: string };
    resourceFieldRef?: { resource: string; divisor?: string; containerName?: string };
    configMapKeyRef?: { name: string; key: string; optional?: boolean };
    secretKeyRef?: { name: string; key: string; optional?: boolean };
  };
}
interface Probe {
  httpGet?: { path?: string; port: number | string; scheme?: string };
  tcpSocket?: { port: number | string };
  initialDelaySeconds?: number;
  periodSeconds?: number;
  timeoutSeconds?: number;
  failureThreshold?: number;
  successThreshold?: number;
}
interface Container {
  name: string;
  image: string;
  command?: string[];
  args?: string[];
  env?: EnvVar[];
  envFrom?: { configMapRef?: { name: string; optional?: boolean }; secretRef?: { name: string; optional?: boolean }; prefix?: string }[];
  ports?: { name?: string; containerPort: number }[];
  volumeMounts?: { name: string; mountPath: string; readOnly?: boolean; subPath?: string; mountPropagation?: string }[];
  readinessProbe?: Probe;
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  securityContext?: SecurityContext;
  workingDir?: string;
}
interface SecurityContext {
  runAsUser?: number;
  runAsGroup?: number;
  runAsNonRoot?: boolean;
  privileged?: boolean;
  allowPrivilegeEscalation?: boolean;
  readOnlyRootFilesystem?: boolean;
  capabilities?: { add?: string[]; drop?: string[] };
}
interface KeyToPath { key: string; path: string; mode?: number }
interface Volume {
  name: string;
  emptyDir?: { medium?: string };
  hostPath?: { path: string; type?: string };
  configMap?: { name: string; items?: KeyToPath[]; optional?: boolean; defaultMode?: number };
  secret?: { secretName: string; items?: KeyToPath[]; optional?: boolean; defaultMode?: number };
  downwardAPI?: { items: { path: string; fieldRef?: { fieldPath: string } }[] };
  projected?: {
    defaultMode?: number;
    sources: {
      serviceAccountToken?: { path: string; audience?: string; expirationSeconds?: number };
      configMap?: { name: string; items?: KeyToPath[]; optional?: boolean };
      secret?: { name: string; items?: KeyToPath[]; optional?: boolean };
      downwardAPI?: { items: { path: string; fieldRef?: { fieldPath: string } }[] };
    }[];
  };
}
export interface Pod extends KubeObject {
  spec: {
    nodeName?: string;
    schedulerName?: string;
    hostNetwork?: boolean;
    hostPID?: boolean;
    serviceAccountName?: string;
    containers: Container[];
    initContainers?: Container[];
    volumes?: Volume[];
    terminationGracePeriodSeconds?: number;
    securityContext?: SecurityContext & { fsGroup?: number };
    hostname?: string;
    subdomain?: string;
    dnsPolicy?: string;
  };
  status?: { phase?: string; podIP?: string; conditions?: { type: string; status: string }[]; containerStatuses?: { name: string; ready: boolean; restartCount: number }[] };
}

// ---- Running pods ----------------------------------------------------------------------------------------------------

interface ContainerRun {
  spec: Container;
  id: string;
  bundle: string;
  log: string;
  proc: ChildProcess | null;
  restartCount: number;
  startedAt: string | null;
  lastExit: { exitCode: number; finishedAt: string; reason: string } | null;
  ready: boolean;
  probeSuccesses: number;
  probeFailures: number;
  probeTimer: NodeJS.Timeout | null;
  restartTimer: NodeJS.Timeout | null;
}

interface PodRun {
  pod: Pod;
  key: string;
  uid: string;
  /** The pod's network namespace (a name under /run/netns), or null for hostNetwork. */
  netns: string | null;
  ip: string;
  dir: string;
  containers: ContainerRun[];
  stopping: Promise<void> | null;
  tokenTimers: NodeJS.Timeout[];
  startTime: string;
  statusTimer: NodeJS.Timeout | null;
  statusWrite: Promise<void>;
}

export class NodeRuntime {
  private readonly opts: RuntimeOptions;
  private readonly pods = new Map<string, PodRun>();
  private readonly stops: (() => void)[] = [];
  private leaseTimer: NodeJS.Timeout | null = null;
  private closed = false;
  private readonly runcRoot: string;
  /** Pods being set up, by uid: a watch event that arrives meanwhile waits for it. */
  private readonly pending = new Map<string, Promise<void>>();

  constructor(opts: RuntimeOptions) {
    this.opts = opts;
    this.runcRoot = join(opts.dir, 'runc');
    mkdirSync(this.runcRoot, { recursive: true });
    mkdirSync(join(opts.logDir, 'pods'), { recursive: true });
  }

  /** Registers the node (Node, status, Lease), then schedules and runs pods until `close`. */
  async start(): Promise<void> {
    await this.register();
    this.stops.push(this.opts.scheduler.watch<Pod>('/api/v1/pods?fieldSelector=spec.nodeName=', (e) => {
      if (e.type !== 'DELETED') void this.schedule(e.object);
    }, (err) => this.opts.log(`scheduler watch: ${err.message}`)));
    this.stops.push(this.opts.kubelet.watch<Pod>(`/api/v1/pods?fieldSelector=spec.nodeName=${this.opts.nodeName}`, (e) => this.onPod(e), (err) => this.opts.log(`kubelet watch: ${err.message}`)));
  }

  /** Stops every pod (SIGKILL, CNI DEL) and the watches; the API objects stay. */
  async close(): Promise<void> {
    this.closed = true;
    for (const s of this.stops) s();
    if (this.leaseTimer) clearInterval(this.leaseTimer);
    await Promise.all([...this.pending.values()].map((p) => p.catch(() => {})));
    await Promise.all([...this.pods.values()].map((p) => this.teardown(p, 0).catch((err: Error) => this.opts.log(`teardown ${p.key}: ${err.message}`))));
  }

  /** The running pod of `namespace/name`, or undefined. */
  running(namespace: string, name: string): { ip: string; netns: string | null; containers: { name: string; id: string; pid: number | undefined; log: string }[] } | undefined {
    const p = [...this.pods.values()].find((r) => r.pod.metadata.namespace === namespace && r.pod.metadata.name === name && r.stopping === null);
    if (!p) return undefined;
    return { ip: p.ip, netns: p.netns, containers: p.containers.map((c) => ({ name: c.spec.name, id: c.id, pid: c.proc?.pid, log: c.log })) };
  }

  /**
   * The running pods of `namespace` whose labels include `labels`, newest first, from this node's own state (no API
   * call: what a scenario reads while the API server is down).
   */
  runningPods(namespace: string, labels: Record<string, string>): { name: string; ip: string; netns: string | null; ready: boolean; startTime: string }[] {
    return [...this.pods.values()]
      .filter((r) => r.stopping === null && r.pod.metadata.namespace === namespace && Object.entries(labels).every(([k, v]) => r.pod.metadata.labels?.[k] === v))
      .map((r) => ({ name: r.pod.metadata.name, ip: r.ip, netns: r.netns, ready: r.containers.length > 0 && r.containers.every((c) => c.ready && c.proc !== null), startTime: r.startTime }))
      .sort((a, b) => b.startTime.localeCompare(a.startTime));
  }

  /** `runc exec` in a container of a running pod (what `kubectl exec` does): resolves stdout; rejects with stderr. */
  async exec(namespace: string, name: string, container: string, argv: string[], timeoutMs = 60_000): Promise<string> {
    const p = this.running(namespace, name);
    const c = p?.containers.find((x) => x.name === container);
    if (!c) throw new Error(`exec: no running container ${container} in ${namespace}/${name}`);
    const { stdout } = await execFileP('runc', ['--root', this.runcRoot, 'exec', c.id, ...argv], { timeout: timeoutMs, maxBuffer: 16 * 1024 * 1024 });
    return stdout;
  }

  /** Kills the process of a container (as an OOM kill or a crash would); the runtime restarts it. */
  async killContainer(namespace: string, name: string, container: string, signal = 'KILL'): Promise<void> {
    const p = this.running(namespace, name);
    const c = p?.containers.find((x) => x.name === container);
    if (!c) throw new Error(`kill: no running container ${container} in ${namespace}/${name}`);
    await execFileP('runc', ['--root', this.runcRoot, 'kill', c.id, signal]);
  }

  // ---- node registration ------------------------------------------------------------------------------------------

  private async register(): Promise<void> {
    const { kubelet, nodeName, nodeIp, capacity, versions } = this.opts;
    const node = await kubelet.getOrNull(apiPath('nodes', { name: nodeName }));
    if (node === null) {
      await kubelet.create(apiPath('nodes'), {
        apiVersion: 'v1',
        kind: 'Node',
        metadata: { name: nodeName, labels: { 'kubernetes.io/hostname': nodeName, 'kubernetes.io/os': 'linux', 'kubernetes.io/arch': 'amd64', 'beta.kubernetes.io/os': 'linux', 'beta.kubernetes.io/arch': 'amd64' } },
        spec: {},
      });
    }
    const now = new Date().toISOString();
    const condition = (type: string, status: string, reason: string) => ({ type, status, reason, message: reason, lastHeartbeatTime: now, lastTransitionTime: now });
    await kubelet.patch(apiPath('nodes', { name: nodeName, sub: 'status' }), {
      status: {
        capacity,
        allocatable: capacity,
        addresses: [{ type: 'InternalIP', address: nodeIp }, { type: 'Hostname', address: nodeName }],
        conditions: [
          condition('MemoryPressure', 'False', 'KubeletHasSufficientMemory'),
          condition('DiskPressure', 'False', 'KubeletHasNoDiskPressure'),
          condition('PIDPressure', 'False', 'KubeletHasSufficientPID'),
          condition('Ready', 'True', 'KubeletReady'),
        ],
        nodeInfo: {
          kubeletVersion: versions.kubelet,
          kubeProxyVersion: versions.kubelet,
          containerRuntimeVersion: versions.runtime,
          operatingSystem: 'linux',
          architecture: 'amd64',
          osImage: 'ztunnel-node e2e',
          kernelVersion: readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim(),
          machineID: '', systemUUID: '', bootID: '',
        },
      },
    });
    const leasePath = apiPath('leases', { group: 'coordination.k8s.io', namespace: 'kube-node-lease', name: nodeName });
    const renew = async () => {
      const renewTime = new Date().toISOString().replace('Z', '000Z');
      try {
        await kubelet.patch(leasePath, { spec: { renewTime, holderIdentity: nodeName, leaseDurationSeconds: 40 } }, 'merge');
      } catch (err) {
        if (err instanceof KubeError && err.status === 404) {
          await kubelet.create(apiPath('leases', { group: 'coordination.k8s.io', namespace: 'kube-node-lease' }), {
            apiVersion: 'coordination.k8s.io/v1',
            kind: 'Lease',
            metadata: { name: nodeName, namespace: 'kube-node-lease' },
            spec: { holderIdentity: nodeName, leaseDurationSeconds: 40, renewTime },
          });
        } else {
          this.opts.log(`lease renewal: ${(err as Error).message}`);
        }
      }
    };
    await renew();
    this.leaseTimer = setInterval(() => void renew(), 10_000);
  }

  // ---- scheduling -------------------------------------------------------------------------------------------------

  private async schedule(pod: Pod): Promise<void> {
    if (this.closed || pod.spec.nodeName || pod.metadata.deletionTimestamp) return;
    if ((pod.spec.schedulerName ?? 'default-scheduler') !== 'default-scheduler') return;
    const { namespace, name } = pod.metadata;
    try {
      await this.opts.scheduler.create(apiPath('pods', { namespace, name, sub: 'binding' }), {
        apiVersion: 'v1',
        kind: 'Binding',
        metadata: { name, namespace, uid: pod.metadata.uid },
        target: { apiVersion: 'v1', kind: 'Node', name: this.opts.nodeName },
      });
    } catch (err) {
      // Already bound (a second event for the same pod), or gone.
      if (!(err instanceof KubeError && (err.status === 409 || err.status === 404))) this.opts.log(`binding ${namespace}/${name}: ${(err as Error).message}`);
    }
  }

  // ---- pods -------------------------------------------------------------------------------------------------------

  private onPod(e: WatchEvent<Pod>): void {
    if (this.closed) return;
    const pod = e.object;
    const uid = pod.metadata.uid ?? '';
    const known = this.pods.get(uid);
    const after = this.pending.get(uid) ?? Promise.resolve();
    if (e.type === 'DELETED') {
      if (known) void after.then(() => this.teardown(known, 0)).catch((err: Error) => this.opts.log(`teardown ${known.key}: ${err.message}`));
      return;
    }
    if (pod.metadata.deletionTimestamp) {
      if (known) {
        known.pod = pod;
        void after.then(() => this.terminate(known)).catch((err: Error) => this.opts.log(`terminating ${known.key}: ${err.message}`));
      } else if (!this.pending.has(uid)) {
        // Never started here: finish its deletion as the kubelet does.
        void this.finalize(pod).catch((err: Error) => this.opts.log(`finalizing ${pod.metadata.namespace}/${pod.metadata.name}: ${(err as Error).message}`));
      }
      return;
    }
    if (known) {
      known.pod = pod;
      return;
    }
    if (this.pending.has(uid) || ['Succeeded', 'Failed'].includes(pod.status?.phase ?? '')) return;
    this.setUp(pod, 0);
  }

  /**
   * Sets the pod up; on a failure (a volume's ConfigMap not there yet, a CNI plugin refusing) undoes what was done and
   * tries again in 2 s while the pod exists, as the kubelet's pod workers do.
   */
  private setUp(pod: Pod, attempt: number): void {
    const uid = pod.metadata.uid ?? '';
    const key = `${pod.metadata.namespace}/${pod.metadata.name}`;
    const setup = this.startPod(pod).catch(async (err: Error) => {
      this.opts.log(`pod ${key} failed to start (attempt ${attempt + 1}): ${err.message}`);
      const half = this.pods.get(uid);
      if (half) await this.teardown(half, 0).catch(() => {});
      await this.patchStatus(pod, { phase: 'Pending', conditions: [{ type: 'PodScheduled', status: 'True' }, { type: 'Ready', status: 'False', reason: 'StartError', message: err.message }] }).catch(() => {});
      await new Promise((r) => setTimeout(r, 2_000));
      if (this.closed) return;
      const now = await this.opts.kubelet.getOrNull<Pod>(apiPath('pods', { namespace: pod.metadata.namespace, name: pod.metadata.name })).catch(() => null);
      if (now && now.metadata.uid === uid && !now.metadata.deletionTimestamp) queueMicrotask(() => this.setUp(now, attempt + 1));
    }).finally(() => {
      if (this.pending.get(uid) === setup) this.pending.delete(uid);
    });
    this.pending.set(uid, setup);
  }

  private async startPod(pod: Pod): Promise<void> {
    const { namespace = 'default', name, uid = '' } = pod.metadata;
    const key = `${namespace}/${name}`;
    const dir = join(this.opts.dir, 'pods', uid);
    mkdirSync(dir, { recursive: true });
    const run: PodRun = {
      pod, key, uid, dir, netns: null, ip: this.opts.nodeIp, containers: [], stopping: null, tokenTimers: [],
      startTime: new Date().toISOString(), statusTimer: null, statusWrite: Promise.resolve(),
    };
    this.pods.set(uid, run);
    if (!pod.spec.hostNetwork) {
      run.netns = `${this.opts.netnsPrefix}-${createHash('sha256').update(uid).digest('hex').slice(0, 10)}`;
      await this.cmd('ip', ['netns', 'add', run.netns]);
      await this.cmd('ip', ['-n', run.netns, 'link', 'set', 'lo', 'up']);
      run.ip = await this.cniAdd(run);
    }
    this.opts.log(`pod ${key} sandbox ready at ${run.ip}${run.netns ? ` (netns ${run.netns})` : ' (host network)'}`);
    await this.prepareVolumes(run);
    writeFileSync(join(dir, 'hosts'), [
      '127.0.0.1\tlocalhost',
      '::1\tlocalhost ip6-localhost ip6-loopback',
      `${run.ip}\t${pod.spec.hostname ?? name}`,
      ...this.opts.hosts(),
      '',
    ].join('\n'));
    writeFileSync(join(dir, 'resolv.conf'), this.opts.resolvConf(namespace));
    writeFileSync(join(dir, 'hostname'), `${pod.spec.hostNetwork ? this.opts.nodeName : (pod.spec.hostname ?? name)}\n`);
    for (const c of pod.spec.initContainers ?? []) {
      const init = this.container(run, c);
      const code = await this.runOnce(run, init);
      if (code !== 0) throw new Error(`init container ${c.name} exited ${code} (log: ${init.log})`);
    }
    for (const c of pod.spec.containers) {
      const cr = this.container(run, c);
      run.containers.push(cr);
      this.launch(run, cr);
    }
    this.writeStatus(run);
    run.statusTimer = setInterval(() => this.writeStatus(run), 5_000);
  }

  private container(run: PodRun, spec: Container): ContainerRun {
    const id = `${run.uid.slice(0, 8)}-${spec.name}`;
    return {
      spec, id, bundle: join(run.dir, 'bundles', spec.name), proc: null, restartCount: 0, startedAt: null, lastExit: null,
      ready: false, probeSuccesses: 0, probeFailures: 0, probeTimer: null, restartTimer: null,
      log: join(this.opts.logDir, 'pods', `${run.pod.metadata.namespace}_${run.pod.metadata.name}_${spec.name}.log`),
    };
  }

  /** Runs an init container to completion; resolves its exit code. */
  private async runOnce(run: PodRun, c: ContainerRun): Promise<number> {
    await this.bundle(run, c);
    const out = openSync(c.log, 'a');
    const proc = spawn('runc', ['--root', this.runcRoot, 'run', '--bundle', c.bundle, c.id], { stdio: ['ignore', out, out] });
    closeSync(out);
    const code = await new Promise<number>((resolve) => proc.on('exit', (code) => resolve(code ?? 1)));
    await this.cmd('runc', ['--root', this.runcRoot, 'delete', '--force', c.id]).catch(() => {});
    return code;
  }

  private launch(run: PodRun, c: ContainerRun): void {
    if (run.stopping || this.closed) return;
    this.bundle(run, c).then(() => {
      if (run.stopping || this.closed) return;
      const out = openSync(c.log, 'a');
      const proc = spawn('runc', ['--root', this.runcRoot, 'run', '--bundle', c.bundle, c.id], { stdio: ['ignore', out, out] });
      closeSync(out);
      c.proc = proc;
      c.startedAt = new Date().toISOString();
      c.ready = false;
      c.probeSuccesses = 0;
      c.probeFailures = 0;
      this.startProbes(run, c);
      this.writeStatus(run);
      proc.on('exit', (code, signal) => {
        c.proc = null;
        c.ready = false;
        if (c.probeTimer) clearTimeout(c.probeTimer);
        c.lastExit = { exitCode: code ?? 128 + 9, finishedAt: new Date().toISOString(), reason: signal ? `Signal ${signal}` : code === 0 ? 'Completed' : 'Error' };
        void this.cmd('runc', ['--root', this.runcRoot, 'delete', '--force', c.id]).catch(() => {}).then(() => {
          if (run.stopping || this.closed) return;
          this.opts.log(`container ${run.key}/${c.spec.name} exited (${c.lastExit?.reason}, code ${c.lastExit?.exitCode}); restarting (log: ${c.log})`);
          c.restartCount++;
          this.writeStatus(run);
          // CrashLoopBackOff's shape: 1 s, doubling, at most 10 s here (a test does not wait 5 minutes).
          c.restartTimer = setTimeout(() => this.launch(run, c), Math.min(10_000, 1_000 * 2 ** Math.min(c.restartCount - 1, 4)));
        });
      });
    }, (err: Error) => {
      this.opts.log(`container ${run.key}/${c.spec.name} cannot start: ${err.message}`);
      c.restartTimer = setTimeout(() => this.launch(run, c), 2_000);
    });
  }

  // ---- the OCI bundle ---------------------------------------------------------------------------------------------

  private async bundle(run: PodRun, c: ContainerRun): Promise<void> {
    const { pod } = run;
    const spec = c.spec;
    const image = this.opts.image(spec.image);
    if (image === null) throw new Error(`no image ${spec.image} on this node`);
    const sc: SecurityContext = { ...pod.spec.securityContext, ...spec.securityContext };
    const uid = sc.runAsUser ?? image.user?.uid ?? 0;
    const gid = sc.runAsGroup ?? image.user?.gid ?? (sc.runAsUser !== undefined ? 0 : image.user?.gid ?? 0);
    if (sc.runAsNonRoot && uid === 0) throw new Error(`container ${spec.name}: runAsNonRoot, and the image runs as root`);
    const env = await this.environment(run, spec, image);
    const argv = [...(spec.command ?? image.entrypoint), ...(spec.args ?? (spec.command ? [] : image.cmd))].map((a) => expand(a, env));
    if (argv.length === 0) throw new Error(`container ${spec.name}: nothing to run`);
    let caps: string[];
    if (sc.privileged) caps = ALL_CAPS;
    else {
      const drop = (sc.capabilities?.drop ?? []).map(capName);
      caps = drop.includes('ALL') ? [] : DEFAULT_CAPS.filter((x) => !drop.includes(x));
      for (const a of (sc.capabilities?.add ?? []).map(capName)) if (!caps.includes(a)) caps.push(a);
    }
    const capList = caps.map((x) => `CAP_${x}`);
    const rootfs = join(c.bundle, 'rootfs');
    rmSync(c.bundle, { recursive: true, force: true });
    mkdirSync(rootfs, { recursive: true });
    await this.cmd('cp', ['-a', '/etc', join(rootfs, 'etc')]);
    const mounts: object[] = [
      { destination: '/proc', type: 'proc', source: 'proc', options: ['nosuid', 'noexec', 'nodev'] },
      { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'] },
      { destination: '/dev/pts', type: 'devpts', source: 'devpts', options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620', 'gid=5'] },
      { destination: '/dev/shm', type: 'tmpfs', source: 'shm', options: ['nosuid', 'noexec', 'nodev', 'mode=1777', 'size=65536k'] },
      { destination: '/dev/mqueue', type: 'mqueue', source: 'mqueue', options: ['nosuid', 'noexec', 'nodev'] },
      { destination: '/sys', type: sc.privileged ? 'bind' : 'sysfs', source: sc.privileged ? '/sys' : 'sysfs', options: sc.privileged ? ['rbind', 'rw'] : ['nosuid', 'noexec', 'nodev', 'ro'] },
      ...BASE.filter((d) => existsSync(d)).map((d) => ({ destination: d, type: 'bind', source: d, options: ['rbind', 'ro'] })),
      ...image.files.map((f) => ({ destination: f.destination, type: 'bind', source: f.source, options: ['rbind', 'ro'] })),
      { destination: '/etc/hosts', type: 'bind', source: join(run.dir, 'hosts'), options: ['bind', 'rw'] },
      { destination: '/etc/resolv.conf', type: 'bind', source: join(run.dir, 'resolv.conf'), options: ['bind', 'rw'] },
      { destination: '/etc/hostname', type: 'bind', source: join(run.dir, 'hostname'), options: ['bind', 'rw'] },
    ];
    for (const m of spec.volumeMounts ?? []) {
      const source = this.volumeSource(run, m.name);
      const src = m.subPath ? join(source, m.subPath) : source;
      const propagation = m.mountPropagation === 'HostToContainer' ? 'rslave' : m.mountPropagation === 'Bidirectional' ? 'rshared' : 'rprivate';
      mounts.push({ destination: m.mountPath, type: 'bind', source: src, options: ['rbind', m.readOnly ? 'ro' : 'rw', propagation] });
    }
    const namespaces: { type: string; path?: string }[] = [{ type: 'mount' }, { type: 'ipc' }];
    if (!pod.spec.hostNetwork) namespaces.push({ type: 'uts' }, { type: 'network', path: `/run/netns/${run.netns}` });
    if (!pod.spec.hostPID) namespaces.push({ type: 'pid' });
    const config = {
      ociVersion: '1.0.2',
      process: {
        terminal: false,
        user: { uid, gid, additionalGids: pod.spec.securityContext?.fsGroup !== undefined ? [pod.spec.securityContext.fsGroup] : [] },
        args: argv,
        env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
        cwd: spec.workingDir ?? image.workingDir ?? '/',
        capabilities: uid === 0
          ? { bounding: capList, effective: capList, permitted: capList, inheritable: [], ambient: [] }
          : { bounding: capList, effective: [], permitted: [], inheritable: [], ambient: [] },
        noNewPrivileges: sc.allowPrivilegeEscalation === false,
      },
      root: { path: 'rootfs', readonly: Boolean(sc.readOnlyRootFilesystem) },
      hostname: pod.spec.hostNetwork ? undefined : (pod.spec.hostname ?? pod.metadata.name).slice(0, 63),
      mounts,
      linux: {
        namespaces,
        cgroupsPath: `${this.opts.cgroupParent}/kubepods/besteffort/pod${run.uid}/${c.id}`,
        resources: { devices: [{ allow: false, access: 'rwm' }] },
        maskedPaths: sc.privileged ? [] : ['/proc/acpi', '/proc/kcore', '/proc/keys', '/proc/latency_stats', '/proc/timer_list', '/proc/sched_debug', '/sys/firmware', '/proc/scsi'],
        readonlyPaths: sc.privileged ? [] : ['/proc/bus', '/proc/fs', '/proc/irq', '/proc/sys', '/proc/sysrq-trigger'],
      },
    };
    writeFileSync(join(c.bundle, 'config.json'), JSON.stringify(config, null, 1));
  }

  /** The container's environment, as the kubelet builds it: the image's, envFrom, env (with $(VAR) expansion), service links. */
  private async environment(run: PodRun, spec: Container, image: ImageSpec): Promise<Record<string, string>> {
    const { pod } = run;
    const ns = pod.metadata.namespace ?? 'default';
    const env: Record<string, string> = {
      PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
      HOSTNAME: pod.spec.hostNetwork ? this.opts.nodeName : pod.metadata.name,
      HOME: '/root',
      ...image.env,
      KUBERNETES_SERVICE_HOST: this.opts.apiService.host,
      KUBERNETES_SERVICE_PORT: String(this.opts.apiService.port),
      KUBERNETES_SERVICE_PORT_HTTPS: String(this.opts.apiService.port),
      KUBERNETES_PORT: `tcp://${this.opts.apiService.host}:${this.opts.apiService.port}`,
    };
    for (const from of spec.envFrom ?? []) {
      const data = from.configMapRef
        ? await this.configMapData(ns, from.configMapRef.name, from.configMapRef.optional)
        : from.secretRef ? await this.secretData(ns, from.secretRef.name, from.secretRef.optional) : {};
      for (const [k, v] of Object.entries(data)) env[`${from.prefix ?? ''}${k}`] = v.toString('utf8');
    }
    for (const v of spec.env ?? []) {
      if (v.value !== undefined) env[v.name] = expand(v.value, env);
      else if (v.valueFrom?.fieldRef) env[v.name] = this.field(run, v.valueFrom.fieldRef.fieldPath);
      else if (v.valueFrom?.resourceFieldRef) env[v.name] = this.resourceField(spec, v.valueFrom.resourceFieldRef);
      else if (v.valueFrom?.configMapKeyRef) {
        const r = v.valueFrom.configMapKeyRef;
        const data = await this.configMapData(ns, r.name, r.optional);
        if (data[r.key] !== undefined) env[v.name] = data[r.key]!.toString('utf8');
        else if (!r.optional) throw new Error(`env ${v.name}: no key ${r.key} in ConfigMap ${r.name}`);
      } else if (v.valueFrom?.secretKeyRef) {
        const r = v.valueFrom.secretKeyRef;
        const data = await this.secretData(ns, r.name, r.optional);
        if (data[r.key] !== undefined) env[v.name] = data[r.key]!.toString('utf8');
        else if (!r.optional) throw new Error(`env ${v.name}: no key ${r.key} in Secret ${r.name}`);
      } else env[v.name] = '';
    }
    return env;
  }

  private field(run: PodRun, path: string): string {
    const { pod } = run;
    switch (path) {
      case 'metadata.name': return pod.metadata.name;
      case 'metadata.namespace': return pod.metadata.namespace ?? 'default';
      case 'metadata.uid': return pod.metadata.uid ?? '';
      case 'spec.nodeName': return this.opts.nodeName;
      case 'spec.serviceAccountName': return pod.spec.serviceAccountName ?? 'default';
      case 'status.podIP': return run.ip;
      case 'status.podIPs': return run.ip;
      case 'status.hostIP': return this.opts.nodeIp;
      case 'status.hostIPs': return this.opts.nodeIp;
    }
    if (path === 'metadata.labels' || path === 'metadata.annotations') {
      // The whole map, as the kubelet writes it into a downwardAPI file: key="value" lines, sorted, values quoted.
      const map = (path === 'metadata.labels' ? pod.metadata.labels : pod.metadata.annotations) ?? {};
      return Object.keys(map).sort().map((k) => `${k}=${JSON.stringify(map[k])}`).join('\n');
    }
    const m = /^metadata\.(labels|annotations)\['(.+)'\]$/.exec(path);
    if (m) return (m[1] === 'labels' ? pod.metadata.labels : pod.metadata.annotations)?.[m[2]!] ?? '';
    throw new Error(`fieldRef ${path} is not one this runtime knows`);
  }

  /** A resourceFieldRef's value: the container's limit (the node's allocatable when none) or request, over the divisor. */
  private resourceField(spec: Container, ref: { resource: string; divisor?: string }): string {
    const [kind, resource] = ref.resource.split('.') as ['limits' | 'requests', string];
    const set = spec.resources?.[kind]?.[resource];
    const fallback = kind === 'limits' ? (this.opts.capacity as Record<string, string>)[resource] : '0';
    const value = quantity(set ?? fallback ?? '0');
    // The API server defaults an unset divisor to "0", which the kubelet reads as 1.
    const divisor = quantity(ref.divisor ?? '1') || 1;
    return String(Math.ceil(value / divisor));
  }

  private async configMapData(ns: string, name: string, optional?: boolean): Promise<Record<string, Buffer>> {
    const cm = await this.opts.kubelet.getOrNull<KubeObject & { data?: Record<string, string>; binaryData?: Record<string, string> }>(apiPath('configmaps', { namespace: ns, name }));
    if (cm === null) {
      if (optional) return {};
      throw new Error(`ConfigMap ${ns}/${name} not found`);
    }
    const out: Record<string, Buffer> = {};
    for (const [k, v] of Object.entries(cm.data ?? {})) out[k] = Buffer.from(v, 'utf8');
    for (const [k, v] of Object.entries(cm.binaryData ?? {})) out[k] = Buffer.from(v, 'base64');
    return out;
  }

  private async secretData(ns: string, name: string, optional?: boolean): Promise<Record<string, Buffer>> {
    const s = await this.opts.kubelet.getOrNull<KubeObject & { data?: Record<string, string> }>(apiPath('secrets', { namespace: ns, name }));
    if (s === null) {
      if (optional) return {};
      throw new Error(`Secret ${ns}/${name} not found`);
    }
    return Object.fromEntries(Object.entries(s.data ?? {}).map(([k, v]) => [k, Buffer.from(v, 'base64')]));
  }

  // ---- volumes ----------------------------------------------------------------------------------------------------

  private volumeSource(run: PodRun, name: string): string {
    const v = (run.pod.spec.volumes ?? []).find((x) => x.name === name);
    if (!v) throw new Error(`volume ${name} is mounted but not declared`);
    if (v.hostPath) return v.hostPath.path;
    return join(run.dir, 'volumes', name);
  }

  private async prepareVolumes(run: PodRun): Promise<void> {
    const ns = run.pod.metadata.namespace ?? 'default';
    for (const v of run.pod.spec.volumes ?? []) {
      const dir = join(run.dir, 'volumes', v.name);
      if (v.hostPath) {
        const t = v.hostPath.type ?? '';
        if (!existsSync(v.hostPath.path)) {
          if (t === 'DirectoryOrCreate') mkdirSync(v.hostPath.path, { recursive: true, mode: 0o755 });
          else if (t !== '') throw new Error(`hostPath ${v.hostPath.path} (${t}) does not exist`);
        }
        continue;
      }
      mkdirSync(dir, { recursive: true });
      // An emptyDir is world-writable, as the kubelet makes it (the process's umask does not apply).
      chmodSync(dir, 0o777);
      if (v.emptyDir) continue;
      const write = (path: string, data: Buffer, mode = 0o644) => {
        const file = join(dir, path);
        mkdirSync(join(file, '..'), { recursive: true });
        writeFileSync(file, data, { mode });
      };
      const keys = (data: Record<string, Buffer>, items: KeyToPath[] | undefined, mode: number) => {
        if (items) for (const i of items) {
          if (data[i.key] === undefined) throw new Error(`volume ${v.name}: no key ${i.key}`);
          write(i.path, data[i.key]!, i.mode ?? mode);
        }
        else for (const [k, d] of Object.entries(data)) write(k, d, mode);
      };
      const downward = (items: { path: string; fieldRef?: { fieldPath: string } }[]) => {
        for (const i of items) if (i.fieldRef) write(i.path, Buffer.from(this.field(run, i.fieldRef.fieldPath)));
      };
      if (v.configMap) keys(await this.configMapData(ns, v.configMap.name, v.configMap.optional), v.configMap.items, v.configMap.defaultMode ?? 0o644);
      else if (v.secret) keys(await this.secretData(ns, v.secret.secretName, v.secret.optional), v.secret.items, v.secret.defaultMode ?? 0o644);
      else if (v.downwardAPI) downward(v.downwardAPI.items);
      else if (v.projected) {
        const mode = v.projected.defaultMode ?? 0o644;
        for (const s of v.projected.sources) {
          if (s.configMap) keys(await this.configMapData(ns, s.configMap.name, s.configMap.optional), s.configMap.items, mode);
          else if (s.secret) keys(await this.secretData(ns, s.secret.name, s.secret.optional), s.secret.items, mode);
          else if (s.downwardAPI) downward(s.downwardAPI.items);
          else if (s.serviceAccountToken) await this.token(run, s.serviceAccountToken, (t) => write(s.serviceAccountToken!.path, Buffer.from(t), mode));
        }
      } else throw new Error(`volume ${v.name}: a kind this runtime does not know (${Object.keys(v).join(', ')})`);
    }
    // fsGroup: the pod's volumes belong to that group, readable (and, for emptyDirs, writable) by it.
    const fsGroup = run.pod.spec.securityContext?.fsGroup;
    if (fsGroup !== undefined && existsSync(join(run.dir, 'volumes'))) {
      await this.cmd('chown', ['-R', `:${fsGroup}`, join(run.dir, 'volumes')]);
      await this.cmd('chmod', ['-R', 'g+rwX', join(run.dir, 'volumes')]);
    }
  }

  /** A token from the TokenRequest API bound to the pod, written now and again at 80 % of its life. */
  private async token(run: PodRun, src: { audience?: string; expirationSeconds?: number }, write: (token: string) => void): Promise<void> {
    const { pod } = run;
    const request = async () => {
      const tr = await this.opts.kubelet.create<KubeObject & { status: { token: string; expirationTimestamp: string } }>(
        apiPath('serviceaccounts', { namespace: pod.metadata.namespace, name: pod.spec.serviceAccountName ?? 'default', sub: 'token' }),
        {
          apiVersion: 'authentication.k8s.io/v1',
          kind: 'TokenRequest',
          spec: {
            audiences: src.audience ? [src.audience] : [],
            expirationSeconds: src.expirationSeconds ?? 3607,
            boundObjectRef: { apiVersion: 'v1', kind: 'Pod', name: pod.metadata.name, uid: pod.metadata.uid },
          },
        },
      );
      write(tr.status.token);
      const life = Date.parse(tr.status.expirationTimestamp) - Date.now();
      const t = setTimeout(() => void request().catch((err: Error) => this.opts.log(`token refresh for ${run.key}: ${err.message}`)), Math.max(1_000, life * 0.8));
      run.tokenTimers.push(t);
    };
    await request();
  }

  // ---- CNI --------------------------------------------------------------------------------------------------------

  private cniEnv(run: PodRun): NodeJS.ProcessEnv {
    const { pod } = run;
    return {
      ...process.env,
      CNI_PATH: this.opts.cni.binDir,
      NETCONFPATH: this.opts.cni.confDir,
      CNI_IFNAME: 'eth0',
      CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=${pod.metadata.namespace};K8S_POD_NAME=${pod.metadata.name};K8S_POD_INFRA_CONTAINER_ID=${run.uid};K8S_POD_UID=${run.uid}`,
    };
  }

  /**
   * CNI ADD through the node's configuration (the chain, istio-cni's plugin included once installed); the pod's IP. The
   * namespace is named by its /var/run/netns path, as containerd names it: istio-cni's agent opens it under the
   * /host/var/run/netns its chart mounts.
   */
  private async cniAdd(run: PodRun): Promise<string> {
    const { cnitool, network } = this.opts.cni;
    let stdout: string;
    try {
      ({ stdout } = await runWithEnv(cnitool, ['add', network, `/var/run/netns/${run.netns}`], this.cniEnv(run)));
    } catch (err) {
      throw new Error(`CNI ADD for ${run.key} failed: ${(err as Error).message}`);
    }
    const result = JSON.parse(stdout) as { ips?: { address: string }[] };
    const ip = result.ips?.[0]?.address.split('/')[0];
    if (!ip) throw new Error(`CNI ADD for ${run.key} gave no address: ${stdout}`);
    return ip;
  }

  private async cniDel(run: PodRun): Promise<void> {
    const { cnitool, network } = this.opts.cni;
    await runWithEnv(cnitool, ['del', network, `/var/run/netns/${run.netns}`], this.cniEnv(run)).catch((err: Error) => this.opts.log(`CNI DEL for ${run.key}: ${err.message}`));
  }

  // ---- probes and status --------------------------------------------------------------------------------------------

  private startProbes(run: PodRun, c: ContainerRun): void {
    const probe = c.spec.readinessProbe;
    if (!probe) {
      c.ready = true;
      return;
    }
    const period = (probe.periodSeconds ?? 10) * 1000;
    const tick = async () => {
      if (!c.proc || run.stopping) return;
      const ok = await this.probeOnce(run, c, probe);
      const was = c.ready;
      if (ok) {
        c.probeFailures = 0;
        if (++c.probeSuccesses >= (probe.successThreshold ?? 1)) c.ready = true;
      } else {
        c.probeSuccesses = 0;
        if (++c.probeFailures >= (probe.failureThreshold ?? 3)) c.ready = false;
      }
      if (was !== c.ready) this.writeStatus(run);
      // Until the first success, probe every second: a test should not wait a whole period for a pod that is up.
      c.probeTimer = setTimeout(() => void tick(), c.ready || c.probeFailures > 30 ? period : Math.min(period, 1_000));
    };
    c.probeTimer = setTimeout(() => void tick(), (probe.initialDelaySeconds ?? 0) * 1000);
  }

  private probeOnce(run: PodRun, c: ContainerRun, probe: Probe): Promise<boolean> {
    const port = (p: number | string) => typeof p === 'number' ? p : Number(c.spec.ports?.find((x) => x.name === p)?.containerPort ?? p);
    const timeout = (probe.timeoutSeconds ?? 1) * 1000;
    return new Promise((resolve) => {
      if (probe.httpGet) {
        const req = request({ host: run.ip, port: port(probe.httpGet.port), path: probe.httpGet.path ?? '/', timeout, headers: { 'user-agent': 'kube-probe/1.36' } }, (res) => {
          res.resume();
          resolve((res.statusCode ?? 0) >= 200 && (res.statusCode ?? 0) < 400);
        });
        req.on('timeout', () => req.destroy());
        req.on('error', () => resolve(false));
        req.end();
      } else if (probe.tcpSocket) {
        const s = connect(port(probe.tcpSocket.port), run.ip);
        s.setTimeout(timeout, () => s.destroy());
        s.on('connect', () => { s.destroy(); resolve(true); });
        s.on('error', () => resolve(false));
        s.on('close', () => resolve(false));
      } else resolve(true);
    });
  }

  private writeStatus(run: PodRun): void {
    if (run.stopping && run.containers.every((c) => !c.proc)) return;
    const all = run.containers.length > 0 && run.containers.every((c) => c.ready && c.proc);
    const now = new Date().toISOString();
    const status = {
      phase: 'Running',
      hostIP: this.opts.nodeIp,
      hostIPs: [{ ip: this.opts.nodeIp }],
      podIP: run.ip,
      podIPs: [{ ip: run.ip }],
      startTime: run.startTime,
      conditions: [
        { type: 'PodReadyToStartContainers', status: 'True', lastTransitionTime: run.startTime },
        { type: 'Initialized', status: 'True', lastTransitionTime: run.startTime },
        { type: 'ContainersReady', status: all ? 'True' : 'False', lastTransitionTime: now },
        { type: 'Ready', status: all ? 'True' : 'False', lastTransitionTime: now },
        { type: 'PodScheduled', status: 'True', lastTransitionTime: run.startTime },
      ],
      containerStatuses: run.containers.map((c) => ({
        name: c.spec.name,
        image: c.spec.image,
        imageID: '',
        containerID: `runc://${c.id}`,
        ready: c.ready && c.proc !== null,
        started: c.proc !== null,
        restartCount: c.restartCount,
        state: c.proc ? { running: { startedAt: c.startedAt } } : { waiting: { reason: c.lastExit ? 'CrashLoopBackOff' : 'ContainerCreating' } },
        lastState: c.lastExit ? { terminated: { exitCode: c.lastExit.exitCode, reason: c.lastExit.reason, finishedAt: c.lastExit.finishedAt } } : {},
      })),
    };
    const key = JSON.stringify({ ...status, conditions: status.conditions.map((x) => [x.type, x.status]) });
    if ((run as PodRun & { lastStatus?: string }).lastStatus === key) return;
    (run as PodRun & { lastStatus?: string }).lastStatus = key;
    run.statusWrite = run.statusWrite.then(() => this.patchStatus(run.pod, status)).catch((err: Error) => {
      if (!(err instanceof KubeError && err.status === 404)) this.opts.log(`status of ${run.key}: ${err.message}`);
    });
  }

  private async patchStatus(pod: Pod, status: Record<string, unknown>): Promise<void> {
    await this.opts.kubelet.patch(apiPath('pods', { namespace: pod.metadata.namespace, name: pod.metadata.name, sub: 'status' }), { status });
  }

  // ---- termination ------------------------------------------------------------------------------------------------

  /** Graceful: SIGTERM, the grace period, SIGKILL; then CNI DEL and the final delete. */
  private terminate(run: PodRun): Promise<void> {
    const grace = run.pod.metadata.deletionGracePeriodSeconds ?? run.pod.spec.terminationGracePeriodSeconds ?? 30;
    return this.teardown(run, grace).then(() => this.finalize(run.pod));
  }

  private teardown(run: PodRun, graceSeconds: number): Promise<void> {
    if (run.stopping) return run.stopping;
    run.stopping = (async () => {
      if (run.statusTimer) clearInterval(run.statusTimer);
      for (const t of run.tokenTimers) clearTimeout(t);
      for (const c of run.containers) {
        if (c.probeTimer) clearTimeout(c.probeTimer);
        if (c.restartTimer) clearTimeout(c.restartTimer);
      }
      const live = run.containers.filter((c) => c.proc);
      this.opts.log(`pod ${run.key} stopping (grace ${graceSeconds} s)`);
      await Promise.all(live.map(async (c) => {
        const exited = new Promise<void>((r) => c.proc?.once('exit', () => r()) ?? r());
        if (graceSeconds > 0) {
          await this.cmd('runc', ['--root', this.runcRoot, 'kill', c.id, 'TERM']).catch(() => {});
          const t = setTimeout(() => void this.cmd('runc', ['--root', this.runcRoot, 'kill', '--all', c.id, 'KILL']).catch(() => {}), graceSeconds * 1000);
          await exited;
          clearTimeout(t);
        } else {
          await this.cmd('runc', ['--root', this.runcRoot, 'kill', '--all', c.id, 'KILL']).catch(() => {});
          await exited;
        }
        await this.cmd('runc', ['--root', this.runcRoot, 'delete', '--force', c.id]).catch(() => {});
      }));
      if (run.netns) {
        await this.cniDel(run);
        await this.cmd('ip', ['netns', 'delete', run.netns]).catch(() => {});
      }
      this.pods.delete(run.uid);
      this.opts.log(`pod ${run.key} stopped`);
    })();
    return run.stopping;
  }

  private async finalize(pod: Pod): Promise<void> {
    await this.opts.kubelet.delete(apiPath('pods', { namespace: pod.metadata.namespace, name: pod.metadata.name }), {
      gracePeriodSeconds: 0,
      preconditions: { uid: pod.metadata.uid },
    }).catch((err: Error) => {
      if (!(err instanceof KubeError && (err.status === 404 || err.status === 409))) throw err;
    });
  }

  private async cmd(file: string, args: string[]): Promise<void> {
    await execFileP(file, args, { timeout: 60_000 });
  }
}

/** `execFile` with an environment, naming the command and its stderr in the failure. */
async function runWithEnv(file: string, args: string[], env: NodeJS.ProcessEnv): Promise<{ stdout: string }> {
  try {
    const { stdout } = await execFileP(file, args, { env, timeout: 120_000, maxBuffer: 4 * 1024 * 1024 });
    return { stdout };
  } catch (err) {
    const e = err as Error & { stderr?: string; stdout?: string };
    throw new Error(`${file} ${args.join(' ')}: ${(e.stderr || e.stdout || e.message).trim()}`);
  }
}

/** `$(VAR)` expansion as the kubelet does it in command, args and env values; `$$` escapes. */
function expand(s: string, env: Record<string, string>): string {
  return s.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, name: string | undefined) => name === undefined ? '$' : env[name] ?? m);
}

/** A Kubernetes capability name (NET_ADMIN or CAP_NET_ADMIN) without its prefix. */
const capName = (c: string): string => c.toUpperCase().replace(/^CAP_/, '');

/** A resource quantity ("200m", "2", "512Mi", "1G") as a number. */
export function quantity(q: string): number {
  const m = /^([0-9.]+)([a-zA-Z]*)$/.exec(q.trim());
  if (!m) throw new Error(`not a quantity: ${q}`);
  const n = Number(m[1]);
  const suffix: Record<string, number> = { '': 1, m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, Ti: 1024 ** 4 };
  const f = suffix[m[2]!];
  if (f === undefined) throw new Error(`not a quantity: ${q}`);
  return n * f;
}
