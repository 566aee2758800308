//! The proxies: inbound HBONE (15008), outbound routing and its SOCKS5 entry, the HBONE client pool, and the
//! HTTP/2 glue they share.

pub mod access;
pub mod denials;
pub mod double_hbone;
pub mod h2;
pub mod inbound;
pub mod inbound_passthrough;
pub mod outbound;
pub mod outlier;
pub mod pool;
pub mod proxy_protocol;
pub mod reevaluation;
pub mod resets;
pub mod resume;
pub mod self_inbound;
pub mod socks5;
pub mod tracker;

use parking_lot::RwLock;
use std::sync::Arc;

use crate::config::Config;
use crate::events::Events;
use crate::identity::CertStore;
use crate::metrics::Metrics;
use crate::state::State;

/// Which local workload a proxy serves. Local mode knows the uid; in-pod, istio-cni names the pod (namespace,
/// name, service account) and the workload is looked up in the state on each connection, so it can arrive or change
/// after the proxy started. Never inferred from packet contents, so a pod cannot pass itself off as another.
#[derive(Debug, Clone)]
pub enum LocalRef {
    Uid(Arc<str>),
    Pod { namespace: Arc<str>, name: Arc<str>, service_account: Arc<str>, node: Arc<str> },
}

impl LocalRef {
    pub fn resolve(&self, state: &State) -> Option<Arc<crate::state::Workload>> {
        match self {
            LocalRef::Uid(uid) => state.workload(uid).cloned(),
            LocalRef::Pod { namespace, name, service_account, node } => {
                state.workload_by_name(namespace, name, service_account, node).cloned()
            }
        }
    }
}

impl LocalRef {
    /// A pod named by istio-cni (or the daemon's own), on `node`.
    pub fn pod(namespace: &str, name: &str, service_account: &str, node: &str) -> LocalRef {
        LocalRef::Pod {
            namespace: Arc::from(namespace),
            name: Arc::from(name),
            service_account: Arc::from(service_account),
            node: Arc::from(node),
        }
    }

    /// The identity a pod's inbound presents: its workload's trust domain when known, else `fallback_td` (the
    /// daemon's); its namespace and service account. Uid refs are local mode's, which knows its workloads.
    pub fn pod_identity(&self, state: &State, fallback_td: &str) -> Option<crate::identity::Identity> {
        let LocalRef::Pod { namespace, service_account, .. } = self else { return None };
        let td = self.resolve(state).map(|w| w.trust_domain.to_string()).unwrap_or_else(|| fallback_td.to_string());
        Some(crate::identity::Identity::new(&td, namespace, service_account))
    }

    /// The same local workload (for listing a pod's connections).
    pub fn same(&self, other: &LocalRef) -> bool {
        match (self, other) {
            (LocalRef::Uid(a), LocalRef::Uid(b)) => a == b,
            (LocalRef::Pod { namespace: n1, name: a, .. }, LocalRef::Pod { namespace: n2, name: b, .. }) => {
                n1 == n2 && a == b
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for LocalRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LocalRef::Uid(uid) => f.write_str(uid),
            LocalRef::Pod { namespace, name, .. } => write!(f, "{namespace}/{name}"),
        }
    }
}

/// Accept connections until the drain's graceful signal, on every silo (see `silo`): each silo accepts from its own
/// registration of the listening socket, and each connection runs as a task of the silo that took it, tracked by
/// the drain (so it can wait for it, then force it). Sets TCP_NODELAY and canonicalizes the peer (no `::ffff:` from
/// dual-stack listeners). An accept error (e.g. EMFILE) is counted and logged (the event queue rate-limits it per
/// cause) and backs off briefly instead of spinning. Resolves when every silo has stopped accepting.
pub async fn accept_until_drained<F, Fut>(
    listener: tokio::net::TcpListener,
    pi: &ProxyInputs,
    drain: &crate::drain::Drain,
    handle: F,
) where
    F: Fn(tokio::net::TcpStream, std::net::SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (metrics, events) = (pi.metrics.clone(), pi.events.clone());
    if pi.silos.handles().is_empty() {
        return accept_loop(listener, metrics, events, drain.clone(), handle).await;
    }
    let mut listener = match listener.into_std() {
        Ok(l) => Some(l),
        Err(e) => return log_listener_error(&events, "leaving the control runtime", &e),
    };
    // One descriptor per silo: the others get duplicates, the last the original (a listener costs as many
    // descriptors as there are silos, not one more).
    let last = pi.silos.handles().len();
    pi.silos
        .on_each(|i| {
            let copy = match listener.as_ref() {
                Some(l) if i < last => l.try_clone(),
                _ => listener.take().ok_or_else(|| std::io::Error::other("the listener was handed out")),
            };
            let (metrics, events, drain, handle) = (metrics.clone(), events.clone(), drain.clone(), handle.clone());
            async move {
                // Registers the duplicate with this silo's reactor (it must run on the silo).
                match copy.and_then(tokio::net::TcpListener::from_std) {
                    Ok(l) => accept_loop(l, metrics, events, drain, handle).await,
                    Err(e) => log_listener_error(&events, "registering with a silo", &e),
                }
            }
        })
        .await;
}

fn log_listener_error(events: &Events, step: &str, e: &std::io::Error) {
    events.log(
        crate::events::Level::Error,
        "listener not served",
        crate::fields! {"step" => step.to_string(), "error" => e.to_string()},
    );
}

async fn accept_loop<F, Fut>(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    events: Arc<Events>,
    drain: crate::drain::Drain,
    handle: F,
) where
    F: Fn(tokio::net::TcpStream, std::net::SocketAddr) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, peer)) => (s, crate::socket::canonical(peer)),
                Err(e) => {
                    metrics.accept_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
                    events.log(
                        crate::events::Level::Warn,
                        "accept failed",
                        crate::fields! {"listener" => local, "error" => e.to_string()},
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = drain.graceful.cancelled() => return,
        };
        let _ = crate::socket::accepted(&stream);
        drain.tasks.spawn(handle(stream, peer));
    }
}

/// What every proxy needs, shared by reference.
pub struct ProxyInputs {
    pub cfg: Arc<Config>,
    pub state: Arc<RwLock<State>>,
    /// Woken each time a batch has been applied to `state` (an outbound connection waits on it for its source pod's
    /// workload: `outbound::connect`).
    pub state_changed: Arc<tokio::sync::Notify>,
    pub certs: Arc<CertStore>,
    pub metrics: Arc<Metrics>,
    pub events: Arc<Events>,
    pub pool: Arc<pool::Pool>,
    pub tracker: Arc<tracker::Tracker>,
    /// The last inbound connections authorization refused (the policy impact preview judges them again).
    pub denials: Arc<denials::RecentDenials>,
    /// Where this proxy's sockets are created (the daemon's namespace, or a pod's, marked).
    pub sockets: Arc<dyn crate::socket::SocketFactory>,
    /// Inbound connections to the application keep the client's source IP (IP_TRANSPARENT), in-pod only.
    pub preserve_source: bool,
    /// The connection workers every listener is served on.
    pub silos: Arc<crate::silo::Silos>,
    /// Where live connections meet a successor daemon (one per process).
    pub handover: Arc<crate::handover::Hub>,
    /// The node's outlier detection of outbound endpoints (one per process, shared by every proxy).
    pub outliers: Arc<outlier::Outliers>,
    /// Premature stream resets per peer across connections (one per process, shared by every inbound listener).
    pub resets: Arc<resets::PeerResets>,
}

/// An inbound connection's authorization, logged as ztunnel's `authpol_log!` logs it: each dry-run policy that
/// matched (what enforcing it would do), then the decision with the policy that made it; at debug, or at info with
/// AUTHZ_POLICY_INFO_LOGGING. Nothing is formatted unless the line would be written.
pub fn authorize_logged(
    pi: &ProxyInputs,
    st: &State,
    w: &crate::state::Workload,
    conn: &crate::rbac::Connection,
    dst: std::net::SocketAddr,
) -> crate::rbac::Decision {
    use crate::events::Level;
    let level = if pi.cfg.authz_policy_info_logging { Level::Info } else { Level::Debug };
    let decision = crate::rbac::authorize(st, w, conn);
    if !pi.events.enabled("log", level) {
        return decision;
    }
    let src = || conn.src_identity.as_ref().map(|i| i.to_string()).unwrap_or_default();
    if st.has_dry_run_policies() {
        for (policy, action) in crate::rbac::dry_run_matches(st, w, conn) {
            let f = crate::fields! {"policy" => policy, "action" => format!("{action:?}"), "src.identity" => src(),
            "src.addr" => conn.src_ip.to_string(), "dst.addr" => dst.to_string()};
            pi.events.log(level, "dry-run policy matched", f);
        }
    }
    let message = if decision.allowed {
        "authorization policy allowed the connection"
    } else {
        "authorization policy denied the connection"
    };
    let f = crate::fields! {"policy" => decision.policy.clone().unwrap_or_default(), "reason" => decision.reason.clone(),
    "src.identity" => src(), "src.addr" => conn.src_ip.to_string(), "dst.addr" => dst.to_string(),
    "dst.workload" => w.name.to_string()};
    pi.events.log(level, message, f);
    decision
}
