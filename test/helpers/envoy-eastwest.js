// A real Envoy running as an Istio ambient east-west gateway (test/fixtures/envoy/eastwest-gateway.yaml: the outer
// HBONE terminated on <ip>:15008, routed by the CONNECT :authority `<hostname>:<port>`, its payload — the client's
// inner HBONE — forwarded unopened to the endpoint's node at <endpoint IP>:15008). The Envoy binary and the config
// rendering are test/helpers/envoy-waypoint.js's; its certificate is signed by the daemons' built-in CA.
//
//   const gw = await startEnvoyEastWest({ binary, dir, caDir, ip, admin, service, endpoint });
//   await gw.stats(/^http\.connect_terminate\./);      // counters by name
//   gw.accessLog();                                    // the CONNECT streams it has logged so far (parsed JSON)
//   await gw.stop();
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { envoyStats } from '../../bench/harness/envoy.mjs';
import { poll } from '../../bench/harness/processes.mjs';
import { ROOT } from './daemon.js';
import { renderWaypointConfig, WAYPOINT_TEMPLATE } from './envoy-waypoint.js';
import { builtinLeaf, spiffe } from './pki.js';

export const EASTWEST_TEMPLATE = join(ROOT, 'test', 'fixtures', 'envoy', 'eastwest-gateway.yaml');

const READY_TIMEOUT_MS = 15_000;
const STOP_TIMEOUT_MS = 5_000;

const live = new Set();
process.once('exit', () => {
  for (const child of live) child.kill('SIGKILL');
});

/** The gateway config: the template with every {{NAME}} filled (strictly: a missing or unused value is an error). */
export function renderEastWestConfig(values, template = readFileSync(EASTWEST_TEMPLATE, 'utf8')) {
  try {
    return renderWaypointConfig(values, template);
  } catch (err) {
    throw new Error(err.message.replace(WAYPOINT_TEMPLATE, EASTWEST_TEMPLATE));
  }
}

/**
 * Starts Envoy as the east-west gateway and waits until its admin says ready.
 *
 *   binary      the Envoy binary (envoyBinary() of envoy-waypoint.js)
 *   dir         where its certificate, key, config and logs go
 *   caDir       the daemons' LOCAL_CA_DIR: its root signs the gateway's certificate and is the mesh root
 *   ip          the gateway's IP (connect_terminate listens on ip:15008; the forwarded TCP is bound to it)
 *   admin       { ip, port } of Envoy's admin
 *   identity    { namespace, serviceAccount } (default istio-system/istio-eastwestgateway); trustDomain
 *   service     { hostname, port }: the one service it exposes (authority `<hostname>:<port>`)
 *   endpoint    { ip, port = 15008 }: that service's endpoint's HBONE address on this network
 *   validateOnly  render, then `envoy --mode validate` instead of serving; resolves { code, output }
 */
export async function startEnvoyEastWest({
  binary,
  dir,
  caDir,
  ip,
  admin,
  identity = { namespace: 'istio-system', serviceAccount: 'istio-eastwestgateway' },
  trustDomain = 'cluster.local',
  service,
  endpoint,
  validateOnly = false,
}) {
  const id = spiffe(identity.namespace, identity.serviceAccount, trustDomain);
  const leaf = builtinLeaf(dir, caDir, [id], 'eastwest');
  const chainPath = join(dir, 'eastwest-chain.pem');
  const keyPath = join(dir, 'eastwest-key.pem');
  writeFileSync(chainPath, leaf.certPem);
  writeFileSync(keyPath, leaf.keyPem, { mode: 0o600 });
  const accessLogPath = join(dir, 'access.log');
  writeFileSync(accessLogPath, '');
  const config = renderEastWestConfig({
    ADMIN_IP: admin.ip,
    ADMIN_PORT: admin.port,
    GATEWAY_IP: ip,
    CERT_CHAIN: chainPath,
    PRIVATE_KEY: keyPath,
    MESH_ROOT: join(caDir, 'root-cert.pem'),
    TRUST_DOMAIN: trustDomain,
    SERVICE_HOSTNAME: service.hostname,
    SERVICE_PORT: service.port,
    ENDPOINT_IP: endpoint.ip,
    ENDPOINT_HBONE_PORT: endpoint.port ?? 15008,
    ACCESS_LOG: accessLogPath,
  });
  const configPath = join(dir, 'eastwest-gateway.yaml');
  writeFileSync(configPath, config);
  const logPath = join(dir, 'envoy.log');
  // One worker, no hot restart (no shared memory: Envoys of other suites never collide); access log lines flushed
  // every 100 ms instead of Envoy's default 10 s, so a test can read what it just did.
  const args = ['-c', configPath, '--concurrency', '1', '--disable-hot-restart', '-l', 'warning', '--log-path', logPath,
    '--file-flush-interval-msec', '100'];
  if (validateOnly) args.push('--mode', 'validate');
  const child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  live.add(child);
  const output = [];
  child.stdout.on('data', (d) => output.push(String(d)));
  child.stderr.on('data', (d) => output.push(String(d)));
  const exited = new Promise((resolve) =>
    child.once('close', (code, signal) => {
      live.delete(child);
      resolve({ code, signal });
    }),
  );
  const tail = () => {
    let log = '';
    try {
      log = readFileSync(logPath, 'utf8');
    } catch {
      // not written yet
    }
    return `${output.join('')}${log}`.split('\n').slice(-30).join('\n');
  };
  if (validateOnly) {
    const r = await exited;
    return { code: r.code, output: tail() };
  }
  const base = `http://${admin.ip}:${admin.port}`;
  const gw = {
    child,
    configPath,
    admin: base,
    identity: id,
    tail,
    /** Envoy's counters and gauges whose names match `pattern`, from a fresh /stats. */
    stats: (pattern) => envoyStats(base, pattern),
    /** The access log records written so far (one per ended CONNECT stream), parsed. */
    accessLog: () =>
      readFileSync(accessLogPath, 'utf8')
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l)),
    /** SIGTERM, then SIGKILL after STOP_TIMEOUT_MS; resolves { code, signal } once it has exited. */
    async stop() {
      if (!live.has(child)) return exited;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), STOP_TIMEOUT_MS);
      const r = await exited;
      clearTimeout(timer);
      return r;
    },
  };
  const died = exited.then((r) => {
    throw new Error(`Envoy exited (${r.code ?? r.signal}) before it was ready:\n${tail()}`);
  });
  died.catch(() => undefined); // once ready, its exit is stop()'s business
  try {
    await Promise.race([poll(base, '/ready', (status) => status === 200, 'the Envoy east-west gateway', READY_TIMEOUT_MS), died]);
  } catch (err) {
    await gw.stop();
    throw new Error(`${err.message}\n${tail()}`);
  }
  return gw;
}
