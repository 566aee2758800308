//! Live heap bytes of the mesh state for the large-input shape (100k workloads, 10k services, 1k policies), counted
//! by a wrapping global allocator, and the process RSS. Run:
//! cargo run --release -p ztunnel-dataplane --example state_mem [workloads]
//! Under heaptrack, `FORGET=1` leaves the state allocated at exit, so `heaptrack_print --print-leaks` shows where each
//! byte of it was allocated.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use dataplane::state::{State, StateDelta};
use serde_json::json;

struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
// SAFETY: delegates to System; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n, Ordering::Relaxed);
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}
#[global_allocator]
static A: Counting = Counting;

fn mib(b: usize) -> f64 {
    (b as f64 / 1048576.0 * 10.0).round() / 10.0
}

/// A delta of `items` under `key`, the JSON moved in: `json!({key: items})` would serialize a copy and leave the input
/// alive, counted as the state's (it once put the services at 2.2 KB each instead of 0.8).
fn delta(key: &str, items: Vec<serde_json::Value>) -> StateDelta {
    let doc = serde_json::Value::Object([(key.to_string(), serde_json::Value::Array(items))].into_iter().collect());
    serde_json::from_value(doc).unwrap()
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let s = n / 10;
    let p = n / 100;
    let ip = |i: usize, b: usize| format!("{b}.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    let mut st = State::default();
    let base = LIVE.load(Ordering::Relaxed);
    for chunk in (0..n).collect::<Vec<_>>().chunks(5000) {
        let workloads: Vec<_> = chunk.iter().map(|&i| {
            let ns = format!("ns{}", i % 50);
            let svc = i % s;
            json!({"uid": format!("Kubernetes//Pod/{ns}/w{i}"), "name": format!("w{i}"), "namespace": ns,
                "serviceAccount": format!("sa{}", i % 200), "trustDomain": "cluster.local", "workloadIps": [ip(i, 10)],
                "protocol": "HBONE", "node": format!("node-{}", i % 500), "canonicalName": format!("app{}", i % 1000),
                "canonicalRevision": "v1", "workloadName": format!("app{}", i % 1000), "workloadType": "deployment",
                "clusterId": "Kubernetes", "locality": {"region": format!("region-{}", i % 3), "zone": format!("zone-{}", i % 9), "subzone": ""},
                "services": {format!("ns{}/svc{svc}.ns{}.svc.cluster.local", svc % 50, svc % 50): {"80": 8080, "443": 8443}},
                "authorizationPolicies": [format!("ns{}/p{}", (i % p) % 50, i % p)]})
        }).collect();
        st.apply(delta("workloads", workloads)).unwrap();
    }
    let after_w = LIVE.load(Ordering::Relaxed);
    let services: Vec<_> = (0..s)
        .map(|j| {
            let ns = format!("ns{}", j % 50);
            json!({"name": format!("svc{j}"), "namespace": ns, "hostname": format!("svc{j}.{ns}.svc.cluster.local"),
            "vips": [format!("/{}", ip(j, 11))], "ports": {"80": 8080, "443": 8443},
            "subjectAltNames": [format!("spiffe://cluster.local/ns/{ns}/sa/sa{}", j % 200)]})
        })
        .collect();
    st.apply(delta("services", services)).unwrap();
    let after_s = LIVE.load(Ordering::Relaxed);
    let rss = std::fs::read_to_string("/proc/self/status").unwrap();
    let rss = rss.lines().find(|l| l.starts_with("VmRSS")).unwrap_or("").to_string();
    println!(
        "{}",
        json!({"workloads": n, "services": s, "workloadsMiB": mib(after_w - base),
        "servicesMiB": mib(after_s - after_w), "liveMiB": mib(after_s - base), "bytesPerWorkload": (after_w - base) / n, "rss": rss,
        "workloadStructBytes": std::mem::size_of::<dataplane::state::Workload>(),
        "serviceStructBytes": std::mem::size_of::<dataplane::state::Service>()})
    );
    std::hint::black_box(&st);
    if std::env::var_os("FORGET").is_some() {
        std::mem::forget(st);
    }
}
