//! The CPU profile behind the admin API's `/debug/pprof/profile` (ztunnel's endpoint, the same parameters): the
//! whole process sampled for a while by tikv's `pprof` (a SIGPROF interval timer; each sample's stack unwound in the
//! signal handler, symbols resolved once the time is up), encoded in the pprof protobuf format (google/pprof's
//! `profile.proto`) that `go tool pprof` and every pprof viewer read.
//!
//! The process is Node's: samples land on the dataplane's tokio workers, its blocking threads, and Node's own threads
//! (the JavaScript main thread shows as V8 and libnode frames; JIT-compiled JavaScript has no symbols). Frames in libc,
//! libgcc, pthread and the vDSO are not unwound (pprof's blocklist: unwinding from a signal interrupting them can
//! deadlock). One profile at a time in the process: the profiler is a process-wide singleton.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, UNIX_EPOCH};

/// ztunnel's limits: 1 to 300 seconds (10 by default), 1 to 1000 Hz (100 by default).
pub const SECONDS: std::ops::RangeInclusive<u64> = 1..=300;
pub const FREQUENCY: std::ops::RangeInclusive<i32> = 1..=1000;

static RUNNING: AtomicBool = AtomicBool::new(false);
/// Set by `cancel_cpu_profile` (the requester went away): the running profile stops at its next tick.
static CANCEL: AtomicBool = AtomicBool::new(false);
/// How often a running profile looks at CANCEL.
const TICK: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("seconds must be in 1..=300, got {0}")]
    Seconds(u64),
    #[error("frequency must be in 1..=1000, got {0}")]
    Frequency(i32),
    #[error("a profile is already being taken")]
    Busy,
    #[error("the profile was cancelled")]
    Cancelled,
    #[error("the profiler failed: {0}")]
    Profiler(#[from] pprof::Error),
}

/// Samples the process for `seconds` at `frequency` Hz and returns the encoded profile. Blocks the calling thread for
/// the duration (call it from a blocking-pool thread).
pub fn cpu_profile(seconds: u64, frequency: i32) -> Result<Vec<u8>, ProfileError> {
    if !SECONDS.contains(&seconds) {
        return Err(ProfileError::Seconds(seconds));
    }
    if !FREQUENCY.contains(&frequency) {
        return Err(ProfileError::Frequency(frequency));
    }
    if RUNNING.swap(true, Ordering::AcqRel) {
        return Err(ProfileError::Busy);
    }
    struct Running;
    impl Drop for Running {
        fn drop(&mut self) {
            RUNNING.store(false, Ordering::Release);
        }
    }
    let _running = Running;
    CANCEL.store(false, Ordering::Release);
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(frequency)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(seconds);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        if CANCEL.swap(false, Ordering::AcqRel) {
            return Err(ProfileError::Cancelled);
        }
        std::thread::sleep(left.min(TICK));
    }
    let report = guard.report().build()?;
    drop(guard);
    let encoded = encode_report(&report, frequency);
    drop(report);
    release_symbols();
    Ok(encoded)
}

/// Stops the running profile, if one is (its requester went away); it returns `Cancelled` within a tick.
pub fn cancel_cpu_profile() {
    if RUNNING.load(Ordering::Acquire) {
        CANCEL.store(true, Ordering::Release);
    }
}

/// Symbolizing a profile reads the binary's debug information into `backtrace`'s process-wide cache: hundreds of
/// MiB for this module (built with debuginfo), kept for the process's life unless dropped. A profile is rare: drop the
/// cache and give the freed heap back after each one. Measured on an idle daemon, one 1 s profile: +275 MiB resident
/// kept, now +79 MiB, which is pprof's own sample table (allocated at the first profile and reused by the next ones:
/// a second profile adds nothing).
pub(crate) fn release_symbols() {
    backtrace::clear_symbol_cache();
    crate::alloc::release_free_heap();
}

fn encode_report(report: &pprof::Report, frequency: i32) -> Vec<u8> {
    let samples = report.data.iter().map(|(frames, count)| {
        let stack = frames.frames.iter().flatten().map(|s| (s.name(), s.filename().into_owned(), s.lineno()));
        (stack.collect::<Vec<_>>(), *count as i64)
    });
    let start = report.timing.start_time.duration_since(UNIX_EPOCH).unwrap_or_default();
    encode(samples, frequency, start, report.timing.duration)
}

/// The profile.proto messages this profile uses (field numbers as google/pprof's profile.proto gives them).
pub(crate) mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
    }
}

/// Encodes samples (each a stack, innermost frame first, as (function, file, line), and its count) as a CPU profile:
/// sample types `samples/count` and `cpu/nanoseconds` (count × the sampling period), one location per distinct frame.
pub fn encode(
    samples: impl Iterator<Item = (Vec<(String, String, u32)>, i64)>,
    frequency: i32,
    start: Duration,
    duration: Duration,
) -> Vec<u8> {
    let period = 1_000_000_000 / i64::from(frequency.max(1));
    let samples = samples.map(|(stack, count)| (stack, [count, count * period]));
    let types = [("samples", "count"), ("cpu", "nanoseconds")];
    encode_values(samples, types, ("cpu", "nanoseconds"), period, start, duration)
}

/// Encodes samples with two values each (`types` names them, as (type, unit)) as a pprof profile; one location per
/// distinct frame, one function per distinct (name, file).
pub fn encode_values(
    samples: impl Iterator<Item = (Vec<(String, String, u32)>, [i64; 2])>,
    types: [(&str, &str); 2],
    period_type: (&str, &str),
    period: i64,
    start: Duration,
    duration: Duration,
) -> Vec<u8> {
    use prost::Message;
    let mut strings: HashMap<String, i64> = HashMap::new();
    let mut p = proto::Profile::default();
    let mut s = |v: &str, p: &mut proto::Profile| -> i64 {
        if let Some(i) = strings.get(v) {
            return *i;
        }
        let i = p.string_table.len() as i64;
        p.string_table.push(v.to_string());
        strings.insert(v.to_string(), i);
        i
    };
    s("", &mut p); // the string table starts with ""
    let value_type = |t: &str, u: &str, p: &mut proto::Profile, s: &mut dyn FnMut(&str, &mut proto::Profile) -> i64| {
        proto::ValueType { r#type: s(t, p), unit: s(u, p) }
    };
    p.sample_type = types.iter().map(|(t, u)| value_type(t, u, &mut p, &mut s)).collect();
    p.period_type = Some(value_type(period_type.0, period_type.1, &mut p, &mut s));
    p.period = period;
    p.time_nanos = start.as_nanos() as i64;
    p.duration_nanos = duration.as_nanos() as i64;
    let mut functions: HashMap<(String, String), u64> = HashMap::new();
    let mut locations: HashMap<(u64, u32), u64> = HashMap::new();
    for (stack, values) in samples {
        let mut ids = Vec::with_capacity(stack.len());
        for (name, file, line) in stack {
            let fid = match functions.get(&(name.clone(), file.clone())) {
                Some(id) => *id,
                None => {
                    let id = p.function.len() as u64 + 1;
                    let (n, f) = (s(&name, &mut p), s(&file, &mut p));
                    p.function.push(proto::Function { id, name: n, system_name: n, filename: f });
                    functions.insert((name, file), id);
                    id
                }
            };
            let lid = *locations.entry((fid, line)).or_insert_with(|| {
                let id = p.location.len() as u64 + 1;
                p.location
                    .push(proto::Location { id, line: vec![proto::Line { function_id: fid, line: i64::from(line) }] });
                id
            });
            ids.push(lid);
        }
        p.sample.push(proto::Sample { location_id: ids, value: values.to_vec() });
    }
    p.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_ztunnels_and_one_profile_runs_at_a_time() {
        assert!(matches!(cpu_profile(0, 100), Err(ProfileError::Seconds(0))));
        assert!(matches!(cpu_profile(301, 100), Err(ProfileError::Seconds(301))));
        assert!(matches!(cpu_profile(1, 0), Err(ProfileError::Frequency(0))));
        assert!(matches!(cpu_profile(1, 1001), Err(ProfileError::Frequency(1001))));
        RUNNING.store(true, Ordering::Release);
        assert!(matches!(cpu_profile(1, 100), Err(ProfileError::Busy)));
        RUNNING.store(false, Ordering::Release);
    }

    #[test]
    fn the_encoding_shares_functions_and_locations_and_scales_cpu_time_by_the_period() {
        let stack = |names: &[&str]| names.iter().map(|n| (n.to_string(), "f.rs".to_string(), 7)).collect::<Vec<_>>();
        let bytes = encode(
            vec![(stack(&["leaf", "main"]), 3), (stack(&["other", "main"]), 2)].into_iter(),
            100,
            Duration::from_secs(1),
            Duration::from_secs(2),
        );
        let p = <proto::Profile as prost::Message>::decode(bytes.as_slice()).unwrap();
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.function.len(), 3, "leaf, main, other");
        assert_eq!(p.location.len(), 3);
        assert_eq!(p.sample.len(), 2);
        assert_eq!(p.sample[0].value, vec![3, 3 * 10_000_000], "cpu nanoseconds = count × 10 ms at 100 Hz");
        assert_eq!(p.sample[0].location_id[1], p.sample[1].location_id[1], "main is one location");
        assert_eq!((p.period, p.duration_nanos), (10_000_000, 2_000_000_000));
    }
}
