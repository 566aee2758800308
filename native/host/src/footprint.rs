//! Cold code pages: what a daemon's startup touched of the executables mapped into it, and then never runs again.
//!
//! A page of an executable file's code that a process has touched stays in its RSS for as long as the mapping lives,
//! even if it never runs again: the kernel only takes it away under memory pressure. An idle daemon has run a great
//! deal of code once (Node's bootstrap and module loader, V8's parser and compilers, the config's validation, the
//! dataplane's setup), and the kernel maps code around each page fault too (fault-around: 64 KiB), so an idle daemon
//! held ~36 MiB of Node's binary and ~8 MiB of this module's code resident, most of it cold (bench/idle-rss.mjs).
//!
//! `release_cold_code` unmaps the resident pages of every read-only file mapping (code, constants and V8's startup
//! snapshot in Node's binary) that still holds only the file's own bytes (MADV_DONTNEED on a private file mapping drops this process's page table entries; the pages stay in the
//! page cache, shared with every other process mapping the file). The next instruction fetched from such a page faults
//! it back in from the page cache (a minor fault, about a microsecond), so what the daemon goes on running comes back
//! and what it never runs again stays out: the same as the kernel's own reclaim, done at the moment a daemon turns
//! idle instead of under pressure. A mapping with private (copy-on-write) pages is left alone: dropping those would
//! lose their changes (a text relocation, a debugger's breakpoint).

/// What one release did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase")]
pub struct ColdCodeReleased {
    /// Executable file mappings whose pages were released.
    pub mappings: u32,
    /// Their resident bytes before the release.
    #[cfg_attr(test, ts(type = "number"))]
    pub resident_bytes: u64,
    /// Executable file mappings left alone because they hold private pages.
    pub skipped: u32,
}

/// One mapping of `/proc/self/smaps`: its range, whether it is an executable file mapping, its resident and
/// private-anonymous bytes.
#[derive(Debug, Default, PartialEq, Eq)]
struct Mapping {
    start: usize,
    end: usize,
    executable_file: bool,
    rss: u64,
    anonymous: u64,
}

/// Parses `/proc/self/smaps` text: a header line per mapping (`start-end perms offset dev inode path`), then its
/// `Key: value kB` lines.
fn parse_smaps(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                let perms = fields.next().unwrap_or("");
                let path = fields.nth(3);
                out.push(Mapping {
                    start,
                    end,
                    // Read-only (code, constants: `r-x`, `r--`), private, backed by a file.
                    executable_file: (perms == "r-xp" || perms == "r--p") && path.is_some_and(|p| p.starts_with('/')),
                    ..Mapping::default()
                });
                continue;
            }
        }
        let mut kb = || fields.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 1024;
        match (first, out.last_mut()) {
            ("Rss:", Some(m)) => m.rss = kb(),
            ("Anonymous:", Some(m)) => m.anonymous = kb(),
            _ => {}
        }
    }
    out
}

/// Releases the resident pages of the process's executable file mappings (see the module's comment). Linux only;
/// elsewhere it does nothing.
pub fn release_cold_code() -> std::io::Result<ColdCodeReleased> {
    let mut released = ColdCodeReleased::default();
    if !cfg!(target_os = "linux") {
        return Ok(released);
    }
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    for m in parse_smaps(&smaps).into_iter().filter(|m| m.executable_file && m.rss > 0) {
        if m.anonymous > 0 {
            released.skipped += 1;
            continue;
        }
        // MADV_RANDOM first: a fault then maps the one page asked for, not the 64 KiB around it (fault-around), so only
        // what runs again comes back.
        let (addr, len) = (m.start as *mut nix::libc::c_void, m.end - m.start);
        // SAFETY: the range is a whole mapping of this process, read-only, backed by a file and with no private
        // pages: MADV_RANDOM is a hint, and MADV_DONTNEED only drops page table entries, the next access faulting the
        // same bytes back in from the file. Nothing in the range is lost or moved, so code running in it (this very
        // function's, other threads') simply faults on its next instruction fetch.
        let rc = unsafe {
            nix::libc::madvise(addr, len, nix::libc::MADV_RANDOM);
            nix::libc::madvise(addr, len, nix::libc::MADV_DONTNEED)
        };
        if rc == 0 {
            released.mappings += 1;
            released.resident_bytes += m.rss;
        }
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_are_read_per_mapping() {
        let text = "\
55d0c0000000-55d0c2000000 r-xp 00000000 08:01 123 /usr/bin/node
Size:              32768 kB
Rss:               20480 kB
Anonymous:             0 kB
7f0000000000-7f0000100000 rw-p 00000000 00:00 0
Rss:                1024 kB
Anonymous:          1024 kB
7f1000000000-7f1000200000 r-xp 00001000 08:01 456 /opt/a b/x.node
Rss:                 512 kB
Anonymous:             8 kB
7fff00000000-7fff00002000 r-xp 00000000 00:00 0                          [vdso]
Rss:                   8 kB
";
        let m = parse_smaps(text);
        assert_eq!(m.len(), 4);
        assert_eq!(
            m[0],
            Mapping {
                start: 0x55d0c0000000,
                end: 0x55d0c2000000,
                executable_file: true,
                rss: 20480 * 1024,
                anonymous: 0
            }
        );
        assert!(!m[1].executable_file, "anonymous memory is never released");
        assert!(m[2].executable_file && m[2].anonymous == 8 * 1024, "a path with a space, and its private pages");
        assert!(!m[3].executable_file, "[vdso] is no file");
    }

    fn resident_code() -> u64 {
        parse_smaps(&std::fs::read_to_string("/proc/self/smaps").unwrap())
            .iter()
            .filter(|m| m.executable_file && m.anonymous == 0)
            .map(|m| m.rss)
            .sum()
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn released_code_leaves_rss_and_comes_back_when_run() {
        // Other tests run on other threads and fault their code in meanwhile: the drop is looked for in a few tries.
        let mut seen = Vec::new();
        for _ in 0..3 {
            let before = resident_code();
            let r = release_cold_code().unwrap();
            assert!(r.mappings > 0 && r.resident_bytes > 0, "{r:?}");
            let after = resident_code();
            seen.push((before, after));
            if after < before {
                break;
            }
        }
        assert!(seen.iter().any(|(b, a)| a < b), "resident code before -> after each release: {seen:?}");
        let r = release_cold_code().unwrap();
        // The code still runs (it faults back in): a full parse and format after the release.
        assert_eq!(parse_smaps("1-2 r-xp 0 0:0 0 /x\nRss: 4 kB\n")[0].rss, 4096);
        assert!(format!("{:?}", serde_json::to_string(&r).unwrap()).contains("residentBytes"));
    }
}
