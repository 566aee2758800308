//! The HBONE client side of HTTP/2: the handshake with Istio's client settings and the CONNECT request.

use bytes::Bytes;
use http::{Method, Request};

use crate::config::Config;

/// Header list limit on the client side (ztunnel: 16 KiB).
const MAX_HEADER_LIST: u32 = 16 * 1024;

pub fn builder(cfg: &Config) -> h2::client::Builder {
    let mut b = h2::client::Builder::new();
    b.initial_window_size(cfg.http2.stream_window_size)
        .initial_connection_window_size(cfg.http2.connection_window_size)
        .max_frame_size(cfg.http2.frame_size)
        .max_header_list_size(MAX_HEADER_LIST)
        .max_send_buffer_size(cfg.http2.stream_window_size as usize)
        .initial_max_send_streams(cfg.pool_max_streams_per_connection as usize)
        .enable_push(false);
    b
}

/// The headers ztunnel sets on every CONNECT it sends.
pub struct ConnectHeaders {
    pub baggage: String,
    pub forwarded: String,
    pub traceparent: String,
}

pub fn connect_request(authority: &str, h: &ConnectHeaders) -> Result<Request<()>, http::Error> {
    let mut b = Request::builder().method(Method::CONNECT).uri(authority).version(http::Version::HTTP_2);
    if !h.baggage.is_empty() {
        b = b.header("baggage", &h.baggage);
    }
    b = b.header("forwarded", &h.forwarded).header("traceparent", &h.traceparent);
    b.body(())
}

/// W3C traceparent with a random trace id and parent id: `00-<32 hex>-<16 hex>-00`.
pub fn new_traceparent() -> String {
    let trace: u128 = rand::random::<u128>().max(1);
    let parent: u64 = rand::random::<u64>().max(1);
    format!("00-{trace:032x}-{parent:016x}-00")
}

pub type SendRequest = h2::client::SendRequest<Bytes>;
