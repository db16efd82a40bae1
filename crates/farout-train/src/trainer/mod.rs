//! The training loop of a classifier config: a face head or document encoder feeding the
//! output layer, on one process or as one rank of an MPI job (the [`Collective`] it holds).
//!
//! - [`init`]: building the encoder, output layer and estimator from a config (and checking
//!   the config's classifier sections);
//! - [`step`]: the loop: batches, one optimisation step, logs, divergence;
//! - [`eval`]: test metrics, predictions, the layer's rows and features, the summary;
//! - [`checkpoints`]: saving, loading and resuming, per rank for a class-sharded layer;
//! - [`select`]: the weights best on validation, kept beside the checkpoint, and early stopping.

mod checkpoints;
mod eval;
mod init;
mod select;
mod step;

#[cfg(test)]
pub(crate) use checkpoints::check_class_layout;
pub(crate) use checkpoints::{CLASS_LAYOUT, CLASS_LAYOUT_FILE, checkpoint_rank_counts, rank_checkpoint};
pub(crate) use init::check_config;
pub use select::Selection;

use crate::config::Config;
use crate::data::TaskData;
use farout_core::Matrix;
use farout_data::{Dataset, Features};
use farout_dist::{Collective, Strided};
use farout_estimators::{GradientEstimator, Loss};
use farout_layer::OutputLayer;
use farout_models::{DocEncoder, FaceHead};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The feature network of a run.
enum Encoder {
    /// Frozen: the features were computed once at load time and replaced the inputs.
    Face(FaceHead),
    /// Trainable document encoder.
    Doc(DocEncoder),
}

/// Progress of a run, saved in checkpoints.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct State {
    step: u64,
    epoch: usize,
    batch_in_epoch: usize,
    train_seconds: f64,
    samples: u64,
    classes_scored: u64,
    /// Mean loss per sample of the first step, the reference of [`BLOWUP`].
    #[serde(default)]
    initial_loss: f64,
    /// The validation figures of a run that keeps its best weights ([`select`]).
    #[serde(default)]
    valid: Tracking,
}

/// The validation evaluations of a run so far.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Tracking {
    /// The best figure, whose weights are kept.
    best: Option<Point>,
    /// The latest figure.
    last: Option<Point>,
    /// Evaluations since the best.
    since_best: u64,
    /// Evaluations made.
    evaluations: u64,
}

/// One validation figure and when it was reached.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
struct Point {
    step: u64,
    /// Epochs completed, fractional.
    epoch: f64,
    /// Training seconds.
    seconds: f64,
    value: f64,
}

/// What a run reports at the end (printed as JSON, written by `--summary`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Summary {
    /// Run name.
    pub name: String,
    /// Data set description.
    pub task: String,
    /// Gradient estimator.
    pub estimator: String,
    /// Final test metrics (`p@1`, `p@3`, `p@5`, `ndcg@k`, `loss`, `accuracy` for multiclass);
    /// train-set metrics when there is no test set. Of the kept weights: the best on
    /// validation when the run selects them ([`Summary::selection`]), else the last step's.
    pub metrics: BTreeMap<String, f64>,
    /// A run that kept its weights best on validation: where they were reached and the last
    /// step's test metrics beside them. `None` when the last step is the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<Selection>,
    /// Seconds spent training (evaluation and checkpoints excluded).
    pub train_seconds: f64,
    /// Optimisation steps taken.
    pub steps: u64,
    /// Epochs completed.
    pub epochs: usize,
    /// Training samples per second.
    pub samples_per_s: f64,
    /// Classes scored per training sample (the estimator's cost; K for exact estimators).
    pub classes_scored_per_sample: f64,
    /// Last measured recall of the MIPS index against brute force (search estimators).
    pub index_recall: Option<f64>,
    /// Gradient fidelity of an approximate estimator at the end of training: mean cosine
    /// between its `dL/dphi` and the exact one (softmax, or margin for search estimators with
    /// `output.loss = "margin"`) over up to 256 training samples. `None` for exact estimators.
    #[serde(default)]
    pub grad_cosine: Option<f64>,
    /// Bytes of the output layer (W, bias, optimiser state) and the encoder.
    pub model_bytes: usize,
    /// Peak resident memory of the process (Linux), bytes.
    pub peak_rss_bytes: Option<u64>,
    /// Number of classes K.
    pub n_classes: usize,
    /// Feature dimension D.
    pub d_model: usize,
    /// Training samples.
    pub n_train: usize,
    /// Test samples.
    pub n_test: usize,
    /// The run's seed.
    pub seed: u64,
    /// Where logs were written.
    pub log_dir: PathBuf,
    /// A linear solver's totals and own figures (`[linear]` runs; see
    /// [`farout_linear::FitSummary`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear: Option<serde_json::Value>,
}

/// The training loop of one config.
pub struct Trainer<'c> {
    /// The ranks this trainer runs on ([`farout_dist::Local`] for one process).
    comm: &'c dyn Collective,
    config: Config,
    data: TaskData,
    encoder: Encoder,
    layer: OutputLayer,
    estimator: Box<dyn GradientEstimator>,
    /// Used for the first `output.warmup_steps` steps.
    warmup: Option<Box<dyn GradientEstimator>>,
    /// Classes retrieved per query by a search-based estimator (recall is measured at this k).
    search_top: usize,
    /// The exact gradient the estimator approximates (`None` for exact estimators).
    reference: Option<Box<dyn GradientEstimator>>,
    /// Last measured recall of the index against brute force.
    last_recall: Option<f64>,
    loss: Box<dyn Loss>,
    state: State,
    /// Scratch for the features of a batch of precomputed (face) embeddings.
    phi: Matrix,
    /// This rank's classes when the output layer is split over MPI ranks.
    shard: Option<Strided>,
}

impl<'c> Trainer<'c> {
    /// The ranks this trainer runs on.
    pub fn comm(&self) -> &'c dyn Collective {
        self.comm
    }

    /// The config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The output layer.
    pub fn layer(&self) -> &OutputLayer {
        &self.layer
    }

    /// The loaded data.
    pub fn data(&self) -> &TaskData {
        &self.data
    }

    /// Features of rows `idx` of `ds` (no gradient tracking). A feature-sharded document
    /// encoder sums its bags over the ranks: every rank must ask for the same rows.
    fn features(&self, ds: &Dataset, idx: &[usize]) -> Result<Matrix, crate::Error> {
        match (&ds.features, &self.encoder) {
            (Features::Dense(m), _) => Ok(gather_rows(m, idx)),
            (Features::Sparse(s), Encoder::Doc(enc)) => {
                let docs: Vec<_> = idx.iter().map(|&i| s.row(i)).collect();
                if enc.deal().ranks() == 1 {
                    return Ok(enc.encode(&docs));
                }
                Ok(enc.encode_summed(&docs, |bags| self.comm.allreduce_sum_f32(bags))?)
            }
            (Features::Sparse(_), Encoder::Face(_)) => {
                unreachable!("config check pairs face_head with dense data")
            }
        }
    }

    /// Steps taken so far.
    pub fn step(&self) -> u64 {
        self.state.step
    }
}

fn embed_in_place(head: &FaceHead, ds: &mut Dataset, batch: usize) {
    if let Features::Dense(m) = &mut ds.features {
        head.embed_in_place(m, batch.max(1024));
    }
}

fn gather_rows(m: &Matrix, idx: &[usize]) -> Matrix {
    let mut out = Matrix::default();
    gather_rows_into(m, idx, &mut out);
    out
}

fn gather_rows_into(m: &Matrix, idx: &[usize], out: &mut Matrix) {
    let d = m.cols();
    out.reshape_for_overwrite(idx.len(), d);
    for (dst, &i) in out.as_mut_slice().chunks_exact_mut(d).zip(idx) {
        dst.copy_from_slice(m.row(i));
    }
}

/// Peak resident set size from /proc/self/status (None off Linux).
pub(crate) fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Small configs the trainer's unit tests share.
#[cfg(test)]
pub(super) mod testutil {
    use crate::Config;

    /// A synthetic face task small enough for a unit test (K = 40 classes of 16-d embeddings,
    /// 1,200 training samples), logging and checkpointing into `dir`, with `extra` TOML.
    pub fn tiny_face(dir: &std::path::Path, extra: &str) -> Config {
        let text = format!(
            "[data]\nformat = \"synthetic_face\"\n[data.face]\nn_classes = 40\nn_samples = 1200\ndim = 16\n\
             [model]\nencoder = \"face_head\"\n[output]\nestimator = \"softmax\"\n\
             [train]\nepochs = 2\nbatch_size = 64\nthreads = 1\n\
             [log]\nprogress = false\ntensorboard = false\ndir = {dir:?}\n{extra}"
        );
        let mut c = Config::parse(&text, &[]).unwrap();
        c.name = "trainer-test".into();
        c.check().unwrap();
        c
    }
}
