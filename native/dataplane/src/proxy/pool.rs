//! The HBONE client pool: HTTP/2-over-mTLS connections shared by the CONNECT streams of one key.
//!
//! Invariants:
//! - A connection is only ever shared by streams with the same key: {source identity, expected destination
//!   identities, next-hop address, source IP}, ztunnel's pool key, so a tunnel never carries another identity's
//!   streams. The key is compared whole, not just hashed.
//! - A connection carries at most min(POOL_MAX_STREAMS_PER_CONNECTION, the peer's SETTINGS_MAX_CONCURRENT_STREAMS)
//!   streams; the count is reserved under the key's lock, so concurrent callers never overshoot.
//! - Concurrent first requests for one key create exactly one connection: creation holds a per-key async lock and
//!   re-checks for capacity after taking it.
//! - A connection that received GOAWAY, failed a PING, or whose driver ended is never handed out again.
//! - A key unused for POOL_UNUSED_RELEASE_TIMEOUT is released: the pool drops its handles and h2 closes the
//!   connection once its last stream ends.
//! - Each silo (`crate::silo`) has its own connections: a stream is only ever carried by a connection of the silo
//!   its connection runs on, so the stream's task and the connection's driver share one thread. A key used from
//!   two silos has (at least) one connection in each.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use h2::client::ResponseFuture;
use h2::SendStream;
use http::Request;
use tokio_rustls::TlsConnector;

use super::h2::client::{builder, SendRequest};
use super::h2::keepalive;
use crate::config::Config;
use crate::drain::Drain;
use crate::events::{Events, Level};
use crate::fields;
use crate::identity::{CertStore, Identity};
use crate::metrics::Metrics;
use crate::socket;
use crate::tls::{client_config, ExpectedIdentities};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub src_id: Identity,
    pub dst_ids: ExpectedIdentities,
    pub dst: SocketAddr,
    pub src: IpAddr,
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("no certificate for {0}")]
    NoCertificate(String),
    #[error("connecting to {0}: {1}")]
    Connect(SocketAddr, std::io::Error),
    #[error("TLS handshake with {0}: {1}")]
    Tls(SocketAddr, std::io::Error),
    #[error("HTTP/2 handshake with {0}: {1}")]
    H2Handshake(SocketAddr, h2::Error),
    #[error("HTTP/2 request to {0}: {1}")]
    Request(SocketAddr, h2::Error),
    #[error("TLS configuration: {0}")]
    Config(String),
}

impl PoolError {
    /// The Istio response flag for metrics.
    pub fn response_flag(&self) -> &'static str {
        match self {
            PoolError::NoCertificate(_) => "IDENTITY_ERROR",
            PoolError::Connect(_, e) if e.kind() == std::io::ErrorKind::TimedOut => "NETWORK_POLICY",
            PoolError::Connect(..) => "CONNECT",
            PoolError::Tls(..) | PoolError::Config(_) => "TLS_FAILURE",
            PoolError::H2Handshake(..) | PoolError::Request(..) => "H2_HANDSHAKE_FAILURE",
        }
    }
}

pub struct PooledConn {
    send: SendRequest,
    active: AtomicUsize,
    dead: Arc<AtomicBool>,
    max: usize,
    /// The connection's share of the node's buffer budget.
    buffers: Arc<crate::budget::ConnBuffers>,
    /// Ends the connection's streams: at once when it was shed or drained, CLOSED_STREAM_GRACE after it ended
    /// otherwise (`h2::end_streams`).
    streams_end: tokio_util::sync::CancellationToken,
    /// Fired when a revocation list revokes the server's certificate (the streams then end at once).
    revoked: tokio_util::sync::CancellationToken,
    /// Where its streams stop for a hand-over of the connection.
    gate: Arc<crate::handover::hconn::Gate>,
}

impl PooledConn {
    fn limit(&self) -> usize {
        self.max.min(self.send.current_max_send_streams())
    }

    /// GOAWAY received or the connection failed: h2 reports it through poll_ready without blocking.
    fn is_usable(&self) -> bool {
        if self.dead.load(Ordering::Acquire) {
            return false;
        }
        if self.gate.stopping() {
            return false; // being handed over: a new stream goes on another connection
        }
        if let Some(Err(_)) = self.send.clone().ready().now_or_never() {
            self.dead.store(true, Ordering::Release);
            return false;
        }
        true
    }
}

/// One stream's share of a pooled connection; returns the slot when dropped.
pub struct StreamLease {
    conn: Arc<PooledConn>,
    key_entry: Arc<KeyEntry>,
}

impl StreamLease {
    /// The leased connection's share of the node's buffer budget.
    pub fn buffers(&self) -> &Arc<crate::budget::ConnBuffers> {
        &self.conn.buffers
    }

    /// Where the leased connection's streams stop for its hand-over.
    pub fn gate(&self) -> &Arc<crate::handover::hconn::Gate> {
        &self.conn.gate
    }

    /// The peer refused a stream on the leased connection (or is going away): no new stream goes on it; its open
    /// ones carry on.
    pub fn refused(&self) {
        self.conn.dead.store(true, Ordering::Release);
    }

    /// Whether a revocation list revoked the leased connection's server.
    pub fn revoked(&self) -> bool {
        self.conn.revoked.is_cancelled()
    }

    /// Cancelled when the leased connection's streams must end (`PooledConn::streams_end`).
    pub fn streams_end(&self) -> &tokio_util::sync::CancellationToken {
        &self.conn.streams_end
    }
}

impl Drop for StreamLease {
    fn drop(&mut self) {
        self.conn.active.fetch_sub(1, Ordering::AcqRel);
        *self.key_entry.last_used.lock() = Instant::now();
    }
}

struct KeyEntry {
    create: tokio::sync::Mutex<()>,
    conns: Mutex<Vec<Arc<PooledConn>>>,
    last_used: Mutex<Instant>,
}

impl KeyEntry {
    fn try_reserve(self: &Arc<Self>) -> Option<StreamLease> {
        let mut conns = self.conns.lock();
        conns.retain(|c| c.is_usable());
        for c in conns.iter() {
            if c.active.load(Ordering::Acquire) < c.limit() {
                c.active.fetch_add(1, Ordering::AcqRel);
                *self.last_used.lock() = Instant::now();
                return Some(StreamLease { conn: c.clone(), key_entry: self.clone() });
            }
        }
        None
    }

    fn idle_since(&self) -> Option<Instant> {
        let conns = self.conns.lock();
        if conns.iter().any(|c| c.active.load(Ordering::Acquire) > 0) {
            return None;
        }
        Some(*self.last_used.lock())
    }
}

type Keys = HashMap<PoolKey, Arc<KeyEntry>>;

pub struct Pool {
    cfg: Arc<Config>,
    sockets: Arc<dyn crate::socket::SocketFactory>,
    certs: Arc<CertStore>,
    metrics: Arc<Metrics>,
    events: Arc<Events>,
    drain: Drain,
    /// One key table per silo (index 0: callers off the silos).
    keys: Box<[Mutex<Keys>]>,
    next_id: AtomicU64,
    /// The proxy's inputs, once it has them: a pooled connection can then be handed to a successor daemon.
    inputs: std::sync::OnceLock<std::sync::Weak<crate::proxy::ProxyInputs>>,
}

impl Pool {
    pub fn new(
        cfg: Arc<Config>,
        certs: Arc<CertStore>,
        metrics: Arc<Metrics>,
        events: Arc<Events>,
        drain: Drain,
    ) -> Arc<Pool> {
        Pool::with_sockets(cfg, Arc::new(crate::socket::DefaultSockets), certs, metrics, events, drain)
    }

    pub fn with_sockets(
        cfg: Arc<Config>,
        sockets: Arc<dyn crate::socket::SocketFactory>,
        certs: Arc<CertStore>,
        metrics: Arc<Metrics>,
        events: Arc<Events>,
        drain: Drain,
    ) -> Arc<Pool> {
        let shards = crate::silo::Silos::shards(cfg.worker_threads);
        Arc::new(Pool {
            keys: (0..shards).map(|_| Mutex::new(HashMap::new())).collect(),
            cfg,
            sockets,
            certs,
            metrics,
            events,
            drain,
            next_id: AtomicU64::new(0),
            inputs: std::sync::OnceLock::new(),
        })
    }

    /// The inputs of the proxy this pool serves (they hold the pool, so a weak reference): its connections take part
    /// in hand-overs from then on.
    pub fn set_inputs(&self, pi: &Arc<crate::proxy::ProxyInputs>) {
        let _ = self.inputs.set(Arc::downgrade(pi));
    }

    /// Release keys idle for longer than the configured timeout. Run periodically by `run_eviction`.
    pub fn evict_idle(&self, now: Instant) -> usize {
        let timeout = Duration::from_millis(self.cfg.pool_unused_release_timeout_ms);
        let mut released = 0;
        for shard in self.keys.iter() {
            let mut keys = shard.lock();
            let before = keys.len();
            keys.retain(|_, e| match e.idle_since() {
                Some(t) => now.duration_since(t) < timeout,
                None => true,
            });
            released += before - keys.len();
        }
        released
    }

    pub async fn run_eviction(self: Arc<Self>) {
        let timeout = Duration::from_millis(self.cfg.pool_unused_release_timeout_ms);
        let period = (timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => { self.evict_idle(Instant::now()); }
                _ = self.drain.graceful.cancelled() => {
                    // Drop every handle: h2 closes each connection once its streams end.
                    self.keys.iter().for_each(|shard| shard.lock().clear());
                    return;
                }
            }
        }
    }

    /// Number of live pooled connections (for tests and the admin API).
    pub fn connection_count(&self) -> usize {
        let count =
            |keys: &Keys| keys.values().map(|e| e.conns.lock().iter().filter(|c| c.is_usable()).count()).sum::<usize>();
        self.keys.iter().map(|shard| count(&shard.lock())).sum()
    }

    /// The calling silo's entry for `key`.
    fn entry(&self, key: &PoolKey) -> Arc<KeyEntry> {
        let mut keys = self.keys[crate::silo::current().min(self.keys.len() - 1)].lock();
        keys.entry(key.clone())
            .or_insert_with(|| {
                Arc::new(KeyEntry {
                    create: tokio::sync::Mutex::new(()),
                    conns: Mutex::new(Vec::new()),
                    last_used: Mutex::new(Instant::now()),
                })
            })
            .clone()
    }

    /// Get a stream slot on a connection for `key`, creating the connection if none has room.
    pub async fn checkout(&self, key: &PoolKey) -> Result<StreamLease, PoolError> {
        let entry = self.entry(key);
        if let Some(lease) = entry.try_reserve() {
            return Ok(lease);
        }
        let _creating = entry.create.lock().await;
        if let Some(lease) = entry.try_reserve() {
            return Ok(lease);
        }
        let conn = self.connect(key).await?;
        conn.active.store(1, Ordering::Release);
        entry.conns.lock().push(conn.clone());
        *entry.last_used.lock() = Instant::now();
        Ok(StreamLease { conn, key_entry: entry.clone() })
    }

    /// Open a CONNECT stream for `key`. A connection found dead on use (GOAWAY between checkout and send) is
    /// marked and the request retried once on a fresh checkout.
    pub async fn send_connect(
        &self,
        key: &PoolKey,
        make_req: &(dyn Fn() -> Request<()> + Sync),
    ) -> Result<(ResponseFuture, SendStream<Bytes>, StreamLease), PoolError> {
        let mut last_err = None;
        for _ in 0..2 {
            let lease = self.checkout(key).await?;
            let ready = lease.conn.send.clone().ready().await;
            let mut send = match ready {
                Ok(s) => s,
                Err(e) => {
                    lease.conn.dead.store(true, Ordering::Release);
                    last_err = Some(PoolError::Request(key.dst, e));
                    continue;
                }
            };
            match send.send_request(make_req(), false) {
                Ok((resp, stream)) => return Ok((resp, stream, lease)),
                Err(e) => {
                    lease.conn.dead.store(true, Ordering::Release);
                    last_err = Some(PoolError::Request(key.dst, e));
                }
            }
        }
        Err(last_err.expect("loop ran"))
    }

    async fn connect(&self, key: &PoolKey) -> Result<Arc<PooledConn>, PoolError> {
        // On demand: a missing certificate is asked for and waited for, within the connect timeout.
        let cert = match self.certs.get(&key.src_id) {
            Some(c) => c,
            None => self
                .certs
                .wait_for(&key.src_id, self.cfg.connect_timeout())
                .await
                .ok_or_else(|| PoolError::NoCertificate(key.src_id.to_string()))?,
        };
        let tls_cfg =
            client_config(&cert, key.dst_ids.clone(), &self.certs).map_err(|e| PoolError::Config(e.to_string()))?;
        // Pool connections never spoof the source; they bind the workload IP only in local mode.
        let opts = socket::ConnectOptions {
            bind: self.cfg.bind_source_ip.then_some(std::net::SocketAddr::new(key.src, 0)),
            transparent: false,
        };
        let tcp = socket::connect_with(&*self.sockets, key.dst, opts, self.cfg.connect_timeout())
            .await
            .map_err(|e| PoolError::Connect(key.dst, e))?;
        // No SNI is sent (enable_sni = false); the name only satisfies the API.
        let server_name = rustls::pki_types::ServerName::IpAddress(key.dst.ip().into());
        // The handshake's traffic secrets are caught for a hand-over (`handover::tls13`).
        let secrets = Arc::new(Mutex::new(crate::handover::tls13::Secrets::default()));
        let mut tls = tokio::time::timeout(
            self.cfg.handshake_timeout(),
            crate::handover::tls13::capture(
                secrets.clone(),
                TlsConnector::from(Arc::new(tls_cfg)).connect(server_name, crate::tls::tls_socket(tcp)),
            ),
        )
        .await
        .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")))
        .map_err(|e| {
            self.metrics.tls_handshake_failures_outbound.fetch_add(1, Ordering::Relaxed);
            if crate::tls::revocation::is_revoked_error(&e) {
                self.certs.revocations().refused(crate::tls::revocation::Peer::Server);
            }
            PoolError::Tls(key.dst, e)
        })?;
        tls.get_mut().1.set_buffer_limit(Some(crate::tls::TLS_SEND_BUFFER));
        // A revocation list that revokes the server closes the connection and its streams (`tls::revocation`).
        let revocation = self.certs.watch_revocation(
            tls.get_ref().1.peer_certificates(),
            Some(cert.roots.clone()),
            crate::tls::revocation::Peer::Server,
        );
        let revoked = revocation.revoked.clone();
        let buffers = self.metrics.budget.connection(key.dst);
        // The tap under h2 follows the HTTP/2 state a hand-over carries (`handover::http2`).
        let (tap, session) = crate::handover::http2::Tap::new(tls, true);
        let tls = crate::budget::Metered::new(tap, buffers.clone(), true);
        let (send, mut conn) =
            builder(&self.cfg).handshake::<_, Bytes>(tls).await.map_err(|e| PoolError::H2Handshake(key.dst, e))?;
        let gate: Arc<crate::handover::hconn::Gate> = Arc::default();
        let (inputs, gate2, window) =
            (self.inputs.get().cloned(), gate.clone(), self.cfg.http2.connection_window_size as i64);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let dead = Arc::new(AtomicBool::new(false));
        let ping = conn.ping_pong();
        let streams_end = tokio_util::sync::CancellationToken::new();
        let (metrics, events, force, dst, dead2, shed, streams_end2) = (
            self.metrics.clone(),
            self.events.clone(),
            self.drain.force.clone(),
            key.dst,
            dead.clone(),
            buffers.shed.clone(),
            streams_end.clone(),
        );
        metrics.tunnels_opened_outbound.fetch_add(1, Ordering::Relaxed);
        metrics.tunnels_active_outbound.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            use crate::handover::hconn::{offer_connection, Offered};
            let ping_fut = std::pin::pin!(async {
                match ping {
                    Some(p) => keepalive(p).await,
                    None => std::future::pending().await,
                }
            });
            let mut ping_fut = ping_fut;
            let inputs = inputs.and_then(|w| w.upgrade());
            // A hand-over takes the connection whole: its description crosses with it; it pauses once a round.
            let ticket = inputs.as_ref().map(|pi| pi.handover.ticket());
            let (mut described, mut declined, mut kept) = (None, None, None);
            let why = loop {
                let round = ticket.as_ref().map(|t| t.round());
                let generation = round.as_ref().map(|r| r.generation);
                let describe = round.as_ref().map(|r| r.describe.clone());
                let pause = round.as_ref().map(|r| r.pause.clone());
                tokio::select! {
                    r = &mut conn => break r.err().map(|e| e.to_string()),
                    why = &mut ping_fut => break Some(why.to_string()),
                    _ = force.cancelled() => break Some("drained".to_string()),
                    _ = shed.cancelled() => break Some("shed: the node's buffered stream data is over its budget".to_string()),
                    _ = revocation.revoked.cancelled() => {
                        dead2.store(true, Ordering::Release);
                        events.log(
                            Level::Warn,
                            "HBONE pool connection closed: the server's certificate was revoked",
                            fields! {"dst.addr" => dst.to_string(), "id" => id},
                        );
                        break Some("the server's certificate was revoked".to_string());
                    }
                    _ = cancelled(describe.as_ref()), if described != generation => {
                        described = generation;
                        if let Some(t) = &ticket {
                            t.described_later(gate2.streams());
                        }
                    }
                    _ = cancelled(pause.as_ref()), if declined != generation => {
                        let (Some(t), Some(round)) = (&ticket, &round) else { continue };
                        let poll_conn = |cx: &mut std::task::Context<'_>| match std::future::Future::poll(std::pin::Pin::new(&mut conn), cx) {
                            std::task::Poll::Ready(_) => std::task::Poll::Ready(false),
                            std::task::Poll::Pending => std::task::Poll::Pending,
                        };
                        match offer_connection((t, round), &gate2, &session, &secrets, poll_conn, (window, &revocation), &events).await {
                            Offered::Declined => declined = generation,
                            Offered::Gone => break Some("handed over".to_string()),
                            Offered::Kept(k) => {
                                kept = Some(*k);
                                break Some("carried on here after a hand-over that failed".to_string());
                            }
                        }
                    }
                }
            };
            drop(ticket);
            if let (Some((engine, ids, metas)), Some(pi)) = (kept, &inputs) {
                dead2.store(true, Ordering::Release);
                drop(conn);
                super::resume::run_streams(pi.clone(), force.clone(), engine, ids, metas, None).await;
            }
            dead2.store(true, Ordering::Release);
            let revoked = revocation.revoked.is_cancelled();
            drop(revocation);
            super::h2::end_streams(streams_end2, shed.is_cancelled() || revoked, force);
            metrics.tunnels_active_outbound.fetch_sub(1, Ordering::Relaxed);
            if let Some(why) = why {
                events.log(
                    Level::Debug,
                    "HBONE pool connection ended",
                    fields! {"dst.addr" => dst.to_string(), "id" => id, "reason" => why},
                );
            }
        });
        Ok(Arc::new(PooledConn {
            send,
            active: AtomicUsize::new(0),
            dead,
            max: self.cfg.pool_max_streams_per_connection as usize,
            buffers,
            streams_end,
            revoked,
            gate,
        }))
    }
}

/// Waits for `token`, or forever without one.
async fn cancelled(token: Option<&tokio_util::sync::CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}
