//! Support for the readers' fuzz tests (`tests/fuzz_readers.rs` of farout-data,
//! farout-skipgram and farout-linear): a counting allocator that measures the peak memory of
//! one call, byte-level mutations of valid files, and the case count.
//!
//! The readers promise never to panic and never to allocate more than the file justifies: a
//! header announcing 10^12 rows is an error, not an 8 TB allocation. The tests check the second
//! promise with [`PeakAlloc`] installed as the test binary's global allocator:
//!
//! ```
//! use farout_core::fuzz::{PeakAlloc, exclusive, peak_during};
//!
//! #[global_allocator]
//! static ALLOC: PeakAlloc = PeakAlloc;
//!
//! let _alone = exclusive();
//! let (v, peak) = peak_during(|| vec![1u8; 4096]);
//! assert!(peak >= 4096 && v.len() == 4096);
//! ```
//!
//! The counters are global (a reader may spawn threads), so each test holds [`exclusive`] for
//! its whole run: another test building its inputs meanwhile would count in this one's peak.
//!
//! Cases are drawn from a fixed seed, so a run is reproducible; `FAROUT_FUZZ_SEED` draws others.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

/// Cases per fuzz test when `FAROUT_FUZZ_CASES` is unset.
pub const DEFAULT_CASES: u32 = 5000;

/// The number of cases of each fuzz test: `FAROUT_FUZZ_CASES` if set, else [`DEFAULT_CASES`].
pub fn cases() -> u32 {
    match std::env::var("FAROUT_FUZZ_CASES") {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("FAROUT_FUZZ_CASES={v:?} is not a number")),
        Err(_) => DEFAULT_CASES,
    }
}

/// Where the fuzz tests write their files: `/dev/shm` when the system has it (in memory: a case
/// is a few microseconds of reading, and a disk busy with a build would make each `open` of
/// the file cost a millisecond), else the usual temporary directory.
pub fn scratch_root() -> std::path::PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() }
}

/// Seed of the cases: `FAROUT_FUZZ_SEED` if set, else a fixed one.
pub fn seed() -> u64 {
    match std::env::var("FAROUT_FUZZ_SEED") {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("FAROUT_FUZZ_SEED={v:?} is not a number")),
        Err(_) => 0x5eed_f00d,
    }
}

static EXCLUSIVE: Mutex<()> = Mutex::new(());

/// Held by each test of a binary with [`PeakAlloc`] for its whole run, so that tests run one at
/// a time and no other test's allocations count in a peak.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    EXCLUSIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

static LIVE: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);
static MEASURING: Mutex<()> = Mutex::new(());

/// The system allocator, counting live bytes and their peak. A reallocation counts the new
/// block before the old one is released, the worst case of a moving `realloc`.
pub struct PeakAlloc;

fn grow(n: usize) {
    let live = LIVE.fetch_add(n as i64, Relaxed) + n as i64;
    PEAK.fetch_max(live, Relaxed);
}

fn shrink(n: usize) {
    LIVE.fetch_sub(n as i64, Relaxed);
}

// SAFETY: every call forwards to `System` with the caller's arguments; the counters only
// observe sizes.
unsafe impl GlobalAlloc for PeakAlloc {
    /// # Safety
    /// As [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grow(layout.size());
        // SAFETY: forwarded as received.
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            shrink(layout.size());
        }
        p
    }

    /// # Safety
    /// As [`GlobalAlloc::alloc_zeroed`]: `layout` has a non-zero size.
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grow(layout.size());
        // SAFETY: forwarded as received.
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            shrink(layout.size());
        }
        p
    }

    /// # Safety
    /// As [`GlobalAlloc::dealloc`]: `ptr` was allocated by this allocator with `layout`.
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) };
        shrink(layout.size());
    }

    /// # Safety
    /// As [`GlobalAlloc::realloc`]: `ptr` was allocated by this allocator with `layout`;
    /// `new_size` is non-zero and, rounded up to `layout.align()`, does not overflow `isize`.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grow(new_size);
        // SAFETY: forwarded as received.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        shrink(if p.is_null() { new_size } else { layout.size() });
        p
    }
}

/// Runs `f` and returns its result with the peak of live heap bytes above the level at the
/// start (0 if it only freed). Meaningful only with [`PeakAlloc`] as the global allocator, and
/// while holding [`exclusive`].
pub fn peak_during<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let _one_at_a_time = MEASURING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let out = f();
    let peak = PEAK.load(Relaxed) - base;
    (out, peak.max(0) as u64)
}

/// Values a mutation writes over a number of a header: the sizes readers must not trust.
pub const HUGE: [u64; 8] =
    [1_000_000_000_000, 1 << 32, (1 << 32) - 1, 1 << 31, 1 << 40, 1 << 62, u64::MAX - 1, u64::MAX];

/// One byte-level edit of a file; `at` and `arg` are taken modulo whatever they index.
#[derive(Clone, Copy, Debug)]
pub struct Mutation {
    /// Which edit (modulo 7): flip a bit, insert a byte, delete a byte, truncate, replace a
    /// decimal number by a huge one, overwrite 8 bytes by a huge little-endian u64, or 4 bytes
    /// by a huge u32.
    pub kind: u8,
    /// Where.
    pub at: u64,
    /// With what.
    pub arg: u64,
}

impl Mutation {
    /// Applies the edit to `bytes`.
    pub fn apply(self, bytes: &mut Vec<u8>) {
        let len = bytes.len() as u64;
        let at = |n: u64| if n == 0 { 0 } else { (self.at % n) as usize };
        let huge = HUGE[(self.arg % HUGE.len() as u64) as usize];
        match self.kind % 7 {
            0 if len > 0 => bytes[at(len)] ^= 1 << (self.arg % 8),
            1 => bytes.insert(at(len + 1), self.arg as u8),
            2 if len > 0 => {
                bytes.remove(at(len));
            }
            3 => bytes.truncate(at(len + 1)),
            4 => {
                // A decimal run, often one of the first three (the header's numbers); the
                // replacement sometimes overflows u64 on purpose.
                let runs = digit_runs(bytes);
                if !runs.is_empty() {
                    let n = if self.arg.is_multiple_of(2) { runs.len().min(3) } else { runs.len() } as u64;
                    let r = runs[at(n)].clone();
                    let text = if self.arg.is_multiple_of(5) { format!("{huge}0") } else { huge.to_string() };
                    bytes.splice(r, text.into_bytes());
                }
            }
            5 if len >= 8 => {
                let i = at(len - 7);
                bytes[i..i + 8].copy_from_slice(&huge.to_le_bytes());
            }
            6 if len >= 4 => {
                let i = at(len - 3);
                bytes[i..i + 4].copy_from_slice(&(huge as u32 | 1 << 31).to_le_bytes());
            }
            _ => {}
        }
    }
}

/// Byte ranges of the maximal runs of ASCII digits.
fn digit_runs(bytes: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            runs.push(start..i);
        } else {
            i += 1;
        }
    }
    runs
}

/// `valid` with `mutations` applied in order.
pub fn mutate(valid: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes = valid.to_vec();
    mutations.iter().for_each(|m| m.apply(&mut bytes));
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_edit_numbers_and_stay_in_bounds() {
        let m = |kind, at, arg| Mutation { kind, at, arg };
        assert_eq!(mutate(b"3 10 5\n1 0:1\n", &[m(4, 0, 1)]), b"4294967296 10 5\n1 0:1\n");
        assert_eq!(mutate(b"3 10 5\n", &[m(4, 1, 7)]), format!("3 {} 5\n", u64::MAX).as_bytes());
        assert_eq!(mutate(b"abc", &[m(3, 1, 0)]), b"a");
        assert_eq!(mutate(b"ab", &[m(1, 4, b'x' as u64)]), b"axb");
        for kind in 0..7 {
            for len in 0..10 {
                for at in [0, 1, 7, u64::MAX] {
                    mutate(&vec![b'7'; len], &[m(kind, at, at)]);
                }
            }
        }
    }
}
