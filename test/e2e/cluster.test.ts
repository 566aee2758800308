// ztunnel-node in a real control plane (npm run e2e, as root; scripts/e2e.mjs prepares the node and runs this file
// inside its namespaces): Kubernetes' API server, controller manager and kube-proxy, istiod, istio-cni's node agent and
// CNI plugin, all built from the Go module proxy, and ztunnel-node as its chart deploys it. Nothing stands between
// ztunnel-node and them: the node's runtime (lib/runtime.ts) runs the pods the controllers create, calls istio-cni's
// plugin for each pod as a container runtime does, and plays no part in the mesh.
//
// The scenarios run in order against one cluster; each fails on a broken link of the chain it names.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, test } from 'node:test';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Cluster, e2eEnv } from './lib/cluster.js';
import { apiPath } from './lib/kube.js';
import type { Pod } from './lib/runtime.js';
import {
  NS, assertStreamSurvived, configDump, connectFrom, createPods, eventually, metricSum, metricsText, namespace, spiffe, streamCounters,
  streamFlowing,
} from './scenario.js';

const REPO = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
let c: Cluster;

// One cluster for every scenario, in order, set up and torn down by the hooks of this describe.
describe('ztunnel-node in a real control plane', () => {
  before(async () => {
    const env = e2eEnv(REPO);
    c = await Cluster.up(env, (line) => console.log(`# ${new Date().toISOString()} ${line}`));
    console.log(`# ${new Date().toISOString()} cluster ready; the mesh's workloads next`);
    await namespace(c, ['client', 'echo', 'other'], { echo: 'echo', 'echo-long': 'echo-long' });
    await createPods(c, [
      { name: 'echo-1', sa: 'echo', labels: { app: 'echo' }, args: ['echo'] },
      { name: 'echo-2', sa: 'echo', labels: { app: 'echo' }, args: ['echo'] },
      { name: 'echo-long', sa: 'echo', labels: { app: 'echo-long' }, args: ['echo'] },
      { name: 'client', sa: 'client', labels: { app: 'client' }, args: ['sleep'] },
      { name: 'other', sa: 'other', labels: { app: 'other' }, args: ['sleep'] },
      { name: 'stream-long', sa: 'client', labels: { app: 'stream-long' }, args: ['stream', '--target', 'echo-long.e2e.svc.cluster.local:8080'] },
    ]);
    await c.waitPodsReady(NS, 'app in (echo,echo-long,client,other,stream-long)', 6, 180_000);
  }, { timeout: 1_200_000 });

  after(async () => {
    await c?.down();
  }, { timeout: 120_000 });

  test('1. ambient: a pod reaches a Service over HBONE with mTLS, as its SPIFFE identity, with certificates istiod signed for the API server\'s tokens', async () => {
    const before = await metricsText(c);
    const opened = (t: string) => metricSum(t, 'istio_tcp_connections_opened_total', {
      reporter: 'destination', source_principal: spiffe('client'), destination_principal: spiffe('echo'), connection_security_policy: 'mutual_tls',
    });
    const r = await eventually('client → echo.e2e.svc.cluster.local:8080', async () => {
      const x = await connectFrom(c, 'client', 'echo.e2e.svc.cluster.local:8080');
      return x.ok ? x : false;
    }, 60_000);
    assert.ok(r.ok);
    // The destination side saw it arrive over mTLS as the client's identity (ztunnel's own metric and labels).
    const after = await eventually('the destination-side metric', async () => {
      const t = await metricsText(c);
      return opened(t) > opened(before) ? t : false;
    }, 10_000);
    assert.ok(metricSum(after, 'istio_tcp_connections_opened_total', { reporter: 'source', source_principal: spiffe('client'), request_protocol: 'tcp' }) > 0, 'captured on the source side too');
    // The certificates: istiod's root, as the API server's ConfigMap istio-ca-root-cert carries it.
    const cm = await c.admin.get<{ metadata: { name: string }; data: Record<string, string> }>(apiPath('configmaps', { namespace: NS, name: 'istio-ca-root-cert' }));
    const root = new X509Certificate(cm.data['root-cert.pem']!);
    const dump = await configDump(c);
    for (const sa of ['client', 'echo']) {
      const cert = dump.certificates.find((x) => x.identity === spiffe(sa));
      assert.ok(cert, `a certificate for ${spiffe(sa)}: ${JSON.stringify(dump.certificates.map((x) => x.identity))}`);
      const leaf = new X509Certificate(Buffer.from(cert.certChain[0]!.pem, 'base64'));
      assert.equal(leaf.subjectAltName, `URI:${spiffe(sa)}`);
      assert.ok(leaf.verify(root.publicKey), `${sa}'s certificate is signed by istiod's root`);
    }
  });

  /** How long a change may take to reach the traffic: the API server, istiod's push, ztunnel-node's re-evaluation. */
  const BOUND_MS = 10_000;

  const policy = (name: string, action: 'DENY' | 'ALLOW', principal: string) => JSON.stringify({
    apiVersion: 'security.istio.io/v1',
    kind: 'AuthorizationPolicy',
    metadata: { name, namespace: NS },
    spec: { selector: { matchLabels: { app: 'echo' } }, action, rules: [{ from: [{ source: { principals: [principal] } }] }] },
  });
  const principal = (sa: string) => `cluster.local/ns/${NS}/sa/${sa}`;
  const passes = async (pod: string) => (await connectFrom(c, pod, 'echo.e2e.svc.cluster.local:8080')).ok;

  test('2. kubectl apply of an AuthorizationPolicy (DENY, then ALLOW-only) changes what passes, live connections included; kubectl delete restores it', async () => {
    // stream-policy (client) is what the policies deny; stream-other (other) is what every one of them allows: istiod
    // pushes a workload naming a new policy before the policy itself, and no allowed live connection may be hurt by it.
    await createPods(c, [
      { name: 'stream-policy', sa: 'client', labels: { app: 'stream-policy' }, args: ['stream', '--target', 'echo.e2e.svc.cluster.local:8080'] },
      { name: 'stream-other', sa: 'other', labels: { app: 'stream-other' }, args: ['stream', '--target', 'echo.e2e.svc.cluster.local:8080'] },
    ]);
    await c.waitPodsReady(NS, 'app in (stream-policy,stream-other)', 2);
    const live = await streamFlowing(c, 'stream-policy');
    const allowed = await streamFlowing(c, 'stream-other');
    const long = streamCounters(c, 'stream-long');
    assert.ok(await passes('client'), 'client → echo before any policy');

    await c.apply(policy('deny-client', 'DENY', principal('client')));
    const t0 = Date.now();
    await eventually('client denied', async () => !(await passes('client')), BOUND_MS);
    const cut = await eventually('the live connection from stream-policy closed', async () => {
      const s = streamCounters(c, 'stream-policy');
      return s.errors > live.errors ? s : false;
    }, BOUND_MS);
    console.log(`# DENY: new connections refused and the live one closed within ${Date.now() - t0} ms (${cut.lastError})`);
    assert.ok(await passes('other'), 'other (not named by the DENY) still passes');

    // ALLOW-only: the ALLOW for `other` first, then the DENY goes: `client` is never let through in between.
    await c.apply(policy('allow-other', 'ALLOW', principal('other')));
    await c.kubectl(['delete', 'authorizationpolicy', 'deny-client', '-n', NS]);
    await eventually('other allowed by the ALLOW', () => passes('other'), BOUND_MS);
    assert.equal(await passes('client'), false, 'client is not in the ALLOW-only policy');
    const denied = streamCounters(c, 'stream-policy');
    assert.ok(!denied.connected, 'stream-policy stays refused');

    await c.kubectl(['delete', 'authorizationpolicy', 'allow-other', '-n', NS]);
    await eventually('client allowed again', () => passes('client'), BOUND_MS);
    await eventually('stream-policy connected again and echoing', async () => {
      const s = streamCounters(c, 'stream-policy');
      return s.connected && s.connects > denied.connects && s.echoed > denied.echoed;
    }, BOUND_MS + 5_000);
    // What every policy allowed, and a workload the policies never selected, kept their connections throughout.
    await assertStreamSurvived(c, 'stream-other', allowed);
    await assertStreamSurvived(c, 'stream-long', long);
    for (const name of ['stream-policy', 'stream-other']) await c.admin.delete(apiPath('pods', { namespace: NS, name }));
  });

  test('3. a pod deleted and another added: ZDS removes and adds it, WDS follows, no other connection is hurt', async () => {
    const long = streamCounters(c, 'stream-long');
    const m0 = await metricsText(c);
    const stopped0 = metricSum(m0, 'workload_manager_proxies_stopped_total', {});
    const started0 = metricSum(m0, 'workload_manager_proxies_started_total', {});
    const echo2 = (await c.pods(NS, 'app=echo')).find((p) => p.metadata.name === 'echo-2')!;
    const echo2Ip = echo2.status?.podIP;

    await c.kubectl(['delete', 'pod', 'echo-2', '-n', NS, '--wait=true', '--timeout=60s']);
    await eventually('ztunnel-node stopped echo-2\'s proxy (ZDS)', async () => metricSum(await metricsText(c), 'workload_manager_proxies_stopped_total', {}) > stopped0, BOUND_MS);
    await eventually('echo-2 gone from WDS', async () => !(await configDump(c)).workloads.some((w) => w.name === 'echo-2' && w.namespace === NS), BOUND_MS);
    const svc = (await configDump(c)).services.find((s) => s.name === 'echo' && s.namespace === NS);
    assert.ok(svc && !JSON.stringify(svc.endpoints).includes(`${echo2Ip}`), 'echo-2 is no endpoint of echo any more');

    await createPods(c, [{ name: 'echo-3', sa: 'echo', labels: { app: 'echo' }, args: ['echo'] }]);
    const [echo3] = (await c.waitPodsReady(NS, 'app=echo', 2)).filter((p) => p.metadata.name === 'echo-3');
    await eventually('ztunnel-node started echo-3\'s proxy (ZDS)', async () => metricSum(await metricsText(c), 'workload_manager_proxies_started_total', {}) > started0, BOUND_MS);
    await eventually('echo-3 in WDS', async () => (await configDump(c)).workloads.some((w) => w.name === 'echo-3' && w.workloadIps.includes(echo3!.status!.podIP!)), BOUND_MS);
    const direct = await eventually('client → echo-3 by its pod IP', async () => {
      const r = await connectFrom(c, 'client', `${echo3!.status!.podIP}:8080`);
      return r.ok ? r : false;
    }, BOUND_MS);
    assert.ok(direct.ok);
    await assertStreamSurvived(c, 'stream-long', long);
  });

  const ready = (p: Pod) => !p.metadata.deletionTimestamp && Boolean(p.status?.conditions?.some((x) => x.type === 'Ready' && x.status === 'True'));

  /** A Service selecting the echo pods, created now; resolves once ztunnel-node has it (a change made through the whole chain). */
  async function serviceReachesZtunnel(name: string): Promise<void> {
    await c.apply(JSON.stringify({
      apiVersion: 'v1', kind: 'Service', metadata: { name, namespace: NS },
      spec: { selector: { app: 'echo' }, ports: [{ name: 'tcp-echo', port: 8080, targetPort: 8080 }] },
    }));
    await eventually(`Service ${name} in ztunnel-node's config_dump`, async () => (await configDump(c)).services.some((s) => s.name === name && s.namespace === NS), 30_000);
  }

  async function readyAnswers(): Promise<boolean> {
    return (await c.ztunnelGet(15021, '/healthz/ready')).status === 200;
  }

  test('4. istiod restarted, the API server restarted: ztunnel-node keeps serving the last good state, reconnects, resumes; certificates rotate without a dropped connection', async () => {
    const long = streamCounters(c, 'stream-long');
    const dump0 = await configDump(c);
    const serial0 = dump0.certificates.find((x) => x.identity === spiffe('client'))!.certChain[0]!.serialNumber;

    const [istiod] = await c.pods('istio-system', 'app=istiod');
    const restarts0 = istiod!.status?.containerStatuses?.[0]?.restartCount ?? 0;
    await c.runtime.killContainer('istio-system', istiod!.metadata.name, 'discovery');
    assert.ok(await passes('client'), 'traffic while istiod is down: the last good state serves');
    assert.ok(await readyAnswers(), 'ready while istiod is down');
    await eventually('istiod restarted and ready', async () => {
      const [p] = await c.pods('istio-system', 'app=istiod');
      return p && ready(p) && (p.status?.containerStatuses?.[0]?.restartCount ?? 0) > restarts0;
    }, 120_000);
    await serviceReachesZtunnel('echo-after-istiod');

    await c.controlPlane.apiserver.stop();
    try {
      assert.ok(await passes('client'), 'traffic while the API server is down');
      assert.ok(await readyAnswers(), 'ready while the API server is down');
      await sleep(5_000);
    } finally {
      await c.controlPlane.startApiserver();
    }
    await serviceReachesZtunnel('echo-after-apiserver');
    assert.ok(await passes('client'));

    // SECRET_TTL=2m (the chart's env): refreshed at about half its life, so within this run.
    const rotated = await eventually('client\'s certificate rotated', async () => {
      const cert = (await configDump(c)).certificates.find((x) => x.identity === spiffe('client'));
      return cert && cert.state === 'Available' && cert.certChain[0]!.serialNumber !== serial0 ? cert : false;
    }, 180_000);
    console.log(`# rotated: serial ${serial0} -> ${rotated.certChain[0]!.serialNumber}, valid ${rotated.certChain[0]!.validFrom} to ${rotated.certChain[0]!.expirationTime}`);
    assert.ok(await passes('client'), 'new connections with the new certificate');
    await assertStreamSurvived(c, 'stream-long', long);
  });

  test('5. a restart of ztunnel-node (the DaemonSet\'s surge rollout): the successor takes over, a long-lived connection survives byte-exact', async () => {
    const long = await streamFlowing(c, 'stream-long');
    const old = await c.ztunnelPod();
    await c.kubectl(['rollout', 'restart', 'daemonset/ztunnel', '-n', 'istio-system']);
    const successor = await eventually('a new ztunnel-node pod ready, the old one gone', async () => {
      const pods = await c.pods('istio-system', 'app=ztunnel');
      return pods.length === 1 && pods[0]!.metadata.uid !== old.metadata.uid && ready(pods[0]!) ? pods[0]! : false;
    }, 180_000);
    await assertStreamSurvived(c, 'stream-long', long);
    assert.ok(await passes('client'), 'new connections through the successor');
    const log = readFileSync(join(c.env.logs, 'pods', `istio-system_${successor.metadata.name}_istio-proxy.log`), 'utf8');
    assert.match(log, /hand-over taken/, 'the successor took the connections over');
  });

  test('6. istioctl ztunnel-config reads ztunnel-node\'s config_dump; istioctl x precheck and analyze are clean', async () => {
    await c.apply(JSON.stringify({
      apiVersion: 'security.istio.io/v1', kind: 'AuthorizationPolicy', metadata: { name: 'allow-all', namespace: NS },
      spec: { selector: { matchLabels: { app: 'echo' } }, action: 'ALLOW', rules: [{}] },
    }));
    await eventually('allow-all in config_dump', async () => (await configDump(c)).policies.some((p) => p.name === 'allow-all'), BOUND_MS);
    const file = join(c.env.work, 'config_dump.json');
    writeFileSync(file, (await c.ztunnelGet(15000, '/config_dump')).body);
    const workloads = await c.istioctl(['ztunnel-config', 'workload', '--file', file]);
    for (const name of ['echo-1', 'echo-3', 'client', 'stream-long']) assert.match(workloads, new RegExp(`^${NS}\\s+${name}\\s+10\\.244\\.`, 'm'), workloads);
    assert.match(workloads, /HBONE/);
    const services = await c.istioctl(['ztunnel-config', 'service', '--file', file]);
    assert.match(services, new RegExp(`^${NS}\\s+echo\\s+10\\.96\\.`, 'm'), services);
    const policies = await c.istioctl(['ztunnel-config', 'policy', '--file', file]);
    assert.match(policies, new RegExp(`^${NS}\\s+allow-all\\s+Allow`, 'm'), policies);
    const certs = await c.istioctl(['ztunnel-config', 'certificate', '--file', file]);
    assert.ok(certs.includes(spiffe('client')), certs);
    const precheck = await c.istioctl(['x', 'precheck']);
    assert.match(precheck, /No issues found/, precheck);
    // Warnings and errors (istioctl's own Info messages, such as the `default` namespace having no injection label,
    // say nothing of ztunnel-node).
    const analyze = await c.istioctl(['analyze', '-A', '--output-threshold', 'Warning']);
    assert.match(analyze, /No validation issues found/, analyze);
    await c.kubectl(['delete', 'authorizationpolicy', 'allow-all', '-n', NS]);
  });
});
