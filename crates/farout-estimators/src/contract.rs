//! The contract of an estimator plug-in: what its parameter struct implements
//! ([`EstimatorParams`]: check, loss, build), the problem it is built for ([`Problem`]), and
//! what building gives ([`Built`]: the estimator, its exact loss, the index it needs). The
//! estimator itself implements [`crate::GradientEstimator`] (`estimator.rs`); the exact
//! estimator of an [`ExactLoss`] ([`ExactLoss::exact`]) is built in `exact.rs`. The list of
//! plug-ins a config can name is `registry.rs`; this file does not know it.
//!
//! Every estimator computes or approximates one of two exact losses ([`ExactLoss`]; `loss` and
//! `mu` choose it where an estimator offers both, [`LossKind`]), whose exact estimator is the
//! reference of its gradient:
//!
//! ```text
//! softmax   LDGS eq. 2        L = sum_{p in P} ( log sum_j exp(z_j) - z_p )
//! margin    LDGS eq. 10-11    L = max_{a in C} <z + 1_N, a> - (mu/2) |a|^2
//! ```
//!
//! (`loss.rs` derives both gradients.) The sampling estimators, whose own losses are other
//! objectives (negative sampling's binary logistic loss) or bounds (OVE, A&R), are measured
//! against the softmax.

use crate::Error;
use crate::estimator::GradientEstimator;
use crate::loss::{Loss, SmoothedMargin, Softmax};
use serde::{Deserialize, Serialize};

/// What an estimator's parameters can do: check themselves and build the estimator.
pub trait EstimatorParams {
    /// Checks what serde cannot (ranges); errors name the key relative to `[output]`.
    fn check(&self) -> Result<(), farout_core::ParamError>;

    /// The ranges `farout tune` draws the estimator's own knobs from (keys relative to
    /// `[output]`, as in [`EstimatorParams::check`]'s errors). Default: nothing to tune.
    fn search_space(&self) -> Vec<farout_core::space::Dim> {
        Vec::new()
    }

    /// The exact loss the estimator computes or approximates (its evaluation loss and the
    /// reference of its gradient).
    fn loss(&self) -> Result<ExactLoss, Error>;

    /// Builds the estimator for `problem`.
    fn build(&self, problem: &Problem) -> Result<Built, Error>;

    /// Whether the estimator's gradient is the softmax cross-entropy's (LDGS eq. 2), exact or
    /// estimated, rather than another objective's or a bound's: what the collapsed skip-gram
    /// objective (LDGS eq. 9) trains with.
    fn estimates_softmax(&self) -> bool {
        false
    }

    /// Whether the estimator scores the rows of W alone, so the layer must have no bias (the
    /// index of Algorithm 1 searches W).
    fn needs_no_bias(&self) -> bool {
        false
    }
}

/// The shape of the problem an estimator is built for.
pub struct Problem<'a> {
    /// Number of classes K.
    pub n_classes: usize,
    /// Number of training samples (the size of per-sample state, A&R).
    pub n_data: usize,
    /// Feature dimension D.
    pub dim: usize,
    /// Training label counts per class; called only by proposals that need them (unigram).
    pub label_counts: &'a dyn Fn() -> Vec<u64>,
}

/// The index a search-based estimator needs: `blocks` column blocks of `W`, `top` classes
/// retrieved per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchShape {
    /// Classes retrieved per search (and per block).
    pub top: usize,
    /// Column blocks of `W`, one index each (Algorithm 1: one).
    pub blocks: usize,
}

/// A built estimator with what goes with it.
pub struct Built {
    /// The estimator.
    pub estimator: Box<dyn GradientEstimator>,
    /// The exact loss it computes or approximates.
    pub loss: ExactLoss,
    /// Whether the estimator is that loss's exact gradient (no reference needed).
    pub exact: bool,
    /// The index it searches, for search-based estimators.
    pub search: Option<SearchShape>,
}

impl Built {
    /// An approximate estimator of `loss` that searches no index.
    pub fn sampling(estimator: Box<dyn GradientEstimator>, loss: ExactLoss) -> Self {
        Self { estimator, loss, exact: false, search: None }
    }

    /// The exact gradient of the loss, against which an approximate estimator is measured;
    /// `None` when the estimator is exact itself.
    pub fn reference(&self) -> Option<Box<dyn GradientEstimator>> {
        (!self.exact).then(|| self.loss.exact())
    }
}

/// The exact losses every estimator computes or approximates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExactLoss {
    /// Cross-entropy (LDGS eq. 2).
    Softmax,
    /// Smoothed max-margin (LDGS eq. 10-11).
    Margin(SmoothedMargin),
}

impl ExactLoss {
    /// The loss of `output.loss` (with `output.mu` for the margin).
    pub fn of(kind: LossKind, mu: f32) -> Result<Self, Error> {
        Ok(match kind {
            LossKind::Softmax => Self::Softmax,
            LossKind::Margin => Self::Margin(SmoothedMargin::new(mu)?),
        })
    }

    /// The loss as a trait object.
    pub fn boxed(&self) -> Box<dyn Loss> {
        match *self {
            Self::Softmax => Box::new(Softmax),
            Self::Margin(m) => Box::new(m),
        }
    }

    /// Whether this is the softmax cross-entropy.
    pub fn is_softmax(&self) -> bool {
        matches!(self, Self::Softmax)
    }
}

/// The loss a search-based estimator approximates (`output.loss`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossKind {
    /// Cross-entropy (eq. 2).
    Softmax,
    /// Smoothed max-margin (eq. 10) with `output.mu`.
    #[default]
    Margin,
}

/// How many negatives a sampling estimator draws: `n_samples`, or `sample_fraction` of K.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Negatives {
    /// Negatives per sample (0 = use `sample_fraction`).
    pub n_samples: usize,
    /// Negatives as a fraction of K when `n_samples = 0` (the LDGS paper: 0.01).
    pub sample_fraction: f64,
}

impl Default for Negatives {
    fn default() -> Self {
        Self { n_samples: 0, sample_fraction: 0.01 }
    }
}

impl Negatives {
    /// Checks `sample_fraction` (in (0, 1]).
    pub fn check(&self) -> Result<(), farout_core::ParamError> {
        if !(self.sample_fraction > 0.0 && self.sample_fraction <= 1.0) {
            return Err(farout_core::ParamError::new("sample_fraction", self.sample_fraction, "must be in (0, 1]"));
        }
        Ok(())
    }

    /// The number of negatives for `n_classes` classes (at least one); an error when
    /// `n_samples` is not below K: drawing as many negatives as there are classes costs more
    /// than the exact loss and estimates it worse.
    pub fn count(&self, n_classes: usize) -> Result<usize, Error> {
        if self.n_samples >= n_classes.max(2) {
            return Err(Error::Param(farout_core::ParamError::new(
                "n_samples",
                format!("{} (K = {n_classes} classes)", self.n_samples),
                "must be smaller than K; with that many negatives use the exact estimator \"softmax\"",
            )));
        }
        Ok(if self.n_samples > 0 {
            self.n_samples
        } else {
            ((self.sample_fraction * n_classes as f64) as usize).max(1)
        })
    }
}
