//! Walker's alias method: O(1) draws from a fixed discrete distribution.
//!
//! word2vec draws negatives from a 10^8-entry table filled in proportion to unigram^0.75; the
//! alias table gives the exact distribution with K entries (Vose's construction, O(K) to build)
//! and one uniform index plus one uniform float per draw.
//!
//! Each column's keep probability and alias share one 8-byte cell, so a draw reads one cache
//! line, and the choice between the column and its alias is a select, not a branch: a
//! mispredicted branch would hold up the next draw's load, where with a select the loads of
//! successive draws overlap (on a 800,000-word vocabulary the table is 6.4 MB, out of L2).

use crate::rng::{Rng, RngExt};

/// A discrete distribution over `0..len` prepared for O(1) sampling.
#[derive(Clone, Debug)]
pub struct AliasTable {
    /// Column `i`: the probability of keeping `i`, else its alias.
    cells: Vec<Cell>,
    /// The normalised probabilities, for importance corrections (`log Q`).
    probs: Vec<f64>,
}

/// One column of the table.
#[derive(Clone, Copy, Debug)]
struct Cell {
    keep: f32,
    alias: u32,
}

impl AliasTable {
    /// Builds the table for weights `w` (non-negative, finite, not all zero); `None` otherwise.
    pub fn new(w: &[f64]) -> Option<Self> {
        let total: f64 = w.iter().sum();
        if w.is_empty() || w.len() > u32::MAX as usize || !(total > 0.0 && total.is_finite()) {
            return None;
        }
        if w.iter().any(|&x| !(x >= 0.0)) {
            return None;
        }
        let n = w.len();
        let probs: Vec<f64> = w.iter().map(|&x| x / total).collect();
        let mut scaled: Vec<f64> = probs.iter().map(|p| p * n as f64).collect();
        let (mut small, mut large): (Vec<u32>, Vec<u32>) = (0..n as u32).partition(|&i| scaled[i as usize] < 1.0);
        let mut keep = vec![1.0f32; n];
        let mut alias: Vec<u32> = (0..n as u32).collect();
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            keep[s as usize] = scaled[s as usize] as f32;
            alias[s as usize] = l;
            scaled[l as usize] -= 1.0 - scaled[s as usize];
            if scaled[l as usize] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        // Whatever is left has (up to rounding) probability exactly 1 of keeping itself.
        // Drawn at random cells, tens of thousands of times a second: in huge pages at large n.
        let mut cells = crate::hugepages::with_capacity(n);
        cells.extend(keep.into_iter().zip(alias).map(|(keep, alias)| Cell { keep, alias }));
        Some(Self { cells, probs })
    }

    /// Number of outcomes.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Always false (a table has at least one outcome).
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// Number of outcomes with a non-zero probability.
    pub fn support(&self) -> usize {
        self.probs.iter().filter(|&&p| p > 0.0).count()
    }

    /// Probability of outcome `i`.
    #[inline]
    pub fn prob(&self, i: usize) -> f64 {
        self.probs[i]
    }

    /// One draw.
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> u32 {
        self.resolve(self.draw_column(rng))
    }

    /// The randomness of one draw, taken from `rng` as [`Self::sample`] takes it: a column
    /// and a uniform float. [`Self::resolve`] turns it into the draw. A caller making many
    /// draws can take them all first and [`Self::prefetch`] their columns, so that their
    /// cache misses overlap other work.
    #[inline]
    pub fn draw_column(&self, rng: &mut Rng) -> (u32, f32) {
        let i = rng.random_range(0..self.cells.len());
        (i as u32, rng.random::<f32>())
    }

    /// Starts loading column `i` into the caches (a hint, no effect on any result).
    #[inline]
    pub fn prefetch(&self, i: u32) {
        crate::kernels::prefetch(std::slice::from_ref(&self.cells[i as usize]));
    }

    /// The draw of column `i` and float `u` (from [`Self::draw_column`]).
    #[inline]
    pub fn resolve(&self, (i, u): (u32, f32)) -> u32 {
        let c = self.cells[i as usize];
        std::hint::select_unpredictable(u < c.keep, i, c.alias)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::seeded;

    #[test]
    fn frequencies_match_the_weights() {
        // Chi-square-like check: every outcome's frequency within 5 standard errors.
        let w = [1.0, 0.0, 3.0, 0.5, 10.0, 2.5];
        let t = AliasTable::new(&w).unwrap();
        let n = 400_000;
        let mut counts = [0usize; 6];
        let mut r = seeded(5, 0);
        for _ in 0..n {
            counts[t.sample(&mut r) as usize] += 1;
        }
        let total: f64 = w.iter().sum();
        for (i, &c) in counts.iter().enumerate() {
            let p = w[i] / total;
            let se = (p * (1.0 - p) / n as f64).sqrt();
            let f = c as f64 / n as f64;
            assert!((f - p).abs() <= 5.0 * se + 1e-12, "outcome {i}: {f} vs {p}");
            assert!((t.prob(i) - p).abs() < 1e-12);
        }
        assert_eq!(counts[1], 0, "zero weight is never drawn");
    }

    #[test]
    fn rejects_bad_weights() {
        assert!(AliasTable::new(&[]).is_none());
        assert!(AliasTable::new(&[0.0, 0.0]).is_none());
        assert!(AliasTable::new(&[1.0, -1.0, 2.0]).is_none());
        assert!(AliasTable::new(&[1.0, f64::NAN]).is_none());
    }
}
