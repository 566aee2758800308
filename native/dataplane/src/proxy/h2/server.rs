//! The HBONE server side of HTTP/2: ztunnel's server settings.

/// ztunnel advertises 200 concurrent streams per connection.
pub const MAX_CONCURRENT_STREAMS: u32 = 200;
/// Header list limit on the server side (ztunnel: 64 KiB).
const MAX_HEADER_LIST: u32 = 64 * 1024;
/// Per-stream send buffer (ztunnel: 400 KiB): bounds what a peer that never opens its window can make us hold.
const MAX_SEND_BUFFER: usize = 400 * 1024;

pub fn builder(cfg: &crate::config::Config) -> h2::server::Builder {
    let mut b = h2::server::Builder::new();
    b.initial_window_size(cfg.http2.stream_window_size)
        .initial_connection_window_size(cfg.http2.connection_window_size)
        .max_frame_size(cfg.http2.frame_size)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST)
        .max_send_buffer_size(MAX_SEND_BUFFER);
    b
}
