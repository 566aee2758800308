// Policy compilation, the only one: the TS model of an authorization policy (from the local config, xDS or a policy
// preview) → the form the Rust dataplane loads (docs/native-api.md, `NativePolicy`), evaluates, and writes
// config_dump's `policies` from. The dataplane only parses this form into its evaluation structures.
//
// What compiling does, and why here (the control side) rather than per connection:
// - principals are compared without `spiffe://` (Istio's rule); exact and prefix values written with the scheme
//   are stripped once, here;
// - CIDRs are normalized ("10.0.0.1" → "10.0.0.1/32") and string matchers become tagged variants;
// - the dataplane checks what it loads at its boundary (INVALID_STATE names the policy), so a bad policy never
//   half-applies.
// Evaluation semantics live in native/mesh/src/rbac.rs (the README's "Authorization" section).
import { isIP } from 'node:net';
// The compiled shapes are the dataplane's own (generated from its Rust types).
import type { NativeMatch, NativePolicy, NativeStringMatch } from '../native/types.js';
import type { Policy, PolicyMatch, StringMatch } from '../state/model.js';

const SPIFFE = 'spiffe://';

function stringMatch(m: StringMatch, stripSpiffe: boolean): NativeStringMatch {
  const strip = (v: string) => (stripSpiffe && v.startsWith(SPIFFE) ? v.slice(SPIFFE.length) : v);
  if ('Exact' in m) return { exact: strip(m.Exact) };
  if ('Prefix' in m) return { prefix: strip(m.Prefix) };
  if ('Suffix' in m) return { suffix: m.Suffix };
  return { presence: true };
}

/** "10.0.0.1" → "10.0.0.1/32"; "fd00::/8" unchanged. Throws on anything that is not an IP or CIDR. */
export function normalizeCidr(cidr: string): string {
  const [ip, prefix, ...rest] = cidr.split('/');
  const family = isIP(ip ?? '');
  const max = family === 4 ? 32 : 128;
  const bits = prefix === undefined ? max : Number(prefix);
  if (family === 0 || rest.length > 0 || !Number.isInteger(bits) || bits < 0 || bits > max || (prefix !== undefined && !/^\d+$/.test(prefix))) {
    throw new Error(`${JSON.stringify(cidr)} is not an IP address or CIDR`);
  }
  return `${ip}/${bits}`;
}

function compileMatch(m: PolicyMatch): NativeMatch {
  const out: NativeMatch = {};
  const strings = (list: StringMatch[], strip: boolean) => list.map((x) => stringMatch(x, strip));
  if (m.namespaces.length) out.namespaces = strings(m.namespaces, false);
  if (m.notNamespaces.length) out.notNamespaces = strings(m.notNamespaces, false);
  if (m.principals.length) out.principals = strings(m.principals, true);
  if (m.notPrincipals.length) out.notPrincipals = strings(m.notPrincipals, true);
  if (m.serviceAccounts.length) out.serviceAccounts = m.serviceAccounts.map((s) => ({ ...s }));
  if (m.notServiceAccounts.length) out.notServiceAccounts = m.notServiceAccounts.map((s) => ({ ...s }));
  if (m.sourceIps.length) out.sourceIps = m.sourceIps.map(normalizeCidr);
  if (m.notSourceIps.length) out.notSourceIps = m.notSourceIps.map(normalizeCidr);
  if (m.destinationIps.length) out.destinationIps = m.destinationIps.map(normalizeCidr);
  if (m.notDestinationIps.length) out.notDestinationIps = m.notDestinationIps.map(normalizeCidr);
  if (m.destinationPorts.length) out.destinationPorts = [...new Set(m.destinationPorts)];
  if (m.notDestinationPorts.length) out.notDestinationPorts = [...new Set(m.notDestinationPorts)];
  return out;
}

export function compilePolicy(p: Policy): NativePolicy {
  return {
    name: p.name,
    namespace: p.namespace,
    scope: p.scope,
    action: p.action,
    dryRun: p.dryRun,
    rules: p.rules.map((rule) => rule.map((clause) => clause.map(compileMatch))),
  };
}
