//! Parts laid one after another: where each starts.

use std::ops::Add;

/// Where each part starts when parts of lengths `counts` are laid one after another in order:
/// the exclusive prefix sums `[0, c0, c0 + c1, ...]`, one per part (MPI's displacements of a
/// gather or an all-to-all with these counts).
pub fn starts_of<T: Copy + Default + Add<Output = T>>(counts: &[T]) -> Vec<T> {
    counts.iter().scan(T::default(), |at, &c| Some(std::mem::replace(at, *at + c))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Part `r` starts where the parts before it end, and occupies its own count.
        #[test]
        fn each_part_starts_where_the_ones_before_it_end(counts in proptest::collection::vec(0usize..50, 0..20)) {
            let starts = starts_of(&counts);
            prop_assert_eq!(starts.len(), counts.len());
            for (r, &at) in starts.iter().enumerate() {
                prop_assert_eq!(at, counts[..r].iter().sum::<usize>());
            }
        }
    }

    #[test]
    fn starts_of_integers_of_any_width() {
        assert_eq!(starts_of(&[3i32, 0, 2, 4]), vec![0, 3, 3, 5]);
        assert!(starts_of::<usize>(&[]).is_empty());
    }
}
