//! HTTP/2 for HBONE: the settings both sides use (Istio's, spec §2.2) and the PING keepalive.

pub mod client;
pub mod server;

use std::time::Duration;

/// First PING after 10 s of connection life, then every 10 s; no PONG within 20 s drops the connection.
pub const PING_INTERVAL: Duration = Duration::from_secs(10);
pub const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// Run PING/PONG until a PONG is late or the connection goes away. Returns when the peer is considered dead.
pub async fn keepalive(mut ping: ::h2::PingPong) -> &'static str {
    loop {
        tokio::time::sleep(PING_INTERVAL).await;
        match tokio::time::timeout(PING_TIMEOUT, ping.ping(::h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => continue,
            Ok(Err(_)) => return "ping failed",
            Err(_) => return "ping timed out",
        }
    }
}
