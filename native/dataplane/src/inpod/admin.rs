//! The in-pod manager's state as JSON for TS: readiness, the `workloadState` of config_dump, and the
//! workload_manager_* metrics.
//!
//! Shape: `StateJson` (TS: the generated `InPodState`), keys in alphabetical order.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::Serialize;

use super::{PodPhase, WorkloadManager};
use crate::proxy::LocalRef;

/// `inpodState()`: the workload proxy manager, for readiness, config_dump `workloadState` and metrics.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "InPodState"))]
#[serde(rename_all = "camelCase")]
struct StateJson<'a> {
    active_proxies: usize,
    connected: bool,
    last_error: Option<&'a str>,
    pending_proxies: usize,
    #[cfg_attr(test, ts(type = "number"))]
    proxies_started: u64,
    #[cfg_attr(test, ts(type = "number"))]
    proxies_stopped: u64,
    ready: bool,
    snapshot_received: bool,
    /// By pod uid.
    workloads: BTreeMap<&'a str, PodJson<'a>>,
}

#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "InPodWorkload"))]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodJson<'a> {
    /// Only when asked for (`inpodState({ connections: true })`, the default).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(optional))]
    pub connections: Option<ConnectionsJson>,
    /// Why its last start failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(optional))]
    pub error: Option<&'a str>,
    pub info: InfoJson<'a>,
    pub state: PodPhase,
}

#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "InPodConnections"))]
pub(crate) struct ConnectionsJson {
    pub inbound: Vec<crate::proxy::tracker::ConnInfo>,
    pub outbound: Vec<crate::proxy::tracker::ConnInfo>,
}

#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "InPodWorkloadInfo"))]
#[serde(rename_all = "camelCase")]
pub(crate) struct InfoJson<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub service_account: &'a str,
}

impl WorkloadManager {
    /// The manager's state as JSON. `connections`: list each pod's live connections (config_dump); without them
    /// the answer costs O(pods), not O(connections), which is what readiness polls and metric scrapes need.
    pub fn state_json(&self, connections: bool) -> String {
        let pods = self.pods.lock();
        let status = self.status.lock();
        let pending = pods.values().filter(|p| p.phase == PodPhase::Pending).count();
        let active = pods.values().filter(|p| p.phase == PodPhase::Up).count();
        let workloads = pods
            .iter()
            .map(|(uid, p)| {
                let connections = connections.then(|| {
                    let local = LocalRef::Pod {
                        namespace: Arc::from(p.info.namespace.as_str()),
                        name: Arc::from(p.info.name.as_str()),
                        service_account: Arc::from(""),
                        node: Arc::from(""),
                    };
                    let (inbound, outbound) = self.base.tracker.connections_of(&local);
                    ConnectionsJson { inbound, outbound }
                });
                let info = InfoJson {
                    name: &p.info.name,
                    namespace: &p.info.namespace,
                    service_account: &p.info.service_account,
                };
                (uid.as_str(), PodJson { connections, error: p.error.as_deref(), info, state: p.phase })
            })
            .collect();
        let state = StateJson {
            active_proxies: active,
            connected: status.connected,
            last_error: status.last_error.as_deref(),
            pending_proxies: pending,
            proxies_started: self.started.load(Ordering::Relaxed),
            proxies_stopped: self.stopped.load(Ordering::Relaxed),
            ready: status.connected && status.snapshot_done && pending == 0,
            snapshot_received: status.snapshot_done,
            workloads,
        };
        serde_json::to_string(&state).unwrap_or_else(|_| "null".into())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::super::testutil::{info, Harness};

    #[tokio::test]
    async fn state_json_lists_pods_by_uid_with_their_state_and_error() {
        let h = Harness::new("admin");
        h.mgr.add("b", info("b"), h.cni.dir.netns("ns-b")).await.unwrap();
        h.proxies.fail_with(Some("no room"));
        assert_eq!(h.mgr.add("a", info("a"), h.cni.dir.netns("ns-a")).await, Err("no room".to_string()));
        assert_eq!(
            h.mgr.state_json(false),
            concat!(
                r#"{"activeProxies":1,"connected":false,"lastError":null,"pendingProxies":1,"proxiesStarted":1,"#,
                r#""proxiesStopped":0,"ready":false,"snapshotReceived":false,"workloads":{"#,
                r#""a":{"error":"no room","info":{"name":"pod-a","namespace":"ns1","serviceAccount":"sa1"},"#,
                r#""state":"Pending"},"#,
                r#""b":{"info":{"name":"pod-b","namespace":"ns1","serviceAccount":"sa1"},"state":"Up"}}}"#,
            )
        );
    }

    #[tokio::test]
    async fn connections_are_listed_only_when_asked() {
        let h = Harness::new("admin-conns");
        h.mgr.add("a", info("a"), h.cni.dir.netns("ns-a")).await.unwrap();
        let with: Value = serde_json::from_str(&h.mgr.state_json(true)).unwrap();
        assert_eq!(with["workloads"]["a"]["connections"], json!({"inbound": [], "outbound": []}));
        let without: Value = serde_json::from_str(&h.mgr.state_json(false)).unwrap();
        assert_eq!(without["workloads"]["a"].get("connections"), None);
    }
}
