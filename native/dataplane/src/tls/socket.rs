//! The TCP socket under an HBONE TLS session: reads go through a buffer (see `SOCKET_READ_BUFFER`), writes
//! straight through.
//!
//! Unlike `tokio::io::BufReader`, the buffer exists only while there is something to read: it is taken when the
//! socket is readable and given back once it is drained and the next read would wait. An idle HBONE connection (a
//! node holds one per peer node and identity, often with idle streams on it) then costs no read buffer; a busy one
//! keeps its buffer from read to read, so the byte path is unchanged.

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
}

impl TlsSocket {
    pub fn new(tcp: TcpStream, capacity: usize) -> TlsSocket {
        TlsSocket { tcp, capacity, buf: Vec::new(), pos: 0 }
    }

    pub fn get_ref(&self) -> &TcpStream {
        &self.tcp
    }

    /// Bytes of read buffer held right now (0 while idle).
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }
}

impl AsyncRead for TlsSocket {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.pos < this.buf.len() {
                let n = out.remaining().min(this.buf.len() - this.pos);
                out.put_slice(&this.buf[this.pos..this.pos + n]);
                this.pos += n;
                if this.pos == this.buf.len() {
                    this.buf.clear();
                    this.pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if out.remaining() >= this.capacity {
                // A read at least as large as the buffer gains nothing from it.
                return Pin::new(&mut this.tcp).poll_read(cx, out);
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
}
