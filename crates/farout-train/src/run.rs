//! One entry for training: [`train`] takes a loaded config and runs the trainer it asks for —
//! a linear solver ([`crate::linear`]), the classifier loop ([`Trainer`]) or skip-gram
//! ([`crate::skipgram`]) — and returns what the run reports.

use crate::config::EncoderKind;
use crate::skipgram::SkipGramSummary;
use crate::{Config, Error, Summary, Trainer};
use serde::Serialize;
use std::path::Path;

/// How to run a config.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrainOptions<'a> {
    /// Continue from the config's checkpoint.
    pub resume: bool,
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
pub fn train(config: &Config, options: &TrainOptions) -> Result<RunSummary, Error> {
    if config.is_linear() {
        if options.resume {
            return Err(Error::Option {
                name: "resume",
                msg: "a linear solver trains in one go; there is nothing to resume".into(),
            });
        }
        if options.export_vectors.is_some() {
            return Err(Error::Option { name: "export-vectors", msg: "is for skip-gram configs".into() });
        }
        return Ok(RunSummary::Classifier(crate::linear::LinearRun::new(config.clone())?.train()?));
    }
    if config.model.encoder == EncoderKind::SkipGram {
        let summary = crate::skipgram::train(config, options.resume, options.export_vectors)?;
        return Ok(RunSummary::SkipGram(summary));
    }
    if options.export_vectors.is_some() {
        return Err(Error::Option {
            name: "export-vectors",
            msg: "is for skip-gram configs (model.encoder = \"skip_gram\")".into(),
        });
    }
    let mut trainer = Trainer::new(config.clone())?;
    if options.resume {
        trainer.resume()?;
        log::info!("resuming at step {}", trainer.step());
    }
    Ok(RunSummary::Classifier(trainer.run()?))
}
