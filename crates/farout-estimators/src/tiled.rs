//! Dense gradients a tile of classes at a time, for losses normalised by a log-sum-exp (the
//! exact softmax): the normaliser is computed online, tile by tile (Milakov & Gimelshein,
//! *Online normalizer calculation for softmax*, 2018), so that a layer can score a tile of
//! classes and summarise it while the tile is in cache, and later turn the same tile into
//! gradients and feed them to the two backward products while it is in cache again. The
//! whole-batch path instead streams the `[B, K]` scores through memory between each of the three
//! matrix products and each pass of the loss.
//!
//! For a sample with positives P and the tiles t of classes:
//!
//! ```text
//! scan:     m_t = max_{k in t} z_k,   e_k = exp(z_k - m_t) (in place of z_k),
//!           s_t = sum_{k in t} e_k,   q_t = sum_{p in P, p in t} z_p
//! merge:    M = max_t m_t,   S = sum_t s_t exp(m_t - M),   Q = sum_t q_t
//! loss:     L = |P| (M + ln S) - Q                        (= sum_{p in P} (ln sum_k e^{z_k} - z_p))
//! gradient: dL/dz_k = |P| e_k exp(m_t - M) / S - [k in P]    for k in t
//! ```
//!
//! one exponential per score, as in the whole-batch path. A sample without positives has loss 0
//! and no gradient.

use crate::Softmax;
use farout_core::{ClassId, kernels, vexp};
use std::ops::Range;

/// The log-sum-exp summary of some of a sample's scores: their max `m`, `s = sum exp(z - m)` and
/// the sum `q` of the positives' scores among them. [`LogSumExp::merge`] combines summaries
/// of disjoint sets of classes (tiles, or the classes of several ranks).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogSumExp {
    /// The largest score (`-inf` for no scores).
    pub max: f32,
    /// `sum exp(z - max)`.
    pub exp_sum: f64,
    /// The sum of the positives' scores.
    pub pos_sum: f64,
}

impl Default for LogSumExp {
    fn default() -> Self {
        Self { max: f32::NEG_INFINITY, exp_sum: 0.0, pos_sum: 0.0 }
    }
}

impl LogSumExp {
    /// The summary of the union of the classes `self` and `other` summarise.
    pub fn merge(self, other: Self) -> Self {
        let max = self.max.max(other.max);
        Self { max, exp_sum: self.exp_sum_at(max) + other.exp_sum_at(max), pos_sum: self.pos_sum + other.pos_sum }
    }

    /// `sum exp(z - max)` over the summarised scores, for a `max` at least [`Self::max`] (0 for
    /// a summary of no scores, whatever `max`).
    pub fn exp_sum_at(&self, max: f32) -> f64 {
        if self.exp_sum == 0.0 { 0.0 } else { self.exp_sum * f64::from(self.max - max).exp() }
    }

    /// `|P| (max + ln exp_sum) - pos_sum`: the softmax loss of a sample with `n_pos` positives
    /// when `self` summarises all its classes (0 without positives).
    pub fn loss(&self, n_pos: usize) -> f64 {
        if n_pos == 0 {
            return 0.0;
        }
        n_pos as f64 * (f64::from(self.max) + self.exp_sum.ln()) - self.pos_sum
    }
}

/// A dense loss whose gradient a layer can compute a tile of classes at a time from
/// [`LogSumExp`] summaries (module docs): [`GradientEstimator::tiled`](crate::GradientEstimator::tiled).
pub trait TiledGradient: Sync {
    /// First pass over one sample's scores `z` of the classes `rows` (bias added): overwrites
    /// them with what [`Self::gradient`] needs and returns the tile's summary.
    fn scan(&self, rows: Range<usize>, z: &mut [f32], positives: &[ClassId]) -> LogSumExp;

    /// Second pass: the gradients `g` of the classes `rows` of one sample from what
    /// [`Self::scan`] left in `stored`, the tile's summary and the sample's merged summary.
    fn gradient(
        &self,
        rows: Range<usize>,
        stored: &[f32],
        positives: &[ClassId],
        tile: &LogSumExp,
        all: &LogSumExp,
        g: &mut [f32],
    );
}

/// The positives of `positives` among the classes `rows`, as offsets into `rows`.
fn positives_in<'a>(positives: &'a [ClassId], rows: &'a Range<usize>) -> impl Iterator<Item = usize> + 'a {
    positives.iter().map(|&p| p as usize).filter(|p| rows.contains(p)).map(|p| p - rows.start)
}

impl TiledGradient for Softmax {
    fn scan(&self, rows: Range<usize>, z: &mut [f32], positives: &[ClassId]) -> LogSumExp {
        if positives.is_empty() {
            return LogSumExp::default();
        }
        let pos_sum = positives_in(positives, &rows).map(|l| f64::from(z[l])).sum();
        let max = kernels::max(z);
        let exp_sum = vexp::exp_shifted(z, max);
        LogSumExp { max, exp_sum, pos_sum }
    }

    fn gradient(
        &self,
        rows: Range<usize>,
        stored: &[f32],
        positives: &[ClassId],
        tile: &LogSumExp,
        all: &LogSumExp,
        g: &mut [f32],
    ) {
        if positives.is_empty() {
            g.fill(0.0);
            return;
        }
        let scale = (positives.len() as f64 * f64::from(tile.max - all.max).exp() / all.exp_sum) as f32;
        g.iter_mut().zip(stored).for_each(|(g, &e)| *g = e * scale);
        for l in positives_in(positives, &rows) {
            g[l] -= 1.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Loss, LossScratch};

    /// Tile by tile equals the whole row at once, for tile sizes that do and do not divide K,
    /// repeated positives and a positive in every tile.
    #[test]
    fn tiles_give_the_whole_rows_loss_and_gradient() {
        let k = 37;
        let z: Vec<f32> = (0..k).map(|i| ((i * 7919 % 101) as f32 - 50.0) * 0.21).collect();
        for positives in [vec![3u32], vec![0, 36, 36], vec![5, 17, 29], vec![]] {
            let mut want = vec![0.0; k];
            let loss = Softmax.value_and_grad(&z, &positives, &mut want, &mut LossScratch::default());
            for tile in [1, 5, 10, 37, 64] {
                let ranges: Vec<_> = (0..k).step_by(tile).map(|s| s..(s + tile).min(k)).collect();
                let mut stored = z.clone();
                let sums: Vec<LogSumExp> =
                    ranges.iter().map(|r| Softmax.scan(r.clone(), &mut stored[r.clone()], &positives)).collect();
                let all = sums.iter().fold(LogSumExp::default(), |a, &b| a.merge(b));
                let got_loss = all.loss(positives.len());
                assert!(
                    (got_loss - f64::from(loss)).abs() < 1e-4 * (1.0 + got_loss.abs()),
                    "tile {tile}: {got_loss} vs {loss}"
                );
                let mut g = vec![f32::NAN; k];
                for (r, s) in ranges.iter().zip(&sums) {
                    Softmax.gradient(r.clone(), &stored[r.clone()], &positives, s, &all, &mut g[r.clone()]);
                }
                for (i, (a, b)) in g.iter().zip(&want).enumerate() {
                    assert!((a - b).abs() < 1e-6, "tile {tile}, class {i}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn merging_an_empty_summary_changes_nothing() {
        let s = LogSumExp { max: 2.0, exp_sum: 3.5, pos_sum: 1.0 };
        assert_eq!(LogSumExp::default().merge(s), s);
        assert_eq!(s.merge(LogSumExp::default()), s);
        assert_eq!(LogSumExp::default().merge(LogSumExp::default()).exp_sum, 0.0);
    }
}
