use crate::Error;
use crate::config::{Config, ConfigError, EncoderKind};
use crate::data::{self, TaskData};
use crate::metrics::RankingSums;
use crate::report::progress_bar;
use crate::sinks::{MetricsSink, Sinks};
use farout_core::topk::{Hit, top_k};
use farout_core::{ClassId, Matrix, rng};
use farout_data::{Dataset, Features};
use farout_dist::{Collective, Local, Shards};
use farout_estimators::{Batch, Built, GradientEstimator, Loss, LossScratch, Problem};
use farout_layer::{LayerInit, OutputLayer, sharded, sharded_sparse};
use farout_models::{DocEncoder, FaceHead, bridge};
use indicatif::ProgressBar;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

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
}

/// A step whose mean loss per sample exceeds this many times the first step's, and at least
/// this many times 1 (the scale of a margin), has blown up: its loss is finite but its weights
/// are ruined. The run stops as on a NaN.
const BLOWUP: f64 = 100.0;

/// Bytes of scores an evaluation batch holds at most: at K = 672,000 a batch of 256 rows took
/// 688 MB beside a training run (the largest allocation after the features), so large output
/// layers are scored fewer rows at a time (24 there).
const EVAL_SCORE_BYTES: usize = 64 << 20;

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
    /// train-set metrics when there is no test set.
    pub metrics: BTreeMap<String, f64>,
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
pub struct Trainer {
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
    shard: Option<Shard>,
}

/// The classes of one rank of a class-sharded output layer: rank `rank` of `ranks` owns as many
/// contiguous classes from `first` on as its layer has rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shard {
    rank: usize,
    ranks: usize,
    first: usize,
}

/// The name of rank `rank`'s checkpoint directory (inside the config's) in a run on `ranks`.
pub fn rank_checkpoint(rank: usize, ranks: usize) -> String {
    format!("rank-{rank}-of-{ranks}")
}

/// Ranks of the checkpoints inside `dir` (`rank-R-of-P` directories and their save siblings):
/// the distinct P found.
fn checkpoint_rank_counts(dir: &Path) -> Vec<usize> {
    let mut found: Vec<usize> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_prefix("rank-")?;
            let (_, of) = rest.split_once("-of-")?;
            of.split('.').next()?.parse().ok()
        })
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}

/// The lowest and highest of the ranks' `step`.
fn step_range(comm: &dyn Collective, step: u64) -> Result<(u64, u64), Error> {
    let mut steps = [step as f64, -(step as f64)];
    comm.allreduce_max_f64(&mut steps)?;
    Ok((-steps[1] as u64, steps[0] as u64))
}

/// Whether `output.class_chunk`, when set, goes with the exact softmax and no warm-up, and if
/// not the key that says why. The estimator of a class-sharded layer is checked once built
/// ([`check_sharded_estimator`]).
fn check_class_chunk(config: &Config) -> Result<(), Error> {
    let why = |key: &str, msg: String| Err(Error::Key(ConfigError::key(key, msg)));
    if config.output.class_chunk > 0 {
        if config.output.estimator.name() != "softmax" {
            return why(
                "output.estimator",
                format!(
                    "with output.class_chunk = {} the classes are visited in chunks by the exact \"softmax\" \
                     only; found {:?}, which trains with output.class_chunk = 0",
                    config.output.class_chunk,
                    config.output.estimator.name()
                ),
            );
        }
        if config.output.warmup_steps > 0 {
            return why("output.warmup_steps", "must be 0 with output.class_chunk > 0".to_string());
        }
    }
    Ok(())
}

/// Whether `estimator` trains a layer whose classes are split over `ranks` ranks
/// ([`sharded_sparse::trains_sharded`]), and if not the error naming the key.
fn check_sharded_estimator(estimator: &dyn GradientEstimator, ranks: usize) -> Result<(), Error> {
    if sharded_sparse::trains_sharded(estimator) {
        return Ok(());
    }
    Err(Error::Key(ConfigError::key(
        "output.estimator",
        format!(
            "on {ranks} MPI ranks the class-sharded layer trains the exact \"softmax\" and \"margin\", \
             \"mips\", \"sampled_softmax\", \"negative_sampling\", \"ove\", \"ar_softmax\", \"ar_probit\", \"ar_logistic\", \
             and \"ldgs\" with iterations = \"fixed_point\" and rescore = \"exact\" (its defaults); found {:?} with \
             these settings, which trains in one process",
            estimator.name()
        ),
    )))
}

/// One step of a class-sharded layer (or of one process's layer in class chunks): the rows
/// `first..` of a `k`-class layer on the ranks of `comm`.
struct ShardedStep<'a> {
    layer: &'a mut OutputLayer,
    first: usize,
    k: usize,
    comm: &'a dyn Collective,
    class_chunk: usize,
}

impl ShardedStep<'_> {
    /// The step of `estimator` (checked by [`check_sharded_estimator`]) on `batch`, the same on
    /// every rank, with `dL/dphi` summed over the ranks when `want_dphi`.
    fn step(
        self,
        estimator: &dyn GradientEstimator,
        batch: Batch,
        rng: &mut rng::Rng,
        want_dphi: bool,
    ) -> Result<farout_layer::StepStats, Error> {
        let ShardedStep { layer, first, k, comm, class_chunk } = self;
        let (stats, _) =
            sharded_sparse::estimator_step(layer, first, k, comm, estimator, batch, rng, want_dphi, class_chunk)?;
        Ok(stats)
    }
}

/// What one optimisation step did.
struct StepResult {
    /// Sum of the per-sample losses.
    loss_sum: f64,
    samples: u64,
    classes_scored: u64,
    rows_updated: u64,
    /// Wall time of the step.
    seconds: f64,
}

/// Sums over the steps since the last log record.
#[derive(Default)]
struct Window {
    loss_sum: f64,
    samples: u64,
    classes_scored: u64,
    rows_updated: u64,
    seconds: f64,
}

impl Window {
    fn add(&mut self, s: &StepResult) {
        self.loss_sum += s.loss_sum;
        self.samples += s.samples;
        self.classes_scored += s.classes_scored;
        self.rows_updated += s.rows_updated;
        self.seconds += s.seconds;
    }
}

/// The logs and display of a run in progress.
struct RunLog {
    sinks: Sinks,
    bar: ProgressBar,
    /// Steps at which the run ends (epochs, capped by `train.max_steps`).
    total_steps: u64,
    steps_per_epoch: u64,
    window: Window,
    /// The step of the last log record.
    window_start: u64,
    /// The last test P@1, shown on the progress bar.
    last_eval: String,
}

impl Trainer {
    /// Loads the data, builds encoder, output layer and estimator.
    pub fn new(config: Config) -> Result<Self, Error> {
        Self::new_on(config, &Local)
    }

    /// [`Trainer::new`] as one of the ranks of `comm`: with several ranks, each holds an even
    /// share of the output layer's classes (see [`farout_layer::sharded`]).
    pub fn new_on(config: Config, comm: &dyn Collective) -> Result<Self, Error> {
        check_class_chunk(&config)?;
        let mut data = data::load(&config)?;
        if data.train.is_empty() {
            return Err(Error::NoData("the training set is empty"));
        }
        if data.n_classes == 0 {
            return Err(Error::NoData("the data have no classes (K = 0)"));
        }
        check_model_memory(&config, &data)?;
        let encoder = match config.model.encoder {
            EncoderKind::FaceHead => {
                let head = FaceHead::new(&config.model.face_head, data.n_features)?;
                embed_in_place(&head, &mut data.train, config.eval.batch_size);
                if let Some(t) = &mut data.test {
                    embed_in_place(&head, t, config.eval.batch_size);
                }
                Encoder::Face(head)
            }
            EncoderKind::DocEncoder => {
                Encoder::Doc(DocEncoder::new(&config.model.doc_encoder, data.n_features, config.seed)?)
            }
            EncoderKind::SkipGram => unreachable!("data::load rejects text corpora"),
        };
        let d_model = match &encoder {
            Encoder::Face(h) => h.d_out(data.n_features),
            Encoder::Doc(e) => e.d_model(),
        };
        if data.n_classes < comm.size() {
            return Err(Error::NoData("fewer classes than MPI ranks: every rank needs one"));
        }
        let rows = Shards::even(data.n_classes, comm.size())?.range(comm.rank());
        let shard = (comm.size() > 1).then_some(Shard { rank: comm.rank(), ranks: comm.size(), first: rows.start });
        let (out, seed) = (&config.output, config.seed);
        let mut layer = OutputLayer::with_rows(rows, d_model, &out.layer, &out.optimizer, seed)?;
        let (labels, k) = (&data.train.labels, data.n_classes);
        let label_counts = || {
            let mut counts = vec![0u64; k];
            labels.labels.iter().for_each(|&c| counts[c as usize] += 1);
            counts
        };
        let problem = Problem { n_classes: k, n_data: data.train.len(), dim: d_model, label_counts: &label_counts };
        let crate::estimators::RunEstimator { built, warmup } = crate::estimators::build(&config, &problem)?;
        crate::estimators::attach_index(&mut layer, &built, &config, k, comm.size())?;
        if shard.is_some() {
            check_sharded_estimator(built.estimator.as_ref(), comm.size())?;
            if let Some(w) = &warmup {
                check_sharded_estimator(w.as_ref(), comm.size())?;
            }
        }
        let reference = built.reference();
        let Built { estimator, loss, search, .. } = built;
        let (loss, search_top) = (loss.boxed(), search.map_or(0, |s| s.top));
        if estimator.single_label() {
            let (most, i) = data.train.labels.most_labels();
            if most > 1 {
                return Err(Error::Key(ConfigError::key(
                    "data.first_label",
                    format!(
                        "output.estimator = \"{}\" models one label per sample, but training sample {i} has {most} \
                     labels; set data.first_label = true (the A&R paper keeps each sample's first label)",
                        estimator.name()
                    ),
                )));
            }
        }
        let mut trainer = Self {
            config,
            data,
            encoder,
            layer,
            estimator,
            warmup,
            search_top,
            reference,
            last_recall: None,
            loss,
            state: State::default(),
            phi: Matrix::default(),
            shard,
        };
        if trainer.config.output.layer.init == LayerInit::Msi {
            trainer.init_msi()?;
        }
        Ok(trainer)
    }

    /// Sets W (and the bias) by the mean-separating initialisation over the features of the
    /// training set as the encoder computes them now (one pass).
    fn init_msi(&mut self) -> Result<(), Error> {
        let start = Instant::now();
        let (train, batch) = (&self.data.train, self.config.eval.batch_size);
        let mut sums = farout_linear::init::OutputLayerMsi::new(train.labels.n_labels, self.layer.d_model());
        let mut row_norms = 0.0f64;
        for start in (0..train.len()).step_by(batch) {
            let idx: Vec<usize> = (start..(start + batch).min(train.len())).collect();
            let phi = self.features(train, &idx);
            for (row, &i) in phi.as_slice().chunks_exact(phi.cols().max(1)).zip(&idx) {
                sums.add(row, train.labels.get(i));
                row_norms += farout_core::kernels::norm(row) as f64;
            }
        }
        let cfg = &self.config.output.layer;
        // Without a bias only x̄ can score msi_t: a small x̄ takes a large multiple of it.
        let mean_row_norm = row_norms / train.len().max(1) as f64;
        if !cfg.bias && cfg.msi_t != 0.0 && sums.mean_norm() < 0.1 * mean_row_norm {
            log::warn!(
                "output.layer.init = \"msi\" without a bias: the mean of the training features has norm {:.3} \
                 against {:.3} for a row, so scoring it msi_t = {} puts a large multiple of it into every row of W; \
                 msi_t = 0.0 (or output.layer.bias = true) avoids that",
                sums.mean_norm(),
                mean_row_norm,
                cfg.msi_t
            );
        }
        let msi = farout_linear::Msi { s: cfg.msi_s as f64, t: cfg.msi_t as f64 };
        let (w, b) = sums.finish(cfg.bias, msi);
        // This rank's rows of the K x D initialisation (all of them in one process).
        let (k, d) = (self.layer.n_classes(), self.layer.d_model());
        let first = self.shard.map_or(0, |s| s.first);
        let (w, b) = if self.shard.is_some() {
            (w[first * d..(first + k) * d].to_vec(), b.get(first..first + k).map(<[f32]>::to_vec).unwrap_or_default())
        } else {
            (w, b)
        };
        self.layer.set_weights(Matrix::from_vec(k, d, w).expect("K x D weights"))?;
        if cfg.bias {
            self.layer.set_bias(b)?;
        }
        log::info!("output layer: mean-separating initialisation in {:.2} s", start.elapsed().as_secs_f64());
        Ok(())
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

    /// Features of rows `idx` of `ds` (no gradient tracking).
    fn features(&self, ds: &Dataset, idx: &[usize]) -> Matrix {
        match (&ds.features, &self.encoder) {
            (Features::Dense(m), _) => gather_rows(m, idx),
            (Features::Sparse(s), Encoder::Doc(enc)) => enc.encode(&idx.iter().map(|&i| s.row(i)).collect::<Vec<_>>()),
            (Features::Sparse(_), Encoder::Face(_)) => {
                unreachable!("config check pairs face_head with dense data")
            }
        }
    }

    /// The output layer's search problem, its rows: W, with the bias as a last column when the
    /// layer has one, so that [`Trainer::feature_rows`] · rowsᵀ are the layer's scores (a
    /// class-sharded layer gives its own rows).
    pub fn class_rows(&self) -> Matrix {
        let w = self.layer.weights();
        let Some(bias) = self.layer.bias() else { return w.clone() };
        let d = w.cols();
        let mut rows = Matrix::zeros(w.rows(), d + 1);
        for (k, &b) in bias.iter().enumerate() {
            rows.row_mut(k)[..d].copy_from_slice(w.row(k));
            rows.row_mut(k)[d] = b;
        }
        rows
    }

    /// The queries of the output layer's search: the encoder's features of every sample of
    /// `ds`, with a trailing 1 when the layer has a bias ([`Trainer::class_rows`]).
    pub fn feature_rows(&self, ds: &Dataset) -> Matrix {
        let d = self.layer.d_model();
        let cols = d + usize::from(self.layer.bias().is_some());
        let mut rows = Matrix::zeros(ds.len(), cols);
        let Ok(()) = self.feature_batches(ds, ds.len(), self.config.eval.batch_size, |idx, phi| {
            for (r, &i) in idx.iter().enumerate() {
                let row = rows.row_mut(i);
                row[..d].copy_from_slice(phi.row(r));
                if cols > d {
                    row[d] = 1.0;
                }
            }
            Ok::<_, std::convert::Infallible>(())
        });
        rows
    }

    /// Evaluates on (the first `max_samples`, 0 = all, of) `ds`: P@k, nDCG@k, exact loss.
    pub fn evaluate(&self, ds: &Dataset, max_samples: usize) -> BTreeMap<String, f64> {
        debug_assert!(self.shard.is_none(), "a class-sharded layer evaluates with evaluate_on");
        let n = if max_samples == 0 { ds.len() } else { ds.len().min(max_samples) };
        let mut sums = RankingSums::default();
        self.scored_batches(ds, n, |idx, z| {
            let k = z.cols();
            let part = z
                .as_slice()
                .par_chunks(k)
                .zip(idx.par_iter())
                .fold(
                    || (RankingSums::default(), Vec::new(), Vec::new(), LossScratch::default()),
                    |(mut s, mut hits, mut grad, mut scratch), (row, &i)| {
                        let pos = ds.labels.get(i);
                        top_k(row, 5, &mut hits);
                        grad.resize(k, 0.0);
                        let l = if pos.is_empty() {
                            0.0
                        } else {
                            self.loss.value_and_grad(row, pos, &mut grad, &mut scratch)
                        };
                        s.add(&hits, pos, l as f64);
                        (s, hits, grad, scratch)
                    },
                )
                .map(|t| t.0)
                .reduce(RankingSums::default, |mut a, b| {
                    a.merge(&b);
                    a
                });
            sums.merge(&part);
            Ok(())
        })
        .expect("one process does not communicate");
        sums.finish(ds.labels.is_multiclass())
    }

    /// Scores the first `n` samples of `ds` batch by batch (`eval.batch_size` rows, fewer when
    /// their scores would take more than [`EVAL_SCORE_BYTES`]): `f(idx, z)` with the batch's
    /// sample indices and their scores over this rank's classes.
    fn scored_batches(
        &self,
        ds: &Dataset,
        n: usize,
        mut f: impl FnMut(&[usize], &Matrix) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let per_row = 4 * self.layer.n_classes().max(1);
        let rows = self.config.eval.batch_size.min((EVAL_SCORE_BYTES / per_row).max(1));
        let mut z = Matrix::default();
        self.feature_batches(ds, n, rows, |idx, phi| {
            self.layer.scores(phi, &mut z);
            f(idx, &z)
        })
    }

    /// Runs `f(idx, features)` on the first `n` samples of `ds` in batches of `rows`.
    fn feature_batches<E>(
        &self,
        ds: &Dataset,
        n: usize,
        rows: usize,
        mut f: impl FnMut(&[usize], &Matrix) -> Result<(), E>,
    ) -> Result<(), E> {
        for start in (0..n).step_by(rows) {
            let idx: Vec<usize> = (start..(start + rows).min(n)).collect();
            f(&idx, &self.features(ds, &idx))?;
        }
        Ok(())
    }

    /// [`Trainer::evaluate`] as one of the ranks of `comm`: with a class-sharded layer, the
    /// ranks' top-5 are merged and the softmax loss combines their normalisers; the same
    /// metrics on every rank. Other losses (the smoothed margin's projection needs every score
    /// of a row in one place) are left out of a class-sharded layer's metrics.
    pub fn evaluate_on(
        &self,
        ds: &Dataset,
        max_samples: usize,
        comm: &dyn Collective,
    ) -> Result<BTreeMap<String, f64>, Error> {
        let Some(shard) = self.shard else { return Ok(self.evaluate(ds, max_samples)) };
        let n = if max_samples == 0 { ds.len() } else { ds.len().min(max_samples) };
        let softmax = self.loss.name() == "softmax";
        let mut sums = RankingSums::default();
        self.scored_batches(ds, n, |idx, z| {
            let positives: Vec<&[ClassId]> = idx.iter().map(|&i| ds.labels.get(i)).collect();
            let hits = sharded::merged_top_k(comm, z, shard.first, 5)?;
            let losses = if softmax {
                sharded::softmax_losses(comm, z, shard.first, &positives)?
            } else {
                vec![0.0; positives.len()]
            };
            for ((h, pos), l) in hits.iter().zip(&positives).zip(losses) {
                sums.add(h, pos, l);
            }
            Ok(())
        })?;
        let mut metrics = sums.finish(ds.labels.is_multiclass());
        if !softmax {
            metrics.remove("loss");
        }
        Ok(metrics)
    }

    /// The top-`k` classes with scores for every sample of `ds`.
    pub fn predict(&self, ds: &Dataset, k: usize) -> Vec<Vec<Hit>> {
        self.predict_on(ds, k, &Local).expect("one process does not communicate")
    }

    /// [`Trainer::predict`] as one of the ranks of `comm` (a class-sharded layer merges the
    /// ranks' top-k); the same predictions on every rank.
    pub fn predict_on(&self, ds: &Dataset, k: usize, comm: &dyn Collective) -> Result<Vec<Vec<Hit>>, Error> {
        let first = self.shard.map_or(0, |s| s.first);
        let mut out = Vec::with_capacity(ds.len());
        self.scored_batches(ds, ds.len(), |_, z| {
            out.extend(sharded::merged_top_k(comm, z, first, k)?);
            Ok(())
        })?;
        Ok(out)
    }

    /// Loads a data file in the config's format for prediction (features of the training set's
    /// dimension; labels optional).
    pub fn load_input(&self, path: &Path, labels: Option<&Path>) -> Result<Dataset, Error> {
        let mut ds = data::load_split(&self.config, path, labels, Some(&self.data.train))?;
        data::prepare(&self.config, self.data.idf.as_deref(), &mut ds);
        if let Encoder::Face(head) = &self.encoder {
            embed_in_place(head, &mut ds, self.config.eval.batch_size);
        }
        Ok(ds)
    }

    /// Trains to the end of the configured epochs (or `max_steps`, or `max_seconds`),
    /// evaluating, logging and checkpointing along the way; returns the summary.
    pub fn run(&mut self) -> Result<Summary, Error> {
        self.run_on(&Local)
    }

    /// [`Trainer::run`] as one of the ranks of `comm`: every rank takes the same steps on the
    /// same batches; rank 0 logs, shows progress and writes the metrics.
    pub fn run_on(&mut self, comm: &dyn Collective) -> Result<Summary, Error> {
        let mut run = self.open_run(comm)?;
        while self.state.epoch < self.config.train.epochs && !self.stopped(&run) {
            let order = self.epoch_order();
            let batches: Vec<&[usize]> = order.chunks(self.config.train.batch_size).collect();
            while self.state.batch_in_epoch < batches.len() && !self.stopped(&run) {
                let idx = batches[self.state.batch_in_epoch];
                let step = self.train_batch(idx, comm)?;
                self.after_step(&mut run, idx, &step, comm)?;
            }
            if self.state.batch_in_epoch == batches.len() {
                self.end_epoch(&mut run, comm)?;
            }
        }
        self.finish(run, comm)
    }

    /// Opens the logs (rank 0's) and the progress bar of a run starting (or resuming) at the
    /// current step.
    fn open_run(&self, comm: &dyn Collective) -> Result<RunLog, Error> {
        let cfg = &self.config;
        let log_dir = cfg.log_dir();
        let sinks = Sinks::open_on_root(comm, &log_dir, &cfg.log, self.state.step == 0)?;
        let steps_per_epoch = self.steps_per_epoch();
        let mut total_steps = steps_per_epoch * cfg.train.epochs as u64;
        if cfg.train.max_steps > 0 {
            total_steps = total_steps.min(cfg.train.max_steps);
        }
        let bar = progress_bar(
            cfg.log.progress && comm.is_root(),
            total_steps,
            "{prefix} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} steps, ETA {eta} | {msg}",
        );
        bar.set_prefix(format!("{} ({})", cfg.name, self.estimator.name()));
        bar.set_position(self.state.step);
        Ok(RunLog {
            sinks,
            bar,
            total_steps,
            steps_per_epoch,
            window: Window::default(),
            window_start: self.state.step,
            last_eval: String::new(),
        })
    }

    /// Optimisation steps in one epoch.
    fn steps_per_epoch(&self) -> u64 {
        self.data.train.len().div_ceil(self.config.train.batch_size) as u64
    }

    /// Whether the run is over: all steps taken or the time budget spent.
    fn stopped(&self, run: &RunLog) -> bool {
        let max_seconds = self.config.train.max_seconds;
        self.state.step >= run.total_steps || (max_seconds > 0.0 && self.state.train_seconds >= max_seconds)
    }

    /// The current epoch's sample order (a function of the seed and the epoch, so a resumed
    /// run sees the same batches).
    fn epoch_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.data.train.len()).collect();
        rng::shuffle(&mut order, &mut rng::seeded(self.config.seed, 1 + self.state.epoch as u64));
        order
    }

    /// One optimisation step on the training samples `idx`: encoder forward, the estimator's
    /// gradient and the layer update, encoder backward. Stops the run (keeping the last
    /// checkpoint) if the loss is not finite.
    fn train_batch(&mut self, idx: &[usize], comm: &dyn Collective) -> Result<StepResult, Error> {
        let t0 = Instant::now();
        let positives: Vec<&[ClassId]> = idx.iter().map(|&i| self.data.train.labels.get(i)).collect();
        let class_chunk = self.config.output.class_chunk;
        // The same generator on every rank: sampling estimators draw the same classes.
        let mut step_rng = rng::seeded(self.config.seed ^ 0xE57, self.state.step);
        let estimator: &dyn GradientEstimator = match &self.warmup {
            Some(w) if self.state.step < self.config.output.warmup_steps => w.as_ref(),
            _ => self.estimator.as_ref(),
        };
        let sharded = self.shard.is_some() || class_chunk > 0;
        let (first, k) = (self.shard.map_or(0, |s| s.first), self.data.n_classes);
        let stats = match (&mut self.encoder, &self.data.train.features) {
            (Encoder::Face(_), Features::Dense(m)) => {
                gather_rows_into(m, idx, &mut self.phi);
                if sharded {
                    let (layer, phi) = (&mut self.layer, &self.phi);
                    let on = ShardedStep { layer, first, k, comm, class_chunk };
                    on.step(estimator, Batch::new(phi, &positives).with_ids(idx), &mut step_rng, false)?
                } else {
                    let batch = Batch::new(&self.phi, &positives).with_ids(idx);
                    self.layer.train_step(estimator, batch, &mut step_rng, false)
                }
            }
            (Encoder::Doc(enc), Features::Sparse(s)) if sharded => {
                // Data parallel: each rank encodes its share of the batch, the ranks gather the
                // features for the class-sharded layer, and each backpropagates its rows of
                // dL/dphi; the encoder's gradients are summed over the ranks, so every rank's
                // copy of the encoder takes the same step. Dropout masks come from a generator
                // of the rank's own.
                let (ranks, rank) = (comm.size(), comm.rank());
                let part = |r: usize| idx.len() * r / ranks..idx.len() * (r + 1) / ranks;
                let mine = part(rank);
                let docs: Vec<_> = idx[mine.clone()].iter().map(|&i| s.row(i)).collect();
                let mut dropout_rng =
                    rng::seeded(self.config.seed ^ 0xD20, self.state.step * ranks as u64 + rank as u64);
                let fwd = enc.forward(&docs, &mut dropout_rng);
                let d = enc.d_model();
                let counts: Vec<usize> = (0..ranks).map(|r| part(r).len() * d).collect();
                self.phi.reshape_for_overwrite(idx.len(), d);
                comm.allgatherv_f32(bridge::to_matrix(fwd.phi.clone()).as_slice(), &counts, self.phi.as_mut_slice())?;
                let (layer, phi) = (&mut self.layer, &self.phi);
                let on = ShardedStep { layer, first, k, comm, class_chunk };
                let stats = on.step(estimator, Batch::new(phi, &positives).with_ids(idx), &mut step_rng, true)?;
                if stats.loss_sum.is_finite() {
                    let rows = &self.layer.dphi().as_slice()[mine.start * d..mine.end * d];
                    let grads = enc.gradients(fwd, &Matrix::from_vec(mine.len(), d, rows.to_vec()).expect("rows of D"));
                    enc.apply(&crate::dist::sum_doc_grads(comm, grads)?);
                }
                stats
            }
            (Encoder::Doc(enc), Features::Sparse(s)) => {
                let docs: Vec<_> = idx.iter().map(|&i| s.row(i)).collect();
                let fwd = enc.forward(&docs, &mut step_rng);
                let phi = bridge::to_matrix(fwd.phi.clone());
                let batch = Batch::new(&phi, &positives).with_ids(idx);
                let stats = self.layer.train_step(estimator, batch, &mut step_rng, true);
                if stats.loss_sum.is_finite() {
                    enc.backward(fwd, self.layer.dphi());
                }
                stats
            }
            _ => unreachable!("config check pairs encoders with their data"),
        };
        self.step_result(idx, stats, t0)
    }

    /// What a step on `idx` did, from its statistics; stops the run on divergence.
    fn step_result(&mut self, idx: &[usize], stats: farout_layer::StepStats, t0: Instant) -> Result<StepResult, Error> {
        if !stats.loss_sum.is_finite() {
            return Err(self.diverged(format!("loss = {}", stats.loss_sum)));
        }
        let mean = stats.loss_sum / idx.len().max(1) as f64;
        if self.state.step == 0 {
            self.state.initial_loss = mean;
        }
        let reference = self.state.initial_loss.max(1.0);
        if mean > BLOWUP * reference {
            return Err(self.diverged(format!(
                "mean loss {mean:.4e} is more than {BLOWUP} times the first step's {:.4}, or {BLOWUP}",
                self.state.initial_loss
            )));
        }
        Ok(StepResult {
            loss_sum: stats.loss_sum,
            samples: idx.len() as u64,
            classes_scored: stats.classes_scored as u64,
            rows_updated: stats.rows_updated as u64,
            seconds: t0.elapsed().as_secs_f64(),
        })
    }

    /// Counts a step, then logs, measures recall, evaluates and checkpoints when they are due.
    fn after_step(
        &mut self,
        run: &mut RunLog,
        idx: &[usize],
        step: &StepResult,
        comm: &dyn Collective,
    ) -> Result<(), Error> {
        let s = &mut self.state;
        s.step += 1;
        s.batch_in_epoch += 1;
        s.train_seconds += step.seconds;
        if comm.size() > 1 {
            // The run's time is its slowest rank's: every rank stops at the same step.
            let mut t = [s.train_seconds];
            comm.allreduce_max_f64(&mut t)?;
            s.train_seconds = t[0];
        }
        s.samples += step.samples;
        s.classes_scored += step.classes_scored;
        run.window.add(step);
        let step_no = s.step;
        let (index, eval, ck) = (&self.config.index, &self.config.eval, &self.config.checkpoint);
        let due = |every: u64| every > 0 && step_no.is_multiple_of(every);
        let (log_due, recall_due) =
            (due(self.config.train.log_every) || step_no == run.total_steps, due(index.recall_every));
        let (eval_due, checkpoint_due) = (due(eval.every_steps), ck.enabled && due(ck.every_steps));
        let (recall_queries, eval_samples) = (index.recall_queries, eval.max_samples);
        if log_due {
            self.log_window(run)?;
        }
        run.bar.set_position(step_no);
        if recall_due && self.layer.index().is_some() {
            self.measure_recall(run, &idx[..idx.len().min(recall_queries)])?;
        }
        if eval_due {
            run.last_eval = self.log_eval(&mut run.sinks, eval_samples, comm)?;
        }
        if checkpoint_due {
            self.save_checkpoint_on(comm)?;
        }
        Ok(())
    }

    /// Records the means over the steps since the last record and shows them on the progress bar.
    fn log_window(&self, run: &mut RunLog) -> Result<(), Error> {
        let w = &run.window;
        let loss = w.loss_sum / w.samples as f64;
        let samples_per_s = w.samples as f64 / w.seconds.max(1e-9);
        let steps = (self.state.step - run.window_start) as f64;
        let epoch = self.state.epoch as f64 + self.state.batch_in_epoch as f64 / run.steps_per_epoch as f64;
        run.sinks.record(
            self.state.step,
            self.state.train_seconds,
            &[
                ("train/loss", loss),
                ("train/samples_per_s", samples_per_s),
                ("train/lr", self.layer.lr() as f64),
                ("train/classes_scored_per_sample", w.classes_scored as f64 / w.samples as f64),
                ("train/rows_updated_per_step", w.rows_updated as f64 / steps),
                ("train/epoch", epoch),
            ],
        )?;
        // Every record reaches the file now: a killed run keeps its log up to its last window.
        run.sinks.flush()?;
        run.bar.set_message(format!("loss {loss:.4} | {samples_per_s:.0} samples/s{}", run.last_eval));
        run.window = Window::default();
        run.window_start = self.state.step;
        Ok(())
    }

    /// Measures the index's recall against brute force on the features of training samples
    /// `idx` and records it.
    fn measure_recall(&mut self, run: &mut RunLog, idx: &[usize]) -> Result<(), Error> {
        let queries = self.features(&self.data.train, idx);
        if let Some(r) = self.layer.index_recall(&queries, self.search_top) {
            self.last_recall = Some(r);
            let builds = self.layer.index_builds() as f64;
            let mut values = vec![("index/recall", r), ("index/builds", builds)];
            if let Some(probed) = self.layer.index_probes(self.search_top) {
                values.push(("index/probed", probed));
            }
            run.sinks.record(self.state.step, self.state.train_seconds, &values)?;
        }
        Ok(())
    }

    /// Closes an epoch: evaluates (unless evaluation is per step, or this was the last epoch,
    /// which [`Self::finish`] evaluates) and checkpoints.
    fn end_epoch(&mut self, run: &mut RunLog, comm: &dyn Collective) -> Result<(), Error> {
        self.state.epoch += 1;
        self.state.batch_in_epoch = 0;
        let cfg = &self.config;
        if cfg.eval.every_steps == 0 && self.state.epoch < cfg.train.epochs {
            run.last_eval = self.log_eval(&mut run.sinks, cfg.eval.max_samples, comm)?;
        }
        if cfg.checkpoint.enabled && cfg.checkpoint.every_steps == 0 {
            self.save_checkpoint_on(comm)?;
        }
        Ok(())
    }

    /// The final evaluation (test set, or the training set without one), checkpoint and summary.
    fn finish(&mut self, mut run: RunLog, comm: &dyn Collective) -> Result<Summary, Error> {
        run.bar.finish();
        let test = self.data.test.as_ref().filter(|t| !t.is_empty()).unwrap_or(&self.data.train);
        let metrics = self.evaluate_and_log(test, self.config.eval.final_max_samples, &mut run.sinks, comm)?;
        if self.config.checkpoint.enabled {
            self.save_checkpoint_on(comm)?;
        }
        let mut summary = self.summary(metrics);
        summary.grad_cosine = self.gradient_fidelity(256);
        summary.peak_rss_bytes = peak_rss_bytes();
        if comm.size() > 1 {
            // The layer's bytes add up over the ranks; the peak memory is the largest rank's.
            let mut bytes = [summary.model_bytes as u64];
            comm.allreduce_sum_u64(&mut bytes)?;
            let mut peak = [summary.peak_rss_bytes.unwrap_or(0) as f64];
            comm.allreduce_max_f64(&mut peak)?;
            summary.model_bytes = bytes[0] as usize;
            summary.peak_rss_bytes = summary.peak_rss_bytes.map(|_| peak[0] as u64);
        }
        Ok(summary)
    }

    /// Mean cosine between the estimator's `dL/dphi` and the exact one on the first `n`
    /// training samples (see [`Summary::grad_cosine`]); `None` for exact estimators. Runs the
    /// estimator's batch path (A&R state is read and updated as in a training step). `None`
    /// with a class-sharded layer too: the reference would need every rank's rows.
    pub fn gradient_fidelity(&self, n: usize) -> Option<f64> {
        if self.shard.is_some() || (self.estimator.uses_index() && self.layer.index().is_none()) {
            return None; // search never started (warm-up covered the run)
        }
        let reference = self.reference.as_ref()?;
        let idx: Vec<usize> = (0..n.min(self.data.train.len())).collect();
        let ctx = self.layer.ctx();
        // The exact gradient holds every score of its batch: as many rows at a time as an
        // evaluation batch.
        let rows = (EVAL_SCORE_BYTES / (4 * self.layer.n_classes().max(1))).max(1);
        let mut cos = 0.0;
        for (part, idx) in idx.chunks(rows).enumerate() {
            let phi = self.features(&self.data.train, idx);
            let positives: Vec<&[ClassId]> = idx.iter().map(|&i| self.data.train.labels.get(i)).collect();
            let batch = Batch::new(&phi, &positives).with_ids(idx);
            let dphi = |e: &dyn GradientEstimator| {
                let (mut g, mut out) = (farout_estimators::BatchGrad::default(), Matrix::default());
                e.estimate_batch(&ctx, batch, &mut rng::seeded(self.config.seed, 0xF1D + part as u64), &mut g);
                g.dphi(ctx.w, &mut out);
                out
            };
            let (a, b) = (dphi(self.estimator.as_ref()), dphi(reference.as_ref()));
            cos += (0..idx.len()).map(|i| farout_core::kernels::cosine(a.row(i), b.row(i)) as f64).sum::<f64>();
        }
        Some(cos / idx.len().max(1) as f64)
    }

    /// Periodic evaluation on the test set (if any); returns the progress-bar suffix.
    fn log_eval(&self, sinks: &mut Sinks, max_samples: usize, comm: &dyn Collective) -> Result<String, Error> {
        let Some(test) = self.data.test.as_ref().filter(|t| !t.is_empty()) else {
            return Ok(String::new());
        };
        let m = self.evaluate_and_log(test, max_samples, sinks, comm)?;
        Ok(format!(" | test p@1 {:.4}", m["p@1"]))
    }

    /// Evaluates on `ds` and records the metrics as `eval/<name>` at the current step.
    fn evaluate_and_log(
        &self,
        ds: &Dataset,
        max_samples: usize,
        sinks: &mut Sinks,
        comm: &dyn Collective,
    ) -> Result<BTreeMap<String, f64>, Error> {
        let m = self.evaluate_on(ds, max_samples, comm)?;
        let mut values: Vec<(String, f64)> = m.iter().map(|(k, v)| (format!("eval/{k}"), *v)).collect();
        // Epochs completed, fractional: the x axis of comparisons against epochs.
        let per_epoch = self.data.train.len().div_ceil(self.config.train.batch_size) as f64;
        values.push(("eval/epoch".into(), self.state.epoch as f64 + self.state.batch_in_epoch as f64 / per_epoch));
        let refs: Vec<(&str, f64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        sinks.record(self.state.step, self.state.train_seconds, &refs)?;
        sinks.flush()?;
        Ok(m)
    }

    fn summary(&self, metrics: BTreeMap<String, f64>) -> Summary {
        let s = &self.state;
        let encoder_bytes = match &self.encoder {
            Encoder::Face(_) => 0,
            Encoder::Doc(e) => e.memory_bytes(),
        };
        Summary {
            name: self.config.name.clone(),
            task: self.config.task(),
            estimator: self.estimator.name().to_string(),
            metrics,
            train_seconds: s.train_seconds,
            steps: s.step,
            epochs: s.epoch,
            samples_per_s: s.samples as f64 / s.train_seconds.max(1e-9),
            classes_scored_per_sample: s.classes_scored as f64 / s.samples.max(1) as f64,
            index_recall: self.last_recall,
            grad_cosine: None,
            model_bytes: self.layer.memory_bytes() + encoder_bytes,
            peak_rss_bytes: peak_rss_bytes(),
            n_classes: self.data.n_classes,
            d_model: self.layer.d_model(),
            n_train: self.data.train.len(),
            n_test: self.data.test.as_ref().map_or(0, |t| t.len()),
            seed: self.config.seed,
            log_dir: self.config.log_dir(),
            linear: None,
        }
    }

    /// This rank's checkpoint directory: the config's, or with a class-sharded layer its
    /// `rank-R-of-P` directory inside it.
    pub fn checkpoint_dir(&self) -> PathBuf {
        let dir = self.config.checkpoint_dir();
        match self.shard {
            Some(s) => dir.join(rank_checkpoint(s.rank, s.ranks)),
            None => dir,
        }
    }

    /// [`Trainer::save_checkpoint`] on every rank of `comm` (each its own rows); every rank
    /// learns if one failed.
    fn save_checkpoint_on(&self, comm: &dyn Collective) -> Result<PathBuf, Error> {
        crate::dist::agree(comm, self.save_checkpoint())
    }

    /// Writes the checkpoint atomically (see [`crate::checkpoint`]), after checking that the
    /// weights are finite: a checkpoint is never written from a diverged model.
    pub fn save_checkpoint(&self) -> Result<PathBuf, Error> {
        let dir = self.checkpoint_dir();
        if let Err(e) = self.check_weights_finite(&dir) {
            return Err(self.diverged(format!("non-finite weights ({e})")));
        }
        // The ranks of a sharded layer keep their previous checkpoint too (see load_checkpoint_on).
        crate::checkpoint::replace_dir_keeping(&dir, self.state.step, self.shard.is_some(), |tmp| {
            self.layer.save(&tmp.join("layer.bin"))?;
            if let Encoder::Doc(e) = &self.encoder {
                e.save(tmp)?;
            }
            if let Some(st) = self.estimator.sample_state() {
                crate::checkpoint::write_f32_file(&tmp.join("estimator_state.bin"), &st.to_vec())?;
            }
            let state = serde_json::to_string_pretty(&self.state).expect("state serialises");
            std::fs::write(tmp.join("state.json"), state)
                .map_err(|source| Error::Io { path: tmp.to_path_buf(), source })
        })
    }

    /// An error naming the first non-finite weight of the layer (W, bias) or of the document
    /// encoder (embedding table, hidden bias), as if they were files in `dir`.
    fn check_weights_finite(&self, dir: &Path) -> Result<(), Error> {
        let layer = dir.join("layer.bin");
        crate::checkpoint::check_finite(&layer, "output layer W", self.layer.weights().as_slice())?;
        if let Some(b) = self.layer.bias() {
            crate::checkpoint::check_finite(&layer, "output layer bias", b)?;
        }
        if let Encoder::Doc(e) = &self.encoder {
            crate::checkpoint::check_finite(&dir.join("table.bin"), "encoder embedding table", e.table().as_slice())?;
            crate::checkpoint::check_finite(&dir.join("hidden.bpk"), "encoder hidden bias", &e.hidden_bias())?;
        }
        Ok(())
    }

    /// The error that stops a diverged run: what went wrong, the checkpoint that is kept and
    /// the keys to change.
    fn diverged(&self, why: String) -> Error {
        let dir = self.checkpoint_dir();
        let kept = match crate::checkpoint::latest(&dir) {
            Ok(found) => {
                format!("the last good checkpoint (step {}) is kept at {}", found.progress, found.dir.display())
            }
            Err(_) => "no checkpoint had been written yet".into(),
        };
        let keys = match self.encoder {
            Encoder::Doc(_) => "output.optimizer.lr, model.doc_encoder.optimizer.lr",
            Encoder::Face(_) => "output.optimizer.lr",
        };
        Error::Diverged { step: self.state.step, why, kept, keys: keys.into() }
    }

    /// Restores layer, encoder and progress from the newest complete checkpoint in `dir` (or,
    /// after a save was interrupted, beside it: see [`crate::checkpoint`]). Files are checked
    /// against the checkpoint's manifest, and NaN or infinite weights are refused.
    pub fn load_checkpoint(&mut self, dir: &Path) -> Result<(), Error> {
        let dir = &crate::checkpoint::open(dir)?;
        let state: State = crate::checkpoint::read_state(dir, "training state")?;
        self.layer.load(&dir.join("layer.bin"))?;
        if let Encoder::Doc(e) = &mut self.encoder {
            e.load(dir)?;
        }
        if let Some(st) = self.estimator.sample_state() {
            // Per-sample variational state (A&R): its length is fixed by the training set.
            let mut vals = vec![0.0f32; st.len() * st.width()];
            let path = dir.join("estimator_state.bin");
            crate::checkpoint::read_f32_file(&path, &mut vals)?;
            crate::checkpoint::check_finite(&path, "estimator state", &vals)?;
            st.restore(&vals);
        }
        self.check_weights_finite(dir)?;
        self.state = state;
        Ok(())
    }

    /// Continues from the config's checkpoint directory.
    pub fn resume(&mut self) -> Result<(), Error> {
        self.resume_on(&Local)
    }

    /// Loads this rank's checkpoint of `dir` (the config's checkpoint directory by default):
    /// its `rank-R-of-P` directory for a class-sharded layer. A checkpoint written by another
    /// number of ranks, or ranks whose checkpoints are at different steps, are errors on every
    /// rank.
    pub fn load_checkpoint_on(&mut self, dir: &Path, comm: &dyn Collective) -> Result<(), Error> {
        let ranks = comm.size();
        let written = checkpoint_rank_counts(dir);
        let loaded = match (written.as_slice(), ranks) {
            ([], 1) => self.load_checkpoint(dir),
            ([p], _) if *p == ranks => self.load_checkpoint(&dir.join(rank_checkpoint(comm.rank(), ranks))),
            ([], _) => Err(Error::Checkpoint {
                path: dir.to_path_buf(),
                msg: format!("holds a checkpoint of one process, not of {ranks} MPI ranks: run without mpirun"),
            }),
            (found, _) => Err(Error::Checkpoint {
                path: dir.to_path_buf(),
                msg: format!(
                    "holds the checkpoints of {} MPI ranks; run with that many (mpirun -np {}), not {ranks}",
                    found.iter().map(usize::to_string).collect::<Vec<_>>().join(" and "),
                    found[0]
                ),
            }),
        };
        crate::dist::agree(comm, loaded)?;
        if ranks == 1 {
            return Ok(());
        }
        let (low, high) = step_range(comm, self.state.step)?;
        if low == high {
            return Ok(());
        }
        // A kill between the ranks' saves: the ranks ahead go back to the checkpoint they kept.
        let rank_dir = dir.join(rank_checkpoint(comm.rank(), ranks));
        let back = if self.state.step == low {
            Ok(())
        } else {
            match crate::checkpoint::at_progress(&rank_dir, low) {
                Some(back) => self.load_checkpoint(&back),
                None => Err(Error::Checkpoint {
                    path: dir.to_path_buf(),
                    msg: format!(
                        "the ranks' checkpoints are at steps {low} to {high} (a save was interrupted on some \
                         ranks), and rank {} kept none at step {low}",
                        comm.rank()
                    ),
                }),
            }
        };
        crate::dist::agree(comm, back)?;
        log::warn!("the save at step {high} did not finish on every rank: all ranks resume from step {low}");
        let (low, high) = step_range(comm, self.state.step)?;
        if low != high {
            return Err(Error::Checkpoint {
                path: dir.to_path_buf(),
                msg: format!(
                    "the ranks' checkpoints are at steps {low} to {high}: a save was interrupted on some ranks"
                ),
            });
        }
        Ok(())
    }

    /// [`Trainer::resume`] as one of the ranks of `comm`.
    pub fn resume_on(&mut self, comm: &dyn Collective) -> Result<(), Error> {
        let dir = self.config.checkpoint_dir();
        self.load_checkpoint_on(&dir, comm)
    }

    /// Steps taken so far.
    pub fn step(&self) -> u64 {
        self.state.step
    }
}

/// An error, before the model is allocated, if the output layer (W, its optimiser state and an
/// index's copy) and the document encoder's table (with its optimiser state) do not fit in the
/// memory available.
fn check_model_memory(config: &Config, data: &TaskData) -> Result<(), Error> {
    let (k, v) = (data.n_classes as u64, data.n_features as u64);
    let (d, table) = match config.model.encoder {
        EncoderKind::DocEncoder => {
            let d = config.model.doc_encoder.d_model as u64;
            (d, farout_core::resources::array_bytes(&[v, d, 2], 4))
        }
        _ => (v, 0),
    };
    let layer = farout_core::resources::array_bytes(&[k, d, 3], 4);
    let what = format!("the model ({k} classes x {d} output layer, {v} input features)");
    let change = "lower model.doc_encoder.d_model or the data's classes and features";
    Ok(farout_core::resources::check_memory(layer + table, what, change)?)
}

fn embed_in_place(head: &FaceHead, ds: &mut Dataset, batch: usize) {
    if let Features::Dense(m) = &ds.features {
        ds.features = Features::Dense(head.embed(m, batch.max(1024)));
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
