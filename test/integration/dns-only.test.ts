// ENABLE_PROXY=false, ztunnel's DNS-only mode: a local workload gets its DNS proxy, and none of its proxies (no HBONE
// listener, no SOCKS5 entry), nor a certificate it would need for them. The same workload with the proxies on has both.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { connect } from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { IdentityDump } from '../../dist/ca/manager.js';
import { ROOT, makeTempDir, startDaemon, workload } from '../helpers/daemon.js';
import { BLOCKS, block, httpGet } from '../helpers/net.js';
import { PYTHON, skipWithoutPython } from '../helpers/prereqs.js';

const run = promisify(execFile);
const net = block(BLOCKS['dns-only']);
const SLEEP = net.workload(1);
const VIP = net.workload(200);
const CONFIG = {
  workloads: [
    workload({ name: 'sleep', ip: SLEEP, node: 'node-a' }),
    workload({ name: 'echo', ip: net.workload(2), node: 'node-b', services: { 'default/echo.default.svc.cluster.local': { 80: 8080 } } }),
  ],
  services: [{ name: 'echo', namespace: 'default', hostname: 'echo.default.svc.cluster.local', vips: [`/${VIP}`], ports: { 80: 8080 } }],
};

/** One answer of dns_query.py: its records (the fields this file reads). */
interface DnsAnswer {
  answers: { data: string }[];
}

/** The part of /config_dump this file reads. */
interface CertificatesDump {
  certificates: IdentityDump[];
}

/** 'open' or the connect error's code. */
const probe = (port: number) =>
  new Promise<string | undefined>((resolve) => {
    const s = connect({ host: SLEEP, port });
    s.once('connect', () => {
      s.destroy();
      resolve('open');
    });
    s.once('error', (e: NodeJS.ErrnoException) => resolve(e.code));
  });

test('ENABLE_PROXY=false: the workload\'s DNS proxy answers, and no proxy listens', { skip: skipWithoutPython('dnspython') }, async (t) => {
  for (const [i, env, proxies] of [[1, { ENABLE_PROXY: 'false' }, false], [2, {}, true]] as const) {
    const d = await startDaemon({ node: 'node-a', config: CONFIG, caDir: makeTempDir('ztn-dns-only-ca-'), adminIp: net.admin(i), env, cleanup: t });
    await d.waitForLog((l) => l.message === 'local workload listening', { message: 'the workload served' });
    const q = { server: SLEEP, port: 15053, name: 'echo.default.svc.cluster.local.', type: 'A' };
    const { stdout } = await run(PYTHON, [join(ROOT, 'test/helpers/dns_query.py'), JSON.stringify([q, { ...q, tcp: true }])], { timeout: 30_000 });
    for (const r of JSON.parse(stdout) as DnsAnswer[]) assert.deepEqual(r.answers.map((a) => a.data), [VIP], JSON.stringify(r));
    const want = proxies ? 'open' : 'ECONNREFUSED';
    assert.deepEqual([await probe(15080), await probe(15008)], [want, want], `proxies ${proxies ? 'on' : 'off'}: SOCKS5 and HBONE`);
    const { certificates } = JSON.parse((await httpGet(`${d.adminUrl}/config_dump`)).body) as CertificatesDump;
    assert.equal(certificates.length > 0, proxies, `certificates held: ${JSON.stringify(certificates.map((c) => c.identity))}`);
    await d.stop();
  }
});
