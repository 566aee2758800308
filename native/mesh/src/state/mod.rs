//! The dataplane's view of the mesh: workloads and services, indexed for the lookups a connection needs.
//!
//! This is the only copy of the mesh (ARCHITECTURE.md): the control side hands over batched deltas
//! (`StateDelta`, from a local config file) or still-encoded WDS resources (wds.rs), and gets back what changed
//! (`Applied`: the workload transitions it reconciles certificates and listeners from) and, for config_dump, the
//! state rendered in its own JSON shape (dump.rs). A JSON delta is validated whole and rejected whole on error, so
//! the previous state keeps serving; a WDS batch is judged resource by resource (a bad one is NACKed, the good ones
//! apply). An upsert equal to what is held changes nothing and reports nothing.
//!
//! Indexes: workloads by uid and by `(network, ip)` (several workloads may share an IP: the best one answers, the
//! others stay indexed for when it leaves; host-network workloads share the node's IP and are not indexed by it);
//! services by `namespace/hostname`, by `(network, vip)` and by CIDR VIP; service endpoints derived from each
//! workload's `services` map.

pub mod dump;
mod index;
pub mod intern;
pub mod local;
mod model;
pub mod policy;
pub mod wds;

pub use model::{
    AppTunnelProtocol, ApplicationTunnel, GatewayAddress, GatewayDestination, HealthPolicy, IpFamilies, LbMode,
    LbScope, LoadBalancer, Locality, NetworkMode, PortMap, Protocol, Service, ServiceKey, StateDelta, ValidDelta,
    Visibility, Workload, WorkloadStatus,
};

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use intern::Str;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{code}: {0}", code = crate::ErrorCode::InvalidState)]
    Json(#[from] serde_json::Error),
    /// A field of a JSON delta that cannot be read, by its path ("workloads[1].workloadIps[0]").
    #[error("{code}: {path}: {error}", code = crate::ErrorCode::InvalidState)]
    Field { path: String, error: serde_json::Error },
    #[error("{code}: {what} {name:?}: {problem}", code = crate::ErrorCode::InvalidState)]
    Invalid { what: &'static str, name: String, problem: String },
}

/// Key of an address index: (network, ip).
pub type NetworkAddr = (String, IpAddr);

/// What an Address resource name denotes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AddrKey {
    Workload(String),
    Service(ServiceKey),
}

/// A workload whose record changed: `before` None = added, `after` None = removed.
#[derive(Debug, Clone)]
pub struct Transition {
    pub uid: Str,
    pub before: Option<Arc<Workload>>,
    pub after: Option<Arc<Workload>>,
}

/// What one apply changed.
#[derive(Debug, Default)]
pub struct Applied {
    pub workloads: Vec<Transition>,
    /// Services upserted (with a change) or removed.
    pub services: usize,
    /// Policies upserted or removed.
    pub policies: usize,
    /// (workload uid, policy key) references that became unresolved with this change (`State::missing_references`).
    pub missing: Vec<(Str, Str)>,
    /// References that were unresolved before this change and are not after it: the policy arrived, or the workload
    /// no longer names it (or is gone).
    pub resolved: Vec<(Str, Str)>,
}

impl Applied {
    /// What a batch applied in parts changed, in all.
    pub fn merge(&mut self, other: Applied) {
        self.workloads.extend(other.workloads);
        self.services += other.services;
        self.policies += other.policies;
        self.missing.extend(other.missing);
        self.resolved.extend(other.resolved);
    }
}

#[derive(Default, Debug)]
pub struct State {
    workloads: HashMap<Str, Arc<Workload>>,
    /// Every (non host-network) workload with that address, in arrival order; `workload_by_addr` picks the best.
    workloads_by_addr: HashMap<NetworkAddr, Uids>,
    /// (namespace, name) → uids: how an in-pod proxy finds its workload from what istio-cni told it.
    workloads_by_name: HashMap<(Str, Str), Uids>,
    services: HashMap<ServiceKey, Arc<Service>>,
    services_by_vip: HashMap<NetworkAddr, index::Keys>,
    /// hostname → the services of that hostname (one per namespace that has it).
    services_by_hostname: HashMap<Str, index::Keys>,
    /// Services addressed by a whole range.
    services_by_cidr: index::Ranges,
    /// Bumped by every change of the services (what an answer derived from them depends on: `services_generation`).
    services_generation: u64,
    /// service key → endpoint workload uid → (service port → target port). Kept even for services that have not
    /// arrived yet (ztunnel's "staged" endpoints), so arrival order does not matter.
    endpoints: HashMap<ServiceKey, BTreeMap<Str, PortMap>>,
    policies: HashMap<String, Arc<policy::Policy>>,
    /// GLOBAL-scope policies, sorted by key.
    global_policies: Vec<Arc<policy::Policy>>,
    /// NAMESPACE-scope policies by namespace, sorted by key.
    namespace_policies: HashMap<String, Vec<Arc<policy::Policy>>>,
    /// How many policies are dry-run: per-connection dry-run reporting costs nothing when there are none.
    dry_run_policies: usize,
    /// WDS resource name → what it denotes (istiod names workloads by uid and services by namespace/hostname, but a
    /// name may be renamed in place; a removal names the resource, not the key).
    wds_names: HashMap<String, AddrKey>,
    /// The keys the last applied local config document put here (local.rs): the next document removes those it lacks.
    local_keys: local::LocalKeys,
    /// Policy references that do not resolve: policy key → the workloads naming it. Such a workload denies every
    /// inbound connection until the policy arrives (fail closed); the control side warns of each as it appears and
    /// exports the count. Kept in O(change); a batch that removes policies makes one pass over the workloads.
    missing_refs: HashMap<Str, std::collections::HashSet<Str>>,
    missing_count: usize,
}

/// Pushes onto an index list that usually holds one entry: grown one at a time (a first push would reserve four).
/// The uids an index key names: nearly always one, held inline (a one-entry Vec costs a heap allocation per key:
/// 6 MiB at 100k workloads for the two workload indexes).
type Uids = smallvec::SmallVec<[Str; 1]>;

impl State {
    /// Validate and apply (tests and small deltas; the dataplane validates outside its lock and calls
    /// `apply_valid`).
    pub fn apply(&mut self, delta: StateDelta) -> Result<Applied, StateError> {
        let mut valid = delta.validate()?;
        self.drop_unchanged(&mut valid);
        Ok(self.apply_valid(valid))
    }

    /// Turns a `full` delta into an incremental one (everything held and not upserted is removed) and drops upserts
    /// equal to what is held, so that re-evaluation and the control side only see real changes.
    pub fn drop_unchanged(&self, delta: &mut ValidDelta) {
        if delta.full {
            delta.full = false;
            let up_w: std::collections::HashSet<&str> = delta.workloads.iter().map(|w| w.uid.as_str()).collect();
            let gone_w: Vec<String> =
                self.workloads.keys().filter(|k| !up_w.contains(k.as_str())).map(|k| k.to_string()).collect();
            let up_s: std::collections::HashSet<ServiceKey> = delta.services.iter().map(|s| s.key()).collect();
            let gone_s: Vec<String> =
                self.services.keys().filter(|k| !up_s.contains(k)).map(|k| k.to_string()).collect();
            let up_p: std::collections::HashSet<String> = delta.policies.iter().map(|p| p.key()).collect();
            let gone_p: Vec<String> = self.policies.keys().filter(|k| !up_p.contains(*k)).cloned().collect();
            delta.removed_workloads.extend(gone_w);
            delta.removed_services.extend(gone_s);
            delta.removed_policies.extend(gone_p);
        }
        let removed_w: std::collections::HashSet<&str> = delta.removed_workloads.iter().map(String::as_str).collect();
        let removed_s: std::collections::HashSet<&str> = delta.removed_services.iter().map(String::as_str).collect();
        // An upsert equal to the held record is dropped, unless the same delta also removes that key.
        let keep_w: Vec<bool> = delta
            .workloads
            .iter()
            .map(|w| removed_w.contains(w.uid.as_str()) || self.workloads.get(&w.uid).is_none_or(|old| **old != *w))
            .collect();
        let keep_s: Vec<bool> = delta
            .services
            .iter()
            .map(|s| {
                removed_s.contains(s.key().to_string().as_str())
                    || self.services.get(&s.key()).is_none_or(|old| **old != *s)
            })
            .collect();
        let removed_p: std::collections::HashSet<&str> = delta.removed_policies.iter().map(String::as_str).collect();
        let keep_p: Vec<bool> = delta
            .policies
            .iter()
            .map(|p| {
                let key = p.key();
                removed_p.contains(key.as_str()) || self.policies.get(&key).is_none_or(|old| **old != *p)
            })
            .collect();
        let mut i = 0;
        delta.workloads.retain(|_| (keep_w[i], i += 1).0);
        let mut i = 0;
        delta.services.retain(|_| (keep_s[i], i += 1).0);
        let mut i = 0;
        delta.policies.retain(|_| (keep_p[i], i += 1).0);
        // A removal of a key that is not held changes nothing.
        delta.removed_workloads.retain(|uid| self.workloads.contains_key(uid.as_str()));
        delta.removed_policies.retain(|key| self.policies.contains_key(key.as_str()));
    }

    pub fn apply_valid(&mut self, delta: ValidDelta) -> Applied {
        let ValidDelta { full, workloads, removed_workloads, services, removed_services, policies, removed_policies } =
            delta;
        let mut applied = Applied::default();
        if full {
            *self = State { wds_names: std::mem::take(&mut self.wds_names), ..State::default() };
        }
        let upserted_policies: Vec<String> = policies.iter().map(|p| p.key()).collect();
        for key in &removed_policies {
            if self.remove_policy(key) {
                applied.policies += 1;
            }
        }
        for p in policies {
            self.insert_policy(p);
            applied.policies += 1;
        }
        // Removals first, then upserts: a batch may remove and re-add one key (the upsert wins). Keyed by the
        // records' own shared uids (no copy per workload: a first load changes 100k).
        let mut before: HashMap<Str, Option<Arc<Workload>>> =
            HashMap::with_capacity(removed_workloads.len() + workloads.len());
        for uid in &removed_workloads {
            if let Some(old) = self.remove_workload(uid) {
                before.entry(old.uid.clone()).or_insert(Some(old));
            }
        }
        for key in &removed_services {
            if let Some(key) = ServiceKey::parse(key) {
                if self.remove_service(&key) {
                    applied.services += 1;
                }
            }
        }
        let mut after: HashMap<Str, Arc<Workload>> = HashMap::with_capacity(workloads.len());
        for w in workloads {
            let uid = w.uid.clone();
            let (old, new) = self.insert_workload(w);
            before.entry(uid.clone()).or_insert(old);
            after.insert(uid, new);
        }
        for s in services {
            self.insert_service(s);
            applied.services += 1;
        }
        for (uid, b) in before {
            let a = after.remove(&uid);
            if let (Some(x), Some(y)) = (&b, &a) {
                if x == y {
                    continue;
                }
            }
            applied.workloads.push(Transition { uid, before: b, after: a });
        }
        (applied.missing, applied.resolved) =
            self.track_missing(&applied.workloads, &upserted_policies, &removed_policies);
        applied
    }

    /// Follows one applied change in the missing-reference index; returns the references it made missing (not those
    /// that were missing before it and still are), and those it resolved (missing before it, not after).
    #[allow(clippy::type_complexity)]
    fn track_missing(
        &mut self,
        changed: &[Transition],
        upserted: &[String],
        removed: &[String],
    ) -> (Vec<(Str, Str)>, Vec<(Str, Str)>) {
        let mut was = std::collections::HashSet::new();
        let mut now = Vec::new();
        let mut resolved = Vec::new();
        for t in changed {
            if let Some(b) = &t.before {
                for p in &b.authorization_policies {
                    if self.unmiss(p, &b.uid) {
                        was.insert((b.uid.clone(), p.clone()));
                    }
                }
            }
        }
        for key in upserted {
            if let Some((policy, uids)) = self.missing_refs.remove_entry(key.as_str()) {
                self.missing_count -= uids.len();
                resolved.extend(uids.into_iter().map(|uid| (uid, policy.clone())));
            }
        }
        let gone: std::collections::HashSet<&str> =
            removed.iter().map(String::as_str).filter(|k| !self.policies.contains_key(*k)).collect();
        let mut found: Vec<(Str, Str)> = Vec::new();
        for t in changed {
            if let Some(a) = &t.after {
                for p in &a.authorization_policies {
                    if !self.policies.contains_key(p.as_str()) {
                        found.push((a.uid.clone(), p.clone()));
                    }
                }
            }
        }
        if !gone.is_empty() {
            for w in self.workloads.values() {
                for p in &w.authorization_policies {
                    if gone.contains(p.as_str()) {
                        found.push((w.uid.clone(), p.clone()));
                    }
                }
            }
        }
        for (uid, p) in found {
            let pair = (uid.clone(), p.clone());
            if self.miss(&p, &uid) && !was.remove(&pair) {
                now.push(pair);
            } else {
                was.remove(&pair);
            }
        }
        // Missing before the change (unmissed above) and not missing again after it.
        resolved.extend(was);
        (now, resolved)
    }

    /// Records a missing reference; true if it was not recorded yet.
    fn miss(&mut self, policy: &Str, uid: &Str) -> bool {
        let added = self.missing_refs.entry(policy.clone()).or_default().insert(uid.clone());
        self.missing_count += added as usize;
        added
    }

    /// Forgets a missing reference; true if it was recorded.
    fn unmiss(&mut self, policy: &str, uid: &str) -> bool {
        let Some(uids) = self.missing_refs.get_mut(policy) else { return false };
        let gone = uids.remove(uid);
        if uids.is_empty() {
            self.missing_refs.remove(policy);
        }
        self.missing_count -= gone as usize;
        gone
    }

    /// How many (workload, policy) references do not resolve.
    pub fn missing_references(&self) -> usize {
        self.missing_count
    }

    /// The removals a local document with these keys implies: what the last applied one had and it lacks.
    pub fn local_removals(&self, next: &local::LocalKeys) -> local::LocalRemovals {
        self.local_keys.removed_by(next)
    }

    /// The keys the last applied local document put in the state (config_dump's `staticConfig`).
    pub fn local_keys(&self) -> &local::LocalKeys {
        &self.local_keys
    }

    /// Records the keys of the local document just applied.
    pub fn local_record(&mut self, keys: local::LocalKeys) {
        self.local_keys = keys;
    }

    /// The removals a WDS batch implies, beyond its upserts: the keys that `removed` names (a known name's key, else
    /// the name tried as a workload uid and as a namespace/hostname service, ztunnel's order), and the keys that an
    /// upserted name used to denote (renamed in place). A key the batch upserts is never removed.
    pub fn wds_removals(&self, upserted: &[(String, AddrKey)], removed: &[String]) -> (Vec<String>, Vec<String>) {
        let up: std::collections::HashSet<&AddrKey> = upserted.iter().map(|(_, k)| k).collect();
        let mut workloads = Vec::new();
        let mut services = Vec::new();
        let mut drop = |k: &AddrKey| {
            if up.contains(k) {
                return;
            }
            match k {
                AddrKey::Workload(uid) => workloads.push(uid.clone()),
                AddrKey::Service(key) => services.push(key.to_string()),
            }
        };
        for (name, key) in upserted {
            if let Some(old) = self.wds_names.get(name) {
                if old != key {
                    drop(old);
                }
            }
        }
        for name in removed {
            match self.wds_names.get(name) {
                Some(k) => drop(k),
                None => {
                    drop(&AddrKey::Workload(name.clone()));
                    if let Some(key) = ServiceKey::parse(name) {
                        drop(&AddrKey::Service(key));
                    }
                }
            }
        }
        (workloads, services)
    }

    /// Records what the names of an applied WDS batch denote.
    pub fn wds_record(&mut self, upserted: Vec<(String, AddrKey)>, removed: &[String]) {
        for name in removed {
            self.wds_names.remove(name);
        }
        for (name, key) in upserted {
            self.wds_names.insert(name, key);
        }
    }

    /// (what was held, what is held now).
    fn insert_workload(&mut self, w: Workload) -> (Option<Arc<Workload>>, Arc<Workload>) {
        let old = self.remove_workload(&w.uid);
        let w = Arc::new(w);
        if w.network_mode != model::NetworkMode::HostNetwork {
            for ip in &w.ips {
                self.workloads_by_addr.entry((w.network.to_string(), *ip)).or_default().push(w.uid.clone());
            }
        }
        self.workloads_by_name.entry((w.namespace.clone(), w.name.clone())).or_default().push(w.uid.clone());
        for (svc, ports) in &w.service_ports {
            self.endpoints.entry(svc.clone()).or_default().insert(w.uid.clone(), ports.clone());
        }
        self.workloads.insert(w.uid.clone(), w.clone());
        (old, w)
    }

    fn remove_workload(&mut self, uid: &str) -> Option<Arc<Workload>> {
        let old = self.workloads.remove(uid)?;
        let name_key = (old.namespace.clone(), old.name.clone());
        if let Some(uids) = self.workloads_by_name.get_mut(&name_key) {
            uids.retain(|u| &**u != uid);
            if uids.is_empty() {
                self.workloads_by_name.remove(&name_key);
            }
        }
        for ip in &old.ips {
            let key = (old.network.to_string(), *ip);
            if let Some(uids) = self.workloads_by_addr.get_mut(&key) {
                uids.retain(|u| &**u != uid);
                if uids.is_empty() {
                    self.workloads_by_addr.remove(&key);
                }
            }
        }
        for (svc, _) in &old.service_ports {
            if let Some(eps) = self.endpoints.get_mut(svc) {
                eps.remove(uid);
                if eps.is_empty() {
                    self.endpoints.remove(svc);
                }
            }
        }
        Some(old)
    }

    fn insert_service(&mut self, s: Service) {
        self.remove_service(&s.key());
        self.services_generation += 1;
        let s = Arc::new(s);
        for vip in &s.vips {
            self.services_by_vip.entry(vip.clone()).or_default().push(s.key());
        }
        self.services_by_hostname.entry(s.hostname.clone()).or_default().push(s.key());
        for (net, cidr) in &s.cidr_vips {
            self.services_by_cidr.insert(net, *cidr, s.key());
        }
        self.services.insert(s.key(), s);
    }

    fn remove_service(&mut self, key: &ServiceKey) -> bool {
        let Some(old) = self.services.remove(key) else { return false };
        self.services_generation += 1;
        for (net, cidr) in &old.cidr_vips {
            self.services_by_cidr.remove(net, *cidr, key);
        }
        if let Some(keys) = self.services_by_hostname.get_mut(&key.hostname) {
            if !keys.remove(key) {
                self.services_by_hostname.remove(&key.hostname);
            }
        }
        for vip in &old.vips {
            if let Some(keys) = self.services_by_vip.get_mut(vip) {
                if !keys.remove(key) {
                    self.services_by_vip.remove(vip);
                }
            }
        }
        true
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

    fn remove_policy(&mut self, key: &str) -> bool {
        let Some(old) = self.policies.remove(key) else { return false };
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
        true
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
        let uids = self.workloads_by_name.get(&(Str::from(namespace), Str::from(name)))?;
        let mut found =
            uids.iter().filter_map(|u| self.workloads.get(u)).filter(|w| w.service_account == service_account);
        let first = found.next()?;
        if first.node == node {
            return Some(first);
        }
        Some(found.find(|w| w.node == node).unwrap_or(first))
    }

    /// The workload at an address. When several share it, ztunnel's order decides (`WorkloadByAddr::get` in
    /// ztunnel's src/state/workload.rs): a pod tunnelling HBONE, then a pod, then an HBONE workload; among equals
    /// the one that arrived (or was last updated) last, as `max_by_key` picks.
    pub fn workload_by_addr(&self, network: &str, ip: IpAddr) -> Option<&Arc<Workload>> {
        let uids = self.workloads_by_addr.get(&(network.to_string(), ip))?;
        let rank = |w: &Workload| match (w.is_pod(), w.protocol == Protocol::Hbone) {
            (true, true) => 3,
            (true, false) => 2,
            (false, true) => 1,
            (false, false) => 0,
        };
        uids.iter().filter_map(|u| self.workloads.get(u)).max_by_key(|w| rank(w))
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
                .find(|s| s.namespace == client_ns)
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
        // The longest range that contains the IP decides (ties among its services as above).
        best(&mut self.services_by_cidr.longest(network, ip)?.iter())
    }

    pub fn service(&self, key: &ServiceKey) -> Option<&Arc<Service>> {
        self.services.get(key)
    }

    /// A service by hostname alone (an HBONE `:authority` names no namespace): the one in `prefer_ns`, else the
    /// first.
    pub fn service_by_hostname(&self, hostname: &str, prefer_ns: &str) -> Option<&Arc<Service>> {
        let keys = self.services_by_hostname.get(hostname)?;
        let host = keys.first()?.hostname.clone();
        keys.in_namespace(prefer_ns, &host).or_else(|| keys.first()).and_then(|k| self.services.get(k))
    }

    /// How many services have this hostname.
    pub fn services_by_host_len(&self, hostname: &str) -> usize {
        self.services_by_hostname.get(hostname).map_or(0, index::Keys::len)
    }

    /// A number that changes whenever a service is added, changed or removed.
    pub fn services_generation(&self) -> u64 {
        self.services_generation
    }

    /// Every service with this hostname (the DNS proxy chooses among them).
    pub fn services_by_host<'a>(&'a self, hostname: &str) -> impl Iterator<Item = &'a Arc<Service>> + 'a {
        self.services_by_hostname
            .get(hostname)
            .into_iter()
            .flat_map(index::Keys::iter)
            .filter_map(|k| self.services.get(k))
    }

    /// `uid`'s port map as an endpoint of the service `key`, if it is one.
    pub fn endpoint_ports(&self, key: &ServiceKey, uid: &str) -> Option<&PortMap> {
        self.endpoints.get(key).and_then(|eps| eps.get(uid))
    }

    /// A workload by `namespace` and `hostname` (a workload that only has a hostname). O(workloads): only for the
    /// rare waypoint or gateway named by a hostname that no service has.
    pub fn workload_by_hostname(&self, namespace: &str, hostname: &str) -> Option<&Arc<Workload>> {
        self.workloads.values().find(|w| w.hostname == hostname && w.namespace == namespace)
    }

    /// Endpoints of a service: (workload, service port → target port map of that endpoint).
    pub fn endpoints<'a>(&'a self, key: &ServiceKey) -> impl Iterator<Item = (&'a Arc<Workload>, &'a PortMap)> + 'a {
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
        StateDelta::from_json(json.as_bytes()).unwrap()
    }

    #[test]
    fn indexes_follow_upserts_and_removals() {
        let mut st = State::default();
        st.apply(delta(r#"{"full":true,"workloads":[{"uid":"w1","name":"a","namespace":"ns","workloadIps":["10.0.0.1"],"services":{"ns/svc.example":{"80":8080}}}],
            "services":[{"name":"svc","namespace":"ns","hostname":"svc.example","vips":["/10.96.0.1"],"ports":{"80":8080}}]}"#)).unwrap();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(st.workload_by_addr("", ip).unwrap().uid, "w1");
        let svc = st.service_by_vip("", "10.96.0.1".parse().unwrap(), "ns").unwrap().clone();
        assert_eq!(st.endpoints(&svc.key()).count(), 1);
        // Move the workload to another IP: the old address is forgotten.
        st.apply(delta(r#"{"workloads":[{"uid":"w1","name":"a","namespace":"ns","workloadIps":["10.0.0.2"]}]}"#))
            .unwrap();
        assert!(st.workload_by_addr("", ip).is_none());
        assert_eq!(st.endpoints(&svc.key()).count(), 0);
        st.apply(delta(r#"{"removedWorkloads":["w1"],"removedServices":["ns/svc.example"]}"#)).unwrap();
        assert_eq!(st.workload_count(), 0);
        assert_eq!(st.service_count(), 0);
    }

    #[test]
    fn values_that_end_up_in_headers_are_refused_when_the_record_is_accepted() {
        use serde_json::json;
        let refused = |delta: serde_json::Value| {
            let mut st = State::default();
            st.apply(serde_json::from_value::<StateDelta>(delta).unwrap()).unwrap_err().to_string()
        };
        let w = |field: &str, value: &str| {
            let mut w = json!({"uid": "w1", "name": "w1", "namespace": "ns", "workloadIps": ["10.0.0.1"]});
            w[field] = json!(value);
            json!({"workloads": [w]})
        };
        // A forged baggage key, a control character, a space.
        let e = refused(w("canonicalName", "app,k8s.namespace.name=kube-system"));
        assert!(e.contains(r#"workload "w1": canonicalName"#) && e.contains("cannot go into a header"), "{e}");
        assert!(refused(w("namespace", "ns\u{7}")).contains("namespace"));
        assert!(refused(w("workloadName", "my app")).contains("workloadName"));
        assert!(refused(w("clusterId", "c\"1")).contains("clusterId"));
        let svc = json!({"services": [{"name": "s", "namespace": "ns", "hostname": "s.ns;host=evil"}]});
        assert!(refused(svc).contains("hostname"));
        // What Kubernetes names and label values look like is fine.
        let mut st = State::default();
        st.apply(serde_json::from_value::<StateDelta>(w("canonicalRevision", "v1.2_rc-3")).unwrap()).unwrap();
    }

    #[test]
    fn endpoints_arriving_before_their_service_are_kept() {
        let mut st = State::default();
        st.apply(delta(r#"{"workloads":[{"uid":"w1","name":"a","namespace":"ns","workloadIps":["10.0.0.1"],"services":{"ns/svc.example":{"80":8080}}}]}"#)).unwrap();
        st.apply(delta(r#"{"services":[{"name":"svc","namespace":"ns","hostname":"svc.example","vips":["/10.96.0.1"],"ports":{"80":8080}}]}"#)).unwrap();
        let svc = st.service_by_vip("", "10.96.0.1".parse().unwrap(), "x").unwrap();
        assert_eq!(st.endpoints(&svc.key()).count(), 1);
    }

    #[test]
    fn a_bad_delta_changes_nothing() {
        let mut st = State::default();
        st.apply(delta(r#"{"workloads":[{"uid":"w1","name":"a","namespace":"ns","workloadIps":["10.0.0.1"]}]}"#))
            .unwrap();
        let err = st
            .apply(delta(
                r#"{"full":true,"workloads":[{"uid":"w2","name":"b","namespace":"ns","clusterId":"a;b","workloadIps":["10.0.0.2"]}]}"#,
            ))
            .unwrap_err();
        assert!(err.to_string().contains("w2") && err.to_string().contains("clusterId"), "{err}");
        assert!(st.workload("w1").is_some());
        assert!(st.workload("w2").is_none());
        // A value that cannot be read at all is named by its path in the delta.
        let bad =
            r#"{"workloads":[{"uid":"w1","name":"a","namespace":"ns"},{"uid":"w2","workloadIps":["10.0.0.300"]}]}"#;
        let err = StateDelta::from_json(bad.as_bytes()).unwrap_err().to_string();
        assert!(
            err.starts_with("INVALID_STATE: workloads[1].workloadIps[0]: \"10.0.0.300\" is not an IP address"),
            "{err}"
        );
        assert!(StateDelta::from_json(b"{} x").is_err(), "trailing characters");
    }
}
