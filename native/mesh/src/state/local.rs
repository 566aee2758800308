//! The local config file (LOCAL_XDS_PATH / LOCAL_XDS) read straight into the state model, judged by the records'
//! own serde shapes: `Workload` and `Service` (state/model.rs) are the schema of its `workloads` and `services`, as
//! they are of a JSON delta; nothing else lists their fields. The YAML is read by `yaml::de` (a serde Deserializer
//! over saphyr-parser's events: no tree, no JSON in between; a 100k-workload file of 51 MiB used to take about 20 s
//! through YAML → JSON → JavaScript objects → zod → JSON deltas). Only the `policies` part is handed back, as JSON, for
//! the control side's schema and policy compiler (ts/config/local.ts, ts/policy/compile.ts: policies are compiled
//! there), about 1% of a file.
//!
//! A document with problems is refused whole, with every record's first problem (at most `MAX_PROBLEMS` listed),
//! each named by its path in the document: `workloads[1].workloadIps[0]: "300.1.1.1" is not an IP address`. A
//! syntax error ends the reading (`line L, column C: invalid YAML: ...`). Rules a record type does not hold for
//! every source are the local file's own (`local_rules`): a workload names itself and its namespace, a uid or a
//! service key is given once in a document.
//!
//! A document read here is held in a process-wide slot (`stash`) until the dataplane applies it
//! (`Dataplane::apply_local`): the reading happens on the loader's worker thread, which has no dataplane handle.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};

use serde::Deserialize;

use super::{Service, ServiceKey, StateError, Workload};
use crate::yaml::de::{self, path_key, Deserializer};

/// A local document's workloads and services, validated, and its policies as written (JSON, for the control side).
#[derive(Debug, Default)]
pub struct LocalDocument {
    pub workloads: Vec<Workload>,
    pub services: Vec<Service>,
    /// The `policies` list as JSON text (`[]` when absent), for the control side's schema.
    pub policies_json: String,
}

/// At most this many problems are listed, the rest counted: a file with 100k errors is refused in a screenful, not
/// in 100k lines (issue 29).
pub const MAX_PROBLEMS: usize = 100;

/// A refused document: its problems (`path: problem`, at most `MAX_PROBLEMS`), and how many there are in all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refused {
    pub problems: Vec<String>,
    pub total: usize,
}

impl Refused {
    fn add(&mut self, problem: String) {
        self.total += 1;
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(problem);
        }
    }

    fn absorb(&mut self, other: Refused) {
        let room = MAX_PROBLEMS - self.problems.len();
        self.problems.extend(other.problems.into_iter().take(room));
        self.total += other.total;
    }
}

/// The records read from a list, in order, and the index of each in the list (a refused record leaves a gap).
struct Indexed<T> {
    records: Vec<T>,
    at: Vec<usize>,
}

impl<T> Default for Indexed<T> {
    fn default() -> Self {
        Indexed { records: Vec::new(), at: Vec::new() }
    }
}

impl<T> Indexed<T> {
    fn push(&mut self, i: usize, record: T) {
        self.records.push(record);
        self.at.push(i);
    }

    /// The records of the next piece of the list.
    fn extend(&mut self, next: Indexed<T>) {
        self.records.extend(next.records);
        self.at.extend(next.at);
    }

    fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.at.iter().copied().zip(&self.records)
    }
}

/// What the reading collected: the records read (each validated), the policies, the problems.
#[derive(Default)]
struct Parsed {
    workloads: Indexed<Workload>,
    services: Indexed<Service>,
    policies: Option<serde_json::Value>,
    refused: Refused,
    /// The reading stopped at a syntax error (`refused` holds only it).
    stopped: bool,
}

impl LocalDocument {
    /// YAML text → validated records, or the document's problems.
    pub fn from_yaml(text: &str) -> Result<LocalDocument, Refused> {
        Self::from_yaml_split(text, SPLIT_AT)
    }

    /// `from_yaml`, reading a document of at least `split_at` bytes in parallel pieces when its layout allows it
    /// (`sections`).
    pub fn from_yaml_split(text: &str, split_at: usize) -> Result<LocalDocument, Refused> {
        if let Err(e) = crate::yaml::check_nesting(text) {
            return Err(Refused { problems: vec![e], total: 1 });
        }
        let parsed = match text.len() >= split_at {
            true => match sections(text) {
                // A piece that cannot be read is read again as part of the whole, whose syntax error then says
                // where it is in the document, not in the piece.
                Some(sections) => from_sections(text, sections).unwrap_or_else(|| whole(text)),
                None => whole(text),
            },
            false => whole(text),
        };
        parsed.checked()
    }
}

/// The document read in one piece.
fn whole(text: &str) -> Parsed {
    let mut doc = Parsed::default();
    let mut de = Deserializer::new(text);
    let read = de.document(|de| {
        de.map(|de, key| {
            let at = de.mark();
            let read = match &*key {
                "workloads" => items(de, "workloads", 0, &mut doc.workloads, &mut doc.refused, workload),
                "services" => items(de, "services", 0, &mut doc.services, &mut doc.refused, service),
                "policies" => policies(de, &mut doc.refused).map(|p| doc.policies = p),
                other => {
                    doc.refused.add(format!("{other}: unknown field {other:?}"));
                    serde::de::IgnoredAny::deserialize(&mut *de).map(|_| ())
                }
            };
            match read {
                Err(e) if !e.fatal() => {
                    doc.refused.add(format!("{key}: {e}"));
                    de.recover(at)
                }
                other => other,
            }
        })
    });
    match read {
        // A syntax error makes what was read before it moot (a record cut short reads as a type error).
        Err(e) if e.fatal() => {
            doc.refused = Refused { problems: vec![e.to_string()], total: 1 };
            doc.stopped = true;
        }
        Err(e) => doc.refused.add(format!("(document): {e}")),
        Ok(()) => {}
    }
    doc
}

/// The pieces of a large document, read in parallel (`sections`); None when one of them stopped at a syntax error.
fn from_sections(text: &str, s: Sections<'_>) -> Option<Parsed> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
    let workloads = pieces(text, &s.workloads, threads);
    let services = pieces(text, &s.services, threads);
    std::thread::scope(|scope| {
        let w: Vec<_> =
            workloads.into_iter().map(|(t, base)| scope.spawn(move || piece(t, "workloads", base, workload))).collect();
        let sv: Vec<_> =
            services.into_iter().map(|(t, base)| scope.spawn(move || piece(t, "services", base, service))).collect();
        let mut doc = match s.policies {
            Some(t) => whole(t),
            None => Parsed::default(),
        };
        // A reader that panicked is a piece that was not read: the whole document is then read in one.
        for h in w {
            let (records, refused) = h.join().ok()??;
            doc.workloads.extend(records);
            doc.refused.absorb(refused);
        }
        for h in sv {
            let (records, refused) = h.join().ok()??;
            doc.services.extend(records);
            doc.refused.absorb(refused);
        }
        (!doc.stopped).then_some(doc)
    })
}

/// One piece: consecutive items of one list, the first of them item `base`; None when it stopped at a syntax error.
fn piece<T>(text: &str, list: &str, base: usize, read: Read<T>) -> Option<(Indexed<T>, Refused)> {
    let mut out = Indexed::default();
    let mut refused = Refused::default();
    let mut de = Deserializer::new(text);
    de.document(|de| items(de, list, base, &mut out, &mut refused, read)).ok()?;
    Some((out, refused))
}

/// A record read from the deserializer, or its problem: (path inside the record, problem, whether the reading must
/// stop: a syntax error).
type Read<T> = for<'a> fn(&mut Deserializer<'a>) -> Result<T, (String, String, bool)>;

/// The items of a list (`list[base]` onwards), each read by `read`; a bad item is reported and skipped.
fn items<T>(
    de: &mut Deserializer<'_>,
    list: &str,
    base: usize,
    out: &mut Indexed<T>,
    refused: &mut Refused,
    read: Read<T>,
) -> Result<(), de::Error> {
    let mut i = base;
    de.seq(|de| {
        let at = de.mark();
        match read(de) {
            Ok(record) => out.push(i, record),
            Err((_, problem, true)) => return Err(de::Error::stop(problem)),
            Err((path, problem, false)) => {
                refused.add(format!("{list}[{i}]{path}: {problem}"));
                de.recover(at)?;
            }
        }
        i += 1;
        Ok(())
    })
}

/// A record by its serde shape, its problem named by its path inside the record.
fn record<'a, T: Deserialize<'a>>(de: &mut Deserializer<'a>) -> Result<T, (String, String, bool)> {
    T::deserialize(&mut *de).map_err(|e| {
        let (path, fatal, message) = (e.path().to_string(), e.fatal(), e.to_string());
        // serde's wording for the two commonest slips, in the words the rest of the messages use.
        if let Some(field) = message.strip_prefix("missing field `").and_then(|m| m.strip_suffix('`')) {
            return (path_key(&path, field), "missing required field".into(), fatal);
        }
        if let Some(rest) = message.strip_prefix("unknown field `") {
            let field = rest.split('`').next().unwrap_or_default();
            return (path, format!("unknown field {field:?}"), fatal);
        }
        (path, message, fatal)
    })
}

/// A record's validation problem; one that names its field first (`canonicalName: ...`) is put at that field's path.
fn invalid(e: StateError) -> (String, String, bool) {
    let problem = match e {
        StateError::Invalid { problem, .. } => problem,
        other => other.to_string(),
    };
    match problem.split_once(": ") {
        Some((field, rest)) if !field.is_empty() && field.split('.').all(|f| path_key("", f).starts_with('.')) => {
            (format!(".{field}"), rest.to_string(), false)
        }
        _ => (String::new(), problem, false),
    }
}

/// The local file's rule beyond the record's: a record names itself (WDS's records are istiod's, which always do).
fn named(fields: [(&str, &str); 3]) -> Result<(), (String, String, bool)> {
    match fields.iter().find(|(_, v)| v.is_empty()) {
        Some((field, _)) => Err((format!(".{field}"), "must not be empty".into(), false)),
        None => Ok(()),
    }
}

fn workload(de: &mut Deserializer<'_>) -> Result<Workload, (String, String, bool)> {
    let w: Workload = record(de)?;
    named([("uid", &w.uid), ("name", &w.name), ("namespace", &w.namespace)])?;
    w.validate().map_err(invalid)
}

fn service(de: &mut Deserializer<'_>) -> Result<Service, (String, String, bool)> {
    let s: Service = record(de)?;
    named([("name", &s.name), ("namespace", &s.namespace), ("hostname", &s.hostname)])?;
    s.validate().map_err(invalid)
}

/// `policies`: a list (or null), as JSON for the control side.
fn policies(de: &mut Deserializer<'_>, refused: &mut Refused) -> Result<Option<serde_json::Value>, de::Error> {
    let at = de.mark();
    let value: serde_json::Value = match serde_json::Value::deserialize(&mut *de) {
        Ok(v) => v,
        Err(e) if e.fatal() => return Err(e),
        Err(e) => {
            refused.add(format!("policies{}: {e}", e.path()));
            de.recover(at)?;
            return Ok(None);
        }
    };
    match value {
        serde_json::Value::Null => Ok(None),
        v @ serde_json::Value::Array(_) => Ok(Some(v)),
        _ => {
            refused.add("policies: expected a list".into());
            Ok(None)
        }
    }
}

impl Parsed {
    /// The whole document's rules: a uid or a service key given twice is refused (naming both places).
    fn checked(mut self) -> Result<LocalDocument, Refused> {
        let mut uids: HashMap<&str, usize> = HashMap::with_capacity(self.workloads.records.len());
        for (i, w) in self.workloads.iter() {
            if let Some(first) = uids.insert(&w.uid, i) {
                self.refused.add(format!("workloads[{i}].uid: duplicate uid {:?} (also workloads[{first}])", &*w.uid));
            }
        }
        let mut keys: HashMap<ServiceKey, usize> = HashMap::with_capacity(self.services.records.len());
        for (i, s) in self.services.iter() {
            if let Some(first) = keys.insert(s.key(), i) {
                self.refused.add(format!("services[{i}]: duplicate service \"{}\" (also services[{first}])", s.key()));
            }
        }
        drop((uids, keys));
        if self.refused.total > 0 {
            return Err(self.refused);
        }
        Ok(LocalDocument {
            workloads: self.workloads.records,
            services: self.services.records,
            policies_json: self.policies.map_or_else(|| "[]".into(), |v| v.to_string()),
        })
    }
}

// ---- reading a large document in pieces ------------------------------------------------------------------------

/// Documents smaller than this are read in one piece (threads cost more than they save).
pub const SPLIT_AT: usize = 4 << 20;

/// A document's top-level sections: the text of the items of `workloads` and `services` (each a block list at
/// column 0, without its key line), and the whole `policies` section (key line included).
struct Sections<'a> {
    workloads: Vec<(usize, usize)>,
    services: Vec<(usize, usize)>,
    policies: Option<&'a str>,
}

/// Splits a document laid out as block YAML at the top level: every line that starts at column 0 is a comment, a
/// section key alone on its line (`workloads:`, `services:`, `policies:`, each once), or a list item (`- `) of the
/// section above it. YAML's indentation rules make such a line the start of a new item of that list (a nested value,
/// a block scalar or a continuation line is indented; quoted and flow values spanning lines are indented too, or the
/// document is not this layout), so the items between two such lines are a document of their own. Anything else (a
/// flow mapping at the top, `---`, a directive, a tab, a key with its value on the same line) gives None: the
/// document is then read in one piece.
fn sections(text: &str) -> Option<Sections<'_>> {
    #[derive(Clone, Copy, PartialEq)]
    enum In {
        Start,
        Workloads,
        Services,
        Policies,
    }
    let mut at = In::Start;
    let mut seen = [false; 3];
    // Per section: byte offsets of its item starts, and of its end.
    let mut items: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
    let mut bounds: [(usize, usize); 3] = [(0, 0); 3];
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let bare = line.strip_suffix('\n').unwrap_or(line);
        let bare = bare.strip_suffix('\r').unwrap_or(bare);
        // A lone CR is a line break to YAML: the lines here would not be the parser's.
        if bare.contains('\r') {
            return None;
        }
        let Some(&first) = bare.as_bytes().first() else { continue };
        match first {
            // A comment may fall outside every piece: it must be one the parser reads (YAML's printable
            // characters), or the pieces would accept what the whole refuses.
            b'#' if bare.chars().all(printable) => continue,
            b'#' => return None,
            // Inside an item (or blank): anywhere else, the lines would belong to no piece.
            b' ' if bare.trim_start_matches(' ').is_empty() || bare.trim_start_matches(' ').starts_with('#') => {
                if !bare.chars().all(printable) {
                    return None;
                }
                continue;
            }
            b' ' => match at {
                In::Workloads if !items[0].is_empty() => continue,
                In::Services if !items[1].is_empty() => continue,
                In::Policies => continue,
                _ => return None,
            },
            b'-' if bare == "-" || bare.starts_with("- ") => match at {
                In::Workloads => items[0].push(start),
                In::Services => items[1].push(start),
                In::Policies => {}
                In::Start => return None,
            },
            _ => {
                let (key, rest) = bare.split_once(':')?;
                // Nothing after the key but a comment, which YAML starts only after a space (`a:#b` is a scalar).
                let comment = rest.starts_with(' ') && rest.trim_start_matches(' ').starts_with('#');
                if !(rest.trim_start_matches(' ').is_empty() || comment) {
                    return None;
                }
                let (i, next) = match key {
                    "workloads" => (0, In::Workloads),
                    "services" => (1, In::Services),
                    "policies" => (2, In::Policies),
                    _ => return None,
                };
                if std::mem::replace(&mut seen[i], true) {
                    return None;
                }
                if let Some(j) = section(at) {
                    bounds[j].1 = start;
                }
                bounds[i] = (start, text.len());
                at = next;
            }
        }
    }
    fn section(at: In) -> Option<usize> {
        match at {
            In::Workloads => Some(0),
            In::Services => Some(1),
            In::Policies => Some(2),
            In::Start => None,
        }
    }
    let ranges = |i: usize| -> Vec<(usize, usize)> {
        let starts = &items[i];
        (0..starts.len()).map(|k| (starts[k], starts.get(k + 1).copied().unwrap_or(bounds[i].1))).collect()
    };
    Some(Sections {
        workloads: ranges(0),
        services: ranges(1),
        policies: seen[2].then(|| &text[bounds[2].0..bounds[2].1]),
    })
}

/// YAML's printable characters (`c-printable`, YAML 1.2 §5.1), what a comment may hold.
fn printable(c: char) -> bool {
    matches!(c, '\t' | '\r' | '\n' | ' '..='~' | '\u{85}' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}')
        || c >= '\u{10000}'
}

/// Groups consecutive items (byte ranges of `text`, each starting where the one before ended) into at most `n`
/// pieces of about equal size, each with the index of its first item.
fn pieces<'a>(text: &'a str, items: &[(usize, usize)], n: usize) -> Vec<(&'a str, usize)> {
    let (Some(first), Some(last)) = (items.first(), items.last()) else { return Vec::new() };
    let per = (last.1 - first.0).div_ceil(n).max(1);
    let mut out = Vec::new();
    let (mut from, mut base) = (first.0, 0);
    for (k, &(_, end)) in items.iter().enumerate() {
        if end - from >= per || k + 1 == items.len() {
            out.push((&text[from..end], base));
            (from, base) = (end, k + 1);
        }
    }
    out
}

// ---- the hand-over slot --------------------------------------------------------------------------------------

struct Slots {
    next: u32,
    held: std::collections::BTreeMap<u32, LocalDocument>,
}

static SLOTS: Mutex<Slots> = Mutex::new(Slots { next: 1, held: std::collections::BTreeMap::new() });

fn slots() -> parking_lot::MutexGuard<'static, Slots> {
    // A panic while holding it cannot leave a slot half-written: take the guard back.
    SLOTS.lock()
}

/// Holds a document until the dataplane applies it; returns its ticket.
pub fn stash(doc: LocalDocument) -> u32 {
    let mut s = slots();
    let id = s.next;
    s.next = s.next.wrapping_add(1).max(1);
    s.held.insert(id, doc);
    id
}

/// Takes a held document (None: unknown ticket, or already taken).
pub fn take(id: u32) -> Option<LocalDocument> {
    slots().held.remove(&id)
}

/// How many documents are held (tests: a discarded load must not leave one behind).
pub fn held() -> usize {
    slots().held.len()
}

/// The keys the last applied local document put in the state: what the next one removes if it lacks them, and what
/// config_dump's `staticConfig` shows.
#[derive(Debug, Default, Clone)]
pub struct LocalKeys {
    pub workloads: HashSet<super::intern::Str>,
    pub services: HashSet<ServiceKey>,
    /// "namespace/name"
    pub policies: HashSet<String>,
}

/// What a local document removes: the keys the last one had and it lacks, as a delta's removal lists.
pub struct LocalRemovals {
    pub workloads: Vec<String>,
    pub services: Vec<String>,
    pub policies: Vec<String>,
}

impl LocalKeys {
    /// The document's workloads and services, and its policies (compiled by the control side, sent beside it).
    pub fn of(doc: &LocalDocument, policies: &[super::policy::Policy]) -> LocalKeys {
        LocalKeys {
            workloads: doc.workloads.iter().map(|w| w.uid.clone()).collect(),
            services: doc.services.iter().map(|s| s.key()).collect(),
            policies: policies.iter().map(|p| p.key()).collect(),
        }
    }

    /// What `self` (the last applied) has and `next` lacks.
    pub fn removed_by(&self, next: &LocalKeys) -> LocalRemovals {
        LocalRemovals {
            workloads: self.workloads.difference(&next.workloads).map(|u| u.to_string()).collect(),
            services: self.services.difference(&next.services).map(|k| k.to_string()).collect(),
            policies: self.policies.difference(&next.policies).cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::LbMode;
    use super::*;

    fn read(yaml: &str) -> Result<LocalDocument, Refused> {
        LocalDocument::from_yaml(yaml)
    }

    /// The one problem of `yaml`.
    fn problem(yaml: &str) -> String {
        match read(yaml) {
            Ok(_) => panic!("accepted: {yaml}"),
            Err(r) => {
                assert_eq!(r.total, 1, "{r:?}");
                r.problems[0].clone()
            }
        }
    }

    #[test]
    fn reads_every_field_and_applies_the_schema_defaults() {
        let doc = read(
            r#"
workloads:
- uid: Kubernetes//Pod/ns/a
  name: a
  namespace: ns
  workloadIps: [10.0.0.1, "fd00::1"]
  protocol: HBONE
  node: n1
  workloadType: Deployment
  locality: {region: r, zone: z}
  services: {"ns/svc.example": {80: 8080, "443": 8443}}
  authorizationPolicies: [ns/p]
  waypoint: {destination: /10.0.0.9}
  applicationTunnel: {protocol: PROXY, port: 15088}
  capacity: 3
services:
- name: svc
  namespace: ns
  hostname: svc.example
  vips: [/11.0.0.1]
  cidrVips: [10.1.0.0/16, net/10.2.0.0/16]
  ports: {80: 0}
  subjectAltNames: [spiffe://cluster.local/ns/ns/sa/a, not-an-identity]
  loadBalancer: {mode: Failover, routingPreferences: [Zone, Node]}
  visibility: ~
policies:
- {name: p, namespace: ns, scope: WorkloadSelector, action: Allow, rules: [[[{principals: [!Exact a, {Prefix: b}]}]]]}
"#,
        )
        .expect("accepted");
        let w = &doc.workloads[0];
        assert_eq!(w.service_account.as_str(), "default");
        assert_eq!(w.trust_domain.as_str(), "cluster.local");
        assert_eq!(w.workload_type.as_str(), "deployment");
        assert_eq!(w.capacity, 3);
        assert_eq!(w.ips.len(), 2);
        assert_eq!(w.locality.zone, "z");
        assert_eq!(w.service_ports[0].1.get(&443), Some(&8443));
        assert_eq!(w.waypoint.as_ref().unwrap().hbone_mtls_port, 15008);
        assert_eq!(w.application_tunnel.as_ref().unwrap().port, Some(15088));
        let zero = read("workloads:\n- {uid: a, name: a, namespace: ns, applicationTunnel: {port: 0}}\n").unwrap();
        assert_eq!(zero.workloads[0].application_tunnel.as_ref().unwrap().port, None, "0 is unset, as WDS reads it");
        let s = &doc.services[0];
        assert_eq!(s.cidr_vips.len(), 2);
        assert_eq!(s.cidr_vips[0].0, "");
        assert_eq!(s.cidr_vips[1].0, "net");
        assert_eq!(s.load_balancer.as_ref().unwrap().mode, LbMode::Failover);
        assert_eq!(s.ports.get(&80), Some(&0));
        assert_eq!(s.subject_alt_names.len(), 1, "the SPIFFE identities among the SANs");
        assert_eq!(s.subject_alt_names_given.len(), 2, "all of them, for config_dump");
        let p: serde_json::Value = serde_json::from_str(&doc.policies_json).unwrap();
        assert_eq!(p[0]["rules"][0][0][0]["principals"], serde_json::json!([{"Exact": "a"}, {"Prefix": "b"}]));
        // Anchors and aliases are YAML: a shared block reads as written out.
        let shared = read(
            "x: &loc {region: r}
",
        )
        .unwrap_err();
        assert_eq!(shared.problems, ["x: unknown field \"x\""]);
        let doc = read("workloads:\n- {uid: a, name: a, namespace: ns, locality: &l {region: r}}\n- {uid: b, name: b, namespace: ns, locality: *l}\n")
            .expect("aliases");
        assert_eq!(doc.workloads[1].locality.region, "r");
    }

    #[test]
    fn empty_documents_are_empty_configs() {
        for text in ["", "~", "---\n", "# nothing\n", "{}", "workloads: ~\n"] {
            let doc = read(text).unwrap_or_else(|e| panic!("{text:?}: {e:?}"));
            assert!(doc.workloads.is_empty() && doc.services.is_empty(), "{text:?}");
            assert_eq!(doc.policies_json, "[]");
        }
    }

    /// The record types are the schema: each problem is named by its path in the document.
    #[test]
    fn refuses_what_the_records_refuse_naming_the_path() {
        let w = |extra: &str| {
            problem(&format!(
                "workloads:\n- {{uid: a, name: a, namespace: ns}}\n- {{uid: b, name: b, namespace: ns{extra}}}\n"
            ))
        };
        for (extra, expected) in [
            (", bogus: 1", "workloads[1].bogus: unknown field \"bogus\""),
            (", workloadIps: [10.0.0.300]", "workloads[1].workloadIps[0]: \"10.0.0.300\" is not an IP address"),
            (", capacity: 1.0", "workloads[1].capacity: invalid type: floating point `1.0`, expected u32"),
            (", capacity: -1", "workloads[1].capacity: invalid value: integer `-1`, expected u32"),
            (", capacity: \"2\"", "workloads[1].capacity: invalid type: string \"2\", expected u32"),
            (", node: 1.5", "workloads[1].node: invalid type: floating point `1.5`, expected a string"),
            (", name: b", "workloads[1]: the key \"name\" is given twice"),
            (", namespace: \"a,b\"", "workloads[1]: the key \"namespace\" is given twice"),
            (", serviceAccount: a/b", "workloads[1].serviceAccount: \"a/b\" has the character \"/\", which cannot go into an identity or a namespace/hostname key"),
            (", canonicalName: \"app,k8s.namespace.name=x\"", "workloads[1].canonicalName: \"app,k8s.namespace.name=x\" has the character \",\", which cannot go into a header"),
            (", workloadType: Pod2", "workloads[1].workloadType: \"Pod2\" is not one of deployment|cronjob|pod|job (any case)"),
            (", protocol: hbone", "workloads[1].protocol: unknown variant `hbone`, expected `HBONE` or `TCP`"),
            (", services: {svc: {80: 80}}", "workloads[1].services: \"svc\" is not <namespace>/<hostname>"),
            (", services: {ns/svc: {80: 80, \"80\": 81}}", "workloads[1].services[\"ns/svc\"]: the key \"80\" is given twice"),
            (", services: {ns/svc: {0: 80}}", "workloads[1].services[\"ns/svc\"]: \"0\" is not a port (1-65535)"),
            (", services: {ns/svc: {80: 70000}}", "workloads[1].services[\"ns/svc\"]: 70000 is not a port (0-65535)"),
            (", waypoint: {hboneMtlsPort: 15008}", "workloads[1].waypoint.destination: missing required field"),
            (", waypoint: {destination: nohost}", "workloads[1].waypoint: \"nohost\" is not <network>/<ip> or <namespace>/<hostname>"),
            (", locality: {area: x}", "workloads[1].locality.area: unknown field \"area\""),
            (", uid: \"\"", "workloads[1]: the key \"uid\" is given twice"),
        ] {
            assert_eq!(w(extra), expected, "{extra}");
        }
        assert_eq!(problem("workloads:\n- {uid: a, name: a}\n"), "workloads[0].namespace: missing required field");
        assert_eq!(
            problem("workloads:\n- {uid: \"\", name: a, namespace: n}\n"),
            "workloads[0].uid: must not be empty"
        );
        assert_eq!(
            problem("workloads:\n- {uid: a, name: a, namespace: ns}\n- {uid: a, name: b, namespace: ns}\n"),
            "workloads[1].uid: duplicate uid \"a\" (also workloads[0])"
        );
        for (text, expected) in [
            (
                "services:\n- {name: s, namespace: ns, hostname: h, vips: [10.0.0.1]}\n",
                "services[0].vips[0]: \"10.0.0.1\" is not <network>/<ip> (e.g. \"/10.0.0.1\")",
            ),
            (
                "services:\n- {name: s, namespace: ns, hostname: h, cidrVips: [10.0.0.0/33]}\n",
                "services[0].cidrVips[0]: \"10.0.0.0/33\" is not a CIDR (e.g. 10.0.0.0/24 or net/10.0.0.0/24)",
            ),
            (
                "services:\n- {name: s, namespace: ns, hostname: h, weightedWaypoints: [{weight: 1}]}\n",
                "services[0].weightedWaypoints[0].waypoint: missing required field",
            ),
            (
                "services:\n- {name: s, namespace: ns, hostname: \"s n\"}\n",
                "services[0].hostname: \"s n\" has the character \" \", which cannot go into a header",
            ),
            (
                "services:\n- {name: s, namespace: ns, hostname: h}\n- {name: t, namespace: ns, hostname: h}\n",
                "services[1]: duplicate service \"ns/h\" (also services[0])",
            ),
            ("workloads: []\nworkloads: []\n", "(document): the key \"workloads\" is given twice"),
            ("other: []\n", "other: unknown field \"other\""),
            ("- a\n", "(document): expected a mapping"),
            ("workloads: 3\n", "workloads: expected a list"),
            ("policies: {}\n", "policies: expected a list"),
            ("--- {}\n--- {}\n", "invalid YAML: more than one document"),
        ] {
            assert_eq!(problem(text), expected, "{text}");
        }
        assert!(problem("workloads: [\n").starts_with("line 2, column 1: invalid YAML: "));
    }

    #[test]
    fn every_bad_record_is_reported_up_to_a_screenful() {
        let mut text = String::from("workloads:\n");
        for i in 0..250 {
            text += &format!("- {{uid: w{i}, name: w{i}, namespace: ns, workloadIps: [x{i}]}}\n");
        }
        text += "- {uid: ok, name: ok, namespace: ns}\n";
        for split_at in [0, usize::MAX] {
            let r = LocalDocument::from_yaml_split(&text, split_at).unwrap_err();
            assert_eq!(r.total, 250);
            assert_eq!(r.problems.len(), MAX_PROBLEMS);
            assert_eq!(r.problems[0], "workloads[0].workloadIps[0]: \"x0\" is not an IP address");
            assert_eq!(r.problems[99], "workloads[99].workloadIps[0]: \"x99\" is not an IP address");
        }
    }

    #[test]
    fn a_document_splits_only_at_top_level_list_items() {
        let text = "# head\nworkloads:\n- {uid: a, name: a, namespace: ns}\n- uid: b\n  name: b\n  namespace: ns\n\n# c\n- {uid: c, name: c, namespace: ns}\nservices:\n- {name: s, namespace: ns, hostname: h}\npolicies:\n- {name: p, scope: Global, action: Allow}\n";
        let s = sections(text).expect("this layout splits");
        let items: Vec<&str> = s.workloads.iter().map(|&(a, b)| &text[a..b]).collect();
        assert_eq!(items.len(), 3);
        assert!(items[1].starts_with("- uid: b\n  name: b") && items[1].ends_with("# c\n"), "{items:?}");
        assert_eq!(s.services.len(), 1);
        assert!(s.policies.unwrap().starts_with("policies:\n"));
        for (pieces_of, n) in [(1, 1), (2, 2), (8, 3)] {
            let p = pieces(text, &s.workloads, pieces_of);
            assert_eq!(p.len(), n, "{pieces_of} pieces");
            let texts: Vec<&str> = p.iter().map(|(t, _)| *t).collect();
            assert_eq!(texts.concat(), text[s.workloads[0].0..s.workloads[2].1], "the pieces are the items, in order");
            assert_eq!(p[0].1, 0, "the first piece starts at item 0");
        }
        // Split and whole give the same document.
        let split = LocalDocument::from_yaml_split(text, 0).expect("split");
        let whole = LocalDocument::from_yaml_split(text, usize::MAX).expect("whole");
        assert_eq!(split.workloads, whole.workloads);
        assert_eq!(split.services, whole.services);
        assert_eq!(split.policies_json, whole.policies_json);
        // CRLF line ends split the same way.
        let crlf = text.replace('\n', "\r\n");
        assert_eq!(sections(&crlf).expect("crlf").workloads.len(), 3);
        // A line that looks like a section key inside a value spanning lines cuts that value in two: the piece before
        // it no longer parses, so the document is refused (never read differently).
        for tricky in [
            "workloads:\n- {uid: \"a\nservices:\", name: a, namespace: ns}\n",
            "workloads:\n- {uid: a, name: a, namespace: ns, authorizationPolicies: [x,\nservices:\n]}\n",
        ] {
            let whole = LocalDocument::from_yaml_split(tricky, usize::MAX);
            match LocalDocument::from_yaml_split(tricky, 0) {
                Err(_) => {}
                Ok(split) => assert_eq!(Some(split.workloads), whole.ok().map(|d| d.workloads), "{tricky:?}"),
            }
        }
        for other in [
            "workloads:\n  - {uid: a, name: a, namespace: ns}\n", // items indented under the key: one piece
            "workloads: []\n",                                    // a value on the key's line
            "{workloads: []}\n",                                  // a flow mapping at the top
            "---\nworkloads:\n- {uid: a, name: a, namespace: ns}\n", // a document marker
            "%YAML 1.2\n---\nworkloads: []\n",                    // a directive
            "workloads:\n- a\nworkloads:\n- b\n",                 // a key twice
            "other:\n- a\n",                                      // an unknown key
            "- a\n",                                              // a list at the top
            "workloads:\n- [a,\nb]\n",                            // a flow value spanning lines
            "workloads:\n- \"a\n\tb\"\n",                         // a tab at column 0
            "# a\u{0}b\nworkloads:\n- a\n",                       // a comment the parser refuses
        ] {
            assert!(sections(other).is_none(), "{other:?}");
        }
    }

    /// A syntax error in a piece is reported where it is in the document (the pieces are read again as one).
    #[test]
    fn a_syntax_error_in_a_piece_says_where_it_is_in_the_document() {
        let mut text = String::from("workloads:\n");
        for i in 0..50 {
            text += &format!("- {{uid: w{i}, name: w{i}, namespace: ns}}\n");
        }
        text += "- {uid: bad, name: [x\nservices:\n- {name: s, namespace: ns, hostname: h}\n";
        let whole = LocalDocument::from_yaml_split(&text, usize::MAX).unwrap_err();
        let split = LocalDocument::from_yaml_split(&text, 0).unwrap_err();
        assert!(sections(&text).is_some(), "this layout is read in pieces");
        assert_eq!(whole.problems.len(), 1);
        assert!(whole.problems[0].starts_with("line 53, "), "{whole:?}");
        assert_eq!(split, whole);
    }

    #[test]
    fn the_slots_hand_a_document_over_once() {
        let id = stash(LocalDocument::default());
        assert!(take(id).is_some());
        assert!(take(id).is_none());
    }
}
