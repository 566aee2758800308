//! The copy loops: TCP↔TCP and TCP↔HTTP/2 stream.
//!
//! Invariants:
//! - The two directions are independent. EOF in one direction is propagated (shutdown(write) on TCP, END_STREAM
//!   on HTTP/2) and the other direction keeps going; an error in either direction ends both.
//! - Buffers start small and grow with the bytes moved (1 KiB → 16 KiB after 128 KiB → 256 KiB after 10 MiB), so
//!   idle connections cost little and bulk transfers make few syscalls (ztunnel #1024, #1169).
//! - TCP → HTTP/2 holds no buffer while its socket has nothing to read: an idle tunneled connection costs no copy
//!   buffer at all (the buffer is allocated once the socket is readable).
//! - Data read from TCP is handed to h2 as `Bytes` without another copy.
//! - Every chunk moved is added to the connection's byte counters.
//! - TCP → HTTP/2 counts what it reads against the node's buffer budget until the connection writes it
//!   (`budget.rs`), and stops reading while the node is over budget and its connection is a heavy holder.

use std::future::{poll_fn, Future};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

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

use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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

/// Copy one direction between two byte streams; on EOF shut down the writer. Returns the bytes copied.
pub async fn copy_one_way<R, W>(mut r: R, mut w: W, counter: &Tally<'_>) -> io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut moved = 0u64;
    let mut buf = vec![0u8; SMALL];
    loop {
        let want = buffer_size(moved);
        if buf.len() < want {
            buf.resize(want, 0);
        }
        let n = r.read(&mut buf).await?;
        if n == 0 {
            w.shutdown().await?;
            return Ok(moved);
        }
        w.write_all(&buf[..n]).await?;
        moved += n as u64;
        counter.add(n as u64);
    }
}

/// TCP → HTTP/2: read from the socket and send DATA frames, respecting the peer's flow control.
pub async fn tcp_to_h2(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut send: SendStream<Bytes>,
    counter: &Tally<'_>,
    meter: Option<crate::budget::StreamMeter>,
) -> io::Result<u64> {
    use futures_util::FutureExt;
    let mut moved = 0u64;
    let mut buf = BytesMut::new();
    loop {
        // Readiness is polled on the stream itself: `readable()`'s future would add 168 bytes to every
        // connection's task for as long as it waits.
        let ready = |cx: &mut std::task::Context<'_>| AsRef::<tokio::net::TcpStream>::as_ref(&r).poll_read_ready(cx);
        if poll_fn(ready).now_or_never().is_none() {
            // About to wait for the peer: wait without a buffer (the last one's unused tail is still tied to the
            // allocation h2 may be holding).
            buf = BytesMut::new();
            poll_fn(ready).await?;
        }
        if let Some(m) = &meter {
            m.admit().await;
        }
        buf.reserve(buffer_size(moved));
        let n = r.read_buf(&mut buf).await?;
        if n == 0 {
            send.send_data(Bytes::new(), true).map_err(h2_io)?;
            return Ok(moved);
        }
        // Counted before h2 has it: the connection may write it (and take it off) as soon as it is handed over.
        if let Some(m) = &meter {
            m.queued(n);
        }
        let mut data = buf.split().freeze();
        while !data.is_empty() {
            send.reserve_capacity(data.len());
            let granted = poll_fn(|cx| send.poll_capacity(cx))
                .await
                .ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "HTTP/2 stream closed"))?
                .map_err(h2_io)?;
            if granted == 0 {
                continue;
            }
            let chunk = data.split_to(granted.min(data.len()));
            send.send_data(chunk, false).map_err(h2_io)?;
        }
        moved += n as u64;
        counter.add(n as u64);
    }
}

/// HTTP/2 → TCP: write DATA frames to the socket, releasing flow-control capacity only once written (so a slow
/// reader pushes back on the sender). END_STREAM → shutdown(write).
pub async fn h2_to_tcp<W>(
    mut recv: RecvStream,
    mut w: W,
    counter: &Tally<'_>,
    meter: Option<crate::budget::RecvMeter>,
) -> io::Result<u64>
where
    W: AsyncWrite + Unpin,
{
    let mut moved = 0u64;
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.map_err(h2_io)?;
        let n = chunk.len();
        w.write_all(&chunk).await?;
        recv.flow_control().release_capacity(n).map_err(h2_io)?;
        if let Some(m) = &meter {
            m.delivered(n);
        }
        moved += n as u64;
        counter.add(n as u64);
    }
    w.shutdown().await?;
    Ok(moved)
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
/// stream, whose connection is itself carried by a stream).
/// (A plain function returning the join, not an `async fn`: that would keep its arguments beside the join in every
/// idle connection's task.)
pub fn tcp_h2_bidirectional<'a>(
    tcp: tokio::net::TcpStream,
    send: SendStream<Bytes>,
    recv: RecvStream,
    to_h2: &'a Tally<'_>,
    from_h2: &'a Tally<'_>,
    buffers: Option<std::sync::Arc<crate::budget::ConnBuffers>>,
) -> impl Future<Output = io::Result<(u64, u64)>> + 'a {
    let (r, w) = tcp.into_split();
    // Counted from before any of the stream's data moves either way.
    let meter = buffers.map(|b| b.stream(u32::from(send.stream_id())));
    let receiver = meter.as_ref().map(|m| m.receiver());
    futures_util::future::try_join(tcp_to_h2(r, send, to_h2, meter), h2_to_tcp(recv, w, from_h2, receiver))
}

/// Copy both directions between two TCP streams.
pub fn tcp_bidirectional<'a>(
    a: tokio::net::TcpStream,
    b: tokio::net::TcpStream,
    a_to_b: &'a Tally<'_>,
    b_to_a: &'a Tally<'_>,
) -> impl Future<Output = io::Result<(u64, u64)>> + 'a {
    let (ar, aw) = a.into_split();
    let (br, bw) = b.into_split();
    futures_util::future::try_join(copy_one_way(ar, bw, a_to_b), copy_one_way(br, aw, b_to_a))
}

#[cfg(test)]
mod tests {
    use super::*;
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
