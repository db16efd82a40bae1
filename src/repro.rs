//! `farout repro ...`: the papers' experiments, each printing one JSON object.

use anyhow::{Context, Result};
use clap::Subcommand;
use farout_train::repro::{self, ArBibtexOptions, ArSyntheticOptions};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum ReproCommand {
    /// A&R paper, Section 4.1: softmax A&R against OVE on 10^4 classes with p_k ∝ u_k^2, biases
    /// only (bounds on the data's log marginal likelihood, error of the fitted probabilities,
    /// minutes per epoch).
    ArSynthetic {
        /// Classes before dropping empty ones.
        #[arg(long, default_value_t = 10_000)]
        classes: usize,
        /// Observations N.
        #[arg(long, default_value_t = 300_000)]
        observations: usize,
        /// Observations per minibatch |B|.
        #[arg(long, default_value_t = 500)]
        batch: usize,
        /// Negative classes per observation |S|.
        #[arg(long, default_value_t = 100)]
        negatives: usize,
        /// Iterations per method (the paper: 500,000).
        #[arg(long, default_value_t = 30_000)]
        iterations: u64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Print the JSON report (the default; kept for symmetry with `bench`).
        #[arg(long)]
        json: bool,
    },
    /// A&R paper, Section 4.2 on Bibtex (first label only, linear model on raw features):
    /// exact softmax, OVE, A&R softmax, probit and logistic — test log-likelihood and accuracy.
    ArBibtex {
        /// Directory with bibtex's train.txt and test.txt (`$FAROUT_DATA` is the environment variable
        /// FAROUT_DATA, default ../shared/data).
        #[arg(long, default_value = "$FAROUT_DATA/xmc/bibtex")]
        data: PathBuf,
        #[arg(long, default_value_t = 488)]
        batch: usize,
        #[arg(long, default_value_t = 20)]
        negatives: usize,
        #[arg(long, default_value_t = 5_000)]
        iterations: u64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Print the JSON report (the default).
        #[arg(long)]
        json: bool,
    },
}

pub fn run(command: ReproCommand) -> Result<()> {
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let json = match command {
        ReproCommand::ArSynthetic { classes, observations, batch, negatives, iterations, seed, json: _ } => {
            let opts = ArSyntheticOptions { classes, observations, batch, negatives, iterations, seed, progress };
            serde_json::to_string_pretty(&repro::ar_synthetic(&opts)?)?
        }
        ReproCommand::ArBibtex { data, batch, negatives, iterations, seed, json: _ } => {
            let opts = ArBibtexOptions { batch, negatives, iterations, seed, progress };
            let data = farout_train::config::expand_data_path(&data);
            let report = repro::ar_bibtex(&data, &opts).with_context(|| format!("bibtex from {}", data.display()))?;
            serde_json::to_string_pretty(&report)?
        }
    };
    crate::emit(json)
}
