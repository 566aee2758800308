//! An HBONE connection taken from h2 and rustls in mid-transfer and carried on by `hbone::Engine`, against a real
//! h2 and rustls peer that is none the wiser: every byte of every stream, both ways, in order; the peer's new
//! streams go elsewhere after the GOAWAY; its KeyUpdate is followed.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::hbone::{self, ConnParcel, StreamParcel};
use super::http2::Tap;
use super::tls13;
use crate::copy::{self, Tally};

/// The client's TLS session, shared so the test can make it update its keys while h2 runs over it.
struct SharedTls(Arc<Mutex<tokio_rustls::client::TlsStream<TcpStream>>>);

impl AsyncRead for SharedTls {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0.lock()).poll_read(cx, buf)
    }
}

impl AsyncWrite for SharedTls {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut *self.0.lock()).poll_write(cx, buf)
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0.lock()).poll_flush(cx)
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0.lock()).poll_shutdown(cx)
    }
}

/// The byte at offset `i` of stream `s`'s upload (the echo brings it back).
fn byte(s: u32, i: u64) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 9) ^ (s as u64 * 77)) as u8
}

fn configs() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    let (mut server, mut client) = tls13::tests::configs();
    server.alpn_protocols = vec![b"h2".to_vec()];
    client.alpn_protocols = vec![b"h2".to_vec()];
    (Arc::new(server), Arc::new(client))
}

async fn echo_app() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// The client's side of one stream: uploads `total` bytes at a pace, then END_STREAM, and checks every echoed byte.
async fn client_stream(send: &mut h2::client::SendRequest<Bytes>, id: u32, total: u64) -> tokio::task::JoinHandle<u64> {
    let req = http::Request::builder().method("CONNECT").uri("127.0.0.1:1").body(()).expect("req");
    let (resp, mut up) = send.send_request(req, false).expect("request");
    tokio::spawn(async move {
        let resp = resp.await.expect("response");
        assert_eq!(resp.status(), 200);
        let mut down = resp.into_body();
        let writer = tokio::spawn(async move {
            let mut at = 0u64;
            while at < total {
                let n = (total - at).min(8 * 1024 + (at % 5000));
                let chunk: Vec<u8> = (at..at + n).map(|i| byte(id, i)).collect();
                up.reserve_capacity(chunk.len());
                let mut chunk = Bytes::from(chunk);
                while !chunk.is_empty() {
                    let got = std::future::poll_fn(|cx| up.poll_capacity(cx)).await.expect("open").expect("cap");
                    up.send_data(chunk.split_to(got.min(chunk.len())), false).expect("send");
                }
                at += n;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            up.send_data(Bytes::new(), true).expect("end");
        });
        let mut seen = 0u64;
        while let Some(chunk) = down.data().await {
            let chunk = chunk.expect("the stream is never reset");
            for b in chunk.iter() {
                assert_eq!(*b, byte(id, seen), "stream {id}: byte {seen} lost, reordered or duplicated");
                seen += 1;
            }
            down.flow_control().release_capacity(chunk.len()).expect("release");
        }
        writer.await.expect("writer");
        seen
    })
}

/// Across a process boundary: through the hand-over protocol, the sockets as SCM_RIGHTS; the successor's engine and
/// its streams' ids.
async fn cross(tcp: TcpStream, conn: ConnParcel, apps: Vec<TcpStream>) -> (hbone::Engine, Vec<u32>) {
    let n = conn.streams.len() as u32;
    let metas: Vec<super::ConnMeta> = conn
        .streams
        .iter()
        .map(|s| {
            let mut m = super::tests::describe();
            m.kind = super::ConnKind::InboundHbone;
            m.legs[0].moved = s.moved.0;
            m.legs[1].moved = s.moved.1;
            m
        })
        .collect();
    let hub = Arc::new(super::Hub::default());
    let ticket = hub.ticket();
    let fds: Vec<RawFd> = std::iter::once(tcp.as_raw_fd()).chain(apps.iter().map(|a| a.as_raw_fd())).collect();
    let first = metas[0].clone();
    let parcel = super::Parcel {
        id: ticket.id,
        fds,
        meta: None,
        legs: Default::default(),
        hbone: Some(Box::new(super::HboneOffer { conn, metas })),
    };
    let offered = tokio::spawn(async move {
        let round = ticket.round();
        round.describe.cancelled().await;
        ticket.described(first);
        round.pause.cancelled().await;
        ticket.offer(round.generation, parcel).await
    });
    let (giver_end, taker_end) = std::os::unix::net::UnixStream::pair().expect("pair");
    let giver = std::thread::spawn(move || hub.give(giver_end, "node", || {}));
    let (report, mut got) = tokio::task::spawn_blocking(move || super::take_on(taker_end, "node")).await.expect("take");
    assert_eq!(report.error, None);
    assert_eq!(report.connections, n, "counted as proxied connections");
    assert_eq!(offered.await.expect("offer"), super::Verdict::Gone);
    assert_eq!(giver.join().expect("give").connections, n);
    // The predecessor's references go; the sockets live on in the successor's.
    drop((tcp, apps));
    let r = got.pop().expect("the connection");
    let h = r.hbone.expect("an HBONE connection");
    assert_eq!(h.metas.len(), n as usize);
    let (engine, ids, _) = h.into_engine(r.fds).expect("engine");
    (engine, ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hbone_connection_carries_on_after_its_session_is_taken_from_h2_and_rustls_and_again_from_its_engine() {
    let (server_cfg, client_cfg) = configs();
    let app = echo_app().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    const STREAMS: u32 = 3;
    const TOTAL: u64 = 3 << 20;

    // The client: a plain h2 over rustls, as a peer node would be.
    let client = tokio::spawn(async move {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let tls = tokio_rustls::TlsConnector::from(client_cfg)
            .connect("peer.test".try_into().expect("name"), tcp)
            .await
            .expect("tls");
        let tls = Arc::new(Mutex::new(tls));
        let (mut send, conn) = h2::client::handshake(SharedTls(tls.clone())).await.expect("h2");
        let driver = tokio::spawn(conn);
        let mut streams = Vec::new();
        for id in 0..STREAMS {
            streams.push(client_stream(&mut send, id, TOTAL).await);
        }
        (send, driver, streams, tls)
    });

    // The server: h2 over the tap, each stream relayed to the echo application until told to pause.
    let (tcp, _) = listener.accept().await.expect("accept");
    let logged = Arc::new(Mutex::new(tls13::Secrets::default()));
    let accept = tokio_rustls::TlsAcceptor::from(server_cfg).accept(crate::tls::tls_socket(tcp));
    let tls = tls13::capture(logged.clone(), accept).await.expect("handshake");
    let (tap, shared) = Tap::new(tls, false);
    let mut conn = h2::server::handshake(tap).await.expect("h2 server");
    let pause = CancellationToken::new();
    let mut relays = Vec::new();
    for _ in 0..STREAMS {
        let (req, mut respond) = conn.accept().await.expect("a stream").expect("ok");
        let upstream = TcpStream::connect(app).await.expect("app");
        let send = respond.send_response(http::Response::new(()), false).expect("200");
        let pause = pause.clone();
        relays.push(tokio::spawn(async move {
            let (a, b) = (Tally::new(None), Tally::new(None));
            let mut relay = copy::tcp_h2_bidirectional(upstream, send, req.into_body(), &a, &b, None);
            tokio::select! {
                r = &mut relay => panic!("the relay ended before the hand-over: {:?}", r.map(|_| ())),
                _ = pause.cancelled() => relay.into_parts(),
            }
        }));
    }
    let driving = CancellationToken::new();
    let stop = driving.clone();
    let conn = tokio::spawn(async move {
        tokio::select! {
            _ = async { while let Some(Ok(_)) = conn.accept().await {} } => panic!("the connection ended"),
            _ = stop.cancelled() => conn,
        }
    });
    let (send, driver, streams, client_tls) = client.await.expect("client");
    tokio::time::sleep(Duration::from_millis(150)).await;

    // The hand-over: relays paused, h2 brought to rest, what h2 holds drained, the session taken.
    pause.cancel();
    let mut parts = Vec::new();
    for r in relays {
        parts.push(r.await.expect("paused"));
    }
    driving.cancel();
    let mut conn = conn.await.expect("conn");
    hbone::quiesce(
        &shared,
        |cx| match conn.poll_accept(cx) {
            std::task::Poll::Ready(None) | std::task::Poll::Ready(Some(Err(_))) => std::task::Poll::Ready(false),
            _ => std::task::Poll::Pending,
        },
        Duration::from_secs(2),
    )
    .await
    .expect("at rest");
    let mut streams_out = Vec::new();
    let mut apps = Vec::new();
    let mut handles = Vec::new();
    for mut p in parts {
        let id = u32::from(p.send.stream_id());
        let mut to_app = p.to_tcp.take().map(|(b, at)| b[at..].to_vec()).unwrap_or_default();
        copy::drain_received(&mut p.recv, &mut to_app).expect("drain");
        streams_out.push(StreamParcel {
            id,
            to_peer: p.to_h2.to_vec(),
            to_app,
            app_eof: p.up_done,
            app_shut: p.down_shut,
            moved: p.moved,
        });
        apps.push(p.tcp);
        handles.push((p.send, p.recv));
    }
    let secrets = std::mem::take(&mut *logged.lock());
    let plaintext = hbone::finish_record(&shared, Duration::from_secs(2)).await.expect("record finished");
    let taken = hbone::take_session(&shared, &secrets, plaintext).expect("taken");
    // The session has left h2: dropping its handles reaches nothing on the wire.
    drop(handles);
    let moved_before: u64 = streams_out.iter().map(|s| s.moved.0).sum();
    assert!(moved_before > 0, "data flowed before the hand-over");
    assert!(moved_before < STREAMS as u64 * TOTAL / 2, "most of it is left for after: {moved_before}");
    drop(conn);
    let conn = ConnParcel {
        tls: taken.tls,
        h2: taken.h2,
        ciphertext: taken.ciphertext,
        plaintext: taken.plaintext,
        conn_window: 65_535,
        streams: streams_out,
        peer: hbone::PeerChain { chain: vec![vec![0x30, 1, 2], vec![0x30, 3]], verified_at: 1_700_000_000 },
    };
    let (mut engine, ids) = cross(taken.tcp, conn, apps).await;
    assert_eq!(ids.len(), STREAMS as usize);
    // The peer's chain crosses with the connection, for the successor to follow it for revocation.
    assert_eq!(engine.peer().chain, [vec![0x30, 1, 2], vec![0x30, 3]]);
    assert_eq!(engine.peer().verified_at, 1_700_000_000);
    let ends = Arc::new(Mutex::new(Vec::new()));

    // The peer updates its keys (and asks for ours) while the first successor carries the connection.
    let updating = client_tls.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        updating.lock().get_mut().1.refresh_traffic_keys().expect("key update");
    });
    let until = tokio::time::Instant::now() + Duration::from_millis(120);
    tokio::select! {
        done = engine.step() => {
            assert!(!done, "the connection ended before the second hand-over");
            panic!("a stream ended before the second hand-over: {:?}", engine.take_ended().map(|e| e.id).collect::<Vec<_>>());
        }
        _ = tokio::time::sleep_until(until) => {}
    }
    // The successor is succeeded in turn: the engine comes to rest at a record's end and crosses again.
    assert!(engine.can_hand_over(), "an engine at work can be handed on");
    assert!(engine.flush(Duration::from_secs(2)).await, "what it owed the peer is written");
    let (tcp, conn, apps) = engine.into_parcel();
    let moved_first: u64 = conn.streams.iter().map(|s| s.moved.0).sum();
    assert!(moved_first > moved_before, "the first successor moved bytes: {moved_before} → {moved_first}");
    assert!(moved_first < STREAMS as u64 * TOTAL, "some are left for the second: {moved_first}");
    let (engine, ids) = cross(tcp, conn, apps).await;
    assert_eq!(ids.len(), STREAMS as usize);
    let e2 = ends.clone();
    let carried = tokio::spawn(engine.run(move |e| e2.lock().push((e.id, e.result.is_ok(), e.moved))));

    // And again, with the second successor.
    tokio::time::sleep(Duration::from_millis(30)).await;
    client_tls.lock().get_mut().1.refresh_traffic_keys().expect("key update");

    // The peer's new streams are refused or go elsewhere: the GOAWAY arrived.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let refused = match send.ready().await {
        Err(_) => true,
        Ok(mut s) => {
            let req = http::Request::builder().method("CONNECT").uri("127.0.0.1:1").body(()).expect("req");
            match s.send_request(req, true) {
                Err(_) => true,
                Ok((resp, _)) => resp.await.is_err(),
            }
        }
    };
    assert!(refused, "no new stream on a handed-over connection");

    for s in streams {
        let seen = tokio::time::timeout(Duration::from_secs(30), s).await.expect("in time").expect("stream");
        assert_eq!(seen, TOTAL, "every byte came back");
    }
    tokio::time::timeout(Duration::from_secs(10), carried).await.expect("the engine ends").expect("engine");
    let ends = ends.lock().clone();
    assert_eq!(ends.len(), STREAMS as usize);
    for (id, ok, moved) in ends {
        assert!(ok, "stream {id} ended cleanly");
        assert_eq!(moved, (TOTAL, TOTAL), "stream {id}: the bytes of both processes");
    }
    // The client's connection ends without an error once its streams are done.
    let r = tokio::time::timeout(Duration::from_secs(10), driver).await.expect("closed").expect("driver");
    assert!(r.is_ok(), "the peer saw a clean end: {r:?}");
}

/// Two engines back to back, as after both ends of one HBONE connection were handed over: fixed keys, stream 1
/// open both ways, each engine's application socket the test's.
async fn engine_pair() -> ((hbone::Engine, TcpStream), (hbone::Engine, TcpStream)) {
    use super::http2::{H2State, StreamWire};
    let dir = |k: u8| tls13::DirState { secret: None, key: vec![k; 16], iv: vec![k + 1; 12], seq: 0 };
    let tls = |tx: u8, rx: u8| tls13::TlsState { suite: 0x1301, tx: dir(tx), rx: dir(rx) };
    let h2 = |client: bool| {
        let mut h = H2State::new(client);
        h.streams.insert(1, StreamWire { send: 65_535, recv: 65_535, local_end: false, remote_end: false });
        h.peer_last_stream = if client { 0 } else { 1 };
        h
    };
    let parcel = |tls, h2| ConnParcel {
        tls,
        h2,
        ciphertext: Vec::new(),
        plaintext: Vec::new(),
        conn_window: 65_535,
        peer: Default::default(),
        streams: vec![StreamParcel {
            id: 1,
            to_peer: Vec::new(),
            to_app: Vec::new(),
            app_eof: false,
            app_shut: false,
            moved: (0, 0),
        }],
    };
    let pair = || async {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let c = TcpStream::connect(l.local_addr().expect("addr")).await.expect("connect");
        (c, l.accept().await.expect("accept").0)
    };
    let (ta, tb) = pair().await;
    let (app_a, side_a) = pair().await;
    let (app_b, side_b) = pair().await;
    let a = hbone::Engine::new(ta, parcel(tls(1, 3), h2(true)), vec![side_a]).expect("a");
    let b = hbone::Engine::new(tb, parcel(tls(3, 1), h2(false)), vec![side_b]).expect("b");
    ((a, app_a), (b, app_b))
}

#[tokio::test]
async fn a_stream_s_last_bytes_come_through_when_the_peer_closes_the_connection_right_after_them() {
    use tokio::io::AsyncReadExt;
    let ((a, mut app_a), (b, mut app_b)) = engine_pair().await;
    let ends = Arc::new(Mutex::new(Vec::new()));
    let (ea, eb) = (ends.clone(), ends.clone());
    let a = tokio::spawn(a.run(move |e| ea.lock().push(("a", e.result.is_ok(), e.moved))));
    let b = tokio::spawn(b.run(move |e| eb.lock().push(("b", e.result.is_ok(), e.moved))));
    app_a.write_all(b"hello").await.expect("write");
    app_a.shutdown().await.expect("shutdown");
    let mut got = Vec::new();
    app_b.read_to_end(&mut got).await.expect("read");
    assert_eq!(got, b"hello");
    // Written and shut down before the engine runs again (one thread): its last DATA, its END_STREAM and, the
    // connection's last stream over, close_notify and FIN go out in one write and come in in one read.
    let last = vec![7u8; 3000];
    app_b.write_all(&last).await.expect("write");
    app_b.shutdown().await.expect("shutdown");
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), app_a.read_to_end(&mut got)).await.expect("in time").expect("read");
    assert_eq!(got.len(), last.len(), "every last byte, though the peer closed right after them");
    assert_eq!(got, last);
    for t in [a, b] {
        tokio::time::timeout(Duration::from_secs(10), t).await.expect("the engine ends").expect("engine");
    }
    let mut ends = ends.lock().clone();
    ends.sort();
    assert_eq!(ends, vec![("a", true, (5, 3000)), ("b", true, (3000, 5))], "both ends clean, every byte counted");
}
