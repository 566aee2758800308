//! The key log of HBONE sessions that can be handed to a successor daemon (handover/tls13.rs continues them): rustls
//! logs a handshake's first application traffic secrets into it, kept in memory for that one connection and only while
//! `capture` polls it; never to a file.

use std::cell::RefCell;
use std::sync::Arc;

use parking_lot::Mutex;

/// The first application traffic secrets of one handshake, as rustls logged them.
#[derive(Default)]
pub struct Secrets {
    pub client: Option<Vec<u8>>,
    pub server: Option<Vec<u8>>,
}

thread_local! {
    /// Where the handshake being polled on this thread logs its secrets (`capture`).
    pub(crate) static SINK: RefCell<Option<Arc<Mutex<Secrets>>>> = const { RefCell::new(None) };
}

/// rustls' key log for HBONE sessions: it keeps the two first application traffic secrets of the handshake being
/// polled inside `capture`, and nothing otherwise.
#[derive(Debug)]
pub struct CaptureLog;

const CLIENT_SECRET: &str = "CLIENT_TRAFFIC_SECRET_0";
const SERVER_SECRET: &str = "SERVER_TRAFFIC_SECRET_0";

impl rustls::KeyLog for CaptureLog {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        SINK.with(|s| {
            if let Some(sink) = &*s.borrow() {
                let mut sink = sink.lock();
                match label {
                    CLIENT_SECRET => sink.client = Some(secret.to_vec()),
                    SERVER_SECRET => sink.server = Some(secret.to_vec()),
                    _ => {}
                }
            }
        });
    }

    fn will_log(&self, label: &str) -> bool {
        (label == CLIENT_SECRET || label == SERVER_SECRET) && SINK.with(|s| s.borrow().is_some())
    }
}

/// Poll a handshake with its secrets caught into `sink` (rustls logs them synchronously, inside a poll).
pub async fn capture<F: std::future::Future>(sink: Arc<Mutex<Secrets>>, fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        let prev = SINK.with(|s| s.replace(Some(sink.clone())));
        let r = fut.as_mut().poll(cx);
        SINK.with(|s| *s.borrow_mut() = prev);
        r
    })
    .await
}
