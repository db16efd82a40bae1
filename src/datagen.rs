//! `farout data gen ...`: synthetic data sets written to disk.

use anyhow::Result;
use clap::Subcommand;
use farout_core::resources;
use farout_data::synth::{FaceGenerator, FaceSpec, XmcGenerator, XmcSpec};
use farout_data::synth_text::TextGenSpec;
use indicatif::ProgressBar;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum DataCommand {
    /// Generate a data set.
    Gen {
        #[command(subcommand)]
        kind: GenKind,
    },
}

#[derive(Subcommand)]
pub enum GenKind {
    /// FaceNet-like embeddings: writes train.npy, train.labels.npy, test.npy, test.labels.npy,
    /// means.npy (use with data.format = "npy").
    Face {
        /// Number of identities K.
        #[arg(long, default_value_t = 10_000)]
        classes: usize,
        /// Samples (train + test).
        #[arg(long, default_value_t = 100_000)]
        samples: usize,
        /// Embedding dimension.
        #[arg(long, default_value_t = 128)]
        dim: usize,
        /// Noise norm relative to the class mean.
        #[arg(long, default_value_t = 1.0)]
        noise: f32,
        /// Power-law exponent of class sizes.
        #[arg(long, default_value_t = 0.5)]
        size_exponent: f64,
        /// Fraction held out for testing.
        #[arg(long, default_value_t = 0.2)]
        test_fraction: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Replace the files of an earlier data set in --out.
        #[arg(long)]
        overwrite: bool,
    },
    /// Sparse multi-label documents: writes train.txt and test.txt in XMC format.
    Xmc {
        #[arg(long, default_value_t = 20_000)]
        samples: usize,
        /// Vocabulary size.
        #[arg(long, default_value_t = 20_000)]
        features: usize,
        /// Number of labels K.
        #[arg(long, default_value_t = 1_000)]
        labels: usize,
        /// Mean labels per document.
        #[arg(long, default_value_t = 3.2)]
        labels_per_sample: f64,
        /// Tokens per document.
        #[arg(long, default_value_t = 60)]
        features_per_sample: usize,
        #[arg(long, default_value_t = 0.2)]
        test_fraction: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Replace the files of an earlier data set in --out.
        #[arg(long)]
        overwrite: bool,
    },
    /// A Zipfian corpus with topics as text, one sentence per line: the synthetic corpus of the
    /// skip-gram configs (`[data.synthetic]`), written once so other tools (gensim, fastText,
    /// word2vec) train on the very same words.
    Corpus {
        /// Tokens in total (whole sentences: about this many).
        #[arg(long, default_value_t = 2_000_000)]
        tokens: u64,
        /// Distinct words.
        #[arg(long, default_value_t = 5_000)]
        vocab: usize,
        /// Zipf exponent of word frequencies.
        #[arg(long, default_value_t = 1.0)]
        exponent: f64,
        /// Topics (a sentence draws most of its words from one).
        #[arg(long, default_value_t = 50)]
        topics: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output file.
        #[arg(long)]
        out: PathBuf,
        /// Replace an earlier file at --out.
        #[arg(long)]
        overwrite: bool,
    },
}

fn bar(total: u64) -> ProgressBar {
    farout_train::report::progress_bar(true, total, "[{elapsed_precise}] {bar:30} {pos}/{len} samples, ETA {eta}")
}

/// The files `data gen face` writes into its directory.
const FACE_FILES: [&str; 5] = ["train.npy", "train.labels.npy", "test.npy", "test.labels.npy", "means.npy"];
/// The files `data gen xmc` writes into its directory.
const XMC_FILES: [&str; 2] = ["train.txt", "test.txt"];

/// An error, unless `overwrite`, if `out` (with one of `names` joined, `""` for `out` itself)
/// already exists: a generated data set never replaces files silently.
fn refuse_to_replace(out: &std::path::Path, names: &[&str], overwrite: bool) -> Result<()> {
    let found: Vec<String> = names
        .iter()
        .map(|n| if n.is_empty() { out.to_path_buf() } else { out.join(n) })
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if !overwrite && !found.is_empty() {
        anyhow::bail!(
            "--out {}: {} already exist(s); pass --overwrite to replace, or choose another --out",
            out.display(),
            found.join(", ")
        );
    }
    Ok(())
}

pub fn run(cmd: DataCommand) -> Result<()> {
    let DataCommand::Gen { kind } = cmd;
    match kind {
        GenKind::Face { classes, samples, dim, noise, size_exponent, test_fraction, seed, out, overwrite } => {
            refuse_to_replace(&out, &FACE_FILES, overwrite)?;
            let spec = FaceSpec {
                n_classes: classes,
                n_samples: samples,
                dim,
                noise,
                size_exponent,
                test_fraction,
                seed,
                ..FaceSpec::default()
            };
            let change = "lower --classes, --samples or --dim";
            resources::check_memory(spec.generator_bytes(), "generating the class means and labels", change)?;
            let files = spec.features_bytes() + spec.generator_bytes();
            resources::check_disk(
                &out,
                files,
                format!("{samples} x {dim} features and {classes} means as f32"),
                change,
            )?;
            let g = FaceGenerator::new(spec)?;
            let b = bar(samples as u64);
            g.write(&out, |n| b.inc(n as u64))?;
            b.finish();
            log::info!("wrote {} (K = {classes}, N = {samples}, D = {dim})", out.display());
        }
        GenKind::Xmc {
            samples,
            features,
            labels,
            labels_per_sample,
            features_per_sample,
            test_fraction,
            seed,
            out,
            overwrite,
        } => {
            refuse_to_replace(&out, &XMC_FILES, overwrite)?;
            let spec = XmcSpec {
                n_samples: samples,
                n_features: features,
                n_labels: labels,
                labels_per_sample,
                features_per_sample,
                test_fraction,
                seed,
                ..XmcSpec::default()
            };
            let change = "lower --samples, --features, --labels or --features-per-sample";
            resources::check_memory(spec.generator_bytes(), "the label and feature distributions", change)?;
            resources::check_disk(&out, spec.data_bytes(), format!("{samples} documents as text"), change)?;
            let g = XmcGenerator::new(spec)?;
            let b = bar(samples as u64);
            g.write(&out, |n| b.inc(n as u64))?;
            b.finish();
            log::info!("wrote {} (K = {labels}, N = {samples}, V = {features})", out.display());
        }
        GenKind::Corpus { tokens, vocab, exponent, topics, seed, out, overwrite } => {
            refuse_to_replace(&out, &[""], overwrite)?;
            let spec = TextGenSpec { words: vocab, tokens, exponent, topics, seed, ..TextGenSpec::default() };
            spec.check()?;
            let change = "lower --tokens or --vocab";
            resources::check_memory(spec.generator_bytes(), "the word distributions", change)?;
            resources::check_disk(&out, spec.text_bytes(), format!("a corpus of {tokens} tokens"), change)?;
            let b = farout_train::report::progress_bar(
                true,
                tokens,
                "[{elapsed_precise}] {bar:30} {pos}/{len} tokens, ETA {eta}",
            );
            let written = spec.write(&out, &|n| b.set_position(n))?;
            b.finish();
            log::info!("wrote {} ({written} tokens, {vocab} words)", out.display());
        }
    }
    Ok(())
}
