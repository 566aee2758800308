//! Continuous authorization through `Dataplane::apply_state`: live connections (registered in the tracker as the
//! inbound proxies register them) judged again by the re-evaluation task, in istiod's real push order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::identity::Identity;
use dataplane::proxy::tracker::TrackGuard;
use dataplane::proxy::LocalRef;
use dataplane::rbac::Connection;
use dataplane::Dataplane;
use serde_json::{json, Value};

const ECHO_IP: &str = "10.0.0.10";

fn dataplane(grace_ms: u64) -> Dataplane {
    Dataplane::from_json(&json!({ "missingPolicyGraceMs": grace_ms }).to_string()).unwrap()
}

fn echo(policies: &[&str]) -> Value {
    json!({"uid": "echo", "name": "echo", "namespace": "ns", "serviceAccount": "echo", "workloadIps": [ECHO_IP],
           "protocol": "HBONE", "authorizationPolicies": policies})
}

fn apply(dp: &Dataplane, delta: Value) {
    dp.apply_state_json(&delta.to_string()).unwrap();
}

/// Apply a delta and wait for the re-evaluation pass that judged it.
fn apply_and_settle(dp: &Dataplane, delta: Value) {
    apply(dp, delta);
    assert!(
        wait_until(Duration::from_secs(5), || {
            let (submitted, judged) = dp.reevaluation_progress();
            judged == submitted
        }),
        "no re-evaluation pass"
    );
}

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

/// Waits for the first pass a grace period running out wakes (and its judging done): the event, not its time.
fn wait_for_grace_pass(dp: &Dataplane) {
    assert!(
        wait_until(Duration::from_secs(5), || dp.reevaluation_grace_passes() >= 1),
        "no pass when the grace ran out"
    );
}

/// A live inbound connection to echo:8080, as the HBONE server registers it (mTLS from `sa`, or plaintext).
fn live(dp: &Dataplane, sa: Option<&str>) -> TrackGuard {
    let conn = Connection::new(
        sa.map(|sa| Identity::new("cluster.local", "ns", sa)),
        "10.0.0.20".parse().unwrap(),
        ECHO_IP.parse().unwrap(),
        8080,
    );
    dp.inputs().tracker.register(LocalRef::Uid(Arc::from("echo")), conn, "HBONE")
}

fn allow_sleep() -> Value {
    json!({"name": "allow-sleep", "namespace": "ns", "scope": "WorkloadSelector", "action": "Allow",
           "rules": [[[{"principals": [{"exact": "cluster.local/ns/ns/sa/sleep"}]}]]]})
}

#[test]
fn istiod_order_reference_then_policy_keeps_the_allowed_connection() {
    let dp = dataplane(1_000);
    apply(&dp, json!({"full": true, "workloads": [echo(&[])]}));
    let sleep = live(&dp, Some("sleep"));
    let other = live(&dp, Some("other"));
    // istiod: the Address response naming the policy first...
    apply_and_settle(&dp, json!({"workloads": [echo(&["ns/allow-sleep"])]}));
    assert!(!sleep.close.is_cancelled(), "the allowed connection was cut before its policy arrived");
    assert!(!other.close.is_cancelled(), "live connections are not judged on a policy that has not arrived");
    // ...then the Authorization response with it.
    apply_and_settle(&dp, json!({"policies": [allow_sleep()]}));
    assert!(other.close.is_cancelled(), "the connection the policy does not allow is closed once it arrives");
    assert!(!sleep.close.is_cancelled(), "the connection the policy allows survives");
    // The grace running out later changes nothing: the policy is known (waited for as the pass it wakes, not as time).
    assert_eq!(dp.reevaluation_grace_passes(), 0, "the grace has not run out yet");
    wait_for_grace_pass(&dp);
    assert!(!sleep.close.is_cancelled());
    assert_eq!(dp.inputs().metrics.authz_closed_by_policy.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn strict_converted_policy_keeps_mtls_and_closes_plaintext() {
    let dp = dataplane(1_000);
    apply(&dp, json!({"full": true, "workloads": [echo(&[])]}));
    let mtls = live(&dp, Some("sleep"));
    let plaintext = live(&dp, None);
    apply_and_settle(&dp, json!({"workloads": [echo(&["ns/istio_converted_static_strict"])]}));
    let strict = json!({"name": "istio_converted_static_strict", "namespace": "ns", "scope": "WorkloadSelector",
                        "action": "Deny", "rules": [[[{"notPrincipals": [{"presence": true}]}]]]});
    apply_and_settle(&dp, json!({"policies": [strict]}));
    assert!(!mtls.close.is_cancelled(), "STRICT must not cut a live mTLS connection");
    assert!(plaintext.close.is_cancelled(), "STRICT closes the live plaintext connection");
}

#[test]
fn a_policy_that_never_arrives_closes_after_the_grace_period() {
    let dp = dataplane(1_000);
    apply(&dp, json!({"full": true, "workloads": [echo(&[])]}));
    let conn = live(&dp, Some("sleep"));
    let started = Instant::now();
    apply_and_settle(&dp, json!({"workloads": [echo(&["ns/never-sent"])]}));
    assert!(!conn.close.is_cancelled(), "judged before the grace period passed");
    assert!(wait_until(Duration::from_secs(4), || conn.close.is_cancelled()), "never closed");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900), "closed after {took:?}, before the 1 s grace");
    let events = dp.drain_events_json();
    assert!(events.contains("ns/never-sent") && events.contains("did not arrive"), "{events}");
    assert!(events.contains("connection closed due to policy change"), "{events}");
}

#[test]
fn a_known_deny_closes_at_once_even_while_another_policy_is_missing() {
    let dp = dataplane(60_000);
    apply(&dp, json!({"full": true, "workloads": [echo(&[])]}));
    let sleep = live(&dp, Some("sleep"));
    let other = live(&dp, Some("other"));
    let deny_other = json!({"name": "deny-other", "namespace": "ns", "scope": "WorkloadSelector", "action": "Deny",
                            "rules": [[[{"principals": [{"exact": "cluster.local/ns/ns/sa/other"}]}]]]});
    apply_and_settle(&dp, json!({"workloads": [echo(&["ns/deny-other", "ns/pending"])], "policies": [deny_other]}));
    assert!(other.close.is_cancelled(), "a matching DENY decides whatever else arrives");
    assert!(!sleep.close.is_cancelled(), "deferred on the missing policy");
}

#[test]
fn a_removed_policy_still_named_gets_the_grace_too() {
    // Deleting a policy: istiod may send the Authorization removal before the workload's new reference list.
    let dp = dataplane(1_000);
    apply(&dp, json!({"full": true, "workloads": [echo(&["ns/allow-sleep"])], "policies": [allow_sleep()]}));
    let sleep = live(&dp, Some("sleep"));
    apply_and_settle(&dp, json!({"removedPolicies": ["ns/allow-sleep"]}));
    assert!(!sleep.close.is_cancelled());
    apply_and_settle(&dp, json!({"workloads": [echo(&[])]}));
    // The deferred connection's grace runs out (the pass it wakes, not a fixed wait); judged then, nothing denies it.
    wait_for_grace_pass(&dp);
    assert!(!sleep.close.is_cancelled(), "no policy left: allowed");
}

#[test]
fn workload_only_changes_do_not_wake_the_task() {
    let dp = dataplane(1_000);
    let other = json!({"uid": "w2", "name": "w2", "namespace": "ns2", "workloadIps": ["10.0.0.99"]});
    apply_and_settle(&dp, json!({"full": true, "workloads": [echo(&[]), other.clone()]}));
    let guards: Vec<_> = (0..10_000).map(|_| live(&dp, Some("sleep"))).collect();
    let before = dp.reevaluation_progress();
    // echo's locality and another workload's address change: neither can change a decision.
    let mut moved = echo(&[]);
    moved["locality"] = json!({"region": "r1", "zone": "z1"});
    let mut readdressed = other;
    readdressed["workloadIps"] = json!(["10.0.0.98"]);
    apply(&dp, json!({"workloads": [moved, readdressed]}));
    assert_eq!(dp.reevaluation_progress(), before, "a workload-only change was sent for re-evaluation");
    assert!(guards.iter().all(|g| !g.close.is_cancelled()));
}
