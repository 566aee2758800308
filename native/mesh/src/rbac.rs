//! L4 authorization, evaluated at the destination for every inbound connection (never at the source, as in ztunnel).
//!
//! Istio's semantics: the policy set of a destination workload is the GLOBAL policies, the NAMESPACE policies of
//! its namespace, and the WORKLOAD_SELECTOR policies it names. Dry-run policies are only reported. Any matching
//! DENY rejects; with no ALLOW policy the connection is allowed; otherwise a matching ALLOW allows and anything
//! else is rejected. A policy matches if any rule matches; a rule if all its clauses match (no clauses: match); a
//! clause if any of its matches matches; a match if every field holds (positive list empty or one matches, and no
//! negative one matches). A connection without an identity (plaintext) never matches a principal, namespace or
//! service account, not even `presence`.
//!
//! Where ztunnel-node is deliberately stricter than ztunnel (README "Authorization"):
//! - In a DENY policy an empty match matches every connection. istiod sends an empty match for a DENY whose rules
//!   were L7-only; ztunnel skips it and the DENY never fires (istio#61126). We fail closed.
//! - A WORKLOAD_SELECTOR policy a workload names but that has not arrived denies every NEW inbound connection to
//!   that workload until it arrives (ztunnel skips unknown policies, failing open during xDS lag). Live connections
//!   are not judged on a missing policy until a grace period passes (`authorize_live`): istiod sends a workload's
//!   new policy reference just before the policy itself, and the final policy set may well allow them.
//! - The identity is the one verified in the TLS handshake; nothing from headers reaches this module.
//!
//! Evaluation is a pure function of the state and the connection; `explain` returns the same decision with the
//! policies considered, for `/debug/authorize`. Where policies are found is a parameter (`Policies`): the state, or
//! the state with candidate policies laid over it, which is how the policy impact preview (preview.rs) asks this
//! same evaluator what a candidate would decide.

use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;

use crate::identity::Identity;
use crate::state::policy::{Action, Match, Policy, StringMatch};
use crate::state::{State, Workload};

/// What authorization sees of one inbound connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// The verified peer identity; None for plaintext.
    pub src_identity: Option<Identity>,
    /// The identity as principals are written, without `spiffe://` (computed once, not per match); then, with
    /// TRUST_DOMAINS, the same identity in each trust domain a principal may name it by (`with_trust_domains`).
    principals: Vec<String>,
    /// The TCP peer address (never a header).
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    /// The resolved target port (never 15008).
    pub dst_port: u16,
}

impl Connection {
    pub fn new(src_identity: Option<Identity>, src_ip: IpAddr, dst_ip: IpAddr, dst_port: u16) -> Connection {
        let principals = src_identity
            .as_ref()
            .map(|i| {
                let s = i.to_string();
                s.strip_prefix("spiffe://").map(str::to_string).unwrap_or(s)
            })
            .into_iter()
            .collect();
        Connection { src_identity, principals, src_ip, dst_ip, dst_port }
    }

    /// The connection as judged at a destination in trust domain `own` with TRUST_DOMAINS `aliases`: a principal
    /// written in `own`, an alias or `cluster.local` matches a peer in any of them (Istio's trust-domain aliases);
    /// without aliases, unchanged.
    pub fn with_trust_domains(mut self, aliases: &crate::identity::TrustDomains, own: &str) -> Connection {
        if let Some(id) = &self.src_identity {
            self.principals.extend(aliases.alias_principals(own, id));
        }
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "AuthorizeDecision"))]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub allowed: bool,
    /// The policy that decided (`namespace/name`), if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(any(test, feature = "ts"), ts(optional))]
    pub policy: Option<String>,
    /// The index of the matching rule in that policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(any(test, feature = "ts"), ts(optional))]
    pub rule: Option<usize>,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "ConsideredPolicy"))]
#[serde(rename_all = "camelCase")]
pub struct Considered {
    pub policy: String,
    pub action: Action,
    pub dry_run: bool,
    /// How it entered the set: "global", "namespace" or "workload".
    #[cfg_attr(any(test, feature = "ts"), ts(type = "\"global\" | \"namespace\" | \"workload\""))]
    pub via: &'static str,
    /// Whether it matched, and with which rule.
    pub matched_rule: Option<usize>,
    /// False for a referenced policy that has not arrived.
    pub known: bool,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub decision: Decision,
    pub considered: Vec<Considered>,
}

fn string_matches(list: &[StringMatch], value: Option<&str>) -> bool {
    match value {
        Some(v) => list.iter().any(|m| m.matches(v)),
        None => false,
    }
}

/// Whether any of the peer's principals (none for plaintext) matches any of `list`.
fn principal_matches(list: &[StringMatch], principals: &[String]) -> bool {
    principals.iter().any(|v| list.iter().any(|m| m.matches(v)))
}

/// One field type: positive list empty or one matches, and no negative one matches.
fn field<T>(pos: &[T], neg: &[T], any: impl Fn(&[T]) -> bool) -> bool {
    (pos.is_empty() || any(pos)) && (neg.is_empty() || !any(neg))
}

fn match_holds(m: &Match, c: &Connection) -> bool {
    // Cheapest and most selective fields first: ports and addresses are integer compares.
    let ns = c.src_identity.as_ref().map(|i| i.namespace.as_str());
    field(&m.destination_ports, &m.not_destination_ports, |l| l.contains(&c.dst_port))
        && field(&m.destination_ips, &m.not_destination_ips, |l| l.iter().any(|cidr| cidr.contains(c.dst_ip)))
        && field(&m.source_ips, &m.not_source_ips, |l| l.iter().any(|cidr| cidr.contains(c.src_ip)))
        && field(&m.namespaces, &m.not_namespaces, |l| string_matches(l, ns))
        && field(&m.service_accounts, &m.not_service_accounts, |l| {
            c.src_identity.as_ref().is_some_and(|i| {
                l.iter().any(|sa| sa.namespace == i.namespace && sa.service_account == i.service_account)
            })
        })
        && field(&m.principals, &m.not_principals, |l| principal_matches(l, &c.principals))
}

/// The index of the first matching rule, if any. An indexed policy (`RuleIndex`) tries only the rules that can match.
pub fn policy_matches(p: &Policy, c: &Connection) -> Option<usize> {
    let holds = |rule: &[Vec<Match>]| {
        rule.iter().all(|clause| {
            clause.iter().any(|m| {
                if m.is_empty() {
                    // Istio skips empty matches; in a DENY we treat them as "everything" (fail closed).
                    p.action == Action::Deny
                } else {
                    match_holds(m, c)
                }
            })
        })
    };
    let ns = c.src_identity.as_ref().map(|i| i.namespace.as_str());
    match &p.index {
        Some(index) => index
            .candidates(&c.principals, ns, c.dst_port)
            .into_iter()
            .map(|i| i as usize)
            .find(|&i| holds(&p.rules[i])),
        None => p.rules.iter().position(|rule| holds(rule)),
    }
}

/// One member of a workload's policy set.
pub enum Entry<'a> {
    /// A known policy and how it entered the set: "global", "namespace" or "workload".
    Known(&'static str, &'a Arc<Policy>),
    /// A WORKLOAD_SELECTOR key the workload names that has not arrived.
    Missing(&'a str),
}

/// Where the evaluator finds policies: the state, or the state with candidate policies laid over it (the policy
/// impact preview, preview.rs). One evaluator judges both; the state's own lookups cost what they always did.
pub trait Policies {
    /// The GLOBAL policies, in key order.
    fn global(&self) -> impl Iterator<Item = &Arc<Policy>>;
    /// The NAMESPACE policies of `namespace`, in key order.
    fn of_namespace<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = &'a Arc<Policy>>;
    /// The policy of a `namespace/name` key.
    fn by_key(&self, key: &str) -> Option<&Arc<Policy>>;
    /// WORKLOAD_SELECTOR policies that select `w` although `w` does not name them (a previewed new policy and the
    /// workloads it is to select); the state has none.
    fn also_selecting<'a>(&'a self, _w: &'a Workload) -> impl Iterator<Item = &'a Arc<Policy>> {
        std::iter::empty()
    }
}

impl Policies for State {
    fn global(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.global_policies().iter()
    }

    fn of_namespace<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = &'a Arc<Policy>> {
        self.namespace_policies(namespace).iter()
    }

    fn by_key(&self, key: &str) -> Option<&Arc<Policy>> {
        self.policy(key)
    }
}

/// The policies that apply to `w`, in evaluation order, without allocating keys.
pub fn policy_set<'a, P: Policies>(policies: &'a P, w: &'a Workload) -> impl Iterator<Item = Entry<'a>> + 'a {
    let global = policies.global().map(|p| Entry::Known("global", p));
    let ns = policies.of_namespace(&w.namespace).map(|p| Entry::Known("namespace", p));
    let selected = w.authorization_policies.iter().filter_map(move |key| match policies.by_key(key) {
        // A selector naming a global or namespace policy would count it twice; the scope decides membership.
        Some(p) if p.scope != crate::state::policy::Scope::WorkloadSelector => None,
        Some(p) => Some(Entry::Known("workload", p)),
        None => Some(Entry::Missing(key.as_str())),
    });
    let also = policies.also_selecting(w).map(|p| Entry::Known("workload", p));
    global.chain(ns).chain(selected).chain(also)
}

fn missing_decision(key: &str) -> Decision {
    Decision {
        allowed: false,
        reason: format!("policy {key} is referenced by the workload but not known yet (fail closed)"),
        policy: Some(key.to_string()),
        rule: None,
    }
}

fn final_decision(have_allow: bool, deny: Option<(String, usize)>, allow: Option<(String, usize)>) -> Decision {
    if let Some((key, rule)) = deny {
        Decision { allowed: false, reason: format!("explicitly denied by: {key}"), policy: Some(key), rule: Some(rule) }
    } else if !have_allow {
        Decision { allowed: true, reason: "no allow policies, allow".into(), policy: None, rule: None }
    } else if let Some((key, rule)) = allow {
        Decision { allowed: true, reason: format!("allowed by: {key}"), policy: Some(key), rule: Some(rule) }
    } else {
        Decision { allowed: false, reason: "allow policies exist, but none allowed".into(), policy: None, rule: None }
    }
}

/// The decision with every policy considered (for `/debug/authorize`). Same answer as `authorize`: the first
/// entry, in evaluation order, that is a missing policy or a matching enforced DENY decides; then the ALLOWs.
pub fn explain(state: &State, w: &Workload, c: &Connection) -> Explanation {
    let mut considered = Vec::new();
    let mut denied: Option<Decision> = None;
    let mut allow: Option<(String, usize)> = None;
    let mut have_allow = false;
    for entry in policy_set(state, w) {
        let (via, p) = match entry {
            Entry::Missing(key) => {
                denied.get_or_insert_with(|| missing_decision(key));
                considered.push(Considered {
                    policy: key.to_string(),
                    action: Action::Deny,
                    dry_run: false,
                    via: "workload",
                    matched_rule: None,
                    known: false,
                });
                continue;
            }
            Entry::Known(via, p) => (via, p),
        };
        let matched = policy_matches(p, c);
        considered.push(Considered {
            policy: p.key(),
            action: p.action,
            dry_run: p.dry_run,
            via,
            matched_rule: matched,
            known: true,
        });
        if p.dry_run {
            continue;
        }
        match (p.action, matched) {
            (Action::Deny, Some(rule)) => {
                denied.get_or_insert_with(|| final_decision(false, Some((p.key(), rule)), None));
            }
            (Action::Allow, m) => {
                have_allow = true;
                if let (Some(rule), None) = (m, &allow) {
                    allow = Some((p.key(), rule));
                }
            }
            _ => {}
        }
    }
    let decision = denied.unwrap_or_else(|| final_decision(have_allow, None, allow));
    Explanation { decision, considered }
}

/// The re-evaluation of a live connection: `authorize`, except that a missing policy still within its grace
/// period (`in_grace(key)`) defers the verdict instead of denying. A matching enforced DENY among the known
/// policies still decides at once: the final set contains it too, so the connection is denied whatever arrives.
pub enum LiveDecision {
    Decided(Decision),
    /// Not judged yet: this missing policy may still arrive.
    Deferred(String),
}

/// Generic over where policies are found: re-evaluation passes the state, the preview the state with its candidates
/// laid over it, so a preview is judged by this very function.
pub fn authorize_live<P: Policies>(
    policies: &P,
    w: &Workload,
    c: &Connection,
    in_grace: impl FnMut(&str) -> bool,
) -> LiveDecision {
    evaluate(policies, w, c, in_grace, true)
}

/// The decision alone: the per-connection path (one pass, no explanation, keys formatted only for the decider).
/// A missing policy denies.
pub fn authorize(state: &State, w: &Workload, c: &Connection) -> Decision {
    match evaluate(state, w, c, |_| false, false) {
        LiveDecision::Decided(d) => d,
        LiveDecision::Deferred(key) => missing_decision(&key),
    }
}

fn evaluate<P: Policies>(
    policies: &P,
    w: &Workload,
    c: &Connection,
    mut in_grace: impl FnMut(&str) -> bool,
    live: bool,
) -> LiveDecision {
    let mut deferred: Option<&str> = None;
    let mut have_allow = false;
    let mut allow: Option<(&Arc<Policy>, usize)> = None;
    for entry in policy_set(policies, w) {
        let p = match entry {
            Entry::Missing(key) if in_grace(key) => {
                deferred.get_or_insert(key);
                continue;
            }
            Entry::Missing(key) => {
                let mut d = missing_decision(key);
                if live {
                    d.reason =
                        format!("policy {key} is referenced by the workload but did not arrive in time (fail closed)");
                }
                return LiveDecision::Decided(d);
            }
            Entry::Known(_, p) => p,
        };
        if p.dry_run {
            continue;
        }
        match p.action {
            Action::Deny => {
                if let Some(rule) = policy_matches(p, c) {
                    return LiveDecision::Decided(final_decision(false, Some((p.key(), rule)), None));
                }
            }
            Action::Allow => {
                have_allow = true;
                if allow.is_none() {
                    allow = policy_matches(p, c).map(|rule| (p, rule));
                }
            }
        }
    }
    match deferred {
        Some(key) => LiveDecision::Deferred(key.to_string()),
        None => LiveDecision::Decided(final_decision(have_allow, None, allow.map(|(p, rule)| (p.key(), rule)))),
    }
}

/// Dry-run policies that would have changed the decision's outcome are reported, never enforced.
pub fn dry_run_matches<'a>(
    state: &'a State,
    w: &'a Workload,
    c: &'a Connection,
) -> impl Iterator<Item = (String, Action)> + 'a {
    policy_set(state, w).filter_map(move |e| match e {
        Entry::Known(_, p) if p.dry_run && policy_matches(p, c).is_some() => Some((p.key(), p.action)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    //! The decision table. Rows marked "Istio" follow ztunnel's `rbac.rs`/`assert_rbac` semantics; rows marked
    //! "stricter" are ztunnel-node's documented fail-closed cases.
    use super::*;
    use crate::state::StateDelta;
    use serde_json::{json, Value};

    const DST: &str = "10.0.0.10";

    fn state_with(policies: Value, workload_policies: &[&str]) -> State {
        let mut st = State::default();
        let delta = json!({
            "workloads": [{"uid": "dst", "name": "echo", "namespace": "ns1", "serviceAccount": "echo",
                           "workloadIps": [DST], "protocol": "HBONE", "authorizationPolicies": workload_policies}],
            "policies": policies,
        });
        st.apply(serde_json::from_value::<StateDelta>(delta).unwrap()).unwrap();
        st
    }

    fn mtls(ns: &str, sa: &str, src_ip: &str, port: u16) -> Connection {
        Connection::new(
            Some(Identity::new("cluster.local", ns, sa)),
            src_ip.parse().unwrap(),
            DST.parse().unwrap(),
            port,
        )
    }

    fn plaintext(src_ip: &str, port: u16) -> Connection {
        Connection::new(None, src_ip.parse().unwrap(), DST.parse().unwrap(), port)
    }

    fn policy(name: &str, action: &str, m: Value) -> Value {
        json!({"name": name, "namespace": "ns1", "scope": "Namespace", "action": action, "rules": [[[m]]]})
    }

    fn decide(st: &State, c: &Connection) -> bool {
        let w = st.workload("dst").unwrap();
        let d = authorize(st, w, c);
        // The explain path must agree with enforcement on every row.
        assert_eq!(explain(st, w, c).decision, d, "explain and authorize disagree");
        d.allowed
    }

    /// TRUST_DOMAINS: a principal in the destination's trust domain, an alias or `cluster.local` matches a peer of
    /// any of them (ALLOW and DENY alike); another trust domain only as written; no aliases, ztunnel's exact match.
    #[test]
    fn principals_match_across_trust_domain_aliases() {
        use crate::identity::TrustDomains;
        let aliases = TrustDomains::new(vec!["old.td".into()]);
        let peer = |td: &str| {
            Connection::new(
                Some(Identity::new(td, "ns2", "sleep")),
                "10.1.0.5".parse().unwrap(),
                DST.parse().unwrap(),
                80,
            )
        };
        let allow = |principal: &str| {
            state_with(json!([policy("p", "Allow", json!({"principals": [{"exact": principal}]}))]), &[])
        };
        // (principal, peer trust domain, with aliases?, allowed?)
        let rows = [
            ("new.td/ns/ns2/sa/sleep", "old.td", true, true),
            ("old.td/ns/ns2/sa/sleep", "new.td", true, true),
            ("cluster.local/ns/ns2/sa/sleep", "old.td", true, true),
            ("new.td/ns/ns2/sa/sleep", "old.td", false, false),
            ("other.td/ns/ns2/sa/sleep", "old.td", true, false),
            ("new.td/ns/ns2/sa/admin", "old.td", true, false),
            ("new.td/ns/ns2/sa/sleep", "other.td", true, false),
        ];
        for (principal, td, with, want) in rows {
            let c = if with { peer(td).with_trust_domains(&aliases, "new.td") } else { peer(td) };
            assert_eq!(decide(&allow(principal), &c), want, "{principal} vs a peer of {td} (aliases: {with})");
        }
        // A DENY written in the old domain still stops the peer that moved to the new one.
        let deny =
            state_with(json!([policy("d", "Deny", json!({"principals": [{"exact": "old.td/ns/ns2/sa/sleep"}]}))]), &[]);
        assert!(!decide(&deny, &peer("new.td").with_trust_domains(&aliases, "new.td")));
        let not = state_with(
            json!([policy("n", "Deny", json!({"notPrincipals": [{"exact": "old.td/ns/ns2/sa/sleep"}]}))]),
            &[],
        );
        assert!(
            decide(&not, &peer("new.td").with_trust_domains(&aliases, "new.td")),
            "notPrincipals sees the alias too"
        );
    }

    /// One ALLOW policy with one match; (match, connection, allowed?) for every field and its not_ form.
    #[test]
    fn every_field_and_its_negation() {
        let a = mtls("ns2", "sleep", "10.1.0.5", 8080);
        let p = plaintext("10.1.0.5", 8080);
        let rows: Vec<(&str, Value, &Connection, bool)> = vec![
            ("namespaces exact hit", json!({"namespaces": [{"exact": "ns2"}]}), &a, true),
            ("namespaces exact miss", json!({"namespaces": [{"exact": "ns3"}]}), &a, false),
            ("notNamespaces hit", json!({"notNamespaces": [{"exact": "ns2"}]}), &a, false),
            ("notNamespaces miss", json!({"notNamespaces": [{"exact": "ns3"}]}), &a, true),
            (
                "principals exact (no spiffe://)",
                json!({"principals": [{"exact": "cluster.local/ns/ns2/sa/sleep"}]}),
                &a,
                true,
            ),
            ("principals prefix", json!({"principals": [{"prefix": "cluster.local/ns/ns2/"}]}), &a, true),
            ("principals suffix", json!({"principals": [{"suffix": "/sa/sleep"}]}), &a, true),
            ("principals suffix miss", json!({"principals": [{"suffix": "/sa/other"}]}), &a, false),
            ("principals presence", json!({"principals": [{"presence": true}]}), &a, true),
            ("notPrincipals exact", json!({"notPrincipals": [{"exact": "cluster.local/ns/ns2/sa/sleep"}]}), &a, false),
            (
                "serviceAccounts hit",
                json!({"serviceAccounts": [{"namespace": "ns2", "serviceAccount": "sleep"}]}),
                &a,
                true,
            ),
            (
                "serviceAccounts other ns",
                json!({"serviceAccounts": [{"namespace": "ns1", "serviceAccount": "sleep"}]}),
                &a,
                false,
            ),
            (
                "notServiceAccounts hit",
                json!({"notServiceAccounts": [{"namespace": "ns2", "serviceAccount": "sleep"}]}),
                &a,
                false,
            ),
            ("sourceIps hit", json!({"sourceIps": ["10.1.0.0/16"]}), &a, true),
            ("sourceIps miss", json!({"sourceIps": ["10.2.0.0/16"]}), &a, false),
            ("notSourceIps hit", json!({"notSourceIps": ["10.1.0.5/32"]}), &a, false),
            ("destinationIps hit", json!({"destinationIps": ["10.0.0.0/24"]}), &a, true),
            ("notDestinationIps hit", json!({"notDestinationIps": ["10.0.0.10/32"]}), &a, false),
            ("destinationPorts hit", json!({"destinationPorts": [8080]}), &a, true),
            ("destinationPorts miss", json!({"destinationPorts": [9090]}), &a, false),
            ("notDestinationPorts hit", json!({"notDestinationPorts": [8080]}), &a, false),
            ("fields AND together", json!({"namespaces": [{"exact": "ns2"}], "destinationPorts": [9090]}), &a, false),
            // Istio: plaintext has no identity and never matches a principal, namespace or service account, not even
            // presence; so a negative list of them never excludes plaintext.
            ("plaintext vs principals presence", json!({"principals": [{"presence": true}]}), &p, false),
            ("plaintext vs namespaces prefix \"\"", json!({"namespaces": [{"prefix": ""}]}), &p, false),
            (
                "plaintext vs serviceAccounts",
                json!({"serviceAccounts": [{"namespace": "ns2", "serviceAccount": "sleep"}]}),
                &p,
                false,
            ),
            ("plaintext vs notPrincipals presence", json!({"notPrincipals": [{"presence": true}]}), &p, true),
            ("plaintext vs sourceIps", json!({"sourceIps": ["10.1.0.5"]}), &p, true),
        ];
        for (name, m, c, want) in rows {
            let st = state_with(json!([policy("allow", "Allow", m)]), &[]);
            assert_eq!(decide(&st, c), want, "{name}");
        }
    }

    #[test]
    fn istio_evaluation_order_and_actions() {
        let c = mtls("ns2", "sleep", "10.1.0.5", 8080);
        let ns2 = json!({"namespaces": [{"exact": "ns2"}]});
        let ns3 = json!({"namespaces": [{"exact": "ns3"}]});
        // Istio: no policies → allow.
        assert!(decide(&state_with(json!([]), &[]), &c));
        // Istio: only a non-matching DENY → allow (no ALLOW policies).
        assert!(decide(&state_with(json!([policy("d", "Deny", ns3.clone())]), &[]), &c));
        // Istio: a matching DENY wins over a matching ALLOW.
        assert!(!decide(
            &state_with(json!([policy("a", "Allow", ns2.clone()), policy("d", "Deny", ns2.clone())]), &[]),
            &c
        ));
        // Istio: ALLOW policies exist and none match → deny.
        assert!(!decide(&state_with(json!([policy("a", "Allow", ns3.clone())]), &[]), &c));
        // Istio: any one of several ALLOWs suffices.
        assert!(decide(
            &state_with(json!([policy("a1", "Allow", ns3.clone()), policy("a2", "Allow", ns2.clone())]), &[]),
            &c
        ));
        let w_st = state_with(json!([policy("a1", "Allow", ns3.clone()), policy("a2", "Allow", ns2.clone())]), &[]);
        let d = authorize(&w_st, w_st.workload("dst").unwrap(), &c);
        assert_eq!((d.policy.as_deref(), d.rule), (Some("ns1/a2"), Some(0)));
    }

    #[test]
    fn istio_dry_run_is_never_enforced() {
        let c = mtls("ns2", "sleep", "10.1.0.5", 8080);
        let mut deny = policy("d", "Deny", json!({"namespaces": [{"exact": "ns2"}]}));
        deny["dryRun"] = json!(true);
        let st = state_with(json!([deny]), &[]);
        assert!(decide(&st, &c));
        assert_eq!(dry_run_matches(&st, st.workload("dst").unwrap(), &c).count(), 1);
        // A dry-run ALLOW does not create the "allow policies exist" condition either.
        let mut allow = policy("a", "Allow", json!({"namespaces": [{"exact": "ns3"}]}));
        allow["dryRun"] = json!(true);
        assert!(decide(&state_with(json!([allow]), &[]), &c));
    }

    #[test]
    fn rules_clauses_and_empty_structures() {
        let c = mtls("ns2", "sleep", "10.1.0.5", 8080);
        let ns2 = json!({"namespaces": [{"exact": "ns2"}]});
        let port9 = json!({"destinationPorts": [9090]});
        let mk = |action: &str, rules: Value| json!([{"name": "p", "namespace": "ns1", "scope": "Namespace", "action": action, "rules": rules}]);
        // Istio: a policy with no rules never matches: an ALLOW with no rules denies everything.
        assert!(!decide(&state_with(mk("Allow", json!([])), &[]), &c));
        assert!(decide(&state_with(mk("Deny", json!([])), &[]), &c));
        // Istio: a rule with no clauses matches everything.
        assert!(decide(&state_with(mk("Allow", json!([[]])), &[]), &c));
        assert!(!decide(&state_with(mk("Deny", json!([[]])), &[]), &c));
        // Istio: rules OR, clauses AND, matches within a clause OR.
        assert!(decide(&state_with(mk("Allow", json!([[[port9.clone()]], [[ns2.clone()]]])), &[]), &c), "any rule");
        assert!(!decide(&state_with(mk("Allow", json!([[[ns2.clone()], [port9.clone()]]])), &[]), &c), "all clauses");
        assert!(decide(&state_with(mk("Allow", json!([[[port9.clone(), ns2.clone()]]])), &[]), &c), "any match");
        // Istio: empty matches are skipped in an ALLOW (what istiod sends for L7-only ALLOW rules: never matches).
        assert!(!decide(&state_with(mk("Allow", json!([[[{}]]])), &[]), &c));
        assert!(decide(&state_with(mk("Allow", json!([[[{}, ns2.clone()]]])), &[]), &c));
        // Stricter than ztunnel (istio#61126): a DENY whose rule has only empty matches (an L7-only DENY) denies.
        assert!(!decide(&state_with(mk("Deny", json!([[[{}]]])), &[]), &c));
    }

    #[test]
    fn scopes_decide_membership() {
        let c = mtls("ns2", "sleep", "10.1.0.5", 8080);
        let deny_all = json!([[[{}]]]);
        let p = |name: &str, ns: &str, scope: &str| json!({"name": name, "namespace": ns, "scope": scope, "action": "Deny", "rules": deny_all});
        // Istio: GLOBAL applies to every workload, whatever its namespace field.
        assert!(!decide(&state_with(json!([p("g", "istio-system", "Global")]), &[]), &c));
        // Istio: NAMESPACE applies to the workloads of its namespace only.
        assert!(!decide(&state_with(json!([p("n", "ns1", "Namespace")]), &[]), &c));
        assert!(decide(&state_with(json!([p("n", "other", "Namespace")]), &[]), &c));
        // Istio: WORKLOAD_SELECTOR applies only when the workload names it.
        assert!(decide(&state_with(json!([p("w", "ns1", "WorkloadSelector")]), &[]), &c));
        assert!(!decide(&state_with(json!([p("w", "ns1", "WorkloadSelector")]), &["ns1/w"]), &c));
    }

    #[test]
    fn stricter_a_named_policy_that_has_not_arrived_denies() {
        let c = mtls("ns2", "sleep", "10.1.0.5", 8080);
        let st = state_with(json!([]), &["ns1/not-yet"]);
        let w = st.workload("dst").unwrap();
        let d = authorize(&st, w, &c);
        assert!(!d.allowed);
        assert_eq!(d.policy.as_deref(), Some("ns1/not-yet"));
        assert!(d.reason.contains("not known"), "{}", d.reason);
        let e = explain(&st, w, &c);
        assert!(e.considered.iter().any(|p| p.policy == "ns1/not-yet" && !p.known));
    }

    #[test]
    fn strict_peer_authentication_equivalent_denies_plaintext_only() {
        // Istio converts STRICT PeerAuthentication to DENY notPrincipals:[presence].
        let strict = json!([{"name": "istio_converted_static_strict", "namespace": "ns1", "scope": "Namespace",
            "action": "Deny", "rules": [[[{"notPrincipals": [{"presence": true}]}]]]}]);
        let st = state_with(strict, &[]);
        assert!(!decide(&st, &plaintext("10.1.0.5", 8080)));
        assert!(decide(&st, &mtls("ns2", "sleep", "10.1.0.5", 8080)));
    }

    #[test]
    fn bad_policies_are_rejected_with_their_name() {
        let mut st = State::default();
        let bad = json!({"policies": [{"name": "p", "namespace": "ns", "scope": "Namespace", "action": "Allow",
            "rules": [[[{"sourceIps": ["10.0.0.0/40"]}]]]}]});
        let err = st.apply(serde_json::from_value(bad).unwrap()).unwrap_err().to_string();
        assert!(err.contains("ns/p") && err.contains("CIDR"), "{err}");
        let bad_port = json!({"policies": [{"name": "q", "namespace": "ns", "scope": "Namespace", "action": "Allow",
            "rules": [[[{"destinationPorts": [70000]}]]]}]});
        assert!(st.apply(serde_json::from_value(bad_port).unwrap()).is_err());
    }

    /// The rule index (`RuleIndex`) only skips rules that cannot match: for random policies of 16 to 40 rules (indexed)
    /// the first matching rule is the one a scan of every rule finds, for random connections, mTLS and plaintext,
    /// with and without trust-domain aliases.
    #[test]
    fn indexed_rules_decide_as_a_scan() {
        use crate::identity::TrustDomains;
        use crate::state::policy::PolicyJson;
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};

        let names = ["a", "b", "c"];
        let string_match = prop_oneof![
            4 => (0..3usize).prop_map(move |i| json!({"exact": names[i]})),
            1 => (0..3usize).prop_map(move |i| json!({"prefix": names[i]})),
            1 => Just(json!({"presence": true})),
        ];
        let principal = prop_oneof![
            4 => (0..3usize, 0..3usize, 0..2usize).prop_map(move |(n, a, td)| {
                json!({"exact": format!("{}/ns/{}/sa/{}", ["cluster.local", "old.td"][td], names[n], names[a])})
            }),
            1 => Just(json!({"suffix": "/sa/a"})),
        ];
        let one_match = (
            prop::collection::vec(principal.clone(), 0..3),
            prop::collection::vec(principal, 0..2),
            prop::collection::vec(string_match.clone(), 0..3),
            prop::collection::vec(string_match, 0..2),
            prop::collection::vec(80u32..84, 0..3),
            prop::collection::vec(80u32..84, 0..2),
        )
            .prop_map(|(p, np, n, nn, port, nport)| {
                json!({"principals": p, "notPrincipals": np, "namespaces": n, "notNamespaces": nn,
                       "destinationPorts": port, "notDestinationPorts": nport})
            });
        let rule = prop::collection::vec(prop::collection::vec(one_match, 0..3), 0..3);
        let policy = (prop::collection::vec(rule, 16..40), prop::bool::ANY);
        let conn = (prop::option::of((0..3usize, 0..3usize, 0..2usize)), 80u16..84);
        let mut runner = TestRunner::new(Config { cases: 300, ..Config::default() });
        runner
            .run(&(policy, prop::collection::vec(conn, 8)), |((rules, deny), conns)| {
                let json = json!({"name": "p", "namespace": "ns1", "scope": "Namespace",
                                  "action": if deny { "Deny" } else { "Allow" }, "rules": rules});
                let indexed = serde_json::from_value::<PolicyJson>(json).unwrap().validate().unwrap();
                prop_assert!(indexed.index.is_some(), "a policy of 16 rules or more is indexed");
                let mut scanned = indexed.clone();
                scanned.index = None;
                let aliases = TrustDomains::new(vec!["old.td".into()]);
                for (peer, port) in conns {
                    let id = peer.map(|(n, a, td)| Identity::new(["cluster.local", "old.td"][td], names[n], names[a]));
                    let c = Connection::new(id, "10.1.0.5".parse().unwrap(), DST.parse().unwrap(), port);
                    for c in [c.clone(), c.with_trust_domains(&aliases, "cluster.local")] {
                        prop_assert_eq!(policy_matches(&indexed, &c), policy_matches(&scanned, &c), "{:?}", c);
                    }
                }
                Ok(())
            })
            .unwrap();
    }
}
