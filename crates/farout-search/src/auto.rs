//! The index chosen from the rows (`kind = "auto"`, the default): spherical clustering where
//! its clusters let a search skip most rows, brute force on int8 codes where they do not.
//!
//! **Why both.** Whether clustering pays depends on the rows, not only on their number: on the
//! class means of a face model (rows near a low-dimensional subspace) a calibrated
//! [`SphericalIndex`] reaches recall 0.9 scanning a few percent of the rows, but the label rows
//! of a document tagger have no such structure, and its calibration answers every query by brute
//! force, while it keeps cluster copies and drift checks up to date after every step. Brute
//! force on int8 codes ([`FlatInt8Index`]) is exact up to rare rounding ties, several times
//! faster than brute force in f32, and its upkeep is re-quantising the changed rows.
//!
//! **How it chooses.**
//! - Below `exact_below` rows: brute force in f32 ([`ExactIndex`]), with nothing to build or
//!   keep up to date; there int8 brute force, which quantises every query and re-quantises the
//!   rows each step changes, does not pay (see docs/decisions.md, "auto-index").
//! - From `exact_below` rows: a [`SphericalIndex`] calibrated to `recall`. Once every `k` it was
//!   asked has calibrated to brute force (its clusters would have to be scanned for a quarter of
//!   the rows or more), the next sync or refresh replaces it by a [`FlatInt8Index`] over the
//!   same rows, whatever their width (int8 brute force is several times faster than f32 even
//!   at 16 dimensions).
//! - Rows gain structure as training goes on (a layer built untrained has equal rows), so after
//!   [`RETRY_QUERIES_PER_CENTROID`] queries per centroid the spherical index would have had,
//!   the clusters are fitted and calibrated again; each trial that again ends in brute force
//!   doubles the wait. A trial (k-means and its assignment, about `9 K C D` multiply-adds) costs
//!   about as much as 60 brute-force queries per centroid, so trials take a few percent of the
//!   search time spent by brute force (see docs/decisions.md, "auto-index"). A rebuild
//!   (`rebuild_every`, or asked for by the index) starts over with the clusters.
//!
//! Searches return what the index in use returns; [`MipsIndex::calibrations`] reports the
//! spherical index's budgets, or brute force (every row probed) for each `k` after the switch.

use crate::persist::{Dec, Enc, Problem, inconsistent};
use crate::{
    Calibrated, ExactIndex, FlatInt8Config, FlatInt8Index, Hit, MipsIndex, Rows, SphericalConfig, SphericalIndex,
};
use farout_core::{ClassId, Matrix};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Queries searched by brute force, per centroid of the spherical index, before its clusters
/// are fitted and calibrated again (see the module docs).
pub const RETRY_QUERIES_PER_CENTROID: usize = 1_500;

/// Parameters of [`AutoIndex`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AutoConfig {
    /// Target recall of the top `k` against brute force, to which the spherical index calibrates
    /// its probe budget (see `SphericalConfig::recall`).
    pub recall: f32,
    /// Below this many rows the index is brute force in f32: nothing to build or keep up to
    /// date.
    pub exact_below: usize,
    /// Seed of the spherical index's centroid initialisation.
    pub seed: u64,
}

impl Default for AutoConfig {
    fn default() -> Self {
        Self { recall: 0.9, exact_below: 2_000, seed: 1 }
    }
}

impl AutoConfig {
    /// The spherical index this configuration tries.
    fn spherical(&self) -> SphericalConfig {
        SphericalConfig { recall: self.recall, seed: self.seed, exact_below: 0, ..SphericalConfig::default() }
    }
}

impl crate::IndexParams for AutoConfig {
    fn check(&self) -> Result<(), farout_core::ParamError> {
        crate::IndexParams::check(&self.spherical())
    }

    fn build(&self, w: Rows) -> Box<dyn MipsIndex> {
        if w.len() < self.exact_below {
            return Box::new(ExactIndex::new());
        }
        Box::new(AutoIndex::build(w, self))
    }
}

/// The index in use (the spherical index boxed: it is ten times the size of the other).
enum Current {
    Clusters(Box<SphericalIndex>),
    Flat(FlatInt8Index),
}

/// Spherical clustering or int8 brute force, whichever the rows call for (see the module docs).
pub struct AutoIndex {
    config: AutoConfig,
    current: Current,
    /// The calibrations that chose brute force (reported while it answers).
    brute_force: Vec<Calibrated>,
    /// Queries searched by brute force since the last switch to it.
    flat_queries: AtomicUsize,
    /// Queries by brute force after which the clusters are tried again.
    retry_after: usize,
    /// The norm floor of the rows it was built on ([`Rows::with_norm_floor`]), for the trials.
    norm_floor: f32,
}

impl AutoIndex {
    /// Builds a spherical index over `w`, which gives way to brute force on int8 codes once its
    /// calibration chooses brute force ([`AutoConfig`]'s `build` applies `exact_below` first).
    pub fn build(w: Rows, config: &AutoConfig) -> Self {
        Self {
            config: config.clone(),
            current: Current::Clusters(Box::new(SphericalIndex::build(w, &config.spherical()))),
            brute_force: Vec::new(),
            flat_queries: AtomicUsize::new(0),
            retry_after: Self::first_retry(w.len()),
            norm_floor: w.norm_floor(),
        }
    }

    /// Whether the index answers by brute force on int8 codes (else by spherical clustering).
    pub fn is_brute_force(&self) -> bool {
        matches!(self.current, Current::Flat(_))
    }

    /// Queries by brute force before the first trial of the clusters: per centroid of a spherical
    /// index over `rows` rows (about `sqrt(rows)`).
    fn first_retry(rows: usize) -> usize {
        RETRY_QUERIES_PER_CENTROID * ((rows as f64).sqrt().round() as usize).max(1)
    }

    fn index(&self) -> &dyn MipsIndex {
        match &self.current {
            Current::Clusters(index) => index.as_ref(),
            Current::Flat(index) => index,
        }
    }

    fn index_mut(&mut self) -> &mut dyn MipsIndex {
        match &mut self.current {
            Current::Clusters(index) => index.as_mut(),
            Current::Flat(index) => index,
        }
    }

    /// After a sync or refresh: hands over to brute force once the clusters calibrated to it for
    /// every `k`, or tries the clusters again once brute force has served long enough.
    fn choose(&mut self, w: Rows) {
        match &self.current {
            Current::Clusters(index) => {
                let fitted = index.calibrations();
                if !fitted.is_empty() && fitted.iter().all(|c| c.budget.is_none()) {
                    self.brute_force = fitted;
                    self.current = Current::Flat(FlatInt8Index::build(w, &FlatInt8Config::default()));
                    self.flat_queries.store(0, Ordering::Relaxed);
                }
            }
            Current::Flat(_) if self.flat_queries.load(Ordering::Relaxed) >= self.retry_after => {
                let rows = w.with_norm_floor(self.norm_floor);
                self.current = Current::Clusters(Box::new(SphericalIndex::build(rows, &self.config.spherical())));
                self.brute_force.clear();
                // Should the trial end in brute force again, the next one waits twice as long.
                self.retry_after = self.retry_after.saturating_mul(2);
            }
            Current::Flat(_) => {}
        }
    }
}

impl MipsIndex for AutoIndex {
    fn name(&self) -> &'static str {
        "auto"
    }

    fn search(&self, w: Rows, query: &[f32], k: usize, out: &mut Vec<Hit>) -> usize {
        if self.is_brute_force() {
            self.flat_queries.fetch_add(1, Ordering::Relaxed);
        }
        self.index().search(w, query, k, out)
    }

    fn search_batch(&self, w: Rows, queries: &Matrix, k: usize, out: &mut Vec<Vec<Hit>>) -> usize {
        if self.is_brute_force() {
            self.flat_queries.fetch_add(queries.rows(), Ordering::Relaxed);
        }
        self.index().search_batch(w, queries, k, out)
    }

    fn sync(&mut self, w: Rows, rows: &[ClassId]) {
        self.index_mut().sync(w, rows);
        self.choose(w);
    }

    fn refresh(&mut self, w: Rows, rows: &[ClassId]) {
        self.index_mut().refresh(w, rows);
        self.choose(w);
    }

    fn needs_rebuild(&self) -> bool {
        self.index().needs_rebuild()
    }

    fn calibrations(&self) -> Vec<Calibrated> {
        match &self.current {
            Current::Clusters(index) => index.calibrations(),
            Current::Flat(_) => self.brute_force.clone(),
        }
    }

    fn memory_bytes(&self) -> usize {
        self.index().memory_bytes()
    }

    fn save_state(&self, out: &mut Enc) -> Result<(), crate::persist::Unsupported> {
        self.save(out)
    }
}

impl AutoIndex {
    /// Writes the parameters, the index in use and the counters that decide the next switch
    /// (`crate::persist`).
    fn save(&self, out: &mut Enc) -> Result<(), crate::persist::Unsupported> {
        out.config(&self.config);
        out.u8(self.is_brute_force() as u8);
        self.index().save_state(out)?;
        out.u64(self.brute_force.len() as u64);
        self.brute_force.iter().for_each(|fit| crate::spherical::save_fit(out, fit));
        out.u64(self.flat_queries.load(Ordering::Relaxed) as u64);
        out.u64(self.retry_after as u64);
        out.f32(self.norm_floor);
        Ok(())
    }

    /// Reads what [`AutoIndex::save`] wrote for the rows `w`.
    pub(crate) fn restore(dec: &mut Dec, w: Rows) -> Result<Self, Problem> {
        let config: AutoConfig = dec.config("auto")?;
        crate::IndexParams::check(&config).map_err(inconsistent)?;
        let current = match dec.u8()? {
            0 => Current::Clusters(Box::new(SphericalIndex::restore(dec, w)?)),
            1 => Current::Flat(FlatInt8Index::restore(dec, w)?),
            other => return Err(inconsistent(format!("the automatic index uses index {other}, not 0 or 1"))),
        };
        let n = dec.usize_at_most(MAX_SAVED_CALIBRATIONS, "calibrations")?;
        let brute_force = (0..n).map(|_| crate::spherical::restore_fit(dec)).collect::<Result<Vec<_>, _>>()?;
        let flat_queries = AtomicUsize::new(dec.usize_at_most(usize::MAX, "queries")?);
        let retry_after = dec.usize_at_most(usize::MAX, "retry_after")?;
        let norm_floor = dec.f32()?;
        if !(norm_floor.is_finite() && norm_floor >= 0.0) {
            return Err(inconsistent("the norm floor is not a finite number >= 0"));
        }
        Ok(Self { config, current, brute_force, flat_queries, retry_after, norm_floor })
    }
}

/// Most calibrations a saved automatic index may report (one per `k` searched): a bound on
/// what a damaged file can make the reader allocate.
const MAX_SAVED_CALIBRATIONS: usize = 1 << 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::clustered;
    use crate::{ExactIndex, IndexParams, overlap};
    use farout_core::rng::{self, RngExt};

    /// `n` rows of `d` independent standard normal values: no cluster structure.
    fn unstructured(n: usize, d: usize, seed: u64) -> Matrix {
        let mut r = rng::seeded(seed, 0xA070);
        let mut w = Matrix::zeros(n, d);
        w.as_mut_slice().iter_mut().for_each(|x| *x = r.random::<f32>() - 0.5);
        w
    }

    /// Searches `queries` batched, `rounds` times, syncing no rows after each round (as training
    /// syncs after every step); returns the last round's recall against brute force.
    fn train_like(index: &mut AutoIndex, w: &Matrix, queries: &Matrix, k: usize, rounds: usize) -> f64 {
        let (mut found, mut exact) = (Vec::new(), Vec::new());
        let mut recall = 0.0;
        for _ in 0..rounds {
            index.search_batch(Rows::all(w), queries, k, &mut found);
            ExactIndex.search_batch(Rows::all(w), queries, k, &mut exact);
            recall = overlap(&found, &exact);
            index.sync(Rows::all(w), &[]);
        }
        recall
    }

    /// Rows that cluster keep the spherical index (it calibrates to a budget below brute
    /// force); rows without structure end with brute force on int8 codes, which then returns
    /// the exact top k, and report brute force in their calibrations.
    #[test]
    fn clusters_where_they_cut_the_search_brute_force_where_they_do_not() {
        let config = AutoConfig::default();
        let (w, q) = clustered(20_000, 32);
        let mut index = AutoIndex::build(Rows::all(&w), &config);
        let recall = train_like(&mut index, &w, &q, 10, 3);
        assert!(!index.is_brute_force(), "clustered rows: {:?}", index.calibrations());
        assert!(index.calibrations()[0].budget.is_some_and(|b| b < 20_000 / 4));
        assert!(recall >= 0.85, "recall {recall}");

        let w = unstructured(20_000, 32, 1);
        let q = unstructured(300, 32, 2);
        let mut index = AutoIndex::build(Rows::all(&w), &config);
        let recall = train_like(&mut index, &w, &q, 100, 3);
        assert!(index.is_brute_force(), "unstructured rows: {:?}", index.calibrations());
        assert_eq!(recall, 1.0);
        let fitted = index.calibrations();
        assert_eq!((fitted.len(), fitted[0].k, fitted[0].budget), (1, 100, None));
    }

    /// Below `exact_below` rows the index is brute force in f32; from there, spherical.
    #[test]
    fn fewer_rows_than_exact_below_are_brute_force_in_f32() {
        let config = AutoConfig::default();
        let (w, _) = clustered(1_999, 32);
        assert_eq!(config.build(Rows::all(&w)).name(), "exact");
        let (w, _) = clustered(2_000, 32);
        assert_eq!(config.build(Rows::all(&w)).name(), "auto");
    }

    /// Brute force tries the clusters again after its queries: the rows of an untrained layer
    /// (all equal) calibrate to brute force; once they have trained into clusters, the trial
    /// keeps the clusters. A trial that ends in brute force again doubles the wait.
    #[test]
    fn brute_force_tries_the_clusters_again_once_rows_have_structure() {
        let (trained, q) = clustered(20_000, 32);
        let mut w = Matrix::zeros(20_000, 32);
        (0..w.rows()).for_each(|i| w.row_mut(i).fill(0.1));
        let mut index = AutoIndex::build(Rows::all(&w), &AutoConfig::default());
        train_like(&mut index, &w, &q, 10, 2);
        assert!(index.is_brute_force(), "equal rows: {:?}", index.calibrations());
        let wait = index.retry_after;
        assert_eq!(wait, AutoIndex::first_retry(20_000));

        // Still equal rows: the trial ends in brute force and the next waits twice as long.
        index.flat_queries.store(wait, Ordering::Relaxed);
        index.sync(Rows::all(&w), &[]);
        assert!(!index.is_brute_force(), "the trial fits clusters");
        train_like(&mut index, &w, &q, 10, 2);
        assert!(index.is_brute_force());
        assert_eq!(index.retry_after, 2 * wait);

        // Trained rows: the next trial keeps the clusters.
        let all: Vec<ClassId> = (0..20_000).collect();
        index.sync(Rows::all(&trained), &all);
        index.flat_queries.store(2 * wait, Ordering::Relaxed);
        let recall = train_like(&mut index, &trained, &q, 10, 3);
        assert!(!index.is_brute_force(), "trained rows: {:?}", index.calibrations());
        assert!(recall >= 0.85, "recall {recall}");
    }

    /// A recall outside (0, 1] names its key.
    #[test]
    fn a_recall_outside_0_1_names_its_key() {
        let e = AutoConfig { recall: 1.5, ..AutoConfig::default() }.check().unwrap_err();
        assert_eq!(e.key_and_message().0, "recall");
    }
}
