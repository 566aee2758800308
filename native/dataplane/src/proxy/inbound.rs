//! Inbound HBONE (15008): mTLS, then HTTP/2, then one CONNECT stream per proxied connection to the local workload.
//!
//! Invariants:
//! - The peer identity is the single SPIFFE SAN of the certificate verified in the handshake; no header changes it.
//! - The upstream IP is always the local workload's own IP; only the port comes from `:authority` (or a service
//!   hostname's mapping, or the application tunnel). An `:authority` naming another IP is refused (400) unless the
//!   workload has an application tunnel or is that target's waypoint. Our own ports are refused (503) after the
//!   mapping.
//! - The upstream connection is established before the 200 is sent; no byte reaches the application before the
//!   answer is decided.
//! - Handshakes (TLS and the HTTP/2 preface) have a deadline, so a peer cannot hold a socket for free.
//! - A stream's upstream dial lives only as long as the stream: the peer's RST_STREAM, or the connection's end, drops
//!   it (and its socket) at once. At most MAX_PENDING_STREAMS streams per connection (MAX_PENDING_STREAMS_PER_PEER
//!   per peer) are being set up at a time (more wait, and may be reset while they wait), and a peer that resets more than RESET_ALLOWANCE streams beyond twice those it
//!   completed is sent GOAWAY ENHANCE_YOUR_CALM (HTTP/2 rapid reset).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{Method, Request, Response, StatusCode};
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
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
use crate::state::{AppTunnelProtocol, GatewayDestination, Service, State, Workload};

/// Streams of one HBONE connection being set up at once (authorization and upstream connect): more wait for a place,
/// so one connection cannot hold more than this many upstream dials.
pub const MAX_PENDING_STREAMS: usize = 64;
/// Streams the peer may reset before they are established, beyond twice the streams it completed, before the
/// connection is closed with ENHANCE_YOUR_CALM (HTTP/2 rapid reset, CVE-2023-44487).
pub const RESET_ALLOWANCE: u32 = 100;
/// Connections one peer IP may hold on one inbound listener (a peer node pools one per source identity, so this is
/// generous); more are closed at accept, before any TLS work.
pub const MAX_CONNECTIONS_PER_PEER: usize = 512;
/// Streams being set up at once across all of one peer IP's connections to one listener.
pub const MAX_PENDING_STREAMS_PER_PEER: usize = 256;

/// What each peer IP holds on one listener: its connections, and the permits for its streams being set up.
#[derive(Default)]
struct Peers {
    by_ip: parking_lot::Mutex<std::collections::HashMap<IpAddr, (usize, Arc<Semaphore>)>>,
}

/// One admitted connection of a peer; releases its place when dropped.
struct PeerGuard {
    peers: Arc<Peers>,
    ip: IpAddr,
    pending: Arc<Semaphore>,
}

impl Peers {
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<PeerGuard> {
        let mut map = self.by_ip.lock();
        let entry = map.entry(ip).or_insert_with(|| (0, Arc::new(Semaphore::new(MAX_PENDING_STREAMS_PER_PEER))));
        if entry.0 >= MAX_CONNECTIONS_PER_PEER {
            return None;
        }
        entry.0 += 1;
        Some(PeerGuard { peers: self.clone(), ip, pending: entry.1.clone() })
    }
}

impl Drop for PeerGuard {
    fn drop(&mut self) {
        let mut map = self.peers.by_ip.lock();
        if let Some(entry) = map.get_mut(&self.ip) {
            entry.0 -= 1;
            if entry.0 == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// Why a CONNECT stream was refused, and with which status.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InboundError {
    #[error("method {0} is not CONNECT")]
    NotConnect(String),
    #[error("authority {0:?} is not ip:port or host:port")]
    BadAuthority(String),
    #[error("ip mismatch: authority {0} is not an address of the local workload, nor a target it is the waypoint of")]
    IpMismatch(IpAddr),
    #[error("local workload {0} is not known")]
    UnknownWorkload(String),
    #[error("port {0} is ztunnel-node's own")]
    IllegalPort(u16),
    #[error("no service has the hostname {0}")]
    NoHostname(String),
    #[error("service {0} has no target port for port {1}")]
    NoPortForService(String, u16),
    #[error("service {0} has no VIP to name in the PROXY header")]
    NoIpForService(String),
    #[error("connecting to {0}: {1}")]
    Upstream(SocketAddr, String),
}

impl InboundError {
    pub fn status(&self) -> StatusCode {
        match self {
            InboundError::NotConnect(_) | InboundError::BadAuthority(_) | InboundError::IpMismatch(_) => {
                StatusCode::BAD_REQUEST
            }
            InboundError::UnknownWorkload(_)
            | InboundError::IllegalPort(_)
            | InboundError::NoHostname(_)
            | InboundError::NoPortForService(..)
            | InboundError::NoIpForService(_)
            | InboundError::Upstream(..) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// An HBONE `:authority`: an address, or a service hostname and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authority {
    Addr(SocketAddr),
    Host(String, u16),
}

impl Authority {
    /// `ip:port` or `host:port`; port 0 is no port (nothing listens there; dialing it is refused, not tried).
    pub fn parse(s: &str) -> Option<Authority> {
        if let Ok(a) = s.parse::<SocketAddr>() {
            return (a.port() != 0).then_some(Authority::Addr(a));
        }
        let (host, port) = s.rsplit_once(':')?;
        // As ztunnel reads it (HboneAddress::try_from: an address first, else the URI's host and `port_u16`, whose
        // parse takes a leading '+'): "10.0.0.1:+80" is the hostname "10.0.0.1", port 80, which no service has (503).
        let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
        let valid = !host.is_empty()
            && host.len() <= 253
            && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
        valid.then(|| Authority::Host(host.to_string(), port))
    }
}

/// The first service (by key) of which `w` is an endpoint and that delivers to `port` on it: a service port mapped
/// to `port` by the endpoint's own map, else by the service's, else the service port itself.
pub fn service_for_port(st: &State, w: &Workload, port: u16) -> Option<Arc<Service>> {
    // Per inbound connection: one pass over this endpoint's few services, no allocation.
    let delivers = |svc: &Service, endpoint_ports: &crate::state::PortMap| {
        svc.ports.iter().any(|(sp, tp)| {
            let target =
                endpoint_ports.get(sp).copied().filter(|t| *t != 0).or(Some(*tp).filter(|t| *t != 0)).unwrap_or(*sp);
            target == port
        }) || endpoint_ports.iter().any(|(_, tp)| *tp == port)
    };
    w.service_ports
        .iter()
        .filter_map(|(key, endpoint_ports)| st.service(key).filter(|svc| delivers(svc, endpoint_ports)))
        .min_by_key(|s| s.key())
        .cloned()
}

/// Where an accepted CONNECT stream goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundTarget {
    /// Always the local workload's IP; the port from the authority (or the service's mapping, or the application
    /// tunnel's port).
    pub upstream: SocketAddr,
    /// The application tunnel to speak to the upstream, and the target to name in it.
    pub tunnel: Option<(AppTunnelProtocol, SocketAddr)>,
    /// The service named by a hostname authority.
    pub service: Option<Arc<Service>>,
}

/// Decide one CONNECT stream for `local`, reached on `dst_ip` (a pure function of the request and the state):
/// ztunnel's validation (CONNECT only; the authority's IP must be the workload's, unless the workload has an
/// application tunnel or is the waypoint of the authority's target; a hostname names a service) and its upstream
/// (the local IP; the port from the authority, the service's mapping for a hostname, then the application tunnel's
/// override). Our own ports are refused after the mapping.
pub fn resolve_connect<B>(
    req: &Request<B>,
    local: Option<&Workload>,
    dst_ip: IpAddr,
    state: &State,
    illegal: &[u16],
) -> Result<InboundTarget, InboundError> {
    if req.method() != Method::CONNECT {
        return Err(InboundError::NotConnect(req.method().to_string()));
    }
    let raw = req.uri().authority().map(|a| a.as_str()).unwrap_or("");
    let authority = Authority::parse(raw).ok_or_else(|| InboundError::BadAuthority(raw.to_string()))?;
    let local = local.ok_or_else(|| InboundError::UnknownWorkload(String::new()))?;
    let target_ip = if local.ips.contains(&dst_ip) { dst_ip } else { local.ips.first().copied().unwrap_or(dst_ip) };
    let (dest, service) = match &authority {
        Authority::Addr(a) => {
            let aligned = local.ips.contains(&a.ip());
            if !aligned && local.application_tunnel.is_none() && !is_waypoint_of(state, local, a.ip()) {
                return Err(InboundError::IpMismatch(a.ip()));
            }
            (SocketAddr::new(target_ip, a.port()), None)
        }
        Authority::Host(host, port) => {
            let svc = state
                .service_by_hostname(host, &local.namespace)
                .ok_or_else(|| InboundError::NoHostname(host.clone()))?;
            let mapped = state.endpoint_ports(&svc.key(), &local.uid).and_then(|m| m.get(port)).copied();
            let p = match mapped.filter(|p| *p != 0).or_else(|| svc.ports.get(port).copied().filter(|p| *p != 0)) {
                Some(p) => p,
                None => return Err(InboundError::NoPortForService(host.clone(), *port)),
            };
            (SocketAddr::new(target_ip, p), Some(svc.clone()))
        }
    };
    if illegal.contains(&dest.port()) {
        return Err(InboundError::IllegalPort(dest.port()));
    }
    let Some(tunnel) = &local.application_tunnel else {
        return Ok(InboundTarget { upstream: dest, tunnel: None, service });
    };
    let upstream = SocketAddr::new(dest.ip(), tunnel.port.unwrap_or(dest.port()));
    let named = match (&authority, &service) {
        (Authority::Addr(a), _) => *a,
        // PROXY names addresses: a VIP of the service, on our network first, IPv4 first.
        (Authority::Host(host, port), svc) => {
            let vip = svc
                .as_ref()
                .and_then(|s| s.vips.iter().max_by_key(|(net, ip)| (**net == *local.network, ip.is_ipv4())))
                .ok_or_else(|| InboundError::NoIpForService(host.clone()))?;
            SocketAddr::new(vip.1, *port)
        }
    };
    Ok(InboundTarget { upstream, tunnel: Some((tunnel.protocol, named)), service })
}

/// The waypoint "sandwich": the authority's target (a service VIP or a workload on our network) names `local` as
/// its waypoint.
fn is_waypoint_of(state: &State, local: &Workload, target: IpAddr) -> bool {
    let gw = match state.workload_by_addr(&local.network, target) {
        Some(w) => w.waypoint.as_deref(),
        None => match state.service_by_vip(&local.network, target, &local.namespace) {
            Some(s) => s.waypoint.as_deref(),
            None => return false,
        },
    };
    let Some(gw) = gw else { return false };
    let service_has = |s: &Service| state.endpoint_ports(&s.key(), &local.uid).is_some();
    match &gw.destination {
        GatewayDestination::Address((net, ip)) => match state.workload_by_addr(net, *ip) {
            Some(w) => w.uid == local.uid,
            None => state.service_by_vip(net, *ip, &local.namespace).is_some_and(|s| service_has(s)),
        },
        GatewayDestination::Hostname(key) => match state.service(key) {
            Some(s) => service_has(s),
            None => state.workload_by_hostname(&key.namespace, &key.hostname).is_some_and(|w| w.uid == local.uid),
        },
    }
}

/// Serve one local workload's HBONE listener until drained, with its TLS config and the identity it serves as.
pub async fn serve(
    listener: TcpListener,
    pi: Arc<ProxyInputs>,
    local: LocalRef,
    (tls, identity): (Arc<ServerConfig>, Identity),
    drain: Drain,
) {
    let acceptor = TlsAcceptor::from(tls);
    let identity = Arc::new(identity);
    let d = drain.clone();
    let peers = Arc::new(Peers::default());
    let inputs = pi.clone();
    super::accept_until_drained(listener, &inputs, &drain, move |tcp, peer| {
        let (pi, local, acceptor, d, id) = (pi.clone(), local.clone(), acceptor.clone(), d.clone(), identity.clone());
        let admitted = if pi.resets.source_banned(peer.ip()) { Err(()) } else { Ok(peers.admit(peer.ip())) };
        async move {
            let Ok(admitted) = admitted else {
                pi.metrics.inbound_refused_resets.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let Some(place) = admitted else {
                pi.metrics.inbound_refused_peer_limit.fetch_add(1, Ordering::Relaxed);
                pi.events.log(
                    Level::Warn,
                    "inbound HBONE connection refused: the peer holds too many connections",
                    fields! {"src.addr" => peer.ip().to_string(), "limit" => MAX_CONNECTIONS_PER_PEER},
                );
                return;
            };
            serve_connection(pi, local, acceptor, id, tcp, peer, d, place).await
        }
    })
    .await
}

#[allow(clippy::too_many_arguments)]
async fn serve_connection(
    pi: Arc<ProxyInputs>,
    local: LocalRef,
    acceptor: TlsAcceptor,
    identity: Arc<Identity>,
    tcp: TcpStream,
    peer: SocketAddr,
    drain: Drain,
    place: PeerGuard,
) {
    let hs_deadline = pi.cfg.handshake_timeout();
    let dst_ip = match tcp.local_addr() {
        Ok(a) => crate::socket::canonical(a).ip(),
        Err(_) => return,
    };
    let warn = |msg: &str, err: String| {
        pi.events.push(Event {
            kind: "access",
            level: Level::Warn,
            message: msg.to_string(),
            fields: fields! {"src.addr" => peer.to_string(), "direction" => "inbound", "error" => err},
        });
    };
    // No certificate yet (not prefetched, or just forgotten): ask for it and wait, within the handshake deadline.
    if pi.certs.get(&identity).is_none() && pi.certs.wait_for(&identity, hs_deadline).await.is_none() {
        pi.metrics.tls_handshake_failures_inbound.fetch_add(1, Ordering::Relaxed);
        return warn("TLS handshake failed", format!("no certificate for {identity} within {hs_deadline:?}"));
    }
    // The handshake's traffic secrets are caught for a hand-over (`handover::tls13`).
    let secrets = Arc::new(parking_lot::Mutex::new(crate::handover::tls13::Secrets::default()));
    let handshake = crate::handover::tls13::capture(secrets.clone(), acceptor.accept(crate::tls::tls_socket(tcp)));
    let mut tls = match tokio::time::timeout(hs_deadline, handshake).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            pi.metrics.tls_handshake_failures_inbound.fetch_add(1, Ordering::Relaxed);
            if crate::tls::revocation::is_revoked_error(&e) {
                pi.certs.revocations().refused(crate::tls::revocation::Peer::Client);
            }
            return warn("TLS handshake failed", e.to_string());
        }
        Err(_) => {
            pi.metrics.tls_handshake_failures_inbound.fetch_add(1, Ordering::Relaxed);
            return warn("TLS handshake failed", "timed out".into());
        }
    };
    // HBONE is HTTP/2 over TLS: a client that did not negotiate `h2` (no ALPN at all: rustls lets that through)
    // speaks something else, and is closed before any HTTP/2 is read.
    if tls.get_ref().1.alpn_protocol() != Some(crate::tls::ALPN_H2) {
        pi.metrics.tls_handshake_failures_inbound.fetch_add(1, Ordering::Relaxed);
        return warn("TLS handshake failed", "the client did not negotiate ALPN h2".into());
    }
    tls.get_mut().1.set_buffer_limit(Some(crate::tls::TLS_SEND_BUFFER));
    // The verifier accepted exactly one SPIFFE SAN in our trust domain; read that same SAN back.
    let peer_id = match tls.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|c| spiffe_identity(c)) {
        Some(Ok(id)) => Arc::new(id),
        _ => return warn("TLS handshake failed", "no verified peer identity".into()),
    };
    // A peer the reset budget banned (`resets`) is refused until its ban ends.
    let budget_peer = super::resets::Peer { identity: Arc::from(peer_id.to_string()), source: peer.ip() };
    if pi.resets.banned(&budget_peer) {
        pi.metrics.inbound_refused_resets.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // A revocation list that revokes the peer closes the connection (`tls::revocation`).
    let revocation = pi.certs.watch_revocation(
        tls.get_ref().1.peer_certificates(),
        pi.certs.get(&identity).map(|c| c.roots.clone()),
        crate::tls::revocation::Peer::Client,
    );
    let buffers = pi.metrics.budget.connection(peer);
    // The tap under h2 follows the HTTP/2 state a hand-over carries (`handover::http2`).
    let (tap, session) = crate::handover::http2::Tap::new(tls, false);
    let tls = crate::budget::Metered::new(tap, buffers.clone(), false);
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
    let ctx = Arc::new(StreamContext {
        pi: pi.clone(),
        local,
        peer_id,
        peer,
        dst_ip,
        force: drain.force.clone(),
        pending: Arc::new(Semaphore::new(MAX_PENDING_STREAMS)),
        peer_pending: place.pending.clone(),
        resets: AtomicU32::new(0),
        established: AtomicU32::new(0),
        calm: CancellationToken::new(),
        budget_peer,
        banned: CancellationToken::new(),
        clean_streams: AtomicU32::new(0),
        buffers,
        streams_end: CancellationToken::new(),
        revoked: revocation.revoked.clone(),
        gate: Arc::default(),
    });
    let mut going_away = false;
    // A hand-over takes the connection whole: its description crosses with it, and it pauses only once a round.
    let ticket = pi.handover.ticket();
    let (mut described, mut declined) = (None, None);
    let mut kept = None;
    loop {
        let round = ticket.round();
        tokio::select! {
            _ = round.describe.cancelled(), if described != Some(round.generation) => {
                described = Some(round.generation);
                ticket.described_later(ctx.gate.streams());
            }
            _ = round.pause.cancelled(), if declined != Some(round.generation) => {
                use crate::handover::hconn::{offer_connection, Offered};
                let poll_conn = |cx: &mut std::task::Context<'_>| loop {
                    match conn.poll_accept(cx) {
                        // A stream that arrives now is refused: REFUSED_STREAM, not processed, which the peer may
                        // retry (ours does, on another connection).
                        std::task::Poll::Ready(Some(Ok((_, mut respond)))) => respond.send_reset(h2::Reason::REFUSED_STREAM),
                        std::task::Poll::Ready(_) => return std::task::Poll::Ready(false),
                        std::task::Poll::Pending => return std::task::Poll::Pending,
                    }
                };
                let window = pi.cfg.http2.connection_window_size as i64;
                match offer_connection((&ticket, &round), &ctx.gate, &session, &secrets, poll_conn, (window, &revocation), &pi.events).await {
                    Offered::Declined => declined = Some(round.generation),
                    Offered::Gone => break,
                    Offered::Kept(k) => {
                        kept = Some(*k);
                        break;
                    }
                }
            }
            next = conn.accept() => match next {
                Some(Ok(_)) if pi.resets.banned(&ctx.budget_peer) => {
                    ctx.banned.cancel();
                }
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
            _ = ctx.banned.cancelled() => {
                // Banned by the node's reset budget (the ban was logged where it started): GOAWAY and closed.
                pi.metrics.inbound_refused_resets.fetch_add(1, Ordering::Relaxed);
                conn.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                let flush = async { while let Some(Ok(_)) = conn.accept().await {} };
                let _ = tokio::time::timeout(std::time::Duration::from_secs(1), flush).await;
                break;
            }
            _ = ctx.calm.cancelled() => {
                conn.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                pi.events.log(
                    Level::Warn,
                    "HBONE connection closed: too many streams reset before they were established",
                    fields! {"src.addr" => peer.to_string(), "resets" => ctx.resets.load(Ordering::Relaxed)},
                );
                // Drive the connection a moment so the GOAWAY goes out; streams still arriving are dropped (reset).
                let flush = async { while let Some(Ok(_)) = conn.accept().await {} };
                let _ = tokio::time::timeout(std::time::Duration::from_secs(1), flush).await;
                break;
            }
            _ = ctx.buffers.shed.cancelled() => {
                // Shed to get the node back under its buffer budget (the warning is the budget's). The peer is not
                // reading, so the GOAWAY may never leave; the connection and what h2 holds for it go now.
                conn.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                break;
            }
            _ = ctx.revoked.cancelled() => {
                // A security event: the connection closes at once, and its streams with it, as ztunnel's.
                conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                pi.events.log(
                    Level::Warn,
                    "HBONE connection closed: its peer's certificate was revoked",
                    fields! {"src.addr" => peer.to_string(), "src.identity" => ctx.peer_id.to_string()},
                );
                break;
            }
            _ = drain.force.cancelled() => break,
        }
    }
    drop(revocation);
    // Revoked: the streams end now (their records say CERT_REVOKED), not after the grace.
    let now = ctx.buffers.shed.is_cancelled() || ctx.revoked.is_cancelled();
    super::h2::end_streams(ctx.streams_end.clone(), now, drain.force.clone());
    drop(ticket);
    if let Some((engine, ids, metas)) = kept {
        // It left h2 for a successor that did not take it: carried on here to its end.
        drop(conn);
        super::resume::run_streams(pi.clone(), drain.force.clone(), engine, ids, metas, None).await;
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
    /// The address the peer dialed (the local workload's IP).
    dst_ip: IpAddr,
    force: CancellationToken,
    /// Permits for streams being set up: this connection's (MAX_PENDING_STREAMS), its peer's across its connections
    /// (MAX_PENDING_STREAMS_PER_PEER).
    pending: Arc<Semaphore>,
    peer_pending: Arc<Semaphore>,
    /// Streams the peer reset before they were established, and streams established.
    resets: AtomicU32,
    established: AtomicU32,
    /// Cancelled when the resets exceed the allowance: the connection loop closes the connection.
    calm: CancellationToken,
    /// The peer as the node's reset budget knows it (`resets`), and cancelled when the budget bans it.
    budget_peer: super::resets::Peer,
    banned: CancellationToken,
    /// Streams that ended well since the last report to the reset budget.
    clean_streams: AtomicU32,
    /// The connection's share of the node's buffer budget.
    buffers: Arc<crate::budget::ConnBuffers>,
    /// Ends the streams: at once when the connection is drained or shed, CLOSED_STREAM_GRACE after it ended
    /// otherwise, to deliver what h2 still held (`h2::end_streams`).
    streams_end: CancellationToken,
    /// Fired when a revocation list revokes the peer's certificate: the connection closes, its streams end at once
    /// (through `streams_end`) and say CERT_REVOKED.
    revoked: CancellationToken,
    /// Where the streams stop for a hand-over of the connection.
    gate: Arc<crate::handover::hconn::Gate>,
}

impl StreamContext {
    /// The peer reset a stream before it was established: counted on the connection (its allowance) and for the
    /// peer across its connections (`resets`).
    fn peer_reset(&self) {
        let resets = self.resets.fetch_add(1, Ordering::Relaxed) + 1;
        if resets > RESET_ALLOWANCE + 2 * self.established.load(Ordering::Relaxed) {
            self.calm.cancel();
        }
        self.stream_ended(true);
    }

    /// One of the peer's streams ended, premature or not. Clean ones are counted here and reported with the next
    /// premature one, or when the connection and its last stream are gone (`Drop`); a ban it starts closes this
    /// connection.
    fn stream_ended(&self, premature: bool) {
        if !premature {
            self.clean_streams.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let clean = self.clean_streams.swap(0, Ordering::Relaxed);
        for b in self.pi.resets.record(&self.budget_peer, clean, true) {
            self.pi.events.log(
                Level::Warn,
                "HBONE peer banned: most of its recent streams were reset prematurely",
                fields! {
                    "peer" => b.who, "src.addr" => self.peer.to_string(), "premature" => b.premature,
                    "streams" => b.streams, "for" => format!("{:?}", b.for_)
                },
            );
            self.banned.cancel();
        }
    }
}

impl Drop for StreamContext {
    /// The connection and its last stream have ended: the clean streams not reported yet go to the reset budget.
    fn drop(&mut self) {
        let clean = *self.clean_streams.get_mut();
        self.pi.resets.record(&self.budget_peer, clean, false);
    }
}

/// A CONNECT stream that was authorized and whose upstream is connected: what it needs for the rest of its life.
struct Established {
    upstream: TcpStream,
    send: h2::SendStream<Bytes>,
    body: RecvStream,
    track: super::tracker::TrackGuard,
    result: super::access::ConnectionResult,
    local: Arc<Workload>,
    target: SocketAddr,
}

/// How a stream that was not established ended: reset by the peer while it was set up (premature), or answered
/// with an error (a denial, a failed dial...).
enum Ended {
    Reset,
    Failed,
}

type EstablishFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Box<Established>, Ended>> + Send>>;

/// One CONNECT stream's task. Validation, authorization and the upstream connect run boxed (the caller's box) and
/// are freed once established, so the task is sized for the relay, which lives as long as the connection.
async fn stream_task(ctx: Arc<StreamContext>, establish: EstablishFuture) {
    // Unboxed by value: the box is freed here, not at the end of the connection. A connection with a stream being
    // set up is not handed over.
    let setting_up = ctx.gate.setting_up();
    let created = Instant::now();
    let established = establish.await.map(|b| *b);
    drop(setting_up);
    let Established { upstream, send, body, track, result, local, target } = match established {
        Ok(e) => e,
        // A reset while it was set up was counted as premature (`peer_reset`).
        Err(Ended::Reset) => return,
        Err(Ended::Failed) => return ctx.stream_ended(false),
    };
    let counters = result.counters();
    // The reporter's view: received = bytes from the peer, sent = bytes back to it.
    let (from_peer, to_peer) = (Tally::new(Some(&counters.received)), Tally::new(Some(&counters.sent)));
    let describe = || {
        let record = super::access::record_fields(&access_record(ctx.peer, &ctx.peer_id, &local, target));
        let kind = crate::handover::ConnKind::InboundHbone;
        let meta = super::resume::meta(kind, &ctx.local, &result, record, (ctx.peer, target, target));
        crate::handover::ConnMeta { peer_identity: Some(ctx.peer_id.to_string()), ..meta }
    };
    // The relay and its other ends are built in place (a value moved into a future would take room twice).
    let copied = {
        let mut relay =
            crate::copy::tcp_h2_bidirectional(upstream, send, body, &to_peer, &from_peer, Some(ctx.buffers.clone()));
        let ends = std::pin::pin!(async {
            tokio::select! {
                _ = track.close.cancelled() => std::io::Error::other("connection closed due to policy change"),
                // Drained, shed for the buffer budget (a stream blocked writing to an application that does not
                // read would keep the connection's buffers alive), or the connection's end after the grace.
                _ = ctx.streams_end.cancelled() => std::io::Error::other(if ctx.force.is_cancelled() {
                    "drained"
                } else if ctx.buffers.shed.is_cancelled() {
                    "shed: the node's buffered stream data is over its budget"
                } else {
                    "the HBONE connection closed"
                }),
            }
        });
        match crate::handover::hconn::carry_stream(&ctx.gate, &mut relay, ends, describe).await {
            crate::handover::hconn::Carried::Ended(r) => r,
            crate::handover::hconn::Carried::Give(tx) => {
                let _ = tx.send(relay.into_parts());
                return;
            }
        }
    };
    let flag = if ctx.revoked.is_cancelled() {
        "CERT_REVOKED"
    } else if track.close.is_cancelled() {
        "DENY"
    } else {
        "CONNECT"
    };
    drop(track);
    // Premature (`resets`): the peer reset it within a second of its creation, or after its 200 with no byte moved.
    // The relay ends on the stream's HTTP/2 error: the peer's RST_STREAM itself, or h2's "inactive stream" for what
    // the relay still had to do on the stream the peer reset (not the connection's end: I/O or GOAWAY).
    let reset_by_peer = copied.as_ref().err().is_some_and(|e| {
        e.get_ref().and_then(|i| i.downcast_ref::<h2::Error>()).is_some_and(|h| !h.is_io() && !h.is_go_away())
    });
    let idle = to_peer.get() == 0 && from_peer.get() == 0;
    ctx.stream_ended(reset_by_peer && (created.elapsed() < super::resets::PREMATURE_LIFETIME || idle));
    let error = copied.err().map(|e| {
        (flag, if flag == "CERT_REVOKED" { crate::tls::revocation::REVOKED.to_string() } else { e.to_string() })
    });
    let record = access_record(ctx.peer, &ctx.peer_id, &local, target);
    result.finish(&ctx.pi, &record, to_peer.get(), from_peer.get(), error);
}

/// Validate, authorize and connect one CONNECT stream; answer it (200 with the upstream connected, or the error).
async fn establish_stream(
    ctx: Arc<StreamContext>,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) -> Result<Box<Established>, Ended> {
    let (pi, local_ref, peer_id, peer) = (&*ctx.pi, &ctx.local, &*ctx.peer_id, ctx.peer);
    let started = Instant::now();
    // Held until this returns: the streams being set up at once are bounded per connection and per peer. A stream
    // beyond the bound waits for a place (it is not refused: a burst of legitimate streams is only delayed), and a
    // reset while it waits ends it like a reset during its dial.
    let permits = {
        let acquire = async {
            let conn = ctx.pending.clone().acquire_owned().await.ok()?;
            Some((conn, ctx.peer_pending.clone().acquire_owned().await.ok()?))
        };
        let reset = std::future::poll_fn(|cx| respond.poll_reset(cx));
        tokio::select! {
            p = acquire => p,
            _ = reset => None,
        }
    };
    let Some(_setting_up) = permits else {
        ctx.peer_reset();
        return Err(Ended::Reset);
    };
    // x-forwarded-network naming another network: the peer is a gateway, its IP says nothing of the source.
    let from_gateway = req
        .headers()
        .get("x-forwarded-network")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|n| !n.eq_ignore_ascii_case(&pi.cfg.network));
    let (local, source, resolved) = {
        let st = pi.state.read();
        let local = local_ref.resolve(&st);
        // The source workload by the connection's IP, used for metrics only when its identity is the verified one.
        let source = local
            .as_ref()
            .filter(|_| !from_gateway)
            .and_then(|l| st.workload_by_addr(&l.network, peer.ip()))
            .filter(|w| &w.identity() == peer_id)
            .cloned();
        let resolved = resolve_connect(&req, local.as_deref(), ctx.dst_ip, &st, &pi.cfg.illegal_ports());
        (local, source, resolved)
    };
    // The source as its baggage describes it, read only when its workload is not known here (another cluster's).
    let derived_source = source.is_none().then(|| crate::metrics::Baggage::parse(req.headers())).flatten();
    let InboundTarget { upstream: target, tunnel, service } = match resolved {
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
            return Err(Ended::Failed);
        }
    };
    let local = local.expect("validated");
    // Register, then check: a policy change from here on re-evaluates this connection (tracker.rs).
    let conn = rbac::Connection::new(Some(peer_id.clone()), peer.ip(), target.ip(), target.port())
        .with_trust_domains(pi.certs.trust_domains(), &local.trust_domain);
    let track = pi.tracker.register(local_ref.clone(), conn.clone(), "HBONE");
    let decision = {
        let st = pi.state.read();
        let resolved = local_ref.resolve(&st);
        let current = resolved.as_ref().unwrap_or(&local);
        super::authorize_logged(pi, &st, current, &conn, target)
    };
    // destination_service: the service the authority named, else (an address authority) the destination workload's
    // service that delivers to this port, as ztunnel infers it, so service dashboards see inbound traffic too.
    let service = service.or_else(|| {
        let st = pi.state.read();
        service_for_port(&st, &local, target.port())
    });
    let labels = TrafficLabels::new(&ConnectionInfo {
        reporter: Reporter::Destination,
        source: source.as_deref(),
        source_identity: Some(peer_id),
        destination: Some(&local),
        destination_identity: Some(&local.identity()),
        destination_service: service.as_deref(),
        mutual_tls: true,
        derived_source: derived_source.as_ref(),
        derived_destination: None,
    });
    let mut result = super::access::ConnectionResult::open(pi, labels, started);
    if !decision.allowed {
        respond_error(&mut respond, StatusCode::UNAUTHORIZED).await;
        result.fail("DENY");
        pi.metrics.authz_denied.fetch_add(1, Ordering::Relaxed);
        let mut f = fields! {
            "src.addr" => peer.to_string(), "src.identity" => peer_id.to_string(),
            "dst.addr" => target.to_string(), "dst.workload" => local.name.clone(),
            "dst.namespace" => local.namespace.clone(), "dst.identity" => local.identity().to_string(),
            "direction" => "inbound", "error" => format!("connection denied: {}", decision.reason),
        };
        if let Some(p) = &decision.policy {
            f.insert("policy".into(), p.clone().into());
        }
        pi.events.push(Event { kind: "access", level: Level::Warn, message: "connection denied".into(), fields: f });
        pi.denials.record(local.uid.clone(), conn, "HBONE");
        return Err(Ended::Failed);
    }
    // An application tunnel speaking PROXY is reached on loopback, from loopback (LOCALHOST_APP_TUNNEL): it is then
    // reachable only through us, and the PROXY header carries the original addresses.
    let proxy_to = tunnel.filter(|(p, _)| *p == AppTunnelProtocol::Proxy).map(|(_, named)| named);
    let (dial, opts) = if proxy_to.is_some() && pi.cfg.localhost_app_tunnel {
        let lo =
            if target.is_ipv4() { IpAddr::from([127, 0, 0, 1]) } else { IpAddr::from(std::net::Ipv6Addr::LOCALHOST) };
        let opts = crate::socket::ConnectOptions { bind: Some(SocketAddr::new(lo, 0)), transparent: false };
        (SocketAddr::new(lo, target.port()), opts)
    } else {
        // In-pod, the application sees the client's IP (ENABLE_ORIG_SRC); the port is left to the kernel.
        let opts = crate::socket::ConnectOptions {
            bind: pi.preserve_source.then_some(SocketAddr::new(peer.ip(), 0)),
            transparent: pi.preserve_source,
        };
        (target, opts)
    };
    // The dial races the peer: a reset of this stream (or the connection's end) drops it, closing its socket at once,
    // instead of holding a descriptor for the whole connect timeout.
    let dialed = {
        let connect = crate::socket::connect_with(&*pi.sockets, dial, opts, pi.cfg.connect_timeout());
        let reset = std::future::poll_fn(|cx| respond.poll_reset(cx));
        tokio::select! {
            r = connect => Some(r),
            _ = reset => None,
        }
    };
    let Some(dialed) = dialed else {
        ctx.peer_reset();
        result.fail("CONNECT");
        return Err(Ended::Reset);
    };
    let mut upstream = match dialed {
        Ok(s) => s,
        Err(e) => {
            let err = InboundError::Upstream(target, e.to_string());
            respond_error(&mut respond, err.status()).await;
            result.finish(pi, &access_record(peer, peer_id, &local, target), 0, 0, Some(("CONNECT", err.to_string())));
            return Err(Ended::Failed);
        }
    };
    // ENABLE_RESPONSE_BAGGAGE (Istio's default): the 200 carries the destination's baggage for the client's metrics.
    let mut ok = Response::builder().status(StatusCode::OK);
    let dst_baggage = crate::metrics::baggage(&local);
    if pi.cfg.enable_response_baggage && !dst_baggage.is_empty() {
        ok = ok.header("baggage", dst_baggage);
    }
    let send = match respond.send_response(ok.body(()).unwrap_or_else(|_| Response::new(())), false) {
        Ok(s) => s,
        Err(e) => {
            result.finish(pi, &access_record(peer, peer_id, &local, target), 0, 0, Some(("CONNECT", e.to_string())));
            return Err(Ended::Failed);
        }
    };
    if let Some(named) = proxy_to {
        use tokio::io::AsyncWriteExt;
        let written = match super::proxy_protocol::header(peer, named, Some(peer_id)) {
            Ok(h) => upstream.write_all(&h).await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            let error = Some(("CONNECT", format!("PROXY header: {e}")));
            result.finish(pi, &access_record(peer, peer_id, &local, target), 0, 0, error);
            return Err(Ended::Failed);
        }
    }
    ctx.established.fetch_add(1, Ordering::Relaxed);
    Ok(Box::new(Established { upstream, send, body: req.into_body(), track, result, local, target }))
}

/// What the inbound access record names: the peer and its identity, the target and the workload it reaches.
fn access_record<'a>(
    peer: SocketAddr,
    peer_id: &'a Identity,
    local: &'a Workload,
    target: SocketAddr,
) -> super::access::AccessRecord<'a> {
    super::access::AccessRecord {
        direction: "inbound",
        src_addr: peer,
        src_workload: None,
        src_identity: Some(peer_id),
        dst_addr: target,
        dst_hbone_addr: None,
        dst_service: None,
        dst_workload: Some(local),
        dst_identity_of: Some(local),
        dst_derived: None,
        attempts: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{State, StateDelta};
    use serde_json::json;

    /// A port is what u16's parser reads, as the http crate's `port_u16` ztunnel uses: a leading '+' and zeros are
    /// taken, so "10.0.0.1:+80" is the hostname "10.0.0.1" (ztunnel's SvcHostname: no such service, 503), not the
    /// address; anything else is no authority (400).
    #[test]
    fn an_authority_port_is_read_as_ztunnel_reads_it() {
        assert_eq!(Authority::parse("10.0.0.1:+80"), Some(Authority::Host("10.0.0.1".into(), 80)));
        assert_eq!(Authority::parse("h:080"), Some(Authority::Host("h".into(), 80)));
        for bad in ["h:-1", "h: 80", "h:", "h:++80", "h:0", "h:65536"] {
            assert_eq!(Authority::parse(bad), None, "{bad}");
        }
    }

    /// What one idle inbound stream's task holds for its life (the spawned future; `cargo test --release
    /// task_sizes -- --nocapture` prints the release figure). The bound catches a field added to the relay state.
    #[test]
    fn stream_task_size() {
        let pi = crate::inpod::testutil::inputs();
        let ctx = Arc::new(StreamContext {
            buffers: pi.metrics.budget.connection("127.0.0.1:15008".parse().unwrap()),
            pi,
            local: LocalRef::Uid("u".into()),
            peer_id: Arc::new(Identity::new("cluster.local", "default", "sleep")),
            peer: "127.0.0.1:1".parse().unwrap(),
            dst_ip: "127.0.0.2".parse().unwrap(),
            force: CancellationToken::new(),
            pending: Arc::new(Semaphore::new(1)),
            peer_pending: Arc::new(Semaphore::new(1)),
            resets: AtomicU32::new(0),
            established: AtomicU32::new(0),
            calm: CancellationToken::new(),
            budget_peer: crate::proxy::resets::Peer {
                identity: Arc::from("sleep"),
                source: "127.0.0.1".parse().unwrap(),
            },
            banned: CancellationToken::new(),
            clean_streams: AtomicU32::new(0),
            streams_end: CancellationToken::new(),
            revoked: CancellationToken::new(),
            gate: Arc::default(),
        });
        let size = std::mem::size_of_val(&stream_task(ctx, Box::pin(async { Err(Ended::Failed) })));
        println!("task_sizes: inbound stream task future {size} bytes");
        // 1,344 bytes with two async copy loops and four waits; 664-672 with the poll-based relay and one wait for
        // the connection's end; 1,160 (debug) since the stream can stop for a hand-over of its connection (the
        // gate's wait and the phase's own select: a cost to win back with one wake-up list per connection).
        assert!(size <= 1_200, "the inbound stream task's future is {size} bytes");
    }

    /// echo (127.0.2.10) behind service echo (80 → 8080; hostname echo.default.svc.cluster.local, VIP 10.96.0.10);
    /// `wp` (127.0.3.10), the waypoint of service `reviews` (VIP 10.96.1.1) and of workload `db` (127.0.4.10),
    /// speaking PROXY on 15088; a service `named` whose target port is only in the endpoint's own map.
    fn world() -> State {
        let mut st = State::default();
        let delta = json!({
            "workloads": [
                {"uid": "echo", "name": "echo", "namespace": "default", "workloadIps": ["127.0.2.10"], "protocol": "HBONE",
                 "services": {"default/echo.default.svc.cluster.local": {"80": 8080},
                              "default/named.default.svc.cluster.local": {"81": 9091}}},
                {"uid": "wp", "name": "waypoint", "namespace": "default", "workloadIps": ["127.0.3.10"], "protocol": "HBONE",
                 "applicationTunnel": {"protocol": "PROXY", "port": 15088},
                 "services": {"default/waypoint.default.svc.cluster.local": {"15008": 15008}}},
                {"uid": "wp-plain", "name": "waypoint-plain", "namespace": "default", "workloadIps": ["127.0.3.11"],
                 "protocol": "HBONE"},
                {"uid": "db", "name": "db", "namespace": "default", "workloadIps": ["127.0.4.10"], "protocol": "HBONE",
                 "waypoint": {"destination": "/127.0.3.11", "hboneMtlsPort": 15008}},
            ],
            "services": [
                {"name": "echo", "namespace": "default", "hostname": "echo.default.svc.cluster.local",
                 "vips": ["/10.96.0.10"], "ports": {"80": 8080}},
                {"name": "named", "namespace": "default", "hostname": "named.default.svc.cluster.local",
                 "vips": ["/10.96.0.11"], "ports": {"81": 0}},
                {"name": "reviews", "namespace": "default", "hostname": "reviews.default.svc.cluster.local",
                 "vips": ["/10.96.1.1"], "ports": {"9080": 9080},
                 "waypoint": {"destination": "default/waypoint.default.svc.cluster.local", "hboneMtlsPort": 15008}},
                {"name": "waypoint", "namespace": "default", "hostname": "waypoint.default.svc.cluster.local",
                 "vips": ["/10.96.5.1"], "ports": {"15008": 15008}},
            ],
        });
        st.apply(serde_json::from_value::<StateDelta>(delta).unwrap()).unwrap();
        st
    }

    /// (method, authority, local workload, its IP) → upstream, or the status of the refusal. Each row names the rule.
    #[test]
    fn connect_resolution_table() {
        let st = world();
        let echo = st.workload("echo").cloned();
        let wp = st.workload("wp").cloned();
        let plain = st.workload("wp-plain").cloned();
        let illegal = [15001, 15006, 15008, 15080];
        type Row<'a> = (&'a str, Method, &'a str, Option<&'a Workload>, &'a str, Result<&'a str, StatusCode>);
        let rows: Vec<Row> = vec![
            (
                "ip authority: the port",
                Method::CONNECT,
                "127.0.2.10:8080",
                echo.as_deref(),
                "127.0.2.10",
                Ok("127.0.2.10:8080"),
            ),
            (
                "port 0 is no port",
                Method::CONNECT,
                "127.0.2.10:0",
                echo.as_deref(),
                "127.0.2.10",
                Err(StatusCode::BAD_REQUEST),
            ),
            (
                "a hostname with port 0 neither",
                Method::CONNECT,
                "echo.default.svc.cluster.local:0",
                echo.as_deref(),
                "127.0.2.10",
                Err(StatusCode::BAD_REQUEST),
            ),
            (
                "GET is refused",
                Method::GET,
                "127.0.2.10:8080",
                echo.as_deref(),
                "127.0.2.10",
                Err(StatusCode::BAD_REQUEST),
            ),
            (
                "POST is refused",
                Method::POST,
                "127.0.2.10:8080",
                echo.as_deref(),
                "127.0.2.10",
                Err(StatusCode::BAD_REQUEST),
            ),
            (
                "another IP: ip mismatch",
                Method::CONNECT,
                "127.0.0.1:8080",
                echo.as_deref(),
                "127.0.2.10",
                Err(StatusCode::BAD_REQUEST),
            ),
            (
                "a neighbour's IP",
                Method::CONNECT,
                "127.0.2.11:8080",
                echo.as_deref(),
                "127.0.2.10",
                Err(StatusCode::BAD_REQUEST),
            ),
            (
                "garbage authority",
                Method::CONNECT,
                "echo.default",
                echo.as_deref(),
                "127.0.2.10",
                Err(StatusCode::BAD_REQUEST),
            ),
            (
                "our port 15008",
                Method::CONNECT,
                "127.0.2.10:15008",
                echo.as_deref(),
                "127.0.2.10",
                Err(StatusCode::SERVICE_UNAVAILABLE),
            ),
            (
                "our port 15001",
                Method::CONNECT,
                "127.0.2.10:15001",
                echo.as_deref(),
                "127.0.2.10",
                Err(StatusCode::SERVICE_UNAVAILABLE),
            ),
            (
                "unknown local workload",
                Method::CONNECT,
                "127.0.2.10:8080",
                None,
                "127.0.2.10",
                Err(StatusCode::SERVICE_UNAVAILABLE),
            ),
            (
                "hostname: the service's target port",
                Method::CONNECT,
                "echo.default.svc.cluster.local:80",
                echo.as_deref(),
                "127.0.2.10",
                Ok("127.0.2.10:8080"),
            ),
            (
                "hostname: the endpoint's own port map",
                Method::CONNECT,
                "named.default.svc.cluster.local:81",
                echo.as_deref(),
                "127.0.2.10",
                Ok("127.0.2.10:9091"),
            ),
            (
                "hostname: no such service",
                Method::CONNECT,
                "nope.default.svc.cluster.local:80",
                echo.as_deref(),
                "127.0.2.10",
                Err(StatusCode::SERVICE_UNAVAILABLE),
            ),
            (
                "hostname: a port the service lacks",
                Method::CONNECT,
                "echo.default.svc.cluster.local:81",
                echo.as_deref(),
                "127.0.2.10",
                Err(StatusCode::SERVICE_UNAVAILABLE),
            ),
            (
                "sandwich: a VIP whose waypoint (by hostname) is this workload",
                Method::CONNECT,
                "10.96.1.1:9080",
                wp.as_deref(),
                "127.0.3.10",
                Ok("127.0.3.10:15088"),
            ),
            (
                "sandwich: a workload whose waypoint (by IP) is this workload, no tunnel",
                Method::CONNECT,
                "127.0.4.10:5432",
                plain.as_deref(),
                "127.0.3.11",
                Ok("127.0.3.11:5432"),
            ),
            (
                "not its waypoint: ip mismatch",
                Method::CONNECT,
                "10.96.0.10:80",
                plain.as_deref(),
                "127.0.3.11",
                Err(StatusCode::BAD_REQUEST),
            ),
        ];
        for (rule, m, auth, local, dst_ip, want) in rows {
            let r = Request::builder().method(m).uri(auth).body(()).unwrap();
            let got = resolve_connect(&r, local, dst_ip.parse().unwrap(), &st, &illegal)
                .map(|t| t.upstream)
                .map_err(|e| e.status());
            let want = want.map(|s| s.parse::<SocketAddr>().unwrap());
            assert_eq!(got, want, "{rule}");
        }
    }

    #[test]
    fn application_tunnel_names_the_authority_or_a_vip_of_the_hostname() {
        let st = world();
        let wp = st.workload("wp").cloned();
        let r = |auth: &str| Request::builder().method(Method::CONNECT).uri(auth).body(()).unwrap();
        let ip = "127.0.3.10".parse().unwrap();
        let t = resolve_connect(&r("10.96.1.1:9080"), wp.as_deref(), ip, &st, &[]).unwrap();
        assert_eq!(t.tunnel, Some((AppTunnelProtocol::Proxy, "10.96.1.1:9080".parse().unwrap())));
        let t = resolve_connect(&r("echo.default.svc.cluster.local:80"), wp.as_deref(), ip, &st, &[]).unwrap();
        assert_eq!(
            t.tunnel,
            Some((AppTunnelProtocol::Proxy, "10.96.0.10:80".parse().unwrap())),
            "a VIP of the service"
        );
        assert_eq!(t.upstream, "127.0.3.10:15088".parse().unwrap(), "the tunnel's port overrides");
        assert_eq!(t.service.unwrap().name, "echo");
    }
}
