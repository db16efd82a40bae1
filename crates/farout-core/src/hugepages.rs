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
