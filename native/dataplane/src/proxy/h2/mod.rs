//! HTTP/2 for HBONE: the settings both sides use (ztunnel's) and its PING keepalive.

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

/// How long a stream may go on once its HTTP/2 connection has ended: enough to hand the application what h2 had
/// already received (an upload whose client closed without waiting), not to keep a stream whose application does not
/// read (and what h2 holds for it) forever.
pub const CLOSED_STREAM_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// An HTTP/2 connection has ended: end its streams with `streams_end`, at once when `now` (the connection was shed or
/// forced), else CLOSED_STREAM_GRACE later (or when `force` fires first). One token per connection, so a stream's task
/// waits on one thing for all three causes (each wait is a 72-byte future in every idle stream's task).
pub fn end_streams(
    streams_end: tokio_util::sync::CancellationToken,
    now: bool,
    force: tokio_util::sync::CancellationToken,
) {
    if now || force.is_cancelled() {
        streams_end.cancel();
        return;
    }
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(CLOSED_STREAM_GRACE) => {}
            _ = force.cancelled() => {}
        }
        streams_end.cancel();
    });
}
