//! Passive outlier detection for outbound connects (beyond ztunnel; Envoy's outlier detection by consecutive gateway
//! failures): an endpoint whose connects failed `consecutive_failures` times in a row is ejected, skipped by load
//! balancing for an ejection time that grows with each ejection (`base × n`, at most `max`), then tried again.
//!
//! - Per node, keyed by workload uid, bounded: at most `MAX_TRACKED` endpoints; a new one past that evicts the
//!   longest-quiet endpoint that is not ejected (an ejected one is never forgotten early), else is not tracked.
//! - A success resets the endpoint's count; an endpoint ejected long ago (`max`) that succeeds is forgotten, and so
//!   is one istiod reports anew as healthy (`forget`: the state changed it).
//! - Choosing skips ejected endpoints, but never more than `max_ejection_percent` of the candidates (rounded up)
//!   and never all of them: an ejected endpoint is better than none.
//! - Nothing is locked on the connect path while nothing is tracked (one atomic load).
//! - Time is the detector's clock: the monotonic clock plus an offset that only tests move (`advance`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

/// How many endpoints one node tracks at most (about 100 bytes each).
pub const MAX_TRACKED: usize = 16_384;

/// The detector's settings (the dataplane config's `resilience`).
pub use crate::config::OutlierConfig;

#[derive(Debug, Clone, Copy)]
struct Health {
    /// Connect failures since the last success or ejection.
    failures: u32,
    /// Ejections so far (the multiplier of the next one).
    ejections: u32,
    ejected_until: Option<Instant>,
    /// The last failure, success or ejection: eviction takes the quietest.
    touched: Instant,
    /// When the last ejection began (an endpoint is forgotten `max` after it).
    ejected_at: Option<Instant>,
}

/// One tracked endpoint, for config_dump.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase")]
pub struct OutlierEndpoint {
    pub uid: String,
    pub consecutive_failures: u32,
    pub ejections: u32,
    /// Milliseconds until it is tried again; absent when it is not ejected.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(optional, type = "number"))]
    pub ejected_for_ms: Option<u64>,
}

pub struct Outliers {
    cfg: OutlierConfig,
    tracked: Mutex<HashMap<Arc<str>, Health>>,
    /// Entries in `tracked`: the connect path looks at nothing else while it is 0.
    len: AtomicUsize,
    /// The test clock's offset, in milliseconds.
    offset_ms: AtomicU64,
    pub ejections_total: AtomicU64,
    /// Connects retried on another endpoint (counted by the outbound path).
    pub retries_total: AtomicU64,
}

impl Default for Outliers {
    fn default() -> Self {
        Outliers::new(crate::config::ResilienceConfig::default().outliers())
    }
}

impl Outliers {
    pub fn new(cfg: OutlierConfig) -> Outliers {
        Outliers {
            cfg,
            tracked: Mutex::new(HashMap::new()),
            len: AtomicUsize::new(0),
            offset_ms: AtomicU64::new(0),
            ejections_total: AtomicU64::new(0),
            retries_total: AtomicU64::new(0),
        }
    }

    pub fn now(&self) -> Instant {
        Instant::now() + Duration::from_millis(self.offset_ms.load(Ordering::Relaxed))
    }

    /// Tests only: move the detector's clock forward.
    pub fn advance(&self, by: Duration) {
        self.offset_ms.fetch_add(by.as_millis() as u64, Ordering::Relaxed);
    }

    /// Whether anything is tracked (else choosing needs no lookup).
    pub fn is_idle(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    /// A connect to `uid` succeeded.
    pub fn success(&self, uid: &str) {
        if self.is_idle() {
            return;
        }
        let now = self.now();
        let mut t = self.tracked.lock();
        let Some(h) = t.get_mut(uid) else { return };
        h.failures = 0;
        h.touched = now;
        let ejected = h.ejected_until.is_some_and(|u| u > now);
        let long_ago = h.ejected_at.is_none_or(|at| now.duration_since(at) >= self.cfg.max_ejection);
        if !ejected && long_ago {
            t.remove(uid);
            self.len.store(t.len(), Ordering::Relaxed);
        }
    }

    /// A connect to `uid` failed as a dead endpoint fails; true when this failure ejected it.
    pub fn failure(&self, uid: &Arc<str>) -> bool {
        if self.cfg.consecutive_failures == 0 {
            return false;
        }
        let now = self.now();
        let mut t = self.tracked.lock();
        if !t.contains_key(uid) && t.len() >= MAX_TRACKED && !evict_one(&mut t, now) {
            return false;
        }
        let h = t.entry(uid.clone()).or_insert(Health {
            failures: 0,
            ejections: 0,
            ejected_until: None,
            touched: now,
            ejected_at: None,
        });
        h.touched = now;
        if h.ejected_until.is_some_and(|u| u > now) {
            return false; // already out (a connect chosen before the ejection)
        }
        h.failures += 1;
        let ejected = h.failures >= self.cfg.consecutive_failures;
        if ejected {
            h.ejections = h.ejections.saturating_add(1);
            let length = self.cfg.base_ejection.saturating_mul(h.ejections).min(self.cfg.max_ejection);
            h.ejected_until = Some(now + length);
            h.ejected_at = Some(now);
            h.failures = 0;
            self.ejections_total.fetch_add(1, Ordering::Relaxed);
        }
        self.len.store(t.len(), Ordering::Relaxed);
        ejected
    }

    /// istiod said something new of `uid` and calls it healthy: its ejection and history end.
    pub fn forget(&self, uid: &str) {
        if self.is_idle() {
            return;
        }
        let mut t = self.tracked.lock();
        if t.remove(uid).is_some() {
            self.len.store(t.len(), Ordering::Relaxed);
        }
    }

    /// `candidates` without the ejected ones, at most the configured share of them (rounded up) and never all.
    pub fn skip_ejected<T>(&self, candidates: Vec<T>, uid: impl Fn(&T) -> &str) -> Vec<T> {
        if self.is_idle() || candidates.len() < 2 {
            return candidates;
        }
        let now = self.now();
        let n = candidates.len();
        let share = (n * self.cfg.max_ejection_percent as usize).div_ceil(100);
        let mut allowed = share.min(n - 1);
        if allowed == 0 {
            return candidates;
        }
        let t = self.tracked.lock();
        let ejected = |c: &T| t.get(uid(c)).and_then(|h| h.ejected_until).is_some_and(|u| u > now);
        candidates
            .into_iter()
            .filter(|c| {
                if allowed > 0 && ejected(c) {
                    allowed -= 1;
                    false
                } else {
                    true
                }
            })
            .collect()
    }

    /// Endpoints ejected now.
    pub fn ejected_count(&self) -> usize {
        if self.is_idle() {
            return 0;
        }
        let now = self.now();
        self.tracked.lock().values().filter(|h| h.ejected_until.is_some_and(|u| u > now)).count()
    }

    /// Every tracked endpoint, by uid (config_dump).
    pub fn dump(&self) -> Vec<OutlierEndpoint> {
        let now = self.now();
        let mut out: Vec<OutlierEndpoint> = self
            .tracked
            .lock()
            .iter()
            .map(|(uid, h)| OutlierEndpoint {
                uid: uid.to_string(),
                consecutive_failures: h.failures,
                ejections: h.ejections,
                ejected_for_ms: h
                    .ejected_until
                    .filter(|u| *u > now)
                    .map(|u| u.duration_since(now).as_millis().try_into().unwrap_or(u64::MAX)),
            })
            .collect();
        out.sort_by(|a, b| a.uid.cmp(&b.uid));
        out
    }
}

/// Makes room: drops the quietest endpoint that is not ejected now; false when every one is.
fn evict_one(t: &mut HashMap<Arc<str>, Health>, now: Instant) -> bool {
    let victim = t
        .iter()
        .filter(|(_, h)| h.ejected_until.is_none_or(|u| u <= now))
        .min_by_key(|(_, h)| h.touched)
        .map(|(k, _)| k.clone());
    match victim {
        Some(k) => t.remove(&k).is_some(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detector() -> Outliers {
        Outliers::new(OutlierConfig {
            consecutive_failures: 3,
            base_ejection: Duration::from_secs(30),
            max_ejection: Duration::from_secs(75),
            max_ejection_percent: 50,
        })
    }

    /// Three failures in a row: the detector's threshold.
    fn eject(o: &Outliers, uid: &str) {
        let uid: Arc<str> = uid.into();
        for _ in 0..3 {
            o.failure(&uid);
        }
    }

    /// The ejection left, give or take the milliseconds the test itself took.
    fn assert_near(ms: Option<u64>, want: u64, what: &str) {
        let ms = ms.expect("ejected");
        assert!(ms <= want && ms + 1_000 > want, "{what}: {ms} ms left, want {want}");
    }

    #[test]
    fn consecutive_failures_eject_for_a_time_that_grows_and_a_success_resets_the_count() {
        let o = detector();
        let a: Arc<str> = "a".into();
        assert!(!o.failure(&a) && !o.failure(&a));
        o.success("a");
        assert!(!o.failure(&a) && !o.failure(&a), "the success reset the count");
        assert!(o.failure(&a), "the third in a row ejects");
        assert_eq!(o.ejected_count(), 1);
        assert_near(o.dump()[0].ejected_for_ms, 30_000, "the first ejection");
        o.advance(Duration::from_secs(30));
        assert_eq!(o.ejected_count(), 0, "back after the base ejection time");
        for _ in 0..2 {
            assert!(!o.failure(&a));
        }
        assert!(o.failure(&a));
        assert_near(o.dump()[0].ejected_for_ms, 60_000, "the second ejection lasts twice as long");
        o.advance(Duration::from_secs(60));
        for _ in 0..3 {
            o.failure(&a);
        }
        assert_near(o.dump()[0].ejected_for_ms, 75_000, "at most max_ejection");
        assert_eq!(o.ejections_total.load(Ordering::Relaxed), 3);
        // Returned and quiet for max_ejection after its last ejection: a success forgets it.
        o.advance(Duration::from_secs(75));
        o.success("a");
        assert!(o.dump().is_empty() && o.is_idle());
    }

    #[test]
    fn choosing_skips_ejected_endpoints_up_to_the_share_and_never_all() {
        let o = detector();
        let skip = |v: Vec<&'static str>| o.skip_ejected(v, |s| s);
        assert_eq!(skip(vec!["a", "b", "c"]), ["a", "b", "c"], "nothing tracked");
        for uid in ["a", "b", "c", "d"] {
            eject(&o, uid);
        }
        // 50 % of five, rounded up: three may go of the four out; of three, two; of two, one; of one, none.
        assert_eq!(skip(vec!["a", "b", "c", "d", "e"]), ["d", "e"]);
        assert_eq!(skip(vec!["a", "b", "x"]), ["x"]);
        assert_eq!(skip(vec!["a", "b"]), ["b"]);
        assert_eq!(skip(vec!["a"]), ["a"], "an ejected endpoint is better than none");
    }

    #[test]
    fn bounded_memory_evicts_the_quietest_endpoint_that_is_not_ejected() {
        let o = detector();
        eject(&o, "ejected");
        for i in 0..MAX_TRACKED + 10 {
            o.advance(Duration::from_millis(1));
            o.failure(&Arc::from(format!("e{i}").as_str()));
        }
        let dump = o.dump();
        assert_eq!(dump.len(), MAX_TRACKED);
        assert!(dump.iter().any(|e| e.uid == "ejected"), "an ejected endpoint is kept");
        assert!(!dump.iter().any(|e| e.uid == "e0"), "the quietest went first");
    }

    #[test]
    fn istiod_s_word_ends_an_ejection_and_zero_failures_turns_ejection_off() {
        let o = detector();
        eject(&o, "a");
        o.forget("a");
        let a: Arc<str> = "a".into();
        assert_eq!(o.ejected_count(), 0);
        let off = Outliers::new(OutlierConfig { consecutive_failures: 0, ..o.cfg });
        for _ in 0..10 {
            assert!(!off.failure(&a));
        }
        assert!(off.is_idle());
    }
}
