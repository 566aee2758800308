// A real Envoy running as an Istio ambient east-west gateway (test/fixtures/envoy/eastwest-gateway.yaml: the outer
// HBONE terminated on <ip>:15008, routed by the CONNECT :authority `<hostname>:<port>`, its payload — the client's
// inner HBONE — forwarded unopened to the endpoint's node at <endpoint IP>:15008). The Envoy binary and the config
// rendering are test/helpers/envoy-waypoint.ts's; its certificate is signed by the daemons' built-in CA.
//
//   const gw = await startEnvoyEastWest({ binary, dir, caDir, ip, admin, service, endpoint });
//   await gw.stats(/^http\.connect_terminate\./);      // counters by name
//   gw.accessLog();                                    // the CONNECT streams it has logged so far (parsed JSON)
//   await gw.stop();
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from './daemon.js';
import {
  renderWaypointConfig,
  runEnvoy,
  WAYPOINT_TEMPLATE,
  writeLeaf,
  type EnvoyStartOptions,
  type EnvoyHandle,
  type EnvoyValidation,
} from './envoy-waypoint.js';
import { spiffe } from './pki.js';

export const EASTWEST_TEMPLATE = join(ROOT, 'test', 'fixtures', 'envoy', 'eastwest-gateway.yaml');

/** The gateway config: the template with every {{NAME}} filled (strictly: a missing or unused value is an error). */
export function renderEastWestConfig(values: Record<string, string | number>, template = readFileSync(EASTWEST_TEMPLATE, 'utf8')): string {
  try {
    return renderWaypointConfig(values, template);
  } catch (err) {
    throw new Error((err as Error).message.replace(WAYPOINT_TEMPLATE, EASTWEST_TEMPLATE));
  }
}

/** `startEnvoyEastWest`'s options (described below). */
export interface EnvoyEastWestOptions extends EnvoyStartOptions {
  /** Default istio-system/istio-eastwestgateway. */
  identity?: { namespace: string; serviceAccount: string };
  service: { hostname: string; port: number };
  endpoint: { ip: string; port?: number };
  /** Default false. */
  validateOnly?: boolean;
}

/** A running east-west gateway. */
export interface EnvoyEastWest extends EnvoyHandle {
  configPath: string;
  /** Its SPIFFE identity. */
  identity: string;
  /** The access log records written so far (one per ended CONNECT stream), parsed: Envoy's JSON fields. */
  accessLog(): Record<string, unknown>[];
}

/**
 * Starts Envoy as the east-west gateway and waits until its admin says ready.
 *
 *   binary      the Envoy binary (envoyBinary() of envoy-waypoint.ts)
 *   dir         where its certificate, key, config and logs go
 *   caDir       the daemons' LOCAL_CA_DIR: its root signs the gateway's certificate and is the mesh root
 *   ip          the gateway's IP (connect_terminate listens on ip:15008; the forwarded TCP is bound to it)
 *   admin       { ip, port } of Envoy's admin
 *   identity    { namespace, serviceAccount } (default istio-system/istio-eastwestgateway); trustDomain
 *   service     { hostname, port }: the one service it exposes (authority `<hostname>:<port>`)
 *   endpoint    { ip, port = 15008 }: that service's endpoint's HBONE address on this network
 *   validateOnly  render, then `envoy --mode validate` instead of serving; resolves { code, output }
 */
export async function startEnvoyEastWest(options: EnvoyEastWestOptions & { validateOnly: true }): Promise<EnvoyValidation>;
export async function startEnvoyEastWest(options: EnvoyEastWestOptions & { validateOnly?: false }): Promise<EnvoyEastWest>;
export async function startEnvoyEastWest(options: EnvoyEastWestOptions): Promise<EnvoyEastWest | EnvoyValidation>;
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
}: EnvoyEastWestOptions): Promise<EnvoyEastWest | EnvoyValidation> {
  const id = spiffe(identity.namespace, identity.serviceAccount, trustDomain);
  const { chainPath, keyPath } = writeLeaf(dir, caDir, id, 'eastwest');
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
  // Access log lines flushed every 100 ms instead of Envoy's default 10 s, so a test can read what it just did.
  const run = await runEnvoy({
    binary,
    configPath,
    logPath: join(dir, 'envoy.log'),
    admin,
    what: 'the Envoy east-west gateway',
    extraArgs: ['--file-flush-interval-msec', '100'],
    validateOnly,
  });
  // runEnvoy validated (validateOnly) or serves.
  if (validateOnly) return run as EnvoyValidation;
  return {
    ...(run as EnvoyHandle),
    configPath,
    identity: id,
    /** The access log records written so far (one per ended CONNECT stream), parsed. */
    accessLog: () =>
      readFileSync(accessLogPath, 'utf8')
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l)),
  };
}
