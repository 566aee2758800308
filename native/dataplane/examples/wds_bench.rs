//! Times a first WDS push: `cargo run --release --example wds_bench -- [WORKLOADS] [ROUNDS]` (default 100000, 5).
//! Each round packs WORKLOADS Address resources as istiod sends them (a pod each: an address, a service with two
//! ports, a locality, a policy key), then times `wds::judge` (decode and validate, resource by resource: the part
//! off the lock) and `Dataplane::apply_addresses` (the same, then the state's apply) into a fresh dataplane. Prints
//! the median of each. Measures; asserts only that every resource was accepted.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use dataplane::state::wds::{
    judge, Address, AddressType, Any, PortList, Resource, WireLocality, WirePort, WireWorkload, ADDRESS_TYPE_URL,
};
use prost::Message;

fn resource(i: u32) -> Vec<u8> {
    let ns = format!("ns{}", i % 50);
    let w = WireWorkload {
        uid: format!("Kubernetes//Pod/{ns}/w{i}"),
        name: format!("w{i}"),
        namespace: ns.clone(),
        addresses: vec![vec![10, (i >> 16) as u8, (i >> 8) as u8, i as u8]],
        tunnel_protocol: 1,
        trust_domain: "cluster.local".into(),
        service_account: format!("sa{}", i % 200),
        node: format!("node{}", i % 100),
        canonical_name: format!("app{}", i % 1000),
        canonical_revision: "v1".into(),
        workload_name: format!("app{}", i % 1000),
        cluster_id: "Kubernetes".into(),
        authorization_policies: vec![format!("{ns}/p{}", i % 100)],
        services: HashMap::from([(
            format!("{ns}/svc{}.{ns}.svc.cluster.local", i % 1000),
            PortList {
                ports: vec![
                    WirePort { service_port: 80, target_port: 8080 },
                    WirePort { service_port: 443, target_port: 8443 },
                ],
            },
        )]),
        locality: Some(WireLocality { region: "r1".into(), zone: format!("z{}", i % 3), subzone: String::new() }),
        ..Default::default()
    };
    let body = Address { r#type: Some(AddressType::Workload(w)) };
    let r = Resource {
        name: format!("Kubernetes//Pod/w{i}"),
        version: "v1".into(),
        resource: Some(Any { type_url: ADDRESS_TYPE_URL.into(), value: body.encode_to_vec() }),
    };
    r.encode_to_vec()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u32 = args.next().map_or(100_000, |a| a.parse().expect("WORKLOADS"));
    let rounds: usize = args.next().map_or(5, |a| a.parse().expect("ROUNDS"));
    let mut packed = Vec::new();
    for i in 0..n {
        let r = resource(i);
        packed.extend_from_slice(&(r.len() as u32).to_le_bytes());
        packed.extend_from_slice(&r);
    }
    let (mut judged, mut applied) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let j = judge(&packed).expect("readable");
        judged.push(t.elapsed());
        assert!(j.rejected.is_empty(), "{:?}", j.rejected.first());
        drop(j);
        let dp = dataplane::Dataplane::from_json(r#"{"nodeName":"bench"}"#).expect("a dataplane");
        let t = Instant::now();
        dp.apply_addresses(&packed, Vec::new()).expect("applied");
        applied.push(t.elapsed());
    }
    println!(
        "{n} workloads ({} KiB packed): judge {:?}, apply_addresses {:?} (median of {rounds})",
        packed.len() / 1024,
        median(judged),
        median(applied)
    );
}
