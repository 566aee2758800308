//! Hand-over: a daemon started beside another on the same node takes its established connections, byte-exact, so a
//! restart or an upgrade cuts none of them.
//!
//! The serving daemon listens on `HANDOVER_SOCKET` (a Unix socket, 0600, the peer's uid checked). A successor
//! connects once it is ready, and the two run one exchange (`wire`):
//!
//! ```text
//! successor                       predecessor
//!   Hello {version, node, ──────▶  same uid? same node? same version? else Refuse (another node: it carries on;
//!          waves}                  another version: it drains as it would have)
//!                    ◀───────────  Hello {.., waves}; stops accepting; every connection describes itself and goes
//!                                  on copying
//!                    ◀───────────  Meta × ⌈n/512⌉ (metadata by connection id)
//!                                  then, one wave at a time, the wave's connections pause at their next poll
//!                    ◀───────────  Conn × ⌈w/126⌉ (the sockets as SCM_RIGHTS, each leg's end and count, the bytes
//!                                  read and not written)
//!                    ◀───────────  Offered {w}
//!   Ready {w}        ───────────▶  (the wave taken in, none of it started)
//!                    ◀───────────  Commit
//!   Committed        ───────────▶  (sent before the successor starts any of the wave): the wave is the successor's
//!   Started          ───────────▶  (the wave's connections run): the next wave
//!                    ◀───────────  Done (after the last wave)
//! ```
//!
//! **Waves.** The connections are split by ticket into `SLOTS` slots, and consecutive slots into waves of about
//! `WAVE` connections (an HBONE connection weighs its streams); the successor starts each wave as it commits, and the next wave pauses only once the one before
//! runs in the successor (`Started`). A connection's pause is then its own wave's exchange and start, not the whole
//! hand-over's: starting a connection costs the successor tens of microseconds, and 9,000 started after one commit left
//! the last of them paused for 300 ms; waves that do not wait for `Started` queue up in the successor's silos the same
//! way (bench/results). Both Hellos say `waves`; a daemon that does not (an older one: the field is new, the version the
//! same) gets one wave of everything, without `Started` and `Done`.
//!
//! One process owns a connection at every moment: the predecessor's paused tasks keep their sockets (the successor
//! holds only more references to them) until their wave's `Committed` arrives; anything else (a refusal, a bad frame,
//! the successor dying or closing at any step before it) resumes every paused connection where it stopped, the waves
//! not reached never paused, and the predecessor drains them as it does today. The waves committed before are the
//! successor's, as every connection is once a hand-over has committed. The successor starts nothing of a wave before it
//! has sent its `Committed`, and the predecessor waits for that answer or the end of the stream, with no timeout (a
//! stream ends only when the successor closes it or dies): there is no moment when both, or neither, would copy.
//! Dropping a handed-over socket in the predecessor sends nothing on the wire: the socket lives on in the successor.
//!
//! A connection is handed over while it is copying (`carry`): between two polls a relay's whole state is its fields
//! (`copy::TcpRelay`), so nothing is lost, duplicated or reordered. TCP ⇄ TCP relays are handed over (outbound
//! passthrough, SOCKS5 or captured, to a non-HBONE destination; inbound plaintext).
//!
//! HBONE connections cross whole, one `Hbone` frame each (its TCP socket and its streams' application sockets, the
//! TLS record layer's keys, secrets and sequence numbers, the HTTP/2 state as the wire defines it, the bytes read and
//! not processed, each stream's pending bytes and metadata), and the successor carries them on with `hbone::Engine`
//! (`tls13`: the record layer; `http2`: the tap that learns the HTTP/2 state and stops h2 at a frame boundary). The
//! proxies offer them (`hconn`): inbound 15008 connections and outbound pooled ones stop their streams' copies at the
//! pause, quiesce the connection at a frame and record boundary, and offer it whole; a connection that cannot come to
//! rest (a stream being set up, a double-HBONE outer connection) declines and stays. A connection the successor
//! carries on is not offered again at the successor's own restart: it drains there (its streams end or are cut).

pub mod carry;
pub mod hbone;
#[cfg(test)]
mod hbone_tests;
pub mod hconn;
pub mod http2;
pub mod tls13;
pub mod wire;

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::copy::{LegEnd, LegState};
use wire::Kind;

/// The protocol's version: a successor speaking another is refused, and the predecessor drains as today.
pub const VERSION: u32 = 1;
/// How long the predecessor waits for its connections to pause (each does at its next poll; they are all idle or
/// copying, so this bounds a silo that is stuck, not the usual case).
const PAUSE_WAIT: Duration = Duration::from_secs(2);
/// How long either side waits for the other's next frame, but for the predecessor's wait for `Committed`: a peer that
/// hangs holds the other no longer than this (a successor's readiness waits for its take). 9,000 connections take
/// about 0.3 s in all (bench/handover.mjs), the longest wait inside the exchange is `PAUSE_WAIT`.
const STEP_WAIT: Duration = Duration::from_secs(10);
/// How long the predecessor keeps still after the commit, waiting for the successor to have started what it took.
const ARRIVAL_WAIT: Duration = Duration::from_secs(2);
/// The slots connections are spread over by ticket (consecutive ones make a wave).
pub const SLOTS: usize = 32;
/// About how many connections a wave holds (a slot is never split): what a successor starts in a few tens of
/// milliseconds (bench/handover.mjs).
const WAVE: usize = 512;
/// How long a successor waits for a wave to run before it says `Started` anyway (a stuck silo does not hold the
/// exchange).
const START_WAIT: Duration = Duration::from_secs(1);

fn slot(id: u64) -> usize {
    (id % SLOTS as u64) as usize
}

/// Where the connections of this process meet a hand-over.
pub struct Hub {
    /// The current round: its generation and its tokens (describe, then pause: one per slot), cancelled as a
    /// successor asks; replaced by a fresh round when the exchange ends, either way, under this lock with the leftover
    /// offers answered (`Hub::next_round`), so that no offer waits for a verdict that never comes.
    round: Mutex<Rounds>,
    offers_tx: mpsc::Sender<Offer>,
    offers_rx: Mutex<mpsc::Receiver<Offer>>,
    descs_tx: mpsc::Sender<(u64, Option<ConnMeta>)>,
    descs_rx: Mutex<mpsc::Receiver<(u64, Option<ConnMeta>)>>,
    next_id: std::sync::atomic::AtomicU64,
    /// Connections that can be handed over, live now, by slot.
    live: [AtomicUsize; SLOTS],
    /// What the connections of each slot weigh in this round, as they describe themselves (a TCP relay 1, an HBONE
    /// connection its streams): what the waves are cut by.
    weight: [AtomicUsize; SLOTS],
    /// One hand-over at a time.
    busy: Mutex<()>,
    /// What the daemon's drain waits for besides its tasks: a hand-over under way (the sockets of the connections it
    /// paused are borrowed from tasks that must outlive it, and a stream whose connection pauses ends its own task),
    /// and HBONE connections an engine carries on in a connection's task once their streams' tasks have ended.
    carrying: tokio_util::task::TaskTracker,
    /// About how many connections a wave holds (`WAVE`).
    wave: usize,
}

impl Default for Hub {
    fn default() -> Hub {
        let (offers_tx, offers_rx) = mpsc::channel();
        let (descs_tx, descs_rx) = mpsc::channel();
        Hub {
            round: Mutex::new(Rounds::default()),
            offers_tx,
            offers_rx: Mutex::new(offers_rx),
            descs_tx,
            descs_rx: Mutex::new(descs_rx),
            next_id: std::sync::atomic::AtomicU64::new(1),
            live: std::array::from_fn(|_| AtomicUsize::new(0)),
            weight: std::array::from_fn(|_| AtomicUsize::new(0)),
            busy: Mutex::new(()),
            carrying: tokio_util::task::TaskTracker::new(),
            wave: WAVE,
        }
    }
}

#[cfg(test)]
impl Hub {
    fn with_wave(wave: usize) -> Hub {
        Hub { wave, ..Hub::default() }
    }
}

/// One hand-over's round, as a connection sees it.
#[derive(Clone, Default)]
pub struct Round {
    pub generation: u64,
    /// Cancelled first: describe yourself and go on copying.
    pub describe: CancellationToken,
    /// Cancelled next, when the connection's wave comes: pause and offer.
    pub pause: CancellationToken,
}

/// One hand-over's round, as the hub holds it: a pause token per slot.
#[derive(Default)]
struct Rounds {
    generation: u64,
    describe: CancellationToken,
    pause: [CancellationToken; SLOTS],
}

/// What became of a paused connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The successor has it: end without a word (no access record: the successor writes it).
    Gone,
    /// Carry on where it stopped.
    Keep,
}

/// A connection's registration with the hub, for as long as it can be handed over.
pub struct Ticket {
    hub: std::sync::Arc<Hub>,
    pub id: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.hub.live[slot(self.id)].fetch_sub(1, Ordering::AcqRel);
    }
}

impl Ticket {
    /// The current round: its tokens are cancelled when a hand-over asks this connection to describe itself, then
    /// (its wave's) to pause.
    pub fn round(&self) -> Round {
        let r = self.hub.round.lock();
        Round { generation: r.generation, describe: r.describe.clone(), pause: r.pause[slot(self.id)].clone() }
    }

    pub fn described(&self, meta: ConnMeta) {
        self.hub.weight[slot(self.id)].fetch_add(1, Ordering::AcqRel);
        let _ = self.hub.descs_tx.send((self.id, Some(meta)));
    }

    /// Answer the describe phase with nothing to send now (an HBONE connection's descriptions cross with it), and
    /// what the connection weighs: its streams (they pause and cross one by one).
    pub fn described_later(&self, streams: usize) {
        self.hub.weight[slot(self.id)].fetch_add(streams.max(1), Ordering::AcqRel);
        let _ = self.hub.descs_tx.send((self.id, None));
    }

    /// Not this time (an HBONE connection that cannot come to rest, or has no stream): it carries on here, and the
    /// exchange neither waits for it nor sends anything of it.
    pub async fn decline(&self, generation: u64) {
        let parcel = Parcel { id: self.id, fds: Vec::new(), meta: None, legs: Default::default(), hbone: None };
        self.offer(generation, parcel).await;
    }

    /// Hand the paused connection's state to the hub and wait for the verdict. The descriptors stay valid (their
    /// sockets owned by the caller) until it returns.
    /// Offered under the round lock, and only in the round it paused for: an exchange that has ended has answered every
    /// offer it will ever get (`Hub::next_round`), and one made for it afterwards is kept at once.
    pub async fn offer(&self, generation: u64, parcel: Parcel) -> Verdict {
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let round = self.hub.round.lock();
            if round.generation != generation || self.hub.offers_tx.send(Offer { parcel, verdict: tx }).is_err() {
                return Verdict::Keep;
            }
        }
        rx.await.unwrap_or(Verdict::Keep)
    }
}

struct Offer {
    parcel: Parcel,
    verdict: tokio::sync::oneshot::Sender<Verdict>,
}

/// One paused connection, as it crosses.
pub struct Parcel {
    pub id: u64,
    /// Borrowed: the offering task keeps the sockets until its verdict.
    pub fds: Vec<RawFd>,
    /// None when it was described before the pause.
    pub meta: Option<ConnMeta>,
    pub legs: [LegState; 2],
    /// An HBONE connection (`fds`: its TCP socket, then its streams' application sockets).
    pub hbone: Option<Box<HboneOffer>>,
}

/// A paused HBONE connection's state, and each of its streams' metadata (in `conn.streams`' order).
pub struct HboneOffer {
    pub conn: hbone::ConnParcel,
    pub metas: Vec<ConnMeta>,
}

/// Which proxy a connection belongs to, and so how the successor carries it on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ConnKind {
    /// An outbound connection to a plain TCP upstream (SOCKS5 or captured): client → upstream is leg 0.
    OutboundTcp,
    /// Inbound plaintext (15006): client → application is leg 0; continuously authorized.
    InboundPlaintext,
    /// A CONNECT stream of an HBONE connection: outbound (client → peer is leg 0) or inbound 15008 (peer →
    /// application is leg 0).
    OutboundHbone,
    InboundHbone,
}

/// The local workload a connection is served for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "by")]
pub enum LocalJson {
    Uid { uid: String },
    Pod { namespace: String, name: String, service_account: String, node: String },
}

/// A connection's description: enough for the successor to count it, list it, authorize it and write its record.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnMeta {
    pub kind: ConnKind,
    pub local: LocalJson,
    /// The metrics bucket it counts into (shared with the bucket; on the wire, `label` indexes its batch's table).
    #[serde(skip)]
    pub labels: std::sync::Arc<crate::metrics::TrafficLabels>,
    #[serde(default)]
    pub label: u32,
    /// Its access record's fields but the bytes, the duration and the error (rendered by the proxy that opened it).
    pub record: serde_json::Map<String, serde_json::Value>,
    /// How long ago it was accepted (the record's duration goes on from there).
    pub age_ms: u64,
    pub src: std::net::SocketAddr,
    pub original_dst: std::net::SocketAddr,
    pub actual_dst: std::net::SocketAddr,
    /// Each leg's bytes moved and end; the pending bytes follow the metadata in the frame.
    pub legs: [LegMeta; 2],
    /// The peer's verified identity (an inbound HBONE stream's), so that its authorization goes on after the
    /// hand-over as it does for the streams opened here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_identity: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LegMeta {
    pub moved: u64,
    pub end: LegEnd,
    pub pending: usize,
}

/// A connection the successor has taken in and not started.
pub struct Received {
    pub fds: Vec<OwnedFd>,
    /// An HBONE connection's: its first stream's (the local workload it serves).
    pub meta: ConnMeta,
    pub legs: [LegState; 2],
    pub hbone: Option<Box<HboneReceived>>,
}

/// An HBONE connection taken in: its state and its streams' metadata (its sockets are `Received::fds`).
pub struct HboneReceived {
    pub conn: hbone::ConnParcel,
    pub metas: Vec<ConnMeta>,
}

/// How one hand-over went, from the side that reports it.
#[derive(Debug, Clone, Default, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase")]
pub struct HandoverReport {
    /// The predecessor (`give`) or the successor (`take`).
    pub role: String,
    /// Take: a predecessor was found on the socket.
    pub found: bool,
    /// The proxied connections that changed hands (an HBONE connection counts each of its streams).
    pub connections: u32,
    /// Give: the connections kept because the hand-over did not complete: those paused and resumed, and those of the
    /// waves not reached (an HBONE connection not reached counts once, not per stream).
    pub kept: u32,
    /// From the first frame to the last.
    pub duration_ms: f64,
    /// The longest a connection was paused (give: from its wave's pause to its commit).
    pub pause_ms: f64,
    /// Why it did not complete (absent when it did).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(optional))]
    pub error: Option<String>,
    /// The other process's pid, as the kernel reported it (0 when in another pid namespace).
    pub peer_pid: i32,
    /// Give: where the pauses went (ms, summed over the waves): collecting the connections' state, sending them, the
    /// successor's answer.
    pub phases_ms: [f64; 3],
    /// The waves committed (0 when none was; 1 with a daemon that does not speak of waves).
    pub waves: u32,
    /// The other side's protocol version.
    pub peer_version: u32,
    /// The node the other side serves.
    pub peer_node: String,
    /// Give: the peer serves another node; this daemon carries on as if it had not come.
    pub other_node: bool,
}

#[derive(Serialize, Deserialize)]
struct Hello {
    version: u32,
    pid: u32,
    /// The node the daemon serves: a daemon of another node is refused, and the predecessor carries on (a socket
    /// path shared by mistake must not end an unrelated daemon).
    #[serde(default)]
    node: String,
    /// The sender hands over, or takes, in waves (`Done` ends them); absent in an older daemon's Hello: one wave.
    #[serde(default)]
    waves: bool,
}

#[derive(Serialize, Deserialize)]
struct Count {
    count: u32,
}

#[derive(Serialize, Deserialize)]
struct Reason {
    reason: String,
    /// A refusal names the node its sender serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node: Option<String>,
}

fn protocol(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn json<T: serde::de::DeserializeOwned>(f: &wire::Frame) -> io::Result<T> {
    serde_json::from_slice(&f.payload).map_err(|e| protocol(format!("bad {:?} frame: {e}", f.kind)))
}

fn expect(sock: &UnixStream, kind: Kind) -> io::Result<wire::Frame> {
    match wire::recv(sock)? {
        Some(f) if f.kind == kind => Ok(f),
        Some(f) if f.kind == Kind::Abort || f.kind == Kind::Refuse => {
            let r: Reason = json(&f).unwrap_or(Reason { reason: "no reason given".into(), node: None });
            Err(protocol(format!("the other side gave up: {}", r.reason)))
        }
        Some(f) => Err(protocol(format!("expected {kind:?}, got {:?}", f.kind))),
        None => Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("the other side closed before {kind:?}"))),
    }
}

fn send_json(sock: &UnixStream, kind: Kind, v: &impl Serialize) -> io::Result<()> {
    wire::send(sock, kind, &[], &serde_json::to_vec(v).map_err(io::Error::other)?)
}

/// The peer must run as this process's user (or root).
fn check_peer(sock: &UnixStream) -> io::Result<i32> {
    let (uid, pid) = wire::peer(sock)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { nix::libc::geteuid() };
    if uid != me && uid != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("hand-over peer runs as uid {uid}, this daemon as {me}"),
        ));
    }
    Ok(pid)
}

impl Hub {
    /// Register a connection that can be handed over.
    pub fn ticket(self: &std::sync::Arc<Self>) -> Ticket {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.live[slot(id)].fetch_add(1, Ordering::AcqRel);
        Ticket { hub: self.clone(), id }
    }

    pub fn live(&self) -> usize {
        self.live_in(0..SLOTS)
    }

    /// Held for as long as a drain must wait for what it covers (see `carrying`).
    pub fn carrying(&self) -> tokio_util::task::task_tracker::TaskTrackerToken {
        self.carrying.token()
    }

    /// Wait, up to `deadline`, until no hand-over is under way and no carried-on connection is left; true if so. For
    /// the daemon's drain: the hub takes nothing new to wait for after it.
    pub async fn settled(&self, deadline: Duration) -> bool {
        self.carrying.close();
        tokio::time::timeout(deadline, self.carrying.wait()).await.is_ok()
    }

    /// For the runtime's shutdown: wait (up to `wait`) for a hand-over under way to end, and hold off any other while
    /// the guard lives, so that no exchange sends a socket whose task the shutdown has dropped.
    pub fn quiesce(&self, wait: Duration) -> Option<parking_lot::MutexGuard<'_, ()>> {
        self.busy.try_lock_for(wait)
    }

    fn live_in(&self, slots: std::ops::Range<usize>) -> usize {
        self.live[slots].iter().map(|n| n.load(Ordering::Acquire)).sum()
    }

    /// The waves, as ranges of consecutive slots of about `WAVE` connections (or HBONE streams) each: as they
    /// described themselves, and a connection that did not as one.
    fn waves(&self) -> Vec<std::ops::Range<usize>> {
        let (mut out, mut start, mut n) = (Vec::new(), 0, 0);
        for s in 0..SLOTS {
            n += self.live[s].load(Ordering::Acquire).max(self.weight[s].load(Ordering::Acquire));
            if n >= self.wave {
                out.push(start..s + 1);
                (start, n) = (s + 1, 0);
            }
        }
        if start < SLOTS {
            out.push(start..SLOTS);
        }
        out
    }

    /// Predecessor: one hand-over with the successor at the other end of `sock` (blocking; run it on a blocking
    /// thread). `stop_accepting` runs once the successor is known to speak this version, before the pause.
    pub fn give(&self, sock: UnixStream, node: &str, stop_accepting: impl FnOnce()) -> HandoverReport {
        let _one = self.busy.lock();
        let _carrying = self.carrying();
        let started = Instant::now();
        let mut report = HandoverReport { role: "give".into(), ..Default::default() };
        // The waves committed (the successor's: their tasks let go at the end), and the wave under way.
        let mut given: Vec<Offer> = Vec::new();
        let mut paused: Vec<Offer> = Vec::new();
        // The first slot no wave has paused yet, once accepting has stopped (what lies beyond is kept, unpaused).
        let mut reached = SLOTS;
        let mut longest = Duration::ZERO;
        let outcome = (|| -> io::Result<()> {
            sock.set_read_timeout(Some(STEP_WAIT))?;
            report.peer_pid = check_peer(&sock)?;
            let hello: Hello = json(&expect(&sock, Kind::Hello)?)?;
            report.peer_version = hello.version;
            report.peer_node = hello.node.clone();
            let refusal = if hello.node != node {
                report.other_node = true;
                Some(format!("this daemon serves node {node:?}, the successor {:?}", hello.node))
            } else if hello.version != VERSION {
                Some(format!("protocol version {} is not this daemon's {VERSION}", hello.version))
            } else {
                None
            };
            if let Some(reason) = refusal {
                let _ = send_json(&sock, Kind::Refuse, &Reason { reason: reason.clone(), node: Some(node.into()) });
                return Err(protocol(reason));
            }
            let me = Hello { version: VERSION, pid: std::process::id(), node: node.into(), waves: hello.waves };
            send_json(&sock, Kind::Hello, &me)?;
            stop_accepting();
            reached = 0;
            // Before the pause: the metadata, while the connections go on copying.
            let described = self.describe_all();
            for chunk in described.chunks(META_BATCH) {
                send_meta(&sock, chunk)?;
            }
            let waves = if hello.waves { self.waves() } else { std::iter::once(0..SLOTS).collect() };
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            for slots in waves {
                let t0 = Instant::now();
                reached = slots.end;
                self.pause_slots(slots, &mut paused);
                // The declined carry on at once, and are not counted. An offer whose task is gone (a runtime that shut
                // down under it) is not sent: its sockets closed with the task, and their numbers may be another's.
                for o in paused.extract_if(.., |o| o.parcel.fds.is_empty() || o.verdict.is_closed()) {
                    let _ = o.verdict.send(Verdict::Keep);
                }
                // Connections that described themselves after the first collection (set up meanwhile) did so before
                // they paused: their descriptions are queued by now.
                let late: Vec<(u64, ConnMeta)> = std::iter::from_fn(|| self.descs_rx.lock().try_recv().ok())
                    .filter_map(|(id, m)| Some((id, m?)))
                    .collect();
                for chunk in late.chunks(META_BATCH) {
                    send_meta(&sock, chunk)?;
                }
                // An empty wave is skipped; a daemon that takes everything at once gets its one wave, empty or not.
                if paused.is_empty() && hello.waves {
                    continue;
                }
                let t1 = Instant::now();
                let mut tcp: Vec<&mut Parcel> = Vec::with_capacity(paused.len());
                for o in paused.iter_mut() {
                    match &o.parcel.hbone {
                        Some(_) => send_hbone(&sock, &mut o.parcel)?,
                        None => tcp.push(&mut o.parcel),
                    }
                }
                for chunk in tcp.chunks_mut(BATCH) {
                    send_batch(&sock, chunk)?;
                }
                send_json(&sock, Kind::Offered, &Count { count: paused.len() as u32 })?;
                let t2 = Instant::now();
                let ready: Count = json(&expect(&sock, Kind::Ready)?)?;
                let phases = [ms(t1 - t0), ms(t2 - t1), ms(t2.elapsed())];
                for (sum, x) in report.phases_ms.iter_mut().zip(phases) {
                    *sum += x;
                }
                if ready.count as usize != paused.len() {
                    return Err(protocol(format!("the successor took {} of {}", ready.count, paused.len())));
                }
                wire::send(&sock, Kind::Commit, &[], b"")?;
                // The one wait without a timeout: the answer, or the end of the stream (the successor closed or
                // died).
                sock.set_read_timeout(None)?;
                expect(&sock, Kind::Committed)?;
                sock.set_read_timeout(Some(STEP_WAIT))?;
                longest = longest.max(t0.elapsed());
                report.waves += 1;
                given.append(&mut paused);
                if hello.waves {
                    expect(&sock, Kind::Started)?;
                }
            }
            if hello.waves {
                wire::send(&sock, Kind::Done, &[], b"")?;
            }
            Ok(())
        })();
        if let Err(e) = &outcome {
            report.error = Some(e.to_string());
            if !paused.is_empty() {
                let _ = send_json(&sock, Kind::Abort, &Reason { reason: e.to_string(), node: None });
            }
        }
        if !given.is_empty() {
            // The successor's now. It starts them while this side keeps still, and closes the socket once it has (a
            // successor that does not wait closes it at once).
            if sock.set_read_timeout(Some(ARRIVAL_WAIT)).is_ok() {
                let _ = wire::recv(&sock);
            }
        }
        // Either way a fresh round, before anything resumes: what did not pause in this one (a connection set up
        // meanwhile, a wave not reached) carries on here, and a kept one does not pause again for a round that is
        // over.
        self.next_round();
        // Counted as proxied connections: an HBONE connection counts its streams.
        let streams = |v: &[Offer]| -> u32 {
            v.iter().map(|o| o.parcel.hbone.as_ref().map_or(1, |h| h.metas.len() as u32)).sum()
        };
        report.connections = streams(&given);
        if outcome.is_err() {
            report.kept = streams(&paused) + self.live_in(reached.min(SLOTS)..SLOTS) as u32;
        }
        for o in given {
            let _ = o.verdict.send(Verdict::Gone);
        }
        for o in paused {
            let _ = o.verdict.send(Verdict::Keep);
        }
        report.pause_ms = longest.as_secs_f64() * 1000.0;
        report.duration_ms = started.elapsed().as_secs_f64() * 1000.0;
        report
    }

    /// A fresh round, with every offer still queued for the one that ends answered `Keep` (under the round lock, so
    /// none can be queued after), and the descriptions it left dropped.
    fn next_round(&self) {
        let mut round = self.round.lock();
        *round = Rounds { generation: round.generation + 1, ..Rounds::default() };
        while let Ok(o) = self.offers_rx.lock().try_recv() {
            let _ = o.verdict.send(Verdict::Keep);
        }
        while self.descs_rx.lock().try_recv().is_ok() {}
    }

    /// Ask every connection to describe itself and collect the descriptions: all that are live, or what came within
    /// the wait.
    fn describe_all(&self) -> Vec<(u64, ConnMeta)> {
        let rx = self.descs_rx.lock();
        // Stale ones (sent as the last round ended) go before asking: after, they could not be told apart.
        while rx.try_recv().is_ok() {}
        for w in &self.weight {
            w.store(0, Ordering::Release);
        }
        self.round.lock().describe.cancel();
        collect(&rx, |_| true, || self.live(), Vec::new()).into_iter().filter_map(|(id, m)| Some((id, m?))).collect()
    }

    /// Ask the connections of `slots` to pause and collect their parcels: all that are live, or what came within the
    /// wait (and any other queued: one set up after its wave paused).
    fn pause_slots(&self, slots: std::ops::Range<usize>, into: &mut Vec<Offer>) {
        for t in &self.round.lock().pause[slots.clone()] {
            t.cancel();
        }
        // One whose task is gone does not count (nor is it sent: `give`).
        let ours = |o: &Offer| slots.contains(&slot(o.parcel.id)) && !o.verdict.is_closed();
        *into = collect(&self.offers_rx.lock(), ours, || self.live_in(slots.clone()), std::mem::take(into));
    }
}

/// Receive into `out` until as many of those `counts` are in it as `live()` says there are, or `PAUSE_WAIT` has
/// passed, then whatever else is queued. Those that ended meanwhile never answer; a slow one left out is kept by the
/// round's end.
fn collect<T>(
    rx: &mpsc::Receiver<T>,
    counts: impl Fn(&T) -> bool,
    live: impl Fn() -> usize,
    mut out: Vec<T>,
) -> Vec<T> {
    let deadline = Instant::now() + PAUSE_WAIT;
    let mut n = out.iter().filter(|x| counts(x)).count();
    while n < live() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match rx.recv_timeout(left.min(Duration::from_millis(20))) {
            Ok(x) => {
                n += usize::from(counts(&x));
                out.push(x);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    out.extend(std::iter::from_fn(|| rx.try_recv().ok()));
    out
}

/// How many paused connections go in one frame: two descriptors each, within `wire::MAX_FDS`.
const BATCH: usize = wire::MAX_FDS / 2;
/// How many descriptions go in one frame.
const META_BATCH: usize = 512;

type Labels = std::sync::Arc<crate::metrics::TrafficLabels>;

/// Each distinct label set once per frame (connections of one bucket share it): sets `label` on each.
fn label_table<'a>(metas: impl Iterator<Item = &'a mut ConnMeta>) -> Vec<Labels> {
    let mut labels: Vec<Labels> = Vec::new();
    for m in metas {
        let at = match labels.iter().position(|l| std::sync::Arc::ptr_eq(l, &m.labels)) {
            Some(i) => i,
            None => {
                labels.push(m.labels.clone());
                labels.len() - 1
            }
        };
        m.label = at as u32;
    }
    labels
}

fn resolve_labels(meta: &mut ConnMeta, labels: &[Labels]) -> io::Result<()> {
    meta.labels = labels.get(meta.label as usize).cloned().ok_or_else(|| protocol("a label set out of range"))?;
    Ok(())
}

#[derive(Serialize)]
struct MetaOut<'a> {
    labels: Vec<&'a crate::metrics::TrafficLabels>,
    conns: Vec<(u64, &'a ConnMeta)>,
}

#[derive(Deserialize)]
struct MetaIn {
    labels: Vec<crate::metrics::TrafficLabels>,
    conns: Vec<(u64, ConnMeta)>,
}

#[derive(Serialize)]
struct StateOut<'a> {
    labels: Vec<&'a crate::metrics::TrafficLabels>,
    conns: Vec<StateRef<'a>>,
}

#[derive(Serialize)]
struct StateRef<'a> {
    id: u64,
    legs: [LegMeta; 2],
    #[serde(skip_serializing_if = "Option::is_none")]
    meta: Option<&'a ConnMeta>,
}

#[derive(Deserialize)]
struct StateIn {
    labels: Vec<crate::metrics::TrafficLabels>,
    conns: Vec<StateEntry>,
}

#[derive(Deserialize)]
struct StateEntry {
    id: u64,
    legs: [LegMeta; 2],
    #[serde(default)]
    meta: Option<ConnMeta>,
}

fn send_meta(sock: &UnixStream, described: &[(u64, ConnMeta)]) -> io::Result<()> {
    let mut metas: Vec<(u64, ConnMeta)> = described.to_vec();
    let labels = label_table(metas.iter_mut().map(|(_, m)| m));
    let out = MetaOut {
        labels: labels.iter().map(|l| &**l).collect(),
        conns: metas.iter().map(|(id, m)| (*id, m)).collect(),
    };
    wire::send(sock, Kind::Meta, &[], &serde_json::to_vec(&out).map_err(io::Error::other)?)
}

fn parse_meta(f: &wire::Frame, into: &mut std::collections::HashMap<u64, ConnMeta>) -> io::Result<()> {
    let batch: MetaIn = json(f)?;
    let labels: Vec<Labels> = batch.labels.into_iter().map(std::sync::Arc::new).collect();
    for (id, mut meta) in batch.conns {
        resolve_labels(&mut meta, &labels)?;
        into.insert(id, meta);
    }
    Ok(())
}

/// Up to `BATCH` paused connections in one frame: where each leg is, the metadata of those not described before,
/// the descriptors in order, and the pending bytes after the JSON.
fn send_batch(sock: &UnixStream, parcels: &mut [&mut Parcel]) -> io::Result<()> {
    let labels = label_table(parcels.iter_mut().filter_map(|p| p.meta.as_mut()));
    let conns = parcels
        .iter()
        .map(|p| StateRef {
            id: p.id,
            legs: p.legs.each_ref().map(|l| LegMeta { moved: l.moved, end: l.end, pending: l.pending.len() }),
            meta: p.meta.as_ref(),
        })
        .collect();
    let out = StateOut { labels: labels.iter().map(|l| &**l).collect(), conns };
    let json = serde_json::to_vec(&out).map_err(io::Error::other)?;
    let pending: usize = parcels.iter().map(|p| p.legs[0].pending.len() + p.legs[1].pending.len()).sum();
    let mut payload = Vec::with_capacity(4 + json.len() + pending);
    payload.extend_from_slice(&(json.len() as u32).to_le_bytes());
    payload.extend_from_slice(&json);
    let mut fds = Vec::with_capacity(parcels.len() * 2);
    for p in parcels.iter() {
        payload.extend_from_slice(&p.legs[0].pending);
        payload.extend_from_slice(&p.legs[1].pending);
        fds.extend_from_slice(&p.fds);
    }
    wire::send(sock, Kind::Conn, &fds, &payload)
}

fn parse_batch(
    f: wire::Frame,
    described: &mut std::collections::HashMap<u64, ConnMeta>,
    into: &mut Vec<Received>,
) -> io::Result<()> {
    let p = &f.payload;
    if p.len() < 4 {
        return Err(protocol("connection frame without metadata"));
    }
    let meta_len = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize;
    let meta_end = 4usize.checked_add(meta_len).filter(|e| *e <= p.len()).ok_or_else(|| protocol("short metadata"))?;
    let batch: StateIn =
        serde_json::from_slice(&p[4..meta_end]).map_err(|e| protocol(format!("bad connection metadata: {e}")))?;
    if f.fds.len() != batch.conns.len() * 2 {
        return Err(protocol(format!("{} connections came with {} sockets", batch.conns.len(), f.fds.len())));
    }
    let pending: Option<usize> =
        batch.conns.iter().try_fold(0usize, |n, c| n.checked_add(c.legs[0].pending)?.checked_add(c.legs[1].pending));
    if pending.and_then(|n| meta_end.checked_add(n)) != Some(p.len()) {
        return Err(protocol("the pending bytes do not match the metadata"));
    }
    let labels: Vec<Labels> = batch.labels.into_iter().map(std::sync::Arc::new).collect();
    let (mut at, mut fds) = (meta_end, f.fds.into_iter());
    for entry in batch.conns {
        let mut meta = match entry.meta {
            Some(mut m) => {
                resolve_labels(&mut m, &labels)?;
                m
            }
            None => described
                .remove(&entry.id)
                .ok_or_else(|| protocol(format!("connection {} was not described", entry.id)))?,
        };
        meta.legs = entry.legs;
        let mut leg = |i: usize| {
            let n = entry.legs[i].pending;
            let bytes = p[at..at + n].to_vec();
            at += n;
            LegState { pending: bytes, moved: entry.legs[i].moved, end: entry.legs[i].end }
        };
        let legs = [leg(0), leg(1)];
        let (Some(a), Some(b)) = (fds.next(), fds.next()) else { return Err(protocol("missing sockets")) };
        into.push(Received { fds: vec![a, b], meta, legs, hbone: None });
    }
    Ok(())
}

#[derive(Serialize)]
struct HboneOut<'a> {
    id: u64,
    labels: Vec<&'a crate::metrics::TrafficLabels>,
    metas: &'a [ConnMeta],
    conn: &'a hbone::ConnParcel,
}

#[derive(Deserialize)]
struct HboneIn {
    labels: Vec<crate::metrics::TrafficLabels>,
    metas: Vec<ConnMeta>,
    conn: hbone::ConnParcel,
}

/// One paused HBONE connection in one frame (at most `wire::MAX_FDS` sockets: a connection carries 200 streams).
fn send_hbone(sock: &UnixStream, parcel: &mut Parcel) -> io::Result<()> {
    let Some(h) = parcel.hbone.as_mut() else { return Err(protocol("not an HBONE connection")) };
    let labels = label_table(h.metas.iter_mut());
    let out = HboneOut { id: parcel.id, labels: labels.iter().map(|l| &**l).collect(), metas: &h.metas, conn: &h.conn };
    wire::send(sock, Kind::Hbone, &parcel.fds, &serde_json::to_vec(&out).map_err(io::Error::other)?)
}

fn parse_hbone(f: wire::Frame) -> io::Result<Received> {
    let mut h: HboneIn = json(&f)?;
    if h.metas.len() != h.conn.streams.len() || f.fds.len() != 1 + h.conn.streams.len() {
        return Err(protocol(format!(
            "an HBONE connection of {} streams came with {} descriptions and {} sockets",
            h.conn.streams.len(),
            h.metas.len(),
            f.fds.len()
        )));
    }
    let labels: Vec<Labels> = h.labels.into_iter().map(std::sync::Arc::new).collect();
    for m in h.metas.iter_mut() {
        resolve_labels(m, &labels)?;
    }
    let meta = h.metas.first().cloned().ok_or_else(|| protocol("an HBONE connection without streams"))?;
    let legs = [LegState::default(), LegState::default()];
    Ok(Received { fds: f.fds, meta, legs, hbone: Some(Box::new(HboneReceived { conn: h.conn, metas: h.metas })) })
}

/// Successor: take every connection the daemon listening on `path` hands over (blocking), a wave at a time: each is
/// given to `start` once its `Committed` is sent (the connections are this process's to start, and only then).
/// Nobody on `path` is not an error (`found: false`). The socket comes back after a hand-over that committed any:
/// the predecessor waits for its close (`ARRIVAL_WAIT` at most) before it lets go of what it handed over, so that its
/// clean-up does not take the machine from the successor while the successor starts the connections (see
/// `Arrival`).
pub fn take(
    path: &std::path::Path,
    node: &str,
    start: impl FnMut(Vec<Received>, Started),
) -> (HandoverReport, Option<UnixStream>) {
    match UnixStream::connect(path) {
        Ok(s) => take_waves(s, node, start),
        Err(e) => {
            let mut report = HandoverReport { role: "take".into(), ..Default::default() };
            if !matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused) {
                report.error = Some(format!("connecting to {}: {e}", path.display()));
            }
            (report, None)
        }
    }
}

/// `take` over a connected socket, every wave gathered, the socket closed at once (the predecessor does not wait).
pub fn take_on(sock: UnixStream, node: &str) -> (HandoverReport, Vec<Received>) {
    let mut got = Vec::new();
    let (report, _) = take_waves(sock, node, |wave, _| got.extend(wave));
    (report, got)
}

/// One hand-over's connections as the successor starts them: a clone each, dropped once it runs here, and one held
/// by the take until its last wave. The last one closes the hand-over socket (the predecessor then lets go of its
/// references) and asks for one authorization pass over what was taken in; the last of a wave's lets the take say
/// `Started`.
#[derive(Clone)]
pub struct Arrival {
    held: std::sync::Arc<ArrivalHeld>,
    _wave: Option<Started>,
}

/// A wave's connections as they start (`Arrival::of`): once every clone is dropped, the take goes on.
#[derive(Clone)]
pub struct Started(#[allow(dead_code)] std::sync::Arc<mpsc::Sender<()>>);

struct ArrivalHeld {
    sock: Mutex<Option<UnixStream>>,
    /// Dropped with the last clone (the proxy's: one authorization pass over what was taken in).
    _adopted: Box<dyn Send + Sync>,
}

impl Arrival {
    /// `adopted`: held until the last clone is dropped.
    pub fn new(sock: Option<UnixStream>, adopted: impl Send + Sync + 'static) -> Arrival {
        let held = ArrivalHeld { sock: Mutex::new(sock), _adopted: Box::new(adopted) };
        Arrival { held: std::sync::Arc::new(held), _wave: None }
    }

    /// A clone for one connection of `wave`.
    pub fn of(&self, wave: &Started) -> Arrival {
        Arrival { held: self.held.clone(), _wave: Some(wave.clone()) }
    }

    /// The hand-over socket, once the take is over: closed with the last clone.
    pub fn hold(&self, sock: Option<UnixStream>) {
        *self.held.sock.lock() = sock;
    }
}

/// `take` over a connected socket: the report, and the socket after a commit. `start` gets each wave and a token
/// for its connections to drop as they run (`Arrival::of`); the next wave comes once they all have.
pub fn take_waves(
    sock: UnixStream,
    node: &str,
    mut start: impl FnMut(Vec<Received>, Started),
) -> (HandoverReport, Option<UnixStream>) {
    let started = Instant::now();
    let mut report = HandoverReport { role: "take".into(), found: true, ..Default::default() };
    let outcome = (|| -> io::Result<()> {
        sock.set_read_timeout(Some(STEP_WAIT))?;
        report.peer_pid = check_peer(&sock)?;
        let me = Hello { version: VERSION, pid: std::process::id(), node: node.into(), waves: true };
        send_json(&sock, Kind::Hello, &me)?;
        let first = wire::recv(&sock)?.ok_or_else(|| protocol("the predecessor closed before its Hello"))?;
        if first.kind == Kind::Refuse {
            let r: Reason = json(&first)?;
            report.peer_node = r.node.unwrap_or_default();
            return Err(protocol(format!("refused: {}", r.reason)));
        }
        if first.kind != Kind::Hello {
            return Err(protocol(format!("expected Hello, got {:?}", first.kind)));
        }
        let hello: Hello = json(&first)?;
        report.peer_version = hello.version;
        report.peer_node = hello.node;
        let mut described = std::collections::HashMap::new();
        loop {
            let mut got = Vec::new();
            loop {
                let f = wire::recv(&sock)?.ok_or_else(|| protocol("the predecessor closed mid-way"))?;
                match f.kind {
                    Kind::Meta => parse_meta(&f, &mut described)?,
                    Kind::Conn => parse_batch(f, &mut described, &mut got)?,
                    Kind::Hbone => got.push(parse_hbone(f)?),
                    Kind::Offered => {
                        let c: Count = json(&f)?;
                        if c.count as usize != got.len() {
                            return Err(protocol(format!("offered {} but sent {}", c.count, got.len())));
                        }
                        break;
                    }
                    Kind::Done if hello.waves && got.is_empty() => return Ok(()),
                    Kind::Abort => {
                        let r: Reason = json(&f).unwrap_or(Reason { reason: "no reason given".into(), node: None });
                        return Err(protocol(format!("the predecessor gave up: {}", r.reason)));
                    }
                    k => return Err(protocol(format!("unexpected {k:?} frame"))),
                }
            }
            send_json(&sock, Kind::Ready, &Count { count: got.len() as u32 })?;
            expect(&sock, Kind::Commit)?;
            wire::send(&sock, Kind::Committed, &[], b"")?;
            report.connections += got.iter().map(|r| r.hbone.as_ref().map_or(1, |h| h.metas.len() as u32)).sum::<u32>();
            report.waves += 1;
            let (tx, running) = mpsc::channel();
            start(got, Started(std::sync::Arc::new(tx)));
            if !hello.waves {
                return Ok(());
            }
            // Every token dropped: the sender with them.
            let _ = running.recv_timeout(START_WAIT);
            wire::send(&sock, Kind::Started, &[], b"")?;
        }
    })();
    // A wave not committed is dropped: our references to its sockets close, the predecessor keeps them (nothing
    // crosses the wire). Those committed are started, whatever came after.
    if let Err(e) = outcome {
        report.error = Some(e.to_string());
    }
    report.duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    let held = (report.error.is_none() || report.waves > 0).then_some(sock);
    (report, held)
}

/// Predecessor: listen on `path` (0600, replacing a stale socket nobody listens on); the successor finds it there.
/// A socket a daemon serves is refused, unless `replace`: that daemon is leaving (this one just tried to take its
/// connections over), and from the rename on it is out of reach of later successors.
pub fn listen(path: &std::path::Path, replace: bool) -> io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if path.exists() && !replace {
        match UnixStream::connect(path) {
            // Someone serves it: taking the name now would hide it from its successor.
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is served by a running daemon", path.display()),
                ))
            }
            Err(_) => std::fs::remove_file(path)?,
        }
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    // Bound under a private name, made 0600, then renamed into place: never reachable with wider permissions.
    let tmp = path.with_file_name(format!(
        ".{}.{}",
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let l = std::os::unix::net::UnixListener::bind(&tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path)?;
    Ok(l)
}

#[cfg(test)]
pub(crate) mod tests;
