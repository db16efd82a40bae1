//! farout-estimators: losses over a score vector and the estimators of their gradient.
//!
//! An output layer with weights `W` (K x D, optional bias b) scores a feature vector `phi` as
//! `z = W phi + b`. A [`Loss`] maps `(z, P)` (P = positive classes, N = the others) to a value
//! and `dL/dz`. A [`GradientEstimator`] produces, for one sample, a loss estimate and a *sparse
//! class gradient* `(k, g_k)` approximating `dL/dz_k`, in whatever time its method allows; the
//! layer then applies
//!
//! ```text
//! dL/dphi = sum_k g_k W_k      (handed back to the encoder)
//! dL/dW_k = g_k phi            (a sparse row update: only classes with g_k != 0 move)
//! dL/db_k = g_k
//! ```
//!
//! (ARCHITECTURE.md, "The plug-in contracts"). The exact estimators (`softmax`, `margin`) are
//! the references every approximate one is tested against: against the exact gradient, or for
//! unbiased ones against the exact expectation over many seeds.
//!
//! The estimators a config can name (`[output] estimator = "..."`), each with the module that
//! states its maths and the source of the method:
//!
//! - `softmax` (`exact.rs`, `loss.rs`): the exact cross-entropy, LDGS paper eq. 2,
//!   `L = sum_{p in P} (log sum_j exp(z_j) - z_p)`, `dL/dz_k = |P| softmax(z)_k - [k in P]`.
//! - `margin` (`exact.rs`, `loss.rs`, `bisimplex.rs`): the exact smoothed max-margin, LDGS eq.
//!   10-11, `L = max_{a in C} <z + 1_N, a> - (mu/2) |a|^2`, `dL/dz = proj_C((z + 1_N) / mu)`.
//! - `mips` (`mips.rs`): LDGS Algorithm 1, the loss on the scores of the top Q retrieved classes
//!   and the positives, no gradient elsewhere.
//! - `ldgs` (`ldgs.rs`): LDGS Algorithm 2 (Theorem 1, eq. 12), B column blocks searched apart,
//!   `g = (1/B) sum_j dL(B (z_j + lambda_j))` with message passing on the `lambda_j`.
//! - `sampled_softmax` (`sampled.rs`, `proposal.rs`): Jean et al. 2015, eq. 2 over the
//!   positives and sampled classes, every logit corrected by `-log E_c`.
//! - `negative_sampling` (`sampled.rs`): Mikolov et al. 2013,
//!   `L = -sum_{p in P} log sigma(z_p) - sum_j log sigma(-z_{k_j})`.
//! - `ove` (`ar.rs`): the One-vs-Each bound, A&R paper eq. 10 (Titsias 2016).
//! - `ar_softmax` (`ar.rs`): A&R Algorithm 1 on the bound of eq. 8.
//! - `ar_probit`, `ar_logistic` (`ar.rs`): A&R Algorithm 2 on the ELBO of eq. 7.
//!
//! The other modules: `estimator.rs` (the contract and its batch types), `registry.rs` (the
//! parameter structs a config selects), `shard.rs` (candidate sets on a class-sharded layer) and
//! `state.rs` (A&R's per-sample variational state).
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
mod contract;
mod estimator;
mod exact;
mod ldgs;
mod loss;
mod mips;
mod proposal;
mod registry;
mod sampled;
mod shard;
mod slots;
mod state;
mod tiled;

pub use ar::{
    ArLogistic, ArLogisticConfig, ArProbit, ArProbitConfig, ArSoftmax, ArSoftmaxConfig, ArUtility, Gaussian, Logistic,
    Noise, Ove, OveConfig, ove_bound, softmax_elbo, utility_log_prob,
};
pub use bisimplex::project_bisimplex;
pub use contract::{Built, EstimatorParams, ExactLoss, LossKind, Negatives, Problem, SearchShape};
pub use estimator::{Batch, BatchEstimate, BatchGrad, Ctx, Estimate, GradientEstimator};
pub use exact::{Exact, MarginConfig, SoftmaxConfig};
pub use ldgs::{
    ActiveSet, Iterations, Ldgs, LdgsConfig, Rescore, RescoreScratch, complete_scores, completes_whole_row,
};
pub use loss::{BinaryLogistic, Loss, LossScratch, SmoothedMargin, Softmax};
pub use mips::{Mips, MipsConfig, dphi_cosine};
pub use proposal::{Draws, Proposal, ProposalKind};
pub use registry::EstimatorConfig;
pub use sampled::{NegativeSampling, NegativeSamplingConfig, SampledSoftmax, SampledSoftmaxConfig};
pub use shard::{Drawn, DrawnLoss, ShardDraw, ShardPlan};
pub use slots::{FewSlots, Slots};
pub use state::SampleState;
pub use tiled::{LogSumExp, TiledGradient};

/// Errors of estimator construction.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A parameter is outside its valid range.
    #[error(transparent)]
    Param(#[from] farout_core::ParamError),
}

impl From<Error> for farout_core::ParamError {
    fn from(e: Error) -> Self {
        match e {
            Error::Param(e) => e,
        }
    }
}

impl Error {
    /// The config key the error is about (relative to `[output]`) and what is wrong with it.
    pub fn key_and_message(&self) -> (&str, String) {
        match self {
            Error::Param(e) => e.key_and_message(),
        }
    }
}

/// Rejects a zero for a count that must be at least one (`name` as in the config).
pub(crate) fn at_least_one(name: &'static str, n: usize, reason: &'static str) -> Result<(), Error> {
    if n == 0 {
        return Err(Error::Param(farout_core::ParamError::new(name, 0, reason)));
    }
    Ok(())
}
