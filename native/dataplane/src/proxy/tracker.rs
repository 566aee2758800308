//! Inbound connections under continuous authorization.
//!
//! Invariants:
//! - A connection is registered BEFORE its first authorization check. A state change writes the new state first
//!   and re-evaluates the registered connections after, so a change can never fall between a connection's check
//!   and its registration.
//! - Re-evaluation uses the same pure `rbac::authorize` as the first check; a connection now denied is closed
//!   through its own token (the connection's task drops both sockets), and counted and logged.
//! - Lock order: state (read) before the tracker's map. Registration takes only the map.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::{LocalRef, ProxyInputs};
use crate::events::{Event, Level};
use crate::rbac;

/// Boxed in the map: a live connection costs the table a 16-byte slot (times its load-factor headroom) instead of the
/// whole entry.
struct Tracked {
    local: LocalRef,
    close: CancellationToken,
    kind: Kind,
}

/// Inbound connections keep what authorization needs (their listing derives from it); outbound ones their listing.
enum Kind {
    Inbound { conn: rbac::Connection, protocol: &'static str },
    Outbound(ConnInfo),
}

impl Tracked {
    fn info(&self) -> ConnInfo {
        match &self.kind {
            Kind::Inbound { conn, protocol } => {
                let dst = std::net::SocketAddr::new(conn.dst_ip, conn.dst_port);
                ConnInfo {
                    inbound: true,
                    src: std::net::SocketAddr::new(conn.src_ip, 0),
                    original_dst: dst,
                    actual_dst: dst,
                    protocol,
                }
            }
            Kind::Outbound(info) => info.clone(),
        }
    }
}

/// What config_dump's `workloadState.connections` shows of a live connection (ztunnel's keys).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnInfo {
    #[serde(skip)]
    pub inbound: bool,
    pub src: std::net::SocketAddr,
    pub original_dst: std::net::SocketAddr,
    pub actual_dst: std::net::SocketAddr,
    pub protocol: &'static str,
}

#[derive(Default)]
pub struct Tracker {
    next: AtomicU64,
    conns: Mutex<HashMap<u64, Box<Tracked>>>,
}

/// A registered connection; unregisters when dropped. `close` fires when a policy change denies it.
pub struct TrackGuard {
    tracker: Arc<Tracker>,
    id: u64,
    pub close: CancellationToken,
}

impl Drop for TrackGuard {
    fn drop(&mut self) {
        self.tracker.conns.lock().expect("tracker lock").remove(&self.id);
    }
}

impl Tracker {
    /// Register an inbound connection (authorization is then continuous).
    pub fn register(self: &Arc<Self>, local: LocalRef, conn: rbac::Connection, protocol: &'static str) -> TrackGuard {
        self.insert(local, Kind::Inbound { conn, protocol })
    }

    /// Register an outbound connection: listed in config_dump, never re-evaluated (authorization is inbound only).
    pub fn register_outbound(self: &Arc<Self>, local: LocalRef, info: ConnInfo) -> TrackGuard {
        self.insert(local, Kind::Outbound(ConnInfo { inbound: false, ..info }))
    }

    fn insert(self: &Arc<Self>, local: LocalRef, kind: Kind) -> TrackGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let close = CancellationToken::new();
        self.conns.lock().expect("tracker lock").insert(id, Box::new(Tracked { local, close: close.clone(), kind }));
        TrackGuard { tracker: self.clone(), id, close }
    }

    /// The live (inbound, outbound) connections of one local workload.
    pub fn connections_of(&self, local: &LocalRef) -> (Vec<ConnInfo>, Vec<ConnInfo>) {
        let conns = self.conns.lock().expect("tracker lock");
        let (mut inbound, mut outbound) = (Vec::new(), Vec::new());
        for t in conns.values().filter(|t| t.local.same(local)) {
            match t.kind {
                Kind::Inbound { .. } => inbound.push(t.info()),
                Kind::Outbound(_) => outbound.push(t.info()),
            }
        }
        (inbound, outbound)
    }

    pub fn len(&self) -> usize {
        self.conns.lock().expect("tracker lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Re-check every tracked connection against the current state; close the ones now denied.
    pub fn reevaluate(&self, pi: &ProxyInputs) {
        let state = pi.state.read().expect("state lock");
        let conns = self.conns.lock().expect("tracker lock");
        for t in conns.values() {
            let Kind::Inbound { conn, .. } = &t.kind else { continue };
            if t.close.is_cancelled() {
                continue;
            }
            let decision = match t.local.resolve(&state) {
                Some(w) => rbac::authorize(&state, &w, conn),
                None => continue, // the workload's own removal drains its listeners and connections
            };
            if decision.allowed {
                continue;
            }
            t.close.cancel();
            pi.metrics.authz_closed_by_policy.fetch_add(1, Ordering::Relaxed);
            pi.events.push(Event {
                kind: "access",
                level: Level::Warn,
                message: "connection closed due to policy change".into(),
                fields: crate::fields! {
                    "src.addr" => conn.src_ip.to_string(),
                    "src.identity" => conn.src_identity.as_ref().map(|i| i.to_string()).unwrap_or_default(),
                    "dst.addr" => std::net::SocketAddr::new(conn.dst_ip, conn.dst_port).to_string(),
                    "dst.workload" => t.local.to_string(),
                    "direction" => "inbound",
                    "policy" => decision.policy.clone().unwrap_or_default(),
                    "reason" => decision.reason,
                },
            });
        }
    }
}
