//! farout-data: the data sets farout trains on, how they are read and written, and synthetic
//! generators at the scales of the LDGS paper's experiments.
//!
//! - [`xmc`]: the Extreme Classification Repository sparse format (`N D K` header, then
//!   `l1,l2 f:v f:v` lines), streamed and validated against the header;
//! - [`npy`]: `.npy` dense f32 features and integer labels; [`raw`]: raw little-endian f32;
//!   [`labels`]: text label files (comma-separated ids per line);
//! - [`synth`]: FaceNet-like clustered embeddings and power-law sparse XMC data.
//!
//! Every reader reports errors with the file and, for text formats, the 1-based line, and never
//! panics. Sizes read from a file (a header's counts, a `.npy` shape) are checked against the
//! file's length with [`check_len`] before anything is sized by them, so a corrupt header is an
//! error rather than an allocation of terabytes; `tests/fuzz_readers.rs` checks both promises.
#![warn(missing_docs)]

pub mod corpus;
mod dataset;
pub mod labels;
pub mod npy;
pub mod raw;
pub mod synth;
pub mod synth_text;
pub mod word_ids;
pub mod xmc;

pub use dataset::{Dataset, Features, LabelSets, SparseRows};

use std::path::{Path, PathBuf};

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
    /// Parameters of a generator or reader are invalid (built with [`ParamError::message`]
    /// and written, as the readers always have, without quotes: `invalid data.dim: ...`).
    ///
    /// [`ParamError::message`]: farout_core::ParamError::message
    #[error("invalid {}: {}", .0.name, .0.reason)]
    Param(#[from] farout_core::ParamError),
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}

/// Checks that a file of `have` bytes holds the `needed` bytes its header implies (`None`: the
/// size overflowed u64), before anything is sized by the header. `what` names what needs them,
/// e.g. "a header of 1000 samples (a line each)"; `line` is the header's line in a text file.
///
/// ```
/// # use std::path::Path;
/// let e = farout_data::check_len(Path::new("x.txt"), Some(1), Some(1000), 12, "a header of 1000 samples");
/// assert_eq!(e.unwrap_err().to_string(), "x.txt:1: a header of 1000 samples needs at least 1000 bytes but the file has 12");
/// ```
pub fn check_len(path: &Path, line: Option<usize>, needed: Option<u64>, have: u64, what: &str) -> Result<()> {
    if needed.is_some_and(|n| n <= have) {
        return Ok(());
    }
    let needed = match needed {
        Some(n) => format!("at least {n}"),
        None => format!("more than {}", u64::MAX),
    };
    let msg = format!("{what} needs {needed} bytes but the file has {have}");
    let path = path.to_path_buf();
    Err(match line {
        Some(line) => Error::Parse { path, line, msg },
        None => Error::Format { path, msg },
    })
}

/// Checks that the values of a matrix read from `path` (`cols` values per row) are all
/// finite: one policy for every reader of vectors, which refuses NaN and infinities where they
/// enter, naming the file and the first bad row (0-based, as numpy indexes it) and column,
/// rather than letting them reach an index, a solver or a metric that trusts them.
///
/// ```
/// # use std::path::Path;
/// let e = farout_data::check_finite(Path::new("x.npy"), &[1.0, 2.0, f32::NAN, 0.0], 2);
/// assert_eq!(e.unwrap_err().to_string(), "x.npy: row 1, column 0 holds NaN (1 of 4 values are not finite); farout refuses NaN and infinite values");
/// ```
pub fn check_finite(path: &Path, values: &[f32], cols: usize) -> Result<()> {
    let Some(first) = values.iter().position(|v| !v.is_finite()) else { return Ok(()) };
    let bad = values[first..].iter().filter(|v| !v.is_finite()).count();
    let cols = cols.max(1);
    let msg = format!(
        "row {}, column {} holds {} ({bad} of {} values are not finite); farout refuses NaN and infinite values",
        first / cols,
        first % cols,
        values[first],
        values.len()
    );
    Err(Error::Format { path: path.to_path_buf(), msg })
}

/// Capacity of a read buffer for `len` bytes: [`READ_BUFFER`] or less for a smaller file.
pub(crate) fn buffer_len(len: u64) -> usize {
    len.clamp(1, READ_BUFFER as u64) as usize
}

/// Size of the readers' buffers (large reads keep the disk streaming).
pub(crate) const READ_BUFFER: usize = 1 << 20;
