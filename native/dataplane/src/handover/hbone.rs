//! An HBONE connection after a hand-over: its TCP socket, its TLS session's record layer (`tls13`), its HTTP/2
//! state as the wire defines it (`http2::H2State`), and the application sockets of its open CONNECT streams, carried
//! on until the last stream ends.
//!
//! The connection is not h2's any more, and it takes no new stream: GOAWAY goes out first (NO_ERROR, the last
//! stream the peer opened), so the peer opens new streams on a fresh connection (which the successor serves with
//! h2 as always), and a stream the peer opened before it saw the GOAWAY is refused (REFUSED_STREAM, safe to
//! retry). The open streams go on byte for byte: DATA both ways within both windows, the receive windows
//! opened again as the application takes the bytes (so a slow reader still holds the sender back), END_STREAM as a
//! shutdown of the application socket's write side and an EOF from it as END_STREAM, RST_STREAM as the socket's
//! close. PING is answered, SETTINGS applied and acknowledged. HEADERS are never decoded: the peer's HPACK state
//! stays with the process that ran h2, and nothing here needs it (a CONNECT stream carries its bytes in DATA).
//! When the last stream ends, close_notify and FIN close the connection, as h2 would once idle after a GOAWAY.

use std::collections::BTreeMap;
use std::io;
use std::task::{Context, Poll};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use super::http2::{self, H2State, Head};
use super::tls13::{self, Opened, Records, TlsState};

const NO_ERROR: u32 = 0;
const PROTOCOL_ERROR: u32 = 1;
const REFUSED_STREAM: u32 = 7;
const CANCEL: u32 = 8;
/// Ciphertext waiting for the socket above which no more DATA is made.
const TX_HIGH: usize = 256 * 1024;
/// A stream's (or the connection's) receive window is opened again once this much was delivered, or at once when
/// the stream's bytes are all delivered.
const CREDIT_STEP: i64 = 32 * 1024;
/// How long a closed connection waits for the peer's FIN.
const LINGER: std::time::Duration = std::time::Duration::from_secs(5);
/// The most read from an application socket at once.
const READ_CHUNK: usize = 64 * 1024;

/// One open stream as it crosses: its id, the bytes read from the application not yet sent as DATA, the bytes
/// received not yet written to the application, and which ends are done.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamParcel {
    pub id: u32,
    pub to_peer: Vec<u8>,
    pub to_app: Vec<u8>,
    /// The application's EOF was read (END_STREAM is due or sent: `H2State` says which).
    pub app_eof: bool,
    /// The application socket's write side is shut down (after END_STREAM).
    pub app_shut: bool,
    /// Bytes moved so far: application → peer, peer → application.
    pub moved: (u64, u64),
}

/// An HBONE connection as it crosses: the session, the HTTP/2 state, and what was read and not yet processed
/// (ciphertext from a record's start, then plaintext from a frame's start).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConnParcel {
    pub tls: TlsState,
    pub h2: H2State,
    pub ciphertext: Vec<u8>,
    pub plaintext: Vec<u8>,
    /// The receive windows the connection keeps open (ours: `config.http2`).
    pub conn_window: i64,
    pub streams: Vec<StreamParcel>,
    /// The peer's certificate chain as its handshake verified it, and when: the successor follows the connection for
    /// revocation as the predecessor did (`tls::revocation`). Empty from a predecessor that had none to give.
    #[serde(default, skip_serializing_if = "PeerChain::is_empty")]
    pub peer: PeerChain,
}

/// A connection's peer chain and when it was verified (tls/revocation.rs).
pub use crate::tls::revocation::PeerChain;

/// How one stream ended, and the bytes it moved (application → peer, peer → application).
pub struct StreamEnd {
    pub id: u32,
    pub result: io::Result<()>,
    pub moved: (u64, u64),
}

struct Stream {
    app: TcpStream,
    to_peer: Vec<u8>,
    to_peer_at: usize,
    to_app: Vec<u8>,
    to_app_at: usize,
    app_eof: bool,
    app_shut: bool,
    /// Delivered to the application and not yet given back as window.
    credit: i64,
    moved: (u64, u64),
    failed: Option<io::Error>,
}

pub struct Engine {
    tcp: TcpStream,
    records: Records,
    h2: H2State,
    rx_tls: Vec<u8>,
    rx_plain: Vec<u8>,
    tx_plain: Vec<u8>,
    tx_tls: Vec<u8>,
    tx_at: usize,
    streams: BTreeMap<u32, Stream>,
    conn_window: i64,
    conn_credit: i64,
    /// The peer closed (close_notify, FIN, an error): no more frames.
    peer_gone: Option<io::Error>,
    closing: bool,
    ended: Vec<StreamEnd>,
    /// The peer's chain, handed on with the connection.
    peer: PeerChain,
}

fn frame(out: &mut Vec<u8>, typ: u8, flags: u8, stream: u32, payload: &[u8]) {
    Head { len: payload.len(), typ, flags, stream }.write(out);
    out.extend_from_slice(payload);
}

impl Engine {
    /// `apps`: the streams' application sockets, in `parcel.streams`' order.
    pub fn new(tcp: TcpStream, parcel: ConnParcel, apps: Vec<TcpStream>) -> Result<Engine, String> {
        let records = Records::new(&parcel.tls).map_err(|e| e.to_string())?;
        if apps.len() != parcel.streams.len() {
            return Err("a stream without its socket".into());
        }
        let mut h2 = parcel.h2;
        let mut streams = BTreeMap::new();
        let mut conn_credit = parcel.conn_window - h2.recv;
        for (p, app) in parcel.streams.into_iter().zip(apps) {
            // What h2 had released and not yet sent as WINDOW_UPDATE, and the bytes not yet delivered. A stream
            // both ends closed on the wire has nothing to give back; its last bytes are still delivered.
            let credit = h2.streams.get(&p.id).map_or(0, |wire| h2.our_initial - wire.recv - p.to_app.len() as i64);
            conn_credit -= p.to_app.len() as i64;
            streams.insert(
                p.id,
                Stream {
                    app,
                    to_peer: p.to_peer,
                    to_peer_at: 0,
                    to_app: p.to_app,
                    to_app_at: 0,
                    app_eof: p.app_eof,
                    app_shut: p.app_shut,
                    credit: credit.max(0),
                    moved: p.moved,
                    failed: None,
                },
            );
        }
        // Streams the wire still has open but nothing here carries (set up when the hand-over came): refused.
        let mut tx_plain = Vec::new();
        let orphans: Vec<u32> = h2.streams.keys().filter(|id| !streams.contains_key(id)).copied().collect();
        for id in orphans {
            frame(&mut tx_plain, http2::RST_STREAM, 0, id, &REFUSED_STREAM.to_be_bytes());
            h2.streams.remove(&id);
        }
        let mut goaway = h2.peer_last_stream.to_be_bytes().to_vec();
        goaway.extend_from_slice(&NO_ERROR.to_be_bytes());
        frame(&mut tx_plain, http2::GOAWAY, 0, 0, &goaway);
        h2.our_goaway = true;
        Ok(Engine {
            tcp,
            records,
            h2,
            rx_tls: parcel.ciphertext,
            rx_plain: parcel.plaintext,
            tx_plain,
            tx_tls: Vec::new(),
            tx_at: 0,
            streams,
            conn_window: parcel.conn_window,
            conn_credit: conn_credit.max(0),
            peer_gone: None,
            closing: false,
            ended: Vec::new(),
            peer: parcel.peer,
        })
    }

    /// The peer's chain as the connection's first handshake verified it.
    pub fn peer(&self) -> &PeerChain {
        &self.peer
    }

    /// Carry the connection until its last stream ends; `on_end` is told of each stream's end. Then, with
    /// close_notify and FIN sent, what the peer still sends is read and dropped until its own FIN (`LINGER` at
    /// most), so a last frame of its in flight meets no reset.
    pub async fn run(mut self, mut on_end: impl FnMut(StreamEnd)) {
        loop {
            let done = self.step().await;
            self.ended.drain(..).for_each(&mut on_end);
            if done {
                break;
            }
        }
        self.linger().await;
    }

    /// Drive the connection until a stream ends (false: `take_ended` says which) or the connection is over (true).
    /// Cancel-safe: every state lives in the engine between polls.
    pub async fn step(&mut self) -> bool {
        std::future::poll_fn(|cx| match self.poll(cx) {
            Poll::Ready(()) => Poll::Ready(true),
            Poll::Pending if !self.ended.is_empty() => Poll::Ready(false),
            Poll::Pending => Poll::Pending,
        })
        .await
    }

    pub fn take_ended(&mut self) -> std::vec::Drain<'_, StreamEnd> {
        self.ended.drain(..)
    }

    /// After the connection is over (`step` said so): the peer's last frames read and dropped until its FIN.
    pub async fn linger(mut self) {
        if self.peer_gone.is_none() {
            let mut scratch = vec![0u8; 16 * 1024];
            let linger = async {
                use tokio::io::AsyncReadExt;
                while let Ok(n) = self.tcp.read(&mut scratch).await {
                    if n == 0 {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(LINGER, linger).await;
        }
    }

    /// End one stream from outside (a policy that now denies it): reset toward the peer, its socket closed.
    pub fn close_stream(&mut self, id: u32, e: io::Error) {
        if let Some(s) = self.streams.get_mut(&id) {
            s.failed.get_or_insert(e);
        }
    }

    /// The ids of the streams it carries.
    pub fn stream_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.streams.keys().copied()
    }

    /// Whether the connection can be handed on as it stands: open both ways, streams live and none failing, no
    /// post-handshake message half read.
    pub fn can_hand_over(&self) -> bool {
        self.peer_gone.is_none()
            && !self.closing
            && !self.streams.is_empty()
            && self.records.can_hand_over()
            && self.streams.values().all(|s| s.failed.is_none())
    }

    /// Bring the connection to rest for a hand-over: what is queued for the peer sealed and written, so the wire
    /// stops at a record's end. False when the socket did not take it within `wait` (what was written stays written,
    /// and the engine carries on).
    pub async fn flush(&mut self, wait: std::time::Duration) -> bool {
        if !self.tx_plain.is_empty() {
            let plain = std::mem::take(&mut self.tx_plain);
            self.records.seal(&plain, &mut self.tx_tls);
        }
        let written = std::future::poll_fn(|cx| loop {
            match self.write_peer(cx) {
                Err(e) => return Poll::Ready(Err(e)),
                Ok(_) if self.tx_tls.is_empty() => return Poll::Ready(Ok(())),
                Ok(true) => continue,
                Ok(false) => return Poll::Pending,
            }
        });
        matches!(tokio::time::timeout(wait, written).await, Ok(Ok(())))
    }

    /// The connection at rest (`flush`) as it crosses again: its socket, its state (records and frames read and
    /// not yet processed, from a record's and a frame's start), and its streams' sockets in the parcel's order.
    pub fn into_parcel(self) -> (TcpStream, ConnParcel, Vec<TcpStream>) {
        let mut streams = Vec::with_capacity(self.streams.len());
        let mut apps = Vec::with_capacity(self.streams.len());
        for (id, s) in self.streams {
            streams.push(StreamParcel {
                id,
                to_peer: s.to_peer[s.to_peer_at..].to_vec(),
                to_app: s.to_app[s.to_app_at..].to_vec(),
                app_eof: s.app_eof,
                app_shut: s.app_shut,
                moved: s.moved,
            });
            apps.push(s.app);
        }
        let conn = ConnParcel {
            tls: self.records.state(),
            h2: self.h2,
            ciphertext: self.rx_tls,
            plaintext: self.rx_plain,
            conn_window: self.conn_window,
            streams,
            peer: self.peer,
        };
        (self.tcp, conn, apps)
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let mut progress = false;
            if self.peer_gone.is_none() {
                progress |= self.read_peer(cx);
            }
            progress |= self.process_frames();
            progress |= self.pump_streams(cx);
            self.settle_without_peer();
            self.reap();
            if !self.tx_plain.is_empty() {
                let plain = std::mem::take(&mut self.tx_plain);
                // Nothing more goes to a peer that closed: its last bytes are being delivered.
                if self.peer_gone.is_none() {
                    self.records.seal(&plain, &mut self.tx_tls);
                    progress = true;
                }
            }
            if self.streams.is_empty() && !self.closing {
                self.closing = true;
                if self.peer_gone.is_none() {
                    self.records.close_notify(&mut self.tx_tls);
                }
            }
            match self.write_peer(cx) {
                Err(_) if self.peer_gone.is_some() => {
                    self.tx_tls.clear();
                    self.tx_at = 0;
                }
                Err(e) => self.fail_all(e),
                Ok(wrote) => progress |= wrote,
            }
            if self.closing && self.tx_at == self.tx_tls.len() {
                let _ = std::pin::Pin::new(&mut self.tcp).poll_shutdown(cx);
                return Poll::Ready(());
            }
            if self.closing && self.peer_gone.is_some() && self.streams.is_empty() {
                return Poll::Ready(());
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }

    fn fail_all(&mut self, e: io::Error) {
        for s in self.streams.values_mut() {
            s.failed.get_or_insert_with(|| io::Error::new(e.kind(), e.to_string()));
        }
        self.tx_tls.clear();
        self.tx_at = 0;
        self.peer_gone.get_or_insert(e);
        self.reap();
        self.closing = true;
    }

    /// Ciphertext in, records opened, plaintext kept for `process_frames`.
    fn read_peer(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        loop {
            // Whole records first (some may have crossed with the connection).
            let mut at = 0;
            while let Some(len) = tls13::record_len(&self.rx_tls[at..]) {
                let len = match len {
                    Ok(l) => l,
                    Err(e) => return self.peer_failed(io::Error::new(io::ErrorKind::InvalidData, e)),
                };
                if self.rx_tls.len() - at < len {
                    break;
                }
                let rec = &mut self.rx_tls[at..at + len];
                match self.records.open(rec, &mut self.tx_tls) {
                    Ok(Opened::Data(n)) => self.rx_plain.extend_from_slice(&rec[tls13::HEADER..tls13::HEADER + n]),
                    Ok(Opened::Control) => {}
                    Ok(Opened::Closed) => {
                        self.rx_tls.clear();
                        return self.peer_failed(io::Error::new(io::ErrorKind::UnexpectedEof, "close_notify"));
                    }
                    Err(e) => return self.peer_failed(io::Error::new(io::ErrorKind::InvalidData, e)),
                }
                at += len;
                progress = true;
            }
            self.rx_tls.drain(..at);
            if self.rx_plain.len() > 4 << 20 {
                return progress; // the frames first
            }
            if self.tcp.poll_read_ready(cx).is_pending() {
                return progress;
            }
            self.rx_tls.reserve(32 * 1024);
            match self.tcp.try_read_buf(&mut self.rx_tls) {
                Ok(0) => return self.peer_failed(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed")),
                Ok(_) => progress = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return self.peer_failed(e),
            }
        }
    }

    /// The peer closed (close_notify, FIN, an error). What it sent before is still delivered: the frames read are
    /// processed first, and `settle_without_peer` ends each stream only once nothing is left for it to deliver (a
    /// stream's last DATA, its END_STREAM and the close_notify after it often come in one read).
    fn peer_failed(&mut self, e: io::Error) -> bool {
        self.peer_gone = Some(e);
        true
    }

    /// With the peer gone: a stream whose bytes from the peer are all delivered ends, cleanly if both of its ends
    /// were closed on the wire (and its application socket shut down), else with the peer's error.
    fn settle_without_peer(&mut self) {
        let Some(e) = &self.peer_gone else { return };
        for (id, s) in self.streams.iter_mut() {
            if s.failed.is_some() || s.to_app_at < s.to_app.len() {
                continue;
            }
            let wire = self.h2.streams.get(id);
            if wire.is_none_or(|w| w.remote_end) && !s.app_shut {
                continue; // the shutdown comes next, in `pump_streams`
            }
            if wire.is_some() {
                s.failed = Some(io::Error::new(e.kind(), e.to_string()));
            }
        }
    }

    fn process_frames(&mut self) -> bool {
        let mut at = 0;
        let mut progress = false;
        while self.rx_plain.len() - at >= http2::FRAME_HEADER {
            let h = Head::parse(&self.rx_plain[at..]);
            let end = at + http2::FRAME_HEADER + h.len;
            if self.rx_plain.len() < end {
                break;
            }
            let payload = self.rx_plain[at + http2::FRAME_HEADER..end].to_vec();
            at = end;
            progress = true;
            self.frame_in(h, &payload);
        }
        self.rx_plain.drain(..at);
        progress
    }

    fn frame_in(&mut self, h: Head, payload: &[u8]) {
        let known = self.h2.streams.contains_key(&h.stream);
        self.h2.received(h, payload);
        match h.typ {
            http2::DATA => {
                // Padding counts against the window but is not data.
                let data = if h.flags & 0x8 != 0 && !payload.is_empty() {
                    let pad = payload[0] as usize;
                    &payload[1..payload.len().saturating_sub(pad).max(1)]
                } else {
                    payload
                };
                let padding = (h.len - data.len()) as i64;
                self.conn_credit += padding;
                match self.streams.get_mut(&h.stream) {
                    Some(s) if known => {
                        s.to_app.extend_from_slice(data);
                        s.credit += padding;
                    }
                    _ => {
                        // A stream not carried here: its bytes only count against the connection's window.
                        self.conn_credit += data.len() as i64;
                        if !known {
                            frame(&mut self.tx_plain, http2::RST_STREAM, 0, h.stream, &CANCEL.to_be_bytes());
                        }
                    }
                }
            }
            http2::HEADERS if !known && self.h2.streams.contains_key(&h.stream) => {
                // A new stream the peer opened before it saw our GOAWAY.
                self.h2.streams.remove(&h.stream);
                frame(&mut self.tx_plain, http2::RST_STREAM, 0, h.stream, &REFUSED_STREAM.to_be_bytes());
            }
            http2::RST_STREAM => {
                if let Some(s) = self.streams.get_mut(&h.stream) {
                    s.failed.get_or_insert_with(|| io::Error::new(io::ErrorKind::ConnectionReset, "stream reset"));
                }
            }
            http2::SETTINGS if h.flags & http2::ACK == 0 => {
                frame(&mut self.tx_plain, http2::SETTINGS, http2::ACK, 0, &[]);
            }
            http2::PING if h.flags & http2::ACK == 0 && payload.len() == 8 => {
                frame(&mut self.tx_plain, http2::PING, http2::ACK, 0, payload);
            }
            http2::PUSH_PROMISE => {
                let mut goaway = self.h2.peer_last_stream.to_be_bytes().to_vec();
                goaway.extend_from_slice(&PROTOCOL_ERROR.to_be_bytes());
                frame(&mut self.tx_plain, http2::GOAWAY, 0, 0, &goaway);
                self.peer_gone.get_or_insert(io::Error::new(io::ErrorKind::InvalidData, "PUSH_PROMISE"));
            }
            _ => {}
        }
    }

    /// Each stream: received bytes to the application, END_STREAM as its shutdown, its bytes to the peer as DATA.
    fn pump_streams(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            let wire = self.h2.streams.get(&id).copied();
            let Some(s) = self.streams.get_mut(&id) else { continue };
            if s.failed.is_some() {
                continue;
            }
            // Peer → application.
            while s.to_app_at < s.to_app.len() {
                match std::pin::Pin::new(&mut s.app).poll_write(cx, &s.to_app[s.to_app_at..]) {
                    Poll::Ready(Ok(0)) => {
                        s.failed = Some(io::ErrorKind::WriteZero.into());
                        break;
                    }
                    Poll::Ready(Ok(n)) => {
                        s.to_app_at += n;
                        s.moved.1 += n as u64;
                        s.credit += n as i64;
                        self.conn_credit += n as i64;
                        progress = true;
                    }
                    Poll::Ready(Err(e)) => {
                        s.failed = Some(e);
                        break;
                    }
                    Poll::Pending => break,
                }
            }
            if s.to_app_at == s.to_app.len() {
                s.to_app.clear();
                s.to_app_at = 0;
                let remote_end = wire.is_none_or(|w| w.remote_end);
                if remote_end && !s.app_shut {
                    if let Poll::Ready(r) = std::pin::Pin::new(&mut s.app).poll_shutdown(cx) {
                        s.app_shut = true;
                        progress = true;
                        if let Err(e) = r {
                            s.failed = Some(e);
                        }
                    }
                }
            }
            let Some(w) = wire else { continue };
            // Window back to the peer for what the application took.
            if s.credit > 0 && !w.remote_end && (s.credit >= CREDIT_STEP || s.to_app.is_empty()) {
                frame(&mut self.tx_plain, http2::WINDOW_UPDATE, 0, id, &(s.credit as u32).to_be_bytes());
                self.h2.sent(
                    Head { len: 4, typ: http2::WINDOW_UPDATE, flags: 0, stream: id },
                    &(s.credit as u32).to_be_bytes(),
                );
                s.credit = 0;
            }
            // Application → peer, within both windows and the peer's frame size.
            if w.local_end || s.failed.is_some() || self.peer_gone.is_some() {
                continue;
            }
            loop {
                if self.tx_tls.len() - self.tx_at > TX_HIGH {
                    break;
                }
                let Some(w) = self.h2.streams.get(&id).copied() else { break };
                if s.to_peer_at < s.to_peer.len() {
                    let room = w.send.min(self.h2.send).min(self.h2.peer_max_frame as i64);
                    if room <= 0 {
                        break;
                    }
                    let n = (room as usize).min(s.to_peer.len() - s.to_peer_at);
                    let chunk = &s.to_peer[s.to_peer_at..s.to_peer_at + n];
                    let h = Head { len: n, typ: http2::DATA, flags: 0, stream: id };
                    frame(&mut self.tx_plain, h.typ, 0, id, chunk);
                    self.h2.sent(h, &[]);
                    s.to_peer_at += n;
                    s.moved.0 += n as u64;
                    if self.tx_plain.len() > 64 * 1024 {
                        let plain = std::mem::take(&mut self.tx_plain);
                        self.records.seal(&plain, &mut self.tx_tls);
                    }
                    progress = true;
                    continue;
                }
                s.to_peer.clear();
                s.to_peer_at = 0;
                if s.app_eof {
                    let h = Head { len: 0, typ: http2::DATA, flags: http2::END_STREAM, stream: id };
                    frame(&mut self.tx_plain, h.typ, h.flags, id, &[]);
                    self.h2.sent(h, &[]);
                    progress = true;
                    break;
                }
                if w.send <= 0 || self.h2.send <= 0 {
                    break;
                }
                if s.app.poll_read_ready(cx).is_pending() {
                    break;
                }
                s.to_peer.reserve(READ_CHUNK);
                match s.app.try_read_buf(&mut s.to_peer) {
                    Ok(0) => s.app_eof = true,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => {
                        s.failed = Some(e);
                        break;
                    }
                }
                progress = true;
            }
        }
        // The connection's window.
        if self.conn_credit >= CREDIT_STEP.min(self.conn_window / 2) && self.peer_gone.is_none() {
            let inc = (self.conn_credit as u32).to_be_bytes();
            frame(&mut self.tx_plain, http2::WINDOW_UPDATE, 0, 0, &inc);
            self.h2.sent(Head { len: 4, typ: http2::WINDOW_UPDATE, flags: 0, stream: 0 }, &inc);
            self.conn_credit = 0;
        }
        progress
    }

    /// Streams that are over: both ends done and everything delivered, or failed.
    fn reap(&mut self) {
        let done: Vec<u32> = self
            .streams
            .iter()
            .filter(|(id, s)| {
                let wire = self.h2.streams.get(id);
                let finished = wire.is_none() && s.to_app.is_empty() && s.app_shut && s.to_peer.is_empty();
                finished || s.failed.is_some()
            })
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            let Some(mut s) = self.streams.remove(&id) else { continue };
            let failed = s.failed.take();
            if failed.is_some() && self.h2.streams.remove(&id).is_some() && self.peer_gone.is_none() {
                frame(&mut self.tx_plain, http2::RST_STREAM, 0, id, &CANCEL.to_be_bytes());
            }
            self.ended.push(StreamEnd { id, result: failed.map_or(Ok(()), Err), moved: s.moved });
        }
    }

    fn write_peer(&mut self, cx: &mut Context<'_>) -> io::Result<bool> {
        let mut wrote = false;
        while self.tx_at < self.tx_tls.len() {
            match std::pin::Pin::new(&mut self.tcp).poll_write(cx, &self.tx_tls[self.tx_at..]) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => {
                    self.tx_at += n;
                    wrote = true;
                }
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => break,
            }
        }
        if self.tx_at == self.tx_tls.len() {
            self.tx_tls.clear();
            self.tx_at = 0;
        }
        Ok(wrote)
    }
}

/// The TLS sessions HBONE runs h2 over (client and server side), as a hand-over takes them apart.
pub trait Session: tokio::io::AsyncRead + AsyncWrite + Unpin + Send {
    const IS_CLIENT: bool;
    fn socket_mut(&mut self) -> &mut crate::tls::TlsSocket;
    /// rustls holds ciphertext not yet written.
    fn wants_write(&self) -> bool;
    /// The socket, and the session's exported keys, suite and any plaintext it still held.
    fn split(self) -> Result<(crate::tls::TlsSocket, rustls::ExtractedSecrets, rustls::CipherSuite, Vec<u8>), String>;
}

macro_rules! session {
    ($t:ty, $client:expr) => {
        impl Session for $t {
            const IS_CLIENT: bool = $client;
            fn socket_mut(&mut self) -> &mut crate::tls::TlsSocket {
                self.get_mut().0
            }
            fn wants_write(&self) -> bool {
                self.get_ref().1.wants_write()
            }
            fn split(
                self,
            ) -> Result<(crate::tls::TlsSocket, rustls::ExtractedSecrets, rustls::CipherSuite, Vec<u8>), String> {
                use std::io::Read;
                let (io, mut conn) = self.into_inner();
                let mut plain = Vec::new();
                match conn.reader().read_to_end(&mut plain) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e.to_string()),
                }
                let suite = conn.negotiated_cipher_suite().ok_or("no cipher suite")?.suite();
                let secrets = conn.dangerous_extract_secrets().map_err(|e| e.to_string())?;
                Ok((io, secrets, suite, plain))
            }
        }
    };
}
session!(tokio_rustls::server::TlsStream<crate::tls::TlsSocket>, false);
session!(tokio_rustls::client::TlsStream<crate::tls::TlsSocket>, true);

/// Predecessor: bring an h2 connection to rest. Its reads stop at a frame boundary, and it is polled (`poll_conn`,
/// which drives it: `poll_accept` on the server side, the connection future on the client's) until it has processed
/// every frame it was given and written everything it had to, through to the socket. Its streams' relays must be
/// paused first (they give h2 nothing more to send). Fails if that takes longer than `wait`, or the connection ends.
pub async fn quiesce<S: Session>(
    shared: &http2::Shared<S>,
    mut poll_conn: impl FnMut(&mut Context<'_>) -> Poll<bool>,
    wait: std::time::Duration,
) -> Result<(), String> {
    shared.lock().pause();
    let deadline = tokio::time::Instant::now() + wait;
    let mut spins = 0u32;
    loop {
        let done = std::future::poll_fn(|cx| {
            let before = shared.lock().written;
            if let Poll::Ready(false) = poll_conn(cx) {
                return Poll::Ready(Err("the connection ended".to_string()));
            }
            let g = shared.lock();
            let flushed = g.io.as_ref().is_some_and(|io| !io.wants_write());
            Poll::Ready(Ok(g.is_quiet() && g.sent_whole() && flushed && g.written == before))
        })
        .await?;
        if done {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            shared.lock().resume(Vec::new());
            return Err("the connection did not come to rest".into());
        }
        spins += 1;
        if spins < 16 {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}

/// What a connection at rest is made of once taken from h2 and rustls.
pub struct Taken {
    pub tcp: TcpStream,
    pub tls: TlsState,
    pub h2: H2State,
    pub ciphertext: Vec<u8>,
    pub plaintext: Vec<u8>,
}

/// Predecessor: read the TLS record in flight to its end (within `wait`), so rustls holds no part of one: the
/// plaintext read from the session past h2's last frame. On failure the connection carries on, h2 given that
/// plaintext first.
pub async fn finish_record<S: Session>(
    shared: &http2::Shared<S>,
    wait: std::time::Duration,
) -> Result<Vec<u8>, String> {
    let mut plaintext = Vec::new();
    let finish = std::future::poll_fn(|cx| {
        let mut g = shared.lock();
        let Some(io) = g.io_mut() else { return Poll::Ready(Err("taken already".to_string())) };
        io.socket_mut().finish_record();
        loop {
            let mid = io.socket_mut().mid_record();
            let mut buf = [0u8; 8192];
            let mut rb = tokio::io::ReadBuf::new(&mut buf);
            // Pending once the record is through (the socket hands up nothing more), or while its rest is on the way.
            match std::pin::Pin::new(&mut *io).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if rb.filled().is_empty() => {
                    return Poll::Ready(Err("the peer closed the connection".into()))
                }
                Poll::Ready(Ok(())) => plaintext.extend_from_slice(rb.filled()),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.to_string())),
                Poll::Pending if mid => return Poll::Pending,
                Poll::Pending => return Poll::Ready(Ok(())),
            }
        }
    });
    let outcome = match tokio::time::timeout(wait, finish).await {
        Ok(r) => r,
        Err(_) => Err("the peer did not finish its TLS record".into()),
    };
    let mut g = shared.lock();
    let pending_write = g.io.as_ref().is_some_and(|io| io.wants_write());
    match outcome {
        Ok(()) if !pending_write => Ok(plaintext),
        failed => {
            if let Some(io) = g.io_mut() {
                io.socket_mut().unfinish();
            }
            g.resume(plaintext);
            Err(failed.err().unwrap_or_else(|| "TLS records not yet written".into()))
        }
    }
}

/// Predecessor: take a connection at rest (`quiesce`, then `finish_record`, whose plaintext is `plaintext`) out
/// from under h2 and rustls. From then on h2 reaches nothing on the wire, and there is no way back to rustls: the
/// caller carries the connection on with `Engine` whatever happens next.
pub fn take_session<S: Session>(
    shared: &http2::Shared<S>,
    logged: &tls13::Secrets,
    mut plaintext: Vec<u8>,
) -> Result<Taken, String> {
    let (io, h2) = {
        let mut g = shared.lock();
        (g.take().ok_or("taken already")?, g.state.clone())
    };
    let (mut sock, secrets, suite, rest) = io.split()?;
    plaintext.extend_from_slice(&rest);
    let tls = tls13::from_rustls(secrets, suite, logged, S::IS_CLIENT).map_err(|e| e.to_string())?;
    let ciphertext = sock.take_buffered();
    Ok(Taken { tcp: sock.into_inner(), tls, h2, ciphertext, plaintext })
}

fn tokio_socket(fd: std::os::fd::OwnedFd) -> io::Result<TcpStream> {
    let s = std::net::TcpStream::from(fd);
    s.set_nonblocking(true)?;
    TcpStream::from_std(s)
}

impl super::HboneReceived {
    /// The engine for a connection taken in, its sockets registered with the calling thread's reactor, and its
    /// streams' ids in `metas`' order.
    pub fn into_engine(
        self,
        fds: Vec<std::os::fd::OwnedFd>,
    ) -> Result<(Engine, Vec<u32>, Vec<super::ConnMeta>), String> {
        let mut socks = fds.into_iter().map(tokio_socket).collect::<io::Result<Vec<_>>>().map_err(|e| e.to_string())?;
        if socks.is_empty() {
            return Err("an HBONE connection without its socket".into());
        }
        let tcp = socks.remove(0);
        let ids = self.conn.streams.iter().map(|s| s.id).collect();
        Ok((Engine::new(tcp, self.conn, socks)?, ids, self.metas))
    }
}
