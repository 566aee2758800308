// Revocation of live connections (CRL_PATH), as ztunnel's src/tls/revocation.rs: when the list changes, the HBONE
// connections whose peer certificate it revokes are closed, inbound and outbound, their streams recorded with the
// response flag CERT_REVOKED and counted in istio_crl_policy_rejections_total (by reporter); other connections carry
// on, and a new handshake with the revoked certificate is refused (counted too). The lists are made by openssl from
// the built-in CA's root, as a mesh CA would publish them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import type { IdentityDump } from '../../dist/ca/manager.js';
import { socks5Connect } from '../../dist/cli/socks5-client.js';
import { makeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import { connectRequest, hboneSession } from '../helpers/hbone.js';
import { BLOCKS, block, startEchoServer, waitFor } from '../helpers/net.js';
import { builtinCa, builtinLeaf, makeCrl, spiffe, type Leaf } from '../helpers/pki.js';

const net = block(BLOCKS['crl-live']);
const SLEEP = net.workload(1);
const ECHO = net.workload(2);

/** The part of /config_dump this file reads. */
interface CertificatesDump {
  certificates: IdentityDump[];
}

/** Replaces `path` whole (by rename, as a ConfigMap update does). */
function publish(path: string, pem: string): void {
  writeFileSync(`${path}.new`, pem);
  renameSync(`${path}.new`, path);
}

/** Sends `text` on a duplex and resolves once it came back (an echo), or rejects when the duplex ends first. */
function echoes(duplex: Duplex, text: string): Promise<void> {
  return new Promise((resolve, reject) => {
    let got = '';
    const onData = (c: Buffer | string) => {
      got += c.toString();
      if (got.includes(text)) done(resolve);
    };
    const onEnd = () => done(() => reject(new Error(`ended before the echo of ${text}`)));
    const done = (f: () => void) => {
      duplex.off('data', onData);
      duplex.off('end', onEnd);
      duplex.off('close', onEnd);
      duplex.off('error', onEnd);
      f();
    };
    duplex.on('data', onData);
    duplex.on('end', onEnd);
    duplex.on('close', onEnd);
    duplex.on('error', onEnd);
    duplex.resume();
    duplex.write(text);
  });
}

/** Resolves once `duplex` has ended or closed (errors included). */
function ended(duplex: Duplex): Promise<void> {
  if (duplex.destroyed || duplex.readableEnded) return Promise.resolve();
  return new Promise<void>((resolve) => {
    for (const e of ['end', 'close', 'error']) duplex.once(e, () => resolve());
    duplex.resume();
  });
}

function within<T>(ms: number, p: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`not within ${ms} ms: ${what}`)), ms)));
  return Promise.race([p, bound]).finally(() => clearTimeout(timer));
}

test('inbound: a CRL change closes the live connection of the peer it revokes, flagged CERT_REVOKED; others carry on', async (t) => {
  const app = await startEchoServer(ECHO, 8080);
  t.after(() => app.close());
  const caDir = makeTempDir('ztn-crl-ca-');
  const crlPath = join(makeTempDir('ztn-crl-file-'), 'ca-crl.pem');
  const d = await startDaemon({
    node: 'node-b',
    config: { workloads: [workload({ name: 'echo', ip: ECHO, node: 'node-b' })] },
    caDir,
    adminIp: net.admin(1),
    env: { CRL_PATH: crlPath },
    cleanup: t,
  });
  const certs = makeTempDir('ztn-crl-certs-');
  const ca = builtinCa(caDir);
  const revoked = builtinLeaf(certs, caDir, [spiffe('shop', 'cart')], 'cart');
  const kept = builtinLeaf(certs, caDir, [spiffe('shop', 'till')], 'till');
  const open = async (leaf: Leaf) => {
    const session = await hboneSession({ host: ECHO, ca: ca.certPem, cert: leaf.certPem, key: leaf.keyPem });
    const r = await connectRequest(session, `${ECHO}:8080`);
    assert.equal(r.status, 200);
    await echoes(r.stream, 'before');
    return { session, stream: r.stream };
  };
  const [a, b] = [await open(revoked), await open(kept)];
  t.after(() => (a.session.destroy(), b.session.destroy()));

  // The list names the cart certificate (and one that does not exist).
  publish(crlPath, makeCrl(certs, ca, [revoked.serial, 999_999n]));
  await within(15_000, ended(a.stream), 'the revoked peer\'s stream ends');
  const flagged = () => d.metric('istio_tcp_connections_failed_total', { reporter: 'destination', response_flags: 'CERT_REVOKED' });
  await waitFor(async () => (await flagged()) === 1, { message: 'one connection failed with CERT_REVOKED' });
  assert.equal(await d.metric('istio_crl_policy_rejections_total', { reporter: 'destination' }), 1);
  assert.equal(await d.metric('istio_crl_policy_rejections_total', { reporter: 'source' }), 0);
  const record = await d.waitForLog((l) => l.target === 'access' && /revoked/.test((l.error as string | undefined) ?? ''), { message: 'the access record of the revoked stream' });
  assert.equal(record['src.identity'], spiffe('shop', 'cart'));
  assert.equal(record.direction, 'inbound');
  await echoes(b.stream, 'after');

  // A new handshake with the revoked certificate is refused, and counted.
  await assert.rejects(async () => {
    const s = await hboneSession({ host: ECHO, ca: ca.certPem, cert: revoked.certPem, key: revoked.keyPem });
    try {
      const r = await connectRequest(s, `${ECHO}:8080`);
      if (r.status !== 200) throw new Error(`refused: ${r.status ?? r.error?.message}`);
    } finally {
      s.destroy();
    }
  });
  await waitFor(async () => (await d.metric('istio_crl_policy_rejections_total', { reporter: 'destination' })) === 2, {
    message: 'the refused handshake counted',
  });
  assert.equal(await flagged(), 1, 'the refused handshake is not a closed connection');
  assert.equal(await d.metric('istio_crl_untracked_connections_total', { reporter: 'destination' }), 0);
});

test('outbound: a CRL change that revokes the server closes the pooled connection, its streams flagged CERT_REVOKED', async (t) => {
  const app = await startEchoServer(ECHO, 8080);
  t.after(() => app.close());
  const caDir = makeTempDir('ztn-crl-ca-');
  const crlPath = join(makeTempDir('ztn-crl-file-'), 'ca-crl.pem');
  const config = {
    workloads: [workload({ name: 'sleep', ip: SLEEP, node: 'node-a' }), workload({ name: 'echo', ip: ECHO, node: 'node-b' })],
  };
  const [a, b] = await Promise.all([
    startDaemon({ node: 'node-a', config, caDir, adminIp: net.admin(2), env: { CRL_PATH: crlPath }, cleanup: t }),
    startDaemon({ node: 'node-b', config, caDir, adminIp: net.admin(3), cleanup: t }),
  ]);
  const socket = await socks5Connect({ proxyHost: SLEEP, proxyPort: 15080, destHost: ECHO, destPort: 8080 });
  t.after(() => socket.destroy());
  await echoes(socket, 'before');
  // echo's certificate, as node-b holds it (config_dump gives the serial in decimal).
  const dump = await waitFor(async () => {
    const r = await fetch(`${b.adminUrl}/config_dump`);
    const { certificates } = (await r.json()) as CertificatesDump;
    return certificates.find((c) => c.identity === spiffe('default', 'echo') && c.certChain?.length > 0);
  }, { message: 'echo\'s certificate in node-b\'s config_dump' });
  const echoSerial = BigInt(dump.certChain[0].serialNumber);
  publish(crlPath, makeCrl(makeTempDir('ztn-crl-list-'), builtinCa(caDir), [echoSerial]));
  await within(15_000, ended(socket), 'the client connection ends');
  await waitFor(async () => (await a.metric('istio_tcp_connections_failed_total', { reporter: 'source', response_flags: 'CERT_REVOKED' })) === 1, {
    message: 'the outbound connection failed with CERT_REVOKED',
  });
  assert.equal(await a.metric('istio_crl_policy_rejections_total', { reporter: 'source' }), 1);
  // A new connection to echo is refused at its handshake by node-a (counted), never carried in plaintext.
  const again = await socks5Connect({ proxyHost: SLEEP, proxyPort: 15080, destHost: ECHO, destPort: 8080 }).catch((e: Error) => e);
  if (!(again instanceof Error)) {
    await assert.rejects(echoes(again, 'again'));
    again.destroy();
  }
  await waitFor(async () => (await a.metric('istio_crl_policy_rejections_total', { reporter: 'source' })) === 2, {
    message: 'the refused handshake counted',
  });
});

test('a connection handed over to a new daemon is still followed: the list closes it there, CERT_REVOKED', async (t) => {
  const app = await startEchoServer(ECHO, 8081);
  t.after(() => app.close());
  const caDir = makeTempDir('ztn-crl-ca-');
  const crlPath = join(makeTempDir('ztn-crl-file-'), 'ca-crl.pem');
  const env = { CRL_PATH: crlPath, HANDOVER_SOCKET: join(makeTempDir('ztn-crl-handover-'), 'handover.sock') };
  const config = { workloads: [workload({ name: 'echo', ip: ECHO, node: 'node-c' })] };
  const first = await startDaemon({ node: 'node-c', config, caDir, adminIp: net.admin(4), env, cleanup: t });
  const certs = makeTempDir('ztn-crl-certs-');
  const ca = builtinCa(caDir);
  const leaf = builtinLeaf(certs, caDir, [spiffe('shop', 'cart')], 'cart');
  const session = await hboneSession({ host: ECHO, ca: ca.certPem, cert: leaf.certPem, key: leaf.keyPem });
  t.after(() => session.destroy());
  const r = await connectRequest(session, `${ECHO}:8081`);
  assert.equal(r.status, 200);
  await echoes(r.stream, 'before');

  const second = await startDaemon({ node: 'node-c', config, caDir, adminIp: net.admin(5), env, cleanup: t });
  const exit = await Promise.race([first.exited, new Promise<null>((res) => setTimeout(() => res(null), 10_000))]);
  assert.equal(exit?.code, 0, 'the predecessor handed over and exited');
  assert.equal(second.logs.find((l) => l.message === 'hand-over taken')?.connections, 1);
  await echoes(r.stream, 'after the hand-over');
  assert.equal(await second.metric('istio_crl_untracked_connections_total', { reporter: 'destination' }), 0, 'its chain came with it');

  publish(crlPath, makeCrl(certs, ca, [leaf.serial]));
  await within(15_000, ended(r.stream), "the revoked peer's stream ends on the successor").catch((e: Error) => {
    throw new Error(`${e.message}\n${second.tail()}`);
  });
  await waitFor(async () => (await second.metric('istio_tcp_connections_failed_total', { reporter: 'destination', response_flags: 'CERT_REVOKED' })) === 1, {
    message: 'the successor flagged it CERT_REVOKED',
  });
  assert.equal(await second.metric('istio_crl_policy_rejections_total', { reporter: 'destination' }), 1);
});
