//! The policy impact preview (admin `POST /debug/authz/preview`): what candidate authorization policies would do on
//! this node if applied, without applying them. The answer: the live inbound connections allowed now that they would
//! deny (applying them closes those), and the recent denied attempts (proxy/denials.rs) they would allow.
//!
//! Invariants:
//! - One evaluator. Candidates are laid over the state's policy lookup (`Overlay`, an `rbac::Policies`), and both
//!   verdicts, now and with the candidates, come from `rbac::authorize_live`, the function re-evaluation judges live
//!   connections with, over the connections re-evaluation would walk (`reevaluation::walk`, with the scope
//!   `Scope::of_change` gives the candidates as a change). So the preview predicts what re-evaluation does once the
//!   candidates are applied, including which policy and rule decide.
//! - Upsert semantics, as applying them: a candidate replaces the held policy of its `namespace/name` wherever that
//!   one was (its scope may differ), in the key order the state keeps, so the deciding policy is the one enforcement
//!   would name. A WORKLOAD_SELECTOR candidate selects the workloads that already name its key (as istiod would send
//!   them after the push), and the workloads `selects` lists for it (a new policy no workload names yet).
//! - Nothing of the mesh is copied: the overlay is two references, the candidates are the only new policies, and the
//!   state's read lock is held per chunk of connections, as re-evaluation holds it, never across the whole walk.
//! - A dry-run candidate is judged as if enforced (and named in `judgedAsEnforced`): what turning it on would do is
//!   the question a preview answers. Applied as dry-run, it changes no decision.
//! - A verdict is the one re-evaluation ends with: a policy a workload names that is still missing denies (no grace:
//!   the preview does not wait for it).

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::proxy::reevaluation::{self, Scope};
use crate::proxy::ProxyInputs;
use crate::rbac::{self, Connection, Decision, LiveDecision, Policies};
use crate::state::policy::{Policy, PolicyJson, Scope as PolicyScope};
use crate::state::{State, StateError, ValidDelta, Workload};
use crate::AuthorizeWorkload;

/// Entries listed per answer list unless the request says otherwise (the totals count them all).
pub const DEFAULT_LIMIT: usize = 1000;

/// Recent denials judged per hold of the state's read lock.
const CHUNK: usize = 512;

#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    /// A candidate that `applyState` would refuse (its message names the policy and the field).
    #[error("{0}")]
    Policy(#[from] StateError),
    #[error("{code}: {0}", code = crate::ErrorCode::InvalidSpec)]
    Request(String),
}

/// What `previewAuthz` takes.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "AuthzPreviewRequest"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreviewRequest {
    /// The candidate policies, compiled as `StateDelta.policies` carries them and validated the same way; each is
    /// upserted by namespace/name over the policies held, as applying it would.
    pub policies: Vec<PolicyJson>,
    /// WORKLOAD_SELECTOR candidate (`namespace/name`) → uids of workloads it is to select besides those already
    /// naming it (a new policy, which no workload names before the push that adds it).
    #[serde(default)]
    #[cfg_attr(test, ts(as = "Option<BTreeMap<String, Vec<String>>>", optional))]
    pub selects: BTreeMap<String, Vec<String>>,
    /// At most this many entries in each list of the answer (default 1000); the totals count them all.
    #[serde(default)]
    #[cfg_attr(test, ts(optional))]
    pub limit: Option<u32>,
}

/// One group of connections or attempts of the answer: same destination workload and address, same source.
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "PreviewFlow"))]
#[serde(rename_all = "camelCase")]
pub struct Flow {
    pub workload: AuthorizeWorkload,
    /// The source's verified SPIFFE identity; absent for plaintext.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(optional))]
    pub src_identity: Option<String>,
    #[cfg_attr(test, ts(as = "String"))]
    pub src_ip: IpAddr,
    /// The destination address and target port, "ip:port".
    #[cfg_attr(test, ts(as = "String"))]
    pub dst: SocketAddr,
    #[cfg_attr(test, ts(type = "\"HBONE\" | \"TCP\""))]
    pub protocol: &'static str,
    /// Live connections (`wouldClose`) or denied attempts (`wouldAllow`) in the group.
    pub count: usize,
    /// `wouldAllow`: when the last of the attempts was denied, Unix milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(type = "number", optional))]
    pub last_denied_ms: Option<u64>,
    /// The decision now.
    pub now: Decision,
    /// The decision with the candidates applied, and the policy and rule that make it.
    pub candidate: Decision,
}

/// What `previewAuthz` answers.
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export, rename = "AuthzPreview"))]
#[serde(rename_all = "camelCase")]
pub struct PreviewOut {
    /// The candidates, `namespace/name`, in the order given.
    pub candidates: Vec<String>,
    /// Dry-run candidates, judged as if enforced (applied as dry-run, they change no decision).
    pub judged_as_enforced: Vec<String>,
    /// Live inbound connections judged: those on workloads the candidates can affect (as re-evaluation picks them).
    pub connections_judged: usize,
    /// Recent denied attempts judged (of the last 1000 on this node), on workloads the candidates can affect.
    pub denials_judged: usize,
    /// Live connections allowed now that the candidates deny: applying them closes these.
    pub would_close: Vec<Flow>,
    /// The live connections in `wouldClose`'s groups, all of them (the list stops at `limit` groups).
    pub would_close_connections: usize,
    /// Recent attempts denied now that the candidates allow.
    pub would_allow: Vec<Flow>,
    /// The attempts in `wouldAllow`'s groups, all of them.
    pub would_allow_attempts: usize,
    /// A list stopped at `limit` groups.
    pub truncated: bool,
}

/// `namespace/name` is `key`, without formatting the key.
fn is_key(key: &str, p: &Policy) -> bool {
    key.len() == p.namespace.len() + 1 + p.name.len()
        && key.starts_with(p.namespace.as_str())
        && key.as_bytes()[p.namespace.len()] == b'/'
        && key.ends_with(p.name.as_str())
}

/// The state's order of policies: by `namespace/name` as a string (state::insert_policy), without formatting keys.
fn key_order(a: &Policy, b: &Policy) -> Ordering {
    fn key(p: &Policy) -> impl Iterator<Item = u8> + '_ {
        p.namespace.bytes().chain(std::iter::once(b'/')).chain(p.name.bytes())
    }
    key(a).cmp(key(b))
}

/// The candidates, validated and indexed the way the state indexes its policies.
pub struct Candidates {
    /// In the order given.
    all: Vec<Arc<Policy>>,
    /// GLOBAL candidates, in key order.
    global: Vec<Arc<Policy>>,
    /// NAMESPACE candidates by namespace, in key order.
    namespace: HashMap<String, Vec<Arc<Policy>>>,
    /// Workload uid → the WORKLOAD_SELECTOR candidates `selects` names it for.
    selects: HashMap<String, Vec<Arc<Policy>>>,
    judged_as_enforced: Vec<String>,
}

impl Candidates {
    /// Validates the request against `state` (the uids `selects` names must be workloads it holds).
    pub fn new(req: &PreviewRequest, state: &State) -> Result<Candidates, PreviewError> {
        if req.policies.is_empty() {
            return Err(PreviewError::Request("no candidate policy to preview".into()));
        }
        let mut c = Candidates {
            all: Vec::with_capacity(req.policies.len()),
            global: Vec::new(),
            namespace: HashMap::new(),
            selects: HashMap::new(),
            judged_as_enforced: Vec::new(),
        };
        for json in &req.policies {
            let mut p = json.validate()?;
            if c.by_key(&p.key()).is_some() {
                return Err(PreviewError::Request(format!("policy {} is given twice", p.key())));
            }
            if p.dry_run {
                c.judged_as_enforced.push(p.key());
                p.dry_run = false;
            }
            let p = Arc::new(p);
            let at = |v: &Vec<Arc<Policy>>| v.partition_point(|x| key_order(x, &p) == Ordering::Less);
            match p.scope {
                PolicyScope::Global => c.global.insert(at(&c.global), p.clone()),
                PolicyScope::Namespace => {
                    let v = c.namespace.entry(p.namespace.clone()).or_default();
                    v.insert(at(v), p.clone())
                }
                PolicyScope::WorkloadSelector => {}
            }
            c.all.push(p);
        }
        for (key, uids) in &req.selects {
            let p = c.by_key(key).cloned().ok_or_else(|| {
                PreviewError::Request(format!("selects names {key}, which is not one of the candidates"))
            })?;
            if p.scope != PolicyScope::WorkloadSelector {
                return Err(PreviewError::Request(format!(
                    "selects names {key}, whose scope is {:?}: only a WorkloadSelector policy selects workloads",
                    p.scope
                )));
            }
            for uid in uids {
                if state.workload(uid).is_none() {
                    return Err(PreviewError::Request(format!("selects[{key:?}]: no workload has the uid {uid:?}")));
                }
                let chosen = c.selects.entry(uid.clone()).or_default();
                if !chosen.iter().any(|q| Arc::ptr_eq(q, &p)) {
                    chosen.push(p.clone());
                }
            }
        }
        Ok(c)
    }

    fn by_key(&self, key: &str) -> Option<&Arc<Policy>> {
        self.all.iter().find(|p| is_key(key, p))
    }

    fn replaces(&self, held: &Policy) -> bool {
        self.all.iter().any(|p| p.namespace == held.namespace && p.name == held.name)
    }

    /// The connections the candidates can change a decision for: re-evaluation's scope of them as a change, and
    /// the workloads `selects` adds them to.
    pub fn scope(&self, state: &State) -> Scope {
        let change =
            ValidDelta { policies: self.all.iter().map(|p| Policy::clone(p)).collect(), ..ValidDelta::default() };
        Scope::of_change(state, &change).and_uids(self.selects.keys().cloned())
    }

    /// The state with the candidates laid over its policies.
    pub fn over<'a>(&'a self, state: &'a State) -> Overlay<'a> {
        Overlay { state, candidates: self }
    }
}

/// The state's policies with the candidates upserted over them, as a lookup (`rbac::Policies`).
pub struct Overlay<'a> {
    state: &'a State,
    candidates: &'a Candidates,
}

impl Overlay<'_> {
    /// `held` without the policies a candidate replaces, merged with `added` in key order.
    fn merged<'a>(
        &'a self,
        held: &'a [Arc<Policy>],
        added: &'a [Arc<Policy>],
    ) -> impl Iterator<Item = &'a Arc<Policy>> + 'a {
        let mut held = held.iter().filter(|p| !self.candidates.replaces(p)).peekable();
        let mut added = added.iter().peekable();
        std::iter::from_fn(move || match (held.peek(), added.peek()) {
            (Some(h), Some(a)) if key_order(h, a) == Ordering::Greater => added.next(),
            (Some(_), _) => held.next(),
            (None, _) => added.next(),
        })
    }
}

impl Policies for Overlay<'_> {
    fn global(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.merged(self.state.global_policies(), &self.candidates.global)
    }

    fn of_namespace<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = &'a Arc<Policy>> {
        let added = self.candidates.namespace.get(namespace).map(Vec::as_slice).unwrap_or(&[]);
        self.merged(self.state.namespace_policies(namespace), added)
    }

    fn by_key(&self, key: &str) -> Option<&Arc<Policy>> {
        self.candidates.by_key(key).or_else(|| self.state.policy(key))
    }

    fn also_selecting<'a>(&'a self, w: &'a Workload) -> impl Iterator<Item = &'a Arc<Policy>> {
        let chosen = self.candidates.selects.get(w.uid.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        // A workload naming the key has it in its set already.
        chosen.iter().filter(move |p| !w.authorization_policies.iter().any(|k| is_key(k, p)))
    }
}

/// The verdict re-evaluation ends with: `authorize_live` once no grace is left.
pub fn verdict<P: Policies>(policies: &P, w: &Workload, c: &Connection) -> Decision {
    match rbac::authorize_live(policies, w, c, |_| false) {
        LiveDecision::Decided(d) => d,
        // Not reached: with no grace a missing policy decides at once.
        LiveDecision::Deferred(key) => Decision {
            allowed: false,
            reason: format!("policy {key} is referenced by the workload but not known (fail closed)"),
            policy: Some(key),
            rule: None,
        },
    }
}

/// Groups of the answer, keyed for a stable order: destination workload, destination, source, identity, protocol.
#[derive(Default)]
struct Groups(BTreeMap<(String, SocketAddr, IpAddr, Option<String>, &'static str), Flow>);

impl Groups {
    fn add(
        &mut self,
        w: &Workload,
        c: &Connection,
        protocol: &'static str,
        at: Option<SystemTime>,
        now: Decision,
        candidate: Decision,
    ) {
        let identity = c.src_identity.as_ref().map(|i| i.to_string());
        let dst = SocketAddr::new(c.dst_ip, c.dst_port);
        let ms = at.map(|t| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64));
        let flow =
            self.0.entry((w.uid.to_string(), dst, c.src_ip, identity.clone(), protocol)).or_insert_with(|| Flow {
                workload: AuthorizeWorkload::of(w),
                src_identity: identity,
                src_ip: c.src_ip,
                dst,
                protocol,
                count: 0,
                last_denied_ms: None,
                now,
                candidate,
            });
        flow.count += 1;
        flow.last_denied_ms = flow.last_denied_ms.max(ms);
    }

    /// (the first `limit` groups, everything they count, whether groups were left out)
    fn into_list(self, limit: usize) -> (Vec<Flow>, usize, bool) {
        let total = self.0.values().map(|f| f.count).sum();
        let cut = self.0.len() > limit;
        (self.0.into_values().take(limit).collect(), total, cut)
    }
}

/// The preview of `req` over the live connections and recent denials of the proxies `pi` serves.
pub async fn preview(pi: &ProxyInputs, req: PreviewRequest) -> Result<PreviewOut, PreviewError> {
    let limit = req.limit.map_or(DEFAULT_LIMIT, |l| l as usize);
    let (candidates, scope) = {
        let state = pi.state.read();
        let c = Candidates::new(&req, &state)?;
        let scope = c.scope(&state);
        (c, scope)
    };
    let (mut close, mut connections_judged) = (Groups::default(), 0);
    reevaluation::walk(pi, &scope, |state, live| {
        connections_judged += 1;
        let now = verdict(state, live.workload, live.conn);
        if !now.allowed {
            return; // already on its way out (a pass about to close it); not the candidates' doing
        }
        let candidate = verdict(&candidates.over(state), live.workload, live.conn);
        if !candidate.allowed {
            close.add(live.workload, live.conn, live.protocol, None, now, candidate);
        }
    })
    .await;
    let (mut allow, mut denials_judged) = (Groups::default(), 0);
    let denials = pi.denials.snapshot();
    for chunk in denials.chunks(CHUNK) {
        let state = pi.state.read();
        for d in chunk {
            let Some(w) = state.workload(&d.uid).filter(|w| scope.covers(w)) else { continue };
            denials_judged += 1;
            let now = verdict(&*state, w, &d.conn);
            if now.allowed {
                continue; // allowed already: not the candidates' doing
            }
            let candidate = verdict(&candidates.over(&state), w, &d.conn);
            if candidate.allowed {
                allow.add(w, &d.conn, d.protocol, Some(d.at), now, candidate);
            }
        }
    }
    let (would_close, would_close_connections, cut_close) = close.into_list(limit);
    let (would_allow, would_allow_attempts, cut_allow) = allow.into_list(limit);
    Ok(PreviewOut {
        candidates: candidates.all.iter().map(|p| p.key()).collect(),
        judged_as_enforced: candidates.judged_as_enforced,
        connections_judged,
        denials_judged,
        would_close,
        would_close_connections,
        would_allow,
        would_allow_attempts,
        truncated: cut_close || cut_allow,
    })
}

#[cfg(test)]
mod tests {
    //! The overlay against the real thing: for each candidate, the verdict through the overlay equals the verdict on
    //! a state the candidate was applied to (decision, deciding policy and rule), for every connection of a table.
    use super::*;
    use crate::identity::Identity;
    use crate::state::StateDelta;
    use serde_json::{json, Value};

    fn workloads() -> Value {
        json!([
            {"uid": "echo", "name": "echo", "namespace": "ns1", "serviceAccount": "echo", "workloadIps": ["10.0.0.10"],
             "protocol": "HBONE", "authorizationPolicies": ["ns1/sel"]},
            {"uid": "db", "name": "db", "namespace": "ns1", "serviceAccount": "db", "workloadIps": ["10.0.0.11"],
             "protocol": "HBONE"},
            {"uid": "web", "name": "web", "namespace": "ns2", "serviceAccount": "web", "workloadIps": ["10.0.0.12"],
             "protocol": "HBONE", "authorizationPolicies": ["ns2/missing"]},
        ])
    }

    fn principal(sa: &str) -> Value {
        json!({"principals": [{"exact": format!("cluster.local/ns/ns3/sa/{sa}")}]})
    }

    fn policy(ns: &str, name: &str, scope: &str, action: &str, m: Value) -> Value {
        json!({"name": name, "namespace": ns, "scope": scope, "action": action, "rules": [[[m]]]})
    }

    fn held() -> Value {
        json!([
            policy("ns1", "sel", "WorkloadSelector", "Deny", json!({"destinationPorts": [9999]})),
            policy(
                "ns1",
                "allow-a-b",
                "Namespace",
                "Allow",
                json!({"principals": [{"prefix": "cluster.local/ns/ns3/sa/"}]})
            ),
            policy("ns1", "m-deny-c", "Namespace", "Deny", principal("c")),
            policy("", "g-deny-d", "Global", "Deny", principal("d")),
        ])
    }

    fn state(policies: Value) -> State {
        let mut st = State::default();
        let delta = json!({"workloads": workloads(), "policies": policies});
        st.apply(serde_json::from_value::<StateDelta>(delta).unwrap()).unwrap();
        st
    }

    fn conns() -> Vec<(&'static str, Connection)> {
        let mut out = Vec::new();
        for (uid, ip) in [("echo", "10.0.0.10"), ("db", "10.0.0.11"), ("web", "10.0.0.12")] {
            for sa in ["a", "b", "c", "d", "e"] {
                for port in [8080, 9090] {
                    let id = Some(Identity::new("cluster.local", "ns3", sa));
                    out.push((uid, Connection::new(id, "10.1.0.1".parse().unwrap(), ip.parse().unwrap(), port)));
                }
            }
            out.push((uid, Connection::new(None, "10.1.0.1".parse().unwrap(), ip.parse().unwrap(), 8080)));
        }
        out
    }

    fn request(candidates: Value, selects: Value) -> PreviewRequest {
        serde_json::from_value(json!({"policies": candidates, "selects": selects})).unwrap()
    }

    /// The candidates (and for `selects`, the references they add) applied to a copy of the held state.
    fn applied(candidates: &Value, selects: &Value) -> State {
        let mut st = state(held());
        let mut ws = workloads();
        for (key, uids) in selects.as_object().unwrap() {
            for w in ws.as_array_mut().unwrap() {
                if uids.as_array().unwrap().contains(&w["uid"]) {
                    let refs = w.as_object_mut().unwrap().entry("authorizationPolicies").or_insert(json!([]));
                    refs.as_array_mut().unwrap().push(json!(key));
                }
            }
        }
        let mut enforced = candidates.clone();
        for p in enforced.as_array_mut().unwrap() {
            p["dryRun"] = json!(false);
        }
        let delta = json!({"workloads": ws, "policies": enforced});
        st.apply(serde_json::from_value::<StateDelta>(delta).unwrap()).unwrap();
        st
    }

    #[test]
    fn the_overlay_decides_as_the_applied_candidate_does() {
        let rows: Vec<(&str, Value, Value)> = vec![
            (
                "a new namespace DENY",
                json!([policy("ns1", "deny-9090", "Namespace", "Deny", json!({"destinationPorts": [9090]}))]),
                json!({}),
            ),
            (
                "an upserted ALLOW that drops b",
                json!([policy("ns1", "allow-a-b", "Namespace", "Allow", principal("a"))]),
                json!({}),
            ),
            (
                "an upserted DENY that no longer matches c",
                json!([policy("ns1", "m-deny-c", "Namespace", "Deny", principal("zz"))]),
                json!({}),
            ),
            (
                "a DENY sorted before the held one that also matches",
                json!([policy("ns1", "a-deny-c", "Namespace", "Deny", principal("c"))]),
                json!({}),
            ),
            (
                "a global DENY in another namespace",
                json!([policy("istio-system", "deny-e", "Global", "Deny", principal("e"))]),
                json!({}),
            ),
            (
                "a global policy made namespace-scoped elsewhere",
                json!([policy("", "g-deny-d", "Namespace", "Deny", principal("d"))]),
                json!({}),
            ),
            (
                "the selector policy echo names",
                json!([policy("ns1", "sel", "WorkloadSelector", "Deny", principal("a"))]),
                json!({}),
            ),
            (
                "a selector nobody names: nothing",
                json!([policy("ns1", "new", "WorkloadSelector", "Deny", principal("a"))]),
                json!({}),
            ),
            (
                "a new selector with selects",
                json!([policy("ns1", "new", "WorkloadSelector", "Deny", principal("b"))]),
                json!({"ns1/new": ["db"]}),
            ),
            (
                "selects naming a workload that names it already",
                json!([policy("ns1", "sel", "WorkloadSelector", "Deny", principal("b"))]),
                json!({"ns1/sel": ["echo"]}),
            ),
            (
                "the missing policy web names arrives",
                json!([policy("ns2", "missing", "WorkloadSelector", "Allow", principal("a"))]),
                json!({}),
            ),
            (
                "a dry-run DENY, judged as enforced",
                json!([{"name": "dry", "namespace": "ns1", "scope": "Namespace", "action": "Deny", "dryRun": true, "rules": [[[principal("a")]]]}]),
                json!({}),
            ),
            (
                "two candidates at once",
                json!([
                    policy("ns1", "allow-a-b", "Namespace", "Allow", principal("c")),
                    policy("ns1", "m-deny-c", "Namespace", "Deny", json!({"destinationPorts": [1]}))
                ]),
                json!({}),
            ),
        ];
        let now = state(held());
        for (name, candidates, selects) in rows {
            let req = request(candidates.clone(), selects.clone());
            let c = Candidates::new(&req, &now).unwrap();
            let after = applied(&candidates, &selects);
            let scope = c.scope(&now);
            let mut changed = 0;
            for (uid, conn) in conns() {
                let w = now.workload(uid).unwrap();
                let previewed = verdict(&c.over(&now), w, &conn);
                let enforced = verdict(&after, after.workload(uid).unwrap(), &conn);
                assert_eq!(previewed, enforced, "{name}: {uid} {conn:?}");
                changed += usize::from(verdict(&now, w, &conn) != enforced);
                // Outside the scope nothing may change (the preview, like re-evaluation, does not look there).
                if !scope.covers(w) {
                    assert_eq!(verdict(&now, w, &conn), enforced, "{name}: {uid} is outside the scope but changes");
                }
            }
            assert_eq!(changed == 0, name.ends_with("nothing"), "{name}: {changed} verdicts change");
            if name.starts_with("a dry-run") {
                assert_eq!(c.judged_as_enforced, vec!["ns1/dry".to_string()]);
            }
        }
    }

    #[test]
    fn bad_requests_are_refused_with_what_is_wrong() {
        let st = state(held());
        let bad = |candidates: Value, selects: Value| match Candidates::new(&request(candidates, selects), &st) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted"),
        };
        let ok = policy("ns1", "p", "WorkloadSelector", "Deny", principal("a"));
        assert_eq!(bad(json!([]), json!({})), "INVALID_SPEC: no candidate policy to preview");
        let e =
            bad(json!([policy("ns1", "p", "Namespace", "Allow", json!({"sourceIps": ["10.0.0.0/40"]}))]), json!({}));
        assert!(e.starts_with("INVALID_STATE:") && e.contains("ns1/p") && e.contains("CIDR"), "{e}");
        assert!(bad(json!([ok, ok]), json!({})).contains("given twice"));
        assert!(bad(json!([ok]), json!({"ns1/other": ["echo"]})).contains("not one of the candidates"));
        assert!(bad(json!([ok]), json!({"ns1/p": ["nope"]})).contains("no workload has the uid \"nope\""));
        let ns = policy("ns1", "n", "Namespace", "Deny", principal("a"));
        assert!(bad(json!([ns]), json!({"ns1/n": ["echo"]})).contains("only a WorkloadSelector policy"));
    }

    #[test]
    fn the_merge_keeps_the_states_key_order() {
        // "a-b/x" sorts before "a/x" as a key ('-' < '/'), though "a" < "a-b" as a namespace.
        let st = state(json!([
            policy("a", "x", "Global", "Deny", principal("a")),
            policy("a-c", "x", "Global", "Deny", principal("a")),
        ]));
        let req = request(json!([policy("a-b", "x", "Global", "Deny", principal("a"))]), json!({}));
        let c = Candidates::new(&req, &st).unwrap();
        let keys: Vec<String> = c.over(&st).global().map(|p| p.key()).collect();
        assert_eq!(keys, ["a-b/x", "a-c/x", "a/x"]);
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }
}
