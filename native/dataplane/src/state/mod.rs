//! The dataplane's view of the mesh: workloads and services, indexed for the lookups a connection needs.
//!
//! TS converts wire or file formats into this model and hands it over as batched deltas (`StateDelta`); this
//! module validates what it cannot trust the boundary for (IP syntax, port numbers) and rejects the whole delta
//! on error, so the previous state keeps serving.
//!
//! Indexes: workloads by uid and by `(network, ip)`; services by `namespace/hostname` and by `(network, vip)`;
//! service endpoints derived from each workload's `services` map.

mod model;

pub use model::{Locality, Protocol, Service, ServiceKey, StateDelta, Workload, WorkloadStatus};

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
    workloads_by_addr: HashMap<NetworkAddr, String>,
    services: HashMap<ServiceKey, Arc<Service>>,
    services_by_vip: HashMap<NetworkAddr, Vec<ServiceKey>>,
    /// service key → endpoint workload uid → (service port → target port). Kept even for services that have not
    /// arrived yet (ztunnel's "staged" endpoints), so arrival order does not matter.
    endpoints: HashMap<ServiceKey, BTreeMap<String, HashMap<u16, u16>>>,
}

impl State {
    pub fn apply(&mut self, delta: StateDelta) -> Result<(), StateError> {
        let (workloads, services) = delta.validate()?;
        if delta.full {
            *self = State::default();
        }
        for uid in &delta.removed_workloads {
            self.remove_workload(uid);
        }
        for key in &delta.removed_services {
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
        Ok(())
    }

    fn insert_workload(&mut self, w: Workload) {
        self.remove_workload(&w.uid);
        let w = Arc::new(w);
        for ip in &w.ips {
            self.workloads_by_addr.insert((w.network.clone(), *ip), w.uid.clone());
        }
        for (svc, ports) in &w.service_ports {
            self.endpoints.entry(svc.clone()).or_default().insert(w.uid.clone(), ports.clone());
        }
        self.workloads.insert(w.uid.clone(), w);
    }

    fn remove_workload(&mut self, uid: &str) {
        let Some(old) = self.workloads.remove(uid) else { return };
        for ip in &old.ips {
            let key = (old.network.clone(), *ip);
            if self.workloads_by_addr.get(&key).map(String::as_str) == Some(uid) {
                self.workloads_by_addr.remove(&key);
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
        self.services.insert(s.key.clone(), s);
    }

    fn remove_service(&mut self, key: &ServiceKey) {
        let Some(old) = self.services.remove(key) else { return };
        for vip in &old.vips {
            if let Some(keys) = self.services_by_vip.get_mut(vip) {
                keys.retain(|k| k != key);
                if keys.is_empty() {
                    self.services_by_vip.remove(vip);
                }
            }
        }
    }

    pub fn workload(&self, uid: &str) -> Option<&Arc<Workload>> {
        self.workloads.get(uid)
    }

    pub fn workload_by_addr(&self, network: &str, ip: IpAddr) -> Option<&Arc<Workload>> {
        self.workloads_by_addr.get(&(network.to_string(), ip)).and_then(|uid| self.workloads.get(uid))
    }

    /// The service behind a VIP. Several services may share a VIP; like ztunnel, prefer the one in the client's
    /// namespace, then the first.
    pub fn service_by_vip(&self, network: &str, ip: IpAddr, client_ns: &str) -> Option<&Arc<Service>> {
        let keys = self.services_by_vip.get(&(network.to_string(), ip))?;
        keys.iter().find(|k| k.namespace == client_ns).or_else(|| keys.first()).and_then(|k| self.services.get(k))
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
