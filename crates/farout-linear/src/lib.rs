//! farout-linear: one-vs-all linear extreme classifiers on sparse features.
//!
//! This crate trains DiSMEC (one L2-regularised squared-hinge classifier per label, pruned to a
//! sparse model) with the truncated Newton method of LIBLINEAR >= 2.40 and the
//! mean-separating initialisation (MSI) of Schultheis & Babbar, *Speeding-up one-versus-all
//! training for extreme classification via mean-separating initialization* (\[M\]). It has no
//! Burn dependency, so it builds and tests in seconds. Each module's documentation states the
//! equations it implements, with the papers' numbers, and the choices the papers leave open.
//!
//! - [`data`]: [`TrainSet`] (CSR rows plus the label → samples [`LabelIndex`]), [`DataStats`]
//!   (n, Σx_i, ‖x̄‖², shared by MSI and the stopping rule) and [`FeatureTransform`] (tf-idf, row
//!   normalisation). The bias is an implicit constant feature x_0 = 1, never stored.
//! - [`newton`]: the per-label objective, gradient, Hessian-vector product (eqs. 3–5, 19, 20),
//!   preconditioned CG and line search, exactly as LIBLINEAR's `newton.cpp`.
//! - [`init`]: the [`WeightInit`] trait and its implementations [`Zero`], [`Bias`] and [`Msi`]
//!   (eqs. 21–24).
//! - [`dismec`]: [`DismecConfig`] (`solver = "dismec"`) and [`Dismec`], the label-parallel
//!   trainer (rayon, largest labels first), pruning.
//! - [`ppdsparse`]: [`PpdSparseConfig`] (`solver = "ppdsparse"`), PPDSparse's dual greedy
//!   active-set solver of the elastic-net squared-hinge problem (Yen et al., KDD'17), with the
//!   CSC transpose of X its search walks.
//! - [`memoir`]: [`MemoirConfig`] (`solver = "memoir"`), the Crammer–Singer multiclass SVM by
//!   stochastic subgradient steps with an inexact argmax (Belyy & Sholokhov, \[E\], Alg. 1–2),
//!   lazily scaled dense W.
//! - [`oracle`]: the [`oracle::ArgmaxOracle`] trait (top 2 per query, refresh of changed rows)
//!   and [`oracle::MipsOracle`] over any farout-search index (exact, HNSW, SimpleLSH).
//! - [`model`]: [`SparseModel`] and its checked binary file format.
//! - [`predictor`]: [`Predictor`], the model's feature-major copy that predicts a sample's top
//!   k, labels with equal weights scored once.
//! - [`solver`]: the [`LinearSolver`] trait every solver's parameter struct implements, and
//!   the registry [`SolverConfig`] that `[linear] solver = "..."` selects from.
//!
//! What is reused rather than written here: CSR rows, the XMC reader, idf weights and row
//! normalisation come from `farout-data` ([`farout_data::SparseRows`], [`farout_data::xmc`]);
//! top-k selection from [`farout_core::topk`]; the model file checksum is CRC-32 from the
//! `crc32fast` crate; parallelism is rayon's. DiSMEC needs no column-major copy of X (every
//! product walks rows of the active set), so none is built.
//!
//! ```
//! use farout_data::{LabelSets, SparseRows};
//! use farout_linear::{Dismec, DismecConfig, TrainSet};
//!
//! // Two features; label 0 goes with feature 0, label 1 with feature 1.
//! let mut x = SparseRows::new(2);
//! let mut y = LabelSets::new(2);
//! for i in 0..20 {
//!     let f = (i % 2) as u32;
//!     x.push_row(&[f], &[1.0]);
//!     y.push(&[f]);
//! }
//! let data = TrainSet::new(x, &y).unwrap();
//! let trained = Dismec::new(&DismecConfig::default()).unwrap().train(&data).unwrap();
//! let predictor = trained.model.predictor();
//! let (mut scores, mut hits) = (Vec::new(), Vec::new());
//! predictor.top_k(&[1], &[1.0], 1, &mut scores, &mut hits);
//! assert_eq!(hits[0].class, 1);
//! ```
#![warn(missing_docs)]

pub mod contract;
pub mod data;
pub mod dismec;
pub mod init;
pub mod memoir;
pub mod model;
pub mod newton;
pub mod oracle;
pub mod ova;
pub mod ppdsparse;
pub mod predictor;
pub mod solver;

pub use contract::{FitSummary, Fitted, LinearSolver, Progress, Silent};
pub use data::{DataStats, FeatureTransform, FittedTransform, LabelIndex, TrainSet};
pub use dismec::{Dismec, DismecConfig, InitKind, TrainReport, Trained};
pub use init::{Bias, FromModel, InitContext, Msi, WeightInit, Zero};
pub use memoir::MemoirConfig;
pub use model::{ModelFileError, SparseModel};
pub use newton::LabelStats;
pub use ppdsparse::PpdSparseConfig;
pub use predictor::Predictor;
pub use solver::SolverConfig;

use std::path::PathBuf;

/// Errors of farout-linear.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A parameter of `[linear]` is out of range.
    #[error(transparent)]
    Param(#[from] farout_core::ParamError),
    /// Reading the data failed.
    #[error(transparent)]
    Data(#[from] farout_data::Error),
    /// Features and labels (or a model and its input) do not fit together.
    #[error("shape mismatch in {what}: {detail}")]
    Shape {
        /// What was being combined.
        what: &'static str,
        /// The sizes that did not fit.
        detail: String,
    },
    /// A model file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A collective operation between MPI ranks failed (a solver trained on several ranks).
    #[error(transparent)]
    Dist(#[from] farout_dist::DistError),
    /// A model file is not a valid farout-linear model.
    #[error("{}: not a valid farout-linear model: {problem}", path.display())]
    ModelFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        problem: ModelFileError,
    },
    /// A warm start asked of a solver that cannot take one, or with a model that does not fit.
    #[error("warm start: {why}")]
    NoWarmStart {
        /// Why not.
        why: &'static str,
    },
    /// Fitting stopped on request ([`farout_core::stop`], e.g. Ctrl-C); a partial model would
    /// predict only some labels, so none is kept.
    #[error("fitting stopped on request after {done} of {total} {unit}; no model was kept")]
    Interrupted {
        /// Units of work finished.
        done: usize,
        /// Units of work of the whole fit.
        total: usize,
        /// `"labels"` or `"batches"`.
        unit: &'static str,
    },
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
pub(crate) mod testutil;
