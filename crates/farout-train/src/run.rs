//! One entry for training: [`train`] takes a loaded config and runs the trainer it asks for —
//! a linear solver ([`crate::linear`]), the classifier loop ([`Trainer`]) or skip-gram
//! ([`crate::skipgram`]) — and returns what the run reports.

use crate::config::EncoderKind;
use crate::dist::{agree, check_same_config};
use crate::guard::{RunGuard, Start};
use crate::skipgram::SkipGramSummary;
use crate::{Config, Error, Summary, Trainer};
use farout_dist::{Collective, Local};
use serde::Serialize;
use std::path::Path;

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

/// Trains the model `config` describes, with its logs, checkpoints and progress bar.
/// The run's directories are locked while it runs (see [`crate::guard`]).
pub fn train(config: &Config, options: &TrainOptions) -> Result<RunSummary, Error> {
    train_on(config, options, &Local)
}

/// [`train`] as one of the ranks of `comm`. With several ranks every rank must have loaded the
/// same config; rank 0 locks the run's directories and writes logs; each rank trains its share
/// of a linear model's labels (or MEMOIR's classes), or of a network's output layer.
pub fn train_on(config: &Config, options: &TrainOptions, comm: &dyn Collective) -> Result<RunSummary, Error> {
    check_same_config(comm, config)?;
    if comm.size() > 1 && config.model.encoder == EncoderKind::SkipGram && !config.is_linear() {
        return Err(Error::NoData(
            "under mpirun, farout trains linear configs (the labels or classes split over the ranks) and the \
             face head and document encoder (the output layer split over the ranks); skip-gram runs in one \
             process: run it without mpirun",
        ));
    }
    let start = match (options.resume, options.overwrite) {
        (true, true) => {
            return Err(Error::Option { name: "overwrite", msg: "cannot be combined with --resume".into() });
        }
        (true, false) => Start::Resume,
        (false, true) => Start::Overwrite,
        (false, false) => Start::Fresh,
    };
    if config.is_linear() && options.resume {
        return Err(Error::Option {
            name: "resume",
            msg: "a linear solver trains in one go; there is nothing to resume".into(),
        });
    }
    if options.export_vectors.is_some() && (config.is_linear() || config.model.encoder != EncoderKind::SkipGram) {
        return Err(Error::Option {
            name: "export-vectors",
            msg: "is for skip-gram configs (model.encoder = \"skip_gram\")".into(),
        });
    }
    // Rank 0 holds the lock and replaces a previous run; every rank learns if it failed.
    let guard = if comm.is_root() { RunGuard::acquire(config, start).map(Some) } else { Ok(None) };
    let mut guard = agree(comm, guard)?;
    let mut clear_previous = || agree(comm, guard.as_mut().map_or(Ok(()), RunGuard::clear_previous));
    if config.is_linear() {
        let run = agree(comm, crate::linear::LinearRun::new(config.clone()))?;
        clear_previous()?;
        return Ok(RunSummary::Classifier(run.train(comm)?));
    }
    if config.model.encoder == EncoderKind::SkipGram {
        clear_previous()?;
        let summary = crate::skipgram::train(config, options.resume, options.export_vectors)?;
        return Ok(RunSummary::SkipGram(summary));
    }
    let mut trainer = agree(comm, Trainer::new_on(config.clone(), comm))?;
    clear_previous()?;
    if options.resume {
        trainer.resume_on(comm)?;
        log::info!("resuming at step {}", trainer.step());
    }
    Ok(RunSummary::Classifier(trainer.run_on(comm)?))
}
