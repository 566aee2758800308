//! Authorization policies as they cross the boundary (compiled by TS: principals without `spiffe://`, CIDRs in
//! canonical form, ports as numbers) and their validated, evaluation-ready form.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::StateError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, export_to = "../../../ts/native/generated/", rename = "PolicyScope"))]
pub enum Scope {
    Global,
    Namespace,
    WorkloadSelector,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, export_to = "../../../ts/native/generated/", rename = "PolicyAction"))]
pub enum Action {
    Allow,
    Deny,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(
    test,
    derive(ts_rs::TS),
    ts(export, export_to = "../../../ts/native/generated/", rename = "NativeStringMatch")
)]
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
#[cfg_attr(test, derive(ts_rs::TS), ts(export, export_to = "../../../ts/native/generated/"))]
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
        let (ip, prefix) = match s.split_once('/') {
            Some((ip, p)) => (ip.parse::<IpAddr>().ok()?, Some(p.parse::<u8>().ok()?)),
            None => (s.parse::<IpAddr>().ok()?, None),
        };
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return None;
        }
        Some(Cidr { addr: mask(ip, prefix), prefix })
    }

    /// The range of `prefix` bits that contains `ip`.
    pub fn of(ip: IpAddr, prefix: u8) -> Cidr {
        Cidr { addr: mask(ip, prefix), prefix }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
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
#[cfg_attr(test, derive(ts_rs::TS), ts(export, export_to = "../../../ts/native/generated/", rename = "NativeMatch"))]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct MatchJson {
    #[cfg_attr(test, ts(as = "Option<Vec<StringMatch>>", optional))]
    pub namespaces: Vec<StringMatch>,
    #[cfg_attr(test, ts(as = "Option<Vec<StringMatch>>", optional))]
    pub not_namespaces: Vec<StringMatch>,
    #[cfg_attr(test, ts(as = "Option<Vec<StringMatch>>", optional))]
    pub principals: Vec<StringMatch>,
    #[cfg_attr(test, ts(as = "Option<Vec<StringMatch>>", optional))]
    pub not_principals: Vec<StringMatch>,
    #[cfg_attr(test, ts(as = "Option<Vec<ServiceAccountMatch>>", optional))]
    pub service_accounts: Vec<ServiceAccountMatch>,
    #[cfg_attr(test, ts(as = "Option<Vec<ServiceAccountMatch>>", optional))]
    pub not_service_accounts: Vec<ServiceAccountMatch>,
    #[cfg_attr(test, ts(as = "Option<Vec<String>>", optional))]
    pub source_ips: Vec<String>,
    #[cfg_attr(test, ts(as = "Option<Vec<String>>", optional))]
    pub not_source_ips: Vec<String>,
    #[cfg_attr(test, ts(as = "Option<Vec<String>>", optional))]
    pub destination_ips: Vec<String>,
    #[cfg_attr(test, ts(as = "Option<Vec<String>>", optional))]
    pub not_destination_ips: Vec<String>,
    #[cfg_attr(test, ts(as = "Option<Vec<u32>>", optional))]
    pub destination_ports: Vec<u32>,
    #[cfg_attr(test, ts(as = "Option<Vec<u32>>", optional))]
    pub not_destination_ports: Vec<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, export_to = "../../../ts/native/generated/", rename = "NativePolicy"))]
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

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Match {
    pub namespaces: Vec<StringMatch>,
    pub not_namespaces: Vec<StringMatch>,
    pub principals: Vec<StringMatch>,
    pub not_principals: Vec<StringMatch>,
    pub service_accounts: Vec<ServiceAccountMatch>,
    pub not_service_accounts: Vec<ServiceAccountMatch>,
    pub source_ips: Vec<Cidr>,
    pub not_source_ips: Vec<Cidr>,
    pub destination_ips: Vec<Cidr>,
    pub not_destination_ips: Vec<Cidr>,
    pub destination_ports: Vec<u16>,
    pub not_destination_ports: Vec<u16>,
    /// Every list empty (computed once: the evaluator asks on every connection).
    pub empty: bool,
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub name: String,
    pub namespace: String,
    pub scope: Scope,
    pub action: Action,
    pub dry_run: bool,
    pub rules: Vec<Vec<Vec<Match>>>,
}

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
        let cidrs = |v: &[String]| -> Result<Vec<Cidr>, StateError> {
            v.iter().map(|s| Cidr::parse(s).ok_or_else(|| bad(format!("{s:?} is not a CIDR")))).collect()
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
    }
}
