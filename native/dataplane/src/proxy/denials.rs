//! Recent authorization denials: the last `RECENT_DENIALS` inbound connections refused by a policy decision (HBONE
//! on 15008, plaintext on 15006), kept so the policy impact preview (preview.rs) can judge them again under a
//! candidate policy: "which recently refused attempts would this change let in".
//!
//! Invariants:
//! - Only authorization denials are recorded (the "connection denied" access event); refusals for other reasons (no
//!   such workload, an illegal port, a bad CONNECT) are not, since no policy change would let them in.
//! - Bounded: a ring of `RECENT_DENIALS` slots, allocated once; when full the oldest entry is dropped. Recording is
//!   O(1) under a short lock and allocates nothing beyond the entry, which is made of what the connection's check
//!   already built (its `rbac::Connection`, moved in, and a reference-counted uid).
//! - Freeing the dropped entry happens after the lock is released, so a denial never waits on another's free.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::time::SystemTime;

use crate::rbac;
use crate::state::intern::Str;

/// How many denials are kept: a few minutes of a misbehaving client at a handful of attempts a second, or the
/// variety of sources a policy change is likely to concern; about 200 KiB at most (pages are only touched as used).
pub const RECENT_DENIALS: usize = 1000;

/// One refused attempt: what the evaluator needs to judge it again, and when it happened.
#[derive(Debug, Clone)]
pub struct Denial {
    /// The destination (local) workload, as it was when the attempt was judged.
    pub uid: Str,
    pub conn: rbac::Connection,
    /// "HBONE" or "TCP" (plaintext).
    pub protocol: &'static str,
    pub at: SystemTime,
}

pub struct RecentDenials {
    ring: Mutex<VecDeque<Denial>>,
    capacity: usize,
}

impl Default for RecentDenials {
    fn default() -> RecentDenials {
        RecentDenials::with_capacity(RECENT_DENIALS)
    }
}

impl RecentDenials {
    pub fn with_capacity(capacity: usize) -> RecentDenials {
        RecentDenials { ring: Mutex::new(VecDeque::with_capacity(capacity)), capacity: capacity.max(1) }
    }

    /// Record a denial; the oldest one goes when the ring is full.
    pub fn record(&self, uid: Str, conn: rbac::Connection, protocol: &'static str) {
        let entry = Denial { uid, conn, protocol, at: SystemTime::now() };
        let dropped = {
            let mut ring = self.ring.lock();
            let dropped = if ring.len() >= self.capacity { ring.pop_front() } else { None };
            ring.push_back(entry);
            dropped
        };
        drop(dropped);
    }

    /// A copy of the ring, oldest first (the preview judges it without holding the lock).
    pub fn snapshot(&self) -> Vec<Denial> {
        self.ring.lock().iter().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.ring.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;

    fn conn(i: u16) -> rbac::Connection {
        rbac::Connection::new(
            Some(Identity::new("cluster.local", "ns", "sa")),
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            i,
        )
    }

    #[test]
    fn the_ring_keeps_the_last_entries_and_never_grows() {
        let ring = RecentDenials::with_capacity(10);
        let slots = ring.ring.lock().capacity();
        for i in 1..=25u16 {
            ring.record(Str::from("w"), conn(i), "HBONE");
        }
        let kept = ring.snapshot();
        assert_eq!(kept.len(), 10);
        assert_eq!(kept.iter().map(|d| d.conn.dst_port).collect::<Vec<_>>(), (16..=25).collect::<Vec<_>>());
        assert!(kept.windows(2).all(|w| w[0].at <= w[1].at), "oldest first");
        assert_eq!(ring.ring.lock().capacity(), slots, "no slot was added once full");
    }

    #[test]
    fn the_default_ring_holds_recent_denials() {
        let ring = RecentDenials::default();
        for i in 0..(RECENT_DENIALS as u16 + 5) {
            ring.record(Str::from("w"), conn(i), "TCP");
        }
        assert_eq!(ring.len(), RECENT_DENIALS);
        assert_eq!(ring.snapshot()[0].conn.dst_port, 5);
    }
}
