//! The HBONE client pool against a real in-process HTTP/2-over-mTLS server: reuse, stream limits, concurrent
//! creation, GOAWAY, and peer identity checks.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dataplane::ca::LocalCa;
use dataplane::config::Config;
use dataplane::drain::Drain;
use dataplane::events::Events;
use dataplane::identity::{CertStore, Identity};
use dataplane::metrics::Metrics;
use dataplane::proxy::pool::{Pool, PoolError, PoolKey};
use dataplane::tls::{self, ExpectedIdentities};
use http::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

struct Fixture {
    _dir: TempDir,
    ca: LocalCa,
    certs: Arc<CertStore>,
}

struct TempDir(std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn id(sa: &str) -> Identity {
    Identity::new("cluster.local", "default", sa)
}

impl Fixture {
    fn new() -> Fixture {
        let dir = std::env::temp_dir().join(format!("ztn-pool-{}-{}", std::process::id(), rand::random::<u64>()));
        let ca = LocalCa::open(&dir, "cluster.local").unwrap();
        let certs = Arc::new(CertStore::new(tls::provider()));
        Fixture { _dir: TempDir(dir), ca, certs }
    }

    fn issue(&self, store: &CertStore, identity: &Identity) {
        let csr = store.create_csr(identity).unwrap();
        let chain = self.ca.sign(&csr, &identity.to_string(), Duration::from_secs(3600)).unwrap();
        store.install(identity, &chain, self.ca.root_pem()).unwrap();
    }
}

/// A test HBONE server: answers every CONNECT with 200 and holds the stream open until the client ends it.
/// `goaway_after`: send GOAWAY once that many streams were accepted on a connection.
struct Server {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

async fn server(fx: &Fixture, identity: Identity, max_streams: u32, goaway_after: Option<usize>) -> Server {
    let store = Arc::new(CertStore::new(tls::provider()));
    fx.issue(&store, &identity);
    let cfg = Arc::new(tls::server_config(store, identity).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    tokio::spawn(async move {
        let acceptor = TlsAcceptor::from(cfg);
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let mut conn = h2::server::Builder::new()
                    .max_concurrent_streams(max_streams)
                    .handshake::<_, Bytes>(tls)
                    .await
                    .unwrap();
                let mut accepted = 0;
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    accepted += 1;
                    assert_eq!(req.method(), Method::CONNECT);
                    tokio::spawn(async move {
                        let mut send = respond.send_response(Response::new(()), false).unwrap();
                        let mut body = req.into_body();
                        while let Some(Ok(_)) = body.data().await {}
                        let _ = send.send_data(Bytes::new(), true);
                    });
                    if goaway_after == Some(accepted) {
                        conn.graceful_shutdown();
                    }
                }
            });
        }
    });
    Server { addr, connections }
}

fn pool(fx: &Fixture, max_streams: u32) -> Arc<Pool> {
    pool_with(fx, Config { pool_max_streams_per_connection: max_streams, ..Config::default() })
}

fn pool_with(fx: &Fixture, cfg: Config) -> Arc<Pool> {
    Pool::new(Arc::new(cfg), fx.certs.clone(), Arc::new(Metrics::default()), Arc::new(Events::default()), Drain::new())
}

fn key(addr: SocketAddr, expected: &[Identity]) -> PoolKey {
    PoolKey {
        src_id: id("sleep"),
        dst_ids: ExpectedIdentities::new(expected.to_vec()),
        dst: addr,
        src: "127.0.0.1".parse().unwrap(),
    }
}

fn connect_req(addr: SocketAddr) -> impl Fn() -> Request<()> + Sync {
    move || Request::builder().method(Method::CONNECT).uri(addr.to_string()).body(()).unwrap()
}

/// Open a CONNECT and keep it open; returns the send half (dropping it ends the stream).
async fn open(
    pool: &Pool,
    k: &PoolKey,
) -> Result<(h2::SendStream<Bytes>, dataplane::proxy::pool::StreamLease), PoolError> {
    let mk = connect_req(k.dst);
    let (resp, send, lease) = pool.send_connect(k, &mk).await?;
    let resp = resp.await.map_err(|e| PoolError::Request(k.dst, e))?;
    assert_eq!(resp.status(), StatusCode::OK);
    Ok((send, lease))
}

#[tokio::test]
async fn sequential_streams_reuse_one_connection() {
    let fx = Fixture::new();
    fx.issue(&fx.certs, &id("sleep"));
    let srv = server(&fx, id("echo"), 200, None).await;
    let p = pool(&fx, 100);
    let k = key(srv.addr, &[id("echo")]);
    for _ in 0..10 {
        let (mut send, lease) = open(&p, &k).await.unwrap();
        send.send_data(Bytes::new(), true).unwrap();
        drop(lease);
    }
    assert_eq!(srv.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn concurrent_first_requests_create_exactly_one_connection() {
    let fx = Fixture::new();
    fx.issue(&fx.certs, &id("sleep"));
    let srv = server(&fx, id("echo"), 200, None).await;
    let p = pool(&fx, 100);
    let k = key(srv.addr, &[id("echo")]);
    let opens = (0..50).map(|_| open(&p, &k));
    let held: Vec<_> = futures_util::future::join_all(opens).await.into_iter().map(Result::unwrap).collect();
    assert_eq!(held.len(), 50);
    assert_eq!(srv.connections.load(Ordering::SeqCst), 1);
    assert_eq!(p.connection_count(), 1);
}

#[tokio::test]
async fn stream_limit_is_the_lower_of_ours_and_the_peers() {
    let fx = Fixture::new();
    fx.issue(&fx.certs, &id("sleep"));
    // Our limit 3: 7 concurrent streams need 3 connections.
    let srv = server(&fx, id("echo"), 200, None).await;
    let p = pool(&fx, 3);
    let k = key(srv.addr, &[id("echo")]);
    let held: Vec<_> =
        futures_util::future::join_all((0..7).map(|_| open(&p, &k))).await.into_iter().map(Result::unwrap).collect();
    assert_eq!(held.len(), 7);
    assert_eq!(srv.connections.load(Ordering::SeqCst), 3);

    // The peer's limit 2 (below our 100): 5 concurrent streams need 3 connections. The peer's SETTINGS arrive
    // right after the handshake; open one stream first so they are known.
    let srv2 = server(&fx, id("echo"), 2, None).await;
    let p2 = pool(&fx, 100);
    let k2 = key(srv2.addr, &[id("echo")]);
    let first = open(&p2, &k2).await.unwrap();
    let mut rest = Vec::new();
    for _ in 0..4 {
        rest.push(open(&p2, &k2).await.unwrap());
    }
    drop((first, rest));
    assert_eq!(srv2.connections.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_connection_that_received_goaway_is_not_reused() {
    let fx = Fixture::new();
    fx.issue(&fx.certs, &id("sleep"));
    let srv = server(&fx, id("echo"), 200, Some(1)).await;
    let p = pool(&fx, 100);
    let k = key(srv.addr, &[id("echo")]);
    let (_s1, _l1) = open(&p, &k).await.unwrap();
    // Let the GOAWAY arrive.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_s2, _l2) = open(&p, &k).await.unwrap();
    assert_eq!(srv.connections.load(Ordering::SeqCst), 2, "the second stream must use a fresh connection");
}

#[tokio::test]
async fn keys_do_not_share_connections() {
    let fx = Fixture::new();
    fx.issue(&fx.certs, &id("sleep"));
    fx.issue(&fx.certs, &id("other"));
    let srv = server(&fx, id("echo"), 200, None).await;
    let p = pool(&fx, 100);
    let a = key(srv.addr, &[id("echo")]);
    let b = PoolKey { src_id: id("other"), ..a.clone() };
    let c = PoolKey { dst_ids: ExpectedIdentities::new(vec![id("echo"), id("echo-san")]), ..a.clone() };
    let d = PoolKey { src: "127.0.0.2".parse().unwrap(), ..a.clone() };
    let _held = (
        open(&p, &a).await.unwrap(),
        open(&p, &b).await.unwrap(),
        open(&p, &c).await.unwrap(),
        open(&p, &d).await.unwrap(),
    );
    assert_eq!(srv.connections.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn wrong_server_identity_fails_the_handshake() {
    let fx = Fixture::new();
    fx.issue(&fx.certs, &id("sleep"));
    // The server has a valid certificate from the mesh CA, but for another identity.
    let srv = server(&fx, id("evil"), 200, None).await;
    let p = pool(&fx, 100);
    let k = key(srv.addr, &[id("echo")]);
    let err = open(&p, &k).await.err().expect("must fail");
    assert!(matches!(err, PoolError::Tls(..)), "{err}");
    assert_eq!(err.response_flag(), "TLS_FAILURE");
}

#[tokio::test]
async fn no_certificate_means_no_connection() {
    let fx = Fixture::new();
    let srv = server(&fx, id("echo"), 200, None).await;
    // The pool waits for a certificate on demand up to the connect timeout: keep it short here.
    let cfg = Config { connect_timeout_ms: 200, ..Config::default() };
    let p = pool_with(&fx, cfg);
    let err = open(&p, &key(srv.addr, &[id("echo")])).await.err().expect("must fail");
    assert!(matches!(err, PoolError::NoCertificate(_)), "{err}");
    assert_eq!(srv.connections.load(Ordering::SeqCst), 0, "nothing is dialed without our certificate");
}

#[tokio::test]
async fn a_certificate_installed_while_the_dial_waits_is_used() {
    let fx = Fixture::new();
    let srv = server(&fx, id("echo"), 200, None).await;
    let p = pool(&fx, 100);
    let k = key(srv.addr, &[id("echo")]);
    let dial = tokio::spawn({
        let (p, k) = (p.clone(), k.clone());
        async move { open(&p, &k).await.map(|_| ()).map_err(|e| e.to_string()) }
    });
    // The control side hears the ask (certificates on demand) and installs the certificate.
    let asked = tokio::time::timeout(Duration::from_secs(5), fx.certs.next_wants()).await.expect("an ask");
    assert_eq!(asked, vec![id("sleep")]);
    fx.issue(&fx.certs, &id("sleep"));
    dial.await.unwrap().expect("the waiting dial proceeds");
    assert_eq!(srv.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn idle_keys_are_released() {
    let fx = Fixture::new();
    fx.issue(&fx.certs, &id("sleep"));
    let srv = server(&fx, id("echo"), 200, None).await;
    let cfg = Config { pool_unused_release_timeout_ms: 50, ..Config::default() };
    let p = pool_with(&fx, cfg);
    let k = key(srv.addr, &[id("echo")]);
    let held = open(&p, &k).await.unwrap();
    assert_eq!(p.evict_idle(std::time::Instant::now() + Duration::from_secs(1)), 0, "a key with a live stream stays");
    drop(held);
    assert_eq!(p.evict_idle(std::time::Instant::now() + Duration::from_secs(1)), 1);
    assert_eq!(p.connection_count(), 0);
    let _again = open(&p, &k).await.unwrap();
    assert_eq!(srv.connections.load(Ordering::SeqCst), 2);
}
