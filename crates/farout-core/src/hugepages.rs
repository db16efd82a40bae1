//! Transparent huge pages for large tables read at random rows.
//!
//! A row read at random from a table of hundreds of megabytes misses the TLB as well as the
//! caches when the table sits in 4 KiB pages: the page walk comes before the row's own miss.
//! In 2 MiB pages the whole table needs a few hundred TLB entries, which the CPU's second-level
//! TLB holds. Linux gives a mapping huge pages on request (`madvise(MADV_HUGEPAGE)`) when
//! `/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` (the usual default) or `always`;
//! numpy asks for them for every array of 4 MiB or more. The request only helps pages not yet
//! touched, so it is made right after allocation, before the table is written
//! (docs/decisions.md, "huge-page-tables").
//!
//! Buffers under 2 MiB cannot be given huge pages one by one: the process's allocator maps each
//! large one in pages of its own. Many such buffers read together (a search index's per-cluster
//! int8 codes: a thousand buffers of 128 KiB at a million rows of 128 values, streamed one after
//! another by every batch of queries) share huge pages when they are allocated from
//! [`HugePages`], mimalloc's allocator, which carves them out of large regions it backs with
//! transparent huge pages ([`HugeVec`]; docs/decisions.md, "pooled-huge-pages").

use allocator_api2::alloc::{AllocError, Allocator};
use std::alloc::{GlobalAlloc, Layout};
use std::ptr::NonNull;

/// Tables smaller than this are left alone, as numpy leaves them: the request covers whole
/// 2 MiB pages inside the table only.
pub const MIN_BYTES: usize = 4 << 20;

/// Asks the kernel to back `data`'s whole 2 MiB pages with huge pages, when it is at least
/// [`MIN_BYTES`] long. A hint: nothing changes when the system refuses it or has no such pages,
/// and the values are untouched.
pub fn advise<T>(data: &mut [T]) {
    advise_range(data.as_mut_ptr() as usize, std::mem::size_of_val(data));
}

/// An empty vector with room for `n` values, in huge pages where [`advise`] would give them:
/// for tables built by pushing, which would touch their pages before an `advise` afterwards.
pub fn with_capacity<T>(n: usize) -> Vec<T> {
    let mut v = Vec::with_capacity(n);
    advise_range(v.as_mut_ptr() as usize, v.capacity() * std::mem::size_of::<T>());
    v
}

/// The allocator of [`HugeVec`]: mimalloc's, whose regions are backed by transparent huge pages
/// where the system offers them. Only the vectors that name it use it; everything else keeps the
/// process's allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HugePages;

/// A vector whose buffer comes from [`HugePages`].
pub type HugeVec<T> = allocator_api2::vec::Vec<T, HugePages>;

/// An empty [`HugeVec`] with room for `n` values.
pub fn huge_vec<T>(n: usize) -> HugeVec<T> {
    HugeVec::with_capacity_in(n, HugePages)
}

// SAFETY: every block comes from mimalloc and goes back to it with the layout it was allocated
// with; empty layouts never reach it (a dangling, aligned pointer stands for them).
unsafe impl Allocator for HugePages {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            // SAFETY: an alignment is never zero.
            let dangling = unsafe { NonNull::new_unchecked(std::ptr::without_provenance_mut(layout.align())) };
            return Ok(NonNull::slice_from_raw_parts(dangling, 0));
        }
        // SAFETY: the layout has a non-zero size.
        let block = unsafe { mimalloc::MiMalloc.alloc(layout) };
        NonNull::new(block).map(|b| NonNull::slice_from_raw_parts(b, layout.size())).ok_or(AllocError)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            // SAFETY: `ptr` came from `allocate` with this layout (the caller's contract).
            unsafe { mimalloc::MiMalloc.dealloc(ptr.as_ptr(), layout) };
        }
    }

    unsafe fn grow(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if old.size() == 0 || old.align() != new.align() {
            // SAFETY: the caller's contract, passed on.
            return unsafe { grow_by_copy(self, ptr, old, new) };
        }
        // SAFETY: `ptr` holds a block of layout `old` from mimalloc, `new` is at least as large
        // with the same alignment (the caller's contract and the test above).
        let block = unsafe { mimalloc::MiMalloc.realloc(ptr.as_ptr(), old, new.size()) };
        NonNull::new(block).map(|b| NonNull::slice_from_raw_parts(b, new.size())).ok_or(AllocError)
    }
}

/// [`Allocator::grow`] by a new block, a copy and freeing the old one.
///
/// # Safety
/// As for [`Allocator::grow`].
unsafe fn grow_by_copy(a: &HugePages, ptr: NonNull<u8>, old: Layout, new: Layout) -> Result<NonNull<[u8]>, AllocError> {
    let block = a.allocate(new)?;
    // SAFETY: both blocks hold at least `old.size()` bytes and are distinct; `ptr` is freed
    // with its own layout.
    unsafe {
        std::ptr::copy_nonoverlapping(ptr.as_ptr(), block.as_ptr().cast::<u8>(), old.size());
        a.deallocate(ptr, old);
    }
    Ok(block)
}

fn advise_range(start: usize, bytes: usize) {
    if bytes < MIN_BYTES {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let (lo, hi) = (start.next_multiple_of(HUGE), (start + bytes) / HUGE * HUGE);
        if hi > lo {
            // SAFETY: [lo, hi) lies inside one allocation that the caller holds mutably;
            // MADV_HUGEPAGE changes how the range is backed, never its contents.
            let _ = unsafe { rustix::mm::madvise(lo as *mut _, hi - lo, rustix::mm::Advice::LinuxHugepage) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = start;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's own account of the mapping holding `addr`: its `AnonHugePages` in kB.
    #[cfg(target_os = "linux")]
    fn huge_kb_at(addr: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((lo, hi)) = range.split_once('-')
                && let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
            } else if inside && let Some(kb) = line.strip_prefix("AnonHugePages:") {
                return kb.trim().trim_end_matches(" kB").trim().parse().ok();
            }
        }
        None
    }

    /// Vectors from [`HugePages`] keep their values through growth (in place or moved),
    /// shrinking and clones, honour their type's alignment, and many medium buffers written
    /// through them lie (at least partly) in huge pages where the system offers them.
    #[test]
    fn pooled_vectors_keep_values_and_share_huge_pages() {
        let huge_copy = |values: &[f32]| {
            let mut v = huge_vec(values.len());
            v.extend_from_slice(values);
            v
        };
        #[repr(align(64))]
        #[derive(Clone, Copy, Debug, PartialEq)]
        struct Line([u8; 64]);
        let mut lines: HugeVec<Line> = huge_vec(0);
        let mut grown: HugeVec<u32> = huge_vec(3);
        for i in 0..100_000u32 {
            grown.push(i);
            if i % 1000 == 0 {
                lines.push(Line([i as u8; 64]));
                assert_eq!(lines.as_ptr() as usize % 64, 0, "a 64-byte aligned type misaligned");
            }
        }
        assert!(grown.iter().enumerate().all(|(i, &x)| x == i as u32));
        assert!(lines.iter().enumerate().all(|(i, l)| l.0 == [(i * 1000) as u8; 64]));
        grown.truncate(10);
        grown.shrink_to_fit();
        assert_eq!(&grown[..], &(0..10).collect::<Vec<u32>>()[..]);
        assert_eq!(grown.clone(), grown);
        assert_eq!(&huge_copy(&[1.5f32, 2.5])[..], &[1.5, 2.5]);
        let empty: HugeVec<()> = huge_vec(10);
        assert!(empty.is_empty());
        // A thousand buffers of 128 KiB, as an index's clusters hold at a million rows.
        let buffers: Vec<HugeVec<f32>> = (0..1000).map(|b| huge_copy(&vec![b as f32; 32 * 1024])).collect();
        assert!(buffers.iter().enumerate().all(|(b, v)| v.iter().all(|&x| x == b as f32)));
        #[cfg(target_os = "linux")]
        {
            let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
            if mode.contains("[never]") || mode.is_empty() {
                eprintln!("skipped the huge page check: transparent huge pages are off ({})", mode.trim());
                return;
            }
            let kb = huge_kb_at(buffers[500].as_ptr() as usize).expect("the buffers' mapping in /proc/self/smaps");
            assert!(kb >= 2048, "no huge page among 1,000 pooled buffers of 128 KiB (THP {})", mode.trim());
        }
    }

    /// Values are kept, small tables are left alone, and a large table written after the
    /// request is (at least partly) in huge pages where the system offers them.
    #[test]
    fn large_tables_get_huge_pages_and_keep_their_values() {
        let mut small = vec![1.5f32; 1000];
        advise(&mut small);
        assert!(small.iter().all(|&x| x == 1.5));
        let mut big = vec![0.0f32; (64 << 20) / 4];
        advise(&mut big);
        for (i, x) in big.iter_mut().enumerate() {
            *x = i as f32;
        }
        assert!(big.iter().enumerate().all(|(i, &x)| x == i as f32));
        let mut pushed = with_capacity::<u64>((64 << 20) / 8);
        pushed.extend(0..(64 << 20) / 8);
        assert!(pushed.iter().enumerate().all(|(i, &x)| x == i as u64));
        #[cfg(target_os = "linux")]
        {
            let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
            if mode.contains("[never]") || mode.is_empty() {
                eprintln!("skipped the huge page check: transparent huge pages are off ({})", mode.trim());
                return;
            }
            for (table, at) in [("written", big.as_ptr() as usize), ("pushed", pushed.as_ptr() as usize)] {
                let kb = huge_kb_at(at + (32 << 20)).expect("the table's mapping in /proc/self/smaps");
                assert!(kb >= 2048, "no huge page in a 64 MiB {table} table asked for them (THP {})", mode.trim());
            }
        }
    }
}
