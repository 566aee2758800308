//! The TCP socket under an HBONE TLS session: reads go through a buffer (see `SOCKET_READ_BUFFER`), writes
//! straight through.
//!
//! Unlike `tokio::io::BufReader`, the buffer exists only while there is something to read: it is taken when the
//! socket is readable and given back once it is drained and the next read would wait. An idle HBONE connection (a
//! node holds one per peer node and identity, often with idle streams on it) then costs no read buffer; a busy one
//! keeps its buffer from read to read, so the byte path is unchanged.
//!
//! It also follows the TLS record boundaries of what it hands up (a header every 16 KiB), so a hand-over can stop
//! reading at the end of a record (`finish_record`): the session's own buffer then holds no part of one, and what
//! this buffer still holds (`take_buffered`) starts at a record's header.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

pub struct TlsSocket {
    tcp: TcpStream,
    capacity: usize,
    /// Unread bytes are `buf[pos..]`; empty (no allocation) while idle.
    buf: Vec<u8>,
    pos: usize,
    /// Where the bytes handed up are in the record stream.
    at: Boundary,
    /// Hand up nothing past the end of the current record.
    finishing: bool,
}

impl TlsSocket {
    pub fn new(tcp: TcpStream, capacity: usize) -> TlsSocket {
        TlsSocket { tcp, capacity, buf: Vec::new(), pos: 0, at: Boundary::default(), finishing: false }
    }

    /// Whether part of a record has been handed up and the rest not.
    pub fn mid_record(&self) -> bool {
        self.at.head_seen > 0 || self.at.body_left > 0
    }

    /// From now on, hand up the rest of the current record at most; once it is through, reads wait (`Pending`,
    /// without registering for readiness: the caller polls again itself).
    pub fn finish_record(&mut self) {
        self.finishing = true;
    }

    /// Back to reading freely (the hand-over did not take the connection).
    pub fn unfinish(&mut self) {
        self.finishing = false;
    }

    /// The bytes read from the socket and not handed up (from a record's start, once `mid_record` is false).
    pub fn take_buffered(&mut self) -> Vec<u8> {
        let rest = self.buf.split_off(self.pos);
        self.buf = Vec::new();
        self.pos = 0;
        rest
    }

    pub fn into_inner(self) -> TcpStream {
        self.tcp
    }

    /// How much may be handed up now: all of it, or while finishing the rest of the current record.
    fn allowance(&self) -> usize {
        if !self.finishing {
            usize::MAX
        } else if self.at.head_seen > 0 {
            5 - self.at.head_seen as usize
        } else {
            self.at.body_left
        }
    }

    pub fn get_ref(&self) -> &TcpStream {
        &self.tcp
    }

    /// Bytes of read buffer held right now (0 while idle).
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }
}

/// The record being handed up: header bytes seen (0..=4), the header, body bytes still to come.
#[derive(Default)]
struct Boundary {
    head_seen: u8,
    head: [u8; 5],
    body_left: usize,
}

impl Boundary {
    /// Follow the record boundaries across bytes handed up.
    fn track(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let n = self.body_left.min(bytes.len());
                self.body_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let take = (5 - self.head_seen as usize).min(bytes.len());
            self.head[self.head_seen as usize..self.head_seen as usize + take].copy_from_slice(&bytes[..take]);
            self.head_seen += take as u8;
            bytes = &bytes[take..];
            if self.head_seen == 5 {
                self.head_seen = 0;
                self.body_left = (self.head[3] as usize) << 8 | self.head[4] as usize;
            }
        }
    }
}

impl AsyncRead for TlsSocket {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let allowance = this.allowance();
        if allowance == 0 {
            return Poll::Pending;
        }
        loop {
            if this.pos < this.buf.len() {
                let n = out.remaining().min(this.buf.len() - this.pos).min(allowance);
                let (from, to) = (this.pos, this.pos + n);
                out.put_slice(&this.buf[from..to]);
                this.pos = to;
                this.at.track(&this.buf[from..to]);
                if this.pos == this.buf.len() {
                    this.buf.clear();
                    this.pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if out.remaining() >= this.capacity && allowance == usize::MAX {
                // A read at least as large as the buffer gains nothing from it.
                let before = out.filled().len();
                ready!(Pin::new(&mut this.tcp).poll_read(cx, out))?;
                this.at.track(&out.filled()[before..]);
                return Poll::Ready(Ok(()));
            }
            if this.tcp.poll_read_ready(cx).is_pending() {
                // Drained, and the next read would wait: give the buffer back while idle.
                this.buf = Vec::new();
                return Poll::Pending;
            }
            if this.buf.capacity() == 0 {
                this.buf.reserve_exact(this.capacity);
            }
            match this.tcp.try_read_buf(&mut this.buf) {
                Ok(0) => return Poll::Ready(Ok(())), // EOF
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue, // readiness cleared; poll again
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for TlsSocket {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(Pin::new(&mut self.tcp).poll_shutdown(cx))?;
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair(capacity: usize) -> (TlsSocket, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (TlsSocket::new(c, capacity), s)
    }

    #[tokio::test]
    async fn reads_every_byte_in_order_through_small_and_large_reads() {
        let (mut sock, mut peer) = pair(1024).await;
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            for chunk in sent.chunks(3000) {
                peer.write_all(chunk).await.unwrap();
            }
            peer.shutdown().await.unwrap();
            peer
        });
        let mut got = Vec::new();
        let mut small = [0u8; 100];
        let mut large = vec![0u8; 4096];
        loop {
            // Alternate read sizes: below the buffer (served from it) and above (straight from the socket).
            let n = if got.len() % 2 == 0 {
                sock.read(&mut small).await.unwrap()
            } else {
                let n = sock.read(&mut large).await.unwrap();
                got.extend_from_slice(&large[..n]);
                if n == 0 {
                    break;
                }
                continue;
            };
            if n == 0 {
                break;
            }
            got.extend_from_slice(&small[..n]);
        }
        assert_eq!(got.len(), data.len());
        assert!(got == data, "bytes out of order or corrupted");
        drop(writer.await.unwrap());
    }

    #[tokio::test]
    async fn holds_no_buffer_while_idle_and_one_while_data_waits() {
        let (mut sock, mut peer) = pair(32 * 1024).await;
        assert_eq!(sock.buffer_capacity(), 0);
        peer.write_all(&[1u8; 5000]).await.unwrap();
        let mut b = [0u8; 10];
        sock.read_exact(&mut b).await.unwrap();
        assert!(sock.buffer_capacity() >= 32 * 1024, "the rest of the data waits in the buffer");
        let mut rest = vec![0u8; 4990];
        sock.read_exact(&mut rest).await.unwrap();
        // Nothing more to read: the next read waits, and gives the buffer back first.
        let pending = tokio::time::timeout(std::time::Duration::from_millis(50), sock.read(&mut b)).await;
        assert!(pending.is_err(), "no data, the read must wait");
        assert_eq!(sock.buffer_capacity(), 0);
        peer.write_all(b"more").await.unwrap();
        let n = sock.read(&mut b).await.unwrap();
        assert_eq!(&b[..n], b"more");
    }

    #[tokio::test]
    async fn writes_go_straight_to_the_socket() {
        let (mut sock, mut peer) = pair(1024).await;
        sock.write_all(b"hello").await.unwrap();
        sock.shutdown().await.unwrap();
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello");
    }

    #[tokio::test]
    async fn finishing_stops_at_the_end_of_the_record_and_keeps_the_rest() {
        let (mut sock, mut peer) = pair(1024).await;
        // Two records (5-byte headers, 300- and 40-byte bodies) and the start of a third.
        let mut wire = vec![23, 3, 3, 1, 44];
        wire.extend(std::iter::repeat_n(1u8, 300));
        wire.extend([23, 3, 3, 0, 40]);
        wire.extend(std::iter::repeat_n(2u8, 40));
        wire.extend([23, 3, 3, 0]);
        peer.write_all(&wire).await.unwrap();
        let mut first = [0u8; 100];
        sock.read_exact(&mut first).await.unwrap();
        assert!(sock.mid_record());
        sock.finish_record();
        let mut rest = Vec::new();
        let mut b = [0u8; 4096];
        while sock.mid_record() {
            let n = sock.read(&mut b).await.unwrap();
            rest.extend_from_slice(&b[..n]);
        }
        assert_eq!(rest.len(), 305 - 100, "exactly the first record's rest");
        let more = tokio::time::timeout(std::time::Duration::from_millis(50), sock.read(&mut b)).await;
        assert!(more.is_err(), "nothing past the record");
        assert_eq!(sock.take_buffered(), wire[305..].to_vec(), "the rest, from the next record's header");
    }
}
