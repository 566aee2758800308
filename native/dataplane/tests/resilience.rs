//! Connect retry and passive outlier ejection (proxy/outbound.rs `connect`, proxy/outlier.rs) through the real
//! outbound connect on real sockets, in process: a service with three plain-TCP endpoints on loopback, one serving,
//! one refusing (a closed port) and one blackholed (a listener whose accept queue is full, so SYNs go unanswered).
//! Time is the detector's own clock, moved by the test (`Outliers::advance`), never slept.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dataplane::proxy::outbound::{self, OutboundError};
use dataplane::proxy::LocalRef;
use dataplane::Dataplane;
use serde_json::{json, Value};

const SLEEP: &str = "127.93.1.10";
const GOOD: &str = "127.93.2.10";
const REFUSING: &str = "127.93.3.10";
const BLACKHOLE: &str = "127.93.4.10";
const VIP: &str = "127.93.100.1";
const PORT: u16 = 8080;

/// The tests share the endpoints' addresses: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn workload(uid: &str, ip: &str, node: &str, extra: Value) -> Value {
    let mut w = json!({"uid": uid, "name": uid, "namespace": "default", "serviceAccount": uid, "workloadIps": [ip],
                       "protocol": "TCP", "node": node});
    w.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    w
}

/// The daemon (node-a, `sleep`) and its mesh: `svc` at VIP:80 → 8080 on the three endpoints, `lb` its load balancer.
fn world(lb: Value, resilience: Value) -> Dataplane {
    let cfg = json!({"nodeName": "node-a", "connectTimeoutMs": 600, "resilience": resilience});
    let dp = Dataplane::from_json(&cfg.to_string()).unwrap();
    let member = json!({"services": {"default/svc.default.svc.cluster.local": {"80": PORT}}});
    let delta = json!({
        "workloads": [
            workload("sleep", SLEEP, "node-a", json!({})),
            workload("good", GOOD, "node-b", member.clone()),
            workload("refusing", REFUSING, "node-b", member.clone()),
            workload("blackhole", BLACKHOLE, "node-b", member),
        ],
        "services": [{"name": "svc", "namespace": "default", "hostname": "svc.default.svc.cluster.local",
                      "vips": [format!("/{VIP}")], "ports": {"80": PORT}, "loadBalancer": lb}],
    });
    dp.apply_state_json(&delta.to_string()).unwrap();
    dp
}

/// The serving endpoint (a thread accepting and closing what it accepts, stopped and joined on drop, so the next
/// test can bind the address), and the blackhole: a listener with a backlog of one, filled by a connection never
/// accepted (the kernel then drops further SYNs).
struct Endpoints {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    _hole: socket2::Socket,
    _filler: std::net::TcpStream,
}

impl Drop for Endpoints {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn endpoints() -> Endpoints {
    let good = std::net::TcpListener::bind((GOOD, PORT)).unwrap();
    good.set_nonblocking(true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let thread = std::thread::spawn(move || {
        while !stopped.load(Ordering::Relaxed) {
            match good.accept() {
                Ok((s, _)) => drop(s),
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    });
    let hole = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    hole.set_reuse_address(true).unwrap();
    hole.bind(&SocketAddr::new(BLACKHOLE.parse().unwrap(), PORT).into()).unwrap();
    hole.listen(0).unwrap();
    let filler = std::net::TcpStream::connect((BLACKHOLE, PORT)).unwrap();
    Endpoints { stop, thread: Some(thread), _hole: hole, _filler: filler }
}

async fn connect(dp: &Dataplane, dst: &str) -> Result<(String, u32), String> {
    let client: SocketAddr = format!("{SLEEP}:40000").parse().unwrap();
    let local = LocalRef::Uid("sleep".into());
    match outbound::connect(dp.inputs(), &local, client, dst.parse().unwrap()).await {
        Ok((routed, _upstream)) => Ok((routed.request.destination.unwrap().uid.to_string(), routed.attempts)),
        Err((_, e)) => Err(e.to_string()),
    }
}

fn ejected(dp: &Dataplane) -> Vec<String> {
    let dump = dp.inputs().outliers.dump();
    dump.into_iter().filter(|e| e.ejected_for_ms.is_some()).map(|e| e.uid).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_costs_no_client_connection_and_is_ejected_then_tried_again() {
    let _serial = SERIAL.lock().await;
    let _eps = endpoints();
    let dp = world(json!({"mode": "Standard"}), json!({}));
    let mut retries = 0;
    for i in 0..200 {
        let (uid, attempts) =
            connect(&dp, &format!("{VIP}:80")).await.unwrap_or_else(|e| panic!("connection {i}: {e}"));
        assert_eq!(uid, "good", "connection {i}");
        retries += attempts - 1;
    }
    let o = &dp.inputs().outliers;
    assert_eq!(ejected(&dp), ["blackhole", "refusing"], "five consecutive failures each");
    assert_eq!(o.ejections_total.load(Ordering::Relaxed), 2);
    assert!(retries >= 10, "each failure of the dead endpoints was retried ({retries})");
    assert_eq!(o.retries_total.load(Ordering::Relaxed), u64::from(retries));
    // Ejected: every connection goes straight to the serving endpoint.
    for _ in 0..20 {
        assert_eq!(connect(&dp, &format!("{VIP}:80")).await.unwrap(), ("good".to_string(), 1));
    }
    // The base ejection time passes on the detector's clock: both are tried again, fail, and are ejected anew for
    // twice as long.
    o.advance(Duration::from_secs(30));
    assert!(ejected(&dp).is_empty(), "back after the base ejection time");
    for _ in 0..60 {
        assert_eq!(connect(&dp, &format!("{VIP}:80")).await.unwrap().0, "good");
    }
    assert_eq!(ejected(&dp), ["blackhole", "refusing"]);
    assert!(o.dump().iter().all(|e| e.ejections == 2 && e.ejected_for_ms.is_some_and(|ms| ms > 30_000)));
    // istiod's word (the endpoint changed, healthy) ends an ejection at once.
    let back = workload(
        "refusing",
        REFUSING,
        "node-b",
        json!({"canonicalRevision": "v2",
        "services": {"default/svc.default.svc.cluster.local": {"80": PORT}}}),
    );
    dp.apply_state_json(&json!({"workloads": [back]}).to_string()).unwrap();
    assert_eq!(ejected(&dp), ["blackhole"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_scope_and_workload_addressed_traffic_are_never_escaped_by_a_retry() {
    let _serial = SERIAL.lock().await;
    let _eps = endpoints();
    // Strict [Node]: the only endpoint on the client's node refuses; the one elsewhere serves but is out of scope.
    let dp = world(json!({"mode": "Strict", "routingPreferences": ["Node"]}), json!({}));
    let local = workload(
        "refusing",
        REFUSING,
        "node-a",
        json!({"services": {"default/svc.default.svc.cluster.local": {"80": PORT}}}),
    );
    dp.apply_state_json(&json!({"workloads": [local]}).to_string()).unwrap();
    for _ in 0..3 {
        let e = connect(&dp, &format!("{VIP}:80")).await.unwrap_err();
        assert!(e.contains(REFUSING), "{e}");
    }
    // Workload-addressed: the refusing endpoint itself, never another.
    let dp = world(json!({"mode": "Standard"}), json!({}));
    let e = connect(&dp, &format!("{REFUSING}:{PORT}")).await.unwrap_err();
    assert!(e.contains("refused"), "{e}");
    assert_eq!(dp.inputs().outliers.retries_total.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turned_off_it_is_ztunnel_s_connect() {
    let _serial = SERIAL.lock().await;
    let _eps = endpoints();
    let dp = world(json!({"mode": "Standard"}), json!({"connectAttempts": 1, "consecutiveFailures": 0}));
    let mut failed = 0;
    for _ in 0..30 {
        failed += usize::from(connect(&dp, &format!("{VIP}:80")).await.is_err());
    }
    assert!(failed >= 8, "about two in three fail without retry ({failed} of 30)");
    assert!(dp.inputs().outliers.dump().is_empty(), "nothing tracked");
    assert_eq!(dp.inputs().outliers.retries_total.load(Ordering::Relaxed), 0);
}

#[test]
fn a_policy_s_answer_and_what_this_node_got_wrong_are_never_retried() {
    let peer: SocketAddr = "10.0.0.1:15008".parse().unwrap();
    assert!(!OutboundError::Status(peer, 401).retryable(), "a DENY is an answer");
    assert!(!OutboundError::Status(peer, 400).retryable());
    assert!(OutboundError::Status(peer, 503).retryable());
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    assert!(OutboundError::Connect(peer, refused).retryable());
}
