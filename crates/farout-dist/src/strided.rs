//! Rows dealt round-robin over ranks: row `c` is rank `c mod P`'s local row `c / P`.

use crate::DistError;

/// Rank `rank`'s rows of `rows` rows dealt round-robin over `ranks` ranks: global row `c`
/// belongs to rank `c mod ranks`, as its local row `c / ranks`.
///
/// The output layer's classes are split this way rather than into contiguous ranges
/// ([`crate::Shards`]) because class ids usually follow frequency (the synthetic face task
/// numbers its identities by size, extreme-classification data sets their labels by count):
/// contiguous ranges give one rank every frequent class and another every rare one, whose rows
/// train differently and cluster differently in a search index, so one rank searches and scores
/// more than the other at every step. Dealt, every rank holds every P-th class of each
/// frequency. Sizes differ by at most one, larger ranks first, and local order follows global
/// order, so a rank's top-k ties break to the lower class as over the whole layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strided {
    rows: usize,
    rank: usize,
    ranks: usize,
}

impl Strided {
    /// Rank `rank` of `ranks`; an error if there are no ranks or `rank` is not one of them.
    pub fn new(rows: usize, rank: usize, ranks: usize) -> Result<Self, DistError> {
        if ranks == 0 || rank >= ranks {
            return Err(DistError::Shards(format!("rank {rank} of {ranks} ranks")));
        }
        Ok(Self { rows, rank, ranks })
    }

    /// Every row on one rank (local row = global row).
    pub fn whole(rows: usize) -> Self {
        Self { rows, rank: 0, ranks: 1 }
    }

    /// Rows of the whole split.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Rows this rank holds.
    pub fn len(&self) -> usize {
        Self::count(self.rows, self.rank, self.ranks)
    }

    /// Whether this rank holds no row (fewer rows than ranks).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows rank `rank` of `ranks` holds: `ceil((rows - rank) / ranks)`, 0 past the rows.
    pub fn count(rows: usize, rank: usize, ranks: usize) -> usize {
        if rank >= rows || ranks == 0 { 0 } else { (rows - rank).div_ceil(ranks) }
    }

    /// Rows per rank, in rank order.
    pub fn counts(rows: usize, ranks: usize) -> Vec<usize> {
        (0..ranks).map(|r| Self::count(rows, r, ranks)).collect()
    }

    /// Where each global row lies, in global order, when every rank's rows are laid one rank
    /// after another (what an allgather of the ranks' local rows gives): row `c` at the
    /// start of rank `c mod ranks`'s rows plus its local row `c / ranks`.
    pub fn joined_positions(rows: usize, ranks: usize) -> Vec<usize> {
        let starts = crate::starts_of(&Self::counts(rows, ranks));
        (0..rows).map(|c| starts[c % ranks] + c / ranks).collect()
    }

    /// The global row of local row `local`.
    #[inline]
    pub fn global(&self, local: usize) -> usize {
        local * self.ranks + self.rank
    }

    /// The local row of global row `row`, or `None` if another rank holds it (or it is past
    /// the rows).
    #[inline]
    pub fn local(&self, row: usize) -> Option<usize> {
        (row < self.rows && row % self.ranks == self.rank).then_some(row / self.ranks)
    }

    /// The rank holding global row `row`.
    pub fn owner(&self, row: usize) -> usize {
        row % self.ranks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        let s = Strided::new(10, 1, 4).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!((0..s.len()).map(|l| s.global(l)).collect::<Vec<_>>(), vec![1, 5, 9]);
        assert_eq!((s.local(5), s.local(6), s.local(13)), (Some(1), None, None));
        assert_eq!(Strided::counts(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(Strided::counts(2, 4), vec![1, 1, 0, 0]);
        assert!(Strided::new(5, 2, 2).is_err());
        assert!(Strided::new(5, 0, 0).is_err());
        let one = Strided::whole(7);
        assert_eq!((one.len(), one.global(6), one.local(6)), (7, 6, Some(6)));
    }

    proptest! {
        /// Every row has exactly one owner, at the local row that maps back to it; local order
        /// follows global order; sizes differ by at most one.
        #[test]
        fn the_ranks_partition_the_rows(rows in 0usize..300, ranks in 1usize..17) {
            let mut seen = vec![0usize; rows];
            for rank in 0..ranks {
                let s = Strided::new(rows, rank, ranks).unwrap();
                for l in 0..s.len() {
                    let c = s.global(l);
                    prop_assert!(c < rows);
                    prop_assert_eq!(s.local(c), Some(l));
                    prop_assert_eq!(s.owner(c), rank);
                    prop_assert!(l == 0 || s.global(l - 1) < c);
                    seen[c] += 1;
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1));
            // The ranks' rows laid one rank after another: each global row where it says.
            let joined: Vec<usize> = (0..ranks)
                .flat_map(|rank| {
                    let s = Strided::new(rows, rank, ranks).unwrap();
                    (0..s.len()).map(move |l| s.global(l))
                })
                .collect();
            let at = Strided::joined_positions(rows, ranks);
            prop_assert!((0..rows).all(|c| joined[at[c]] == c));
            let c = Strided::counts(rows, ranks);
            prop_assert_eq!(c.iter().sum::<usize>(), rows);
            prop_assert!(c.iter().max().unwrap() - c.iter().min().unwrap() <= 1);
        }
    }
}
