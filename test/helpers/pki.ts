// Certificates made with the openssl CLI, independently of ztunnel-node's own Rust code: foreign CAs, other
// trust domains, several SANs, and leaf certificates signed by the built-in CA's root straight from LOCAL_CA_DIR.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

function openssl(args: string[], cwd: string): Buffer {
  return execFileSync('openssl', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
}

export function tempDir(prefix = 'ztn-test-'): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

/** A CA on disk: its certificate and key files, and the certificate's PEM. */
export interface Ca {
  certPath: string;
  keyPath: string;
  certPem: string;
}

/** A leaf certificate made by `makeLeaf`. */
export interface Leaf {
  certPem: string;
  keyPem: string;
  /** The leaf then its CA's certificate. */
  chainPem: string;
  /** Its serial number (for `makeCrl`). */
  serial: bigint;
}

/** A self-signed P-256 CA: { certPath, keyPath, certPem }. */
export function makeCa(dir: string, name = 'test-ca'): Ca {
  const keyPath = join(dir, `${name}.key`);
  const certPath = join(dir, `${name}.crt`);
  openssl([
    'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
    '-keyout', keyPath, '-out', certPath, '-days', '2', '-subj', `/O=${name}`,
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign',
  ], dir);
  return { certPath, keyPath, certPem: readFileSync(certPath, 'utf8') };
}

/** The built-in CA of a LOCAL_CA_DIR, used by openssl directly. */
export function builtinCa(caDir: string): Ca {
  const certPath = join(caDir, 'root-cert.pem');
  return { certPath, keyPath: join(caDir, 'root-key.pem'), certPem: readFileSync(certPath, 'utf8') };
}

let serial = 1000;

/** A P-256 leaf with the given URI SANs signed by `ca`: { certPem, keyPem, chainPem }. */
export function makeLeaf(dir: string, ca: Ca, uris: readonly string[], name = `leaf${serial}`): Leaf {
  const keyPath = join(dir, `${name}.key`);
  const csrPath = join(dir, `${name}.csr`);
  const certPath = join(dir, `${name}.crt`);
  const extPath = join(dir, `${name}.ext`);
  openssl(['req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
    '-keyout', keyPath, '-out', csrPath, '-subj', '/O=test'], dir);
  const san = uris.map((u) => `URI:${u}`).join(',');
  writeFileSync(extPath, [
    san ? `subjectAltName=${san}` : '',
    'keyUsage=critical,digitalSignature,keyEncipherment',
    'extendedKeyUsage=serverAuth,clientAuth',
    'basicConstraints=critical,CA:FALSE',
  ].filter(Boolean).join('\n') + '\n');
  openssl(['x509', '-req', '-in', csrPath, '-CA', ca.certPath, '-CAkey', ca.keyPath, '-set_serial', String(serial++),
    '-days', '1', '-extfile', extPath, '-out', certPath], dir);
  const certPem = readFileSync(certPath, 'utf8');
  return { certPem, keyPem: readFileSync(keyPath, 'utf8'), chainPem: certPem + ca.certPem, serial: BigInt(serial - 1) };
}

/**
 * A CRL (PEM) signed by `ca` revoking the certificates of `serials` (BigInts), made by `openssl ca -gencrl` from an
 * index of its own: a list as Istio's CA publishes one, by a program other than ours.
 */
export function makeCrl(dir: string, ca: Ca, serials: readonly bigint[]): string {
  const d = mkdtempSync(join(dir, 'crl-'));
  const hex = (n: bigint) => {
    const h = n.toString(16).toUpperCase();
    return h.length % 2 === 0 ? h : `0${h}`;
  };
  writeFileSync(join(d, 'index.txt'), serials.map((n) => `R\t491231235959Z\t240101000000Z\t${hex(n)}\tunknown\t/O=test\n`).join(''));
  writeFileSync(join(d, 'crlnumber'), '01\n');
  writeFileSync(join(d, 'ca.cnf'), [
    '[ca]', 'default_ca = ca_default', '[ca_default]', 'database = index.txt', 'crlnumber = crlnumber',
    'default_md = sha256', 'default_crl_days = 30', '',
  ].join('\n'));
  const out = join(d, 'crl.pem');
  openssl(['ca', '-gencrl', '-config', 'ca.cnf', '-keyfile', ca.keyPath, '-cert', ca.certPath, '-out', out], d);
  return readFileSync(out, 'utf8');
}

export const spiffe = (ns: string, sa: string, td = 'cluster.local'): string => `spiffe://${td}/ns/${ns}/sa/${sa}`;

/** A leaf signed by the built-in CA of `caDir` (root-cert.pem + root-key.pem, as the daemons created them). */
export function builtinLeaf(dir: string, caDir: string, uris: readonly string[], name?: string): Leaf {
  return makeLeaf(dir, builtinCa(caDir), uris, name);
}

/**
 * A leaf certificate for `spiffe://cluster.local/ns/default/sa/sleep` and its root, as PEM (made in a temporary
 * directory, removed): for suites that hand certificates to the daemon's code in process. null where the openssl CLI
 * is missing (the suite skips, saying so).
 */
export function sleepLeafAndRoot(): { leaf: string; root: string } | null {
  try {
    const dir = tempDir('ztn-pki-');
    const ca = makeCa(dir, 'root');
    const leaf = makeLeaf(dir, ca, [spiffe('default', 'sleep')]);
    rmSync(dir, { recursive: true, force: true });
    return { leaf: leaf.certPem, root: ca.certPem };
  } catch {
    return null;
  }
}
