// The control-plane roots (XDS_ROOT_CA, CA_ROOT_CA) follow their file, as ztunnel's RootCertManager has its clients
// rebuild their channels after the file changes: istiod's serving certificate moves to a new root (the ConfigMap
// first carries both roots, as Istio's root rotation publishes them), istiod restarts, and the daemon's XDS stream
// and CA requests verify it with what the file holds then. A file that lost the new root is obeyed too: the daemon
// refuses the new istiod (no stream) until the file has it again, never falling back to anything.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { sumSamples } from '../../dist/cli/prom-text.js';
import type { IdentityDump } from '../../dist/ca/manager.js';
import { makeTempDir, startDaemon } from '../helpers/daemon.js';
import type { DaemonLogRecord } from '../helpers/daemon.js';
import { ADDRESS, AUTHORIZATION, istiodEnv, makeServerPki, startFakeIstiod, workloadResource } from '../helpers/fake-istiod.js';
import type { AdsStream, XdsResource } from '../helpers/fake-istiod.js';
import { BLOCKS, block, waitFor } from '../helpers/net.js';

const net = block(BLOCKS['root-rotation']);

/** Replaces `path` whole, by rename (as the kubelet swaps a ConfigMap's files). */
function publish(path: string, text: string): void {
  writeFileSync(`${path}.new`, text);
  renameSync(`${path}.new`, path);
}

async function serve(stream: AdsStream, resources: XdsResource[]): Promise<void> {
  await stream.nextRequest(ADDRESS);
  await stream.nextRequest(AUTHORIZATION);
  assert.equal((await stream.pushAndWait(ADDRESS, { resources })).errorDetail, undefined);
  assert.equal((await stream.pushAndWait(AUTHORIZATION, { resources: [] })).errorDetail, undefined);
}

test('a root rotation in the file is followed by the XDS stream and the CA client; a file without the new root is obeyed', async (t) => {
  const dir = makeTempDir('ztn-root-rotation-');
  const istiod = await startFakeIstiod({ dir });
  t.after(() => istiod.close());
  const rootsPath = join(makeTempDir('ztn-root-file-'), 'root-cert.pem');
  const rootA = readFileSync(istiod.rootCaPath, 'utf8');
  publish(rootsPath, rootA);

  const env = istiodEnv(istiod, 'node-a', { XDS_ROOT_CA: rootsPath, CA_ROOT_CA: rootsPath, AUTH_TOKEN: 'literal-token' });
  const started = startDaemon({ node: 'node-a', config: {}, adminIp: net.admin(1), env, cleanup: t });
  const sleep = (name: string, ip: string) => workloadResource({ name, ip, node: 'node-a' });
  await serve(await istiod.nextStream(), [sleep('sleep', net.workload(1))]);
  const d = await started;
  assert.equal(istiod.certRequests.length, 1, 'sleep\'s certificate from the CA under root A');

  // Rotation: the file carries both roots, then istiod restarts with a serving certificate under the new root.
  const pkiB = makeServerPki(join(dir, 'istiod-pki-b'));
  publish(rootsPath, rootA + pkiB.root.toString());
  await istiod.crash();
  istiod.pki = pkiB;
  await istiod.start();
  // A new workload on this node: its certificate is asked of the CA behind the new root.
  await serve(await istiod.nextStream(), [sleep('sleep', net.workload(1)), sleep('curl', net.workload(2))]);
  await waitFor(() => istiod.certRequests.some((r) => r.identity!.endsWith('/sa/curl')), { message: 'curl\'s CSR reached the CA under root B' });
  await waitFor(
    async () => JSON.parse(await (await fetch(`${d.adminUrl}/config_dump`)).text()).certificates.some((c: IdentityDump) => c.identity.endsWith('/sa/curl')),
    { message: 'curl\'s certificate installed' },
  );

  // The file loses the new root (an operator's mistake): istiod under root B is refused, with nothing else tried.
  publish(rootsPath, rootA);
  const seen = d.logs.length;
  await istiod.crash();
  await istiod.start();
  const refused = (l: DaemonLogRecord) => l.message === 'XDS stream ended' && /certificate|issuer/i.test(String(l.details ?? ''));
  await waitFor(() => d.logs.slice(seen).filter(refused).length >= 2, { timeoutMs: 15_000, message: 'attempts refused at the certificate' });
  assert.equal(istiod.streams.length, 2, 'no stream reached istiod while the file lacked its root');
  assert.ok(sumSamples(await d.metrics(), 'istio_xds_connection_terminations_total', { reason: 'ConnectionError' }) >= 2);

  // The root is back: the next attempt connects.
  publish(rootsPath, rootA + pkiB.root.toString());
  await serve(await istiod.nextStream(30_000), [sleep('sleep', net.workload(1)), sleep('curl', net.workload(2))]);
  assert.equal((await d.stop()).code, 0);
});
