//! YAML read by serde: a `Deserializer` over saphyr-parser's event stream (a maintained pure-Rust YAML 1.2 parser,
//! twice the speed of libyaml-to-a-tree on a large local config), so that a record type's own `Deserialize` is the
//! schema of the document that holds it (the local config's workloads and services: `state/local.rs`). Nothing is
//! built in between: a 100k-workload file is read straight into the state's records.
//!
//! The rules, those of the YAML 1.2 core schema as yaml_serde applies them (and as the local config was read before
//! this reader): a plain scalar is null when empty or `~`/`null` (three spellings), a boolean when `true`/`false`
//! (three spellings each), a number when it reads as a decimal, `0x`/`0o`/`0b` integer or as a float (`.inf`, `.nan`
//! included), and otherwise a string; a quoted scalar is always a string. Types are strict: a number where a string
//! goes is an error, not its text. A mapping key is read as its text (`80: 8080` is the key "80", as JSON writes it);
//! a key given twice in one mapping is an error. Anchors and aliases are expanded (at most `MAX_EXPANDED` events in
//! all: an alias bomb is refused, not followed). A standard tag (`!!str 80`) forces its type; a local tag is serde's
//! external enum tagging, the form ztunnel's own YAML uses: `!Exact "a"` reads as the mapping `{Exact: a}`. Other tags
//! and more than one document are refused. A syntax error says where: `line L, column C: invalid YAML: ...`.
//!
//! A reader that keeps going after a bad record (`Deserializer::recover`) reports every record's problem, not only
//! the first of the document.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;

use saphyr_parser::{Event, Parser, ScalarStyle, StrInput, Tag};
use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

/// Events an alias may replay in one document, in all (a document of 100k workloads has about 3M events of its own;
/// aliases are for sharing a few blocks).
pub const MAX_EXPANDED: usize = 1 << 20;

/// Collections nested deeper than this are refused (reading a value recurses once per level; a local config nests a
/// few levels, a policy seven). Flow collections are refused sooner, before parsing (`super::check_nesting`).
pub const MAX_DEPTH: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    message: String,
    /// The text cannot be read further (a syntax error, an alias bomb): no later record can be reported.
    fatal: bool,
    /// Where the problem is, from where the reading started: `.workloadIps[0]`, `.services["ns/h"]` (written as the
    /// error leaves each value it is in: nothing is kept of the path while reading goes well).
    path: String,
}

impl Error {
    pub fn fatal(&self) -> bool {
        self.fatal
    }

    /// An error after which the text cannot be read further.
    pub fn stop(message: String) -> Error {
        Error { message, fatal: true, path: String::new() }
    }

    /// The path of the value the problem is in ("" for the value read).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The error of a value under `key` of a mapping.
    fn in_key(mut self, key: &str) -> Error {
        if !self.fatal {
            self.path = path_key("", key) + &self.path;
        }
        self
    }

    /// The error of item `index` of a list.
    fn in_item(mut self, index: usize) -> Error {
        if !self.fatal {
            self.path = format!("[{index}]{}", self.path);
        }
        self
    }
}

/// `path.key`, or `path["key"]` for a key that is not an identifier.
pub fn path_key(path: &str, key: &str) -> String {
    let identifier = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    match identifier {
        true => format!("{path}.{key}"),
        false => format!("{path}[{key:?}]"),
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Error {
        Error { message: msg.to_string(), fatal: false, path: String::new() }
    }
}

type R<T> = Result<T, Error>;

/// A scalar as the core schema resolves it.
enum Scalar<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(Cow<'a, str>),
}

fn is_null(v: &str) -> bool {
    matches!(v, "" | "~" | "null" | "Null" | "NULL")
}

fn boolean(v: &str) -> Option<bool> {
    match v {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// A number as the core schema reads one (`[-+]?` decimal, `0x`, `0o`, `0b`, floats and `.inf`/`.nan`), or None.
fn number(v: &str) -> Option<Scalar<'static>> {
    let (negative, digits) = match v.as_bytes().first()? {
        b'-' => (true, &v[1..]),
        b'+' => (false, &v[1..]),
        _ => (false, v),
    };
    let radix = |prefix: &str, radix: u32| -> Option<Scalar<'static>> {
        let body = digits.strip_prefix(prefix)?;
        let n = u64::from_str_radix(body, radix).ok()?;
        Some(match negative {
            true => Scalar::Int(0i64.checked_sub_unsigned(n)?),
            false => Scalar::Uint(n),
        })
    };
    if let Some(n) = radix("0x", 16).or_else(|| radix("0o", 8)).or_else(|| radix("0b", 2)) {
        return Some(n);
    }
    match digits {
        ".inf" | ".Inf" | ".INF" => {
            return Some(Scalar::Float(if negative { f64::NEG_INFINITY } else { f64::INFINITY }))
        }
        ".nan" | ".NaN" | ".NAN" if v == digits => return Some(Scalar::Float(f64::NAN)),
        _ => {}
    }
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return None;
    }
    if digits.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(i) = v.parse::<i64>() {
            return Some(Scalar::Int(i));
        }
        if let Ok(u) = digits.parse::<u64>() {
            if !negative {
                return Some(Scalar::Uint(u));
            }
        }
    }
    v.parse::<f64>().ok().map(Scalar::Float)
}

/// A tag as written (`!<x>` for a verbatim one).
fn tag_text(t: &Tag) -> String {
    match t.handle.is_empty() {
        true => format!("!<{}>", t.suffix),
        false => format!("{}{}", t.handle, t.suffix),
    }
}

fn resolve<'a>(v: Cow<'a, str>, style: ScalarStyle, tag: Option<&Tag>) -> R<Scalar<'a>> {
    if let Some(tag) = tag {
        if !tag.is_yaml_core_schema() {
            return Err(de::Error::custom(format!("the tag {} is not supported here", tag_text(tag))));
        }
        let bad = || de::Error::custom(format!("{v:?} is not a {}", tag.suffix));
        return match tag.suffix.as_str() {
            "str" => Ok(Scalar::Str(v)),
            "null" if is_null(&v) => Ok(Scalar::Null),
            "bool" => boolean(&v).map(Scalar::Bool).ok_or_else(bad),
            "int" => match number(&v) {
                Some(n @ (Scalar::Int(_) | Scalar::Uint(_))) => Ok(n),
                _ => Err(bad()),
            },
            "float" => match number(&v) {
                Some(Scalar::Int(i)) => Ok(Scalar::Float(i as f64)),
                Some(Scalar::Uint(u)) => Ok(Scalar::Float(u as f64)),
                Some(f @ Scalar::Float(_)) => Ok(f),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        };
    }
    if style != ScalarStyle::Plain {
        return Ok(Scalar::Str(v));
    }
    if is_null(&v) {
        return Ok(Scalar::Null);
    }
    if let Some(b) = boolean(&v) {
        return Ok(Scalar::Bool(b));
    }
    Ok(number(&v).unwrap_or(Scalar::Str(v)))
}

/// The events an anchor names, being recorded: from the anchored node's first event to its last.
struct Recording<'a> {
    id: usize,
    /// The nesting depth the node started at: it is complete when the depth is back there.
    depth: usize,
    events: Vec<Event<'a>>,
}

pub struct Deserializer<'a> {
    parser: Parser<'a, StrInput<'a>>,
    peeked: Option<Event<'a>>,
    /// Events an alias is replaying (innermost last), and the next of each.
    replay: Vec<(Rc<[Event<'a>]>, usize)>,
    anchors: HashMap<usize, Rc<[Event<'a>]>>,
    recording: Vec<Recording<'a>>,
    /// Nesting depth of the events read from the stream (anchors' bounds).
    read_depth: usize,
    /// Nesting depth of the events taken by the reader (a bad record's end: `recover`).
    depth: usize,
    /// Events taken by the reader so far.
    taken: u64,
    expanded: usize,
}

impl<'a> Deserializer<'a> {
    /// A reader of `text`'s one document (`document`), or of its stream's events one by one.
    pub fn new(text: &'a str) -> Deserializer<'a> {
        Deserializer {
            parser: Parser::new_from_str(text),
            peeked: None,
            replay: Vec::new(),
            anchors: HashMap::new(),
            recording: Vec::new(),
            read_depth: 0,
            depth: 0,
            taken: 0,
            expanded: 0,
        }
    }

    /// Reads the one document of the text with `body` (an empty text is one document: a null). More than one
    /// document is refused.
    pub fn document<T>(&mut self, body: impl FnOnce(&mut Self) -> R<T>) -> R<T> {
        self.expect(|e| matches!(e, Event::StreamStart), "no stream start")?;
        let out = match self.next()? {
            Event::StreamEnd => {
                self.peeked = Some(Event::Scalar(Cow::Borrowed(""), ScalarStyle::Plain, 0, None));
                return body(self);
            }
            Event::DocumentStart(_) => body(self)?,
            _ => return Err(Error::stop("invalid YAML: no document start".into())),
        };
        self.expect(|e| matches!(e, Event::DocumentEnd), "the document does not end")?;
        self.expect(|e| matches!(e, Event::StreamEnd), "more than one document")?;
        Ok(out)
    }

    fn expect(&mut self, is: impl Fn(&Event<'a>) -> bool, what: &str) -> R<()> {
        match is(&self.next()?) {
            true => Ok(()),
            false => Err(Error::stop(format!("invalid YAML: {what}"))),
        }
    }

    /// Where the reading is: a reader notes it before a record and, if the record fails, `recover`s from it to read
    /// the next one.
    pub fn mark(&self) -> Mark {
        Mark { depth: self.depth, taken: self.taken }
    }

    /// Drops the rest of a value that failed to read from `at` (all of it, if it failed before its first event).
    pub fn recover(&mut self, at: Mark) -> R<()> {
        if self.taken == at.taken {
            self.next()?;
        }
        while self.depth > at.depth {
            self.next()?;
        }
        Ok(())
    }

    /// Reads the sequence that comes next, calling `item` at each item (the item is next).
    pub fn seq(&mut self, mut item: impl FnMut(&mut Self) -> R<()>) -> R<()> {
        match self.next()? {
            Event::SequenceStart(..) => {}
            Event::Scalar(v, ScalarStyle::Plain, _, None) if is_null(&v) => {
                return Ok(());
            }
            _ => return Err(de::Error::custom("expected a list")),
        }
        while !self.ends()? {
            item(self)?;
        }
        Ok(())
    }

    /// True (and taken) when the collection being read ends next.
    fn ends(&mut self) -> R<bool> {
        if matches!(self.peek()?, Event::SequenceEnd | Event::MappingEnd) {
            self.next()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Reads the mapping that comes next, calling `value` with each key (its value is next); a key given twice is an
    /// error. A null is an empty mapping.
    pub fn map(&mut self, mut value: impl FnMut(&mut Self, Cow<'a, str>) -> R<()>) -> R<()> {
        match self.next()? {
            Event::MappingStart(..) => {}
            Event::Scalar(v, ScalarStyle::Plain, _, None) if is_null(&v) => {
                return Ok(());
            }
            _ => return Err(de::Error::custom("expected a mapping")),
        }
        let mut keys = Keys::default();
        while !self.ends()? {
            let key = self.key()?;
            keys.first(key.clone())?;
            value(self, key)?;
        }
        Ok(())
    }

    fn key(&mut self) -> R<Cow<'a, str>> {
        match self.next()? {
            Event::Scalar(v, ScalarStyle::Plain, _, None) if is_null(&v) => Ok(Cow::Borrowed("")),
            Event::Scalar(v, _, _, None) => Ok(v),
            Event::Scalar(..) => Err(de::Error::custom("a tagged mapping key is not supported")),
            _ => Err(de::Error::custom("a mapping key must be a string, number or boolean")),
        }
    }

    fn next(&mut self) -> R<Event<'a>> {
        let e = match self.peeked.take() {
            Some(e) => e,
            None => self.read()?,
        };
        self.taken += 1;
        match e {
            Event::SequenceStart(..) | Event::MappingStart(..) if self.depth == MAX_DEPTH => {
                return Err(Error::stop(format!("invalid YAML: collections nested deeper than {MAX_DEPTH} levels")));
            }
            Event::SequenceStart(..) | Event::MappingStart(..) => self.depth += 1,
            Event::SequenceEnd | Event::MappingEnd => self.depth -= 1,
            _ => {}
        }
        Ok(e)
    }

    fn peek(&mut self) -> R<&Event<'a>> {
        if self.peeked.is_none() {
            self.peeked = Some(self.read()?);
        }
        Ok(self.peeked.as_ref().expect("just peeked"))
    }

    /// The next event of the stream, with aliases expanded and anchored nodes recorded.
    fn read(&mut self) -> R<Event<'a>> {
        let e = loop {
            if let Some((events, at)) = self.replay.last_mut() {
                if let Some(e) = events.get(*at) {
                    *at += 1;
                    self.expanded += 1;
                    if self.expanded > MAX_EXPANDED {
                        return Err(Error::stop(format!(
                            "invalid YAML: aliases expand to more than {MAX_EXPANDED} events"
                        )));
                    }
                    break e.clone();
                }
                self.replay.pop();
                continue;
            }
            let (e, span) = match self.parser.next_event() {
                Some(Ok(e)) => e,
                Some(Err(e)) => {
                    let at = e.marker();
                    return Err(Error::stop(format!(
                        "line {}, column {}: invalid YAML: {}",
                        at.line(),
                        at.col() + 1,
                        e.info()
                    )));
                }
                None => return Err(Error::stop("invalid YAML: the text ended early".into())),
            };
            match e {
                Event::Alias(id) => match self.anchors.get(&id) {
                    Some(events) => self.replay.push((events.clone(), 0)),
                    None => {
                        return Err(Error::stop(format!(
                            "line {}, column {}: invalid YAML: an alias to an unknown anchor",
                            span.start.line(),
                            span.start.col() + 1
                        )))
                    }
                },
                e => break e,
            }
        };
        // A new anchor starts a recording; the event is recorded without it (a replay does not anchor again).
        let e = match e {
            Event::Scalar(v, s, id, t) if id > 0 => self.anchor(id, Event::Scalar(v, s, 0, t)),
            Event::SequenceStart(id, t) if id > 0 => self.anchor(id, Event::SequenceStart(0, t)),
            Event::MappingStart(id, t) if id > 0 => self.anchor(id, Event::MappingStart(0, t)),
            e => e,
        };
        self.record(&e);
        Ok(e)
    }

    fn anchor(&mut self, id: usize, e: Event<'a>) -> Event<'a> {
        self.recording.push(Recording { id, depth: self.read_depth, events: Vec::new() });
        e
    }

    fn record(&mut self, e: &Event<'a>) {
        match e {
            Event::SequenceStart(..) | Event::MappingStart(..) => self.read_depth += 1,
            Event::SequenceEnd | Event::MappingEnd => self.read_depth -= 1,
            _ => {}
        }
        if self.recording.is_empty() {
            return;
        }
        for r in &mut self.recording {
            r.events.push(e.clone());
        }
        while self.recording.last().is_some_and(|r| r.depth == self.read_depth) {
            let r = self.recording.pop().expect("just seen");
            self.anchors.insert(r.id, r.events.into());
        }
    }

    fn scalar_event(&mut self) -> R<(Cow<'a, str>, ScalarStyle, Option<Cow<'a, Tag>>)> {
        match self.next()? {
            Event::Scalar(v, style, _, tag) => Ok((v, style, tag)),
            _ => Err(de::Error::custom("expected a scalar")),
        }
    }

    /// A local tag (`!Name`) on the next node: its name, the node left next without it.
    fn local_tag(&mut self) -> R<Option<String>> {
        let tag = match self.peek()? {
            Event::Scalar(_, _, _, Some(t)) | Event::SequenceStart(_, Some(t)) | Event::MappingStart(_, Some(t)) => {
                t.clone()
            }
            _ => return Ok(None),
        };
        if tag.is_yaml_core_schema() {
            return Ok(None);
        }
        if tag.handle != "!" || tag.suffix.is_empty() {
            return Err(de::Error::custom(format!("the tag {} is not supported here", tag_text(&tag))));
        }
        if let Some(Event::Scalar(_, _, _, t) | Event::SequenceStart(_, t) | Event::MappingStart(_, t)) =
            self.peeked.as_mut()
        {
            *t = None;
        }
        Ok(Some(tag.suffix.clone()))
    }
}

/// A place in the reading (`Deserializer::mark`).
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    depth: usize,
    taken: u64,
}

/// The keys of one mapping so far: a list while short (a record's dozen keys), a set past that (a hostile mapping of
/// 100k keys must not cost 100k² comparisons).
#[derive(Default)]
struct Keys<'a> {
    few: smallvec::SmallVec<[Cow<'a, str>; 16]>,
    many: Option<std::collections::HashSet<Cow<'a, str>>>,
    /// The last key, once they are `many`.
    last: Cow<'a, str>,
}

impl<'a> Keys<'a> {
    const FEW: usize = 16;

    /// `key` (a borrowed key costs no copy), unless the mapping has it already.
    fn first(&mut self, key: Cow<'a, str>) -> R<()> {
        let twice = match &self.many {
            None => self.few.contains(&key),
            Some(many) => many.contains(&key),
        };
        if twice {
            return Err(de::Error::custom(format!("the key {key:?} is given twice")));
        }
        match &mut self.many {
            None if self.few.len() < Self::FEW => self.few.push(key),
            None => {
                let mut many: std::collections::HashSet<_> = self.few.drain(..).collect();
                many.insert(key.clone());
                self.many = Some(many);
                self.last = key;
            }
            Some(many) => {
                many.insert(key.clone());
                self.last = key;
            }
        }
        Ok(())
    }

    /// The key given last (its value is next).
    fn last(&self) -> &Cow<'a, str> {
        match self.many {
            None => self.few.last().unwrap_or(&self.last),
            Some(_) => &self.last,
        }
    }
}

struct SeqAccess<'d, 'a> {
    de: &'d mut Deserializer<'a>,
    index: usize,
}

impl<'de> de::SeqAccess<'de> for SeqAccess<'_, 'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> R<Option<T::Value>> {
        if self.de.ends()? {
            return Ok(None);
        }
        self.index += 1;
        seed.deserialize(&mut *self.de).map(Some).map_err(|e| e.in_item(self.index - 1))
    }
}

struct MapAccess<'d, 'a> {
    de: &'d mut Deserializer<'a>,
    keys: Keys<'a>,
}

impl<'de> de::MapAccess<'de> for MapAccess<'_, 'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> R<Option<K::Value>> {
        if self.de.ends()? {
            return Ok(None);
        }
        let key = self.de.key()?;
        self.keys.first(key)?;
        let key = self.keys.last();
        let read = match key {
            Cow::Borrowed(k) => seed.deserialize(de::value::BorrowedStrDeserializer::new(k)),
            Cow::Owned(k) => seed.deserialize(de::value::StrDeserializer::new(k)),
        };
        read.map(Some).map_err(|e: Error| e.in_key(key))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> R<V::Value> {
        seed.deserialize(&mut *self.de).map_err(|e| e.in_key(self.keys.last()))
    }
}

/// A node under a local tag, read as the one-entry mapping `{ tag: node }`.
struct Tagged<'d, 'a> {
    de: &'d mut Deserializer<'a>,
    tag: Option<String>,
}

impl<'de> de::MapAccess<'de> for Tagged<'_, 'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> R<Option<K::Value>> {
        match &self.tag {
            Some(t) => seed.deserialize(de::value::StrDeserializer::new(t)).map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> R<V::Value> {
        let tag = self.tag.take().unwrap_or_default();
        seed.deserialize(&mut *self.de).map_err(|e| e.in_key(&tag))
    }
}

fn visit_scalar<'de, V: Visitor<'de>>(s: Scalar<'de>, visitor: V) -> R<V::Value> {
    match s {
        Scalar::Null => visitor.visit_unit(),
        Scalar::Bool(b) => visitor.visit_bool(b),
        Scalar::Int(i) => visitor.visit_i64(i),
        Scalar::Uint(u) => visitor.visit_u64(u),
        Scalar::Float(f) => visitor.visit_f64(f),
        Scalar::Str(Cow::Borrowed(s)) => visitor.visit_borrowed_str(s),
        Scalar::Str(Cow::Owned(s)) => visitor.visit_string(s),
    }
}

impl<'de> de::Deserializer<'de> for &mut Deserializer<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> R<V::Value> {
        if let Some(tag) = self.local_tag()? {
            return visitor.visit_map(Tagged { de: self, tag: Some(tag) });
        }
        match self.next()? {
            Event::Scalar(v, style, _, tag) => visit_scalar(resolve(v, style, tag.as_deref())?, visitor),
            Event::SequenceStart(..) => visitor.visit_seq(SeqAccess { de: self, index: 0 }),
            Event::MappingStart(..) => visitor.visit_map(MapAccess { de: self, keys: Keys::default() }),
            _ => Err(Error::stop("invalid YAML: an unexpected event".into())),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> R<V::Value> {
        match self.peek()? {
            Event::Scalar(v, ScalarStyle::Plain, _, None) if is_null(v) => {
                self.next()?;
                visitor.visit_none()
            }
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> R<V::Value> {
        visitor.visit_newtype_struct(self)
    }

    /// A unit variant written as its name (the records' enums: `protocol: HBONE`).
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> R<V::Value> {
        let (v, style, tag) = self.scalar_event()?;
        match resolve(v, style, tag.as_deref())? {
            Scalar::Str(Cow::Borrowed(s)) => visitor.visit_enum(de::value::BorrowedStrDeserializer::new(s)),
            Scalar::Str(Cow::Owned(s)) => visitor.visit_enum(s.into_deserializer()),
            other => Err(de::Error::invalid_type(unexpected(&other), &visitor)),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> R<V::Value> {
        let at = self.mark();
        self.recover(at)?;
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct identifier
    }
}

fn unexpected<'a>(s: &'a Scalar<'_>) -> de::Unexpected<'a> {
    match s {
        Scalar::Null => de::Unexpected::Unit,
        Scalar::Bool(b) => de::Unexpected::Bool(*b),
        Scalar::Int(i) => de::Unexpected::Signed(*i),
        Scalar::Uint(u) => de::Unexpected::Unsigned(*u),
        Scalar::Float(f) => de::Unexpected::Float(*f),
        Scalar::Str(s) => de::Unexpected::Str(s),
    }
}

/// A whole text as one value of `T` (the text's one document).
pub fn from_str<'a, T: serde::Deserialize<'a>>(text: &'a str) -> R<T> {
    Deserializer::new(text).document(|d| T::deserialize(d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::{json, Value};

    fn value(text: &str) -> R<Value> {
        from_str(text)
    }

    #[test]
    fn scalars_resolve_by_the_core_schema_and_quoting_makes_a_string() {
        let v = value(
            "a: ~\nb: null\nc:\nd: True\ne: 0x1f\nf: -0o17\ng: 0b11\nh: 1.5e3\ni: .inf\nj: yes\nk: '80'\nl: 007\nm: 1.2.3\n\
             n: -12\no: 18446744073709551615\np: +5\n",
        )
        .unwrap();
        assert_eq!(
            v,
            json!({"a": null, "b": null, "c": null, "d": true, "e": 31, "f": -15, "g": 3, "h": 1500.0, "i": null,
                   "j": "yes", "k": "80", "l": 7, "m": "1.2.3", "n": -12, "o": 18446744073709551615u64, "p": 5})
        );
        assert_eq!(value("").unwrap(), Value::Null, "an empty text is a null document");
        assert_eq!(value("a: !!str 80\nb: !!int '9'\n").unwrap(), json!({"a": "80", "b": 9}));
        assert!(value("a: !!int x\n").is_err());
    }

    #[test]
    fn keys_are_their_text_and_a_key_twice_is_refused() {
        assert_eq!(value("{80: 8080, true: 1, ~: 2}").unwrap(), json!({"80": 8080, "true": 1, "": 2}));
        let e = value("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(e.to_string(), "the key \"a\" is given twice");
        assert!(value("? [a]\n: 1\n").unwrap_err().to_string().contains("mapping key"));
    }

    #[test]
    fn a_large_mapping_is_checked_for_a_key_given_twice_in_linear_time() {
        let keys: Vec<String> = (0..100_000).map(|i| format!("k{i}: {i}")).collect();
        let started = std::time::Instant::now();
        let v = value(&format!("{{{}}}", keys.join(", "))).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 100_000);
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
        let e = value(&format!("{{{}, k99999: 0}}", keys.join(", "))).unwrap_err();
        assert_eq!(e.to_string(), "the key \"k99999\" is given twice");
        let e = value(&format!("{{{}, k3: 0}}", keys[..40].join(", "))).unwrap_err();
        assert_eq!(e.to_string(), "the key \"k3\" is given twice", "a key of the first few, once past them");
    }

    #[test]
    fn block_collections_nested_too_deep_are_refused_not_recursed_into() {
        for deep in [
            "- ".repeat(100_000) + "x\n",
            "a:\n".to_string() + &(1..2000).map(|i| format!("{}b:\n", " ".repeat(i))).collect::<String>(),
        ] {
            let e = value(&deep).unwrap_err();
            assert!(e.fatal() && e.to_string().contains("nested deeper than 128 levels"), "{e}");
        }
        assert!(value(&("- ".repeat(100) + "x\n")).is_ok());
    }

    #[test]
    fn local_tags_are_enum_variants_as_ztunnel_writes_them() {
        let tagged = value("[!Exact \"cluster.local/ns/a/sa/b\", !Prefix x, !Presence []]").unwrap();
        let mapping = value("[{Exact: cluster.local/ns/a/sa/b}, {Prefix: x}, {Presence: []}]").unwrap();
        assert_eq!(tagged, mapping);
        assert!(value("a: !<tag:example.com,2000:x> 1").is_err());
    }

    #[test]
    fn aliases_replay_their_anchor_and_a_bomb_is_refused() {
        let v = value("base: &b {x: 1, y: [2, *c]}\nc: &c 3\n").unwrap_err();
        assert!(v.to_string().contains("unknown anchor"), "{v}");
        let v = value("a: &a {x: [1, 2], y: &s hi}\nb: *a\nc: [*s, *a]\n").unwrap();
        assert_eq!(
            v,
            json!({"a": {"x": [1, 2], "y": "hi"}, "b": {"x": [1, 2], "y": "hi"}, "c": ["hi", {"x": [1, 2], "y": "hi"}]})
        );
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            bomb += &format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n");
        }
        let e = value(&bomb).unwrap_err();
        assert!(e.fatal() && e.to_string().contains("aliases expand"), "{e}");
    }

    #[test]
    fn syntax_errors_say_where_and_stop_the_reading() {
        let e = value("workloads:\n  - uid: [a\n").unwrap_err();
        assert!(e.fatal() && e.to_string().starts_with("line 3, column 1: invalid YAML: "), "{e}");
        assert!(value("a: 1\n---\nb: 2\n").unwrap_err().to_string().contains("more than one document"));
    }

    #[test]
    fn types_are_strict_and_records_read_directly() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        #[serde(deny_unknown_fields)]
        struct Rec {
            name: String,
            port: u16,
            on: Option<bool>,
            mode: Mode,
        }
        #[derive(serde::Deserialize, Debug, PartialEq)]
        enum Mode {
            Strict,
        }
        let r: Rec = from_str("{name: a, port: 80, on: ~, mode: Strict}").unwrap();
        assert_eq!(r, Rec { name: "a".into(), port: 80, on: None, mode: Mode::Strict });
        let e = from_str::<Rec>("{name: 12, port: 80, mode: Strict}").unwrap_err();
        assert_eq!(e.to_string(), "invalid type: integer `12`, expected a string");
        let e = from_str::<Rec>("{name: a, port: 80, mode: Loose}").unwrap_err();
        assert!(e.to_string().starts_with("unknown variant `Loose`"), "{e}");
        let e = from_str::<Rec>("{name: a, port: 80, mode: Strict, extra: 1}").unwrap_err();
        assert!(e.to_string().starts_with("unknown field `extra`"), "{e}");
    }

    #[test]
    fn a_reader_goes_on_after_a_bad_item() {
        let mut d = Deserializer::new("- {port: 1}\n- {port: x, more: [1, 2]}\n- !<x> {port: 2}\n- {port: 3}\n");
        let mut got = Vec::new();
        d.document(|d| {
            d.seq(|d| {
                let at = d.mark();
                #[derive(serde::Deserialize)]
                struct P {
                    port: u16,
                }
                match P::deserialize(&mut *d) {
                    Ok(p) => got.push(Ok(p.port)),
                    Err(e) => {
                        got.push(Err(e.to_string()));
                        d.recover(at)?;
                    }
                }
                Ok(())
            })
        })
        .unwrap();
        assert_eq!(
            got,
            vec![
                Ok(1),
                Err("invalid type: string \"x\", expected u16".into()),
                Err("the tag !<x> is not supported here".into()),
                Ok(3)
            ],
            "an item refused before its first event is read is skipped whole"
        );
    }
}
