//! Authorization decision latency at scale: 10,000 policies of 10 rules across 1,000 namespaces.
//! Run: cargo run --release -p ztunnel-dataplane --example rbac_bench
//! Prints one JSON line: p50/p99 of single decisions (ns) for an allowed and a denied connection.

use std::time::Instant;

use dataplane::identity::Identity;
use dataplane::rbac::{authorize, Connection};
use dataplane::state::{State, StateDelta};
use serde_json::json;

const NAMESPACES: usize = 1_000;
const POLICIES: usize = 10_000;
const RULES: usize = 10;
/// Issue #29's case: one ALLOW policy of 100k rules, one principal and port each; a connection no rule allows.
const BIG_RULES: usize = 100_000;

fn main() {
    let mut policies = Vec::with_capacity(POLICIES);
    for i in 0..POLICIES {
        let ns = format!("ns-{}", i % NAMESPACES);
        let rules: Vec<_> = (0..RULES)
            .map(|r| {
                json!([[{
                    "principals": [{"exact": format!("cluster.local/ns/client-{r}/sa/sa-{i}")}],
                    "sourceIps": [format!("10.{}.{}.0/24", r, i % 250)],
                    "destinationPorts": [8000 + r as u32],
                }], [{"notNamespaces": [{"prefix": "blocked-"}]}]])
            })
            .collect();
        let action = if i % 10 == 0 { "Deny" } else { "Allow" };
        policies.push(
            json!({"name": format!("p-{i}"), "namespace": ns, "scope": "Namespace", "action": action, "rules": rules}),
        );
    }
    let delta = json!({
        "full": true,
        "workloads": [{"uid": "dst", "name": "server", "namespace": "ns-17", "serviceAccount": "server",
                       "workloadIps": ["10.200.0.1"], "protocol": "HBONE"}],
        "policies": policies,
    });
    let mut st = State::default();
    let started = Instant::now();
    st.apply(serde_json::from_value::<StateDelta>(delta).unwrap()).unwrap();
    let load_ms = started.elapsed().as_secs_f64() * 1e3;
    let w = st.workload("dst").unwrap().clone();

    // Policy p-1017 (ns-17, ALLOW) rule 3 matches this connection.
    let allowed = Connection::new(
        Some(Identity::new("cluster.local", "client-3", "sa-1017")),
        "10.3.17.9".parse().unwrap(),
        "10.200.0.1".parse().unwrap(),
        8003,
    );
    let denied = Connection::new(
        Some(Identity::new("cluster.local", "nobody", "sa")),
        "192.0.2.1".parse().unwrap(),
        "10.200.0.1".parse().unwrap(),
        8003,
    );
    assert!(authorize(&st, &w, &allowed).allowed);
    assert!(!authorize(&st, &w, &denied).allowed);
    let measure = |c: &Connection| {
        let mut samples = Vec::with_capacity(200_000);
        for _ in 0..200_000 {
            let t = Instant::now();
            let d = authorize(&st, &w, c);
            std::hint::black_box(d);
            samples.push(t.elapsed().as_nanos() as u64);
        }
        samples.sort_unstable();
        (samples[samples.len() / 2], samples[samples.len() * 99 / 100])
    };
    let (a50, a99) = measure(&allowed);
    let (d50, d99) = measure(&denied);
    let (big50, big99) = one_big_policy();
    println!(
        "{}",
        json!({
            "policies": POLICIES, "rulesPerPolicy": RULES, "namespaces": NAMESPACES,
            "loadMs": load_ms,
            "allowedP50Ns": a50, "allowedP99Ns": a99, "deniedP50Ns": d50, "deniedP99Ns": d99,
            "bigPolicyRules": BIG_RULES, "bigPolicyDeniedP50Ns": big50, "bigPolicyDeniedP99Ns": big99,
        })
    );
}

/// Decision latency (p50, p99, ns) of a connection no rule of one 100k-rule ALLOW policy matches.
fn one_big_policy() -> (u64, u64) {
    let rules: Vec<_> = (0..BIG_RULES)
        .map(|r| {
            json!([[{"principals": [{"exact": format!("cluster.local/ns/client/sa/sa-{r}")}],
                          "destinationPorts": [8000 + (r % 100) as u32]}]])
        })
        .collect();
    let delta = json!({
        "full": true,
        "workloads": [{"uid": "dst", "name": "server", "namespace": "ns", "serviceAccount": "server",
                       "workloadIps": ["10.200.0.1"], "protocol": "HBONE"}],
        "policies": [{"name": "big", "namespace": "ns", "scope": "Namespace", "action": "Allow", "rules": rules}],
    });
    let mut st = State::default();
    st.apply(serde_json::from_value::<StateDelta>(delta).unwrap()).unwrap();
    let w = st.workload("dst").unwrap().clone();
    let c = Connection::new(
        Some(Identity::new("cluster.local", "client", "sa-none")),
        "10.3.17.9".parse().unwrap(),
        "10.200.0.1".parse().unwrap(),
        8003,
    );
    let mut samples = Vec::with_capacity(2_000);
    for _ in 0..2_000 {
        let t = Instant::now();
        let d = authorize(&st, &w, &c);
        assert!(!d.allowed);
        samples.push(t.elapsed().as_nanos() as u64);
    }
    samples.sort_unstable();
    (samples[samples.len() / 2], samples[samples.len() * 99 / 100])
}
