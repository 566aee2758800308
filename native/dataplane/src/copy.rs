//! The copy loops: TCP↔TCP and TCP↔HTTP/2 stream.
//!
//! Invariants:
//! - The two directions are independent. EOF in one direction is propagated (shutdown(write) on TCP, END_STREAM
//!   on HTTP/2) and the other direction keeps going; an error in either direction ends both.
//! - Buffers start small and grow with the bytes moved (1 KiB → 16 KiB after 128 KiB → 256 KiB after 10 MiB), so
//!   idle connections cost little and bulk transfers make few syscalls (ztunnel #1024, #1169).
//! - Neither relay holds a buffer while its socket has nothing to read: an idle connection costs no copy buffer at
//!   all (the buffer is allocated once the socket is readable).
//! - Between two polls a relay's whole state is its fields: the TCP ⇄ TCP relay can be paused, handed to a successor
//!   daemon and resumed there (`TcpRelay::into_parts`/`resume`, `handover`).
//! - Data read from TCP is handed to h2 as `Bytes` without another copy.
//! - Every chunk moved is added to the connection's byte counters.
//! - TCP → HTTP/2 counts what it reads against the node's buffer budget until the connection writes it
//!   (`budget.rs`), and stops reading while the node is over budget and its connection is a heavy holder.

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{ready, Context, Poll};

/// Counts one direction's bytes twice: for this connection (the access log) and for its metrics bucket (visible to
/// scrapes while the connection is still open). Two relaxed adds per chunk.
pub struct Tally<'a> {
    pub connection: AtomicU64,
    pub shared: Option<&'a AtomicU64>,
}

impl<'a> Tally<'a> {
    pub fn new(shared: Option<&'a AtomicU64>) -> Tally<'a> {
        Tally { connection: AtomicU64::new(0), shared }
    }

    pub fn add(&self, n: u64) {
        self.connection.fetch_add(n, Ordering::Relaxed);
        if let Some(s) = self.shared {
            s.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn get(&self) -> u64 {
        self.connection.load(Ordering::Relaxed)
    }
}

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use tokio::io::AsyncWrite;

const SMALL: usize = 1024;
const MEDIUM: usize = 16 * 1024 - 64;
const LARGE: usize = 256 * 1024 - 64;
const TO_MEDIUM_AFTER: u64 = 128 * 1024;
const TO_LARGE_AFTER: u64 = 10 * 1024 * 1024;

/// The read size to use after `moved` bytes.
pub fn buffer_size(moved: u64) -> usize {
    if moved >= TO_LARGE_AFTER {
        LARGE
    } else if moved >= TO_MEDIUM_AFTER {
        MEDIUM
    } else {
        SMALL
    }
}

pub fn h2_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        e.into_io().unwrap_or_else(|| io::Error::other("HTTP/2 I/O error"))
    } else {
        io::Error::new(io::ErrorKind::ConnectionReset, e)
    }
}

/// Copy both directions between a TCP stream and an HTTP/2 stream until both are done or one fails. `buffers`: the
/// HTTP/2 connection's share of the buffer budget, when its writer is `Metered` (not for a double-HBONE inner
/// stream, whose connection is itself carried by a stream). Resolves to the bytes moved (TCP → HTTP/2, HTTP/2 → TCP).
pub fn tcp_h2_bidirectional<'a, 't>(
    tcp: tokio::net::TcpStream,
    send: SendStream<Bytes>,
    recv: RecvStream,
    to_h2: &'a Tally<'t>,
    from_h2: &'a Tally<'t>,
    buffers: Option<std::sync::Arc<crate::budget::ConnBuffers>>,
) -> H2Relay<'a, 't> {
    // Counted from before any of the stream's data moves either way.
    let meter = buffers.map(|b| b.stream(u32::from(send.stream_id())));
    let receiver = meter.as_ref().map(|m| m.receiver());
    H2Relay {
        tcp,
        send,
        recv,
        to_h2,
        from_h2,
        meter,
        receiver,
        admit: None,
        buf: Vec::new(),
        out: Bytes::new(),
        out_len: 0,
        up_moved: 0,
        up_done: false,
        down: None,
        down_moved: 0,
        down_state: Down::Data,
    }
}

/// Where the HTTP/2 → TCP direction is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Down {
    /// Reading DATA (or writing one chunk: `H2Relay::down`).
    Data,
    /// END_STREAM seen: shutting down the socket's write side.
    Shutdown,
    Done,
}

/// Both directions of a TCP ⇄ HTTP/2 stream relay as one poll-based state machine: what an idle tunneled connection
/// holds is these fields (a few hundred bytes), not two async state machines and a split socket's shared half.
///
/// TCP → HTTP/2: waits for the socket's readiness without a buffer, reads into one that grows with the bytes moved
/// (`buffer_size`), hands the data to h2 as `Bytes` (no copy) as the peer's flow control grants capacity, and sends
/// END_STREAM at EOF; while the node is over its buffer budget and this stream's connection is a heavy holder it
/// does not read (`StreamMeter::held_back`). HTTP/2 → TCP: writes each DATA chunk to the socket and releases its
/// flow-control capacity only once written (so a slow reader pushes back on the sender); END_STREAM → shutdown(write).
/// An error either way ends both.
pub struct H2Relay<'a, 't> {
    tcp: tokio::net::TcpStream,
    send: SendStream<Bytes>,
    recv: RecvStream,
    to_h2: &'a Tally<'t>,
    from_h2: &'a Tally<'t>,
    meter: Option<crate::budget::StreamMeter>,
    receiver: Option<crate::budget::RecvMeter>,
    /// The budget's wait, only while held back.
    admit: Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// TCP → HTTP/2: the read buffer (empty while the socket has nothing to read), the chunk h2 has not taken yet
    /// and its size when read (counted once all of it is handed over).
    /// The next read's buffer: a fresh allocation of `buffer_size`, shrunk to what was read and handed to h2 whole.
    buf: Vec<u8>,
    out: Bytes,
    out_len: usize,
    up_moved: u64,
    up_done: bool,
    /// HTTP/2 → TCP: the chunk being written (and how much of it is written).
    down: Option<(Bytes, usize)>,
    down_moved: u64,
    down_state: Down,
}

/// A paused `H2Relay`'s state, for a hand-over: the socket, the stream's handles, the bytes read from the socket and
/// not yet given to h2, the chunk being written to the socket and how much of it is, which ends are done, and the
/// bytes moved (TCP → HTTP/2, HTTP/2 → TCP).
pub struct H2Parts {
    pub tcp: tokio::net::TcpStream,
    pub send: SendStream<Bytes>,
    pub recv: RecvStream,
    pub to_h2: Bytes,
    pub to_tcp: Option<(Bytes, usize)>,
    pub up_done: bool,
    /// END_STREAM was received (the socket's write side is being or was shut down), and it was.
    pub down_ended: bool,
    pub down_shut: bool,
    pub moved: (u64, u64),
}

impl<'a, 't> H2Relay<'a, 't> {
    /// Stop here: the relay's whole state (between two polls nothing else holds any of it).
    pub fn into_parts(self) -> H2Parts {
        // A chunk is counted once all of it is with h2; of one paused halfway, what h2 has is counted here.
        let partly = if self.out.is_empty() { 0 } else { (self.out_len - self.out.len()) as u64 };
        self.to_h2.add(partly);
        H2Parts {
            tcp: self.tcp,
            send: self.send,
            recv: self.recv,
            to_h2: self.out,
            to_tcp: self.down,
            up_done: self.up_done,
            down_ended: self.down_state != Down::Data,
            down_shut: self.down_state == Down::Done,
            moved: (self.up_moved + partly, self.down_moved),
        }
    }

    pub fn stream_id(&self) -> u32 {
        u32::from(self.send.stream_id())
    }
}

/// What h2 received for a stream and has not yet handed out, taken without giving the window back (the hand-over's
/// successor does, as it delivers the bytes): appended to `into`; true if the stream's END_STREAM came too.
pub fn drain_received(recv: &mut RecvStream, into: &mut Vec<u8>) -> io::Result<bool> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    loop {
        match recv.poll_data(&mut cx) {
            Poll::Ready(Some(Ok(chunk))) => into.extend_from_slice(&chunk),
            Poll::Ready(Some(Err(e))) => return Err(h2_io(e)),
            Poll::Ready(None) => return Ok(true),
            Poll::Pending => return Ok(recv.is_end_stream()),
        }
    }
}

impl H2Relay<'_, '_> {
    fn poll_up(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if !self.out.is_empty() {
                self.send.reserve_capacity(self.out.len());
                let granted = match self.send.poll_capacity(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(None) => {
                        return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, "HTTP/2 stream closed")))
                    }
                    Poll::Ready(Some(r)) => r.map_err(h2_io)?,
                };
                if granted == 0 {
                    continue;
                }
                let chunk = self.out.split_to(granted.min(self.out.len()));
                self.send.send_data(chunk, false).map_err(h2_io)?;
                if self.out.is_empty() {
                    self.up_moved += self.out_len as u64;
                    self.to_h2.add(self.out_len as u64);
                }
                continue;
            }
            if self.up_done {
                return Poll::Ready(Ok(()));
            }
            // Readiness is polled on the socket itself; about to wait for the peer, wait without a buffer.
            if self.tcp.poll_read_ready(cx).is_pending() {
                self.buf = Vec::new();
                return Poll::Pending;
            }
            if let Some(m) = &self.meter {
                if self.admit.is_none() {
                    self.admit = m.held_back().map(|w| Box::pin(w) as _);
                }
                if let Some(wait) = &mut self.admit {
                    ready!(wait.as_mut().poll(cx));
                    self.admit = None;
                }
            }
            if self.buf.capacity() == 0 {
                self.buf.reserve_exact(buffer_size(self.up_moved));
            }
            let n = match self.tcp.try_read_buf(&mut self.buf) {
                Ok(n) => n,
                // Not readable after all: poll_read_ready registers for the next readiness.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            };
            if n == 0 {
                self.send.send_data(Bytes::new(), true).map_err(h2_io)?;
                self.up_done = true;
                self.buf = Vec::new();
                return Poll::Ready(Ok(()));
            }
            // Counted before h2 has it: the connection may write it (and take it off) as soon as it is handed over.
            if let Some(m) = &self.meter {
                m.queued(n);
            }
            // What h2 holds is what the budget counts, `n`, and the memory behind it is that too: the buffer is
            // shrunk to what was read (glibc's realloc gives the tail back in place, without copying) and handed
            // over whole, so no queued chunk pins a larger allocation (issue #29: the budget counted lengths while
            // partly filled buffers stayed resident).
            let mut chunk = std::mem::take(&mut self.buf);
            chunk.shrink_to_fit();
            self.out = Bytes::from(chunk);
            self.out_len = n;
        }
    }

    fn poll_down(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            match self.down_state {
                Down::Done => return Poll::Ready(Ok(())),
                Down::Shutdown => {
                    ready!(std::pin::Pin::new(&mut self.tcp).poll_shutdown(cx))?;
                    self.down_state = Down::Done;
                }
                Down::Data => {
                    if let Some((chunk, written)) = &mut self.down {
                        while *written < chunk.len() {
                            let n = ready!(std::pin::Pin::new(&mut self.tcp).poll_write(cx, &chunk[*written..]))?;
                            if n == 0 {
                                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                            }
                            *written += n;
                        }
                        let n = chunk.len();
                        self.down = None;
                        self.recv.flow_control().release_capacity(n).map_err(h2_io)?;
                        if let Some(m) = &self.receiver {
                            m.delivered(n);
                        }
                        self.down_moved += n as u64;
                        self.from_h2.add(n as u64);
                    }
                    match ready!(self.recv.poll_data(cx)) {
                        Some(chunk) => self.down = Some((chunk.map_err(h2_io)?, 0)),
                        None => self.down_state = Down::Shutdown,
                    }
                }
            }
        }
    }
}

impl Future for H2Relay<'_, '_> {
    type Output = io::Result<(u64, u64)>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let me = self.get_mut();
        let up = me.poll_up(cx)?;
        let down = me.poll_down(cx)?;
        if up.is_ready() && down.is_ready() {
            return Poll::Ready(Ok((me.up_moved, me.down_moved)));
        }
        Poll::Pending
    }
}

/// Copy both directions between two TCP streams (a `TcpRelay`, which can be paused and handed to a successor).
pub fn tcp_bidirectional<'a>(
    a: tokio::net::TcpStream,
    b: tokio::net::TcpStream,
    a_to_b: &'a Tally<'_>,
    b_to_a: &'a Tally<'_>,
) -> TcpRelay<'a> {
    TcpRelay::resume(a, b, [LegState::default(), LegState::default()], [a_to_b, b_to_a])
}

/// Where one direction of a TCP ⇄ TCP relay is: what it read and has not written yet, how much it moved, and whether
/// it has seen its source's EOF. This is the whole state of a direction between two polls, which is what makes a
/// relay exact to pause, hand over (`handover`) and resume: no byte is in flight anywhere else.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LegState {
    /// Read from the source, not yet written to the destination.
    pub pending: Vec<u8>,
    /// Bytes written to the destination so far (in this process and the ones before it).
    pub moved: u64,
    pub end: LegEnd,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LegEnd {
    /// Still reading.
    #[default]
    Open,
    /// The source's EOF was read: what is pending is written, then the destination's write side is shut down.
    Eof,
    /// Shut down: this direction is over.
    Done,
}

/// One direction: the buffer is `buf[off..len]`, empty (and freed) while the source has nothing to read.
struct Leg {
    buf: Vec<u8>,
    off: usize,
    len: usize,
    moved: u64,
    end: LegEnd,
}

impl Leg {
    fn from_state(s: LegState) -> Leg {
        let len = s.pending.len();
        Leg { buf: s.pending, off: 0, len, moved: s.moved, end: s.end }
    }

    fn state(&self) -> LegState {
        LegState { pending: self.buf[self.off..self.len].to_vec(), moved: self.moved, end: self.end }
    }

    fn poll(
        &mut self,
        from: &tokio::net::TcpStream,
        to: &mut tokio::net::TcpStream,
        tally: &Tally<'_>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        use std::pin::Pin;
        loop {
            while self.off < self.len {
                let n = ready!(Pin::new(&mut *to).poll_write(cx, &self.buf[self.off..self.len]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.off += n;
                self.moved += n as u64;
                tally.add(n as u64);
            }
            match self.end {
                LegEnd::Done => return Poll::Ready(Ok(())),
                LegEnd::Eof => {
                    ready!(Pin::new(&mut *to).poll_shutdown(cx))?;
                    self.end = LegEnd::Done;
                    self.buf = Vec::new();
                    return Poll::Ready(Ok(()));
                }
                LegEnd::Open => {}
            }
            // Idle: wait for the source without holding a buffer.
            if from.poll_read_ready(cx).is_pending() {
                self.buf = Vec::new();
                (self.off, self.len) = (0, 0);
                return Poll::Pending;
            }
            let want = buffer_size(self.moved);
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
            match from.try_read(&mut self.buf) {
                Ok(0) => self.end = LegEnd::Eof,
                Ok(n) => (self.off, self.len) = (0, n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// Both directions of a TCP ⇄ TCP relay as one poll-based state machine: reads grow their buffer with the bytes moved
/// (`buffer_size`), an EOF becomes shutdown(write) on the other socket once what was read is written, the other
/// direction keeps going, and an error either way ends both. Resolves to the bytes moved (a → b, b → a).
///
/// Between two polls its state is exactly its fields, so `into_parts` (pause) and `resume` (on a successor) lose,
/// duplicate and reorder nothing.
pub struct TcpRelay<'a> {
    a: tokio::net::TcpStream,
    b: tokio::net::TcpStream,
    ab: Leg,
    ba: Leg,
    tallies: [&'a Tally<'a>; 2],
}

impl<'a> TcpRelay<'a> {
    /// A relay that carries on from `legs` (a → b, b → a): pending bytes are written first.
    pub fn resume(
        a: tokio::net::TcpStream,
        b: tokio::net::TcpStream,
        legs: [LegState; 2],
        tallies: [&'a Tally<'_>; 2],
    ) -> TcpRelay<'a> {
        let [ab, ba] = legs;
        // Tally's lifetime parameter only names what its shared counter borrows; shortening it is sound.
        let tallies: [&'a Tally<'a>; 2] = tallies;
        TcpRelay { a, b, ab: Leg::from_state(ab), ba: Leg::from_state(ba), tallies }
    }

    /// The sockets and each direction's state (a → b, b → a), to resume here or elsewhere.
    pub fn into_parts(self) -> (tokio::net::TcpStream, tokio::net::TcpStream, [LegState; 2]) {
        let legs = [self.ab.state(), self.ba.state()];
        (self.a, self.b, legs)
    }

    /// The sockets, borrowed (their descriptors go to a successor while the relay is paused).
    pub fn sockets(&self) -> [&tokio::net::TcpStream; 2] {
        [&self.a, &self.b]
    }

    /// Each direction's state now (a → b, b → a), the relay left as it is.
    pub fn legs(&self) -> [LegState; 2] {
        [self.ab.state(), self.ba.state()]
    }

    /// The bytes written so far each way (a → b, b → a), in this process and the ones before it.
    pub fn moved(&self) -> (u64, u64) {
        (self.ab.moved, self.ba.moved)
    }
}

impl Future for TcpRelay<'_> {
    type Output = io::Result<(u64, u64)>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let me = self.get_mut();
        let ab = me.ab.poll(&me.a, &mut me.b, me.tallies[0], cx)?;
        let ba = me.ba.poll(&me.b, &mut me.a, me.tallies[1], cx)?;
        if ab.is_ready() && ba.is_ready() {
            return Poll::Ready(Ok((me.ab.moved, me.ba.moved)));
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    #[test]
    fn buffers_grow_with_volume() {
        assert_eq!(buffer_size(0), SMALL);
        assert_eq!(buffer_size(TO_MEDIUM_AFTER), MEDIUM);
        assert_eq!(buffer_size(TO_LARGE_AFTER), LARGE);
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    /// client ⇄ [proxy a | proxy b] ⇄ server: the client half-closes, the server keeps sending, then closes.
    #[tokio::test]
    async fn half_close_is_propagated_and_the_other_direction_continues() {
        let (mut client, proxy_a) = pair().await;
        let (proxy_b, mut server) = pair().await;
        let shared = std::sync::Arc::new(AtomicU64::new(0));
        let shared2 = shared.clone();
        let relay = tokio::spawn(async move {
            let (up, down) = (Tally::new(Some(&shared2)), Tally::new(None));
            let r = tcp_bidirectional(proxy_a, proxy_b, &up, &down).await;
            (r, up.get(), down.get())
        });
        client.write_all(b"hello").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap(); // EOF arrives: the half-close was propagated
        assert_eq!(got, b"hello");
        server.write_all(b"still talking").await.unwrap();
        server.shutdown().await.unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"still talking");
        let (r, up, down) = relay.await.unwrap();
        assert_eq!(r.unwrap(), (5, 13));
        assert_eq!((up, down), (5, 13));
        assert_eq!(shared.load(Ordering::Relaxed), 5);
    }

    /// app ⇄ relay ⇄ HTTP/2 stream ⇄ server: 2 MiB up (many times the 64 KiB stream window, so flow control paces
    /// it), the app's half-close arrives as END_STREAM, and the server's reply after it comes back down, ending in
    /// the app's EOF.
    #[tokio::test]
    async fn h2_relay_moves_both_ways_under_flow_control_and_half_closes() {
        const UP: usize = 2 << 20;
        let (mut app, proxy) = pair().await;
        let (h2c, h2s) = pair().await;
        let server = tokio::spawn(async move {
            let mut conn = h2::server::handshake(h2s).await.unwrap();
            let (req, mut respond) = conn.accept().await.unwrap().unwrap();
            tokio::spawn(async move { while conn.accept().await.is_some() {} });
            let mut reply = respond.send_response(http::Response::new(()), false).unwrap();
            let mut body = req.into_body();
            let (mut got, mut bad) = (0usize, 0usize);
            while let Some(d) = body.data().await {
                let d = d.unwrap();
                bad += d.iter().enumerate().filter(|(i, b)| **b != ((got + i) % 251) as u8).count();
                got += d.len();
                body.flow_control().release_capacity(d.len()).unwrap();
            }
            reply.send_data(Bytes::from_static(b"still talking"), true).unwrap();
            (got, bad)
        });
        let (mut client, conn) = h2::client::handshake(h2c).await.unwrap();
        tokio::spawn(conn);
        let (response, send) = client.send_request(http::Request::post("http://x/").body(()).unwrap(), false).unwrap();
        let body = response.await.unwrap().into_body();
        let relay = tokio::spawn(async move {
            let (up, down) = (Tally::new(None), Tally::new(None));
            let r = tcp_h2_bidirectional(proxy, send, body, &up, &down, None).await;
            (r.unwrap(), up.get(), down.get())
        });
        let data: Vec<u8> = (0..UP).map(|i| (i % 251) as u8).collect();
        app.write_all(&data).await.unwrap();
        app.shutdown().await.unwrap();
        let mut back = Vec::new();
        app.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"still talking");
        assert_eq!(server.await.unwrap(), (UP, 0), "every byte arrived, in order");
        let (moved, up, down) = relay.await.unwrap();
        assert_eq!(moved, (UP as u64, 13));
        assert_eq!((up, down), (UP as u64, 13));
    }

    #[tokio::test]
    async fn server_closing_first_ends_the_copy() {
        let (mut client, proxy_a) = pair().await;
        let (proxy_b, mut server) = pair().await;
        let relay = tokio::spawn(async move {
            let (x, y) = (Tally::new(None), Tally::new(None));
            tcp_bidirectional(proxy_a, proxy_b, &x, &y).await
        });
        server.write_all(b"bye").await.unwrap();
        drop(server);
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"bye");
        drop(client);
        let r = tokio::time::timeout(std::time::Duration::from_secs(5), relay).await.unwrap().unwrap();
        // Either a clean finish or a reset from writing to the closed server: the relay must end, not hang.
        let _ = r;
    }
}
