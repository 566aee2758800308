// The edge where istiod's wire messages become ztunnel-node's state model (ts/state/model.ts). Nothing past this
// file sees a protobuf. Every conversion can fail: the error names the field and the problem, and the xDS client
// prefixes the resource name and sends that text back in the NACK (`<name>: <reason>`).
//
// Policies become the SAME `Policy` the local config file produces (ts/config/local.ts), so whatever compiles
// store policies for the dataplane cannot tell the two sources apart.
import { fromBinary } from '@bufbuild/protobuf';
import type { Any } from '@bufbuild/protobuf/wkt';
import {
  Action,
  AuthorizationSchema,
  Scope,
  type Address as AuthzAddress,
  type Authorization,
  type Match,
  type StringMatch as WireStringMatch,
} from '../gen/istio/security/authorization_pb.js';
import {
  AddressSchema,
  ApplicationTunnel_Protocol,
  IPFamilies,
  LoadBalancing_HealthPolicy,
  LoadBalancing_Mode,
  LoadBalancing_Scope,
  NetworkMode,
  Service_Visibility,
  TunnelProtocol,
  WorkloadStatus,
  WorkloadType,
  type GatewayAddress as WireGateway,
  type NetworkAddress,
  type Service as WireService,
  type Workload as WireWorkload,
} from '../gen/istio/workload/workload_pb.js';
import type {
  GatewayAddress,
  LoadBalancer,
  Policy,
  PolicyMatch,
  ServiceInfo,
  StringMatch,
  WorkloadInfo,
} from '../state/model.js';

export const ADDRESS_TYPE_URL = 'type.googleapis.com/istio.workload.Address';
export const AUTHORIZATION_TYPE_URL = 'type.googleapis.com/istio.security.Authorization';

/** A resource that cannot be converted; `message` is the NACK reason (without the resource name). */
export class ConversionError extends Error {
  override readonly name = 'ConversionError';
}

function reject(message: string): never {
  throw new ConversionError(message);
}

/** Istio's defaults for fields a workload may leave empty (ztunnel applies the same ones). */
const DEFAULT_TRUST_DOMAIN = 'cluster.local';
const DEFAULT_SERVICE_ACCOUNT = 'default';
/** An absent capacity is weight 1 (the field is a wrapper so that 0 can be said explicitly). */
const DEFAULT_CAPACITY = 1;
const DEFAULT_HBONE_PORT = 15008;

export type AddressResource = { kind: 'workload'; workload: WorkloadInfo } | { kind: 'service'; service: ServiceInfo };

function unpack(any: Any | undefined, typeUrl: string): Uint8Array {
  if (any === undefined) reject('resource has no body');
  if (any.typeUrl !== typeUrl) reject(`type ${JSON.stringify(any.typeUrl)} is not ${typeUrl}`);
  return any.value;
}

/** Decodes and converts one `istio.workload.Address` resource body. */
export function convertAddressResource(any: Any | undefined): AddressResource {
  let addr;
  try {
    addr = fromBinary(AddressSchema, unpack(any, ADDRESS_TYPE_URL));
  } catch (err) {
    if (err instanceof ConversionError) throw err;
    reject(`cannot decode istio.workload.Address: ${(err as Error).message}`);
  }
  switch (addr.type.case) {
    case 'workload':
      return { kind: 'workload', workload: convertWorkload(addr.type.value) };
    case 'service':
      return { kind: 'service', service: convertService(addr.type.value) };
    default:
      return reject('Address has neither a workload nor a service');
  }
}

/** Decodes and converts one `istio.security.Authorization` resource body. */
export function convertAuthorizationResource(any: Any | undefined): Policy {
  let authz;
  try {
    authz = fromBinary(AuthorizationSchema, unpack(any, AUTHORIZATION_TYPE_URL));
  } catch (err) {
    if (err instanceof ConversionError) throw err;
    reject(`cannot decode istio.security.Authorization: ${(err as Error).message}`);
  }
  return convertAuthorization(authz);
}

/** 4 or 16 bytes -> text; anything else is a bad address. */
export function ipFromBytes(bytes: Uint8Array, field: string): string {
  if (bytes.length === 4) return bytes.join('.');
  if (bytes.length === 16) {
    const groups: string[] = [];
    for (let i = 0; i < 16; i += 2) groups.push((((bytes[i] as number) << 8) | (bytes[i + 1] as number)).toString(16));
    // Compress the longest run of zero groups, as the canonical text form does.
    let best = -1;
    let bestLen = 0;
    for (let i = 0; i < 8; ) {
      if (groups[i] !== '0') {
        i++;
        continue;
      }
      let j = i;
      while (j < 8 && groups[j] === '0') j++;
      if (j - i > bestLen && j - i > 1) {
        best = i;
        bestLen = j - i;
      }
      i = j;
    }
    if (best < 0) return groups.join(':');
    return `${groups.slice(0, best).join(':')}::${groups.slice(best + bestLen).join(':')}`;
  }
  return reject(`${field}: ${bytes.length} bytes is not an IPv4 (4) or IPv6 (16) address`);
}

function enumValue<T extends string>(field: string, value: number, table: Record<number, T>): T {
  const v = table[value];
  if (v === undefined) reject(`${field}: unknown enum value ${value}`);
  return v;
}

function gateway(g: WireGateway | undefined, field: string): GatewayAddress | null {
  if (g === undefined) return null;
  const port = g.hboneMtlsPort === 0 ? DEFAULT_HBONE_PORT : g.hboneMtlsPort;
  if (port > 65535) reject(`${field}.hboneMtlsPort: ${port} is not a port`);
  switch (g.destination.case) {
    case 'hostname':
      return { destination: `${g.destination.value.namespace}/${g.destination.value.hostname}`, hboneMtlsPort: port };
    case 'address':
      return {
        destination: `${g.destination.value.network}/${ipFromBytes(g.destination.value.address, `${field}.address`)}`,
        hboneMtlsPort: port,
      };
    default:
      return reject(`${field}: neither a hostname nor an address`);
  }
}

function checkPort(field: string, n: number, allowZero: boolean): number {
  if (n > 65535 || (!allowZero && n === 0)) reject(`${field}: ${n} is not a port`);
  return n;
}

const PROTOCOLS: Record<number, 'TCP' | 'HBONE'> = { [TunnelProtocol.NONE]: 'TCP', [TunnelProtocol.HBONE]: 'HBONE' };
const STATUSES: Record<number, 'Healthy' | 'Unhealthy'> = {
  [WorkloadStatus.HEALTHY]: 'Healthy',
  [WorkloadStatus.UNHEALTHY]: 'Unhealthy',
};
const WORKLOAD_TYPES: Record<number, WorkloadInfo['workloadType']> = {
  [WorkloadType.DEPLOYMENT]: 'deployment',
  [WorkloadType.CRONJOB]: 'cronjob',
  [WorkloadType.POD]: 'pod',
  [WorkloadType.JOB]: 'job',
};
const NETWORK_MODES: Record<number, WorkloadInfo['networkMode']> = {
  [NetworkMode.STANDARD]: 'Standard',
  [NetworkMode.HOST_NETWORK]: 'HostNetwork',
};
const APP_TUNNEL_PROTOCOLS: Record<number, 'NONE' | 'PROXY'> = {
  [ApplicationTunnel_Protocol.NONE]: 'NONE',
  [ApplicationTunnel_Protocol.PROXY]: 'PROXY',
};

export function convertWorkload(w: WireWorkload): WorkloadInfo {
  if (w.uid === '') reject('workload has no uid');
  if (w.tunnelProtocol === TunnelProtocol.LEGACY_ISTIO_MTLS) {
    reject('tunnelProtocol LEGACY_ISTIO_MTLS is not supported (only NONE and HBONE)');
  }
  const services: Record<string, Record<string, number>> = {};
  for (const [key, list] of Object.entries(w.services)) {
    if (!/^[^/]+\/[^/]+$/.test(key)) reject(`services: key ${JSON.stringify(key)} is not <namespace>/<hostname>`);
    const ports: Record<string, number> = {};
    list.ports.forEach((p, i) => {
      const sp = checkPort(`services[${JSON.stringify(key)}].ports[${i}].servicePort`, p.servicePort, false);
      ports[String(sp)] = checkPort(`services[${JSON.stringify(key)}].ports[${i}].targetPort`, p.targetPort, true);
    });
    services[key] = ports;
  }
  const tunnel = w.applicationTunnel;
  return {
    uid: w.uid,
    name: w.name,
    namespace: w.namespace,
    serviceAccount: w.serviceAccount || DEFAULT_SERVICE_ACCOUNT,
    trustDomain: w.trustDomain || DEFAULT_TRUST_DOMAIN,
    workloadIps: w.addresses.map((a, i) => ipFromBytes(a, `addresses[${i}]`)),
    network: w.network,
    protocol: enumValue('tunnelProtocol', w.tunnelProtocol, PROTOCOLS),
    node: w.node,
    status: enumValue('status', w.status, STATUSES),
    capacity: w.capacity ?? DEFAULT_CAPACITY,
    canonicalName: w.canonicalName,
    canonicalRevision: w.canonicalRevision,
    workloadName: w.workloadName,
    workloadType: enumValue('workloadType', w.workloadType, WORKLOAD_TYPES),
    clusterId: w.clusterId,
    locality: {
      region: w.locality?.region ?? '',
      zone: w.locality?.zone ?? '',
      subzone: w.locality?.subzone ?? '',
    },
    services,
    authorizationPolicies: [...w.authorizationPolicies],
    hostname: w.hostname,
    networkMode: enumValue('networkMode', w.networkMode, NETWORK_MODES),
    waypoint: gateway(w.waypoint, 'waypoint'),
    networkGateway: gateway(w.networkGateway, 'networkGateway'),
    applicationTunnel:
      tunnel === undefined
        ? null
        : {
            protocol: enumValue('applicationTunnel.protocol', tunnel.protocol, APP_TUNNEL_PROTOCOLS),
            port: tunnel.port === 0 ? null : checkPort('applicationTunnel.port', tunnel.port, false),
          },
    nativeTunnel: w.nativeTunnel,
  };
}

const SCOPES: Record<number, LoadBalancer['routingPreferences'][number]> = {
  [LoadBalancing_Scope.REGION]: 'Region',
  [LoadBalancing_Scope.ZONE]: 'Zone',
  [LoadBalancing_Scope.SUBZONE]: 'Subzone',
  [LoadBalancing_Scope.NODE]: 'Node',
  [LoadBalancing_Scope.CLUSTER]: 'Cluster',
  [LoadBalancing_Scope.NETWORK]: 'Network',
};
const LB_MODES: Record<number, LoadBalancer['mode']> = {
  [LoadBalancing_Mode.UNSPECIFIED_MODE]: 'Standard',
  [LoadBalancing_Mode.STRICT]: 'Strict',
  [LoadBalancing_Mode.FAILOVER]: 'Failover',
  [LoadBalancing_Mode.PASSTHROUGH]: 'Passthrough',
};
const HEALTH_POLICIES: Record<number, LoadBalancer['healthPolicy']> = {
  [LoadBalancing_HealthPolicy.ONLY_HEALTHY]: 'OnlyHealthy',
  [LoadBalancing_HealthPolicy.ALLOW_ALL]: 'AllowAll',
};
const IP_FAMILIES: Record<number, ServiceInfo['ipFamilies']> = {
  [IPFamilies.AUTOMATIC]: null,
  [IPFamilies.IPV4_ONLY]: 'IPv4',
  [IPFamilies.IPV6_ONLY]: 'IPv6',
  [IPFamilies.DUAL]: 'Dual',
};

function isHostPrefix(ip: string, length: number): boolean {
  return length === (ip.includes(':') ? 128 : 32);
}

export function convertService(s: WireService): ServiceInfo {
  if (s.namespace === '') reject('service has no namespace');
  if (s.hostname === '') reject('service has no hostname');
  const vips: string[] = [];
  const cidrVips: string[] = [];
  s.addresses.forEach((a: NetworkAddress, i) => {
    const ip = ipFromBytes(a.address, `addresses[${i}].address`);
    if (a.length === undefined || isHostPrefix(ip, a.length)) {
      vips.push(`${a.network}/${ip}`);
    } else {
      if (a.length > (ip.includes(':') ? 128 : 32)) reject(`addresses[${i}].length: /${a.length} is too long for ${ip}`);
      cidrVips.push(`${a.network}/${ip}/${a.length}`);
    }
  });
  const ports: Record<string, number> = {};
  s.ports.forEach((p, i) => {
    ports[String(checkPort(`ports[${i}].servicePort`, p.servicePort, false))] = checkPort(`ports[${i}].targetPort`, p.targetPort, true);
  });
  const lb = s.loadBalancing;
  return {
    name: s.name,
    namespace: s.namespace,
    hostname: s.hostname,
    vips,
    ports,
    subjectAltNames: [...s.subjectAltNames],
    cidrVips,
    waypoint: gateway(s.waypoint, 'waypoint'),
    weightedWaypoints: s.weightedWaypoints.map((w, i) => {
      const g = gateway(w.destination, `weightedWaypoints[${i}].destination`);
      if (g === null) return reject(`weightedWaypoints[${i}]: no destination`);
      return { waypoint: g, weight: w.weight };
    }),
    loadBalancer:
      lb === undefined
        ? null
        : {
            routingPreferences: lb.routingPreference.map((p, i) => enumValue(`loadBalancing.routingPreference[${i}]`, p, SCOPES)),
            mode: enumValue('loadBalancing.mode', lb.mode, LB_MODES),
            healthPolicy: enumValue('loadBalancing.healthPolicy', lb.healthPolicy, HEALTH_POLICIES),
          },
    ipFamilies: s.ipFamilies in IP_FAMILIES ? (IP_FAMILIES[s.ipFamilies] ?? null) : reject(`ipFamilies: unknown enum value ${s.ipFamilies}`),
    canonical: s.canonical,
    // An unknown visibility is PUBLIC (spec §3.3): newer istiods may add values.
    visibility: s.visibility === Service_Visibility.NAMESPACE ? 'Namespace' : 'Public',
  };
}

const POLICY_SCOPES: Record<number, Policy['scope']> = {
  [Scope.GLOBAL]: 'Global',
  [Scope.NAMESPACE]: 'Namespace',
  [Scope.WORKLOAD_SELECTOR]: 'WorkloadSelector',
};
const ACTIONS: Record<number, Policy['action']> = { [Action.ALLOW]: 'Allow', [Action.DENY]: 'Deny' };

function stringMatch(m: WireStringMatch, field: string): StringMatch {
  switch (m.matchType.case) {
    case 'exact':
      return { Exact: m.matchType.value };
    case 'prefix':
      return { Prefix: m.matchType.value };
    case 'suffix':
      return { Suffix: m.matchType.value };
    case 'presence':
      return { Presence: [] };
    default:
      return reject(`${field}: empty StringMatch`);
  }
}

function cidr(a: AuthzAddress, field: string): string {
  const ip = ipFromBytes(a.address, `${field}.address`);
  const max = ip.includes(':') ? 128 : 32;
  if (a.length > max) reject(`${field}.length: /${a.length} is too long for ${ip}`);
  return `${ip}/${a.length}`;
}

function match(m: Match, field: string): PolicyMatch {
  const strings = (list: WireStringMatch[], name: string) => list.map((x, i) => stringMatch(x, `${field}.${name}[${i}]`));
  const cidrs = (list: AuthzAddress[], name: string) => list.map((x, i) => cidr(x, `${field}.${name}[${i}]`));
  const ports = (list: number[], name: string) => list.map((p, i) => checkPort(`${field}.${name}[${i}]`, p, false));
  const sas = (list: Match['serviceAccounts']) => list.map((sa) => ({ namespace: sa.namespace, serviceAccount: sa.serviceAccount }));
  return {
    namespaces: strings(m.namespaces, 'namespaces'),
    notNamespaces: strings(m.notNamespaces, 'notNamespaces'),
    principals: strings(m.principals, 'principals'),
    notPrincipals: strings(m.notPrincipals, 'notPrincipals'),
    serviceAccounts: sas(m.serviceAccounts),
    notServiceAccounts: sas(m.notServiceAccounts),
    sourceIps: cidrs(m.sourceIps, 'sourceIps'),
    notSourceIps: cidrs(m.notSourceIps, 'notSourceIps'),
    destinationIps: cidrs(m.destinationIps, 'destinationIps'),
    notDestinationIps: cidrs(m.notDestinationIps, 'notDestinationIps'),
    destinationPorts: ports(m.destinationPorts, 'destinationPorts'),
    notDestinationPorts: ports(m.notDestinationPorts, 'notDestinationPorts'),
  };
}

export function convertAuthorization(a: Authorization): Policy {
  if (a.name === '') reject('policy has no name');
  return {
    name: a.name,
    namespace: a.namespace,
    scope: enumValue('scope', a.scope, POLICY_SCOPES),
    action: enumValue('action', a.action, ACTIONS),
    dryRun: a.dryRun,
    rules: a.rules.map((r, ri) =>
      r.clauses.map((c, ci) => c.matches.map((m, mi) => match(m, `rules[${ri}].clauses[${ci}].matches[${mi}]`))),
    ),
  };
}
