//! Workload identities: SPIFFE IDs (Istio's format), trust domains and their aliases, and reading the identity a
//! certificate carries. The keys and certificates behind them are the dataplane's (its `identity` module).

use std::fmt;
use std::str::FromStr;

/// `spiffe://<trust_domain>/ns/<namespace>/sa/<service_account>`, exactly (Istio's format).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("not a SPIFFE identity (want spiffe://<td>/ns/<ns>/sa/<sa>): {0:?}")]
    NotSpiffe(String),
}

const SPIFFE_PREFIX: &str = "spiffe://";

impl FromStr for Identity {
    type Err = IdentityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || IdentityError::NotSpiffe(s.to_string());
        let rest = s.strip_prefix(SPIFFE_PREFIX).ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [td, "ns", ns, "sa", sa] if !td.is_empty() && !ns.is_empty() && !sa.is_empty() => Ok(Identity {
                trust_domain: td.to_string(),
                namespace: ns.to_string(),
                service_account: sa.to_string(),
            }),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SPIFFE_PREFIX}{}/ns/{}/sa/{}", self.trust_domain, self.namespace, self.service_account)
    }
}

impl Identity {
    pub fn new(trust_domain: &str, namespace: &str, service_account: &str) -> Identity {
        Identity {
            trust_domain: trust_domain.to_string(),
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
        }
    }
}

/// Istio's name for "the local trust domain" in policies: a principal written in it stands for the local trust domain
/// and its aliases (Istio's `trustdomain.Bundle`, which expands such principals for Envoy).
const CLUSTER_LOCAL: &str = "cluster.local";

/// The trust domains accepted as aliases of each local workload's own (`TRUST_DOMAINS`, as istio/ztunnel#2092
/// proposes it). Empty, the default: a peer must be in the workload's own trust domain, and a principal matches only
/// as written (ztunnel's behaviour). Otherwise, with `S` = the workload's own trust domain and the aliases:
/// - a peer whose trust domain is in `S` is accepted, inbound (a client) and outbound (a server whose namespace and
///   service account are an expected identity's, in a trust domain of `S`);
/// - a principal written in a trust domain of `S`, or in `cluster.local`, matches such a peer in any trust domain of
///   `S` (Istio's `trustDomainAliases` for sidecars); one in another trust domain matches only as written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustDomains {
    aliases: std::sync::Arc<[String]>,
}

impl TrustDomains {
    pub fn new(aliases: Vec<String>) -> TrustDomains {
        let mut aliases = aliases;
        aliases.sort();
        aliases.dedup();
        TrustDomains { aliases: aliases.into() }
    }

    pub fn is_empty(&self) -> bool {
        self.aliases.is_empty()
    }

    pub fn aliases(&self) -> &[String] {
        &self.aliases
    }

    /// Whether `peer` is `own` or one of its aliases.
    pub fn accepts(&self, own: &str, peer: &str) -> bool {
        peer == own || self.aliases.iter().any(|a| a == peer)
    }

    /// `id` written in each other trust domain a principal may name it by (see the type), without `spiffe://`;
    /// nothing when there are no aliases or `id` is not in `own`'s set.
    pub fn alias_principals(&self, own: &str, id: &Identity) -> Vec<String> {
        if self.is_empty() || !self.accepts(own, &id.trust_domain) {
            return Vec::new();
        }
        let mut domains: Vec<&str> = std::iter::once(own)
            .chain(self.aliases.iter().map(String::as_str))
            .chain(std::iter::once(CLUSTER_LOCAL))
            .filter(|d| *d != id.trust_domain)
            .collect();
        domains.sort_unstable();
        domains.dedup();
        domains.into_iter().map(|d| format!("{d}/ns/{}/sa/{}", id.namespace, id.service_account)).collect()
    }
}

/// The URI SANs of a DER certificate, in order. Errors only if the certificate does not parse.
pub fn uri_sans(der: &[u8]) -> Result<Vec<String>, String> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| format!("certificate does not parse: {e}"))?;
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::URI(uri) = name {
                out.push(uri.to_string());
            }
        }
    }
    Ok(out)
}

/// The single SPIFFE identity of a certificate. Istio takes the first URI SAN that parses; we refuse a
/// certificate with more than one SPIFFE SAN instead: with two, a trust-domain check could pass on one SAN while
/// authorization looks at the other.
pub fn spiffe_identity(der: &[u8]) -> Result<Identity, String> {
    let ids: Vec<Identity> = uri_sans(der)?.iter().filter_map(|s| s.parse::<Identity>().ok()).collect();
    match ids.len() {
        0 => Err("certificate has no SPIFFE URI SAN".into()),
        1 => Ok(ids.into_iter().next().expect("one element")),
        n => Err(format!("certificate has {n} SPIFFE URI SANs; exactly one is allowed")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_istio_spiffe_ids() {
        let id: Identity = "spiffe://cluster.local/ns/default/sa/sleep".parse().unwrap();
        assert_eq!(id, Identity::new("cluster.local", "default", "sleep"));
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/default/sa/sleep");
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            "spiffe://",
            "spiffe://cluster.local",
            "spiffe://cluster.local/ns/default",
            "spiffe://cluster.local/ns/default/sa",
            "spiffe://cluster.local/ns/default/sa/",
            "spiffe://cluster.local/ns//sa/x",
            "spiffe:///ns/a/sa/b",
            "spiffe://cluster.local/ns/a/sa/b/extra",
            "spiffe://cluster.local/sa/a/ns/b",
            "http://cluster.local/ns/a/sa/b",
            "cluster.local/ns/a/sa/b",
        ] {
            assert!(bad.parse::<Identity>().is_err(), "{bad:?} should not parse");
        }
    }
}
