//! The daemon's own inbound HBONE listener (shared mode): ztunnel's "self-proxy" (`create_ztunnel_self_proxy_listener`),
//! so other nodes can reach this daemon's own ports, its metrics above all, through the mesh with its policies
//! applied, as they reach any pod's.
//!
//! - `[::]:15008` (else `0.0.0.0:15008`) in the daemon's own network namespace, for the daemon's pod as a workload
//!   (POD_NAMESPACE, POD_NAME, SERVICE_ACCOUNT), whose identity it presents; authorization is that workload's, as
//!   WDS describes it (an unknown workload is refused, as in-pod).
//! - A CONNECT reaches the daemon's pod address at its port, the source never spoofed (ztunnel's
//!   `disable_inbound_freebind`). Of the daemon's own ports only those the caller allows (the stats and readiness
//!   servers) may be reached; the proxies' ports and the admin stay refused, as everywhere.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use serde::Deserialize;

use super::{LocalRef, ProxyInputs};
use crate::config::HBONE_PORT;
use crate::drain::Drain;
use crate::socket::{listen_with, ListenOptions};

/// What `startSelfInbound` takes: the daemon's own pod, and which of its own ports the mesh may reach.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SelfInboundSpec {
    pub namespace: String,
    pub name: String,
    pub service_account: String,
    /// The daemon's own ports peers may reach through it (the stats and readiness servers').
    pub reachable_ports: Vec<u16>,
    /// SO_REUSEPORT, so a successor daemon binds beside this one (INPOD_PORT_REUSE).
    pub reuse_port: bool,
}

/// Binds the listener and serves it under `drain`; the address bound, or why it could not be.
pub fn start(base: &Arc<ProxyInputs>, spec: &SelfInboundSpec, drain: &Drain) -> Result<SocketAddr, String> {
    let mut cfg = (*base.cfg).clone();
    cfg.own_ports.retain(|p| !spec.reachable_ports.contains(p));
    let pi = Arc::new(ProxyInputs {
        cfg: Arc::new(cfg),
        state: base.state.clone(),
        state_changed: base.state_changed.clone(),
        certs: base.certs.clone(),
        metrics: base.metrics.clone(),
        events: base.events.clone(),
        pool: base.pool.clone(),
        tracker: base.tracker.clone(),
        denials: base.denials.clone(),
        sockets: base.sockets.clone(),
        preserve_source: false,
        silos: base.silos.clone(),
        handover: base.handover.clone(),
        outliers: base.outliers.clone(),
        resets: base.resets.clone(),
    });
    let local = LocalRef::pod(&spec.namespace, &spec.name, &spec.service_account, &base.cfg.node_name);
    let identity = local.pod_identity(&base.state.read(), &base.cfg.trust_domain).ok_or("not a pod")?;
    let tls = Arc::new(crate::tls::server_config(base.certs.clone(), identity.clone()).map_err(|e| e.to_string())?);
    let opts = ListenOptions { reuse_port: spec.reuse_port, transparent: false };
    let any6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), HBONE_PORT);
    let any4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), HBONE_PORT);
    let listener = listen_with(&*pi.sockets, any6, opts)
        .or_else(|_| listen_with(&*pi.sockets, any4, opts))
        .map_err(|e| format!("binding the daemon's own HBONE port {HBONE_PORT}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(super::inbound::serve(listener, pi, local, (tls, identity), drain.clone()));
    Ok(addr)
}
