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

pub fn yaml_to_json(text: &str) -> Result<String, String> {
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
    use super::yaml_to_json;

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
