//! Inbound plaintext (15006, in-pod): connections to the pod that arrived without HBONE, redirected by the pod's
//! iptables rules. They have no identity: authorization sees only addresses and ports, so a STRICT policy
//! (`DENY notPrincipals: [presence]`) denies them. Denied connections are closed without a byte reaching the app.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::{TcpListener, TcpStream};

use super::{LocalRef, ProxyInputs};
use crate::copy::Tally;
use crate::drain::Drain;
use crate::events::{Event, Level};
use crate::fields;
use crate::metrics::{ConnectionInfo, Reporter, TrafficLabels};
use crate::rbac;

/// What every connection of one 15006 listener shares: one allocation per listener, one pointer per task.
struct Listener {
    pi: Arc<ProxyInputs>,
    local: LocalRef,
    force: tokio_util::sync::CancellationToken,
}

pub async fn serve(listener: TcpListener, pi: Arc<ProxyInputs>, local: LocalRef, drain: Drain) {
    let l = Arc::new(Listener { pi, local, force: drain.force.clone() });
    let pi = l.pi.clone();
    super::accept_until_drained(listener, &pi, &drain, move |stream, peer| {
        let setup = Box::pin(establish(l.clone(), stream, peer));
        connection(l.clone(), setup)
    })
    .await
}

/// An authorized plaintext connection whose upstream is connected.
struct Established {
    client: TcpStream,
    upstream: TcpStream,
    peer: SocketAddr,
    dst: SocketAddr,
    local: Arc<crate::state::Workload>,
    track: super::tracker::TrackGuard,
    result: super::access::ConnectionResult,
}

type EstablishFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Box<Established>>> + Send>>;

/// One connection's task, sized for its relay: the checks and the connect run in the caller's box (see
/// outbound::connection).
async fn connection(l: Arc<Listener>, establish: EstablishFuture) {
    let Some(Established { client, upstream, peer, dst, local, track, result }) = establish.await.map(|b| *b) else {
        return;
    };
    let pi = &l.pi;
    let counters = result.counters();
    let (rx, tx) = (Tally::new(Some(&counters.received)), Tally::new(Some(&counters.sent)));
    let record = super::access::AccessRecord {
        direction: "inbound",
        src_addr: peer,
        src_workload: None,
        src_identity: None,
        dst_addr: dst,
        dst_hbone_addr: None,
        dst_service: None,
        dst_workload: Some(&local),
        dst_identity_of: None,
        dst_derived: None,
        attempts: 1,
    };
    // A TCP ⇄ TCP relay can be handed to a successor daemon (`handover`).
    let relay = crate::copy::tcp_bidirectional(client, upstream, &rx, &tx);
    let ends = crate::handover::carry::Ends { force: &l.force, close: &track.close };
    let describe = || {
        let fields = super::access::record_fields(&record);
        let kind = crate::handover::ConnKind::InboundPlaintext;
        super::resume::meta(kind, &l.local, &result, fields, (peer, dst, dst))
    };
    let (outcome, (to_app, to_client)) = match crate::handover::carry::carry(&pi.handover, relay, ends, describe).await
    {
        crate::handover::carry::Carried::HandedOver => return,
        crate::handover::carry::Carried::Ended(r, moved) => (r, moved),
    };
    let flag = if track.close.is_cancelled() { "DENY" } else { "CONNECT" };
    result.finish(pi, &record, to_client, to_app, outcome.err().map(|e| (flag, e.to_string())));
}

fn refused(pi: &ProxyInputs, peer: SocketAddr, dst: Option<SocketAddr>, error: String) {
    pi.events.push(Event {
        kind: "access",
        level: Level::Warn,
        message: "connection failed".into(),
        fields: fields! {
            "src.addr" => peer.to_string(),
            "dst.addr" => dst.map(|d| d.to_string()).unwrap_or_default(),
            "direction" => "inbound",
            "error" => error,
        },
    });
}

/// The original destination, authorization and the upstream connect.
async fn establish(l: Arc<Listener>, stream: TcpStream, peer: SocketAddr) -> Option<Box<Established>> {
    let (pi, local_ref) = (&*l.pi, &l.local);
    let started = Instant::now();
    let dst = match crate::socket::original_dst(&stream) {
        Ok(d) => d,
        Err(e) => {
            refused(pi, peer, None, format!("no original destination: {e}"));
            return None;
        }
    };
    if pi.cfg.illegal_ports().contains(&dst.port()) {
        refused(pi, peer, Some(dst), format!("port {} is ztunnel-node's own", dst.port()));
        return None;
    }
    let Some(local) = local_ref.resolve(&pi.state.read()) else {
        refused(pi, peer, Some(dst), format!("local workload {local_ref} is not known"));
        return None;
    };
    let conn = rbac::Connection::new(None, peer.ip(), dst.ip(), dst.port());
    let track = pi.tracker.register(local_ref.clone(), conn.clone(), "TCP");
    let decision = {
        let st = pi.state.read();
        super::authorize_logged(pi, &st, &local, &conn, dst)
    };
    let (source, service) = {
        let st = pi.state.read();
        (
            st.workload_by_addr(&local.network, peer.ip()).cloned(),
            super::inbound::service_for_port(&st, &local, dst.port()),
        )
    };
    let labels = TrafficLabels::new(&ConnectionInfo {
        reporter: Reporter::Destination,
        source: source.as_deref(),
        source_identity: None,
        destination: Some(&local),
        destination_identity: Some(&local.identity()),
        destination_service: service.as_deref(),
        mutual_tls: false,
        derived_source: None,
        derived_destination: None,
    });
    let mut result = super::access::ConnectionResult::open(pi, labels, started);
    if !decision.allowed {
        result.fail("DENY");
        pi.metrics.authz_denied.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut f = fields! {
            "src.addr" => peer.to_string(), "dst.addr" => dst.to_string(), "dst.workload" => local.name.clone(),
            "dst.namespace" => local.namespace.clone(), "dst.identity" => local.identity().to_string(),
            "direction" => "inbound", "error" => format!("connection denied: {}", decision.reason),
        };
        if let Some(p) = decision.policy {
            f.insert("policy".into(), p.into());
        }
        pi.events.push(Event { kind: "access", level: Level::Warn, message: "connection denied".into(), fields: f });
        pi.denials.record(local.uid.clone(), conn, "TCP");
        return None; // dropping the stream closes it: nothing was read, nothing reached the application
    }
    let opts = crate::socket::ConnectOptions {
        bind: pi.preserve_source.then_some(SocketAddr::new(peer.ip(), 0)),
        transparent: pi.preserve_source,
    };
    let upstream = match crate::socket::connect_with(&*pi.sockets, dst, opts, pi.cfg.connect_timeout()).await {
        Ok(u) => u,
        Err(e) => {
            result.fail("CONNECT");
            refused(pi, peer, Some(dst), format!("connecting to {dst}: {e}"));
            return None;
        }
    };
    Some(Box::new(Established { client: stream, upstream, peer, dst, local, track, result }))
}
