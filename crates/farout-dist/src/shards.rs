//! Contiguous splits of K rows (classes, labels) over P ranks.

use std::ops::Range;

use crate::DistError;

/// A split of rows `0..rows()` into `parts()` contiguous, ordered ranges: rank `r` owns
/// `range(r)`, and the ranges tile `0..rows()` in rank order (some may be empty when there are
/// fewer rows than ranks). Contiguity keeps a rank's rows one slice of W and makes a gather in
/// rank order return rows in global order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shards {
    /// `bounds[r]..bounds[r + 1]` is rank r's range; `bounds[0] == 0`, non-decreasing.
    bounds: Vec<usize>,
}

impl Shards {
    /// Equal sizes: the first `rows % parts` ranks get `rows / parts + 1` rows, the others
    /// `rows / parts`, so sizes differ by at most one.
    pub fn even(rows: usize, parts: usize) -> Result<Self, DistError> {
        if parts == 0 {
            return Err(DistError::Shards("zero parts".into()));
        }
        let (q, extra) = (rows / parts, rows % parts);
        let bounds = (0..=parts).map(|r| r * q + r.min(extra)).collect();
        Ok(Self { bounds })
    }

    /// Contiguous split minimising the largest per-rank sum of `weights` (e.g. label
    /// frequencies, so that every rank sees about the same number of positives). Every rank gets
    /// at least one row when `weights.len() >= parts`.
    ///
    /// Exact: the optimal bottleneck `T` is found by bisection over the integers with a greedy
    /// feasibility test (`O(K log sum)`), then the greedy split at `T` is built, closing a part
    /// early only when the rows left are just enough for one per remaining rank.
    pub fn balanced(weights: &[u64], parts: usize) -> Result<Self, DistError> {
        if parts == 0 {
            return Err(DistError::Shards("zero parts".into()));
        }
        let rows = weights.len();
        let w = |i: usize| u128::from(weights[i]);
        // Parts a greedy fill with bottleneck `t` needs (`t` >= every weight).
        let parts_needed = |t: u128| {
            let (mut n, mut sum) = (1usize, 0u128);
            for i in 0..rows {
                if sum + w(i) > t {
                    n += 1;
                    sum = 0;
                }
                sum += w(i);
            }
            n
        };
        let mut lo = weights.iter().copied().max().map_or(0, u128::from);
        let mut hi: u128 = weights.iter().map(|&x| u128::from(x)).sum();
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if parts_needed(mid) <= parts { hi = mid } else { lo = mid + 1 }
        }
        let t = lo;

        let mut bounds = Vec::with_capacity(parts + 1);
        bounds.push(0);
        let mut sum = 0u128;
        for i in 0..rows {
            let start = *bounds.last().unwrap_or(&0);
            let parts_after = parts - bounds.len();
            if i > start && (rows - i <= parts_after || sum + w(i) > t) {
                bounds.push(i);
                sum = 0;
            }
            sum += w(i);
        }
        bounds.push(rows);
        bounds.resize(parts + 1, rows);
        debug_assert_eq!(bounds.len(), parts + 1);
        Ok(Self { bounds })
    }

    /// A split given by its `parts + 1` bounds: `0 = b[0] <= b[1] <= ... <= b[parts] = rows`.
    pub fn from_bounds(bounds: Vec<usize>) -> Result<Self, DistError> {
        if bounds.len() < 2 {
            return Err(DistError::Shards(format!("{} bounds: need at least 2", bounds.len())));
        }
        if bounds[0] != 0 {
            return Err(DistError::Shards(format!("the first bound is {}, not 0", bounds[0])));
        }
        if let Some(r) = bounds.windows(2).position(|b| b[0] > b[1]) {
            return Err(DistError::Shards(format!("bounds decrease at rank {r}: {} > {}", bounds[r], bounds[r + 1])));
        }
        Ok(Self { bounds })
    }

    /// Number of ranks.
    pub fn parts(&self) -> usize {
        self.bounds.len() - 1
    }

    /// Number of rows split.
    pub fn rows(&self) -> usize {
        self.bounds[self.parts()]
    }

    /// The `parts() + 1` bounds.
    pub fn bounds(&self) -> &[usize] {
        &self.bounds
    }

    /// Rows owned by `rank`.
    ///
    /// # Panics
    /// If `rank >= parts()` (like slice indexing); [`get`](Self::get) does not panic.
    pub fn range(&self, rank: usize) -> Range<usize> {
        self.bounds[rank]..self.bounds[rank + 1]
    }

    /// Rows owned by `rank`, or `None` if there is no such rank.
    pub fn get(&self, rank: usize) -> Option<Range<usize>> {
        (rank < self.parts()).then(|| self.range(rank))
    }

    /// Number of rows owned by `rank` (0 for a rank that does not exist).
    pub fn len(&self, rank: usize) -> usize {
        self.get(rank).map_or(0, |r| r.len())
    }

    /// Whether the split has no rows at all.
    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// The rank owning `row`, or `None` if `row >= rows()`. `O(log parts)`.
    pub fn owner(&self, row: usize) -> Option<usize> {
        if row >= self.rows() {
            return None;
        }
        // Last rank whose range starts at or before `row`; empty ranges before it are skipped.
        Some(self.bounds.partition_point(|&b| b <= row) - 1)
    }

    /// The owner of `row` and its index inside the owner's range.
    pub fn locate(&self, row: usize) -> Option<(usize, usize)> {
        self.owner(row).map(|r| (r, row - self.bounds[r]))
    }

    /// Rows per rank, in rank order: the `counts` of an allgatherv of one value per row.
    pub fn counts(&self) -> Vec<usize> {
        self.bounds.windows(2).map(|b| b[1] - b[0]).collect()
    }
}

/// The index of `row` among the rows `first..first + len` (a rank's own rows), or `None` if it
/// is not one of them.
pub fn local_index(row: usize, first: usize, len: usize) -> Option<usize> {
    row.checked_sub(first).filter(|&l| l < len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check_tiling(s: &Shards, rows: usize, parts: usize) {
        assert_eq!(s.parts(), parts);
        assert_eq!(s.rows(), rows);
        assert_eq!(s.counts().iter().sum::<usize>(), rows);
        let mut next = 0;
        for r in 0..parts {
            let range = s.range(r);
            assert_eq!(range.start, next);
            next = range.end;
            for row in range {
                assert_eq!(s.owner(row), Some(r));
                assert_eq!(s.locate(row), Some((r, row - s.bounds()[r])));
            }
        }
        assert_eq!(next, rows);
        assert_eq!(s.owner(rows), None);
        assert_eq!(s.get(parts), None);
        assert_eq!(s.len(parts), 0);
    }

    #[test]
    fn even_examples() {
        let s = Shards::even(10, 4).unwrap();
        assert_eq!(s.bounds(), &[0, 3, 6, 8, 10]);
        assert_eq!(s.counts(), vec![3, 3, 2, 2]);
        assert_eq!(s.owner(5), Some(1));
        assert_eq!(s.owner(9), Some(3));
        assert_eq!(Shards::even(2, 4).unwrap().counts(), vec![1, 1, 0, 0]);
        assert_eq!(Shards::even(2, 4).unwrap().owner(1), Some(1));
        assert!(Shards::even(0, 3).unwrap().is_empty());
        assert!(Shards::even(5, 0).is_err());
    }

    #[test]
    fn balanced_examples() {
        // One heavy head label, a long light tail (Zipf-like label frequencies).
        let w = [100, 1, 1, 1, 1, 1, 1, 1, 1, 1];
        let s = Shards::balanced(&w, 3).unwrap();
        assert_eq!(s.range(0), 0..1, "the head label alone");
        let sums: Vec<u64> = (0..3).map(|r| w[s.range(r)].iter().sum()).collect();
        assert_eq!(sums.iter().max(), Some(&100));
        assert!(s.counts().iter().all(|&c| c > 0));
        // Equal weights: as even as Shards::even.
        let s = Shards::balanced(&[1; 10], 4).unwrap();
        assert_eq!(s.counts().iter().max(), Some(&3));
        // Fewer rows than ranks, zero weights, no rows.
        assert_eq!(Shards::balanced(&[5, 7], 4).unwrap().counts(), vec![1, 1, 0, 0]);
        assert_eq!(Shards::balanced(&[0, 0, 0], 2).unwrap().counts().len(), 2);
        assert_eq!(Shards::balanced(&[], 3).unwrap().bounds(), &[0, 0, 0, 0]);
        assert!(Shards::balanced(&[1], 0).is_err());
        // Weights near u64::MAX do not overflow the sums.
        let s = Shards::balanced(&[u64::MAX; 5], 2).unwrap();
        assert_eq!(s.counts(), vec![3, 2]);
    }

    #[test]
    fn from_bounds_validates() {
        let s = Shards::from_bounds(vec![0, 0, 4, 4, 9]).unwrap();
        check_tiling(&s, 9, 4);
        assert_eq!(s.owner(0), Some(1));
        assert_eq!(s.owner(4), Some(3));
        assert!(Shards::from_bounds(vec![0]).is_err());
        assert!(Shards::from_bounds(vec![1, 3]).is_err());
        assert!(Shards::from_bounds(vec![0, 5, 3]).is_err());
    }

    /// Smallest possible largest part sum over every split of `w` into `parts` contiguous
    /// (possibly empty) parts, by enumerating the split points.
    fn brute_force_bottleneck(w: &[u64], parts: usize) -> u128 {
        fn go(w: &[u64], parts: usize) -> u128 {
            if parts == 1 {
                return w.iter().map(|&x| u128::from(x)).sum();
            }
            (0..=w.len())
                .map(|cut| {
                    let head: u128 = w[..cut].iter().map(|&x| u128::from(x)).sum();
                    head.max(go(&w[cut..], parts - 1))
                })
                .min()
                .unwrap()
        }
        go(w, parts)
    }

    proptest! {
        #[test]
        fn even_is_a_tiling_with_sizes_within_one(rows in 0usize..200, parts in 1usize..20) {
            let s = Shards::even(rows, parts).unwrap();
            check_tiling(&s, rows, parts);
            let c = s.counts();
            prop_assert!(c.iter().max().unwrap() - c.iter().min().unwrap() <= 1);
            prop_assert!(c.windows(2).all(|p| p[0] >= p[1]), "larger ranges first");
        }

        #[test]
        fn balanced_is_optimal(
            w in prop::collection::vec(prop_oneof![0u64..4, 0u64..100, Just(1000u64)], 0..9),
            parts in 1usize..5,
        ) {
            let s = Shards::balanced(&w, parts).unwrap();
            check_tiling(&s, w.len(), parts);
            let worst = (0..parts)
                .map(|r| w[s.range(r)].iter().map(|&x| u128::from(x)).sum::<u128>())
                .max()
                .unwrap();
            prop_assert_eq!(worst, brute_force_bottleneck(&w, parts));
            if w.len() >= parts {
                prop_assert!(s.counts().iter().all(|&c| c > 0), "{:?}", s.counts());
            }
        }

        #[test]
        fn balanced_large_inputs_tile(
            w in prop::collection::vec(0u64..1_000_000, 0..2000),
            parts in 1usize..64,
        ) {
            let s = Shards::balanced(&w, parts).unwrap();
            check_tiling(&s, w.len(), parts);
            // The optimum is at most the ideal share plus one row's weight.
            let total: u128 = w.iter().map(|&x| u128::from(x)).sum();
            let max_w = w.iter().copied().max().map_or(0, u128::from);
            let worst = (0..parts)
                .map(|r| w[s.range(r)].iter().map(|&x| u128::from(x)).sum::<u128>())
                .max()
                .unwrap();
            prop_assert!(worst <= total.div_ceil(parts as u128) + max_w);
        }
    }
}
