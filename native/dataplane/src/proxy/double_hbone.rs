//! Double HBONE: reaching a service endpoint on another network through that network's gateway.
//!
//! The outer CONNECT goes to the gateway over the ordinary pooled HBONE connection (verified as the gateway). Inside
//! that stream runs a second, end-to-end HBONE connection to the destination's node: TLS 1.3 (our workload's
//! certificate, the final destination's identities verified), HTTP/2 and one CONNECT with the same `:authority`
//! (`<service hostname>:<port>`, so the gateway can route without decrypting) plus `x-forwarded-network`. The
//! inner connection is never pooled: each one may reach a different endpoint behind the gateway.
//!
//! Invariants:
//! - The gateway only ever sees TLS: the inner handshake fails closed if the far end is not one of the expected
//!   final identities; nothing falls back to the outer tunnel alone.
//! - The inner HTTP/2 connection's task lives as long as the stream: dropping the `InnerConnection` aborts it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::task::JoinHandle;

use super::h2::client::builder;
use crate::config::Config;
use crate::identity::{spiffe_identity, InstalledCert};
use crate::tls::{client_config, ExpectedIdentities};

/// One HTTP/2 stream as a byte stream (the outer CONNECT, carrying the inner TLS). Reads release flow-control
/// capacity as they are consumed; writes wait for capacity, so the peer's window bounds what is buffered.
pub struct H2Io {
    send: SendStream<Bytes>,
    recv: RecvStream,
    pending: Bytes,
}

impl H2Io {
    pub fn new(send: SendStream<Bytes>, recv: RecvStream) -> H2Io {
        H2Io { send, recv, pending: Bytes::new() }
    }
}

fn h2_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        e.into_io().unwrap_or_else(|| io::Error::other("h2 io error"))
    } else {
        io::Error::other(e)
    }
}

impl AsyncRead for H2Io {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        while self.pending.is_empty() {
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    self.pending = data;
                }
                Some(Err(e)) => return Poll::Ready(Err(h2_io(e))),
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = self.pending.len().min(buf.remaining());
        buf.put_slice(&self.pending[..n]);
        self.pending.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Io {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        self.send.reserve_capacity(buf.len());
        loop {
            match ready!(self.send.poll_capacity(cx)) {
                // Zero capacity is not an answer yet: poll again, which registers the waker.
                Some(Ok(0)) => continue,
                Some(Ok(n)) => {
                    let n = n.min(buf.len());
                    self.send.send_data(Bytes::copy_from_slice(&buf[..n]), false).map_err(h2_io)?;
                    return Poll::Ready(Ok(n));
                }
                Some(Err(e)) => return Poll::Ready(Err(h2_io(e))),
                None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.send.send_data(Bytes::new(), true).map_err(h2_io))
    }
}

/// The inner HTTP/2 connection: its driver task is aborted when this is dropped (the stream ended).
pub struct InnerConnection {
    driver: JoinHandle<()>,
    revoked: tokio_util::sync::CancellationToken,
    /// The final destination as it presented itself (taken once, for the connection's labels and record).
    pub derived: Option<Box<crate::metrics::DerivedPeer>>,
}

impl InnerConnection {
    /// Whether a revocation list revoked the destination's certificate (the inner connection is then closed).
    pub fn revoked(&self) -> bool {
        self.revoked.is_cancelled()
    }
}

impl Drop for InnerConnection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InnerError {
    #[error("inner TLS configuration: {0}")]
    Config(String),
    #[error("inner TLS handshake with the destination behind the gateway: {0}")]
    Tls(io::Error),
    #[error("inner HTTP/2 handshake: {0}")]
    H2(h2::Error),
    #[error("inner CONNECT: {0}")]
    Request(h2::Error),
    #[error("inner CONNECT answered HTTP {0}")]
    Status(u16),
}

/// Over the outer stream `io`: the inner TLS (as `cert`'s identity, expecting one of `expected`), HTTP/2, and the
/// CONNECT `req`. Returns the inner stream once the far end answered 200.
pub async fn connect_inner(
    cfg: &Config,
    io: H2Io,
    cert: &InstalledCert,
    expected: ExpectedIdentities,
    certs: &crate::identity::CertStore,
    req: http::Request<()>,
) -> Result<(SendStream<Bytes>, RecvStream, InnerConnection), InnerError> {
    let tls_cfg = client_config(cert, expected, certs).map_err(|e| InnerError::Config(e.to_string()))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls_cfg));
    // No SNI is sent (enable_sni = false); the name only satisfies the API.
    let name = rustls::pki_types::ServerName::IpAddress(std::net::IpAddr::from([0, 0, 0, 0]).into());
    let tls = connector.connect(name, io).await.map_err(|e| {
        if crate::tls::revocation::is_revoked_error(&e) {
            certs.revocations().refused(crate::tls::revocation::Peer::Server);
        }
        InnerError::Tls(e)
    })?;
    // The destination behind the gateway is followed for revocation like a pooled connection's server.
    let revocation = certs.watch_revocation(
        tls.get_ref().1.peer_certificates(),
        Some(cert.roots.clone()),
        crate::tls::revocation::Peer::Server,
    );
    let revoked = revocation.revoked.clone();
    // The gateway picked the final destination: its identity is the one this inner handshake verified.
    let identity = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(|c| spiffe_identity(c).ok());
    let (send_req, conn) = builder(cfg).handshake::<_, Bytes>(tls).await.map_err(InnerError::H2)?;
    let driver = tokio::spawn(async move {
        tokio::select! {
            _ = conn => {}
            _ = revocation.revoked.cancelled() => {}
        }
    });
    let mut inner = InnerConnection { driver, revoked, derived: None };
    let mut send_req = send_req.ready().await.map_err(InnerError::Request)?;
    let (resp, send) = send_req.send_request(req, false).map_err(InnerError::Request)?;
    let resp = resp.await.map_err(InnerError::Request)?;
    if resp.status() != http::StatusCode::OK {
        return Err(InnerError::Status(resp.status().as_u16()));
    }
    // What the destination says of itself in its 200's baggage (ENABLE_RESPONSE_BAGGAGE), as ztunnel derives the
    // destination of a double-HBONE connection from it.
    let baggage = crate::metrics::Baggage::parse(resp.headers());
    inner.derived = Some(Box::new(crate::metrics::DerivedPeer { baggage, identity }));
    Ok((send, resp.into_body(), inner))
}
