//! Starting one pod's proxies inside its network namespace: the outbound capture (15001), inbound plaintext (15006)
//! and inbound HBONE (15008) listeners, SOCKS5 (15080, loopback) when enabled, and the DNS proxy when enabled, all
//! on sockets made in the pod's namespace and carrying the in-pod mark, with one HBONE pool per pod.
//!
//! The manager reaches this through `PodProxies`, so its state machine can be driven with a stand-in that binds
//! nothing (the unit tests). Every task a start spawns is under the drain it returns; draining it stops the pod's
//! proxies.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::netns::{InPodSockets, NetNs};
use super::zds::WorkloadInfo;
use super::{InPodConfig, OrigSrc};
use crate::config::{HBONE_PORT, INBOUND_PLAINTEXT_PORT, OUTBOUND_CAPTURE_PORT, SOCKS5_PORT};
use crate::drain::Drain;
use crate::proxy::pool::Pool;
use crate::proxy::{LocalRef, ProxyInputs};
use crate::socket::{listen_with, ListenOptions, SocketFactory};

/// Starts a pod's proxies in its namespace. `Ok` carries the drain that stops them; `Err` is the text the ZDS ack
/// and the admin view carry.
pub trait PodProxies: Send + Sync {
    fn start<'a>(
        &'a self,
        uid: &'a str,
        info: &'a WorkloadInfo,
        netns: Arc<NetNs>,
    ) -> BoxFuture<'a, Result<Drain, String>>;
}

/// The real proxies: listeners and DNS inside the pod's namespace, under a child of the daemon's drain.
pub(super) struct InPodProxies {
    pub(super) base: Arc<ProxyInputs>,
    pub(super) cfg: InPodConfig,
    pub(super) daemon_drain: Drain,
}

impl PodProxies for InPodProxies {
    fn start<'a>(
        &'a self,
        uid: &'a str,
        info: &'a WorkloadInfo,
        netns: Arc<NetNs>,
    ) -> BoxFuture<'a, Result<Drain, String>> {
        Box::pin(self.start_proxies(uid, info, netns))
    }
}

impl InPodProxies {
    async fn start_proxies(&self, uid: &str, info: &WorkloadInfo, netns: Arc<NetNs>) -> Result<Drain, String> {
        let base = &self.base;
        let sockets: Arc<dyn SocketFactory> = Arc::new(InPodSockets { netns: netns.clone(), mark: self.cfg.mark });
        let drain = self.daemon_drain.child();
        let transparent = match self.cfg.orig_src {
            OrigSrc::Never => false,
            mode => {
                let works = probe_transparent(&*sockets);
                if !works && mode == OrigSrc::Required {
                    return Err("ENABLE_ORIG_SRC=true but IP_TRANSPARENT is not permitted".into());
                }
                works
            }
        };
        let pool = Pool::with_sockets(
            base.cfg.clone(),
            sockets.clone(),
            base.certs.clone(),
            base.metrics.clone(),
            base.events.clone(),
            drain.clone(),
        );
        tokio::spawn(pool.clone().run_eviction());
        let pi = Arc::new(ProxyInputs {
            cfg: base.cfg.clone(),
            state: base.state.clone(),
            state_changed: base.state_changed.clone(),
            certs: base.certs.clone(),
            metrics: base.metrics.clone(),
            events: base.events.clone(),
            pool,
            tracker: base.tracker.clone(),
            denials: base.denials.clone(),
            sockets: sockets.clone(),
            preserve_source: transparent,
            silos: base.silos.clone(),
            handover: base.handover.clone(),
            outliers: base.outliers.clone(),
            resets: base.resets.clone(),
        });
        pi.pool.set_inputs(&pi);
        let local = LocalRef::pod(&info.namespace, &info.name, &info.service_account, &base.cfg.node_name);
        // The trust domain comes from the pod's workload when known, else the daemon's.
        let identity = local.pod_identity(&base.state.read(), &base.cfg.trust_domain).ok_or("not a pod")?;
        let tls = Arc::new(crate::tls::server_config(base.certs.clone(), identity.clone()).map_err(|e| e.to_string())?);
        let opts = ListenOptions { reuse_port: self.cfg.reuse_port, transparent };
        let bind = |port: u16, loopback: bool| -> Result<tokio::net::TcpListener, String> {
            let (v6, v4) = if loopback {
                (IpAddr::V6(Ipv6Addr::LOCALHOST), IpAddr::V4(Ipv4Addr::LOCALHOST))
            } else {
                (IpAddr::V6(Ipv6Addr::UNSPECIFIED), IpAddr::V4(Ipv4Addr::UNSPECIFIED))
            };
            // Dual-stack [::] when the pod has IPv6, else 0.0.0.0.
            if !loopback {
                if let Ok(l) = listen_with(&*sockets, SocketAddr::new(v6, port), opts) {
                    return Ok(l);
                }
            }
            listen_with(&*sockets, SocketAddr::new(v4, port), opts)
                .map_err(|e| format!("binding port {port} in {uid}'s netns: {e}"))
        };
        // The pod's DNS proxy resolver: its listeners when DNS is on, and the SOCKS5 entry's domain names.
        let dns = crate::dns::Server::new(pi.clone(), local.clone(), sockets.clone(), self.cfg.dedicated)?;
        // ENABLE_PROXY=false (ztunnel's DNS-only mode): none of the proxies, the DNS proxy alone.
        if base.cfg.proxy_enabled {
            let outbound = bind(OUTBOUND_CAPTURE_PORT, false)?;
            let inbound_plain = bind(INBOUND_PLAINTEXT_PORT, false)?;
            let hbone = bind(HBONE_PORT, false)?;
            let socks = if base.cfg.socks5_enabled { Some(bind(SOCKS5_PORT, true)?) } else { None };
            tokio::spawn(crate::proxy::outbound::serve_capture(outbound, pi.clone(), local.clone(), drain.clone()));
            tokio::spawn(crate::proxy::inbound_passthrough::serve(
                inbound_plain,
                pi.clone(),
                local.clone(),
                drain.clone(),
            ));
            tokio::spawn(crate::proxy::inbound::serve(
                hbone,
                pi.clone(),
                local.clone(),
                (tls, identity),
                drain.clone(),
            ));
            if let Some(l) = socks {
                tokio::spawn(crate::proxy::socks5::serve(
                    l,
                    pi.clone(),
                    local.clone(),
                    Some(dns.clone()),
                    drain.clone(),
                ));
            }
        }
        if base.cfg.dns.enabled {
            let dns_opts = ListenOptions { reuse_port: self.cfg.reuse_port, transparent: false };
            let addrs = base.cfg.dns.listen_addrs()?;
            let localhost = addrs.len() == 2;
            for (i, addr) in addrs.iter().enumerate() {
                match dns.start(&*sockets, std::slice::from_ref(addr), dns_opts, &drain) {
                    Ok(_) => {}
                    // localhost's ::1 only where the pod has IPv6 on lo (ztunnel's `maybe_downgrade_ipv6`).
                    Err(_) if localhost && i == 1 => {}
                    Err(e) => {
                        drain.drain_now().await;
                        return Err(format!("{uid}: {e}"));
                    }
                }
            }
        }
        Ok(drain)
    }
}

/// Whether IP_TRANSPARENT can be set on a socket of this factory (needs CAP_NET_ADMIN in the pod's namespace).
fn probe_transparent(sockets: &dyn SocketFactory) -> bool {
    match sockets.tcp(socket2::Domain::IPV4) {
        Ok(s) => s.set_ip_transparent_v4(true).is_ok(),
        Err(_) => false,
    }
}
