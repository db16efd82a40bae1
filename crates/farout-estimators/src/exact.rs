//! Exact gradients: every class scored, then the loss differentiated ([`Exact`]), and the
//! parameters of `[output] estimator = "softmax"` ([`SoftmaxConfig`]) and `"margin"`
//! ([`MarginConfig`]). These are the references every approximate estimator is measured
//! against: in the tests, in `farout bench estimator` and in a run's gradient cosine.
//!
//! `softmax`: the multi-label cross-entropy of the LDGS paper, eq. 2 ([`crate::Softmax`]):
//!
//! ```text
//! L(z, P)  = sum_{p in P} ( log sum_{j=1..K} exp(z_j) - z_p )
//! dL/dz_k  = |P| exp(z_k) / sum_j exp(z_j) - [k in P]
//! ```
//!
//! Every class gets a gradient, so a batch's gradient is a dense `[B, K]` matrix.
//!
//! `margin`: the smoothed max-margin loss of the LDGS paper, eq. 10-11
//! ([`crate::SmoothedMargin`]; smoothing `mu`, the paper's 1 for multiclass and 5 for multilabel
//! data):
//!
//! ```text
//! L_mu(z, P) = max_{a in C} <z + 1_N, a> - (mu/2) |a|^2                    (eq. 10)
//! dL/dz      = a* = proj_C((z + 1_N) / mu)                                   (eq. 11)
//! C          = {a : sum_{k in N} a_k = -sum_{k in P} a_k <= 1, a_N >= 0, a_P <= 0}
//! ```
//!
//! with `1_N` 1 on the negatives and 0 on the positives. Only the negatives within `mu` of the
//! best one and the weakest positives get a gradient, so the gradient is sparse (`loss.rs`
//! derives both gradients).
//!
//! Cost: K inner products per sample, O(K D). A batch computes all its scores with one matrix
//! product `Z = Phi W^T`, which runs near the machine's peak.

use crate::contract::{Built, EstimatorParams, ExactLoss, Problem};
use crate::estimator::{Batch, BatchEstimate, BatchGrad, Ctx, Estimate, GradientEstimator};
use crate::loss::{Loss, LossScratch, SmoothedMargin, Softmax};
use farout_core::{ClassId, Rng, SparseGrad, gemm, kernels};
use rayon::prelude::*;
use std::cell::RefCell;

/// The exact gradient of a [`Loss`]: score every class, then differentiate.
///
/// Cost: K inner products per sample (O(K D)). Per sample this is a matrix-vector product; the
/// batch method computes all scores with one matrix product `Z = Phi W^T`, which runs near the
/// machine's peak, and returns dense gradients for dense losses (softmax) and sparse ones for
/// sparse losses (margin).
#[derive(Clone, Debug)]
pub struct Exact<L> {
    loss: L,
}

impl<L: Loss> Exact<L> {
    /// The exact estimator of `loss`.
    pub fn new(loss: L) -> Self {
        Self { loss }
    }

    /// The loss.
    pub fn loss(&self) -> &L {
        &self.loss
    }
}

impl<L: Loss> GradientEstimator for Exact<L> {
    fn name(&self) -> &'static str {
        self.loss.name()
    }

    /// Losses that depend only on the scores near the top ([`Loss::support_width`]) shard by
    /// gathering those; the exact softmax has its own sharded step.
    fn shard_plan(&self) -> Option<crate::ShardPlan<'_>> {
        self.loss.support_width().map(|width| crate::ShardPlan::Near { width, loss: &self.loss })
    }

    fn tiled(&self) -> Option<&dyn crate::TiledGradient> {
        self.loss.tiled()
    }

    fn estimate(
        &self,
        ctx: &Ctx,
        phi: &[f32],
        positives: &[ClassId],
        _rng: &mut Rng,
        out: &mut SparseGrad,
    ) -> Estimate {
        let k = ctx.n_classes();
        let mut z = vec![0.0; k];
        kernels::gemv(ctx.w.as_slice(), phi, &mut z);
        add_bias(&mut z, ctx.bias);
        let mut grad = vec![0.0; k];
        let loss = self.loss.value_and_grad(&z, positives, &mut grad, &mut LossScratch::default());
        out.clear();
        for (i, &g) in grad.iter().enumerate() {
            if g != 0.0 {
                out.push(i as ClassId, g);
            }
        }
        Estimate { loss, classes_scored: k }
    }

    fn estimate_batch(&self, ctx: &Ctx, batch: Batch, _rng: &mut Rng, out: &mut BatchGrad) -> BatchEstimate {
        let (b, k, d) = (batch.phi.rows(), ctx.n_classes(), ctx.w.cols());
        out.reset_dense(b, k);
        gemm::scores(batch.phi.as_slice(), b, ctx.w.as_slice(), k, d, out.dense.as_mut_slice());
        let sparse = self.loss.sparse_gradient();
        if sparse {
            // The dense buffer then only holds the scores.
            out.reset_sparse(b);
        }
        let loss = &self.loss;
        let loss_sum: f64 = if sparse {
            out.dense
                .as_mut_slice()
                .par_chunks_mut(k.max(1))
                .zip(out.sparse.par_iter_mut())
                .zip(batch.positives.par_iter())
                .map(|((z, sg), pos)| {
                    SCRATCH.with_borrow_mut(|(scratch, grad)| {
                        add_bias(z, ctx.bias);
                        grad.resize(k, 0.0);
                        let l = loss.value_and_grad(z, pos, grad, scratch);
                        for (i, &g) in grad.iter().enumerate() {
                            if g != 0.0 {
                                sg.push(i as ClassId, g);
                            }
                        }
                        l as f64
                    })
                })
                .sum()
        } else {
            out.dense
                .as_mut_slice()
                .par_chunks_mut(k.max(1))
                .zip(batch.positives.par_iter())
                .map(|(z, pos)| {
                    SCRATCH.with_borrow_mut(|(scratch, _)| {
                        add_bias(z, ctx.bias);
                        loss.value_and_grad_in_place(z, pos, scratch) as f64
                    })
                })
                .sum()
        };
        BatchEstimate { loss_sum, classes_scored: b * k }
    }
}

thread_local! {
    /// Each worker's loss scratch and dense gradient row, kept across samples and steps (rayon's
    /// `map_init` would make new ones for every piece a batch is split into, often one sample).
    static SCRATCH: RefCell<(LossScratch, Vec<f32>)> = RefCell::new(Default::default());
}

fn add_bias(z: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for (v, bb) in z.iter_mut().zip(b) {
            *v += bb;
        }
    }
}

/// `[output] estimator = "softmax"`: the exact cross-entropy gradient; no parameters.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoftmaxConfig {}

impl ExactLoss {
    /// Its exact gradient estimator: the reference every approximate estimator of this loss is
    /// measured against.
    pub fn exact(&self) -> Box<dyn GradientEstimator> {
        match *self {
            Self::Softmax => Box::new(Exact::new(Softmax)),
            Self::Margin(m) => Box::new(Exact::new(m)),
        }
    }
}

impl EstimatorParams for SoftmaxConfig {
    fn check(&self) -> Result<(), farout_core::ParamError> {
        Ok(())
    }

    fn loss(&self) -> Result<ExactLoss, crate::Error> {
        Ok(ExactLoss::Softmax)
    }

    fn build(&self, _: &Problem) -> Result<Built, crate::Error> {
        Ok(Built { estimator: Box::new(Exact::new(Softmax)), loss: ExactLoss::Softmax, exact: true, search: None })
    }

    fn estimates_softmax(&self) -> bool {
        true
    }
}

/// `[output] estimator = "margin"`: the exact smoothed max-margin gradient.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MarginConfig {
    /// Smoothing `mu` of the margin loss (the LDGS paper: 1 for multiclass, 5 for multilabel).
    pub mu: f32,
}

impl Default for MarginConfig {
    fn default() -> Self {
        Self { mu: 1.0 }
    }
}

impl EstimatorParams for MarginConfig {
    /// The smoothing μ of the margin loss (a scale: log-uniform around the shipped 5).
    fn search_space(&self) -> Vec<farout_core::space::Dim> {
        use farout_core::space::Dim;
        vec![Dim::float_log("mu", 0.5, 20.0)]
    }

    fn check(&self) -> Result<(), farout_core::ParamError> {
        self.loss()?;
        Ok(())
    }

    fn loss(&self) -> Result<ExactLoss, crate::Error> {
        Ok(ExactLoss::Margin(SmoothedMargin::new(self.mu)?))
    }

    fn build(&self, _: &Problem) -> Result<Built, crate::Error> {
        let loss = self.loss()?;
        Ok(Built { estimator: loss.exact(), loss, exact: true, search: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SmoothedMargin, Softmax};
    use farout_core::{Matrix, rng};

    fn layer(k: usize, d: usize, seed: u64) -> (Matrix, Vec<f32>, Matrix) {
        let mut r = rng::seeded(seed, 0);
        let w = Matrix::from_vec(k, d, (0..k * d).map(|_| rng::normal(&mut r)).collect()).unwrap();
        let bias: Vec<f32> = (0..k).map(|_| 0.1 * rng::normal(&mut r)).collect();
        let phi = Matrix::from_vec(6, d, (0..6 * d).map(|_| 0.5 * rng::normal(&mut r)).collect()).unwrap();
        (w, bias, phi)
    }

    fn batch_matches_per_sample<L: Loss + Clone>(loss: L) {
        let (w, bias, phi) = layer(50, 8, 3);
        let ctx = Ctx::new(&w, Some(&bias));
        let pos: Vec<Vec<u32>> = vec![vec![1], vec![2, 7], vec![], vec![49], vec![0, 1, 2], vec![10]];
        let pos_refs: Vec<&[u32]> = pos.iter().map(|p| p.as_slice()).collect();
        let est = Exact::new(loss);
        let mut bg = BatchGrad::default();
        let mut r = rng::seeded(0, 0);
        let tot = est.estimate_batch(&ctx, Batch::new(&phi, &pos_refs), &mut r, &mut bg);
        let mut sum = 0.0;
        for (i, p) in pos.iter().enumerate().take(6) {
            let mut g = SparseGrad::new();
            let e = est.estimate(&ctx, phi.row(i), p, &mut r, &mut g);
            sum += e.loss as f64;
            let mut dense = [0.0; 50];
            for (k, v) in g.iter() {
                dense[k as usize] = v;
            }
            let mut batch_dense = vec![0.0; 50];
            if bg.is_dense {
                batch_dense.copy_from_slice(bg.dense.row(i));
            } else {
                for (k, v) in bg.sparse[i].iter() {
                    batch_dense[k as usize] = v;
                }
            }
            for (a, b) in dense.iter().zip(&batch_dense) {
                assert!((a - b).abs() < 1e-4, "sample {i}: {a} vs {b}");
            }
        }
        assert!((sum - tot.loss_sum).abs() < 1e-3 * sum.abs().max(1.0));
        assert_eq!(tot.classes_scored, 300);
    }

    #[test]
    fn batched_softmax_equals_per_sample_reference() {
        batch_matches_per_sample(Softmax);
    }

    #[test]
    fn batched_margin_equals_per_sample_reference() {
        for mu in [0.05, 1.0, 50.0] {
            batch_matches_per_sample(SmoothedMargin::new(mu).unwrap());
        }
    }
}
