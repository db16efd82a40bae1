//! The losses estimators evaluate: [`Loss`] maps a score vector `z` and the positions `P` of its
//! positives to `L(z, P)` and `dL/dz`, on all K scores (exact estimators) or on the scores of a
//! candidate set (search and sampling estimators, whose positions index that set). `N` is every
//! position not in `P`.
//!
//! # Cross-entropy ([`Softmax`]), LDGS paper eq. 2
//!
//! ```text
//! L(z, P)  = sum_{p in P} ( log sum_j exp(z_j) - z_p )
//! dL/dz_k  = sum_{p in P} ( exp(z_k) / sum_j exp(z_j) - [k = p] )
//!          = |P| softmax(z)_k - [k in P]
//! ```
//!
//! since `d/dz_k log sum_j exp(z_j) = softmax(z)_k`, once per positive. With one positive this is
//! the usual softmax cross-entropy; the gradient sums to 0. `log sum_j exp(z_j)` is computed as
//! `m + log sum_j exp(z_j - m)` with `m = max_j z_j`, so that large scores cannot overflow.
//!
//! # Smoothed max-margin ([`SmoothedMargin`]), LDGS paper eq. 10-11
//!
//! The max-margin loss (eq. 3), `L(z, P) = max(0, 1 + max_{n in N} z_n - min_{p in P} z_p)`, is a
//! maximum over the bi-simplex `C`:
//!
//! ```text
//! C        = {a : sum_{n in N} a_n = -sum_{p in P} a_p = s <= 1, a_N >= 0, a_P <= 0}
//! L(z, P)  = max_{a in C} <z + 1_N, a>                  (1_N: 1 on negatives, 0 on positives)
//! ```
//!
//! (for a given `s` the best `a` puts `s` on the best negative and `-s` on the worst positive,
//! worth `s (1 + max_N z - min_P z)`, so the best `s` is 1 or 0). Nesterov smoothing subtracts
//! `(mu/2) |a|^2` (eq. 10). Completing the square,
//! `<z + 1_N, a> - (mu/2) |a|^2 = (mu/2) (|v|^2 - |a - v|^2)` with `v = (z + 1_N) / mu`, so the
//! maximiser is the Euclidean projection of `v` onto `C`, and by Danskin's theorem it is the
//! gradient:
//!
//! ```text
//! L_mu(z, P) = max_{a in C} <z + 1_N, a> - (mu/2) |a|^2                          (eq. 10)
//! dL/dz      = a* = proj_C((z + 1_N) / mu)                                         (eq. 11)
//! ```
//!
//! `L_mu` is `1/mu`-smooth and within `mu` of the max-margin loss (`|a|^2 <= 2` on `C`); the
//! LDGS paper uses `mu = 1` for multiclass and `mu = 5` for multilabel data. The gradient is
//! non-zero only on the negatives within `mu` of the best one and on the weakest positives: it is
//! sparse, and a candidate set holding those classes gives the exact loss
//! ([`Loss::support_width`]). `bisimplex.rs` computes the projection.
//!
//! # Binary logistic ([`BinaryLogistic`]), negative sampling's loss
//!
//! ```text
//! L        = sum_{p in P} softplus(-z_p) + sum_{c not in P} softplus(z_c)
//!          = -sum_{p in P} log sigma(z_p) - sum_{c not in P} log sigma(-z_c)
//! dL/dz_p  = sigma(z_p) - 1,        dL/dz_c = sigma(z_c)
//! ```
//!
//! with `softplus(x) = log(1 + exp(x))`, whose derivative is `sigma(x) = 1 / (1 + exp(-x))`; a
//! class listed twice counts twice.

use crate::bisimplex::{BisimplexScratch, project_bisimplex_into};
use farout_core::{ClassId, kernels, vexp};

/// `log(1 + exp(x))` without overflow.
#[inline]
pub(crate) fn softplus(x: f64) -> f64 {
    if x > 0.0 { x + (-x).exp().ln_1p() } else { x.exp().ln_1p() }
}

/// The logistic function.
#[inline]
pub(crate) fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// A loss `L(z, P)` of a score vector `z` and a set of positive positions `P`.
///
/// Positions index `z`: for an exact loss `z` holds all K scores and positions are class ids; an
/// approximate estimator may pass a shorter vector of retrieved scores with positions into it.
pub trait Loss: Send + Sync {
    /// Name used in configs and logs.
    fn name(&self) -> &'static str;

    /// Returns `L(z, P)` and writes `dL/dz` into `grad` (same length as `z`). `scratch` is reused
    /// between calls to avoid allocating per sample.
    fn value_and_grad(&self, z: &[f32], positives: &[ClassId], grad: &mut [f32], scratch: &mut LossScratch) -> f32;

    /// Whether `dL/dz` is sparse (few non-zeros out of K), which makes sparse row updates pay.
    fn sparse_gradient(&self) -> bool;

    /// A width `w` such that every negative class scoring more than `w` below the best
    /// negative has a zero gradient and leaves the loss as it is: the loss and its gradient are
    /// then those of the scores within `w` of the top and the positives. `None` when every score
    /// counts (softmax).
    fn support_width(&self) -> Option<f32> {
        None
    }

    /// The tile-by-tile form of an exact dense loss ([`crate::TiledGradient`]), if it has one.
    fn tiled(&self) -> Option<&dyn crate::TiledGradient> {
        None
    }

    /// Like [`Self::value_and_grad`], overwriting the scores `z` with the gradient. The default
    /// copies the scores into `scratch`; losses that can work in place override it.
    fn value_and_grad_in_place(&self, z: &mut [f32], positives: &[ClassId], scratch: &mut LossScratch) -> f32 {
        let mut copy = std::mem::take(&mut scratch.scores);
        copy.clear();
        copy.extend_from_slice(z);
        let l = self.value_and_grad(&copy, positives, z, scratch);
        scratch.scores = copy;
        l
    }
}

/// Reusable buffers of the losses.
#[derive(Debug, Default)]
pub struct LossScratch {
    bisimplex: BisimplexScratch,
    is_positive: Vec<bool>,
    scores: Vec<f32>,
}

/// `mask` as `n` flags, true at the positions `positives`.
fn mark_positives<'a>(mask: &'a mut Vec<bool>, n: usize, positives: &[ClassId]) -> &'a [bool] {
    mask.clear();
    mask.resize(n, false);
    for &p in positives {
        mask[p as usize] = true;
    }
    mask
}

/// Multi-label cross-entropy, eq. (2) of the LDGS paper:
///
/// `L(z, P) = sum_{p in P} ( log sum_j exp(z_j) - z_p )`,
/// `dL/dz_k = |P| softmax(z)_k - [k in P]`.
///
/// With one positive this is the usual softmax cross-entropy. A sample with no positives has
/// loss 0 and no gradient.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Softmax;

impl Loss for Softmax {
    fn name(&self) -> &'static str {
        "softmax"
    }

    fn value_and_grad(&self, z: &[f32], positives: &[ClassId], grad: &mut [f32], _: &mut LossScratch) -> f32 {
        debug_assert_eq!(z.len(), grad.len());
        if positives.is_empty() {
            grad.fill(0.0);
            return 0.0;
        }
        let max = kernels::max(z);
        grad.copy_from_slice(z);
        let sum = vexp::exp_shifted(grad, max);
        let n_pos = positives.len() as f32;
        let scale = n_pos / sum as f32;
        for g in grad.iter_mut() {
            *g *= scale;
        }
        let log_z = max + (sum as f32).ln();
        let mut loss = 0.0;
        for &p in positives {
            loss += log_z - z[p as usize];
            grad[p as usize] -= 1.0;
        }
        loss
    }

    fn sparse_gradient(&self) -> bool {
        false
    }

    fn tiled(&self) -> Option<&dyn crate::TiledGradient> {
        Some(self)
    }

    /// In place: only the positives' scores are needed once the exponentials overwrite `z`.
    fn value_and_grad_in_place(&self, z: &mut [f32], positives: &[ClassId], _: &mut LossScratch) -> f32 {
        if positives.is_empty() {
            z.fill(0.0);
            return 0.0;
        }
        let max = kernels::max(z);
        let pos_score_sum: f64 = positives.iter().map(|&p| z[p as usize] as f64).sum();
        let sum = vexp::exp_shifted(z, max);
        let scale = positives.len() as f32 / sum as f32;
        for v in z.iter_mut() {
            *v *= scale;
        }
        for &p in positives {
            z[p as usize] -= 1.0;
        }
        let log_z = max as f64 + sum.ln();
        (positives.len() as f64 * log_z - pos_score_sum) as f32
    }
}

/// The binary logistic losses of negative sampling on a candidate set: label 1 for the
/// positions in `positives`, 0 for the others,
///
/// `L = sum_{p in P} softplus(-z_p) + sum_{c not in P} softplus(z_c)`,
/// `dL/dz_p = sigma(z_p) - 1`, `dL/dz_c = sigma(z_c)`
///
/// (`softplus(x) = log(1 + exp(x))`; a class listed twice counts twice).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BinaryLogistic;

impl Loss for BinaryLogistic {
    fn name(&self) -> &'static str {
        "binary_logistic"
    }

    fn value_and_grad(&self, z: &[f32], positives: &[ClassId], grad: &mut [f32], scratch: &mut LossScratch) -> f32 {
        debug_assert_eq!(z.len(), grad.len());
        let is_pos = mark_positives(&mut scratch.is_positive, z.len(), positives);
        let mut loss = 0.0f64;
        for ((&z, g), &p) in z.iter().zip(grad.iter_mut()).zip(is_pos.iter()) {
            let z = f64::from(z);
            if p {
                loss += softplus(-z);
                *g = (sigmoid(z) - 1.0) as f32;
            } else {
                loss += softplus(z);
                *g = sigmoid(z) as f32;
            }
        }
        loss as f32
    }

    fn sparse_gradient(&self) -> bool {
        true
    }
}

/// Smoothed max-margin loss, eq. (10)-(11) of the LDGS paper (Nesterov smoothing of the
/// max-margin loss (3) with parameter `mu`):
///
/// `L_mu(z, P) = max_{a in C} <z + 1_N, a> - mu/2 |a|^2`,
/// `dL/dz = a* = proj_C((z + 1_N) / mu)`,
///
/// where `1_N` is 1 on negatives and 0 on positives, and `C` is the bi-simplex
/// `{a : sum_N a = -sum_P a <= 1, a_N >= 0, a_P <= 0}`. At `mu -> 0` this is the max-margin loss
/// `max(0, 1 + max_N z - min_P z)`; the gradient is non-zero only on the confusing negatives
/// (within about `mu` of the top) and the weakest positives, so it is sparse. The paper uses
/// `mu = 1` for multiclass and `mu = 5` for multilabel data.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SmoothedMargin {
    mu: f32,
}

impl SmoothedMargin {
    /// The loss with smoothing `mu` (> 0).
    pub fn new(mu: f32) -> Result<Self, crate::Error> {
        if !(mu > 0.0 && mu.is_finite()) {
            return Err(crate::Error::Param(farout_core::ParamError::new("mu", mu, "must be a finite number > 0")));
        }
        Ok(Self { mu })
    }

    /// The smoothing parameter.
    pub fn mu(&self) -> f32 {
        self.mu
    }
}

impl Loss for SmoothedMargin {
    fn name(&self) -> &'static str {
        "margin"
    }

    fn value_and_grad(&self, z: &[f32], positives: &[ClassId], grad: &mut [f32], scratch: &mut LossScratch) -> f32 {
        let is_pos = mark_positives(&mut scratch.is_positive, z.len(), positives);
        let inv_mu = 1.0 / self.mu;
        // v = (z + 1_N) / mu, written into grad and projected in place.
        let mut finite = true;
        for ((g, &v), &pos) in grad.iter_mut().zip(z).zip(is_pos.iter()) {
            *g = (v + if pos { 0.0 } else { 1.0 }) * inv_mu;
            finite &= g.is_finite();
        }
        if !finite {
            // Scores of a diverged model: the loss is undefined; NaN lets the trainer stop.
            grad.fill(0.0);
            return f32::NAN;
        }
        project_bisimplex_into(grad, is_pos, &mut scratch.bisimplex);
        let mut lin = 0.0f64;
        let mut sq = 0.0f64;
        for ((&a, &v), &pos) in grad.iter().zip(z).zip(is_pos.iter()) {
            if a != 0.0 {
                lin += a as f64 * (v as f64 + if pos { 0.0 } else { 1.0 });
                sq += a as f64 * a as f64;
            }
        }
        (lin - 0.5 * self.mu as f64 * sq) as f32
    }

    fn sparse_gradient(&self) -> bool {
        true
    }

    /// `mu`: a negative with `v = (z + 1) / mu` more than 1 below the top's is never in the
    /// projection's support (see `bisimplex.rs`).
    fn support_width(&self) -> Option<f32> {
        Some(self.mu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_logistic_by_hand() {
        // Position 0 positive, 1 and 2 negatives, 2 listed twice.
        let z = [2.0f32, -1.0, 0.5, 0.5];
        let mut grad = [0f32; 4];
        let loss = BinaryLogistic.value_and_grad(&z, &[0], &mut grad, &mut LossScratch::default());
        let (sp, sg) = (|x: f64| (1.0 + x.exp()).ln(), |x: f64| 1.0 / (1.0 + (-x).exp()));
        let want = sp(-2.0) + sp(-1.0) + 2.0 * sp(0.5);
        assert!((f64::from(loss) - want).abs() < 1e-6, "{loss} vs {want}");
        for (g, w) in grad.iter().zip([sg(2.0) - 1.0, sg(-1.0), sg(0.5), sg(0.5)]) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{grad:?}");
        }
    }

    #[test]
    fn non_finite_scores_give_a_nan_margin_loss_and_no_gradient() {
        let loss = SmoothedMargin::new(1.0).unwrap();
        let mut scratch = LossScratch::default();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let z = [0.5, bad, -1.0];
            let mut grad = vec![1.0; 3];
            assert!(loss.value_and_grad(&z, &[0], &mut grad, &mut scratch).is_nan());
            assert_eq!(grad, vec![0.0; 3]);
        }
    }

    /// Central finite differences in f64 arithmetic on the f32 loss.
    fn check_gradient(loss: &dyn Loss, z: &[f32], positives: &[ClassId], tol: f32) {
        let mut scratch = LossScratch::default();
        let mut grad = vec![0.0; z.len()];
        loss.value_and_grad(z, positives, &mut grad, &mut scratch);
        let mut tmp = vec![0.0; z.len()];
        let h = 1e-2f32;
        for k in 0..z.len() {
            let mut zp = z.to_vec();
            zp[k] += h;
            let lp = loss.value_and_grad(&zp, positives, &mut tmp, &mut scratch);
            zp[k] -= 2.0 * h;
            let lm = loss.value_and_grad(&zp, positives, &mut tmp, &mut scratch);
            let fd = (lp - lm) / (2.0 * h);
            assert!((fd - grad[k]).abs() < tol, "{}: dL/dz_{k} = {} but finite difference {fd}", loss.name(), grad[k]);
        }
    }

    fn scores(seed: u64, n: usize, spread: f32) -> Vec<f32> {
        let mut r = farout_core::rng::seeded(seed, 0);
        (0..n).map(|_| spread * farout_core::rng::normal(&mut r)).collect()
    }

    #[test]
    fn softmax_gradient_matches_finite_differences() {
        for seed in 0..20 {
            let z = scores(seed, 12, 2.0);
            check_gradient(&Softmax, &z, &[3], 2e-3);
            check_gradient(&Softmax, &z, &[0, 5, 11], 2e-3);
        }
    }

    #[test]
    fn in_place_gradients_equal_the_out_of_place_ones() {
        let margin = SmoothedMargin::new(1.0).unwrap();
        for loss in [&Softmax as &dyn Loss, &margin] {
            for seed in 0..10 {
                let z = scores(seed, 30, 2.0);
                let pos = [seed as u32 % 30, 7];
                let mut scratch = LossScratch::default();
                let mut g = vec![0.0; 30];
                let l = loss.value_and_grad(&z, &pos, &mut g, &mut scratch);
                let mut zz = z.clone();
                let l2 = loss.value_and_grad_in_place(&mut zz, &pos, &mut scratch);
                assert!((l - l2).abs() < 1e-4 * l.abs().max(1.0), "{}: {l} vs {l2}", loss.name());
                for (a, b) in g.iter().zip(&zz) {
                    assert!((a - b).abs() < 1e-6);
                }
            }
        }
    }

    #[test]
    fn softmax_value_is_cross_entropy() {
        let z = [1.0, 2.0, 3.0];
        let mut g = [0.0; 3];
        let l = Softmax.value_and_grad(&z, &[0], &mut g, &mut LossScratch::default());
        let expect = (1f32.exp() + 2f32.exp() + 3f32.exp()).ln() - 1.0;
        assert!((l - expect).abs() < 1e-5);
        assert!((g.iter().sum::<f32>()).abs() < 1e-6, "softmax gradient sums to |P| - |P| = 0");
    }

    #[test]
    fn margin_gradient_matches_finite_differences() {
        // The smoothed loss is 1/mu-smooth, so central differences with h = 1e-2 are accurate
        // to O(h / mu) only near the kinks of the projection; scores spread widely keep most
        // coordinates away from them, and the tolerance covers the rest.
        for mu in [1.0, 5.0] {
            let loss = SmoothedMargin::new(mu).unwrap();
            for seed in 0..20 {
                let z = scores(seed + 100, 10, 1.5);
                check_gradient(&loss, &z, &[2], 2e-2);
                check_gradient(&loss, &z, &[1, 7], 2e-2);
            }
        }
    }

    #[test]
    fn margin_is_zero_when_positive_wins_by_a_wide_margin() {
        let loss = SmoothedMargin::new(1.0).unwrap();
        let z = [10.0, 0.0, -1.0, 0.5];
        let mut g = [9.0; 4];
        let l = loss.value_and_grad(&z, &[0], &mut g, &mut LossScratch::default());
        assert_eq!(l, 0.0);
        assert_eq!(g, [0.0; 4]);
    }

    #[test]
    fn margin_approaches_max_margin_as_mu_shrinks() {
        let z = [0.3, 0.9, -0.2, 0.1];
        let hard = 1.0f32 + 0.9 - 0.3; // max(0, 1 + max_N z - min_P z)
        let loss = SmoothedMargin::new(1e-3).unwrap();
        let mut g = [0.0; 4];
        let l = loss.value_and_grad(&z, &[0], &mut g, &mut LossScratch::default());
        assert!((l - hard).abs() < 1e-2, "{l} vs {hard}");
        assert!((g[1] - 1.0).abs() < 1e-4 && (g[0] + 1.0).abs() < 1e-4);
    }

    #[test]
    fn margin_rejects_non_positive_mu() {
        assert!(SmoothedMargin::new(0.0).is_err());
        assert!(SmoothedMargin::new(f32::NAN).is_err());
    }
}
