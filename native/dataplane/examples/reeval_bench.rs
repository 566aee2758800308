//! Continuous authorization at 10,000 live connections: what `apply_state` costs, how long a re-evaluation pass
//! takes, and what opening a connection waits for while passes run.
//! Run: cargo run --release -p ztunnel-dataplane --example reeval_bench
//! Prints one JSON line.
//!
//! The connections are registered in the tracker exactly as the inbound proxies register them (no sockets), spread
//! over 100 local workloads with 1,000 policies in their namespaces. "Opening a connection" is the dataplane's part of
//! it: register in the tracker, then the first authorization check under the state's read lock, then unregister.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::identity::Identity;
use dataplane::proxy::LocalRef;
use dataplane::rbac::{self, Connection};
use dataplane::Dataplane;
use serde_json::{json, Value};

const WORKLOADS: usize = 100;
const CONNECTIONS: usize = 10_000;
const POLICIES: usize = 1_000;

fn workload(i: usize, zone: &str) -> Value {
    json!({"uid": format!("w{i}"), "name": format!("w{i}"), "namespace": format!("ns-{}", i % 10),
           "serviceAccount": "server", "workloadIps": [format!("10.1.{}.{}", i / 250, i % 250)], "protocol": "HBONE",
           "locality": {"zone": zone}})
}

fn policy(i: usize, port: u32) -> Value {
    json!({"name": format!("p-{i}"), "namespace": format!("ns-{}", i % 10), "scope": "Namespace", "action": "Allow",
           "rules": [[[{"principals": [{"prefix": format!("cluster.local/ns/client-{i}/")}], "destinationPorts": [port]}]],
                     [[{"namespaces": [{"exact": "clients"}]}]]]})
}

fn conn(i: usize) -> Connection {
    let w = i % WORKLOADS;
    Connection::new(
        Some(Identity::new("cluster.local", "clients", "sleep")),
        format!("10.2.{}.{}", (i / 250) % 250, i % 250).parse().unwrap(),
        format!("10.1.{}.{}", w / 250, w % 250).parse().unwrap(),
        8080,
    )
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((p / 100.0) * (v.len() - 1) as f64).round() as usize]
}

fn settle(dp: &Dataplane) -> Duration {
    let t = Instant::now();
    loop {
        let (submitted, judged) = dp.reevaluation_progress();
        if judged == submitted {
            return t.elapsed();
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// p50/p99 (µs) of opening a connection (register + first check + unregister) on another thread while `during` runs.
fn open_latency(dp: &Arc<Dataplane>, during: impl FnOnce()) -> (f64, f64, usize) {
    let stop = Arc::new(AtomicBool::new(false));
    let (dp2, stop2) = (dp.clone(), stop.clone());
    let opener = std::thread::spawn(move || {
        let pi = dp2.inputs();
        let mut samples = Vec::new();
        let mut i = 0;
        while !stop2.load(Ordering::Relaxed) {
            let c = conn(i);
            let local = LocalRef::Uid(Arc::from(format!("w{}", i % WORKLOADS)));
            let t = Instant::now();
            let guard = pi.tracker.register(local.clone(), c.clone(), "HBONE");
            let allowed = {
                let st = pi.state.read();
                let w = local.resolve(&st).unwrap();
                rbac::authorize(&st, &w, &c).allowed
            };
            drop(guard);
            samples.push(t.elapsed().as_secs_f64() * 1e6);
            assert!(allowed);
            i += 1;
            std::thread::sleep(Duration::from_micros(100));
        }
        samples
    });
    std::thread::sleep(Duration::from_millis(50));
    during();
    stop.store(true, Ordering::Relaxed);
    let mut samples = opener.join().unwrap();
    let n = samples.len();
    (pct(&mut samples, 50.0), pct(&mut samples, 99.0), n)
}

fn main() {
    let dp = Arc::new(Dataplane::from_json(r#"{"workerThreads":2}"#).unwrap());
    let workloads: Vec<_> = (0..WORKLOADS).map(|i| workload(i, "a")).collect();
    let policies: Vec<_> = (0..POLICIES).map(|i| policy(i, 8080)).collect();
    dp.apply_state_json(&json!({"full": true, "workloads": workloads, "policies": policies}).to_string()).unwrap();
    settle(&dp);
    let pi = dp.inputs().clone();
    let guards: Vec<_> = (0..CONNECTIONS)
        .map(|i| pi.tracker.register(LocalRef::Uid(Arc::from(format!("w{}", i % WORKLOADS))), conn(i), "HBONE"))
        .collect();

    // 1. apply_state of a workload-only delta (one workload's locality) with 10,000 live connections.
    let mut workload_only = Vec::new();
    for n in 0..2_000 {
        let delta = json!({"workloads": [workload(n % WORKLOADS, if n % 2 == 0 { "b" } else { "a" })]}).to_string();
        let t = Instant::now();
        dp.apply_state_json(&delta).unwrap();
        workload_only.push(t.elapsed().as_secs_f64() * 1e6);
    }

    // 2. A policy change in every namespace: apply_state's own time, and the pass that re-judges all 10,000.
    let mut policy_apply = Vec::new();
    let mut pass = Vec::new();
    for n in 0..20 {
        let changed: Vec<_> = (0..10).map(|i| policy(i, 8080 + (n % 2) as u32)).collect();
        let delta = json!({"policies": changed}).to_string();
        let t = Instant::now();
        dp.apply_state_json(&delta).unwrap();
        policy_apply.push(t.elapsed().as_secs_f64() * 1e6);
        pass.push(settle(&dp).as_secs_f64() * 1e3);
    }

    // 3. Opening connections while nothing happens, then while policy changes re-judge all 10,000 back to back.
    let (idle_p50, idle_p99, idle_n) = open_latency(&dp, || std::thread::sleep(Duration::from_millis(1_000)));
    let (busy_p50, busy_p99, busy_n) = open_latency(&dp, || {
        let until = Instant::now() + Duration::from_millis(1_000);
        let mut n = 0;
        while Instant::now() < until {
            let changed: Vec<_> = (0..10).map(|i| policy(i, 8080 + (n % 2) as u32)).collect();
            dp.apply_state_json(&json!({"policies": changed}).to_string()).unwrap();
            settle(&dp);
            n += 1;
        }
    });
    assert!(guards.iter().all(|g| !g.close.is_cancelled()), "an allowed connection was closed");

    println!(
        "{}",
        json!({
            "connections": CONNECTIONS, "workloads": WORKLOADS, "policies": POLICIES,
            "applyWorkloadOnlyUs": {"p50": pct(&mut workload_only, 50.0), "p99": pct(&mut workload_only, 99.0)},
            "applyPolicyChangeUs": {"p50": pct(&mut policy_apply, 50.0), "p99": pct(&mut policy_apply, 99.0)},
            "passAllMs": {"p50": pct(&mut pass, 50.0), "max": pct(&mut pass, 100.0)},
            "openUs": {
                "idle": {"p50": idle_p50, "p99": idle_p99, "samples": idle_n},
                "duringPasses": {"p50": busy_p50, "p99": busy_p99, "samples": busy_n},
            },
        })
    );
}
