//! The experiment config: TOML parsed into plain structs.
//!
//! Every struct denies unknown keys (a misspelled key is an error naming it, never silently
//! ignored) and every field has a documented default, so a config only states what differs.
//! `--set key=value` overrides are applied to the TOML tree before parsing, so they are
//! checked exactly like keys in the file.
//!
//! Paths in a config are relative to the working directory (run farout from the project root).

use farout_data::corpus::TextSpec;
use farout_data::synth::{FaceSpec, XmcSpec};
use farout_data::synth_text::TextGenSpec;
use farout_estimators::EstimatorConfig;
use farout_layer::{IndexUpkeep, OptimizerConfig, OutputLayerConfig};
use farout_linear::SolverConfig;
use farout_models::{DocEncoderConfig, FaceHeadConfig};
use farout_search::IndexConfig;
use farout_skipgram::SkipGramConfig;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A whole experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Name of the run (summaries, log directory). Default: the config file's stem.
    #[serde(default)]
    pub name: String,
    /// Seed of every random choice (initialisation, shuffling, sampling).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Where the data come from.
    pub data: DataConfig,
    /// The network computing features.
    pub model: ModelConfig,
    /// The output layer and its gradient estimator.
    pub output: OutputConfig,
    /// The training loop.
    #[serde(default)]
    pub train: TrainConfig,
    /// Evaluation.
    #[serde(default)]
    pub eval: EvalConfig,
    /// Logs.
    #[serde(default)]
    pub log: LogConfig,
    /// Checkpoints.
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    /// The MIPS index of search-based estimators.
    #[serde(default)]
    pub index: IndexSection,
    /// A linear extreme classifier (`[linear] solver = "dismec" | "ppdsparse" | "memoir"` and
    /// that solver's keys) trained on the data's features instead of a network: such a config
    /// has no `[model]`, `[output]` or `[index]`, and of `[train]` only `threads` applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear: Option<SolverConfig>,
}

fn default_seed() -> u64 {
    1
}

/// Data format of `data.train` / `data.test`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataFormat {
    /// Extreme Classification Repository sparse text (`N D K` header).
    Xmc,
    /// `.npy` f32 features `[N, D]`, labels from `train_labels` / `test_labels`.
    Npy,
    /// Raw little-endian f32 features of dimension `data.dim`, labels as for `npy`.
    Raw,
    /// FaceNet-like embeddings generated in memory from `[data.face]` (no files).
    SyntheticFace,
    /// Sparse multi-label documents generated in memory from `[data.xmc]` (no files).
    SyntheticXmc,
    /// Plain text for word embeddings, one sentence per line (`data.corpus`, tokenised as
    /// `[data.text]` says); only with `model.encoder = "skip_gram"`.
    Text,
}

/// `[data]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// Format of the files (or a synthetic generator).
    pub format: DataFormat,
    /// Training features (xmc: features and labels).
    pub train: Option<PathBuf>,
    /// Test features.
    pub test: Option<PathBuf>,
    /// Training labels for `npy` / `raw` (`.npy` integers or text, one line per sample).
    pub train_labels: Option<PathBuf>,
    /// Test labels for `npy` / `raw`.
    pub test_labels: Option<PathBuf>,
    /// Number of classes K for `npy` / `raw` (0 = one more than the largest label seen).
    pub n_classes: usize,
    /// Feature dimension of `raw` files.
    pub dim: usize,
    /// Scale sparse feature rows to unit L2 norm (after tf-idf weighting, if any).
    pub normalize: bool,
    /// Weight sparse features by their smoothed inverse document frequency in the training set.
    pub tfidf: bool,
    /// Keep only each sample's first label (the A&R paper's treatment of multi-label data for
    /// the single-label estimators `ove` and `ar_*`).
    pub first_label: bool,
    /// Generator parameters for `synthetic_face`.
    pub face: FaceSpec,
    /// Generator parameters for `synthetic_xmc`.
    pub xmc: XmcSpec,
    /// The corpus of `text` (streamed, never loaded whole). Unset: a synthetic corpus from
    /// `[data.synthetic]` is written to `<log dir>/corpus.txt` and used.
    pub corpus: Option<PathBuf>,
    /// The synthetic corpus of `text` when `data.corpus` is unset.
    pub synthetic: TextGenSpec,
    /// Tokenisation, vocabulary and subsampling of `text`.
    pub text: TextSpec,
    /// Set this fraction of the training rows (drawn with `seed`) aside as the set the run
    /// evaluates on, and do not read the test set (0 = off): a validation split, as `farout
    /// tune` searches on. Row data sets only (not `text`).
    pub holdout: f64,
    /// Train on this fraction of the training rows (drawn with `seed`, after `holdout`; 1 =
    /// all): the growing data of a search's early rounds. Row data sets only.
    pub train_fraction: f64,
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            format: DataFormat::Xmc,
            train: None,
            test: None,
            train_labels: None,
            test_labels: None,
            n_classes: 0,
            dim: 0,
            normalize: true,
            tfidf: false,
            first_label: false,
            face: FaceSpec::default(),
            xmc: XmcSpec::default(),
            corpus: None,
            synthetic: TextGenSpec::default(),
            text: TextSpec::default(),
            holdout: 0.0,
            train_fraction: 1.0,
        }
    }
}

impl DataConfig {
    /// The ranges `farout tune` draws from (keys relative to `[data]`): the preprocessing of
    /// sparse rows (tf-idf weighting, row normalisation), which can move P@1 as much as any
    /// solver setting; the subsampling threshold of a corpus. Dense features have none.
    pub fn search_space(&self) -> Vec<farout_core::space::Dim> {
        use farout_core::space::{Dim, Value};
        let both = || vec![Value::Bool(true), Value::Bool(false)];
        match self.format {
            DataFormat::Xmc | DataFormat::SyntheticXmc => {
                vec![Dim::choice("tfidf", both()), Dim::choice("normalize", both())]
            }
            DataFormat::Text => self.text.search_space().into_iter().map(|d| d.under("text")).collect(),
            _ => Vec::new(),
        }
    }
}

/// Which encoder computes `phi(x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EncoderKind {
    /// Frozen FaceNet-style head over dense features.
    FaceHead,
    /// One hidden layer over sparse bags of words.
    DocEncoder,
    /// Skip-gram word embeddings over a text corpus: the encoder is the input-vector table.
    SkipGram,
}

/// `[model]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The encoder.
    pub encoder: EncoderKind,
    /// Its parameters when `encoder = "face_head"`.
    #[serde(default)]
    pub face_head: FaceHeadConfig,
    /// Its parameters when `encoder = "doc_encoder"`.
    #[serde(default)]
    pub doc_encoder: DocEncoderConfig,
    /// Its parameters when `encoder = "skip_gram"`.
    #[serde(default)]
    pub skip_gram: SkipGramConfig,
}

/// `[output]`: the gradient estimator (`output.estimator` and the keys of that estimator, see
/// [`EstimatorConfig`]), the layer and its optimiser.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutputConfig {
    /// The estimator and its parameters (keys of `[output]` beside the ones below).
    #[serde(flatten)]
    pub estimator: EstimatorConfig,
    /// Train the first this many steps with uniform sampled softmax before switching to the
    /// configured estimator (the LDGS paper warms search up by sampling until scores spread).
    #[serde(default)]
    pub warmup_steps: u64,
    /// Negatives per sample of the warm-up (0 = K / 100).
    #[serde(default)]
    pub warmup_samples: usize,
    /// Bias and initialisation of W.
    #[serde(default)]
    pub layer: OutputLayerConfig,
    /// Optimiser of W's rows and the bias.
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    /// Exact softmax on frozen face features: visit the classes this many at a time (0 = all at
    /// once). The class gradients then take `batch x class_chunk` numbers instead of
    /// `batch x K` (per MPI rank: `K / P`), for one more score product per step.
    #[serde(default)]
    pub class_chunk: usize,
}

impl OutputConfig {
    /// Keys of `[output]` that belong to the section, not to the estimator.
    const OWN_KEYS: [&'static str; 5] = ["warmup_steps", "warmup_samples", "layer", "optimizer", "class_chunk"];
}

/// `[train]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Passes over the training data.
    pub epochs: usize,
    /// Samples per step.
    pub batch_size: usize,
    /// Worker threads (0 = one per core).
    pub threads: usize,
    /// Stop after this many steps (0 = no limit).
    pub max_steps: u64,
    /// Stop once this many seconds were spent training (0 = no limit; evaluation excluded):
    /// equal wall-clock budgets for comparisons.
    pub max_seconds: f64,
    /// Log training scalars every this many steps.
    pub log_every: u64,
    /// Which weights a classifier network keeps and reports: `auto` (the best on validation
    /// when the run has a time budget, `train.max_seconds > 0`; else the last step), `best`
    /// (always the best on validation) or `last` (the last step, trained on every row).
    pub select: Select,
    /// The fraction of the training rows (drawn with `seed`) set aside as the validation split
    /// the best weights are chosen on, when the run selects them. With `data.holdout` the
    /// held-out rows are the validation split and none is carved.
    pub valid_fraction: f64,
    /// Stop after this many evaluations in a row without a better validation figure, when the
    /// run selects its best weights (0 = never stop early: run to the budget or the epochs).
    pub patience: u64,
    /// The validation metric the best weights are chosen by (`p@1`, `p@3`, `p@5`, `ndcg@1`,
    /// `ndcg@3`, `ndcg@5`, `accuracy`; `loss`, lower is better).
    pub select_metric: String,
}

/// `train.select`: which step's weights a classifier run keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Select {
    /// The best on validation under a time budget, the last step otherwise.
    #[default]
    Auto,
    /// The best on validation.
    Best,
    /// The last step.
    Last,
}

/// The metrics `train.select_metric` may name (all but `loss` higher is better).
pub const SELECT_METRICS: [&str; 8] = ["p@1", "p@3", "p@5", "ndcg@1", "ndcg@3", "ndcg@5", "accuracy", "loss"];

impl TrainConfig {
    /// The ranges `farout tune` draws from (keys relative to `[train]`): the batch size. The
    /// epochs are the search's budget, not a dimension.
    pub fn search_space(&self) -> Vec<farout_core::space::Dim> {
        use farout_core::space::{Dim, Value};
        vec![Dim::choice("batch_size", [8, 16, 32, 64, 128].into_iter().map(Value::Int).collect())]
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 5,
            batch_size: 64,
            threads: 0,
            max_steps: 0,
            max_seconds: 0.0,
            log_every: 50,
            select: Select::Auto,
            valid_fraction: 0.1,
            patience: 10,
            select_metric: "p@1".into(),
        }
    }
}

/// `[eval]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Evaluate on the test set every this many steps (0 = at the end of each epoch only).
    pub every_steps: u64,
    /// Evaluate on at most this many test samples during training (0 = all).
    pub max_samples: usize,
    /// The final evaluation (the summary's metrics) uses at most this many test samples (0 =
    /// all). Cap it at MegaFace scale, where scoring 940,000 test samples against 672,000
    /// classes exactly takes longer than an epoch of training.
    pub final_max_samples: usize,
    /// Rows scored per evaluation batch.
    pub batch_size: usize,
    /// Skip-gram: analogy questions evaluated after each epoch (e.g.
    /// `../shared/data/eval/questions-words.txt`).
    pub analogy: Option<PathBuf>,
    /// Skip-gram: candidates of the analogy evaluation (the most frequent words; 0 = all).
    pub analogy_restrict: usize,
    /// Skip-gram: word pairs with human similarity scores evaluated after each epoch (e.g.
    /// `../shared/data/eval/wordsim353.tsv`).
    pub similarity: Option<PathBuf>,
    /// Skip-gram: held-out text on which the full-softmax objective is evaluated after each
    /// epoch (a synthetic corpus gets a held-out part generated with it).
    pub heldout: Option<PathBuf>,
    /// Skip-gram: (context, centre) pairs of the held-out text used (0 = no evaluation).
    pub heldout_pairs: usize,
    /// Skip-gram: also evaluate the held-out objective every this many training seconds within
    /// an epoch (0 = after each epoch only), for objective-against-time curves when an epoch is
    /// long (the LDGS paper's Figure 3). Minibatch estimators only: negative sampling and its
    /// warm-up epochs evaluate after each epoch.
    pub every_seconds: f64,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            every_steps: 0,
            max_samples: 0,
            final_max_samples: 0,
            batch_size: 256,
            analogy: None,
            analogy_restrict: 30_000,
            similarity: None,
            heldout: None,
            heldout_pairs: 5_000,
            every_seconds: 0.0,
        }
    }
}

/// `[log]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Directory of the run's logs (default `runs/<name>`).
    pub dir: Option<PathBuf>,
    /// Write TensorBoard event files into `<dir>/tb`.
    pub tensorboard: bool,
    /// Write `<dir>/metrics.jsonl`.
    pub jsonl: bool,
    /// Show a progress bar on the terminal.
    pub progress: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { dir: None, tensorboard: true, jsonl: true, progress: true }
    }
}

/// `[checkpoint]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Directory of the checkpoint (default `<log dir>/checkpoint`).
    pub dir: Option<PathBuf>,
    /// Save every this many steps (0 = at the end of each epoch only).
    pub every_steps: u64,
    /// Whether to save at all.
    pub enabled: bool,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self { dir: None, every_steps: 0, enabled: true }
    }
}

/// `[index]`: the MIPS index of search-based estimators (`index.kind` and the keys of that
/// index, see [`IndexConfig`]) and its upkeep during training.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IndexSection {
    /// The index and its parameters (keys of `[index]` beside the ones below).
    #[serde(flatten)]
    pub index: IndexConfig,
    /// Re-index the rows that changed every this many steps.
    #[serde(default = "default_refresh_every")]
    pub refresh_every: u64,
    /// Rebuild the index from scratch every this many steps (0 = only when it asks, e.g. a row
    /// outgrew its norm bound): refreshes reassign changed rows to clusters fitted on the rows
    /// of the last build, which training leaves behind.
    #[serde(default)]
    pub rebuild_every: u64,
    /// Log the index's recall against brute force every this many steps (0 = never); stale
    /// indexes fail silently, this is how to see it.
    #[serde(default = "default_recall_every")]
    pub recall_every: u64,
    /// Queries (rows of the current batch) used for the recall measurement.
    #[serde(default = "default_recall_queries")]
    pub recall_queries: usize,
}

fn default_refresh_every() -> u64 {
    1
}

fn default_recall_every() -> u64 {
    200
}

fn default_recall_queries() -> usize {
    32
}

impl Default for IndexSection {
    fn default() -> Self {
        Self {
            index: IndexConfig::default(),
            refresh_every: default_refresh_every(),
            rebuild_every: 0,
            recall_every: default_recall_every(),
            recall_queries: default_recall_queries(),
        }
    }
}

impl IndexSection {
    /// Keys of `[index]` that belong to the section, not to the index.
    const OWN_KEYS: [&'static str; 4] = ["refresh_every", "rebuild_every", "recall_every", "recall_queries"];

    /// How training keeps the index up to date.
    pub fn upkeep(&self) -> IndexUpkeep {
        IndexUpkeep { refresh_every: self.refresh_every, rebuild_every: self.rebuild_every }
    }
}

/// What is wrong with a config. Every variant names where: the key (as a dotted path from the
/// top of the file), the `--set` argument, or the line and column of a syntax error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file is not valid TOML (the message has the line and column).
    #[error("{0}")]
    Syntax(String),
    /// A `--set` argument is malformed.
    #[error("--set {arg}: {msg}")]
    Override {
        /// The argument as given.
        arg: String,
        /// What is wrong.
        msg: String,
    },
    /// A key is unknown, has the wrong type or a value out of range, or is missing.
    #[error("key `{key}`{}{msg}", if msg.starts_with(' ') || msg.starts_with(':') { "" } else { ": " })]
    Key {
        /// The dotted key path (`output.top`, `model.doc_encoder.hidden`).
        key: String,
        /// What is wrong, and what is allowed.
        msg: String,
    },
}

impl ConfigError {
    /// An error of key `key`.
    pub fn key(key: impl Into<String>, msg: impl Into<String>) -> Self {
        Self::Key { key: key.into(), msg: msg.into() }
    }

    /// The error of a parameter of section `section` (`output`, `index`, `linear`,
    /// `model.doc_encoder`, `output.optimizer`, `data.text`, ...): every plug-in's and section's
    /// `check` names its key relative to its section, and this prefixes it once.
    pub(crate) fn param(section: &str, e: farout_core::ParamError) -> Self {
        let (key, msg) = e.key_and_message();
        Self::key(format!("{section}.{key}"), msg)
    }
}

impl Config {
    /// More threads than cores only adds contention (and hogwild skip-gram more conflicting
    /// writes): `train.threads` above the core count is lowered to it, with a warning.
    pub(crate) fn limit_threads(&mut self) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if self.train.threads > cores {
            log::warn!(
                "train.threads = {} is more than the {cores} cores of this machine; using {cores}",
                self.train.threads
            );
            self.train.threads = cores;
        }
    }

    /// Parses config text with overrides; the error names the offending key.
    pub fn parse(text: &str, overrides: &[String]) -> Result<Self, ConfigError> {
        let mut table: toml::Table =
            text.parse().map_err(|e: toml::de::Error| ConfigError::Syntax(one_line(&e.to_string())))?;
        for o in overrides {
            apply_override(&mut table, o)?;
        }
        if table.contains_key("linear") {
            // The solver is the model: the network sections do not apply. They are filled with
            // defaults that nothing reads, so the rest of the schema stays one struct.
            for section in ["model", "output", "index"] {
                if table.contains_key(section) {
                    return Err(ConfigError::key(
                        section,
                        "a linear config ([linear]) has no [model], [output] or [index]: the solver is the model",
                    ));
                }
            }
            let mut model = toml::Table::new();
            model.insert("encoder".into(), "doc_encoder".into());
            let mut output = toml::Table::new();
            output.insert("estimator".into(), "softmax".into());
            table.insert("model".into(), model.into());
            table.insert("output".into(), output.into());
        }
        deserialize_at(toml::Value::Table(table))
    }

    /// The files `data.format` needs are named; the synthetic corpus's parameters are valid.
    pub(crate) fn check_format(&self) -> Result<(), ConfigError> {
        let d = &self.data;
        let need = |field: &Option<PathBuf>, key: &str| -> Result<(), ConfigError> {
            match field {
                None => Err(ConfigError::key(
                    format!("data.{key}"),
                    format!("is required with data.format = {:?}", format_name(d.format)),
                )),
                Some(_) => Ok(()),
            }
        };
        if !(0.0..1.0).contains(&d.holdout) {
            return Err(ConfigError::key("data.holdout", format!(" = {} must be in [0, 1)", d.holdout)));
        }
        if !(d.train_fraction > 0.0 && d.train_fraction <= 1.0) {
            return Err(ConfigError::key("data.train_fraction", format!(" = {} must be in (0, 1]", d.train_fraction)));
        }
        if d.format == DataFormat::Text && (d.holdout > 0.0 || d.train_fraction < 1.0) {
            return Err(ConfigError::key(
                "data.holdout",
                "and data.train_fraction split row data sets; a text corpus is held out with eval.heldout",
            ));
        }
        match d.format {
            DataFormat::Xmc => {
                need(&d.train, "train")?;
            }
            DataFormat::Npy | DataFormat::Raw => {
                need(&d.train, "train")?;
                need(&d.train_labels, "train_labels")?;
                if d.test.is_some() {
                    need(&d.test_labels, "test_labels")?;
                }
                if d.format == DataFormat::Raw && d.dim == 0 {
                    return Err(ConfigError::key("data.dim", "must be > 0 with data.format = \"raw\""));
                }
            }
            DataFormat::SyntheticFace | DataFormat::SyntheticXmc => {}
            DataFormat::Text => {
                if d.corpus.is_none() {
                    d.synthetic.check().map_err(|e| ConfigError::param("data.synthetic", e))?;
                }
            }
        }
        Ok(())
    }

    /// `train.select`, `valid_fraction` and `select_metric`: a fraction in (0, 1), a metric a
    /// classifier reports, and `select = "best"` only where a run can select (not skip-gram).
    fn check_selection(&self) -> Result<(), ConfigError> {
        let t = &self.train;
        if !(t.valid_fraction > 0.0 && t.valid_fraction < 1.0) {
            return Err(ConfigError::key("train.valid_fraction", format!(" = {} must be in (0, 1)", t.valid_fraction)));
        }
        if !SELECT_METRICS.contains(&t.select_metric.as_str()) {
            return Err(ConfigError::key(
                "train.select_metric",
                format!(" = {:?}: one of {}", t.select_metric, SELECT_METRICS.join(", ")),
            ));
        }
        if t.select == Select::Best
            && self.model.encoder == EncoderKind::SkipGram
            && !crate::skipgram::has_heldout(self)
        {
            return Err(ConfigError::key(
                "train.select",
                " = \"best\": a skip-gram run keeps its epoch best on held-out text; set eval.heldout (and \
                 eval.heldout_pairs > 0), or use \"auto\" or \"last\"",
            ));
        }
        Ok(())
    }

    /// A text corpus goes with the skip-gram encoder and only with it, and the estimator's own
    /// parameters are valid: the first checks of a network config (classifier or skip-gram).
    pub(crate) fn check_encoder_and_estimator(&self) -> Result<(), ConfigError> {
        if (self.data.format == DataFormat::Text) != (self.model.encoder == EncoderKind::SkipGram) {
            return Err(ConfigError::key(
                "model.encoder",
                "\"skip_gram\" goes with data.format = \"text\" and only with it",
            ));
        }
        self.output.estimator.check().map_err(|e| ConfigError::param("output", e))
    }

    /// The sections every network trains with (`[train]`, `[eval]`, the output layer's
    /// `[output]` and `[index]`): the last checks of a classifier or skip-gram config.
    pub(crate) fn check_training(&self) -> Result<(), ConfigError> {
        let out = &self.output;
        if self.train.epochs == 0 {
            return Err(ConfigError::key(
                "train.epochs",
                "must be >= 1 (0 would write an untrained model; `farout eval` scores a checkpoint)",
            ));
        }
        at_least_one("train.batch_size", self.train.batch_size)?;
        at_least_one("eval.batch_size", self.eval.batch_size)?;
        finite_at_least("train.max_seconds", self.train.max_seconds, 0.0)?;
        self.check_selection()?;
        finite_at_least("eval.every_seconds", self.eval.every_seconds, 0.0)?;
        if self.eval.every_seconds > 0.0
            && (self.model.encoder != EncoderKind::SkipGram || out.estimator.negative_sampling().is_some())
        {
            return Err(ConfigError::key(
                "eval.every_seconds",
                "applies to skip-gram with a minibatch estimator (not negative_sampling, which evaluates \
                 after each epoch); classifiers use eval.every_steps",
            ));
        }
        at_least_one("train.log_every", self.train.log_every as usize)?;
        if out.estimator.needs_no_bias() && out.layer.bias {
            return Err(ConfigError::key(
                "output.layer.bias",
                format!(
                    "must be false with output.estimator = {:?} (the index searches W alone)",
                    out.estimator.name()
                ),
            ));
        }
        if self.model.encoder == EncoderKind::DocEncoder {
            self.model.doc_encoder.check().map_err(|e| ConfigError::param("model.doc_encoder", e))?;
        }
        at_least_one("index.refresh_every", self.index.refresh_every as usize)?;
        if self.index.recall_every > 0 {
            // A recall over no query would be logged as 0 (or NaN), a silent false alarm.
            at_least_one("index.recall_queries", self.index.recall_queries)?;
        }
        self.index.index.check().map_err(|e| ConfigError::param("index", e))?;
        for (key, optimizer) in
            [("output.optimizer", &out.optimizer), ("model.doc_encoder.optimizer", &self.model.doc_encoder.optimizer)]
        {
            optimizer.check().map_err(|e| ConfigError::param(key, e))?;
        }
        Ok(())
    }

    /// Replaces a leading `$FAROUT_DATA` in the data and evaluation paths by [`data_root`].
    pub fn expand_data_paths(&mut self) {
        let (d, e) = (&mut self.data, &mut self.eval);
        let paths = [&mut d.train, &mut d.test, &mut d.train_labels, &mut d.test_labels, &mut d.corpus];
        for p in paths.into_iter().chain([&mut e.analogy, &mut e.similarity, &mut e.heldout]).flatten() {
            *p = expand_data_path(p);
        }
    }

    /// The log directory.
    pub fn log_dir(&self) -> PathBuf {
        self.log.dir.clone().unwrap_or_else(|| PathBuf::from("runs").join(&self.name))
    }

    /// The checkpoint directory.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.checkpoint.dir.clone().unwrap_or_else(|| self.log_dir().join("checkpoint"))
    }

    /// The directory of the weights best on validation, beside the checkpoint directory:
    /// `<checkpoint dir>-best`.
    pub fn best_checkpoint_dir(&self) -> PathBuf {
        let dir = self.checkpoint_dir();
        let mut name = dir.file_name().unwrap_or_default().to_os_string();
        name.push("-best");
        dir.with_file_name(name)
    }

    /// Whether a network run keeps its weights best on validation (`train.select`; `auto`:
    /// under a time budget) rather than its last step's: a classifier on its validation rows, a
    /// skip-gram run on its held-out text (none without). Linear solvers train in one go: never.
    pub fn selects_best(&self) -> bool {
        let skip_gram = self.model.encoder == EncoderKind::SkipGram;
        let network = self.linear.is_none() && (!skip_gram || crate::skipgram::has_heldout(self));
        network
            && match self.train.select {
                Select::Auto => self.train.max_seconds > 0.0,
                Select::Best => true,
                Select::Last => false,
            }
    }

    /// A short description of the task for summaries, e.g. `xmc:bibtex` or `synthetic_face`.
    pub fn task(&self) -> String {
        let stem = |p: &Option<PathBuf>| {
            p.as_ref()
                .and_then(|p| p.parent())
                .and_then(|p| p.file_name())
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        match self.data.format {
            DataFormat::SyntheticFace => format!("synthetic_face:K={}", self.data.face.n_classes),
            DataFormat::SyntheticXmc => format!("synthetic_xmc:K={}", self.data.xmc.n_labels),
            DataFormat::Text => match &self.data.corpus {
                Some(p) => format!("text:{}", p.file_name().map(|s| s.to_string_lossy()).unwrap_or_default()),
                None => format!("synthetic_text:V={},N={}", self.data.synthetic.words, self.data.synthetic.tokens),
            },
            f => format!("{}:{}", format_name(f), stem(&self.data.train)),
        }
    }
}

/// Where the public data sets are: the environment variable `FAROUT_DATA`, or `../shared/data`
/// (relative to the working directory) when it is unset or empty.
pub fn data_root() -> PathBuf {
    match std::env::var_os("FAROUT_DATA") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from("../shared/data"),
    }
}

/// `path` with a leading `$FAROUT_DATA` component replaced by [`data_root`]; other paths as
/// they are. Configs name the public data sets as `$FAROUT_DATA/xmc/bibtex/train.txt`.
pub fn expand_data_path(path: &Path) -> PathBuf {
    match path.strip_prefix("$FAROUT_DATA") {
        Ok(rest) => data_root().join(rest),
        Err(_) => path.to_path_buf(),
    }
}

/// Checks that the value of config key `key` is a finite number `>= min` (NaN is not), else says
/// so naming the key.
fn finite_at_least<T: Copy + Into<f64> + std::fmt::Display>(key: &str, value: T, min: f64) -> Result<(), ConfigError> {
    let v: f64 = value.into();
    if v >= min && v.is_finite() {
        Ok(())
    } else {
        Err(ConfigError::key(key, format!(" = {value} must be a finite number >= {min}")))
    }
}

/// The first key (dotted path) where two TOML trees differ.
pub(crate) fn first_difference(a: &toml::Value, b: &toml::Value, path: &str) -> Option<String> {
    match (a, b) {
        (toml::Value::Table(x), toml::Value::Table(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => first_difference(u, v, &p),
                    _ => Some(p),
                }
            })
        }
        _ if a == b => None,
        _ => Some(path.to_string()),
    }
}

/// The first key (dotted path) where two values of a config section differ.
pub(crate) fn first_difference_key<T: Serialize>(a: &T, b: &T) -> Option<String> {
    let (a, b) = (toml::Value::try_from(a).ok()?, toml::Value::try_from(b).ok()?);
    first_difference(&a, &b, "")
}

/// Checks that the count of config key `key` is at least one.
pub(crate) fn at_least_one(key: &str, value: usize) -> Result<(), ConfigError> {
    if value == 0 { Err(ConfigError::key(key, " must be > 0")) } else { Ok(()) }
}

/// Deserializes `T` from a config tree; the error names the full key path, also inside the
/// tagged sections `[output]` and `[index]`.
fn deserialize_at<T: serde::de::DeserializeOwned>(mut value: toml::Value) -> Result<T, ConfigError> {
    // `[index]` without `kind` is the default index.
    if let Some(toml::Value::Table(index)) = value.get_mut("index") {
        index.entry("kind").or_insert_with(|| IndexConfig::default().name().into());
    }
    serde_path_to_error::deserialize(value.clone()).map_err(|e| {
        let path = e.path().to_string();
        let msg = one_line(&e.into_inner().to_string());
        // serde buffers the tagged sections and loses the key inside them: find it again.
        let inner = match path.as_str() {
            "output" => variant_error(&value, "output", "estimator", &OutputConfig::OWN_KEYS, |tag, de| {
                EstimatorConfig::deserialize_variant(tag, de).map(|_| ())
            }),
            "index" => variant_error(&value, "index", "kind", &IndexSection::OWN_KEYS, |tag, de| {
                IndexConfig::deserialize_variant(tag, de).map(|_| ())
            }),
            "linear" => variant_error(&value, "linear", "solver", &[], |tag, de| {
                SolverConfig::deserialize_variant(tag, de).map(|_| ())
            }),
            _ => None,
        };
        inner.unwrap_or_else(|| {
            let msg = msg.trim_end_matches(&format!(" in `{path}`")).to_string();
            if path == "." { ConfigError::Syntax(msg) } else { ConfigError::key(path, msg) }
        })
    })
}

/// The estimator of an `[output]` section given as `key=value` settings (`--set` syntax, keys
/// relative to `[output]`, e.g. `estimator=ldgs`, `top=1500`): how benches name estimators.
pub fn estimator_from_settings(settings: &[String]) -> Result<EstimatorConfig, ConfigError> {
    #[derive(Deserialize)]
    struct Only {
        output: OutputConfig,
    }
    let only: Only = section_from_settings("output", settings)?;
    only.output.estimator.check().map_err(|e| ConfigError::param("output", e))?;
    Ok(only.output.estimator)
}

/// The index of an `[index]` section given as `key=value` settings (keys relative to
/// `[index]`, e.g. `kind=spherical`, `candidate_factor=10`).
pub fn index_from_settings(settings: &[String]) -> Result<IndexConfig, ConfigError> {
    #[derive(Deserialize)]
    struct Only {
        index: IndexSection,
    }
    let index = section_from_settings::<Only>("index", settings)?.index.index;
    index.check().map_err(|e| ConfigError::param("index", e))?;
    Ok(index)
}

/// A config tree holding only `[section]` with `settings`, deserialized as `T`.
fn section_from_settings<T: serde::de::DeserializeOwned>(section: &str, settings: &[String]) -> Result<T, ConfigError> {
    let mut table = toml::Table::new();
    for s in settings {
        apply_override(&mut table, &format!("{section}.{s}"))?;
    }
    deserialize_at(toml::Value::Table(table))
}

/// The error inside the tagged section `section` of `config` (tag key `tag`, section keys
/// `own`), with its full key path: the variant's parameters are deserialized alone, which serde
/// can follow key by key. `None` when the section itself is the problem (the message of the
/// whole parse says it then).
fn variant_error(
    config: &toml::Value,
    section: &str,
    tag: &str,
    own: &[&str],
    parse: impl FnOnce(&str, serde_path_to_error::Deserializer<'_, '_, toml::Value>) -> Result<(), toml::de::Error>,
) -> Option<ConfigError> {
    let mut table = config.get(section)?.as_table()?.clone();
    let name = table.remove(tag)?;
    let name = name.as_str()?.to_string();
    table.retain(|k, _| !own.contains(&k));
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(toml::Value::Table(table), &mut track);
    let e = parse(&name, de).err()?;
    let path = track.path().to_string();
    let msg = one_line(&e.to_string());
    // A key the variant does not take: name it with the keys it does take.
    if let Some((key, rest)) = msg.strip_prefix("unknown field `").and_then(|m| m.split_once('`')) {
        let takes = match rest.strip_prefix(", expected ") {
            Some(keys) => format!("it takes {keys}"),
            None => "it takes no keys".into(),
        };
        return Some(ConfigError::key(
            format!("{section}.{key}"),
            format!("is not a key of {section}.{tag} = {name:?} ({takes})"),
        ));
    }
    if path == "." {
        return Some(ConfigError::key(format!("{section}.{tag}"), msg));
    }
    let msg = msg.trim_end_matches(&format!(" in `{path}`")).to_string();
    Some(ConfigError::key(format!("{section}.{path}"), msg))
}

fn format_name(f: DataFormat) -> &'static str {
    match f {
        DataFormat::Xmc => "xmc",
        DataFormat::Npy => "npy",
        DataFormat::Raw => "raw",
        DataFormat::SyntheticFace => "synthetic_face",
        DataFormat::SyntheticXmc => "synthetic_xmc",
        DataFormat::Text => "text",
    }
}

fn one_line(s: &str) -> String {
    s.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

/// Sets `a.b.c = value` in `table`; `value` is parsed as TOML (`5`, `0.1`, `true`, `"x"`,
/// `[1, 2]`) and taken as a string when it does not parse.
pub(crate) fn apply_override(table: &mut toml::Table, o: &str) -> Result<(), ConfigError> {
    let bad = |msg: String| ConfigError::Override { arg: o.to_string(), msg };
    let (key, value) = o.split_once('=').ok_or_else(|| bad("expected key=value".into()))?;
    let key = key.trim();
    let value = value.trim();
    let parsed: toml::Value = match format!("v = {value}").parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").expect("the key just parsed"),
        Err(_) => toml::Value::String(value.to_string()),
    };
    let parts: Vec<&str> = key.split('.').collect();
    let mut cur = table;
    for (i, part) in parts.iter().enumerate() {
        if part.is_empty() {
            return Err(bad("empty key segment".into()));
        }
        if i + 1 == parts.len() {
            cur.insert(part.to_string(), parsed);
            return Ok(());
        }
        let entry = cur.entry(part.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = entry.as_table_mut().ok_or_else(|| bad(format!("`{}` is not a table", parts[..=i].join("."))))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        [data]
        format = "synthetic_face"
        [model]
        encoder = "face_head"
        [output]
        estimator = "softmax"
    "#;

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let c = Config::parse(MINIMAL, &[]).unwrap();
        c.check().unwrap();
        assert_eq!(c.train, TrainConfig::default());
        assert_eq!(c.seed, 1);
        assert_eq!(c.data.face, FaceSpec::default());
    }

    const LDGS: &str = r#"
        [data]
        format = "synthetic_face"
        [model]
        encoder = "face_head"
        [output]
        estimator = "ldgs"
    "#;

    fn parse_err(text: &str, overrides: &[&str]) -> String {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        Config::parse(text, &overrides).unwrap_err().to_string()
    }

    fn check_err(text: &str, overrides: &[&str]) -> String {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        Config::parse(text, &overrides).unwrap().check().unwrap_err().to_string()
    }

    fn ldgs(c: &Config) -> &farout_estimators::LdgsConfig {
        match &c.output.estimator {
            EstimatorConfig::Ldgs(p) => p,
            e => panic!("expected ldgs, found {}", e.name()),
        }
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = parse_err(&format!("{MINIMAL}\n[train]\nepoch = 3\n"), &[]);
        assert!(e.contains("key `train.epoch`") && e.contains("unknown field `epoch`") && e.contains("epochs"), "{e}");
        let e = parse_err(MINIMAL, &["output.estimator=lsh"]);
        assert!(e.contains("output.estimator") && e.contains("softmax") && e.contains("margin"), "{e}");
        let e = parse_err(MINIMAL, &["train.batch_size=abc"]);
        assert!(e.contains("train.batch_size"), "{e}");
        let e = parse_err(LDGS, &["output.iterations=forever"]);
        assert!(e.contains("output.iterations") && e.contains("fixed_point"), "{e}");
    }

    #[test]
    fn keys_inside_tagged_sections_are_named() {
        // A key another estimator takes: named, with the keys this one takes.
        let e = parse_err(MINIMAL, &["output.top=5"]);
        assert!(e.contains("key `output.top`") && e.contains("\"softmax\""), "{e}");
        let e = parse_err(LDGS, &["output.topp=5"]);
        assert!(e.contains("key `output.topp`") && e.contains("`top`") && e.contains("`blocks`"), "{e}");
        // A value of the wrong type: the key inside the variant.
        let e = parse_err(LDGS, &["output.top=\"many\""]);
        assert!(e.starts_with("key `output.top`"), "{e}");
        let e = parse_err(MINIMAL, &["index.candidate_factor=\"x\""]);
        assert!(e.starts_with("key `index.candidate_factor`"), "{e}");
        let e = parse_err(MINIMAL, &["index.kind=\"annoy\""]);
        assert!(e.contains("index.kind") && e.contains("spherical") && e.contains("hnsw"), "{e}");
        let e = parse_err(MINIMAL, &["index.kind=\"exact\"", "index.tables=3"]);
        assert!(e.contains("key `index.tables`") && e.contains("\"exact\""), "{e}");
        // Keys of the section itself still go through.
        let c = Config::parse(LDGS, &["output.warmup_steps=3".into(), "index.recall_every=7".into()]).unwrap();
        assert_eq!((c.output.warmup_steps, c.index.recall_every), (3, 7));
        // Range checks of estimator parameters name the key.
        let e = check_err(LDGS, &["output.mu=0"]);
        assert!(e.contains("key `output.mu`"), "{e}");
        let e = check_err(LDGS, &["output.tau2=-1"]);
        assert!(e.contains("key `output.tau2`"), "{e}");
        let e = check_err(MINIMAL, &["output.estimator=\"sampled_softmax\"", "output.sample_fraction=2"]);
        assert!(e.contains("key `output.sample_fraction`"), "{e}");
    }

    #[test]
    fn encoder_and_optimizer_errors_name_the_full_key() {
        let doc = MINIMAL.replace("synthetic_face", "synthetic_xmc").replace("face_head", "doc_encoder");
        let e = check_err(&doc, &["model.doc_encoder.d_model=0"]);
        assert!(e.starts_with("key `model.doc_encoder.d_model`"), "{e}");
        let e = check_err(&doc, &["model.doc_encoder.optimizer={kind=\"sgd\", lr=0}"]);
        assert!(e.starts_with("key `model.doc_encoder.optimizer.lr`"), "{e}");
        let e = check_err(&doc, &["model.doc_encoder.optimizer={kind=\"ar_schedule\"}"]);
        assert!(e.starts_with("key `model.doc_encoder.optimizer.kind`"), "{e}");
        let e = check_err(MINIMAL, &["output.optimizer={kind=\"adagrad\", lr=0.1, eps=0}"]);
        assert!(e.starts_with("key `output.optimizer.eps`"), "{e}");
    }

    /// Every section's `check` returns a `farout_core::ParamError` and [`ConfigError::param`]
    /// prefixes its section: the messages are the ones each section has always written (a
    /// value and its range after ` = `, or a message after `: `).
    #[test]
    fn parameter_errors_of_every_section_keep_their_messages() {
        let doc = MINIMAL.replace("synthetic_face", "synthetic_xmc").replace("face_head", "doc_encoder");
        let text = MINIMAL
            .replace("synthetic_face", "text")
            .replace("face_head", "skip_gram")
            .replace("\"softmax\"", "\"negative_sampling\"");
        let linear = "[data]\nformat = \"synthetic_xmc\"\n[linear]\nsolver = \"memoir\"\n";
        let cases: [(&str, &[&str], &str); 10] = [
            (
                MINIMAL,
                &["output.optimizer={kind=\"sgd\", lr=0.1, decay=-1}"],
                "key `output.optimizer.decay` = -1 must be >= 0",
            ),
            (LDGS, &["output.tau2=-1"], "key `output.tau2` = -1 must be >= 0"),
            (
                LDGS,
                &["index.kind=\"hamming\"", "index.bits=70"],
                "key `index.bits` = 70 must be a multiple of 64 from 64 to 512",
            ),
            (&doc, &["model.doc_encoder.dropout=1.5"], "key `model.doc_encoder.dropout`: 1.5 is not in [0, 1)"),
            (
                &doc,
                &["model.doc_encoder.optimizer={kind=\"sgd\", lr=0}"],
                "key `model.doc_encoder.optimizer.lr`: 0 must be a finite number > 0",
            ),
            (linear, &["linear.eta0=0"], "key `linear.eta0` = 0 must be a finite number > 0 (0.1 in [E])"),
            (
                linear,
                &["linear.oracle={kind=\"hamming\", bits=70}"],
                "key `linear.oracle.bits` = 70 must be a multiple of 64 from 64 to 512",
            ),
            (&text, &["model.skip_gram.lr=0"], "key `model.skip_gram.lr`: 0 must be a finite number > 0"),
            (&text, &["data.text.t=2"], "key `data.text.t`: 2 must be in (0, 1)"),
            (
                &text,
                &["data.synthetic.min_len=0"],
                "key `data.synthetic.max_len`: need 1 <= min_len <= max_len, found 0..25",
            ),
        ];
        for (config, sets, want) in cases {
            assert_eq!(check_err(config, sets), want, "{sets:?}");
        }
    }

    #[test]
    fn syntax_and_override_errors_say_where() {
        let e = parse_err("[data\nformat = 1", &[]);
        assert!(e.contains("line 1"), "{e}");
        let e = parse_err(MINIMAL, &["train.epochs"]);
        assert!(e.starts_with("--set train.epochs") && e.contains("key=value"), "{e}");
        let e = parse_err(MINIMAL, &["data.format.x=3"]);
        assert!(e.contains("`data.format` is not a table"), "{e}");
        let e = parse_err(MINIMAL, &["seed.x=3"]);
        assert!(e.starts_with("key `seed`"), "{e}");
    }

    #[test]
    fn ldgs_iterations_are_steps_or_the_fixed_point() {
        use farout_estimators::Iterations;
        assert_eq!(ldgs(&Config::parse(LDGS, &[]).unwrap()).iterations, Iterations::FixedPoint);
        let c = Config::parse(LDGS, &["output.iterations=3".into()]).unwrap();
        assert_eq!(ldgs(&c).iterations, Iterations::Steps(3));
        let c = Config::parse(&format!("{LDGS}iterations = \"fixed_point\"\n"), &[]).unwrap();
        assert_eq!(ldgs(&c).iterations, Iterations::FixedPoint);
        // A config file takes the strings the command line does (`bench estimator --iterations`).
        let c = Config::parse(&format!("{LDGS}iterations = \"fixed-point\"\n"), &[]).unwrap();
        assert_eq!(ldgs(&c).iterations, Iterations::FixedPoint);
        let c = Config::parse(&format!("{LDGS}iterations = \"4\"\n"), &[]).unwrap();
        assert_eq!(ldgs(&c).iterations, Iterations::Steps(4));
    }

    #[test]
    fn overrides_set_nested_keys() {
        let c = Config::parse(
            MINIMAL,
            &["train.epochs=2".into(), "data.face.n_classes=50".into(), "data.train=x/y.txt".into()],
        )
        .unwrap();
        assert_eq!((c.train.epochs, c.data.face.n_classes), (2, 50));
        assert_eq!(c.data.train, Some(PathBuf::from("x/y.txt")));
    }

    #[test]
    fn check_names_missing_and_inconsistent_keys() {
        let mut c = Config::parse(MINIMAL, &[]).unwrap();
        c.data.format = DataFormat::Npy;
        assert!(c.check().unwrap_err().to_string().contains("data.train"));
        c.data.format = DataFormat::Xmc;
        c.data.train = Some("t.txt".into());
        assert!(c.check().unwrap_err().to_string().contains("model.encoder"));
    }

    #[test]
    fn check_names_bad_spherical_index_parameters() {
        let spherical = "index.kind=\"spherical\"";
        assert!(check_err(MINIMAL, &[spherical, "index.rescore=0.5"]).contains("index.rescore"));
        assert!(check_err(MINIMAL, &[spherical, "index.candidate_factor=0"]).contains("index.candidate_factor"));
        // The default index (`auto`) checks the recall it passes on.
        assert!(check_err(MINIMAL, &["index.recall=0"]).contains("index.recall"));
        // Every index checks its own parameters; the key is named with its section.
        let hnsw = check_err(MINIMAL, &["index.kind=\"hnsw\"", "index.max_connections=1"]);
        assert!(hnsw.contains("index.max_connections") && hnsw.contains("2..=256"), "{hnsw}");
        let lsh = check_err(MINIMAL, &["index.kind=\"simple_lsh\"", "index.bits=40"]);
        assert!(lsh.contains("index.bits") && lsh.contains("0..=31"), "{lsh}");
        assert!(index_from_settings(&["kind=\"simple_lsh\"".into(), "tables=0".into()]).is_err());
        let scoring = parse_err(MINIMAL, &[spherical, "index.scoring=\"int4\""]);
        assert!(scoring.contains("int8") && scoring.contains("f32"), "{scoring}");
    }

    #[test]
    fn section_keys_are_the_struct_fields() {
        // OWN_KEYS, which error reporting strips before reading a variant, are the fields.
        let c = Config::parse(MINIMAL, &[]).unwrap();
        let keys = |v: toml::Value, tag: &str, variant: &[&str]| -> Vec<String> {
            let mut k: Vec<String> =
                v.as_table().unwrap().keys().filter(|k| *k != tag && !variant.contains(&k.as_str())).cloned().collect();
            k.sort();
            k
        };
        let mut own: Vec<String> = OutputConfig::OWN_KEYS.iter().map(|s| s.to_string()).collect();
        own.sort();
        assert_eq!(keys(toml::Value::try_from(&c.output).unwrap(), "estimator", &[]), own);
        let mut own: Vec<String> = IndexSection::OWN_KEYS.iter().map(|s| s.to_string()).collect();
        own.sort();
        let index = toml::Value::try_from(&c.index).unwrap();
        let variant: Vec<String> =
            toml::Value::try_from(&c.index.index).unwrap().as_table().unwrap().keys().cloned().collect();
        let variant: Vec<&str> = variant.iter().map(|s| s.as_str()).collect();
        assert_eq!(keys(index, "kind", &variant), own);
    }
}
