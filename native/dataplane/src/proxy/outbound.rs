//! Outbound: where a local workload's connection goes, and getting it there.
//!
//! The routing decision (`build_request`) is a pure function of the state: destination IP → service VIP (pick a
//! healthy endpoint that has the port, weighted by capacity, service port → target port) or workload by IP;
//! an HBONE workload is reached through its node's 15008 with `:authority <ip>:<port>`; a TCP workload or an
//! unknown destination is reached directly (plain TCP passthrough). I/O happens only after the decision.
//!
//! Invariant: the protocol comes only from the destination's state. If an HBONE destination cannot be reached
//! over mTLS (no certificate, handshake failure, wrong peer identity), the connection fails; nothing retries in
//! plaintext.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::future::Either;
use h2::{RecvStream, SendStream};

use super::h2::client::{connect_request, new_traceparent, ConnectHeaders};
use super::pool::{PoolError, PoolKey, StreamLease};
use super::{LocalRef, ProxyInputs};
use crate::config::Config;
use crate::identity::Identity;
use crate::state::{Protocol, Service, State, Workload, WorkloadStatus};
use crate::tls::ExpectedIdentities;

/// Where and how to send one outbound connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub protocol: Protocol,
    /// The address dialed: `<ip>:15008` for HBONE, the target itself for TCP.
    pub upstream: SocketAddr,
    /// The final target (`:authority` for HBONE).
    pub target: SocketAddr,
    pub destination: Option<Arc<Workload>>,
    pub service: Option<Arc<Service>>,
    /// Identities the HBONE server may present.
    pub expected: ExpectedIdentities,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RouteError {
    #[error("connection to ztunnel-node's own port {0} refused")]
    SelfCall(u16),
    #[error("no healthy upstream for service {0} port {1}")]
    NoHealthyUpstream(String, u16),
    #[error("service {0} has no port {1}")]
    NoPort(String, u16),
    #[error("workload {0} has no address")]
    NoAddress(String),
    #[error("no valid routing destination: workload {0} is on network {1:?} and has no gateway")]
    RemoteNetwork(String, String),
}

/// Decide where a connection from `src` to `dst` goes. `pick(total)` returns a number in `0..total` (the
/// weighted endpoint choice); tests pass a fixed one.
pub fn build_request(
    state: &State,
    cfg: &Config,
    src: &Workload,
    dst: SocketAddr,
    pick: &mut dyn FnMut(u64) -> u64,
) -> Result<Request, RouteError> {
    if cfg.illegal_ports().contains(&dst.port()) && (dst.ip().is_loopback() || src.ips.contains(&dst.ip())) {
        return Err(RouteError::SelfCall(dst.port()));
    }
    let (dest, port, service) = if let Some(svc) = state.service_by_vip(&src.network, dst.ip(), &src.namespace) {
        let target_port = match svc.ports.get(&dst.port()) {
            Some(0) => dst.port(),
            Some(p) => *p,
            None => return Err(RouteError::NoPort(svc.key.to_string(), dst.port())),
        };
        let candidates: Vec<(&Arc<Workload>, u16)> = state
            .endpoints(&svc.key)
            .filter(|(w, _)| w.status == WorkloadStatus::Healthy && !w.ips.is_empty() && w.capacity > 0)
            .map(|(w, ports)| (w, ports.get(&dst.port()).copied().filter(|p| *p != 0).unwrap_or(target_port)))
            .collect();
        let total: u64 = candidates.iter().map(|(w, _)| u64::from(w.capacity)).sum();
        if total == 0 {
            return Err(RouteError::NoHealthyUpstream(svc.key.to_string(), dst.port()));
        }
        let mut n = pick(total) % total;
        let (w, p) = candidates
            .iter()
            .find(|(w, _)| {
                let c = u64::from(w.capacity);
                if n < c {
                    true
                } else {
                    n -= c;
                    false
                }
            })
            .expect("n < total");
        ((*w).clone(), *p, Some(svc.clone()))
    } else if let Some(w) = state.workload_by_addr(&src.network, dst.ip()) {
        (w.clone(), dst.port(), None)
    } else {
        return Ok(passthrough(dst));
    };
    if dest.network != src.network {
        return Err(RouteError::RemoteNetwork(dest.uid.clone(), dest.network.clone()));
    }
    // The dialed IP when it is one of the workload's, else the first of the same family, else the first.
    let ip = if dest.ips.contains(&dst.ip()) {
        dst.ip()
    } else {
        dest.ips
            .iter()
            .find(|ip| ip.is_ipv4() == dst.is_ipv4())
            .or_else(|| dest.ips.first())
            .copied()
            .ok_or_else(|| RouteError::NoAddress(dest.uid.clone()))?
    };
    let target = SocketAddr::new(ip, port);
    Ok(match dest.protocol {
        Protocol::Hbone => {
            let mut ids = vec![dest.identity()];
            if let Some(s) = &service {
                ids.extend(s.subject_alt_names.iter().cloned());
            }
            Request {
                protocol: Protocol::Hbone,
                upstream: SocketAddr::new(ip, cfg.hbone_port),
                target,
                destination: Some(dest),
                service,
                expected: ExpectedIdentities::new(ids),
            }
        }
        Protocol::Tcp => Request {
            protocol: Protocol::Tcp,
            upstream: target,
            target,
            destination: Some(dest),
            service,
            expected: ExpectedIdentities::default(),
        },
    })
}

fn passthrough(dst: SocketAddr) -> Request {
    Request {
        protocol: Protocol::Tcp,
        upstream: dst,
        target: dst,
        destination: None,
        service: None,
        expected: ExpectedIdentities::default(),
    }
}

/// `baggage` of the source workload, in Istio's key order, skipping empty values.
pub fn baggage(cluster_id: &str, w: &Workload) -> String {
    let wtype = if w.workload_type.is_empty() { "deployment" } else { w.workload_type.as_str() };
    let cluster = if w.cluster_id.is_empty() { cluster_id } else { w.cluster_id.as_str() };
    let kvs = [
        ("k8s.cluster.name".to_string(), cluster),
        ("k8s.namespace.name".to_string(), w.namespace.as_str()),
        (format!("k8s.{wtype}.name"), w.workload_name.as_str()),
        ("service.name".to_string(), w.canonical_name.as_str()),
        ("service.version".to_string(), w.canonical_revision.as_str()),
        ("cloud.region".to_string(), w.locality.region.as_str()),
        ("cloud.availability_zone".to_string(), w.locality.zone.as_str()),
    ];
    kvs.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// `forwarded: for="<client>"[;host=<service hostname>]` (IPv6 clients as `[ip]:port`).
pub fn forwarded(client: SocketAddr, service: Option<&Service>) -> String {
    match service {
        Some(s) => format!("for=\"{client}\";host={}", s.key.hostname),
        None => format!("for=\"{client}\""),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    #[error("{0}")]
    Route(#[from] RouteError),
    #[error("source workload {0} is not in the state")]
    UnknownSource(String),
    #[error("{0}")]
    Pool(#[from] PoolError),
    #[error("connecting to {0}: {1}")]
    Connect(SocketAddr, std::io::Error),
    #[error("HBONE peer {0} answered HTTP {1}")]
    Status(SocketAddr, u16),
    #[error("HBONE peer {0} reset the CONNECT: {1}")]
    Response(SocketAddr, h2::Error),
}

impl OutboundError {
    pub fn response_flag(&self) -> &'static str {
        match self {
            OutboundError::Pool(p) => p.response_flag(),
            OutboundError::Status(_, 401) => "DENY",
            _ => "CONNECT",
        }
    }
}

/// An established upstream.
pub enum Upstream {
    Tcp(tokio::net::TcpStream),
    Hbone { send: SendStream<Bytes>, recv: RecvStream, _lease: StreamLease },
}

/// What an outbound connection knows once routed.
pub struct Routed {
    pub request: Request,
    pub source: Arc<Workload>,
    pub source_identity: Identity,
}

/// Route and connect. On success the upstream is ready for bytes (for HBONE: the peer answered 200).
pub async fn connect(
    pi: &ProxyInputs,
    src: &LocalRef,
    client: SocketAddr,
    dst: SocketAddr,
) -> Result<(Routed, Upstream), (Option<Routed>, OutboundError)> {
    let (source, request) = {
        let state = pi.state.read().expect("state lock");
        let source = src.resolve(&state).ok_or_else(|| (None, OutboundError::UnknownSource(src.to_string())))?;
        let mut rng = |n: u64| rand::random::<u64>() % n.max(1);
        let request = build_request(&state, &pi.cfg, &source, dst, &mut rng).map_err(|e| (None, e.into()))?;
        (source, request)
    };
    let routed = Routed { source_identity: source.identity(), source: source.clone(), request };
    let (protocol, upstream_addr, target) = (routed.request.protocol, routed.request.upstream, routed.request.target);
    let src_ip = if source.ips.contains(&client.ip()) {
        client.ip()
    } else {
        source.ips.first().copied().unwrap_or(client.ip())
    };
    match protocol {
        Protocol::Tcp => {
            let bind: Option<IpAddr> = pi.cfg.bind_source_ip.then_some(src_ip);
            let opts =
                crate::socket::ConnectOptions { bind: bind.map(|ip| SocketAddr::new(ip, 0)), transparent: false };
            match crate::socket::connect_with(&*pi.sockets, upstream_addr, opts, pi.cfg.connect_timeout()).await {
                Ok(s) => Ok((routed, Upstream::Tcp(s))),
                Err(e) => Err((Some(routed), OutboundError::Connect(upstream_addr, e))),
            }
        }
        Protocol::Hbone => {
            let key = PoolKey {
                src_id: routed.source_identity.clone(),
                dst_ids: routed.request.expected.clone(),
                dst: upstream_addr,
                src: src_ip,
            };
            let headers = ConnectHeaders {
                baggage: baggage(&pi.cfg.cluster_id, &source),
                forwarded: forwarded(client, routed.request.service.as_deref()),
                traceparent: new_traceparent(),
            };
            let authority = target.to_string();
            let make = || connect_request(&authority, &headers).expect("authority is a socket address");
            let (resp, send, lease) = match pi.pool.send_connect(&key, &make).await {
                Ok(x) => x,
                Err(e) => return Err((Some(routed), e.into())),
            };
            let resp = match resp.await {
                Ok(r) => r,
                Err(e) => return Err((Some(routed), OutboundError::Response(upstream_addr, e))),
            };
            if resp.status() != http::StatusCode::OK {
                let status = resp.status().as_u16();
                return Err((Some(routed), OutboundError::Status(upstream_addr, status)));
            }
            let recv = resp.into_body();
            Ok((routed, Upstream::Hbone { send, recv, _lease: lease }))
        }
    }
}

/// Metrics labels of an outbound connection.
pub fn labels(routed: Option<&Routed>, source: Option<&Workload>) -> crate::metrics::TrafficLabels {
    use crate::metrics::{ConnectionInfo, Reporter, TrafficLabels};
    let hbone = routed.is_some_and(|r| r.request.protocol == Protocol::Hbone);
    let dst_id = routed.and_then(|r| r.request.destination.as_ref()).map(|w| w.identity());
    TrafficLabels::new(&ConnectionInfo {
        reporter: Reporter::Source,
        source: routed.map(|r| r.source.as_ref()).or(source),
        source_identity: routed.filter(|_| hbone).map(|r| &r.source_identity),
        destination: routed.and_then(|r| r.request.destination.as_deref()),
        destination_identity: dst_id.as_ref().filter(|_| hbone),
        destination_service: routed.and_then(|r| r.request.service.as_deref()),
        mutual_tls: hbone,
    })
}

/// What every connection of one outbound listener (a workload's SOCKS5 entry or its 15001 capture) shares: one
/// allocation per listener, one pointer per connection task.
pub struct Listener {
    pub pi: Arc<ProxyInputs>,
    pub local: LocalRef,
    pub force: tokio_util::sync::CancellationToken,
}

/// An outbound connection once routed and connected: what it needs for the rest of its life.
pub struct Established {
    pub client: tokio::net::TcpStream,
    pub client_addr: SocketAddr,
    pub original_dst: SocketAddr,
    pub routed: Box<Routed>,
    pub upstream: Upstream,
}

/// The entry and connect phase of an outbound connection, boxed by its caller (an async fn keeps its argument
/// slots for its whole life, so taking the future itself by value would put all of it back in the task).
pub type EstablishFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Box<Established>>> + Send>>;

/// One outbound connection's task. The entry (SOCKS5 handshake, or the original destination) and the connect run
/// boxed and are freed once the upstream is established: their state is large and short-lived, and inline it would
/// size the task, which lives as long as the connection, for its worst moment. Idle connections are what a node
/// holds by the thousand (bench: about 2.2 KB → under 1 KB per task). Then bytes are copied between the client and
/// the upstream until both directions end, and the access log is written; the metrics count sent = client →
/// upstream, received = upstream → client.
pub async fn connection(l: Arc<Listener>, establish: EstablishFuture) {
    // Unboxed by value: the box is freed here, not at the end of the connection.
    let Some(Established { client, client_addr, original_dst, routed, upstream }) = establish.await.map(|b| *b) else {
        return;
    };
    let (pi, local, force) = (&*l.pi, &l.local, &l.force);
    let started = Instant::now();
    let mut guard = pi.metrics.open(labels(Some(&routed), None));
    let protocol = if routed.request.protocol == Protocol::Hbone { "HBONE" } else { "TCP" };
    let _listed = pi.tracker.register_outbound(
        local.clone(),
        super::tracker::ConnInfo {
            inbound: false,
            src: client_addr,
            original_dst,
            actual_dst: routed.request.upstream,
            protocol,
        },
    );
    let counters = guard.counters.clone();
    let (sent, recv) =
        (crate::copy::Tally::new(Some(&counters.sent)), crate::copy::Tally::new(Some(&counters.received)));
    // The stream's lease on its HBONE connection is held until the copy ends.
    let (copy, _lease) = match upstream {
        Upstream::Tcp(up) => (Either::Left(crate::copy::tcp_bidirectional(client, up, &sent, &recv)), None),
        Upstream::Hbone { send, recv: body, _lease } => {
            (Either::Right(crate::copy::tcp_h2_bidirectional(client, send, body, &sent, &recv)), Some(_lease))
        }
    };
    let result = tokio::select! {
        r = copy => r.map(|_| ()),
        _ = force.cancelled() => Err(std::io::Error::other("drained")),
    };
    let (s, r) = (sent.get(), recv.get());
    if result.is_err() {
        guard.fail("CONNECT");
    }
    access_log(pi, client_addr, Some(&routed), s, r, started, result.as_ref().err().map(|e| e.to_string()));
}

/// ztunnel's "connection complete" access log record (spec §7.4), outbound side.
pub fn access_log(
    pi: &ProxyInputs,
    client: SocketAddr,
    routed: Option<&Routed>,
    sent: u64,
    received: u64,
    started: Instant,
    error: Option<String>,
) {
    use crate::events::{Event, Level};
    let level = if error.is_some() { Level::Error } else { Level::Info };
    if !pi.events.enabled("access", level) {
        return;
    }
    let mut f = crate::fields! {
        "src.addr" => client.to_string(),
        "direction" => "outbound",
        "bytes_sent" => sent,
        "bytes_recv" => received,
        "duration" => format!("{}ms", started.elapsed().as_millis()),
    };
    if let Some(r) = routed {
        f.insert("src.workload".into(), r.source.name.clone().into());
        f.insert("src.namespace".into(), r.source.namespace.clone().into());
        f.insert("src.identity".into(), r.source_identity.to_string().into());
        f.insert("dst.addr".into(), r.request.target.to_string().into());
        if r.request.protocol == Protocol::Hbone {
            f.insert("dst.hbone_addr".into(), r.request.upstream.to_string().into());
        }
        if let Some(s) = &r.request.service {
            f.insert("dst.service".into(), s.key.hostname.clone().into());
        }
        if let Some(w) = &r.request.destination {
            f.insert("dst.workload".into(), w.name.clone().into());
            f.insert("dst.namespace".into(), w.namespace.clone().into());
            if r.request.protocol == Protocol::Hbone {
                f.insert("dst.identity".into(), w.identity().to_string().into());
            }
        }
    }
    if let Some(e) = error {
        f.insert("error".into(), e.into());
    }
    pi.events.push(Event { kind: "access", level, message: "connection complete".into(), fields: f });
}

/// Count and log an outbound connection that never reached its upstream (`connection failed`, ztunnel's record).
pub fn record_failure(
    pi: &ProxyInputs,
    local: &LocalRef,
    peer: SocketAddr,
    dst: SocketAddr,
    routed: Option<&Routed>,
    err: &OutboundError,
) {
    let source = local.resolve(&pi.state.read().expect("state lock"));
    let mut guard = pi.metrics.open(labels(routed, source.as_deref()));
    guard.fail(err.response_flag());
    let mut f = crate::fields! {
        "src.addr" => peer.to_string(),
        "dst.addr" => dst.to_string(),
        "direction" => "outbound",
        "error" => err.to_string(),
    };
    if let Some(r) = routed {
        f.insert("dst.hbone_addr".into(), r.request.upstream.to_string().into());
    }
    pi.events.push(crate::events::Event {
        kind: "access",
        level: crate::events::Level::Warn,
        message: "connection failed".into(),
        fields: f,
    });
}

/// Outbound capture (15001, in-pod): connections the pod's iptables rules redirected here; the destination is the
/// original one (SO_ORIGINAL_DST). Same routing and relay as the SOCKS5 entry; a failure closes the connection.
pub async fn serve_capture(
    listener: tokio::net::TcpListener,
    pi: Arc<ProxyInputs>,
    local: LocalRef,
    drain: crate::drain::Drain,
) {
    let l = Arc::new(Listener { pi, local, force: drain.force.clone() });
    super::accept_until_drained(listener, &drain, |stream, peer| {
        connection(l.clone(), Box::pin(establish_captured(l.clone(), stream, peer)))
    })
    .await
}

async fn establish_captured(
    l: Arc<Listener>,
    client: tokio::net::TcpStream,
    peer: SocketAddr,
) -> Option<Box<Established>> {
    let pi = &l.pi;
    let dst = match crate::socket::original_dst(&client) {
        Ok(d) => d,
        Err(e) => {
            pi.events.log(
                crate::events::Level::Warn,
                "captured connection without an original destination",
                crate::fields! {"src.addr" => peer.to_string(), "error" => e.to_string()},
            );
            return None;
        }
    };
    match connect(pi, &l.local, peer, dst).await {
        Ok((routed, upstream)) => Some(Box::new(Established {
            client,
            client_addr: peer,
            original_dst: dst,
            routed: Box::new(routed),
            upstream,
        })),
        Err((routed, err)) => {
            record_failure(pi, &l.local, peer, dst, routed.as_ref(), &err);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateDelta;

    fn state(json: &str) -> State {
        let mut st = State::default();
        st.apply(serde_json::from_str::<StateDelta>(json).unwrap()).unwrap();
        st
    }

    const WORLD: &str = r#"{"workloads":[
        {"uid":"src","name":"sleep","namespace":"default","serviceAccount":"sleep","workloadIps":["10.0.0.1"],"protocol":"HBONE"},
        {"uid":"h1","name":"echo-1","namespace":"default","serviceAccount":"echo","workloadIps":["10.0.1.1"],"protocol":"HBONE",
         "services":{"default/echo.default.svc.cluster.local":{"80":8080}}},
        {"uid":"h2","name":"echo-2","namespace":"default","serviceAccount":"echo","workloadIps":["10.0.1.2"],"protocol":"HBONE","capacity":3,
         "services":{"default/echo.default.svc.cluster.local":{"80":9090}}},
        {"uid":"sick","name":"echo-3","namespace":"default","serviceAccount":"echo","workloadIps":["10.0.1.3"],"protocol":"HBONE","status":"Unhealthy",
         "services":{"default/echo.default.svc.cluster.local":{"80":8080}}},
        {"uid":"t1","name":"legacy","namespace":"other","serviceAccount":"legacy","workloadIps":["10.0.2.1"],"protocol":"TCP",
         "services":{"other/legacy.other.svc.cluster.local":{}}},
        {"uid":"far","name":"far","namespace":"default","workloadIps":["10.9.0.1"],"network":"remote","protocol":"HBONE",
         "services":{"default/far.default.svc.cluster.local":{"80":80}}}
      ],
      "services":[
        {"name":"echo","namespace":"default","hostname":"echo.default.svc.cluster.local","vips":["/10.96.0.10"],"ports":{"80":8080},
         "subjectAltNames":["spiffe://cluster.local/ns/default/sa/echo-san","not-a-spiffe-id"]},
        {"name":"legacy","namespace":"other","hostname":"legacy.other.svc.cluster.local","vips":["/10.96.0.20"],"ports":{"80":0}},
        {"name":"empty","namespace":"default","hostname":"empty.default.svc.cluster.local","vips":["/10.96.0.30"],"ports":{"80":8080}},
        {"name":"far","namespace":"default","hostname":"far.default.svc.cluster.local","vips":["/10.96.0.40"],"ports":{"80":80}}
      ]}"#;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn id(ns: &str, sa: &str) -> Identity {
        Identity::new("cluster.local", ns, sa)
    }

    /// The decision table: destination → (protocol, dialed address, target, expected identities).
    #[test]
    fn routing_decision_table() {
        let st = state(WORLD);
        let cfg = Config::default();
        let src = st.workload("src").unwrap().clone();
        type Row = (&'static str, u64, Result<(Protocol, &'static str, &'static str, Vec<Identity>), RouteError>);
        let rows: Vec<Row> = vec![
            // Workload addressed directly, HBONE: tunnel to its 15008, authority = ip:port.
            ("10.0.1.1:8080", 0, Ok((Protocol::Hbone, "10.0.1.1:15008", "10.0.1.1:8080", vec![id("default", "echo")]))),
            // Service VIP: weighted pick among healthy endpoints (h1 weight 1, h2 weight 3; "sick" never),
            // the endpoint's own port map wins over the service's target port, service SANs are accepted too.
            (
                "10.96.0.10:80",
                0,
                Ok((
                    Protocol::Hbone,
                    "10.0.1.1:15008",
                    "10.0.1.1:8080",
                    vec![id("default", "echo"), id("default", "echo-san")],
                )),
            ),
            (
                "10.96.0.10:80",
                1,
                Ok((
                    Protocol::Hbone,
                    "10.0.1.2:15008",
                    "10.0.1.2:9090",
                    vec![id("default", "echo"), id("default", "echo-san")],
                )),
            ),
            (
                "10.96.0.10:80",
                3,
                Ok((
                    Protocol::Hbone,
                    "10.0.1.2:15008",
                    "10.0.1.2:9090",
                    vec![id("default", "echo"), id("default", "echo-san")],
                )),
            ),
            // A port the service does not have.
            ("10.96.0.10:81", 0, Err(RouteError::NoPort("default/echo.default.svc.cluster.local".into(), 81))),
            // TCP workload behind a service whose target port is 0 (= the service port): plain TCP.
            ("10.96.0.20:80", 0, Ok((Protocol::Tcp, "10.0.2.1:80", "10.0.2.1:80", vec![]))),
            ("10.0.2.1:5432", 0, Ok((Protocol::Tcp, "10.0.2.1:5432", "10.0.2.1:5432", vec![]))),
            // A service with no endpoints.
            (
                "10.96.0.30:80",
                0,
                Err(RouteError::NoHealthyUpstream("default/empty.default.svc.cluster.local".into(), 80)),
            ),
            // Unknown destination: plain TCP passthrough to the original destination.
            ("192.0.2.7:443", 0, Ok((Protocol::Tcp, "192.0.2.7:443", "192.0.2.7:443", vec![]))),
            // Our own ports on loopback or on the source's own IP: refused.
            ("127.0.0.1:15008", 0, Err(RouteError::SelfCall(15008))),
            ("127.0.0.1:15001", 0, Err(RouteError::SelfCall(15001))),
            ("10.0.0.1:15006", 0, Err(RouteError::SelfCall(15006))),
            ("10.0.0.1:15080", 0, Err(RouteError::SelfCall(15080))),
            // A service whose only endpoint is on another network with no gateway.
            ("10.96.0.40:80", 0, Err(RouteError::RemoteNetwork("far".into(), "remote".into()))),
            // The same workload's IP is not indexed on our network: it is an unknown destination.
            ("10.9.0.1:80", 0, Ok((Protocol::Tcp, "10.9.0.1:80", "10.9.0.1:80", vec![]))),
        ];
        for (dst, pick, want) in rows {
            let mut p = |_total: u64| pick;
            let got = build_request(&st, &cfg, &src, addr(dst), &mut p)
                .map(|r| (r.protocol, r.upstream, r.target, r.expected.0.clone()));
            let want = want.map(|(proto, up, target, mut ids)| {
                ids.sort();
                (proto, addr(up), addr(target), ids)
            });
            assert_eq!(got, want, "destination {dst} pick {pick}");
        }
    }

    #[test]
    fn unhealthy_endpoints_are_never_picked() {
        let st = state(WORLD);
        let src = st.workload("src").unwrap().clone();
        for pick in 0..100 {
            let r = build_request(&st, &Config::default(), &src, addr("10.96.0.10:80"), &mut |_| pick).unwrap();
            assert_ne!(r.target.ip(), "10.0.1.3".parse::<IpAddr>().unwrap());
        }
    }

    #[test]
    fn baggage_and_forwarded_headers() {
        let st = state(
            r#"{"workloads":[{"uid":"w","name":"sleep-abc","namespace":"default","workloadIps":["10.0.0.1"],
            "workloadName":"sleep","workloadType":"deployment","canonicalName":"sleep","canonicalRevision":"v1",
            "locality":{"region":"eu","zone":"eu-1"}}]}"#,
        );
        let w = st.workload("w").unwrap();
        assert_eq!(
            baggage("Kubernetes", w),
            "k8s.cluster.name=Kubernetes,k8s.namespace.name=default,k8s.deployment.name=sleep,service.name=sleep,service.version=v1,cloud.region=eu,cloud.availability_zone=eu-1"
        );
        assert_eq!(forwarded(addr("10.0.0.1:4242"), None), "for=\"10.0.0.1:4242\"");
        assert_eq!(forwarded(addr("[fd00::1]:4242"), None), "for=\"[fd00::1]:4242\"");
        let tp = new_traceparent();
        assert_eq!(tp.len(), 55);
        assert!(tp.starts_with("00-") && tp.ends_with("-00"));
    }
}
