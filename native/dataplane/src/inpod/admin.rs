//! The in-pod manager's state as JSON for TS: readiness, the `workloadState` of config_dump, and the
//! workload_manager_* metrics.
//!
//! Shape: `connected`, `snapshotReceived`, `ready`, `lastError`, `activeProxies`, `pendingProxies`,
//! `proxiesStarted`, `proxiesStopped`, and `workloads` keyed by pod uid, each with its `state` (`Pending` or `Up`),
//! `info` (`name`, `namespace`, `serviceAccount`), `error` when its last start failed, and `connections` when asked.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::Serialize;

use super::{PodPhase, WorkloadManager};
use crate::proxy::LocalRef;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PodJson<'a> {
    state: PodPhase,
    info: InfoJson<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    connections: Option<ConnectionsJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

#[derive(Serialize)]
struct ConnectionsJson {
    inbound: Vec<crate::proxy::tracker::ConnInfo>,
    outbound: Vec<crate::proxy::tracker::ConnInfo>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InfoJson<'a> {
    name: &'a str,
    namespace: &'a str,
    service_account: &'a str,
}

impl WorkloadManager {
    /// The manager's state as JSON. `connections`: list each pod's live connections (config_dump); without them
    /// the answer costs O(pods), not O(connections), which is what readiness polls and metric scrapes need.
    pub fn state_json(&self, connections: bool) -> String {
        let pods = self.pods.lock();
        let status = self.status.lock();
        let pending = pods.values().filter(|p| p.phase == PodPhase::Pending).count();
        let active = pods.values().filter(|p| p.phase == PodPhase::Up).count();
        let mut workloads = serde_json::Map::new();
        let mut uids: Vec<&String> = pods.keys().collect();
        uids.sort();
        for uid in uids {
            let p = &pods[uid];
            let listed = connections.then(|| {
                let local = LocalRef::Pod {
                    namespace: Arc::from(p.info.namespace.as_str()),
                    name: Arc::from(p.info.name.as_str()),
                    service_account: Arc::from(""),
                    node: Arc::from(""),
                };
                let (inbound, outbound) = self.base.tracker.connections_of(&local);
                ConnectionsJson { inbound, outbound }
            });
            let j = PodJson {
                connections: listed,
                state: p.phase,
                info: InfoJson {
                    name: &p.info.name,
                    namespace: &p.info.namespace,
                    service_account: &p.info.service_account,
                },
                error: p.error.as_deref(),
            };
            workloads.insert(uid.clone(), serde_json::to_value(j).unwrap_or_default());
        }
        serde_json::json!({
            "connected": status.connected,
            "snapshotReceived": status.snapshot_done,
            "ready": status.connected && status.snapshot_done && pending == 0,
            "lastError": status.last_error,
            "activeProxies": active,
            "pendingProxies": pending,
            "proxiesStarted": self.started.load(Ordering::Relaxed),
            "proxiesStopped": self.stopped.load(Ordering::Relaxed),
            "workloads": workloads,
        })
        .to_string()
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
