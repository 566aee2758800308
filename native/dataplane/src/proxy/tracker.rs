//! Live connections: inbound ones under continuous authorization, and every one for config_dump.
//!
//! Invariants:
//! - A connection is registered BEFORE its first authorization check. A state change writes the new state first
//!   and is re-evaluated after (`reevaluation.rs` snapshots this tracker only then), so a change can never fall
//!   between a connection's check and its registration.
//! - The table is sharded by connection id; opening or closing a connection locks one shard for one insert or
//!   remove. A re-evaluation copies a shard's inbound entries (`Arc` clones) under that lock and evaluates them
//!   after releasing it, so no connection ever waits on an authorization pass.
//! - Lock order: never the state lock while a shard is held (the snapshot takes only shards; evaluation takes only
//!   the state).

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::LocalRef;
use crate::rbac;

/// Shards of the table: enough that two workers opening connections rarely meet, few enough that a snapshot of
/// all of them is cheap.
const SHARDS: usize = 16;

/// Behind an `Arc` in the map: a live connection costs the table a pointer-sized slot (times its load-factor
/// headroom), and a re-evaluation can hold the entry without holding the shard.
pub(crate) struct Tracked {
    pub(crate) local: LocalRef,
    pub(crate) close: CancellationToken,
    pub(crate) kind: Kind,
}

/// Inbound connections keep what authorization needs (their listing derives from it); outbound ones their listing.
pub(crate) enum Kind {
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
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "ConnectionInfo"))]
#[serde(rename_all = "camelCase")]
pub struct ConnInfo {
    #[serde(skip)]
    pub inbound: bool,
    /// "ip:port"
    #[cfg_attr(test, ts(as = "String"))]
    pub src: std::net::SocketAddr,
    #[cfg_attr(test, ts(as = "String"))]
    pub original_dst: std::net::SocketAddr,
    #[cfg_attr(test, ts(as = "String"))]
    pub actual_dst: std::net::SocketAddr,
    #[cfg_attr(test, ts(type = "\"HBONE\" | \"TCP\""))]
    pub protocol: &'static str,
}

type Shard = Mutex<HashMap<u64, Arc<Tracked>>>;

#[derive(Default)]
pub struct Tracker {
    next: AtomicU64,
    shards: [Shard; SHARDS],
    /// What outbound entries share as their `close`: they are never closed by re-evaluation, and a token of their
    /// own would be an allocation per connection.
    never: CancellationToken,
}

/// A registered connection; unregisters when dropped. `close` fires when a policy change denies it.
pub struct TrackGuard {
    tracker: Arc<Tracker>,
    id: u64,
    pub close: CancellationToken,
}

impl Drop for TrackGuard {
    fn drop(&mut self) {
        self.tracker.shard(self.id).remove(&self.id);
    }
}

impl Tracker {
    /// Register an inbound connection (authorization is then continuous).
    pub fn register(self: &Arc<Self>, local: LocalRef, conn: rbac::Connection, protocol: &'static str) -> TrackGuard {
        self.insert(local, Kind::Inbound { conn, protocol }, CancellationToken::new())
    }

    /// Register an outbound connection: listed in config_dump, never re-evaluated (authorization is inbound only).
    pub fn register_outbound(self: &Arc<Self>, local: LocalRef, info: ConnInfo) -> TrackGuard {
        self.insert(local, Kind::Outbound(ConnInfo { inbound: false, ..info }), self.never.clone())
    }

    fn insert(self: &Arc<Self>, local: LocalRef, kind: Kind, close: CancellationToken) -> TrackGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.shard(id).insert(id, Arc::new(Tracked { local, close: close.clone(), kind }));
        TrackGuard { tracker: self.clone(), id, close }
    }

    /// A shard's map. The maps hold no invariant a panicking holder could break halfway (one insert or remove, or
    /// a read), so a poisoned lock is taken as it is rather than spreading the panic to every connection.
    fn shard(&self, id: u64) -> MutexGuard<'_, HashMap<u64, Arc<Tracked>>> {
        self.shards[(id % SHARDS as u64) as usize].lock()
    }

    fn shards(&self) -> impl Iterator<Item = MutexGuard<'_, HashMap<u64, Arc<Tracked>>>> {
        self.shards.iter().map(|s| s.lock())
    }

    /// The live (inbound, outbound) connections of one local workload.
    pub fn connections_of(&self, local: &LocalRef) -> (Vec<ConnInfo>, Vec<ConnInfo>) {
        let (mut inbound, mut outbound) = (Vec::new(), Vec::new());
        for shard in self.shards() {
            for t in shard.values().filter(|t| t.local.same(local)) {
                match t.kind {
                    Kind::Inbound { .. } => inbound.push(t.info()),
                    Kind::Outbound(_) => outbound.push(t.info()),
                }
            }
        }
        (inbound, outbound)
    }

    /// The inbound connections not yet closed, one shard locked at a time (each only for the copy).
    pub(crate) fn inbound_snapshot(&self) -> Vec<Arc<Tracked>> {
        let mut out = Vec::new();
        for shard in self.shards() {
            out.extend(
                shard.values().filter(|t| matches!(t.kind, Kind::Inbound { .. }) && !t.close.is_cancelled()).cloned(),
            );
        }
        out
    }

    pub fn len(&self) -> usize {
        self.shards().map(|s| s.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
