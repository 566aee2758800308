//! Events the dataplane reports to TS (access logs, warnings), queued here and drained in batches.
//!
//! Invariant: the queue is bounded; when full, events are counted as dropped instead of growing memory.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;
use serde_json::{Map, Value};

const CAPACITY: usize = 16_384;

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub kind: &'static str,
    pub level: Level,
    pub message: String,
    pub fields: Map<String, Value>,
}

#[derive(Default)]
pub struct Events {
    inner: Mutex<(VecDeque<Event>, u64)>,
}

impl Events {
    pub fn push(&self, e: Event) {
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
