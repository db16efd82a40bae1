//! farout-data: the data sets farout trains on, how they are read and written, and synthetic
//! generators at the scales of the LDGS paper's experiments.
//!
//! - [`xmc`]: the Extreme Classification Repository sparse format (`N D K` header, then
//!   `l1,l2 f:v f:v` lines), streamed and validated against the header;
//! - [`npy`]: `.npy` dense f32 features and integer labels; [`raw`]: raw little-endian f32;
//!   [`labels`]: text label files (comma-separated ids per line);
//! - [`synth`]: FaceNet-like clustered embeddings and power-law sparse XMC data.
//!
//! Every reader reports errors with the file and, for text formats, the 1-based line.
#![warn(missing_docs)]

pub mod corpus;
mod dataset;
pub mod labels;
pub mod npy;
pub mod raw;
pub mod synth;
pub mod synth_text;
pub mod xmc;

pub use dataset::{Dataset, Features, LabelSets, SparseRows};

use std::path::PathBuf;

/// Errors of the data readers and writers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be opened, read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A line of a text file is malformed.
    #[error("{}:{line}: {msg}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        msg: String,
    },
    /// A binary file has the wrong format, type or shape.
    #[error("{}: {msg}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// Parameters of a generator or reader are invalid.
    #[error("invalid {name}: {msg}")]
    Param {
        /// The parameter.
        name: &'static str,
        /// What is wrong.
        msg: String,
    },
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}
