//! Process-wide allocator settings for the byte path (glibc; elsewhere nothing to do).
//!
//! The copy loops hand h2 a fresh buffer of up to 256 KiB per read (the `Bytes` goes with the DATA frame, so the
//! buffer cannot be reused in place), and h2 decodes DATA frames of up to 1 MiB. glibc's defaults serve requests of
//! 128 KiB and more with mmap and give free heap tops above 128 KiB back to the kernel, so at line rate nearly every
//! buffer was a fresh mapping: a page fault and a zeroed page per 4 KiB, then munmap. perf put that at about a third
//! of the two proxies' CPU (exc_page_fault, do_anonymous_page, unmap_page_range, memcg charging). Serving these sizes
//! from the heap and keeping some free heap per arena makes each buffer reuse warm pages (bench, same run: 7.2 →
//! 11.4 Gbit/s single stream, 1.35 → 0.91 CPU-s/GB for the two proxies).
//!
//! The cost is bounded: at most `TRIM_THRESHOLD` of free heap stays mapped per malloc arena after a burst.

/// Above the largest hot-path allocation (a 1 MiB h2 frame plus its header); larger ones still use mmap.
pub const MMAP_THRESHOLD: i32 = 4 * 1024 * 1024;
/// Free heap kept per arena before it is returned to the kernel.
pub const TRIM_THRESHOLD: i32 = 16 * 1024 * 1024;

/// Applies the settings once per process (idempotent). Returns whether the allocator accepted them.
pub fn tune() -> bool {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ONCE.get_or_init(apply)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() -> bool {
    // SAFETY: mallopt only sets glibc's malloc parameters; it is thread-safe (it takes the arena locks).
    unsafe {
        nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && nix::libc::mallopt(nix::libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() -> bool {
    false
}

/// Gives free heap pages back to the kernel, wherever they are in the heap (`malloc_trim`), not only above the top.
/// For after a large state batch (a first push or a local file of many thousands of resources): decoding it leaves
/// hundreds of MiB freed in the middle of the arenas, which the top-trimming above never returns. Not for the byte
/// path: it takes every arena's lock and walks them.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages to the kernel; it is thread-safe (it takes the arena locks).
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_accepts_the_settings() {
        assert!(super::tune());
        assert!(super::tune(), "idempotent");
    }
}
