//! The proxies: inbound HBONE (15008), outbound routing and its SOCKS5 entry, the HBONE client pool, and the
//! HTTP/2 glue they share.

pub mod h2;
pub mod inbound;
pub mod outbound;
pub mod pool;
pub mod socks5;
pub mod tracker;

use std::sync::{Arc, RwLock};

use crate::config::Config;
use crate::events::Events;
use crate::identity::CertStore;
use crate::metrics::Metrics;
use crate::state::State;

/// What every proxy needs, shared by reference.
pub struct ProxyInputs {
    pub cfg: Arc<Config>,
    pub state: Arc<RwLock<State>>,
    pub certs: Arc<CertStore>,
    pub metrics: Arc<Metrics>,
    pub events: Arc<Events>,
    pub pool: Arc<pool::Pool>,
    pub tracker: Arc<tracker::Tracker>,
    /// Where this proxy's sockets are created (the daemon's namespace, or a pod's, marked).
    pub sockets: Arc<dyn crate::socket::SocketFactory>,
    /// Inbound connections to the application keep the client's source IP (IP_TRANSPARENT), in-pod only.
    pub preserve_source: bool,
}
