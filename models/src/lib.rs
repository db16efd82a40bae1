//! farout-models: the Burn networks that compute features `phi(x)` for the output layer.
//!
//! - [`FaceHead`]: a frozen FaceNet-style head (optional linear projection loaded from a file,
//!   then L2 normalisation);
//! - [`DocEncoder`]: one hidden layer over a sparse bag of words, its big input table kept
//!   outside Burn autodiff with sparse row updates;
//! - [`bridge`]: moving matrices in and out of Burn, and handing `dL/dphi` computed by the
//!   output layer to Burn as an upstream gradient.
//!
//! Burn 0.22 selects its backend at run time; [`device`] is the one place that chooses it.
#![warn(missing_docs)]

pub mod bridge;
mod doc_encoder;
mod face_head;

pub use doc_encoder::{Activation, DocEncoder, DocEncoderConfig, DocForward, DocGrads, EncoderRanks, join_dealt};
pub use face_head::{FaceHead, FaceHeadConfig};

use burn::prelude::Device;
use std::path::PathBuf;

/// The CPU device every farout model runs on (plain tensors, no gradient tracking).
///
/// burn-ndarray is deprecated in Burn 0.22 in favour of burn-flex; it is the backend named in the
/// design, and this is the only line to change to switch.
#[allow(deprecated)]
pub fn device() -> Device {
    Device::ndarray()
}

/// The same device with gradient tracking on.
pub fn autodiff_device() -> Device {
    device().autodiff()
}

/// Errors of the models.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A weight file could not be read or has the wrong shape.
    #[error("{}: {msg}", path.display())]
    Weights {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A configuration value is invalid (the key relative to the encoder's table).
    #[error(transparent)]
    Param(#[from] farout_core::ParamError),
}
