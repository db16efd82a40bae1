//! The three kinds of run a config describes, behind one contract.
//!
//! A config trains one of three tasks: a **classifier** network (a face head or a document
//! encoder feeding the output layer, trained by [`Trainer`]), a **linear** extreme classifier
//! (`[linear]`, trained by [`LinearRun`]) or **skip-gram** word vectors
//! (`model.encoder = "skip_gram"`, [`crate::skipgram`]). [`TaskKind::of`] tells which, in one
//! place; each task validates the config sections it reads ([`TaskKind::check`]) and states what
//! it supports ([`TaskKind::shares_ranks`], [`TaskKind::resumes`], ...). [`open`] gives the
//! [`Task`] that `farout train`, `eval`, `predict` and `export` drive without asking which kind
//! it is; it holds the job's [`Collective`], so one process and the ranks of an MPI job take the
//! same path.
//!
//! ```text
//! config ──TaskKind::of──▶ Classifier | Linear | SkipGram
//!        ──open──────────▶ Box<dyn Task>: train · load · evaluate · predict · export
//! ```

use crate::config::{Config, ConfigError, EncoderKind};
use crate::dist::agree;
use crate::linear::{LinearModel, LinearRun};
use crate::skipgram::{SkipGramRows, SkipGramSummary};
use crate::{Error, Summary, Trainer};
use farout_core::topk::Hit;
use farout_data::Dataset;
use farout_dist::Collective;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// What a config trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskKind {
    /// A face head or document encoder feeding the output layer ([`Trainer`]).
    Classifier,
    /// A linear extreme classifier: `[linear]` with DiSMEC, PPDSparse or MEMOIR ([`LinearRun`]).
    Linear,
    /// Word vectors: `model.encoder = "skip_gram"` on a text corpus ([`crate::skipgram`]).
    SkipGram,
}

impl TaskKind {
    /// The task `config` describes: a `[linear]` section makes it linear, a skip-gram encoder
    /// skip-gram, anything else a classifier.
    pub fn of(config: &Config) -> Self {
        if config.linear.is_some() {
            Self::Linear
        } else if config.model.encoder == EncoderKind::SkipGram {
            Self::SkipGram
        } else {
            Self::Classifier
        }
    }

    /// The task's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Classifier => "classifier",
            Self::Linear => "linear",
            Self::SkipGram => "skip-gram",
        }
    }

    /// Checks the config sections this task reads, beyond what serde checks (ranges, keys that
    /// must go together). The data format's files are checked for every task before.
    pub fn check(self, config: &Config) -> Result<(), ConfigError> {
        match self {
            Self::Classifier => crate::trainer::check_config(config),
            Self::Linear => crate::linear::check_config(config),
            Self::SkipGram => crate::skipgram::check_config(config),
        }
    }

    /// Whether the ranks of an MPI job can share the task (skip-gram trains in one process).
    pub fn shares_ranks(self) -> bool {
        self != Self::SkipGram
    }

    /// Whether a run continues from its checkpoint with `--resume` (a linear solver trains in
    /// one go).
    pub fn resumes(self) -> bool {
        self != Self::Linear
    }

    /// Whether a time budget (`train.max_seconds`) can end a run early (a linear solver runs to
    /// convergence).
    pub fn takes_budget(self) -> bool {
        self != Self::Linear
    }

    /// Whether a time budget ends the run by its clock alone, keeping the epochs on which the
    /// step-size schedule depends (skip-gram), rather than by lifting the epochs.
    pub fn keeps_epochs_under_budget(self) -> bool {
        self == Self::SkipGram
    }

    /// Whether the task writes word vectors (`--export-vectors`).
    pub fn has_word_vectors(self) -> bool {
        self == Self::SkipGram
    }

    /// An error when `options` ask for what the task does not do: `--resume` of a task that
    /// trains in one go, `--export-vectors` of a task without word vectors.
    pub fn check_options(self, options: &TrainOptions) -> Result<(), Error> {
        if options.resume && !self.resumes() {
            return Err(Error::Option {
                name: "resume",
                msg: "a linear solver trains in one go; there is nothing to resume".into(),
            });
        }
        if options.warm_start.is_some() && self != Self::Linear {
            return Err(Error::Option {
                name: "warm-start",
                msg: "is for linear solvers (a network continues its own checkpoint with --resume)".into(),
            });
        }
        if options.export_vectors.is_some() && !self.has_word_vectors() {
            return Err(Error::Option {
                name: "export-vectors",
                msg: "is for skip-gram configs (model.encoder = \"skip_gram\")".into(),
            });
        }
        Ok(())
    }
}

/// Reading a config: a config is valid when its task's checks pass, so loading and checking
/// live beside the tasks (the schema in [`crate::config`] does not know them).
impl Config {
    /// Reads `path`, applies `overrides` (`key.path=value`), parses and validates.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, Error> {
        let at = |error: ConfigError| Error::Config { path: path.to_path_buf(), error };
        let text = std::fs::read_to_string(path).map_err(crate::io_err(path))?;
        let name = path.file_stem().map_or_else(|| "run".into(), |s| s.to_string_lossy().into_owned());
        Self::from_text(&text, overrides, &name).map_err(at)
    }

    /// [`Config::load`] of config text that has no file (the Python package's dicts): `name`
    /// is the run's name unless the text sets one.
    pub fn from_text(text: &str, overrides: &[String], name: &str) -> Result<Self, ConfigError> {
        let mut config = Self::parse(text, overrides)?;
        config.expand_data_paths();
        if config.name.is_empty() {
            config.name = name.into();
        }
        config.check()?;
        config.limit_threads();
        Ok(config)
    }

    /// Checks values serde cannot (ranges, required files per format, keys that go together):
    /// the data format's files, then the sections of the config's task ([`TaskKind::check`]).
    pub fn check(&self) -> Result<(), ConfigError> {
        self.check_format()?;
        TaskKind::of(self).check(self)
    }
}

/// How to run a config.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrainOptions<'a> {
    /// Continue from the config's checkpoint.
    pub resume: bool,
    /// Replace a run already in the config's directories (without it, such a run is an error).
    pub overwrite: bool,
    /// Skip-gram: write the input vectors here at the end (word2vec binary for `.bin`, else
    /// word2vec text).
    pub export_vectors: Option<&'a Path>,
    /// Linear solvers that allow it (DiSMEC): start from the model saved in this checkpoint
    /// directory (an earlier run on the same features with other parameters or rows). The
    /// model trained is the cold start's to the solver's tolerance; only the time changes.
    pub warm_start: Option<&'a Path>,
}

/// What a training run reports (printed as JSON, written by `--summary`).
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum RunSummary {
    /// A classifier (face head or document encoder with an output layer, or a linear solver).
    Classifier(Summary),
    /// Word vectors.
    SkipGram(SkipGramSummary),
}

impl RunSummary {
    /// Pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("summaries serialise")
    }

    /// Reads a summary written by [`Self::to_json`] (only skip-gram summaries have a
    /// vocabulary).
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        let value: serde_json::Value = serde_json::from_str(text)?;
        Ok(if value.get("vocab").is_some() {
            Self::SkipGram(serde_json::from_value(value)?)
        } else {
            Self::Classifier(serde_json::from_value(value)?)
        })
    }
}

/// The rows `farout export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportRows {
    /// Skip-gram word (input) vectors.
    Input,
    /// Skip-gram context (output) vectors, or a network's output layer.
    Output,
    /// A network's encoder features.
    Features,
}

/// One task of a config, opened: its data loaded and its model built (or read back with
/// [`Task::load`]). The entry points of the CLI and of compare drive every task through it.
///
/// Only [`Task::train`] and [`Task::load`] change the task. Tasks that cannot answer a request
/// (skip-gram has no classes to predict, a linear model no vectors to export) return an error
/// that says what to use instead.
pub trait Task {
    /// Which task this is.
    fn kind(&self) -> TaskKind;

    /// Trains to the end (continuing from the checkpoint with `options.resume`), with logs,
    /// checkpoints and progress bar; returns what the run reports.
    fn train(&mut self, options: &TrainOptions) -> Result<RunSummary, Error>;

    /// Reads the trained model back from `checkpoint` (default: the config's checkpoint
    /// directory; for a network that kept its weights best on validation, those).
    fn load(&mut self, checkpoint: Option<&Path>) -> Result<(), Error>;

    /// The config's test set, if it names one.
    fn test(&self) -> Option<&Dataset>;

    /// Reads a data file in the config's format, transformed as the training set was (labels
    /// optional).
    fn load_input(&self, path: &Path, labels: Option<&Path>) -> Result<Dataset, Error>;

    /// P@k, nDCG@k (accuracy for single-label data, the exact loss where the task has one) of the
    /// trained model on `ds`.
    fn evaluate(&self, ds: &Dataset) -> Result<BTreeMap<String, f64>, Error>;

    /// The `k` best classes with scores for every sample of `ds`, best first.
    fn predict(&self, ds: &Dataset, k: usize) -> Result<Vec<Vec<Hit>>, Error>;

    /// Writes the trained model's `rows` (the task's default when `None`) to `out`, encoding
    /// `input` instead of the test set for features; returns the number of rows written.
    fn export(&self, out: &Path, rows: Option<ExportRows>, input: Option<&Path>) -> Result<usize, Error>;
}

/// Opens the task of `config` as one of the ranks of `comm`: loads its data and builds its model
/// (every rank learns if one failed). Train it with [`Task::train`], or read a trained model back
/// with [`Task::load`].
pub fn open<'c>(config: Config, comm: &'c dyn Collective) -> Result<Box<dyn Task + 'c>, Error> {
    Ok(match TaskKind::of(&config) {
        TaskKind::Classifier => Box::new(agree(comm, Trainer::new(config, comm))?),
        TaskKind::Linear => Box::new(LinearTask { run: agree(comm, LinearRun::new(config))?, model: None, comm }),
        TaskKind::SkipGram => Box::new(SkipGramTask { config }),
    })
}

/// Opens the task of `config` and reads its trained model from `checkpoint` (default: the
/// config's checkpoint directory): what `eval`, `predict` and `export` work on.
pub fn open_trained<'c>(
    config: Config,
    checkpoint: Option<&Path>,
    comm: &'c dyn Collective,
) -> Result<Box<dyn Task + 'c>, Error> {
    let mut task = open(config, comm)?;
    task.load(checkpoint)?;
    Ok(task)
}

impl Task for Trainer<'_> {
    fn kind(&self) -> TaskKind {
        TaskKind::Classifier
    }

    fn train(&mut self, options: &TrainOptions) -> Result<RunSummary, Error> {
        if options.resume {
            self.resume()?;
            log::info!("resuming at step {}", self.step());
        }
        Ok(RunSummary::Classifier(self.run()?))
    }

    fn load(&mut self, checkpoint: Option<&Path>) -> Result<(), Error> {
        let dir = checkpoint.map_or_else(|| self.kept_checkpoint_dir(), Path::to_path_buf);
        self.load_checkpoint(&dir)
    }

    fn test(&self) -> Option<&Dataset> {
        self.data().test.as_ref()
    }

    fn load_input(&self, path: &Path, labels: Option<&Path>) -> Result<Dataset, Error> {
        agree(self.comm(), Trainer::load_input(self, path, labels))
    }

    fn evaluate(&self, ds: &Dataset) -> Result<BTreeMap<String, f64>, Error> {
        Trainer::evaluate(self, ds, 0)
    }

    fn predict(&self, ds: &Dataset, k: usize) -> Result<Vec<Vec<Hit>>, Error> {
        Trainer::predict(self, ds, k)
    }

    fn export(&self, out: &Path, rows: Option<ExportRows>, input: Option<&Path>) -> Result<usize, Error> {
        if out.extension().is_none_or(|e| e != "npy") {
            let msg = format!("a network's rows are written as .npy (found {})", out.display());
            return Err(Error::Option { name: "out", msg });
        }
        let m = match rows.unwrap_or(ExportRows::Output) {
            ExportRows::Input => {
                return Err(Error::Option {
                    name: "rows",
                    msg: "input: a network's rows are `output` (the output layer) or `features` (the encoder's)".into(),
                });
            }
            ExportRows::Output => self.class_rows(),
            ExportRows::Features => match input {
                Some(p) => self.feature_rows(&Task::load_input(self, p, None)?)?,
                None => {
                    self.feature_rows(self.test().ok_or(Error::NoData("no --input and the config names no test set"))?)?
                }
            },
        };
        farout_data::npy::write_f32_matrix(out, &m)?;
        Ok(m.rows())
    }
}

/// A linear config opened: its data, and once trained or loaded this rank's labels of the model.
struct LinearTask<'c> {
    run: LinearRun,
    model: Option<LinearModel>,
    comm: &'c dyn Collective,
}

impl LinearTask<'_> {
    fn model(&self) -> Result<&LinearModel, Error> {
        self.model.as_ref().ok_or(Error::Unsupported(
            "the linear model is neither trained nor loaded: train it, or load its checkpoint",
        ))
    }
}

impl Task for LinearTask<'_> {
    fn kind(&self) -> TaskKind {
        TaskKind::Linear
    }

    fn train(&mut self, options: &TrainOptions) -> Result<RunSummary, Error> {
        self.kind().check_options(options)?;
        Ok(RunSummary::Classifier(self.run.train_from(self.comm, options.warm_start)?))
    }

    fn load(&mut self, checkpoint: Option<&Path>) -> Result<(), Error> {
        self.model = Some(self.run.load_model(checkpoint, self.comm)?);
        Ok(())
    }

    fn test(&self) -> Option<&Dataset> {
        self.run.data().test.as_ref()
    }

    fn load_input(&self, path: &Path, labels: Option<&Path>) -> Result<Dataset, Error> {
        agree(self.comm, self.run.load_input(path, labels))
    }

    fn evaluate(&self, ds: &Dataset) -> Result<BTreeMap<String, f64>, Error> {
        crate::linear::evaluate(self.model()?, ds, 0, self.comm)
    }

    fn predict(&self, ds: &Dataset, k: usize) -> Result<Vec<Vec<Hit>>, Error> {
        crate::linear::predict(self.model()?, ds, ds.len(), k, self.comm)
    }

    fn export(&self, _: &Path, _: Option<ExportRows>, _: Option<&Path>) -> Result<usize, Error> {
        Err(Error::Unsupported(
            "a linear model has no checkpoint vectors to export: its weights are in the model file (`farout predict` uses it)",
        ))
    }
}

/// A skip-gram config: training reads the corpus itself, and export reads the checkpoint.
struct SkipGramTask {
    config: Config,
}

/// What a skip-gram task answers instead of classes.
const NO_CLASSES: &str = "a skip-gram model has word vectors, not classes: export them (`farout export`) and \
     evaluate them with `farout eval analogy` or `farout eval similarity`";

impl Task for SkipGramTask {
    fn kind(&self) -> TaskKind {
        TaskKind::SkipGram
    }

    fn train(&mut self, options: &TrainOptions) -> Result<RunSummary, Error> {
        let summary = crate::skipgram::train(&self.config, options.resume, options.export_vectors)?;
        Ok(RunSummary::SkipGram(summary))
    }

    fn load(&mut self, checkpoint: Option<&Path>) -> Result<(), Error> {
        let dir = checkpoint.map_or_else(|| crate::skipgram::kept_checkpoint_dir(&self.config), Path::to_path_buf);
        self.config.checkpoint.dir = Some(dir);
        Ok(())
    }

    fn test(&self) -> Option<&Dataset> {
        None
    }

    fn load_input(&self, _: &Path, _: Option<&Path>) -> Result<Dataset, Error> {
        Err(Error::Unsupported(NO_CLASSES))
    }

    fn evaluate(&self, _: &Dataset) -> Result<BTreeMap<String, f64>, Error> {
        Err(Error::Unsupported(NO_CLASSES))
    }

    fn predict(&self, _: &Dataset, _: usize) -> Result<Vec<Vec<Hit>>, Error> {
        Err(Error::Unsupported(NO_CLASSES))
    }

    fn export(&self, out: &Path, rows: Option<ExportRows>, _: Option<&Path>) -> Result<usize, Error> {
        let rows = match rows.unwrap_or(ExportRows::Input) {
            ExportRows::Input => SkipGramRows::Input,
            ExportRows::Output => SkipGramRows::Output,
            ExportRows::Features => {
                return Err(Error::Option {
                    name: "rows",
                    msg: "features: a skip-gram model's rows are `input` (word vectors) or `output` (context vectors)"
                        .into(),
                });
            }
        };
        crate::skipgram::export_checkpoint(&self.config, out, rows)
    }
}
