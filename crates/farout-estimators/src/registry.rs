//! The estimators a config can name: one line each in the list below, everything else beside
//! the estimator.
//!
//! Each estimator module defines its parameter struct (the keys of `[output]` it accepts, with
//! their defaults as serde defaults) and implements [`crate::EstimatorParams`] for it: validation
//! that names the key, and construction for a problem of a given shape. The registry turns the
//! list into [`EstimatorConfig`], the serde enum tagged by `estimator`
//! (`[output] estimator = "ldgs"`), which training, `farout bench` and `farout compare` all build
//! from. Adding an estimator is one new module plus one line in the list below.
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

use crate::{Error, Exact, GradientEstimator, Loss, SmoothedMargin, Softmax};
use serde::{Deserialize, Serialize};

/// What an estimator's parameters can do: check themselves and build the estimator.
pub trait EstimatorParams {
    /// Checks what serde cannot (ranges); errors name the key relative to `[output]`.
    fn check(&self) -> Result<(), Error>;

    /// The exact loss the estimator computes or approximates (its evaluation loss and the
    /// reference of its gradient).
    fn loss(&self) -> Result<ExactLoss, Error>;

    /// Builds the estimator for `problem`.
    fn build(&self, problem: &Problem) -> Result<Built, Error>;
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

    /// Its exact gradient estimator.
    pub fn exact(&self) -> Box<dyn GradientEstimator> {
        match *self {
            Self::Softmax => Box::new(Exact::new(Softmax)),
            Self::Margin(m) => Box::new(Exact::new(m)),
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

farout_core::plugin_registry! {
    /// The gradient estimator of `[output]` (tag `estimator`) with its parameters.
    pub enum EstimatorConfig: EstimatorParams, tag = "estimator" {
        /// Exact cross-entropy (LDGS eq. 2).
        Softmax(crate::exact::SoftmaxConfig) = "softmax",
        /// Exact smoothed max-margin (LDGS eq. 10-11).
        Margin(crate::exact::MarginConfig) = "margin",
        /// Algorithm 1 of the LDGS paper: top-`top` retrieval, the loss on the retrieved scores.
        Mips(crate::mips::MipsConfig) = "mips",
        /// Algorithm 2 of the LDGS paper: block indexes and greedy message passing.
        Ldgs(crate::ldgs::LdgsConfig) = "ldgs",
        /// Sampled softmax (Jean et al. 2015).
        SampledSoftmax(crate::sampled::SampledSoftmaxConfig) = "sampled_softmax",
        /// word2vec's negative sampling (Mikolov et al. 2013).
        NegativeSampling(crate::sampled::NegativeSamplingConfig) = "negative_sampling",
        /// One-vs-Each bound (Titsias 2016).
        Ove(crate::ar::OveConfig) = "ove",
        /// Softmax A&R (Algorithm 1 of the A&R paper).
        ArSoftmax(crate::ar::ArSoftmaxConfig) = "ar_softmax",
        /// Multinomial probit A&R (Algorithm 2).
        ArProbit(crate::ar::ArProbitConfig) = "ar_probit",
        /// Multinomial logistic A&R (Algorithm 2).
        ArLogistic(crate::ar::ArLogisticConfig) = "ar_logistic",
    }
}

impl EstimatorConfig {
    /// Checks the parameters (errors name the key relative to `[output]`).
    pub fn check(&self) -> Result<(), Error> {
        self.params().check()?;
        self.params().loss().map(|_| ())
    }

    /// Builds the estimator for `problem`.
    pub fn build(&self, problem: &Problem) -> Result<Built, Error> {
        self.params().build(problem)
    }

    /// The exact loss the estimator computes or approximates.
    pub fn loss(&self) -> Result<ExactLoss, Error> {
        self.params().loss()
    }
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
    pub fn check(&self) -> Result<(), Error> {
        if !(self.sample_fraction > 0.0 && self.sample_fraction <= 1.0) {
            return Err(Error::Param(farout_core::ParamError {
                name: "sample_fraction",
                value: self.sample_fraction.to_string(),
                reason: "must be in (0, 1]",
            }));
        }
        Ok(())
    }

    /// The number of negatives for `n_classes` classes (at least one); an error when
    /// `n_samples` is not below K: drawing as many negatives as there are classes costs more
    /// than the exact loss and estimates it worse.
    pub fn count(&self, n_classes: usize) -> Result<usize, Error> {
        if self.n_samples >= n_classes.max(2) {
            return Err(Error::Param(farout_core::ParamError {
                name: "n_samples",
                value: format!("{} (K = {n_classes} classes)", self.n_samples),
                reason: "must be smaller than K; with that many negatives use the exact estimator \"softmax\"",
            }));
        }
        Ok(if self.n_samples > 0 {
            self.n_samples
        } else {
            ((self.sample_fraction * n_classes as f64) as usize).max(1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem_counts() -> Vec<u64> {
        vec![5, 3, 0, 1]
    }

    #[test]
    fn every_registered_estimator_builds_with_its_defaults() {
        let counts = problem_counts;
        let problem = Problem { n_classes: 4, n_data: 10, dim: 32, label_counts: &counts };
        for name in EstimatorConfig::NAMES {
            let table = serde_json::json!({ "estimator": name });
            let config: EstimatorConfig = serde_json::from_value(table).unwrap();
            assert_eq!(config.name(), *name);
            config.check().unwrap();
            let built = config.build(&problem).unwrap();
            assert_eq!(built.reference().is_none(), built.exact, "{name}");
            assert_eq!(built.search.is_some(), built.estimator.uses_index(), "{name}");
        }
    }

    #[test]
    fn a_key_of_another_estimator_is_rejected() {
        let e = serde_json::from_value::<EstimatorConfig>(serde_json::json!({ "estimator": "softmax", "top": 5 }))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `top`"), "{e}");
        let e = serde_json::from_value::<EstimatorConfig>(serde_json::json!({ "estimator": "lsh" })).unwrap_err();
        assert!(e.to_string().contains("ldgs"), "{e}");
    }
}
