//! Socket creation shared by every listener and upstream connection.
//!
//! Every socket ztunnel-node creates comes from a `SocketFactory`: in local mode the daemon's own network namespace;
//! in-pod, the pod's namespace with `SO_MARK` set, so the pod's iptables rules let ztunnel-node's own traffic through
//! instead of capturing it again, which would loop it back into the proxy.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Listen backlog; matches ztunnel's in-pod listeners.
const BACKLOG: i32 = 128;

/// The keepalive every TCP socket gets (`configure`). Process-wide, as the settings are (one daemon, one set, given at
/// start), rather than threaded through every factory and call site.
static KEEPALIVE: parking_lot::RwLock<Option<crate::config::SocketConfig>> = parking_lot::RwLock::new(None);

/// Set the keepalive of the sockets made from now on (ztunnel's default until called).
pub fn configure(cfg: crate::config::SocketConfig) {
    *KEEPALIVE.write() = Some(cfg);
}

/// SO_KEEPALIVE with its time, interval and count when enabled, and TCP_USER_TIMEOUT when asked (on its own, as in
/// ztunnel's `DefaultSocketFactory`: time + interval × retries), on an upstream socket before it connects and on each
/// accepted one (a listener's options reach its children, but not an armed keepalive timer). Best effort, as ztunnel's:
/// a refused option never fails the connection. A handed-over socket keeps them: it is the same socket.
fn keepalive(sock: socket2::SockRef<'_>) {
    let cfg = KEEPALIVE.read().unwrap_or_default();
    let (time, interval) =
        (Duration::from_millis(cfg.keepalive_time_ms), Duration::from_millis(cfg.keepalive_interval_ms));
    if cfg.keepalive_enabled {
        let ka =
            socket2::TcpKeepalive::new().with_time(time).with_interval(interval).with_retries(cfg.keepalive_retries);
        let _ = sock.set_tcp_keepalive(&ka);
    }
    if cfg.user_timeout_enabled {
        let _ = sock.set_tcp_user_timeout(Some(time + interval * cfg.keepalive_retries));
    }
}

pub trait SocketFactory: Send + Sync + 'static {
    /// A new TCP socket, in the right network namespace, with the right mark.
    fn tcp(&self, domain: Domain) -> io::Result<Socket>;
    /// A new UDP socket, likewise (the DNS proxy's listeners and upstream queries).
    fn udp(&self, domain: Domain) -> io::Result<Socket>;
}

/// Sockets of the daemon's own network namespace, unmarked.
#[derive(Debug, Default, Clone, Copy)]
pub struct DefaultSockets;

impl SocketFactory for DefaultSockets {
    fn tcp(&self, domain: Domain) -> io::Result<Socket> {
        Socket::new(domain, Type::STREAM, Some(Protocol::TCP))
    }
    fn udp(&self, domain: Domain) -> io::Result<Socket> {
        Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct ListenOptions {
    /// SO_REUSEPORT, so a new daemon can bind beside a draining one.
    pub reuse_port: bool,
    /// IP_TRANSPARENT (best effort): accepted sockets may then answer for any address (needed with TPROXY).
    pub transparent: bool,
}

/// Bind a listener. Must be called inside the runtime context.
pub fn listen_with(f: &dyn SocketFactory, addr: SocketAddr, opts: ListenOptions) -> io::Result<TcpListener> {
    let sock = f.tcp(Domain::for_address(addr))?;
    sock.set_reuse_address(true)?;
    if opts.reuse_port {
        sock.set_reuse_port(true)?;
    }
    if opts.transparent {
        set_transparent(&sock, addr.is_ipv4());
    }
    sock.set_nonblocking(true)?;
    if addr.is_ipv6() {
        sock.set_only_v6(false)?;
    }
    sock.bind(&addr.into())?;
    sock.listen(BACKLOG)?;
    TcpListener::from_std(sock.into())
}

/// Bind a UDP socket (the DNS proxy). Must be called inside the runtime context.
pub fn bind_udp(f: &dyn SocketFactory, addr: SocketAddr, opts: ListenOptions) -> io::Result<tokio::net::UdpSocket> {
    let sock = f.udp(Domain::for_address(addr))?;
    if opts.reuse_port {
        sock.set_reuse_port(true)?;
    }
    sock.set_nonblocking(true)?;
    if addr.is_ipv6() {
        sock.set_only_v6(false)?;
    }
    sock.bind(&addr.into())?;
    tokio::net::UdpSocket::from_std(sock.into())
}

/// A local-mode workload's listener: SO_REUSEPORT, so a successor daemon of the same node binds beside this one and
/// takes its connections over (`handover`), as in-pod listeners do.
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    listen_with(&DefaultSockets, addr, ListenOptions { reuse_port: true, transparent: false })
}

/// An accepted connection's options: TCP_NODELAY and the keepalive.
pub fn accepted(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    keepalive(socket2::SockRef::from(stream));
    Ok(())
}

/// Best effort: IP_TRANSPARENT needs CAP_NET_ADMIN. Returns whether it took.
pub fn set_transparent(sock: &Socket, v4: bool) -> bool {
    if v4 {
        sock.set_ip_transparent_v4(true).is_ok()
    } else {
        sock.set_ip_transparent_v6(true).is_ok()
    }
}

/// The destination a redirected (iptables REDIRECT) connection was originally sent to.
/// Like ztunnel: IPv4 first (a dual-stack listener carries IPv4 connections as v4-mapped), then IPv6.
pub fn original_dst(stream: &TcpStream) -> io::Result<SocketAddr> {
    let sock = socket2::SockRef::from(stream);
    let addr = match sock.original_dst_v4() {
        Ok(a) => a,
        Err(_) => sock.original_dst_v6()?,
    };
    addr.as_socket().map(canonical).ok_or_else(|| io::Error::other("original destination is not an IP address"))
}

/// An IPv4 peer of a dual-stack socket shows as `::ffff:a.b.c.d`; policies, lookups and logs want `a.b.c.d`.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// How an upstream connection is made.
#[derive(Debug, Default, Clone, Copy)]
pub struct ConnectOptions {
    /// Bind to this source address first (port 0 = any).
    pub bind: Option<SocketAddr>,
    /// Set IP_TRANSPARENT so `bind` may be an address this host does not own (original source preservation).
    pub transparent: bool,
}

/// Connect with a deadline, TCP_NODELAY set.
pub async fn connect_with(
    f: &dyn SocketFactory,
    dst: SocketAddr,
    opts: ConnectOptions,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let sock = f.tcp(Domain::for_address(dst))?;
    if let Some(src) = opts.bind.filter(|s| s.is_ipv4() == dst.is_ipv4()) {
        if opts.transparent {
            set_transparent(&sock, src.is_ipv4());
            // IP_FREEBIND as well: the address may not be configured here at all.
            let _ = if src.is_ipv4() { sock.set_freebind_v4(true) } else { sock.set_freebind_v6(true) };
        }
        sock.bind(&src.into())?;
    }
    sock.set_tcp_nodelay(true)?;
    keepalive(socket2::SockRef::from(&sock));
    sock.set_nonblocking(true)?;
    let sock = TcpSocket::from_std_stream(sock.into());
    match tokio::time::timeout(timeout, sock.connect(dst)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, format!("connection to {dst} timed out"))),
    }
}

/// Connect from the daemon's own namespace, optionally from a given source IP.
pub async fn connect(dst: SocketAddr, src: Option<IpAddr>, timeout: Duration) -> io::Result<TcpStream> {
    let opts = ConnectOptions { bind: src.map(|ip| SocketAddr::new(ip, 0)), transparent: false };
    connect_with(&DefaultSockets, dst, opts, timeout).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An accepted socket and an upstream connection carry the configured keepalive.
    #[tokio::test]
    async fn accepted_and_upstream_sockets_carry_the_configured_keepalive() {
        let cfg = crate::config::SocketConfig {
            keepalive_enabled: true,
            keepalive_time_ms: 42_000,
            keepalive_interval_ms: 7_000,
            keepalive_retries: 3,
            user_timeout_enabled: true,
        };
        configure(cfg);
        let l = listen_with(&DefaultSockets, "127.0.0.1:0".parse().unwrap(), ListenOptions::default()).unwrap();
        let addr = l.local_addr().unwrap();
        let up = connect_with(&DefaultSockets, addr, ConnectOptions::default(), Duration::from_secs(5)).await.unwrap();
        let (accepted, _) = l.accept().await.unwrap();
        super::accepted(&accepted).unwrap();
        for s in [socket2::SockRef::from(&accepted), socket2::SockRef::from(&up)] {
            assert!(s.keepalive().unwrap());
            assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(42));
            assert_eq!(s.tcp_keepalive_interval().unwrap(), Duration::from_secs(7));
            assert_eq!(s.tcp_keepalive_retries().unwrap(), 3);
            assert_eq!(s.tcp_user_timeout().unwrap(), Some(Duration::from_secs(42 + 7 * 3)));
        }
        configure(crate::config::SocketConfig { keepalive_enabled: false, ..cfg });
        let off = connect_with(&DefaultSockets, addr, ConnectOptions::default(), Duration::from_secs(5)).await.unwrap();
        assert!(!socket2::SockRef::from(&off).keepalive().unwrap(), "off: no keepalive");
        let user_timeout = socket2::SockRef::from(&off).tcp_user_timeout().unwrap();
        assert_eq!(
            user_timeout,
            Some(Duration::from_secs(42 + 7 * 3)),
            "the user timeout on its own, as ztunnel sets it"
        );
        configure(crate::config::SocketConfig::default());
    }
}
