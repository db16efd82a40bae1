use crate::Error;
use crate::layer_file::{Parts, open_checked};
use crate::optim::{Optimizer, OptimizerConfig, split_rows};
use farout_core::binio::read_f32s;
use farout_core::gemm::{self, Op};
use farout_core::{ClassId, Matrix, ParamError, Rng, kernels, rng};
use farout_dist::Strided;
use farout_estimators::{Batch, BatchEstimate, BatchGrad, Ctx, GradientEstimator};
use farout_search::{BlockIndex, IndexConfig};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::path::Path;

mod dense_update;
mod saved_index;
mod tiled;

pub use saved_index::INDEX_FILES;

/// Configuration of the output layer (the `[output.layer]` block of a config, together with
/// the optimiser in `[output.optimizer]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutputLayerConfig {
    /// Whether classes have a bias `b_k`.
    pub bias: bool,
    /// Standard deviation of the normal initialisation of W (0 = zeros, which is fine for a
    /// frozen encoder and for convex losses).
    pub init_std: f32,
    /// How W and the bias start: `normal` (N(0, init_std²), zero bias) or `msi`, the
    /// mean-separating initialisation from one pass over the training features (the trainer
    /// computes it; see `farout_linear::init::OutputLayerMsi`).
    pub init: LayerInit,
    /// MSI: score asked of each class's mean feature vector.
    pub msi_s: f32,
    /// MSI: score asked of the mean of the other classes' samples.
    pub msi_t: f32,
}

/// The initialisation of W (`output.layer.init`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerInit {
    /// Normal with standard deviation `init_std` (zeros when 0), zero bias.
    #[default]
    Normal,
    /// Mean-separating: `W_k = u_k p̄_k + v_k x̄` with the class means p̄_k and the overall
    /// mean x̄ of the training features, so that p̄_k scores `msi_s` and the other samples'
    /// mean `msi_t` (Schultheis & Babbar, eqs. 21–24, applied to φ).
    Msi,
}

impl Default for OutputLayerConfig {
    fn default() -> Self {
        Self { bias: true, init_std: 0.0, init: LayerInit::Normal, msi_s: 1.0, msi_t: -2.0 }
    }
}

/// What a training step did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepStats {
    /// Sum of the batch's loss estimates.
    pub loss_sum: f64,
    /// Classes scored, summed over the batch (the estimator's cost).
    pub classes_scored: usize,
    /// Rows of W that changed.
    pub rows_updated: usize,
}

/// When an attached index is maintained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexUpkeep {
    /// Re-index the rows that changed every this many steps (at least 1).
    pub refresh_every: u64,
    /// Rebuild from scratch every this many steps (0 = only when the index asks). Refreshes
    /// move changed rows between fixed clusters (or buckets, or graph neighbourhoods) chosen for
    /// the rows the index was built on; as training moves the rows, a rebuild re-fits them.
    pub rebuild_every: u64,
}

impl Default for IndexUpkeep {
    fn default() -> Self {
        Self { refresh_every: 1, rebuild_every: 0 }
    }
}

/// A MIPS index over the rows of W and the rows changed since it last saw them.
struct Attached {
    config: IndexConfig,
    n_blocks: usize,
    upkeep: IndexUpkeep,
    index: Option<BlockIndex>,
    dirty: Vec<bool>,
    dirty_rows: Vec<ClassId>,
    steps_since_refresh: u64,
    steps_since_build: u64,
    rebuilds: u64,
    /// Rebuild before the next search, whatever the index says.
    rebuild_requested: bool,
    /// Each block's norm bound at least these largest norms at the next build (shared by the
    /// ranks of a class-sharded layer).
    norm_floors: Vec<f32>,
    /// Each block's centroids at the next build, when given (another rank's: see
    /// [`OutputLayer::build_index_on`]).
    centroids: Vec<Matrix>,
}

/// The output layer: `W` (K x D), optional bias, their optimisers, an optional MIPS index and
/// reusable buffers.
pub struct OutputLayer {
    w: Matrix,
    bias: Option<Vec<f32>>,
    opt_w: Optimizer,
    opt_b: Optimizer,
    grads: BatchGrad,
    dphi: Matrix,
    /// The `rows x D` gradient of W for adaptive optimisers (dense steps).
    dw: Vec<f32>,
    entries: Vec<(ClassId, u32, f32)>,
    grouping: Grouping,
    /// Rows changed by the last sparse update, in class order.
    touched: Vec<ClassId>,
    attached: Option<Attached>,
}

impl OutputLayer {
    /// A layer of `n_classes x d_model` initialised from `seed`.
    pub fn new(
        n_classes: usize,
        d_model: usize,
        config: &OutputLayerConfig,
        optimizer: &OptimizerConfig,
        seed: u64,
    ) -> Result<Self, Error> {
        Self::with_classes(Strided::whole(n_classes), d_model, config, optimizer, seed)
    }

    /// One rank's classes `shard` of the layer [`OutputLayer::new`] would make (a shard of a
    /// class-sharded layer): row `k` here starts as row `shard.global(k)` there.
    pub fn with_classes(
        shard: Strided,
        d_model: usize,
        config: &OutputLayerConfig,
        optimizer: &OptimizerConfig,
        seed: u64,
    ) -> Result<Self, Error> {
        let n_classes = shard.len();
        optimizer.check()?;
        if n_classes == 0 || d_model == 0 {
            return Err(Error::Param(ParamError::message(
                "output",
                format!("a {n_classes} x {d_model} layer has no weights"),
            )));
        }
        if !(config.init_std >= 0.0) {
            return Err(Error::Param(ParamError::message(
                "output.layer.init_std",
                format!("{} must be >= 0", config.init_std),
            )));
        }
        if config.init == LayerInit::Msi
            && !(config.msi_t < config.msi_s && config.msi_s.is_finite() && config.msi_t.is_finite())
        {
            return Err(Error::Param(ParamError::message(
                "output.layer.msi_t",
                format!("{} must be a finite number less than output.layer.msi_s = {}", config.msi_t, config.msi_s),
            )));
        }
        let mut w = Matrix::zeros(n_classes, d_model);
        if config.init_std > 0.0 {
            w.as_mut_slice().par_chunks_mut(d_model).enumerate().for_each(|(k, row)| {
                let mut r = rng::seeded(seed, shard.global(k) as u64);
                row.iter_mut().for_each(|x| *x = config.init_std * rng::normal(&mut r));
            });
        }
        Ok(Self {
            w,
            bias: config.bias.then(|| vec![0.0; n_classes]),
            opt_w: optimizer.build(n_classes, d_model),
            opt_b: optimizer.build(n_classes, 1),
            grads: BatchGrad::default(),
            dphi: Matrix::default(),
            dw: Vec::new(),
            entries: Vec::new(),
            grouping: Grouping::default(),
            touched: Vec::new(),
            attached: None,
        })
    }

    /// Number of classes K.
    pub fn n_classes(&self) -> usize {
        self.w.rows()
    }

    /// Feature dimension D.
    pub fn d_model(&self) -> usize {
        self.w.cols()
    }

    /// The weights.
    pub fn weights(&self) -> &Matrix {
        &self.w
    }

    /// Replaces W by `w` of the same shape (for example output vectors trained elsewhere); an
    /// attached index is rebuilt before its next search. NaN or infinite weights are refused
    /// here, where they enter, rather than in the index built over them.
    pub fn set_weights(&mut self, w: Matrix) -> Result<(), Error> {
        if (w.rows(), w.cols()) != (self.w.rows(), self.w.cols()) {
            return Err(Error::Param(ParamError::message(
                "output",
                format!("weights of {} x {} for a {} x {} layer", w.rows(), w.cols(), self.w.rows(), self.w.cols()),
            )));
        }
        if let Some((row, col)) = w.first_non_finite() {
            let v = w.row(row)[col];
            return Err(Error::Param(ParamError::message(
                "output",
                format!("weight row {row}, column {col} is {v}: the layer takes finite weights only"),
            )));
        }
        self.w = w;
        if let Some(a) = &mut self.attached {
            a.index = None;
        }
        Ok(())
    }

    /// The largest magnitude of a weight or bias of the rows the last training step updated
    /// (every row after a dense step; 0 before the first step), NaN if one of them is NaN. A
    /// pass over those rows: callers check it every so often, not at every step.
    pub fn updated_scale(&self) -> f32 {
        if self.grads.is_dense {
            return self.scale();
        }
        let bias = |k: usize| self.bias.as_ref().map_or(0.0, |b| b[k]);
        self.touched.iter().fold(0.0, |m, &k| {
            let k = k as usize;
            max_magnitude(max_magnitude(m, self.w.row(k)), &[bias(k)])
        })
    }

    /// The largest magnitude of a weight or bias of the layer, NaN if one is NaN.
    pub fn scale(&self) -> f32 {
        max_magnitude(max_magnitude(0.0, self.w.as_slice()), self.bias.as_deref().unwrap_or(&[]))
    }

    /// The biases, if any.
    pub fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// Replaces the biases by `b` (one per class; the layer must have biases).
    pub fn set_bias(&mut self, b: Vec<f32>) -> Result<(), Error> {
        if let Some(k) = b.iter().position(|x| !x.is_finite()) {
            return Err(Error::Param(ParamError::message(
                "output",
                format!("the bias of class {k} is {}: the layer takes finite biases only", b[k]),
            )));
        }
        match &mut self.bias {
            Some(old) if old.len() == b.len() => {
                *old = b;
                Ok(())
            }
            Some(old) => Err(Error::Param(ParamError::message(
                "output",
                format!("{} biases for {} classes", b.len(), old.len()),
            ))),
            None => Err(Error::Param(ParamError::message("output.layer.bias", "the layer has no bias to set"))),
        }
    }

    /// The view estimators score against (with the index, once built).
    pub fn ctx(&self) -> Ctx<'_> {
        Ctx { w: &self.w, bias: self.bias.as_deref(), index: self.index() }
    }

    /// Attaches MIPS indexes of `config` over `n_blocks` column blocks of W (1 = one index over
    /// all columns), built lazily at the first step of an estimator that uses them, synced after
    /// every step, refreshed with the rows that changed and rebuilt as `upkeep` says (and when an
    /// index asks).
    pub fn attach_index(&mut self, config: IndexConfig, n_blocks: usize, upkeep: IndexUpkeep) -> Result<(), Error> {
        if n_blocks == 0 || !self.d_model().is_multiple_of(n_blocks) {
            return Err(Error::Param(ParamError::message(
                "output.blocks",
                format!("{n_blocks} blocks do not divide the feature dimension {}", self.d_model()),
            )));
        }
        self.attached = Some(Attached {
            config,
            n_blocks,
            upkeep: IndexUpkeep { refresh_every: upkeep.refresh_every.max(1), ..upkeep },
            index: None,
            dirty: vec![false; self.n_classes()],
            dirty_rows: Vec::new(),
            steps_since_refresh: 0,
            steps_since_build: 0,
            rebuilds: 0,
            rebuild_requested: false,
            norm_floors: Vec::new(),
            centroids: Vec::new(),
        });
        Ok(())
    }

    /// Whether the attached index is built from scratch before its next search: not built
    /// yet, asked for by the index (a row outgrew its norm bound) or by
    /// [`Self::request_index_rebuild`], or due by [`IndexUpkeep::rebuild_every`].
    pub fn index_rebuild_due(&self) -> bool {
        self.attached.as_ref().is_some_and(|a| {
            a.rebuild_requested
                || a.index.as_ref().is_none_or(|i| i.needs_rebuild())
                || (a.upkeep.rebuild_every > 0 && a.steps_since_build >= a.upkeep.rebuild_every)
        })
    }

    /// Builds the attached index from scratch before its next search, each block's norm bound
    /// fitted as though its rows' largest norm were at least `norm_floors[j]`: the ranks of a
    /// class-sharded layer rebuild together when one of them must (so that one rank's rebuild
    /// does not stall the others on its own), with the bound of the whole layer's rows (so that
    /// a rank's rows outgrow it no sooner than one index's would).
    pub fn request_index_rebuild(&mut self, norm_floors: Vec<f32>) {
        if let Some(a) = &mut self.attached {
            a.rebuild_requested = true;
            a.norm_floors = norm_floors;
        }
    }

    /// Builds the attached index now if it is due ([`Self::index_rebuild_due`]), each block on
    /// the given `centroids` when there are some (another rank's [`Self::index_centroids`]; see
    /// [`farout_search::IndexConfig::build_on`]); otherwise it builds before the next search.
    pub fn build_index_on(&mut self, centroids: Vec<Matrix>) {
        if let Some(a) = &mut self.attached {
            a.centroids = centroids;
        }
        self.ensure_index();
    }

    /// The attached index's centroids, one matrix per block, if every block has some (a
    /// spherical index).
    pub fn index_centroids(&self) -> Option<Vec<Matrix>> {
        self.index().and_then(BlockIndex::centroids)
    }

    /// The largest norm of a row in each column block of the attached index (none without).
    pub fn index_block_norms(&self) -> Vec<f32> {
        self.attached.as_ref().map_or_else(Vec::new, |a| BlockIndex::block_norms(&self.w, a.n_blocks))
    }

    /// The attached indexes, once built.
    pub fn index(&self) -> Option<&BlockIndex> {
        self.attached.as_ref().and_then(|a| a.index.as_ref())
    }

    /// Number of full index builds so far (the first build counts).
    pub fn index_builds(&self) -> u64 {
        self.attached.as_ref().map_or(0, |a| a.rebuilds)
    }

    /// Recall of the index's top-`k` against brute force for `queries` (`[n, d_model]`),
    /// averaged over the blocks.
    pub fn index_recall(&self, queries: &Matrix, k: usize) -> Option<f64> {
        self.index().map(|i| i.recall(&self.w, queries, k))
    }

    /// Rows the index scans per query for `k` results as calibrated to its target recall,
    /// averaged over the blocks (`None` without an index, or before it has calibrated `k`).
    pub fn index_probes(&self, k: usize) -> Option<f64> {
        self.index().and_then(|i| i.calibrated_probes(k))
    }

    fn ensure_index(&mut self) {
        if self.index_rebuild_due()
            && let Some(a) = &mut self.attached
        {
            a.rebuild_requested = false;
            a.index = None; // free the old index before building the new one
            a.index = Some(BlockIndex::build_on(&self.w, &a.config, a.n_blocks, &a.norm_floors, &a.centroids));
            a.norm_floors.clear();
            a.centroids.clear();
            a.rebuilds += 1;
            a.dirty.fill(false);
            a.dirty_rows.clear();
            a.steps_since_refresh = 0;
            a.steps_since_build = 0;
        }
    }

    /// Records that `rows` changed (all rows when `None`): re-indexes every changed row when a
    /// refresh is due, else syncs them into the index now (its scores stay exact).
    fn after_update(&mut self, rows: Option<&[ClassId]>) {
        let Some(a) = &mut self.attached else { return };
        let Some(index) = &mut a.index else { return };
        a.steps_since_refresh += 1;
        a.steps_since_build += 1;
        let refresh = a.steps_since_refresh >= a.upkeep.refresh_every;
        match rows {
            Some(rows) => {
                for &r in rows {
                    if !a.dirty[r as usize] {
                        a.dirty[r as usize] = true;
                        a.dirty_rows.push(r);
                    }
                }
            }
            None => {
                a.dirty_rows.clear();
                a.dirty_rows.extend(0..a.dirty.len() as ClassId);
                a.dirty.fill(true);
            }
        }
        if !refresh {
            index.sync(&self.w, rows.unwrap_or(&a.dirty_rows));
        } else {
            // A refresh syncs the rows it re-indexes.
            index.refresh(&self.w, &a.dirty_rows);
            for &r in &a.dirty_rows {
                a.dirty[r as usize] = false;
            }
            a.dirty_rows.clear();
            a.steps_since_refresh = 0;
        }
    }

    /// Steps taken.
    pub fn step(&self) -> u64 {
        self.opt_w.step()
    }

    /// Current step size of the W optimiser.
    pub fn lr(&self) -> f32 {
        self.opt_w.lr()
    }

    /// Bytes held by W, the bias and optimiser state.
    pub fn memory_bytes(&self) -> usize {
        self.w.bytes()
            + self.bias.as_ref().map_or(0, |b| b.len() * 4)
            + (self.opt_w.accum.len() + self.opt_b.accum.len()) * 4
    }

    /// `dL/dphi` of the last step (`[batch, d_model]`), when it was requested.
    pub fn dphi(&self) -> &Matrix {
        &self.dphi
    }

    /// Scores of a batch: `out = phi W^T + b` (`[batch, K]`).
    pub fn scores(&self, phi: &Matrix, out: &mut Matrix) {
        let (b, k, d) = (phi.rows(), self.n_classes(), self.d_model());
        out.reshape_for_overwrite(b, k);
        gemm::scores(phi.as_slice(), b, self.w.as_slice(), k, d, out.as_mut_slice());
        if let Some(bias) = &self.bias {
            out.as_mut_slice().par_chunks_mut(k).for_each(|z| z.iter_mut().zip(bias).for_each(|(v, b)| *v += b));
        }
    }

    /// `dL/dphi` of the last step, to combine with other ranks' shares (a class-sharded layer
    /// sums them).
    pub fn dphi_mut(&mut self) -> &mut Matrix {
        &mut self.dphi
    }

    /// One training step: estimates class gradients for `batch`, computes `dL/dphi` (when
    /// `want_dphi`; read it with [`Self::dphi`]) and updates the touched rows.
    pub fn train_step(
        &mut self,
        estimator: &dyn GradientEstimator,
        batch: Batch,
        rng: &mut Rng,
        want_dphi: bool,
    ) -> StepStats {
        if estimator.uses_index() {
            assert!(self.attached.is_some(), "estimator `{}` needs an index: call attach_index", estimator.name());
            self.ensure_index();
        }
        if let Some(tiled) = estimator.tiled().filter(|_| batch.phi.rows() > 0 && self.n_classes() > 0) {
            self.ensure_index();
            return self.train_step_tiled(tiled, batch, want_dphi);
        }
        let estimate = |ctx: &Ctx, batch: Batch, grads: &mut BatchGrad| {
            Ok::<_, std::convert::Infallible>(estimator.estimate_batch(ctx, batch, rng, grads))
        };
        match self.train_step_with(batch, want_dphi, estimate) {
            Ok(stats) => stats,
            Err(never) => match never {},
        }
    }

    /// [`Self::train_step`] with the class gradients from `estimate(ctx, batch, grads)` instead
    /// of a [`GradientEstimator`]: for gradients that need more than this layer's rows, such as
    /// a class-sharded softmax that combines the ranks' normalisers on the calling thread. An
    /// attached index is built first when due, as for [`Self::train_step`]. An error of
    /// `estimate` leaves W, the bias and the optimisers as they were.
    pub fn train_step_with<E>(
        &mut self,
        batch: Batch,
        want_dphi: bool,
        estimate: impl FnOnce(&Ctx, Batch, &mut BatchGrad) -> Result<BatchEstimate, E>,
    ) -> Result<StepStats, E> {
        self.ensure_index();
        let index = self.attached.as_ref().and_then(|a| a.index.as_ref());
        let ctx = Ctx { w: &self.w, bias: self.bias.as_deref(), index };
        let est = estimate(&ctx, batch, &mut self.grads)?;
        let rows_updated = if self.grads.is_dense {
            if want_dphi {
                self.grads.dphi(&self.w, &mut self.dphi);
            }
            let n = self.update_dense(batch.phi);
            self.after_update(None);
            n
        } else {
            let n = self.backward_sparse(batch.phi, want_dphi, true);
            if self.index().is_some() {
                let rows = std::mem::take(&mut self.touched);
                self.after_update(Some(&rows));
                self.touched = rows;
            }
            n
        };
        self.opt_w.advance();
        self.opt_b.advance();
        Ok(StepStats { loss_sum: est.loss_sum, classes_scored: est.classes_scored, rows_updated })
    }

    /// Like [`Self::train_step`] with `dL/dphi`, but W, the bias and their optimisers stay as
    /// they are: the layer as a fixed function of `phi` (alternating updates, where the
    /// features move while the classes wait).
    pub fn backward_only(&mut self, estimator: &dyn GradientEstimator, batch: Batch, rng: &mut Rng) -> StepStats {
        let est = self.estimate(estimator, batch, rng, true);
        StepStats { loss_sum: est.loss_sum, classes_scored: est.classes_scored, rows_updated: 0 }
    }

    /// The class gradients of `batch` into `self.grads`, and `dL/dphi` (from the current W)
    /// when `want_dphi`.
    fn estimate(
        &mut self,
        estimator: &dyn GradientEstimator,
        batch: Batch,
        rng: &mut Rng,
        want_dphi: bool,
    ) -> BatchEstimate {
        if estimator.uses_index() {
            assert!(self.attached.is_some(), "estimator `{}` needs an index: call attach_index", estimator.name());
            self.ensure_index();
        }
        // Field-wise borrows: the context reads W while the gradient buffers are written.
        let index = self.attached.as_ref().and_then(|a| a.index.as_ref());
        let ctx = Ctx { w: &self.w, bias: self.bias.as_deref(), index };
        let est = estimator.estimate_batch(&ctx, batch, rng, &mut self.grads);
        if want_dphi {
            if self.grads.is_dense {
                self.grads.dphi(&self.w, &mut self.dphi);
            } else {
                self.backward_sparse(batch.phi, true, false);
            }
        }
        est
    }

    /// All rows change: `dW = G^T Phi` by one matrix product.
    fn update_dense(&mut self, phi: &Matrix) -> usize {
        let g = std::mem::take(&mut self.grads.dense);
        self.update_rows_dense(0..self.n_classes(), g.as_slice(), phi);
        self.grads.dense = g;
        self.n_classes()
    }

    /// Applies the dense gradients `g` (`[B, rows.len()]`, row-major) of the classes `rows` to
    /// their rows of W and bias with the optimiser: `dW = g^T Phi` by one matrix product (fused
    /// into W for SGD, through a `rows.len() x D` temporary for AdaGrad).
    fn update_rows_dense(&mut self, rows: std::ops::Range<usize>, g: &[f32], phi: &Matrix) {
        let (b, k, d) = (phi.rows(), rows.len(), self.d_model());
        let rules = (self.opt_w.rule(), self.opt_b.rule());
        let target = dense_update::Rows {
            w: dense_update::rows_of(self.w.as_mut_slice(), &rows, d),
            acc_w: dense_update::rows_of(self.opt_w.accum_mut(), &rows, d),
            bias: dense_update::rows_of(self.bias.as_deref_mut().unwrap_or_default(), &rows, 1),
            acc_b: dense_update::rows_of(self.opt_b.accum_mut(), &rows, 1),
        };
        let scratch = (&mut self.dw, &mut Vec::new());
        dense_update::apply(target, g, phi.as_slice(), (b, k, d), rules, scratch, true);
    }

    /// A dense step that visits the classes `chunk` at a time, so that the class gradients never
    /// take more than `B x chunk` numbers (against `B x K` for [`Self::train_step_with`]):
    /// `scores(rows, z)` is called on every range of classes first (to gather what the
    /// gradients need, for instance softmax normalisers), then `between()`, then
    /// `gradient(rows, z)` on every range again with the scores recomputed, turning them into
    /// the class gradients in place; each range then adds `g W_rows` to `dL/dphi` (W before
    /// its update, when `want_dphi`) and updates its rows. That is one more score product than
    /// [`Self::train_step_with`] (4 instead of 3) for memory linear in `chunk`, not in K.
    /// Returns the rows updated (all).
    pub fn train_dense_in_passes<E>(
        &mut self,
        phi: &Matrix,
        chunk: usize,
        want_dphi: bool,
        mut scores: impl FnMut(std::ops::Range<usize>, &[f32]),
        between: impl FnOnce() -> Result<(), E>,
        mut gradient: impl FnMut(std::ops::Range<usize>, &mut [f32]),
    ) -> Result<usize, E> {
        let (b, k, d) = (phi.rows(), self.n_classes(), self.d_model());
        let chunk = chunk.clamp(1, k.max(1));
        let ranges = || (0..k).step_by(chunk).map(move |start| start..(start + chunk).min(k));
        let mut z = Vec::new();
        let score_rows = |w: &Matrix, bias: Option<&[f32]>, rows: std::ops::Range<usize>, z: &mut Vec<f32>| {
            let n = rows.len();
            z.resize(b * n, 0.0);
            gemm::scores(phi.as_slice(), b, &w.as_slice()[rows.start * d..rows.end * d], n, d, z);
            if let Some(bias) = bias {
                let bias = &bias[rows];
                z.par_chunks_mut(n).for_each(|row| row.iter_mut().zip(bias).for_each(|(v, c)| *v += c));
            }
        };
        for rows in ranges() {
            score_rows(&self.w, self.bias.as_deref(), rows.clone(), &mut z);
            scores(rows, &z);
        }
        between()?;
        if want_dphi {
            self.dphi.reshape_for_overwrite(b, d);
            self.dphi.as_mut_slice().fill(0.0);
        }
        for rows in ranges() {
            score_rows(&self.w, self.bias.as_deref(), rows.clone(), &mut z);
            gradient(rows.clone(), &mut z);
            if want_dphi {
                let (n, w) = (rows.len(), &self.w.as_slice()[rows.start * d..rows.end * d]);
                gemm::gemm(self.dphi.as_mut_slice(), b, d, 1.0, 1.0, &z, (b, n), Op::N, w, (n, d), Op::N);
            }
            self.update_rows_dense(rows, &z, phi);
        }
        self.after_update(None);
        self.opt_w.advance();
        self.opt_b.advance();
        Ok(k)
    }

    /// The backward pass of sparse class gradients, class by class. The `(class, sample, g)`
    /// entries are grouped by class and the classes cut into contiguous ranges of about equal
    /// work; each range, in parallel, reads each of its touched rows `W_k` once, adds
    /// `g_ik W_k` to its own copy of `dL/dphi_i` (when `want_dphi`; W before the update) and,
    /// when `update`, applies `dW_k = sum_i g_ik phi_i` (and `sum_i g_ik` to the bias) to the row
    /// with the optimiser. The batch's `phi` and `dL/dphi` stay in cache while W streams by in
    /// row order, where a pass sample by sample would fetch a scattered row of W for every
    /// entry: search gradients of thousands of classes per sample cost that many row fetches.
    /// Returns the number of rows touched (listed in `self.touched`).
    fn backward_sparse(&mut self, phi: &Matrix, want_dphi: bool, update: bool) -> usize {
        let (b, d) = (phi.rows(), self.d_model());
        let starts = self.group_entries_by_class();
        let n_rows = starts.len() - 1;
        let entries = &self.entries;
        let bounds = balanced_ranges(&starts, entries.len());
        // Each range owns the rows of W (and their optimiser state and bias) from its first
        // class to the next range's first class.
        let cuts: Vec<usize> = bounds[1..bounds.len() - 1].iter().map(|&r| entries[starts[r]].0 as usize).collect();
        let first: Vec<usize> = std::iter::once(0).chain(cuts.iter().copied()).collect();
        let acc_width = if self.opt_w.accum.is_empty() { 0 } else { d };
        let (rule_w, rule_b) = (self.opt_w.rule(), self.opt_b.rule());
        let w_parts = split_rows(self.w.as_mut_slice(), &cuts, d);
        let acc_parts = split_rows(&mut self.opt_w.accum, &cuts, acc_width);
        let (bias_parts, bias_acc_parts) = match &mut self.bias {
            Some(bias) => {
                let width = if self.opt_b.accum.is_empty() { 0 } else { 1 };
                let parts: Vec<Option<&mut [f32]>> = split_rows(bias, &cuts, 1).into_iter().map(Some).collect();
                (parts, split_rows(&mut self.opt_b.accum, &cuts, width))
            }
            None => ((0..first.len()).map(|_| None).collect(), split_rows(&mut [], &cuts, 0)),
        };
        let parts: Vec<_> =
            w_parts.into_iter().zip(acc_parts).zip(bias_parts.into_iter().zip(bias_acc_parts)).collect();
        let starts = &starts;
        let partial_dphi: Vec<Vec<f32>> = parts
            .into_par_iter()
            .enumerate()
            .map(|(p, ((w, acc), (mut bias, bias_acc)))| {
                let mut dphi = if want_dphi { vec![0.0f32; b * d] } else { Vec::new() };
                let mut grad = vec![0.0f32; d];
                for r in bounds[p]..bounds[p + 1] {
                    let run = &entries[starts[r]..starts[r + 1]];
                    let k = run[0].0 as usize - first[p];
                    let row = &mut w[k * d..(k + 1) * d];
                    if want_dphi {
                        add_run_to_dphi(run, row, &mut dphi, d);
                    }
                    if !update {
                        continue;
                    }
                    grad.fill(0.0);
                    let mut grad_bias = 0.0;
                    for &(_, i, v) in run {
                        kernels::axpy(v, phi.row(i as usize), &mut grad);
                        grad_bias += v;
                    }
                    let acc_row = if acc.is_empty() { &mut [][..] } else { &mut acc[k * d..(k + 1) * d] };
                    rule_w.apply(row, acc_row, &grad);
                    if let Some(bias) = bias.as_deref_mut() {
                        let acc_b = if bias_acc.is_empty() { &mut [][..] } else { &mut bias_acc[k..k + 1] };
                        rule_b.apply(&mut bias[k..k + 1], acc_b, &[grad_bias]);
                    }
                }
                dphi
            })
            .collect();
        if want_dphi {
            self.sum_partial_dphi(&partial_dphi, b, d);
        }
        n_rows
    }

    /// The `(class, sample, g)` entries of the batch's sparse gradients, grouped by class into
    /// `self.entries`, and their classes listed in `self.touched`. Returns where the runs of
    /// equal class start: run r is `entries[starts[r]..starts[r + 1]]` (the last start is
    /// `entries.len()`).
    fn group_entries_by_class(&mut self) -> Vec<usize> {
        self.entries.clear();
        for (i, g) in self.grads.sparse.iter().enumerate() {
            self.entries.extend(g.iter().map(|(k, v)| (k, i as u32, v)));
        }
        self.grouping.group(&mut self.entries, self.w.rows());
        let entries = &self.entries;
        let mut starts: Vec<usize> =
            (0..entries.len()).filter(|&j| j == 0 || entries[j].0 != entries[j - 1].0).collect();
        let n_rows = starts.len();
        starts.push(entries.len());
        self.touched.clear();
        self.touched.extend(starts[..n_rows].iter().map(|&j| entries[j].0));
        starts
    }

    /// `dL/dphi` = the ranges' partial sums, added in range order.
    fn sum_partial_dphi(&mut self, partial_dphi: &[Vec<f32>], b: usize, d: usize) {
        self.dphi.reshape_for_overwrite(b, d);
        let out = self.dphi.as_mut_slice();
        out.fill(0.0);
        for part in partial_dphi {
            kernels::axpy(1.0, part, out);
        }
    }

    /// Writes W, the bias and the optimiser state to `path` (farout's own little-endian format,
    /// described in [`crate::LayerFile`], which reads it without building a layer).
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        let parts = Parts {
            rows: self.n_classes(),
            d: self.d_model(),
            step: self.opt_w.step,
            w: self.w.as_slice(),
            bias: self.bias.as_deref(),
            state_w: &self.opt_w.accum,
            state_b: &self.opt_b.accum,
        };
        parts.write(path)
    }

    /// Restores W, the bias and the optimiser state saved by [`Self::save`] into this layer,
    /// which must have the same shape, bias setting and optimiser kind (`output.optimizer`).
    pub fn load(&mut self, path: &Path) -> Result<(), Error> {
        self.read_checkpoint(path, true)
    }

    /// Restores W and the bias saved by [`Self::save`] into this layer of the same shape and
    /// bias setting, leaving the optimiser as it is: what evaluation and prediction need, whatever
    /// optimiser the layer was trained with.
    pub fn load_weights(&mut self, path: &Path) -> Result<(), Error> {
        self.read_checkpoint(path, false)
    }

    fn read_checkpoint(&mut self, path: &Path, with_optimizer: bool) -> Result<(), Error> {
        let err = |msg: String| Error::Checkpoint { path: path.to_path_buf(), msg };
        let (mut f, h) = open_checked(path)?;
        let expect = [self.n_classes() as u64, self.d_model() as u64, self.bias.is_some() as u64];
        if h[..3] != expect {
            return Err(err(format!(
                "checkpoint holds a {} x {} layer (bias {}) but the config builds {} x {} (bias {}): the data's \
                 classes, the features (or model.doc_encoder.d_model) or output.layer.bias differ from the run's",
                h[0],
                h[1],
                h[2] == 1,
                expect[0],
                expect[1],
                expect[2] == 1,
            )));
        }
        if with_optimizer && h[4] != self.opt_w.accum.len() as u64 {
            return Err(err(format!(
                "checkpoint holds {} optimiser values but the config's output.optimizer keeps {}: resume with the \
                 output.optimizer the run was trained with",
                h[4],
                self.opt_w.accum.len()
            )));
        }
        read_f32s(&mut f, self.w.as_mut_slice()).map_err(|e| err(e.to_string()))?;
        if let Some(b) = &mut self.bias {
            read_f32s(&mut f, b).map_err(|e| err(e.to_string()))?;
        }
        if let Some(a) = &mut self.attached {
            a.index = None; // rebuilt from the loaded W at the next search step
        }
        if !with_optimizer {
            return Ok(());
        }
        read_f32s(&mut f, &mut self.opt_w.accum).map_err(|e| err(e.to_string()))?;
        read_f32s(&mut f, &mut self.opt_b.accum).map_err(|e| err(e.to_string()))?;
        self.opt_w.step = h[3];
        self.opt_b.step = h[3];
        Ok(())
    }
}

/// The larger of `m` and the largest `|x|` of `xs`; NaN once either holds a NaN (`f32::max`
/// would drop it).
fn max_magnitude(m: f32, xs: &[f32]) -> f32 {
    xs.iter().fold(m, |m, x| if m.is_nan() || x.abs() <= m { m } else { x.abs() })
}

/// Ranges of the class runs starting at `starts` (the last start being `n_entries`) with about
/// equal numbers of entries, for `4 × threads` parallel parts at most: range p is the runs
/// `bounds[p]..bounds[p + 1]`.
fn balanced_ranges(starts: &[usize], n_entries: usize) -> Vec<usize> {
    let n_rows = starts.len() - 1;
    let n_parts = (4 * rayon::current_num_threads()).clamp(1, n_rows.max(1));
    let mut bounds = vec![0usize];
    for (r, &start) in starts.iter().enumerate().take(n_rows).skip(1) {
        if start * n_parts >= bounds.len() * n_entries && bounds.len() < n_parts {
            bounds.push(r);
        }
    }
    bounds.push(n_rows);
    bounds
}

/// Adds `g_ik W_k` to `dL/dphi_i` (rows of `d` in `dphi`) for every entry `(k, i, g_ik)` of
/// the run of class k, whose row is `row`.
#[inline]
fn add_run_to_dphi(run: &[(ClassId, u32, f32)], row: &[f32], dphi: &mut [f32], d: usize) {
    for &(_, i, v) in run {
        let i = i as usize;
        kernels::axpy(v, row, &mut dphi[i * d..(i + 1) * d]);
    }
}

/// Groups (class, sample, value) entries by class for the sparse update.
#[derive(Default)]
struct Grouping {
    /// Entries per class, then the next free slot of each class.
    slots: Vec<u32>,
    out: Vec<(ClassId, u32, f32)>,
}

impl Grouping {
    /// Orders `entries` by class (the order within a class may change). Many entries for the
    /// classes (search gradients at large budgets: batch x K/5 entries over K classes) are
    /// placed by a counting sort in O(entries + K); few by a comparison sort.
    fn group(&mut self, entries: &mut Vec<(ClassId, u32, f32)>, n_classes: usize) {
        if entries.len() < n_classes / 4 {
            entries.sort_unstable_by_key(|e| e.0);
            return;
        }
        self.slots.clear();
        self.slots.resize(n_classes + 1, 0);
        for e in entries.iter() {
            self.slots[e.0 as usize + 1] += 1;
        }
        for k in 0..n_classes {
            self.slots[k + 1] += self.slots[k];
        }
        self.out.clear();
        self.out.resize(entries.len(), (0, 0, 0.0));
        for &e in entries.iter() {
            let slot = &mut self.slots[e.0 as usize];
            self.out[*slot as usize] = e;
            *slot += 1;
        }
        std::mem::swap(entries, &mut self.out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_estimators::{Exact, SmoothedMargin, Softmax};

    #[test]
    fn grouping_orders_entries_by_class_by_either_sort() {
        use farout_core::rng::RngExt;
        let mut r = rng::seeded(4, 0);
        for (n, k) in [(10, 1000), (5000, 300), (0, 10), (7, 1)] {
            let entries: Vec<(ClassId, u32, f32)> =
                (0..n).map(|i| (r.random_range(0..k) as ClassId, i as u32, rng::normal(&mut r))).collect();
            let mut got = entries.clone();
            Grouping::default().group(&mut got, k);
            assert!(got.windows(2).all(|w| w[0].0 <= w[1].0), "n {n}, k {k}: not grouped");
            // The same entries (sample ids are distinct, so sorting by them compares the sets).
            let (mut a, mut b) = (got, entries);
            a.sort_by_key(|e| e.1);
            b.sort_by_key(|e| e.1);
            assert_eq!(a, b);
        }
    }

    fn setup(seed: u64) -> (Matrix, Vec<Vec<u32>>) {
        let mut r = rng::seeded(seed, 0);
        let phi = Matrix::from_vec(5, 6, (0..30).map(|_| rng::normal(&mut r)).collect()).unwrap();
        (phi, vec![vec![0], vec![3, 4], vec![], vec![7], vec![1]])
    }

    /// Reference: per-sample exact gradients, dW and dphi accumulated by loops.
    fn reference(
        layer: &OutputLayer,
        est: &dyn GradientEstimator,
        phi: &Matrix,
        pos: &[Vec<u32>],
    ) -> (Matrix, Matrix, Vec<f32>) {
        let (k, d) = (layer.n_classes(), layer.d_model());
        let mut dw = Matrix::zeros(k, d);
        let mut dphi = Matrix::zeros(phi.rows(), d);
        let mut db = vec![0.0; k];
        assert_eq!(pos.len(), phi.rows(), "one positive set per sample");
        for (i, pos_i) in pos.iter().enumerate() {
            let mut g = farout_core::SparseGrad::new();
            est.estimate(&layer.ctx(), phi.row(i), pos_i, &mut rng::seeded(0, 0), &mut g);
            for (c, v) in g.iter() {
                kernels::axpy(v, phi.row(i), dw.row_mut(c as usize));
                kernels::axpy(v, layer.weights().row(c as usize), dphi.row_mut(i));
                db[c as usize] += v;
            }
        }
        (dw, dphi, db)
    }

    #[test]
    fn non_finite_weights_are_refused_where_they_enter_and_the_scale_sees_them() {
        let cfg = OutputLayerConfig { bias: true, init_std: 0.3, ..Default::default() };
        let mut layer = OutputLayer::new(4, 3, &cfg, &OptimizerConfig::default(), 5).unwrap();
        let mut w = Matrix::zeros(4, 3);
        w.row_mut(2)[1] = f32::NAN;
        let e = layer.set_weights(w.clone()).unwrap_err().to_string();
        assert!(e.contains("weight row 2, column 1 is NaN"), "{e}");
        let e = layer.set_bias(vec![0.0, f32::INFINITY, 0.0, 0.0]).unwrap_err().to_string();
        assert!(e.contains("the bias of class 1 is inf"), "{e}");
        w.row_mut(2)[1] = -7.5;
        layer.set_weights(w).unwrap();
        layer.set_bias(vec![0.0, 2.0, 0.0, 0.0]).unwrap();
        assert_eq!(layer.scale(), 7.5);
        assert!(max_magnitude(1.0, &[f32::NAN, 3.0]).is_nan());
        assert_eq!(max_magnitude(1.0, &[-3.0, 2.0]), 3.0);
    }

    fn check_step(est: &dyn GradientEstimator, opt: OptimizerConfig) {
        let (phi, pos) = setup(1);
        let refs: Vec<&[u32]> = pos.iter().map(|p| p.as_slice()).collect();
        let cfg = OutputLayerConfig { bias: true, init_std: 0.3, ..Default::default() };
        let mut layer = OutputLayer::new(10, 6, &cfg, &opt, 5).unwrap();
        let (dw, dphi, db) = reference(&layer, est, &phi, &pos);
        let w0 = layer.weights().clone();
        let b0 = layer.bias().unwrap().to_vec();
        let rule = opt.build(1, 1).rule();
        layer.train_step(est, Batch::new(&phi, &refs), &mut rng::seeded(0, 0), true);
        for (a, b) in layer.dphi().as_slice().iter().zip(dphi.as_slice()) {
            assert!((a - b).abs() < 1e-4, "dphi {a} vs {b}");
        }
        // Expected rows: the update rule applied to the reference gradient (rows with zero
        // gradient unchanged, as sparse updates touch only rows with gradient).
        for c in 0..10 {
            let mut row = w0.row(c).to_vec();
            let mut bias = [b0[c]];
            if dw.row(c).iter().any(|&x| x != 0.0) || db[c] != 0.0 {
                rule.apply(&mut row, &mut [0.0; 6], dw.row(c));
                rule.apply(&mut bias, &mut [0.0], &[db[c]]);
            }
            for (a, b) in layer.weights().row(c).iter().zip(&row) {
                assert!((a - b).abs() < 1e-4, "{} row {c}: {a} vs {b}", est.name());
            }
            assert!((layer.bias().unwrap()[c] - bias[0]).abs() < 1e-4);
        }
    }

    /// Sparse gradients with many classes per sample, repeated classes included: each sample
    /// puts `g = phi_0 / (1 + j)` on 60 classes drawn from its own features (no RNG, so the
    /// reference and the batch step see the same entries).
    struct Scattered;

    impl GradientEstimator for Scattered {
        fn name(&self) -> &'static str {
            "scattered"
        }

        fn estimate(
            &self,
            ctx: &Ctx,
            phi: &[f32],
            _: &[ClassId],
            _: &mut Rng,
            out: &mut farout_core::SparseGrad,
        ) -> farout_estimators::Estimate {
            out.clear();
            let mut r = rng::seeded(phi[0].to_bits() as u64, phi[1].to_bits() as u64);
            for j in 0..60 {
                let c = farout_core::rng::RngExt::random_range(&mut r, 0..ctx.n_classes());
                out.push(c as ClassId, phi[0] / (1.0 + j as f32));
            }
            farout_estimators::Estimate { loss: 0.0, classes_scored: 60 }
        }
    }

    #[test]
    fn class_by_class_backward_matches_the_per_sample_reference() {
        let (k, d, b) = (300, 7, 41);
        let mut r = rng::seeded(9, 0);
        let phi = Matrix::from_vec(b, d, (0..b * d).map(|_| rng::normal(&mut r)).collect()).unwrap();
        let pos = vec![Vec::new(); b];
        let refs: Vec<&[u32]> = pos.iter().map(|p| p.as_slice()).collect();
        for opt in [
            OptimizerConfig::Sgd { lr: 0.5, decay: 0.0, l2: 0.1 },
            OptimizerConfig::Adagrad { lr: 0.5, eps: 1e-8, l2: 0.0 },
        ] {
            for bias in [false, true] {
                let cfg = OutputLayerConfig { bias, init_std: 0.3, ..Default::default() };
                let mut layer = OutputLayer::new(k, d, &cfg, &opt, 5).unwrap();
                let (dw, dphi, db) = reference(&layer, &Scattered, &phi, &pos);
                let (w0, b0) = (layer.weights().clone(), layer.bias().map(<[f32]>::to_vec));
                // Backward only: dL/dphi, nothing moves.
                layer.backward_only(&Scattered, Batch::new(&phi, &refs), &mut rng::seeded(0, 0));
                for (a, b) in layer.dphi().as_slice().iter().zip(dphi.as_slice()) {
                    assert!((a - b).abs() < 1e-4 * (1.0 + b.abs()), "dphi {a} vs {b}");
                }
                assert_eq!(layer.weights(), &w0);
                let stats = layer.train_step(&Scattered, Batch::new(&phi, &refs), &mut rng::seeded(0, 0), true);
                for (a, b) in layer.dphi().as_slice().iter().zip(dphi.as_slice()) {
                    assert!((a - b).abs() < 1e-4 * (1.0 + b.abs()), "dphi {a} vs {b}");
                }
                let rule = opt.build(1, 1).rule();
                let mut with_entries = vec![false; k];
                for i in 0..b {
                    let mut g = farout_core::SparseGrad::new();
                    Scattered.estimate(&layer.ctx(), phi.row(i), &[], &mut rng::seeded(0, 0), &mut g);
                    g.iter().for_each(|(c, _)| with_entries[c as usize] = true);
                }
                let mut touched = 0;
                for c in 0..k {
                    let mut row = w0.row(c).to_vec();
                    let mut acc = vec![0.0; d];
                    let moved = with_entries[c];
                    if moved {
                        touched += 1;
                        rule.apply(&mut row, &mut acc, dw.row(c));
                    }
                    for (a, want) in layer.weights().row(c).iter().zip(&row) {
                        assert!((a - want).abs() < 1e-4 * (1.0 + want.abs()), "{opt:?} row {c}: {a} vs {want}");
                    }
                    if let (Some(got), Some(b0)) = (layer.bias(), &b0) {
                        let mut want = [b0[c]];
                        if moved {
                            rule.apply(&mut want, &mut [0.0], &[db[c]]);
                        }
                        assert!((got[c] - want[0]).abs() < 1e-4, "bias {c}: {} vs {}", got[c], want[0]);
                    }
                }
                assert_eq!(stats.rows_updated, touched);
                assert!(touched > 200, "{touched} rows touched: too few to cut the classes into ranges");
            }
        }
    }

    #[test]
    fn dense_and_sparse_steps_match_per_sample_reference() {
        for opt in [
            OptimizerConfig::Sgd { lr: 0.5, decay: 0.0, l2: 0.0 },
            OptimizerConfig::Adagrad { lr: 0.5, eps: 1e-8, l2: 0.0 },
            OptimizerConfig::ArSchedule { rho0: 0.5, decay: 0.9, decay_every: 2000, grad_scale: 3.0, l2: 0.1 },
        ] {
            check_step(&Exact::new(Softmax), opt.clone());
            check_step(&Exact::new(SmoothedMargin::new(1.0).unwrap()), opt);
        }
    }

    #[test]
    fn attached_index_is_built_lazily_and_refreshed_with_updated_rows() {
        use farout_estimators::{Mips, SmoothedMargin};
        let (phi, pos) = setup(4);
        let refs: Vec<&[u32]> = pos.iter().map(|p| p.as_slice()).collect();
        let cfg = OutputLayerConfig { bias: false, init_std: 0.3, ..Default::default() };
        // Small steps keep every row within the index's norm bound (10% headroom), so the one
        // build is followed by refreshes only; a larger step would trigger a rebuild.
        let opt = OptimizerConfig::Adagrad { lr: 0.005, eps: 1e-8, l2: 0.0 };
        let mut layer = OutputLayer::new(10, 6, &cfg, &opt, 5).unwrap();
        let index = IndexConfig::default();
        layer.attach_index(index, 1, IndexUpkeep::default()).unwrap();
        assert!(layer.index().is_none(), "built lazily");
        let est = Mips::new(SmoothedMargin::new(1.0).unwrap(), 10).unwrap();
        for _ in 0..5 {
            layer.train_step(&est, Batch::new(&phi, &refs), &mut rng::seeded(0, 0), false);
            // Refreshed every step: the index agrees with brute force on the current W.
            assert_eq!(layer.index_recall(&phi, 3), Some(1.0));
        }
        assert_eq!(layer.index_builds(), 1);
    }

    #[test]
    fn index_is_rebuilt_on_schedule() {
        use farout_estimators::{Mips, SmoothedMargin};
        let (phi, pos) = setup(4);
        let refs: Vec<&[u32]> = pos.iter().map(|p| p.as_slice()).collect();
        let opt = OptimizerConfig::Adagrad { lr: 0.005, eps: 1e-8, l2: 0.0 };
        let mut layer =
            OutputLayer::new(10, 6, &OutputLayerConfig { bias: false, init_std: 0.3, ..Default::default() }, &opt, 5)
                .unwrap();
        let index = IndexConfig::default();
        layer.attach_index(index, 1, IndexUpkeep { refresh_every: 1, rebuild_every: 2 }).unwrap();
        let est = Mips::new(SmoothedMargin::new(1.0).unwrap(), 10).unwrap();
        let mut builds = Vec::new();
        for _ in 0..5 {
            layer.train_step(&est, Batch::new(&phi, &refs), &mut rng::seeded(0, 0), false);
            builds.push(layer.index_builds());
        }
        // Built at the first step, rebuilt before steps 3 and 5 (small steps: never on request).
        assert_eq!(builds, [1, 1, 2, 2, 3]);
    }

    /// Between refreshes the index finds rows where it last indexed them, but scores them with
    /// their current values (synced after every step); refreshed every step, the refresh syncs
    /// them. The spherical index scans its own copies of the rows, so a row left unsynced would
    /// show as a stale score.
    #[test]
    fn index_scores_stay_exact_between_refreshes() {
        for refresh_every in [1_000, 1] {
            index_scores_stay_exact_with(refresh_every);
        }
    }

    fn index_scores_stay_exact_with(refresh_every: u64) {
        use farout_estimators::{Mips, SmoothedMargin};
        use farout_search::{Hit, SphericalConfig};
        let (phi, pos) = setup(6);
        let refs: Vec<&[u32]> = pos.iter().map(|p| p.as_slice()).collect();
        let cfg = OutputLayerConfig { bias: false, init_std: 0.3, ..Default::default() };
        let opt = OptimizerConfig::Adagrad { lr: 0.005, eps: 1e-8, l2: 0.0 };
        let mut layer = OutputLayer::new(300, 6, &cfg, &opt, 5).unwrap();
        let index = IndexConfig::Spherical(SphericalConfig { exact_below: 0, ..SphericalConfig::default() });
        layer.attach_index(index, 2, IndexUpkeep { refresh_every, rebuild_every: 0 }).unwrap();
        let est = Mips::new(SmoothedMargin::new(1.0).unwrap(), 50).unwrap();
        let mut hits: Vec<Hit> = Vec::new();
        let mut changed = 0;
        for _ in 0..5 {
            changed += layer.train_step(&est, Batch::new(&phi, &refs), &mut rng::seeded(0, 0), false).rows_updated;
            for i in 0..phi.rows() {
                for j in 0..2 {
                    layer.index().unwrap().search_block(layer.weights(), j, phi.row(i), 20, &mut hits);
                    assert_eq!(hits.len(), 20);
                    for h in &hits {
                        let exact = kernels::dot(
                            &layer.weights().row(h.class as usize)[3 * j..3 * j + 3],
                            &phi.row(i)[3 * j..3 * j + 3],
                        );
                        assert_eq!(h.score, exact, "class {} block {j}", h.class);
                    }
                }
            }
        }
        assert!(changed > 0, "the steps changed rows");
        assert_eq!(layer.index_builds(), 1);
    }

    #[test]
    fn training_reduces_the_loss() {
        let (phi, pos) = setup(2);
        let refs: Vec<&[u32]> = pos.iter().map(|p| p.as_slice()).collect();
        let mut layer = OutputLayer::new(10, 6, &OutputLayerConfig::default(), &OptimizerConfig::default(), 0).unwrap();
        let est = Exact::new(Softmax);
        let first = layer.train_step(&est, Batch::new(&phi, &refs), &mut rng::seeded(0, 0), false).loss_sum;
        let mut last = first;
        for _ in 0..50 {
            last = layer.train_step(&est, Batch::new(&phi, &refs), &mut rng::seeded(0, 0), false).loss_sum;
        }
        assert!(last < 0.2 * first, "{first} -> {last}");
    }

    #[test]
    fn save_and_load_round_trip_and_check_shape() {
        let dir = tempfile::tempdir().unwrap();
        let (phi, pos) = setup(3);
        let refs: Vec<&[u32]> = pos.iter().map(|p| p.as_slice()).collect();
        let opt = OptimizerConfig::default();
        let mut a = OutputLayer::new(10, 6, &OutputLayerConfig::default(), &opt, 0).unwrap();
        a.train_step(&Exact::new(Softmax), Batch::new(&phi, &refs), &mut rng::seeded(0, 0), false);
        let p = dir.path().join("layer.bin");
        a.save(&p).unwrap();
        let mut b = OutputLayer::new(10, 6, &OutputLayerConfig::default(), &opt, 9).unwrap();
        b.load(&p).unwrap();
        assert_eq!((a.weights(), a.bias(), &a.opt_w, a.step()), (b.weights(), b.bias(), &b.opt_w, b.step()));
        let mut c = OutputLayer::new(11, 6, &OutputLayerConfig::default(), &opt, 0).unwrap();
        assert!(c.load(&p).unwrap_err().to_string().contains("checkpoint holds a 10 x 6 layer"));
    }

    /// A truncated checkpoint is refused by its length before any value is read, so the layer
    /// keeps its weights (a partial read would leave some rows loaded and others not).
    #[test]
    fn a_truncated_checkpoint_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let opt = OptimizerConfig::default();
        let a = OutputLayer::new(10, 6, &OutputLayerConfig::default(), &opt, 0).unwrap();
        let p = dir.path().join("layer.bin");
        a.save(&p).unwrap();
        let len = std::fs::metadata(&p).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(len - 4).unwrap();
        let mut b = OutputLayer::new(10, 6, &OutputLayerConfig::default(), &opt, 9).unwrap();
        let before = b.weights().clone();
        let e = b.load(&p).unwrap_err().to_string();
        assert!(e.contains("truncated") && e.contains(&format!("{} bytes", len - 4)), "{e}");
        assert_eq!(b.weights(), &before);
    }
}
