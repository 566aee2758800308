// The TLS channel to istiod (ts/xds/grpc.ts), through the code path the XDS and CA clients use (channelCredentials
// + serverNameOptions on a real grpc-js Client) against a real TLS HTTP/2 server on 127.0.0.1 that records the SNI
// each connection sent: an IP literal is never sent as SNI (RFC 6066; Node warns DEP0123), and verification is as
// strict as ever (the roots, then the URL's host or the alternate name).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createSecureServer } from 'node:http2';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import * as grpc from '@grpc/grpc-js';
import { channelCredentials, grpcTarget, serverNameOptions } from '../../dist/xds/grpc.js';
import { makeCa, tempDir } from '../helpers/pki.js';
import { ISTIOD_HOSTNAME, makeServerPki } from '../helpers/fake-istiod.js';
import type { Ca } from '../helpers/pki.js';
import type { ControlPlaneTarget } from '../../dist/xds/grpc.js';

const warnings: (Error & { code?: string })[] = [];
process.on('warning', (w) => warnings.push(w));
const dep0123 = () => warnings.filter((w) => w.code === 'DEP0123').map((w) => w.message);

const dir = tempDir('ztn-cp-tls-');
test.after(() => rmSync(dir, { recursive: true, force: true }));
// Server certificate for istiod.istio-system.svc and 127.0.0.1 (the fake istiod's).
const pki = makeServerPki(join(dir, 'istiod'));
const rootCa = pki.rootCaPath;

/** A server certificate under `ca` with exactly the given subjectAltName (openssl, independent of our code). */
function serverCert(ca: Ca, name: string, san: string) {
  execFileSync('openssl', ['req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
    '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', '/O=istiod'], { cwd: dir, stdio: 'ignore' });
  writeFileSync(join(dir, `${name}.ext`), `subjectAltName=${san}\nextendedKeyUsage=serverAuth\n`);
  execFileSync('openssl', ['x509', '-req', '-in', `${name}.csr`, '-CA', ca.certPath, '-CAkey', ca.keyPath,
    '-set_serial', '9', '-days', '1', '-extfile', `${name}.ext`, '-out', `${name}.pem`], { cwd: dir, stdio: 'ignore' });
  return { cert: readFileSync(join(dir, `${name}.pem`)), key: readFileSync(join(dir, `${name}.key`)) };
}

/**
 * A TLS HTTP/2 server on 127.0.0.1:0. `sni`: every server name a ClientHello carried (the SNI callback runs only
 * when one is sent); `seen`: each completed handshake's `servername` (false: none).
 */
async function sniServer({ cert, key }: { cert: Buffer; key: Buffer }) {
  const seen: (string | false | null)[] = [];
  const sni: string[] = [];
  const server = createSecureServer({
    cert,
    key,
    SNICallback: (name, cb) => {
      sni.push(name);
      cb(null, undefined); // the server's own certificate, whatever the name
    },
  });
  server.on('secureConnection', (socket) => seen.push(socket.servername));
  // A client that refuses the certificate resets the handshake; that is expected here.
  server.on('tlsClientError', () => {});
  server.on('stream', (stream) => stream.respond({ ':status': 200, 'content-type': 'application/grpc', 'grpc-status': '12' }, { endStream: true }));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { seen, sni, port: (server.address() as AddressInfo).port, close: () => new Promise((resolve) => server.close(resolve)) };
}

/** Connects the way the XDS/CA clients do; resolves with null once READY, or the error at the deadline. */
function connect(target: ControlPlaneTarget, timeoutMs = 3_000): Promise<Error | null> {
  const client = new grpc.Client(grpcTarget(target.address).target, channelCredentials(target), serverNameOptions(target));
  return new Promise((resolve) => {
    client.waitForReady(Date.now() + timeoutMs, (err) => {
      client.close();
      resolve(err ?? null);
    });
  });
}

const ipTarget = (port: number, altHostname: string | null = null, root = rootCa): ControlPlaneTarget => ({ address: `https://127.0.0.1:${port}`, rootCa: root, altHostname });

test('an IP target with no alternate name sends no SNI (and no DEP0123), and verifies the IP SAN', async () => {
  const server = await sniServer(pki);
  try {
    assert.equal(await connect(ipTarget(server.port)), null);
    assert.ok(server.seen.length >= 1);
    assert.deepEqual(server.sni, []);
    assert.deepEqual([...new Set(server.seen)], [false], `SNI sent: ${server.seen}`);
  } finally {
    await server.close();
  }
  await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
  assert.deepEqual(dep0123(), []);
});

test('an IP target with an alternate name sends the alternate name as SNI', async () => {
  // The certificate names only istiod.istio-system.svc: the connection verifies through the alternate name.
  const ca = makeCa(dir, 'alt-root');
  const server = await sniServer(serverCert(ca, 'dns-only', `DNS:${ISTIOD_HOSTNAME}`));
  try {
    assert.equal(await connect(ipTarget(server.port, ISTIOD_HOSTNAME, ca.certPath)), null);
    assert.deepEqual([...new Set(server.sni)], [ISTIOD_HOSTNAME]);
    assert.deepEqual([...new Set(server.seen)], [ISTIOD_HOSTNAME]);
  } finally {
    await server.close();
  }
});

test('a DNS name is still sent as SNI', async () => {
  const server = await sniServer(pki);
  try {
    // localhost resolves to 127.0.0.1 (and maybe ::1, refused); the certificate does not name localhost, so the
    // connection fails verification, after the ClientHello carried the name.
    const err = await connect({ address: `https://localhost:${server.port}`, rootCa, altHostname: null }, 1_500);
    assert.ok(err, 'a certificate without localhost must not verify');
    assert.ok(server.sni.length >= 1, 'no ClientHello reached the server');
    assert.deepEqual([...new Set(server.sni)], ['localhost']);
  } finally {
    await server.close();
  }
});

test('verification is unchanged: the IP or the alternate name must be in the certificate, under the given roots', async () => {
  const ca = makeCa(dir, 'strict-root');
  const other = serverCert(ca, 'other-name', 'DNS:other.example');
  const server = await sniServer(other);
  try {
    // Neither 127.0.0.1 nor the alternate name is in the certificate.
    assert.ok(await connect(ipTarget(server.port, null, ca.certPath), 1_500), 'IP not in the certificate');
    assert.ok(await connect(ipTarget(server.port, ISTIOD_HOSTNAME, ca.certPath), 1_500), 'alternate name not in the certificate');
    // ...and it is the certificate that was refused, not the connection: the alternate name it carries verifies.
    assert.equal(await connect(ipTarget(server.port, 'other.example', ca.certPath)), null);
  } finally {
    await server.close();
  }
  const good = await sniServer(pki);
  try {
    // The right names under the wrong roots.
    assert.ok(await connect(ipTarget(good.port, null, ca.certPath), 1_500), 'a certificate from other roots');
    assert.equal(await connect(ipTarget(good.port, null, rootCa)), null);
  } finally {
    await good.close();
  }
});

test('no connection in this file made Node warn about an IP as TLS server name (DEP0123, once per process)', async () => {
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(dep0123(), []);
});
