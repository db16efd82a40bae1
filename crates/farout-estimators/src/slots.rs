//! [`Slots`]: where each class sits in a sample's candidate set, over all K classes.

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
}
