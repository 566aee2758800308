//! One connection's result, for the three proxies that carry one (outbound, inbound HBONE, inbound plaintext): the
//! metrics guard that counts it (opened when the connection is set up, closed when the result is dropped; failed with
//! Istio's response flag) and ztunnel's "connection complete" access record (target `access`, its field names:
//! `src.addr`, `src.workload`, `src.namespace`, `src.identity`, `dst.addr`, `dst.hbone_addr`, `dst.service`,
//! `dst.workload`, `dst.namespace`, `dst.identity`, `direction`, `bytes_sent`, `bytes_recv`, `duration`, `error`),
//! written here and nowhere else. Info when it ended well, error otherwise; not even built below the access filter.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use super::ProxyInputs;
use crate::events::{Event, Level};
use crate::identity::Identity;
use crate::metrics::{ConnectionGuard, Counters, TrafficLabels};
use crate::state::Workload;

/// Who and what a connection joins, as its access record names them; what is unknown is left out.
pub struct AccessRecord<'a> {
    /// `inbound` or `outbound`.
    pub direction: &'static str,
    pub src_addr: SocketAddr,
    pub src_workload: Option<&'a Workload>,
    pub src_identity: Option<&'a Identity>,
    /// The destination the client asked for.
    pub dst_addr: SocketAddr,
    /// The HBONE peer dialed, when the connection went out through one.
    pub dst_hbone_addr: Option<SocketAddr>,
    /// The service's hostname, when the client addressed one.
    pub dst_service: Option<&'a str>,
    pub dst_workload: Option<&'a Workload>,
    /// The workload whose identity the destination proved (built only when the record is written).
    pub dst_identity_of: Option<&'a Workload>,
    /// The final destination behind a network gateway as it presented itself (double HBONE): wins over the above.
    pub dst_derived: Option<&'a crate::metrics::DerivedPeer>,
    /// Connect attempts (outbound; a retry tried another endpoint): written when more than one.
    pub attempts: u32,
}

/// A connection from the moment it is counted as opened to its end.
pub struct ConnectionResult {
    guard: ConnectionGuard,
    started: Instant,
}

impl ConnectionResult {
    /// Counts the connection as opened under `labels`; `started` is when it was accepted (the record's duration).
    pub fn open(pi: &ProxyInputs, labels: TrafficLabels, started: Instant) -> ConnectionResult {
        ConnectionResult { guard: pi.metrics.open(labels), started }
    }

    /// The byte counters the copy loops add to.
    pub fn counters(&self) -> Arc<Counters> {
        self.guard.counters.clone()
    }

    /// An end decided before any byte was copied and not logged as complete (a denial has its own record): the
    /// metrics count it failed with `flag`. Dropping the result closes it.
    pub fn fail(&mut self, flag: &'static str) {
        self.guard.fail(flag);
    }

    /// A connection handed over by a predecessor (`handover`): counted open here (the predecessor counted it
    /// opened), closed and failed as any other; `age` is how long ago the predecessor accepted it.
    pub fn adopt(pi: &ProxyInputs, labels: TrafficLabels, age: std::time::Duration) -> ConnectionResult {
        let now = Instant::now();
        ConnectionResult { guard: pi.metrics.adopt(labels), started: now.checked_sub(age).unwrap_or(now) }
    }

    /// The connection ended: `error`, with its response flag (`CONNECT`, `DENY`), marks it failed; the record says
    /// the bytes each way from this side's view (sent = toward the client).
    pub fn finish(
        self,
        pi: &ProxyInputs,
        record: &AccessRecord<'_>,
        sent: u64,
        received: u64,
        error: Option<(&'static str, String)>,
    ) {
        let level = if error.is_some() { Level::Error } else { Level::Info };
        let fields = if pi.events.enabled("access", level) { record_fields(record) } else { Default::default() };
        self.finish_with(pi, fields, sent, received, error)
    }

    /// `finish` with the record's identity fields already rendered (a connection a predecessor handed over, whose
    /// workloads this process may not hold).
    pub fn finish_with(
        mut self,
        pi: &ProxyInputs,
        mut f: serde_json::Map<String, serde_json::Value>,
        sent: u64,
        received: u64,
        error: Option<(&'static str, String)>,
    ) {
        let level = if error.is_some() { Level::Error } else { Level::Info };
        if let Some((flag, _)) = &error {
            self.guard.fail(flag);
        }
        if !pi.events.enabled("access", level) {
            return;
        }
        f.insert("bytes_sent".into(), sent.into());
        f.insert("bytes_recv".into(), received.into());
        f.insert("duration".into(), format!("{}ms", self.started.elapsed().as_millis()).into());
        if let Some((_, e)) = error {
            f.insert("error".into(), e.into());
        }
        pi.events.push(Event { kind: "access", level, message: "connection complete".into(), fields: f });
    }

    /// How long ago the connection was accepted.
    pub fn age(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    pub fn labels(&self) -> &Arc<TrafficLabels> {
        self.guard.labels()
    }
}

/// The access record's fields that name who and what (all but the bytes, the duration and the error).
pub fn record_fields(record: &AccessRecord<'_>) -> serde_json::Map<String, serde_json::Value> {
    let mut f = crate::fields! {
        "src.addr" => record.src_addr.to_string(),
        "dst.addr" => record.dst_addr.to_string(),
        "direction" => record.direction,
    };
    let mut put = |k: &str, v: String| {
        f.insert(k.into(), v.into());
    };
    if let Some(w) = record.src_workload {
        put("src.workload", w.name.to_string());
        put("src.namespace", w.namespace.to_string());
    }
    if let Some(id) = record.src_identity {
        put("src.identity", id.to_string());
    }
    if let Some(a) = record.dst_hbone_addr {
        put("dst.hbone_addr", a.to_string());
    }
    if let Some(s) = record.dst_service {
        put("dst.service", s.to_string());
    }
    let derived = record.dst_derived.and_then(|d| d.baggage.as_ref());
    match (derived, record.dst_workload) {
        (Some(b), _) => {
            put("dst.workload", b.workload_name.clone().unwrap_or_default());
            put("dst.namespace", b.namespace.clone().unwrap_or_default());
        }
        (None, Some(w)) => {
            put("dst.workload", w.name.to_string());
            put("dst.namespace", w.namespace.to_string());
        }
        (None, None) => {}
    }
    match (record.dst_derived.and_then(|d| d.identity.as_ref()), record.dst_identity_of) {
        (Some(id), _) => put("dst.identity", id.to_string()),
        (None, Some(w)) => put("dst.identity", w.identity().to_string()),
        (None, None) => {}
    }
    if record.attempts > 1 {
        f.insert("attempts".into(), record.attempts.into());
    }
    f
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::state::StateDelta;

    fn echo() -> Workload {
        let w = json!({"uid": "u-echo", "name": "echo", "namespace": "ns", "serviceAccount": "echo", "workloadIps": ["10.0.0.2"]});
        let delta: StateDelta = serde_json::from_value(json!({ "workloads": [w] })).unwrap();
        delta.validate().unwrap().workloads.pop().unwrap()
    }

    fn labels() -> TrafficLabels {
        TrafficLabels { reporter: "destination".into(), response_flags: "-".into(), ..Default::default() }
    }

    #[test]
    fn a_failed_connection_is_counted_failed_with_its_flag_and_logged_complete_with_its_record() {
        let dp = crate::Dataplane::from_json("{}").unwrap();
        let pi = dp.inputs().clone();
        let (w, peer, target) = (echo(), "10.0.0.1:5000".parse().unwrap(), "10.0.0.2:8080".parse().unwrap());
        let id: Identity = "spiffe://td/ns/ns/sa/sleep".parse().unwrap();
        let record = AccessRecord {
            direction: "inbound",
            src_addr: peer,
            src_workload: None,
            src_identity: Some(&id),
            dst_addr: target,
            dst_hbone_addr: None,
            dst_service: Some("echo.ns.svc"),
            dst_workload: Some(&w),
            dst_identity_of: Some(&w),
            dst_derived: None,
            attempts: 1,
        };
        let result = ConnectionResult::open(&pi, labels(), Instant::now());
        result.counters().sent.fetch_add(7, std::sync::atomic::Ordering::Relaxed);
        result.finish(&pi, &record, 7, 3, Some(("CONNECT", "upstream reset".into())));
        let events: Value = serde_json::from_str(&pi.events.drain_json()).unwrap();
        let e = &events[0];
        assert_eq!(
            (&e["kind"], &e["level"], &e["message"]),
            (&json!("access"), &json!("error"), &json!("connection complete"))
        );
        let f = &e["fields"];
        assert_eq!(f["src.addr"], "10.0.0.1:5000");
        assert_eq!(f["src.identity"], "spiffe://td/ns/ns/sa/sleep");
        assert_eq!(f["dst.addr"], "10.0.0.2:8080");
        assert_eq!((&f["dst.workload"], &f["dst.namespace"]), (&json!("echo"), &json!("ns")));
        assert_eq!(f["dst.identity"], "spiffe://cluster.local/ns/ns/sa/echo");
        assert_eq!(f["dst.service"], "echo.ns.svc");
        assert_eq!((&f["bytes_sent"], &f["bytes_recv"], &f["direction"]), (&json!(7), &json!(3), &json!("inbound")));
        assert_eq!(f["error"], "upstream reset");
        assert!(f["duration"].as_str().unwrap().ends_with("ms"));
        assert!(f.get("src.workload").is_none() && f.get("dst.hbone_addr").is_none(), "unknown fields are left out");
        let m: Value = serde_json::from_str(&pi.metrics.snapshot_json()).unwrap();
        let rows = m["connections"].as_array().unwrap();
        let row = |flag: &str| rows.iter().find(|r| r["labels"]["response_flags"] == flag).unwrap().clone();
        assert_eq!((&row("-")["opened"], &row("-")["closed"], &row("-")["sent"]), (&json!(1), &json!(1), &json!(7)));
        assert_eq!(row("CONNECT")["failed"], 1, "failed under its response flag");
        dp.shutdown();
    }

    #[test]
    fn below_the_access_filter_nothing_is_built_but_the_connection_is_still_counted() {
        let dp = crate::Dataplane::from_json("{}").unwrap();
        let pi = dp.inputs().clone();
        pi.events.set_min_levels(crate::events::parse_min_level("off").unwrap(), 0);
        let w = echo();
        let record = AccessRecord {
            direction: "outbound",
            src_addr: "10.0.0.1:5000".parse().unwrap(),
            src_workload: Some(&w),
            src_identity: None,
            dst_addr: "10.0.0.2:8080".parse().unwrap(),
            dst_hbone_addr: Some("10.0.0.2:15008".parse().unwrap()),
            dst_service: None,
            dst_workload: None,
            dst_identity_of: None,
            dst_derived: None,
            attempts: 1,
        };
        ConnectionResult::open(&pi, labels(), Instant::now()).finish(&pi, &record, 1, 1, None);
        assert_eq!(pi.events.drain_json(), "[]");
        let m: Value = serde_json::from_str(&pi.metrics.snapshot_json()).unwrap();
        assert_eq!((&m["connections"][0]["opened"], &m["connections"][0]["closed"]), (&json!(1), &json!(1)));
        dp.shutdown();
    }
}
