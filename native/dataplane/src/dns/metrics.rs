//! The DNS proxy's counters, under ztunnel's names and labels (request_query_type in lowercase, request_protocol,
//! source_canonical_service, source_canonical_revision), read by TS once per scrape.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hickory_proto::rr::RecordType;
use serde::Serialize;

use super::Transport;
use crate::state::Workload;

/// ztunnel's buckets for `istio_dns_upstream_request_duration_seconds`.
pub const DURATION_BUCKETS: [f64; 6] = [0.0005, 0.001, 0.01, 0.1, 1.0, 5.0];

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "DnsLabels"))]
pub struct Labels {
    pub request_query_type: String,
    pub request_protocol: &'static str,
    pub source_canonical_service: String,
    pub source_canonical_revision: String,
}

impl Labels {
    pub fn new(qtype: RecordType, transport: Transport, client: Option<&Workload>) -> Labels {
        Labels {
            request_query_type: qtype.to_string().to_ascii_lowercase(),
            request_protocol: transport.label(),
            source_canonical_service: client.map(|w| w.canonical_name.to_string()).unwrap_or_default(),
            source_canonical_revision: client.map(|w| w.canonical_revision.to_string()).unwrap_or_default(),
        }
    }
}

#[derive(Debug, Default, Clone, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "DnsCounts"))]
#[serde(rename_all = "camelCase")]
struct Counts {
    #[cfg_attr(test, ts(type = "number"))]
    requests: u64,
    #[cfg_attr(test, ts(type = "number"))]
    upstream_requests: u64,
    #[cfg_attr(test, ts(type = "number"))]
    upstream_failures: u64,
    /// Cumulative per bucket of DURATION_BUCKETS (Prometheus' `le`): 0.0005, 0.001, 0.01, 0.1, 1 and 5 s.
    #[cfg_attr(test, ts(type = "Array<number>"))]
    duration_buckets: [u64; 6],
    duration_sum: f64,
    #[cfg_attr(test, ts(type = "number"))]
    duration_count: u64,
}

#[derive(Default)]
pub struct DnsMetrics {
    by_labels: Mutex<HashMap<Labels, Counts>>,
    /// Questions dropped or connections refused at a server's cap.
    dropped: AtomicU64,
    /// Forwarded questions answered from a cache, and asked upstream instead (`cache`).
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    /// Answers the servers' caches hold.
    cache_entries: std::sync::atomic::AtomicI64,
}

#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "DnsRow"))]
struct Row<'a> {
    labels: &'a Labels,
    #[serde(flatten)]
    counts: &'a Counts,
}

/// The DNS proxy's counters, as the control side reads them (`Metrics::snapshot`).
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "DnsCounters"))]
#[serde(rename_all = "camelCase")]
pub struct DnsSnapshot<'a> {
    rows: Vec<Row<'a>>,
    /// Questions dropped, or TCP connections refused, at a server's cap.
    #[cfg_attr(test, ts(type = "number"))]
    dropped: u64,
    /// Questions the mesh does not answer that a cache did (`dns::cache`), and that went upstream.
    #[cfg_attr(test, ts(type = "number"))]
    cache_hits: u64,
    #[cfg_attr(test, ts(type = "number"))]
    cache_misses: u64,
    /// Answers held in the DNS servers' caches.
    #[cfg_attr(test, ts(type = "number"))]
    cache_entries: i64,
}

impl DnsMetrics {
    fn with(&self, l: &Labels, f: impl FnOnce(&mut Counts)) {
        let mut m = self.by_labels.lock();
        match m.get_mut(l) {
            Some(c) => f(c),
            None => f(m.entry(l.clone()).or_default()),
        }
    }

    pub fn request(&self, l: &Labels) {
        self.with(l, |c| c.requests += 1);
    }

    pub fn upstream_request(&self, l: &Labels) {
        self.with(l, |c| c.upstream_requests += 1);
    }

    pub fn upstream_failure(&self, l: &Labels) {
        self.with(l, |c| c.upstream_failures += 1);
    }

    pub fn upstream_duration(&self, l: &Labels, d: Duration) {
        let secs = d.as_secs_f64();
        self.with(l, |c| {
            for (i, le) in DURATION_BUCKETS.iter().enumerate() {
                if secs <= *le {
                    c.duration_buckets[i] += 1;
                }
            }
            c.duration_sum += secs;
            c.duration_count += 1;
        });
    }

    pub fn dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    pub fn cache_lookup(&self, hit: bool) {
        let c = if hit { &self.cache_hits } else { &self.cache_misses };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn cache_entries(&self, delta: i64) {
        self.cache_entries.fetch_add(delta, Ordering::Relaxed);
    }

    /// Serialized while `f` holds it (the rows borrow the counters under their lock).
    pub fn with_snapshot<T>(&self, f: impl FnOnce(&DnsSnapshot<'_>) -> T) -> T {
        let m = self.by_labels.lock();
        let rows: Vec<Row<'_>> = m.iter().map(|(labels, counts)| Row { labels, counts }).collect();
        f(&DnsSnapshot {
            rows,
            dropped: self.dropped.load(Ordering::Relaxed),
            cache_hits: self.cache_hits.load(Ordering::Relaxed),
            cache_misses: self.cache_misses.load(Ordering::Relaxed),
            cache_entries: self.cache_entries.load(Ordering::Relaxed),
        })
    }

    pub fn snapshot(&self) -> serde_json::Value {
        self.with_snapshot(|s| serde_json::to_value(s).expect("serializable"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_fill_cumulative_buckets() {
        let m = DnsMetrics::default();
        let l = Labels::new(RecordType::A, Transport::Udp, None);
        m.upstream_duration(&l, Duration::from_micros(700));
        m.upstream_duration(&l, Duration::from_secs(2));
        let v = m.snapshot();
        let row = &v["rows"][0];
        assert_eq!(row["labels"]["request_query_type"], "a");
        assert_eq!(row["labels"]["request_protocol"], "udp");
        assert_eq!(row["durationBuckets"], serde_json::json!([0, 1, 1, 1, 1, 2]));
        assert_eq!(row["durationCount"], 2);
    }
}
