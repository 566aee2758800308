//! The local config file's reader (`state::local::LocalDocument::from_yaml`: yaml/de.rs's serde Deserializer over
//! saphyr-parser's events, the records' own serde shapes as the schema) over any text, read whole and in pieces.
//! It never panics; a refused document has at least one problem; read whole and in pieces, a document read both ways
//! gives the same records, and one refused both ways the same number of problems (a cut inside a value spanning lines can make the pieces unreadable: then it is refused,
//! never read differently).

#![no_main]

use dataplane::state::local::LocalDocument;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let whole = LocalDocument::from_yaml_split(text, usize::MAX);
    let pieces = LocalDocument::from_yaml_split(text, 0);
    match (&whole, &pieces) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.workloads, b.workloads);
            assert_eq!(a.services, b.services);
            assert_eq!(a.policies_json, b.policies_json);
        }
        // Refused both ways: as many problems (a syntax error in a piece is reported from the whole document).
        (Err(a), Err(b)) => {
            assert!(a.total >= 1 && !a.problems.is_empty(), "{a:?}");
            assert_eq!(a.total, b.total, "{a:?}\n{b:?}\n{text}");
        }
        (Err(r), _) | (_, Err(r)) => assert!(r.total >= 1 && !r.problems.is_empty(), "{r:?}"),
    }
});
