//! Fair shares of a DNS server's TCP connections (issue 29): 128 slow clients held every slot, so 10 of 197
//! legitimate questions were answered. As RFC 7766 § 6.2.3 allows, a full server closes its oldest idle connection
//! first; and one source address may hold only a share of the slots while they wait. The same rules as the admin
//! servers' (ts/admin/http.ts `capConnections`):
//! - a connection waiting for a question (part of one, or idle between questions) may be closed to make room; one
//!   whose question is being answered never is;
//! - a source at its share (a quarter of the cap) makes room among its own connections, the oldest waiting first;
//! - a full server makes room at the source holding the most connections, closing its oldest waiting one;
//! - with no waiting connection to close, the new one is refused.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

pub struct Slots {
    cap: usize,
    share: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// Connection id (its age: lower is older) → its slot.
    conns: BTreeMap<u64, Slot>,
    by_source: HashMap<IpAddr, BTreeSet<u64>>,
}

struct Slot {
    source: IpAddr,
    answering: bool,
    closed: CancellationToken,
}

/// A connection's place; gives it back when dropped.
pub struct Held {
    slots: Arc<Slots>,
    id: u64,
    /// Cancelled when the connection is closed to make room for another.
    pub closed: CancellationToken,
}

impl Slots {
    pub fn new(cap: usize) -> Arc<Slots> {
        Arc::new(Slots { cap, share: (cap / 4).max(1), inner: Mutex::new(Inner::default()) })
    }

    /// A place for a new connection from `source`, making room as above; None when there is none. `evicted` counts
    /// the connections closed to make room.
    pub fn admit(self: &Arc<Self>, source: IpAddr, evicted: &mut usize) -> Option<Held> {
        let mut g = self.inner.lock();
        let at_source = g.by_source.get(&source).map_or(0, BTreeSet::len);
        if at_source >= self.share {
            let own = g.oldest_waiting(&source);
            match own {
                Some(id) => {
                    g.close(id);
                    *evicted += 1;
                }
                None if g.conns.len() >= self.cap => return None,
                None => {}
            }
        }
        if g.conns.len() >= self.cap {
            let id = g.heaviest_waiting()?;
            g.close(id);
            *evicted += 1;
        }
        let id = g.next;
        g.next += 1;
        let closed = CancellationToken::new();
        g.conns.insert(id, Slot { source, answering: false, closed: closed.clone() });
        g.by_source.entry(source).or_default().insert(id);
        Some(Held { slots: self.clone(), id, closed })
    }

    #[cfg(test)]
    fn open(&self) -> usize {
        self.inner.lock().conns.len()
    }
}

impl Inner {
    fn oldest_waiting(&self, source: &IpAddr) -> Option<u64> {
        self.by_source.get(source)?.iter().copied().find(|id| self.conns.get(id).is_some_and(|s| !s.answering))
    }

    /// The oldest waiting connection of the source holding the most connections that has one waiting.
    fn heaviest_waiting(&self) -> Option<u64> {
        let mut best: Option<(usize, u64)> = None;
        for (source, ids) in &self.by_source {
            if best.is_some_and(|(n, _)| ids.len() <= n) {
                continue;
            }
            if let Some(id) = self.oldest_waiting(source) {
                best = Some((ids.len(), id));
            }
        }
        best.map(|(_, id)| id)
    }

    fn close(&mut self, id: u64) {
        if let Some(slot) = self.forget(id) {
            slot.closed.cancel();
        }
    }

    fn forget(&mut self, id: u64) -> Option<Slot> {
        let slot = self.conns.remove(&id)?;
        if let Some(ids) = self.by_source.get_mut(&slot.source) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_source.remove(&slot.source);
            }
        }
        Some(slot)
    }
}

impl Held {
    /// Whether the connection's question is being answered (it may not be closed for room meanwhile).
    pub fn answering(&self, on: bool) {
        if let Some(s) = self.slots.inner.lock().conns.get_mut(&self.id) {
            s.answering = on;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.slots.inner.lock().forget(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn a_source_at_its_share_makes_room_among_its_own_and_a_full_server_at_the_heaviest() {
        let slots = Slots::new(8); // share 2
        let mut evicted = 0;
        let a1 = slots.admit(ip(1), &mut evicted).unwrap();
        let a2 = slots.admit(ip(1), &mut evicted).unwrap();
        a2.answering(true);
        let a3 = slots.admit(ip(1), &mut evicted).unwrap();
        assert!(a1.closed.is_cancelled(), "the oldest waiting connection of the source made room");
        assert!(!a2.closed.is_cancelled(), "one being answered is never closed");
        assert_eq!(evicted, 1);
        a3.answering(true);
        // ip(1) at its share with all answering: a new one still gets in while the server has room.
        let a4 = slots.admit(ip(1), &mut evicted).unwrap();
        // Fill the server from others: b holds 3 (its share is exceeded only by its own choice to make room).
        let b: Vec<Held> = (0..2).map(|_| slots.admit(ip(2), &mut evicted).unwrap()).collect();
        let c = slots.admit(ip(3), &mut evicted).unwrap();
        let d = slots.admit(ip(4), &mut evicted).unwrap();
        assert_eq!(slots.open(), 7);
        let e = slots.admit(ip(5), &mut evicted).unwrap();
        assert_eq!(slots.open(), 8);
        // Full: the probe-like newcomer from ip(6) makes room at the heaviest source with a waiting connection:
        // ip(1) holds 3 (a2, a3 answering; a4 waiting).
        let f = slots.admit(ip(6), &mut evicted).unwrap();
        assert!(a4.closed.is_cancelled());
        assert!(
            !b[0].closed.is_cancelled()
                && !c.closed.is_cancelled()
                && !d.closed.is_cancelled()
                && !e.closed.is_cancelled()
        );
        assert_eq!(slots.open(), 8);
        drop(a4);
        assert_eq!(slots.open(), 8, "dropping a closed place frees nothing twice");
        drop(f);
        assert_eq!(slots.open(), 7);
    }

    #[test]
    fn with_every_place_answering_a_newcomer_is_refused() {
        let slots = Slots::new(4);
        let mut evicted = 0;
        let held: Vec<Held> = (0..4).map(|i| slots.admit(ip(i), &mut evicted).unwrap()).collect();
        for h in &held {
            h.answering(true);
        }
        assert!(slots.admit(ip(9), &mut evicted).is_none());
        assert_eq!(evicted, 0);
        held[2].answering(false);
        assert!(slots.admit(ip(9), &mut evicted).is_some());
        assert!(held[2].closed.is_cancelled());
    }
}
