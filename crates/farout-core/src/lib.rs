//! farout-core: the pieces every other farout crate shares.
//!
//! - [`Matrix`]: a dense row-major f32 matrix (W of the output layer, feature batches);
//! - [`kernels`]: dot, axpy and friends written for auto-vectorisation, with scalar references;
//! - [`gemm`]: multi-threaded matrix products (the `gemm` crate) over row-major slices;
//! - [`topk`]: top-k selection of scores;
//! - [`metrics`]: the ranking metrics of extreme classification (P@k, nDCG@k, accuracy);
//! - [`SparseVec`], [`ClassId`], seeded RNG helpers ([`rng`]) and the crate's [`Error`];
//! - [`fuzz`]: what the readers' fuzz tests share (a peak-counting allocator, file mutations);
//! - [`resources`]: the memory and disk space available, to check sizes before allocating.
#![warn(missing_docs)]

pub mod alias;
pub mod binio;
pub mod fuzz;
pub mod gemm;
pub mod kernels;
mod matrix;
pub mod metrics;
mod registry;
pub mod resources;
pub mod rng;
mod sparse;
pub mod topk;
pub mod vexp;

pub use alias::AliasTable;
pub use matrix::Matrix;
pub use rng::Rng;
pub use sparse::{SparseGrad, SparseVec};

/// Index of a class (a row of W, a label, a word of the vocabulary).
///
/// `u32` halves the memory of label lists and candidate sets against `usize`; 4 G classes is far
/// beyond what one machine trains.
pub type ClassId = u32;

/// A plug-in's parameter outside its valid range: the key (relative to the plug-in's config
/// section, e.g. `top` in `[output]`), the value given and what is allowed. The config edge
/// prefixes the section once ([`ParamError::key_and_message`]).
#[derive(Debug, thiserror::Error)]
#[error("invalid parameter `{name}` = {value}: {reason}")]
pub struct ParamError {
    /// Parameter name as in the config, relative to its section.
    pub name: &'static str,
    /// The value given.
    pub value: String,
    /// What is allowed.
    pub reason: &'static str,
}

impl ParamError {
    /// The key the error is about and what is wrong with it (`" = 0 must be > 0"`).
    pub fn key_and_message(&self) -> (&'static str, String) {
        (self.name, format!(" = {} {}", self.value, self.reason))
    }
}

/// Errors of the core kernels: shape mismatches between operands.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Two operands do not have compatible shapes.
    #[error("shape mismatch in {op}: {detail}")]
    Shape {
        /// The operation that was called.
        op: &'static str,
        /// The shapes that did not fit.
        detail: String,
    },
}
