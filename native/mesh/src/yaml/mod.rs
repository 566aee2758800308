//! YAML, read natively: `de`, a serde Deserializer over saphyr-parser's events (the local config's records are read
//! with it: state/local.rs), and `yaml_to_json` for what the control side's schemas judge (the local config's
//! policies come as JSON from `de` too; the policy preview's candidates through `yaml_to_json`). Parsing is the one
//! step of loading a large file that JavaScript does slowly: the `yaml` package takes about 80 s for a 51 MiB file of
//! 100k workloads. A document is refused before it is parsed when its flow collections nest too deep.

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
            // The escaped character; an escaped line break is still a line (the loop counts it).
            Some('"') if c == '\\' => {
                if chars.next_if(|&n| n != '\n').is_some() {
                    column += 1;
                }
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

pub mod de;

/// YAML text (the policy preview's candidates) as JSON text: the document as JavaScript's YAML reading gives it (`de`'s
/// rules: keys as their text, a local tag as a one-entry mapping, a non-finite float as null). Throws
/// `line L, column C: invalid YAML: ...` for a syntax error, `invalid YAML: <path>: ...` for a key given twice.
pub fn yaml_to_json(text: &str) -> Result<String, String> {
    check_nesting(text)?;
    let doc: serde_json::Value = de::from_str(text).map_err(|e| match (e.fatal(), e.path()) {
        (true, _) => e.to_string(),
        (false, "") => format!("invalid YAML: {e}"),
        (false, path) => format!("invalid YAML: {}: {e}", path.trim_start_matches('.')),
    })?;
    Ok(doc.to_string())
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
        // Columns count characters, lines count an escaped line break in a double-quoted scalar too.
        let wide = format!("é: \"ü\\ü\"\nq: \"a\\\nb\"\nx: {}\n", "[".repeat(65));
        assert_eq!(
            check_nesting(&wide).unwrap_err(),
            "line 4, column 68: invalid YAML: collections nested deeper than 64 levels"
        );
        assert!(yaml_to_json(&quoted).is_ok(), "and it is YAML");
        assert!(crate::state::local::LocalDocument::from_yaml(&deep).is_err());
    }

    #[test]
    fn the_document_as_javascript_reads_it() {
        let json = yaml_to_json("workloads:\n- {uid: a, ports: {80: 8080}, ok: true, f: 1.5, n: ~}\n").unwrap();
        assert_eq!(
            json, r#"{"workloads":[{"f":1.5,"n":null,"ok":true,"ports":{"80":8080},"uid":"a"}]}"#,
            "keys sorted"
        );
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
        let nested = yaml_to_json("policies:\n- {name: p, name: q}\n").unwrap_err();
        assert_eq!(nested, "invalid YAML: policies[0]: the key \"name\" is given twice");
        let dup = yaml_to_json("a: 1\na: 2\n").unwrap_err();
        assert_eq!(dup, "invalid YAML: the key \"a\" is given twice");
        assert!(yaml_to_json("? [a]\n: 1\n").unwrap_err().contains("mapping key"));
    }
}
