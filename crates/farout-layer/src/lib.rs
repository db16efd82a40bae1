//! farout-layer: the output layer `z = W phi + b` over K classes.
//!
//! One training step on a batch:
//! 1. the [`GradientEstimator`] fills class gradients `g_ik ~ dL_i/dz_k` (dense or sparse);
//! 2. `dL/dphi_i = sum_k g_ik W_k` is computed *before* W changes and handed to the encoder
//!    (the Burn bridge in `farout-models` turns it into an upstream gradient);
//! 3. `dL/dW_k = sum_i g_ik phi_i` and `dL/db_k = sum_i g_ik` update only the touched rows
//!    (all rows for a dense gradient, through one matrix product).
//!
//! A step's gradient is the *sum* over the batch's samples (not the mean): each sample counts as
//! one stochastic step, as in word2vec's per-pair updates, so a row's update does not shrink
//! when more samples share the batch. Scale learning rates with that in mind (AdaGrad is
//! insensitive to it).
//!
//! The optimisers are SGD with the LDGS paper's `1/(1 + t)` cooling and AdaGrad; both apply an
//! optional L2 penalty lazily, to the rows a step touches.
//!
//! With several ranks, [`ShardedLayer`] keeps one rank's rows and combines the ranks' scores by
//! collectives: exact softmax ([`sharded`]), and the search and sampling estimators that
//! evaluate their loss on a candidate set ([`sharded_sparse`]).
//!
//! A MIPS index can be attached ([`OutputLayer::attach_index`]) for search-based estimators:
//! built when first needed, synced and refreshed with the rows that changed, rebuilt every so
//! many steps ([`IndexUpkeep`]) or on request.
#![warn(missing_docs)]

mod layer;
mod layer_file;
mod optim;
pub mod sharded;
mod sharded_layer;
mod sharded_search;
pub mod sharded_sparse;

pub use layer::{INDEX_FILES, IndexUpkeep, LayerInit, OutputLayer, OutputLayerConfig, StepStats};
pub use layer_file::LayerFile;
pub use optim::{Optimizer, OptimizerConfig, UpdateRule};
pub use sharded_layer::ShardedLayer;

use std::path::PathBuf;

/// Errors of the output layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is invalid (the optimiser's parameters, the layer's shape; keys of
    /// the layer's own checks are full paths such as `output.layer.init_std`).
    #[error(transparent)]
    Param(#[from] farout_core::ParamError),
    /// A checkpoint file could not be read or written, or does not match.
    #[error("{}: {msg}", path.display())]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
}

pub use farout_estimators::GradientEstimator;
