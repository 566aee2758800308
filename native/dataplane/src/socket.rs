//! Socket setup shared by every listener and upstream connection.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Listen backlog; matches ztunnel's in-pod listeners.
const BACKLOG: i32 = 128;

/// Bind a listener. Must be called inside the runtime context.
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.set_nonblocking(true)?;
    if addr.is_ipv6() {
        sock.set_only_v6(false)?;
    }
    sock.bind(&addr.into())?;
    sock.listen(BACKLOG)?;
    TcpListener::from_std(sock.into())
}

/// Connect with a deadline, optionally from a given source IP, with TCP_NODELAY set.
pub async fn connect(dst: SocketAddr, src: Option<IpAddr>, timeout: Duration) -> io::Result<TcpStream> {
    let sock = if dst.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    if let Some(ip) = src {
        if ip.is_ipv4() == dst.is_ipv4() {
            sock.bind(SocketAddr::new(ip, 0))?;
        }
    }
    sock.set_nodelay(true)?;
    match tokio::time::timeout(timeout, sock.connect(dst)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, format!("connection to {dst} timed out"))),
    }
}
