//! `farout tune CONFIG`: searches the config's settings on a validation split within a time
//! budget, retrains the best on the whole training set and prints its test summary (JSON) and
//! the trials' table.

use crate::{emit, on_pool};
use anyhow::Result;
use farout_train::tune::{TuneOptions, tune};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct TuneArgs {
    /// The base config (its settings are the search's first trial).
    config: PathBuf,
    /// Seconds of search (the final retraining on the whole training set excluded).
    #[arg(long, default_value_t = 600.0)]
    budget: f64,
    /// A space file (TOML: "key" = { log = [lo, hi] } ...) over the plug-ins' default spaces.
    #[arg(long, value_name = "SPACE.toml")]
    space: Option<PathBuf>,
    /// Fraction of the training rows set aside as the validation split.
    #[arg(long, default_value_t = 0.2)]
    valid_fraction: f64,
    /// Validation metric: p@1, p@3, p@5, ndcg@k, accuracy, loss; skip-gram: heldout_objective,
    /// analogy, similarity (default: p@1, or heldout_objective).
    #[arg(long)]
    metric: Option<String>,
    /// Output directory (trials.csv, best.toml, progress.png, trials/, runs/).
    #[arg(long, default_value = "runs/tune")]
    out: PathBuf,
    /// Continue the search in --out from its trials.csv.
    #[arg(long)]
    resume: bool,
    /// Seed of the search's draws (default: the config's seed).
    #[arg(long)]
    seed: Option<u64>,
    /// Stop after this many settings (0: as many as the budget allows).
    #[arg(long, default_value_t = 0)]
    max_settings: usize,
    /// Train every trial from scratch (no warm starts: a promoted network trial retrains
    /// from epoch 0, a linear solver from its own initialisation).
    #[arg(long)]
    cold: bool,
    /// Trials run at once, each on its own pool of train.threads threads (default: as many as
    /// fit the cores, cores / train.threads, at least 1; one when train.threads is 0).
    #[arg(long, default_value_t = 0)]
    jobs: usize,
    /// Epochs of the top rung of a network or skip-gram search (rungs train a ninth, a third
    /// and all of them; default: 3 x train.epochs for a network, train.epochs for skip-gram).
    #[arg(long, value_name = "N")]
    max_epochs: Option<usize>,
    /// Override a key of the base config, e.g. --set train.threads=1 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

/// Runs the search on rayon's pool; prints the final run's summary and the trials.
pub fn run(a: TuneArgs) -> Result<()> {
    let opts = TuneOptions {
        config: a.config,
        set: a.set,
        budget: a.budget,
        space: a.space,
        valid_fraction: a.valid_fraction,
        metric: a.metric,
        out: a.out,
        resume: a.resume,
        seed: a.seed,
        max_settings: a.max_settings,
        cold: a.cold,
        jobs: a.jobs,
        max_epochs: a.max_epochs,
        progress: true,
    };
    let report = on_pool(|| tune(&opts))?;
    emit(report.summary.to_json())?;
    emit(format!(
        "\nbest setting (validation {:.4}): {}\n{} trials; {}/best.toml\n\n{}",
        report.best_valid,
        if report.best.is_empty() {
            "the base config".to_string()
        } else {
            report.best.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
        },
        report.trials.len(),
        report.out.display(),
        report.table.trim_end()
    ))
}
