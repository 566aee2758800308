//! The hand-over within one process: a predecessor's relay and a successor's resume over a socket pair, with the
//! same descriptors and the same exchange as between two daemons.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::carry::{carry, Carried, Ends};
use super::wire::{self, Kind};
use super::*;
use crate::copy::{tcp_bidirectional, Tally};
use crate::proxy::resume::{meta, resume};
use crate::proxy::LocalRef;

const UP: usize = 3 << 20;
const DOWN: usize = 2 << 20;
/// Each way, for the tests of many connections: paced finely, they last a second or so and cost little.
const SLOW: usize = 1 << 20;

fn pattern(seed: usize, at: usize, len: usize) -> Vec<u8> {
    (at..at + len).map(|i| ((i * 7 + seed) % 251) as u8).collect()
}

async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (s, _) = l.accept().await.unwrap();
    (c, s)
}

/// Writes `len` bytes of a pattern in small paced chunks (a pause after each `every`), then half-closes.
async fn send_paced(mut s: tokio::net::tcp::OwnedWriteHalf, seed: usize, len: usize, every: usize) {
    let mut at = 0;
    while at < len {
        let n = (len - at).min(8 * 1024);
        s.write_all(&pattern(seed, at, n)).await.unwrap();
        at += n;
        if at % every == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    s.shutdown().await.unwrap();
}

/// Reads to EOF; the count of bytes and of bytes that differ from the pattern (0: nothing lost, duplicated or
/// reordered).
async fn receive(mut s: tokio::net::tcp::OwnedReadHalf, seed: usize) -> (usize, usize) {
    let (mut got, mut bad) = (0usize, 0usize);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = s.read(&mut buf).await.unwrap();
        if n == 0 {
            return (got, bad);
        }
        let want = pattern(seed, got, n);
        bad += buf[..n].iter().zip(&want).filter(|(a, b)| a != b).count();
        got += n;
    }
}

pub(crate) fn describe() -> ConnMeta {
    let pi = crate::inpod::testutil::inputs();
    let labels = crate::metrics::TrafficLabels { reporter: "source".into(), ..Default::default() };
    let result = crate::proxy::access::ConnectionResult::open(&pi, labels, std::time::Instant::now());
    let addr = "127.0.0.1:1".parse().unwrap();
    let record = crate::fields! {"src.addr" => "127.0.0.1:1", "direction" => "outbound"};
    meta(ConnKind::OutboundTcp, &LocalRef::Uid("u".into()), &result, record, (addr, addr, addr))
}

struct Flow {
    relay: tokio::task::JoinHandle<&'static str>,
    client: tokio::task::JoinHandle<(usize, usize)>,
    server: tokio::task::JoinHandle<(usize, usize)>,
    force: CancellationToken,
}

/// client ⇄ [relay] ⇄ server, both ways at once, the relay registered with `hub`.
async fn flow(hub: Arc<Hub>) -> Flow {
    flow_of(hub, (UP, DOWN), 256 * 1024).await
}

/// `flow`, `up` and `down` bytes, a pause after each `every`.
async fn flow_of(hub: Arc<Hub>, (up, down): (usize, usize), every: usize) -> Flow {
    let (client, relay_a) = pair().await;
    let (relay_b, server) = pair().await;
    let force = CancellationToken::new();
    let f = force.clone();
    let relay = tokio::spawn(async move {
        let (t0, t1) = (Tally::new(None), Tally::new(None));
        let never = CancellationToken::new();
        let r = tcp_bidirectional(relay_a, relay_b, &t0, &t1);
        match carry(&hub, r, Ends { force: &f, close: &never }, describe).await {
            Carried::HandedOver => "handed over",
            Carried::Ended(Ok(()), _) => "ended",
            Carried::Ended(Err(_), _) => "failed",
        }
    });
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    tokio::spawn(send_paced(cw, 1, up, every));
    tokio::spawn(send_paced(sw, 2, down, every));
    let client = tokio::spawn(receive(cr, 2));
    let server = tokio::spawn(receive(sr, 1));
    Flow { relay, client, server, force }
}

async fn wait_live(hub: &Hub, n: usize) {
    for _ in 0..200 {
        if hub.live() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{n} connections never registered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copying_relay_is_handed_over_byte_exact_and_the_successor_finishes_it() {
    let old = Arc::new(Hub::default());
    let flows = [flow(old.clone()).await, flow(old.clone()).await];
    wait_live(&old, 2).await;
    tokio::time::sleep(Duration::from_millis(30)).await; // mid-transfer
    let (p, s) = UnixStream::pair().unwrap();
    let stopped = Arc::new(AtomicBool::new(false));
    let st = stopped.clone();
    let hub = old.clone();
    let give = tokio::task::spawn_blocking(move || hub.give(p, "node-a", || st.store(true, Ordering::SeqCst)));
    let (taken, received) = tokio::task::spawn_blocking(move || take_on(s, "node-a")).await.unwrap();
    let given = give.await.unwrap();
    assert_eq!(given.error, None);
    assert_eq!((given.connections, given.kept, taken.connections), (2, 0, 2), "{given:?} {taken:?}");
    assert!(stopped.load(Ordering::SeqCst), "the predecessor stopped accepting");
    assert_eq!(taken.peer_version, VERSION);
    for r in &received {
        let (up, down) = (r.legs[0].moved, r.legs[1].moved);
        assert!(up > 0 && up < UP as u64 && down < DOWN as u64, "handed over mid-transfer: {up} up, {down} down");
    }
    // The successor's side: its own inputs and hub, as a new daemon has.
    let pi = crate::inpod::testutil::inputs();
    let resumed: Vec<_> = received
        .into_iter()
        .map(|r| tokio::spawn(resume(pi.clone(), CancellationToken::new(), r, arrival())))
        .collect();
    for f in flows {
        assert_eq!(f.relay.await.unwrap(), "handed over", "the predecessor's task let it go");
        assert_eq!(f.server.await.unwrap(), (UP, 0), "every byte up, in order, once");
        assert_eq!(f.client.await.unwrap(), (DOWN, 0), "every byte down, in order, once");
        drop(f.force);
    }
    for r in resumed {
        tokio::time::timeout(Duration::from_secs(5), r).await.unwrap().unwrap();
    }
    // One record per connection, written by the successor, with the bytes of both processes.
    let events: Vec<serde_json::Value> = serde_json::from_str(&pi.events.drain_json()).unwrap();
    let done: Vec<_> = events.iter().filter(|e| e["message"] == "connection complete").collect();
    assert_eq!(done.len(), 2, "{events:?}");
    for e in done {
        assert_eq!(e["fields"]["bytes_sent"], UP as u64);
        assert_eq!(e["fields"]["bytes_recv"], DOWN as u64);
        assert_eq!(e["fields"]["direction"], "outbound");
    }
    assert_eq!(old.live(), 0);
}

/// The successor fails at each step before `Committed`: the predecessor keeps every connection, which finishes
/// intact, and a later hand-over can still pause them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_that_fails_before_committing_leaves_everything_with_the_predecessor() {
    for step in ["hello-only", "after-offers", "after-commit", "other-version", "other-node"] {
        let hub = Arc::new(Hub::default());
        let f = flow(hub.clone()).await;
        wait_live(&hub, 1).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (p, s) = UnixStream::pair().unwrap();
        let h = hub.clone();
        let give = tokio::task::spawn_blocking(move || h.give(p, "node-a", || ()));
        let successor = tokio::task::spawn_blocking(move || {
            let version = if step == "other-version" { VERSION + 1 } else { VERSION };
            let node = if step == "other-node" { "node-b" } else { "node-a" };
            send_json(&s, Kind::Hello, &Hello { version, pid: 0, node: node.into(), waves: false }).unwrap();
            if step == "hello-only" {
                let _ = wire::recv(&s);
                return; // dies after the hello
            }
            let mut n = 0;
            while let Ok(Some(f)) = wire::recv(&s) {
                match f.kind {
                    Kind::Hello | Kind::Meta => continue,
                    Kind::Conn => n += 1,
                    Kind::Offered if step == "after-offers" => return, // dies holding the descriptors
                    Kind::Offered => send_json(&s, Kind::Ready, &Count { count: n }).unwrap(),
                    Kind::Commit => return, // dies before answering
                    _ => return,
                }
            }
        });
        successor.await.unwrap();
        let report = give.await.unwrap();
        assert!(report.error.is_some(), "{step}: {report:?}");
        assert_eq!(report.connections, 0, "{step}");
        // Refused: nothing was paused. Gone after the hello: the predecessor finds out on a write, which the kernel
        // may accept until the successor's close comes back as a reset, so the pause may have begun (then kept).
        let paused = step == "after-offers" || step == "after-commit";
        let kept: &[u32] = if paused {
            &[1]
        } else if step == "hello-only" {
            &[0, 1]
        } else {
            &[0]
        };
        assert!(kept.contains(&report.kept), "{step}: {report:?}");
        assert_eq!(report.other_node, step == "other-node", "{step}");
        assert_eq!(f.relay.await.unwrap(), "ended", "{step}: the predecessor carried it to its end");
        assert_eq!(f.server.await.unwrap(), (UP, 0), "{step}");
        assert_eq!(f.client.await.unwrap(), (DOWN, 0), "{step}");
        drop(f.force);
    }
}

/// A give from `hub` to a successor (the end returned) that has said hello, in one wave, and read up to `Offered`.
async fn giving_until_offered(hub: &Arc<Hub>) -> (tokio::task::JoinHandle<HandoverReport>, UnixStream) {
    let (p, s) = UnixStream::pair().unwrap();
    let h = hub.clone();
    let give = tokio::task::spawn_blocking(move || h.give(p, "node-a", || ()));
    send_json(&s, Kind::Hello, &Hello { version: VERSION, pid: 0, node: "node-a".into(), waves: false }).unwrap();
    let s = tokio::task::spawn_blocking(move || {
        while let Ok(Some(f)) = wire::recv(&s) {
            if f.kind == Kind::Offered {
                break;
            }
        }
        s
    });
    (give, s.await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_connection_pauses_again_for_the_next_successor() {
    let hub = Arc::new(Hub::default());
    let f = flow(hub.clone()).await;
    wait_live(&hub, 1).await;
    // A first successor that dies after the offers.
    let (give, s) = giving_until_offered(&hub).await;
    drop(s);
    assert_eq!(give.await.unwrap().kept, 1);
    // The second one takes it.
    let (p, s) = UnixStream::pair().unwrap();
    let h = hub.clone();
    let give = tokio::task::spawn_blocking(move || h.give(p, "node-a", || ()));
    let (taken, received) = tokio::task::spawn_blocking(move || take_on(s, "node-a")).await.unwrap();
    assert_eq!((give.await.unwrap().connections, taken.connections), (1, 1));
    carried_on_intact(received, f).await;
}

#[test]
fn the_socket_is_private_and_a_live_one_is_not_taken_over() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("ztn-handover-{}", std::process::id()));
    let path = dir.join("handover.sock");
    let l = listen(&path, false).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let err = listen(&path, false).unwrap_err();
    // A leaving daemon's name is taken over when asked.
    drop(listen(&path, true).unwrap());
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    drop(l);
    // A stale socket (its daemon gone) is replaced.
    let l = listen(&path, false).unwrap();
    drop(l);
    let mut got = Vec::new();
    let (report, held) = take(&dir.join("nobody.sock"), "node-a", |wave, _| got.extend(wave));
    assert!(!report.found && report.error.is_none() && got.is_empty() && held.is_none(), "{report:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_connection_frame_that_does_not_add_up_is_refused() {
    let meta = describe();
    let leg = LegMeta { moved: 0, end: Default::default(), pending: 0 };
    let entry = StateRef { id: 7, legs: [leg, leg], meta: Some(&meta) };
    let json = serde_json::to_vec(&StateOut { labels: vec![&*meta.labels], conns: vec![entry] }).unwrap();
    let frame = |extra: &[u8], sockets: usize| {
        let mut payload = (json.len() as u32).to_le_bytes().to_vec();
        payload.extend_from_slice(&json);
        payload.extend_from_slice(extra);
        let fds = (0..sockets).map(|_| std::os::fd::OwnedFd::from(UnixStream::pair().unwrap().0)).collect();
        wire::Frame { kind: Kind::Conn, fds, payload }
    };
    let mut got = Vec::new();
    parse_batch(frame(b"", 2), &mut Default::default(), &mut got).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].meta.labels.reporter, "source", "the label set comes from the batch's table");
    let err = parse_batch(frame(b"extra", 2), &mut Default::default(), &mut got).err().unwrap();
    assert!(err.to_string().contains("pending bytes"), "{err}");
    let err = parse_batch(frame(b"", 1), &mut Default::default(), &mut got).err().unwrap();
    assert!(err.to_string().contains("sockets"), "{err}");
    let garbage = wire::Frame { kind: Kind::Conn, fds: Vec::new(), payload: vec![255, 255, 255, 255] };
    assert!(parse_batch(garbage, &mut Default::default(), &mut got).is_err());
}

/// What a TCP ⇄ TCP relay's copy phase holds while idle (the outbound task boxes it): 856 bytes, and no buffer (the two
/// copy loops it replaced held 1 KiB each while idle).
#[test]
fn the_copy_phase_is_small() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (a, _x) = pair().await;
        let (b, _y) = pair().await;
        let (t0, t1) = (Tally::new(None), Tally::new(None));
        let (force, close) = (CancellationToken::new(), CancellationToken::new());
        let hub = Arc::new(Hub::default());
        let relay = tcp_bidirectional(a, b, &t0, &t1);
        let size = std::mem::size_of_val(&carry(&hub, relay, Ends { force: &force, close: &close }, describe));
        println!("task_sizes: TCP relay phase {size} bytes");
        assert!(size <= 880, "the TCP copy phase's future is {size} bytes");
    });
}

/// A connection set up after a hand-over has ended (one still connecting while it ran) carries on in the predecessor:
/// it must not pause for a round that is over and wait for a verdict that never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_comes_after_the_exchange_flows_on_in_the_predecessor() {
    let old = Arc::new(Hub::default());
    let first = flow(old.clone()).await;
    wait_live(&old, 1).await;
    let (p, s) = UnixStream::pair().unwrap();
    let hub = old.clone();
    let give = tokio::task::spawn_blocking(move || hub.give(p, "node-a", || ()));
    let (_taken, received) = tokio::task::spawn_blocking(move || take_on(s, "node-a")).await.unwrap();
    assert_eq!(give.await.unwrap().connections, 1);
    let pi = crate::inpod::testutil::inputs();
    for r in received {
        tokio::spawn(resume(pi.clone(), CancellationToken::new(), r, arrival()));
    }
    // Set up once the exchange is over, on the predecessor's hub.
    let late = flow(old.clone()).await;
    let ended = tokio::time::timeout(Duration::from_secs(20), late.relay).await;
    assert_eq!(ended.expect("the late connection hung, paused").unwrap(), "ended");
    assert_eq!(late.server.await.unwrap(), (UP, 0));
    assert_eq!(late.client.await.unwrap(), (DOWN, 0));
    assert_eq!(first.relay.await.unwrap(), "handed over");
    assert_eq!(first.server.await.unwrap(), (UP, 0));
}

/// The successor's side: what it `received` resumed on inputs of its own, and `f`'s relay handed over with every
/// byte through, each way.
async fn carried_on_intact(received: Vec<Received>, f: Flow) {
    let pi = crate::inpod::testutil::inputs();
    for r in received {
        tokio::spawn(resume(pi.clone(), CancellationToken::new(), r, arrival()));
    }
    assert_eq!(f.relay.await.unwrap(), "handed over");
    assert_eq!(f.server.await.unwrap(), (UP, 0));
    assert_eq!(f.client.await.unwrap(), (DOWN, 0));
}

/// A successor's token for one connection taken in (its pass, once dropped, judges nothing here).
fn arrival() -> Arrival {
    let r = std::sync::Arc::new(crate::proxy::reevaluation::Reevaluator::default());
    Arrival::new(None, r.adopt())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_predecessor_keeps_still_until_the_successor_has_started_what_it_took() {
    let old = Arc::new(Hub::default());
    let f = flow(old.clone()).await;
    wait_live(&old, 1).await;
    let (p, s) = UnixStream::pair().unwrap();
    let hub = old.clone();
    let give = tokio::task::spawn_blocking(move || hub.give(p, "node-a", || ()));
    let (taken, received, held) = tokio::task::spawn_blocking(move || {
        let mut got = Vec::new();
        let (report, held) = take_waves(s, "node-a", |wave, _| got.extend(wave));
        (report, got, held)
    })
    .await
    .unwrap();
    assert_eq!(taken.error, None);
    let held = held.expect("the socket, after a commit");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!give.is_finished(), "the predecessor waits for the close of the hand-over socket");
    // The successor starts what it took, then lets the socket go (the last arrival): the predecessor goes on.
    let pi = crate::inpod::testutil::inputs();
    let r = std::sync::Arc::new(crate::proxy::reevaluation::Reevaluator::default());
    let arrival = Arrival::new(Some(held), r.adopt());
    let resumed: Vec<_> = received
        .into_iter()
        .map(|r| tokio::spawn(resume(pi.clone(), CancellationToken::new(), r, arrival.clone())))
        .collect();
    drop(arrival);
    let given = tokio::time::timeout(Duration::from_secs(1), give).await.expect("it goes on").unwrap();
    assert_eq!((given.error, given.connections), (None, 1));
    assert!(given.pause_ms < 250.0, "the wait is not counted as a pause: {} ms", given.pause_ms);
    assert_eq!(f.relay.await.unwrap(), "handed over");
    assert_eq!(f.server.await.unwrap(), (UP, 0));
    assert_eq!(f.client.await.unwrap(), (DOWN, 0));
    for r in resumed {
        tokio::time::timeout(Duration::from_secs(5), r).await.unwrap().unwrap();
    }
}

/// `n` slow flows through `hub`, all live and copying, and a give under way to the successor's end returned.
async fn giving_many(hub: &Arc<Hub>, n: usize) -> (Vec<Flow>, tokio::task::JoinHandle<HandoverReport>, UnixStream) {
    let mut flows = Vec::new();
    for _ in 0..n {
        flows.push(flow_of(hub.clone(), (SLOW, SLOW), 16 * 1024).await);
    }
    wait_live(hub, n).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (p, s) = UnixStream::pair().unwrap();
    let h = hub.clone();
    (flows, tokio::task::spawn_blocking(move || h.give(p, "node-a", || ())), s)
}

/// Many connections cross in waves: each wave pauses only once the one before runs in the successor, and every connection
/// arrives intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cross_in_waves_each_paused_only_for_its_own() {
    const N: usize = 24;
    let old = Arc::new(Hub::with_wave(4));
    let (flows, give, s) = giving_many(&old, N).await;
    // At each commit the successor notes how many of the predecessor's slots are not yet asked to pause: with waves,
    // their connections still copy there while the first waves are the successor's.
    let watch = old.clone();
    let (taken, waves) = tokio::task::spawn_blocking(move || {
        let mut waves: Vec<(Vec<Received>, usize)> = Vec::new();
        let (report, _) = take_waves(s, "node-a", |wave, _| {
            let unpaused = watch.round.lock().pause.iter().filter(|t| !t.is_cancelled()).count();
            waves.push((wave, unpaused));
        });
        (report, waves)
    })
    .await
    .unwrap();
    let given = give.await.unwrap();
    assert_eq!(given.error, None);
    assert_eq!((given.connections, given.kept, taken.connections), (N as u32, 0, N as u32), "{given:?} {taken:?}");
    assert!(given.waves >= 4, "{N} connections in waves of about 4 (whole slots): {given:?}");
    assert_eq!(taken.waves, given.waves);
    assert_eq!(waves.len() as u32, taken.waves);
    assert!(waves.iter().all(|(w, _)| !w.is_empty()), "no empty wave crosses");
    let unpaused: Vec<usize> = waves.iter().map(|(_, n)| *n).collect();
    assert!(
        unpaused[0] > 0 && unpaused.windows(2).all(|w| w[0] > w[1]),
        "a wave pauses only once the one before runs in the successor: {unpaused:?}"
    );
    let pi = crate::inpod::testutil::inputs();
    let resumed: Vec<_> = waves
        .into_iter()
        .flat_map(|(w, _)| w)
        .map(|r| tokio::spawn(resume(pi.clone(), CancellationToken::new(), r, arrival())))
        .collect();
    for f in flows {
        assert_eq!(f.relay.await.unwrap(), "handed over");
        assert_eq!(f.server.await.unwrap(), (SLOW, 0), "every byte up, in order, once");
        assert_eq!(f.client.await.unwrap(), (SLOW, 0), "every byte down, in order, once");
    }
    for r in resumed {
        tokio::time::timeout(Duration::from_secs(5), r).await.unwrap().unwrap();
    }
}

/// A successor that commits a first wave and dies: that wave is its (it started it), every other connection stays
/// with the predecessor and runs to its end there, intact; the report says how many went and how many stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_that_dies_after_a_first_wave_leaves_the_rest_with_the_predecessor() {
    const N: usize = 16;
    let old = Arc::new(Hub::with_wave(1));
    let (flows, give, s) = giving_many(&old, N).await;
    let first = tokio::task::spawn_blocking(move || {
        send_json(&s, Kind::Hello, &Hello { version: VERSION, pid: 0, node: "node-a".into(), waves: true }).unwrap();
        let (mut described, mut got) = (std::collections::HashMap::new(), Vec::new());
        let mut committed = false;
        while let Ok(Some(f)) = wire::recv(&s) {
            match f.kind {
                Kind::Hello => continue,
                Kind::Meta => parse_meta(&f, &mut described).unwrap(),
                Kind::Conn if !committed => parse_batch(f, &mut described, &mut got).unwrap(),
                Kind::Offered if !committed => send_json(&s, Kind::Ready, &Count { count: got.len() as u32 }).unwrap(),
                Kind::Commit => {
                    wire::send(&s, Kind::Committed, &[], b"").unwrap();
                    wire::send(&s, Kind::Started, &[], b"").unwrap();
                    committed = true;
                }
                // The second wave's offer: it dies holding its descriptors.
                _ => break,
            }
        }
        got
    });
    let got = first.await.unwrap();
    let given = give.await.unwrap();
    assert!(given.error.is_some(), "{given:?}");
    assert_eq!(given.waves, 1);
    assert_eq!(given.connections as usize, got.len());
    assert!(!got.is_empty() && got.len() < N, "a first wave of some: {}", got.len());
    assert_eq!((given.connections + given.kept) as usize, N, "every other one is kept: {given:?}");
    let pi = crate::inpod::testutil::inputs();
    for r in got {
        tokio::spawn(resume(pi.clone(), CancellationToken::new(), r, arrival()));
    }
    let (mut handed, mut ended) = (0, 0);
    for f in flows {
        match f.relay.await.unwrap() {
            "handed over" => handed += 1,
            "ended" => ended += 1,
            other => panic!("a connection {other}"),
        }
        assert_eq!(f.server.await.unwrap(), (SLOW, 0), "every byte up, in order, once");
        assert_eq!(f.client.await.unwrap(), (SLOW, 0), "every byte down, in order, once");
    }
    assert_eq!((handed, ended), (given.connections, given.kept));
}

/// A predecessor of an older build (its Hello does not speak of waves) hands everything over in one wave, with no
/// `Done`: the successor takes it and is done at its commit, without waiting for more.
#[test]
fn a_predecessor_that_does_not_speak_of_waves_is_taken_from_in_one() {
    let (p, s) = UnixStream::pair().unwrap();
    let old = std::thread::spawn(move || {
        let hello: Hello = json(&expect(&p, Kind::Hello).unwrap()).unwrap();
        assert!(hello.waves, "the successor offers waves");
        // What an older predecessor sends: no `waves` field at all.
        let raw = serde_json::json!({"version": VERSION, "pid": 1, "node": "node-a"});
        wire::send(&p, Kind::Hello, &[], raw.to_string().as_bytes()).unwrap();
        send_json(&p, Kind::Offered, &Count { count: 0 }).unwrap();
        let ready: Count = json(&expect(&p, Kind::Ready).unwrap()).unwrap();
        wire::send(&p, Kind::Commit, &[], b"").unwrap();
        expect(&p, Kind::Committed).unwrap();
        // It keeps the socket open (waiting for the close) and sends nothing more.
        let after = wire::recv(&p).unwrap();
        (ready.count, after.is_none())
    });
    let started = std::time::Instant::now();
    let (report, held) = take_waves(s, "node-a", |wave, _| assert!(wave.is_empty()));
    assert_eq!((report.error.as_deref(), report.waves, report.connections), (None, 1, 0), "{report:?}");
    assert!(started.elapsed() < STEP_WAIT / 2, "it did not wait for another wave");
    drop(held);
    assert_eq!(
        old.join().unwrap(),
        (0, true),
        "no Started nor Done was sent to it: the next thing it saw was the close"
    );
}

/// A wave is cut by weight: an HBONE connection weighs its streams (they pause and cross one by one), a connection
/// that has not described itself weighs one.
#[test]
fn an_hbone_connection_weighs_its_streams_in_the_waves() {
    let hub = Arc::new(Hub::with_wave(8));
    let tickets: Vec<Ticket> = (0..SLOTS).map(|_| hub.ticket()).collect();
    assert_eq!(hub.waves().len(), SLOTS / 8, "one connection a slot, 8 to a wave");
    for t in &tickets {
        t.described_later(8);
    }
    assert_eq!(hub.waves().len(), SLOTS, "8 streams each: a wave each");
    assert_eq!(hub.waves().iter().map(|w| w.len()).sum::<usize>(), SLOTS, "every slot in one wave");
}

/// An offer whose task is gone before the exchange sends it (a runtime shut down under it) is not sent: its sockets
/// closed with the task, and their numbers may already be another socket's. The rest cross as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_whose_task_is_gone_is_not_sent() {
    let old = Arc::new(Hub::default());
    let f = flow(old.clone()).await;
    wait_live(&old, 1).await;
    // A connection's task queues its offer and is dropped, its sockets with it, the offer still queued.
    let (a, b) = pair().await;
    let (hub, (queued_tx, queued)) = (old.clone(), tokio::sync::oneshot::channel());
    let task = tokio::spawn(async move {
        let ticket = hub.ticket();
        let round = ticket.round();
        let fds = vec![a.as_raw_fd(), b.as_raw_fd()];
        let offer = ticket
            .offer(round.generation, Parcel { id: ticket.id, fds, meta: None, legs: Default::default(), hbone: None });
        let mut offer = std::pin::pin!(offer);
        // Polled once: queued in the hub.
        assert!(futures_util::poll!(offer.as_mut()).is_pending());
        let _ = queued_tx.send(());
        offer.await
    });
    queued.await.unwrap();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    // The closed numbers are taken again by the hand-over's own socket pair.
    let (p, s) = UnixStream::pair().unwrap();
    let hub = old.clone();
    let give = tokio::task::spawn_blocking(move || hub.give(p, "node-a", || ()));
    let (taken, received) = tokio::task::spawn_blocking(move || take_on(s, "node-a")).await.unwrap();
    let given = give.await.unwrap();
    assert_eq!((given.error.as_deref(), given.connections), (None, 1), "{given:?}");
    assert_eq!((taken.error.as_deref(), taken.connections, received.len()), (None, 1, 1), "{taken:?}");
    carried_on_intact(received, f).await;
}

/// The daemon's drain waits for a hand-over under way (its streams' tasks may all have ended, their connection's
/// offer still in its hands), and for a connection carried on after one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_waits_for_a_hand_over_under_way() {
    let hub = Arc::new(Hub::default());
    let (give, s) = giving_until_offered(&hub).await;
    // The exchange waits for `Ready`.
    assert!(!hub.settled(Duration::from_millis(200)).await, "settled while a hand-over is under way");
    let carried = hub.carrying();
    send_json(&s, Kind::Ready, &Count { count: 0 }).unwrap();
    assert_eq!(wire::recv(&s).unwrap().unwrap().kind, Kind::Commit);
    wire::send(&s, Kind::Committed, &[], b"").unwrap();
    assert_eq!(give.await.unwrap().error, None);
    assert!(!hub.settled(Duration::from_millis(100)).await, "settled while a carried-on connection is left");
    drop(carried);
    assert!(hub.settled(Duration::from_secs(1)).await);
}
