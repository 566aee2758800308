//! A TCP ⇄ TCP connection's copy phase, where a hand-over can take it: the relay runs until it ends, is forced, is
//! closed by policy, or is asked to pause (asked first to describe itself, it sends its metadata and goes on); a
//! paused relay is offered to the hub and either leaves with the successor or carries on where it stopped. `resume` is the successor's side: the same phase, from the state that crossed.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{ConnKind, ConnMeta, Hub, LegMeta, Parcel, Received, Verdict};
use crate::copy::{Tally, TcpRelay};
use crate::proxy::{LocalRef, ProxyInputs};

pub enum Carried {
    /// The relay ended here: how, and the bytes moved each way (leg 0, leg 1), counted across processes.
    Ended(io::Result<()>, (u64, u64)),
    /// The successor has it.
    HandedOver,
}

/// What a relay is ended by besides its own end.
pub struct Ends<'a> {
    /// The drain's deadline.
    pub force: &'a CancellationToken,
    /// A policy change that denies it (inbound), or a token never cancelled.
    pub close: &'a CancellationToken,
}

/// Run `relay` to its end, or until a successor takes it. `describe` is called only when pausing.
pub async fn carry(
    hub: &Arc<Hub>,
    mut relay: TcpRelay<'_>,
    ends: Ends<'_>,
    describe: impl Fn() -> ConnMeta,
) -> Carried {
    let ticket = hub.ticket();
    // The round this connection described itself in: its metadata crossed then, and need not again.
    let mut described = None;
    loop {
        let round = ticket.round();
        let fresh = described != Some(round.generation);
        tokio::select! {
            r = &mut relay => return Carried::Ended(r.map(|_| ()), relay.moved()),
            _ = ends.force.cancelled() => return Carried::Ended(Err(io::Error::other("drained")), relay.moved()),
            _ = ends.close.cancelled() => {
                return Carried::Ended(Err(io::Error::other("connection closed due to policy change")), relay.moved())
            }
            _ = round.describe.cancelled(), if fresh => {
                described = Some(round.generation);
                ticket.described(describe());
            }
            _ = round.pause.cancelled() => {
                let legs = relay.legs();
                let meta = fresh.then(&describe);
                let fds = relay.sockets().map(|s| s.as_raw_fd()).to_vec();
                // Boxed: the parcel exists only while paused; the relay's future stays small.
                let offer = Box::pin(ticket.offer(round.generation, Parcel { id: ticket.id, fds, meta, legs, hbone: None }));
                if offer.await == Verdict::Gone {
                    return Carried::HandedOver;
                }
                // Kept: a fresh round is in place by now, and the relay goes on where it stopped.
            }
        }
    }
}

/// The metadata a proxy gives for its connection (`legs` is filled in by `carry`).
pub fn meta(
    kind: ConnKind,
    local: &LocalRef,
    result: &crate::proxy::access::ConnectionResult,
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
pub async fn resume(pi: Arc<ProxyInputs>, force: CancellationToken, r: Received, arrival: super::Arrival) {
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
    let result =
        crate::proxy::access::ConnectionResult::adopt(&pi, (*meta.labels).clone(), Duration::from_millis(meta.age_ms));
    let track = match meta.kind {
        ConnKind::OutboundTcp | ConnKind::OutboundHbone => pi.tracker.register_outbound(
            local.clone(),
            crate::proxy::tracker::ConnInfo {
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
