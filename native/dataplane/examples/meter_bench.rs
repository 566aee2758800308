//! What the buffer budget's accounting costs on the byte path (budget.rs): one HTTP/2 stream over loopback TCP,
//! an application socket → `copy::tcp_h2_bidirectional` → h2 → the reader (which answers at once with an empty
//! body, so only the TCP → HTTP/2 direction carries data), with the connection's IO plain and `Metered`, in
//! alternating rounds (same process, same machine state). No TLS, so the accounting's share is not diluted by
//! encryption: this is its upper bound. Prints each configuration's median throughput and CPU per GB, and the ratios.
//! Run: cargo run --release -p ztunnel-dataplane --example meter_bench

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use dataplane::budget::{Budget, Metered};
use dataplane::copy::{tcp_h2_bidirectional, Tally};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

const BYTES: usize = 2 << 30;
const ROUNDS: usize = 5;

fn cpu_seconds() -> f64 {
    let mut ru: nix::libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { nix::libc::getrusage(nix::libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: nix::libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (s, _) = l.accept().await.unwrap();
    c.set_nodelay(true).unwrap();
    s.set_nodelay(true).unwrap();
    (c, s)
}

/// One transfer of BYTES; returns (seconds, CPU seconds).
async fn round(metered: bool) -> (f64, f64) {
    let budget = Arc::new(Budget::default());
    let (app, app_proxy) = pair().await;
    let (h2c, h2s) = pair().await;
    let peer = h2s.peer_addr().unwrap();
    // The reader: an h2 server that reads the stream and releases its window.
    let reader = tokio::spawn(async move {
        let mut conn = h2::server::Builder::new()
            .initial_window_size(4 << 20)
            .initial_connection_window_size(16 << 20)
            .max_frame_size(1 << 20)
            .handshake::<_, Bytes>(h2s)
            .await
            .unwrap();
        let (req, mut resp) = conn.accept().await.unwrap().unwrap();
        tokio::spawn(async move { while conn.accept().await.is_some() {} });
        resp.send_response(http::Response::new(()), true).unwrap();
        let mut body = req.into_body();
        let mut got = 0usize;
        while let Some(d) = body.data().await {
            let d = d.unwrap();
            got += d.len();
            body.flow_control().release_capacity(d.len()).unwrap();
        }
        got
    });
    let conn = budget.connection(peer);
    let mut b = h2::client::Builder::new();
    b.initial_window_size(4 << 20).initial_connection_window_size(16 << 20).max_frame_size(1 << 20);
    let (send, stream, response, buffers) = if metered {
        let (mut s, c) = b.handshake::<_, Bytes>(Metered::new(h2c, conn.clone(), true)).await.unwrap();
        tokio::spawn(c);
        let (r, st) = s.send_request(http::Request::post("http://x/").body(()).unwrap(), false).unwrap();
        (s, st, r, Some(conn))
    } else {
        let (mut s, c) = b.handshake::<_, Bytes>(h2c).await.unwrap();
        tokio::spawn(c);
        let (r, st) = s.send_request(http::Request::post("http://x/").body(()).unwrap(), false).unwrap();
        (s, st, r, None)
    };
    let writer = tokio::spawn(async move {
        let mut app = app;
        let chunk = vec![0x5au8; 256 * 1024];
        let mut left = BYTES;
        while left > 0 {
            let n = left.min(chunk.len());
            app.write_all(&chunk[..n]).await.unwrap();
            left -= n;
        }
        app.shutdown().await.unwrap();
    });
    let (t0, c0) = (Instant::now(), cpu_seconds());
    let body = response.await.unwrap().into_body();
    let (tally, back) = (Tally::new(None), Tally::new(None));
    let (up, down) = tcp_h2_bidirectional(app_proxy, stream, body, &tally, &back, buffers).await.unwrap();
    assert_eq!((up, down), (BYTES as u64, 0));
    let got = reader.await.unwrap();
    writer.await.unwrap();
    drop(send);
    assert_eq!(got, BYTES);
    assert_eq!(budget.used(), 0, "everything written is taken off the count");
    (t0.elapsed().as_secs_f64(), cpu_seconds() - c0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (mut plain, mut metered) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    rt.block_on(async {
        round(false).await; // warm-up
        for _ in 0..ROUNDS {
            for m in [false, true] {
                let (secs, cpu) = round(m).await;
                let gb = BYTES as f64 / 1e9;
                let into = if m { &mut metered } else { &mut plain };
                into.0.push(gb * 8.0 / secs);
                into.1.push(cpu / gb);
            }
        }
    });
    let (pg, pc) = (median(plain.0), median(plain.1));
    let (mg, mc) = (median(metered.0), median(metered.1));
    println!("plain   {pg:6.2} Gbit/s  {pc:.3} CPU-s/GB");
    println!("metered {mg:6.2} Gbit/s  {mc:.3} CPU-s/GB");
    println!(
        "metered/plain: throughput {:.3}, CPU per GB {:.3} (median of {ROUNDS} alternating rounds)",
        mg / pg,
        mc / pc
    );
}
