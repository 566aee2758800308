//! Authorization policies as they cross the boundary (compiled by TS, the one policy compiler: principals without
//! `spiffe://`, CIDRs in canonical form, ports as numbers) and the form the dataplane loads them into: checked,
//! evaluation-ready, and what config_dump's `policies` are written from (state/dump.rs).

use std::collections::HashMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::StateError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "PolicyScope"))]
pub enum Scope {
    Global,
    Namespace,
    WorkloadSelector,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "PolicyAction"))]
pub enum Action {
    Allow,
    Deny,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "NativeStringMatch"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
    Suffix(String),
    /// Any non-empty value.
    Presence(bool),
}

impl StringMatch {
    pub fn matches(&self, v: &str) -> bool {
        match self {
            StringMatch::Exact(s) => v == s,
            StringMatch::Prefix(s) => v.starts_with(s.as_str()),
            StringMatch::Suffix(s) => v.ends_with(s.as_str()),
            StringMatch::Presence(_) => !v.is_empty(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceAccountMatch {
    pub namespace: String,
    pub service_account: String,
}

/// A CIDR, stored masked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Cidr> {
        let (ip, prefix) = parse_cidr(s)?;
        Some(Cidr::of(ip, prefix))
    }

    /// The range of `prefix` bits that contains `ip`.
    pub fn of(ip: IpAddr, prefix: u8) -> Cidr {
        Cidr { addr: mask(ip, prefix), prefix }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }
}

/// "ip/prefix" or a bare address (the whole length): the address as written and the prefix.
fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (ip, prefix) = match s.split_once('/') {
        Some((ip, p)) => (ip.parse::<IpAddr>().ok()?, Some(p.parse::<u8>().ok()?)),
        None => (s.parse::<IpAddr>().ok()?, None),
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let prefix = prefix.unwrap_or(max);
    (prefix <= max).then_some((ip, prefix))
}

/// A policy's CIDR: matched as the masked range, shown as written (ztunnel's `IpNet` keeps the address it was
/// given: config_dump shows "10.1.2.3/8", not "10.0.0.0/8").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyCidr {
    pub range: Cidr,
    pub written: IpAddr,
}

impl PolicyCidr {
    pub fn parse(s: &str) -> Option<PolicyCidr> {
        let (ip, prefix) = parse_cidr(s)?;
        Some(PolicyCidr { range: Cidr::of(ip, prefix), written: ip })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.range.contains(ip)
    }
}

impl std::fmt::Display for PolicyCidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.written, self.range.prefix)
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v) => {
            let bits = u32::from(v);
            let m = if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix)) };
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(v) => {
            let bits = u128::from(v);
            let m = if prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(prefix)) };
            IpAddr::V6((bits & m).into())
        }
    }
}

/// One match as TS sends it. Every list empty (or omitted: the compiler leaves empty lists out) means "no constraint".
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "NativeMatch"))]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct MatchJson {
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<StringMatch>>", optional))]
    pub namespaces: Vec<StringMatch>,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<StringMatch>>", optional))]
    pub not_namespaces: Vec<StringMatch>,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<StringMatch>>", optional))]
    pub principals: Vec<StringMatch>,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<StringMatch>>", optional))]
    pub not_principals: Vec<StringMatch>,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<ServiceAccountMatch>>", optional))]
    pub service_accounts: Vec<ServiceAccountMatch>,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<ServiceAccountMatch>>", optional))]
    pub not_service_accounts: Vec<ServiceAccountMatch>,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub source_ips: Vec<String>,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub not_source_ips: Vec<String>,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub destination_ips: Vec<String>,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub not_destination_ips: Vec<String>,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<u32>>", optional))]
    pub destination_ports: Vec<u32>,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<u32>>", optional))]
    pub not_destination_ports: Vec<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "NativePolicy"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyJson {
    pub name: String,
    pub namespace: String,
    pub scope: Scope,
    pub action: Action,
    #[serde(default)]
    pub dry_run: bool,
    /// rules[rule][clause][match]
    #[serde(default)]
    pub rules: Vec<Vec<Vec<MatchJson>>>,
}

/// One match as the dataplane evaluates it, and as config_dump writes it: ztunnel's `RbacMatch` (its keys in its
/// order, an empty list left out, string matches externally tagged, CIDRs as written).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "MatchDump"))]
#[serde(rename_all = "camelCase")]
pub struct Match {
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "ztunnel_strings")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<ZtunnelStringMatch<'static>>>", optional))]
    pub namespaces: Vec<StringMatch>,
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "ztunnel_strings")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<ZtunnelStringMatch<'static>>>", optional))]
    pub not_namespaces: Vec<StringMatch>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<ServiceAccountMatch>>", optional))]
    pub service_accounts: Vec<ServiceAccountMatch>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<ServiceAccountMatch>>", optional))]
    pub not_service_accounts: Vec<ServiceAccountMatch>,
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "ztunnel_strings")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<ZtunnelStringMatch<'static>>>", optional))]
    pub principals: Vec<StringMatch>,
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "ztunnel_strings")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<ZtunnelStringMatch<'static>>>", optional))]
    pub not_principals: Vec<StringMatch>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub source_ips: Vec<PolicyCidr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub not_source_ips: Vec<PolicyCidr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub destination_ips: Vec<PolicyCidr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub not_destination_ips: Vec<PolicyCidr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<u16>>", optional))]
    pub destination_ports: Vec<u16>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<u16>>", optional))]
    pub not_destination_ports: Vec<u16>,
    /// Every list empty (computed once: the evaluator asks on every connection).
    #[serde(skip)]
    #[cfg_attr(any(test, feature = "ts"), ts(skip))]
    pub empty: bool,
}

/// A string match as ztunnel's config_dump writes one (its `StringMatch`, externally tagged): `{"Exact": "x"}`, and
/// `{"Presence": []}` for its empty tuple variant.
#[derive(Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "StringMatchDump"))]
enum ZtunnelStringMatch<'a> {
    Exact(&'a str),
    Prefix(&'a str),
    Suffix(&'a str),
    Presence(#[cfg_attr(any(test, feature = "ts"), ts(type = "[]"))] [(); 0]),
}

fn ztunnel_strings<S: serde::Serializer>(v: &[StringMatch], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|m| match m {
        StringMatch::Exact(x) => ZtunnelStringMatch::Exact(x),
        StringMatch::Prefix(x) => ZtunnelStringMatch::Prefix(x),
        StringMatch::Suffix(x) => ZtunnelStringMatch::Suffix(x),
        StringMatch::Presence(_) => ZtunnelStringMatch::Presence([]),
    }))
}

/// As written: "10.1.2.3/8".
impl Serialize for PolicyCidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl Match {
    pub fn is_empty(&self) -> bool {
        self.empty
    }

    fn compute_empty(&mut self) {
        self.empty = self.namespaces.is_empty()
            && self.not_namespaces.is_empty()
            && self.principals.is_empty()
            && self.not_principals.is_empty()
            && self.service_accounts.is_empty()
            && self.not_service_accounts.is_empty()
            && self.source_ips.is_empty()
            && self.not_source_ips.is_empty()
            && self.destination_ips.is_empty()
            && self.not_destination_ips.is_empty()
            && self.destination_ports.is_empty()
            && self.not_destination_ports.is_empty();
    }
}

/// A policy as the dataplane holds and evaluates it (the form the control side compiled, checked), and as config_dump
/// writes it: ztunnel's `Authorization` (its keys in its order, `dryRun` always).
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "PolicyDump"))]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    pub name: String,
    pub namespace: String,
    pub scope: Scope,
    pub action: Action,
    pub rules: Vec<Vec<Vec<Match>>>,
    pub dry_run: bool,
    /// Which rules can match a connection, found without trying every rule (built from `rules`; None for a policy
    /// of few rules, which is scanned).
    #[serde(skip)]
    #[cfg_attr(any(test, feature = "ts"), ts(skip))]
    pub index: Option<Box<RuleIndex>>,
}

/// A policy's rules by what they require of a connection, so that its cost does not grow with its rule count for the
/// common matches (issue #29: a 100k-rule policy added 3 ms to every inbound connection).
///
/// A rule is indexed under a field when one of its clauses (all must hold) requires that field to be one of a set
/// of exact values: each of the clause's matches has a positive list for it made only of exact values (principals,
/// then namespaces) or ports. The connection's principal, namespace and port then name the only indexed rules that
/// can match; the others (`rest`) are always tried. Policies of few rules are not indexed: a scan is cheaper.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleIndex {
    by_principal: HashMap<String, Vec<u32>>,
    by_namespace: HashMap<String, Vec<u32>>,
    by_port: HashMap<u16, Vec<u32>>,
    rest: Vec<u32>,
}

/// Below this many rules a policy is scanned.
const INDEX_MIN_RULES: usize = 16;

enum Guard<'a> {
    Principals(Vec<&'a str>),
    Namespaces(Vec<&'a str>),
    Ports(Vec<u16>),
}

/// The exact values `pick` requires of every match of `clause`, if each has a positive list of exact values only.
fn exact_values<'a>(clause: &'a [Match], pick: impl Fn(&'a Match) -> &'a [StringMatch]) -> Option<Vec<&'a str>> {
    let mut out = Vec::new();
    for m in clause {
        let list = pick(m);
        if list.is_empty() {
            return None;
        }
        for s in list {
            match s {
                StringMatch::Exact(v) => out.push(v.as_str()),
                _ => return None,
            }
        }
    }
    Some(out)
}

fn guard(rule: &[Vec<Match>]) -> Option<Guard<'_>> {
    let clauses = || rule.iter().filter(|c| !c.is_empty());
    if let Some(v) = clauses().find_map(|c| exact_values(c, |m| &m.principals)) {
        return Some(Guard::Principals(v));
    }
    if let Some(v) = clauses().find_map(|c| exact_values(c, |m| &m.namespaces)) {
        return Some(Guard::Namespaces(v));
    }
    clauses()
        .find(|c| c.iter().all(|m| !m.destination_ports.is_empty()))
        .map(|c| Guard::Ports(c.iter().flat_map(|m| m.destination_ports.iter().copied()).collect()))
}

impl RuleIndex {
    pub fn build(rules: &[Vec<Vec<Match>>]) -> Option<Box<RuleIndex>> {
        if rules.len() < INDEX_MIN_RULES {
            return None;
        }
        let mut index = RuleIndex::default();
        for (i, rule) in rules.iter().enumerate() {
            let i = i as u32;
            let add = |list: &mut Vec<u32>| {
                if list.last() != Some(&i) {
                    list.push(i);
                }
            };
            match guard(rule) {
                Some(Guard::Principals(v)) => {
                    v.into_iter().for_each(|p| add(index.by_principal.entry(p.into()).or_default()))
                }
                Some(Guard::Namespaces(v)) => {
                    v.into_iter().for_each(|n| add(index.by_namespace.entry(n.into()).or_default()))
                }
                Some(Guard::Ports(v)) => v.into_iter().for_each(|p| add(index.by_port.entry(p).or_default())),
                None => add(&mut index.rest),
            }
        }
        Some(Box::new(index))
    }

    /// The rules that can match a connection with these principals (none for plaintext), namespace and port, in
    /// ascending order.
    pub fn candidates(&self, principals: &[String], namespace: Option<&str>, port: u16) -> Vec<u32> {
        let mut out = self.rest.clone();
        for p in principals {
            out.extend(self.by_principal.get(p.as_str()).into_iter().flatten());
        }
        out.extend(namespace.and_then(|n| self.by_namespace.get(n)).into_iter().flatten());
        out.extend(self.by_port.get(&port).into_iter().flatten());
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// Equal as written (the index is built from the rules: comparing it again would only cost a large policy twice).
impl PartialEq for Policy {
    fn eq(&self, other: &Policy) -> bool {
        self.name == other.name
            && self.namespace == other.namespace
            && self.scope == other.scope
            && self.action == other.action
            && self.dry_run == other.dry_run
            && self.rules == other.rules
    }
}

impl Eq for Policy {}

impl Policy {
    /// `namespace/name`, the key workloads use in `authorizationPolicies`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl PolicyJson {
    pub fn validate(&self) -> Result<Policy, StateError> {
        let key = format!("{}/{}", self.namespace, self.name);
        let bad = |problem: String| StateError::Invalid { what: "policy", name: key.clone(), problem };
        if self.name.is_empty() {
            return Err(bad("name is empty".into()));
        }
        let cidrs = |v: &[String]| -> Result<Vec<PolicyCidr>, StateError> {
            v.iter().map(|s| PolicyCidr::parse(s).ok_or_else(|| bad(format!("{s:?} is not a CIDR")))).collect()
        };
        let ports = |v: &[u32]| -> Result<Vec<u16>, StateError> {
            v.iter()
                .map(|p| {
                    u16::try_from(*p).ok().filter(|p| *p != 0).ok_or_else(|| bad(format!("port {p} is out of range")))
                })
                .collect()
        };
        let rules = self
            .rules
            .iter()
            .map(|rule| {
                rule.iter()
                    .map(|clause| {
                        clause
                            .iter()
                            .map(|m| {
                                let mut out = Match {
                                    namespaces: m.namespaces.clone(),
                                    not_namespaces: m.not_namespaces.clone(),
                                    principals: m.principals.clone(),
                                    not_principals: m.not_principals.clone(),
                                    service_accounts: m.service_accounts.clone(),
                                    not_service_accounts: m.not_service_accounts.clone(),
                                    source_ips: cidrs(&m.source_ips)?,
                                    not_source_ips: cidrs(&m.not_source_ips)?,
                                    destination_ips: cidrs(&m.destination_ips)?,
                                    not_destination_ips: cidrs(&m.not_destination_ips)?,
                                    destination_ports: ports(&m.destination_ports)?,
                                    not_destination_ports: ports(&m.not_destination_ports)?,
                                    empty: false,
                                };
                                out.compute_empty();
                                Ok(out)
                            })
                            .collect::<Result<Vec<_>, StateError>>()
                    })
                    .collect::<Result<Vec<_>, StateError>>()
            })
            .collect::<Result<Vec<_>, StateError>>()?;
        Ok(Policy {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            scope: self.scope,
            action: self.action,
            dry_run: self.dry_run,
            index: RuleIndex::build(&rules),
            rules,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_mask_and_contain() {
        let c = Cidr::parse("10.1.2.3/8").unwrap();
        assert_eq!(c.addr, "10.0.0.0".parse::<IpAddr>().unwrap());
        assert!(c.contains("10.200.0.1".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(!c.contains("::ffff:10.0.0.1".parse().unwrap()), "families never mix");
        assert!(Cidr::parse("10.0.0.1").unwrap().contains("10.0.0.1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains("192.0.2.1".parse().unwrap()));
        assert!(Cidr::parse("fd00::/8").unwrap().contains("fd12::1".parse().unwrap()));
        assert!(Cidr::parse("10.0.0.0/33").is_none());
        assert!(Cidr::parse("nonsense").is_none());
        let written = PolicyCidr::parse("10.1.2.3/8").unwrap();
        assert_eq!((written.to_string(), written.range), ("10.1.2.3/8".to_string(), c), "shown as written");
        assert!(written.contains("10.200.0.1".parse().unwrap()));
        assert_eq!(PolicyCidr::parse("fd00::1").unwrap().to_string(), "fd00::1/128");
    }

    /// Issue #29: a connection against a 100k-rule policy tries the one rule its principal names (and those no
    /// exact field guards), not 100k.
    #[test]
    fn a_large_policy_is_tried_by_index() {
        let exact = |v: String| StringMatch::Exact(v);
        let mut rules: Vec<Vec<Vec<Match>>> = (0..100_000)
            .map(|r| vec![vec![Match { principals: vec![exact(format!("td/ns/a/sa/s{r}"))], ..Match::default() }]])
            .collect();
        rules.push(vec![vec![Match { namespaces: vec![exact("b".into())], ..Match::default() }]]);
        rules.push(vec![vec![Match { destination_ports: vec![80], ..Match::default() }]]);
        rules.push(vec![vec![Match { namespaces: vec![StringMatch::Prefix("x".into())], ..Match::default() }]]);
        let index = RuleIndex::build(&rules).expect("indexed");
        assert_eq!(index.candidates(&["td/ns/a/sa/s77".into()], Some("a"), 443), vec![77, 100_002]);
        assert_eq!(index.candidates(&["td/ns/b/sa/s".into()], Some("b"), 80), vec![100_000, 100_001, 100_002]);
        assert_eq!(index.candidates(&[], None, 443), vec![100_002], "plaintext: only the unguarded rule");
        assert!(RuleIndex::build(&rules[..15]).is_none(), "few rules are scanned");
    }
}
