//! How an estimator's gradient is computed when the classes of the output layer are split over
//! ranks (`farout_layer::sharded`): rank r holds only the rows `W_r` of its classes.
//!
//! The estimators that evaluate a loss *exactly on a candidate set* `C` of each sample
//! decompose over the ranks, because only the scores of `C` must travel:
//!
//! - **Search** ([`ShardPlan::Search`]: mips, and ldgs at its fixed point with exact rescoring).
//!   Each rank searches every block index over its own rows for the block's top-Q; the ranks
//!   gather these hits with global ids and keep each block's top-Q over all ranks (the top-Q of
//!   the per-shard top-Q is the top-Q of the whole layer). `U` is their union with the
//!   positives, as in one process, and each class of `U` is scored exactly by the rank that
//!   owns it ([`complete_scores`](crate::complete_scores)).
//! - **Near** ([`ShardPlan::Near`]: the exact smoothed margin). Each rank scores all its
//!   classes; the ranks agree on each sample's best negative score `M` (an allreduce max) and
//!   gather the classes scoring at least `M - width`: the only ones the loss depends on, with
//!   the positives. Exact, and as cheap to move as the gradient's support is small.
//! - **Draw** ([`ShardPlan::Draw`]: sampled softmax, negative sampling, OVE, A&R). The
//!   candidates are drawn over all K classes from the global proposal; every rank draws the
//!   same ones from the same generator, and each class is scored by its owner (a sum over ranks
//!   of one score per candidate). A&R's loss also keeps per-sample state and draws its noise
//!   after scoring ([`DrawnLoss`]): every rank holds all samples' state and updates it alike.
//!
//! Every rank then evaluates the same loss on the same scores and keeps the gradient of the
//! classes it owns. For a sample's candidates `C` and ranks `r` owning the rows `W_r`:
//!
//! ```text
//! z_c      = sum_r [c owned by r] (W_c . phi + b_c)    one allreduce sum per candidate (Draw:
//!                                                      plus the candidate's correction)
//! g_c      = dL(z_C, P)/dz_c                           the same on every rank; kept by c's owner
//! dL/dphi  = sum_r sum_{c owned by r} g_c W_c          one allreduce sum of D values per sample
//! ```
//!
//! On one rank every plan is the estimator's own one-process estimate.

use crate::loss::{Loss, LossScratch};
use farout_core::{ClassId, Rng};

/// An estimator's candidate sets on a class-sharded layer; see the module documentation.
#[derive(Clone, Copy)]
pub enum ShardPlan<'a> {
    /// Candidates from searching every rank's rows, merged, plus the positives.
    Search {
        /// Classes retrieved per block index (Q).
        top: usize,
        /// The loss evaluated on the candidates' scores.
        loss: &'a dyn Loss,
    },
    /// Every class scored, and the candidates the classes within `width` of the best
    /// negative's score (exact losses with [`Loss::support_width`]: the exact margin).
    Near {
        /// The loss's [`Loss::support_width`].
        width: f32,
        /// The loss evaluated on the candidates' scores.
        loss: &'a dyn Loss,
    },
    /// Candidates drawn over all classes with corrections of their scores.
    Draw {
        /// The draws, the same on every rank for the same generator.
        draw: &'a dyn ShardDraw,
        /// The loss evaluated on the corrected scores.
        loss: &'a dyn DrawnLoss,
    },
}

/// One sample's drawn candidates: the positives the loss sees first, then the drawn classes
/// (global ids), each with the correction added to its score.
#[derive(Clone, Debug, Default)]
pub struct Drawn {
    /// Classes over all K: `positives` positive classes, then the drawn classes.
    pub classes: Vec<ClassId>,
    /// How many of `classes` (at the front) are positives of the loss: the sample's positives,
    /// or only its label for single-label estimators (OVE).
    pub positives: usize,
    /// Added to each class's score before the loss (sampled softmax: `-log E_c`).
    pub corrections: Vec<f32>,
    /// The sample's own generator after its draws, from which a [`DrawnLoss`] that draws
    /// after scoring continues (A&R's noise); `None` when the batch shares one draw.
    pub rng: Option<Rng>,
}

/// The loss of a [`ShardPlan::Draw`] on one sample's drawn candidates. Every [`Loss`] is one,
/// of the scores alone; A&R's also reads and writes the sample's variational state and draws
/// from the sample's generator.
pub trait DrawnLoss: Sync {
    /// The loss of the sample `id` (its index in the training set, when the batch has ids)
    /// whose candidates are `drawn`, on their scores `z` (corrections added) with the positives
    /// at `positions` (`0..drawn.positives`); `dL/dz` into `grad` (one per candidate).
    fn drawn_value_and_grad(
        &self,
        id: Option<usize>,
        drawn: &Drawn,
        z: &[f32],
        positions: &[ClassId],
        grad: &mut [f32],
        scratch: &mut LossScratch,
    ) -> f32;
}

impl<L: Loss> DrawnLoss for L {
    fn drawn_value_and_grad(
        &self,
        _: Option<usize>,
        _: &Drawn,
        z: &[f32],
        positions: &[ClassId],
        grad: &mut [f32],
        scratch: &mut LossScratch,
    ) -> f32 {
        self.value_and_grad(z, positions, grad, scratch)
    }
}

/// The draws of a sampling estimator over all classes.
pub trait ShardDraw: Sync {
    /// Every sample's [`Drawn`] candidates over `n_classes` classes into `out` (one per entry of
    /// `positives`), drawn with `rng` exactly as the one-process estimator draws them.
    fn draw_batch(&self, n_classes: usize, positives: &[&[ClassId]], rng: &mut Rng, out: &mut Vec<Drawn>);
}

/// One [`Drawn`] per sample in `out`, each filled by `draw(positives, generator, drawn)` with a
/// generator seeded from one draw of `rng` and the sample's index: the generators the default
/// [`GradientEstimator::estimate_batch`](crate::GradientEstimator::estimate_batch) hands its
/// samples, so that the ranks draw what one process draws.
pub fn draw_per_sample(
    positives: &[&[ClassId]],
    rng: &mut Rng,
    out: &mut Vec<Drawn>,
    mut draw: impl FnMut(&[ClassId], &mut Rng, &mut Drawn),
) {
    out.resize_with(positives.len(), Drawn::default);
    out.truncate(positives.len());
    let seed = farout_core::rng::RngCore::next_u64(rng);
    for (i, (pos, drawn)) in positives.iter().zip(out.iter_mut()).enumerate() {
        let mut r = farout_core::rng::seeded(seed, i as u64);
        draw(pos, &mut r, drawn);
        drawn.rng = Some(r);
    }
}
