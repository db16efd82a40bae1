//! Argmax oracles for MEMOIR: the most violating class `r = argmax_{r≠y} xᵀω_r` (\[E\] Alg. 1–2,
//! "Compute approximately").
//!
//! An oracle answers, for every query row of a batch, its top two classes over the rows of a
//! dense matrix V (the lazily scaled weights `W = acc·V`: the argmax is invariant to `acc > 0`,
//! so V is what is indexed); MEMOIR drops the sample's own class y from the two
//! ([`best_excluding`]). The inexactness of an approximate index is what \[E\] Theorem 1 calls an
//! (ε, δ)-inexact margin: `m − m̄ ≤ ε` with probability at least 1 − δ (eq. 2).
//!
//! Why this shape: queries come a batch at a time (all against the batch-start V, so they run
//! in parallel), and after the batch the oracle learns which rows changed
//! ([`ArgmaxOracle::refresh`]); whether it re-indexes those rows or rebuilds is its own policy.
//! [`MipsOracle`] wraps any farout-search [`MipsIndex`]: brute force (`kind = "exact"`, the
//! reference), HNSW (≈ the paper's SW-graph), SimpleLSH (the paper's LSH variant).

use farout_core::topk::Hit;
use farout_core::{ClassId, Matrix};
use farout_search::{IndexConfig, MipsIndex, Rows};
use std::time::Instant;

/// Top-2 maximum inner product search over the rows of V that follows V's changes.
pub trait ArgmaxOracle: Send + Sync {
    /// Name for logs (`"exact"`, `"hnsw"`, `"simple_lsh"`, ...).
    fn name(&self) -> &'static str;

    /// The (approximate) top two rows of `v` for every row of `queries` (`[n, d]`), best
    /// first, with exact scores, into `out[i]`; runs the queries in parallel. Returns the
    /// number of inner products computed.
    fn top2_batch(&self, v: &Matrix, queries: &Matrix, out: &mut Vec<Vec<Hit>>) -> usize;

    /// `rows` of `v` changed since the oracle last saw them: re-index them, or rebuild.
    fn refresh(&mut self, v: &Matrix, rows: &[ClassId]) -> RefreshKind;
}

/// What [`ArgmaxOracle::refresh`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefreshKind {
    /// Nothing to do (brute force, or no changed rows).
    None,
    /// The changed rows were re-indexed.
    Refreshed,
    /// The index was rebuilt from scratch.
    Rebuilt,
}

/// The best of `hits` (best first) whose class is not `y`.
pub fn best_excluding(hits: &[Hit], y: ClassId) -> Option<Hit> {
    hits.iter().find(|h| h.class != y).copied()
}

/// Any farout-search index as an [`ArgmaxOracle`], with MEMOIR's refresh policy: re-index the
/// changed rows, or rebuild when more than `rebuild_fraction` of all rows changed (up to
/// 2|b| = 200√C rows change per batch, \[E\] Table 4, so re-indexing can cost more than
/// building afresh) or when the index asks for it (a row outgrew the norm bound of its
/// augmentation, or too many stale versions).
pub struct MipsOracle {
    config: IndexConfig,
    index: Box<dyn MipsIndex>,
    rebuild_fraction: f64,
    /// Number of rebuilds so far, the initial build excluded.
    pub rebuilds: usize,
    /// Seconds spent building and refreshing.
    pub seconds: f64,
}

impl MipsOracle {
    /// Builds `config`'s index over the rows of `v` (`config` must have passed its check).
    pub fn build(config: &IndexConfig, v: &Matrix, rebuild_fraction: f64) -> Self {
        let start = Instant::now();
        let index = config.build(Rows::all(v));
        Self { config: config.clone(), index, rebuild_fraction, rebuilds: 0, seconds: start.elapsed().as_secs_f64() }
    }

    /// The wrapped index.
    pub fn index(&self) -> &dyn MipsIndex {
        self.index.as_ref()
    }
}

impl ArgmaxOracle for MipsOracle {
    fn name(&self) -> &'static str {
        self.index.name()
    }

    fn top2_batch(&self, v: &Matrix, queries: &Matrix, out: &mut Vec<Vec<Hit>>) -> usize {
        let cost = self.index.search_batch(Rows::all(v), queries, 2, out);
        // Exact scores, but in no particular order for some indexes.
        out.iter_mut().for_each(|h| h.sort_unstable_by(farout_core::topk::by_score));
        cost
    }

    fn refresh(&mut self, v: &Matrix, rows: &[ClassId]) -> RefreshKind {
        if rows.is_empty() || self.config.name() == "exact" {
            return RefreshKind::None;
        }
        let start = Instant::now();
        let kind = if rows.len() as f64 > self.rebuild_fraction * v.rows() as f64 {
            RefreshKind::Rebuilt
        } else {
            self.index.refresh(Rows::all(v), rows);
            if self.index.needs_rebuild() { RefreshKind::Rebuilt } else { RefreshKind::Refreshed }
        };
        if kind == RefreshKind::Rebuilt {
            self.index = self.config.build(Rows::all(v));
            self.rebuilds += 1;
        }
        self.seconds += start.elapsed().as_secs_f64();
        kind
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_core::rng;

    #[test]
    fn the_exact_oracle_returns_the_two_best_rows_and_y_is_skipped() {
        let mut r = rng::seeded(3, 0);
        let v = Matrix::from_vec(50, 8, (0..400).map(|_| rng::normal(&mut r)).collect()).unwrap();
        let q = Matrix::from_vec(10, 8, (0..80).map(|_| rng::normal(&mut r)).collect()).unwrap();
        let oracle = MipsOracle::build(&IndexConfig::exact(), &v, 0.5);
        let mut out = Vec::new();
        oracle.top2_batch(&v, &q, &mut out);
        for (i, hits) in out.iter().enumerate() {
            let scores: Vec<f32> = v.iter_rows().map(|w| farout_core::kernels::dot(w, q.row(i))).collect();
            let mut order: Vec<usize> = (0..50).collect();
            order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
            assert_eq!(hits.iter().map(|h| h.class as usize).collect::<Vec<_>>(), order[..2]);
            let y = order[0] as ClassId;
            assert_eq!(best_excluding(hits, y).unwrap().class as usize, order[1]);
            assert_eq!(best_excluding(hits, order[2] as ClassId).unwrap().class as usize, order[0]);
        }
    }

    #[test]
    fn many_changed_rows_rebuild_and_few_refresh() {
        let mut r = rng::seeded(4, 0);
        let mut v = Matrix::from_vec(400, 8, (0..3200).map(|_| rng::normal(&mut r)).collect()).unwrap();
        let config = IndexConfig::Hnsw(farout_search::HnswConfig { norm_headroom: 1.0, ..Default::default() });
        let mut oracle = MipsOracle::build(&config, &v, 0.25);
        farout_core::kernels::scale(0.5, v.row_mut(7));
        assert_eq!(oracle.refresh(&v, &[7]), RefreshKind::Refreshed);
        let many: Vec<ClassId> = (0..101).collect();
        assert_eq!(oracle.refresh(&v, &many), RefreshKind::Rebuilt);
        assert_eq!(oracle.refresh(&v, &[]), RefreshKind::None);
        assert_eq!(oracle.rebuilds, 1);
    }
}
