//! The HTTP/2 side of an HBONE connection's hand-over: what the wire says about the connection (`Watch`), learned by
//! reading the frames that pass between h2 and TLS (`Tap`), so it can be handed to a successor that is not h2.
//!
//! h2 keeps its connection state private. What a successor needs is what both peers agree on, and that is on the
//! wire: which streams are open and which ends are closed, both flow-control windows of the connection and of each
//! stream, the peer's settings. The tap follows the frame headers both ways (and the few payloads that change that
//! state: SETTINGS, WINDOW_UPDATE, RST_STREAM, GOAWAY); it copies no DATA. To hand over, it stops at a frame boundary
//! (`Tap::pause`): h2 is given the rest of the frame it is in and then nothing, so every frame h2 was given is whole
//! and processed, and what was read past it stays in the tap's hands.

use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const FRAME_HEADER: usize = 9;
pub const DEFAULT_WINDOW: i64 = 65_535;
pub const DEFAULT_MAX_FRAME: u32 = 16_384;

pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const PRIORITY: u8 = 2;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const PUSH_PROMISE: u8 = 5;
pub const PING: u8 = 6;
pub const GOAWAY: u8 = 7;
pub const WINDOW_UPDATE: u8 = 8;
pub const CONTINUATION: u8 = 9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;

const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;

/// A frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub len: usize,
    pub typ: u8,
    pub flags: u8,
    pub stream: u32,
}

impl Head {
    pub fn parse(b: &[u8]) -> Head {
        Head {
            len: (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize,
            typ: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        let l = self.len as u32;
        out.extend_from_slice(&[(l >> 16) as u8, (l >> 8) as u8, l as u8, self.typ, self.flags]);
        out.extend_from_slice(&self.stream.to_be_bytes());
    }
}

/// Whether a frame's payload changes the state `Watch` keeps (the rest are skipped, not copied).
fn kept(typ: u8) -> bool {
    matches!(typ, SETTINGS | WINDOW_UPDATE | RST_STREAM | GOAWAY)
}

/// Follows the frames of one direction across arbitrary cuts of the byte stream.
#[derive(Debug, Default)]
struct Parser {
    /// Connection preface bytes still to skip (the client's direction).
    preface_left: usize,
    head: [u8; FRAME_HEADER],
    head_seen: usize,
    /// The current frame (once its header is whole), its payload bytes still to come, and the payload kept.
    frame: Option<Head>,
    left: usize,
    payload: Vec<u8>,
}

impl Parser {
    fn new(preface: bool) -> Parser {
        Parser { preface_left: if preface { PREFACE.len() } else { 0 }, ..Default::default() }
    }

    fn at_boundary(&self) -> bool {
        self.preface_left == 0 && self.head_seen == 0 && self.frame.is_none()
    }

    /// Bytes to the end of the current frame (0 at a boundary; the header's rest while in a header, then at least
    /// one more byte so the header can be read).
    fn to_boundary(&self) -> usize {
        if self.preface_left > 0 {
            self.preface_left
        } else if self.head_seen > 0 {
            FRAME_HEADER - self.head_seen
        } else if self.frame.is_some() {
            self.left
        } else {
            0
        }
    }

    fn feed(&mut self, mut bytes: &[u8], mut on_frame: impl FnMut(Head, &[u8])) {
        while !bytes.is_empty() {
            if self.preface_left > 0 {
                let n = self.preface_left.min(bytes.len());
                self.preface_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            if let Some(h) = self.frame {
                let n = self.left.min(bytes.len());
                if kept(h.typ) && self.payload.len() < 4096 {
                    self.payload.extend_from_slice(&bytes[..n.min(4096 - self.payload.len())]);
                }
                self.left -= n;
                bytes = &bytes[n..];
                if self.left == 0 {
                    self.frame = None;
                    on_frame(h, &self.payload);
                    self.payload.clear();
                }
                continue;
            }
            let n = (FRAME_HEADER - self.head_seen).min(bytes.len());
            self.head[self.head_seen..self.head_seen + n].copy_from_slice(&bytes[..n]);
            self.head_seen += n;
            bytes = &bytes[n..];
            if self.head_seen == FRAME_HEADER {
                self.head_seen = 0;
                let h = Head::parse(&self.head);
                if h.len == 0 {
                    on_frame(h, &[]);
                } else {
                    self.frame = Some(h);
                    self.left = h.len;
                }
            }
        }
    }
}

/// One open stream as both peers see it. `send`: what we may still send on it; `recv`: what the peer may still send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamWire {
    pub send: i64,
    pub recv: i64,
    /// We sent END_STREAM / the peer did.
    pub local_end: bool,
    pub remote_end: bool,
}

/// An HTTP/2 connection's state, as the frames that crossed define it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct H2State {
    pub is_client: bool,
    /// The connection's windows: what we may send, what the peer may.
    pub send: i64,
    pub recv: i64,
    /// The initial stream windows in force: the peer's (for our sending), ours (for its).
    pub peer_initial: i64,
    pub our_initial: i64,
    pub peer_max_frame: u32,
    /// The highest stream id the peer opened.
    pub peer_last_stream: u32,
    pub streams: BTreeMap<u32, StreamWire>,
    /// A GOAWAY crossed: from the peer, from us.
    pub peer_goaway: bool,
    pub our_goaway: bool,
}

impl H2State {
    pub fn new(is_client: bool) -> H2State {
        H2State {
            is_client,
            send: DEFAULT_WINDOW,
            recv: DEFAULT_WINDOW,
            peer_initial: DEFAULT_WINDOW,
            our_initial: DEFAULT_WINDOW,
            peer_max_frame: DEFAULT_MAX_FRAME,
            peer_last_stream: 0,
            streams: BTreeMap::new(),
            peer_goaway: false,
            our_goaway: false,
        }
    }

    fn peer_opens(&self, id: u32) -> bool {
        // Clients open odd streams.
        (id % 2 == 1) != self.is_client
    }

    fn settle(&mut self, id: u32) {
        if let Some(s) = self.streams.get(&id) {
            if s.local_end && s.remote_end {
                self.streams.remove(&id);
            }
        }
    }

    fn open(&mut self, id: u32) -> &mut StreamWire {
        let (send, recv) = (self.peer_initial, self.our_initial);
        self.streams.entry(id).or_insert(StreamWire { send, recv, local_end: false, remote_end: false })
    }

    /// A frame from the peer.
    pub fn received(&mut self, h: Head, payload: &[u8]) {
        match h.typ {
            DATA => {
                self.recv -= h.len as i64;
                if let Some(s) = self.streams.get_mut(&h.stream) {
                    s.recv -= h.len as i64;
                    if h.flags & END_STREAM != 0 {
                        s.remote_end = true;
                    }
                }
                self.settle(h.stream);
            }
            HEADERS => {
                if self.peer_opens(h.stream) && !self.streams.contains_key(&h.stream) {
                    if h.stream <= self.peer_last_stream {
                        return; // a closed stream's trailers, or refused
                    }
                    self.peer_last_stream = h.stream;
                    self.open(h.stream);
                }
                if h.flags & END_STREAM != 0 {
                    if let Some(s) = self.streams.get_mut(&h.stream) {
                        s.remote_end = true;
                    }
                    self.settle(h.stream);
                }
            }
            WINDOW_UPDATE if payload.len() >= 4 => {
                let inc = (u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff) as i64;
                if h.stream == 0 {
                    self.send += inc;
                } else if let Some(s) = self.streams.get_mut(&h.stream) {
                    s.send += inc;
                }
            }
            SETTINGS if h.flags & ACK == 0 => {
                for s in payload.chunks_exact(6) {
                    let (id, v) = (u16::from_be_bytes([s[0], s[1]]), u32::from_be_bytes([s[2], s[3], s[4], s[5]]));
                    match id {
                        SETTINGS_INITIAL_WINDOW_SIZE => {
                            let delta = v as i64 - self.peer_initial;
                            self.peer_initial = v as i64;
                            self.streams.values_mut().for_each(|s| s.send += delta);
                        }
                        SETTINGS_MAX_FRAME_SIZE => self.peer_max_frame = v,
                        _ => {}
                    }
                }
            }
            RST_STREAM => {
                self.streams.remove(&h.stream);
            }
            GOAWAY => self.peer_goaway = true,
            _ => {}
        }
    }

    /// A frame we sent. Our settings are taken as in force once sent (a connection handed over has long had them
    /// acknowledged).
    pub fn sent(&mut self, h: Head, payload: &[u8]) {
        match h.typ {
            DATA => {
                self.send -= h.len as i64;
                if let Some(s) = self.streams.get_mut(&h.stream) {
                    s.send -= h.len as i64;
                    if h.flags & END_STREAM != 0 {
                        s.local_end = true;
                    }
                }
                self.settle(h.stream);
            }
            HEADERS => {
                if !self.peer_opens(h.stream) {
                    self.open(h.stream);
                }
                if h.flags & END_STREAM != 0 {
                    if let Some(s) = self.streams.get_mut(&h.stream) {
                        s.local_end = true;
                    }
                    self.settle(h.stream);
                }
            }
            WINDOW_UPDATE if payload.len() >= 4 => {
                let inc = (u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff) as i64;
                if h.stream == 0 {
                    self.recv += inc;
                } else if let Some(s) = self.streams.get_mut(&h.stream) {
                    s.recv += inc;
                }
            }
            SETTINGS if h.flags & ACK == 0 => {
                for s in payload.chunks_exact(6) {
                    let (id, v) = (u16::from_be_bytes([s[0], s[1]]), u32::from_be_bytes([s[2], s[3], s[4], s[5]]));
                    if id == SETTINGS_INITIAL_WINDOW_SIZE {
                        let delta = v as i64 - self.our_initial;
                        self.our_initial = v as i64;
                        self.streams.values_mut().for_each(|s| s.recv += delta);
                    }
                }
            }
            RST_STREAM => {
                self.streams.remove(&h.stream);
            }
            GOAWAY => self.our_goaway = true,
            _ => {}
        }
    }
}

/// What the tap shares between h2 (which owns the `Tap`) and the connection's task, which takes the session out
/// from under h2 at a hand-over.
pub struct TapInner<T> {
    pub(super) io: Option<T>,
    pub state: H2State,
    rx: Parser,
    tx: Parser,
    /// Stopping at the next frame boundary of what is handed to h2, and reached it (h2 asked for more after).
    pausing: bool,
    quiet: bool,
    /// Bytes written through the tap.
    pub written: u64,
    /// Plaintext read from the session for a hand-over that then did not happen: h2 gets it first.
    replay: Vec<u8>,
    replay_at: usize,
}

pub type Shared<T> = Arc<Mutex<TapInner<T>>>;

/// The I/O h2 is given: the TLS session, with every frame both ways followed.
pub struct Tap<T> {
    shared: Shared<T>,
}

impl<T> Tap<T> {
    pub fn new(io: T, is_client: bool) -> (Tap<T>, Shared<T>) {
        let shared = Arc::new(Mutex::new(TapInner {
            io: Some(io),
            state: H2State::new(is_client),
            rx: Parser::new(!is_client),
            tx: Parser::new(is_client),
            pausing: false,
            quiet: false,
            written: 0,
            replay: Vec::new(),
            replay_at: 0,
        }));
        (Tap { shared: shared.clone() }, shared)
    }
}

impl<T> TapInner<T> {
    /// Hand h2 the rest of the frame it is reading, and nothing after it.
    pub fn pause(&mut self) {
        self.pausing = true;
        self.quiet = false;
    }

    /// h2 has every frame it was given whole, and asked for more since the pause.
    pub fn is_quiet(&self) -> bool {
        self.quiet && self.rx.at_boundary()
    }

    /// Whether what we sent ends at a frame boundary (h2 writes whole frames, so it does once flushed).
    pub fn sent_whole(&self) -> bool {
        self.tx.at_boundary()
    }

    /// Carry on (the hand-over did not take this connection), h2 first given `replay`: plaintext read from the
    /// session after h2's last frame.
    pub fn resume(&mut self, replay: Vec<u8>) {
        self.pausing = false;
        self.quiet = false;
        self.replay = replay;
        self.replay_at = 0;
    }

    pub fn io_mut(&mut self) -> Option<&mut T> {
        self.io.as_mut()
    }

    /// Take the session from under h2: h2's later reads and writes fail, so nothing more reaches the wire from it.
    pub fn take(&mut self) -> Option<T> {
        self.io.take()
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "handed over")
}

impl<T: AsyncRead + Unpin> AsyncRead for Tap<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let mut g = self.shared.lock();
        let inner = &mut *g;
        let limit = if inner.pausing { inner.rx.to_boundary() } else { usize::MAX };
        if limit == 0 {
            // At the boundary: h2 gets no more. Nothing will wake it; the connection's task polls it again itself.
            inner.quiet = true;
            return Poll::Pending;
        }
        let before = out.filled().len();
        if inner.replay_at < inner.replay.len() {
            let n = out.remaining().min(inner.replay.len() - inner.replay_at);
            out.put_slice(&inner.replay[inner.replay_at..inner.replay_at + n]);
            inner.replay_at += n;
            if inner.replay_at == inner.replay.len() {
                inner.replay = Vec::new();
                inner.replay_at = 0;
            }
            let TapInner { rx, state, .. } = inner;
            rx.feed(&out.filled()[before..], |h, p| state.received(h, p));
            return Poll::Ready(Ok(()));
        }
        let Some(io) = inner.io.as_mut() else { return Poll::Ready(Err(gone())) };
        let r = if limit < out.remaining() {
            let mut sub = out.take(limit);
            let r = Pin::new(io).poll_read(cx, &mut sub);
            let n = sub.filled().len();
            // SAFETY: `sub` filled (so initialized) the first `n` bytes of `out`'s unfilled part.
            unsafe { out.assume_init(n) };
            out.advance(n);
            r
        } else {
            Pin::new(io).poll_read(cx, out)
        };
        let TapInner { rx, state, .. } = inner;
        rx.feed(&out.filled()[before..], |h, p| state.received(h, p));
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tap<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let mut g = self.shared.lock();
        let inner = &mut *g;
        let Some(io) = inner.io.as_mut() else { return Poll::Ready(Err(gone())) };
        let r = Pin::new(io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            let TapInner { tx, state, written, .. } = inner;
            *written += n as u64;
            tx.feed(&buf[..n], |h, p| state.sent(h, p));
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut g = self.shared.lock();
        let inner = &mut *g;
        let Some(io) = inner.io.as_mut() else { return Poll::Ready(Err(gone())) };
        let r = Pin::new(io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(mut n)) = r {
            let TapInner { tx, state, written, .. } = inner;
            *written += n as u64;
            for b in bufs {
                if n == 0 {
                    break;
                }
                let k = n.min(b.len());
                tx.feed(&b[..k], |h, p| state.sent(h, p));
                n -= k;
            }
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.shared.lock().io.as_ref().is_some_and(|io| io.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut g = self.shared.lock();
        let Some(io) = g.io.as_mut() else { return Poll::Ready(Err(gone())) };
        Pin::new(io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut g = self.shared.lock();
        let Some(io) = g.io.as_mut() else { return Poll::Ready(Err(gone())) };
        Pin::new(io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(typ: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        Head { len: payload.len(), typ, flags, stream }.write(&mut v);
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn the_state_follows_frames_cut_anywhere() {
        let mut wire = PREFACE.to_vec();
        wire.extend(frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0x10, 0]));
        wire.extend(frame(HEADERS, 0x4, 1, b"hpack"));
        wire.extend(frame(DATA, 0, 1, &[0; 1000]));
        wire.extend(frame(WINDOW_UPDATE, 0, 0, &1000u32.to_be_bytes()));
        wire.extend(frame(HEADERS, 0x4, 3, b"x"));
        wire.extend(frame(RST_STREAM, 0, 3, &8u32.to_be_bytes()));
        for cut in [1, 2, 7, 9, 10, 33, 1000] {
            // As the server receives it: the client's preface, settings (initial window 4096), streams.
            let mut st = H2State::new(false);
            let mut p = Parser::new(true);
            for chunk in wire.chunks(cut) {
                p.feed(chunk, |h, pl| st.received(h, pl));
            }
            assert!(p.at_boundary());
            assert_eq!(st.peer_initial, 4096);
            assert_eq!(st.recv, DEFAULT_WINDOW - 1000);
            assert_eq!(st.send, DEFAULT_WINDOW + 1000);
            assert_eq!(st.peer_last_stream, 3);
            assert_eq!(st.streams.keys().copied().collect::<Vec<_>>(), vec![1], "3 was reset");
            assert_eq!(st.streams[&1].recv, DEFAULT_WINDOW - 1000);
            assert_eq!(st.streams[&1].send, 4096);
        }
    }
}
