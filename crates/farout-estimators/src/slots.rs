//! Where each class sits in a sample's candidate set: [`Slots`] over all K classes,
//! [`FewSlots`] for a few hundred classes among many.

use farout_core::ClassId;

/// The position of every class in the candidate set `U` of the current sample, without
/// clearing K entries per sample: an entry is valid when its stamp is the current one. Per
/// insert one load and, for a new class, two stores: cheaper than a hash map for the few
/// hundred to few thousand classes of a sample's `U` (its arrays, 8 bytes per class of the
/// layer, are kept across samples).
#[derive(Debug, Default)]
pub struct Slots {
    stamp: Vec<u32>,
    slot: Vec<u32>,
    current: u32,
}

impl Slots {
    /// Starts an empty set over `k` classes.
    pub fn begin(&mut self, k: usize) {
        if self.stamp.len() < k {
            self.stamp.resize(k, 0);
            self.slot.resize(k, 0);
        }
        self.current = self.current.wrapping_add(1);
        if self.current == 0 {
            self.stamp.fill(0);
            self.current = 1;
        }
    }

    /// The slot of `c` (below the `k` of [`Slots::begin`]), assigning `next` if it has none
    /// yet; returns (slot, whether new).
    pub fn insert(&mut self, c: ClassId, next: usize) -> (usize, bool) {
        let i = c as usize;
        if self.stamp[i] == self.current {
            (self.slot[i] as usize, false)
        } else {
            self.stamp[i] = self.current;
            self.slot[i] = next as u32;
            (next, true)
        }
    }
}

/// The position of each of a few classes (up to a capacity given per set) in a set being
/// built: open addressing with linear probing in a table of two to four times the capacity,
/// a few kilobytes that stay in cache. Where the classes are a few hundred of tens of
/// thousands, the table of [`Slots`] is read at random, one cache miss per insert once other
/// work has evicted it.
#[derive(Debug, Default)]
pub struct FewSlots {
    /// `class + 1` (0: empty) and its slot, per table entry.
    entries: Vec<(u32, u32)>,
    shift: u32,
}

impl FewSlots {
    /// Starts an empty set of at most `capacity` classes.
    pub fn begin(&mut self, capacity: usize) {
        let size = (2 * capacity.max(16)).next_power_of_two();
        self.entries.clear();
        self.entries.resize(size, (0, 0));
        self.shift = 64 - size.trailing_zeros();
    }

    /// The slot of `c`, assigning `next` if it has none yet; returns (slot, whether new).
    /// At most the capacity of [`FewSlots::begin`] classes may be inserted.
    #[inline]
    pub fn insert(&mut self, c: ClassId, next: usize) -> (usize, bool) {
        let mask = self.entries.len() - 1;
        // Fibonacci hashing: the high bits of the product spread consecutive classes.
        let mut i = (u64::from(c).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize;
        loop {
            let (key, slot) = self.entries[i];
            if key == c + 1 {
                return (slot as usize, false);
            }
            if key == 0 {
                self.entries[i] = (c + 1, next as u32);
                return (next, true);
            }
            i = (i + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_set_starts_empty_and_keeps_first_slots() {
        let mut s = Slots::default();
        s.begin(10);
        assert_eq!(s.insert(7, 0), (0, true));
        assert_eq!(s.insert(3, 1), (1, true));
        assert_eq!(s.insert(7, 2), (0, false));
        s.begin(10);
        assert_eq!(s.insert(3, 0), (0, true), "a new set forgets the last one's classes");
        // The stamp wraps: every entry is cleared rather than mistaken for the current set's.
        s.current = u32::MAX;
        s.stamp[5] = 1;
        s.begin(10);
        assert_eq!(s.current, 1);
        assert_eq!(s.insert(5, 4), (4, true));
    }

    #[test]
    fn few_slots_keep_first_slots_like_the_table_over_all_classes() {
        let (mut few, mut all) = (FewSlots::default(), Slots::default());
        let mut r = 12345u64;
        for set in 0..20 {
            let n = 1 + set * 17;
            few.begin(n);
            all.begin(1_000_000);
            let mut next = 0;
            for _ in 0..n {
                r = r.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                // Few distinct classes in some sets (repeats), far apart in others.
                let c = ((r >> 33) % if set % 2 == 0 { n as u64 / 2 + 1 } else { 999_999 }) as ClassId;
                let got = few.insert(c, next);
                assert_eq!(got, all.insert(c, next), "set {set}, class {c}");
                next += usize::from(got.1);
            }
        }
    }
}
