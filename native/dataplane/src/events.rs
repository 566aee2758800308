//! Events the dataplane reports to TS (access logs, warnings), queued here and drained in batches.
//!
//! Invariants:
//! - The queue is bounded; when full, events are counted as dropped instead of growing memory.
//! - An event below the level TS set for its kind (the `access` and `dataplane` log targets) is never queued, and
//!   the per-connection producers check `enabled` first, so a filtered-out access log costs neither the fields nor
//!   a trip through JSON into JavaScript.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

use serde::Serialize;
use serde_json::{Map, Value};

const CAPACITY: usize = 16_384;

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

/// The least severe level a kind of event is reported at; `OFF` reports none.
const OFF: u8 = Level::Error as u8 + 1;

/// A log filter level by name (RUST_LOG's: trace is reported as debug).
pub fn parse_min_level(s: &str) -> Option<u8> {
    Some(match s {
        "trace" | "debug" => Level::Debug as u8,
        "info" => Level::Info as u8,
        "warn" => Level::Warn as u8,
        "error" => Level::Error as u8,
        "off" => OFF,
        _ => return None,
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub kind: &'static str,
    pub level: Level,
    pub message: String,
    pub fields: Map<String, Value>,
}

/// Every level is reported until TS says otherwise.
#[derive(Default)]
pub struct Events {
    inner: Mutex<(VecDeque<Event>, u64)>,
    min_access: AtomicU8,
    min_log: AtomicU8,
    min_dns: AtomicU8,
}

impl Events {
    /// The filter levels of access events and of the other ("dataplane") events, from `parse_min_level`.
    pub fn set_min_levels(&self, access: u8, log: u8) {
        self.min_access.store(access, Ordering::Relaxed);
        self.min_log.store(log, Ordering::Relaxed);
    }

    /// The filter level of the DNS proxy's records (kind `dns`).
    pub fn set_dns_level(&self, dns: u8) {
        self.min_dns.store(dns, Ordering::Relaxed);
    }

    /// Whether an event of this kind and level would be reported: check before building one on a hot path.
    pub fn enabled(&self, kind: &str, level: Level) -> bool {
        let min = match kind {
            "access" => &self.min_access,
            "dns" => &self.min_dns,
            _ => &self.min_log,
        };
        level as u8 >= min.load(Ordering::Relaxed)
    }

    pub fn push(&self, e: Event) {
        if !self.enabled(e.kind, e.level) {
            return;
        }
        let mut g = self.inner.lock().expect("events lock");
        if g.0.len() >= CAPACITY {
            g.1 += 1;
        } else {
            g.0.push_back(e);
        }
    }

    pub fn log(&self, level: Level, message: impl Into<String>, fields: Map<String, Value>) {
        self.push(Event { kind: "log", level, message: message.into(), fields });
    }

    pub fn drain_json(&self) -> String {
        let (events, dropped) = {
            let mut g = self.inner.lock().expect("events lock");
            (std::mem::take(&mut g.0), std::mem::take(&mut g.1))
        };
        let mut out: Vec<Value> = events.into_iter().map(|e| serde_json::to_value(e).unwrap_or(Value::Null)).collect();
        if dropped > 0 {
            out.push(serde_json::json!({"kind": "dropped", "count": dropped}));
        }
        Value::Array(out).to_string()
    }
}

/// Build a field map: `fields!{"src.addr" => addr.to_string(), "bytes_sent" => 12}`.
#[macro_export]
macro_rules! fields {
    ($($k:expr => $v:expr),* $(,)?) => {{
        #[allow(unused_mut)]
        let mut m = serde_json::Map::new();
        $( m.insert($k.to_string(), serde_json::Value::from($v)); )*
        m
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: &'static str, level: Level) -> Event {
        Event { kind, level, message: "m".into(), fields: Map::new() }
    }

    #[test]
    fn events_below_their_kinds_level_are_not_queued() {
        let e = Events::default();
        assert!(e.enabled("access", Level::Debug), "everything is reported until levels are set");
        e.set_min_levels(parse_min_level("warn").unwrap(), parse_min_level("info").unwrap());
        assert!(!e.enabled("access", Level::Info));
        assert!(e.enabled("access", Level::Warn));
        assert!(e.enabled("log", Level::Info));
        e.push(ev("access", Level::Info));
        e.push(ev("access", Level::Error));
        e.push(ev("log", Level::Debug));
        e.push(ev("log", Level::Info));
        let out: Vec<Value> = serde_json::from_str(&e.drain_json()).unwrap();
        let got: Vec<(String, String)> =
            out.iter().map(|v| (v["kind"].as_str().unwrap().into(), v["level"].as_str().unwrap().into())).collect();
        assert_eq!(got, vec![("access".into(), "error".into()), ("log".into(), "info".into())]);
        e.set_min_levels(parse_min_level("off").unwrap(), parse_min_level("trace").unwrap());
        assert!(!e.enabled("access", Level::Error));
        assert!(e.enabled("log", Level::Debug));
        assert_eq!(parse_min_level("verbose"), None);
    }
}
