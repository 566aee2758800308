//! The policy impact preview through `Dataplane::preview_authz_json`, against what enforcement then does: live
//! connections (registered in the tracker as the inbound proxies register them) and recent denials (recorded as
//! they record them); the candidate is previewed, then applied, and re-evaluation must close exactly the
//! connections the preview named, while the attempts it named are now allowed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::identity::Identity;
use dataplane::proxy::tracker::TrackGuard;
use dataplane::proxy::LocalRef;
use dataplane::rbac::{self, Connection};
use dataplane::state::intern::Str;
use dataplane::Dataplane;
use serde_json::{json, Value};

const ECHO_IP: &str = "10.0.0.10";

fn conn(sa: &str, port: u16) -> Connection {
    Connection::new(
        Some(Identity::new("cluster.local", "ns", sa)),
        "10.0.0.20".parse().unwrap(),
        ECHO_IP.parse().unwrap(),
        port,
    )
}

fn live(dp: &Dataplane, sa: &str, port: u16) -> TrackGuard {
    dp.inputs().tracker.register(LocalRef::Uid(Arc::from("echo")), conn(sa, port), "HBONE")
}

fn deny(name: &str, sa: &str) -> Value {
    json!({"name": name, "namespace": "ns", "scope": "Namespace", "action": "Deny",
           "rules": [[[{"principals": [{"exact": format!("cluster.local/ns/ns/sa/{sa}")}]}]]]})
}

fn setup() -> Dataplane {
    let dp = Dataplane::from_json("{}").unwrap();
    let echo = json!({"uid": "echo", "name": "echo", "namespace": "ns", "serviceAccount": "echo",
                      "workloadIps": [ECHO_IP], "protocol": "HBONE"});
    dp.apply_state_json(&json!({"full": true, "workloads": [echo], "policies": [deny("deny", "blocked")]}).to_string())
        .unwrap();
    dp
}

fn preview(dp: &Dataplane, req: Value) -> Value {
    let out = dp.handle().block_on(dp.preview_authz_json(&req.to_string())).unwrap();
    serde_json::from_str(&out).unwrap()
}

fn settle(dp: &Dataplane) {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let (submitted, judged) = dp.reevaluation_progress();
        if submitted == judged {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("no re-evaluation pass");
}

#[test]
fn the_preview_names_what_applying_the_candidate_closes_and_allows() {
    let dp = setup();
    let sleep = live(&dp, "sleep", 8080);
    let other = [live(&dp, "other", 8080), live(&dp, "other", 8080), live(&dp, "other", 9090)];
    // Refused attempts, as the inbound proxies record them (the policy held denies "blocked").
    for _ in 0..3 {
        dp.inputs().denials.record(Str::from("echo"), conn("blocked", 8080), "HBONE");
    }
    let candidate = deny("deny", "other");
    let answer = preview(&dp, json!({"policies": [candidate]}));
    assert_eq!(answer["candidates"], json!(["ns/deny"]));
    assert_eq!(answer["connectionsJudged"], 4);
    assert_eq!(answer["denialsJudged"], 3);
    let close = answer["wouldClose"].as_array().unwrap();
    assert_eq!(close.len(), 2, "{answer}");
    assert_eq!((close[0]["dst"].as_str(), close[0]["count"].as_u64()), (Some("10.0.0.10:8080"), Some(2)));
    assert_eq!((close[1]["dst"].as_str(), close[1]["count"].as_u64()), (Some("10.0.0.10:9090"), Some(1)));
    assert_eq!(close[0]["srcIdentity"], "spiffe://cluster.local/ns/ns/sa/other");
    assert_eq!(close[0]["workload"], json!({"uid": "echo", "name": "echo", "namespace": "ns"}));
    assert_eq!(close[0]["now"]["allowed"], true);
    assert_eq!((&close[0]["candidate"]["policy"], &close[0]["candidate"]["rule"]), (&json!("ns/deny"), &json!(0)));
    assert_eq!(answer["wouldCloseConnections"], 3);
    let allow = answer["wouldAllow"].as_array().unwrap();
    assert_eq!(allow.len(), 1, "{answer}");
    assert_eq!(allow[0]["srcIdentity"], "spiffe://cluster.local/ns/ns/sa/blocked");
    assert_eq!((allow[0]["count"].as_u64(), allow[0]["now"]["policy"].as_str()), (Some(3), Some("ns/deny")));
    assert!(allow[0]["lastDeniedMs"].as_u64().unwrap() > 1_600_000_000_000);
    assert_eq!(answer["truncated"], false);

    let cut = preview(&dp, json!({"policies": [deny("deny", "other")], "limit": 1}));
    assert_eq!((cut["wouldClose"].as_array().unwrap().len(), &cut["wouldCloseConnections"]), (1, &json!(3)));
    assert_eq!(cut["truncated"], true);

    // Nothing was applied by previewing.
    settle(&dp);
    assert!(other.iter().all(|g| !g.close.is_cancelled()));

    // Now apply it: re-evaluation closes exactly those, and the attempts are allowed.
    dp.apply_state_json(&json!({"policies": [deny("deny", "other")]}).to_string()).unwrap();
    settle(&dp);
    assert!(other.iter().all(|g| g.close.is_cancelled()), "the previewed connections were closed");
    assert!(!sleep.close.is_cancelled(), "no other connection was closed");
    let st = dp.inputs().state.read();
    assert!(rbac::authorize(&st, st.workload("echo").unwrap(), &conn("blocked", 8080)).allowed);
}

#[test]
fn a_candidate_equal_to_the_held_policy_judges_nothing() {
    let dp = setup();
    let _sleep = live(&dp, "sleep", 8080);
    dp.inputs().denials.record(Str::from("echo"), conn("blocked", 8080), "HBONE");
    let answer = preview(&dp, json!({"policies": [deny("deny", "blocked")]}));
    assert_eq!((&answer["connectionsJudged"], &answer["denialsJudged"]), (&json!(0), &json!(0)));
    assert_eq!((&answer["wouldClose"], &answer["wouldAllow"]), (&json!([]), &json!([])));
}

#[test]
fn a_bad_request_says_what_is_wrong() {
    let dp = setup();
    let run = |req: Value| dp.handle().block_on(dp.preview_authz_json(&req.to_string())).unwrap_err().to_string();
    assert!(run(json!({"policies": [{"name": "p"}]})).starts_with("INVALID_SPEC:"));
    assert!(run(json!({"policies": [], "extra": 1})).contains("unknown field `extra`"));
    let bad_port = json!({"name": "p", "namespace": "ns", "scope": "Namespace", "action": "Deny",
                          "rules": [[[{"destinationPorts": [70000]}]]]});
    let e = run(json!({"policies": [bad_port]}));
    assert!(e.starts_with("INVALID_STATE:") && e.contains("ns/p") && e.contains("70000"), "{e}");
}
