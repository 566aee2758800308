//! Premature stream resets counted per peer across connections (issue 29; security.md item 23, HTTP/2 rapid reset).
//!
//! A connection's own allowance (`inbound::RESET_ALLOWANCE`) started afresh with every reconnect, and a stream that
//! received its 200 counted as completed, so "wait for the 200, then RST" drove an upstream dial per stream without
//! end. Here a stream is premature when the peer resets it before it is established, or within
//! `PREMATURE_LIFETIME` of its creation (Envoy's rule: 1 s), or after its 200 with no byte either way. The counts
//! live per peer identity and per source address, across the peer's connections; a peer whose premature streams are
//! at least `MIN_PREMATURE` and more than half of its recent streams (Envoy's threshold) is banned for a time that
//! doubles with each ban (`BASE_BAN` up to `MAX_BAN`): its new streams close its connection with ENHANCE_YOUR_CALM and
//! its new connections are refused, with a warning and `ztunnel_node_hbone_connections_refused_total{reason=
//! "premature_resets"}`. A source address needs `SOURCE_FACTOR` times as many (a network gateway carries many
//! identities from one address: the identity is banned long before its gateway would be).
//!
//! A legitimate peer's long streams and occasional cancels never reach half; counts halve every `WINDOW` streams, so
//! old history fades. Bounded: at most `MAX_PEERS` entries, the least recently seen dropped first.
//!
//! Off the stream path: a connection counts its clean streams itself and hands them over in one batch with its next
//! premature stream or when it ends (`record`), so the node's lock is taken per premature stream and per connection,
//! never per clean stream; whether any ban is running is one atomic load (`banned` locks only then).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub const PREMATURE_LIFETIME: Duration = Duration::from_secs(1);
pub const MIN_PREMATURE: u32 = 100;
pub const SOURCE_FACTOR: u32 = 4;
pub const WINDOW: u32 = 1000;
pub const BASE_BAN: Duration = Duration::from_secs(1);
pub const MAX_BAN: Duration = Duration::from_secs(60);
const MAX_PEERS: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Identity(Arc<str>),
    Source(IpAddr),
}

#[derive(Debug)]
struct Entry {
    streams: u32,
    premature: u32,
    bans: u32,
    banned_until: Option<Instant>,
    seen: Instant,
}

/// What a peer is, for the budget: its identity and the address it connects from.
#[derive(Debug, Clone)]
pub struct Peer {
    pub identity: Arc<str>,
    pub source: IpAddr,
}

/// A ban that just started: who, and for how long (for the warning).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Banned {
    pub who: String,
    pub for_: Duration,
    pub premature: u32,
    pub streams: u32,
}

pub struct PeerResets {
    entries: Mutex<HashMap<Key, Entry>>,
    /// When the last ban to end ends, in ms after `epoch`: before that `banned` looks, after it no ban runs.
    bans_until_ms: AtomicU64,
    epoch: Instant,
    /// The clock, advanced by tests.
    #[cfg(test)]
    skew: Mutex<Duration>,
}

impl Default for PeerResets {
    fn default() -> PeerResets {
        PeerResets {
            entries: Mutex::default(),
            bans_until_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            #[cfg(test)]
            skew: Mutex::default(),
        }
    }
}

impl std::fmt::Debug for PeerResets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerResets").field("peers", &self.entries.lock().len()).finish()
    }
}

impl PeerResets {
    fn now(&self) -> Instant {
        #[cfg(test)]
        return Instant::now() + *self.skew.lock();
        #[cfg(not(test))]
        Instant::now()
    }

    #[cfg(test)]
    fn advance(&self, by: Duration) {
        *self.skew.lock() += by;
    }

    fn since_epoch_ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// Whether any ban may be running (one atomic load: the stream path's question while there is none).
    fn any_ban(&self) -> bool {
        self.bans_until_ms.load(Ordering::Acquire) >= self.since_epoch_ms(self.now())
    }

    /// Whether the peer's source address is banned (before its TLS handshake).
    pub fn source_banned(&self, source: IpAddr) -> bool {
        self.any_ban() && self.is_banned(&[Key::Source(source)])
    }

    /// Whether the peer (its identity or its address) is banned.
    pub fn banned(&self, peer: &Peer) -> bool {
        self.any_ban() && self.is_banned(&[Key::Identity(peer.identity.clone()), Key::Source(peer.source)])
    }

    fn is_banned(&self, keys: &[Key]) -> bool {
        let now = self.now();
        let entries = self.entries.lock();
        keys.iter().any(|k| entries.get(k).and_then(|e| e.banned_until).is_some_and(|until| until > now))
    }

    /// What a connection saw since it last reported: `clean` streams that ended well, and whether one more was
    /// premature (as the module says). Returns the bans it started.
    pub fn record(&self, peer: &Peer, clean: u32, premature: bool) -> Vec<Banned> {
        if clean == 0 && !premature {
            return Vec::new();
        }
        let now = self.now();
        let mut out = Vec::new();
        let mut entries = self.entries.lock();
        for (key, min) in [
            (Key::Identity(peer.identity.clone()), MIN_PREMATURE),
            (Key::Source(peer.source), MIN_PREMATURE * SOURCE_FACTOR),
        ] {
            if !entries.contains_key(&key) && entries.len() >= MAX_PEERS {
                evict_quietest(&mut entries);
            }
            let e = entries.entry(key.clone()).or_insert(Entry {
                streams: 0,
                premature: 0,
                bans: 0,
                banned_until: None,
                seen: now,
            });
            e.seen = now;
            e.streams = e.streams.saturating_add(clean).saturating_add(u32::from(premature));
            e.premature += u32::from(premature);
            if premature && e.premature >= min && e.premature * 2 > e.streams && e.banned_until.is_none_or(|u| u <= now)
            {
                let for_ = BASE_BAN.saturating_mul(1 << e.bans.min(16)).min(MAX_BAN);
                e.banned_until = Some(now + for_);
                self.bans_until_ms.fetch_max(self.since_epoch_ms(now + for_), Ordering::AcqRel);
                e.bans += 1;
                out.push(Banned {
                    who: match &key {
                        Key::Identity(id) => format!("identity {id}"),
                        Key::Source(ip) => format!("source address {ip}"),
                    },
                    for_,
                    premature: e.premature,
                    streams: e.streams,
                });
                // Counted afresh after a ban: the next one needs as much evidence again.
                (e.streams, e.premature) = (0, 0);
            } else {
                while e.streams >= WINDOW {
                    (e.streams, e.premature) = (e.streams / 2, e.premature / 2);
                }
            }
        }
        out
    }
}

/// Makes room: the least recently seen peer not banned, else the least recently seen.
fn evict_quietest(entries: &mut HashMap<Key, Entry>) {
    let quietest = entries.iter().filter(|(_, e)| e.banned_until.is_none()).min_by_key(|(_, e)| e.seen);
    let key = quietest.or_else(|| entries.iter().min_by_key(|(_, e)| e.seen)).map(|(k, _)| k.clone());
    if let Some(k) = key {
        entries.remove(&k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(id: &str, last: u8) -> Peer {
        Peer { identity: Arc::from(id), source: IpAddr::from([10, 0, 0, last]) }
    }

    #[test]
    fn a_peer_whose_streams_are_mostly_premature_is_banned_for_a_doubling_time() {
        let r = PeerResets::default();
        let p = peer("spiffe://cluster.local/ns/a/sa/attacker", 1);
        let mut bans = Vec::new();
        for _ in 0..MIN_PREMATURE {
            assert!(!r.banned(&p));
            bans.extend(r.record(&p, 0, true));
        }
        assert_eq!(bans.len(), 1, "banned at the hundredth premature stream");
        assert_eq!(bans[0].for_, BASE_BAN);
        assert!(r.banned(&p));
        // Another address, same identity: banned too; another identity from the same address: not (its source has
        // not reached four times the count).
        assert!(r.banned(&peer("spiffe://cluster.local/ns/a/sa/attacker", 2)));
        assert!(!r.banned(&peer("spiffe://cluster.local/ns/a/sa/other", 1)));
        r.advance(BASE_BAN + Duration::from_millis(1));
        assert!(!r.banned(&p), "the ban ends");
        assert!(!r.any_ban(), "and with it the lock on the stream path");
        let again: Vec<Banned> = (0..MIN_PREMATURE).flat_map(|_| r.record(&p, 0, true)).collect();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].for_, BASE_BAN * 2, "the second ban lasts twice as long");
    }

    #[test]
    fn occasional_cancels_never_trip_it_and_old_history_fades() {
        let r = PeerResets::default();
        let p = peer("spiffe://cluster.local/ns/a/sa/app", 3);
        // 40 % of 100,000 streams premature, reported as a connection does (clean ones in a batch with the next
        // premature one): never half.
        for i in 0..20_000u32 {
            assert!(r.record(&p, 3, true).is_empty(), "round {i}");
            assert!(r.record(&p, 0, true).is_empty(), "round {i}");
        }
        assert!(!r.banned(&p));
        assert!(!r.any_ban(), "no ban ever ran: the stream path takes no lock");
    }

    #[test]
    fn many_identities_from_one_address_ban_the_address_at_four_times_the_count() {
        let r = PeerResets::default();
        let mut bans = Vec::new();
        for i in 0..(MIN_PREMATURE * SOURCE_FACTOR) {
            // A fresh identity every 50 streams: none of them alone reaches the count.
            let p = peer(&format!("spiffe://cluster.local/ns/a/sa/s{}", i / 50), 9);
            bans.extend(r.record(&p, 0, true));
        }
        assert_eq!(bans.len(), 1, "{bans:?}");
        assert_eq!(bans[0].who, "source address 10.0.0.9");
        assert!(r.source_banned(IpAddr::from([10, 0, 0, 9])));
    }

    #[test]
    fn bounded_the_quietest_peer_goes_first() {
        let r = PeerResets::default();
        for i in 0..(MAX_PEERS as u32 + 100) {
            let p = Peer { identity: Arc::from(format!("id{i}")), source: IpAddr::from(i.to_be_bytes()) };
            r.record(&p, 1, false);
        }
        assert!(r.entries.lock().len() <= MAX_PEERS);
        assert!(r.record(&peer("x", 1), 0, false).is_empty(), "nothing to report takes no lock");
    }
}
