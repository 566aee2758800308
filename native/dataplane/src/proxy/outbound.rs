//! Outbound: where a local workload's connection goes, and getting it there.
//!
//! The routing decision (`build_request`) is a pure function of the state, ztunnel's cases in ztunnel's order:
//! service VIP (its waypoint first; else a load-balanced endpoint), else workload by IP (its waypoint unless the
//! client is that waypoint), else plain TCP passthrough. An HBONE workload is reached through its node's 15008 with
//! `:authority <ip>:<port>`; a waypoint with `:authority` = the original destination. I/O happens only after the
//! decision; a case that cannot be routed is an error with a stable reason, never a bypass.
//!
//! Invariant: the protocol comes only from the destination's state. If an HBONE destination cannot be reached
//! over mTLS (no certificate, handshake failure, wrong peer identity), the connection fails; nothing retries in
//! plaintext.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::{RecvStream, SendStream};

use super::h2::client::{connect_request, new_traceparent, ConnectHeaders};
use super::pool::{PoolError, PoolKey, StreamLease};
use super::{LocalRef, ProxyInputs};
use crate::config::Config;
use crate::identity::Identity;
use crate::state::{
    GatewayAddress, GatewayDestination, HealthPolicy, IpFamilies, LbMode, LbScope, Protocol, Service, State, Workload,
    WorkloadStatus,
};
use crate::tls::ExpectedIdentities;

/// Which path a request takes (ztunnel's request types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// To the destination workload itself (HBONE to its node, or plain TCP).
    Direct,
    /// To the destination's waypoint over HBONE, `:authority` = the original destination.
    Waypoint,
    /// Unknown destination (or a PASSTHROUGH service): plain TCP to the original destination.
    Passthrough,
    /// To a service endpoint (or waypoint) on another network: HBONE inside HBONE through its network gateway.
    DoubleHbone,
}

/// The inner HBONE of a double-HBONE request: verified end to end with the final destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inner {
    /// Identities the final destination may present (its workloads' and its service's SANs).
    pub expected: ExpectedIdentities,
    /// Sent as `x-forwarded-network`: the client's network.
    pub network: String,
}

/// Where and how to send one outbound connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub protocol: Protocol,
    pub path: Path,
    /// The address dialed: `<ip>:15008` for HBONE, the target itself for TCP.
    pub upstream: SocketAddr,
    /// The final target (`:authority` for HBONE): the endpoint, or the original destination through a waypoint.
    pub target: SocketAddr,
    /// The workload at the other end of the next hop (the waypoint, when going through one).
    pub destination: Option<Arc<Workload>>,
    /// The service the client addressed (never the waypoint's).
    pub service: Option<Arc<Service>>,
    /// Identities the HBONE server may present.
    pub expected: ExpectedIdentities,
    /// The CONNECT `:authority` when it is not `target` (double HBONE: `<service hostname>:<port>`).
    pub authority: Option<String>,
    /// Double HBONE: the end-to-end connection inside the tunnel to the gateway.
    pub inner: Option<Inner>,
    /// A workload known only by hostname: resolved through DNS when connecting, which then sets `upstream` and
    /// `target` (until then they hold the unspecified address and the target port).
    pub resolve: Option<String>,
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
    #[error("no valid routing destination: workload {0} is on network {1:?} and has no network gateway (or was not addressed through a service)")]
    RemoteNetwork(String, String),
    #[error("network gateway {0} not found")]
    UnknownGateway(String),
    #[error("waypoint {0} not found")]
    UnknownWaypoint(String),
    #[error("workload {0} is addressed by hostname only (DNS resolution of workload hostnames is not supported yet)")]
    HostnameOnly(String),
}

impl RouteError {
    /// A short, stable reason (log field and metric label).
    pub fn reason(&self) -> &'static str {
        match self {
            RouteError::SelfCall(_) => "self_call",
            RouteError::NoHealthyUpstream(..) => "no_healthy_upstream",
            RouteError::NoPort(..) => "no_port",
            RouteError::NoAddress(_) => "no_address",
            RouteError::RemoteNetwork(..) => "remote_network",
            RouteError::UnknownGateway(_) => "unknown_gateway",
            RouteError::UnknownWaypoint(_) => "unknown_waypoint",
            RouteError::HostnameOnly(_) => "hostname_only",
        }
    }
}

/// How endpoints of a service are chosen: for a client's own destination, or for a waypoint (which must have the
/// port, or an application tunnel that carries it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resolution {
    Standard,
    Waypoint,
}

/// A chosen next hop before its IP is picked.
struct Hop {
    workload: Arc<Workload>,
    port: u16,
    service: Option<Arc<Service>>,
}

impl Hop {
    /// The identities the hop may present: its own and its service's SANs.
    fn expected(&self) -> ExpectedIdentities {
        let mut ids = vec![self.workload.identity()];
        if let Some(s) = &self.service {
            ids.extend(s.subject_alt_names.iter().cloned());
        }
        ExpectedIdentities::new(ids)
    }
}

/// How each load-balanced choice of one request is made: the weighted pick, what a retry avoids, and how many
/// endpoints the last choice had (the next hop's alternatives).
pub struct Chooser<'a> {
    /// `pick(total)`: a number in `0..total` (the weighted endpoint choice); tests pass a fixed one.
    pub pick: &'a mut dyn FnMut(u64) -> u64,
    /// Next hops this connection already failed to reach: a retry chooses among the others.
    pub tried: &'a [crate::state::intern::Str],
    /// Endpoints ejected by outlier detection are skipped (within its share).
    pub outliers: Option<&'a super::outlier::Outliers>,
    /// Set by each load-balanced choice: how many endpoints it chose among (the last one is the next hop's).
    pub candidates: usize,
}

impl<'a> Chooser<'a> {
    pub fn new(pick: &'a mut dyn FnMut(u64) -> u64) -> Chooser<'a> {
        Chooser { pick, tried: &[], outliers: None, candidates: 0 }
    }
}

/// Decide where a connection from `src` (at `src_ip`) to `dst` goes, as ztunnel's `build_request` does (one
/// function, its cases in order; README "Routing"). `pick(total)` returns a number in `0..total` (the weighted
/// endpoint choice); tests pass a fixed one.
pub fn build_request(
    state: &State,
    cfg: &Config,
    src: &Workload,
    src_ip: IpAddr,
    dst: SocketAddr,
    pick: &mut dyn FnMut(u64) -> u64,
) -> Result<Request, RouteError> {
    choose_request(state, cfg, src, src_ip, dst, &mut Chooser::new(pick))
}

/// `build_request` with the choices' context: a retry's tried endpoints and the outlier detector.
pub fn choose_request(
    state: &State,
    cfg: &Config,
    src: &Workload,
    src_ip: IpAddr,
    dst: SocketAddr,
    pick: &mut Chooser<'_>,
) -> Result<Request, RouteError> {
    self_call(cfg, src, None, dst)?;
    // 1. A service VIP (or CIDR VIP): its waypoint first (weighted waypoints by weight).
    let service = state.service_by_vip(&src.network, dst.ip(), &src.namespace).cloned();
    if let Some(gw) = service.as_ref().and_then(|s| service_waypoint(s, &mut *pick.pick)) {
        return to_waypoint(state, src, gw, dst, service.clone(), pick);
    }
    // 2. The upstream: a load-balanced endpoint of the service, else the workload with that IP.
    let upstream = match &service {
        Some(svc) if svc.load_balancer.as_ref().is_some_and(|lb| lb.mode == LbMode::Passthrough) => None,
        Some(svc) => from_service(state, src, svc, dst.port(), Resolution::Standard, pick)?,
        None => state.workload_by_addr(&src.network, dst.ip()).map(|w| Hop {
            workload: w.clone(),
            port: dst.port(),
            service: None,
        }),
    };
    // 3. None: a service must have had one (unless it is PASSTHROUGH); an unknown destination is passed through.
    let Some(us) = upstream else {
        if let Some(svc) = &service {
            if !svc.load_balancer.as_ref().is_some_and(|lb| lb.mode == LbMode::Passthrough) {
                return Err(RouteError::NoHealthyUpstream(svc.key().to_string(), dst.port()));
            }
        }
        return Ok(passthrough(dst));
    };
    // 4. Another network: through the endpoint's network gateway (double HBONE), service-addressed only.
    if us.workload.network != src.network {
        return match &service {
            Some(svc) => through_gateway(state, src, &us, svc, dst, pick),
            None => Err(RouteError::RemoteNetwork(us.workload.uid.to_string(), us.workload.network.to_string())),
        };
    }
    // 5. A workload addressed directly goes through its waypoint, unless the client is that waypoint.
    if service.is_none() && !from_waypoint(state, &us.workload, src, src_ip) {
        if let Some(gw) = us.workload.waypoint.as_ref() {
            return to_waypoint(state, src, gw, dst, None, pick);
        }
    }
    // 6. Direct.
    let families = service.as_ref().and_then(|s| s.ip_families);
    let ip = match pick_ip(&us.workload, dst, families) {
        Ok(ip) => ip,
        // Known only by hostname: the address comes from DNS when connecting (`resolve_upstream`).
        Err(RouteError::HostnameOnly(_)) => {
            let unresolved = SocketAddr::new(IpAddr::from([0, 0, 0, 0]), us.port);
            let expected = us.expected();
            let hbone = us.workload.protocol == Protocol::Hbone;
            return Ok(Request {
                protocol: us.workload.protocol,
                path: Path::Direct,
                upstream: unresolved,
                target: unresolved,
                expected: if hbone { expected } else { ExpectedIdentities::default() },
                resolve: Some(us.workload.hostname.to_string()),
                destination: Some(us.workload),
                service: us.service,
                authority: None,
                inner: None,
            });
        }
        Err(e) => return Err(e),
    };
    let target = SocketAddr::new(ip, us.port);
    // The own-port check again, after the port mapping: a service may map to one of our ports.
    self_call(cfg, src, Some(&us.workload), target)?;
    let expected = us.expected();
    Ok(match us.workload.protocol {
        Protocol::Hbone => Request {
            protocol: Protocol::Hbone,
            path: Path::Direct,
            upstream: SocketAddr::new(ip, cfg.hbone_port),
            target,
            destination: Some(us.workload),
            service: us.service,
            expected,
            authority: None,
            inner: None,
            resolve: None,
        },
        Protocol::Tcp => Request {
            protocol: Protocol::Tcp,
            path: Path::Direct,
            upstream: target,
            target,
            destination: Some(us.workload),
            service: us.service,
            expected: ExpectedIdentities::default(),
            authority: None,
            inner: None,
            resolve: None,
        },
    })
}

/// The waypoint of a service: one of its weighted waypoints, picked by weight; when they are all zero (or there
/// are none), its single waypoint.
fn service_waypoint<'a>(s: &'a Service, pick: &mut dyn FnMut(u64) -> u64) -> Option<&'a GatewayAddress> {
    let total: u64 = s.weighted_waypoints.iter().map(|(_, w)| u64::from(*w)).sum();
    if total == 0 {
        return s.waypoint.as_deref();
    }
    let mut n = pick(total) % total;
    s.weighted_waypoints.iter().find_map(|(gw, w)| {
        let w = u64::from(*w);
        if n < w {
            Some(gw)
        } else {
            n -= w;
            None
        }
    })
}

/// Our own listeners are never a destination: on loopback, on the source's own IPs, or on a workload of this
/// node (whose listeners we bind).
fn self_call(cfg: &Config, src: &Workload, dest: Option<&Workload>, to: SocketAddr) -> Result<(), RouteError> {
    let ours = to.ip().is_loopback()
        || src.ips.contains(&to.ip())
        || dest.is_some_and(|w| !w.node.is_empty() && *w.node == *cfg.node_name);
    if ours && cfg.illegal_ports().contains(&to.port()) {
        return Err(RouteError::SelfCall(to.port()));
    }
    Ok(())
}

/// HBONE to the waypoint `gw`, `:authority` = the original destination; `service` is the one addressed, if any.
fn to_waypoint(
    state: &State,
    src: &Workload,
    gw: &GatewayAddress,
    dst: SocketAddr,
    service: Option<Arc<Service>>,
    pick: &mut Chooser<'_>,
) -> Result<Request, RouteError> {
    let (wp, ip) = resolve_gateway(state, src, gw, dst, Resolution::Waypoint, pick).map_err(|e| {
        if let RouteError::UnknownGateway(g) = e {
            RouteError::UnknownWaypoint(g)
        } else {
            e
        }
    })?;
    if wp.workload.network != src.network {
        // A waypoint on another network is reached like any remote hop: through its gateway, by service.
        return match &service {
            Some(svc) => through_gateway(state, src, &wp, svc, dst, pick),
            None => Err(RouteError::RemoteNetwork(wp.workload.uid.to_string(), wp.workload.network.to_string())),
        };
    }
    Ok(Request {
        protocol: Protocol::Hbone,
        path: Path::Waypoint,
        upstream: SocketAddr::new(ip, wp.port),
        target: dst,
        expected: wp.expected(),
        destination: Some(wp.workload),
        service,
        authority: None,
        inner: None,
        resolve: None,
    })
}

/// Double HBONE to `hop` (on another network) through its network gateway: the outer CONNECT to the gateway, the
/// inner one end to end; both with `:authority <service hostname>:<port>`, so the gateway routes without
/// decrypting. The gateway's own identity is verified on the outer TLS, the final destination's on the inner.
fn through_gateway(
    state: &State,
    src: &Workload,
    hop: &Hop,
    svc: &Arc<Service>,
    dst: SocketAddr,
    pick: &mut Chooser<'_>,
) -> Result<Request, RouteError> {
    let gw = hop
        .workload
        .network_gateway
        .as_ref()
        .ok_or_else(|| RouteError::RemoteNetwork(hop.workload.uid.to_string(), hop.workload.network.to_string()))?;
    let (gateway, ip) = resolve_gateway(state, src, gw, dst, Resolution::Standard, pick)?;
    // The final destination is whichever endpoint the gateway picks: any of the service's endpoints on that network.
    let mut finals: Vec<Identity> = svc.subject_alt_names.clone();
    if let Some(s) = &hop.service {
        finals.extend(s.subject_alt_names.iter().cloned());
        finals.extend(
            state.endpoints(&s.key()).filter(|(w, _)| w.network == hop.workload.network).map(|(w, _)| w.identity()),
        );
    }
    finals.push(hop.workload.identity());
    finals.sort();
    finals.dedup();
    Ok(Request {
        protocol: Protocol::Hbone,
        path: Path::DoubleHbone,
        upstream: SocketAddr::new(ip, gateway.port),
        target: dst,
        expected: gateway.expected(),
        destination: Some(gateway.workload),
        service: Some(svc.clone()),
        authority: Some(format!("{}:{}", svc.hostname, dst.port())),
        inner: Some(Inner { expected: ExpectedIdentities::new(finals), network: src.network.to_string() }),
        resolve: None,
    })
}

/// A waypoint's or network gateway's workload (load-balanced when it is a service), the port to dial, and the IP.
/// By address: the IP family of the address; by hostname: the caller's.
fn resolve_gateway(
    state: &State,
    src: &Workload,
    gw: &GatewayAddress,
    dst: SocketAddr,
    mode: Resolution,
    pick: &mut Chooser<'_>,
) -> Result<(Hop, IpAddr), RouteError> {
    let unknown = || RouteError::UnknownGateway(describe(gw));
    // The gateway is the next hop: one candidate unless its service load-balances it below.
    pick.candidates = 1;
    let (us, family_of) = match &gw.destination {
        GatewayDestination::Address((net, ip)) => {
            let addr = SocketAddr::new(*ip, gw.hbone_mtls_port);
            let us = match state.service_by_vip(net, *ip, &src.namespace) {
                Some(svc) => from_service(state, src, svc, gw.hbone_mtls_port, mode, pick)?,
                None => state.workload_by_addr(net, *ip).map(|w| Hop {
                    workload: w.clone(),
                    port: gw.hbone_mtls_port,
                    service: None,
                }),
            };
            (us, addr)
        }
        GatewayDestination::Hostname(key) => {
            let us = match state.service(key) {
                Some(svc) => from_service(state, src, svc, gw.hbone_mtls_port, mode, pick)?,
                None => state.workload_by_hostname(&key.namespace, &key.hostname).map(|w| Hop {
                    workload: w.clone(),
                    port: gw.hbone_mtls_port,
                    service: None,
                }),
            };
            (us, dst)
        }
    };
    let us = us.ok_or_else(unknown)?;
    let ip = pick_ip(&us.workload, family_of, us.service.as_ref().and_then(|s| s.ip_families))?;
    Ok((us, ip))
}

fn describe(gw: &GatewayAddress) -> String {
    match &gw.destination {
        GatewayDestination::Address((net, ip)) => format!("{net}/{ip}"),
        GatewayDestination::Hostname(key) => key.to_string(),
    }
}

/// Whether the client is `w`'s own waypoint (its identity, from one of its IPs): then it is not sent back there.
fn from_waypoint(state: &State, w: &Workload, src: &Workload, src_ip: IpAddr) -> bool {
    let Some(gw) = &w.waypoint else { return false };
    let id = src.identity();
    let is_it = |x: &Workload| x.identity() == id && x.ips.contains(&src_ip);
    let service_has_it = |s: &Service| state.endpoints(&s.key()).any(|(x, _)| is_it(x));
    match &gw.destination {
        GatewayDestination::Address((net, ip)) => match state.workload_by_addr(net, *ip) {
            Some(x) => is_it(x),
            None => state.service_by_vip(net, *ip, &src.namespace).is_some_and(|s| service_has_it(s)),
        },
        GatewayDestination::Hostname(key) => match state.service(key) {
            Some(s) => service_has_it(s),
            None => state.workload_by_hostname(&key.namespace, &key.hostname).is_some_and(|x| is_it(x)),
        },
    }
}

/// An endpoint of `svc` for `svc_port` and the port to reach it on; `Ok(None)` when none qualifies.
fn from_service(
    state: &State,
    src: &Workload,
    svc: &Arc<Service>,
    svc_port: u16,
    mode: Resolution,
    pick: &mut Chooser<'_>,
) -> Result<Option<Hop>, RouteError> {
    let svc_target = svc.ports.get(&svc_port).copied();
    if mode == Resolution::Standard && svc_target.is_none() {
        return Err(RouteError::NoPort(svc.key().to_string(), svc_port));
    }
    let Some((w, ep_ports)) = load_balance(state, src, svc, svc_port, svc_target, mode, pick) else {
        return Ok(None);
    };
    // The endpoint's own port map, else the service's target port, else (application tunnel) the service port.
    let port = match (ep_ports.get(&svc_port).copied().filter(|p| *p != 0), svc_target.filter(|p| *p != 0)) {
        (Some(p), _) | (None, Some(p)) => p,
        (None, None) if w.application_tunnel.as_ref().is_some_and(|t| t.port.is_some()) => svc_port,
        (None, None) => return Ok(None),
    };
    Ok(Some(Hop { workload: w.clone(), port, service: Some(svc.clone()) }))
}

/// ztunnel's endpoint choice: endpoints that can be reached and have the port; healthy ones unless the service
/// allows all; for STRICT only those matching every routing preference, for FAILOVER those matching the most
/// consecutive preferences; then a random pick weighted by capacity.
fn load_balance<'a>(
    state: &'a State,
    src: &Workload,
    svc: &Service,
    svc_port: u16,
    svc_target: Option<u16>,
    mode: Resolution,
    pick: &mut Chooser<'_>,
) -> Option<(&'a Arc<Workload>, &'a crate::state::PortMap)> {
    let lb = svc.load_balancer.as_ref();
    let allow_unhealthy = lb.is_some_and(|lb| lb.health_policy == HealthPolicy::AllowAll);
    let endpoints = state.endpoints(&svc.key()).filter(|(w, ports)| {
        let has_address = !w.ips.is_empty() || !w.hostname.is_empty();
        // An address-less endpoint is reachable only through its network's gateway, from another network.
        if !has_address && (w.network == src.network || w.network_gateway.is_none()) {
            return false;
        }
        if w.status != WorkloadStatus::Healthy && !allow_unhealthy {
            return false;
        }
        match mode {
            Resolution::Standard => svc_target.unwrap_or(0) != 0 || ports.contains_key(&svc_port),
            Resolution::Waypoint => svc_target.is_some() || w.application_tunnel.is_some(),
        }
    });
    // A retry leaves out what it tried; outlier detection, the ejected (within its share). Both before the ranking,
    // as unhealthy endpoints are: Failover then falls back to the next best rank, Strict never leaves its scope.
    let endpoints: Vec<_> = endpoints.filter(|(w, _)| !pick.tried.iter().any(|t| *t == w.uid)).collect();
    let endpoints = match pick.outliers {
        Some(o) => o.skip_ejected(endpoints, |(w, _)| &w.uid),
        None => endpoints,
    };
    let options: Vec<_> = match lb {
        Some(lb) if matches!(lb.mode, LbMode::Strict | LbMode::Failover) => {
            let ranked: Vec<_> = endpoints
                .into_iter()
                .filter_map(|(w, ports)| {
                    let rank = lb.routing_preferences.iter().take_while(|scope| same_scope(scope, src, w)).count();
                    (lb.mode != LbMode::Strict || rank == lb.routing_preferences.len()).then_some((rank, w, ports))
                })
                .collect();
            let best = ranked.iter().map(|(rank, ..)| *rank).max()?;
            ranked.into_iter().filter(|(rank, ..)| *rank == best).map(|(_, w, p)| (w, p)).collect()
        }
        _ => endpoints,
    };
    let total: u64 = options.iter().map(|(w, _)| u64::from(w.capacity)).sum();
    if total == 0 {
        return None;
    }
    pick.candidates = options.iter().filter(|(w, _)| w.capacity > 0).count();
    let mut n = (pick.pick)(total) % total;
    options.into_iter().find(|(w, _)| {
        let c = u64::from(w.capacity);
        if n < c {
            true
        } else {
            n -= c;
            false
        }
    })
}

fn same_scope(scope: &LbScope, a: &Workload, b: &Workload) -> bool {
    match scope {
        LbScope::Region => a.locality.region == b.locality.region,
        LbScope::Zone => a.locality.zone == b.locality.zone,
        LbScope::Subzone => a.locality.subzone == b.locality.subzone,
        LbScope::Node => a.node == b.node,
        LbScope::Cluster => a.cluster_id == b.cluster_id,
        LbScope::Network => a.network == b.network,
    }
}

/// The IP to dial on `w`: the one the client dialed if it is `w`'s; else one the service's IP families allow,
/// of the client's family if possible.
fn pick_ip(w: &Workload, dialed: SocketAddr, families: Option<IpFamilies>) -> Result<IpAddr, RouteError> {
    if w.ips.contains(&dialed.ip()) {
        return Ok(dialed.ip());
    }
    let allowed: Vec<IpAddr> = w.ips.iter().copied().filter(|ip| families.is_none_or(|f| f.accepts(*ip))).collect();
    if let Some(ip) = allowed.iter().find(|ip| ip.is_ipv4() == dialed.is_ipv4()).or_else(|| allowed.first()) {
        return Ok(*ip);
    }
    if !w.hostname.is_empty() {
        return Err(RouteError::HostnameOnly(w.uid.to_string()));
    }
    Err(RouteError::NoAddress(w.uid.to_string()))
}

fn passthrough(dst: SocketAddr) -> Request {
    Request {
        protocol: Protocol::Tcp,
        path: Path::Passthrough,
        authority: None,
        inner: None,
        resolve: None,
        upstream: dst,
        target: dst,
        destination: None,
        service: None,
        expected: ExpectedIdentities::default(),
    }
}

/// `forwarded: for="<client>"[;host=<service hostname>]` (IPv6 clients as `[ip]:port`).
pub fn forwarded(client: SocketAddr, service: Option<&Service>) -> String {
    match service {
        Some(s) => format!("for=\"{client}\";host={}", s.hostname),
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
    #[error("CONNECT authority {0:?}: {1}")]
    Authority(String, String),
    #[error("resolving workload hostname {0}: {1}")]
    Dns(String, String),
    #[error("{0}")]
    Inner(#[from] super::double_hbone::InnerError),
}

impl OutboundError {
    /// The chosen next hop failed before the tunnel as a dead one fails: another may serve. Never a policy's answer
    /// (401), nor what routing or this node got wrong.
    pub fn retryable(&self) -> bool {
        use super::double_hbone::InnerError as I;
        match self {
            OutboundError::Pool(p) => !matches!(p, PoolError::NoCertificate(_) | PoolError::Config(_)),
            OutboundError::Connect(..) | OutboundError::Response(..) => true,
            OutboundError::Status(_, s) => matches!(s, 502..=504),
            OutboundError::Inner(i) => match i {
                I::Tls(_) | I::H2(_) | I::Request(_) => true,
                I::Status(s) => matches!(s, 502..=504),
                I::Config(_) => false,
            },
            _ => false,
        }
    }

    /// Whether outlier detection holds this against the next hop: its own connect failed, or, reached directly, it
    /// answered that its application is not there. A waypoint's or a gateway's 5xx, or what happened behind a
    /// gateway, is about the hop after it.
    pub fn counts_against(&self, path: Path) -> bool {
        match self {
            OutboundError::Inner(_) => false,
            OutboundError::Status(..) => path == Path::Direct && self.retryable(),
            e => e.retryable(),
        }
    }

    pub fn response_flag(&self) -> &'static str {
        match self {
            OutboundError::Pool(p) => p.response_flag(),
            OutboundError::Status(_, 401) | OutboundError::Inner(super::double_hbone::InnerError::Status(401)) => {
                "DENY"
            }
            _ => "CONNECT",
        }
    }
}

/// An established upstream.
pub enum Upstream {
    Tcp(tokio::net::TcpStream),
    /// The stream's lease on its pooled connection is held until the copy ends; for double HBONE (`_inner`), the
    /// streams are the inner ones and the lease is the outer stream's.
    Hbone {
        send: SendStream<Bytes>,
        recv: RecvStream,
        _lease: StreamLease,
        _inner: Option<super::double_hbone::InnerConnection>,
    },
}

/// What an outbound connection knows once routed.
pub struct Routed {
    pub request: Request,
    pub source: Arc<Workload>,
    pub source_identity: Identity,
    /// Which attempt this is (1: the first; a retry chose another next hop).
    pub attempts: u32,
}

/// Route and connect. On success the upstream is ready for bytes (for HBONE: the peer answered 200).
///
/// A service-addressed connection whose load-balanced next hop (an endpoint, a waypoint or a network gateway) fails
/// before the tunnel is established, as a dead endpoint fails (refused, reset, timed out, 502/503/504; never a 401,
/// which is an answer), is tried again on another of its candidates by the same rules, up to
/// `resilience.connectAttempts` in all within the connect timeout (each attempt its share of what is left). The
/// client's bytes wait in its socket meanwhile: nothing has been forwarded. Outlier detection counts each next hop's
/// failures and successes (`outlier.rs`). With one attempt and no ejection this is ztunnel's connect.
pub async fn connect(
    pi: &ProxyInputs,
    src: &LocalRef,
    client: SocketAddr,
    dst: SocketAddr,
) -> Result<(Routed, Upstream), (Option<Routed>, OutboundError)> {
    let resilience = &pi.cfg.resilience;
    let outliers = (resilience.consecutive_failures > 0).then_some(&*pi.outliers);
    let mut started = std::time::Instant::now();
    let timeout = pi.cfg.connect_timeout();
    let mut tried: Vec<crate::state::intern::Str> = Vec::new();
    let mut waited = false;
    loop {
        let (mut routed, src_ip, hop, alternatives) = match route(pi, src, client, dst, &tried, outliers) {
            Ok(r) => r,
            Err(OutboundError::UnknownSource(_)) if !waited => {
                waited = true;
                wait_for_source(pi, src).await;
                // The connect timeout starts once the connection can be routed, as ztunnel's does.
                started = std::time::Instant::now();
                continue;
            }
            Err(e) => return Err((None, e)),
        };
        routed.attempts = tried.len() as u32 + 1;
        let attempts_left = (resilience.connect_attempts as usize).saturating_sub(tried.len());
        let may_retry = hop.is_some() && attempts_left > 1 && alternatives > 1;
        let outcome = if may_retry {
            // Each attempt gets its share of the time left, so a blackholed endpoint leaves room for another.
            let share = timeout.saturating_sub(started.elapsed()) / attempts_left.min(alternatives) as u32;
            match tokio::time::timeout(share, establish(pi, &mut routed, (client, dst), src_ip)).await {
                Ok(r) => r,
                Err(_) => Err(timed_out(&routed.request)),
            }
        } else {
            establish(pi, &mut routed, (client, dst), src_ip).await
        };
        let err = match outcome {
            Ok(upstream) => {
                if let Some(uid) = &hop {
                    pi.outliers.success(uid);
                }
                return Ok((routed, upstream));
            }
            Err(e) => e,
        };
        if let (Some(uid), Some(o)) = (&hop, outliers) {
            if err.counts_against(routed.request.path) && o.failure(&Arc::from(&**uid)) {
                let f = crate::fields! {"workload" => uid.to_string(), "error" => err.to_string()};
                pi.events.log(crate::events::Level::Warn, "endpoint ejected after consecutive connect failures", f);
            }
        }
        match hop {
            Some(uid) if may_retry && err.retryable() && started.elapsed() < timeout => {
                pi.outliers.retries_total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let f = crate::fields! {"dst.addr" => dst.to_string(), "workload" => uid.to_string(),
                "attempt" => routed.attempts, "error" => err.to_string()};
                pi.events.log(crate::events::Level::Debug, "connect failed; trying another endpoint", f);
                tried.push(uid);
            }
            _ => return Err((Some(routed), err)),
        }
    }
}

/// How long an outbound connection waits for its source pod's workload (ztunnel's `get_workload`: 5 s).
pub const SOURCE_WAIT: Duration = Duration::from_secs(5);

/// Waits until `src` is in the state, or SOURCE_WAIT has passed. istio-cni hands a pod to the node proxy as the pod
/// starts, and istiod pushes its workload when the API server has told it of the pod: the pod's first connections
/// can come before its workload. ztunnel holds them until it arrives (`wait_for_workload`); refusing them would fail
/// a new pod's first requests. Woken by each applied batch, never polled; the connection's bytes wait in its socket.
async fn wait_for_source(pi: &ProxyInputs, src: &LocalRef) {
    let deadline = tokio::time::Instant::now() + SOURCE_WAIT;
    loop {
        // Registered before the state is read, so a batch applied in between is not missed.
        let changed = pi.state_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if src.resolve(&pi.state.read()).is_some() || tokio::time::timeout_at(deadline, changed).await.is_err() {
            return;
        }
    }
}

/// One routing decision under the state's read lock: the request, the source IP, the next hop's uid when a
/// retry may choose another (load-balanced for a service the client addressed), and how many it was chosen among.
#[allow(clippy::type_complexity)]
fn route(
    pi: &ProxyInputs,
    src: &LocalRef,
    client: SocketAddr,
    dst: SocketAddr,
    tried: &[crate::state::intern::Str],
    outliers: Option<&super::outlier::Outliers>,
) -> Result<(Routed, IpAddr, Option<crate::state::intern::Str>, usize), OutboundError> {
    let state = pi.state.read();
    let source = src.resolve(&state).ok_or_else(|| OutboundError::UnknownSource(src.to_string()))?;
    let src_ip = if source.ips.contains(&client.ip()) {
        client.ip()
    } else {
        source.ips.first().copied().unwrap_or(client.ip())
    };
    let mut rng = |n: u64| rand::random::<u64>() % n.max(1);
    let mut chooser = Chooser { pick: &mut rng, tried, outliers, candidates: 0 };
    let request = choose_request(&state, &pi.cfg, &source, src_ip, dst, &mut chooser)?;
    let hop = match (&request.service, &request.destination) {
        (Some(_), Some(w)) if chooser.candidates > 0 && request.path != Path::Passthrough => Some(w.uid.clone()),
        _ => None,
    };
    let routed = Routed { source_identity: source.identity(), source: source.clone(), request, attempts: 1 };
    Ok((routed, src_ip, hop, chooser.candidates))
}

/// What an attempt that ran out of its share of the connect timeout failed with (as the connect itself would).
fn timed_out(r: &Request) -> OutboundError {
    let e = std::io::Error::from(std::io::ErrorKind::TimedOut);
    match r.protocol {
        Protocol::Tcp => OutboundError::Connect(r.upstream, e),
        Protocol::Hbone => OutboundError::Pool(PoolError::Connect(r.upstream, e)),
    }
}

/// Connect the routed request: plain TCP, a CONNECT through the pool, or double HBONE.
async fn establish(
    pi: &ProxyInputs,
    routed: &mut Routed,
    (client, dst): (SocketAddr, SocketAddr),
    src_ip: IpAddr,
) -> Result<Upstream, OutboundError> {
    if let Some(host) = routed.request.resolve.take() {
        resolve_upstream(&pi.cfg, &routed.source, &mut routed.request, &host, dst).await?;
    }
    let (protocol, upstream_addr, target) = (routed.request.protocol, routed.request.upstream, routed.request.target);
    match protocol {
        Protocol::Tcp => {
            let bind: Option<IpAddr> = pi.cfg.bind_source_ip.then_some(src_ip);
            let opts =
                crate::socket::ConnectOptions { bind: bind.map(|ip| SocketAddr::new(ip, 0)), transparent: false };
            match crate::socket::connect_with(&*pi.sockets, upstream_addr, opts, pi.cfg.connect_timeout()).await {
                Ok(s) => Ok(Upstream::Tcp(s)),
                Err(e) => Err(OutboundError::Connect(upstream_addr, e)),
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
                baggage: crate::metrics::baggage(&routed.source),
                forwarded: forwarded(client, routed.request.service.as_deref()),
                traceparent: new_traceparent(),
            };
            let authority = routed.request.authority.clone().unwrap_or_else(|| target.to_string());
            // Checked once here, so the pool's retry closure cannot fail (a hostname from the state may not parse).
            if let Err(e) = connect_request(&authority, &headers) {
                return Err(OutboundError::Authority(authority, e.to_string()));
            }
            let make = || connect_request(&authority, &headers).unwrap_or_else(|_| http::Request::new(()));
            // A stream the peer did not process (REFUSED_STREAM, or above a GOAWAY's last stream: RFC 9113 § 8.7;
            // a daemon handing its connection over answers so) is asked again once, on another connection.
            let mut refused_once = false;
            let (resp, send, lease) = loop {
                let (resp, send, lease) = match pi.pool.send_connect(&key, &make).await {
                    Ok(x) => x,
                    Err(e) => return Err(e.into()),
                };
                // Until answered, the stream holds its connection here (it is not handed over mid-setup).
                let setting_up = lease.gate().setting_up();
                match resp.await {
                    Ok(r) => break (r, send, lease),
                    Err(e)
                        if !refused_once
                            && e.is_remote()
                            && (e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM)) =>
                    {
                        refused_once = true;
                        lease.refused();
                        drop(setting_up);
                    }
                    Err(e) => return Err(OutboundError::Response(upstream_addr, e)),
                }
            };
            if resp.status() != http::StatusCode::OK {
                let status = resp.status().as_u16();
                return Err(OutboundError::Status(upstream_addr, status));
            }
            let recv = resp.into_body();
            let Some(inner) = routed.request.inner.clone() else {
                return Ok(Upstream::Hbone { send, recv, _lease: lease, _inner: None });
            };
            // Double HBONE: the end-to-end HBONE inside the gateway's stream, with x-forwarded-network.
            let cert = match pi.certs.get(&routed.source_identity) {
                Some(c) => c,
                None => return Err(PoolError::NoCertificate(key.src_id.to_string()).into()),
            };
            let mut req = match connect_request(&authority, &headers) {
                Ok(r) => r,
                Err(e) => return Err(OutboundError::Authority(authority, e.to_string())),
            };
            if let Ok(v) = http::HeaderValue::from_str(&inner.network) {
                req.headers_mut().insert("x-forwarded-network", v);
            }
            let io = super::double_hbone::H2Io::new(send, recv);
            match super::double_hbone::connect_inner(&pi.cfg, io, &cert, inner.expected, &pi.certs, req).await {
                Ok((send, recv, conn)) => Ok(Upstream::Hbone { send, recv, _lease: lease, _inner: Some(conn) }),
                Err(e) => Err(OutboundError::Inner(e)),
            }
        }
    }
}

/// A workload known only by hostname: resolve it (the system resolver), prefer the client's address family, pick one
/// address at random, and fill in the request's target and next hop. Our own ports are refused here too.
async fn resolve_upstream(
    cfg: &Config,
    src: &Workload,
    request: &mut Request,
    host: &str,
    dst: SocketAddr,
) -> Result<(), OutboundError> {
    let port = request.target.port();
    let found: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| OutboundError::Dns(host.to_string(), e.to_string()))?
        .map(crate::socket::canonical)
        .collect();
    let (same, other): (Vec<SocketAddr>, Vec<SocketAddr>) =
        found.into_iter().partition(|a| a.is_ipv4() == dst.is_ipv4());
    let pool = if same.is_empty() { other } else { same };
    if pool.is_empty() {
        return Err(OutboundError::Dns(host.to_string(), "no addresses".into()));
    }
    let target = pool[rand::random::<u64>() as usize % pool.len()];
    self_call(cfg, src, request.destination.as_deref(), target)?;
    request.target = target;
    request.upstream = match request.protocol {
        Protocol::Hbone => SocketAddr::new(target.ip(), cfg.hbone_port),
        Protocol::Tcp => target,
    };
    Ok(())
}

/// Metrics labels of an outbound connection.
pub fn labels(
    routed: Option<&Routed>,
    source: Option<&Workload>,
    derived_destination: Option<&crate::metrics::DerivedPeer>,
) -> crate::metrics::TrafficLabels {
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
        derived_source: None,
        derived_destination,
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
    // Behind a network gateway, the destination as it presented itself (ztunnel's derived destination), kept by the
    // inner connection (borrowed where needed, so the task holds nothing more).
    let derived = match &upstream {
        Upstream::Hbone { _inner: Some(inner), .. } => inner.derived.as_deref(),
        _ => None,
    };
    let result = super::access::ConnectionResult::open(pi, labels(Some(&routed), None, derived), Instant::now());
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
    let counters = result.counters();
    // Istio's byte metrics have one meaning on both reporters: `received` is the request direction (client to
    // server), `sent` the response. The access log's bytes_sent/bytes_recv are this side's: sent to the upstream,
    // received from it.
    let (sent, recv) =
        (crate::copy::Tally::new(Some(&counters.received)), crate::copy::Tally::new(Some(&counters.sent)));
    // The stream's lease on its HBONE connection is held until the copy ends.
    let (copy, _lease) = match upstream {
        Upstream::Tcp(up) => {
            // A TCP ⇄ TCP relay can be handed to a successor daemon (`handover`).
            let relay = crate::copy::tcp_bidirectional(client, up, &sent, &recv);
            let ends = crate::handover::carry::Ends { force, close: &_listed.close };
            let describe = || {
                let record = super::access::record_fields(&access_record(client_addr, &routed, None));
                let addrs = (client_addr, original_dst, routed.request.upstream);
                super::resume::meta(crate::handover::ConnKind::OutboundTcp, local, &result, record, addrs)
            };
            // Boxed: a TCP relay's phase is larger than an HBONE stream's, and the task is sized for its largest.
            let (outcome, (up_bytes, down_bytes)) =
                match Box::pin(crate::handover::carry::carry(&pi.handover, relay, ends, describe)).await {
                    crate::handover::carry::Carried::HandedOver => return,
                    crate::handover::carry::Carried::Ended(r, moved) => (r, moved),
                };
            let error = outcome.err().map(|e| ("CONNECT", e.to_string()));
            return result.finish(pi, &access_record(client_addr, &routed, None), up_bytes, down_bytes, error);
        }
        Upstream::Hbone { send, recv: body, _lease, _inner } => {
            // A double-HBONE inner stream's connection is itself carried by a stream: only a pooled connection's
            // writer is metered.
            let buffers = if _inner.is_none() { Some(_lease.buffers().clone()) } else { None };
            (crate::copy::tcp_h2_bidirectional(client, send, body, &sent, &recv, buffers), Some((_lease, _inner)))
        }
    };
    // A pooled connection shed for the buffer budget ends its streams at once: one blocked writing to a client that
    // does not read would keep the connection's buffers alive. Its end, once the grace for delivering what h2 held
    // is over, ends them too. Both through one token (`h2::end_streams`).
    let streams_end = _lease.as_ref().map(|(l, _)| l.streams_end().clone());
    let ended = async {
        match &streams_end {
            Some(t) => t.cancelled().await,
            None => std::future::pending().await,
        }
    };
    // A pooled connection's stream can stop for a hand-over of its connection; a double-HBONE one keeps its outer
    // connection here while it lives (the inner session is not handed over).
    let gate = _lease.as_ref().filter(|(_, inner)| inner.is_none()).map(|(l, _)| l.gate().clone());
    let _pinned = _lease.as_ref().filter(|(_, inner)| inner.is_some()).map(|(l, _)| l.gate().setting_up());
    let copied = {
        let mut copy = copy;
        let ends = std::pin::pin!(async {
            tokio::select! {
                _ = force.cancelled() => std::io::Error::other("drained"),
                _ = ended => std::io::Error::other(match &_lease {
                    Some((l, _)) if l.buffers().shed.is_cancelled() => {
                        "shed: the node's buffered stream data is over its budget"
                    }
                    _ => "the HBONE connection closed",
                }),
            }
        });
        match &gate {
            Some(gate) => {
                let describe = || {
                    // A pooled stream's (the gate is not a double-HBONE one's): no derived destination.
                    let record = super::access::record_fields(&access_record(client_addr, &routed, None));
                    let addrs = (client_addr, original_dst, routed.request.upstream);
                    let kind = crate::handover::ConnKind::OutboundHbone;
                    super::resume::meta(kind, local, &result, record, addrs)
                };
                match crate::handover::hconn::carry_stream(gate, &mut copy, ends, describe).await {
                    crate::handover::hconn::Carried::Ended(r) => r,
                    crate::handover::hconn::Carried::Give(tx) => {
                        let _ = tx.send(copy.into_parts());
                        return;
                    }
                }
            }
            None => tokio::select! {
                r = &mut copy => r.map(|_| ()),
                e = ends => Err(e),
            },
        }
    };
    // Ended because a revocation list revoked the server (the pooled connection's, or the inner one's behind a
    // gateway): flagged CERT_REVOKED, as ztunnel's.
    let revoked = _lease.as_ref().is_some_and(|(l, inner)| l.revoked() || inner.as_ref().is_some_and(|i| i.revoked()));
    let error = copied.err().map(|e| match revoked {
        true => ("CERT_REVOKED", crate::tls::revocation::REVOKED.to_string()),
        false => ("CONNECT", e.to_string()),
    });
    let derived = _lease.as_ref().and_then(|(_, inner)| inner.as_ref()).and_then(|i| i.derived.as_deref());
    result.finish(pi, &access_record(client_addr, &routed, derived), sent.get(), recv.get(), error);
}

/// What the outbound access record names: the source workload and identity, the destination asked for, the HBONE
/// peer dialed, the service and the workload at the other end (with its identity when reached over HBONE).
fn access_record<'a>(
    client: SocketAddr,
    r: &'a Routed,
    derived: Option<&'a crate::metrics::DerivedPeer>,
) -> super::access::AccessRecord<'a> {
    let hbone = r.request.protocol == Protocol::Hbone;
    super::access::AccessRecord {
        direction: "outbound",
        src_addr: client,
        src_workload: Some(&r.source),
        src_identity: Some(&r.source_identity),
        dst_addr: r.request.target,
        dst_hbone_addr: hbone.then_some(r.request.upstream),
        dst_service: r.request.service.as_ref().map(|s| &*s.hostname),
        dst_workload: r.request.destination.as_deref(),
        dst_identity_of: r.request.destination.as_deref().filter(|_| hbone),
        dst_derived: derived,
        attempts: r.attempts,
    }
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
    let source = local.resolve(&pi.state.read());
    let mut guard = pi.metrics.open(labels(routed, source.as_deref(), None));
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
    if let OutboundError::Route(r) = err {
        f.insert("reason".into(), r.reason().into());
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
    let pi = l.pi.clone();
    super::accept_until_drained(listener, &pi, &drain, move |stream, peer| {
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

    /// What one idle outbound connection's task holds for its life (see inbound's `stream_task_size`).
    #[test]
    fn connection_task_size() {
        let l = Arc::new(Listener {
            pi: crate::inpod::testutil::inputs(),
            local: LocalRef::Uid("u".into()),
            force: tokio_util::sync::CancellationToken::new(),
        });
        let size = std::mem::size_of_val(&connection(l, Box::pin(async { None })));
        println!("task_sizes: outbound connection task future {size} bytes");
        // 1,424 bytes with two async copy loops and three waits; 800 with the poll-based relay and one wait for the
        // pooled connection's end (release and debug alike); 1,232 since the stream can stop for a hand-over of its
        // connection (the gate's wait and the phase's own select: a cost to win back with one wake-up list per
        // connection).
        assert!(size <= 1_280, "the outbound connection task's future is {size} bytes");
    }

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
         "services":{"other/legacy.other.svc.cluster.local":{"80":5432},"other/unmapped.other.svc.cluster.local":{}}},
        {"uid":"far","name":"far","namespace":"default","workloadIps":["10.9.0.1"],"network":"remote","protocol":"HBONE",
         "services":{"default/far.default.svc.cluster.local":{"80":80}}}
      ],
      "services":[
        {"name":"echo","namespace":"default","hostname":"echo.default.svc.cluster.local","vips":["/10.96.0.10"],"ports":{"80":8080},
         "subjectAltNames":["spiffe://cluster.local/ns/default/sa/echo-san","not-a-spiffe-id"]},
        {"name":"legacy","namespace":"other","hostname":"legacy.other.svc.cluster.local","vips":["/10.96.0.20"],"ports":{"80":0}},
        {"name":"unmapped","namespace":"other","hostname":"unmapped.other.svc.cluster.local","vips":["/10.96.0.21"],"ports":{"80":0}},
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
        // The control side's servers (admin, stats, readiness) on their default ports.
        let cfg = Config { own_ports: vec![15000, 15020, 15021], ..Config::default() };
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
            // A service target port of 0 is "not set": the endpoint's own port map decides (TCP workload: plain TCP)...
            ("10.96.0.20:80", 0, Ok((Protocol::Tcp, "10.0.2.1:5432", "10.0.2.1:5432", vec![]))),
            // ...and an endpoint without a mapping for the port is not a candidate.
            (
                "10.96.0.21:80",
                0,
                Err(RouteError::NoHealthyUpstream("other/unmapped.other.svc.cluster.local".into(), 80)),
            ),
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
            // ...the control side's too: admin, stats, readiness (in local mode they share the workloads' loopback).
            ("127.0.0.1:15000", 0, Err(RouteError::SelfCall(15000))),
            ("127.0.0.1:15020", 0, Err(RouteError::SelfCall(15020))),
            ("10.0.0.1:15021", 0, Err(RouteError::SelfCall(15021))),
            // A service whose only endpoint is on another network with no gateway.
            ("10.96.0.40:80", 0, Err(RouteError::RemoteNetwork("far".into(), "remote".into()))),
            // The same workload's IP is not indexed on our network: it is an unknown destination.
            ("10.9.0.1:80", 0, Ok((Protocol::Tcp, "10.9.0.1:80", "10.9.0.1:80", vec![]))),
        ];
        for (dst, pick, want) in rows {
            let mut p = |_total: u64| pick;
            let got = build_request(&st, &cfg, &src, src.ips[0], addr(dst), &mut p)
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
            let r =
                build_request(&st, &Config::default(), &src, src.ips[0], addr("10.96.0.10:80"), &mut |_| pick).unwrap();
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
        // No clusterId from istiod: no k8s.cluster.name (not the daemon's own cluster id), as ztunnel.
        assert_eq!(
            crate::metrics::baggage(w),
            "k8s.namespace.name=default,k8s.deployment.name=sleep,service.name=sleep,service.version=v1,cloud.region=eu,cloud.availability_zone=eu-1"
        );
        let with_cluster = Workload { cluster_id: crate::state::intern::intern("east"), ..(**w).clone() };
        assert!(crate::metrics::baggage(&with_cluster).starts_with("k8s.cluster.name=east,k8s.namespace.name=default,"));
        assert_eq!(forwarded(addr("10.0.0.1:4242"), None), "for=\"10.0.0.1:4242\"");
        assert_eq!(forwarded(addr("[fd00::1]:4242"), None), "for=\"[fd00::1]:4242\"");
        let tp = new_traceparent();
        assert_eq!(tp.len(), 55);
        assert!(tp.starts_with("00-") && tp.ends_with("-00"));
    }

    #[tokio::test]
    async fn a_hostname_only_workload_is_resolved_when_connecting() {
        let st = state(
            r#"{"workloads":[
            {"uid":"src","name":"sleep","namespace":"default","workloadIps":["10.0.0.1"],"protocol":"HBONE"},
            {"uid":"ext","name":"ext","namespace":"default","hostname":"localhost","protocol":"TCP",
             "services":{"default/ext.default.svc.cluster.local":{"80":8080}}},
            {"uid":"ext2","name":"ext2","namespace":"default","hostname":"localhost","protocol":"TCP","node":"n1",
             "services":{"default/own.default.svc.cluster.local":{"80":15080}}}],
            "services":[
            {"name":"ext","namespace":"default","hostname":"ext.default.svc.cluster.local","vips":["/10.96.9.1"],"ports":{"80":8080}},
            {"name":"own","namespace":"default","hostname":"own.default.svc.cluster.local","vips":["/10.96.9.2"],"ports":{"80":15080}}]}"#,
        );
        let cfg = Config::default();
        let src = st.workload("src").unwrap().clone();
        let mut r = build_request(&st, &cfg, &src, src.ips[0], addr("10.96.9.1:80"), &mut |_| 0).unwrap();
        let host = r.resolve.take().unwrap();
        resolve_upstream(&cfg, &src, &mut r, &host, addr("10.96.9.1:80")).await.unwrap();
        assert_eq!(r.target, addr("127.0.0.1:8080"), "localhost, in the client's family");
        assert_eq!(r.upstream, r.target, "TCP: dialed directly");
        // A name that resolves to loopback with one of our ports: refused after resolution.
        let mut r = build_request(&st, &cfg, &src, src.ips[0], addr("10.96.9.2:80"), &mut |_| 0).unwrap();
        let host = r.resolve.take().unwrap();
        let err = resolve_upstream(&cfg, &src, &mut r, &host, addr("10.96.9.2:80")).await.unwrap_err();
        assert!(matches!(err, OutboundError::Route(RouteError::SelfCall(15080))), "{err}");
    }
}
