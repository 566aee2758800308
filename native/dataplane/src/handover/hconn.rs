//! The predecessor's side of an HBONE connection's hand-over: its streams stop at the connection's word (`Gate`),
//! and the connection, brought to rest, leaves h2 and rustls and is offered whole (`offer_connection`).
//!
//! Until the session leaves rustls everything can be undone: the streams carry on where they stopped, h2 is given
//! what was read past its last frame, and the connection is declined (it carries on here). After that there is no way
//! back to rustls and h2: a connection the successor does not take (the exchange failed later) is carried on here by
//! `hbone::Engine`, as a successor would, so either way it is not cut.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::hbone::{self, ConnParcel, Engine, Session, StreamParcel};
use super::{http2, tls13, ConnMeta, HboneOffer, Parcel, Round, Ticket, Verdict};
use crate::copy::{H2Parts, H2Relay};

/// How long the streams get to stop, h2 to come to rest, and the record in flight to end: a connection not at
/// rest by then is declined (it carries on here, and the exchange goes on without it).
pub const REST_WAIT: Duration = Duration::from_millis(500);

/// What a stopped stream is told.
pub enum Word {
    /// Carry on where it stopped.
    Resume,
    /// Hand its relay's state over, and end without a record (whoever carries the connection on writes it).
    Give(oneshot::Sender<H2Parts>),
}

struct Parked {
    meta: ConnMeta,
    word: oneshot::Sender<Word>,
}

/// What the streams of one HBONE connection and its task share for a hand-over.
#[derive(Default)]
pub struct Gate {
    /// Cancelled when the connection asks its streams to stop; a fresh one once they resume.
    stop: Mutex<CancellationToken>,
    /// Streams copying, and streams being set up (a connection with one is not at rest).
    relays: AtomicUsize,
    setup: AtomicUsize,
    parked: Mutex<Vec<Parked>>,
    arrived: tokio::sync::Notify,
}

/// Counts a stream in one of the gate's counters while it lives.
pub struct Counted {
    gate: Arc<Gate>,
    setup: bool,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let c = if self.setup { &self.gate.setup } else { &self.gate.relays };
        c.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Gate {
    /// A stream being set up (authorized, connected, answered), until dropped.
    pub fn setting_up(self: &Arc<Self>) -> Counted {
        self.setup.fetch_add(1, Ordering::AcqRel);
        Counted { gate: self.clone(), setup: true }
    }

    fn copying(self: &Arc<Self>) -> Counted {
        self.relays.fetch_add(1, Ordering::AcqRel);
        Counted { gate: self.clone(), setup: false }
    }

    /// Its streams, copying or being set up.
    pub fn streams(&self) -> usize {
        self.relays.load(Ordering::Acquire) + self.setup.load(Ordering::Acquire)
    }

    /// Its streams are stopping or stopped for a hand-over (a new stream must not start on the connection).
    pub fn stopping(&self) -> bool {
        self.stop.lock().is_cancelled()
    }

    fn stopped(&self) -> CancellationToken {
        self.stop.lock().clone()
    }

    async fn park(&self, meta: ConnMeta) -> Word {
        let (tx, rx) = oneshot::channel();
        self.parked.lock().push(Parked { meta, word: tx });
        self.arrived.notify_one();
        rx.await.unwrap_or(Word::Resume)
    }

    /// Every stopped stream carries on, and the next stop is a fresh token.
    fn resume_all(&self) {
        *self.stop.lock() = CancellationToken::new();
        for p in self.parked.lock().drain(..) {
            let _ = p.word.send(Word::Resume);
        }
    }

    /// Ask the streams to stop, and wait (`REST_WAIT`) until every one copying has and none is being set up.
    async fn stop_all(&self) -> bool {
        self.stop.lock().cancel();
        let deadline = tokio::time::Instant::now() + REST_WAIT;
        loop {
            let arrived = self.arrived.notified();
            let all = self.parked.lock().len() >= self.relays.load(Ordering::Acquire);
            if all && self.setup.load(Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                // One last look (a stream set up may have ended meanwhile without a word).
                let all = self.parked.lock().len() >= self.relays.load(Ordering::Acquire);
                return all && self.setup.load(Ordering::Acquire) == 0;
            }
        }
    }
}

/// How a stream's copy phase on a connection that can be handed over ended.
pub enum Carried {
    Ended(io::Result<()>),
    /// Handed over: send the relay's state (`H2Relay::into_parts`) and end without a record (whoever carries the
    /// connection on writes it).
    Give(oneshot::Sender<H2Parts>),
}

/// A stream's copy phase on a connection that can be handed over: the relay runs until it ends, `ends` fires (the
/// stream's other reasons to end: drain, policy, the connection's end), or the connection asks it to stop; then it
/// waits for the word, and carries on or is given away. The relay and `ends` are the caller's (built in place in
/// its task: a value moved into this future would take room twice).
pub async fn carry_stream(
    gate: &Arc<Gate>,
    relay: &mut H2Relay<'_, '_>,
    mut ends: std::pin::Pin<&mut impl std::future::Future<Output = io::Error>>,
    describe: impl Fn() -> ConnMeta,
) -> Carried {
    let _counted = gate.copying();
    loop {
        let stop = gate.stopped();
        tokio::select! {
            r = &mut *relay => return Carried::Ended(r.map(|_| ())),
            e = &mut ends => return Carried::Ended(Err(e)),
            _ = stop.cancelled() => {}
        }
        // Boxed: the wait exists only while stopped; the stream's future stays small.
        match Box::pin(gate.park(describe())).await {
            Word::Resume => continue,
            Word::Give(tx) => return Carried::Give(tx),
        }
    }
}

/// What became of a connection asked to pause.
pub enum Offered {
    /// Not at rest in time, or nothing to hand over: it carries on here as before.
    Declined,
    /// The successor has it: end without a word on the wire.
    Gone,
    /// It left h2 but the successor did not take it: carry it on here (`proxy::resume::run_streams`).
    Kept(Box<(Engine, Vec<u32>, Vec<ConnMeta>)>),
}

/// Bring one HBONE connection to rest and offer it in `round` (its streams stopped, h2 at rest through
/// `poll_conn`, the record in flight finished; then the session taken and the whole connection offered).
pub async fn offer_connection<S: Session>(
    (ticket, round): (&Ticket, &Round),
    gate: &Arc<Gate>,
    shared: &http2::Shared<S>,
    logged: &Mutex<tls13::Secrets>,
    poll_conn: impl FnMut(&mut Context<'_>) -> Poll<bool>,
    (conn_window, peer): (i64, &crate::tls::revocation::Watch),
    events: &crate::events::Events,
) -> Offered {
    let decline = || async {
        gate.resume_all();
        ticket.decline(round.generation).await;
        Offered::Declined
    };
    if gate.relays.load(Ordering::Acquire) == 0 || logged.lock().client.is_none() {
        return decline().await;
    }
    if !gate.stop_all().await {
        return decline().await;
    }
    if hbone::quiesce(shared, poll_conn, REST_WAIT).await.is_err() {
        return decline().await;
    }
    let plaintext = match hbone::finish_record(shared, REST_WAIT).await {
        Ok(p) => p,
        Err(_) => return decline().await,
    };
    // From here on the streams' relays and the session leave h2 and rustls.
    let parked: Vec<Parked> = std::mem::take(&mut *gate.parked.lock());
    let mut parts = Vec::with_capacity(parked.len());
    for p in parked {
        let (tx, rx) = oneshot::channel();
        if p.word.send(Word::Give(tx)).is_err() {
            continue;
        }
        if let Ok(part) = rx.await {
            parts.push((part, p.meta));
        }
    }
    *gate.stop.lock() = CancellationToken::new();
    let secrets = std::mem::take(&mut *logged.lock());
    let taken = match hbone::take_session(shared, &secrets, plaintext) {
        Ok(t) => t,
        // Cannot happen once at rest (the handshake is done, nothing is left to write); the streams are lost then.
        Err(e) => {
            let f = crate::fields! {"streams" => parts.len(), "error" => e};
            events.log(
                crate::events::Level::Error,
                "hand-over: the TLS session could not be taken: its streams are lost",
                f,
            );
            return Offered::Gone;
        }
    };
    let mut streams = Vec::with_capacity(parts.len());
    let mut metas = Vec::with_capacity(parts.len());
    let mut apps = Vec::with_capacity(parts.len());
    let mut handles = Vec::with_capacity(parts.len());
    for (mut p, mut meta) in parts {
        let mut to_app = p.to_tcp.take().map(|(b, at)| b[at..].to_vec()).unwrap_or_default();
        let _ = crate::copy::drain_received(&mut p.recv, &mut to_app);
        streams.push(StreamParcel {
            id: u32::from(p.send.stream_id()),
            to_peer: p.to_h2.to_vec(),
            to_app,
            app_eof: p.up_done,
            app_shut: p.down_shut,
            moved: p.moved,
        });
        meta.legs[0].moved = p.moved.0;
        meta.legs[1].moved = p.moved.1;
        metas.push(meta);
        apps.push(p.tcp);
        handles.push((p.send, p.recv));
    }
    // The session has left h2: its handles go with nothing reaching the wire.
    drop(handles);
    let conn = ConnParcel {
        tls: taken.tls,
        h2: taken.h2,
        ciphertext: taken.ciphertext,
        plaintext: taken.plaintext,
        conn_window,
        streams,
        peer: peer.peer_chain(),
    };
    offer_parcel((ticket, round), taken.tcp, conn, apps, metas, events).await
}

/// Offer an HBONE connection that has left h2 and rustls (or an engine's, at rest): the successor takes it
/// (`Gone`), or it is `Kept`, carried on here by a fresh engine. `apps` and `metas` are in `conn.streams`' order.
pub async fn offer_parcel(
    (ticket, round): (&Ticket, &Round),
    tcp: tokio::net::TcpStream,
    conn: ConnParcel,
    apps: Vec<tokio::net::TcpStream>,
    metas: Vec<ConnMeta>,
    events: &crate::events::Events,
) -> Offered {
    use std::os::fd::AsRawFd;
    let fds = std::iter::once(tcp.as_raw_fd()).chain(apps.iter().map(|a| a.as_raw_fd())).collect();
    let ids: Vec<u32> = conn.streams.iter().map(|s| s.id).collect();
    let parcel = Parcel {
        id: ticket.id,
        fds,
        meta: None,
        legs: Default::default(),
        hbone: Some(Box::new(HboneOffer { conn: conn.clone(), metas: metas.clone() })),
    };
    match ticket.offer(round.generation, parcel).await {
        Verdict::Gone => Offered::Gone,
        Verdict::Keep => match Engine::new(tcp, conn, apps) {
            Ok(engine) => Offered::Kept(Box::new((engine, ids, metas))),
            Err(e) => {
                let f = crate::fields! {"streams" => ids.len(), "error" => e};
                events.log(
                    crate::events::Level::Error,
                    "hand-over: a kept connection could not be carried on: its streams are lost",
                    f,
                );
                Offered::Gone
            }
        },
    }
}
