// The control plane's own PKI, made with the openssl CLI as kubeadm would make it: one CA for the API server's serving
// certificate and every client certificate (the admin, the controller manager, kube-proxy, the node's kubelet, the
// scheduler's stand-in), and the key pair the API server signs and verifies ServiceAccount tokens with. Istio's CA is
// not here: istiod makes its own (the self-signed `istio-ca-secret`), as in any cluster without a plugged-in CA.
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { makeCa, type Ca } from '../../helpers/pki.js';

function openssl(args: string[], cwd: string): void {
  execFileSync('openssl', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
}

/** A certificate and key on disk. */
export interface KeyPair {
  cert: string;
  key: string;
}

export interface IssueOptions {
  /** Subject CN: the user name the API server reads from a client certificate. */
  cn: string;
  /** Subject O: the groups. */
  groups?: readonly string[];
  dns?: readonly string[];
  ips?: readonly string[];
  /** serverAuth (a serving certificate) or clientAuth. */
  usage: 'server' | 'client';
}

/** A P-256 certificate signed by `ca`, valid for the run (2 days), written as `<name>.crt` and `<name>.key` in `dir`. */
export function issue(dir: string, ca: Ca, name: string, { cn, groups = [], dns = [], ips = [], usage }: IssueOptions): KeyPair {
  const key = join(dir, `${name}.key`);
  const csr = join(dir, `${name}.csr`);
  const cert = join(dir, `${name}.crt`);
  const ext = join(dir, `${name}.ext`);
  const subject = [...groups.map((g) => `/O=${g}`), `/CN=${cn}`].join('');
  openssl(['req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', key, '-out', csr, '-subj', subject], dir);
  const san = [...dns.map((d) => `DNS:${d}`), ...ips.map((i) => `IP:${i}`)].join(',');
  writeFileSync(ext, [
    san ? `subjectAltName=${san}` : '',
    'keyUsage=critical,digitalSignature,keyEncipherment',
    `extendedKeyUsage=${usage === 'server' ? 'serverAuth' : 'clientAuth'}`,
    'basicConstraints=critical,CA:FALSE',
  ].filter(Boolean).join('\n') + '\n');
  openssl(['x509', '-req', '-in', csr, '-CA', ca.certPath, '-CAkey', ca.keyPath, '-CAcreateserial', '-days', '2', '-extfile', ext, '-out', cert], dir);
  return { cert, key };
}

/** Everything the control plane's processes are started with. */
export interface ControlPlanePki {
  ca: Ca;
  apiserver: KeyPair;
  admin: KeyPair;
  controllerManager: KeyPair;
  scheduler: KeyPair;
  kubeProxy: KeyPair;
  /** The node's kubelet: system:node:<node> in system:nodes, as the Node authorizer and NodeRestriction expect. */
  kubelet: KeyPair;
  /** The ServiceAccount token signing key (private, for the controller manager and the API server's issuer)... */
  saKey: string;
  /** ...and its public half (the API server verifies tokens with it). */
  saPub: string;
}

/** The PKI of a cluster whose API server answers on `apiIps` (its address and the `kubernetes` Service's ClusterIP). */
export function makeControlPlanePki(dir: string, { node, apiIps }: { node: string; apiIps: readonly string[] }): ControlPlanePki {
  const ca = makeCa(dir, 'kubernetes-ca');
  const saKey = join(dir, 'sa.key');
  const saPub = join(dir, 'sa.pub');
  openssl(['genpkey', '-algorithm', 'RSA', '-pkeyopt', 'rsa_keygen_bits:2048', '-out', saKey], dir);
  openssl(['pkey', '-in', saKey, '-pubout', '-out', saPub], dir);
  const client = (name: string, cn: string, groups: string[] = []) => issue(dir, ca, name, { cn, groups, usage: 'client' });
  return {
    ca,
    apiserver: issue(dir, ca, 'apiserver', {
      cn: 'kube-apiserver',
      dns: ['kubernetes', 'kubernetes.default', 'kubernetes.default.svc', 'kubernetes.default.svc.cluster.local', 'localhost'],
      ips: ['127.0.0.1', ...apiIps],
      usage: 'server',
    }),
    admin: client('admin', 'kubernetes-admin', ['system:masters']),
    controllerManager: client('controller-manager', 'system:kube-controller-manager'),
    scheduler: client('scheduler', 'system:kube-scheduler'),
    kubeProxy: client('kube-proxy', 'system:kube-proxy'),
    kubelet: client('kubelet', `system:node:${node}`, ['system:nodes']),
    saKey,
    saPub,
  };
}

/** A kubeconfig for `user` against `server`, with its files inlined (as `kubectl config --embed-certs` writes). */
export function kubeconfig(path: string, server: string, ca: Ca, user: KeyPair, name = 'e2e'): string {
  const b64 = (f: string) => readFileSync(f).toString('base64');
  writeFileSync(path, JSON.stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name, cluster: { server, 'certificate-authority-data': Buffer.from(ca.certPem).toString('base64') } }],
    users: [{ name, user: { 'client-certificate-data': b64(user.cert), 'client-key-data': b64(user.key) } }],
    contexts: [{ name, context: { cluster: name, user: name } }],
    'current-context': name,
  }, null, 2));
  return path;
}
