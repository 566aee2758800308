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
//! - Where ztunnel has a TODO (it forwards them): a pod of a Kubernetes headless service by its DNS name,
//!   `<pod>.<service>.<ns>.svc.<domain>` (Kubernetes' name for a pod whose subdomain is the service, as a
//!   StatefulSet's are), answers that endpoint's addresses. The first label is matched, case-insensitively, against
//!   the names of the service's endpoint workloads (the pod name, which is the hostname Kubernetes gives unless the
//!   pod sets `spec.hostname`: WDS does not carry that one, so a name matching no endpoint is forwarded).
//! - Beyond ztunnel: SRV questions for a mesh service's name are answered from its ports (`resolve_srv`): one
//!   record per port, the target the service's name (its VIPs in the additional section), or, for a Kubernetes
//!   headless service, each endpoint's pod name under the service (its addresses and target ports). Names of the
//!   form `_<port-name>._<proto>.<name>` are forwarded: WDS carries no port names.
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
    /// The service chosen for hostnames many services share (`Memo`).
    memo: Arc<Memo>,
}

/// Services sharing a hostname past this many are chosen once per client namespace and remembered (`Memo`).
const MEMO_FROM: usize = 32;
/// (hostname, client namespace) choices remembered per server.
const MEMO_ENTRIES: usize = 256;

/// The service chosen for a hostname that many services share, per client namespace, valid while the state's
/// services are unchanged (`State::services_generation`). Choosing walks them all: a question for a hostname of
/// 100k services cost 13.6 ms of CPU each time (issue 29; 37.5 ms measured here, release build, for 100k services
/// each visible only in its own namespace); now that is the first question after a change, the next cost 9 µs.
#[derive(Debug)]
struct Memo(parking_lot::Mutex<lru::LruCache<MemoKey, (u64, Option<crate::state::ServiceKey>)>>);

/// (hostname, client namespace).
type MemoKey = (String, crate::state::intern::Str);

impl Default for Memo {
    fn default() -> Memo {
        Memo(parking_lot::Mutex::new(lru::LruCache::new(std::num::NonZeroUsize::new(MEMO_ENTRIES).expect("non-zero"))))
    }
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
            memo: Arc::default(),
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
        s.vips.is_empty() && s.hostname.to_ascii_lowercase().ends_with(&self.svc_suffix)
    }
}

#[derive(Debug, Clone)]
struct Alias {
    name: Name,
    /// Reached by stripping one of the client's search domains: the answer then carries a CNAME.
    stripped: bool,
}

/// What a name found: a service, or pods of a headless service by their own name.
enum Target<'s> {
    Service(&'s Arc<Service>),
    Pods(&'s Arc<Service>, Vec<&'s Arc<Workload>>),
}

impl<'s> Target<'s> {
    fn service(&self) -> &'s Arc<Service> {
        match self {
            Target::Service(s) | Target::Pods(s, _) => s,
        }
    }
}

/// One SRV answer: the records (port, target) and the addresses of their targets.
#[derive(Debug, PartialEq)]
pub struct Srv {
    /// `Some(target)`: the question's name is an alias of `target`, which the records are for.
    pub cname: Option<Name>,
    /// (port, target), in answer order.
    pub records: Vec<(u16, Name)>,
    /// The targets' addresses (the additional section).
    pub additional: Vec<(Name, IpAddr)>,
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
    let Some((target, alias, wildcard)) = find(state, d, client, qname) else { return Found::Forward };
    let service = target.service();
    let v6 = qtype == RecordType::AAAA;
    let cname = (alias.stripped && !wildcard).then(|| alias.name.clone());
    if !family_allowed(d, service, v6) {
        return Found::Answer { cname, addresses: Vec::new() };
    }
    let of_family = |ip: &IpAddr| ip.is_ipv6() == v6;
    let mut addresses: Vec<IpAddr> = match &target {
        // A pod by its name: its addresses of the family.
        Target::Pods(_, pods) => pods.iter().flat_map(|w| w.ips.iter().copied().filter(of_family)).collect(),
        // Headless: each endpoint's first address of the family.
        Target::Service(s) if s.vips.is_empty() => {
            state.endpoints(&s.key()).filter_map(|(w, _)| w.ips.iter().copied().find(of_family)).collect()
        }
        Target::Service(s) => {
            s.vips.iter().filter(|(net, ip)| *net == *client.network && of_family(ip)).map(|(_, ip)| *ip).collect()
        }
    };
    addresses.shuffle(&mut rand::rng());
    Found::Answer { cname, addresses }
}

/// Whether the service answers questions of that family (IPV6_ENABLED and its IP families).
fn family_allowed(d: &Domains, service: &Service, v6: bool) -> bool {
    (d.ipv6_enabled || !v6)
        && !matches!((service.ip_families, v6), (Some(IpFamilies::IPv4), true) | (Some(IpFamilies::IPv6), false))
}

/// Resolve an SRV question for `client` from a mesh service's ports (see the module's notes); None: forward it.
pub fn resolve_srv(state: &State, d: &Domains, client: &Workload, qname: &Name) -> Option<Srv> {
    if qname.iter().next().is_some_and(|l| l.starts_with(b"_")) {
        return None; // `_<port-name>._<proto>.`: no port names in the mesh's state
    }
    let (Target::Service(service), alias, wildcard) = find(state, d, client, qname)? else { return None };
    let cname = (alias.stripped && !wildcard).then(|| alias.name.clone());
    let mut ports: Vec<(u16, u16)> = service.ports.iter().map(|(p, t)| (*p, *t)).collect();
    ports.sort_unstable();
    let usable = |ip: &IpAddr| family_allowed(d, service, ip.is_ipv6());
    let mut records = Vec::new();
    let mut additional = Vec::new();
    if service.vips.is_empty() {
        // Kubernetes headless: each endpoint by its pod name under the service, at the port it listens on.
        let mut endpoints: Vec<_> = state.endpoints(&service.key()).collect();
        endpoints.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        for (w, ep_ports) in endpoints {
            let Some(target) = pod_name(w, &service.hostname) else { continue };
            let ips: Vec<IpAddr> = w.ips.iter().copied().filter(usable).collect();
            if ips.is_empty() {
                continue;
            }
            for (port, svc_target) in &ports {
                let p = ep_ports.get(port).copied().filter(|p| *p != 0).unwrap_or(if *svc_target != 0 {
                    *svc_target
                } else {
                    *port
                });
                records.push((p, target.clone()));
            }
            additional.extend(ips.into_iter().map(|ip| (target.clone(), ip)));
        }
    } else {
        let target = fqdn(&service.hostname).ok()?;
        records.extend(ports.iter().map(|(port, _)| (*port, target.clone())));
        additional.extend(
            service
                .vips
                .iter()
                .filter(|(net, ip)| *net == *client.network && usable(ip))
                .map(|(_, ip)| (target.clone(), *ip)),
        );
    }
    Some(Srv { cname, records, additional })
}

/// `<pod>.<service host>.`, when the workload's name is a DNS label.
fn pod_name(w: &Workload, host: &str) -> Option<Name> {
    let label = w.name.to_ascii_lowercase();
    let ok = !label.is_empty()
        && label.len() <= 63
        && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-');
    ok.then(|| fqdn(&format!("{label}.{host}")).ok()).flatten()
}

fn find<'s>(state: &'s State, d: &Domains, client: &Workload, qname: &Name) -> Option<(Target<'s>, Alias, bool)> {
    for alias in d.aliases(client, qname) {
        for (i, candidate) in wildcards(&alias.name).into_iter().enumerate() {
            if let Some(s) = best_service(state, d, client, &host_key(&candidate)) {
                return Some((Target::Service(s), alias, i > 0));
            }
            if i == 0 {
                if let Some(pods) = headless_pods(state, d, client, &alias.name) {
                    return Some((pods, alias, false));
                }
            }
        }
    }
    None
}

/// The service the client means by the hostname `key`: ztunnel's choice among those it may see (remembered for a
/// hostname many services share: `Memo`).
fn best_service<'s>(state: &'s State, d: &Domains, client: &Workload, key: &str) -> Option<&'s Arc<Service>> {
    if state.services_by_host_len(key) <= MEMO_FROM {
        return choose_service(state, d, client, key);
    }
    let generation = state.services_generation();
    let at = (key.to_string(), client.namespace.clone());
    if let Some((g, chosen)) = d.memo.0.lock().get(&at) {
        if *g == generation {
            return chosen.as_ref().and_then(|k| state.service(k));
        }
    }
    let chosen = choose_service(state, d, client, key);
    d.memo.0.lock().put(at, (generation, chosen.map(|s| s.key())));
    chosen
}

fn choose_service<'s>(state: &'s State, d: &Domains, client: &Workload, key: &str) -> Option<&'s Arc<Service>> {
    let found: Vec<&Arc<Service>> = state
        .services_by_host(key)
        .filter(|s| s.visibility == Visibility::Public || *s.namespace == *client.namespace)
        .filter(|s| !s.vips.is_empty() || d.is_kubernetes_headless(s))
        .collect();
    found
        .iter()
        .find(|s| *s.namespace == *client.namespace)
        .or_else(|| found.iter().find(|s| s.canonical))
        .or_else(|| found.iter().find(|s| !d.preferred_namespace.is_empty() && *s.namespace == *d.preferred_namespace))
        .or_else(|| found.first())
        .copied()
}

/// `<pod>.<service>.<ns>.svc.<domain>.`: the endpoints of that headless service named `<pod>`.
fn headless_pods<'s>(state: &'s State, d: &Domains, client: &Workload, name: &Name) -> Option<Target<'s>> {
    if name.num_labels() != d.svc_domain.num_labels() + 3 || !d.svc_domain.zone_of(name) {
        return None;
    }
    let pod = name.iter().next()?;
    let service = best_service(state, d, client, &host_key(&name.base_name())).filter(|s| s.vips.is_empty())?;
    let pods: Vec<&Arc<Workload>> = state
        .endpoints(&service.key())
        .map(|(w, _)| w)
        .filter(|w| w.name.as_bytes().eq_ignore_ascii_case(pod))
        .collect();
    (!pods.is_empty()).then_some(Target::Pods(service, pods))
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

    /// `web` (headless, Kubernetes) with pods web-0 and web-1, `api` with a VIP and two ports, a client in `default`.
    fn mesh() -> (State, Arc<Workload>) {
        use crate::state::StateDelta;
        let mut st = State::default();
        let delta = serde_json::json!({
            "workloads": [
                {"uid": "c", "name": "client", "namespace": "default", "workloadIps": ["10.0.0.1"]},
                {"uid": "w0", "name": "web-0", "namespace": "default", "workloadIps": ["10.0.1.10", "fd00::10"],
                 "services": {"default/web.default.svc.cluster.local": {"80": 8080}}},
                {"uid": "w1", "name": "Web-1", "namespace": "default", "workloadIps": ["10.0.1.11"],
                 "services": {"default/web.default.svc.cluster.local": {"80": 8081}}}
            ],
            "services": [
                {"name": "web", "namespace": "default", "hostname": "web.default.svc.cluster.local", "ports": {"80": 8080}},
                {"name": "api", "namespace": "default", "hostname": "api.default.svc.cluster.local",
                 "vips": ["/10.96.0.5"], "ports": {"443": 8443, "80": 8080}}
            ]
        });
        st.apply(serde_json::from_value::<StateDelta>(delta).unwrap()).unwrap();
        let client = st.workload("c").unwrap().clone();
        (st, client)
    }

    /// A hostname of 200 services (one per namespace, only its own namespace may see each but the last): the choice is
    /// remembered per client namespace and made again when the services change.
    #[test]
    fn a_hostname_many_services_share_is_chosen_once_per_change() {
        use crate::state::StateDelta;
        let mut st = State::default();
        let mut services: Vec<serde_json::Value> = (0..200)
            .map(|i| {
                serde_json::json!({"name": "s", "namespace": format!("ns{i}"), "hostname": "shared.example.com",
                 "vips": [format!("/10.97.{}.{}", i / 200, i % 200 + 1)], "ports": {"80": 80}, "visibility": "Namespace"})
            })
            .collect();
        services.push(serde_json::json!({"name": "s", "namespace": "public", "hostname": "shared.example.com",
            "vips": ["/10.98.0.1"], "ports": {"80": 80}}));
        let delta = serde_json::json!({
            "workloads": [{"uid": "c", "name": "client", "namespace": "elsewhere", "workloadIps": ["10.0.0.1"]},
                          {"uid": "c7", "name": "client", "namespace": "ns7", "workloadIps": ["10.0.0.2"]}],
            "services": services,
        });
        st.apply(serde_json::from_value::<StateDelta>(delta).unwrap()).unwrap();
        let d = Domains::new("cluster.local", None, "", true).unwrap();
        let ask = |st: &State, uid: &str| match resolve(
            st,
            &d,
            st.workload(uid).unwrap(),
            &n("shared.example.com."),
            RecordType::A,
        ) {
            Found::Answer { addresses, .. } => addresses.iter().map(|i| i.to_string()).collect::<Vec<_>>(),
            Found::Forward => vec!["forwarded".into()],
        };
        assert_eq!(ask(&st, "c"), ["10.98.0.1"], "the one it may see");
        assert_eq!(ask(&st, "c7"), ["10.97.0.8"], "its own namespace's");
        assert_eq!(d.memo.0.lock().len(), 2, "both remembered");
        assert_eq!(ask(&st, "c"), ["10.98.0.1"], "remembered");
        // The public one goes: the next question chooses again.
        st.apply(
            serde_json::from_value::<StateDelta>(serde_json::json!({"removedServices": ["public/shared.example.com"]}))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(ask(&st, "c"), ["forwarded"], "nothing it may see: not a mesh name for it");
        assert_eq!(ask(&st, "c7"), ["10.97.0.8"]);
    }

    #[test]
    fn a_headless_service_s_pods_answer_by_their_own_names() {
        let (st, client) = mesh();
        let d = Domains::new("cluster.local", None, "", true).unwrap();
        let a = |q: &str, t| resolve(&st, &d, &client, &n(q), t);
        let ips = |f: Found| match f {
            Found::Answer { addresses, .. } => addresses.iter().map(|i| i.to_string()).collect::<Vec<_>>(),
            Found::Forward => vec!["forwarded".into()],
        };
        assert_eq!(ips(a("web-0.web.default.svc.cluster.local.", RecordType::A)), ["10.0.1.10"]);
        assert_eq!(ips(a("web-0.web.default.svc.cluster.local.", RecordType::AAAA)), ["fd00::10"]);
        assert_eq!(ips(a("WEB-1.web.default.svc.cluster.local.", RecordType::A)), ["10.0.1.11"], "case-insensitive");
        // The short forms a pod's search list makes of it.
        assert_eq!(ips(a("web-0.web.default.", RecordType::A)), ["10.0.1.10"]);
        assert_eq!(ips(a("web-0.web.", RecordType::A)), ["10.0.1.10"]);
        // No such endpoint (a pod with its own spec.hostname?), or a service with a VIP: forwarded.
        assert_eq!(ips(a("web-9.web.default.svc.cluster.local.", RecordType::A)), ["forwarded"]);
        assert_eq!(ips(a("x.api.default.svc.cluster.local.", RecordType::A)), ["forwarded"]);
    }

    #[test]
    fn srv_answers_a_service_s_ports_and_a_headless_one_s_pods() {
        let (st, client) = mesh();
        let d = Domains::new("cluster.local", None, "", true).unwrap();
        let srv = |q: &str| resolve_srv(&st, &d, &client, &n(q));
        let api = srv("api.default.svc.cluster.local.").unwrap();
        let records: Vec<(u16, String)> = api.records.iter().map(|(p, t)| (*p, t.to_ascii())).collect();
        assert_eq!(
            records,
            [(80, "api.default.svc.cluster.local.".into()), (443, "api.default.svc.cluster.local.".into())]
        );
        assert_eq!(api.additional.iter().map(|(_, ip)| ip.to_string()).collect::<Vec<_>>(), ["10.96.0.5"]);
        // A short name expands without a CNAME; through a search domain the resolver appended, a CNAME to the full name.
        assert_eq!(srv("api.").unwrap().records, api.records);
        let searched = srv("api.default.default.svc.cluster.local.").unwrap();
        assert_eq!(searched.cname.map(|c| c.to_ascii()), Some("api.default.svc.cluster.local.".into()));
        // Headless: each pod under the service, at its own target port, its addresses beside.
        let web = srv("web.default.svc.cluster.local.").unwrap();
        let records: Vec<(u16, String)> = web.records.iter().map(|(p, t)| (*p, t.to_ascii())).collect();
        assert_eq!(
            records,
            [
                (8081, "web-1.web.default.svc.cluster.local.".into()),
                (8080, "web-0.web.default.svc.cluster.local.".into())
            ]
        );
        assert_eq!(web.additional.len(), 3);
        // Port names are not in the mesh's state; other names are not the mesh's.
        assert!(srv("_http._tcp.api.default.svc.cluster.local.").is_none());
        assert!(srv("example.com.").is_none());
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
