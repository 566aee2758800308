//! An outbound connection from a pod whose workload istiod has not pushed yet (proxy/outbound.rs `connect`,
//! `SOURCE_WAIT`). istio-cni hands a pod to the node proxy as it starts; its workload comes over WDS once the API
//! server has told istiod of it, and the pod's first connection can come first (seen in the real control plane of
//! test/e2e). ztunnel waits up to 5 s for the workload (`get_workload`); so does ztunnel-node, woken by the batch that
//! brings it, and refuses only after that.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dataplane::proxy::outbound::{self, SOURCE_WAIT};
use dataplane::proxy::LocalRef;
use dataplane::Dataplane;
use serde_json::json;

const POD: &str = "127.94.1.10";
const ECHO: &str = "127.94.2.10";

fn world() -> Dataplane {
    let cfg = json!({"nodeName": "node-a", "connectTimeoutMs": 2000});
    let dp = Dataplane::from_json(&cfg.to_string()).unwrap();
    let echo = json!({"uid": "echo", "name": "echo", "namespace": "default", "serviceAccount": "echo",
                      "workloadIps": [ECHO], "protocol": "TCP", "node": "node-b"});
    dp.apply_state_json(&json!({"workloads": [echo]}).to_string()).unwrap();
    dp
}

/// The pod as istio-cni names it (namespace, name, service account, node): not yet in the state.
fn pod() -> LocalRef {
    LocalRef::pod("default", "new-pod", "new-pod", "node-a")
}

fn its_workload() -> String {
    json!({"workloads": [{"uid": "Kubernetes//Pod/default/new-pod", "name": "new-pod", "namespace": "default",
                          "serviceAccount": "new-pod", "workloadIps": [POD], "protocol": "TCP", "node": "node-a"}]})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_from_a_pod_before_its_workload_waits_for_it_then_goes() {
    let listener = tokio::net::TcpListener::bind((ECHO, 8080)).await.unwrap();
    let dp = std::sync::Arc::new(world());
    let client: SocketAddr = format!("{POD}:40000").parse().unwrap();
    let dst: SocketAddr = format!("{ECHO}:8080").parse().unwrap();
    let started = Instant::now();
    let connecting = {
        let dp = dp.clone();
        tokio::spawn(async move {
            match outbound::connect(dp.inputs(), &pod(), client, dst).await {
                Ok((routed, _upstream)) => Ok((routed.source.name.to_string(), Instant::now())),
                Err((_, e)) => Err(e.to_string()),
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!connecting.is_finished(), "refused before its workload came");
    let pushed = Instant::now();
    dp.apply_state_json(&its_workload()).unwrap();
    let (source, done) = connecting.await.unwrap().expect("connected once the workload came");
    assert_eq!(source, "new-pod");
    assert!(done.duration_since(pushed) < Duration::from_secs(1), "woken by the push, not by a timer");
    assert!(started.elapsed() < SOURCE_WAIT);
    // The upstream connection reached the destination.
    tokio::time::timeout(Duration::from_secs(5), listener.accept()).await.expect("accepted in time").unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_pod_whose_workload_never_comes_is_refused_after_the_wait() {
    let dp = world();
    let client: SocketAddr = format!("{POD}:40001").parse().unwrap();
    let dst: SocketAddr = format!("{ECHO}:8080").parse().unwrap();
    let started = tokio::time::Instant::now();
    let err = match outbound::connect(dp.inputs(), &pod(), client, dst).await {
        Ok(_) => panic!("connected without a source workload"),
        Err((_, e)) => e.to_string(),
    };
    assert!(err.contains("is not in the state"), "{err}");
    assert!(started.elapsed() >= SOURCE_WAIT, "refused after {:?}", started.elapsed());
}

#[tokio::test(start_paused = true)]
async fn a_batch_that_does_not_bring_it_does_not_end_the_wait() {
    let dp = std::sync::Arc::new(world());
    let client: SocketAddr = format!("{POD}:40002").parse().unwrap();
    let dst: SocketAddr = format!("{ECHO}:8080").parse().unwrap();
    let started = tokio::time::Instant::now();
    let connecting = {
        let dp = dp.clone();
        tokio::spawn(async move {
            outbound::connect(dp.inputs(), &pod(), client, dst).await.map(|_| ()).map_err(|(_, e)| e.to_string())
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let other = json!({"workloads": [{"uid": "other", "name": "other", "namespace": "default", "serviceAccount": "other",
                                      "workloadIps": ["127.94.3.10"], "protocol": "TCP", "node": "node-b"}]});
    dp.apply_state_json(&other.to_string()).unwrap();
    let err = connecting.await.unwrap().expect_err("no source workload");
    assert!(err.contains("is not in the state"), "{err}");
    assert!(started.elapsed() >= SOURCE_WAIT, "the unrelated batch ended the wait at {:?}", started.elapsed());
}
