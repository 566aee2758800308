//! Events the dataplane reports to TS (access logs, warnings), queued here and drained in batches.
//!
//! Invariants:
//! - The queue is bounded; when full, events are counted as dropped instead of growing memory.
//! - An event below the level TS set for its kind (the `access` and `dataplane` log targets) is never queued, and
//!   the per-connection producers check `enabled` first, so a filtered-out access log costs neither the fields nor
//!   a trip through JSON into JavaScript.
//! - Warnings and errors are rate limited per cause (kind and message): at most `PER_CAUSE_PER_SECOND` a second
//!   each; the rest are counted and reported as one `suppressed` event per cause and window, so a flood of refused
//!   streams cannot flood the log.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Map, Value};

const CAPACITY: usize = 16_384;
/// Warnings and errors of one cause reported per window; the rest are counted.
pub const PER_CAUSE_PER_SECOND: u32 = 100;
const WINDOW: Duration = Duration::from_secs(1);

/// One cause's current window.
struct Window {
    start: Instant,
    count: u32,
    suppressed: u64,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "EventLevel"))]
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

/// One event of `drainEvents()`. A `suppressed` event's fields are `kind` (the cause's kind) and `count` (lines not
/// logged); its message is the cause's.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "LogEvent"))]
pub struct Event {
    #[cfg_attr(test, ts(type = "\"access\" | \"log\" | \"dns\" | \"suppressed\""))]
    pub kind: &'static str,
    pub level: Level,
    pub message: String,
    #[cfg_attr(test, ts(type = "Record<string, string | number | boolean>"))]
    pub fields: Map<String, Value>,
}

/// The last entry of a `drainEvents()` batch when the queue overflowed: how many events were dropped.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
pub struct DroppedEvents {
    #[cfg_attr(test, ts(type = "\"dropped\""))]
    kind: &'static str,
    #[cfg_attr(test, ts(type = "number"))]
    count: u64,
}

/// Every level is reported until TS says otherwise.
#[derive(Default)]
struct Queue {
    events: VecDeque<Event>,
    dropped: u64,
    windows: HashMap<(&'static str, String), Window>,
}

impl Queue {
    fn enqueue(&mut self, e: Event) {
        if self.events.len() >= CAPACITY {
            self.dropped += 1;
        } else {
            self.events.push_back(e);
        }
    }

    /// Report the suppressed count of every window that has ended (`all`: of every window).
    fn flush_windows(&mut self, now: Instant, all: bool) {
        let mut ended = Vec::new();
        self.windows.retain(|(kind, message), w| {
            let over = all || now.duration_since(w.start) >= WINDOW;
            if over && w.suppressed > 0 {
                ended.push(suppressed_event(kind, message, w.suppressed));
            }
            !over
        });
        for e in ended {
            self.enqueue(e);
        }
    }
}

fn suppressed_event(kind: &str, message: &str, count: u64) -> Event {
    Event {
        kind: "suppressed",
        level: Level::Warn,
        message: message.to_string(),
        fields: crate::fields! {"kind" => kind, "count" => count},
    }
}

#[derive(Default)]
pub struct Events {
    inner: Mutex<Queue>,
    /// The OTLP export of access records, once the control side turns it on: drained access events are encoded there.
    otlp: std::sync::OnceLock<crate::otlp::Exporter>,
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
        let mut g = self.inner.lock();
        if e.level >= Level::Warn {
            let now = Instant::now();
            let (report, allowed) = {
                let w = g.windows.entry((e.kind, e.message.clone())).or_insert(Window {
                    start: now,
                    count: 0,
                    suppressed: 0,
                });
                let mut report = 0;
                if now.duration_since(w.start) >= WINDOW {
                    report = std::mem::take(&mut w.suppressed);
                    (w.start, w.count) = (now, 0);
                }
                w.count += 1;
                let allowed = w.count <= PER_CAUSE_PER_SECOND;
                if !allowed {
                    w.suppressed += 1;
                }
                (report, allowed)
            };
            if report > 0 {
                g.enqueue(suppressed_event(e.kind, &e.message, report));
            }
            if !allowed {
                return;
            }
        }
        g.enqueue(e);
    }

    pub fn log(&self, level: Level, message: impl Into<String>, fields: Map<String, Value>) {
        self.push(Event { kind: "log", level, message: message.into(), fields });
    }

    /// Turns the OTLP export of access records on (once; false if it already was).
    pub fn export_otlp(&self, exporter: crate::otlp::Exporter) -> bool {
        self.otlp.set(exporter).is_ok()
    }

    pub fn otlp(&self) -> Option<&crate::otlp::Exporter> {
        self.otlp.get()
    }

    pub fn drain_json(&self) -> String {
        let (events, dropped) = {
            let mut g = self.inner.lock();
            g.flush_windows(Instant::now(), false);
            (std::mem::take(&mut g.events), std::mem::take(&mut g.dropped))
        };
        if let Some(x) = self.otlp.get() {
            x.add(events.iter());
        }
        let mut out: Vec<Value> = events.into_iter().map(|e| serde_json::to_value(e).unwrap_or(Value::Null)).collect();
        if dropped > 0 {
            out.push(serde_json::to_value(DroppedEvents { kind: "dropped", count: dropped }).unwrap_or(Value::Null));
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

    #[test]
    fn warnings_of_one_cause_are_rate_limited_and_the_rest_counted() {
        let e = Events::default();
        for _ in 0..(PER_CAUSE_PER_SECOND + 50) {
            e.push(Event {
                kind: "access",
                level: Level::Warn,
                message: "connection failed".into(),
                fields: Map::new(),
            });
        }
        e.push(Event { kind: "access", level: Level::Warn, message: "connection denied".into(), fields: Map::new() });
        for _ in 0..500 {
            e.push(ev("access", Level::Info));
        }
        let out: Vec<Value> = serde_json::from_str(&e.drain_json()).unwrap();
        let count = |m: &str| out.iter().filter(|v| v["message"] == m && v["kind"] == "access").count();
        assert_eq!(count("connection failed"), PER_CAUSE_PER_SECOND as usize);
        assert_eq!(count("connection denied"), 1, "another cause has its own allowance");
        assert_eq!(count("m"), 500, "info events are not limited");
        // The window has not ended: the count is reported when it does (here: forced).
        e.inner.lock().flush_windows(Instant::now(), true);
        let out: Vec<Value> = serde_json::from_str(&e.drain_json()).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["kind"], "suppressed");
        assert_eq!(out[0]["message"], "connection failed");
        assert_eq!(out[0]["fields"]["count"], 50);
        assert_eq!(out[0]["fields"]["kind"], "access");
    }
}
