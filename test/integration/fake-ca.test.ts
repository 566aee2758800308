// FAKE_CA=true, as ztunnel's: no istiod CA; the daemon signs its workloads' certificates itself. Without LOCAL_CA_DIR
// its root is made in memory for the process (nothing written), so its own workloads tunnel to each other and a
// peer daemon with another such root is refused at the handshake (TLS_FAILURE), never served in plaintext; two
// daemons given one LOCAL_CA_DIR share that root and tunnel. CA_ADDRESS beside it is refused (config-errors suite).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import type { InstalledCertificate } from '../../dist/native/types.js';
import { makeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import type { Daemon } from '../helpers/daemon.js';
import { BLOCKS, block, httpGet, socks5Request, startEchoServer, throughSocks5, waitFor } from '../helpers/net.js';

const net = block(BLOCKS['fake-ca']);
const SLEEP = net.workload(1);
const ECHO_A = net.workload(2); // node-a, beside sleep
const ECHO_B = net.workload(3); // node-b
const CONFIG = {
  workloads: [
    workload({ name: 'sleep', ip: SLEEP, node: 'node-a' }),
    workload({ name: 'echo-a', ip: ECHO_A, node: 'node-a' }),
    workload({ name: 'echo-b', ip: ECHO_B, node: 'node-b' }),
  ],
};

/** What this file reads of /config_dump. */
interface Dump {
  config: Record<string, unknown>;
  certificates: InstalledCertificate[];
}

const dump = async (d: Daemon): Promise<Dump> => JSON.parse((await httpGet(`${d.adminUrl}/config_dump`)).body) as Dump;

test('FAKE_CA without LOCAL_CA_DIR: a root in memory; own workloads tunnel, a daemon with another root is refused', async (t) => {
  for (const ip of [ECHO_A, ECHO_B]) {
    const app = await startEchoServer(ip, 8080);
    t.after(() => app.close());
  }
  const env = { FAKE_CA: 'true', LOCAL_CA_DIR: undefined };
  const a = await startDaemon({ node: 'node-a', config: CONFIG, adminIp: net.admin(1), env, cleanup: t });
  const b = await startDaemon({ node: 'node-b', config: CONFIG, adminIp: net.admin(2), env, cleanup: t });
  for (const d of [a, b]) {
    await d.waitForLog((l) => /^FAKE_CA=true: .*exists only in this process/.test(l.message ?? ''), { message: 'the FAKE_CA warning' });
    const { config, certificates } = await dump(d);
    assert.equal(config.fakeCa, true);
    assert.equal(config.caAddress, null, 'no CA address, as ztunnel');
    assert.ok(certificates.length > 0, 'certificates signed in the daemon');
  }
  // No root was written: the daemon's own files are the local config and its hand-over socket.
  assert.deepEqual(readdirSync(a.dir).filter((f) => /pem|key|crt/i.test(f)), []);

  assert.equal(await throughSocks5(SLEEP, ECHO_A), 0, 'sleep reaches echo-a: both certificates from node-a\'s root');
  const tunneled = await a.metric('istio_tcp_connections_opened_total', { reporter: 'destination', destination_workload: 'echo-a' });
  assert.ok(tunneled >= 1, 'over HBONE (counted by the destination side)');

  const r = await socks5Request({ socks: { host: SLEEP, port: 15080 }, dest: { host: ECHO_B, port: 8080 } });
  r.socket?.destroy();
  assert.notEqual(r.code, 0x00, 'node-b\'s certificate is from another root: no tunnel');
  await waitFor(
    async () => (await a.metric('istio_tcp_connections_failed_total', { reporter: 'source', destination_workload: 'echo-b', response_flags: 'TLS_FAILURE' })) >= 1,
    { message: 'the refusal counted as TLS_FAILURE' },
  );
  assert.equal(await b.metric('istio_tcp_connections_opened_total', { reporter: 'destination' }), 0, 'node-b served nothing');
  for (const d of [a, b]) assert.equal((await d.stop()).code, 0);
});

test('FAKE_CA with one LOCAL_CA_DIR: two daemons share its root and tunnel', async (t) => {
  const app = await startEchoServer(ECHO_B, 8080);
  t.after(() => app.close());
  const caDir = makeTempDir('ztn-fake-ca-');
  const env = { FAKE_CA: 'true' };
  const a = await startDaemon({ node: 'node-a', config: CONFIG, caDir, adminIp: net.admin(1), env, cleanup: t });
  const b = await startDaemon({ node: 'node-b', config: CONFIG, caDir, adminIp: net.admin(2), env, cleanup: t });
  await a.waitForLog((l) => /^FAKE_CA=true: .*LOCAL_CA_DIR/.test(l.message ?? ''), { message: 'the FAKE_CA warning naming LOCAL_CA_DIR' });
  assert.equal(await throughSocks5(SLEEP, ECHO_B), 0);
  assert.ok((await b.metric('istio_tcp_connections_opened_total', { reporter: 'destination', source_workload: 'sleep' })) >= 1);
  for (const d of [a, b]) assert.equal((await d.stop()).code, 0);
});
