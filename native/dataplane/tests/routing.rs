//! The outbound routing decision (`build_request`), case by case, as Istio's ztunnel decides it: waypoints
//! (service, workload, by address and by hostname), the waypoint's own traffic, load balancing modes and routing
//! preferences, health policy, shared IPs, CIDR VIPs, visibility, IP families, and our own ports after the port
//! mapping. Each test is named after the rule it checks.

use std::net::{IpAddr, SocketAddr};

use dataplane::config::Config;
use dataplane::identity::Identity;
use dataplane::proxy::outbound::{build_request, Path, Request, RouteError};
use dataplane::state::{Protocol, State, StateDelta};
use serde_json::{json, Value};

const SRC_IP: &str = "10.0.0.1";

fn cfg() -> Config {
    Config { node_name: "node-a".into(), ..Config::default() }
}

fn workload(uid: &str, ns: &str, sa: &str, ip: &str, extra: Value) -> Value {
    let mut w = json!({"uid": uid, "name": uid, "namespace": ns, "serviceAccount": sa, "workloadIps": [ip],
                       "protocol": "HBONE", "node": "node-b", "clusterId": "c1",
                       "locality": {"region": "r1", "zone": "z1", "subzone": "s1"}});
    w.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    w
}

fn service(name: &str, ns: &str, vip: &str, ports: Value, extra: Value) -> Value {
    let mut s = json!({"name": name, "namespace": ns, "hostname": format!("{name}.{ns}.svc.cluster.local"),
                       "vips": [format!("/{vip}")], "ports": ports});
    s.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    s
}

fn svc_key(name: &str, ns: &str) -> String {
    format!("{ns}/{name}.{ns}.svc.cluster.local")
}

/// The client: `sleep` on node-a, in r1/z1/s1.
fn sleep() -> Value {
    workload("sleep", "default", "sleep", SRC_IP, json!({"node": "node-a"}))
}

/// A waypoint deployment as istiod describes it: its pod (first workload), and a service on 15008.
fn waypoint_world() -> (Vec<Value>, Value) {
    let pod = workload(
        "waypoint-pod",
        "default",
        "waypoint",
        "10.0.5.1",
        json!({"services": {svc_key("waypoint", "default"): {"15008": 15008}}}),
    );
    (vec![pod], service("waypoint", "default", "10.96.5.1", json!({"15008": 15008}), json!({})))
}

/// `db` (10.0.2.1) with a workload waypoint at `waypoint`, plus `extra` fields.
fn db(waypoint: &str, extra: Value) -> Value {
    let mut fields = json!({"waypoint": {"destination": waypoint, "hboneMtlsPort": 15008}});
    fields.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    workload("db", "default", "db", "10.0.2.1", fields)
}

fn state(workloads: Vec<Value>, services: Vec<Value>) -> State {
    let mut st = State::default();
    let delta = json!({"workloads": workloads, "services": services});
    st.apply(serde_json::from_value::<StateDelta>(delta).unwrap()).unwrap();
    st
}

fn route(st: &State, src: &str, src_ip: &str, dst: &str, pick: u64) -> Result<Request, RouteError> {
    let src = st.workload(src).unwrap().clone();
    build_request(st, &cfg(), &src, src_ip.parse().unwrap(), dst.parse().unwrap(), &mut |_| pick)
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn ids(r: &Request) -> Vec<String> {
    let mut v: Vec<String> = r.expected.0.iter().map(Identity::to_string).collect();
    v.sort();
    v
}

#[test]
fn service_with_a_waypoint_by_hostname_goes_to_the_waypoint_with_the_original_destination_as_authority() {
    let (mut w, wp_svc) = waypoint_world();
    w.push(sleep());
    w.push(workload(
        "reviews-1",
        "default",
        "reviews",
        "10.0.1.1",
        json!({"services": {svc_key("reviews", "default"): {"9080": 9080}}}),
    ));
    let gw = json!({"waypoint": {"destination": "default/waypoint.default.svc.cluster.local", "hboneMtlsPort": 15008}});
    let st = state(w, vec![service("reviews", "default", "10.96.1.1", json!({"9080": 9080}), gw), wp_svc]);
    let r = route(&st, "sleep", SRC_IP, "10.96.1.1:9080", 0).unwrap();
    assert_eq!(r.path, Path::Waypoint);
    assert_eq!(r.protocol, Protocol::Hbone);
    assert_eq!(r.upstream, addr("10.0.5.1:15008"));
    assert_eq!(r.target, addr("10.96.1.1:9080"), ":authority is the VIP the client dialed, untranslated");
    assert_eq!(r.destination.as_ref().unwrap().uid, "waypoint-pod");
    assert_eq!(r.service.as_ref().unwrap().name, "reviews", "the intended service, not the waypoint's");
    assert_eq!(ids(&r), vec!["spiffe://cluster.local/ns/default/sa/waypoint"]);
}

#[test]
fn service_with_a_waypoint_by_address_resolves_the_waypoint_service_vip() {
    let (mut w, wp_svc) = waypoint_world();
    w.push(sleep());
    let gw = json!({"waypoint": {"destination": "/10.96.5.1", "hboneMtlsPort": 15008}});
    let st = state(w, vec![service("ratings", "default", "10.96.1.2", json!({"9080": 9080}), gw), wp_svc]);
    let r = route(&st, "sleep", SRC_IP, "10.96.1.2:9080", 0).unwrap();
    assert_eq!((r.path, r.upstream, r.target), (Path::Waypoint, addr("10.0.5.1:15008"), addr("10.96.1.2:9080")));
}

#[test]
fn workload_with_a_waypoint_by_workload_ip_goes_to_the_waypoint() {
    let (mut w, wp_svc) = waypoint_world();
    w.push(sleep());
    w.push(db("/10.0.5.1", json!({})));
    let st = state(w, vec![wp_svc]);
    let r = route(&st, "sleep", SRC_IP, "10.0.2.1:5432", 0).unwrap();
    assert_eq!((r.path, r.upstream, r.target), (Path::Waypoint, addr("10.0.5.1:15008"), addr("10.0.2.1:5432")));
    assert!(r.service.is_none());
    assert_eq!(ids(&r), vec!["spiffe://cluster.local/ns/default/sa/waypoint"]);
}

#[test]
fn the_waypoint_itself_reaches_its_workload_directly() {
    let (mut w, wp_svc) = waypoint_world();
    w.push(db("default/waypoint.default.svc.cluster.local", json!({})));
    let st = state(w, vec![wp_svc]);
    let r = route(&st, "waypoint-pod", "10.0.5.1", "10.0.2.1:5432", 0).unwrap();
    assert_eq!((r.path, r.upstream, r.target), (Path::Direct, addr("10.0.2.1:15008"), addr("10.0.2.1:5432")));
    // The same identity from another IP is not the waypoint: it goes through the waypoint.
    let r = route(&st, "waypoint-pod", "10.0.5.99", "10.0.2.1:5432", 0).unwrap();
    assert_eq!(r.path, Path::Waypoint);
}

#[test]
fn a_service_addressed_workload_with_a_workload_waypoint_goes_direct() {
    // ztunnel: a workload waypoint applies to traffic addressed to the workload, not to its service.
    let (mut w, wp_svc) = waypoint_world();
    w.push(sleep());
    w.push(db("/10.0.5.1", json!({"services": {svc_key("db", "default"): {"5432": 5432}}})));
    let st = state(w, vec![service("db", "default", "10.96.2.1", json!({"5432": 5432}), json!({})), wp_svc]);
    let r = route(&st, "sleep", SRC_IP, "10.96.2.1:5432", 0).unwrap();
    assert_eq!((r.path, r.upstream), (Path::Direct, addr("10.0.2.1:15008")));
}

#[test]
fn a_waypoint_that_cannot_be_found_fails_closed() {
    let st = state(
        vec![
            sleep(),
            workload(
                "r",
                "default",
                "r",
                "10.0.1.1",
                json!({"services": {svc_key("reviews", "default"): {"9080": 9080}}}),
            ),
        ],
        vec![service(
            "reviews",
            "default",
            "10.96.1.1",
            json!({"9080": 9080}),
            json!({"waypoint": {"destination": "default/missing.default.svc.cluster.local", "hboneMtlsPort": 15008}}),
        )],
    );
    let err = route(&st, "sleep", SRC_IP, "10.96.1.1:9080", 0).unwrap_err();
    assert_eq!(err, RouteError::UnknownWaypoint("default/missing.default.svc.cluster.local".into()));
    assert_eq!(err.reason(), "unknown_waypoint");
}

fn lb_world(lb: Value, endpoints: &[(&str, &str, Value)]) -> State {
    let mut w = vec![sleep()];
    for (uid, ip, extra) in endpoints {
        let mut extra = extra.clone();
        extra["services"] = json!({svc_key("lb", "default"): {"80": 8080}});
        w.push(workload(uid, "default", "lb", ip, extra));
    }
    state(w, vec![service("lb", "default", "10.96.3.1", json!({"80": 8080}), json!({"loadBalancer": lb}))])
}

/// Every endpoint a pick in 0..n can choose.
fn chosen(st: &State, n: u64) -> Vec<String> {
    let mut v: Vec<String> = (0..n)
        .filter_map(|p| route(st, "sleep", SRC_IP, "10.96.3.1:80", p).ok())
        .map(|r| r.destination.unwrap().uid.to_string())
        .collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn failover_network_region_zone_prefers_the_same_zone() {
    // trafficDistribution: PreferClose.
    let lb = json!({"routingPreferences": ["Network", "Region", "Zone"], "mode": "Failover"});
    let eps = [
        ("same-zone", "10.0.3.1", json!({})),
        ("other-zone", "10.0.3.2", json!({"locality": {"region": "r1", "zone": "z2"}})),
        ("other-region", "10.0.3.3", json!({"locality": {"region": "r2", "zone": "z1"}})),
    ];
    assert_eq!(chosen(&lb_world(lb.clone(), &eps), 20), vec!["same-zone"]);
    // The same zone unhealthy: the next best rank (same region).
    let mut sick = eps.clone();
    sick[0].2 = json!({"status": "Unhealthy"});
    assert_eq!(chosen(&lb_world(lb, &sick), 20), vec!["other-zone"]);
}

/// NETWORK ranks as every scope does in ztunnel (`load_balance` in its src/state.rs, read at 0eff13c): Failover
/// prefers the client's network and falls back to an endpoint behind another network's gateway; Strict keeps only the
/// client's network and fails without one.
#[test]
fn network_is_preferred_under_failover_and_required_under_strict_as_in_ztunnel() {
    let world = |mode: &str, here_status: &str| {
        let lb = json!({"routingPreferences": ["Network"], "mode": mode});
        let member = json!({svc_key("lb", "default"): {"80": 8080}});
        let w = vec![
            sleep(),
            workload("here", "default", "lb", "10.0.3.1", json!({"services": member, "status": here_status})),
            workload(
                "far",
                "default",
                "lb",
                "10.9.3.1",
                json!({"services": member, "network": "west",
                       "networkGateway": {"destination": "west/192.0.2.1", "hboneMtlsPort": 15008}}),
            ),
            workload("eastwest", "istio-system", "istio-eastwestgateway", "192.0.2.1", json!({"network": "west"})),
        ];
        let vips = json!({"loadBalancer": lb, "vips": ["/10.96.3.1", "west/10.96.3.1"]});
        state(w, vec![service("lb", "default", "10.96.3.1", json!({"80": 8080}), vips)])
    };
    assert_eq!(chosen(&world("Failover", "Healthy"), 20), vec!["here"]);
    assert_eq!(chosen(&world("Failover", "Unhealthy"), 20), vec!["eastwest"], "through the other network's gateway");
    assert_eq!(chosen(&world("Strict", "Healthy"), 20), vec!["here"]);
    let strict = world("Strict", "Unhealthy");
    assert_eq!(
        route(&strict, "sleep", SRC_IP, "10.96.3.1:80", 0).unwrap_err(),
        RouteError::NoHealthyUpstream(svc_key("lb", "default"), 80)
    );
}

#[test]
fn strict_node_keeps_only_endpoints_on_the_clients_node_and_fails_without_one() {
    // internalTrafficPolicy: Local.
    let lb = json!({"routingPreferences": ["Node"], "mode": "Strict"});
    let eps = [("here", "10.0.3.1", json!({"node": "node-a"})), ("there", "10.0.3.2", json!({}))];
    assert_eq!(chosen(&lb_world(lb.clone(), &eps), 20), vec!["here"]);
    let st = lb_world(lb, &eps[1..]);
    assert_eq!(
        route(&st, "sleep", SRC_IP, "10.96.3.1:80", 0).unwrap_err(),
        RouteError::NoHealthyUpstream(svc_key("lb", "default"), 80)
    );
}

#[test]
fn standard_mode_uses_every_healthy_endpoint_weighted_by_capacity() {
    let st = lb_world(
        json!({"mode": "Standard"}),
        &[
            ("a", "10.0.3.1", json!({"capacity": 1})),
            ("b", "10.0.3.2", json!({"capacity": 3, "locality": {"region": "r9"}})),
            ("zero", "10.0.3.3", json!({"capacity": 0})),
        ],
    );
    let picks: Vec<String> = (0..4)
        .map(|p| route(&st, "sleep", SRC_IP, "10.96.3.1:80", p).unwrap().destination.unwrap().uid.to_string())
        .collect();
    assert_eq!(picks, vec!["a", "b", "b", "b"], "capacity is the weight; capacity 0 is never picked");
}

#[test]
fn allow_all_health_policy_admits_unhealthy_endpoints() {
    let eps = [("sick", "10.0.3.1", json!({"status": "Unhealthy"}))];
    let st = lb_world(json!({"healthPolicy": "OnlyHealthy"}), &eps);
    assert!(matches!(route(&st, "sleep", SRC_IP, "10.96.3.1:80", 0), Err(RouteError::NoHealthyUpstream(..))));
    let st = lb_world(json!({"healthPolicy": "AllowAll"}), &eps);
    assert_eq!(route(&st, "sleep", SRC_IP, "10.96.3.1:80", 0).unwrap().destination.unwrap().uid, "sick");
}

#[test]
fn passthrough_mode_sends_to_the_original_destination() {
    let st = lb_world(json!({"mode": "Passthrough"}), &[("a", "10.0.3.1", json!({}))]);
    let r = route(&st, "sleep", SRC_IP, "10.96.3.1:80", 0).unwrap();
    assert_eq!((r.path, r.protocol, r.upstream), (Path::Passthrough, Protocol::Tcp, addr("10.96.3.1:80")));
}

#[test]
fn a_shared_ip_prefers_the_hbone_pod_and_survives_the_removal_of_either() {
    let pod = workload("c1//v1/Pod/default/a", "default", "a", "10.0.7.1", json!({}));
    let entry = workload(
        "c1/networking.istio.io/WorkloadEntry/default/b",
        "default",
        "b",
        "10.0.7.1",
        json!({"protocol": "TCP"}),
    );
    let mut st = state(vec![sleep(), entry.clone(), pod.clone()], vec![]);
    let who = |st: &State| st.workload_by_addr("", "10.0.7.1".parse().unwrap()).map(|w| w.uid.clone());
    assert_eq!(who(&st).as_deref(), Some("c1//v1/Pod/default/a"));
    st.apply(serde_json::from_value(json!({"removedWorkloads": ["c1//v1/Pod/default/a"]})).unwrap()).unwrap();
    assert_eq!(
        who(&st).as_deref(),
        Some("c1/networking.istio.io/WorkloadEntry/default/b"),
        "the other one stays reachable"
    );
    st.apply(serde_json::from_value(json!({"workloads": [pod]})).unwrap()).unwrap();
    st.apply(
        serde_json::from_value(json!({"removedWorkloads": ["c1/networking.istio.io/WorkloadEntry/default/b"]}))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(who(&st).as_deref(), Some("c1//v1/Pod/default/a"));
    // Two equal candidates (HBONE pods): the one that arrived last wins, as ztunnel's max_by_key picks.
    let twin = workload("c1//v1/Pod/default/twin", "default", "twin", "10.0.7.1", json!({}));
    st.apply(serde_json::from_value(json!({"workloads": [twin]})).unwrap()).unwrap();
    assert_eq!(who(&st).as_deref(), Some("c1//v1/Pod/default/twin"));
    // An update re-inserts: it becomes the latest.
    let pod_v2 = workload("c1//v1/Pod/default/a", "default", "a", "10.0.7.1", json!({"canonicalRevision": "v2"}));
    st.apply(serde_json::from_value(json!({"workloads": [pod_v2]})).unwrap()).unwrap();
    assert_eq!(who(&st).as_deref(), Some("c1//v1/Pod/default/a"));
}

#[test]
fn host_network_workloads_are_not_indexed_by_ip() {
    let host = workload(
        "c1//v1/Pod/kube-system/agent",
        "kube-system",
        "agent",
        "10.0.0.50",
        json!({"networkMode": "HostNetwork"}),
    );
    let st = state(vec![sleep(), host], vec![]);
    let r = route(&st, "sleep", SRC_IP, "10.0.0.50:9100", 0).unwrap();
    assert_eq!(r.path, Path::Passthrough);
}

#[test]
fn cidr_vips_match_by_longest_prefix() {
    let mut wide = service("wide", "default", "10.96.9.1", json!({"80": 80}), json!({"cidrVips": ["/10.200.0.0/16"]}));
    wide["vips"] = json!([]);
    let mut narrow =
        service("narrow", "default", "10.96.9.2", json!({"80": 80}), json!({"cidrVips": ["/10.200.1.0/24"]}));
    narrow["vips"] = json!([]);
    let eps = vec![
        sleep(),
        workload("w", "default", "w", "10.0.9.1", json!({"services": {svc_key("wide", "default"): {"80": 80}}})),
        workload("n", "default", "n", "10.0.9.2", json!({"services": {svc_key("narrow", "default"): {"80": 80}}})),
    ];
    let st = state(eps, vec![wide, narrow]);
    assert_eq!(route(&st, "sleep", SRC_IP, "10.200.1.5:80", 0).unwrap().service.unwrap().name, "narrow");
    assert_eq!(route(&st, "sleep", SRC_IP, "10.200.2.5:80", 0).unwrap().service.unwrap().name, "wide");
    assert_eq!(route(&st, "sleep", SRC_IP, "10.201.0.1:80", 0).unwrap().path, Path::Passthrough);
}

#[test]
fn a_shared_vip_prefers_the_clients_namespace_then_canonical_and_hides_namespace_visibility() {
    let ep = |uid: &str, name: &str, ns: &str, ip: &str| {
        workload(uid, ns, uid, ip, json!({"services": {svc_key(name, ns): {"80": 80}}}))
    };
    let services = vec![
        service("first", "x", "10.96.4.1", json!({"80": 80}), json!({})),
        service("canon", "y", "10.96.4.1", json!({"80": 80}), json!({"canonical": true})),
        service("private", "z", "10.96.4.2", json!({"80": 80}), json!({"visibility": "Namespace"})),
        service("mine", "default", "10.96.4.3", json!({"80": 80}), json!({})),
        service("theirs", "q", "10.96.4.3", json!({"80": 80}), json!({"canonical": true})),
    ];
    let st = state(
        vec![
            sleep(),
            ep("e1", "first", "x", "10.0.4.1"),
            ep("e2", "canon", "y", "10.0.4.2"),
            ep("e3", "private", "z", "10.0.4.3"),
            ep("e4", "mine", "default", "10.0.4.4"),
            ep("e5", "theirs", "q", "10.0.4.5"),
        ],
        services,
    );
    assert_eq!(route(&st, "sleep", SRC_IP, "10.96.4.1:80", 0).unwrap().service.unwrap().name, "canon");
    assert_eq!(route(&st, "sleep", SRC_IP, "10.96.4.3:80", 0).unwrap().service.unwrap().name, "mine");
    assert_eq!(
        route(&st, "sleep", SRC_IP, "10.96.4.2:80", 0).unwrap().path,
        Path::Passthrough,
        "not visible from default"
    );
}

#[test]
fn the_own_port_check_runs_after_the_port_mapping() {
    let st = state(
        vec![
            sleep(),
            workload(
                "local-tcp",
                "default",
                "t",
                "10.0.6.1",
                json!({"protocol": "TCP", "node": "node-a",
            "services": {svc_key("sneaky", "default"): {"80": 15080}}}),
            ),
        ],
        vec![service("sneaky", "default", "10.96.6.1", json!({"80": 15080}), json!({}))],
    );
    assert_eq!(route(&st, "sleep", SRC_IP, "10.96.6.1:80", 0).unwrap_err(), RouteError::SelfCall(15080));
    // Before the mapping too: our ports on loopback and on the client's own IP.
    assert_eq!(route(&st, "sleep", SRC_IP, "127.0.0.1:15001", 0).unwrap_err(), RouteError::SelfCall(15001));
    assert_eq!(route(&st, "sleep", SRC_IP, "10.0.0.1:15006", 0).unwrap_err(), RouteError::SelfCall(15006));
}

#[test]
fn ip_families_of_the_service_choose_the_endpoint_address() {
    let mut dual = workload(
        "dual",
        "default",
        "d",
        "10.0.8.1",
        json!({"services": {svc_key("v6", "default"): {"80": 80}, svc_key("any", "default"): {"80": 80}}}),
    );
    dual["workloadIps"] = json!(["10.0.8.1", "fd00::8"]);
    let st = state(
        vec![sleep(), dual],
        vec![
            service("v6", "default", "10.96.8.1", json!({"80": 80}), json!({"ipFamilies": "IPv6"})),
            service("any", "default", "10.96.8.2", json!({"80": 80}), json!({})),
        ],
    );
    let ip = |dst: &str| route(&st, "sleep", SRC_IP, dst, 0).unwrap().target.ip();
    assert_eq!(ip("10.96.8.1:80"), "fd00::8".parse::<IpAddr>().unwrap());
    assert_eq!(ip("10.96.8.2:80"), "10.0.8.1".parse::<IpAddr>().unwrap(), "the client's family when allowed");
}

/// `far` (10.9.0.1) on network west behind the gateway west/192.0.2.1, an endpoint of service `far` (80 → `target`).
fn far(target: u16) -> Value {
    workload(
        "far",
        "default",
        "far",
        "10.9.0.1",
        json!({"network": "west",
        "networkGateway": {"destination": "west/192.0.2.1", "hboneMtlsPort": 15008},
        "services": {svc_key("far", "default"): {"80": target}}}),
    )
}

#[test]
fn a_hostname_only_endpoint_is_resolved_later_and_an_unknown_gateway_fails_closed() {
    let mut hostname_only = workload(
        "ext",
        "default",
        "ext",
        "10.0.0.0",
        json!({"hostname": "db.example.com",
        "services": {svc_key("ext", "default"): {"80": 80}}}),
    );
    hostname_only["workloadIps"] = json!([]);
    let remote = far(80);
    let st = state(
        vec![sleep(), hostname_only, remote],
        vec![
            service("ext", "default", "10.96.7.1", json!({"80": 80}), json!({})),
            service("far", "default", "10.96.7.2", json!({"80": 80}), json!({})),
        ],
    );
    // Known only by hostname: resolved through DNS when connecting (the request says which name).
    let r = route(&st, "sleep", SRC_IP, "10.96.7.1:80", 0).unwrap();
    assert_eq!((r.path, r.resolve.as_deref(), r.target.port()), (Path::Direct, Some("db.example.com"), 80));
    let e = route(&st, "sleep", SRC_IP, "10.96.7.2:80", 0).unwrap_err();
    assert_eq!(e.reason(), "unknown_gateway", "{e}");
}

#[test]
fn a_service_endpoint_on_another_network_is_reached_by_double_hbone_through_its_gateway() {
    let far = far(8080);
    let gateway =
        workload("eastwest", "istio-system", "istio-eastwestgateway", "192.0.2.1", json!({"network": "west"}));
    let st = state(
        vec![sleep(), far.clone(), gateway],
        vec![service(
            "far",
            "default",
            "10.96.7.2",
            json!({"80": 8080}),
            json!({"subjectAltNames": ["spiffe://cluster.local/ns/default/sa/far-san"]}),
        )],
    );
    let r = route(&st, "sleep", SRC_IP, "10.96.7.2:80", 0).unwrap();
    assert_eq!((r.path, r.protocol, r.upstream), (Path::DoubleHbone, Protocol::Hbone, addr("192.0.2.1:15008")));
    assert_eq!(r.authority.as_deref(), Some("far.default.svc.cluster.local:80"), "outer and inner :authority");
    assert_eq!(ids(&r), vec!["spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway"], "outer: the gateway");
    let inner = r.inner.as_ref().unwrap();
    let mut finals: Vec<String> = inner.expected.0.iter().map(Identity::to_string).collect();
    finals.sort();
    assert_eq!(
        finals,
        vec!["spiffe://cluster.local/ns/default/sa/far", "spiffe://cluster.local/ns/default/sa/far-san"]
    );
    assert_eq!(inner.network, "", "x-forwarded-network: the client's network");
    // Addressed by its IP rather than through the service: no valid route.
    let st = state(vec![sleep(), far], vec![]);
    assert_eq!(
        route(&st, "sleep", SRC_IP, "10.9.0.1:8080", 0).unwrap().path,
        Path::Passthrough,
        "not indexed on our network"
    );
}

#[test]
fn weighted_waypoints_share_by_weight_and_all_zero_falls_back_to_the_waypoint() {
    let wp = |uid: &str, sa: &str, ip: &str, svc: &str| {
        workload(uid, "default", sa, ip, json!({"services": {svc_key(svc, "default"): {"15008": 15008}}}))
    };
    let gw = |host: &str| json!({"destination": format!("default/{host}.default.svc.cluster.local"), "hboneMtlsPort": 15008});
    let services = |weights: (u32, u32)| {
        vec![
            service(
                "reviews",
                "default",
                "10.96.1.1",
                json!({"9080": 9080}),
                json!({
                    "waypoint": gw("wp-main"),
                    "weightedWaypoints": [{"waypoint": gw("wp-a"), "weight": weights.0}, {"waypoint": gw("wp-b"), "weight": weights.1}],
                }),
            ),
            service("wp-main", "default", "10.96.5.1", json!({"15008": 15008}), json!({})),
            service("wp-a", "default", "10.96.5.2", json!({"15008": 15008}), json!({})),
            service("wp-b", "default", "10.96.5.3", json!({"15008": 15008}), json!({})),
        ]
    };
    let workloads = || {
        vec![
            sleep(),
            wp("main-pod", "main", "10.0.5.1", "wp-main"),
            wp("a-pod", "a", "10.0.5.2", "wp-a"),
            wp("b-pod", "b", "10.0.5.3", "wp-b"),
        ]
    };
    let via = |st: &State, pick: u64| {
        route(st, "sleep", SRC_IP, "10.96.1.1:9080", pick).unwrap().destination.unwrap().uid.clone()
    };
    let st = state(workloads(), services((1, 3)));
    assert_eq!((0..4).map(|p| via(&st, p)).collect::<Vec<_>>(), vec!["a-pod", "b-pod", "b-pod", "b-pod"]);
    let st = state(workloads(), services((0, 0)));
    assert_eq!(via(&st, 0), "main-pod", "all weights zero: the single waypoint");
}

/// A cluster domain the DNS proxy cannot serve under is refused when the dataplane is made, naming the field.
#[test]
fn a_bad_cluster_domain_is_refused_by_name() {
    let mut c = Config::default();
    c.dns.cluster_domain = "bad..domain".into();
    let err = dataplane::Dataplane::new(c).err().expect("refused").to_string();
    assert!(err.starts_with("INVALID_CONFIG: dns.clusterDomain: "), "{err}");
}
