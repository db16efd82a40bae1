//! farout-train: everything between a config file and a trained output layer.
//!
//! - [`config`]: the TOML schema (deny unknown keys, documented defaults, `--set` overrides);
//! - [`data`]: loading the train/test sets a config names (or generating them);
//! - [`metrics`]: P@k, nDCG@k, accuracy and the exact test loss;
//! - [`sinks`]: TensorBoard and JSONL scalar sinks behind one small trait;
//! - [`report`]: progress bars and messages for the user (library code never prints);
//! - [`linear`]: linear extreme classifiers (`[linear]`: DiSMEC, PPDSparse, MEMOIR) with the
//!   same logs and summaries;
//! - [`skipgram`]: skip-gram word embeddings from a config (vocabulary, training, evaluation,
//!   checkpoints, export);
//! - [`checkpoint`]: atomically replaced checkpoint directories;
//! - [`repro`]: reproductions of the papers' experiments (`farout repro ...`);
//! - [`dist`]: one job on several MPI ranks: agreeing on failures and on the config;
//! - [`reshard`]: a network's checkpoint of P ranks cut for another number of ranks;
//! - [`task`]: the three tasks a config trains (classifier, linear, skip-gram) behind one
//!   contract: open, train, load, evaluate, predict, export;
//! - [`train`]: the one entry of `farout train`: checks, locks and trains the config's task;
//! - [`bench`]: micro-benchmarks against same-run references (`farout bench ...`);
//! - [`compare`]: several configs trained side by side, with a table and curves;
//! - [`tune`]: `farout tune`, a search of a config's settings on a validation split;
//! - [`Trainer`]: the training loop with progress bar, periodic evaluation, checkpoints,
//!   resume, divergence detection and the final summary.
#![warn(missing_docs)]

pub mod bench;
pub mod checkpoint;
pub mod compare;
pub mod config;
pub mod data;
pub mod dist;
pub mod estimators;
pub mod guard;
pub mod linear;
pub use farout_core::metrics;
pub mod report;
pub mod repro;
pub mod reshard;
mod run;
pub mod sinks;
pub mod skipgram;
pub use farout_core::stop;
pub mod task;
mod trainer;
pub mod tune;

pub use compare::{CompareOptions, CompareReport, compare};
pub use config::Config;
pub use run::train;
pub use task::{ExportRows, RunSummary, Task, TaskKind, TrainOptions};
pub use trainer::{Selection, Summary, Trainer};

use std::path::PathBuf;

/// Errors of training.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The config file is unreadable or invalid.
    #[error("{}: {error}", path.display())]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong (names the key).
        error: config::ConfigError,
    },
    /// A config value does not fit the data (names the key).
    #[error(transparent)]
    Key(#[from] config::ConfigError),
    /// Data could not be loaded.
    #[error(transparent)]
    Data(#[from] farout_data::Error),
    /// Skip-gram training or its files failed.
    #[error(transparent)]
    SkipGram(#[from] farout_skipgram::Error),
    /// A data file does not fit the training set, its labels or the config.
    #[error("{}: {msg}", path.display())]
    DataMismatch {
        /// The file.
        path: PathBuf,
        /// How it does not fit.
        msg: String,
    },
    /// There is nothing to train on.
    #[error("{0}")]
    NoData(&'static str),
    /// A checkpoint file is not what its run wrote.
    #[error("{}: {msg}", path.display())]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A command-line option is out of range.
    #[error("--{name}: {msg}")]
    Option {
        /// The option, without dashes.
        name: &'static str,
        /// What is allowed.
        msg: String,
    },
    /// The output layer rejected its config or checkpoint.
    #[error(transparent)]
    Layer(#[from] farout_layer::Error),
    /// The encoder rejected its config or weights.
    #[error(transparent)]
    Model(#[from] farout_models::Error),
    /// A linear solver failed, or its model file is invalid.
    #[error(transparent)]
    Linear(#[from] farout_linear::Error),
    /// An estimator parameter is invalid.
    #[error(transparent)]
    Estimator(#[from] farout_estimators::Error),
    /// The run needs more memory or disk than the machine has (checked before allocating).
    #[error(transparent)]
    TooLarge(#[from] farout_core::resources::TooLarge),
    /// The run's directory already holds a run.
    #[error(
        "{} already holds a run ({what}); pass --resume to continue it, --overwrite to replace it, or set log.dir (and checkpoint.dir) to another directory",
        dir.display()
    )]
    RunExists {
        /// The log directory.
        dir: PathBuf,
        /// What is there.
        what: String,
    },
    /// Another process holds the run's lock.
    #[error("{}: another farout run is writing to this directory; wait for it to end or set log.dir (and checkpoint.dir) to another directory", path.display())]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// Training diverged: a non-finite loss or weights, or a loss blown far above its best.
    #[error("training diverged at step {step} ({why}); {kept}; lower the learning rate ({keys})")]
    Diverged {
        /// The step at which it was detected.
        step: u64,
        /// What was seen.
        why: String,
        /// What was kept.
        kept: String,
        /// The config keys to change.
        keys: String,
    },
    /// Training stopped on request ([`stop::request`], e.g. Ctrl-C) after `step` (a network's
    /// steps, skip-gram's words), saying what was kept.
    #[error("training stopped on request after {step} {unit}; {kept}")]
    Interrupted {
        /// The last step taken (or words read).
        step: u64,
        /// `"steps"` or `"words"`.
        unit: &'static str,
        /// What survives: the checkpoint that continues the run, or that nothing does.
        kept: String,
    },
    /// The task cannot answer the request (what to use instead).
    #[error("{0}")]
    Unsupported(&'static str),
    /// A comparison could not be made.
    #[error(transparent)]
    Compare(#[from] compare::CompareError),
    /// Communication between the ranks of an MPI job failed.
    #[error(transparent)]
    Dist(#[from] farout_dist::DistError),
    /// Some ranks of an MPI job failed (`own`: this rank's error, if it is one of them).
    #[error("{}", other_ranks(failed, own.as_deref()))]
    OtherRanks {
        /// The ranks that failed.
        failed: Vec<usize>,
        /// This rank's error.
        own: Option<Box<Error>>,
    },
    /// The ranks of an MPI job loaded different configs.
    #[error(
        "rank 0 and ranks {ranks:?} loaded different configs (file or --set overrides): every rank must run the same command"
    )]
    ConfigMismatch {
        /// The ranks whose config differs from rank 0's.
        ranks: Vec<usize>,
    },
    /// A log, checkpoint or output file could not be written or read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether rank `rank` of an MPI job should print this error: rank 0 always; another rank
    /// only its own error from a step that can fail on one rank alone ([`dist::agree`]), and
    /// only when rank 0 did not fail too.
    pub fn printed_by(&self, rank: usize) -> bool {
        match self {
            _ if rank == 0 => true,
            Error::OtherRanks { failed, own } => own.is_some() && !failed.contains(&0),
            // Errors outside `dist::agree` come from steps every rank takes alike (the config,
            // the command line): rank 0 has said it.
            _ => false,
        }
    }
}

fn other_ranks(failed: &[usize], own: Option<&Error>) -> String {
    let ranks = failed.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
    match own {
        Some(e) if failed.len() == 1 => e.to_string(),
        Some(e) => format!("{e} (ranks {ranks} failed)"),
        None if failed.len() == 1 => format!("rank {ranks} failed (it prints why)"),
        None => format!("ranks {ranks} failed (each prints why)"),
    }
}

/// The error of an I/O failure on `path`.
pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}
