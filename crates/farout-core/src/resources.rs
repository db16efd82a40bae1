//! What the machine can hold: the memory available now and the free space on a disk, so that a
//! size read from a config, a command line or a header is checked before anything is allocated
//! or written. An error naming the figure and the key to change beats an abort on a failed
//! allocation, a kill by the kernel or a full disk.

use std::path::Path;

/// A request larger than what the machine has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} would need about {}, but {} {place}; {change}", bytes(*.needed), bytes(*.available))]
pub struct TooLarge {
    /// What needs the space, e.g. "the output layer (1000000000 x 128 f32, optimiser state)".
    pub what: String,
    /// Bytes needed.
    pub needed: u128,
    /// Bytes available.
    pub available: u128,
    /// "of memory are available" or "are free on /path".
    pub place: String,
    /// What to change, e.g. "lower --k or --d".
    pub change: String,
}

/// Bytes of memory this process can still allocate: `MemAvailable` of `/proc/meminfo`, capped
/// by a cgroup (v2) limit; `None` where neither is known.
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    });
    let read = |p: &str| std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<u64>().ok());
    let cgroup = match (read("/sys/fs/cgroup/memory.max"), read("/sys/fs/cgroup/memory.current")) {
        (Some(max), Some(current)) => Some(max.saturating_sub(current)),
        _ => None,
    };
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Free bytes (for an unprivileged user) on the file system holding `path`, or its nearest
/// existing ancestor; `None` where unknown.
pub fn free_disk(path: &Path) -> Option<u64> {
    let mut p = if path.as_os_str().is_empty() { Path::new(".") } else { path };
    while !p.exists() {
        p = p.parent().filter(|q| !q.as_os_str().is_empty()).unwrap_or(Path::new("."));
    }
    free_disk_at(p)
}

#[cfg(unix)]
fn free_disk_at(p: &Path) -> Option<u64> {
    let s = rustix::fs::statvfs(p).ok()?;
    Some(s.f_bavail.saturating_mul(s.f_frsize))
}

#[cfg(not(unix))]
fn free_disk_at(_: &Path) -> Option<u64> {
    None
}

/// An error if `needed` bytes exceed the memory available now (nothing is checked where that
/// is unknown).
pub fn check_memory(needed: u128, what: impl Into<String>, change: impl Into<String>) -> Result<(), TooLarge> {
    check(needed, available_memory(), what, change, "of memory are available".into())
}

/// An error if `needed` bytes exceed the free space on the disk holding `path`.
pub fn check_disk(
    path: &Path,
    needed: u128,
    what: impl Into<String>,
    change: impl Into<String>,
) -> Result<(), TooLarge> {
    let place = format!("are free on the disk holding {}", path.display());
    check(needed, free_disk(path), what, change, place)
}

fn check(
    needed: u128,
    available: Option<u64>,
    what: impl Into<String>,
    change: impl Into<String>,
    place: String,
) -> Result<(), TooLarge> {
    match available {
        Some(a) if needed > a as u128 => {
            Err(TooLarge { what: what.into(), needed, available: a as u128, place, change: change.into() })
        }
        _ => Ok(()),
    }
}

/// `b` bytes in the largest binary unit that keeps a number >= 1, e.g. `7.5 GiB`.
pub fn bytes(b: u128) -> String {
    const UNITS: [&str; 7] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut x = b as f64;
    let mut unit = 0;
    while x >= 1024.0 && unit + 1 < UNITS.len() {
        x /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{b} bytes") } else { format!("{x:.1} {}", UNITS[unit]) }
}

/// Bytes of `n` values of `size` bytes each, as a `u128` (never overflows for sizes from
/// `usize`/`u64` products of a few factors).
pub fn array_bytes(factors: &[u64], size: u64) -> u128 {
    factors.iter().fold(size as u128, |acc, &f| acc.saturating_mul(f as u128))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_reports_memory_and_disk() {
        // Linux CI machines have both; a size far beyond any machine is refused with the figure.
        assert!(available_memory().is_some_and(|m| m > 1 << 20));
        assert!(free_disk(Path::new("no/such/dir/below/here")).is_some());
        let e = check_memory(1 << 70, "the output layer", "lower --k").unwrap_err().to_string();
        assert!(e.starts_with("the output layer would need about 1024.0 EiB, but "), "{e}");
        assert!(e.ends_with("of memory are available; lower --k"), "{e}");
        assert!(check_memory(1, "x", "y").is_ok());
        let e = check_disk(Path::new("."), 1 << 70, "the corpus", "lower tokens").unwrap_err().to_string();
        assert!(e.contains("are free on the disk holding ."), "{e}");
    }

    #[test]
    fn sizes_are_printed_in_binary_units() {
        assert_eq!(bytes(12), "12 bytes");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(8_000_000_000_008), "7.3 TiB");
        assert_eq!(array_bytes(&[1_000_000_000_000, 1_000_000_000_000], 4), 4_000_000_000_000_000_000_000_000);
    }
}
