//! The heap profile behind the admin API's `/debug/pprof/heap` (ztunnel's endpoints: `/debug/pprof/heap/profiling
//! ?activate=true|false` turns it on and off, `/debug/pprof/heap` answers the live sampled allocations as a pprof
//! protobuf profile, `inuse_objects` and `inuse_space`).
//!
//! ztunnel gets this from jemalloc's profiler. The dataplane keeps glibc's malloc (its free-heap handling measured best
//! for the mesh state's RSS, see `alloc.rs`), so the sampling is done here, by a global allocator that wraps the
//! system's (`Sampling`, declared by the native module): while profiling is off it costs one relaxed atomic load per
//! allocation and per free; while on, about one allocation per `RATE` bytes allocated (a Poisson process, as jemalloc
//! and tcmalloc sample) has its stack recorded, and frees look the address up only while sampled allocations are live.
//! Only the native module's own allocations are seen (the mesh state, buffers, TLS, h2); V8's heap is Node's.
//!
//! Reentrancy: recording allocates (the table, the stack), so a thread-local flag lets the allocator's own work through
//! unsampled. Stacks are captured without allocating (`backtrace::trace_unsynchronized` into a fixed array) and
//! symbolized only when a profile is asked for.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

/// Mean bytes allocated between two samples (jemalloc's default `lg_prof_sample` is 19: 512 KiB).
pub const RATE: u64 = 512 * 1024;
const MAX_FRAMES: usize = 64;

static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Sampled allocations not yet freed: while 0, a free costs no lookup.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static TABLE: Mutex<Option<Table>> = Mutex::new(None);
static STARTED: Mutex<Option<SystemTime>> = Mutex::new(None);

thread_local! {
    /// Inside the profiler's own bookkeeping: its allocations are not sampled, its frees not looked up.
    static BUSY: Cell<bool> = const { Cell::new(false) };
    /// Bytes to allocate on this thread before the next sample.
    static UNTIL: Cell<i64> = const { Cell::new(0) };
    static SEED: Cell<u64> = const { Cell::new(0) };
}

#[derive(Default)]
struct Table {
    /// address → (size, stack index)
    live: HashMap<usize, (usize, usize)>,
    stacks: Vec<Vec<usize>>,
    index: HashMap<Vec<usize>, usize>,
}

/// The global allocator: the system's, with the sampling above.
pub struct Sampling;

// SAFETY: every allocation and free is the system allocator's; the profiler only reads the addresses.
unsafe impl GlobalAlloc for Sampling {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if ACTIVE.load(Ordering::Relaxed) && !p.is_null() {
            sampled_alloc(p, layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if ACTIVE.load(Ordering::Relaxed) && !p.is_null() {
            sampled_alloc(p, layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if LIVE.load(Ordering::Relaxed) > 0 {
            freed(ptr);
        }
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if LIVE.load(Ordering::Relaxed) > 0 {
            freed(ptr);
        }
        let p = System.realloc(ptr, layout, new_size);
        if ACTIVE.load(Ordering::Relaxed) && !p.is_null() {
            sampled_alloc(p, new_size);
        }
        p
    }
}

/// Runs `f` as the profiler's own work (unsampled), unless this thread is already inside it or being torn down.
fn own<T>(f: impl FnOnce() -> T) -> Option<T> {
    let entered = BUSY.try_with(|b| !b.replace(true)).unwrap_or(false);
    if !entered {
        return None;
    }
    let out = f();
    let _ = BUSY.try_with(|b| b.set(false));
    Some(out)
}

fn sampled_alloc(p: *mut u8, size: usize) {
    let due = UNTIL
        .try_with(|u| {
            let left = u.get() - size as i64;
            u.set(left);
            left <= 0
        })
        .unwrap_or(false);
    if !due {
        return;
    }
    own(|| {
        let _ = UNTIL.try_with(|u| u.set(next_interval()));
        let mut frames = [0usize; MAX_FRAMES];
        let mut n = 0;
        // SAFETY: no other unwinding runs on this thread now (we are inside an allocation, outside any unwinder).
        unsafe {
            backtrace::trace_unsynchronized(|f| {
                frames[n] = f.ip() as usize;
                n += 1;
                n < MAX_FRAMES
            });
        }
        let mut table = TABLE.lock();
        let Some(t) = table.as_mut() else { return };
        let stack = frames[..n].to_vec();
        let i = match t.index.get(&stack) {
            Some(i) => *i,
            None => {
                t.stacks.push(stack.clone());
                t.index.insert(stack, t.stacks.len() - 1);
                t.stacks.len() - 1
            }
        };
        if t.live.insert(p as usize, (size, i)).is_none() {
            LIVE.fetch_add(1, Ordering::Relaxed);
        }
    });
}

fn freed(p: *mut u8) {
    own(|| {
        if let Some(t) = TABLE.lock().as_mut() {
            if t.live.remove(&(p as usize)).is_some() {
                LIVE.fetch_sub(1, Ordering::Relaxed);
            }
        }
    });
}

/// An exponentially distributed interval with mean `RATE` (xorshift; the quality needed is a fair spread, not secrecy).
fn next_interval() -> i64 {
    let x = SEED
        .try_with(|s| {
            let mut x = s.get();
            if x == 0 {
                x = (s as *const _ as u64) ^ 0x9E37_79B9_7F4A_7C15;
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s.set(x);
            x
        })
        .unwrap_or(0x2545_F491_4F6C_DD1D);
    let u = ((x >> 11) as f64 + 1.0) / ((1u64 << 53) as f64 + 1.0);
    (-(u.ln()) * RATE as f64) as i64 + 1
}

#[derive(Debug, thiserror::Error)]
pub enum HeapProfileError {
    #[error("heap profiling is not active: ask /debug/pprof/heap/profiling?activate=true first")]
    NotActive,
}

/// Turns sampling on (a fresh table) or off (the table and what it recorded are dropped). Returns whether it is on.
pub fn activate(on: bool) -> bool {
    own(|| {
        if on {
            let mut table = TABLE.lock();
            if table.is_none() {
                *table = Some(Table::default());
                *STARTED.lock() = Some(SystemTime::now());
            }
            ACTIVE.store(true, Ordering::Release);
        } else {
            ACTIVE.store(false, Ordering::Release);
            let dropped = TABLE.lock().take();
            LIVE.store(0, Ordering::Release);
            *STARTED.lock() = None;
            drop(dropped);
        }
    });
    ACTIVE.load(Ordering::Acquire)
}

pub fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// The live sampled allocations as a pprof profile (`inuse_objects`/count, `inuse_space`/bytes, each sample scaled by
/// the inverse of its chance of having been sampled, as jemalloc's and Go's heap profiles are).
pub fn profile() -> Result<Vec<u8>, HeapProfileError> {
    let snapshot = own(|| {
        let table = TABLE.lock();
        let t = table.as_ref()?;
        let mut by_stack: HashMap<usize, (i64, i64)> = HashMap::new();
        for (size, stack) in t.live.values() {
            let e = by_stack.entry(*stack).or_default();
            // P(sampled) = 1 - exp(-size / RATE): scale to estimate what was allocated.
            let p = 1.0 - (-(*size as f64) / RATE as f64).exp();
            let scale = if p > 0.0 { 1.0 / p } else { 1.0 };
            e.0 += scale.round() as i64;
            e.1 += (*size as f64 * scale).round() as i64;
        }
        let stacks: Vec<(Vec<usize>, (i64, i64))> =
            by_stack.into_iter().map(|(i, v)| (t.stacks[i].clone(), v)).collect();
        Some((stacks, *STARTED.lock()))
    })
    .flatten();
    let Some((stacks, started)) = snapshot else { return Err(HeapProfileError::NotActive) };
    let samples = stacks.into_iter().map(|(ips, values)| {
        let mut frames = Vec::new();
        for ip in ips {
            backtrace::resolve(ip as *mut std::ffi::c_void, |s| {
                let name = s.name().map(|n| n.to_string()).unwrap_or_else(|| format!("{ip:#x}"));
                let file = s.filename().map(|f| f.display().to_string()).unwrap_or_default();
                frames.push((name, file, s.lineno().unwrap_or(0)));
            });
        }
        // The innermost frames are the sampler's and the allocator's own: the allocation site is the first frame past them.
        let own = |name: &str| {
            name.contains("heap_profile::") || name.contains("__rust_") || name.starts_with("alloc::alloc::")
        };
        let skip = frames.iter().take_while(|(name, _, _)| own(name)).count();
        frames.drain(..skip.min(frames.len().saturating_sub(1)));
        (frames, [values.0, values.1])
    });
    let start = started.and_then(|s| s.duration_since(UNIX_EPOCH).ok()).unwrap_or_default();
    let duration = started.and_then(|s| s.elapsed().ok()).unwrap_or(Duration::ZERO);
    let encoded = crate::profile::encode_values(
        samples,
        [("inuse_objects", "count"), ("inuse_space", "bytes")],
        ("space", "bytes"),
        RATE as i64,
        start,
        duration,
    );
    crate::profile::release_symbols();
    Ok(encoded)
}

/// The lib's tests run on the sampling allocator too (it passes everything through while profiling is off).
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: Sampling = Sampling;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::proto;

    #[inline(never)]
    fn allocate_for_the_heap_profile_test(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| vec![i as u8; 256 * 1024]).collect()
    }

    /// inuse_space of the samples whose stack passes through `function`.
    fn space_of(bytes: &[u8], function: &str) -> i64 {
        let p = <proto::Profile as prost::Message>::decode(bytes).unwrap();
        assert_eq!(p.string_table[p.sample_type[1].r#type as usize], "inuse_space");
        let named: std::collections::HashSet<u64> =
            p.function.iter().filter(|f| p.string_table[f.name as usize].contains(function)).map(|f| f.id).collect();
        let locations: std::collections::HashSet<u64> =
            p.location.iter().filter(|l| l.line.iter().any(|x| named.contains(&x.function_id))).map(|l| l.id).collect();
        p.sample.iter().filter(|s| s.location_id.iter().any(|l| locations.contains(l))).map(|s| s.value[1]).sum()
    }

    #[test]
    fn live_allocations_are_estimated_from_samples_and_freed_ones_leave_the_profile() {
        assert!(matches!(profile(), Err(HeapProfileError::NotActive)));
        assert!(activate(true));
        let held = allocate_for_the_heap_profile_test(200); // 50 MiB in 256 KiB blocks
        let during = profile().unwrap();
        let estimate = space_of(&during, "allocate_for_the_heap_profile_test");
        // Each block is sampled with p = 1 - e^(-1/2) ≈ 0.39 and counted 1/p times: 200 blocks give an estimate
        // within a few MiB of 50 MiB almost always; the bounds leave room for chance.
        assert!((25 << 20..=90 << 20).contains(&estimate), "estimated {estimate} bytes live for 50 MiB");
        drop(held);
        let after = profile().unwrap();
        assert_eq!(space_of(&after, "allocate_for_the_heap_profile_test"), 0, "freed blocks leave the profile");
        assert!(!activate(false));
        assert!(matches!(profile(), Err(HeapProfileError::NotActive)));
    }
}
