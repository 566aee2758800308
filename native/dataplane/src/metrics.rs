//! Connection metrics kept in Rust and read by TS in one batch per scrape.
//!
//! Invariant: nothing here is on the per-byte path except one relaxed atomic add per chunk copied; label sets are
//! resolved once per connection (a mutex-protected map lookup at open time).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;

use crate::identity::Identity;
use crate::state::{Service, Workload};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reporter {
    Source,
    Destination,
}

/// Istio's `CommonTrafficLabels`, in order. Empty strings render as "unknown" on the TS side.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, serde::Deserialize, Default)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
pub struct TrafficLabels {
    pub reporter: String,
    pub source_workload: String,
    pub source_canonical_service: String,
    pub source_canonical_revision: String,
    pub source_workload_namespace: String,
    pub source_principal: String,
    pub source_app: String,
    pub source_version: String,
    pub source_cluster: String,
    pub destination_service: String,
    pub destination_service_namespace: String,
    pub destination_service_name: String,
    pub destination_workload: String,
    pub destination_canonical_service: String,
    pub destination_canonical_revision: String,
    pub destination_workload_namespace: String,
    pub destination_principal: String,
    pub destination_app: String,
    pub destination_version: String,
    pub destination_cluster: String,
    pub request_protocol: String,
    pub response_flags: String,
    pub connection_security_policy: String,
    pub source_region: String,
    pub source_zone: String,
    pub destination_region: String,
    pub destination_zone: String,
}

/// What is known about one connection when it opens.
pub struct ConnectionInfo<'a> {
    pub reporter: Reporter,
    pub source: Option<&'a Workload>,
    pub source_identity: Option<&'a Identity>,
    pub destination: Option<&'a Workload>,
    pub destination_identity: Option<&'a Identity>,
    pub destination_service: Option<&'a Service>,
    pub mutual_tls: bool,
    /// What the peer's `baggage` says of the source, for a source workload not known here (ztunnel's derived source).
    pub derived_source: Option<&'a Baggage>,
    /// The final destination as it presented itself behind a network gateway (double HBONE), where this node only
    /// knows the gateway: ztunnel's derived destination, which wins over `destination` and its identity.
    pub derived_destination: Option<&'a DerivedPeer>,
}

/// A peer known by what it said of itself: its `baggage` (the 200 of a double-HBONE inner CONNECT), and the
/// identity its TLS handshake proved.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DerivedPeer {
    pub baggage: Option<Baggage>,
    pub identity: Option<Identity>,
}

/// A peer's W3C `baggage` header as ztunnel reads it (`src/baggage.rs` `parse_baggage_header`): members split at
/// `,`, key and value at `=` (the text between the first and second), nothing trimmed, an empty value absent, later
/// values winning, unknown keys ignored.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Baggage {
    pub cluster_id: Option<String>,
    pub namespace: Option<String>,
    pub workload_name: Option<String>,
    pub service_name: Option<String>,
    pub revision: Option<String>,
    pub region: Option<String>,
    pub zone: Option<String>,
}

impl Baggage {
    /// Every `baggage` header of `headers`; None when there is none (or none is text).
    pub fn parse(headers: &http::HeaderMap) -> Option<Baggage> {
        let mut b = Baggage::default();
        let mut any = false;
        for v in headers.get_all("baggage").iter().filter_map(|v| v.to_str().ok()) {
            any = true;
            for member in v.split(',') {
                let mut parts = member.split('=');
                let (Some(key), Some(value)) = (parts.next(), parts.next()) else { continue };
                let value = (!value.is_empty()).then(|| value.to_string());
                match key {
                    "k8s.cluster.name" => b.cluster_id = value,
                    "k8s.namespace.name" => b.namespace = value,
                    "k8s.deployment.name" | "k8s.cronjob.name" | "k8s.pod.name" | "k8s.job.name" => {
                        b.workload_name = value
                    }
                    "service.name" => b.service_name = value,
                    "service.version" => b.revision = value,
                    "cloud.region" => b.region = value,
                    "cloud.availability_zone" => b.zone = value,
                    _ => {}
                }
            }
        }
        any.then_some(b)
    }
}

/// `baggage` of a workload, in Istio's key order, skipping empty values: the cluster is the workload's own
/// clusterId only (ztunnel omits it when istiod sent none, rather than saying the daemon's).
pub fn baggage(w: &Workload) -> String {
    let wtype = if w.workload_type.is_empty() { "deployment" } else { w.workload_type.as_str() };
    let kvs = [
        ("k8s.cluster.name".to_string(), w.cluster_id.as_str()),
        ("k8s.namespace.name".to_string(), w.namespace.as_str()),
        (format!("k8s.{wtype}.name"), w.workload_name.as_str()),
        ("service.name".to_string(), w.canonical_name.as_str()),
        ("service.version".to_string(), w.canonical_revision.as_str()),
        ("cloud.region".to_string(), w.locality.region.as_str()),
        ("cloud.availability_zone".to_string(), w.locality.zone.as_str()),
    ];
    kvs.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

impl TrafficLabels {
    pub fn new(info: &ConnectionInfo<'_>) -> TrafficLabels {
        let mut l = TrafficLabels {
            reporter: match info.reporter {
                Reporter::Source => "source",
                Reporter::Destination => "destination",
            }
            .into(),
            request_protocol: "tcp".into(),
            response_flags: "-".into(),
            connection_security_policy: if info.mutual_tls { "mutual_tls" } else { "unknown" }.into(),
            ..Default::default()
        };
        if let Some(side) = info.source.map(Side::of).or_else(|| info.derived_source.map(Side::of_baggage)) {
            (l.source_app, l.source_version) = (side.app.clone(), side.canonical_revision.clone());
            (l.source_workload, l.source_canonical_service, l.source_canonical_revision) =
                (side.workload, side.canonical_service, side.canonical_revision);
            (l.source_workload_namespace, l.source_cluster) = (side.namespace, side.cluster);
            (l.source_region, l.source_zone) = (side.region, side.zone);
        }
        if let Some(id) = info.source_identity {
            l.source_principal = id.to_string();
        }
        let derived = info.derived_destination;
        if let Some(side) =
            derived.and_then(|d| d.baggage.as_ref()).map(Side::of_baggage).or_else(|| info.destination.map(Side::of))
        {
            (l.destination_app, l.destination_version) = (side.app.clone(), side.canonical_revision.clone());
            (l.destination_workload, l.destination_canonical_service, l.destination_canonical_revision) =
                (side.workload, side.canonical_service, side.canonical_revision);
            (l.destination_workload_namespace, l.destination_cluster) = (side.namespace, side.cluster);
            (l.destination_region, l.destination_zone) = (side.region, side.zone);
        }
        if let Some(id) = derived.and_then(|d| d.identity.as_ref()).or(info.destination_identity) {
            l.destination_principal = id.to_string();
        }
        if let Some(s) = info.destination_service {
            l.destination_service = s.hostname.to_string();
            l.destination_service_namespace = s.namespace.to_string();
            l.destination_service_name = s.name.clone();
        }
        l
    }
}

impl TrafficLabels {
    /// (name, value) in ztunnel's order.
    pub fn pairs(&self) -> [(&'static str, &str); 27] {
        [
            ("reporter", &self.reporter),
            ("source_workload", &self.source_workload),
            ("source_canonical_service", &self.source_canonical_service),
            ("source_canonical_revision", &self.source_canonical_revision),
            ("source_workload_namespace", &self.source_workload_namespace),
            ("source_principal", &self.source_principal),
            ("source_app", &self.source_app),
            ("source_version", &self.source_version),
            ("source_cluster", &self.source_cluster),
            ("destination_service", &self.destination_service),
            ("destination_service_namespace", &self.destination_service_namespace),
            ("destination_service_name", &self.destination_service_name),
            ("destination_workload", &self.destination_workload),
            ("destination_canonical_service", &self.destination_canonical_service),
            ("destination_canonical_revision", &self.destination_canonical_revision),
            ("destination_workload_namespace", &self.destination_workload_namespace),
            ("destination_principal", &self.destination_principal),
            ("destination_app", &self.destination_app),
            ("destination_version", &self.destination_version),
            ("destination_cluster", &self.destination_cluster),
            ("request_protocol", &self.request_protocol),
            ("response_flags", &self.response_flags),
            ("connection_security_policy", &self.connection_security_policy),
            ("source_region", &self.source_region),
            ("source_zone", &self.source_zone),
            ("destination_region", &self.destination_region),
            ("destination_zone", &self.destination_zone),
        ]
    }
}

/// ztunnel's TCP traffic counters: family name (OpenMetrics: without `_total`), HELP text, and which count.
const TRAFFIC_FAMILIES: [(&str, &str, usize); 5] = [
    ("istio_tcp_connections_opened", "The total number of TCP connections opened", 0),
    ("istio_tcp_connections_closed", "The total number of TCP connections closed", 1),
    ("istio_tcp_connections_failed", "The total number of TCP connections that failed to establish (unstable)", 2),
    ("istio_tcp_sent_bytes", "The size of total bytes sent during response in case of a TCP connection", 3),
    ("istio_tcp_received_bytes", "The size of total bytes received during request in case of a TCP connection", 4),
];

/// The traffic counters as OpenMetrics text, as ztunnel exposes them: per family `# HELP` and `# TYPE` without
/// `_total`, then a sample per label set with it, every one of the 27 labels present in ztunnel's order, an empty
/// value written `unknown`. Rendered here, where the counters live, so a scrape does not carry every label set
/// across the boundary as JSON to be rendered again. `rows`: each label set with [opened, closed, failed, sent,
/// received].
pub fn traffic_openmetrics(rows: &[(&TrafficLabels, [u64; 5])]) -> String {
    use std::fmt::Write;
    // One sample line is about 1 KB (27 labels): size the buffer once.
    let mut out = String::with_capacity(512 + rows.len() * TRAFFIC_FAMILIES.len() * 1024);
    for (family, help, i) in TRAFFIC_FAMILIES {
        let _ = write!(out, "# HELP {family} {help}\n# TYPE {family} counter\n");
        for (labels, counts) in rows {
            out.push_str(family);
            out.push_str("_total{");
            for (n, (name, value)) in labels.pairs().into_iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                out.push_str(name);
                out.push_str("=\"");
                escape_label_value(&mut out, if value.is_empty() { "unknown" } else { value });
                out.push('"');
            }
            let _ = writeln!(out, "}} {}", counts[i]);
        }
    }
    out
}

/// A label value as the exposition formats escape it: backslash, double quote and line feed.
fn escape_label_value(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// One end's labels as ztunnel's `with_source`/`with_destination` take them from a workload (src/proxy/metrics.rs):
/// the workload is its workloadName (empty, so `unknown`, when istiod sent none; never the pod's name); app and
/// version repeat the canonical service and revision.
struct Side {
    workload: String,
    /// `*_app`: the canonical service, but a derived source's workload name (ztunnel's `with_derived_source`).
    app: String,
    canonical_service: String,
    canonical_revision: String,
    namespace: String,
    cluster: String,
    region: String,
    zone: String,
}

impl Side {
    /// ztunnel's derived workload (`with_derived_source`): the baggage's workload (also the app), service (the
    /// canonical service), version, namespace, cluster and locality.
    fn of_baggage(b: &Baggage) -> Side {
        let s = |v: &Option<String>| v.clone().unwrap_or_default();
        Side {
            workload: s(&b.workload_name),
            app: s(&b.workload_name),
            canonical_service: s(&b.service_name),
            canonical_revision: s(&b.revision),
            namespace: s(&b.namespace),
            cluster: s(&b.cluster_id),
            region: s(&b.region),
            zone: s(&b.zone),
        }
    }

    fn of(w: &Workload) -> Side {
        Side {
            workload: w.workload_name.to_string(),
            app: w.canonical_name.to_string(),
            canonical_service: w.canonical_name.to_string(),
            canonical_revision: w.canonical_revision.to_string(),
            namespace: w.namespace.to_string(),
            cluster: w.cluster_id.to_string(),
            region: w.locality.region.to_string(),
            zone: w.locality.zone.to_string(),
        }
    }
}

#[derive(Default, Debug)]
pub struct Counters {
    pub opened: AtomicU64,
    pub closed: AtomicU64,
    pub failed: AtomicU64,
    pub sent: AtomicU64,
    pub received: AtomicU64,
}

#[derive(Default)]
pub struct Metrics {
    buckets: Mutex<HashMap<Arc<TrafficLabels>, Arc<Counters>>>,
    sockets_open_source: AtomicI64,
    sockets_open_destination: AtomicI64,
    pub tunnels_opened_outbound: AtomicU64,
    pub tunnels_accepted_inbound: AtomicU64,
    pub tunnels_active_outbound: AtomicI64,
    pub tunnels_active_inbound: AtomicI64,
    pub tls_handshake_failures_inbound: AtomicU64,
    pub tls_handshake_failures_outbound: AtomicU64,
    /// Inbound connections refused by authorization (at connect time).
    pub authz_denied: AtomicU64,
    /// Live inbound connections closed because a state change denied them.
    pub authz_closed_by_policy: AtomicU64,
    /// Failed accepts on any listener (EMFILE, ENFILE, ENOBUFS...).
    pub accept_errors: AtomicU64,
    /// Inbound HBONE connections closed at accept: their peer IP held MAX_CONNECTIONS_PER_PEER already.
    pub inbound_refused_peer_limit: AtomicU64,
    /// Inbound connections refused or closed because the reset budget banned their peer (`proxy::resets`).
    pub inbound_refused_resets: AtomicU64,
    /// The DNS proxy's counters.
    pub dns: crate::dns::metrics::DnsMetrics,
    /// Revocation (CRL_PATH): the counters of the certificate store's `Revocations`.
    pub crl: Arc<crate::tls::revocation::CrlCounters>,
    /// The node's budget for stream data buffered toward peers (shared by every proxy).
    pub budget: Arc<crate::budget::Budget>,
    /// Connect retries and outlier ejection: the node's detector (shared with the proxies' inputs).
    pub outliers: Arc<crate::proxy::outlier::Outliers>,
}

/// One label set's connection counters (cumulative since the dataplane started).
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "ConnectionCounters"))]
#[serde(rename_all = "camelCase")]
struct BucketJson<'a> {
    labels: &'a TrafficLabels,
    #[cfg_attr(test, ts(type = "number"))]
    opened: u64,
    #[cfg_attr(test, ts(type = "number"))]
    closed: u64,
    #[cfg_attr(test, ts(type = "number"))]
    failed: u64,
    /// Bytes toward the destination (the request direction).
    #[cfg_attr(test, ts(type = "number"))]
    sent: u64,
    /// Bytes from the destination (the response direction).
    #[cfg_attr(test, ts(type = "number"))]
    received: u64,
}

/// The dataplane's counters as the control side reads them, once per scrape (`metrics()`). Counters are cumulative
/// since the dataplane started.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "MetricsSnapshot"))]
#[serde(rename_all = "camelCase")]
pub struct SnapshotJson<'a> {
    /// The dataplane's tokio runtime (ztunnel's `tokio_*` metrics); null when not asked for.
    runtime: Option<RuntimeJson>,
    connections: Vec<BucketJson<'a>>,
    sockets_open: SocketsOpenJson,
    tunnels: TunnelsJson,
    authorization: AuthorizationJson,
    crl: CrlJson,
    resilience: ResilienceJson,
    dns: &'a crate::dns::metrics::DnsSnapshot<'a>,
    buffers: BuffersJson,
    /// When asked for (`metrics({ trafficText: true })`, the scrape): the traffic counters as OpenMetrics text
    /// (`traffic_openmetrics`), read in this same snapshot; `connections` is then empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(optional))]
    traffic: Option<String>,
}

/// The runtime's figures; per-worker arrays are indexed by worker.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "RuntimeCounters"))]
#[serde(rename_all = "camelCase")]
struct RuntimeJson {
    workers: usize,
    global_queue_depth: usize,
    alive_tasks: usize,
    busy_seconds: Vec<f64>,
    #[cfg_attr(test, ts(type = "Array<number>"))]
    parks: Vec<u64>,
    #[cfg_attr(test, ts(type = "Array<number>"))]
    park_unparks: Vec<u64>,
}

/// Connections open now, by reporter.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "SocketsOpen"))]
struct SocketsOpenJson {
    #[cfg_attr(test, ts(type = "number"))]
    source: i64,
    #[cfg_attr(test, ts(type = "number"))]
    destination: i64,
}

/// HBONE connections (TLS + HTTP/2), not the TCP connections tunnelled inside them.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "TunnelCounters"))]
#[serde(rename_all = "camelCase")]
struct TunnelsJson {
    #[cfg_attr(test, ts(type = "number"))]
    outbound_opened: u64,
    #[cfg_attr(test, ts(type = "number"))]
    outbound_active: i64,
    #[cfg_attr(test, ts(type = "number"))]
    inbound_accepted: u64,
    #[cfg_attr(test, ts(type = "number"))]
    inbound_active: i64,
    #[cfg_attr(test, ts(type = "number"))]
    inbound_handshake_failures: u64,
    #[cfg_attr(test, ts(type = "number"))]
    outbound_handshake_failures: u64,
    /// Inbound connections closed at accept: their peer IP held the per-peer limit already.
    #[cfg_attr(test, ts(type = "number"))]
    inbound_refused_peer_limit: u64,
    /// Inbound connections refused or closed: the reset budget banned their peer.
    #[cfg_attr(test, ts(type = "number"))]
    inbound_refused_resets: u64,
    /// Failed accepts on the dataplane's listeners (EMFILE and the like).
    #[cfg_attr(test, ts(type = "number"))]
    accept_errors: u64,
}

/// Authorization outcomes counted by the dataplane.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "AuthorizationCounters"))]
#[serde(rename_all = "camelCase")]
struct AuthorizationJson {
    #[cfg_attr(test, ts(type = "number"))]
    denied: u64,
    #[cfg_attr(test, ts(type = "number"))]
    closed_by_policy_change: u64,
}

/// Connect retries and outlier ejection (beyond ztunnel).
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "ResilienceCounters"))]
#[serde(rename_all = "camelCase")]
struct ResilienceJson {
    /// Service-addressed connects tried again on another endpoint.
    #[cfg_attr(test, ts(type = "number"))]
    connect_retries: u64,
    /// Endpoints ejected after consecutive connect failures.
    #[cfg_attr(test, ts(type = "number"))]
    ejections: u64,
    /// Endpoints ejected now.
    ejected_endpoints: usize,
}

/// ztunnel's CRL counters by reporter (`source`: outbound, `destination`: inbound).
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "CrlCounters"))]
#[serde(rename_all = "camelCase")]
struct CrlJson {
    /// Handshakes refused because a peer certificate is revoked, and live connections closed for it.
    #[cfg_attr(test, ts(type = "{ source: number; destination: number }"))]
    policy_rejections: ReporterPair,
    /// HBONE connections whose peer chain could not be followed for revocation.
    #[cfg_attr(test, ts(type = "{ source: number; destination: number }"))]
    untracked_connections: ReporterPair,
}

#[derive(Serialize)]
struct ReporterPair {
    source: u64,
    destination: u64,
}

impl From<&crate::tls::revocation::ByReporter> for ReporterPair {
    fn from(b: &crate::tls::revocation::ByReporter) -> ReporterPair {
        ReporterPair { source: b.source(), destination: b.destination() }
    }
}

/// The node's budget for stream data buffered toward HBONE peers (budget.rs).
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "BufferCounters"))]
#[serde(rename_all = "camelCase")]
struct BuffersJson {
    buffered: usize,
    budget: usize,
    #[cfg_attr(test, ts(type = "number"))]
    shed_connections: u64,
    #[cfg_attr(test, ts(type = "number"))]
    backpressured_streams: u64,
}

impl Metrics {
    /// Counters sharing the certificate store's CRL counters.
    pub fn with_crl(crl: Arc<crate::tls::revocation::CrlCounters>) -> Metrics {
        Metrics { crl, ..Metrics::default() }
    }

    /// With the node's outlier detector (its retries, ejections and ejected endpoints are reported here).
    pub fn with_outliers(self, outliers: Arc<crate::proxy::outlier::Outliers>) -> Metrics {
        Metrics { outliers, ..self }
    }

    /// The bucket of a label set: its shared key (one allocation per distinct label set, not per connection) and
    /// its counters.
    fn bucket(&self, labels: TrafficLabels) -> (Arc<TrafficLabels>, Arc<Counters>) {
        let mut b = self.buckets.lock();
        if let Some((k, c)) = b.get_key_value(&labels) {
            return (k.clone(), c.clone());
        }
        let (k, c) = (Arc::new(labels), Arc::new(Counters::default()));
        b.insert(k.clone(), c.clone());
        (k, c)
    }

    /// Count a connection as opened; the returned guard counts it closed when dropped.
    pub fn open(self: &Arc<Self>, labels: TrafficLabels) -> ConnectionGuard {
        let reporter_dest = labels.reporter == "destination";
        let (labels, counters) = self.bucket(labels);
        counters.opened.fetch_add(1, Ordering::Relaxed);
        self.sockets(reporter_dest).fetch_add(1, Ordering::Relaxed);
        ConnectionGuard { metrics: self.clone(), labels, counters, failure: None, reporter_dest }
    }

    /// A connection another process opened and handed over: live here, not counted opened again (summed over both
    /// processes, opened and closed still pair up).
    pub fn adopt(self: &Arc<Self>, labels: TrafficLabels) -> ConnectionGuard {
        let reporter_dest = labels.reporter == "destination";
        let (labels, counters) = self.bucket(labels);
        self.sockets(reporter_dest).fetch_add(1, Ordering::Relaxed);
        ConnectionGuard { metrics: self.clone(), labels, counters, failure: None, reporter_dest }
    }

    fn sockets(&self, destination: bool) -> &AtomicI64 {
        if destination {
            &self.sockets_open_destination
        } else {
            &self.sockets_open_source
        }
    }

    pub fn snapshot_json(&self) -> String {
        self.snapshot_json_with(None, false)
    }

    /// The snapshot, with the connection workers' figures (ztunnel's `tokio_*` metrics) when given the silos'
    /// handles, and the traffic counters as OpenMetrics text instead of JSON rows when `traffic_text`.
    pub fn snapshot_json_with(&self, runtime: Option<&[tokio::runtime::Handle]>, traffic_text: bool) -> String {
        // The bucket map's lock is what a new connection takes to find its bucket: held only to copy the counts (a
        // label set is shared, not copied); rendering 10k label sets takes tens of milliseconds, done after.
        let owned: Vec<(Arc<TrafficLabels>, [u64; 5])> = self
            .buckets
            .lock()
            .iter()
            .map(|(l, c)| {
                let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
                (l.clone(), [load(&c.opened), load(&c.closed), load(&c.failed), load(&c.sent), load(&c.received)])
            })
            .collect();
        let rows: Vec<(&TrafficLabels, [u64; 5])> = owned.iter().map(|(l, c)| (&**l, *c)).collect();
        let (connections, traffic) = if traffic_text {
            (Vec::new(), Some(traffic_openmetrics(&rows)))
        } else {
            let connections = rows
                .iter()
                .map(|(labels, [opened, closed, failed, sent, received])| BucketJson {
                    labels,
                    opened: *opened,
                    closed: *closed,
                    failed: *failed,
                    sent: *sent,
                    received: *received,
                })
                .collect();
            (connections, None)
        };
        // One worker per silo: each silo is a single-threaded runtime.
        let runtime = runtime.map(|handles| {
            let mut r = RuntimeJson {
                workers: 0,
                global_queue_depth: 0,
                alive_tasks: 0,
                busy_seconds: Vec::new(),
                parks: Vec::new(),
                park_unparks: Vec::new(),
            };
            for h in handles {
                let m = h.metrics();
                let workers = m.num_workers();
                r.workers += workers;
                r.global_queue_depth += m.global_queue_depth();
                r.alive_tasks += m.num_alive_tasks();
                r.busy_seconds.extend((0..workers).map(|w| m.worker_total_busy_duration(w).as_secs_f64()));
                r.parks.extend((0..workers).map(|w| m.worker_park_count(w)));
                r.park_unparks.extend((0..workers).map(|w| m.worker_park_unpark_count(w)));
            }
            r
        });
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.dns.with_snapshot(|dns| {
            let snapshot = SnapshotJson {
                runtime,
                connections,
                sockets_open: SocketsOpenJson {
                    source: self.sockets_open_source.load(Ordering::Relaxed),
                    destination: self.sockets_open_destination.load(Ordering::Relaxed),
                },
                tunnels: TunnelsJson {
                    outbound_opened: load(&self.tunnels_opened_outbound),
                    outbound_active: self.tunnels_active_outbound.load(Ordering::Relaxed),
                    inbound_accepted: load(&self.tunnels_accepted_inbound),
                    inbound_active: self.tunnels_active_inbound.load(Ordering::Relaxed),
                    inbound_handshake_failures: load(&self.tls_handshake_failures_inbound),
                    outbound_handshake_failures: load(&self.tls_handshake_failures_outbound),
                    inbound_refused_peer_limit: load(&self.inbound_refused_peer_limit),
                    inbound_refused_resets: load(&self.inbound_refused_resets),
                    accept_errors: load(&self.accept_errors),
                },
                authorization: AuthorizationJson {
                    denied: load(&self.authz_denied),
                    closed_by_policy_change: load(&self.authz_closed_by_policy),
                },
                crl: CrlJson {
                    policy_rejections: (&self.crl.rejections).into(),
                    untracked_connections: (&self.crl.untracked).into(),
                },
                resilience: ResilienceJson {
                    connect_retries: load(&self.outliers.retries_total),
                    ejections: load(&self.outliers.ejections_total),
                    ejected_endpoints: self.outliers.ejected_count(),
                },
                dns,
                buffers: BuffersJson {
                    buffered: self.budget.used(),
                    budget: self.budget.limit(),
                    shed_connections: load(&self.budget.shed),
                    backpressured_streams: load(&self.budget.backpressured),
                },
                traffic,
            };
            serde_json::to_string(&snapshot).expect("serializable")
        })
    }
}

/// One connection's counters. Bytes are added as they are copied; open/close/failure are counted here.
pub struct ConnectionGuard {
    metrics: Arc<Metrics>,
    /// Shared with the bucket: a live connection holds a pointer, not its own copy of ~20 label strings.
    labels: Arc<TrafficLabels>,
    pub counters: Arc<Counters>,
    failure: Option<&'static str>,
    reporter_dest: bool,
}

impl ConnectionGuard {
    pub fn labels(&self) -> &Arc<TrafficLabels> {
        &self.labels
    }

    /// Mark the connection failed with an Istio response flag (`CONNECT`, `DENY`, `TLS_FAILURE`, ...).
    pub fn fail(&mut self, flag: &'static str) {
        self.failure = Some(flag);
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.counters.closed.fetch_add(1, Ordering::Relaxed);
        self.metrics.sockets(self.reporter_dest).fetch_sub(1, Ordering::Relaxed);
        if let Some(flag) = self.failure {
            let mut labels = (*self.labels).clone();
            labels.response_flags = flag.into();
            self.metrics.bucket(labels).1.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baggage_is_read_as_ztunnel_reads_it_and_describes_an_unknown_source() {
        let mut h = http::HeaderMap::new();
        h.append("baggage", "k8s.cluster.name=east,k8s.namespace.name=shop,k8s.deployment.name=cart".parse().unwrap());
        h.append(
            "baggage",
            "service.name=cart-svc,service.version=v7,cloud.region=eu-1,other=x,k8s.pod.name=".parse().unwrap(),
        );
        h.append("baggage", "cloud.availability_zone=eu-1a=x, k8s.cluster.name=ignored".parse().unwrap());
        let b = Baggage::parse(&h).expect("baggage");
        assert_eq!(
            b,
            Baggage {
                cluster_id: Some("east".into()),
                namespace: Some("shop".into()),
                workload_name: None,
                service_name: Some("cart-svc".into()),
                revision: Some("v7".into()),
                region: Some("eu-1".into()),
                zone: Some("eu-1a".into()),
            },
            "a later empty k8s.pod.name clears the workload; the value ends at a second '='; a key after ', ' is \
             another key (nothing trimmed), as ztunnel's parser has it"
        );
        assert_eq!(Baggage::parse(&http::HeaderMap::new()), None);
        let info = |derived| ConnectionInfo {
            reporter: Reporter::Destination,
            source: None,
            source_identity: None,
            destination: None,
            destination_identity: None,
            destination_service: None,
            mutual_tls: true,
            derived_source: derived,
            derived_destination: None,
        };
        let l = TrafficLabels::new(&info(Some(&b)));
        assert_eq!(
            [
                &*l.source_cluster,
                &*l.source_workload_namespace,
                &*l.source_canonical_service,
                &*l.source_canonical_revision,
                &*l.source_region
            ],
            ["east", "shop", "cart-svc", "v7", "eu-1"]
        );
        assert_eq!(l.source_app, "", "a derived source's app is its workload name, here none");
        assert_eq!(TrafficLabels::new(&info(None)).source_cluster, "");
    }

    #[test]
    fn a_derived_destination_wins_over_the_gateway_it_was_reached_through() {
        let mut st = crate::state::State::default();
        let delta = serde_json::json!({"workloads": [{"uid": "gw", "name": "eastwest", "namespace": "istio-system",
            "workloadName": "eastwest", "clusterId": "west", "workloadIps": ["10.0.0.9"]}]});
        st.apply(serde_json::from_value::<crate::state::StateDelta>(delta).unwrap()).unwrap();
        let gateway = st.workload("gw").unwrap().clone();
        let gw_id = gateway.identity();
        let far: Identity = "spiffe://cluster.local/ns/shop/sa/cart".parse().unwrap();
        let b = Baggage {
            cluster_id: Some("east".into()),
            namespace: Some("shop".into()),
            workload_name: Some("cart".into()),
            service_name: Some("cart-svc".into()),
            ..Default::default()
        };
        let derived = DerivedPeer { baggage: Some(b), identity: Some(far.clone()) };
        let info = |d| ConnectionInfo {
            reporter: Reporter::Source,
            source: None,
            source_identity: None,
            destination: Some(&gateway),
            destination_identity: Some(&gw_id),
            destination_service: None,
            mutual_tls: true,
            derived_source: None,
            derived_destination: d,
        };
        let l = TrafficLabels::new(&info(Some(&derived)));
        assert_eq!(
            [&*l.destination_workload, &*l.destination_workload_namespace, &*l.destination_cluster],
            ["cart", "shop", "east"]
        );
        assert_eq!(l.destination_principal, far.to_string());
        let plain = TrafficLabels::new(&info(None));
        assert_eq!([&*plain.destination_workload, &*plain.destination_cluster], ["eastwest", "west"]);
    }

    #[test]
    fn traffic_text_is_openmetrics_with_every_label_in_order_and_escaped_values() {
        let labels = TrafficLabels {
            reporter: "source".into(),
            source_workload: "a\"b\\c\nd".into(),
            destination_zone: "zone-b".into(),
            ..Default::default()
        };
        let text = traffic_openmetrics(&[(&labels, [4, 3, 1, 73, 1_048_595])]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5 * 3, "HELP, TYPE and one sample per family");
        assert_eq!(lines[0], "# HELP istio_tcp_connections_opened The total number of TCP connections opened");
        assert_eq!(lines[1], "# TYPE istio_tcp_connections_opened counter");
        let sample = lines[2];
        assert!(sample.starts_with(
            "istio_tcp_connections_opened_total{reporter=\"source\",source_workload=\"a\\\"b\\\\c\\nd\","
        ));
        assert!(sample.ends_with(",destination_region=\"unknown\",destination_zone=\"zone-b\"} 4"), "{sample}");
        let names: Vec<&str> = sample[sample.find('{').unwrap() + 1..sample.rfind('}').unwrap()]
            .split("\",")
            .map(|kv| kv.split('=').next().unwrap())
            .collect();
        assert_eq!(names, labels.pairs().map(|(n, _)| n).to_vec(), "the 27 labels in ztunnel's order");
        assert!(lines[14].starts_with("istio_tcp_received_bytes_total{") && lines[14].ends_with("} 1048595"));
        assert!(lines[11].starts_with("istio_tcp_sent_bytes_total{") && lines[11].ends_with("} 73"));
        // No connection yet: the families are still declared, with no sample.
        assert_eq!(traffic_openmetrics(&[]).lines().count(), 10);
    }
}
