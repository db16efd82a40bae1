//! The contract between the output layer and a gradient estimator: [`GradientEstimator`], what
//! it sees of the layer ([`Ctx`]) and what it returns, one sample at a time ([`Estimate`] and a
//! sparse gradient) or a batch at a time ([`Batch`] in, [`BatchGrad`] and [`BatchEstimate`] out).
//!
//! For a sample with features `phi` (length D), positives `P` and scores
//! `z_k = W_k . phi + b_k` ([`Ctx::score`]), an estimator returns
//!
//! ```text
//! L~         ~ L(z, P)        the loss estimate                      (Estimate::loss)
//! (k, g_k)   g_k ~ dL/dz_k    for the classes it gives a gradient; 0 for the others
//! cost       rows of W scored, a block product counting 1/B          (Estimate::classes_scored)
//! ```
//!
//! and the layer turns the class gradients `G` of a batch (`[B, K]`, sparse or dense) into
//!
//! ```text
//! dL/dphi_i = sum_k g_ik W_k       (BatchGrad::dphi: one product G W when G is dense)
//! dL/dW_k   = sum_i g_ik phi_i     (only the rows with a non-zero g_ik)
//! dL/db_k   = sum_i g_ik
//! ```
//!
//! A batch's loss and gradient are sums over its samples, not means. Unbiased estimators estimate
//! `dL/dz` in expectation over their draws; the default batch method seeds sample `i`'s generator
//! from one draw of the batch's generator and `i`, so the draws do not depend on the threads that
//! run the batch.

use farout_core::gemm::{self, Op};
use farout_core::{ClassId, Matrix, Rng, SparseGrad, kernels, rng::RngCore};
use rayon::prelude::*;

/// What an estimator sees of the output layer: `W` (K x D), the optional bias (K) and the
/// layer's MIPS index, when one is attached.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    /// The class weights, one row per class.
    pub w: &'a Matrix,
    /// The class biases, when the layer has them.
    pub bias: Option<&'a [f32]>,
    /// The index over the rows of `w` (one per column block), for search-based estimators.
    pub index: Option<&'a farout_search::BlockIndex>,
}

impl<'a> Ctx<'a> {
    /// A view of `w` and `bias`, without index.
    pub fn new(w: &'a Matrix, bias: Option<&'a [f32]>) -> Self {
        Self { w, bias, index: None }
    }

    /// Number of classes K.
    pub fn n_classes(&self) -> usize {
        self.w.rows()
    }

    /// Score of class `k`: `W_k . phi + b_k`.
    #[inline]
    pub fn score(&self, k: usize, phi: &[f32]) -> f32 {
        farout_core::kernels::dot(self.w.row(k), phi) + self.bias.map_or(0.0, |b| b[k])
    }
}

/// The result of estimating one sample's gradient.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    /// Loss estimate for the sample.
    pub loss: f32,
    /// How many classes were scored (inner products with rows of W) to produce it: the cost.
    pub classes_scored: usize,
}

/// A mini-batch: features `phi` (`[batch, d_model]`), each sample's positive classes and, for
/// estimators with per-sample state (A&R), each sample's index in the training set.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    /// Features, one row per sample: `[batch, d_model]`.
    pub phi: &'a Matrix,
    /// Positive classes per sample (`positives.len() == phi.rows()`).
    pub positives: &'a [&'a [ClassId]],
    /// Index of each sample in the training set (`ids.len() == phi.rows()`), or empty when the
    /// estimator keeps no per-sample state ([`GradientEstimator::sample_state`] is `None`).
    pub ids: &'a [usize],
}

impl<'a> Batch<'a> {
    /// A batch without sample ids.
    pub fn new(phi: &'a Matrix, positives: &'a [&'a [ClassId]]) -> Self {
        Self { phi, positives, ids: &[] }
    }

    /// The same batch, with training-set indices for per-sample state.
    pub fn with_ids(self, ids: &'a [usize]) -> Self {
        Self { ids, ..self }
    }
}

/// Totals over a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchEstimate {
    /// Sum of the per-sample loss estimates.
    pub loss_sum: f64,
    /// Sum of the classes scored per sample.
    pub classes_scored: usize,
}

/// Class gradients of a batch: dense `[batch, K]` when (nearly) every class has a non-zero
/// gradient (softmax), sparse per sample otherwise. Buffers are reused between batches.
#[derive(Debug, Default)]
pub struct BatchGrad {
    /// Dense gradients `[batch, K]`, valid when `is_dense`.
    pub dense: Matrix,
    /// Sparse gradients, one per sample, valid when `!is_dense`.
    pub sparse: Vec<SparseGrad>,
    /// Which of the two holds the batch's gradients.
    pub is_dense: bool,
    /// Each sample's loss estimate, when the estimator worked sample by sample (the default
    /// [`GradientEstimator::estimate_batch`] and the search and sampling estimators); empty
    /// when it only gives the batch's sum.
    pub losses: Vec<f32>,
}

impl BatchGrad {
    /// `dL/dphi_i = sum_k g_ik W_k` for every sample into `out` (`[batch, D]`): one matrix
    /// product for dense gradients, a sum of the touched rows per sample for sparse ones.
    pub fn dphi(&self, w: &Matrix, out: &mut Matrix) {
        let (k, d) = (w.rows(), w.cols());
        let b = if self.is_dense { self.dense.rows() } else { self.sparse.len() };
        out.reshape_for_overwrite(b, d);
        if self.is_dense {
            let g = self.dense.as_slice();
            gemm::gemm(out.as_mut_slice(), b, d, 0.0, 1.0, g, (b, k), Op::N, w.as_slice(), (k, d), Op::N);
        } else {
            out.as_mut_slice().par_chunks_mut(d).zip(self.sparse.par_iter()).for_each(|(row, g)| {
                row.fill(0.0);
                for (c, v) in g.iter() {
                    kernels::axpy(v, w.row(c as usize), row);
                }
            });
        }
    }

    /// Prepares a dense `[b, k]` gradient to be overwritten, keeping allocations; the batch
    /// gives no per-sample losses unless the estimator then fills them.
    pub fn reset_dense(&mut self, b: usize, k: usize) {
        self.is_dense = true;
        self.losses.clear();
        self.dense.reshape_for_overwrite(b, k);
    }

    /// Prepares `n` empty sparse gradients, keeping allocations.
    pub fn reset_sparse(&mut self, n: usize) {
        self.is_dense = false;
        self.losses.clear();
        self.sparse.resize_with(n, SparseGrad::new);
        self.sparse.truncate(n);
        for g in &mut self.sparse {
            g.clear();
        }
    }
}

/// An approximation of a loss gradient with respect to the scores of an output layer.
///
/// The trait has this shape because estimators differ in what they need (an index, samples,
/// per-sample variational state) but all answer the same question for one sample: which classes
/// carry gradient, and how much. One required method keeps new estimators small; the batch method
/// has a default (rayon over samples, each with its own RNG stream) that exact estimators override
/// with matrix products.
pub trait GradientEstimator: Send + Sync {
    /// Name used in configs, logs and summaries (`softmax`, `margin`, ...).
    fn name(&self) -> &'static str;

    /// Whether [`Ctx::index`] must be present (search-based estimators).
    fn uses_index(&self) -> bool {
        false
    }

    /// Whether the estimator models exactly one label per sample (A&R, OVE: the likelihood of
    /// a categorical outcome). It uses the first positive; trainers reject multi-label data.
    fn single_label(&self) -> bool {
        false
    }

    /// Per-sample variational state, indexed by [`Batch::ids`], to be saved in checkpoints.
    fn sample_state(&self) -> Option<&crate::SampleState> {
        None
    }

    /// How the estimator runs on an output layer whose classes are split over ranks
    /// ([`crate::ShardPlan`]), or `None` when its gradient needs every row of W in one process.
    fn shard_plan(&self) -> Option<crate::ShardPlan<'_>> {
        None
    }

    /// The loss's tile-by-tile form ([`crate::TiledGradient`]), for an exact estimator whose
    /// dense gradient a layer may compute a tile of classes at a time instead of through
    /// [`Self::estimate_batch`]; `None` otherwise.
    fn tiled(&self) -> Option<&dyn crate::TiledGradient> {
        None
    }

    /// Estimates the loss of one sample with features `phi` (length D) and positive classes
    /// `positives`, writing `(k, g_k ~ dL/dz_k)` into `out` (cleared first).
    fn estimate(&self, ctx: &Ctx, phi: &[f32], positives: &[ClassId], rng: &mut Rng, out: &mut SparseGrad) -> Estimate;

    /// Estimates a whole batch into `out`. Default: [`Self::estimate`] for every sample in
    /// parallel, sample `i` using a generator seeded from one draw of `rng` and `i`.
    fn estimate_batch(&self, ctx: &Ctx, batch: Batch, rng: &mut Rng, out: &mut BatchGrad) -> BatchEstimate {
        let seed = rng.next_u64();
        for_each_sample(out, batch.phi.rows(), |i, g| {
            let mut r = farout_core::rng::seeded(seed, i as u64);
            self.estimate(ctx, batch.phi.row(i), batch.positives[i], &mut r, g)
        })
    }
}

/// Runs `f(i, grad_i)` for every sample `i < n` of a batch in parallel, into `n` cleared sparse
/// gradients of `out`, and sums the per-sample estimates.
pub(crate) fn for_each_sample(
    out: &mut BatchGrad,
    n: usize,
    f: impl Fn(usize, &mut SparseGrad) -> Estimate + Sync + Send,
) -> BatchEstimate {
    out.reset_sparse(n);
    out.losses.resize(n, 0.0);
    out.sparse
        .par_iter_mut()
        .zip(out.losses.par_iter_mut())
        .enumerate()
        .map(|(i, (g, loss))| {
            let e = f(i, g);
            *loss = e.loss;
            e
        })
        .fold(BatchEstimate::default, |acc, e| BatchEstimate {
            loss_sum: acc.loss_sum + e.loss as f64,
            classes_scored: acc.classes_scored + e.classes_scored,
        })
        .reduce(BatchEstimate::default, |a, b| BatchEstimate {
            loss_sum: a.loss_sum + b.loss_sum,
            classes_scored: a.classes_scored + b.classes_scored,
        })
}
