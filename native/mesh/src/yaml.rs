//! The local config file's YAML, parsed natively (yaml_serde, the YAML organization's maintained serde_yaml) and
//! written back as JSON text for the control side's schema to validate. Parsing is the one step of loading a large
//! file that JavaScript does slowly: the `yaml` package takes about 80 s for a 51 MiB file of 100k workloads.
//!
//! The JSON is the document as JavaScript's YAML reading gives it: mapping keys become strings (`80: 8080` →
//! `{"80": 8080}`, a null key `""`), a non-finite float is `null`. A local tag is serde's external enum tagging, the
//! form ztunnel's own YAML uses: `!Exact "a"` is `{"Exact": "a"}`, as the mapping form `{Exact: a}` (so a local
//! config written for ztunnel loads unchanged). Standard tags (`!!str`) are resolved by the parser. A duplicate key, a key that is a
//! mapping or a list, or more than one document is refused. An error says where: `line L, column C: invalid YAML: ...`.

use serde::ser::{Error as _, SerializeMap};
use serde::{Serialize, Serializer};
use yaml_serde::Value;

/// Flow collections (`[...]`, `{...}`) nested deeper than this are refused before parsing. The parsers' own limit
/// (128) is met only after a scan whose cost grows with the square of the depth: a 200 KB file of nested brackets
/// took a minute to be refused (issue 29), blocking readiness meanwhile. A local config nests a few levels.
pub const MAX_FLOW_DEPTH: usize = 64;

/// Refuses, in one pass, text whose flow collections nest deeper than MAX_FLOW_DEPTH: `line L, column C: invalid
/// YAML: ...` at the bracket that goes too deep. Brackets in quoted scalars and comments do not count.
pub fn check_nesting(text: &str) -> Result<(), String> {
    let (mut depth, mut line, mut column) = (0usize, 1usize, 0usize);
    let mut quote: Option<char> = None;
    let mut comment = false;
    let mut prev = '\n';
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        column += 1;
        if c == '\n' {
            (line, column, comment) = (line + 1, 0, false);
            prev = c;
            continue;
        }
        match quote {
            _ if comment => {}
            Some('"') if c == '\\' => {
                chars.next();
                column += 1;
            }
            Some(q) if c == q => {
                // '' inside a single-quoted scalar is an escaped quote.
                if q == '\'' && chars.peek() == Some(&'\'') {
                    chars.next();
                    column += 1;
                } else {
                    quote = None;
                }
            }
            Some(_) => {}
            None => match c {
                '#' if prev.is_whitespace() => comment = true,
                // A quoted scalar starts a token (`it's` is a plain scalar's apostrophe).
                '"' | '\'' if prev.is_whitespace() || "[{,:-?".contains(prev) => quote = Some(c),
                '[' | '{' => {
                    depth += 1;
                    if depth > MAX_FLOW_DEPTH {
                        return Err(format!(
                            "line {line}, column {column}: invalid YAML: collections nested deeper than {MAX_FLOW_DEPTH} levels"
                        ));
                    }
                }
                ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        prev = c;
    }
    Ok(())
}

pub fn yaml_to_json(text: &str) -> Result<String, String> {
    check_nesting(text)?;
    let doc: Value = yaml_serde::from_str(text).map_err(|e| {
        let message = e.to_string();
        match e.location() {
            Some(at) => {
                // The message ends with " at line L column C" (sometimes with more after it); the position is said first.
                let head = message.split(" at line ").next().unwrap_or(&message);
                format!("line {}, column {}: invalid YAML: {head}", at.line(), at.column())
            }
            None => format!("invalid YAML: {message}"),
        }
    })?;
    serde_json::to_string(&Json(&doc)).map_err(|e| format!("invalid YAML: {e}"))
}

struct Json<'a>(&'a Value);

impl Serialize for Json<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    s.serialize_i64(i)
                } else if let Some(u) = n.as_u64() {
                    s.serialize_u64(u)
                } else {
                    match n.as_f64() {
                        Some(f) if f.is_finite() => s.serialize_f64(f),
                        _ => s.serialize_unit(),
                    }
                }
            }
            Value::String(x) => s.serialize_str(x),
            Value::Sequence(items) => s.collect_seq(items.iter().map(Json)),
            Value::Mapping(m) => {
                let mut map = s.serialize_map(Some(m.len()))?;
                for (k, v) in m {
                    let key = match k {
                        Value::String(x) => x.clone(),
                        Value::Number(n) => n.to_string(),
                        Value::Bool(b) => b.to_string(),
                        Value::Null => String::new(),
                        Value::Tagged(t) => match &t.value {
                            Value::String(x) => x.clone(),
                            _ => return Err(S::Error::custom("a mapping key must be a string, number or boolean")),
                        },
                        _ => return Err(S::Error::custom("a mapping key must be a string, number or boolean")),
                    };
                    map.serialize_entry(&key, &Json(v))?;
                }
                map.end()
            }
            Value::Tagged(t) => {
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry(&t.tag.to_string()[1..], &Json(&t.value))?;
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{check_nesting, yaml_to_json};

    #[test]
    fn flow_collections_nested_too_deep_are_refused_in_one_pass_quoted_brackets_do_not_count() {
        let deep = format!("workloads: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
        let started = std::time::Instant::now();
        let err = yaml_to_json(&deep).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "{:?}", started.elapsed());
        assert_eq!(err, "line 1, column 76: invalid YAML: collections nested deeper than 64 levels");
        let at_limit = format!("a: {}{}\n", "[".repeat(64), "]".repeat(64));
        assert!(check_nesting(&at_limit).is_ok());
        let quoted = format!(
            "a: \"{}\"\nb: '{}'\nc: it's [x]\n# {}\nd: [\"]\\\"\", '[it''s]']\n",
            "[".repeat(100),
            "{".repeat(100),
            "[".repeat(100)
        );
        assert!(check_nesting(&quoted).is_ok(), "{quoted}");
        assert!(yaml_to_json(&quoted).is_ok(), "and it is YAML");
        assert!(crate::state::local::LocalDocument::from_yaml(&deep).is_err());
    }

    #[test]
    fn the_document_as_javascript_reads_it() {
        let json = yaml_to_json("workloads:\n- {uid: a, ports: {80: 8080}, ok: true, f: 1.5, n: ~}\n").unwrap();
        assert_eq!(json, r#"{"workloads":[{"uid":"a","ports":{"80":8080},"ok":true,"f":1.5,"n":null}]}"#);
        assert_eq!(yaml_to_json("").unwrap(), "null", "an empty file is an empty document");
        assert_eq!(yaml_to_json("a: yes").unwrap(), r#"{"a":"yes"}"#, "YAML 1.2: yes is a string");
    }

    #[test]
    fn tags_are_serde_enum_variants_as_ztunnel_writes_them() {
        let tagged =
            yaml_to_json("principals: [!Exact \"cluster.local/ns/a/sa/b\", !Prefix x, !Presence []]\n").unwrap();
        let mapping =
            yaml_to_json("principals: [{Exact: cluster.local/ns/a/sa/b}, {Prefix: x}, {Presence: []}]\n").unwrap();
        assert_eq!(tagged, mapping);
        assert_eq!(tagged, r#"{"principals":[{"Exact":"cluster.local/ns/a/sa/b"},{"Prefix":"x"},{"Presence":[]}]}"#);
        assert_eq!(yaml_to_json("a: !!str 80").unwrap(), r#"{"a":"80"}"#, "a standard tag is the parser's");
    }

    #[test]
    fn errors_say_where() {
        let err = yaml_to_json("workloads:\n  - uid: [a\n").unwrap_err();
        assert!(err.starts_with("line ") && err.contains(", column ") && err.contains(": invalid YAML: "), "{err}");
        let dup = yaml_to_json("a: 1\na: 2\n").unwrap_err();
        assert!(dup.contains("invalid YAML") && dup.contains("duplicate"), "{dup}");
        assert!(yaml_to_json("? [a]\n: 1\n").unwrap_err().contains("mapping key"));
    }
}
