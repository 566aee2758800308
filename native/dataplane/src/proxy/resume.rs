//! A proxy connection across a hand-over, the proxy's side of it (handover/ is the transport: the hub, the wire, the
//! TLS and HTTP/2 state, the engine that carries a taken-in HBONE connection's streams): what a connection says of
//! itself when it is described (`meta`), and the successor's side, where a connection taken in becomes a proxy
//! connection again, counted live under its labels, listed in the tracker, authorized continuously when inbound, and
//! its access record written once at its end with the bytes of every process (`resume` for a TCP relay,
//! `resume_hbone` and `run_streams` for an HBONE connection's streams).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{access, tracker, LocalRef, ProxyInputs};
use crate::copy::{Tally, TcpRelay};
use crate::handover::carry::{carry, Carried, Ends};
use crate::handover::hbone::Engine;
use crate::handover::{hconn, ConnKind, ConnMeta, LegMeta, LocalJson, Received};

impl From<&LocalRef> for LocalJson {
    fn from(l: &LocalRef) -> LocalJson {
        match l {
            LocalRef::Uid(u) => LocalJson::Uid { uid: u.to_string() },
            LocalRef::Pod { namespace, name, service_account, node } => LocalJson::Pod {
                namespace: namespace.to_string(),
                name: name.to_string(),
                service_account: service_account.to_string(),
                node: node.to_string(),
            },
        }
    }
}

impl From<&LocalJson> for LocalRef {
    fn from(l: &LocalJson) -> LocalRef {
        match l {
            LocalJson::Uid { uid } => LocalRef::Uid(uid.as_str().into()),
            LocalJson::Pod { namespace, name, service_account, node } => LocalRef::Pod {
                namespace: namespace.as_str().into(),
                name: name.as_str().into(),
                service_account: service_account.as_str().into(),
                node: node.as_str().into(),
            },
        }
    }
}

/// The metadata a proxy gives for its connection (`legs` is filled in by `carry`).
pub fn meta(
    kind: ConnKind,
    local: &LocalRef,
    result: &access::ConnectionResult,
    record: serde_json::Map<String, serde_json::Value>,
    (src, original_dst, actual_dst): (std::net::SocketAddr, std::net::SocketAddr, std::net::SocketAddr),
) -> ConnMeta {
    let leg = LegMeta { moved: 0, end: Default::default(), pending: 0 };
    ConnMeta {
        kind,
        local: local.into(),
        labels: result.labels().clone(),
        label: 0,
        record,
        age_ms: result.age().as_millis() as u64,
        src,
        original_dst,
        actual_dst,
        legs: [leg, leg],
        peer_identity: None,
    }
}

/// Successor: carry on one connection a predecessor handed over, on the calling silo (its sockets register with
/// this thread's reactor). Counted live under its labels, listed in the tracker, authorized continuously when
/// inbound, and its access record written once at its end, with the bytes of both processes.
/// `arrival` is dropped once it is listed and about to run.
pub async fn resume(pi: Arc<ProxyInputs>, force: CancellationToken, r: Received, arrival: crate::handover::Arrival) {
    let Received { fds, meta, legs, .. } = r;
    let mut socks = Vec::with_capacity(2);
    for fd in fds {
        let s = std::net::TcpStream::from(fd);
        match s.set_nonblocking(true).and_then(|()| tokio::net::TcpStream::from_std(s)) {
            Ok(s) => socks.push(s),
            Err(e) => {
                pi.events.log(
                    crate::events::Level::Error,
                    "handed-over connection not resumed",
                    crate::fields! {"src.addr" => meta.src.to_string(), "error" => e.to_string()},
                );
                return;
            }
        }
    }
    let (Some(b), Some(a)) = (socks.pop(), socks.pop()) else { return };
    let local: LocalRef = (&meta.local).into();
    let result = access::ConnectionResult::adopt(&pi, (*meta.labels).clone(), Duration::from_millis(meta.age_ms));
    let track = match meta.kind {
        ConnKind::OutboundTcp | ConnKind::OutboundHbone => pi.tracker.register_outbound(
            local.clone(),
            tracker::ConnInfo {
                inbound: false,
                src: meta.src,
                original_dst: meta.original_dst,
                actual_dst: meta.actual_dst,
                protocol: "TCP",
            },
        ),
        ConnKind::InboundPlaintext | ConnKind::InboundHbone => {
            let conn =
                crate::rbac::Connection::new(None, meta.src.ip(), meta.original_dst.ip(), meta.original_dst.port());
            pi.tracker.register(local.clone(), conn, "TCP")
        }
    };
    let counters = result.counters();
    // Leg 0 is the request direction on both proxies (Istio's `received`), leg 1 the response (`sent`).
    let (t0, t1) = (Tally::new(Some(&counters.received)), Tally::new(Some(&counters.sent)));
    let relay = TcpRelay::resume(a, b, legs, [&t0, &t1]);
    let describe = || ConnMeta { age_ms: result.age().as_millis() as u64, ..meta.clone() };
    drop(arrival);
    let carried = carry(&pi.handover, relay, Ends { force: &force, close: &track.close }, describe).await;
    let Carried::Ended(outcome, (m0, m1)) = carried else { return };
    let flag = if track.close.is_cancelled() { "DENY" } else { "CONNECT" };
    let error = outcome.err().map(|e| (flag, e.to_string()));
    // The record's bytes are this side's view: sent toward the upstream on outbound, toward the client on inbound.
    let (sent, received) = match meta.kind {
        ConnKind::OutboundTcp | ConnKind::OutboundHbone => (m0, m1),
        ConnKind::InboundPlaintext | ConnKind::InboundHbone => (m1, m0),
    };
    drop(track);
    result.finish_with(&pi, meta.record.clone(), sent, received, error);
}

/// Successor (or a predecessor whose hand-over failed after the session left h2): carry a handed-over HBONE
/// connection on, on the calling silo, to its last stream's end. Each stream is counted live under its labels from
/// the start and its bytes at its end, and its access record is written once, with the bytes of every process.
pub async fn resume_hbone(
    pi: std::sync::Arc<ProxyInputs>,
    force: tokio_util::sync::CancellationToken,
    r: crate::handover::Received,
    arrival: crate::handover::Arrival,
) {
    let crate::handover::Received { fds, hbone: Some(h), meta, .. } = r else { return };
    let (engine, ids, metas) = match h.into_engine(fds) {
        Ok(e) => e,
        Err(e) => {
            pi.events.log(
                crate::events::Level::Error,
                "handed-over HBONE connection not resumed",
                crate::fields! {"src.addr" => meta.src.to_string(), "error" => e},
            );
            return;
        }
    };
    run_streams(pi, force, engine, ids, metas, Some(arrival)).await
}

/// What authorization judges an inbound stream taken in by, and whether its peer's identity is the verified one it
/// crossed with (an inbound HBONE stream must carry one; inbound plaintext has none).
fn authorizable(meta: &ConnMeta) -> (crate::rbac::Connection, bool) {
    // A predecessor of before `peerIdentity` names the peer only in the metrics labels (the destination reporter's
    // source principal is the identity its handshake verified).
    let named = meta.peer_identity.as_deref().or_else(|| {
        let p = meta.labels.source_principal.as_str();
        (meta.kind == ConnKind::InboundHbone && p.starts_with("spiffe://")).then_some(p)
    });
    let identity: Option<crate::identity::Identity> = named.and_then(|i| i.parse().ok());
    let verified = match meta.kind {
        ConnKind::InboundHbone => identity.is_some(),
        _ => meta.peer_identity.is_none(),
    };
    let dst = meta.original_dst;
    (crate::rbac::Connection::new(identity, meta.src.ip(), dst.ip(), dst.port()), verified)
}

#[cfg(test)]
#[test]
fn an_inbound_stream_taken_in_is_judged_by_its_verified_identity_or_closed() {
    let mut m = crate::handover::tests::describe();
    m.kind = ConnKind::InboundHbone;
    m.peer_identity = Some("spiffe://cluster.local/ns/default/sa/sleep".into());
    let (conn, ok) = authorizable(&m);
    assert!(ok);
    assert_eq!(conn.src_identity.map(|i| i.to_string()).as_deref(), Some("spiffe://cluster.local/ns/default/sa/sleep"));
    for bad in [None, Some("not an identity".to_string())] {
        m.peer_identity = bad.clone();
        assert!(!authorizable(&m).1, "{bad:?} is refused");
    }
    // From a predecessor that did not send it: the labels' source principal.
    m.peer_identity = None;
    m.labels = std::sync::Arc::new(crate::metrics::TrafficLabels {
        source_principal: "spiffe://cluster.local/ns/default/sa/sleep".into(),
        ..(*m.labels).clone()
    });
    assert!(authorizable(&m).1);
    m.kind = ConnKind::InboundPlaintext;
    m.peer_identity = None;
    assert!(authorizable(&m).1, "plaintext has no identity to carry");
}

/// A carried stream: its description, its metrics and record, and its place in the tracker.
struct Open {
    meta: ConnMeta,
    result: access::ConnectionResult,
    track: tracker::TrackGuard,
}

impl Open {
    fn new(pi: &ProxyInputs, meta: ConnMeta) -> Open {
        let age = std::time::Duration::from_millis(meta.age_ms);
        let result = access::ConnectionResult::adopt(pi, (*meta.labels).clone(), age);
        let local: LocalRef = (&meta.local).into();
        let track = match meta.kind {
            ConnKind::InboundHbone | ConnKind::InboundPlaintext => {
                let (conn, verified) = authorizable(&meta);
                // Judged as a new connection to its workload would be: with the trust-domain aliases of its domain.
                let own = local.resolve(&pi.state.read()).map(|w| w.trust_domain.to_string());
                let conn = match own {
                    Some(own) => conn.with_trust_domains(pi.certs.trust_domains(), &own),
                    None => conn,
                };
                let track = pi.tracker.register(local, conn, "HBONE");
                if !verified {
                    // Fail closed: without the peer's identity no policy can be held to it (a DENY naming it would
                    // not match). The predecessor wrote what its TLS handshake verified; anything else is a fault.
                    let f = crate::fields! {"src.addr" => meta.src.to_string(), "identity" => meta.peer_identity.clone().unwrap_or_default()};
                    pi.events.log(
                        crate::events::Level::Error,
                        "handed-over stream without a valid peer identity: closed",
                        f,
                    );
                    track.close.cancel();
                }
                track
            }
            ConnKind::OutboundTcp | ConnKind::OutboundHbone => pi.tracker.register_outbound(
                local,
                tracker::ConnInfo {
                    inbound: false,
                    src: meta.src,
                    original_dst: meta.original_dst,
                    actual_dst: meta.actual_dst,
                    protocol: "HBONE",
                },
            ),
        };
        Open { meta, result, track }
    }

    /// Count the bytes moved here since the last count (`moved`: application → peer, peer → application, across
    /// processes). Leg 0 is application → peer. Istio's `received` is the request direction: from the client
    /// outbound, from the peer inbound. The bytes moved before the hand-over were counted where they moved.
    fn count(&mut self, moved: (u64, u64)) {
        let legs = &mut self.meta.legs;
        let fresh = (moved.0.saturating_sub(legs[0].moved), moved.1.saturating_sub(legs[1].moved));
        (legs[0].moved, legs[1].moved) = (legs[0].moved.max(moved.0), legs[1].moved.max(moved.1));
        let (request, response) = match self.meta.kind {
            ConnKind::InboundHbone | ConnKind::InboundPlaintext => (fresh.1, fresh.0),
            _ => fresh,
        };
        let counters = self.result.counters();
        counters.received.fetch_add(request, std::sync::atomic::Ordering::Relaxed);
        counters.sent.fetch_add(response, std::sync::atomic::Ordering::Relaxed);
    }

    /// `revoked`: the connection was closed because a revocation list revoked its peer.
    fn finish(mut self, pi: &ProxyInputs, moved: (u64, u64), error: Option<String>, revoked: bool) {
        self.count(moved);
        let flag = match (revoked, self.track.close.is_cancelled()) {
            (true, _) => "CERT_REVOKED",
            (false, true) => "DENY",
            (false, false) => "CONNECT",
        };
        let Open { meta, result, track } = self;
        drop(track);
        result.finish_with(pi, meta.record, moved.0, moved.1, error.map(|e| (flag, e)));
    }
}

/// A connection carried on here is followed for revocation as it was where its handshake ran: the chain it came with,
/// against the roots of its local workload's identity (inbound: the peer is the client; outbound: the server).
fn follow_revocation(pi: &ProxyInputs, engine: &Engine, meta: Option<&ConnMeta>) -> crate::tls::revocation::Watch {
    use crate::tls::revocation::Peer;
    let Some(meta) = meta else { return crate::tls::revocation::Watch::none() };
    let peer = if meta.kind == ConnKind::InboundHbone { Peer::Client } else { Peer::Server };
    let local: LocalRef = (&meta.local).into();
    let identity = local.resolve(&pi.state.read()).map(|w| w.identity());
    let roots = identity.and_then(|id| pi.certs.get(&id)).map(|c| c.roots.clone());
    let chain: Vec<rustls::pki_types::CertificateDer<'static>> =
        engine.peer().chain.iter().map(|d| rustls::pki_types::CertificateDer::from(d.clone())).collect();
    let since =
        rustls::pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(engine.peer().verified_at));
    let chain = (!chain.is_empty()).then_some(chain.as_slice());
    pi.certs.watch_revocation_since(chain, roots, peer, Some(since))
}

/// Carry a handed-over HBONE connection (`engine`) to its end: each stream (`ids`, `metas` in one order) counted
/// live under its labels, listed in the tracker (an inbound one authorized continuously: a policy that now denies it
/// resets it), its access record written once with the bytes of every process it went through; streams still open
/// when `force` fires are recorded as drained. `arrival` (a successor's) is dropped once they are listed. The connection can itself be handed on: it holds a ticket, and at a
/// pause it comes to rest at a record's end (`Engine::flush`) and crosses as a predecessor's h2 connection would.
pub async fn run_streams(
    pi: std::sync::Arc<ProxyInputs>,
    force: tokio_util::sync::CancellationToken,
    mut engine: Engine,
    ids: Vec<u32>,
    metas: Vec<ConnMeta>,
    arrival: Option<crate::handover::Arrival>,
) {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    // A kept connection's streams have no task of their own left: the daemon's drain waits for this one.
    let _carrying = pi.handover.carrying();
    let revocation = follow_revocation(&pi, &engine, metas.first());
    let mut revoked = false;
    let mut open: std::collections::HashMap<u32, Open> =
        ids.into_iter().zip(metas).map(|(id, m)| (id, Open::new(&pi, m))).collect();
    drop(arrival);
    let mut closes: FuturesUnordered<_> = open
        .iter()
        .map(|(&id, o)| {
            let close = o.track.close.clone();
            async move {
                close.cancelled().await;
                id
            }
        })
        .collect();
    let ticket = pi.handover.ticket();
    let (mut described, mut declined) = (None, None);
    let over = loop {
        let round = ticket.round();
        tokio::select! {
            done = engine.step() => {
                for e in engine.take_ended() {
                    if let Some(o) = open.remove(&e.id) {
                        o.finish(&pi, e.moved, e.result.err().map(|err| err.to_string()), revoked);
                    }
                }
                if done {
                    break true;
                }
            }
            Some(id) = closes.next(), if !closes.is_empty() => {
                engine.close_stream(id, io::Error::other("connection closed due to policy change"));
            }
            _ = revocation.revoked.cancelled(), if !revoked => {
                // Every stream ends, and with the last the connection (CERT_REVOKED, as on an h2 connection).
                revoked = true;
                let ids: Vec<u32> = open.keys().copied().collect();
                for id in ids {
                    engine.close_stream(id, io::Error::other(crate::tls::revocation::REVOKED));
                }
            }
            _ = force.cancelled() => break false,
            _ = round.describe.cancelled(), if described != Some(round.generation) => {
                described = Some(round.generation);
                ticket.described_later(open.len());
            }
            _ = round.pause.cancelled(), if declined != Some(round.generation) => {
                match offer_engine((&ticket, &round), engine, &mut open, &pi.events).await {
                    Ok(()) => return,
                    Err((kept, refused)) => {
                        engine = kept;
                        if refused {
                            declined = Some(round.generation);
                        }
                    }
                }
            }
        }
    };
    drop(ticket);
    if over {
        engine.linger().await;
    }
    // Drained: the streams still open end here.
    for (_, o) in open.drain() {
        let moved = (o.meta.legs[0].moved, o.meta.legs[1].moved);
        o.finish(&pi, moved, Some("drained".to_string()), revoked);
    }
}

/// Offer an engine's connection in `round`: brought to rest, its streams' bytes to date counted here, then offered
/// as the h2 connections are. `Ok`: the successor has it (its streams' records are the successor's to write).
/// `Err((engine, declined))`: it carries on here, declined (not at rest) or kept (the successor did not take it).
async fn offer_engine(
    (ticket, round): (&crate::handover::Ticket, &crate::handover::Round),
    mut engine: Engine,
    open: &mut std::collections::HashMap<u32, Open>,
    events: &crate::events::Events,
) -> Result<(), (Engine, bool)> {
    let described = engine.stream_ids().all(|id| open.contains_key(&id));
    if !described || !engine.can_hand_over() || !engine.flush(hconn::REST_WAIT).await {
        ticket.decline(round.generation).await;
        return Err((engine, true));
    }
    let (tcp, conn, apps) = engine.into_parcel();
    let mut metas = Vec::with_capacity(conn.streams.len());
    for s in &conn.streams {
        let Some(o) = open.get_mut(&s.id) else { continue };
        o.count(s.moved);
        o.meta.age_ms = o.result.age().as_millis() as u64;
        metas.push(o.meta.clone());
    }
    match hconn::offer_parcel((ticket, round), tcp, conn, apps, metas, events).await {
        hconn::Offered::Kept(k) => Err((k.0, false)),
        // Gone (or lost, and said so): the streams end here without a record; counted closed, as relays handed over.
        _ => {
            open.clear();
            Ok(())
        }
    }
}
