//! SOCKS5 entry for a local workload's outbound traffic (RFC 1928: no authentication, CONNECT, IPv4/IPv6 literals
//! and domain names). Everything entering a workload's SOCKS5 listener has that workload as its source. A domain
//! name is resolved as ztunnel resolves it, through the workload's DNS proxy resolver (`dns::Server::resolve_host`):
//! a mesh name answers its VIP, `localhost` the loopback, anything else the upstream resolvers (cached).
//!
//! Invariant: the success reply is sent only once the upstream is established (for HBONE, once the peer answered
//! 200), and no client byte is read before it, so nothing is forwarded to a destination that was refused.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::outbound::{self, OutboundError, RouteError};
use super::pool::PoolError;
use super::{LocalRef, ProxyInputs};
use crate::drain::Drain;

/// A client has this long to finish the SOCKS5 greeting and request.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub mod reply {
    pub const SUCCEEDED: u8 = 0x00;
    pub const GENERAL_FAILURE: u8 = 0x01;
    pub const NOT_ALLOWED: u8 = 0x02;
    pub const NETWORK_UNREACHABLE: u8 = 0x03;
    pub const HOST_UNREACHABLE: u8 = 0x04;
    pub const CONNECTION_REFUSED: u8 = 0x05;
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x07;
    pub const ADDRESS_TYPE_NOT_SUPPORTED: u8 = 0x08;
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Socks5Error {
    #[error("not SOCKS version 5 (got {0})")]
    Version(u8),
    #[error("client offers no acceptable authentication method")]
    NoAcceptableAuth,
    #[error("command {0} is not supported (CONNECT only)")]
    Command(u8),
    #[error("address type {0} is not supported (IPv4, IPv6 and domain names only)")]
    AddressType(u8),
    #[error("the domain name is not valid: {0}")]
    Domain(String),
    #[error("port 0 is no destination")]
    PortZero,
    #[error("I/O: {0}")]
    Io(String),
}

impl From<std::io::Error> for Socks5Error {
    fn from(e: std::io::Error) -> Self {
        Socks5Error::Io(e.to_string())
    }
}

/// The SOCKS5 reply code for an outbound failure.
pub fn reply_code(e: &OutboundError) -> u8 {
    use std::io::ErrorKind::*;
    let io_code = |e: &std::io::Error| match e.kind() {
        ConnectionRefused => reply::CONNECTION_REFUSED,
        NetworkUnreachable => reply::NETWORK_UNREACHABLE,
        HostUnreachable | TimedOut => reply::HOST_UNREACHABLE,
        _ => reply::GENERAL_FAILURE,
    };
    match e {
        OutboundError::Route(RouteError::SelfCall(_)) => reply::NOT_ALLOWED,
        OutboundError::Route(_) => reply::HOST_UNREACHABLE,
        OutboundError::Connect(_, io) => io_code(io),
        OutboundError::Pool(PoolError::Connect(_, io)) => io_code(io),
        OutboundError::Status(_, 503) => reply::CONNECTION_REFUSED,
        OutboundError::Status(_, 401 | 403) => reply::NOT_ALLOWED,
        OutboundError::Inner(super::double_hbone::InnerError::Status(401 | 403)) => reply::NOT_ALLOWED,
        OutboundError::Inner(super::double_hbone::InnerError::Status(503)) => reply::CONNECTION_REFUSED,
        _ => reply::GENERAL_FAILURE,
    }
}

/// Where a CONNECT asks to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Addr(SocketAddr),
    /// A domain name (ATYP 3) and port, resolved before routing.
    Name(String, u16),
}

impl Target {
    pub fn port(&self) -> u16 {
        match self {
            Target::Addr(a) => a.port(),
            Target::Name(_, port) => *port,
        }
    }
}

/// Read the greeting and the CONNECT request; answer the method selection. Returns the destination.
pub async fn handshake<S: AsyncReadExt + AsyncWriteExt + Unpin>(
    s: &mut S,
) -> Result<Target, (Socks5Error, Option<u8>)> {
    let io = |e: std::io::Error| (Socks5Error::from(e), None);
    let mut hdr = [0u8; 2];
    s.read_exact(&mut hdr).await.map_err(io)?;
    if hdr[0] != 5 {
        return Err((Socks5Error::Version(hdr[0]), None));
    }
    let mut methods = vec![0u8; hdr[1] as usize];
    s.read_exact(&mut methods).await.map_err(io)?;
    if !methods.contains(&0) {
        s.write_all(&[5, 0xff]).await.map_err(io)?;
        return Err((Socks5Error::NoAcceptableAuth, None));
    }
    s.write_all(&[5, 0]).await.map_err(io)?;
    let mut req = [0u8; 4];
    s.read_exact(&mut req).await.map_err(io)?;
    if req[0] != 5 {
        return Err((Socks5Error::Version(req[0]), None));
    }
    if req[1] != 1 {
        return Err((Socks5Error::Command(req[1]), Some(reply::COMMAND_NOT_SUPPORTED)));
    }
    let host = match req[3] {
        1 => {
            let mut b = [0u8; 4];
            s.read_exact(&mut b).await.map_err(io)?;
            Ok(Ipv4Addr::from(b).into())
        }
        4 => {
            let mut b = [0u8; 16];
            s.read_exact(&mut b).await.map_err(io)?;
            Ok(Ipv6Addr::from(b).into())
        }
        3 => {
            let mut len = [0u8; 1];
            s.read_exact(&mut len).await.map_err(io)?;
            let mut name = vec![0u8; len[0] as usize];
            s.read_exact(&mut name).await.map_err(io)?;
            Err(name)
        }
        other => return Err((Socks5Error::AddressType(other), Some(reply::ADDRESS_TYPE_NOT_SUPPORTED))),
    };
    let mut port = [0u8; 2];
    s.read_exact(&mut port).await.map_err(io)?;
    let port = match u16::from_be_bytes(port) {
        0 => return Err((Socks5Error::PortZero, Some(reply::NOT_ALLOWED))),
        port => port,
    };
    match host {
        Ok(ip) => Ok(Target::Addr(SocketAddr::new(ip, port))),
        // A hostname's characters (RFC 1123), not empty: anything else is no name to resolve.
        Err(name) => match String::from_utf8(name) {
            Ok(n)
                if !n.is_empty()
                    && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_') =>
            {
                Ok(Target::Name(n, port))
            }
            Ok(n) => Err((Socks5Error::Domain(n), Some(reply::HOST_UNREACHABLE))),
            Err(e) => Err((
                Socks5Error::Domain(String::from_utf8_lossy(e.as_bytes()).into_owned()),
                Some(reply::HOST_UNREACHABLE),
            )),
        },
    }
}

pub async fn send_reply<S: AsyncWriteExt + Unpin>(s: &mut S, code: u8) -> std::io::Result<()> {
    // BND.ADDR/BND.PORT are not meaningful for a proxy that hides its upstream socket: 0.0.0.0:0.
    s.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await
}

/// Serve `listener` for the workload `src`; `resolver` resolves the domain names its clients ask for (None: they
/// are refused, as an address type not supported).
pub async fn serve(
    listener: TcpListener,
    pi: Arc<ProxyInputs>,
    src: LocalRef,
    resolver: Option<Arc<crate::dns::Server>>,
    drain: Drain,
) {
    let l = Arc::new(outbound::Listener { pi, local: src, force: drain.force.clone() });
    let pi = l.pi.clone();
    super::accept_until_drained(listener, &pi, &drain, move |stream, peer| {
        outbound::connection(l.clone(), Box::pin(establish(l.clone(), resolver.clone(), stream, peer)))
    })
    .await
}

/// The SOCKS5 handshake, the route and the connect; the success reply once the upstream is established.
async fn establish(
    l: Arc<outbound::Listener>,
    resolver: Option<Arc<crate::dns::Server>>,
    mut stream: TcpStream,
    peer: SocketAddr,
) -> Option<Box<outbound::Established>> {
    let pi = &l.pi;
    let target = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&mut stream)).await {
        Ok(Ok(target)) => target,
        Ok(Err((_e, code))) => {
            if let Some(code) = code {
                let _ = send_reply(&mut stream, code).await;
            }
            return None;
        }
        Err(_) => return None,
    };
    let dst = match target {
        Target::Addr(dst) => dst,
        Target::Name(name, port) => {
            let Some(resolver) = resolver else {
                let _ = send_reply(&mut stream, reply::ADDRESS_TYPE_NOT_SUPPORTED).await;
                return None;
            };
            match resolver.resolve_host(&name).await {
                Ok(ip) => SocketAddr::new(ip, port),
                Err(e) => {
                    let f = crate::fields! {"src.addr" => peer.to_string(), "domain" => name, "error" => e};
                    pi.events.log(crate::events::Level::Debug, "SOCKS5 domain name not resolved", f);
                    let _ = send_reply(&mut stream, reply::HOST_UNREACHABLE).await;
                    return None;
                }
            }
        }
    };
    match outbound::connect(pi, &l.local, peer, dst).await {
        Ok((routed, upstream)) => {
            send_reply(&mut stream, reply::SUCCEEDED).await.ok()?;
            Some(Box::new(outbound::Established {
                client: stream,
                client_addr: peer,
                original_dst: dst,
                routed: Box::new(routed),
                upstream,
            }))
        }
        Err((routed, err)) => {
            let _ = send_reply(&mut stream, reply_code(&err)).await;
            outbound::record_failure(pi, &l.local, peer, dst, routed.as_ref(), &err);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's side of a handshake to 10.0.0.1:`port` (no auth, CONNECT, IPv4), then what the server answered.
    async fn run(port: u16) -> (Result<Target, (Socks5Error, Option<u8>)>, Vec<u8>) {
        let mut req = vec![5, 1, 0, 5, 1, 0, 1, 10, 0, 0, 1];
        req.extend_from_slice(&port.to_be_bytes());
        run_request(req).await
    }

    async fn run_request(req: Vec<u8>) -> (Result<Target, (Socks5Error, Option<u8>)>, Vec<u8>) {
        let (mut client, mut server) = tokio::io::duplex(512);
        client.write_all(&req).await.unwrap();
        let out = handshake(&mut server).await;
        drop(server);
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        (out, answer)
    }

    #[tokio::test]
    async fn a_connect_to_port_zero_is_not_allowed() {
        let (out, answer) = run(0).await;
        assert_eq!(answer, [5, 0], "method selection only");
        assert!(matches!(out, Err((Socks5Error::PortZero, Some(reply::NOT_ALLOWED)))));
        let (out, _) = run(8080).await;
        assert_eq!(out.unwrap(), Target::Addr("10.0.0.1:8080".parse().unwrap()));
    }

    #[tokio::test]
    async fn a_domain_name_is_read_whole_and_a_malformed_one_refused() {
        let named = |name: &[u8]| {
            let mut req = vec![5, 1, 0, 5, 1, 0, 3, name.len() as u8];
            req.extend_from_slice(name);
            req.extend_from_slice(&443u16.to_be_bytes());
            req
        };
        let (out, _) = run_request(named(b"echo.default.svc.cluster.local")).await;
        assert_eq!(out.unwrap(), Target::Name("echo.default.svc.cluster.local".into(), 443));
        for bad in [&b""[..], b"a b", b"\xff\xfe", b"x/y"] {
            let (out, _) = run_request(named(bad)).await;
            assert!(matches!(out, Err((Socks5Error::Domain(_), Some(reply::HOST_UNREACHABLE)))), "{bad:?}: {out:?}");
        }
    }
}
