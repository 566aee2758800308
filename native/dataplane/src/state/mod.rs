//! The dataplane's view of the mesh: workloads and services, indexed for the lookups a connection needs.
//!
//! TS converts wire or file formats into this model and hands it over as batched deltas (`StateDelta`); this
//! module validates what it cannot trust the boundary for (IP syntax, port numbers) and rejects the whole delta
//! on error, so the previous state keeps serving.
//!
//! Indexes: workloads by uid and by `(network, ip)` (several workloads may share an IP: the best one answers, the
//! others stay indexed for when it leaves; host-network workloads share the node's IP and are not indexed by it);
//! services by `namespace/hostname`, by `(network, vip)` and by CIDR VIP; service endpoints derived from each
//! workload's `services` map.

mod model;
pub mod policy;

pub use model::{
    AppTunnelProtocol, ApplicationTunnel, GatewayAddress, GatewayDestination, HealthPolicy, IpFamilies, LbMode,
    LbScope, LoadBalancer, Locality, NetworkMode, Protocol, Service, ServiceKey, StateDelta, ValidDelta, Visibility,
    Workload, WorkloadStatus,
};

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("INVALID_STATE: {0}")]
    Json(#[from] serde_json::Error),
    #[error("INVALID_STATE: {what} {name:?}: {problem}")]
    Invalid { what: &'static str, name: String, problem: String },
}

/// Key of an address index: (network, ip).
pub type NetworkAddr = (String, IpAddr);

#[derive(Default, Debug)]
pub struct State {
    workloads: HashMap<String, Arc<Workload>>,
    /// Every (non host-network) workload with that address, in arrival order; `workload_by_addr` picks the best.
    workloads_by_addr: HashMap<NetworkAddr, Vec<String>>,
    /// (namespace, name) → uids: how an in-pod proxy finds its workload from what istio-cni told it.
    workloads_by_name: HashMap<(String, String), Vec<String>>,
    services: HashMap<ServiceKey, Arc<Service>>,
    services_by_vip: HashMap<NetworkAddr, Vec<ServiceKey>>,
    /// hostname → the services of that hostname (one per namespace that has it).
    services_by_hostname: HashMap<String, Vec<ServiceKey>>,
    /// Services addressed by a whole range, longest prefix first.
    services_by_cidr: Vec<(String, policy::Cidr, ServiceKey)>,
    /// service key → endpoint workload uid → (service port → target port). Kept even for services that have not
    /// arrived yet (ztunnel's "staged" endpoints), so arrival order does not matter.
    endpoints: HashMap<ServiceKey, BTreeMap<String, HashMap<u16, u16>>>,
    policies: HashMap<String, Arc<policy::Policy>>,
    /// GLOBAL-scope policies, sorted by key.
    global_policies: Vec<Arc<policy::Policy>>,
    /// NAMESPACE-scope policies by namespace, sorted by key.
    namespace_policies: HashMap<String, Vec<Arc<policy::Policy>>>,
    /// How many policies are dry-run: per-connection dry-run reporting costs nothing when there are none.
    dry_run_policies: usize,
}

impl State {
    /// Validate and apply (tests and small deltas; the dataplane validates outside its lock and calls
    /// `apply_valid`).
    pub fn apply(&mut self, delta: StateDelta) -> Result<(), StateError> {
        self.apply_valid(delta.validate()?);
        Ok(())
    }

    pub fn apply_valid(&mut self, delta: ValidDelta) {
        let ValidDelta { full, workloads, removed_workloads, services, removed_services, policies, removed_policies } =
            delta;
        if full {
            *self = State::default();
        }
        for key in &removed_policies {
            self.remove_policy(key);
        }
        for p in policies {
            self.insert_policy(p);
        }
        for uid in &removed_workloads {
            self.remove_workload(uid);
        }
        for key in &removed_services {
            if let Some(key) = ServiceKey::parse(key) {
                self.remove_service(&key);
            }
        }
        for w in workloads {
            self.insert_workload(w);
        }
        for s in services {
            self.insert_service(s);
        }
    }

    fn insert_workload(&mut self, w: Workload) {
        self.remove_workload(&w.uid);
        let w = Arc::new(w);
        if w.network_mode != model::NetworkMode::HostNetwork {
            for ip in &w.ips {
                self.workloads_by_addr.entry((w.network.clone(), *ip)).or_default().push(w.uid.clone());
            }
        }
        self.workloads_by_name.entry((w.namespace.clone(), w.name.clone())).or_default().push(w.uid.clone());
        for (svc, ports) in &w.service_ports {
            self.endpoints.entry(svc.clone()).or_default().insert(w.uid.clone(), ports.clone());
        }
        self.workloads.insert(w.uid.clone(), w);
    }

    fn remove_workload(&mut self, uid: &str) {
        let Some(old) = self.workloads.remove(uid) else { return };
        let name_key = (old.namespace.clone(), old.name.clone());
        if let Some(uids) = self.workloads_by_name.get_mut(&name_key) {
            uids.retain(|u| u != uid);
            if uids.is_empty() {
                self.workloads_by_name.remove(&name_key);
            }
        }
        for ip in &old.ips {
            let key = (old.network.clone(), *ip);
            if let Some(uids) = self.workloads_by_addr.get_mut(&key) {
                uids.retain(|u| u != uid);
                if uids.is_empty() {
                    self.workloads_by_addr.remove(&key);
                }
            }
        }
        for svc in old.service_ports.keys() {
            if let Some(eps) = self.endpoints.get_mut(svc) {
                eps.remove(uid);
                if eps.is_empty() {
                    self.endpoints.remove(svc);
                }
            }
        }
    }

    fn insert_service(&mut self, s: Service) {
        self.remove_service(&s.key);
        let s = Arc::new(s);
        for vip in &s.vips {
            self.services_by_vip.entry(vip.clone()).or_default().push(s.key.clone());
        }
        self.services_by_hostname.entry(s.key.hostname.clone()).or_default().push(s.key.clone());
        for (net, cidr) in &s.cidr_vips {
            let at = self.services_by_cidr.partition_point(|(_, c, _)| c.prefix >= cidr.prefix);
            self.services_by_cidr.insert(at, (net.clone(), *cidr, s.key.clone()));
        }
        self.services.insert(s.key.clone(), s);
    }

    fn remove_service(&mut self, key: &ServiceKey) {
        let Some(old) = self.services.remove(key) else { return };
        if !old.cidr_vips.is_empty() {
            self.services_by_cidr.retain(|(_, _, k)| k != key);
        }
        if let Some(keys) = self.services_by_hostname.get_mut(&key.hostname) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.services_by_hostname.remove(&key.hostname);
            }
        }
        for vip in &old.vips {
            if let Some(keys) = self.services_by_vip.get_mut(vip) {
                keys.retain(|k| k != key);
                if keys.is_empty() {
                    self.services_by_vip.remove(vip);
                }
            }
        }
    }

    fn insert_policy(&mut self, p: policy::Policy) {
        let key = p.key();
        self.remove_policy(&key);
        let p = Arc::new(p);
        if p.dry_run {
            self.dry_run_policies += 1;
        }
        let insert_sorted = |v: &mut Vec<Arc<policy::Policy>>, p: Arc<policy::Policy>| {
            let at = v.partition_point(|x| x.key() < p.key());
            v.insert(at, p);
        };
        match p.scope {
            policy::Scope::Global => insert_sorted(&mut self.global_policies, p.clone()),
            policy::Scope::Namespace => {
                insert_sorted(self.namespace_policies.entry(p.namespace.clone()).or_default(), p.clone())
            }
            policy::Scope::WorkloadSelector => {}
        }
        self.policies.insert(key, p);
    }

    fn remove_policy(&mut self, key: &str) {
        let Some(old) = self.policies.remove(key) else { return };
        if old.dry_run {
            self.dry_run_policies -= 1;
        }
        match old.scope {
            policy::Scope::Global => self.global_policies.retain(|p| !Arc::ptr_eq(p, &old)),
            policy::Scope::Namespace => {
                if let Some(v) = self.namespace_policies.get_mut(&old.namespace) {
                    v.retain(|p| !Arc::ptr_eq(p, &old));
                    if v.is_empty() {
                        self.namespace_policies.remove(&old.namespace);
                    }
                }
            }
            policy::Scope::WorkloadSelector => {}
        }
    }

    pub fn policy(&self, key: &str) -> Option<&Arc<policy::Policy>> {
        self.policies.get(key)
    }

    pub fn global_policies(&self) -> &[Arc<policy::Policy>] {
        &self.global_policies
    }

    pub fn namespace_policies(&self, namespace: &str) -> &[Arc<policy::Policy>] {
        self.namespace_policies.get(namespace).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn has_dry_run_policies(&self) -> bool {
        self.dry_run_policies > 0
    }

    pub fn policy_count(&self) -> usize {
        self.policies.len()
    }

    pub fn workload(&self, uid: &str) -> Option<&Arc<Workload>> {
        self.workloads.get(uid)
    }

    /// The workload a pod proxy serves: same namespace, name and service account, preferring one on `node`.
    pub fn workload_by_name(
        &self,
        namespace: &str,
        name: &str,
        service_account: &str,
        node: &str,
    ) -> Option<&Arc<Workload>> {
        let uids = self.workloads_by_name.get(&(namespace.to_string(), name.to_string()))?;
        let mut found =
            uids.iter().filter_map(|u| self.workloads.get(u)).filter(|w| w.service_account == service_account);
        let first = found.next()?;
        if first.node == node {
            return Some(first);
        }
        Some(found.find(|w| w.node == node).unwrap_or(first))
    }

    /// The workload at an address. When several share it, ztunnel's order decides: a pod tunnelling HBONE, then a
    /// pod, then an HBONE workload, then the first to arrive.
    pub fn workload_by_addr(&self, network: &str, ip: IpAddr) -> Option<&Arc<Workload>> {
        let uids = self.workloads_by_addr.get(&(network.to_string(), ip))?;
        let rank = |w: &Workload| match (w.is_pod(), w.protocol == Protocol::Hbone) {
            (true, true) => 0,
            (true, false) => 1,
            (false, true) => 2,
            (false, false) => 3,
        };
        uids.iter().filter_map(|u| self.workloads.get(u)).min_by_key(|w| rank(w))
    }

    /// The service behind a VIP (exact, else the longest CIDR VIP that contains it), as a client in `client_ns`
    /// sees it: services visible only in their namespace are hidden from others; among several, the one in the
    /// client's namespace, then a canonical one, then the first.
    pub fn service_by_vip(&self, network: &str, ip: IpAddr, client_ns: &str) -> Option<&Arc<Service>> {
        let visible = |k: &ServiceKey| {
            self.services.get(k).filter(|s| s.visibility == model::Visibility::Public || k.namespace == client_ns)
        };
        let best = |keys: &mut dyn Iterator<Item = &ServiceKey>| {
            let found: Vec<&Arc<Service>> = keys.filter_map(visible).collect();
            found
                .iter()
                .find(|s| s.key.namespace == client_ns)
                .or_else(|| found.iter().find(|s| s.canonical))
                .or_else(|| found.first())
                .copied()
        };
        if let Some(keys) = self.services_by_vip.get(&(network.to_string(), ip)) {
            if let Some(s) = best(&mut keys.iter()) {
                return Some(s);
            }
        }
        if self.services_by_cidr.is_empty() {
            return None;
        }
        // Longest prefix first: the first range that contains the IP decides (ties among equal prefixes as above).
        let hit = self.services_by_cidr.iter().find(|(net, c, _)| net == network && c.contains(ip))?;
        let prefix = hit.1.prefix;
        best(
            &mut self
                .services_by_cidr
                .iter()
                .filter(|(net, c, _)| net == network && c.prefix == prefix && c.contains(ip))
                .map(|(_, _, k)| k),
        )
    }

    pub fn service(&self, key: &ServiceKey) -> Option<&Arc<Service>> {
        self.services.get(key)
    }

    /// A service by hostname alone (an HBONE `:authority` names no namespace): the one in `prefer_ns`, else the
    /// first.
    pub fn service_by_hostname(&self, hostname: &str, prefer_ns: &str) -> Option<&Arc<Service>> {
        let keys = self.services_by_hostname.get(hostname)?;
        keys.iter().find(|k| k.namespace == prefer_ns).or_else(|| keys.first()).and_then(|k| self.services.get(k))
    }

    /// `uid`'s port map as an endpoint of the service `key`, if it is one.
    pub fn endpoint_ports(&self, key: &ServiceKey, uid: &str) -> Option<&HashMap<u16, u16>> {
        self.endpoints.get(key).and_then(|eps| eps.get(uid))
    }

    /// A workload by `namespace` and `hostname` (a workload that only has a hostname). O(workloads): only for the
    /// rare waypoint or gateway named by a hostname that no service has.
    pub fn workload_by_hostname(&self, namespace: &str, hostname: &str) -> Option<&Arc<Workload>> {
        self.workloads.values().find(|w| w.hostname == hostname && w.namespace == namespace)
    }

    /// Endpoints of a service: (workload, service port → target port map of that endpoint).
    pub fn endpoints<'a>(
        &'a self,
        key: &ServiceKey,
    ) -> impl Iterator<Item = (&'a Arc<Workload>, &'a HashMap<u16, u16>)> + 'a {
        self.endpoints
            .get(key)
            .into_iter()
            .flat_map(|eps| eps.iter())
            .filter_map(|(uid, ports)| self.workloads.get(uid).map(|w| (w, ports)))
    }

    pub fn workload_count(&self) -> usize {
        self.workloads.len()
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(json: &str) -> StateDelta {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn indexes_follow_upserts_and_removals() {
        let mut st = State::default();
        st.apply(delta(r#"{"full":true,"workloads":[{"uid":"w1","name":"a","namespace":"ns","workloadIps":["10.0.0.1"],"services":{"ns/svc.example":{"80":8080}}}],
            "services":[{"name":"svc","namespace":"ns","hostname":"svc.example","vips":["/10.96.0.1"],"ports":{"80":8080}}]}"#)).unwrap();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(st.workload_by_addr("", ip).unwrap().uid, "w1");
        let svc = st.service_by_vip("", "10.96.0.1".parse().unwrap(), "ns").unwrap().clone();
        assert_eq!(st.endpoints(&svc.key).count(), 1);
        // Move the workload to another IP: the old address is forgotten.
        st.apply(delta(r#"{"workloads":[{"uid":"w1","name":"a","namespace":"ns","workloadIps":["10.0.0.2"]}]}"#))
            .unwrap();
        assert!(st.workload_by_addr("", ip).is_none());
        assert_eq!(st.endpoints(&svc.key).count(), 0);
        st.apply(delta(r#"{"removedWorkloads":["w1"],"removedServices":["ns/svc.example"]}"#)).unwrap();
        assert_eq!(st.workload_count(), 0);
        assert_eq!(st.service_count(), 0);
    }

    #[test]
    fn endpoints_arriving_before_their_service_are_kept() {
        let mut st = State::default();
        st.apply(delta(r#"{"workloads":[{"uid":"w1","name":"a","namespace":"ns","workloadIps":["10.0.0.1"],"services":{"ns/svc.example":{"80":8080}}}]}"#)).unwrap();
        st.apply(delta(r#"{"services":[{"name":"svc","namespace":"ns","hostname":"svc.example","vips":["/10.96.0.1"],"ports":{"80":8080}}]}"#)).unwrap();
        let svc = st.service_by_vip("", "10.96.0.1".parse().unwrap(), "x").unwrap();
        assert_eq!(st.endpoints(&svc.key).count(), 1);
    }

    #[test]
    fn a_bad_delta_changes_nothing() {
        let mut st = State::default();
        st.apply(delta(r#"{"workloads":[{"uid":"w1","name":"a","namespace":"ns","workloadIps":["10.0.0.1"]}]}"#))
            .unwrap();
        let err = st
            .apply(delta(
                r#"{"full":true,"workloads":[{"uid":"w2","name":"b","namespace":"ns","workloadIps":["10.0.0.300"]}]}"#,
            ))
            .unwrap_err();
        assert!(err.to_string().contains("w2"), "{err}");
        assert!(st.workload("w1").is_some());
        assert!(st.workload("w2").is_none());
    }
}
