//! The local config file (LOCAL_XDS_PATH / LOCAL_XDS) read straight into the state model: the fast path of a load.
//!
//! A large file (100k workloads, 51 MiB) used to go YAML → JSON text → JavaScript objects → zod → JSON deltas →
//! serde: about 20 s. Here the YAML parser's event stream (saphyr-parser, a maintained pure-Rust YAML 1.2 parser;
//! measured at twice the speed of libyaml-to-a-tree on this file) is read once into the workload and service
//! records, checked by the rules of the control side's schema (ts/config/local.ts), and validated as every other
//! source is. Only the `policies` part is handed back, as JSON, for the control side's schema and policy compiler
//! (about 1% of a file).
//!
//! **The control side's schema stays the judge.** This reader accepts a document only when it is certain the schema
//! would accept it with the same values; anything else — a syntax error, a type or value the schema refuses, and also
//! what the schema might accept but this reader does not model (anchors and aliases, tags, a float where an
//! integer goes, a number written where a string goes) — is *declined* with a short reason, and the control side
//! then loads the document the slow way, which either refuses it with its path-and-field message or accepts it (its
//! records then reach the dataplane as JSON, `LocalDocument::from_json`). Declining costs time, never a different
//! result. The rule for a plain scalar is yaml_serde's (what the slow way parses with): empty and `~`/`null` are null,
//! `true`/`false` (three spellings) are booleans, decimal/hex/octal/binary integers and floats are numbers,
//! everything else is a string; here a plain scalar that any of those rules could read as a number is declined
//! unless it is a plain decimal integer where an integer goes.
//!
//! A document read here (either way) is held in a process-wide slot (`stash`) until the dataplane applies it
//! (`Dataplane::apply_local`): the reading happens on the loader's worker thread, which has no dataplane handle.

use parking_lot::Mutex;
use std::borrow::Cow;
use std::collections::HashSet;
use std::net::IpAddr;

use saphyr_parser::{Event, Parser, ScalarStyle, StrInput};
use serde::Deserialize;

use super::intern::{intern, Str};
use super::model::PortMap;
use super::model::{
    defaults, header_safe, segment_safe, AppTunnelProtocol, ApplicationTunnel, GatewayAddressJson, HealthPolicy,
    IpFamilies, LbMode, LbScope, LoadBalancer, Locality, NetworkMode, Protocol, ServiceJson, Visibility,
    WeightedWaypointJson, WorkloadStatus,
};
use super::{Service, ServiceKey, StateError, Workload};

/// A local document's workloads and services, validated, and its policies as written (JSON, for the control side).
#[derive(Debug, Default)]
pub struct LocalDocument {
    pub workloads: Vec<Workload>,
    pub services: Vec<Service>,
    /// The `policies` list as JSON text (`[]` when absent), in the slow way's JSON form.
    pub policies_json: String,
}

/// Why the fast path declined a document (the slow way then decides; the reason is for logs and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declined(pub String);

type R<T> = Result<T, Declined>;

fn decline<T>(why: impl Into<String>) -> R<T> {
    Err(Declined(why.into()))
}

impl LocalDocument {
    /// The fast path: YAML text → validated records, or declined.
    pub fn from_yaml(text: &str) -> R<LocalDocument> {
        Self::from_yaml_split(text, SPLIT_AT)
    }

    /// `from_yaml`, reading a document of at least `split_at` bytes in parallel pieces when its layout allows it
    /// (`sections`).
    pub fn from_yaml_split(text: &str, split_at: usize) -> R<LocalDocument> {
        crate::yaml::check_nesting(text).map_err(Declined)?;
        if text.len() >= split_at {
            if let Some(sections) = sections(text) {
                return Self::from_sections(text, sections);
            }
        }
        let mut r = Reader::new(text);
        let doc = r.whole(|r| r.document())?;
        doc.validate()
    }

    fn from_sections(text: &str, s: Sections<'_>) -> R<LocalDocument> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
        let workloads = pieces(text, &s.workloads, threads);
        let services = pieces(text, &s.services, threads);
        let (workloads, services, policies) = std::thread::scope(|scope| {
            let w: Vec<_> = workloads
                .into_iter()
                .map(|t| scope.spawn(move || Reader::new(t).whole(|r| r.items(Reader::valid_workload))))
                .collect();
            let sv: Vec<_> = services
                .into_iter()
                .map(|t| scope.spawn(move || Reader::new(t).whole(|r| r.items(Reader::valid_service))))
                .collect();
            let policies = match s.policies {
                Some(t) => Reader::new(t).whole(|r| r.document()).map(|d| d.policies),
                None => Ok(None),
            };
            fn join<T>(h: std::thread::ScopedJoinHandle<'_, R<Vec<T>>>) -> R<Vec<T>> {
                h.join().unwrap_or_else(|_| decline("a reader panicked"))
            }
            let mut workloads = Vec::new();
            for h in w {
                workloads.extend(join(h)?);
            }
            let mut services = Vec::new();
            for h in sv {
                services.extend(join(h)?);
            }
            R::Ok((workloads, services, policies?))
        })?;
        LocalDocument::checked(workloads, services, policies)
    }

    /// The slow way's records: `{ workloads, services }` as the dataplane's JSON deltas carry them, after the
    /// control side's schema accepted the document (its policies travel separately).
    pub fn from_json(json: &[u8]) -> Result<LocalDocument, StateError> {
        #[derive(Deserialize, Default)]
        #[serde(default)]
        struct Doc {
            workloads: Vec<Workload>,
            services: Vec<ServiceJson>,
        }
        let doc: Doc = super::model::from_json(json)?;
        Ok(LocalDocument {
            workloads: doc.workloads.into_iter().map(Workload::validate).collect::<Result<_, _>>()?,
            services: doc.services.iter().map(ServiceJson::validate).collect::<Result<_, _>>()?,
            policies_json: "[]".into(),
        })
    }
}

/// What the reader collected, before the dataplane's own validation.
/// What the reader collected: each record validated as soon as it is read (the record as read is dropped then, so a
/// large document is never held twice).
struct Parsed {
    workloads: Vec<Workload>,
    services: Vec<Service>,
    policies: Option<serde_json::Value>,
}

impl Parsed {
    fn validate(self) -> R<LocalDocument> {
        LocalDocument::checked(self.workloads, self.services, self.policies)
    }
}

/// The dataplane's own validation of a record the reader accepted (a refusal declines: the slow way then reports it).
/// A gateway as written, as the record holds it (a destination that is neither form is declined).
fn gateway_address(g: GatewayAddressJson) -> R<Box<super::model::GatewayAddress>> {
    g.parse().map(Box::new).or_else(decline)
}

fn valid<T>(r: Result<T, StateError>) -> R<T> {
    r.or_else(|e| decline(e.to_string()))
}

impl LocalDocument {
    /// The whole document's rules over validated records: a uid or a service key given twice is declined.
    fn checked(
        workloads: Vec<Workload>,
        services: Vec<Service>,
        policies: Option<serde_json::Value>,
    ) -> R<LocalDocument> {
        let mut uids = HashSet::with_capacity(workloads.len());
        if let Some(w) = workloads.iter().find(|w| !uids.insert(w.uid.as_str())) {
            return decline(format!("duplicate workload uid {:?}", w.uid.as_str()));
        }
        let mut keys = HashSet::with_capacity(services.len());
        if let Some(s) = services.iter().find(|s| !keys.insert(&s.key)) {
            return decline(format!("duplicate service {}", s.key));
        }
        let policies_json = match policies {
            None => "[]".into(),
            Some(v) => v.to_string(),
        };
        Ok(LocalDocument { workloads, services, policies_json })
    }
}

/// A scalar as yaml_serde resolves it, as far as this reader needs to know.
enum Scalar<'a> {
    Null,
    Bool(bool),
    /// A plain decimal integer (no sign but `-`, no leading zero).
    Int(i64),
    Str(Cow<'a, str>),
    /// A plain scalar some rule could read as a number (a float, hex, a leading zero, a `+`): not modelled here.
    Number,
}

fn resolve(v: Cow<'_, str>, style: ScalarStyle) -> Scalar<'_> {
    if style != ScalarStyle::Plain {
        return Scalar::Str(v);
    }
    match &*v {
        "" | "~" | "null" | "Null" | "NULL" => return Scalar::Null,
        "true" | "True" | "TRUE" => return Scalar::Bool(true),
        "false" | "False" | "FALSE" => return Scalar::Bool(false),
        _ => {}
    }
    let first = v.as_bytes()[0];
    if !(first.is_ascii_digit() || matches!(first, b'+' | b'-' | b'.')) {
        return Scalar::Str(v);
    }
    let digits = v.strip_prefix('-').unwrap_or(&v);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && (digits == "0" || !digits.starts_with('0')) {
        return match v.parse::<i64>() {
            Ok(i) => Scalar::Int(i),
            Err(_) => Scalar::Number,
        };
    }
    let unsigned = v.trim_start_matches(['+', '-']);
    let lower = unsigned.to_ascii_lowercase();
    if v.parse::<f64>().is_ok()
        || unsigned.parse::<f64>().is_ok()
        || lower.starts_with("0x")
        || lower.starts_with("0o")
        || lower.starts_with("0b")
        || lower == ".inf"
        || lower == ".nan"
    {
        return Scalar::Number;
    }
    Scalar::Str(v)
}

struct Reader<'a> {
    p: Parser<'a, StrInput<'a>>,
    peeked: Option<Event<'a>>,
}

/// Field sets of a mapping, so that a key given twice is noticed (the slow way refuses it).
struct Seen(u64);

impl Seen {
    fn first(&mut self, i: usize) -> R<()> {
        let bit = 1u64 << i;
        if self.0 & bit != 0 {
            return decline("a key is given twice");
        }
        self.0 |= bit;
        Ok(())
    }
}

impl<'a> Reader<'a> {
    fn new(text: &'a str) -> Reader<'a> {
        Reader { p: Parser::new_from_str(text), peeked: None }
    }

    /// The stream of one document (or none: `body` then sees a null), read by `body`.
    fn whole<T>(&mut self, body: impl FnOnce(&mut Self) -> R<T>) -> R<T> {
        match self.next()? {
            Event::StreamStart => {}
            _ => return decline("no stream start"),
        }
        let out = match self.next()? {
            Event::StreamEnd => {
                self.peeked = Some(Event::Scalar(Cow::Borrowed(""), ScalarStyle::Plain, 0, None));
                return body(self);
            }
            Event::DocumentStart(_) => body(self)?,
            _ => return decline("no document start"),
        };
        match self.next()? {
            Event::DocumentEnd => {}
            _ => return decline("the document does not end"),
        }
        match self.next()? {
            Event::StreamEnd => Ok(out),
            _ => decline("more than one document"),
        }
    }

    /// A list of records read by `item`.
    fn items<T>(&mut self, item: fn(&mut Self) -> R<T>) -> R<Vec<T>> {
        let mut out = Vec::new();
        self.seq(|r| {
            out.push(item(r)?);
            Ok(())
        })?;
        Ok(out)
    }

    fn next(&mut self) -> R<Event<'a>> {
        if let Some(e) = self.peeked.take() {
            return Ok(e);
        }
        match self.p.next_event() {
            Some(Ok((e, _))) => Ok(e),
            Some(Err(e)) => decline(format!("invalid YAML: {e}")),
            None => decline("the stream ended early"),
        }
    }

    fn peek(&mut self) -> R<&Event<'a>> {
        if self.peeked.is_none() {
            let e = self.next()?;
            self.peeked = Some(e);
        }
        Ok(self.peeked.as_ref().expect("just peeked"))
    }

    /// The next scalar; anchors, aliases, tags and collections are declined.
    fn scalar(&mut self) -> R<Scalar<'a>> {
        match self.next()? {
            Event::Scalar(v, style, 0, None) => Ok(resolve(v, style)),
            Event::Scalar(..) => decline("an anchor or a tag"),
            Event::Alias(_) => decline("an alias"),
            _ => decline("a list or mapping where a value goes"),
        }
    }

    fn string(&mut self) -> R<String> {
        match self.scalar()? {
            Scalar::Str(s) => Ok(s.into_owned()),
            _ => decline("not a string"),
        }
    }

    /// A string of at least one character.
    fn non_empty(&mut self) -> R<String> {
        let s = self.string()?;
        if s.is_empty() {
            return decline("an empty string where one is required");
        }
        Ok(s)
    }

    /// A value that goes into a header or an identity (the schema's headerText / segmentText).
    fn header_text(&mut self, segment: bool) -> R<String> {
        let s = self.string()?;
        if header_safe("", &s).is_err() || (segment && segment_safe("", &s).is_err()) {
            return decline("a character that cannot go into a header");
        }
        Ok(s)
    }

    fn int(&mut self, min: i64, max: i64) -> R<i64> {
        match self.scalar()? {
            Scalar::Int(i) if (min..=max).contains(&i) => Ok(i),
            _ => decline("not an integer in range"),
        }
    }

    fn port(&mut self) -> R<u32> {
        Ok(self.int(1, 65535)? as u32)
    }

    fn bool(&mut self) -> R<bool> {
        match self.scalar()? {
            Scalar::Bool(b) => Ok(b),
            _ => decline("not a boolean"),
        }
    }

    /// One of `values`, exactly as written.
    fn one_of<T: Copy>(&mut self, values: &[(&str, T)]) -> R<T> {
        let s = self.string()?;
        match values.iter().find(|(name, _)| *name == s) {
            Some((_, v)) => Ok(*v),
            None => decline("not one of the allowed values"),
        }
    }

    /// True (and consumes it) when the next value is a plain null.
    fn null(&mut self) -> R<bool> {
        if let Event::Scalar(v, ScalarStyle::Plain, 0, None) = self.peek()? {
            if matches!(&**v, "" | "~" | "null" | "Null" | "NULL") {
                self.next()?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn seq(&mut self, mut item: impl FnMut(&mut Self) -> R<()>) -> R<()> {
        match self.next()? {
            Event::SequenceStart(0, None) => {}
            Event::SequenceStart(..) => return decline("an anchor or a tag"),
            _ => return decline("not a list"),
        }
        loop {
            if let Event::SequenceEnd = self.peek()? {
                self.next()?;
                return Ok(());
            }
            item(self)?;
        }
    }

    fn strings(&mut self) -> R<Vec<String>> {
        let mut out = Vec::new();
        self.seq(|r| {
            out.push(r.string()?);
            Ok(())
        })?;
        Ok(out)
    }

    /// A mapping whose keys are strings: `field` is called with each key (the value is next).
    fn map(&mut self, mut field: impl FnMut(&mut Self, Cow<'a, str>) -> R<()>) -> R<()> {
        match self.next()? {
            Event::MappingStart(0, None) => {}
            Event::MappingStart(..) => return decline("an anchor or a tag"),
            _ => return decline("not a mapping"),
        }
        loop {
            if let Event::MappingEnd = self.peek()? {
                self.next()?;
                return Ok(());
            }
            match self.scalar()? {
                Scalar::Str(k) => field(self, k)?,
                _ => return decline("a key that is not a string"),
            }
        }
    }

    /// A mapping with the given fields, each at most once; an unknown field is declined (the schema is strict).
    fn fields(&mut self, names: &[&str], mut field: impl FnMut(&mut Self, usize) -> R<()>) -> R<()> {
        let mut seen = Seen(0);
        self.map(|r, k| match names.iter().position(|n| *n == k) {
            Some(i) => {
                seen.first(i)?;
                field(r, i)
            }
            None => decline(format!("unknown field {k:?}")),
        })
    }

    fn document(&mut self) -> R<Parsed> {
        let mut doc = Parsed { workloads: Vec::new(), services: Vec::new(), policies: None };
        if self.null()? {
            return Ok(doc); // an empty document is an empty config
        }
        self.fields(&["workloads", "services", "policies"], |r, i| match i {
            0 => r.seq(|r| {
                doc.workloads.push(r.valid_workload()?);
                Ok(())
            }),
            1 => r.seq(|r| {
                doc.services.push(r.valid_service()?);
                Ok(())
            }),
            _ => {
                let v = r.json()?;
                if !v.is_array() {
                    return decline("policies is not a list");
                }
                doc.policies = Some(v);
                Ok(())
            }
        })?;
        Ok(doc)
    }

    fn valid_workload(&mut self) -> R<Workload> {
        valid(self.workload()?.validate())
    }

    fn valid_service(&mut self) -> R<Service> {
        valid(self.service()?.validate())
    }

    fn workload(&mut self) -> R<Workload> {
        const F: &[&str] = &[
            "uid",
            "name",
            "namespace",
            "serviceAccount",
            "trustDomain",
            "workloadIps",
            "network",
            "protocol",
            "networkMode",
            "node",
            "hostname",
            "status",
            "capacity",
            "canonicalName",
            "canonicalRevision",
            "workloadName",
            "workloadType",
            "clusterId",
            "locality",
            "services",
            "authorizationPolicies",
            "waypoint",
            "networkGateway",
            "applicationTunnel",
            "nativeTunnel",
        ];
        // Istio's defaults for what is left out are `Workload::validate`'s.
        let mut w = Workload::default();
        let mut required = Seen(0);
        self.fields(F, |r, i| {
            match i {
                0 => w.uid = Str::from(r.non_empty()?.as_str()),
                1 => w.name = Str::from(r.non_empty()?.as_str()),
                2 => {
                    w.namespace = intern(&r.header_text(true)?);
                    if w.namespace.is_empty() {
                        return decline("namespace is empty");
                    }
                }
                3 => w.service_account = intern(&r.header_text(true)?),
                4 => w.trust_domain = intern(&r.header_text(true)?),
                5 => {
                    let mut ips = Vec::new();
                    r.seq(|r| match r.string()?.parse::<IpAddr>() {
                        Ok(ip) => {
                            ips.push(ip);
                            Ok(())
                        }
                        Err(_) => decline("not an IP address"),
                    })?;
                    w.ips = ips;
                }
                6 => w.network = intern(&r.header_text(false)?),
                7 => w.protocol = r.one_of(&[("HBONE", Protocol::Hbone), ("TCP", Protocol::Tcp)])?,
                8 => {
                    w.network_mode =
                        r.one_of(&[("Standard", NetworkMode::Standard), ("HostNetwork", NetworkMode::HostNetwork)])?
                }
                9 => w.node = intern(&r.string()?),
                10 => w.hostname = intern(&r.string()?),
                11 => {
                    w.status =
                        r.one_of(&[("Healthy", WorkloadStatus::Healthy), ("Unhealthy", WorkloadStatus::Unhealthy)])?
                }
                12 => w.capacity = r.int(0, u32::MAX as i64)? as u32,
                13 => w.canonical_name = intern(&r.header_text(false)?),
                14 => w.canonical_revision = intern(&r.header_text(false)?),
                15 => w.workload_name = intern(&r.header_text(false)?),
                16 => {
                    let s = r.string()?;
                    let lower = s.to_ascii_lowercase();
                    if !s.is_ascii() || !defaults::WORKLOAD_TYPES.contains(&lower.as_str()) {
                        return decline("not a workload type");
                    }
                    w.workload_type = intern(&lower);
                }
                17 => w.cluster_id = intern(&r.header_text(false)?),
                18 => w.locality = r.locality()?,
                19 => {
                    let mut services = Vec::new();
                    let mut keys = HashSet::new();
                    r.map(|r, k| {
                        let namespaced = k
                            .split_once('/')
                            .is_some_and(|(ns, host)| !ns.is_empty() && !host.is_empty() && !host.contains('/'));
                        let Some(key) = ServiceKey::parse(&k).filter(|_| namespaced) else {
                            return decline("a service key that is not namespace/hostname");
                        };
                        let ports = PortMap::new(r.port_map()?);
                        if !keys.insert(key.clone()) {
                            return decline("a service key given twice");
                        }
                        services.push((key, ports));
                        Ok(())
                    })?;
                    w.service_ports = services;
                }
                20 => w.authorization_policies = r.strings()?.iter().map(|k| intern(k)).collect(),
                21 => w.waypoint = r.gateway(true)?.map(gateway_address).transpose()?,
                22 => w.network_gateway = r.gateway(true)?.map(gateway_address).transpose()?,
                23 => {
                    if !r.null()? {
                        let mut t = ApplicationTunnel::default();
                        r.fields(&["protocol", "port"], |r, i| {
                            match i {
                                0 => {
                                    t.protocol = r.one_of(&[
                                        ("NONE", AppTunnelProtocol::None),
                                        ("PROXY", AppTunnelProtocol::Proxy),
                                    ])?
                                }
                                _ => t.port = if r.null()? { None } else { Some(r.port()? as u16) },
                            }
                            Ok(())
                        })?;
                        w.application_tunnel = Some(t);
                    }
                }
                _ => w.native_tunnel = r.bool()?,
            }
            if i < 3 {
                required.first(i)?;
            }
            Ok(())
        })?;
        if required.0 != 0b111 {
            return decline("a required workload field is missing");
        }
        Ok(w)
    }

    fn locality(&mut self) -> R<Locality> {
        let mut l = Locality::default();
        self.fields(&["region", "zone", "subzone"], |r, i| {
            let v = super::intern::intern(&r.header_text(false)?);
            match i {
                0 => l.region = v,
                1 => l.zone = v,
                _ => l.subzone = v,
            }
            Ok(())
        })?;
        Ok(l)
    }

    /// servicePort → targetPort: a key 1-65535 (written as a number, or a string of up to five digits), a target 0-65535.
    fn port_map(&mut self) -> R<Vec<(u16, u16)>> {
        match self.next()? {
            Event::MappingStart(0, None) => {}
            _ => return decline("a port map that is not a plain mapping"),
        }
        let mut out = Vec::new();
        let mut keys = HashSet::new();
        loop {
            if let Event::MappingEnd = self.peek()? {
                self.next()?;
                return Ok(out);
            }
            let key = match self.scalar()? {
                Scalar::Int(i) if (1..=65535).contains(&i) => i as u16,
                Scalar::Str(s) if (1..=5).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit()) => {
                    match s.parse::<u16>() {
                        Ok(p) if p >= 1 => p,
                        _ => return decline("not a port"),
                    }
                }
                _ => return decline("not a port"),
            };
            if !keys.insert(key) {
                return decline("a port given twice");
            }
            let target = self.int(0, 65535)? as u16;
            out.push((key, target));
        }
    }

    /// A waypoint or network gateway: `{ destination, hboneMtlsPort }`, or null when `nullable`.
    fn gateway(&mut self, nullable: bool) -> R<Option<GatewayAddressJson>> {
        if nullable && self.null()? {
            return Ok(None);
        }
        let mut g = GatewayAddressJson { destination: String::new(), hbone_mtls_port: 15008 };
        let mut has_destination = false;
        self.fields(&["destination", "hboneMtlsPort"], |r, i| {
            match i {
                0 => {
                    let d = r.string()?;
                    if d.split_once('/').is_none_or(|(_, rest)| rest.is_empty()) {
                        return decline("a gateway destination that is not network/ip or namespace/hostname");
                    }
                    g.destination = d;
                    has_destination = true;
                }
                _ => g.hbone_mtls_port = r.port()?,
            }
            Ok(())
        })?;
        if !has_destination {
            return decline("a gateway without a destination");
        }
        Ok(Some(g))
    }

    fn service(&mut self) -> R<ServiceJson> {
        const F: &[&str] = &[
            "name",
            "namespace",
            "hostname",
            "vips",
            "cidrVips",
            "ports",
            "subjectAltNames",
            "canonical",
            "waypoint",
            "weightedWaypoints",
            "loadBalancer",
            "ipFamilies",
            "visibility",
        ];
        let mut s = ServiceJson::default();
        let mut required = Seen(0);
        self.fields(F, |r, i| {
            match i {
                0 => s.name = r.non_empty()?,
                1 => {
                    s.namespace = r.header_text(true)?;
                    if s.namespace.is_empty() {
                        return decline("namespace is empty");
                    }
                }
                2 => {
                    s.hostname = r.header_text(false)?;
                    if s.hostname.is_empty() {
                        return decline("hostname is empty");
                    }
                }
                3 => {
                    let mut vips = Vec::new();
                    r.seq(|r| {
                        let v = r.string()?;
                        // The schema splits at the first '/': the rest must be an IP.
                        if v.split_once('/').is_none_or(|(_, ip)| ip.parse::<IpAddr>().is_err()) {
                            return decline("a VIP that is not network/ip");
                        }
                        {
                            vips.push(v);
                            Ok(())
                        }
                    })?;
                    s.vips = vips;
                }
                4 => {
                    let mut cidrs = Vec::new();
                    r.seq(|r| {
                        cidrs.push(network_cidr(&r.string()?)?);
                        Ok(())
                    })?;
                    s.cidr_vips = cidrs;
                }
                5 => s.ports = r.port_map()?.into_iter().map(|(k, v)| (k.to_string(), u32::from(v))).collect(),
                6 => s.subject_alt_names = r.strings()?,
                7 => s.canonical = r.bool()?,
                8 => s.waypoint = r.gateway(true)?,
                9 => {
                    let mut out = Vec::new();
                    r.seq(|r| {
                        let mut waypoint = None;
                        let mut weight = None;
                        r.fields(&["waypoint", "weight"], |r, i| {
                            match i {
                                0 => waypoint = r.gateway(false)?,
                                _ => weight = Some(r.int(0, u32::MAX as i64)? as u32),
                            }
                            Ok(())
                        })?;
                        match (waypoint, weight) {
                            (Some(waypoint), Some(weight)) => {
                                out.push(WeightedWaypointJson { waypoint, weight });
                                Ok(())
                            }
                            _ => decline("a weighted waypoint without its waypoint or weight"),
                        }
                    })?;
                    s.weighted_waypoints = out;
                }
                10 => {
                    if !r.null()? {
                        let mut lb = LoadBalancer::default();
                        r.fields(&["routingPreferences", "mode", "healthPolicy"], |r, i| {
                            match i {
                                0 => {
                                    let mut prefs = Vec::new();
                                    r.seq(|r| {
                                        prefs.push(r.one_of(&[
                                            ("Region", LbScope::Region),
                                            ("Zone", LbScope::Zone),
                                            ("Subzone", LbScope::Subzone),
                                            ("Node", LbScope::Node),
                                            ("Cluster", LbScope::Cluster),
                                            ("Network", LbScope::Network),
                                        ])?);
                                        Ok(())
                                    })?;
                                    lb.routing_preferences = prefs;
                                }
                                1 => {
                                    lb.mode = r.one_of(&[
                                        ("Standard", LbMode::Standard),
                                        ("Strict", LbMode::Strict),
                                        ("Failover", LbMode::Failover),
                                        ("Passthrough", LbMode::Passthrough),
                                    ])?
                                }
                                _ => {
                                    lb.health_policy = r.one_of(&[
                                        ("OnlyHealthy", HealthPolicy::OnlyHealthy),
                                        ("AllowAll", HealthPolicy::AllowAll),
                                    ])?
                                }
                            }
                            Ok(())
                        })?;
                        s.load_balancer = Some(lb);
                    }
                }
                11 => {
                    if !r.null()? {
                        s.ip_families = Some(r.one_of(&[
                            ("Dual", IpFamilies::Dual),
                            ("IPv4", IpFamilies::IPv4),
                            ("IPv6", IpFamilies::IPv6),
                        ])?);
                    }
                }
                _ => {
                    if !r.null()? {
                        s.visibility =
                            Some(r.one_of(&[("Public", Visibility::Public), ("Namespace", Visibility::Namespace)])?);
                    }
                }
            }
            if i < 3 {
                required.first(i)?;
            }
            Ok(())
        })?;
        if required.0 != 0b111 {
            return decline("a required service field is missing");
        }
        Ok(s)
    }

    /// Any value, as the slow way's JSON has it (`policies`: validated and compiled by the control side). A local
    /// tag is the external enum tagging of ztunnel's YAML (`!Exact "a"` is `{"Exact": "a"}`).
    fn json(&mut self) -> R<serde_json::Value> {
        use serde_json::Value;
        let (tag, value) = match self.next()? {
            Event::Scalar(v, style, 0, tag) => {
                let value = match resolve(v, style) {
                    Scalar::Null => Value::Null,
                    Scalar::Bool(b) => Value::Bool(b),
                    Scalar::Int(i) => Value::from(i),
                    Scalar::Str(s) => Value::String(s.into_owned()),
                    Scalar::Number => return decline("a number that is not a plain decimal integer"),
                };
                (tag, value)
            }
            Event::SequenceStart(0, tag) => {
                let mut items = Vec::new();
                loop {
                    if let Event::SequenceEnd = self.peek()? {
                        self.next()?;
                        break;
                    }
                    items.push(self.json()?);
                }
                (tag, Value::Array(items))
            }
            Event::MappingStart(0, tag) => {
                let mut m = serde_json::Map::new();
                loop {
                    if let Event::MappingEnd = self.peek()? {
                        self.next()?;
                        break;
                    }
                    let key = match self.scalar()? {
                        Scalar::Str(s) => s.into_owned(),
                        Scalar::Int(i) => i.to_string(),
                        Scalar::Bool(b) => b.to_string(),
                        Scalar::Null => String::new(),
                        Scalar::Number => return decline("a key that is a number"),
                    };
                    let v = self.json()?;
                    if m.insert(key, v).is_some() {
                        return decline("a key given twice");
                    }
                }
                (tag, Value::Object(m))
            }
            Event::Alias(_) => return decline("an alias"),
            _ => return decline("an anchor, or an unexpected event"),
        };
        match tag {
            None => Ok(value),
            Some(t) if t.handle == "!" && !t.suffix.is_empty() => {
                let mut m = serde_json::Map::new();
                m.insert(t.suffix.clone(), value);
                Ok(Value::Object(m))
            }
            Some(_) => decline("a standard or global tag"),
        }
    }
}

/// The schema's `<network>/<cidr>` or bare CIDR (network ""), normalized to `<network>/<cidr>`.
fn network_cidr(s: &str) -> R<String> {
    fn is_cidr(s: &str) -> bool {
        let Some((ip, len)) = s.rsplit_once('/') else { return false };
        let Ok(ip) = ip.parse::<IpAddr>() else { return false };
        if !(1..=3).contains(&len.len()) || !len.bytes().all(|b| b.is_ascii_digit()) {
            return false;
        }
        let len: u32 = len.parse().unwrap_or(u32::MAX);
        len <= if ip.is_ipv4() { 32 } else { 128 }
    }
    let first = s.find('/');
    if is_cidr(s) && first == s.rfind('/') {
        return Ok(format!("/{s}"));
    }
    match first {
        Some(i) if is_cidr(&s[i + 1..]) => Ok(s.to_string()),
        _ => decline("not a CIDR"),
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
        let bare = line.trim_end_matches(['\n', '\r']);
        let Some(&first) = bare.as_bytes().first() else { continue };
        match first {
            b'#' => continue,
            // Inside an item (or blank): anywhere else, the lines would belong to no piece.
            b' ' if bare.trim_start_matches(' ').is_empty() || bare.trim_start_matches(' ').starts_with('#') => {
                continue
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
                let rest = rest.trim_start_matches(' ');
                if !(rest.is_empty() || rest.starts_with('#')) {
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

/// Groups consecutive items (byte ranges of `text`, each starting where the one before ended) into at most `n`
/// pieces of about equal size.
fn pieces<'a>(text: &'a str, items: &[(usize, usize)], n: usize) -> Vec<&'a str> {
    let (Some(first), Some(last)) = (items.first(), items.last()) else { return Vec::new() };
    let per = (last.1 - first.0).div_ceil(n).max(1);
    let mut out = Vec::new();
    let mut from = first.0;
    for (k, &(_, end)) in items.iter().enumerate() {
        if end - from >= per || k + 1 == items.len() {
            out.push(&text[from..end]);
            from = end;
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
            services: doc.services.iter().map(|s| s.key.clone()).collect(),
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
    use super::*;

    fn fast(yaml: &str) -> R<LocalDocument> {
        LocalDocument::from_yaml(yaml)
    }

    #[test]
    fn reads_every_field_and_applies_the_schema_defaults() {
        let doc = fast(
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
        let s = &doc.services[0];
        assert_eq!(s.cidr_vips.len(), 2);
        assert_eq!(s.cidr_vips[0].0, "");
        assert_eq!(s.cidr_vips[1].0, "net");
        assert_eq!(s.load_balancer.as_ref().unwrap().mode, LbMode::Failover);
        assert_eq!(s.ports.get(&80), Some(&0));
        let p: serde_json::Value = serde_json::from_str(&doc.policies_json).unwrap();
        assert_eq!(p[0]["rules"][0][0][0]["principals"], serde_json::json!([{"Exact": "a"}, {"Prefix": "b"}]));
    }

    #[test]
    fn empty_documents_are_empty_configs() {
        for text in ["", "~", "---\n", "# nothing\n", "{}"] {
            let doc = fast(text).unwrap_or_else(|e| panic!("{text:?}: {e:?}"));
            assert!(doc.workloads.is_empty() && doc.services.is_empty(), "{text:?}");
            assert_eq!(doc.policies_json, "[]");
        }
    }

    /// Each of these is either refused by the schema or outside what this reader models: the slow way decides.
    #[test]
    fn declines_what_the_schema_refuses_or_this_reader_does_not_model() {
        let base = "workloads:\n- {uid: a, name: a, namespace: ns";
        for (extra, why) in [
            (", bogus: 1", "unknown field"),
            (", workloadIps: [10.0.0.300]", "bad IP"),
            (", workloadIps: [\"fe80::1%eth0\"]", "zone id"),
            (", capacity: 1.0", "a float"),
            (", capacity: -1", "negative"),
            (", capacity: \"2\"", "a quoted number"),
            (", capacity: 0x10", "hex"),
            (", node: 1.5", "a number where a string goes"),
            (", node: 0123", "a leading zero"),
            (", node: !!str 12", "a standard tag"),
            (", name: b", "a key twice"),
            (", namespace: \"a,b\"", "a header separator"),
            (", serviceAccount: a/b", "a slash in a segment"),
            (", workloadType: Pod2", "not a type"),
            (", protocol: hbone", "enum case"),
            (", services: {svc: {80: 80}}", "not namespace/hostname"),
            (", services: {ns/svc: {80: 80, \"80\": 81}}", "a port twice"),
            (", services: {ns/svc: {0: 80}}", "port 0"),
            (", services: {ns/svc: {80: 70000}}", "target out of range"),
            (", waypoint: {hboneMtlsPort: 15008}", "no destination"),
            (", waypoint: {destination: nohost}", "no slash"),
            (", applicationTunnel: {port: 0}", "port 0"),
            (", locality: {area: x}", "unknown locality field"),
        ] {
            let text = format!("{base}{extra}}}\n");
            assert!(fast(&text).is_err(), "{why}: {text}");
        }
        for (text, why) in [
            ("workloads:\n- &a {uid: a, name: a, namespace: ns}\n", "an anchor"),
            ("x: &a 1\nworkloads: *a\n", "an alias"),
            ("workloads: ~\n", "null for a list"),
            ("workloads: []\nworkloads: []\n", "a key twice"),
            ("other: []\n", "an unknown top-level key"),
            ("- a\n", "a list document"),
            ("a: [\n", "a syntax error"),
            ("--- {}\n--- {}\n", "two documents"),
            ("workloads:\n- {uid: a, name: a}\n", "a required field missing"),
            ("workloads:\n- {uid: a, name: a, namespace: ns}\n- {uid: a, name: b, namespace: ns}\n", "a duplicate uid"),
            (
                "services:\n- {name: s, namespace: ns, hostname: h, vips: [a/b/10.0.0.1]}\n",
                "a VIP split at the first slash",
            ),
            ("services:\n- {name: s, namespace: ns, hostname: h, cidrVips: [10.0.0.0/33]}\n", "a prefix too long"),
            (
                "services:\n- {name: s, namespace: ns, hostname: h, weightedWaypoints: [{weight: 1}]}\n",
                "a weighted waypoint",
            ),
            ("policies: {}\n", "policies not a list"),
            ("policies: [{rules: 1.5}]\n", "a float in a policy"),
            ("policies: [!!map {}]\n", "a standard tag in a policy"),
        ] {
            assert!(fast(text).is_err(), "{why}: {text}");
        }
    }

    #[test]
    fn plain_scalars_resolve_as_yaml_serde_does() {
        let s = |v: &str| match resolve(Cow::Borrowed(v), ScalarStyle::Plain) {
            Scalar::Null => "null".to_string(),
            Scalar::Bool(b) => format!("bool {b}"),
            Scalar::Int(i) => format!("int {i}"),
            Scalar::Str(s) => format!("str {s}"),
            Scalar::Number => "number".to_string(),
        };
        assert_eq!(s("~"), "null");
        assert_eq!(s("NULL"), "null");
        assert_eq!(s("True"), "bool true");
        assert_eq!(s("yes"), "str yes", "YAML 1.2");
        assert_eq!(s("8080"), "int 8080");
        assert_eq!(s("-3"), "int -3");
        assert_eq!(s("0"), "int 0");
        assert_eq!(s("10.0.0.1"), "str 10.0.0.1");
        assert_eq!(s("8_080"), "str 8_080");
        assert_eq!(s("-"), "str -");
        assert_eq!(s("inf"), "str inf", "not finite: yaml_serde keeps it a string");
        for n in ["1.5", "1e3", "+5", "0x1f", "0o17", "0b1", "012", ".inf", "-.Inf", ".NaN", "99999999999999999999"] {
            assert_eq!(s(n), "number", "{n}");
        }
        assert!(matches!(resolve(Cow::Borrowed("80"), ScalarStyle::DoubleQuoted), Scalar::Str(_)));
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
            assert_eq!(p.concat(), text[s.workloads[0].0..s.workloads[2].1], "the pieces are the items, in order");
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
        // it no longer parses, so the document is declined (never read differently).
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
        ] {
            assert!(sections(other).is_none(), "{other:?}");
        }
    }

    #[test]
    fn the_slots_hand_a_document_over_once() {
        let id = stash(LocalDocument::default());
        assert!(take(id).is_some());
        assert!(take(id).is_none());
    }
}
