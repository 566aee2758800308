//! Which mesh name a DNS question asks for, and its addresses: ztunnel's rules (its src/dns/server.rs `find_server`
//! and `get_addresses`), over the dataplane's state.
//!
//! - The question's name is tried as written, expanded to the Kubernetes FQDNs it can stand for
//!   (`<svc>` → `<svc>.<client ns>.svc.<domain>`, `<svc>.<ns>` → `<svc>.<ns>.svc.<domain>`, ...), and with each search
//!   domain of the client stripped off (and those stripped names expanded again).
//! - Each alias is tried exactly, then as wildcards of decreasing specificity (`*.example.com`, `*.com`).
//! - A service matches when the client may see it (NAMESPACE visibility hides it from other namespaces) and it has a
//!   VIP, or is a Kubernetes headless service (hostname under `.svc.<domain>`: its endpoints' addresses answer).
//! - Among several, the one in the client's namespace, then a canonical one, then PREFERED_SERVICE_NAMESPACE's,
//!   then the first.
//!
//! One deliberate difference from ztunnel: when the match came through a stripped search domain, the CNAME points
//! at the fully-qualified name that matched (`echo.default.svc.cluster.local.`), not at the stripped short name
//! (`echo.default.`), which only resolves through a search list.

use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::rr::{Name, RecordType};
use rand::seq::SliceRandom;

use crate::state::{IpFamilies, Visibility};
use crate::state::{Service, State, Workload};

/// The names a DNS proxy serves under, computed once per server.
#[derive(Debug, Clone)]
pub struct Domains {
    /// `<domain>.` (cluster.local.)
    pub domain: Name,
    /// `svc.<domain>.`
    pub svc_domain: Name,
    /// `.svc.<domain>` without the trailing dot: the suffix of Kubernetes service hostnames.
    svc_suffix: String,
    /// Search domains as written in resolv.conf (dedicated mode); `None`: the per-pod Kubernetes defaults.
    static_search: Option<Vec<Name>>,
    pub preferred_namespace: String,
    pub ipv6_enabled: bool,
}

impl Domains {
    pub fn new(
        cluster_domain: &str,
        static_search: Option<&[String]>,
        preferred_namespace: &str,
        ipv6_enabled: bool,
    ) -> Result<Domains, String> {
        let domain = fqdn(cluster_domain).map_err(|e| format!("cluster domain {cluster_domain:?}: {e}"))?;
        let svc_domain = fqdn(&format!("svc.{}", cluster_domain.trim_end_matches('.')))
            .map_err(|e| format!("cluster domain {cluster_domain:?}: {e}"))?;
        let static_search = match static_search {
            None => None,
            Some(list) => Some(
                list.iter()
                    .map(|s| fqdn(s).map_err(|e| format!("search domain {s:?}: {e}")))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Ok(Domains {
            svc_suffix: format!(".svc.{}", cluster_domain.trim_end_matches('.').to_ascii_lowercase()),
            domain,
            svc_domain,
            static_search,
            preferred_namespace: preferred_namespace.to_string(),
            ipv6_enabled,
        })
    }

    /// The search domains the client's resolver appends: in a pod, Kubernetes' `<ns>.svc.<domain>`, `svc.<domain>`,
    /// `<domain>` (ztunnel cannot read the pod's resolv.conf either).
    fn search_domains(&self, client: &Workload) -> Vec<Name> {
        if let Some(list) = &self.static_search {
            return list.clone();
        }
        let mut out = Vec::with_capacity(3);
        if let Ok(ns) = Name::from_ascii(&*client.namespace).and_then(|n| n.append_domain(&self.svc_domain)) {
            out.push(ns);
        }
        out.push(self.svc_domain.clone());
        out.push(self.domain.clone());
        out
    }

    /// Kubernetes FQDNs `name` can stand for, from the client's namespace (ztunnel's `to_kube_fqdns`).
    fn kube_fqdns(&self, name: &Name, namespaced: &Name) -> Vec<Name> {
        let ends_with_svc = |n: &Name| n.iter().next_back().is_some_and(|l| l.eq_ignore_ascii_case(b"svc"));
        let join = |d: &Name| name.clone().append_domain(d).ok();
        match name.num_labels() {
            1 => join(namespaced).into_iter().collect(),
            2 => [join(&self.svc_domain), join(namespaced)].into_iter().flatten().collect(),
            3 => {
                let mut out = Vec::new();
                if ends_with_svc(name) {
                    out.extend(join(&self.domain));
                }
                out.extend(join(&self.svc_domain));
                out
            }
            4 if ends_with_svc(name) => join(&self.domain).into_iter().collect(),
            _ => Vec::new(),
        }
    }

    /// Every alias of `name` for `client`, without repeats, in ztunnel's order.
    fn aliases(&self, client: &Workload, name: &Name) -> Vec<Alias> {
        let mut out: Vec<Alias> = Vec::new();
        let mut add = |alias: Alias| {
            if !out.iter().any(|a| a.name == alias.name) {
                out.push(alias);
            }
        };
        let name = as_fqdn(name);
        add(Alias { name: name.clone(), stripped: false });
        let namespaced = Name::from_ascii(&*client.namespace)
            .and_then(|n| n.append_domain(&self.svc_domain))
            .unwrap_or_else(|_| self.svc_domain.clone());
        for n in self.kube_fqdns(&name, &namespaced) {
            add(Alias { name: n, stripped: false });
        }
        for search in self.search_domains(client) {
            let Some(stripped) = strip_domain(&name, &search) else { continue };
            let expanded = self.kube_fqdns(&stripped, &namespaced);
            add(Alias { name: stripped, stripped: true });
            for n in expanded {
                add(Alias { name: n, stripped: true });
            }
        }
        out
    }

    fn is_kubernetes_headless(&self, s: &Service) -> bool {
        s.vips.is_empty() && s.key.hostname.to_ascii_lowercase().ends_with(&self.svc_suffix)
    }
}

#[derive(Debug, Clone)]
struct Alias {
    name: Name,
    /// Reached by stripping one of the client's search domains: the answer then carries a CNAME.
    stripped: bool,
}

/// What a question resolved to.
#[derive(Debug, PartialEq)]
pub enum Found {
    /// Records for the question (possibly none: the name exists without addresses of that family).
    Answer {
        /// `Some(target)`: the question's name is an alias of `target`, which the addresses are for.
        cname: Option<Name>,
        addresses: Vec<IpAddr>,
    },
    /// Not a mesh name: ask the upstream resolvers.
    Forward,
}

/// Resolve an A or AAAA question for `client`. Other record types are the caller's to forward.
pub fn resolve(state: &State, d: &Domains, client: &Workload, qname: &Name, qtype: RecordType) -> Found {
    let Some((service, alias, wildcard)) = find(state, d, client, qname) else { return Found::Forward };
    let v6 = qtype == RecordType::AAAA;
    let family_allowed = (d.ipv6_enabled || !v6)
        && !matches!((service.ip_families, v6), (Some(IpFamilies::IPv4), true) | (Some(IpFamilies::IPv6), false));
    let cname = (alias.stripped && !wildcard).then(|| alias.name.clone());
    if !family_allowed {
        return Found::Answer { cname, addresses: Vec::new() };
    }
    let of_family = |ip: &IpAddr| ip.is_ipv6() == v6;
    let mut addresses: Vec<IpAddr> = if service.vips.is_empty() {
        // Headless: each endpoint's first address of the family.
        state.endpoints(&service.key).filter_map(|(w, _)| w.ips.iter().copied().find(of_family)).collect()
    } else {
        service.vips.iter().filter(|(net, ip)| *net == *client.network && of_family(ip)).map(|(_, ip)| *ip).collect()
    };
    addresses.shuffle(&mut rand::rng());
    Found::Answer { cname, addresses }
}

fn find<'s>(state: &'s State, d: &Domains, client: &Workload, qname: &Name) -> Option<(&'s Arc<Service>, Alias, bool)> {
    for alias in d.aliases(client, qname) {
        for (i, candidate) in wildcards(&alias.name).into_iter().enumerate() {
            let key = host_key(&candidate);
            let found: Vec<&Arc<Service>> = state
                .services_by_host(&key)
                .filter(|s| s.visibility == Visibility::Public || *s.key.namespace == *client.namespace)
                .filter(|s| !s.vips.is_empty() || d.is_kubernetes_headless(s))
                .collect();
            let best = found
                .iter()
                .find(|s| *s.key.namespace == *client.namespace)
                .or_else(|| found.iter().find(|s| s.canonical))
                .or_else(|| {
                    found
                        .iter()
                        .find(|s| !d.preferred_namespace.is_empty() && *s.key.namespace == *d.preferred_namespace)
                })
                .or_else(|| found.first());
            if let Some(s) = best {
                return Some((s, alias, i > 0));
            }
        }
    }
    None
}

/// `www.example.com.` → [`www.example.com.`, `*.example.com.`, `*.com.`].
fn wildcards(name: &Name) -> Vec<Name> {
    let mut out = vec![name.clone()];
    let mut n = name.clone();
    while n.num_labels() > 1 {
        out.push(n.clone().into_wildcard());
        n = n.base_name();
    }
    out
}

/// The state's hostname key: lowercase, no trailing dot.
fn host_key(name: &Name) -> String {
    let mut s = name.to_lowercase().to_ascii();
    if s.ends_with('.') {
        s.pop();
    }
    s
}

fn fqdn(s: &str) -> Result<Name, String> {
    let mut n = Name::from_ascii(s).map_err(|e| e.to_string())?;
    n.set_fqdn(true);
    Ok(n)
}

fn as_fqdn(n: &Name) -> Name {
    let mut n = n.clone();
    n.set_fqdn(true);
    n
}

/// `name` without the trailing `domain`, when `name` has at least one label more (case-insensitive).
fn strip_domain(name: &Name, domain: &Name) -> Option<Name> {
    let (n, d) = (name.num_labels(), domain.num_labels());
    if n <= d || !domain.zone_of(name) {
        return None;
    }
    let mut stripped = Name::from_labels(name.iter().take((n - d) as usize)).ok()?;
    stripped.set_fqdn(true);
    Some(stripped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    #[test]
    fn wildcards_go_from_specific_to_general() {
        let got: Vec<String> = wildcards(&n("www.example.com.")).iter().map(|x| x.to_ascii()).collect();
        assert_eq!(got, ["www.example.com.", "*.example.com.", "*.com."]);
    }

    #[test]
    fn stripping_keeps_the_question_case() {
        let s = strip_domain(&n("Echo.Default.svc.cluster.local."), &n("default.svc.cluster.local.")).unwrap();
        assert_eq!(s.to_ascii(), "Echo.");
        assert!(strip_domain(&n("svc.cluster.local."), &n("svc.cluster.local.")).is_none());
        assert!(strip_domain(&n("a.example.com."), &n("svc.cluster.local.")).is_none());
    }

    #[test]
    fn kube_fqdns_follow_the_label_count() {
        let d = Domains::new("cluster.local", None, "", true).unwrap();
        let ns = n("ns1.svc.cluster.local.");
        let s = |v: Vec<Name>| v.iter().map(|x| x.to_ascii()).collect::<Vec<_>>();
        assert_eq!(s(d.kube_fqdns(&n("name."), &ns)), ["name.ns1.svc.cluster.local."]);
        assert_eq!(
            s(d.kube_fqdns(&n("name.ns2."), &ns)),
            ["name.ns2.svc.cluster.local.", "name.ns2.ns1.svc.cluster.local."]
        );
        assert_eq!(
            s(d.kube_fqdns(&n("name.ns2.svc."), &ns)),
            ["name.ns2.svc.cluster.local.", "name.ns2.svc.svc.cluster.local."]
        );
        assert_eq!(s(d.kube_fqdns(&n("pod.sub.ns.svc."), &ns)), ["pod.sub.ns.svc.cluster.local."]);
        assert!(d.kube_fqdns(&n("pod.sub.ns.not-svc."), &ns).is_empty());
        assert!(d.kube_fqdns(&n("name.ns2.svc.cluster.local."), &ns).is_empty());
    }
}
