//! OTLP encoding of the access records for their OpenTelemetry export (issue #28, README "Access logs over
//! OpenTelemetry"): when the control side turns export on (`configure`), every access event drained from the event
//! queue (`Events::drain_json`, every 250 ms) is also encoded here as an OTLP `LogRecord` and queued, bounded; the
//! control side takes whole `ExportLogsServiceRequest`s (`take`) and hands them to the OpenTelemetry project's
//! transport. JavaScript never builds or encodes a record: in the daemon's main thread (V8 without its optimizing
//! compiler) encoding cost about 75 µs a record, here about 1 µs, off every connection's path.
//!
//! The messages are opentelemetry-proto's (collector/logs/v1, logs/v1, resource/v1, common/v1), declared here with
//! prost's derive for the few fields written (the `opentelemetry-proto` crate's prost types come with tonic).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use prost::Message;
use serde_json::{Map, Value};

use crate::events::{Event, Level};

#[derive(Clone, PartialEq, prost::Message)]
pub struct AnyValue {
    #[prost(oneof = "any_value::Value", tags = "1, 2, 3, 4")]
    pub value: Option<any_value::Value>,
}

pub mod any_value {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(string, tag = "1")]
        StringValue(String),
        #[prost(bool, tag = "2")]
        BoolValue(bool),
        #[prost(int64, tag = "3")]
        IntValue(i64),
        #[prost(double, tag = "4")]
        DoubleValue(f64),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LogRecord {
    #[prost(fixed64, tag = "1")]
    pub time_unix_nano: u64,
    #[prost(int32, tag = "2")]
    pub severity_number: i32,
    #[prost(string, tag = "3")]
    pub severity_text: String,
    #[prost(message, optional, tag = "5")]
    pub body: Option<AnyValue>,
    #[prost(message, repeated, tag = "6")]
    pub attributes: Vec<KeyValue>,
    #[prost(fixed64, tag = "11")]
    pub observed_time_unix_nano: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ScopeLogs {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub log_records: Vec<LogRecord>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResourceLogs {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_logs: Vec<ScopeLogs>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportLogsServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_logs: Vec<ResourceLogs>,
}

fn string(s: impl Into<String>) -> Option<AnyValue> {
    Some(AnyValue { value: Some(any_value::Value::StringValue(s.into())) })
}

fn int(i: i64) -> Option<AnyValue> {
    Some(AnyValue { value: Some(any_value::Value::IntValue(i)) })
}

/// A JSON value as an attribute (as the SDK maps a JS value: an integer as int64, another number as a double).
fn any(v: &Value) -> Option<AnyValue> {
    use any_value::Value as V;
    let value = match v {
        Value::String(s) => V::StringValue(s.clone()),
        Value::Bool(b) => V::BoolValue(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => V::IntValue(i),
            None => V::DoubleValue(n.as_f64().unwrap_or(0.0)),
        },
        other => V::StringValue(other.to_string()),
    };
    Some(AnyValue { value: Some(value) })
}

fn key_values(map: &Map<String, Value>) -> Vec<KeyValue> {
    map.iter().map(|(k, v)| KeyValue { key: k.clone(), value: any(v) }).collect()
}

/// OTLP's SeverityNumber for a level (logs/v1).
fn severity(level: Level) -> i32 {
    match level {
        Level::Debug => 5,
        Level::Info => 9,
        Level::Warn => 13,
        Level::Error => 17,
    }
}

/// An access event as an OTLP log record: its message as the body; its fields under ztunnel's names, then the
/// semantic conventions' names for what they carry (`network.transport`, `source.address`/`.port`,
/// `destination.address`/`.port`).
pub fn log_record(e: &Event, time_unix_nano: u64) -> LogRecord {
    let mut attributes = key_values(&e.fields);
    attributes.push(KeyValue { key: "network.transport".into(), value: string("tcp") });
    for (field, prefix) in [("src.addr", "source"), ("dst.addr", "destination")] {
        if let Some(addr) = e.fields.get(field).and_then(Value::as_str).and_then(|a| a.parse::<SocketAddr>().ok()) {
            attributes.push(KeyValue { key: format!("{prefix}.address"), value: string(addr.ip().to_string()) });
            attributes.push(KeyValue { key: format!("{prefix}.port"), value: int(i64::from(addr.port())) });
        }
    }
    LogRecord {
        time_unix_nano,
        observed_time_unix_nano: time_unix_nano,
        severity_number: severity(e.level),
        severity_text: match e.level {
            Level::Debug => "DEBUG",
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        }
        .into(),
        body: string(e.message.clone()),
        attributes,
    }
}

/// A batch taken for export: a whole `ExportLogsServiceRequest`, and how many records it holds.
pub struct Batch {
    pub body: Vec<u8>,
    pub count: usize,
}

/// The export's queue of encoded records and what a batch starts with.
pub struct Exporter {
    /// The `resource` field of `ResourceLogs`, encoded once (key, length, message).
    resource_field: Vec<u8>,
    /// The `scope` field of `ScopeLogs`, encoded once.
    scope_field: Vec<u8>,
    max_queue: usize,
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    /// Encoded `LogRecord`s, oldest first.
    records: VecDeque<Vec<u8>>,
    /// Records dropped at the full queue since the last `take`.
    dropped: u64,
}

impl Exporter {
    /// `resource`: the daemon's resource attributes; `scope`: the instrumentation scope's name; `max_queue`: records
    /// that may wait (OTEL_BLRP_MAX_QUEUE_SIZE); past it a record is dropped and counted.
    pub fn new(resource: &Map<String, Value>, scope: &str, max_queue: usize) -> Exporter {
        let mut resource_field = Vec::new();
        prost::encoding::message::encode(1, &Resource { attributes: key_values(resource) }, &mut resource_field);
        let mut scope_field = Vec::new();
        prost::encoding::message::encode(1, &InstrumentationScope { name: scope.into() }, &mut scope_field);
        Exporter { resource_field, scope_field, max_queue: max_queue.max(1), queue: Mutex::default() }
    }

    /// Encodes and queues the access events among `events` (a drained batch).
    pub fn add<'a>(&self, events: impl IntoIterator<Item = &'a Event>) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let encoded: Vec<Vec<u8>> =
            events.into_iter().filter(|e| e.kind == "access").map(|e| log_record(e, now).encode_to_vec()).collect();
        if encoded.is_empty() {
            return;
        }
        let mut q = self.queue.lock();
        for r in encoded {
            if q.records.len() >= self.max_queue {
                q.dropped += 1;
            } else {
                q.records.push_back(r);
            }
        }
    }

    /// Up to `max` queued records as one request (None when none wait), and the records dropped since the last take.
    pub fn take(&self, max: usize) -> (Option<Batch>, u64) {
        let (records, dropped) = {
            let mut q = self.queue.lock();
            let n = q.records.len().min(max.max(1));
            (q.records.drain(..n).collect::<Vec<_>>(), std::mem::take(&mut q.dropped))
        };
        if records.is_empty() {
            return (None, dropped);
        }
        use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
        let framed = |len: usize| key_len(1) + encoded_len_varint(len as u64) + len;
        let scope_logs = self.scope_field.len() + records.iter().map(|r| framed(r.len())).sum::<usize>();
        let resource_logs = self.resource_field.len() + framed(scope_logs);
        let mut body = Vec::with_capacity(framed(resource_logs));
        encode_key(1, WireType::LengthDelimited, &mut body);
        encode_varint(resource_logs as u64, &mut body);
        body.extend_from_slice(&self.resource_field);
        encode_key(2, WireType::LengthDelimited, &mut body);
        encode_varint(scope_logs as u64, &mut body);
        body.extend_from_slice(&self.scope_field);
        for r in &records {
            encode_key(2, WireType::LengthDelimited, &mut body);
            encode_varint(r.len() as u64, &mut body);
            body.extend_from_slice(r);
        }
        (Some(Batch { body, count: records.len() }), dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields;

    fn access(n: u64) -> Event {
        Event {
            kind: "access",
            level: Level::Info,
            message: "connection complete".into(),
            fields: fields! {"src.addr" => "10.0.0.1:4000", "dst.addr" => "[fd00::1]:8080", "bytes_sent" => n, "ok" => true},
        }
    }

    #[test]
    fn a_batch_is_one_request_that_prost_reads_back() {
        let resource = fields! {"service.name" => "ztunnel-node", "k8s.node.name" => "n1"};
        let x = Exporter::new(&resource, "ztunnel-node.access", 100);
        let log = Event { kind: "log", level: Level::Info, message: "not exported".into(), fields: Map::new() };
        x.add([&access(1), &log, &access(2)]);
        let (batch, dropped) = x.take(10);
        let batch = batch.expect("two records");
        assert_eq!((batch.count, dropped), (2, 0));
        let req = ExportLogsServiceRequest::decode(batch.body.as_slice()).unwrap();
        let rl = &req.resource_logs[0];
        assert_eq!(rl.resource.as_ref().unwrap().attributes.len(), 2);
        let sl = &rl.scope_logs[0];
        assert_eq!(sl.scope.as_ref().unwrap().name, "ztunnel-node.access");
        let r = &sl.log_records[1];
        assert_eq!((r.severity_number, r.severity_text.as_str()), (9, "INFO"));
        assert_eq!(r.body, string("connection complete"));
        assert!(r.time_unix_nano > 1_600_000_000_000_000_000 && r.observed_time_unix_nano == r.time_unix_nano);
        let attr = |k: &str| r.attributes.iter().find(|a| a.key == k).and_then(|a| a.value.clone());
        assert_eq!(attr("bytes_sent"), int(2));
        assert_eq!(attr("ok"), Some(AnyValue { value: Some(any_value::Value::BoolValue(true)) }));
        assert_eq!(attr("source.address"), string("10.0.0.1"));
        assert_eq!(attr("source.port"), int(4000));
        assert_eq!(attr("destination.address"), string("fd00::1"));
        assert_eq!(attr("destination.port"), int(8080));
        assert_eq!(attr("network.transport"), string("tcp"));
        assert!(x.take(10).0.is_none(), "taken");
    }

    #[test]
    fn the_queue_is_bounded_and_counts_what_it_drops() {
        let x = Exporter::new(&Map::new(), "s", 3);
        let events: Vec<Event> = (0..5).map(access).collect();
        x.add(events.iter());
        let (batch, dropped) = x.take(2);
        assert_eq!((batch.unwrap().count, dropped), (2, 2));
        let (batch, dropped) = x.take(2);
        assert_eq!((batch.unwrap().count, dropped), (1, 0));
    }
}
