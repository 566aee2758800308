// config_dump's `config`: Istio ztunnel's Config keys (src/config.rs), in its order and serde's value forms, and our
// own settings under `ztunnelNode`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfig, configForDump } from '../../dist/config/index.js';
import { ztunnelConfigDump, readResolverFacts } from '../../dist/config/ztunnel-dump.js';
import type { ConfigInput } from '../../dist/config/index.js';

/** The nested parts of the dumps (typed as records by the daemon) that the tests read into; they assert the values. */
interface Duration { secs: number; nanos: number }
type ZtunnelDump = Record<string, unknown> & {
  dnsResolverCfg: { search: string[]; domain: string | null; name_servers: { socket_addr: string; protocol: string }[] };
  dnsResolverOpts: { cache_size: number; ip_strategy: string; timeout: Duration; ndots: number; attempts: number };
  socketConfig: { keepaliveTime: Duration };
};
type ConfigDump = ZtunnelDump & {
  ztunnelNode: {
    authToken: string; xdsHeaders: Record<string, string>; proxyMode: string; nodeName: string; connectionTimeout: string;
    adminAddr: string; http2: unknown; dns: { enabled: boolean }; inpod: { uds: string };
  };
};

const load = (env: ConfigInput['env']) => loadConfig({ env, cpuCount: 4, exists: () => false });

// ztunnel's Config fields, in declaration order (serde keeps it), camelCase.
const ZTUNNEL_KEYS = [
  'proxy', 'dnsProxy', 'transparentNetworkPolicies', 'windowSize', 'connectionWindowSize', 'frameSize',
  'poolMaxStreamsPerConn', 'poolUnusedReleaseTimeout', 'socks5Addr', 'adminAddr', 'statsAddr', 'readinessAddr',
  'inboundAddr', 'inboundPlaintextAddr', 'outboundAddr', 'dnsProxyAddr', 'illegalPorts', 'network', 'localNode',
  'proxyMode', 'proxyWorkloadInformation', 'clusterId', 'clusterDomain', 'caAddress', 'caRootCert', 'altCaHostname',
  'xdsAddress', 'xdsRootCert', 'altXdsHostname', 'preferedServiceNamespace', 'secretTtl', 'xdsOnDemand', 'fakeCa',
  'fakeSelfInbound', 'selfTerminationDeadline', 'proxyMetadata', 'numWorkerThreads', 'requireOriginalSource',
  'proxyArgs', 'dnsResolverCfg', 'dnsResolverOpts', 'inpodUds', 'inpodPortReuse', 'packetMark', 'socketConfig',
  'xdsHeaders', 'caHeaders', 'localhostAppTunnel', 'ztunnelIdentity', 'ztunnelWorkload', 'ipv6Enabled',
];

const secs = (s: number, nanos = 0): Duration => ({ secs: s, nanos });

test('default config: every ztunnel key, in order, in ztunnel\'s value forms', () => {
  const d = ztunnelConfigDump(load({})) as ZtunnelDump;
  assert.deepEqual(Object.keys(d), ZTUNNEL_KEYS);
  assert.equal(d.proxy, true);
  assert.equal(d.dnsProxy, true);
  assert.equal(d.transparentNetworkPolicies, false);
  assert.deepEqual([d.windowSize, d.connectionWindowSize, d.frameSize], [4194304, 16777216, 1048576]);
  assert.equal(d.poolMaxStreamsPerConn, 100);
  assert.deepEqual(d.poolUnusedReleaseTimeout, secs(300));
  assert.equal(d.socks5Addr, null);
  // Address: Localhost(ipv6, port) or SocketAddr("ip:port"); ours bind 127.0.0.1 / 0.0.0.0 explicitly.
  assert.deepEqual(d.adminAddr, { SocketAddr: '127.0.0.1:15000' });
  assert.deepEqual(d.statsAddr, { SocketAddr: '0.0.0.0:15020' });
  assert.deepEqual(d.readinessAddr, { SocketAddr: '0.0.0.0:15021' });
  assert.deepEqual([d.inboundAddr, d.inboundPlaintextAddr, d.outboundAddr], ['[::]:15008', '[::]:15006', '[::]:15001']);
  assert.deepEqual(d.dnsProxyAddr, { Localhost: [true, 15053] });
  assert.deepEqual(d.illegalPorts, [15008, 15006, 15001, 15053, 15000, 15020, 15021]);
  assert.equal(d.network, '');
  assert.equal(d.localNode, null);
  assert.equal(d.proxyMode, 'Shared');
  assert.equal(d.proxyWorkloadInformation, null);
  assert.deepEqual([d.clusterId, d.clusterDomain], ['Kubernetes', 'cluster.local']);
  assert.equal(d.caAddress, 'https://localhost:15012');
  assert.equal(d.xdsAddress, 'https://localhost:15012');
  // The default root-cert path does not exist here: ztunnel takes the value as inline PEM (Static, bytes skipped).
  assert.equal(d.caRootCert, 'Static');
  assert.equal(d.xdsRootCert, 'Static');
  assert.deepEqual([d.altCaHostname, d.altXdsHostname, d.preferedServiceNamespace], [null, null, null]);
  assert.deepEqual(d.secretTtl, secs(86400));
  assert.deepEqual([d.xdsOnDemand, d.fakeCa, d.fakeSelfInbound], [false, false, false]);
  assert.deepEqual(d.selfTerminationDeadline, secs(5));
  assert.deepEqual(d.proxyMetadata, {});
  assert.equal(d.numWorkerThreads, 2);
  assert.equal(d.requireOriginalSource, null);
  assert.equal(d.proxyArgs, '');
  assert.deepEqual(d.dnsResolverCfg, { domain: null, search: [], name_servers: [] });
  assert.equal(d.dnsResolverOpts.cache_size, 4096);
  assert.equal(d.dnsResolverOpts.ip_strategy, 'Ipv4AndIpv6');
  assert.deepEqual(d.dnsResolverOpts.timeout, secs(5));
  assert.equal(d.inpodUds, '/var/run/ztunnel/ztunnel.sock');
  assert.equal(d.inpodPortReuse, true);
  assert.equal(d.packetMark, 1337);
  assert.deepEqual(d.socketConfig, {
    keepaliveTime: secs(180), keepaliveInterval: secs(180), keepaliveRetries: 9, keepaliveEnabled: true, userTimeoutEnabled: false,
  });
  assert.deepEqual(d.xdsHeaders, []);
  assert.deepEqual(d.caHeaders, []);
  assert.equal(d.localhostAppTunnel, true);
  assert.equal(d.ztunnelIdentity, null);
  assert.equal(d.ztunnelWorkload, null);
  assert.equal(d.ipv6Enabled, true);
});

test('environment-set config: values follow the variables as ztunnel reads them', () => {
  const env = {
    POOL_MAX_STREAMS_PER_CONNECTION: '7',
    POOL_UNUSED_RELEASE_TIMEOUT: '90s',
    CONNECTION_TERMINATION_DEADLINE: '1500ms',
    ISTIO_META_DNS_CAPTURE: 'false',
    ISTIO_META_DNS_PROXY_ADDR: '127.0.0.1:5353',
    ISTIO_META_FOO: 'bar',
    ISTIO_METAJSON_LABELS: '{"app":"x"}',
    PROXY_MODE: 'dedicated',
    PROXY_WORKLOAD_INFO: 'ns1/pod1/sa1',
    ENABLE_ORIG_SRC: 'false',
    IPV6_ENABLED: 'false',
    UNSTABLE_ENABLE_SOCKS5: 'true',
    XDS_ADDRESS: '',
    CA_ROOT_CA: 'SYSTEM',
    SECRET_TTL: '2h',
    KEEPALIVE_TIME: '30s',
    NODE_NAME: 'n1',
    NETWORK: 'net1',
    POD_NAME: 'ztunnel-abc',
    POD_NAMESPACE: 'istio-system',
    SERVICE_ACCOUNT: 'ztunnel',
    TRUST_DOMAIN: 'td.example',
  };
  const d = ztunnelConfigDump(load(env)) as ZtunnelDump;
  assert.deepEqual(Object.keys(d), ZTUNNEL_KEYS);
  assert.equal(d.poolMaxStreamsPerConn, 7);
  assert.deepEqual(d.poolUnusedReleaseTimeout, secs(90));
  assert.deepEqual(d.selfTerminationDeadline, secs(1, 500_000_000));
  assert.equal(d.dnsProxy, false);
  assert.deepEqual(d.dnsProxyAddr, { SocketAddr: '127.0.0.1:5353' });
  // ISTIO_META_ strings only: ztunnel does not read ISTIO_METAJSON_.
  assert.deepEqual(d.proxyMetadata, { DNS_CAPTURE: 'false', DNS_PROXY_ADDR: '127.0.0.1:5353', FOO: 'bar' });
  assert.equal(d.proxyMode, 'Dedicated');
  assert.deepEqual(d.proxyWorkloadInformation, { name: 'pod1', namespace: 'ns1', serviceAccount: 'sa1' });
  assert.equal(d.requireOriginalSource, false);
  assert.equal(d.ipv6Enabled, false);
  assert.deepEqual([d.inboundAddr, d.inboundPlaintextAddr, d.outboundAddr], ['0.0.0.0:15008', '0.0.0.0:15006', '0.0.0.0:15001']);
  assert.equal(d.dnsResolverOpts.ip_strategy, 'Ipv4Only');
  assert.equal(d.socks5Addr, '127.0.0.1:15080');
  assert.deepEqual(d.illegalPorts, [15008, 15006, 15001, 15080, 15000, 15020, 15021], 'SOCKS5 in; DNS off, so 15053 out');
  assert.equal(d.xdsAddress, null);
  assert.equal(d.caRootCert, 'Default');
  assert.deepEqual(d.secretTtl, secs(7200));
  assert.deepEqual(d.socketConfig.keepaliveTime, secs(30));
  assert.equal(d.localNode, 'n1');
  assert.equal(d.network, 'net1');
  assert.equal(d.ztunnelIdentity, 'spiffe://td.example/ns/istio-system/sa/ztunnel');
  assert.deepEqual(d.ztunnelWorkload, { name: 'ztunnel-abc', namespace: 'istio-system', serviceAccount: 'ztunnel' });

  assert.equal(ztunnelConfigDump(load({ PROXY_MODE: 'shared' })).proxyMode, 'Shared');
  assert.equal(ztunnelConfigDump(load({ ENABLE_ORIG_SRC: 'true' })).requireOriginalSource, true);
  // Local mode serves the node's workloads as Shared does, with no pod netns to mark.
  const local = ztunnelConfigDump(load({ PROXY_MODE: 'local', NODE_NAME: 'n1', LOCAL_CA_DIR: '/tmp/ca' }));
  assert.deepEqual([local.proxyMode, local.packetMark, local.caAddress], ['Shared', null, null]);
  // An existing root-cert file is RootCert::File.
  assert.deepEqual(ztunnelConfigDump(load({}), { exists: () => true }).caRootCert, { File: './var/run/secrets/istio/root-cert.pem' });
});

test('no secret reaches the dump: token and header values are redacted, header names kept', () => {
  const secrets = ['s3cr3t-token-value', 'xds-header-secret', 'ca-header-secret'];
  const c = load({ AUTH_TOKEN: secrets[0], XDS_HEADER_Authorization: secrets[1], CA_HEADER_X_Tenant: secrets[2] });
  const d = configForDump(c) as ConfigDump;
  assert.deepEqual(d.xdsHeaders, [['authorization', '<redacted>']]);
  assert.deepEqual(d.caHeaders, [['x_tenant', '<redacted>']]);
  const text = JSON.stringify(d);
  for (const s of secrets) assert.ok(!text.includes(s), `${s} leaked`);
  assert.equal(d.ztunnelNode.authToken, '<redacted>');
  assert.deepEqual(d.ztunnelNode.xdsHeaders, { authorization: '<redacted>' });
});

test('configForDump: ztunnel keys first, our own settings unchanged under ztunnelNode', () => {
  const d = configForDump(load({ CONNECTION_TIMEOUT: '1500ms', NODE_NAME: 'n1' })) as ConfigDump;
  assert.deepEqual(Object.keys(d), [...ZTUNNEL_KEYS, 'ztunnelNode']);
  const own = d.ztunnelNode;
  assert.equal(own.proxyMode, 'shared');
  assert.equal(own.nodeName, 'n1');
  assert.equal(own.connectionTimeout, '1.5s');
  assert.equal(own.adminAddr, '127.0.0.1:15000');
  assert.deepEqual(own.http2, { streamWindowSize: 4194304, connectionWindowSize: 16777216, frameSize: 1048576 });
  assert.deepEqual(own.xdsHeaders, {});
  assert.equal(own.dns.enabled, true);
  assert.equal(own.inpod.uds, '/var/run/ztunnel/ztunnel.sock');
  // Serializable as-is.
  assert.deepEqual(JSON.parse(JSON.stringify(d)), d);
});

test('the resolver file as hickory reads it for ztunnel: servers over UDP then TCP, search, domain, options', (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'zdump-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'resolv.conf');
  writeFileSync(path, 'nameserver 10.96.0.10\nnameserver fd00::a\nsearch ns1.svc.cluster.local svc.cluster.local\noptions ndots:5 timeout:3\n');
  const facts = readResolverFacts(path, 'host.example.com');
  assert.deepEqual(facts, {
    nameservers: ['10.96.0.10:53', '[fd00::a]:53'], search: ['ns1.svc.cluster.local', 'svc.cluster.local'], domain: 'example.com', ndots: 5, timeoutSecs: 3, attempts: 2,
  });
  const d = ztunnelConfigDump(load({}), { resolver: facts }) as ZtunnelDump;
  assert.deepEqual(d.dnsResolverCfg.search, ['ns1.svc.cluster.local', 'svc.cluster.local']);
  assert.equal(d.dnsResolverCfg.domain, 'example.com');
  assert.deepEqual(d.dnsResolverCfg.name_servers.map((s) => [s.socket_addr, s.protocol]), [
    ['10.96.0.10:53', 'udp'], ['10.96.0.10:53', 'tcp'], ['[fd00::a]:53', 'udp'], ['[fd00::a]:53', 'tcp'],
  ]);
  assert.deepEqual(d.dnsResolverCfg.name_servers[0], {
    socket_addr: '10.96.0.10:53', protocol: 'udp', tls_dns_name: null, http_endpoint: null, trust_negative_responses: false, bind_addr: null,
  });
  assert.equal(d.dnsResolverOpts.ndots, 5);
  assert.deepEqual(d.dnsResolverOpts.timeout, secs(3));
  assert.equal(d.dnsResolverOpts.attempts, 2);
  assert.equal(readResolverFacts(join(dir, 'missing'), 'h').nameservers.length, 0);
  // configForDump reads the file DNS_RESOLV_CONF names.
  assert.equal((configForDump(load({ DNS_RESOLV_CONF: path })) as ConfigDump).dnsResolverCfg.name_servers.length, 4);
});
