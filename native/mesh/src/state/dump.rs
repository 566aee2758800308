//! The mesh state written out: config_dump's `workloads`, `services`, `policies` and `stagedServices` (ztunnel's keys, in
//! ztunnel's order, with ztunnel's omissions of default values), and the whole workload records a state change hands
//! back to the control side (the same shape as the `Workload` it sends: `WorkloadFull`). The dataplane's state is the only
//! copy of the mesh (ARCHITECTURE.md), so this is the one place it is written out.

use std::collections::BTreeMap;

use serde::Serialize;

use super::model::{PortsJson, Service, ServiceKey, Workload, WorkloadStatus};
use super::policy::Policy;
use super::State;

/// A workload in the form it is read in (a JSON delta, the local file): the record's keys, then `capacity` and
/// `services` as "namespace/hostname" → { service port: target }. What a state change hands back to the control
/// side (whole records), and the workloads of config_dump's `staticConfig` (ztunnel's LocalWorkload: its Workload's
/// keys, then `services`).
#[derive(Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "Workload"))]
pub struct WorkloadFull<'a> {
    #[serde(flatten)]
    #[cfg_attr(any(test, feature = "ts"), ts(flatten))]
    record: &'a Workload,
    capacity: u32,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "BTreeMap<String, BTreeMap<String, u16>>"))]
    services: BTreeMap<String, PortsJson<'a>>,
}

pub fn workload(w: &Workload) -> WorkloadFull<'_> {
    WorkloadFull {
        record: w,
        capacity: w.capacity,
        services: w.service_ports.iter().map(|(k, m)| (k.to_string(), PortsJson::of(m.iter()))).collect(),
    }
}

/// A workload as config_dump shows it: ztunnel's keys in ztunnel's order, and ztunnel's omissions (a key whose value
/// is its default is left out: no waypoint, empty strings and lists, default locality, `nativeTunnel` false), so
/// `istioctl ztunnel-config` and a diff against ztunnel's dump see the same document. `services` is the list of
/// "namespace/hostname" the workload is an endpoint of (its port maps are in each service's `endpoints`).
#[derive(Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "WorkloadDump"))]
pub struct WorkloadDumpOut<'a> {
    #[serde(flatten)]
    #[cfg_attr(any(test, feature = "ts"), ts(flatten))]
    record: &'a Workload,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(optional, as = "Option<Vec<String>>"))]
    services: Vec<String>,
    capacity: u32,
}

pub fn workload_dump(w: &Workload) -> WorkloadDumpOut<'_> {
    let mut services: Vec<String> = w.service_ports.iter().map(|(k, _)| k.to_string()).collect();
    services.sort();
    WorkloadDumpOut { record: w, services, capacity: w.capacity }
}

/// One endpoint of a service, keyed by workload uid in `endpoints` and `stagedServices`.
#[derive(Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "EndpointDump"))]
#[serde(rename_all = "camelCase")]
pub struct EndpointOut<'a> {
    workload_uid: &'a str,
    /// "<service port>" → target port
    #[cfg_attr(any(test, feature = "ts"), ts(as = "BTreeMap<String, u16>"))]
    port: PortsJson<'a>,
    status: WorkloadStatus,
}

/// A service as config_dump shows it: the record (its keys, order and omissions, `Service`) with its endpoints in the
/// state, by workload uid, where ztunnel puts them: after `ports`.
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export))]
pub struct ServiceDump<'a> {
    #[cfg_attr(any(test, feature = "ts"), ts(flatten))]
    service: &'a Service,
    /// By workload uid.
    #[cfg_attr(any(test, feature = "ts"), ts(rename = "endpoints"))]
    endpoints: BTreeMap<&'a str, EndpointOut<'a>>,
}

impl Serialize for ServiceDump<'_> {
    /// The record's own serialization with `"endpoints"` put in after `ports` (always written: the key after it,
    /// `subjectAltNames`, is always written too). The record is written by serde_json, in which a `"` inside a string
    /// is always escaped, so the first `,"subjectAltNames":` is the key.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        let record = serde_json::to_string(self.service).map_err(S::Error::custom)?;
        let endpoints = serde_json::to_string(&self.endpoints).map_err(S::Error::custom)?;
        const AFTER: &str = ",\"subjectAltNames\":";
        let at = record.find(AFTER).ok_or_else(|| S::Error::custom("a service record without subjectAltNames"))?;
        let text = format!("{},\"endpoints\":{endpoints}{}", &record[..at], &record[at..]);
        serde_json::value::RawValue::from_string(text).map_err(S::Error::custom)?.serialize(s)
    }
}

fn endpoints<'a>(st: &'a State, key: &ServiceKey) -> BTreeMap<&'a str, EndpointOut<'a>> {
    st.endpoints(key)
        .map(|(w, p)| (&*w.uid, EndpointOut { workload_uid: &w.uid, port: PortsJson::of(p.iter()), status: w.status }))
        .collect()
}

/// A service with its endpoints in `st` (none without a state: `staticConfig`'s, as ztunnel shows a local service).
pub fn service<'a>(st: Option<&'a State>, s: &'a Service) -> ServiceDump<'a> {
    ServiceDump { service: s, endpoints: st.map(|st| endpoints(st, &s.key())).unwrap_or_default() }
}

/// Policies sorted by key ("namespace/name").
fn policies<'a>(all: impl Iterator<Item = &'a Policy>) -> Vec<&'a Policy> {
    let mut ps: Vec<&Policy> = all.collect();
    ps.sort_by(|a, b| a.namespace.cmp(&b.namespace).then_with(|| a.name.cmp(&b.name)));
    ps
}

/// config_dump's mesh part: `{ workloads, services, policies, stagedServices }`. Workloads sorted by uid, services by hostname
/// then namespace; staged services are endpoints naming a service the state does not have (yet).
#[derive(Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase")]
pub struct MeshDump<'a> {
    workloads: Vec<WorkloadDumpOut<'a>>,
    services: Vec<ServiceDump<'a>>,
    /// Sorted by "namespace/name".
    policies: Vec<&'a Policy>,
    /// "namespace/hostname" → endpoints by workload uid.
    staged_services: BTreeMap<String, BTreeMap<&'a str, EndpointOut<'a>>>,
}

pub fn mesh(st: &State) -> MeshDump<'_> {
    let mut ws: Vec<&Workload> = st.workloads.values().map(|w| w.as_ref()).collect();
    ws.sort_by(|a, b| a.uid.cmp(&b.uid));
    let mut ss: Vec<&Service> = st.services.values().map(|s| s.as_ref()).collect();
    ss.sort_by(|a, b| a.hostname.cmp(&b.hostname).then_with(|| a.namespace.cmp(&b.namespace)));
    let staged = st
        .endpoints
        .keys()
        .filter(|k| !st.services.contains_key(*k))
        .map(|k| (k.to_string(), endpoints(st, k)))
        .filter(|(_, eps)| !eps.is_empty())
        .collect();
    MeshDump {
        workloads: ws.into_iter().map(workload_dump).collect(),
        services: ss.into_iter().map(|s| service(Some(st), s)).collect(),
        policies: policies(st.policies.values().map(|p| p.as_ref())),
        staged_services: staged,
    }
}

/// `staticConfig`, as ztunnel shows its local config: the last applied local document's workloads (by uid),
/// policies (by key) and services (by hostname, then namespace), as the dataplane holds them. A record an xDS source
/// has since replaced under the same key shows as it is now.
#[derive(Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export))]
pub struct LocalDump<'a> {
    workloads: Vec<WorkloadFull<'a>>,
    policies: Vec<&'a Policy>,
    services: Vec<ServiceDump<'a>>,
}

pub fn local(st: &State) -> LocalDump<'_> {
    let keys = st.local_keys();
    let mut ws: Vec<&Workload> =
        keys.workloads.iter().filter_map(|u| st.workloads.get(u)).map(|w| w.as_ref()).collect();
    ws.sort_by(|a, b| a.uid.cmp(&b.uid));
    let mut ss: Vec<&Service> = keys.services.iter().filter_map(|k| st.services.get(k)).map(|s| s.as_ref()).collect();
    ss.sort_by(|a, b| a.hostname.cmp(&b.hostname).then_with(|| a.namespace.cmp(&b.namespace)));
    LocalDump {
        workloads: ws.into_iter().map(workload).collect(),
        policies: policies(keys.policies.iter().filter_map(|k| st.policies.get(k)).map(|p| p.as_ref())),
        services: ss.into_iter().map(|s| service(None, s)).collect(),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "WorkloadTransition"))]
pub struct TransitionOut<'a> {
    uid: &'a str,
    /// null: added.
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<WorkloadFull<'static>>"))]
    before: Option<WorkloadFull<'a>>,
    /// null: removed.
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<WorkloadFull<'static>>"))]
    after: Option<WorkloadFull<'a>>,
}

/// A (workload, policy) reference that became unresolved, or resolved.
#[derive(Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "MissingReference"))]
pub struct MissingOut<'a> {
    uid: &'a str,
    policy: &'a str,
}

/// What one apply changed, for the control side: the transitions of workloads on this node (before or after: the
/// local-workload reconciler's input), how many workloads changed in all, the policy references it made missing
/// (warned of) and how many are missing in all, and the state's sizes. For a WDS batch, also the
/// (name, version) of each resource that applied and "<name>: <reason>" of each that did not.
#[derive(Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase")]
pub struct AppliedOut<'a> {
    /// Workloads whose record changed and that are (or were) on this node, whole.
    workloads: Vec<TransitionOut<'a>>,
    /// Workloads whose record changed, on this node or not.
    changed_workloads: usize,
    services: usize,
    policies: usize,
    /// [workloads, services, policies] held after the change.
    counts: [usize; 3],
    /// The (workload, policy) references this change made unresolved: such a workload denies every inbound
    /// connection until the policy arrives (fail closed).
    missing: Vec<MissingOut<'a>>,
    /// The references this change resolved (missing before it, not after): the policy arrived, or the workload no
    /// longer names it.
    resolved: Vec<MissingOut<'a>>,
    /// How many (workload, policy) references are unresolved after the change.
    missing_references: usize,
    /// WDS batches: [name, version] of each resource that applied.
    accepted: Vec<(String, String)>,
    /// WDS batches: "<name>: <reason>" of each resource refused (NACKed; its previous version keeps serving).
    rejected: Vec<String>,
}

pub fn applied<'a>(
    a: &'a super::Applied,
    node: &str,
    accepted: Vec<(String, String)>,
    rejected: Vec<String>,
    counts: [usize; 3],
    missing_references: usize,
) -> AppliedOut<'a> {
    let local = |w: &Option<std::sync::Arc<Workload>>| w.as_ref().is_some_and(|w| !node.is_empty() && w.node == node);
    let workloads = a
        .workloads
        .iter()
        .filter(|t| local(&t.before) || local(&t.after))
        .map(|t| TransitionOut {
            uid: &t.uid,
            before: t.before.as_deref().map(workload),
            after: t.after.as_deref().map(workload),
        })
        .collect();
    AppliedOut {
        missing: a.missing.iter().map(|(uid, policy)| MissingOut { uid, policy }).collect(),
        resolved: a.resolved.iter().map(|(uid, policy)| MissingOut { uid, policy }).collect(),
        missing_references,
        workloads,
        changed_workloads: a.workloads.len(),
        services: a.services,
        policies: a.policies,
        counts,
        accepted,
        rejected,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    /// A record with every field set to something other than its default.
    fn full() -> Value {
        json!({
            "uid": "c1//Pod/ns1/a", "name": "a", "namespace": "ns1", "serviceAccount": "sa", "trustDomain": "td",
            "workloadIps": ["10.0.0.1", "fd00::1"], "network": "net1", "protocol": "HBONE", "node": "n1",
            "status": "Unhealthy", "capacity": 3, "canonicalName": "app", "canonicalRevision": "v2",
            "workloadName": "app-v2", "workloadType": "pod", "clusterId": "c1",
            "locality": {"region": "r", "zone": "z", "subzone": "s"},
            "services": {"ns1/svc.ns1.svc.cluster.local": {"80": 8080}},
            "authorizationPolicies": ["ns1/p"], "hostname": "a.example", "networkMode": "HostNetwork",
            "waypoint": {"destination": "net1/10.0.0.9", "hboneMtlsPort": 15008},
            "networkGateway": {"destination": "ns1/gw.example", "hboneMtlsPort": 15009},
            "applicationTunnel": {"protocol": "PROXY", "port": 15088}, "nativeTunnel": true,
        })
    }

    /// One record type reads a workload and writes it back: a record with every field set comes back as it was
    /// sent (the hand-back and staticConfig form, `WorkloadFull`), whose keys are the generated TypeScript
    /// `Workload`'s; a record of defaults comes back with ztunnel's omissions, its defaults filled in.
    #[test]
    fn a_workload_handed_back_has_the_keys_and_values_it_was_sent_with() {
        let w = serde_json::from_value::<Workload>(full()).unwrap().validate().unwrap();
        let back = serde_json::to_value(workload(&w)).unwrap();
        assert_eq!(back, full(), "every value comes back as it was sent");
        let text = serde_json::to_string(&workload(&w)).unwrap();
        let at = |k: &str| text.find(&format!("\"{k}\":")).unwrap_or_else(|| panic!("{k} in {text}"));
        let order = [
            "uid",
            "workloadIps",
            "waypoint",
            "networkGateway",
            "protocol",
            "networkMode",
            "name",
            "namespace",
            "trustDomain",
            "serviceAccount",
            "network",
            "workloadName",
            "workloadType",
            "canonicalName",
            "canonicalRevision",
            "hostname",
            "node",
            "nativeTunnel",
            "applicationTunnel",
            "authorizationPolicies",
            "status",
            "clusterId",
            "locality",
            "capacity",
            "services",
        ];
        assert!(
            order.windows(2).all(|k| at(k[0]) < at(k[1])),
            "ztunnel's order (its LocalWorkload: the record, then services): {text}"
        );
        let least: Workload = serde_json::from_value(json!({"uid": "u", "name": "a", "namespace": "ns"})).unwrap();
        let back = serde_json::to_value(workload(&least.validate().unwrap())).unwrap();
        assert_eq!(
            back,
            json!({
                "uid": "u", "workloadIps": [], "protocol": "TCP", "networkMode": "Standard", "name": "a",
                "namespace": "ns", "trustDomain": "cluster.local", "serviceAccount": "default",
                "workloadType": "deployment", "status": "Healthy", "clusterId": "", "capacity": 1, "services": {},
            })
        );
        let dumped = serde_json::to_value(workload_dump(&w)).unwrap();
        assert_eq!(dumped["services"], json!(["ns1/svc.ns1.svc.cluster.local"]), "config_dump lists the keys");
        let text = serde_json::to_string(&workload_dump(&w)).unwrap();
        assert!(text.find("\"services\":") < text.find("\"capacity\":") && text.ends_with("\"capacity\":3}"), "{text}");
    }

    #[test]
    fn a_bad_workload_field_is_refused_with_its_problem() {
        let bad = |patch: Value| {
            let mut v = full();
            v.as_object_mut().unwrap().extend(patch.as_object().unwrap().clone());
            serde_json::from_value::<Workload>(v)
                .map_err(|e| e.to_string())
                .and_then(|w| w.validate().map(|_| ()).map_err(|e| e.to_string()))
        };
        assert!(bad(json!({"workloadIps": ["10.0.0.300"]}))
            .unwrap_err()
            .contains("\"10.0.0.300\" is not an IP address"));
        let e = bad(json!({"waypoint": {"destination": "nowhere", "hboneMtlsPort": 0}})).unwrap_err();
        assert!(e.contains("\"nowhere\" is not <network>/<ip> or <namespace>/<hostname>"), "{e}");
        let e = bad(json!({"services": {"nohost": {"80": 8080}}})).unwrap_err();
        assert!(e.contains("\"nohost\" is not <namespace>/<hostname>"), "{e}");
        let e = bad(json!({"services": {"ns/h": {"80": 70000}}})).unwrap_err();
        assert!(e.contains("70000 is not a port (0-65535)"), "{e}");
        let e = bad(json!({"bogus": 1})).unwrap_err();
        assert!(e.contains("unknown field `bogus`"), "a record's keys are its own: {e}");
        let e = bad(json!({"clusterId": "a,b"})).unwrap_err();
        assert!(e.contains("c1//Pod/ns1/a") && e.contains("clusterId"), "{e}");
        assert_eq!(bad(json!({"waypoint": null, "capacity": null})), Ok(()));
    }

    fn compiled(name: &str, rules: Value) -> Value {
        json!({"name": name, "namespace": "ns", "scope": "Namespace", "action": "Allow", "rules": rules})
    }

    /// config_dump's `policies` are written from the state (the compiled form the control side sent), as ztunnel's
    /// serde writes its `Authorization`: externally tagged string matches (`Presence` an empty list), its keys in
    /// its order, empty lists left out, CIDRs as written, `dryRun` always; sorted by key.
    #[test]
    fn policies_are_dumped_from_the_state_as_ztunnel_writes_them() {
        let mut st = State::default();
        let rules = json!([[[{
            "destinationPorts": [8080], "principals": [{"exact": "td/ns/a/sa/b"}, {"presence": true}],
            "notSourceIps": ["10.1.2.3/8"], "serviceAccounts": [{"namespace": "a", "serviceAccount": "b"}],
            "namespaces": [{"suffix": "x"}], "notNamespaces": [],
        }], []]]);
        let delta = json!({"policies": [compiled("z", json!([])), compiled("a", rules)]});
        st.apply(serde_json::from_value(delta).unwrap()).unwrap();
        let dumped = serde_json::to_string(&mesh(&st).policies).unwrap();
        assert_eq!(
            dumped,
            concat!(
                r#"[{"name":"a","namespace":"ns","scope":"Namespace","action":"Allow","rules":[[[{"namespaces":[{"Suffix":"x"}],"#,
                r#""serviceAccounts":[{"namespace":"a","serviceAccount":"b"}],"principals":[{"Exact":"td/ns/a/sa/b"},{"Presence":[]}],"#,
                r#""notSourceIps":["10.1.2.3/8"],"destinationPorts":[8080]}],[]]],"dryRun":false},"#,
                r#"{"name":"z","namespace":"ns","scope":"Namespace","action":"Allow","rules":[],"dryRun":false}]"#,
            )
        );
    }

    /// A service as ztunnel's config_dump writes it (istio/ztunnel src/state/service.rs): its keys in order, the
    /// endpoints after `ports` (put there even when a string of the record reads like the key that follows), port
    /// maps in ascending port order, `canonical` always.
    #[test]
    fn a_service_is_dumped_with_its_endpoints_where_ztunnel_puts_them() {
        let mut st = State::default();
        let delta = json!({
            "services": [{"name": "x\",\"subjectAltNames\":[]", "namespace": "ns", "hostname": "h",
                          "vips": ["/10.0.0.1"], "ports": {"1000": 0, "443": 8443, "80": 8080}}],
            "workloads": [{"uid": "w", "name": "w", "namespace": "ns", "services": {"ns/h": {"1000": 1, "80": 8080}}}],
        });
        st.apply(serde_json::from_value(delta).unwrap()).unwrap();
        assert_eq!(
            serde_json::to_string(&mesh(&st).services).unwrap(),
            concat!(
                r#"[{"name":"x\",\"subjectAltNames\":[]","namespace":"ns","hostname":"h","vips":["/10.0.0.1"],"#,
                r#""ports":{"80":8080,"443":8443,"1000":0},"endpoints":{"w":{"workloadUid":"w","port":{"80":8080,"1000":1},"#,
                r#""status":"Healthy"}},"subjectAltNames":[],"canonical":false,"visibility":"Public"}]"#,
            )
        );
    }

    /// The state drops a policy upsert equal to what it holds and a removal of a policy it does not hold: neither
    /// changes anything, so neither reaches re-evaluation or the control side's counts.
    #[test]
    fn a_policy_sent_again_unchanged_changes_nothing() {
        let mut st = State::default();
        let delta = |v: Value| serde_json::from_value(v).unwrap();
        let p = compiled("p", json!([[[{"destinationPorts": [80]}]]]));
        assert_eq!(st.apply(delta(json!({"policies": [p.clone()]}))).unwrap().policies, 1);
        assert_eq!(st.apply(delta(json!({"policies": [p.clone()]}))).unwrap().policies, 0, "unchanged");
        assert_eq!(st.apply(delta(json!({"removedPolicies": ["ns/other"]}))).unwrap().policies, 0, "not held");
        let changed = compiled("p", json!([[[{"destinationPorts": [81]}]]]));
        assert_eq!(st.apply(delta(json!({"policies": [changed.clone()]}))).unwrap().policies, 1);
        let again = json!({"policies": [changed], "removedPolicies": ["ns/p"]});
        assert_eq!(st.apply(delta(again)).unwrap().policies, 2, "removed and upserted in one delta: the upsert wins");
        assert_eq!(
            serde_json::to_value(&mesh(&st).policies).unwrap()[0]["rules"][0][0][0]["destinationPorts"],
            json!([81])
        );
    }
}
