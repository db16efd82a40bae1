//! The experiment config: TOML parsed into plain structs.
//!
//! Every struct denies unknown keys (a misspelled key is an error naming it, never silently
//! ignored) and every field has a documented default, so a config only states what differs.
//! `--set key=value` overrides are applied to the TOML tree before parsing, so they are
//! checked exactly like keys in the file.
//!
//! Paths in a config are relative to the working directory (run farout from the project root).

use crate::Error;
use farout_data::corpus::TextSpec;
use farout_data::synth::{FaceSpec, XmcSpec};
use farout_data::synth_text::TextGenSpec;
use farout_layer::{OptimizerConfig, OutputLayerConfig};
use farout_models::{DocEncoderConfig, FaceHeadConfig};
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

/// The gradient estimators available from config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EstimatorKind {
    /// Exact cross-entropy (LDGS eq. 2).
    Softmax,
    /// Exact smoothed max-margin (LDGS eq. 10-11) with `output.mu`.
    Margin,
    /// Algorithm 1 of the LDGS paper: top-`output.top` retrieval from `[index]`, `output.loss`
    /// on the retrieved scores.
    Mips,
    /// Sampled softmax with `output.n_samples` negatives from `output.proposal`.
    SampledSoftmax,
    /// word2vec's negative sampling with `output.n_samples` negatives from `output.proposal`
    /// (unigram^0.75 by default).
    NegativeSampling,
    /// One-vs-Each bound (Titsias 2016) with `output.n_samples` uniform negatives.
    Ove,
    /// Softmax A&R (Algorithm 1 of the A&R paper) with `output.n_samples` uniform negatives.
    ArSoftmax,
    /// Multinomial probit A&R (Algorithm 2).
    ArProbit,
    /// Multinomial logistic A&R (Algorithm 2).
    ArLogistic,
    /// Algorithm 2 of the LDGS paper: `output.blocks` block indexes, top-`output.top` per block,
    /// `output.iterations` steps of greedy message passing, `output.loss`.
    Ldgs,
}

/// The loss a search-based estimator approximates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossKind {
    /// Cross-entropy (eq. 2).
    Softmax,
    /// Smoothed max-margin (eq. 10) with `output.mu`.
    #[default]
    Margin,
}

/// `[output]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    /// The gradient estimator.
    pub estimator: EstimatorKind,
    /// Smoothing of the margin loss (the paper: 1 for multiclass, 5 for multilabel).
    #[serde(default = "default_mu")]
    pub mu: f32,
    /// Loss approximated by `mips`.
    #[serde(default)]
    pub loss: LossKind,
    /// Classes retrieved per sample by `mips` (0 = K / 100, the paper's batch query).
    #[serde(default)]
    pub top: usize,
    /// Negatives per sample of the sampling estimators and of the warm-up (0 = use
    /// `sample_fraction`).
    #[serde(default)]
    pub n_samples: usize,
    /// Negatives as a fraction of K when `n_samples = 0` (the LDGS paper: 0.01).
    #[serde(default = "default_sample_fraction")]
    pub sample_fraction: f64,
    /// Proposal of `sampled_softmax` and `negative_sampling`: `uniform`, `log_uniform` (ids
    /// sorted by frequency) or `unigram` (training label counts ^ `output.alpha`). Default:
    /// uniform for sampled softmax, unigram for negative sampling.
    #[serde(default)]
    pub proposal: Option<ProposalKind>,
    /// Exponent of the unigram proposal (word2vec: 0.75).
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    /// Sampled softmax: draw until `n` distinct classes (TensorFlow's `unique = true`) rather
    /// than `n` draws with replacement.
    #[serde(default = "default_true")]
    pub unique: bool,
    /// Sampled softmax: one set of negatives for the whole batch instead of one per sample.
    #[serde(default)]
    pub shared_samples: bool,
    /// LDGS: number of column blocks B (0 = D/16 when 16 divides D, else D/25 when 25 does,
    /// else 1: the paper's B = 8 for D = 128 and B = 4 for D = 100).
    #[serde(default)]
    pub blocks: usize,
    /// LDGS: message-passing steps T, or `"fixed_point"` (the default: lambda = lambda*
    /// directly, the T -> inf limit, at the cost of one loss evaluation).
    #[serde(default = "default_iterations")]
    pub iterations: farout_estimators::Iterations,
    /// LDGS: which coordinates message passing updates (`union` or the paper's `gradient`).
    #[serde(default)]
    pub active_set: farout_estimators::ActiveSet,
    /// LDGS: gradient threshold of the `gradient` active set.
    #[serde(default = "default_tau2")]
    pub tau2: f32,
    /// LDGS: score every candidate in every block (`exact`) or only where retrieved (`partial`,
    /// Algorithm 2 as written).
    #[serde(default)]
    pub rescore: farout_estimators::Rescore,
    /// Train the first this many steps with uniform sampled softmax before switching to the
    /// configured estimator (the LDGS paper warms search up by sampling until scores spread).
    #[serde(default)]
    pub warmup_steps: u64,
    /// Bias and initialisation of W.
    #[serde(default)]
    pub layer: OutputLayerConfig,
    /// Optimiser of W's rows and the bias.
    #[serde(default)]
    pub optimizer: OptimizerConfig,
}

fn default_mu() -> f32 {
    1.0
}

fn default_sample_fraction() -> f64 {
    0.01
}

fn default_alpha() -> f64 {
    0.75
}

fn default_true() -> bool {
    true
}

/// Proposal distribution of the sampling estimators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposalKind {
    /// Every class equally likely.
    Uniform,
    /// Zipf over ids (ids sorted by decreasing frequency).
    LogUniform,
    /// Training label counts raised to `output.alpha`.
    Unigram,
}

fn default_iterations() -> farout_estimators::Iterations {
    farout_estimators::Iterations::FixedPoint
}

fn default_tau2() -> f32 {
    1e-3
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
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self { epochs: 5, batch_size: 64, threads: 0, max_steps: 0, max_seconds: 0.0, log_every: 50 }
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

/// `[index]`: the MIPS index of search-based estimators.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IndexSection {
    /// `spherical` (the LDGS paper's), `hnsw`, `simple_lsh` or `exact` (brute force, for reference).
    pub kind: farout_search::IndexKind,
    /// Parameters of `spherical`.
    pub spherical: farout_search::SphericalConfig,
    /// Parameters of `simple_lsh`.
    pub simple_lsh: farout_search::SimpleLshConfig,
    /// Parameters of `hnsw`.
    pub hnsw: farout_search::HnswConfig,
    /// Re-index the rows that changed every this many steps.
    pub refresh_every: u64,
    /// Rebuild the index from scratch every this many steps (0 = only when it asks, e.g. a row
    /// outgrew its norm bound): refreshes reassign changed rows to clusters fitted on the rows
    /// of the last build, which training leaves behind.
    pub rebuild_every: u64,
    /// Log the index's recall against brute force every this many steps (0 = never); stale
    /// indexes fail silently, this is how to see it.
    pub recall_every: u64,
    /// Queries (rows of the current batch) used for the recall measurement.
    pub recall_queries: usize,
}

impl Default for IndexSection {
    fn default() -> Self {
        Self {
            kind: farout_search::IndexKind::Spherical,
            spherical: farout_search::SphericalConfig::default(),
            simple_lsh: farout_search::SimpleLshConfig::default(),
            hnsw: farout_search::HnswConfig::default(),
            refresh_every: 1,
            rebuild_every: 0,
            recall_every: 200,
            recall_queries: 32,
        }
    }
}

impl IndexSection {
    /// The index part of the section.
    pub fn index_config(&self) -> farout_search::IndexConfig {
        farout_search::IndexConfig {
            kind: self.kind,
            spherical: self.spherical.clone(),
            simple_lsh: self.simple_lsh.clone(),
            hnsw: self.hnsw.clone(),
        }
    }
}

impl Config {
    /// Reads `path`, applies `overrides` (`key.path=value`), parses and validates.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config { path: path.to_path_buf(), msg: e.to_string() })?;
        let mut config =
            Self::parse(&text, overrides).map_err(|msg| Error::Config { path: path.to_path_buf(), msg })?;
        if config.name.is_empty() {
            config.name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "run".into());
        }
        config.check().map_err(|msg| Error::Config { path: path.to_path_buf(), msg })?;
        Ok(config)
    }

    /// Parses config text with overrides; the error names the offending key.
    pub fn parse(text: &str, overrides: &[String]) -> Result<Self, String> {
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| one_line(&e.to_string()))?;
        for o in overrides {
            apply_override(&mut table, o)?;
        }
        let value = toml::Value::Table(table);
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let inner = one_line(&e.into_inner().to_string());
            if path == "." { inner } else { format!("key `{path}`: {inner}") }
        })
    }

    /// Checks values serde cannot (ranges, required files per format).
    pub fn check(&self) -> Result<(), String> {
        let d = &self.data;
        let need = |field: &Option<PathBuf>, key: &str| -> Result<(), String> {
            if field.is_none() {
                Err(format!("key `data.{key}` is required with data.format = {:?}", format_name(d.format)))
            } else {
                Ok(())
            }
        };
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
                    return Err("key `data.dim` must be > 0 with data.format = \"raw\"".into());
                }
            }
            DataFormat::SyntheticFace | DataFormat::SyntheticXmc => {}
            DataFormat::Text => {
                if let (None, Err(farout_data::Error::Param { name, msg })) = (&d.corpus, d.synthetic.check()) {
                    return Err(format!("key `{name}` {msg}"));
                }
            }
        }
        if (d.format == DataFormat::Text) != (self.model.encoder == EncoderKind::SkipGram) {
            return Err("key `model.encoder`: \"skip_gram\" goes with data.format = \"text\" and only with it".into());
        }
        if self.model.encoder == EncoderKind::SkipGram {
            if let Err(farout_data::Error::Param { name, msg }) = d.text.check() {
                return Err(format!("key `{name}` {msg}"));
            }
            if let Err(farout_skipgram::Error::Config { key, msg }) = self.model.skip_gram.check() {
                return Err(format!("key `{key}` {msg}"));
            }
            if self.output.warmup_steps > 0 {
                return Err(
                    "key `output.warmup_steps`: skip-gram warms up with model.skip_gram.ns_warmup_epochs".into()
                );
            }
            if self.model.skip_gram.objective == farout_skipgram::Objective::Collapsed {
                let softmax = match self.output.estimator {
                    EstimatorKind::Softmax | EstimatorKind::SampledSoftmax => true,
                    EstimatorKind::Mips | EstimatorKind::Ldgs => self.output.loss == LossKind::Softmax,
                    _ => false,
                };
                if !softmax {
                    return Err(format!(
                        "key `output.estimator`: the collapsed objective (eq. 9) is a softmax loss; use \
                         \"softmax\" (GD), \"mips\" or \"ldgs\" with output.loss = \"softmax\" (GD-MIPS, \
                         GD-Decomp-MIPS) or \"sampled_softmax\" (found {:?}, loss {:?})",
                        self.output.estimator, self.output.loss
                    ));
                }
            }
        }
        let sparse = matches!(d.format, DataFormat::Xmc | DataFormat::SyntheticXmc);
        match (self.model.encoder, sparse) {
            (EncoderKind::FaceHead, true) => {
                return Err(
                    "key `model.encoder`: \"face_head\" needs dense features (data.format npy, raw or synthetic_face)"
                        .into(),
                );
            }
            (EncoderKind::DocEncoder, false) => {
                return Err(
                    "key `model.encoder`: \"doc_encoder\" needs sparse features (data.format xmc or synthetic_xmc)"
                        .into(),
                );
            }
            _ => {}
        }
        if self.train.batch_size == 0 {
            return Err("key `train.batch_size` must be > 0".into());
        }
        if self.eval.batch_size == 0 {
            return Err("key `eval.batch_size` must be > 0".into());
        }
        if !(self.train.max_seconds >= 0.0) {
            return Err(format!("key `train.max_seconds` = {} must be >= 0", self.train.max_seconds));
        }
        finite_at_least("eval.every_seconds", self.eval.every_seconds, 0.0)?;
        if self.eval.every_seconds > 0.0
            && (self.model.encoder != EncoderKind::SkipGram || self.output.estimator == EstimatorKind::NegativeSampling)
        {
            return Err("key `eval.every_seconds` applies to skip-gram with a minibatch estimator (not \
                        negative_sampling, which evaluates after each epoch); classifiers use eval.every_steps"
                .into());
        }
        if self.train.log_every == 0 {
            return Err("key `train.log_every` must be > 0".into());
        }
        if !(self.output.mu > 0.0 && self.output.mu.is_finite()) {
            return Err(format!("key `output.mu` = {} must be a finite number > 0", self.output.mu));
        }
        if self.output.estimator == EstimatorKind::Mips && self.output.layer.bias {
            return Err(
                "key `output.layer.bias` must be false with output.estimator = \"mips\" (the index searches W alone)"
                    .into(),
            );
        }
        if !(self.output.sample_fraction > 0.0 && self.output.sample_fraction <= 1.0) {
            return Err(format!("key `output.sample_fraction` = {} must be in (0, 1]", self.output.sample_fraction));
        }
        finite_at_least("output.alpha", self.output.alpha, 0.0)?;
        if let OptimizerConfig::ArSchedule { .. } = self.model.doc_encoder.optimizer {
            return Err(
                "key `model.doc_encoder.optimizer.kind`: \"ar_schedule\" is for the output layer; use \"sgd\" or \"adagrad\""
                    .into(),
            );
        }
        if self.index.refresh_every == 0 {
            return Err("key `index.refresh_every` must be > 0".into());
        }
        finite_at_least("index.spherical.candidate_factor", self.index.spherical.candidate_factor, 1.0)?;
        finite_at_least("index.spherical.rescore", self.index.spherical.rescore, 1.0)?;
        self.output.optimizer.check("output.optimizer").map_err(|e| e.to_string())?;
        self.model.doc_encoder.optimizer.check("model.doc_encoder.optimizer").map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The log directory.
    pub fn log_dir(&self) -> PathBuf {
        self.log.dir.clone().unwrap_or_else(|| PathBuf::from("runs").join(&self.name))
    }

    /// The checkpoint directory.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.checkpoint.dir.clone().unwrap_or_else(|| self.log_dir().join("checkpoint"))
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

/// Checks that the value of config key `key` is a finite number `>= min` (NaN is not), else says
/// so naming the key.
fn finite_at_least<T: Copy + Into<f64> + std::fmt::Display>(key: &str, value: T, min: f64) -> Result<(), String> {
    let v: f64 = value.into();
    if v >= min && v.is_finite() {
        Ok(())
    } else {
        Err(format!("key `{key}` = {value} must be a finite number >= {min}"))
    }
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
fn apply_override(table: &mut toml::Table, o: &str) -> Result<(), String> {
    let (key, value) = o.split_once('=').ok_or_else(|| format!("--set {o}: expected key=value"))?;
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
            return Err(format!("--set {o}: empty key segment"));
        }
        if i + 1 == parts.len() {
            cur.insert(part.to_string(), parsed);
            return Ok(());
        }
        let entry = cur.entry(part.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = entry.as_table_mut().ok_or_else(|| format!("--set {o}: `{}` is not a table", parts[..=i].join(".")))?;
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

    #[test]
    fn unknown_keys_are_named() {
        let e = Config::parse(&format!("{MINIMAL}\n[train]\nepoch = 3\n"), &[]).unwrap_err();
        assert!(e.contains("key `train.epoch`") && e.contains("unknown field `epoch`") && e.contains("epochs"), "{e}");
        let e = Config::parse(MINIMAL, &["output.estimator=lsh".into()]).unwrap_err();
        assert!(e.contains("output.estimator") && e.contains("softmax") && e.contains("margin"), "{e}");
        let e = Config::parse(MINIMAL, &["train.batch_size=abc".into()]).unwrap_err();
        assert!(e.contains("train.batch_size"), "{e}");
        let e = Config::parse(MINIMAL, &["output.iterations=forever".into()]).unwrap_err();
        assert!(e.contains("output.iterations") && e.contains("fixed_point"), "{e}");
    }

    #[test]
    fn ldgs_iterations_are_steps_or_the_fixed_point() {
        use farout_estimators::Iterations;
        assert_eq!(Config::parse(MINIMAL, &[]).unwrap().output.iterations, Iterations::FixedPoint);
        let c = Config::parse(MINIMAL, &["output.iterations=3".into()]).unwrap();
        assert_eq!(c.output.iterations, Iterations::Steps(3));
        let c = Config::parse(&format!("{MINIMAL}iterations = \"fixed_point\"\n"), &[]).unwrap();
        assert_eq!(c.output.iterations, Iterations::FixedPoint);
        // A config file takes the strings the command line does (`bench estimator --iterations`).
        let c = Config::parse(&format!("{MINIMAL}iterations = \"fixed-point\"\n"), &[]).unwrap();
        assert_eq!(c.output.iterations, Iterations::FixedPoint);
        let c = Config::parse(&format!("{MINIMAL}iterations = \"4\"\n"), &[]).unwrap();
        assert_eq!(c.output.iterations, Iterations::Steps(4));
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
        assert!(c.check().unwrap_err().contains("data.train"));
        c.data.format = DataFormat::Xmc;
        c.data.train = Some("t.txt".into());
        assert!(c.check().unwrap_err().contains("model.encoder"));
    }

    #[test]
    fn check_names_bad_spherical_index_parameters() {
        let set = |key: &str| Config::parse(MINIMAL, &[key.to_string()]).unwrap().check().unwrap_err();
        assert!(set("index.spherical.rescore=0.5").contains("index.spherical.rescore"));
        assert!(set("index.spherical.candidate_factor=0").contains("index.spherical.candidate_factor"));
        let scoring =
            Config::parse(MINIMAL, &["index.spherical.scoring=\"int4\"".to_string()]).unwrap_err().to_string();
        assert!(scoring.contains("int8") && scoring.contains("f32"), "{scoring}");
    }
}
