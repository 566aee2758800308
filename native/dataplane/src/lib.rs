//! ztunnel-node's dataplane: every byte of HBONE traffic, with no Node.js dependency.
//!
//! `Dataplane` owns the threads every byte runs on and the mesh state they read: the connection silos (`host::silo`:
//! `ztunnel-N`, one single-threaded tokio runtime each, where every listener is served and every connection, HBONE
//! stream and pooled HBONE connection lives) and the control runtime (`ztunnel-control`, one worker: xDS-driven work,
//! the CNI server, the DNS proxies, timers, napi calls). The napi binding is a thin facade over this type; Rust tests
//! drive it directly. ARCHITECTURE.md draws the whole.

mod apply;
pub mod budget;
pub mod ca;
pub mod config;
pub mod copy;
pub mod dns;
pub mod drain;
pub mod error_code;
pub mod events;
pub mod handover;
pub mod identity;
pub mod inpod;
pub mod metrics;
pub mod otlp;
pub mod preview;
pub mod proxy;
pub mod socket;
pub mod tls;

// The mesh model is its own crate (native/mesh: no sockets, no runtime); its modules are reached here as they were.
pub use mesh::{rbac, state, yaml};
// The process concerns are their own crate too (native/host).
pub use host::{alloc, footprint, heap_profile, profile, silo};

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use config::Config;
use drain::Drain;
pub use error_code::ErrorCode;
use events::Events;
use identity::{CertStore, Identity};
use metrics::Metrics;
use proxy::pool::Pool;
use proxy::{LocalRef, ProxyInputs};
use state::{State, StateDelta};

#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("{0}")]
    Config(#[from] config::ConfigError),
    #[error("{0}")]
    State(#[from] state::StateError),
    #[error("{0}")]
    Store(#[from] identity::StoreError),
    #[error("{code}: {0}", code = crate::ErrorCode::InvalidIdentity)]
    Identity(#[from] identity::IdentityError),
    #[error("{code}: {0}", code = crate::ErrorCode::InvalidSpec)]
    Spec(String),
    #[error("{code}: {0}: {1}", code = crate::ErrorCode::BindFailed)]
    Bind(SocketAddr, std::io::Error),
    #[error("{0}")]
    Tls(#[from] tls::TlsError),
    #[error("{code}: {0}", code = crate::ErrorCode::Runtime)]
    Runtime(String),
    #[error("{code}: {0}", code = crate::ErrorCode::InvalidCrl)]
    Crl(String),
    #[error("{0}")]
    Preview(#[from] preview::PreviewError),
}

/// What `addLocalWorkload` takes: the listeners to open for one workload of the local config ("ip:port" each).
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LocalWorkloadSpec {
    pub uid: String,
    /// Inbound HBONE listener (HBONE workloads only).
    #[serde(default)]
    #[cfg_attr(test, ts(as = "Option<String>", optional))]
    pub hbone_addr: Option<SocketAddr>,
    /// SOCKS5 entry for the workload's outbound traffic.
    #[serde(default)]
    #[cfg_attr(test, ts(as = "Option<String>", optional))]
    pub socks_addr: Option<SocketAddr>,
    /// The DNS proxy (UDP and TCP) for the workload.
    #[serde(default)]
    #[cfg_attr(test, ts(as = "Option<String>", optional))]
    pub dns_addr: Option<SocketAddr>,
}

/// What `addLocalWorkload` and `listeners` answer: the addresses actually bound (a port 0 made concrete).
#[derive(Debug, Serialize, Clone)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase")]
pub struct BoundListeners {
    pub uid: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(as = "Option<String>", optional))]
    pub hbone_addr: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(as = "Option<String>", optional))]
    pub socks_addr: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(as = "Option<String>", optional))]
    pub dns_addr: Option<SocketAddr>,
}

/// One entry of `certificates()`: what the admin API shows of an installed certificate.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "InstalledCertificate"))]
#[serde(rename_all = "camelCase")]
struct CertificateOut<'a> {
    /// The SPIFFE id.
    identity: String,
    chain_pem: &'a str,
    roots_pem: &'a str,
    /// Unix seconds.
    #[cfg_attr(test, ts(type = "number"))]
    not_before: i64,
    /// Unix seconds.
    #[cfg_attr(test, ts(type = "number"))]
    not_after: i64,
    serial: &'a str,
}

/// What `authorize()` takes (admin `/debug/authorize`).
#[derive(Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AuthorizeRequest {
    /// The source SPIFFE identity; absent (or empty) for plaintext.
    #[serde(default)]
    #[cfg_attr(test, ts(optional))]
    src_identity: Option<String>,
    #[cfg_attr(test, ts(as = "String"))]
    src_ip: std::net::IpAddr,
    /// The destination workload address and target port, "ip:port".
    #[cfg_attr(test, ts(as = "String"))]
    dst: SocketAddr,
}

/// What `authorize()` answers: the destination workload, the decision, and every policy considered.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "AuthorizeExplanation"))]
struct AuthorizeOut {
    workload: AuthorizeWorkload,
    decision: rbac::Decision,
    considered: Vec<rbac::Considered>,
}

/// The destination workload an answer is about (`authorize()`, `previewAuthz()`).
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
pub struct AuthorizeWorkload {
    #[cfg_attr(test, ts(as = "String"))]
    uid: state::intern::Str,
    #[cfg_attr(test, ts(as = "String"))]
    name: state::intern::Str,
    #[cfg_attr(test, ts(as = "String"))]
    namespace: state::intern::Str,
}

impl AuthorizeWorkload {
    pub fn of(w: &state::Workload) -> AuthorizeWorkload {
        AuthorizeWorkload { uid: w.uid.clone(), name: w.name.clone(), namespace: w.namespace.clone() }
    }
}

/// What `version()` answers.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "NativeVersion"))]
#[serde(rename_all = "camelCase")]
struct VersionOut {
    version: &'static str,
    #[cfg_attr(test, ts(type = "\"aws-lc-rs\" | \"ring\""))]
    crypto_provider: &'static str,
    #[cfg_attr(test, ts(type = "\"release\" | \"debug\""))]
    build_profile: &'static str,
    rust_version: &'static str,
}

/// What `startDedicated` takes: PROXY_WORKLOAD_INFO plus the socket settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DedicatedSpec {
    pub namespace: String,
    pub name: String,
    pub service_account: String,
    pub mark: u32,
    #[serde(default)]
    pub orig_src: inpod::OrigSrc,
}

struct LocalWorkload {
    bound: BoundListeners,
    drain: Drain,
}

pub struct Dataplane {
    rt: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    pi: Arc<ProxyInputs>,
    drain: Drain,
    local: Mutex<HashMap<String, LocalWorkload>>,
    inpod: Mutex<Option<Arc<inpod::WorkloadManager>>>,
    reevaluator: Arc<proxy::reevaluation::Reevaluator>,
    /// Connections a predecessor handed over whose workload has no drain of its own here (`handover_take`).
    adopted: Drain,
    /// What each hand-over this daemon gave ended as (`handover_listen`, read by `next_handover`).
    handovers: tokio::sync::Mutex<Option<tokio::sync::mpsc::Receiver<handover::HandoverReport>>>,
}

impl Dataplane {
    pub fn new(cfg: Config) -> Result<Dataplane, DataplaneError> {
        cfg.validate()?;
        // The DNS proxy checks the names it serves under itself (the config module knows no DNS).
        dns::Domains::new(&cfg.dns.cluster_domain, Some(&cfg.dns.search_domains), "", true)
            .map_err(|problem| config::ConfigError::Range { field: "dns.clusterDomain", problem })?;
        alloc::tune();
        socket::configure(cfg.socket);
        let cfg = Arc::new(cfg);
        // Connections run on the silos (`workerThreads` of them); the control runtime's one worker runs the rest.
        let silos = silo::Silos::start(cfg.worker_threads).map_err(|e| DataplaneError::Runtime(e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ztunnel-control")
            .enable_all()
            .build()
            .map_err(|e| DataplaneError::Runtime(e.to_string()))?;
        let handle = rt.handle().clone();
        let drain = Drain::new();
        let certs = Arc::new(
            CertStore::new(tls::provider_for(cfg.tls).map_err(DataplaneError::Spec)?)
                .with_trust_domains(identity::TrustDomains::new(cfg.trust_domain_aliases.clone())),
        );
        let outliers = Arc::new(proxy::outlier::Outliers::new(cfg.resilience.outliers()));
        let metrics = Arc::new(Metrics::with_crl(certs.revocations().counters.clone()).with_outliers(outliers.clone()));
        let events = Arc::new(Events::default());
        metrics.budget.configure(cfg.stream_buffer_budget, events.clone());
        let pool = Pool::new(cfg.clone(), certs.clone(), metrics.clone(), events.clone(), drain.clone());
        handle.spawn(pool.clone().run_eviction());
        let pi = Arc::new(ProxyInputs {
            cfg,
            state: Arc::new(RwLock::new(State::default())),
            state_changed: Arc::default(),
            certs,
            metrics,
            events,
            pool,
            tracker: Arc::default(),
            denials: Arc::default(),
            sockets: Arc::new(socket::DefaultSockets),
            preserve_source: false,
            silos,
            handover: Arc::default(),
            outliers,
            resets: Arc::default(),
        });
        pi.pool.set_inputs(&pi);
        let reevaluator = Arc::new(proxy::reevaluation::Reevaluator::default());
        handle.spawn(reevaluator.clone().run(pi.clone(), drain.force.clone()));
        Ok(Dataplane {
            rt: Mutex::new(Some(rt)),
            handle,
            pi,
            local: Mutex::new(HashMap::new()),
            inpod: Mutex::new(None),
            reevaluator,
            adopted: drain.child(),
            handovers: tokio::sync::Mutex::new(None),
            drain,
        })
    }

    pub fn from_json(config_json: &str) -> Result<Dataplane, DataplaneError> {
        Dataplane::new(Config::from_json(config_json)?)
    }

    pub fn inputs(&self) -> &Arc<ProxyInputs> {
        &self.pi
    }

    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// config_dump's `staticConfig` without its policies: the last applied local document's workloads and services,
    /// as parsed (ztunnel's LocalConfig shape, `state::dump::LocalDump`).
    pub fn local_dump_json(&self) -> String {
        let st = self.pi.state.read();
        serde_json::to_string(&state::dump::local(&st)).expect("the dump serializes")
    }

    /// config_dump's `{ workloads, services, stagedServices }`, rendered from the state.
    pub fn mesh_dump_json(&self) -> String {
        let st = self.pi.state.read();
        serde_json::to_string(&state::dump::mesh(&st)).expect("the dump serializes")
    }

    /// (state changes submitted for re-evaluation, those judged): tests and benchmarks wait for them to meet.
    pub fn reevaluation_progress(&self) -> (u64, u64) {
        self.reevaluator.progress()
    }

    /// Re-evaluation passes a missing policy's grace period running out has woken (tests wait on this).
    pub fn reevaluation_grace_passes(&self) -> u64 {
        self.reevaluator.grace_passes()
    }

    pub fn create_csr(&self, identity: &str) -> Result<String, DataplaneError> {
        Ok(self.pi.certs.create_csr(&identity.parse::<Identity>()?)?)
    }

    pub fn install_certificate(&self, identity: &str, chain_pem: &str, roots_pem: &str) -> Result<(), DataplaneError> {
        Ok(self.pi.certs.install(&identity.parse::<Identity>()?, chain_pem, roots_pem)?)
    }

    /// Replaces the certificate revocation lists every handshake checks peers against (CRL_PATH's PEM; empty: none).
    /// A PEM that does not parse is refused whole and the lists in force stay. Returns how many lists are in force.
    /// The live HBONE connections the new lists revoke are then closed, on the runtime (`tls::revocation`).
    pub fn set_crls(&self, pem: &str) -> Result<usize, DataplaneError> {
        let set = self.pi.certs.crls().set(pem).map_err(DataplaneError::Crl)?;
        let (pi, n) = (self.pi.clone(), set.len());
        self.handle.spawn(async move {
            let algs = pi.certs.provider().signature_verification_algorithms.all;
            let closed = pi.certs.revocations().sweep(&set, algs);
            if closed > 0 {
                pi.events.log(
                    events::Level::Warn,
                    "HBONE connections closed: a certificate revocation list revokes their peer",
                    fields! {"connections" => closed},
                );
            }
        });
        Ok(n)
    }

    /// Free an identity's key and certificate (the control side forgot it). True if there was one.
    pub fn forget_identity(&self, identity: &str) -> Result<bool, DataplaneError> {
        Ok(self.pi.certs.forget(&identity.parse::<Identity>()?))
    }

    /// The identities handshakes are waiting for (certificates on demand), once there is at least one; empty when
    /// the dataplane shuts down.
    pub async fn next_certificate_requests(&self) -> Vec<String> {
        tokio::select! {
            wants = self.pi.certs.next_wants() => wants.iter().map(Identity::to_string).collect(),
            _ = self.drain.force.cancelled() => Vec::new(),
        }
    }

    /// Bind a local workload's listeners (inbound HBONE and/or SOCKS5). Replaces existing listeners for the uid.
    pub async fn add_local_workload(&self, spec: LocalWorkloadSpec) -> Result<BoundListeners, DataplaneError> {
        let workload = self
            .pi
            .state
            .read()
            .workload(&spec.uid)
            .cloned()
            .ok_or_else(|| DataplaneError::Spec(format!("workload {} is not in the state", spec.uid)))?;
        self.remove_local_workload(&spec.uid).await;
        let drain = self.drain.child();
        let uid: Arc<str> = Arc::from(spec.uid.as_str());
        let mut bound = BoundListeners { uid: spec.uid.clone(), hbone_addr: None, socks_addr: None, dns_addr: None };
        if let Some(addr) = spec.hbone_addr {
            let identity = workload.identity();
            let tls = Arc::new(tls::server_config(self.pi.certs.clone(), identity.clone())?);
            let l = socket::listen(addr).map_err(|e| DataplaneError::Bind(addr, e))?;
            bound.hbone_addr = Some(l.local_addr().map_err(|e| DataplaneError::Bind(addr, e))?);
            self.handle.spawn(proxy::inbound::serve(
                l,
                self.pi.clone(),
                LocalRef::Uid(uid.clone()),
                (tls, identity),
                drain.clone(),
            ));
        }
        if let Some(addr) = spec.socks_addr {
            let l = match socket::listen(addr) {
                Ok(l) => l,
                Err(e) => {
                    drain.drain_now().await;
                    return Err(DataplaneError::Bind(addr, e));
                }
            };
            bound.socks_addr = Some(l.local_addr().map_err(|e| DataplaneError::Bind(addr, e))?);
            // Its domain names resolve as the workload's DNS proxy answers them (a server of its own, not listening).
            let sockets: Arc<dyn socket::SocketFactory> = Arc::new(socket::DefaultSockets);
            let resolver = dns::Server::new(self.pi.clone(), LocalRef::Uid(uid.clone()), sockets, false).ok();
            self.handle.spawn(proxy::socks5::serve(
                l,
                self.pi.clone(),
                LocalRef::Uid(uid.clone()),
                resolver,
                drain.clone(),
            ));
        }
        if let Some(addr) = spec.dns_addr {
            let sockets: Arc<dyn socket::SocketFactory> = Arc::new(socket::DefaultSockets);
            let started = dns::Server::new(self.pi.clone(), LocalRef::Uid(uid.clone()), sockets.clone(), false)
                .and_then(|s| {
                    let _rt = self.handle.enter();
                    s.start(&*sockets, &[addr], socket::ListenOptions { reuse_port: true, transparent: false }, &drain)
                });
            match started {
                Ok(b) => bound.dns_addr = b.first().copied(),
                Err(e) => {
                    drain.drain_now().await;
                    return Err(DataplaneError::Spec(e));
                }
            }
        }
        self.local.lock().insert(spec.uid.clone(), LocalWorkload { bound: bound.clone(), drain });
        Ok(bound)
    }

    /// Stop a local workload's listeners and close its connections at once.
    pub async fn remove_local_workload(&self, uid: &str) -> bool {
        let old = self.local.lock().remove(uid);
        match old {
            Some(w) => {
                w.drain.drain_now().await;
                true
            }
            None => false,
        }
    }

    /// Shared (in-pod) mode: connect to istio-cni over ZDS and serve every pod it hands over. Call once the initial
    /// state is applied (ztunnel connects only after its first xDS sync).
    pub fn start_inpod(&self, config_json: &str) -> Result<(), DataplaneError> {
        let cfg: inpod::InPodConfig =
            serde_json::from_str(config_json).map_err(|e| DataplaneError::Spec(e.to_string()))?;
        let mut slot = self.inpod.lock();
        if slot.is_some() {
            return Err(DataplaneError::Spec("the in-pod manager is already running".into()));
        }
        let m = inpod::WorkloadManager::new(self.pi.clone(), cfg, self.drain.clone());
        self.handle.spawn(m.clone().run());
        *slot = Some(m);
        Ok(())
    }

    /// Dedicated mode: capture listeners for one workload in the daemon's own namespace.
    pub async fn start_dedicated(&self, spec: DedicatedSpec) -> Result<(), DataplaneError> {
        let cfg = inpod::InPodConfig {
            uds: Default::default(),
            mark: spec.mark,
            reuse_port: true,
            orig_src: spec.orig_src,
            dedicated: true,
        };
        let m = inpod::WorkloadManager::new(self.pi.clone(), cfg, self.drain.clone());
        *self.inpod.lock() = Some(m.clone());
        let info = inpod::zds::WorkloadInfo {
            name: spec.name,
            namespace: spec.namespace,
            service_account: spec.service_account,
        };
        m.start_dedicated(info).await.map_err(DataplaneError::Spec)
    }

    /// Shared mode: the daemon's own inbound HBONE listener (`proxy::self_inbound`), under the daemon's drain.
    pub fn start_self_inbound(&self, spec: proxy::self_inbound::SelfInboundSpec) -> Result<SocketAddr, DataplaneError> {
        proxy::self_inbound::start(&self.pi, &spec, &self.drain).map_err(DataplaneError::Spec)
    }

    /// The in-pod manager's state (JSON; `null` when not running).
    pub fn inpod_state_json(&self, connections: bool) -> String {
        match self.inpod.lock().as_ref() {
            Some(m) => m.state_json(connections),
            None => "null".into(),
        }
    }

    /// config_dump's `workloadState` in local mode: each workload served here by uid, in the in-pod manager's shape
    /// (`InPodWorkload`: always `Up`, its listeners being bound), with its live connections when asked.
    pub fn local_state_json(&self, connections: bool) -> String {
        let uids: Vec<Arc<str>> = self.local.lock().keys().map(|u| Arc::from(u.as_str())).collect();
        let state = self.pi.state.read();
        let workloads: Vec<_> = uids.iter().filter_map(|uid| Some((uid, state.workload(uid)?.clone()))).collect();
        drop(state);
        let out: std::collections::BTreeMap<&str, inpod::admin::PodJson<'_>> = workloads
            .iter()
            .map(|(uid, w)| {
                let connections = connections.then(|| {
                    let (inbound, outbound) = self.pi.tracker.connections_of(&LocalRef::Uid((*uid).clone()));
                    inpod::admin::ConnectionsJson { inbound, outbound }
                });
                let info = inpod::admin::InfoJson {
                    name: &w.name,
                    namespace: &w.namespace,
                    service_account: &w.service_account,
                };
                (&***uid, inpod::admin::PodJson { connections, error: None, info, state: inpod::PodPhase::Up })
            })
            .collect();
        serde_json::to_string(&out).unwrap_or_else(|_| "{}".into())
    }

    pub fn listeners(&self) -> Vec<BoundListeners> {
        let mut v: Vec<_> = self.local.lock().values().map(|w| w.bound.clone()).collect();
        v.sort_by(|a, b| a.uid.cmp(&b.uid));
        v
    }

    /// Explain the authorization decision for a hypothetical inbound connection (admin `/debug/authorize`).
    /// Request JSON: `{ srcIdentity?: string, srcIp: string, dst: "ip:port" }`; the destination workload is the one
    /// at `dst`'s IP on this node's network. The same `rbac` functions decide real connections.
    pub fn authorize_json(&self, request: &str) -> Result<String, DataplaneError> {
        let req: AuthorizeRequest = serde_json::from_str(request).map_err(|e| DataplaneError::Spec(e.to_string()))?;
        let src_identity = match req.src_identity.as_deref().filter(|s| !s.is_empty()) {
            Some(s) => Some(s.parse::<Identity>()?),
            None => None,
        };
        let state = self.pi.state.read();
        let w = state
            .workload_by_addr(&self.pi.cfg.network, req.dst.ip())
            .ok_or_else(|| DataplaneError::Spec(format!("no workload has the address {}", req.dst.ip())))?;
        let conn = rbac::Connection::new(src_identity, req.src_ip, req.dst.ip(), req.dst.port())
            .with_trust_domains(self.pi.certs.trust_domains(), &w.trust_domain);
        let explanation = rbac::explain(&state, w, &conn);
        let out = AuthorizeOut {
            workload: AuthorizeWorkload::of(w),
            decision: explanation.decision,
            considered: explanation.considered,
        };
        serde_json::to_string(&out).map_err(|e| DataplaneError::Spec(e.to_string()))
    }

    /// The policy impact preview (admin `POST /debug/authz/preview`, preview.rs): a `PreviewRequest` (JSON) judged
    /// over this node's live inbound connections and recent denials, with the candidates laid over the state and
    /// without applying them. Runs on the runtime: the state's read lock is taken per chunk of connections.
    pub async fn preview_authz_json(&self, request: &str) -> Result<String, DataplaneError> {
        let req: preview::PreviewRequest =
            serde_json::from_str(request).map_err(|e| DataplaneError::Spec(e.to_string()))?;
        let out = preview::preview(&self.pi, req).await?;
        serde_json::to_string(&out).map_err(|e| DataplaneError::Spec(e.to_string()))
    }

    /// The counters' snapshot (`MetricsSnapshot`); `traffic_text`: the traffic counters as OpenMetrics text rather than
    /// JSON rows (the scrape renders them as they are).
    pub fn metrics_json(&self, traffic_text: bool) -> String {
        self.pi.metrics.snapshot_json_with(Some(self.pi.silos.handles()), traffic_text)
    }

    /// The log filter levels of access events, of the DNS proxy's records (target `dns`) and of the dataplane's
    /// other events ("trace".."error", "off"); events below them are not even built.
    pub fn set_event_levels(&self, access: &str, dataplane: &str, dns: &str) -> Result<(), DataplaneError> {
        let parse = |s: &str| {
            events::parse_min_level(s).ok_or_else(|| DataplaneError::Spec(format!("unknown log level {s:?}")))
        };
        self.pi.events.set_min_levels(parse(access)?, parse(dataplane)?);
        self.pi.events.set_dns_level(parse(dns)?);
        Ok(())
    }

    pub fn drain_events_json(&self) -> String {
        self.pi.events.drain_json()
    }

    /// Turns on the OTLP encoding of access records (`otlp.rs`): `resource_json` the daemon's resource attributes (a
    /// JSON object of strings, numbers and booleans), `scope` the instrumentation scope's name, `max_queue` the
    /// records that may wait to be taken.
    pub fn export_otlp(&self, resource_json: &str, scope: &str, max_queue: usize) -> Result<(), DataplaneError> {
        let resource: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(resource_json).map_err(|e| DataplaneError::Spec(format!("OTLP resource: {e}")))?;
        if !self.pi.events.export_otlp(otlp::Exporter::new(&resource, scope, max_queue)) {
            return Err(DataplaneError::Spec("OTLP export is already on".into()));
        }
        Ok(())
    }

    /// Up to `max` queued access records as one OTLP `ExportLogsServiceRequest` (None when none wait, or export is
    /// off), and the records dropped at the full queue since the last take.
    pub fn take_otlp(&self, max: usize) -> (Option<otlp::Batch>, u64) {
        match self.pi.events.otlp() {
            Some(x) => x.take(max),
            None => (None, 0),
        }
    }

    /// The endpoints outlier detection tracks (JSON `OutlierEndpoint[]`, by uid): config_dump's `outliers`.
    pub fn outliers_json(&self) -> String {
        serde_json::to_string(&self.pi.outliers.dump()).expect("serializable")
    }

    pub fn certificates_json(&self) -> String {
        let all = self.pi.certs.all();
        let certs: Vec<_> = all
            .iter()
            .map(|c| CertificateOut {
                identity: c.identity.to_string(),
                chain_pem: &c.chain_pem,
                roots_pem: &c.roots_pem,
                not_before: c.not_before,
                not_after: c.not_after,
                serial: &c.serial,
            })
            .collect();
        serde_json::to_string(&certs).unwrap_or_else(|_| "[]".into())
    }

    /// Predecessor: serve hand-overs on the Unix socket `path` (`handover`); `replace` takes the name from a daemon
    /// that is leaving (see `handover::listen`). Each successor that connects gets one
    /// exchange on a blocking thread; the daemon stops accepting (its graceful drain) as soon as the successor
    /// speaks its version. What each ended as is read with `next_handover`.
    pub fn handover_listen(&self, path: &str, replace: bool) -> Result<(), DataplaneError> {
        let bad = |e: std::io::Error| DataplaneError::Spec(format!("HANDOVER_SOCKET {path}: {e}"));
        let std_listener = handover::listen(std::path::Path::new(path), replace).map_err(bad)?;
        std_listener.set_nonblocking(true).map_err(bad)?;
        let listener = {
            let _rt = self.handle.enter();
            tokio::net::UnixListener::from_std(std_listener).map_err(bad)?
        };
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        if let Ok(mut slot) = self.handovers.try_lock() {
            *slot = Some(rx);
        }
        let (hub, drain, events) = (self.pi.handover.clone(), self.drain.clone(), self.pi.events.clone());
        let node = self.pi.cfg.node_name.clone();
        self.handle.spawn(async move {
            loop {
                let sock = match listener.accept().await {
                    Ok((s, _)) => s,
                    Err(e) => {
                        let f = fields! {"error" => e.to_string()};
                        events.log(events::Level::Warn, "hand-over socket accept failed", f);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let sock = match sock.into_std().and_then(|s| s.set_nonblocking(false).map(|()| s)) {
                    Ok(s) => s,
                    Err(_) => continue,
                };
                let (hub, drain, node) = (hub.clone(), drain.clone(), node.clone());
                let give = tokio::task::spawn_blocking(move || hub.give(sock, &node, || drain.graceful.cancel()));
                if let Ok(report) = give.await {
                    if tx.send(report).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(())
    }

    /// Predecessor: how the next hand-over this daemon gave ended (`None` when not listening).
    pub async fn next_handover(&self) -> Option<handover::HandoverReport> {
        let mut slot = self.handovers.lock().await;
        slot.as_mut()?.recv().await
    }

    /// Successor: take every connection the daemon serving `path` hands over, and carry each on from where it
    /// stopped, spread over the silos. Call once this daemon serves the same workloads (its listeners bound), before
    /// it reports ready. Nobody on `path` is not an error (`found: false`).
    pub async fn handover_take(&self, path: &str) -> handover::HandoverReport {
        let (p, node) = (std::path::PathBuf::from(path), self.pi.cfg.node_name.clone());
        // Each wave is started as it commits, while the take goes on with the next.
        let (tx, mut waves) = tokio::sync::mpsc::unbounded_channel::<(Vec<handover::Received>, handover::Started)>();
        let take = tokio::task::spawn_blocking(move || {
            handover::take(&p, &node, |wave, started| {
                let _ = tx.send((wave, started));
            })
        });
        let handles = self.pi.silos.handles().to_vec();
        // One held here until the last wave: the pass over what was taken in waits for every wave's connections.
        let arrival = handover::Arrival::new(None, self.reevaluator.adopt());
        let mut i = 0usize;
        while let Some((wave, started)) = waves.recv().await {
            for r in wave {
                let drain = match &r.meta.local {
                    handover::LocalJson::Uid { uid } => self.local.lock().get(uid).map(|w| w.drain.clone()),
                    handover::LocalJson::Pod { .. } => None,
                }
                .unwrap_or_else(|| self.adopted.clone());
                let (pi, force, arrival) = (self.pi.clone(), drain.force.clone(), arrival.of(&started));
                let task = async move {
                    match r.hbone {
                        Some(_) => proxy::resume::resume_hbone(pi, force, r, arrival).await,
                        None => proxy::resume::resume(pi, force, r, arrival).await,
                    }
                };
                match handles.get(i % handles.len().max(1)) {
                    // The sockets register with the reactor of the silo the task runs on.
                    Some(h) => {
                        let _rt = h.enter();
                        drain.tasks.spawn(task);
                    }
                    None => {
                        drain.tasks.spawn(task);
                    }
                }
                i += 1;
            }
        }
        match take.await {
            Ok((report, held)) => {
                arrival.hold(held);
                report
            }
            Err(e) => {
                handover::HandoverReport { role: "take".into(), error: Some(e.to_string()), ..Default::default() }
            }
        }
    }

    /// Graceful drain of everything: listeners stop, HBONE servers send GOAWAY, connections get until the deadline.
    pub async fn drain(&self, deadline: Duration) -> bool {
        let mut locals: Vec<Drain> = self.local.lock().values().map(|w| w.drain.clone()).collect();
        locals.push(self.adopted.clone());
        let inpod = self.inpod.lock().clone();
        self.drain.graceful.cancel();
        let pods = async {
            if let Some(m) = inpod {
                m.drain_all(deadline).await;
            }
        };
        // A hand-over under way, or connections carried on after one, are waited for too: a stream whose connection
        // pauses ends its task, and the daemon must not shut down under the connection's offer.
        let hub = self.pi.handover.clone();
        let (results, (), settled) = tokio::join!(
            futures_util::future::join_all(locals.iter().map(|d| d.drain(deadline))),
            pods,
            hub.settled(deadline)
        );
        self.drain.force.cancel();
        if !settled {
            let _ = hub.settled(Duration::from_secs(1)).await;
        }
        settled && results.into_iter().all(|clean| clean)
    }

    /// Stop the runtime and join its threads. Must not be called from inside the runtime.
    pub fn shutdown(&self) {
        if let Some(rt) = self.rt.lock().take() {
            // Not under a hand-over's feet: dropping the tasks would close the sockets it is sending.
            let _quiet = self.pi.handover.quiesce(Duration::from_secs(2));
            self.drain.force.cancel();
            self.pi.silos.shutdown(Duration::from_secs(2));
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        // Runtime::drop would panic if dropped inside an async context; shut it down explicitly, off-runtime.
        // The silos' tasks hold the inputs (and so the silos): stop them explicitly.
        self.pi.silos.stop();
        if let Some(rt) = self.rt.get_mut().take() {
            rt.shutdown_background();
        }
    }
}

pub fn version_json() -> String {
    let v = VersionOut {
        version: env!("CARGO_PKG_VERSION"),
        crypto_provider: tls::CRYPTO_PROVIDER,
        build_profile: if cfg!(debug_assertions) { "debug" } else { "release" },
        rust_version: env!("ZTN_RUSTC_VERSION"),
    };
    serde_json::to_string(&v).unwrap_or_default()
}
