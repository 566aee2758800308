//! In-pod mode: istio-cni hands ztunnel-node each pod's network namespace over ZDS; ztunnel-node then listens inside
//! every pod's namespace (15001 outbound capture, 15006 inbound plaintext, 15008 inbound HBONE, 15080 SOCKS5 when
//! enabled), with one HBONE pool per pod.
//!
//! Invariants (the workload proxy manager, `WorkloadManager`):
//! - Every request of a known type from the CNI agent is answered with an ack (an error text on failure); a request
//!   of no known type ends the connection unanswered.
//! - `add` is idempotent for the same netns (same device and inode); a different netns replaces the pod's proxies.
//!   A failed add leaves the pod pending, is NACKed, and is retried every 5 s.
//! - `keep` is only valid before `snapshot_sent`; `snapshot_sent` drains every pod the snapshot did not name; a second
//!   `snapshot_sent` on one connection is a protocol error. Protocol errors end the connection (then reconnect).
//! - `del` after the snapshot drains that pod's proxies at once.
//! - The pod's workload is the one CNI named (namespace, name, service account), never inferred from packets.
//! - Ready only when connected, the snapshot arrived, and no pod is pending. A dropped connection makes the manager
//!   not ready; it reconnects with backoff (10 ms doubling to 15 s) and recovers without a restart.
//!
//! Layout: `protocol` is the ZDS session (requests, snapshot, reconnection, retries), `factory` starts a pod's
//! proxies in its namespace (behind `PodProxies`), `admin` renders the state as JSON; this module holds the pod
//! table they share.

pub(crate) mod admin;
mod factory;
pub mod netns;
mod protocol;
#[cfg(test)]
pub(crate) mod testutil;
pub mod zds;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::drain::Drain;
use crate::events::Level;
use crate::fields;
use crate::proxy::ProxyInputs;
use factory::InPodProxies;
pub use factory::PodProxies;
use netns::NetNs;
use zds::WorkloadInfo;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "lowercase")]
pub enum OrigSrc {
    /// Preserve the client's source IP when IP_TRANSPARENT works.
    #[default]
    Auto,
    /// Fail a pod's start when it does not.
    Required,
    Never,
}

#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InPodConfig {
    /// INPOD_UDS
    pub uds: PathBuf,
    /// PACKET_MARK (1337)
    pub mark: u32,
    /// INPOD_PORT_REUSE
    pub reuse_port: bool,
    /// ENABLE_ORIG_SRC
    #[serde(default)]
    pub orig_src: OrigSrc,
    /// Dedicated mode: the one workload is the daemon's own (the DNS proxy then strips the daemon's search list).
    #[serde(default)]
    pub dedicated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
pub enum PodPhase {
    Pending,
    Up,
}

struct Pod {
    info: WorkloadInfo,
    netns_id: Option<(u64, u64)>,
    phase: PodPhase,
    error: Option<String>,
    drain: Option<Drain>,
    /// Held for a retry of a failed add.
    retry_netns: Option<Arc<NetNs>>,
}

#[derive(Default)]
struct Status {
    connected: bool,
    snapshot_done: bool,
    last_error: Option<String>,
}

pub struct WorkloadManager {
    base: Arc<ProxyInputs>,
    cfg: InPodConfig,
    daemon_drain: Drain,
    proxies: Arc<dyn PodProxies>,
    pods: Mutex<HashMap<String, Pod>>,
    status: Mutex<Status>,
    started: AtomicU64,
    stopped: AtomicU64,
}

impl WorkloadManager {
    pub fn new(base: Arc<ProxyInputs>, cfg: InPodConfig, daemon_drain: Drain) -> Arc<WorkloadManager> {
        let proxies =
            Arc::new(InPodProxies { base: base.clone(), cfg: cfg.clone(), daemon_drain: daemon_drain.clone() });
        WorkloadManager::with_proxies(base, cfg, daemon_drain, proxies)
    }

    /// A manager that starts pods' proxies with `proxies` (`new` uses the real ones; tests a stand-in).
    pub fn with_proxies(
        base: Arc<ProxyInputs>,
        cfg: InPodConfig,
        daemon_drain: Drain,
        proxies: Arc<dyn PodProxies>,
    ) -> Arc<WorkloadManager> {
        Arc::new(WorkloadManager {
            base,
            cfg,
            daemon_drain,
            proxies,
            pods: Mutex::new(HashMap::new()),
            status: Mutex::new(Status::default()),
            started: AtomicU64::new(0),
            stopped: AtomicU64::new(0),
        })
    }

    fn log(&self, level: Level, msg: &str, f: serde_json::Map<String, serde_json::Value>) {
        self.base.events.log(level, msg, f);
    }

    /// Handle an add: idempotent for the same netns, replacing for a new one.
    pub async fn add(&self, uid: &str, info: WorkloadInfo, fd: OwnedFd) -> Result<(), String> {
        let netns = Arc::new(NetNs::from_fd(fd).map_err(|e| format!("netns fd: {e}"))?);
        let existing = {
            let pods = self.pods.lock();
            pods.get(uid).map(|p| (p.netns_id, p.phase))
        };
        if let Some((Some(id), PodPhase::Up)) = existing {
            if id == netns.id {
                return Ok(());
            }
        }
        if existing.is_some() {
            self.remove(uid).await;
        }
        self.start(uid, info, netns).await
    }

    /// Start a pod's proxies and record it: `Up`, or `Pending` with the error and its netns kept for a retry.
    async fn start(&self, uid: &str, info: WorkloadInfo, netns: Arc<NetNs>) -> Result<(), String> {
        match self.proxies.start(uid, &info, netns.clone()).await {
            Ok(drain) => {
                self.started.fetch_add(1, Ordering::Relaxed);
                self.pods.lock().insert(
                    uid.to_string(),
                    Pod {
                        info,
                        netns_id: Some(netns.id),
                        phase: PodPhase::Up,
                        error: None,
                        drain: Some(drain),
                        retry_netns: None,
                    },
                );
                self.log(Level::Info, "pod proxies started", fields! {"uid" => uid});
                Ok(())
            }
            Err(e) => {
                self.pods.lock().insert(
                    uid.to_string(),
                    Pod {
                        info,
                        netns_id: Some(netns.id),
                        phase: PodPhase::Pending,
                        error: Some(e.clone()),
                        drain: None,
                        retry_netns: Some(netns),
                    },
                );
                self.log(
                    Level::Warn,
                    "pod proxies failed to start; will retry",
                    fields! {"uid" => uid, "error" => e.clone()},
                );
                Err(e)
            }
        }
    }

    /// Drain a pod's proxies at once and forget it.
    pub async fn remove(&self, uid: &str) {
        let pod = self.pods.lock().remove(uid);
        if let Some(Pod { drain: Some(drain), .. }) = pod {
            drain.drain_now().await;
            self.stopped.fetch_add(1, Ordering::Relaxed);
            self.log(Level::Info, "pod proxies stopped", fields! {"uid" => uid});
        }
    }

    /// Dedicated mode: one workload, proxies in the daemon's own namespace (iptables redirection there).
    pub async fn start_dedicated(&self, info: WorkloadInfo) -> Result<(), String> {
        let netns = Arc::new(NetNs::current().map_err(|e| format!("own netns: {e}"))?);
        let uid = format!("dedicated/{}/{}", info.namespace, info.name);
        let r = self.start(&uid, info, netns).await;
        if r.is_ok() {
            let mut st = self.status.lock();
            st.connected = true;
            st.snapshot_done = true;
        }
        r
    }

    /// Drain every pod (daemon shutdown).
    pub async fn drain_all(&self, deadline: Duration) {
        let drains: Vec<Drain> = self.pods.lock().values().filter_map(|p| p.drain.clone()).collect();
        futures_util::future::join_all(drains.iter().map(|d| d.drain(deadline))).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::testutil::{drained, info, Harness};

    #[tokio::test]
    async fn dedicated_start_marks_the_manager_ready() {
        let h = Harness::new("dedicated");
        h.mgr.start_dedicated(info("x")).await.unwrap();
        let starts = h.proxies.starts("dedicated/ns1/pod-x");
        assert_eq!(starts.len(), 1, "one pod, named after its workload");
        assert_eq!(starts[0].netns, super::NetNs::current().unwrap().id, "in the daemon's own namespace");
        let st = h.state();
        assert_eq!(st["ready"], true);
        assert_eq!(st["workloads"]["dedicated/ns1/pod-x"]["state"], "Up");
    }

    #[tokio::test]
    async fn drain_all_drains_every_pod() {
        let h = Harness::new("drain-all");
        h.mgr.add("a", info("a"), h.cni.dir.netns("ns-a")).await.unwrap();
        h.mgr.add("b", info("b"), h.cni.dir.netns("ns-b")).await.unwrap();
        h.mgr.drain_all(Duration::from_secs(1)).await;
        for uid in ["a", "b"] {
            let s = &h.proxies.starts(uid)[0];
            assert!(s.drain.as_ref().unwrap().graceful.is_cancelled(), "{uid} drained");
            assert!(!drained(s), "{uid}: a graceful drain whose tasks finished is not forced");
        }
    }

    #[tokio::test]
    async fn removing_a_pending_pod_stops_nothing() {
        let h = Harness::new("remove-pending");
        h.proxies.fail_with(Some("no"));
        assert!(h.mgr.add("a", info("a"), h.cni.dir.netns("ns-a")).await.is_err());
        h.mgr.remove("a").await;
        let st = h.state();
        assert_eq!(st["workloads"], serde_json::json!({}));
        assert_eq!(st["proxiesStopped"], 0, "only running proxies count as stopped");
    }
}
