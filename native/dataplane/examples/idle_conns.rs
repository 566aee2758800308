//! Heap bytes per idle tunneled connection, both node roles in one process: a SOCKS5 client → node A → HBONE
//! (mTLS, h2 CONNECT) → node B → a server that holds every connection open. A counting allocator reports the live
//! heap before and after N connections are established (and echo one byte each), so the figure is the dataplane's
//! own allocations, without RSS noise from fragmentation, Node or the kernel. Run it under heaptrack to see which
//! allocation sites the bytes come from.
//! Run: cargo run --release -p ztunnel-dataplane --example idle_conns -- [N]   (WORKERS=n: the silos per node)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dataplane::ca::LocalCa;
use dataplane::config::Config;
use dataplane::{Dataplane, LocalWorkloadSpec};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};

struct Counting;
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static LIVE_BLOCKS: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards to the system allocator and only adds counters.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(l.size() as i64, Ordering::Relaxed);
        LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE_BYTES.fetch_sub(l.size() as i64, Ordering::Relaxed);
        LIVE_BLOCKS.fetch_sub(1, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new as i64 - l.size() as i64, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> (i64, i64) {
    (LIVE_BYTES.load(Ordering::Relaxed), LIVE_BLOCKS.load(Ordering::Relaxed))
}

const SLEEP: &str = "127.89.1.10";
const ECHO: &str = "127.89.2.10";

fn main() {
    let n: usize = std::env::args().nth(1).map(|s| s.parse().expect("N")).unwrap_or(4000);
    let dir = std::env::temp_dir().join(format!("ztn-idle-{}", std::process::id()));
    let ca = LocalCa::open(&dir, "cluster.local").unwrap();
    let state = json!({"workloads": [
        {"uid": "sleep", "name": "sleep", "namespace": "default", "serviceAccount": "sleep", "workloadIps": [SLEEP],
         "protocol": "HBONE", "node": "node-a"},
        {"uid": "echo", "name": "echo", "namespace": "default", "serviceAccount": "echo", "workloadIps": [ECHO],
         "protocol": "HBONE", "node": "node-b"},
    ]})
    .to_string();
    let node = |name: &str, uid: &str, identity: &str| {
        let workers = std::env::var("WORKERS").map(|w| w.parse().expect("WORKERS")).unwrap_or(2);
        let cfg = Config { node_name: name.into(), bind_source_ip: true, worker_threads: workers, ..Config::default() };
        let dp = Dataplane::new(cfg).unwrap();
        // The daemon's default filter (RUST_LOG=info): events below it are not built, as in a daemon.
        dp.set_event_levels("info", "info", "info").unwrap();
        dp.apply_state_json(&state).unwrap();
        let csr = dp.create_csr(identity).unwrap();
        let chain = ca.sign(&csr, identity, Duration::from_secs(3600)).unwrap();
        dp.install_certificate(identity, &chain, ca.root_pem()).unwrap();
        let _ = uid;
        dp
    };
    let a = node("node-a", "sleep", "spiffe://cluster.local/ns/default/sa/sleep");
    let b = node("node-b", "echo", "spiffe://cluster.local/ns/default/sa/echo");
    let socks = format!("{SLEEP}:15080").parse().unwrap();
    a.handle()
        .block_on(a.add_local_workload(LocalWorkloadSpec {
            uid: "sleep".into(),
            hbone_addr: None,
            socks_addr: Some(socks),
            dns_addr: None,
        }))
        .unwrap();
    let hbone = format!("{ECHO}:15008").parse().unwrap();
    b.handle()
        .block_on(b.add_local_workload(LocalWorkloadSpec {
            uid: "echo".into(),
            hbone_addr: Some(hbone),
            socks_addr: None,
            dns_addr: None,
        }))
        .unwrap();

    let pool = a.inputs().pool.clone();
    // The application and the clients run on their own single thread; their allocations are measured separately.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let server = TcpListener::bind(format!("{ECHO}:8080")).await.unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = server.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut b = [0u8; 1];
                    while let Ok(1) = s.read(&mut b).await {
                        if s.write_all(&b).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let connect = || async {
            let s = TcpSocket::new_v4().unwrap();
            s.bind("127.89.1.10:0".parse().unwrap()).unwrap();
            let mut c = s.connect(socks).await.unwrap();
            c.write_all(&[5, 1, 0, 5, 1, 0, 1, 127, 89, 2, 10, 0x1f, 0x90]).await.unwrap();
            let mut r = [0u8; 12];
            c.read_exact(&mut r).await.unwrap();
            assert_eq!(r[3], 0, "SOCKS5 reply {:?}", &r[..2]);
            c.write_all(b"x").await.unwrap();
            let mut one = [0u8; 1];
            c.read_exact(&mut one).await.unwrap();
            c
        };
        // Baseline: the same client and server without the proxies, to subtract their own share.
        let direct = || async {
            let mut c = tokio::net::TcpStream::connect(format!("{ECHO}:8080")).await.unwrap();
            c.write_all(b"x").await.unwrap();
            let mut one = [0u8; 1];
            c.read_exact(&mut one).await.unwrap();
            c
        };
        drop(futures_util::future::join_all((0..64).map(|_| direct())).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (d0, _) = live();
        let mut held = Vec::with_capacity(n);
        for _ in 0..n / 64 {
            held.extend(futures_util::future::join_all((0..64).map(|_| direct())).await);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let baseline = (live().0 - d0) / held.len() as i64;
        drop(held);
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Warm: the HBONE connection, the certificates' TLS state, the tasks' first allocations.
        let warm: Vec<_> = futures_util::future::join_all((0..64).map(|_| connect())).await;
        drop(warm);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (b0, k0) = live();
        let mut held = Vec::with_capacity(n);
        for _ in 0..n / 64 {
            held.extend(futures_util::future::join_all((0..64).map(|_| connect())).await);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (b1, k1) = live();
        let n = held.len() as i64;
        println!(
            "{n} idle tunneled connections: {} heap bytes per connection for the two nodes ({} with the client and \
             server, whose own share is {baseline}); {:.1} allocations",
            (b1 - b0) / n - baseline,
            (b1 - b0) / n,
            (k1 - k0) as f64 / n as f64
        );
        // Per-silo pools: how many HBONE connections carry the held streams (100 streams each at most).
        println!("node A's pool: {} HBONE connections for {n} streams", pool.connection_count());
        if let Ok(ms) = std::env::var("HOLD_MS") {
            tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
        }
        drop(held);
    });
    let _ = Arc::new(());
    let _ = std::fs::remove_dir_all(&dir);
}
