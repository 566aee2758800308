//! Inbound HBONE (15008): mTLS, then HTTP/2, then one CONNECT stream per proxied connection to the local workload.
//!
//! Invariants:
//! - The peer identity is the single SPIFFE SAN of the certificate verified in the handshake; no header changes it.
//! - The upstream IP is always the local workload's own IP; only the port comes from `:authority`, and an
//!   `:authority` naming another IP is refused (400). Our own ports are refused (503).
//! - The upstream connection is established before the 200 is sent; no byte reaches the application before the
//!   answer is decided.
//! - Handshakes (TLS and the HTTP/2 preface) have a deadline, so a peer cannot hold a socket for free.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{Method, Request, Response, StatusCode};
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::h2::keepalive;
use super::h2::server::builder;
use super::{LocalRef, ProxyInputs};
use crate::copy::Tally;
use crate::drain::Drain;
use crate::events::{Event, Level};
use crate::fields;
use crate::identity::{spiffe_identity, Identity};
use crate::metrics::{ConnectionInfo, Reporter, TrafficLabels};
use crate::rbac;
use crate::state::Workload;

/// Why a CONNECT stream was refused, and with which status.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InboundError {
    #[error("method {0} is not CONNECT")]
    NotConnect(String),
    #[error("authority {0:?} is not ip:port")]
    BadAuthority(String),
    #[error("ip mismatch: authority {0} is not an address of the local workload")]
    IpMismatch(IpAddr),
    #[error("local workload {0} is not known")]
    UnknownWorkload(String),
    #[error("port {0} is ztunnel-node's own")]
    IllegalPort(u16),
    #[error("connecting to {0}: {1}")]
    Upstream(SocketAddr, String),
}

impl InboundError {
    pub fn status(&self) -> StatusCode {
        match self {
            InboundError::NotConnect(_) | InboundError::BadAuthority(_) | InboundError::IpMismatch(_) => {
                StatusCode::BAD_REQUEST
            }
            InboundError::UnknownWorkload(_) | InboundError::IllegalPort(_) | InboundError::Upstream(..) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }
}

/// Validate a CONNECT request for `local` (a pure function: method, authority, IP confinement, our own ports).
pub fn validate_connect<B>(
    req: &Request<B>,
    local: Option<&Workload>,
    illegal: &[u16],
) -> Result<SocketAddr, InboundError> {
    if req.method() != Method::CONNECT {
        return Err(InboundError::NotConnect(req.method().to_string()));
    }
    let authority = req.uri().authority().map(|a| a.as_str()).unwrap_or("");
    let target: SocketAddr = authority.parse().map_err(|_| InboundError::BadAuthority(authority.to_string()))?;
    let local = local.ok_or_else(|| InboundError::UnknownWorkload(String::new()))?;
    if !local.ips.contains(&target.ip()) {
        return Err(InboundError::IpMismatch(target.ip()));
    }
    if illegal.contains(&target.port()) {
        return Err(InboundError::IllegalPort(target.port()));
    }
    Ok(target)
}

/// Serve one local workload's HBONE listener until drained.
pub async fn serve(listener: TcpListener, pi: Arc<ProxyInputs>, local: LocalRef, tls: Arc<ServerConfig>, drain: Drain) {
    let acceptor = TlsAcceptor::from(tls);
    let d = drain.clone();
    super::accept_until_drained(listener, &drain, |tcp, peer| {
        let (pi, local, acceptor, d) = (pi.clone(), local.clone(), acceptor.clone(), d.clone());
        serve_connection(pi, local, acceptor, tcp, peer, d)
    })
    .await
}

async fn serve_connection(
    pi: Arc<ProxyInputs>,
    local: LocalRef,
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
    drain: Drain,
) {
    let hs_deadline = pi.cfg.handshake_timeout();
    let warn = |msg: &str, err: String| {
        pi.events.push(Event {
            kind: "access",
            level: Level::Warn,
            message: msg.to_string(),
            fields: fields! {"src.addr" => peer.to_string(), "direction" => "inbound", "error" => err},
        });
    };
    let mut tls = match tokio::time::timeout(hs_deadline, acceptor.accept(crate::tls::tls_socket(tcp))).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            pi.metrics.tls_handshake_failures_inbound.fetch_add(1, Ordering::Relaxed);
            return warn("TLS handshake failed", e.to_string());
        }
        Err(_) => {
            pi.metrics.tls_handshake_failures_inbound.fetch_add(1, Ordering::Relaxed);
            return warn("TLS handshake failed", "timed out".into());
        }
    };
    tls.get_mut().1.set_buffer_limit(Some(crate::tls::TLS_SEND_BUFFER));
    // The verifier accepted exactly one SPIFFE SAN in our trust domain; read that same SAN back.
    let peer_id = match tls.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|c| spiffe_identity(c)) {
        Some(Ok(id)) => Arc::new(id),
        _ => return warn("TLS handshake failed", "no verified peer identity".into()),
    };
    let mut conn = match tokio::time::timeout(hs_deadline, builder(&pi.cfg).handshake::<_, Bytes>(tls)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return warn("HTTP/2 handshake failed", e.to_string()),
        Err(_) => return warn("HTTP/2 handshake failed", "timed out".into()),
    };
    pi.metrics.tunnels_accepted_inbound.fetch_add(1, Ordering::Relaxed);
    pi.metrics.tunnels_active_inbound.fetch_add(1, Ordering::Relaxed);
    let mut ping = match conn.ping_pong() {
        Some(p) => Box::pin(async move { keepalive(p).await })
            as std::pin::Pin<Box<dyn std::future::Future<Output = &'static str> + Send>>,
        None => Box::pin(std::future::pending()),
    };
    let ctx = Arc::new(StreamContext { pi: pi.clone(), local, peer_id, peer, force: drain.force.clone() });
    let mut going_away = false;
    loop {
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok((req, respond))) => {
                    let setup = Box::pin(establish_stream(ctx.clone(), req, respond));
                    drain.tasks.spawn(stream_task(ctx.clone(), setup));
                }
                Some(Err(_)) | None => break,
            },
            _ = drain.graceful.cancelled(), if !going_away => {
                going_away = true;
                conn.graceful_shutdown();
            }
            _ = &mut ping => {
                conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                break;
            }
            _ = drain.force.cancelled() => break,
        }
    }
    pi.metrics.tunnels_active_inbound.fetch_sub(1, Ordering::Relaxed);
}

async fn respond_error(respond: &mut SendResponse<Bytes>, status: StatusCode) {
    let resp = Response::builder().status(status).body(()).expect("static response");
    let _ = respond.send_response(resp, true);
}

/// What the streams of one HBONE connection share: one allocation per connection, one pointer per stream task.
struct StreamContext {
    pi: Arc<ProxyInputs>,
    local: LocalRef,
    peer_id: Arc<Identity>,
    peer: SocketAddr,
    force: CancellationToken,
}

/// A CONNECT stream that was authorized and whose upstream is connected: what it needs for the rest of its life.
struct Established {
    upstream: TcpStream,
    send: h2::SendStream<Bytes>,
    body: RecvStream,
    track: super::tracker::TrackGuard,
    guard: crate::metrics::ConnectionGuard,
    local: Arc<Workload>,
    target: SocketAddr,
    started: Instant,
}

type EstablishFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Box<Established>>> + Send>>;

/// One CONNECT stream's task. Validation, authorization and the upstream connect run boxed (the caller's box) and
/// are freed once established, so the task is sized for the relay, which lives as long as the connection.
async fn stream_task(ctx: Arc<StreamContext>, establish: EstablishFuture) {
    // Unboxed by value: the box is freed here, not at the end of the connection.
    let Some(Established { upstream, send, body, track, mut guard, local, target, started }) =
        establish.await.map(|b| *b)
    else {
        return;
    };
    let counters = guard.counters.clone();
    // The reporter's view: received = bytes from the peer, sent = bytes back to it.
    let (from_peer, to_peer) = (Tally::new(Some(&counters.received)), Tally::new(Some(&counters.sent)));
    let result = tokio::select! {
        r = crate::copy::tcp_h2_bidirectional(upstream, send, body, &to_peer, &from_peer) => r.map(|_| ()),
        _ = ctx.force.cancelled() => Err(std::io::Error::other("drained")),
        _ = track.close.cancelled() => Err(std::io::Error::other("connection closed due to policy change")),
    };
    let (rx, tx) = (from_peer.get(), to_peer.get());
    if result.is_err() {
        guard.fail(if track.close.is_cancelled() { "DENY" } else { "CONNECT" });
    }
    drop(track);
    let err = result.err().map(|e| e.to_string());
    log_complete(&ctx.pi, ctx.peer, &ctx.peer_id, &local, target, tx, rx, started, err);
}

/// Validate, authorize and connect one CONNECT stream; answer it (200 with the upstream connected, or the error).
async fn establish_stream(
    ctx: Arc<StreamContext>,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) -> Option<Box<Established>> {
    let (pi, local_ref, peer_id, peer) = (&*ctx.pi, &ctx.local, &*ctx.peer_id, ctx.peer);
    let started = Instant::now();
    let (local, source) = {
        let st = pi.state.read().expect("state lock");
        let local = local_ref.resolve(&st);
        // The source workload by the connection's IP, used for metrics only when its identity is the verified one.
        let source = local
            .as_ref()
            .and_then(|l| st.workload_by_addr(&l.network, peer.ip()))
            .filter(|w| &w.identity() == peer_id)
            .cloned();
        (local, source)
    };
    let target = match validate_connect(&req, local.as_deref(), pi.cfg.illegal_ports()) {
        Ok(t) => t,
        Err(e) => {
            respond_error(&mut respond, e.status()).await;
            pi.events.push(Event {
                kind: "access",
                level: Level::Warn,
                message: "connection failed".into(),
                fields: fields! {
                    "src.addr" => peer.to_string(), "src.identity" => peer_id.to_string(),
                    "dst.addr" => req.uri().to_string(), "direction" => "inbound", "error" => e.to_string(),
                    "status" => e.status().as_u16(),
                },
            });
            return None;
        }
    };
    let local = local.expect("validated");
    // Register, then check: a policy change from here on re-evaluates this connection (tracker.rs).
    let conn = rbac::Connection::new(Some(peer_id.clone()), peer.ip(), target.ip(), target.port());
    let track = pi.tracker.register(local_ref.clone(), conn.clone(), "HBONE");
    let decision = {
        let st = pi.state.read().expect("state lock");
        let resolved = local_ref.resolve(&st);
        let current = resolved.as_ref().unwrap_or(&local);
        if st.has_dry_run_policies() {
            for (policy, action) in rbac::dry_run_matches(&st, current, &conn) {
                pi.events.log(
                    Level::Info,
                    "dry-run policy matched",
                    fields! {"policy" => policy, "action" => format!("{action:?}"), "src.identity" => peer_id.to_string(),
                        "dst.addr" => target.to_string()},
                );
            }
        }
        rbac::authorize(&st, current, &conn)
    };
    let mut guard = pi.metrics.open(TrafficLabels::new(&ConnectionInfo {
        reporter: Reporter::Destination,
        source: source.as_deref(),
        source_identity: Some(peer_id),
        destination: Some(&local),
        destination_identity: Some(&local.identity()),
        destination_service: None,
        mutual_tls: true,
    }));
    if !decision.allowed {
        respond_error(&mut respond, StatusCode::UNAUTHORIZED).await;
        guard.fail("DENY");
        pi.metrics.authz_denied.fetch_add(1, Ordering::Relaxed);
        let mut f = fields! {
            "src.addr" => peer.to_string(), "src.identity" => peer_id.to_string(),
            "dst.addr" => target.to_string(), "dst.workload" => local.name.clone(), "direction" => "inbound",
            "error" => format!("connection denied: {}", decision.reason),
        };
        if let Some(p) = &decision.policy {
            f.insert("policy".into(), p.clone().into());
        }
        pi.events.push(Event { kind: "access", level: Level::Warn, message: "connection denied".into(), fields: f });
        return None;
    }
    // In-pod, the application sees the client's IP (ENABLE_ORIG_SRC); the port is left to the kernel.
    let opts = crate::socket::ConnectOptions {
        bind: pi.preserve_source.then_some(SocketAddr::new(peer.ip(), 0)),
        transparent: pi.preserve_source,
    };
    let upstream = match crate::socket::connect_with(&*pi.sockets, target, opts, pi.cfg.connect_timeout()).await {
        Ok(s) => s,
        Err(e) => {
            let err = InboundError::Upstream(target, e.to_string());
            respond_error(&mut respond, err.status()).await;
            guard.fail("CONNECT");
            log_complete(pi, peer, peer_id, &local, target, 0, 0, started, Some(err.to_string()));
            return None;
        }
    };
    // ENABLE_RESPONSE_BAGGAGE (Istio's default): the 200 carries the destination's baggage for the client's metrics.
    let mut ok = Response::builder().status(StatusCode::OK);
    let dst_baggage = super::outbound::baggage(&pi.cfg.cluster_id, &local);
    if !dst_baggage.is_empty() {
        ok = ok.header("baggage", dst_baggage);
    }
    let send = match respond.send_response(ok.body(()).unwrap_or_else(|_| Response::new(())), false) {
        Ok(s) => s,
        Err(e) => {
            guard.fail("CONNECT");
            log_complete(pi, peer, peer_id, &local, target, 0, 0, started, Some(e.to_string()));
            return None;
        }
    };
    Some(Box::new(Established { upstream, send, body: req.into_body(), track, guard, local, target, started }))
}

#[allow(clippy::too_many_arguments)]
fn log_complete(
    pi: &ProxyInputs,
    peer: SocketAddr,
    peer_id: &Identity,
    local: &Workload,
    target: SocketAddr,
    sent: u64,
    received: u64,
    started: Instant,
    error: Option<String>,
) {
    let level = if error.is_some() { Level::Error } else { Level::Info };
    if !pi.events.enabled("access", level) {
        return;
    }
    let mut f = fields! {
        "src.addr" => peer.to_string(),
        "src.identity" => peer_id.to_string(),
        "dst.addr" => target.to_string(),
        "dst.workload" => local.name.clone(),
        "dst.namespace" => local.namespace.clone(),
        "dst.identity" => local.identity().to_string(),
        "direction" => "inbound",
        "bytes_sent" => sent,
        "bytes_recv" => received,
        "duration" => format!("{}ms", started.elapsed().as_millis()),
    };
    if let Some(e) = error {
        f.insert("error".into(), e.into());
    }
    pi.events.push(Event { kind: "access", level, message: "connection complete".into(), fields: f });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{State, StateDelta};

    #[test]
    fn connect_validation_table() {
        let mut st = State::default();
        st.apply(
            serde_json::from_str::<StateDelta>(
                r#"{"workloads":[{"uid":"echo","name":"echo","namespace":"default","workloadIps":["127.0.2.10"],"protocol":"HBONE"}]}"#,
            )
            .unwrap(),
        )
        .unwrap();
        let local = st.workload("echo").cloned();
        let illegal = [15001, 15006, 15008, 15080];
        let req = |m: Method, auth: &str| Request::builder().method(m).uri(auth).body(()).unwrap();
        type Case<'a> = (Request<()>, Option<&'a Workload>, Result<&'a str, StatusCode>);
        let cases: Vec<Case> = vec![
            (req(Method::CONNECT, "127.0.2.10:8080"), local.as_deref(), Ok("127.0.2.10:8080")),
            (req(Method::GET, "127.0.2.10:8080"), local.as_deref(), Err(StatusCode::BAD_REQUEST)),
            (req(Method::POST, "127.0.2.10:8080"), local.as_deref(), Err(StatusCode::BAD_REQUEST)),
            (req(Method::CONNECT, "127.0.0.1:8080"), local.as_deref(), Err(StatusCode::BAD_REQUEST)),
            (req(Method::CONNECT, "127.0.2.11:8080"), local.as_deref(), Err(StatusCode::BAD_REQUEST)),
            (req(Method::CONNECT, "echo.default:8080"), local.as_deref(), Err(StatusCode::BAD_REQUEST)),
            (req(Method::CONNECT, "127.0.2.10:15008"), local.as_deref(), Err(StatusCode::SERVICE_UNAVAILABLE)),
            (req(Method::CONNECT, "127.0.2.10:15001"), local.as_deref(), Err(StatusCode::SERVICE_UNAVAILABLE)),
            (req(Method::CONNECT, "127.0.2.10:8080"), None, Err(StatusCode::SERVICE_UNAVAILABLE)),
        ];
        for (r, l, want) in cases {
            let got = validate_connect(&r, l, &illegal).map_err(|e| e.status());
            let want = want.map(|s| s.parse::<SocketAddr>().unwrap());
            assert_eq!(got, want, "{} {}", r.method(), r.uri());
        }
    }
}
