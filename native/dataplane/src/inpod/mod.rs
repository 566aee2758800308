//! In-pod mode: istio-cni hands ztunnel-node each pod's network namespace over ZDS; ztunnel-node then listens inside
//! every pod's namespace (15001 outbound capture, 15006 inbound plaintext, 15008 inbound HBONE, 15080 SOCKS5 when
//! enabled), with one HBONE pool per pod.
//!
//! Invariants (the workload proxy manager, `WorkloadManager`):
//! - Every request from the CNI agent is answered with an ack (an error text on failure).
//! - `add` is idempotent for the same netns (same device and inode); a different netns replaces the pod's proxies.
//!   A failed add leaves the pod pending, is NACKed, and is retried every 5 s.
//! - `keep` is only valid before `snapshot_sent`; `snapshot_sent` drains every pod the snapshot did not name; a second
//!   `snapshot_sent` on one connection is a protocol error. Protocol errors end the connection (then reconnect).
//! - `del` after the snapshot drains that pod's proxies at once.
//! - The pod's workload is the one CNI named (namespace, name, service account), never inferred from packets.
//! - Ready only when connected, the snapshot arrived, and no pod is pending. A dropped connection makes the manager
//!   not ready; it reconnects with backoff (10 ms doubling to 15 s) and recovers without a restart.

pub mod netns;
pub mod zds;

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{HBONE_PORT, INBOUND_PLAINTEXT_PORT, OUTBOUND_CAPTURE_PORT, SOCKS5_PORT};
use crate::drain::Drain;
use crate::events::Level;
use crate::fields;
use crate::identity::Identity;
use crate::proxy::pool::Pool;
use crate::proxy::{LocalRef, ProxyInputs};
use crate::socket::{listen_with, ListenOptions, SocketFactory};
use netns::{InPodSockets, NetNs};
use zds::{workload_request::Payload, WorkloadInfo, ZdsConn, ZdsError, ZdsHello};

const RETRY_ADD: Duration = Duration::from_secs(5);
const BACKOFF_START: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
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
    pods: Mutex<HashMap<String, Pod>>,
    status: Mutex<Status>,
    started: AtomicU64,
    stopped: AtomicU64,
}

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
    pub fn new(base: Arc<ProxyInputs>, cfg: InPodConfig, daemon_drain: Drain) -> Arc<WorkloadManager> {
        Arc::new(WorkloadManager {
            base,
            cfg,
            daemon_drain,
            pods: Mutex::new(HashMap::new()),
            status: Mutex::new(Status::default()),
            started: AtomicU64::new(0),
            stopped: AtomicU64::new(0),
        })
    }

    fn log(&self, level: Level, msg: &str, f: serde_json::Map<String, serde_json::Value>) {
        self.base.events.log(level, msg, f);
    }

    /// The manager's state as JSON for TS: readiness, `workloadState` of config_dump, and the workload_manager_*
    /// metrics.
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

    /// Connect to the CNI agent and serve it until the daemon drains, reconnecting with backoff.
    pub async fn run(self: Arc<Self>) {
        let mut backoff = BACKOFF_START;
        loop {
            if self.daemon_drain.graceful.is_cancelled() {
                return;
            }
            let conn = tokio::select! {
                c = ZdsConn::connect(&self.cfg.uds) => c,
                _ = self.daemon_drain.graceful.cancelled() => return,
            };
            match conn {
                Ok(conn) => {
                    backoff = BACKOFF_START;
                    let result = tokio::select! {
                        r = self.clone().serve(&conn) => r,
                        _ = self.daemon_drain.graceful.cancelled() => return,
                    };
                    let mut st = self.status.lock();
                    st.connected = false;
                    st.snapshot_done = false;
                    match result {
                        Ok(()) => {
                            st.last_error = Some("CNI agent closed the connection".into());
                            drop(st);
                            self.log(
                                Level::Debug,
                                "ZDS connection ended",
                                fields! {"reason" => "the CNI agent closed the connection"},
                            );
                        }
                        Err(e) => {
                            st.last_error = Some(e.to_string());
                            drop(st);
                            self.log(Level::Warn, "ZDS connection ended", fields! {"error" => e.to_string()});
                        }
                    }
                }
                Err(e) => {
                    let first = self.status.lock().last_error.replace(e.to_string()).is_none();
                    if first {
                        self.log(
                            Level::Warn,
                            "cannot connect to the CNI agent; retrying",
                            fields! {"error" => e.to_string()},
                        );
                    }
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    async fn serve(self: Arc<Self>, conn: &ZdsConn) -> Result<(), ZdsError> {
        conn.send(&ZdsHello { version: zds::Version::V1 as i32 }).await?;
        {
            let mut st = self.status.lock();
            st.connected = true;
            st.snapshot_done = false;
        }
        self.log(Level::Info, "connected to the CNI agent", fields! {"uds" => self.cfg.uds.display().to_string()});
        let mut seen: HashSet<String> = HashSet::new();
        let mut snapshot_done = false;
        let mut retry = tokio::time::interval(RETRY_ADD);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let received = tokio::select! {
                r = conn.recv() => r?,
                _ = retry.tick() => {
                    self.retry_pending().await;
                    continue;
                }
            };
            let Some(received) = received else { return Ok(()) };
            let zds::Received { request, mut fds } = received;
            let Some(payload) = request.payload else {
                return Err(ZdsError::Protocol("request without payload".into()));
            };
            match payload {
                Payload::Add(add) => {
                    if fds.len() != 1 {
                        conn.ack(Some(format!("add for {} carries {} fds, want exactly one", add.uid, fds.len())))
                            .await?;
                        return Err(ZdsError::Protocol(format!("add with {} fds", fds.len())));
                    }
                    let Some(info) = add.workload_info.clone() else {
                        conn.ack(Some("add without workload_info".into())).await?;
                        return Err(ZdsError::Protocol(format!("add for {} without workload_info", add.uid)));
                    };
                    seen.insert(add.uid.clone());
                    self.log(
                        Level::Debug,
                        "ZDS add",
                        fields! {"uid" => add.uid.clone(), "pod" => format!("{}/{}", info.namespace, info.name)},
                    );
                    let fd: OwnedFd = fds.pop().expect("one fd");
                    let result = self.add(&add.uid, info, fd).await;
                    conn.ack(result.err()).await?;
                }
                Payload::Keep(keep) => {
                    if snapshot_done {
                        conn.ack(Some("keep after snapshot_sent".into())).await?;
                        return Err(ZdsError::Protocol("keep after snapshot_sent".into()));
                    }
                    let known = self.pods.lock().contains_key(&keep.uid);
                    self.log(Level::Debug, "ZDS keep", fields! {"uid" => keep.uid.clone(), "known" => known});
                    seen.insert(keep.uid.clone());
                    conn.ack((!known).then(|| format!("keep for unknown pod {}", keep.uid))).await?;
                }
                Payload::Del(del) => {
                    self.log(Level::Debug, "ZDS del", fields! {"uid" => del.uid.clone()});
                    if snapshot_done {
                        self.remove(&del.uid).await;
                    } else {
                        seen.remove(&del.uid);
                    }
                    conn.ack(None).await?;
                }
                Payload::SnapshotSent(_) => {
                    if snapshot_done {
                        conn.ack(Some("second snapshot_sent".into())).await?;
                        return Err(ZdsError::Protocol("second snapshot_sent on one connection".into()));
                    }
                    snapshot_done = true;
                    let stale: Vec<String> = self.pods.lock().keys().filter(|u| !seen.contains(*u)).cloned().collect();
                    self.log(
                        Level::Debug,
                        "ZDS snapshot received",
                        fields! {"pods" => seen.len(), "stale" => stale.len()},
                    );
                    for uid in stale {
                        self.remove(&uid).await;
                    }
                    self.status.lock().snapshot_done = true;
                    conn.ack(None).await?;
                }
            }
        }
    }

    async fn retry_pending(&self) {
        let pending: Vec<(String, WorkloadInfo, Arc<NetNs>)> = self
            .pods
            .lock()
            .iter()
            .filter(|(_, p)| p.phase == PodPhase::Pending)
            .filter_map(|(u, p)| p.retry_netns.clone().map(|n| (u.clone(), p.info.clone(), n)))
            .collect();
        for (uid, info, netns) in pending {
            let _ = self.start(&uid, info, netns).await;
        }
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

    async fn start(&self, uid: &str, info: WorkloadInfo, netns: Arc<NetNs>) -> Result<(), String> {
        match self.start_proxies(uid, &info, netns.clone()).await {
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

    async fn start_proxies(&self, uid: &str, info: &WorkloadInfo, netns: Arc<NetNs>) -> Result<Drain, String> {
        let base = &self.base;
        let sockets: Arc<dyn SocketFactory> = Arc::new(InPodSockets { netns: netns.clone(), mark: self.cfg.mark });
        let drain = self.daemon_drain.child();
        let transparent = match self.cfg.orig_src {
            OrigSrc::Never => false,
            mode => {
                let works = probe_transparent(&*sockets);
                if !works && mode == OrigSrc::Required {
                    return Err("ENABLE_ORIG_SRC=true but IP_TRANSPARENT is not permitted".into());
                }
                works
            }
        };
        let pool = Pool::with_sockets(
            base.cfg.clone(),
            sockets.clone(),
            base.certs.clone(),
            base.metrics.clone(),
            base.events.clone(),
            drain.clone(),
        );
        tokio::spawn(pool.clone().run_eviction());
        let pi = Arc::new(ProxyInputs {
            cfg: base.cfg.clone(),
            state: base.state.clone(),
            certs: base.certs.clone(),
            metrics: base.metrics.clone(),
            events: base.events.clone(),
            pool,
            tracker: base.tracker.clone(),
            sockets: sockets.clone(),
            preserve_source: transparent,
        });
        let local = LocalRef::Pod {
            namespace: Arc::from(info.namespace.as_str()),
            name: Arc::from(info.name.as_str()),
            service_account: Arc::from(info.service_account.as_str()),
            node: Arc::from(base.cfg.node_name.as_str()),
        };
        // The trust domain comes from the pod's workload when known, else the daemon's.
        let td = local
            .resolve(&base.state.read())
            .map(|w| w.trust_domain.clone())
            .unwrap_or_else(|| base.cfg.trust_domain.as_str().into());
        let identity = Identity::new(&td, &info.namespace, &info.service_account);
        let tls = Arc::new(crate::tls::server_config(base.certs.clone(), identity.clone()).map_err(|e| e.to_string())?);
        let opts = ListenOptions { reuse_port: self.cfg.reuse_port, transparent };
        let bind = |port: u16, loopback: bool| -> Result<tokio::net::TcpListener, String> {
            let (v6, v4) = if loopback {
                (IpAddr::V6(Ipv6Addr::LOCALHOST), IpAddr::V4(Ipv4Addr::LOCALHOST))
            } else {
                (IpAddr::V6(Ipv6Addr::UNSPECIFIED), IpAddr::V4(Ipv4Addr::UNSPECIFIED))
            };
            // Dual-stack [::] when the pod has IPv6, else 0.0.0.0.
            if !loopback {
                if let Ok(l) = listen_with(&*sockets, SocketAddr::new(v6, port), opts) {
                    return Ok(l);
                }
            }
            listen_with(&*sockets, SocketAddr::new(v4, port), opts)
                .map_err(|e| format!("binding port {port} in {uid}'s netns: {e}"))
        };
        let outbound = bind(OUTBOUND_CAPTURE_PORT, false)?;
        let inbound_plain = bind(INBOUND_PLAINTEXT_PORT, false)?;
        let hbone = bind(HBONE_PORT, false)?;
        let socks = if base.cfg.socks5_enabled { Some(bind(SOCKS5_PORT, true)?) } else { None };
        tokio::spawn(crate::proxy::outbound::serve_capture(outbound, pi.clone(), local.clone(), drain.clone()));
        tokio::spawn(crate::proxy::inbound_passthrough::serve(inbound_plain, pi.clone(), local.clone(), drain.clone()));
        tokio::spawn(crate::proxy::inbound::serve(hbone, pi.clone(), local.clone(), (tls, identity), drain.clone()));
        if let Some(l) = socks {
            tokio::spawn(crate::proxy::socks5::serve(l, pi.clone(), local.clone(), drain.clone()));
        }
        if base.cfg.dns.enabled {
            let dns = crate::dns::Server::new(pi.clone(), local.clone(), sockets.clone(), self.cfg.dedicated)?;
            let dns_opts = ListenOptions { reuse_port: self.cfg.reuse_port, transparent: false };
            let addrs = base.cfg.dns.listen_addrs()?;
            let localhost = addrs.len() == 2;
            for (i, addr) in addrs.iter().enumerate() {
                match dns.start(&*sockets, std::slice::from_ref(addr), dns_opts, &drain) {
                    Ok(_) => {}
                    // localhost's ::1 only where the pod has IPv6 on lo (ztunnel's `maybe_downgrade_ipv6`).
                    Err(_) if localhost && i == 1 => {}
                    Err(e) => {
                        drain.drain_now().await;
                        return Err(format!("{uid}: {e}"));
                    }
                }
            }
        }
        Ok(drain)
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

/// Whether IP_TRANSPARENT can be set on a socket of this factory (needs CAP_NET_ADMIN in the pod's namespace).
fn probe_transparent(sockets: &dyn SocketFactory) -> bool {
    match sockets.tcp(socket2::Domain::IPV4) {
        Ok(s) => s.set_ip_transparent_v4(true).is_ok(),
        Err(_) => false,
    }
}
