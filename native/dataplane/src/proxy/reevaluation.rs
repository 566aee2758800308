//! Continuous authorization: live inbound connections are judged again after every state change that can change
//! a decision, by a task of its own on the dataplane's runtime.
//!
//! Invariants:
//! - `Dataplane::apply_state` writes the state, then hands this task the scope of the change (`Scope`, computed in
//!   O(change) from the delta and the records it replaces) and returns: applying state never evaluates a
//!   connection, and never runs on Node's thread for longer than the change takes.
//! - Only what can change a decision is sent: a policy (GLOBAL: every connection; NAMESPACE: that namespace's
//!   workloads; WORKLOAD_SELECTOR: the workloads that name it), a workload whose namespace, identity or policy
//!   references changed, and a full replacement (everything). Workload-only changes elsewhere send nothing.
//! - The tracker is snapshotted only after the state being evaluated was written (see tracker.rs), so a
//!   connection registered before the change is in the snapshot, and one registered after it checks the new state
//!   itself. The snapshot holds one tracker shard at a time, for the copy only; evaluation takes the state's read
//!   lock per chunk of connections, so neither opening a connection nor the next `apply_state` waits on a pass.
//! - Push order (istiod sends a workload's new policy reference about half a millisecond before the policy): a
//!   live connection is not judged on a policy that has not arrived until `missing_policy_grace` has passed since
//!   the reference was first seen missing. Then it is judged again: on the arrived policy, or, still missing, it
//!   is closed (fail closed) and that is logged once per policy. A matching enforced DENY among the known policies
//!   closes at once (the final set contains it whatever arrives). New connections are refused all along
//!   (`rbac::authorize`). So no connection the final policy set allows is closed.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::tracker::{Kind, Tracked};
use super::ProxyInputs;
use crate::events::{Event, Level};
use crate::rbac::{self, LiveDecision};
use crate::state::policy::Scope as PolicyScope;
use crate::state::{State, ValidDelta, Workload};

/// Connections evaluated per hold of the state's read lock.
const CHUNK: usize = 512;

/// Which live connections a change can affect (by their local workload).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scope {
    all: bool,
    namespaces: HashSet<String>,
    uids: HashSet<String>,
    /// WORKLOAD_SELECTOR policy keys: the workloads naming one are affected.
    policies: HashSet<String>,
}

impl Scope {
    pub fn all() -> Scope {
        Scope { all: true, ..Scope::default() }
    }

    /// The scope of `delta`, against the state it is about to be applied to (the records it replaces).
    pub fn of_change(state: &State, delta: &ValidDelta) -> Scope {
        if delta.full {
            return Scope::all();
        }
        let mut s = Scope::default();
        let policy = |s: &mut Scope, p: &crate::state::policy::Policy| match p.scope {
            PolicyScope::Global => s.all = true,
            PolicyScope::Namespace => {
                s.namespaces.insert(p.namespace.clone());
            }
            PolicyScope::WorkloadSelector => {
                s.policies.insert(p.key());
            }
        };
        for p in &delta.policies {
            let key = p.key();
            match state.policy(&key) {
                Some(old) if **old == *p => continue,
                // A policy that changes scope affects both the old and the new members.
                Some(old) => policy(&mut s, old),
                None => {}
            }
            policy(&mut s, p);
            // A workload may name a key whose policy turns out to be GLOBAL or NAMESPACE-scoped.
            s.policies.insert(key);
        }
        for key in &delta.removed_policies {
            if let Some(old) = state.policy(key) {
                policy(&mut s, old);
            }
            s.policies.insert(key.clone());
        }
        for w in &delta.workloads {
            let relevant = |o: &Workload| {
                o.namespace == w.namespace
                    && o.name == w.name
                    && o.service_account == w.service_account
                    && o.trust_domain == w.trust_domain
                    && o.authorization_policies == w.authorization_policies
            };
            if !state.workload(&w.uid).is_some_and(|o| relevant(o)) {
                s.uids.insert(w.uid.to_string());
            }
        }
        // A removed workload's connections are drained with it; nothing to judge.
        s
    }

    /// This scope and the workloads `uids`.
    pub(crate) fn and_uids(mut self, uids: impl IntoIterator<Item = String>) -> Scope {
        self.uids.extend(uids);
        self
    }

    pub fn is_empty(&self) -> bool {
        !self.all && self.namespaces.is_empty() && self.uids.is_empty() && self.policies.is_empty()
    }

    fn merge(&mut self, other: Scope) {
        self.all |= other.all;
        self.namespaces.extend(other.namespaces);
        self.uids.extend(other.uids);
        self.policies.extend(other.policies);
    }

    pub(crate) fn covers(&self, w: &Workload) -> bool {
        self.all
            || self.uids.contains(w.uid.as_str())
            || self.namespaces.contains(w.namespace.as_str())
            || (!self.policies.is_empty()
                && w.authorization_policies.iter().any(|k| self.policies.contains(k.as_str())))
    }
}

/// The hand-off between `apply_state` and the re-evaluation task: changes merge while a pass runs.
#[derive(Default)]
pub struct Reevaluator {
    pending: Mutex<Option<Scope>>,
    notify: Notify,
    /// Changes submitted, and how many of them a completed pass has judged (tests and benchmarks wait on these).
    submitted: AtomicU64,
    judged: AtomicU64,
    /// Passes woken by a grace period running out (tests wait on it instead of on the clock).
    grace_passes: AtomicU64,
}

impl Reevaluator {
    /// Queue a change's scope for the task; returns at once.
    pub fn submit(&self, scope: Scope) {
        if scope.is_empty() {
            return;
        }
        let mut pending = self.pending.lock();
        self.submitted.fetch_add(1, Ordering::AcqRel);
        match pending.as_mut() {
            Some(p) => p.merge(scope),
            None => *pending = Some(scope),
        }
        drop(pending);
        self.notify.notify_one();
    }

    /// (changes submitted, changes judged): equal once every submitted change has had its pass.
    pub fn progress(&self) -> (u64, u64) {
        (self.submitted.load(Ordering::Acquire), self.judged.load(Ordering::Acquire))
    }

    /// How many passes a grace period running out has woken, each counted once it completed.
    pub fn grace_passes(&self) -> u64 {
        self.grace_passes.load(Ordering::Acquire)
    }

    /// The pending scope, and how many submitted changes it holds (all of them so far).
    fn take(&self) -> (Scope, u64) {
        let mut pending = self.pending.lock();
        (pending.take().unwrap_or_default(), self.submitted.load(Ordering::Acquire))
    }

    /// The task: one pass per wake-up (a submitted change, or a grace period running out), until `stop`.
    pub async fn run(self: Arc<Self>, pi: Arc<ProxyInputs>, stop: CancellationToken) {
        let mut grace = Grace::new(pi.cfg.missing_policy_grace());
        loop {
            let due = grace.due();
            tokio::select! {
                _ = self.notify.notified() => {}
                _ = async { match due { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {}
                _ = stop.cancelled() => return,
            }
            let (mut scope, submitted) = self.take();
            let due = grace.take_due(Instant::now());
            let grace_ran_out = !due.is_empty();
            scope.merge(due);
            if !scope.is_empty() {
                pass(&pi, &scope, &mut grace).await;
            }
            self.judged.store(submitted, Ordering::Release);
            if grace_ran_out {
                self.grace_passes.fetch_add(1, Ordering::Release);
            }
        }
    }
}

/// Connections a successor takes in were authorized by the predecessor, against its state: this daemon's may be
/// newer (a change that crossed with the hand-over). One `Adopting` per connection taken in; once the last is
/// listed in the tracker (or gave up: dropped either way), one pass judges every live connection.
pub struct Adopting(Arc<AdoptBatch>);

struct AdoptBatch {
    left: std::sync::atomic::AtomicUsize,
    reevaluator: Arc<Reevaluator>,
}

impl Drop for Adopting {
    fn drop(&mut self) {
        if self.0.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.reevaluator.submit(Scope::all());
        }
    }
}

impl Reevaluator {
    /// One token for a whole hand-over (cloned into an `Arrival`).
    pub fn adopt(self: &Arc<Self>) -> Adopting {
        Adopting(Arc::new(AdoptBatch { left: 1.into(), reevaluator: self.clone() }))
    }

    /// `n` tokens for `n` connections taken in.
    pub fn adopting(self: &Arc<Self>, n: usize) -> Vec<Adopting> {
        let batch = Arc::new(AdoptBatch { left: n.into(), reevaluator: self.clone() });
        (0..n).map(|_| Adopting(batch.clone())).collect()
    }
}

/// The missing-policy clock: when each missing reference was first seen, and which workloads wait on one.
struct Grace {
    period: std::time::Duration,
    since: HashMap<String, Instant>,
    /// Workloads with a deferred connection, and when the earliest of them is due.
    waiting: HashSet<String>,
    due: Option<Instant>,
    /// Policies already logged as never arrived (logged once each).
    reported: HashSet<String>,
}

impl Grace {
    fn new(period: std::time::Duration) -> Grace {
        Grace { period, since: HashMap::new(), waiting: HashSet::new(), due: None, reported: HashSet::new() }
    }

    fn due(&self) -> Option<Instant> {
        self.due
    }

    /// The waiting workloads, once their time has come.
    fn take_due(&mut self, now: Instant) -> Scope {
        if self.due.is_none_or(|t| t > now) {
            return Scope::default();
        }
        self.due = None;
        Scope { uids: std::mem::take(&mut self.waiting), ..Scope::default() }
    }

    fn in_grace(&mut self, key: &str, now: Instant) -> bool {
        let since = *self.since.entry(key.to_string()).or_insert(now);
        now < since + self.period
    }

    fn wait(&mut self, uid: &str, key: &str) {
        let at = self.since.get(key).map_or_else(Instant::now, |s| *s + self.period);
        self.waiting.insert(uid.to_string());
        self.due = Some(self.due.map_or(at, |d| d.min(at)));
    }

    /// Forget the clocks of policies that are known now (a later removal starts a new grace).
    fn forget_arrived(&mut self, state: &State) {
        self.since.retain(|k, _| state.policy(k).is_none());
        self.reported.retain(|k| state.policy(k).is_none());
    }
}

/// One live inbound connection as a walk hands it over: the entry, what authorization sees of it, and its local
/// workload as the state has it now.
pub(crate) struct Live<'a> {
    pub(crate) tracked: &'a Tracked,
    pub(crate) conn: &'a rbac::Connection,
    pub(crate) protocol: &'static str,
    pub(crate) workload: &'a Arc<Workload>,
}

/// Visits every live inbound connection not yet closed whose local workload `scope` covers, in chunks of `CHUNK`
/// under the state's read lock (released and the worker yielded between chunks). Re-evaluation and the policy
/// impact preview (preview.rs) both walk this way, so they see the same connections.
pub(crate) async fn walk(pi: &ProxyInputs, scope: &Scope, mut visit: impl FnMut(&State, Live<'_>)) {
    let conns = pi.tracker.inbound_snapshot();
    for chunk in conns.chunks(CHUNK) {
        {
            let state = pi.state.read();
            for t in chunk {
                let Kind::Inbound { conn, protocol } = &t.kind else { continue };
                if t.close.is_cancelled() {
                    continue;
                }
                // A workload no longer in the state is being removed: its drain closes its listeners and connections.
                let Some(w) = t.local.resolve(&state) else { continue };
                if scope.covers(&w) {
                    visit(&state, Live { tracked: t, conn, protocol, workload: &w });
                }
            }
        }
        // Let connection tasks on this worker run between chunks.
        tokio::task::yield_now().await;
    }
}

async fn pass(pi: &ProxyInputs, scope: &Scope, grace: &mut Grace) {
    walk(pi, scope, |state, live| judge(pi, state, live, grace)).await;
    let state = pi.state.read();
    grace.forget_arrived(&state);
}

fn judge(pi: &ProxyInputs, state: &State, live: Live<'_>, grace: &mut Grace) {
    let Live { tracked: t, conn, workload: w, .. } = live;
    let decision = match rbac::authorize_live(state, w, conn, |key| grace.in_grace(key, Instant::now())) {
        LiveDecision::Deferred(key) => {
            grace.wait(&w.uid, &key);
            return;
        }
        LiveDecision::Decided(d) if d.allowed => return,
        LiveDecision::Decided(d) => d,
    };
    if let Some(key) = decision.policy.as_deref().filter(|k| state.policy(k).is_none()) {
        if grace.reported.insert(key.to_string()) {
            pi.events.push(Event {
                kind: "log",
                level: Level::Warn,
                message: format!(
                    "authorization policy {key} did not arrive within {} ms: closing the live connections it was \
                     to judge (fail closed)",
                    grace.period.as_millis()
                ),
                fields: crate::fields! { "policy" => key.to_string(), "workload" => w.uid.clone() },
            });
        }
    }
    t.close.cancel();
    pi.metrics.authz_closed_by_policy.fetch_add(1, Ordering::Relaxed);
    pi.events.push(Event {
        kind: "access",
        level: Level::Warn,
        message: "connection closed due to policy change".into(),
        fields: crate::fields! {
            "src.addr" => conn.src_ip.to_string(),
            "src.identity" => conn.src_identity.as_ref().map(|i| i.to_string()).unwrap_or_default(),
            "dst.addr" => std::net::SocketAddr::new(conn.dst_ip, conn.dst_port).to_string(),
            "dst.workload" => t.local.to_string(),
            "direction" => "inbound",
            "policy" => decision.policy.clone().unwrap_or_default(),
            "reason" => decision.reason,
        },
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateDelta;
    use serde_json::{json, Value};

    fn valid(v: Value) -> ValidDelta {
        serde_json::from_value::<StateDelta>(v).unwrap().validate().unwrap()
    }

    fn policy(name: &str, ns: &str, scope: &str) -> Value {
        json!({"name": name, "namespace": ns, "scope": scope, "action": "Allow",
               "rules": [[[{"principals": [{"exact": "cluster.local/ns/a/sa/b"}]}]]]})
    }

    fn state() -> State {
        let mut st = State::default();
        st.apply(
            serde_json::from_value(json!({
                "workloads": [{"uid": "w1", "name": "a", "namespace": "ns1", "workloadIps": ["10.0.0.1"],
                               "authorizationPolicies": ["ns1/sel"]}],
                "policies": [policy("sel", "ns1", "WorkloadSelector"), policy("nsp", "ns1", "Namespace")],
            }))
            .unwrap(),
        )
        .unwrap();
        st
    }

    #[test]
    fn connections_taken_in_are_judged_once_the_last_of_them_is_listed() {
        let r = Arc::new(Reevaluator::default());
        let mut tokens = r.adopting(3);
        tokens.pop();
        tokens.pop();
        assert_eq!(r.progress().0, 0, "no pass while one is not listed yet");
        tokens.pop();
        assert_eq!(r.progress().0, 1, "one pass once all are");
        assert_eq!(r.take().0, Scope::all(), "it judges every live connection");
    }

    /// (change, the scope it must produce), named after the rule each row checks.
    #[test]
    fn the_scope_of_a_change_is_what_can_change_a_decision() {
        let st = state();
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<HashSet<_>>();
        let rows: Vec<(&str, Value, Scope)> = vec![
            ("full replacement: everything", json!({"full": true}), Scope::all()),
            (
                "global policy: everything",
                json!({"policies": [policy("g", "istio-system", "Global")]}),
                Scope { all: true, policies: set(&["istio-system/g"]), ..Scope::default() },
            ),
            (
                "namespace policy: its namespace",
                json!({"policies": [policy("nsp2", "ns2", "Namespace")]}),
                Scope { namespaces: set(&["ns2"]), policies: set(&["ns2/nsp2"]), ..Scope::default() },
            ),
            (
                "selector policy: the workloads naming it",
                json!({"policies": [policy("sel2", "ns1", "WorkloadSelector")]}),
                Scope { policies: set(&["ns1/sel2"]), ..Scope::default() },
            ),
            (
                "an unchanged policy: nothing",
                json!({"policies": [policy("sel", "ns1", "WorkloadSelector")]}),
                Scope::default(),
            ),
            (
                "a removed namespace policy: its namespace",
                json!({"removedPolicies": ["ns1/nsp"]}),
                Scope { namespaces: set(&["ns1"]), policies: set(&["ns1/nsp"]), ..Scope::default() },
            ),
            (
                "a workload's policy references: that workload",
                json!({"workloads": [{"uid": "w1", "name": "a", "namespace": "ns1", "workloadIps": ["10.0.0.1"]}]}),
                Scope { uids: set(&["w1"]), ..Scope::default() },
            ),
            (
                "a workload's locality and address: nothing",
                json!({"workloads": [{"uid": "w1", "name": "a", "namespace": "ns1", "workloadIps": ["10.0.0.2"],
                                      "authorizationPolicies": ["ns1/sel"], "locality": {"zone": "z"}}]}),
                Scope::default(),
            ),
            (
                "a new workload: that workload",
                json!({"workloads": [{"uid": "w9", "name": "n", "namespace": "ns1", "workloadIps": ["10.0.0.9"]}]}),
                Scope { uids: set(&["w9"]), ..Scope::default() },
            ),
            (
                "a removed workload: nothing (its drain closes it)",
                json!({"removedWorkloads": ["w1"]}),
                Scope::default(),
            ),
        ];
        for (rule, change, want) in rows {
            assert_eq!(Scope::of_change(&st, &valid(change)), want, "{rule}");
        }
    }

    /// The missing-policy clock at given instants (no waiting): a reference is in grace for `period` from when it was
    /// first seen, a deferred workload is due at the end of the earliest of its references' graces, and a policy that
    /// arrives forgets its clock (a later removal starts a new one).
    #[test]
    fn the_grace_runs_from_a_reference_first_seen() {
        let period = std::time::Duration::from_millis(1_000);
        let ms = |n: u64| std::time::Duration::from_millis(n);
        let t0 = Instant::now();
        let mut g = Grace::new(period);
        assert!(g.in_grace("ns/p", t0), "first seen: in grace");
        assert!(g.in_grace("ns/p", t0 + ms(999)), "still in grace just before the period ends");
        assert!(!g.in_grace("ns/p", t0 + ms(1_000)), "out at the period's end");
        assert!(g.in_grace("ns/q", t0 + ms(600)), "another reference has its own clock");
        g.wait("w1", "ns/q");
        g.wait("w2", "ns/p");
        assert_eq!(g.due(), Some(t0 + ms(1_000)), "due at the earliest grace's end");
        assert!(g.take_due(t0 + ms(999)).is_empty(), "nothing due before then");
        let due = g.take_due(t0 + ms(1_000));
        assert_eq!(due.uids, ["w1", "w2"].map(String::from).into_iter().collect(), "the waiting workloads, together");
        assert_eq!(g.due(), None);
        assert!(g.take_due(t0 + ms(5_000)).is_empty(), "taken once");
        let mut st = State::default();
        st.apply(serde_json::from_value::<StateDelta>(json!({"policies": [policy("p", "ns", "Namespace")]})).unwrap())
            .unwrap();
        g.forget_arrived(&st);
        assert!(g.in_grace("ns/p", t0 + ms(10_000)), "arrived, then missing again: a new grace from then");
        assert!(!g.in_grace("ns/q", t0 + ms(10_000)), "a reference still missing keeps its first clock");
    }

    #[test]
    fn coverage_follows_the_scope() {
        let st = state();
        let w = st.workload("w1").unwrap();
        assert!(Scope { policies: ["ns1/sel".to_string()].into(), ..Scope::default() }.covers(w));
        assert!(Scope { namespaces: ["ns1".to_string()].into(), ..Scope::default() }.covers(w));
        assert!(Scope { uids: ["w1".to_string()].into(), ..Scope::default() }.covers(w));
        assert!(Scope::all().covers(w));
        assert!(!Scope { namespaces: ["ns2".to_string()].into(), ..Scope::default() }.covers(w));
        assert!(!Scope { policies: ["ns1/other".to_string()].into(), ..Scope::default() }.covers(w));
    }
}
