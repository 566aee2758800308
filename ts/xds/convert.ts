// The edge where istiod's Authorization messages become ztunnel-node's policy model (ts/state/model.ts). Address
// resources (workloads, services) are not decoded on this side: the dataplane decodes them
// (native/mesh/src/state/wds.rs), the mesh's only holder. Every conversion can fail: the error names the field and the problem, and the xDS client
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
import type { Policy, PolicyMatch, StringMatch } from '../state/model.js';

export const ADDRESS_TYPE_URL = 'type.googleapis.com/istio.workload.Address';
export const AUTHORIZATION_TYPE_URL = 'type.googleapis.com/istio.security.Authorization';

/** A resource that cannot be converted; `message` is the NACK reason (without the resource name). */
export class ConversionError extends Error {
  override readonly name = 'ConversionError';
}

function reject(message: string): never {
  throw new ConversionError(message);
}

function unpack(any: Any | undefined, typeUrl: string): Uint8Array {
  if (any === undefined) reject('resource has no body');
  if (any.typeUrl !== typeUrl) reject(`type ${JSON.stringify(any.typeUrl)} is not ${typeUrl}`);
  return any.value;
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

function checkPort(field: string, n: number, allowZero: boolean): number {
  if (n > 65535 || (!allowZero && n === 0)) reject(`${field}: ${n} is not a port`);
  return n;
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
