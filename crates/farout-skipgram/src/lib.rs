//! farout-skipgram: word embeddings by skip-gram (Mikolov et al. 2013), the LDGS paper's
//! third application (Section 2 item 3, Section 5.3).
//!
//! - [`sgns`]: negative sampling trained word2vec-style, lock-free over threads that stream
//!   ranges of the corpus in turn ([`hogwild`] holds the shared tables);
//! - [`batch`]: any other gradient estimator (exact or sampled softmax, MIPS, LDGS, A&R) on
//!   the same pairs, in minibatches through farout's output layer;
//! - [`collapsed`]: the paper's collapsed objective (eq. 9) from co-occurrence counts, and
//!   gradient descent on it with exact, MIPS or LDGS softmax gradients (GD, GD-MIPS,
//!   GD-Decomp-MIPS);
//! - [`subwords`]: fastText's character n-grams, hashed into extra input rows;
//! - [`pairs`]: text to (context, centre) pairs, shared by both trainers;
//! - [`vectors`]: word2vec text and binary files (gensim reads them);
//! - [`eval`]: analogy accuracy and similarity correlation;
//! - [`nearest`]: the nearest words of a word or vector by cosine, through a search index.
//!
//! The corpus, its vocabulary and subsampling live in `farout_data::corpus`. No Burn here: the
//! model is two embedding tables (input vectors `U` and output vectors `V`, the output layer's W).
#![warn(missing_docs)]

pub mod batch;
pub mod collapsed;
pub mod eval;
pub mod hogwild;
pub mod nearest;
pub mod pairs;
pub mod sgns;
pub mod subwords;
pub mod vectors;

/// Time between progress reports of every trainer.
pub(crate) const REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

use farout_core::rng::RngExt;
use farout_core::{Matrix, ParamError, rng};
use serde::{Deserialize, Serialize};

/// How concurrent row updates are done (see [`hogwild`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hogwild {
    /// Relaxed atomics: updates can be lost, as in any Hogwild scheme, but no data race.
    #[default]
    Atomic,
    /// Plain loads and stores, as word2vec: a data race, so undefined behaviour under Rust's
    /// memory model; opt in only for its speed (figures in [`hogwild`]).
    Racy,
}

/// Which word predicts which (`model.skip_gram.mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Skip-gram: every context word predicts the centre word, one pair at a time.
    #[default]
    SkipGram,
    /// Continuous bag of words: the mean of the window's input vectors predicts the centre
    /// word, one step per centre (word2vec's and fastText's `cbow`; negative sampling only).
    Cbow,
}

/// Which form of the skip-gram objective the estimators other than negative sampling train.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// One SGD step per minibatch of (context, centre) pairs ([`batch`]).
    #[default]
    Pairs,
    /// Gradient descent on the LDGS paper's collapsed objective, eq. 9: a step per batch of
    /// context words with their co-occurrence counts ([`collapsed`]).
    Collapsed,
}

/// How gradient descent on the collapsed objective moves the two tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Updates {
    /// As the LDGS paper (Section 5.3): each epoch is a pass that updates the input vectors
    /// with the output vectors fixed, then a pass that updates the output vectors with the
    /// input vectors fixed (twice the gradient estimates of `simultaneous` per epoch; the
    /// search index stays exact during the first pass).
    #[default]
    Alternating,
    /// Each step updates both tables from the same gradient (one pass per epoch).
    Simultaneous,
}

/// The skip-gram model and its schedule (`[model.skip_gram]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SkipGramConfig {
    /// Skip-gram or CBOW.
    pub mode: Mode,
    /// Vector dimension.
    pub dim: usize,
    /// Maximum window: each centre word uses a window drawn uniformly from 1..=window.
    pub window: usize,
    /// Initial step size (word2vec: 0.025).
    pub lr: f32,
    /// Final step size: the step falls linearly to it over all epochs (gensim: 1e-4).
    pub min_lr: f32,
    /// Memory model of the lock-free updates.
    pub hogwild: Hogwild,
    /// Input vectors start uniform in `[-init_range/dim, init_range/dim)`: 1 as gensim 4, 0.5 as
    /// word2vec's C code.
    pub init_range: f32,
    /// Estimators other than negative sampling: train the objective per pair (`pairs`) or in
    /// the collapsed form (`collapsed`, the paper's GD, GD-MIPS and GD-Decomp-MIPS).
    pub objective: Objective,
    /// The collapsed objective only: alternating or simultaneous updates of the two tables.
    pub updates: Updates,
    /// Estimators other than negative sampling: train this many epochs with negative sampling
    /// first (the LDGS paper starts search-based methods from one epoch of it).
    pub ns_warmup_epochs: usize,
    /// Shortest character n-gram of the subword vectors ([`subwords`]).
    pub minn: usize,
    /// Longest character n-gram; 0 (the default) trains one vector per word, without subwords.
    pub maxn: usize,
    /// Rows the n-grams are hashed into (fastText: 2,000,000).
    pub buckets: usize,
}

impl Default for SkipGramConfig {
    fn default() -> Self {
        Self {
            mode: Mode::SkipGram,
            dim: 100,
            window: 5,
            lr: 0.025,
            min_lr: 1e-4,
            hogwild: Hogwild::default(),
            init_range: 1.0,
            objective: Objective::Pairs,
            updates: Updates::Alternating,
            ns_warmup_epochs: 0,
            minn: 3,
            maxn: 0,
            buckets: 2_000_000,
        }
    }
}

impl SkipGramConfig {
    /// The ranges `farout tune` draws from (keys relative to `[model.skip_gram]`): the step
    /// size log-uniformly around word2vec's 0.025, the window, and (with subword vectors,
    /// `maxn > 0`) the n-gram lengths as fastText's pairs.
    pub fn search_space(&self) -> Vec<farout_core::space::Dim> {
        use farout_core::space::{Dim, Value};
        let mut space = vec![Dim::float_log("lr", 0.005, 0.1), Dim::int("window", 2, 10, false)];
        if self.maxn > 0 {
            space.push(Dim::choice("minn", vec![Value::Int(2), Value::Int(3)]));
            space.push(Dim::choice("maxn", vec![Value::Int(5), Value::Int(6)]));
        }
        space
    }

    /// Checks the values; errors name the key relative to `[model.skip_gram]`.
    pub fn check(&self) -> Result<(), ParamError> {
        let bad = |key, msg: String| Err(ParamError::message(key, msg));
        if self.dim == 0 {
            return bad("dim", "must be >= 1".into());
        }
        if !(self.init_range >= 0.0 && self.init_range.is_finite()) {
            return bad("init_range", format!("{} must be a finite number >= 0", self.init_range));
        }
        if self.window == 0 {
            return bad("window", "must be >= 1".into());
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return bad("lr", format!("{} must be a finite number > 0", self.lr));
        }
        if !(self.min_lr >= 0.0 && self.min_lr <= self.lr) {
            return bad("min_lr", format!("{} must be in [0, lr]", self.min_lr));
        }
        if self.maxn > 0 {
            if !(1..=self.maxn).contains(&self.minn) {
                return bad("minn", format!("{} must be in 1..=maxn ({})", self.minn, self.maxn));
            }
            if self.buckets == 0 || self.buckets > 1 << 30 {
                return bad("buckets", format!("{} must be in 1..=2^30 with maxn > 0", self.buckets));
            }
        }
        Ok(())
    }

    /// The n-gram settings.
    pub fn ngrams(&self) -> subwords::NgramSpec {
        subwords::NgramSpec { minn: self.minn, maxn: self.maxn, buckets: self.buckets }
    }
}

/// The two tables: input vectors `U` (what is exported) and output vectors `V`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Embeddings {
    /// `U`, one row per word, then one per n-gram bucket (see [`subwords`]).
    pub input: Matrix,
    /// `V`, one row per word (the output layer's W).
    pub output: Matrix,
}

impl Embeddings {
    /// word2vec's initialisation: `U` uniform in `[-range/dim, range/dim)` with
    /// `input_rows` rows (the words', then any n-gram buckets'), `V = 0` with one row per word.
    pub fn init(input_rows: usize, words: usize, dim: usize, range: f32, seed: u64) -> Self {
        // Training reads both tables at random rows: huge pages spare it most TLB misses.
        let (mut input, mut output) = (Matrix::zeros(input_rows, dim), Matrix::zeros(words, dim));
        farout_core::hugepages::advise(input.as_mut_slice());
        farout_core::hugepages::advise(output.as_mut_slice());
        let mut r = rng::seeded(seed, u64::MAX);
        for x in input.as_mut_slice() {
            *x = (2.0 * r.random::<f32>() - 1.0) * range / dim as f32;
        }
        Self { input, output }
    }
}

/// Errors of skip-gram training and of the vector files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A parameter is invalid.
    #[error(transparent)]
    Param(#[from] ParamError),
    /// Words and vectors do not fit together (counts, dimensions, a word given twice).
    #[error("vectors: {msg}")]
    Vectors {
        /// What is wrong.
        msg: String,
    },
    /// The loss became NaN or infinite.
    #[error("training diverged (non-finite loss) in epoch {epoch} after {words} words; lower model.skip_gram.lr")]
    Diverged {
        /// The epoch (0-based).
        epoch: usize,
        /// Words read when it was noticed.
        words: u64,
    },
    /// A file could not be read or written, or is malformed (names the file, and the line of
    /// text files).
    #[error(transparent)]
    Data(#[from] farout_data::Error),
}

/// The error of an I/O failure on `path`.
pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Data(farout_data::Error::Io { path: path.to_path_buf(), source })
}

/// The error of a malformed line (1-based) of a text file.
pub(crate) fn parse_err(path: &std::path::Path, line: usize, msg: impl Into<String>) -> Error {
    Error::Data(farout_data::Error::Parse { path: path.to_path_buf(), line, msg: msg.into() })
}

/// The error of a malformed binary file.
pub(crate) fn format_err(path: &std::path::Path, msg: impl Into<String>) -> Error {
    Error::Data(farout_data::Error::Format { path: path.to_path_buf(), msg: msg.into() })
}
