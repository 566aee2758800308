//! The outbound routing decision's cost: 10,000 workloads, 1,000 services of 10 endpoints, a VIP lookup with a
//! weighted endpoint pick, and a direct workload-IP lookup.
//! Run: cargo run --release -p ztunnel-dataplane --example route_bench

use std::time::Instant;

use dataplane::config::Config;
use dataplane::proxy::outbound::build_request;
use dataplane::state::{State, StateDelta};
use serde_json::json;

fn main() {
    let ip = |i: usize| format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    let workloads: Vec<_> = (0..10_000)
        .map(|i| {
            json!({"uid": format!("w{i}"), "name": format!("w{i}"), "namespace": format!("ns{}", i % 100),
                "serviceAccount": "sa", "workloadIps": [ip(i)], "protocol": "HBONE",
                "services": {format!("ns{}/svc{}.example", (i / 10) % 100, i / 10): {"80": 8080}}})
        })
        .collect();
    let services: Vec<_> = (0..1_000)
        .map(|s| {
            json!({"name": format!("svc{s}"), "namespace": format!("ns{}", s % 100), "hostname": format!("svc{s}.example"),
                "vips": [format!("/172.20.{}.{}", s >> 8, s & 255)], "ports": {"80": 8080}})
        })
        .collect();
    let mut st = State::default();
    st.apply(serde_json::from_value::<StateDelta>(json!({"workloads": workloads, "services": services})).unwrap())
        .unwrap();
    let cfg = Config::default();
    let src = st.workload("w0").unwrap().clone();
    let vip = "172.20.1.44:80".parse().unwrap();
    let direct = "10.0.10.1:8080".parse().unwrap();
    let mut n = 0u64;
    let mut pick = |total: u64| {
        n = n.wrapping_add(7);
        n % total
    };
    assert!(build_request(&st, &cfg, &src, src.ips[0], vip, &mut pick).is_ok());
    let measure = |dst, pick: &mut dyn FnMut(u64) -> u64| {
        let iters = 200_000;
        let t = Instant::now();
        for _ in 0..iters {
            std::hint::black_box(build_request(&st, &cfg, &src, src.ips[0], dst, pick).unwrap());
        }
        t.elapsed().as_nanos() as f64 / iters as f64
    };
    let vip_ns = measure(vip, &mut pick);
    let direct_ns = measure(direct, &mut pick);
    println!(
        "{}",
        json!({"workloads": 10_000, "services": 1_000, "vipDecisionNs": vip_ns.round(), "workloadDecisionNs": direct_ns.round()})
    );
}
