//! Times the local config's fast path (state/local.rs) on a file: `cargo run --release --example local_bench -- FILE`
//! (e.g. the 100k-workload file of test/helpers/large-config.ts). Prints the read time, the apply time into a fresh
//! dataplane state, and the counts. Measures; asserts only that the document was accepted.
use std::time::Instant;

use dataplane::state::local::LocalDocument;

fn main() {
    let path = std::env::args().nth(1).expect("usage: local_bench FILE");
    let text = std::fs::read_to_string(&path).expect("read the file");
    let t = Instant::now();
    let one = LocalDocument::from_yaml_split(&text, usize::MAX).unwrap_or_else(|r| panic!("refused: {r:?}"));
    println!("in one piece: {:?}", t.elapsed());
    drop(one);
    let t0 = Instant::now();
    let doc = LocalDocument::from_yaml(&text).unwrap_or_else(|r| panic!("refused: {r:?}"));
    let read = t0.elapsed();
    let (w, s, p) = (doc.workloads.len(), doc.services.len(), doc.policies_json.len());
    let dp = dataplane::Dataplane::from_json(r#"{"nodeName":"bench"}"#).expect("a dataplane");
    let ticket = dataplane::state::local::stash(doc);
    let t1 = Instant::now();
    dp.apply_local(ticket, &[]).expect("applied");
    let apply = t1.elapsed();
    println!("read {read:?} apply {apply:?}: {w} workloads, {s} services, {p} bytes of policies");
}
