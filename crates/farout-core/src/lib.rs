//! farout-core: the pieces every other farout crate shares.
//!
//! - [`Matrix`]: a dense row-major f32 matrix (W of the output layer, feature batches);
//! - [`kernels`]: dot, axpy and friends written for auto-vectorisation, with scalar references;
//! - [`gemm`]: multi-threaded matrix products (the `gemm` crate) over row-major slices;
//! - [`topk`]: top-k selection of scores;
//! - [`metrics`]: the ranking metrics of extreme classification (P@k, nDCG@k, accuracy);
//! - [`SparseVec`], [`ClassId`], [`group_rows`] (a stable counting sort into buckets), seeded
//!   RNG helpers ([`rng`]) and the crate's [`Error`];
//! - [`fuzz`]: what the readers' fuzz tests share (a peak-counting allocator, file mutations);
//! - [`resources`]: the memory and disk space available, to check sizes before allocating.
//! - [`space`]: search spaces, the ranges of plug-in parameters that `farout tune` draws from.
#![warn(missing_docs)]

pub mod alias;
pub mod binio;
pub mod fuzz;
pub mod gemm;
pub mod hugepages;
pub mod kernels;
mod matrix;
pub mod metrics;
mod registry;
pub mod resources;
pub mod rng;
pub mod space;
mod sparse;
pub mod stop;
pub mod topk;
pub mod vexp;

pub use alias::AliasTable;
pub use matrix::Matrix;
pub use rng::Rng;
pub use sparse::{SparseGrad, SparseVec, group_rows};

/// Index of a class (a row of W, a label, a word of the vocabulary).
///
/// `u32` halves the memory of label lists and candidate sets against `usize`; 4 G classes is far
/// beyond what one machine trains.
pub type ClassId = u32;

/// A plug-in's parameter outside its valid range: the key (relative to the plug-in's config
/// section, e.g. `top` in `[output]`, or nested, e.g. `optimizer.lr` in `[model.doc_encoder]`),
/// the value given and what is allowed. The config edge prefixes the section once
/// ([`ParamError::key_and_message`], [`ParamError::under`]).
///
/// Every crate's `check` of its config section returns this one type, built with
/// [`ParamError::new`] (`key = value` and what is allowed) or [`ParamError::message`] (a message
/// that says all, e.g. when the value alone is not the point).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamError {
    /// Parameter name as in the config, relative to its section.
    pub name: std::borrow::Cow<'static, str>,
    /// The value given (`None`: [`ParamError::reason`] is the whole message).
    pub value: Option<String>,
    /// What is allowed (or, without a value, what is wrong).
    pub reason: std::borrow::Cow<'static, str>,
}

impl ParamError {
    /// Parameter `name` has `value`, and `reason` says what is allowed (`"must be > 0"`).
    pub fn new(
        name: impl Into<std::borrow::Cow<'static, str>>,
        value: impl std::fmt::Display,
        reason: impl Into<std::borrow::Cow<'static, str>>,
    ) -> Self {
        Self { name: name.into(), value: Some(value.to_string()), reason: reason.into() }
    }

    /// Parameter `name` is wrong as `message` says (the message names the value if it matters).
    pub fn message(
        name: impl Into<std::borrow::Cow<'static, str>>,
        message: impl Into<std::borrow::Cow<'static, str>>,
    ) -> Self {
        Self { name: name.into(), value: None, reason: message.into() }
    }

    /// The same error with its key nested under `prefix` (`lr` under `optimizer`:
    /// `optimizer.lr`).
    pub fn under(mut self, prefix: &str) -> Self {
        self.name = format!("{prefix}.{}", self.name).into();
        self
    }

    /// The key the error is about and what is wrong with it: `" = 0 must be > 0"` with a value
    /// (the config edge writes ``key `top` = 0 must be > 0``), the message alone without.
    pub fn key_and_message(&self) -> (&str, String) {
        match &self.value {
            Some(value) => (&self.name, format!(" = {value} {}", self.reason)),
            None => (&self.name, self.reason.to_string()),
        }
    }
}

impl std::fmt::Display for ParamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            Some(value) => write!(f, "invalid parameter `{}` = {value}: {}", self.name, self.reason),
            None => write!(f, "invalid `{}`: {}", self.name, self.reason),
        }
    }
}

impl std::error::Error for ParamError {}

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

#[cfg(test)]
mod tests {
    use super::ParamError;

    #[test]
    fn param_error_renders_as_before() {
        let e = ParamError::new("top", 0, "must be > 0");
        assert_eq!(e.to_string(), "invalid parameter `top` = 0: must be > 0");
        assert_eq!(e.key_and_message(), ("top", " = 0 must be > 0".to_string()));
        let e = ParamError::message("d_model", "must be > 0");
        assert_eq!(e.to_string(), "invalid `d_model`: must be > 0");
        assert_eq!(e.key_and_message(), ("d_model", "must be > 0".to_string()));
        let e = ParamError::new("lr", 0, "must be a finite number > 0").under("optimizer");
        assert_eq!(e.key_and_message(), ("optimizer.lr", " = 0 must be a finite number > 0".to_string()));
    }
}
