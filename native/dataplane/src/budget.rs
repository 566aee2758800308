//! The node's budget for stream data buffered toward HBONE peers, across all connections, so that memory stays
//! bounded however many authenticated peers open streams and never read.
//!
//! What is counted: the bytes a copy loop read from a local socket for an HTTP/2 stream that the connection has not
//! yet written to its TLS session. That is where a peer that stops reading makes us hold memory: h2 keeps up to
//! 400 KiB per stream (its send buffer) and a connection has up to 200 streams, so without a budget ten such
//! connections held about 800 MiB.
//!
//! How it is counted, exactly: the loop adds what it reads to its stream's count before handing it to h2; the
//! connection's writer ([`Metered`]) reads the HTTP/2 frame headers of the bytes it writes and takes each DATA
//! frame's payload off its stream's count; a stream that ends with data still queued (reset, connection closed)
//! gives back what it had left. No estimate drifts over a long-lived connection.
//!
//! Also counted: data received from a peer for a stream whose copy loop runs and not yet written to the application
//! (h2 holds it until the loop takes it and releases its window). The writer's twin on the read side follows the
//! frames read and adds each DATA payload to its stream; the loop takes off what it wrote. A peer cannot be held back
//! here (it may send what the windows we granted allow: HTTP2_STREAM_WINDOW_SIZE per stream,
//! HTTP2_CONNECTION_WINDOW_SIZE per connection), so this side counts toward shedding only. Data for a stream without
//! a running loop (before it is accepted, after it ended) is not counted: h2 releases or discards it, within the
//! connection window.
//!
//! At the budget:
//! 1. Backpressure: a stream of a connection holding at least [`HEAVY`] stops reading from its local socket until
//!    the node is back under budget (the application then sees TCP backpressure). Light connections keep going,
//!    so a burst of slow peers does not stall everyone else.
//! 2. Shedding: when the node stays over budget for [`SHED_AFTER`], the connection holding the most is closed, with
//!    a warning and `ztunnel_node_buffer_shed_connections_total`, then the next, until it is under.
//! 3. After a burst (the count fell below an eighth of the budget after passing a quarter of it), free heap is given
//!    back to the kernel (`malloc_trim`), so the resident size returns with the buffers.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::events::{Events, Level};
use crate::fields;

/// The default budget (STREAM_BUFFER_BUDGET).
pub const DEFAULT_LIMIT: usize = 256 * 1024 * 1024;
/// A connection holding this much is held back while the node is over budget.
pub const HEAVY: usize = 1024 * 1024;
/// How long the node may stay over budget before the largest holder is shed.
pub const SHED_AFTER: Duration = Duration::from_secs(1);
/// How often the watcher looks while the count is high.
const TICK: Duration = Duration::from_millis(250);
/// While backpressured, a stream looks again this often (its own connection may have drained meanwhile).
const RECHECK: Duration = Duration::from_millis(100);

/// The node's budget: one per process, shared by every proxy (the daemon's and each pod's).
pub struct Budget {
    limit: AtomicUsize,
    used: AtomicUsize,
    conns: Mutex<HashMap<u64, Weak<ConnBuffers>>>,
    next_id: AtomicU64,
    relief: Notify,
    watching: AtomicBool,
    events: OnceLock<Arc<Events>>,
    /// Connections closed to get back under budget.
    pub shed: AtomicU64,
    /// Streams that waited for the budget at least once.
    pub backpressured: AtomicU64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            limit: AtomicUsize::new(DEFAULT_LIMIT),
            used: AtomicUsize::new(0),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            relief: Notify::new(),
            watching: AtomicBool::new(false),
            events: OnceLock::new(),
            shed: AtomicU64::new(0),
            backpressured: AtomicU64::new(0),
        }
    }
}

impl Budget {
    /// Sets the limit and where the shedding warnings go (once, when the dataplane starts).
    pub fn configure(&self, limit: usize, events: Arc<Events>) {
        self.limit.store(limit.max(1), Ordering::Relaxed);
        let _ = self.events.set(events);
    }

    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Bytes buffered now, across all connections.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn spent(&self) -> bool {
        self.used() >= self.limit()
    }

    fn add(self: &Arc<Self>, n: usize) {
        let now = self.used.fetch_add(n, Ordering::Relaxed) + n;
        if now >= self.limit() / 4 && !self.watching.swap(true, Ordering::AcqRel) {
            // Not on the runtime (a unit test driving the counters by hand): nobody watches, which only loses the
            // shedding and the trim.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(self.clone().watch());
            } else {
                self.watching.store(false, Ordering::Release);
            }
        }
    }

    fn sub(&self, n: usize) {
        if n == 0 {
            return;
        }
        let before = self.used.fetch_sub(n, Ordering::Relaxed);
        let limit = self.limit();
        if before >= limit && before - n < limit {
            self.relief.notify_waiters();
        }
    }

    /// Registers a new HBONE connection (server side: `peer` is the client; client side: the server).
    pub fn connection(self: &Arc<Self>, peer: SocketAddr) -> Arc<ConnBuffers> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(ConnBuffers {
            id,
            budget: self.clone(),
            peer,
            buffered: AtomicUsize::new(0),
            streams: Mutex::new(HashMap::new()),
            shed: CancellationToken::new(),
        });
        self.conns.lock().insert(id, Arc::downgrade(&conn));
        conn
    }

    /// Runs while the count is high: sheds the largest holders when over budget for SHED_AFTER, and trims the heap
    /// once the count has fallen back.
    async fn watch(self: Arc<Self>) {
        let mut over_for = Duration::ZERO;
        loop {
            tokio::time::sleep(TICK).await;
            let limit = self.limit();
            if self.used() < limit / 8 {
                self.watching.store(false, Ordering::Release);
                crate::alloc::release_free_heap();
                // A burst that started between the test and the store above has nobody watching: look again.
                if self.used() >= limit / 4 && !self.watching.swap(true, Ordering::AcqRel) {
                    continue;
                }
                return;
            }
            // What connections already being closed still hold is on its way out: not a reason to shed more.
            let (live, largest) = self.survey();
            if live < limit {
                over_for = Duration::ZERO;
                continue;
            }
            over_for += TICK;
            if over_for < SHED_AFTER {
                continue;
            }
            if let Some(conn) = largest {
                self.shed.fetch_add(1, Ordering::Relaxed);
                conn.shed.cancel();
                if let Some(ev) = self.events.get() {
                    ev.log(
                        Level::Warn,
                        "HBONE connection shed: the node's buffered stream data is over its budget",
                        fields! {
                            "peer.addr" => conn.peer.to_string(),
                            "buffered" => conn.buffered(),
                            "node_buffered" => live,
                            "budget" => limit,
                        },
                    );
                }
            }
        }
    }

    /// What the connections not being shed hold, and the largest of them.
    fn survey(&self) -> (usize, Option<Arc<ConnBuffers>>) {
        let conns = self.conns.lock();
        let mut live = 0;
        let mut largest: Option<Arc<ConnBuffers>> = None;
        for c in conns.values().filter_map(Weak::upgrade) {
            if c.shed.is_cancelled() {
                continue;
            }
            let b = c.buffered();
            live += b;
            if largest.as_ref().is_none_or(|l| l.buffered() < b) {
                largest = Some(c);
            }
        }
        (live, largest)
    }
}

/// One HBONE connection's share of the budget, and its streams' counts (by stream id, for the writer).
pub struct ConnBuffers {
    id: u64,
    budget: Arc<Budget>,
    peer: SocketAddr,
    buffered: AtomicUsize,
    streams: Mutex<HashMap<u32, Arc<StreamCount>>>,
    /// Cancelled when the connection is shed: its task closes it.
    pub shed: CancellationToken,
}

/// What one stream read and the connection has not written yet. The entry outlives the stream's copy loop while
/// h2 still holds its data (a response ends with END_STREAM queued behind it), and goes when that is written, when
/// either side resets the stream (h2 drops its queue then), or with the connection.
struct StreamCount {
    unsent: AtomicUsize,
    /// The copy loop has ended.
    done: AtomicBool,
    /// A RST_STREAM went either way: h2 discards what it held.
    reset: AtomicBool,
    /// Received for this stream and not yet written to the application; RECV_DONE once its loop has ended.
    recv: AtomicUsize,
}

/// `StreamCount::recv` without a receiving loop (none yet, or it has ended): nothing is counted for it.
const RECV_DONE: usize = usize::MAX;

impl Default for StreamCount {
    fn default() -> Self {
        StreamCount {
            unsent: AtomicUsize::new(0),
            done: AtomicBool::new(false),
            reset: AtomicBool::new(false),
            recv: AtomicUsize::new(RECV_DONE),
        }
    }
}

impl ConnBuffers {
    pub fn buffered(&self) -> usize {
        self.buffered.load(Ordering::Relaxed)
    }

    /// Starts counting a stream's data (before any of it is handed to h2).
    pub fn stream(self: &Arc<Self>, id: u32) -> StreamMeter {
        let count = Arc::new(StreamCount::default());
        self.streams.lock().insert(id, count.clone());
        StreamMeter { conn: self.clone(), id, count }
    }

    fn lookup(&self, id: u32) -> Option<Arc<StreamCount>> {
        self.streams.lock().get(&id).cloned()
    }

    fn remove(&self, id: u32) {
        self.streams.lock().remove(&id);
    }

    /// `n` bytes of a stream's count left the node (written, or dropped by h2): takes off at most what it holds,
    /// so nothing is taken off twice.
    fn release(&self, count: &StreamCount, n: usize) {
        let Ok(before) = count.unsent.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_sub(n)))
        else {
            return;
        };
        self.uncount(before.min(n));
    }

    /// The writer wrote `n` bytes of DATA payload of stream `id`.
    fn written(&self, id: u32, count: &StreamCount, n: usize) {
        self.release(count, n);
        self.remove_if_finished(id, count);
    }

    /// The entry goes once both loops have ended and nothing sent is left in h2.
    fn remove_if_finished(&self, id: u32, count: &StreamCount) {
        if count.done.load(Ordering::Acquire)
            && count.recv.load(Ordering::Relaxed) == RECV_DONE
            && (count.unsent.load(Ordering::Relaxed) == 0 || count.reset.load(Ordering::Acquire))
        {
            self.remove(id);
        }
    }

    /// `n` bytes of DATA payload arrived for stream `id` (read side): counted while its receiving loop runs.
    fn received(&self, count: &StreamCount, n: usize) {
        let added = count.recv.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| (v != RECV_DONE).then(|| v + n));
        if added.is_ok() {
            self.buffered.fetch_add(n, Ordering::Relaxed);
            self.budget.add(n);
        }
    }

    /// `n` received bytes of a stream left h2 (written to the application, or dropped with the stream).
    fn delivered(&self, count: &StreamCount, n: usize) {
        let Ok(before) = count
            .recv
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| (v != RECV_DONE).then(|| v.saturating_sub(n)))
        else {
            return;
        };
        self.uncount(before.min(n));
    }

    /// The receiving loop ended: what h2 still holds for the stream is discarded (or released) by h2.
    fn recv_done(&self, count: &StreamCount) {
        let left = count.recv.swap(RECV_DONE, Ordering::Relaxed);
        if left != RECV_DONE {
            self.uncount(left);
        }
    }

    /// Takes `n` bytes off this connection's count and the node's.
    fn uncount(&self, n: usize) {
        if n > 0 {
            self.buffered.fetch_sub(n, Ordering::Relaxed);
            self.budget.sub(n);
        }
    }

    /// A RST_STREAM for stream `id` was sent or received: h2 has dropped whatever it held for it.
    fn reset(&self, id: u32) {
        if let Some(c) = self.lookup(id) {
            c.reset.store(true, Ordering::Release);
            self.release(&c, usize::MAX);
            self.recv_done(&c);
            self.remove_if_finished(id, &c);
        }
    }
}

impl Drop for ConnBuffers {
    fn drop(&mut self) {
        // The connection is gone, and with it whatever h2 still held.
        self.budget.sub(self.buffered.load(Ordering::Relaxed));
        self.budget.conns.lock().remove(&self.id);
    }
}

/// One stream's count, held by its copy loop: what it read and the connection has not written yet.
pub struct StreamMeter {
    conn: Arc<ConnBuffers>,
    id: u32,
    count: Arc<StreamCount>,
}

impl StreamMeter {
    /// The receiving side's share: what the HTTP/2 → TCP loop takes off as it writes. Received data is counted
    /// from here on.
    pub fn receiver(&self) -> RecvMeter {
        let _ = self.count.recv.compare_exchange(RECV_DONE, 0, Ordering::Relaxed, Ordering::Relaxed);
        RecvMeter { conn: self.conn.clone(), id: self.id, count: self.count.clone() }
    }

    /// `n` bytes read for this stream, about to be handed to h2.
    pub fn queued(&self, n: usize) {
        self.count.unsent.fetch_add(n, Ordering::Relaxed);
        self.conn.buffered.fetch_add(n, Ordering::Relaxed);
        self.conn.budget.add(n);
    }

    /// Waits while the node is over budget and this stream's connection is one of the heavy holders.
    pub async fn admit(&self) {
        if let Some(wait) = self.held_back() {
            wait.await
        }
    }

    /// None when the stream may read now; else the wait until it may (owning what it needs, so a poll-based loop can
    /// keep it only while it waits).
    pub fn held_back(&self) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        if !(self.conn.budget.spent() && self.conn.buffered() >= HEAVY) {
            return None;
        }
        let c = self.conn.clone();
        Some(async move { Self::wait_relief(&c).await })
    }

    async fn wait_relief(c: &ConnBuffers) {
        let b = &c.budget;
        let held_back = || b.spent() && c.buffered() >= HEAVY;
        if !held_back() {
            return;
        }
        b.backpressured.fetch_add(1, Ordering::Relaxed);
        while held_back() {
            let relief = b.relief.notified();
            tokio::pin!(relief);
            relief.as_mut().enable();
            if !held_back() {
                break;
            }
            tokio::select! {
                _ = relief => {}
                _ = tokio::time::sleep(RECHECK) => {}
                _ = c.shed.cancelled() => break,
            }
        }
    }
}

impl Drop for StreamMeter {
    fn drop(&mut self) {
        // What h2 still holds stays counted until written (or reset); data read but never handed over (the loop
        // failed first) and a reset stream's are given back now.
        self.count.done.store(true, Ordering::Release);
        if self.count.reset.load(Ordering::Acquire) {
            self.conn.release(&self.count, usize::MAX);
        }
        self.conn.remove_if_finished(self.id, &self.count);
    }
}

/// The receiving loop's share of a stream's count: data h2 holds for it until written to the application.
pub struct RecvMeter {
    conn: Arc<ConnBuffers>,
    id: u32,
    count: Arc<StreamCount>,
}

impl RecvMeter {
    /// `n` bytes were written to the application (and their window released).
    pub fn delivered(&self, n: usize) {
        self.conn.delivered(&self.count, n);
    }
}

impl Drop for RecvMeter {
    fn drop(&mut self) {
        self.conn.recv_done(&self.count);
        self.conn.remove_if_finished(self.id, &self.count);
    }
}

/// The IO under an HBONE connection's h2: counts the DATA payloads it writes off their streams' counts, and drops
/// a stream's count when a RST_STREAM for it goes either way. The bytes themselves pass through untouched.
pub struct Metered<T> {
    inner: T,
    conn: Arc<ConnBuffers>,
    out: FrameReader,
    inn: FrameReader,
    /// The last stream written for, and read for (consecutive frames are usually the same stream): no lock for those.
    cached: Option<(u32, Option<Arc<StreamCount>>)>,
    cached_in: Option<(u32, Option<Arc<StreamCount>>)>,
}

/// The count of `stream`, from the one-entry cache or the connection's map.
fn cached_count(
    cache: &mut Option<(u32, Option<Arc<StreamCount>>)>,
    conn: &ConnBuffers,
    stream: u32,
) -> Option<Arc<StreamCount>> {
    match cache {
        Some((id, c)) if *id == stream => c.clone(),
        _ => {
            let c = conn.lookup(stream);
            *cache = Some((stream, c.clone()));
            c
        }
    }
}

const DATA: u8 = 0x0;
const RST_STREAM: u8 = 0x3;
/// RFC 9113 §3.4: the client's connection preface, which is not a frame.
const PREFACE_LEN: usize = 24;

impl<T> Metered<T> {
    /// `client`: this side sends the connection preface (and the peer does not).
    pub fn new(inner: T, conn: Arc<ConnBuffers>, client: bool) -> Metered<T> {
        let (out, inn) = if client { (PREFACE_LEN, 0) } else { (0, PREFACE_LEN) };
        Metered { inner, conn, out: FrameReader::new(out), inn: FrameReader::new(inn), cached: None, cached_in: None }
    }

    fn wrote(&mut self, bytes: &[u8]) {
        let Metered { out, conn, cached, .. } = self;
        out.feed(bytes, |piece| match piece {
            Piece::Payload { ty: DATA, stream, len } => {
                if let Some(c) = cached_count(cached, conn, stream) {
                    conn.written(stream, &c, len);
                }
            }
            Piece::Header { ty: RST_STREAM, stream } => {
                *cached = None;
                conn.reset(stream);
            }
            _ => {}
        });
    }

    fn read(&mut self, bytes: &[u8]) {
        let Metered { inn, conn, cached, cached_in, .. } = self;
        inn.feed(bytes, |piece| match piece {
            // A padded DATA frame's padding is counted too (flow control counts it as well); h2 hands the loop only
            // the data, so that little stays counted until the loop ends.
            Piece::Payload { ty: DATA, stream, len } => {
                if let Some(c) = cached_count(cached_in, conn, stream) {
                    conn.received(&c, len);
                }
            }
            Piece::Header { ty: RST_STREAM, stream } => {
                *cached = None;
                *cached_in = None;
                conn.reset(stream);
            }
            _ => {}
        });
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Metered<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            self.read(&buf.filled()[before..]);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Metered<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.wrote(&buf[..n]);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(mut n)) = r {
            for b in bufs {
                if n == 0 {
                    break;
                }
                let k = n.min(b.len());
                self.wrote(&b[..k]);
                n -= k;
            }
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What the frame reader found in a piece of the byte stream.
#[derive(Debug, PartialEq, Eq)]
enum Piece {
    /// A frame header: its type and stream.
    Header { ty: u8, stream: u32 },
    /// Some payload bytes of the current frame.
    Payload { ty: u8, stream: u32, len: usize },
}

/// Follows the HTTP/2 frame boundaries of a byte stream seen in arbitrary pieces (RFC 9113 §4.1: a 9-byte header of
/// 24-bit length, 8-bit type, 8-bit flags, 31-bit stream id, then the payload). h2 never pads the DATA frames it
/// writes, so their payload is all stream data.
struct FrameReader {
    skip: usize,
    header: [u8; 9],
    have: usize,
    remaining: usize,
    ty: u8,
    stream: u32,
}

impl FrameReader {
    fn new(skip: usize) -> FrameReader {
        FrameReader { skip, header: [0; 9], have: 0, remaining: 0, ty: 0, stream: 0 }
    }

    fn feed(&mut self, mut b: &[u8], mut found: impl FnMut(Piece)) {
        while !b.is_empty() {
            if self.skip > 0 {
                let k = self.skip.min(b.len());
                self.skip -= k;
                b = &b[k..];
            } else if self.remaining > 0 {
                let k = self.remaining.min(b.len());
                found(Piece::Payload { ty: self.ty, stream: self.stream, len: k });
                self.remaining -= k;
                b = &b[k..];
            } else {
                let k = (9 - self.have).min(b.len());
                self.header[self.have..self.have + k].copy_from_slice(&b[..k]);
                self.have += k;
                b = &b[k..];
                if self.have == 9 {
                    let h = &self.header;
                    self.have = 0;
                    self.remaining = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
                    self.ty = h[3];
                    self.stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    found(Piece::Header { ty: self.ty, stream: self.stream });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ty: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], ty, 0];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// The reader finds the DATA payloads whatever the write boundaries: every split of a frame sequence gives the
    /// same per-stream totals.
    #[test]
    fn frame_reader_counts_data_payloads_across_any_split() {
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        wire.extend(frame(0x4, 0, &[0; 12])); // SETTINGS
        wire.extend(frame(DATA, 1, &[7; 100]));
        wire.extend(frame(0x1, 3, &[1; 30])); // HEADERS
        wire.extend(frame(DATA, 3, &[8; 5]));
        wire.extend(frame(DATA, 1, &[])); // END_STREAM only
        wire.extend(frame(0x8, 0, &[0, 0, 1, 0])); // WINDOW_UPDATE
        wire.extend(frame(DATA, 1, &[9; 1000]));
        for split in [1usize, 2, 5, 9, 10, 24, 33, 100, wire.len()] {
            let mut r = FrameReader::new(PREFACE_LEN);
            let mut seen: HashMap<u32, usize> = HashMap::new();
            let mut headers = Vec::new();
            for piece in wire.chunks(split) {
                r.feed(piece, |p| match p {
                    Piece::Payload { ty: DATA, stream, len } => *seen.entry(stream).or_default() += len,
                    Piece::Header { ty, stream } => headers.push((ty, stream)),
                    _ => {}
                });
            }
            assert_eq!(seen.get(&1), Some(&1100), "split {split}");
            assert_eq!(seen.get(&3), Some(&5), "split {split}");
            assert_eq!(seen.len(), 2, "split {split}");
            assert_eq!(headers, [(4, 0), (0, 1), (1, 3), (0, 3), (0, 1), (8, 0), (0, 1)], "split {split}");
        }
    }

    #[test]
    fn data_left_in_h2_stays_counted_until_written_or_reset() {
        let budget = Arc::new(Budget::default());
        let conn = budget.connection("127.0.0.1:1".parse().unwrap());
        // A response: the copy loop ends with 600 of its 1000 bytes still queued in h2.
        let meter = conn.stream(1);
        meter.queued(1000);
        assert_eq!((budget.used(), conn.buffered()), (1000, 1000));
        let count = conn.lookup(1).unwrap();
        conn.written(1, &count, 400);
        drop(meter);
        assert_eq!((budget.used(), conn.buffered()), (600, 600), "still held by h2");
        conn.written(1, &count, 600);
        assert_eq!((budget.used(), conn.buffered()), (0, 0));
        assert!(conn.lookup(1).is_none(), "written out: the entry goes");
        // A reset stream: h2 drops its queue, so does the count, and a late write report takes nothing more.
        let meter = conn.stream(3);
        meter.queued(500);
        let count = conn.lookup(3).unwrap();
        conn.reset(3);
        assert_eq!(budget.used(), 0);
        drop(meter);
        conn.written(3, &count, 500);
        assert_eq!((budget.used(), conn.buffered()), (0, 0));
        assert!(conn.lookup(3).is_none());
        // The connection's end gives back what its streams still held.
        let meter = conn.stream(5);
        meter.queued(700);
        drop(meter);
        assert_eq!(budget.used(), 700);
        drop(conn);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn received_data_is_counted_while_the_receiving_loop_runs() {
        let budget = Arc::new(Budget::default());
        let conn = budget.connection("127.0.0.1:1".parse().unwrap());
        let count = {
            let meter = conn.stream(1);
            let count = conn.lookup(1).unwrap();
            conn.received(&count, 100);
            assert_eq!(budget.used(), 0, "nothing counted before the receiving loop runs");
            let receiver = meter.receiver();
            conn.received(&count, 5000); // read from the peer, held by h2
            assert_eq!((budget.used(), conn.buffered()), (5000, 5000));
            receiver.delivered(3000); // written to the application
            assert_eq!(budget.used(), 2000);
            drop(meter); // the sending loop ends first: the entry stays for the receiving one
            conn.received(&count, 1000);
            assert_eq!(budget.used(), 3000);
            assert!(conn.lookup(1).is_some());
            drop(receiver); // what h2 still held is dropped with the stream
            assert_eq!((budget.used(), conn.buffered()), (0, 0));
            count
        };
        assert!(conn.lookup(1).is_none(), "both loops ended: the entry goes");
        conn.received(&count, 10);
        assert_eq!(budget.used(), 0, "nothing counted after the loop");
        // A reset ends the count at once, the loop still running.
        let meter = conn.stream(3);
        let receiver = meter.receiver();
        let count = conn.lookup(3).unwrap();
        conn.received(&count, 800);
        conn.reset(3);
        assert_eq!(budget.used(), 0);
        receiver.delivered(800);
        drop((meter, receiver));
        assert_eq!((budget.used(), conn.buffered()), (0, 0));
        assert!(conn.lookup(3).is_none());
    }

    #[tokio::test]
    async fn a_heavy_connection_waits_while_the_node_is_over_budget_and_a_light_one_does_not() {
        let budget = Arc::new(Budget::default());
        budget.limit.store(2 * HEAVY, Ordering::Relaxed);
        let heavy = budget.connection("127.0.0.1:1".parse().unwrap());
        let light = budget.connection("127.0.0.1:2".parse().unwrap());
        let h = heavy.stream(1);
        let l = light.stream(1);
        h.queued(2 * HEAVY);
        l.queued(10);
        tokio::time::timeout(Duration::from_millis(50), l.admit()).await.expect("light: not held back");
        let waiting = tokio::time::timeout(Duration::from_millis(150), h.admit()).await;
        assert!(waiting.is_err(), "heavy: held back while over budget");
        let count = heavy.lookup(1).unwrap();
        let held = Arc::new(h);
        let w = tokio::spawn({
            let h = held.clone();
            async move { h.admit().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        heavy.written(1, &count, HEAVY); // the peer read: the node is under budget again
        tokio::time::timeout(Duration::from_millis(500), w).await.expect("relieved").unwrap();
        assert_eq!(budget.backpressured.load(Ordering::Relaxed), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_largest_holder_is_shed_after_the_grace_and_only_while_over() {
        let budget = Arc::new(Budget::default());
        budget.limit.store(8 * HEAVY, Ordering::Relaxed);
        let big = budget.connection("127.0.0.1:1".parse().unwrap());
        let small = budget.connection("127.0.0.1:2".parse().unwrap());
        let (b, s) = (big.stream(1), small.stream(1));
        s.queued(3 * HEAVY);
        b.queued(6 * HEAVY);
        tokio::time::sleep(SHED_AFTER - TICK).await;
        assert!(!big.shed.is_cancelled(), "not before the grace");
        tokio::time::sleep(3 * TICK).await;
        assert!(big.shed.is_cancelled(), "the largest is shed");
        assert!(!small.shed.is_cancelled(), "what is left (3 MiB) is under budget: nothing more is shed");
        assert_eq!(budget.shed.load(Ordering::Relaxed), 1);
        // The shed connection closes (its h2 state with it), and the other one's peer catches up.
        drop((b, big));
        small.written(1, &small.lookup(1).unwrap(), 3 * HEAVY);
        assert_eq!(budget.used(), 0);
        tokio::time::sleep(2 * TICK).await;
        assert!(!budget.watching.load(Ordering::Acquire), "the watcher ends once the count has fallen");
    }
}
