//! farout-estimators: losses over a score vector and the estimators of their gradient.
//!
//! An output layer with weights `W` (K x D, optional bias b) scores a feature vector `phi` as
//! `z = W phi + b`. A [`Loss`] maps `(z, P)` (P = positive classes) to a value and `dL/dz`. A
//! [`GradientEstimator`] produces, for one sample, a loss estimate and a *sparse class gradient*
//! `(k, g_k)` approximating `dL/dz_k`, in whatever time its method allows; the layer then applies
//! `dL/dphi = sum_k g_k W_k` and `dL/dW_k = g_k phi` (ARCHITECTURE.md, "The plug-in contracts").
//!
//! The exact estimators (`softmax`, `margin`) are the references every approximate one is tested
//! against.
//!
//! ```
//! use farout_core::{Matrix, SparseGrad, rng};
//! use farout_estimators::{Ctx, Exact, GradientEstimator, Softmax};
//!
//! let w = Matrix::from_vec(3, 2, vec![1.0, 0.0, 0.0, 1.0, -1.0, 0.0]).unwrap();
//! let est = Exact::new(Softmax);
//! let mut g = SparseGrad::new();
//! let e = est.estimate(&Ctx::new(&w, None), &[0.5, 0.5], &[1], &mut rng::seeded(0, 0), &mut g);
//! assert!(e.loss > 0.0 && g.len() == 3);
//! ```
#![warn(missing_docs)]

mod ar;
mod bisimplex;
mod estimator;
mod exact;
mod ldgs;
mod loss;
mod mips;
mod proposal;
mod registry;
mod sampled;
mod shard;
mod state;

pub use ar::{
    ArLogistic, ArLogisticConfig, ArProbit, ArProbitConfig, ArSoftmax, ArSoftmaxConfig, ArUtility, Gaussian, Logistic,
    Noise, Ove, OveConfig, ove_bound, softmax_elbo, utility_log_prob,
};
pub use bisimplex::project_bisimplex;
pub use estimator::{Batch, BatchEstimate, BatchGrad, Ctx, Estimate, GradientEstimator};
pub use exact::{Exact, MarginConfig, SoftmaxConfig};
pub use ldgs::{ActiveSet, Iterations, Ldgs, LdgsConfig, Rescore, RescoreScratch, complete_scores};
pub use loss::{BinaryLogistic, Loss, LossScratch, SmoothedMargin, Softmax};
pub use mips::{Mips, MipsConfig, dphi_cosine};
pub use proposal::{Draws, Proposal, ProposalKind};
pub use registry::{Built, EstimatorConfig, EstimatorParams, ExactLoss, LossKind, Negatives, Problem, SearchShape};
pub use sampled::{NegativeSampling, NegativeSamplingConfig, SampledSoftmax, SampledSoftmaxConfig};
pub use shard::{Drawn, DrawnLoss, ShardDraw, ShardPlan};
pub use state::SampleState;

/// Errors of estimator construction.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A parameter is outside its valid range.
    #[error(transparent)]
    Param(#[from] farout_core::ParamError),
}

impl Error {
    /// The config key the error is about (relative to `[output]`) and what is wrong with it.
    pub fn key_and_message(&self) -> (&'static str, String) {
        match self {
            Error::Param(e) => e.key_and_message(),
        }
    }
}

/// Rejects a zero for a count that must be at least one (`name` as in the config).
pub(crate) fn at_least_one(name: &'static str, n: usize, reason: &'static str) -> Result<(), Error> {
    if n == 0 {
        return Err(Error::Param(farout_core::ParamError { name, value: "0".into(), reason }));
    }
    Ok(())
}
