//! farout-search: maximum inner product search (MIPS) over the rows of the output layer's `W`.
//!
//! Search-based gradient estimators (LDGS paper, Algorithms 1 and 2) need, for a feature vector
//! `phi`, the classes with the largest scores `W_k . phi` without scoring all K of them. A
//! [`MipsIndex`] answers that query approximately and returns *exact* scores for what it finds.
//!
//! - [`ExactIndex`]: brute force; the recall reference.
//! - [`SphericalIndex`]: spherical clustering (Auvolat et al. 2015, the LDGS paper's choice):
//!   MIPS reduced to cosine search by norm augmentation, spherical k-means with about sqrt(K)
//!   centroids, probing the best centroids until enough candidates, exact rescoring.
//! - [`SimpleLshIndex`]: SimpleLSH (Neyshabur & Srebro 2015), sign random projections of the
//!   norm-augmented rows in several tables, multi-probe, exact rescoring.
//! - [`HammingIndex`]: one long SimpleLSH code per row, the rows nearest the query's code in
//!   Hamming distance rescored exactly (MEMOIR's LSH oracle).
//! - [`FlatInt8Index`]: brute force on int8 codes (VNNI, AMX), the best rows rescored exactly:
//!   every row looked at, at a fraction of f32 brute force's time; refreshing is re-quantising.
//! - [`HnswIndex`]: an HNSW graph (`hnsw_rs`) over the norm-augmented rows with `DistL2`,
//!   versioned re-insertion on refresh, exact rescoring.
//! - [`AutoIndex`] (the default): the spherical index where its calibration finds clusters
//!   that cut the search, int8 brute force where it does not.
//!
//! [`recall`] measures an index against brute force.
#![warn(missing_docs)]

mod augment;
mod auto;
// The checks every index passes, written once and run for each.
#[cfg(test)]
mod conformance;
mod exact;
mod flat_int8;
mod hamming;
mod hnsw;
mod lsh;
pub mod persist;
pub mod pq4;
pub mod quant;
mod spherical;
#[cfg(test)]
mod testutil;

pub use auto::{AutoConfig, AutoIndex};
pub use exact::{ExactConfig, ExactIndex};
pub use farout_core::topk::Hit;
pub use flat_int8::{FlatInt8Config, FlatInt8Index};
pub use hamming::{HammingConfig, HammingIndex};
pub use hnsw::{HnswConfig, HnswIndex};
pub use lsh::{SimpleLshConfig, SimpleLshIndex};
pub use spherical::{Calibrated, Scoring, SphericalConfig, SphericalIndex};

use farout_core::hugepages::HugeVec;
use farout_core::{ClassId, Matrix};
use rayon::prelude::*;

/// Errors of index configuration: a parameter outside its range.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A parameter is outside its valid range.
    #[error(transparent)]
    Param(#[from] farout_core::ParamError),
}

impl Error {
    /// The config key the error is about (relative to `[index]`) and what is wrong with it.
    pub fn key_and_message(&self) -> (&str, String) {
        match self {
            Error::Param(e) => e.key_and_message(),
        }
    }
}

/// Rejects `value` of parameter `name` unless it is a finite number at least `min`.
pub(crate) fn finite_at_least(name: &'static str, value: f32, min: f32) -> Result<(), farout_core::ParamError> {
    if value.is_finite() && value >= min {
        return Ok(());
    }
    let reason = if min == 0.0 { "must be a finite number >= 0" } else { "must be a finite number >= 1" };
    debug_assert!(min == 0.0 || min == 1.0, "add a reason for min = {min}");
    Err(farout_core::ParamError::new(name, value, reason))
}

/// Rejects `value` of count parameter `name` outside `range`, explained by `reason`.
pub(crate) fn count_in(
    name: &'static str,
    value: usize,
    range: std::ops::RangeInclusive<usize>,
    reason: &'static str,
) -> Result<(), farout_core::ParamError> {
    if range.contains(&value) { Ok(()) } else { Err(farout_core::ParamError::new(name, value, reason)) }
}

/// Room for `extra` more values, made by growing the capacity by an eighth (at least `extra`)
/// instead of doubling it. An index's per-cluster storage gains members one at a time as
/// training moves rows between clusters: doubling left most clusters' copies and codes nearly
/// half empty, about 290 MB at K = 672,000 (docs/decisions.md, "megaface-memory").
pub(crate) trait ReserveByEighths {
    fn reserve_by_eighths(&mut self, extra: usize);
}

/// What [`ReserveByEighths`] reserves (exactly) in a vector of `len` values and `capacity`.
fn room_by_eighths(len: usize, capacity: usize, extra: usize) -> usize {
    if capacity - len < extra { extra.max(len / 8) } else { 0 }
}

impl<T> ReserveByEighths for Vec<T> {
    fn reserve_by_eighths(&mut self, extra: usize) {
        self.reserve_exact(room_by_eighths(self.len(), self.capacity(), extra));
    }
}

impl<T> ReserveByEighths for HugeVec<T> {
    fn reserve_by_eighths(&mut self, extra: usize) {
        self.reserve_exact(room_by_eighths(self.len(), self.capacity(), extra));
    }
}

/// Top-k maximum inner product search over the rows of a matrix `W` that changes during
/// training.
///
/// Why this shape: the index never owns `W` (the output layer does, and updates it in place
/// every step), so both methods take it. An index stores what it needs to find candidates
/// (centroids, graphs, hash tables) and scores candidates either against `W` itself or against
/// its own copy of the rows, which streams faster than rows gathered from all over `W`
/// ([`SphericalIndex`]). Training tells the index which rows changed instead of rebuilding it, at
/// two costs: [`MipsIndex::sync`] after every step (cheap: copy the changed rows' values, so
/// scores stay exact) and [`MipsIndex::refresh`] every so many steps (re-index them: reassign
/// clusters, re-hash, re-insert); an index whose structure has decayed too far says so
/// ([`MipsIndex::needs_rebuild`]).
pub trait MipsIndex: Send + Sync {
    /// Name used in configs and logs.
    fn name(&self) -> &'static str;

    /// The (approximate) top `k` rows of `w` by inner product with `query` (length
    /// `w.dim()`), in no particular order, with exact scores, into `out` (cleared first). Scores
    /// are exact for `w` as of each row's last build, sync or refresh (for indexes that keep no
    /// copy of the rows: for `w` as it is). Returns the number of inner products computed (rows
    /// scored plus index overhead such as centroids): the query's cost, to compare with K for
    /// brute force.
    fn search(&self, w: Rows, query: &[f32], k: usize, out: &mut Vec<Hit>) -> usize;

    /// Searches every row of `queries` (`[n, w.dim()]`): `out[i]` gets query `i`'s top `k`, as
    /// [`MipsIndex::search`] would return it. Returns the summed cost. The default searches the
    /// queries in parallel one by one; indexes that can share work across queries override it.
    fn search_batch(&self, w: Rows, queries: &Matrix, k: usize, out: &mut Vec<Vec<Hit>>) -> usize {
        use rayon::prelude::*;
        out.resize_with(queries.rows(), Vec::new);
        out.truncate(queries.rows());
        out.par_iter_mut().enumerate().map(|(i, o)| self.search(w, queries.row(i), k, o)).sum()
    }

    /// [`MipsIndex::search_batch`] probing as a search for `probe_for` (at least `k`) results
    /// would, but keeping only each query's best `k` of what it scored: where the cost of a
    /// search lies in the rows it scores, fewer results cost less to select, copy and pass on.
    /// The default searches for `probe_for` and keeps the best `k` (ties to the lower class).
    fn search_batch_probing(
        &self,
        w: Rows,
        queries: &Matrix,
        k: usize,
        probe_for: usize,
        out: &mut Vec<Vec<Hit>>,
    ) -> usize {
        let cost = self.search_batch(w, queries, probe_for.max(k), out);
        for hits in out.iter_mut().filter(|h| h.len() > k) {
            if k > 0 {
                hits.select_nth_unstable_by(k - 1, farout_core::topk::by_score);
            }
            hits.truncate(k);
        }
        cost
    }

    /// Takes note of the new values of `rows` of `w`, which changed since the index last saw
    /// them, without re-indexing them: an index that keeps a copy of the rows updates it, so the
    /// scores it returns stay exact; where a row is found does not change until
    /// [`MipsIndex::refresh`]. Meant to run after every training step. The default does nothing
    /// (the index scores against `w` itself).
    fn sync(&mut self, _w: Rows, _rows: &[ClassId]) {}

    /// Re-indexes `rows` of `w`, which changed since they were last indexed (and syncs them).
    fn refresh(&mut self, w: Rows, rows: &[ClassId]);

    /// The cluster centres the index partitions its rows by, if it has any (the spherical
    /// index's unit centroids, `C x (D + 1)`): the ranks of a class-sharded layer build their
    /// indexes on one rank's ([`IndexConfig::build_on`]). The default has none.
    fn centroids(&self) -> Option<&Matrix> {
        None
    }

    /// Whether the index should be rebuilt from scratch (e.g. a row outgrew its norm bound).
    fn needs_rebuild(&self) -> bool {
        false
    }

    /// The probe budgets the index fitted to its target recall, one per `k` it was asked, with
    /// the recall each measured (empty for indexes that do not calibrate).
    fn calibrations(&self) -> Vec<Calibrated> {
        Vec::new()
    }

    /// Bytes held by the index (not counting `W`).
    fn memory_bytes(&self) -> usize;

    /// Writes what [`persist`] needs to restore the index without building it again, so that
    /// the restored index answers as this one does. The default refuses, saying the kind has
    /// no saved form; a kind that cannot be saved overrides it to say why.
    fn save_state(&self, _out: &mut persist::Enc) -> Result<(), persist::Unsupported> {
        Err(persist::Unsupported { kind: self.name(), why: "this index kind has no saved form" })
    }
}

/// The rows of `W` an index searches: every column, or one block of columns (the LDGS block
/// `W^(j)`), viewed in place without copying.
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    m: &'a Matrix,
    start: usize,
    end: usize,
    norm_floor: f32,
}

impl<'a> Rows<'a> {
    /// All columns of `m`.
    pub fn all(m: &'a Matrix) -> Self {
        Self { m, start: 0, end: m.cols(), norm_floor: 0.0 }
    }

    /// Columns `start..end` of `m`.
    pub fn block(m: &'a Matrix, start: usize, end: usize) -> Self {
        assert!(start <= end && end <= m.cols(), "column block {start}..{end} of a {}-column matrix", m.cols());
        Self { m, start, end, norm_floor: 0.0 }
    }

    /// The same rows, for an index that bounds row norms (norm augmentation) as though their
    /// largest norm were at least `floor`: the shards of a class-sharded layer share one bound,
    /// as one index over all the rows would have.
    pub fn with_norm_floor(self, floor: f32) -> Self {
        Self { norm_floor: floor, ..self }
    }

    /// See [`Rows::with_norm_floor`] (0 when not set).
    pub fn norm_floor(&self) -> f32 {
        self.norm_floor
    }

    /// Row `i` restricted to the view's columns.
    #[inline]
    pub fn row(&self, i: usize) -> &'a [f32] {
        &self.m.row(i)[self.start..self.end]
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.m.rows()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.m.rows() == 0
    }

    /// The whole matrix the view is taken from.
    pub fn matrix(&self) -> &'a Matrix {
        self.m
    }

    /// Number of columns in the view.
    pub fn dim(&self) -> usize {
        self.end - self.start
    }

    /// Iterator over the rows.
    pub fn iter(&self) -> impl Iterator<Item = &'a [f32]> + '_ {
        (0..self.len()).map(|i| self.row(i))
    }
}

/// Mean overlap `|approx ∩ exact| / |exact|` of an index's top-`k` with brute force over
/// `queries` (rows of a matrix), searched one query at a time.
pub fn recall(index: &dyn MipsIndex, w: Rows, queries: &Matrix, k: usize) -> f64 {
    use rayon::prelude::*;
    let exact = ExactIndex::new();
    let total: f64 = (0..queries.rows())
        .into_par_iter()
        .map_init(
            || (Vec::new(), Vec::new(), Vec::new()),
            |(a, e, seen): &mut (Vec<Hit>, Vec<Hit>, Vec<ClassId>), i| {
                index.search(w, queries.row(i), k, a);
                exact.search(w, queries.row(i), k, e);
                overlap_one(a, e, seen)
            },
        )
        .sum();
    total / queries.rows().max(1) as f64
}

/// Mean overlap `|found ∩ exact| / |exact|` over queries (`found[i]`, `exact[i]`: query i's
/// results).
pub fn overlap(found: &[Vec<Hit>], exact: &[Vec<Hit>]) -> f64 {
    let mut seen = Vec::new();
    let total: f64 = found.iter().zip(exact).map(|(a, e)| overlap_one(a, e, &mut seen)).sum();
    total / found.len().max(1) as f64
}

/// `|found ∩ exact| / |exact|` (`seen`: scratch).
fn overlap_one(found: &[Hit], exact: &[Hit], seen: &mut Vec<ClassId>) -> f64 {
    seen.clear();
    seen.extend(exact.iter().map(|h| h.class));
    seen.sort_unstable();
    let hits = found.iter().filter(|h| seen.binary_search(&h.class).is_ok()).count();
    hits as f64 / exact.len().max(1) as f64
}

/// What an index's parameters can do: build the index over the rows of `W`.
///
/// Each index module defines its parameter struct (the keys of `[index]` it accepts, with their
/// defaults) and implements this trait for it; [`IndexConfig`] lists them.
pub trait IndexParams {
    /// Checks every parameter against its range; the error names the key (relative to
    /// `[index]`) and what is allowed. Configs are checked once, when they are loaded.
    fn check(&self) -> Result<(), farout_core::ParamError> {
        Ok(())
    }

    /// Builds the index over `w` (from checked parameters).
    fn build(&self, w: Rows) -> Box<dyn MipsIndex>;
}

farout_core::plugin_registry! {
    /// The index of `[index]` (tag `kind`) with its parameters.
    pub enum IndexConfig: IndexParams, tag = "kind" {
        /// Brute force (the recall reference).
        Exact(exact::ExactConfig) = "exact",
        /// Spherical clustering (Auvolat et al. 2015; the LDGS paper's index).
        Spherical(SphericalConfig) = "spherical",
        /// SimpleLSH (Neyshabur & Srebro 2015): sign random projections, multi-probe.
        SimpleLsh(SimpleLshConfig) = "simple_lsh",
        /// SimpleLSH codes ranked by Hamming distance, exact rescoring (MEMOIR's LSH oracle).
        Hamming(HammingConfig) = "hamming",
        /// HNSW graph (Malkov & Yashunin 2018, via hnsw_rs) over the norm-augmented rows.
        Hnsw(HnswConfig) = "hnsw",
        /// Brute force on int8 codes, the best rows rescored exactly.
        FlatInt8(FlatInt8Config) = "flat_int8",
        /// Spherical clustering where it cuts the search, int8 brute force where not.
        Auto(AutoConfig) = "auto",
    }
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self::Auto(AutoConfig::default())
    }
}

impl IndexConfig {
    /// Checks the index's parameters (see [`IndexParams::check`]).
    pub fn check(&self) -> Result<(), farout_core::ParamError> {
        self.params().check()
    }

    /// Builds the configured index over `w`.
    pub fn build(&self, w: Rows) -> Box<dyn MipsIndex> {
        self.params().build(w)
    }

    /// [`IndexConfig::build`], a spherical index on the given `centroids` (another index's
    /// [`MipsIndex::centroids`] over rows of the same dimension and norm bound) instead of
    /// centroids fitted to `w`. The ranks of a class-sharded layer hold rows dealt from one
    /// layer, alike in distribution: on the same centroids their clusters stay alike in size as
    /// the rows train and move between clusters, so every rank probes about as many rows per
    /// query, where centroids fitted by each rank drift apart (decisions.md,
    /// `sharded-shared-centroids`). Other indexes, and centroids of another shape, build as
    /// [`IndexConfig::build`].
    pub fn build_on(&self, w: Rows, centroids: Option<&Matrix>) -> Box<dyn MipsIndex> {
        match (self, centroids) {
            (Self::Spherical(c), Some(centroids)) if centroids.cols() == w.dim() + 1 => c.build_on(w, Some(centroids)),
            _ => self.build(w),
        }
    }

    /// Brute force.
    pub fn exact() -> Self {
        Self::Exact(exact::ExactConfig {})
    }

    /// The settings of one of `ranks` indexes, each over a shard of the `n_rows` rows of a
    /// class-sharded layer, that together search as this index over all the rows would: the
    /// spherical index is brute force on every shard exactly when it would be on the whole
    /// (`exact_below` counts the whole layer's rows), and a fixed `candidate_factor` is split
    /// over the shards (at least 1 per shard), so that the ranks score as many rows per query
    /// as one process. A calibrated index reaches its target recall on each shard, hence on
    /// their merged top-k. The automatic index likewise is brute force on every shard exactly
    /// when it would be on the whole (`exact_below`). Other indexes are unchanged.
    pub fn for_shard(&self, n_rows: usize, ranks: usize) -> Self {
        match self {
            Self::Auto(c) if ranks > 1 => {
                let exact_below = if n_rows < c.exact_below { usize::MAX } else { 0 };
                Self::Auto(AutoConfig { exact_below, ..c.clone() })
            }
            Self::Spherical(c) if ranks > 1 => {
                let mut c = c.clone();
                let whole_is_exact = c.candidate_factor.is_none() && n_rows < c.exact_below;
                c.exact_below = if whole_is_exact { usize::MAX } else { 0 };
                c.candidate_factor = c.candidate_factor.map(|f| (f / ranks as f32).max(1.0));
                Self::Spherical(c)
            }
            other => other.clone(),
        }
    }
}

/// One index per column block of `W` (LDGS: `B` blocks of `D / B` dimensions); a single block
/// covers all columns and serves Algorithm 1.
pub struct BlockIndex {
    blocks: Vec<Box<dyn MipsIndex>>,
    width: usize,
}

impl BlockIndex {
    /// Builds `n_blocks` indexes of `config` over the column blocks of `w` (`w.cols()` must be a
    /// multiple of `n_blocks`; callers validate it).
    pub fn build(w: &Matrix, config: &IndexConfig, n_blocks: usize) -> Self {
        Self::build_with_norm_floors(w, config, n_blocks, &[])
    }

    /// [`BlockIndex::build`] with block `j`'s norm bound fitted as though its rows' largest
    /// norm were at least `floors[j]` (when given; see [`Rows::with_norm_floor`]).
    pub fn build_with_norm_floors(w: &Matrix, config: &IndexConfig, n_blocks: usize, floors: &[f32]) -> Self {
        Self::build_on(w, config, n_blocks, floors, &[])
    }

    /// [`BlockIndex::build_with_norm_floors`] with block `j` built on `centroids[j]` (when
    /// given; see [`IndexConfig::build_on`]).
    pub fn build_on(w: &Matrix, config: &IndexConfig, n_blocks: usize, floors: &[f32], centroids: &[Matrix]) -> Self {
        assert!(n_blocks > 0 && w.cols().is_multiple_of(n_blocks), "{} columns in {n_blocks} blocks", w.cols());
        let width = w.cols() / n_blocks;
        let blocks = (0..n_blocks)
            .map(|j| {
                let rows = Rows::block(w, j * width, (j + 1) * width);
                config.build_on(rows.with_norm_floor(floors.get(j).copied().unwrap_or(0.0)), centroids.get(j))
            })
            .collect();
        Self { blocks, width }
    }

    /// Every block's [`MipsIndex::centroids`], or none if a block has none.
    pub fn centroids(&self) -> Option<Vec<Matrix>> {
        self.blocks.iter().map(|b| b.centroids().cloned()).collect()
    }

    /// The index made of `blocks`, each over `width` columns (a restored index's; see
    /// [`persist`]).
    pub fn from_blocks(blocks: Vec<Box<dyn MipsIndex>>, width: usize) -> Self {
        Self { blocks, width }
    }

    /// The largest norm of a row of `w` in each of `n_blocks` column blocks.
    pub fn block_norms(w: &Matrix, n_blocks: usize) -> Vec<f32> {
        let width = w.cols() / n_blocks.max(1);
        (0..n_blocks)
            .map(|j| {
                Rows::block(w, j * width, (j + 1) * width).iter().map(farout_core::kernels::norm).fold(0.0f32, f32::max)
            })
            .collect()
    }

    /// Number of blocks B.
    pub fn n_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Columns per block.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The view of `w` that block `j` indexes.
    pub fn rows<'a>(&self, w: &'a Matrix, j: usize) -> Rows<'a> {
        Rows::block(w, j * self.width, (j + 1) * self.width)
    }

    /// The index of block `j`.
    pub fn block(&self, j: usize) -> &dyn MipsIndex {
        self.blocks[j].as_ref()
    }

    /// Top `k` of block `j` for the matching slice of the full query `phi`; returns the cost.
    pub fn search_block(&self, w: &Matrix, j: usize, phi: &[f32], k: usize, out: &mut Vec<Hit>) -> usize {
        self.blocks[j].search(self.rows(w, j), &phi[j * self.width..(j + 1) * self.width], k, out)
    }

    /// Top `k` of block `j` for every row of `phi` (`[n, D]`, full width); returns the cost.
    pub fn search_block_batch(&self, w: &Matrix, j: usize, phi: &Matrix, k: usize, out: &mut Vec<Vec<Hit>>) -> usize {
        self.search_block_batch_probing(w, j, phi, k, k, out)
    }

    /// [`BlockIndex::search_block_batch`] probing as a search for `probe_for` results would,
    /// keeping each query's best `k` ([`MipsIndex::search_batch_probing`]).
    pub fn search_block_batch_probing(
        &self,
        w: &Matrix,
        j: usize,
        phi: &Matrix,
        k: usize,
        probe_for: usize,
        out: &mut Vec<Vec<Hit>>,
    ) -> usize {
        let search = |queries: &Matrix, out: &mut Vec<Vec<Hit>>| {
            self.blocks[j].search_batch_probing(self.rows(w, j), queries, k, probe_for, out)
        };
        if self.n_blocks() == 1 {
            return search(phi, out);
        }
        let mut q = Matrix::zeros(phi.rows(), self.width);
        for i in 0..phi.rows() {
            q.row_mut(i).copy_from_slice(&phi.row(i)[j * self.width..(j + 1) * self.width]);
        }
        search(&q, out)
    }

    /// Syncs `rows` in every block ([`MipsIndex::sync`]), the blocks in parallel.
    pub fn sync(&mut self, w: &Matrix, rows: &[ClassId]) {
        let width = self.width;
        self.blocks.par_iter_mut().enumerate().for_each(|(j, b)| {
            b.sync(Rows::block(w, j * width, (j + 1) * width), rows);
        });
    }

    /// Re-indexes `rows` in every block, the blocks in parallel.
    pub fn refresh(&mut self, w: &Matrix, rows: &[ClassId]) {
        let width = self.width;
        self.blocks.par_iter_mut().enumerate().for_each(|(j, b)| {
            b.refresh(Rows::block(w, j * width, (j + 1) * width), rows);
        });
    }

    /// Whether any block asks for a rebuild.
    pub fn needs_rebuild(&self) -> bool {
        self.blocks.iter().any(|b| b.needs_rebuild())
    }

    /// Bytes held by all blocks.
    pub fn memory_bytes(&self) -> usize {
        self.blocks.iter().map(|b| b.memory_bytes()).sum()
    }

    /// Rows scanned per query for `k` results as each block's index calibrated them (brute
    /// force counts all rows), averaged over the blocks; `None` until every block has
    /// calibrated `k` (always for indexes that do not calibrate).
    pub fn calibrated_probes(&self, k: usize) -> Option<f64> {
        let mut total = 0.0;
        for b in &self.blocks {
            total += b.calibrations().into_iter().find(|c| c.k == k)?.probed;
        }
        Some(total / self.blocks.len() as f64)
    }

    /// Mean recall over the blocks of their top-`k` against brute force on the same block,
    /// both searched batched, as training searches (brute force by matrix products, not one
    /// query at a time, where each query would read every row of `W` from memory).
    pub fn recall(&self, w: &Matrix, queries: &Matrix, k: usize) -> f64 {
        let mut total = 0.0;
        let (mut found, mut exact) = (Vec::new(), Vec::new());
        for j in 0..self.n_blocks() {
            let mut q = Matrix::zeros(queries.rows(), self.width);
            for i in 0..queries.rows() {
                q.row_mut(i).copy_from_slice(&queries.row(i)[j * self.width..(j + 1) * self.width]);
            }
            self.block(j).search_batch(self.rows(w, j), &q, k, &mut found);
            ExactIndex::new().search_batch(self.rows(w, j), &q, k, &mut exact);
            total += overlap(&found, &exact);
        }
        total / self.n_blocks() as f64
    }
}
