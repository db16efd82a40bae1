//! Spherical clustering for MIPS (Auvolat et al. 2015; the index of the LDGS experiments): the
//! index type, its configuration and its [`MipsIndex`] implementation. Each concern lives in its
//! own file:
//!
//! - **Reduction to cosine search** (`crate::augment`). With `M >= max_k |w_k|`, append one
//!   coordinate to every row scaled by `1/M`: `x_k = [w_k / M, sqrt(1 - |w_k|^2 / M^2)]`, a
//!   unit vector; a query becomes `[q, 0]`. Then `x_k . [q, 0] = w_k . q / M`: the largest
//!   inner products are the largest cosines, which spherical k-means can organise.
//! - **Index** (`kmeans.rs`). Spherical k-means (unit centroids, assignment by largest dot
//!   product) with `C ~ sqrt(K)` centroids, so that probing costs about as much as scanning one
//!   cluster.
//! - **Search** (`search.rs`). Rank centroids by `c_j . [q, 0]`, scan the members of the best
//!   ones until a budget of rows has been scored, return the top `k` by exact score `w_k . q`;
//!   one query at a time or a batch sharing the work cluster by cluster.
//! - **Budget** (`calibrate.rs`). By default the index fits the budget of each `k` to a target
//!   `recall` on a sample of the queries it is asked (brute force where that would probe a
//!   quarter of the rows or more); `candidate_factor` fixes it to `candidate_factor * k`
//!   instead.
//! - **Layout** (`cluster.rs`). Every cluster keeps a copy of its members' rows, contiguous, and
//!   scores those: scanning a cluster streams memory instead of gathering rows scattered over
//!   `W` (at K = 1,000,000 a batch of 256 queries probes nearly every cluster; the gather cost
//!   more than the scoring). The copies are kept equal to `W` by [`MipsIndex::sync`] (the output
//!   layer calls it after every step, copying the changed rows). Three ways to score them
//!   (`scoring`; the default `auto` is `int8` where the CPU has AVX2 or AVX-512 VNNI and
//!   at least 10 rows are probed per result):
//!   - `f32`: on the copies themselves; the scores are exact, nothing is rescored.
//!   - `int8` (`int8.rs`): on int8 codes of the rows with a scale per row ([`crate::quant`];
//!     kept beside the copies, a quarter of their size), by an AVX-512 VNNI kernel several times
//!     faster per row than f32 matrix products (the centroids are ranked on their codes too);
//!     the best `rescore * k` (and at least `k + 32`) probed rows by approximate score are then
//!     rescored exactly from the copies and the top `k` of those returned. Rounding moves
//!     scores by well under their spread near the cut, so the approximate ranking loses almost
//!     nothing that the rescoring cannot restore. It pays when many rows are probed per result
//!     (10 and more); at 5 the rescoring costs more than the scan saves, and `auto` picks `f32`.
//!   - `pq4` (`pq4.rs`; what `auto` means where `int8` would be chosen and the CPU has AVX2):
//!     `int8` for batches; a query searched alone scans 4-bit codes of the rows' residuals from
//!     their cluster's mean ([`crate::pq4`]: 16 levels a dimension, half the bytes of int8
//!     codes, scored through byte lookup tables held in registers) and rescores the best
//!     `pq4_rescore * k` exactly, or more where a calibration shows the 4-bit codes losing
//!     recall (fitted on its sample, once per calibration). A lone query shares no loads with
//!     other queries, so the bytes it scans set its speed; but the rows rescored cost too, and
//!     which way is faster depends on the CPU, so a calibrated index times its sample both
//!     ways at the fit and keeps the faster (int8 codes at top 2,000 of a million rows on an
//!     Intel Xeon with AMX, 4-bit codes on an AMD EPYC). The 4-bit codes are made by the
//!     first lone query that scans them and kept up to date from then on: an index that only
//!     ever searches in batches, as training does, never makes them and its syncs cost what
//!     `int8`'s do.
//! - **Refresh** (`refresh.rs`). A changed row's copy is updated and the row re-augmented and
//!   reassigned to its nearest centroid (cost C D per row, the paper's `k_r C D`) — only if it
//!   has drifted: its cosine with its own centroid fell by more than `refresh_drift` since it
//!   was assigned (a check of D per row). Rows that moved little, the most in training, keep
//!   their cluster, so a refresh after every step costs little more than the sync. Centroids
//!   are not moved; when a row outgrows `M` (its augmented coordinate would be imaginary) the
//!   index asks for a rebuild.

mod calibrate;
mod cluster;
mod int8;
mod kmeans;
mod persist;
mod pq4;
mod refresh;
mod search;

use crate::augment::NormAugmentation;
use crate::quant::QuantRows;
use crate::{Hit, MipsIndex, Rows};
pub use calibrate::Calibrated;
use calibrate::Calibrations;
pub(crate) use calibrate::{restore_fit, save_fit};
use cluster::Cluster;
use farout_core::{ClassId, Matrix};
use serde::{Deserialize, Serialize};

/// Parameters of [`SphericalIndex`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SphericalConfig {
    /// Number of centroids C (0 = round(sqrt(K))).
    pub n_centroids: usize,
    /// Spherical k-means iterations.
    pub iterations: usize,
    /// Target recall of the top `k` against brute force: the index fits its probe budget to it
    /// per `k`, on a sample of the queries it is asked (see `calibrate.rs`).
    pub recall: f32,
    /// Queries in that sample (the index answers them by brute force while collecting them).
    pub calibration_queries: usize,
    /// Below this many rows (and without `candidate_factor`) the index is brute force: no
    /// clusters to build and keep up to date, and too few rows for clusters to gain (see
    /// docs/decisions.md, "auto-index").
    pub exact_below: usize,
    /// When set, no calibration: probe clusters until `candidate_factor * k` rows have been
    /// scored.
    pub candidate_factor: Option<f32>,
    /// Norm bound `M = (1 + norm_headroom) * max_k |w_k|`: room for rows to grow before a
    /// rebuild is needed.
    pub norm_headroom: f32,
    /// Seed of the centroid initialisation.
    pub seed: u64,
    /// k-means fits the centroids on at most this many rows per centroid (a random subset;
    /// FAISS's default is 256), then assigns every row once: build time stops growing with K.
    pub points_per_centroid: usize,
    /// A refresh reassigns a changed row only when its cosine with its centroid (augmented
    /// space) has fallen by more than this since its assignment; negative = every changed row.
    pub refresh_drift: f32,
    /// How probed rows are scored: on f32 copies (exact) or on int8 codes (approximate, then
    /// the best `rescore * k` rescored exactly from the f32 copies); by default int8 where the
    /// CPU has a SIMD kernel for it and the budget is large enough to pay ([`Scoring::resolve`]).
    pub scoring: Scoring,
    /// `int8` scoring: rows rescored exactly per result (at least 1; at least 32 more than `k`
    /// are rescored).
    pub rescore: f32,
    /// `pq4` scoring: rows rescored exactly per result after a lone query's scan on 4-bit codes
    /// (at least 1; at least 32 more than `k` are rescored); a calibrated index raises it, up to
    /// 3x, where its sample shows the 4-bit codes losing recall.
    pub pq4_rescore: f32,
}

/// How [`SphericalIndex`] scores the rows of the clusters it probes (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scoring {
    /// `int8` where the CPU runs a SIMD int8 kernel (AVX2 or AVX-512 VNNI) and the budget is
    /// calibrated or at least 10 rows per result, `f32` elsewhere.
    #[default]
    Auto,
    /// Exact scores on f32 copies of the rows.
    F32,
    /// Approximate scores on int8 codes, the best rescored exactly. Needs AVX2 or AVX-512 VNNI
    /// to pay (elsewhere the same scores come from slow portable code).
    Int8,
    /// `int8` for batches of queries; a query searched alone is scored on 4-bit codes of the
    /// rows (`pq4.rs`, [`crate::pq4`]), half the bytes, and the best `pq4_rescore * k`
    /// rescored exactly, where that ran the calibration's sample faster than int8 codes. The
    /// codes are made by the first lone query that scans them (0.15-0.3 s per 200,000 rows of
    /// 128 values) and kept up to date by every sync from then on. Needs AVX2 to pay.
    Pq4,
}

impl Scoring {
    /// Whether the clusters keep int8 codes of their rows.
    pub(crate) fn int8_codes(self) -> bool {
        matches!(self, Scoring::Int8 | Scoring::Pq4)
    }

    /// `F32` or `Pq4`: what [`Scoring::Auto`] means on this CPU for rows of `dim` values and a
    /// budget of `candidate_factor` rows probed per result (`None`: calibrated). Int8 codes pay
    /// where the CPU runs a SIMD kernel for them, at least 10 rows are probed per result (a
    /// calibrated budget at recall 0.9 probes more) and rows are wider than 16 values; below
    /// that the cut and the rescoring cost more than the scan saves (an f32 row of 16 values is
    /// one AVX-512 product; see docs/decisions.md, "int8-scoring"). Where they pay, `Pq4`: int8
    /// codes for batches, and 4-bit codes made for lone queries only once one asks
    /// (docs/decisions.md, "pq4-single-query").
    pub fn resolve(self, candidate_factor: Option<f32>, dim: usize) -> Self {
        let simd = crate::quant::Kernel::best() != crate::quant::Kernel::Scalar;
        match self {
            Scoring::Auto if simd && dim > 16 && candidate_factor.is_none_or(|f| f >= 10.0) => Scoring::Pq4,
            Scoring::Auto => Scoring::F32,
            other => other,
        }
    }
}

impl Default for SphericalConfig {
    fn default() -> Self {
        Self {
            n_centroids: 0,
            iterations: 8,
            recall: 0.9,
            calibration_queries: 256,
            exact_below: 2_000,
            candidate_factor: None,
            norm_headroom: 0.1,
            seed: 1,
            points_per_centroid: 256,
            refresh_drift: 0.02,
            scoring: Scoring::default(),
            rescore: 1.0,
            pq4_rescore: 2.5,
        }
    }
}

/// The spherical-clustering index (see the module docs).
#[derive(Clone, Debug)]
pub struct SphericalIndex {
    config: SphericalConfig,
    /// The norm bound M of the reduction to cosine search.
    augmentation: NormAugmentation,
    /// Unit centroids in the augmented space, `C x (D + 1)`.
    centroids: Matrix,
    /// Their first D coordinates, `C x D` (queries have 0 in the augmented one).
    centroids_d: Matrix,
    /// With int8 scoring, the codes of `centroids_d`: probing ranks the centroids by
    /// approximate scores too.
    centroid_codes: Option<QuantRows>,
    /// Cluster of every row.
    assign: Vec<u32>,
    /// Every row's cosine with its centroid when it was assigned (the drift reference).
    assigned_cos: Vec<f32>,
    /// Position of every row in its cluster's member list.
    pos: Vec<u32>,
    clusters: Vec<Cluster>,
    rebuild: bool,
    /// The probe budget per `k`, fitted to the target recall.
    calibrations: Calibrations,
    /// With `pq4` scoring, whether the clusters' 4-bit codes have been made (`pq4.rs`).
    pq4: pq4::Pq4State,
}

/// What probing reads of the (augmented) centroids: their first `d` coordinates, and with int8
/// scoring those rows' codes. Derived from the centroids, so a loaded index recomputes them.
fn centroid_views(centroids: &Matrix, d: usize, scoring: Scoring) -> (Matrix, Option<QuantRows>) {
    let mut centroids_d = Matrix::zeros(centroids.rows(), d);
    for j in 0..centroids.rows() {
        centroids_d.row_mut(j).copy_from_slice(&centroids.row(j)[..d]);
    }
    let centroid_codes = scoring.int8_codes().then(|| {
        let mut codes = QuantRows::with_capacity(d, centroids.rows());
        centroids_d.iter_rows().for_each(|row| codes.push(row));
        codes
    });
    (centroids_d, centroid_codes)
}

impl SphericalIndex {
    /// Builds the index over the rows of `w`: fits the centroids (`kmeans.rs`), assigns every
    /// row to one and copies it into its cluster.
    pub fn build(w: Rows, config: &SphericalConfig) -> Self {
        Self::build_on(w, config, None)
    }

    /// [`SphericalIndex::build`] on the given unit `centroids` (`C x (D + 1)`, in the
    /// augmented space of the same norm bound), when given, instead of fitting them.
    pub fn build_on(w: Rows, config: &SphericalConfig, centroids: Option<&Matrix>) -> Self {
        let scoring = config.scoring.resolve(config.candidate_factor, w.dim());
        let config = &SphericalConfig { scoring, ..config.clone() };
        let (k, d) = (w.len(), w.dim());
        let augmentation = NormAugmentation::fit(w, config.norm_headroom);
        let centroids = match centroids {
            Some(c) => {
                assert_eq!(c.cols(), d + 1, "centroids of {} columns for rows of {d}", c.cols());
                c.clone()
            }
            None => kmeans::fit(w, &augmentation, config),
        };
        let c = centroids.rows();
        let (mut assign, mut assigned_cos) = (vec![0u32; k], vec![0.0f32; k]);
        kmeans::assign_rows(w, &augmentation, &centroids, None, &mut assign, &mut assigned_cos);
        let mut sizes = vec![0usize; c];
        for &a in &assign {
            sizes[a as usize] += 1;
        }
        let mut clusters: Vec<Cluster> = sizes.iter().map(|&n| Cluster::new(config.scoring, d, n)).collect();
        let mut pos = vec![0u32; k];
        for (i, &a) in assign.iter().enumerate() {
            pos[i] = clusters[a as usize].len() as u32;
            clusters[a as usize].push(i as ClassId, w.row(i));
        }
        let (centroids_d, centroid_codes) = centroid_views(&centroids, d, config.scoring);
        Self {
            config: config.clone(),
            augmentation,
            centroids,
            centroids_d,
            centroid_codes,
            assign,
            assigned_cos,
            pos,
            clusters,
            rebuild: false,
            calibrations: Calibrations::default(),
            pq4: pq4::Pq4State::default(),
        }
    }

    /// Number of centroids C.
    pub fn n_centroids(&self) -> usize {
        self.centroids.rows()
    }

    /// Sizes of the clusters.
    pub fn cluster_sizes(&self) -> Vec<usize> {
        self.clusters.iter().map(Cluster::len).collect()
    }
}

impl MipsIndex for SphericalIndex {
    fn name(&self) -> &'static str {
        "spherical"
    }

    fn search(&self, w: Rows, query: &[f32], k: usize, out: &mut Vec<Hit>) -> usize {
        self.search_one(w, query, k, out)
    }

    fn centroids(&self) -> Option<&Matrix> {
        Some(&self.centroids)
    }

    /// Batched search: centroid scores of all queries at once (one matrix product, or one int8
    /// kernel call on the centroids' codes); then, cluster by cluster, the members' copy (or
    /// codes) is scored against every query probing that cluster while its rows are in cache
    /// (dot products, one matrix product where many queries probe it, or the int8 kernel),
    /// instead of each query reading the clusters it probes on its own; with int8 codes the
    /// best are then rescored cluster by cluster. Returns what [`MipsIndex::search`] returns
    /// for each query (up to rounding: the batch's products and kernels may differ from a lone
    /// query's in the last bits).
    fn search_batch(&self, w: Rows, queries: &Matrix, k: usize, out: &mut Vec<Vec<Hit>>) -> usize {
        self.search_batched(w, queries, k, k, out)
    }

    /// Probes the rows a search for `probe_for` results would (its budget) and selects the
    /// best `k` of them, as a search for `k` with that budget.
    fn search_batch_probing(
        &self,
        w: Rows,
        queries: &Matrix,
        k: usize,
        probe_for: usize,
        out: &mut Vec<Vec<Hit>>,
    ) -> usize {
        self.search_batched(w, queries, k, probe_for, out)
    }

    fn sync(&mut self, w: Rows, rows: &[ClassId]) {
        self.sync_rows(w, rows);
    }

    fn refresh(&mut self, w: Rows, rows: &[ClassId]) {
        self.refresh_rows(w, rows);
    }

    fn needs_rebuild(&self) -> bool {
        self.rebuild
    }

    fn calibrations(&self) -> Vec<Calibrated> {
        self.calibrations.fitted()
    }

    fn save_state(&self, out: &mut crate::persist::Enc) -> Result<(), crate::persist::Unsupported> {
        self.save(out);
        Ok(())
    }

    fn memory_bytes(&self) -> usize {
        self.centroids.bytes()
            + self.centroids_d.bytes()
            + 4 * (self.assign.len() + self.assigned_cos.len() + self.pos.len())
            + self.clusters.iter().map(Cluster::bytes).sum::<usize>()
            + self.calibrations.bytes()
    }
}

impl crate::IndexParams for SphericalConfig {
    fn check(&self) -> Result<(), farout_core::ParamError> {
        crate::count_in("points_per_centroid", self.points_per_centroid, 1..=usize::MAX, "must be > 0")?;
        if let Some(factor) = self.candidate_factor {
            crate::finite_at_least("candidate_factor", factor, 1.0)?;
        }
        if !(self.recall > 0.0 && self.recall <= 1.0) {
            let value = self.recall.to_string();
            return Err(farout_core::ParamError::new("recall", value, "must be in (0, 1]"));
        }
        crate::count_in("calibration_queries", self.calibration_queries, 1..=usize::MAX, "must be > 0")?;
        crate::finite_at_least("norm_headroom", self.norm_headroom, 0.0)?;
        crate::finite_at_least("rescore", self.rescore, 1.0)?;
        crate::finite_at_least("pq4_rescore", self.pq4_rescore, 1.0)?;
        if !self.refresh_drift.is_finite() {
            let value = self.refresh_drift.to_string();
            return Err(farout_core::ParamError::new("refresh_drift", value, "must be a finite number"));
        }
        Ok(())
    }

    fn build(&self, w: Rows) -> Box<dyn MipsIndex> {
        self.build_on(w, None)
    }
}

impl SphericalConfig {
    /// The index of this configuration over `w`, on the given `centroids` when there are some
    /// ([`SphericalIndex::build_on`]): brute force below `exact_below` rows when the budget is
    /// calibrated (nothing to cluster), else a spherical index.
    pub fn build_on(&self, w: Rows, centroids: Option<&Matrix>) -> Box<dyn MipsIndex> {
        if self.candidate_factor.is_none() && w.len() < self.exact_below {
            return Box::new(crate::ExactIndex::new());
        }
        Box::new(SphericalIndex::build_on(w, self, centroids))
    }
}

/// The default configuration with each way of scoring, and a fixed budget of 5 rows probed
/// per result (no calibration: the tests of the search mechanics need the same probes whatever
/// was searched before).
#[cfg(test)]
fn both_scorings() -> [SphericalConfig; 2] {
    [Scoring::F32, Scoring::Int8].map(|scoring| SphericalConfig {
        scoring,
        candidate_factor: Some(5.0),
        ..SphericalConfig::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recall;
    use crate::testutil::clustered;

    /// 20,000 rows in 400 natural clusters; with 400 centroids and 1,000 candidates scored per
    /// query (5% of the rows) the measured recall of the top 100 is 0.93 (0.85 with 500).
    #[test]
    fn recall_of_top_100_on_clustered_rows_is_at_least_0_9() {
        let (w, q) = clustered(20_000, 32);
        for base in both_scorings() {
            let config = SphericalConfig { n_centroids: 400, candidate_factor: Some(10.0), ..base };
            let index = SphericalIndex::build(Rows::all(&w), &config);
            let r = recall(&index, Rows::all(&w), &q, 100);
            assert!(r >= 0.9, "recall {r} ({:?})", config.scoring);
            let sizes = index.cluster_sizes();
            assert_eq!((sizes.len(), sizes.iter().sum::<usize>()), (400, 20_000));
        }
    }

    /// An index built on another's centroids (`IndexConfig::build_on`: the rows of another
    /// rank, alike in distribution) keeps them, assigns all its rows and finds their top 100 as
    /// well as its own centroids would; indexes without centroids build as before.
    #[test]
    fn an_index_built_on_another_shards_centroids_keeps_them_and_finds_as_well() {
        let (w, q) = clustered(20_000, 32);
        // Halves of the rows that both hold every cluster of means (class c's is c mod 400).
        let half =
            |h: usize| Matrix::from_vec(10_000, 32, w.as_slice()[h * 320_000..(h + 1) * 320_000].to_vec()).unwrap();
        let (w0, w1) = (half(0), half(1));
        for base in both_scorings() {
            let config = crate::IndexConfig::Spherical(SphericalConfig {
                n_centroids: 200,
                candidate_factor: Some(10.0),
                ..base
            });
            let first = config.build(Rows::all(&w0));
            let shared = first.centroids().expect("a spherical index has centroids").clone();
            let on = config.build_on(Rows::all(&w1), Some(&shared));
            let own = config.build(Rows::all(&w1));
            assert_eq!(on.centroids(), Some(&shared));
            assert_ne!(own.centroids(), Some(&shared), "fitted to its own rows");
            let (r_on, r_own) =
                (recall(on.as_ref(), Rows::all(&w1), &q, 100), recall(own.as_ref(), Rows::all(&w1), &q, 100));
            assert!(r_on >= 0.75 && r_on >= r_own - 0.03, "recall {r_on} on shared centroids, {r_own} on its own");
        }
        let exact = crate::IndexConfig::exact().build_on(Rows::all(&w1), Some(&Matrix::zeros(3, 33)));
        assert!(exact.centroids().is_none());
    }

    /// `auto` is f32 for rows of 16 values or fewer and for small fixed budgets; pq4 (int8
    /// codes, 4-bit ones for lone queries) otherwise, where the CPU has a kernel for them;
    /// explicit choices stand.
    #[test]
    fn auto_scoring_follows_width_budget_and_cpu() {
        let simd = crate::quant::Kernel::best() != crate::quant::Kernel::Scalar;
        let codes_if_simd = if simd { Scoring::Pq4 } else { Scoring::F32 };
        assert_eq!(Scoring::Auto.resolve(None, 16), Scoring::F32);
        assert_eq!(Scoring::Auto.resolve(None, 17), codes_if_simd);
        assert_eq!(Scoring::Auto.resolve(Some(5.0), 128), Scoring::F32);
        assert_eq!(Scoring::Auto.resolve(Some(10.0), 128), codes_if_simd);
        assert_eq!(Scoring::Int8.resolve(None, 16), Scoring::Int8);
        assert_eq!(Scoring::F32.resolve(None, 128), Scoring::F32);
    }
}
