//! Linear extreme classifiers from a config: `[linear] solver = "dismec"` (or `"ppdsparse"`,
//! `"memoir"`) trains one of farout-linear's solvers on the features `[data]` names, with the
//! same data loading, progress bar, `metrics.jsonl` and summary as the network trainers, so
//! `farout compare` puts linear and neural runs in one table.
//!
//! The trained model is saved to `<checkpoint dir>/linear.model` (farout-linear's checked file
//! format, replaced atomically); `farout eval` and `farout predict` read it back.
//!
//! # Several MPI ranks
//!
//! DiSMEC and PPDSparse train every label on its own, so under `mpirun -np P` the labels are
//! split over the ranks: contiguous ranges balanced by label cost ([`label_shards`]), each rank
//! training its range with all of its threads. Rank r writes its labels to
//! `linear.model.<r>-of-<P>` and rank 0 the manifest `linear.shards.json` (the ranges and files).
//! Evaluation and prediction score each sample on every rank's labels and merge the per-rank
//! top-k ([`farout_dist::merge_top_k`]). A model trained on P ranks is read back by
//! any number of ranks: with P ranks each reads its own file; otherwise the shards are joined
//! and split again.
//! Every label is trained exactly as by one process, so the model equals the one-process model.
//!
//! MEMOIR trains all classes jointly: its class matrix W is split evenly over the ranks, as the
//! output layer is, and the ranks exchange each batch's most violating classes and scores
//! (`farout_linear::memoir`, "Several ranks"). Its model is saved, read and merged the same way.

use crate::config::{Config, ConfigError};
use crate::data::{self, TaskData};
use crate::dist::agree;
use crate::metrics::RankingSums;
use crate::report::progress_bar;
use crate::sinks::{MetricsSink, Sinks};
use crate::trainer::peak_rss_bytes;
use crate::{Error, Summary, io_err};
use farout_core::topk::Hit;
use farout_data::{Dataset, Features, SparseRows};
use farout_dist::{Collective, Shards, merge_top_k};
use farout_linear::{SolverConfig, SparseModel, TrainSet};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Checks of a linear config: the solver's parameters, data a linear model can read, and
/// no `[train]` key but `threads`.
pub(crate) fn check_config(config: &Config) -> Result<(), ConfigError> {
    let Some(solver) = &config.linear else {
        return Err(ConfigError::key("linear", "a linear config names its solver: [linear] solver = \"dismec\""));
    };
    solver.params().check().map_err(|e| ConfigError::param("linear", e))?;
    if config.data.format == crate::config::DataFormat::Text {
        return Err(ConfigError::key(
            "data.format",
            "a linear solver needs labelled features (xmc, npy, raw, synthetic_face or synthetic_xmc), not text",
        ));
    }
    let train = crate::config::TrainConfig { threads: config.train.threads, ..crate::config::TrainConfig::default() };
    if let Some(key) = crate::config::first_difference_key(&config.train, &train) {
        return Err(ConfigError::key(
            format!("train.{key}"),
            "does not apply to a linear solver (of [train], only `threads` does)",
        ));
    }
    crate::config::at_least_one("eval.batch_size", config.eval.batch_size)?;
    Ok(())
}

/// The model's file name in the checkpoint directory.
pub const MODEL_FILE: &str = "linear.model";

/// The manifest of a model saved as label shards by several ranks.
pub const SHARDS_FILE: &str = "linear.shards.json";

/// The file of rank `rank`'s labels in a model trained on `ranks` ranks.
pub fn shard_file(rank: usize, ranks: usize) -> String {
    format!("{MODEL_FILE}.{rank}-of-{ranks}")
}

/// [`SHARDS_FILE`]: which labels each shard file holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardManifest {
    /// Features of the model.
    pub n_features: usize,
    /// Labels of the whole model.
    pub n_labels: usize,
    /// The shards in rank order; they tile `0..n_labels`.
    pub shards: Vec<ShardEntry>,
}

/// One shard of a [`ShardManifest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardEntry {
    /// Its file, in the manifest's directory.
    pub file: String,
    /// Its first label.
    pub first: usize,
    /// Its number of labels.
    pub labels: usize,
}

/// A linear model, or this rank's share of its labels.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearModel {
    /// This rank's labels (all of them in a one-process run).
    pub model: SparseModel,
    /// The global id of `model`'s label 0.
    pub first: usize,
    /// The labels of the whole model.
    pub n_labels: usize,
}

impl LinearModel {
    /// A whole model (one process).
    pub fn whole(model: SparseModel) -> Self {
        let n_labels = model.n_labels();
        Self { model, first: 0, n_labels }
    }
}

/// Makes `fitted`'s summary the whole run's (on one rank, it is): returns the run's seconds
/// and the bytes of the model's files over all ranks.
fn whole_run_totals(
    comm: &dyn Collective,
    fitted: &mut farout_linear::Fitted,
    shards: &Shards,
) -> Result<(f64, usize), Error> {
    let (rank, ranks) = (comm.rank(), comm.size());
    // The run takes as long as its slowest rank; sizes add up over the shards.
    let mut rank_seconds = vec![0f64; ranks];
    rank_seconds[rank] = fitted.summary.seconds;
    comm.allreduce_sum_f64(&mut rank_seconds)?;
    let seconds = rank_seconds.iter().copied().fold(0.0, f64::max);
    let s = &mut fitted.summary;
    let mut sizes = [s.nnz_before_pruning as u64, s.nnz_after_pruning as u64, fitted.model.file_len() as u64];
    comm.allreduce_sum_u64(&mut sizes)?;
    (s.seconds, s.nnz_before_pruning, s.nnz_after_pruning) = (seconds, sizes[0] as usize, sizes[1] as usize);
    if ranks > 1 {
        s.stats = rank_stats(comm, &s.stats, &rank_seconds, shards)?;
    }
    Ok((seconds, sizes[2] as usize))
}

/// Rank 0's last record: the test metrics after the training seconds, at step `epochs`.
fn record_final(sinks: &mut Sinks, epochs: usize, seconds: f64, metrics: &BTreeMap<String, f64>) -> Result<(), Error> {
    // After the last epoch's record (step = epoch) for solvers with epochs.
    let epochs = epochs.max(1);
    let mut values: Vec<(String, f64)> = vec![("eval/epoch".into(), epochs as f64), ("train/seconds".into(), seconds)];
    values.extend(metrics.iter().map(|(k, v)| (format!("eval/{k}"), *v)));
    let values: Vec<(&str, f64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    sinks.record(epochs as u64, seconds, &values)?;
    sinks.flush()?;
    Ok(())
}

/// The split of `train`'s labels over `ranks` ranks: contiguous ranges whose largest cost is
/// smallest, a label costing its positives plus the mean positives of a label (a label's
/// solver touches every sample once per iteration, and more often the more positives it has).
pub fn label_shards(train: &TrainSet, ranks: usize) -> Result<Shards, Error> {
    let k = train.n_labels();
    let positives: Vec<u64> = (0..k).map(|j| train.labels.positives(j).len() as u64).collect();
    let mean = positives.iter().sum::<u64>().div_ceil(k.max(1) as u64).max(1);
    let weights: Vec<u64> = positives.iter().map(|&p| p + mean).collect();
    Ok(Shards::balanced(&weights, ranks)?)
}

/// A linear config with its data loaded (train, test and the training set's idf).
pub struct LinearRun {
    config: Config,
    data: TaskData,
}

/// farout-linear's progress sink: the progress bar, and for solvers with epochs (MEMOIR) a log
/// line and a `metrics.jsonl` / TensorBoard record per epoch as it ends (step = epoch).
struct Reporter<'a> {
    bar: ProgressBar,
    name: &'a str,
    start: Instant,
    epochs: Mutex<EpochLog<'a>>,
}

/// Where [`Reporter`] writes the epochs' records, and what it wrote.
struct EpochLog<'a> {
    sinks: &'a mut Sinks,
    /// The last epoch reported (0: none).
    last: usize,
    /// The first error writing a record.
    error: Option<Error>,
}

impl farout_linear::Progress for Reporter<'_> {
    fn begin(&self, total: u64, unit: &'static str) {
        self.bar.set_length(total);
        self.bar.set_message(unit);
    }

    fn advance(&self, n: u64) {
        self.bar.inc(n);
    }

    fn epoch(&self, epoch: usize, values: &[(&'static str, f64)]) {
        let text: Vec<String> = values
            .iter()
            .map(|(k, v)| {
                let k = k.trim_start_matches("train/");
                if v.abs() >= 100.0 { format!("{k} {v:.0}") } else { format!("{k} {v:.4}") }
            })
            .collect();
        log::info!("{}: epoch {epoch}: {}", self.name, text.join(", "));
        let mut values = values.to_vec();
        values.push(("train/epoch", epoch as f64));
        let mut log = self.epochs.lock().unwrap_or_else(|e| e.into_inner());
        let written = log
            .sinks
            .record(epoch as u64, self.start.elapsed().as_secs_f64(), &values)
            .and_then(|()| log.sinks.flush());
        log.last = epoch;
        if let (Err(e), None) = (written, &log.error) {
            log.error = Some(e);
        }
    }
}

impl LinearRun {
    /// Loads the data of `config`, which must have a `[linear]` section.
    pub fn new(config: Config) -> Result<Self, Error> {
        if config.linear.is_none() {
            return Err(Error::NoData("the config has no [linear] section"));
        }
        let data = data::load(&config)?;
        if data.train.is_empty() {
            return Err(Error::NoData("the training set is empty"));
        }
        Ok(Self { config, data })
    }

    /// The solver's parameters.
    fn solver(&self) -> &SolverConfig {
        self.config.linear.as_ref().expect("checked by LinearRun::new")
    }

    /// The loaded train and test sets.
    pub fn data(&self) -> &TaskData {
        &self.data
    }

    /// Where the model of this config is saved: `<checkpoint dir>/linear.model`, or in `dir`.
    pub fn model_path(&self, dir: Option<&Path>) -> PathBuf {
        dir.map_or_else(|| self.config.checkpoint_dir(), Path::to_path_buf).join(MODEL_FILE)
    }

    /// Trains, evaluates on the test set (the training set when there is none), logs, saves
    /// the model (unless `checkpoint.enabled = false`) and returns the summary. With several
    /// ranks, each trains its share of the labels (see the module docs); only rank 0 logs.
    pub fn train(&self, comm: &dyn Collective) -> Result<Summary, Error> {
        self.train_from(comm, None)
    }

    /// [`LinearRun::train`], the solver starting from the model saved in the checkpoint
    /// directory `start` when given (a warm start: see [`farout_linear::FromModel`]); an error
    /// for a solver that cannot take one, or a model of other features or labels.
    pub fn train_from(&self, comm: &dyn Collective, start: Option<&Path>) -> Result<Summary, Error> {
        let cfg = &self.config;
        let start = match start {
            Some(dir) => Some(self.warm_start(dir)?),
            None => None,
        };
        let (rank, ranks) = (comm.rank(), comm.size());
        let log_dir = cfg.log_dir();
        let mut sinks = Sinks::open_on_root(comm, &log_dir, &cfg.log, true)?;
        let train = TrainSet::from_dataset(&self.data.train)?;
        let shards = self.label_split(&train, ranks)?;
        let labels = shards.range(rank);
        self.log_start(&train, ranks);
        let (mut fitted, epochs) = self.fit(&train, &shards, comm, &mut sinks, start)?;
        let n_labels = train.n_labels();
        drop(train);
        let (seconds, model_bytes) = whole_run_totals(comm, &mut fitted, &shards)?;
        let model = LinearModel { model: fitted.model, first: labels.start, n_labels };
        let test = self.data.test.as_ref().filter(|t| !t.is_empty()).unwrap_or(&self.data.train);
        let metrics = evaluate(&model, test, cfg.eval.final_max_samples, comm)?;
        if comm.is_root() {
            record_final(&mut sinks, epochs, seconds, &metrics)?;
        }
        if cfg.checkpoint.enabled {
            let path = self.save(&model, comm)?;
            log::info!("saved the model to {}", path.display());
        }
        Ok(self.summary(metrics, seconds, model_bytes, log_dir, &fitted.summary))
    }

    /// The whole model saved in the checkpoint directory `dir` (every rank reads all of it),
    /// checked against the data, as the start of a warm-started fit.
    fn warm_start(&self, dir: &Path) -> Result<Arc<SparseModel>, Error> {
        if !self.solver().params().warm_starts() {
            let msg = format!(
                "linear.solver = {:?} cannot start from an earlier model (\"dismec\" can)",
                self.solver().name()
            );
            return Err(Error::Option { name: "warm-start", msg });
        }
        let m = self.load_share(dir, &farout_dist::Local)?;
        Ok(Arc::new(m.model))
    }

    /// The labels of each of `ranks` ranks: balanced by cost for the solvers that train every
    /// label on its own, else an even split of the classes.
    fn label_split(&self, train: &TrainSet, ranks: usize) -> Result<Shards, Error> {
        if self.solver().params().label_parallel() {
            label_shards(train, ranks)
        } else {
            Ok(Shards::even(train.n_labels(), ranks)?)
        }
    }

    /// Logs what is trained on what.
    fn log_start(&self, train: &TrainSet, ranks: usize) {
        let ranks_note = if ranks > 1 { format!(", {ranks} MPI ranks") } else { String::new() };
        log::info!(
            "{}: {} on {} samples, {} features, {} labels, {} threads{ranks_note}",
            self.config.name,
            self.solver().name(),
            train.n_samples(),
            train.n_features(),
            train.n_labels(),
            rayon::current_num_threads()
        );
    }

    /// Fits this rank's `shards` of the labels with a progress bar, writing per-epoch records
    /// to `sinks`; fails on every rank if it failed on one. Returns the fitted shard and the
    /// last epoch reported (0: none).
    fn fit(
        &self,
        train: &TrainSet,
        shards: &Shards,
        comm: &dyn Collective,
        sinks: &mut Sinks,
        start: Option<Arc<SparseModel>>,
    ) -> Result<(farout_linear::Fitted, usize), Error> {
        let (cfg, solver) = (&self.config, self.solver());
        let bar = progress_bar(
            cfg.log.progress && comm.is_root(),
            0,
            "{prefix} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} {msg}, ETA {eta}",
        );
        let of_rank = if comm.size() > 1 { ", rank 0's labels" } else { "" };
        bar.set_prefix(format!("{} ({}{of_rank})", cfg.name, solver.name()));
        let reporter = Reporter {
            bar: bar.clone(),
            name: &cfg.name,
            start: Instant::now(),
            epochs: Mutex::new(EpochLog { sinks, last: 0, error: None }),
        };
        let fitted = match start {
            Some(m) => solver.params().fit_labels_from(train, shards.range(comm.rank()), m, &reporter),
            None => solver.params().fit_shard(train, shards, comm, &reporter),
        }
        .map_err(Error::from);
        let EpochLog { last: epochs, error, .. } = reporter.epochs.into_inner().unwrap_or_else(|e| e.into_inner());
        let fitted = agree(comm, fitted.and_then(|f| error.map_or(Ok(f), Err)))?;
        bar.finish();
        Ok((fitted, epochs))
    }

    /// The run's summary.
    fn summary(
        &self,
        metrics: BTreeMap<String, f64>,
        seconds: f64,
        model_bytes: usize,
        log_dir: PathBuf,
        fitted: &farout_linear::FitSummary,
    ) -> Summary {
        let cfg = &self.config;
        let n_train = self.data.train.len();
        Summary {
            name: cfg.name.clone(),
            task: cfg.task(),
            estimator: self.solver().name().to_string(),
            metrics,
            selection: None,
            train_seconds: seconds,
            steps: 1,
            epochs: 1,
            samples_per_s: n_train as f64 / seconds.max(1e-9),
            classes_scored_per_sample: self.data.n_classes as f64,
            index_recall: None,
            grad_cosine: None,
            model_bytes,
            peak_rss_bytes: peak_rss_bytes(),
            n_classes: self.data.n_classes,
            d_model: self.data.n_features,
            n_train,
            n_test: self.data.test.as_ref().map_or(0, |t| t.len()),
            seed: cfg.seed,
            log_dir,
            linear: Some(serde_json::to_value(fitted).expect("summaries serialise")),
        }
    }

    /// Saves `model` in the checkpoint directory: `linear.model` from one process; from
    /// several ranks, one shard file per rank and the manifest, written by rank 0 once every
    /// shard is on disk. Returns the file a user would name (the model or the manifest).
    fn save(&self, model: &LinearModel, comm: &dyn Collective) -> Result<PathBuf, Error> {
        let dir = self.config.checkpoint_dir();
        let (rank, ranks) = (comm.rank(), comm.size());
        let file = if ranks == 1 { MODEL_FILE.to_string() } else { shard_file(rank, ranks) };
        let path = dir.join(&file);
        let written = std::fs::create_dir_all(&dir).map_err(io_err(&dir)).and_then(|()| Ok(model.model.save(&path)?));
        agree(comm, written)?;
        if ranks == 1 {
            return Ok(path);
        }
        let first = u32::try_from(model.first).map_err(|_| Error::NoData("more than 2^32 labels"))?;
        let mut ranges = vec![0u32; 2 * ranks];
        comm.allgather_u32(&[first, model.model.n_labels() as u32], &mut ranges)?;
        let manifest = dir.join(SHARDS_FILE);
        let written = if comm.is_root() {
            let shards = (0..ranks)
                .map(|r| ShardEntry {
                    file: shard_file(r, ranks),
                    first: ranges[2 * r] as usize,
                    labels: ranges[2 * r + 1] as usize,
                })
                .collect();
            let m = ShardManifest { n_features: model.model.n_features(), n_labels: model.n_labels, shards };
            let json = serde_json::to_string_pretty(&m).expect("manifests serialise");
            farout_core::binio::write_atomically(&manifest, json.as_bytes())
                .map_err(|(path, source)| Error::Io { path, source })
        } else {
            Ok(())
        };
        agree(comm, written)?;
        Ok(manifest)
    }

    /// Reads the model saved by [`LinearRun::train`] (from `dir`, default the checkpoint
    /// directory), this rank's labels of it, and checks that it fits the data.
    pub fn load_model(&self, dir: Option<&Path>, comm: &dyn Collective) -> Result<LinearModel, Error> {
        let dir = dir.map_or_else(|| self.config.checkpoint_dir(), Path::to_path_buf);
        let loaded = self.load_share(&dir, comm);
        agree(comm, loaded)
    }

    fn load_share(&self, dir: &Path, comm: &dyn Collective) -> Result<LinearModel, Error> {
        let (whole, manifest) = (dir.join(MODEL_FILE), dir.join(SHARDS_FILE));
        let (rank, ranks) = (comm.rank(), comm.size());
        let model = if whole.exists() || !manifest.exists() {
            let model = SparseModel::load(&whole)?;
            self.check_fits(&whole, model.n_features(), model.n_labels())?;
            model
        } else {
            let m = read_manifest(&manifest)?;
            self.check_fits(&manifest, m.n_features, m.n_labels)?;
            let load = |e: &ShardEntry| -> Result<SparseModel, Error> {
                let path = dir.join(&e.file);
                let shard = SparseModel::load(&path)?;
                if shard.n_features() != m.n_features || shard.n_labels() != e.labels {
                    return Err(Error::DataMismatch {
                        path,
                        msg: format!(
                            "holds {} labels of {} features, the manifest says {} of {}",
                            shard.n_labels(),
                            shard.n_features(),
                            e.labels,
                            m.n_features
                        ),
                    });
                }
                Ok(shard)
            };
            if m.shards.len() == ranks {
                let e = &m.shards[rank];
                return Ok(LinearModel { model: load(e)?, first: e.first, n_labels: m.n_labels });
            }
            let parts = m.shards.iter().map(load).collect::<Result<Vec<_>, _>>()?;
            SparseModel::concat(&parts).expect("shards checked against the manifest")
        };
        let n_labels = model.n_labels();
        if ranks == 1 {
            return Ok(LinearModel::whole(model));
        }
        let labels = Shards::even(n_labels, ranks)?.range(rank);
        let share = model.slice(labels.clone()).expect("a shard of the model's labels");
        Ok(LinearModel { model: share, first: labels.start, n_labels })
    }

    /// A model (or manifest) at `path` of `n_features` x `n_labels` must fit the data.
    fn check_fits(&self, path: &Path, n_features: usize, n_labels: usize) -> Result<(), Error> {
        if n_features == self.data.n_features && n_labels == self.data.n_classes {
            return Ok(());
        }
        Err(Error::DataMismatch {
            path: path.to_path_buf(),
            msg: format!(
                "the model has {n_features} features and {n_labels} labels, the data {} and {}",
                self.data.n_features, self.data.n_classes
            ),
        })
    }

    /// A file to predict on, read and transformed as the training set was.
    pub fn load_input(&self, path: &Path, labels: Option<&Path>) -> Result<Dataset, Error> {
        let mut ds = data::load_split(&self.config, path, labels, Some(&self.data.train))?;
        data::prepare(&self.config, self.data.idf.as_deref(), &mut ds);
        Ok(ds)
    }
}

/// The solver statistics of a run on several ranks: the ranks' labels and seconds, every rank's
/// own statistics (`per_rank`), and the counters (keys ending in `_total`) summed over ranks.
fn rank_stats(
    comm: &dyn Collective,
    mine: &serde_json::Map<String, serde_json::Value>,
    rank_seconds: &[f64],
    shards: &Shards,
) -> Result<serde_json::Map<String, serde_json::Value>, Error> {
    let bytes = serde_json::to_vec(mine).expect("statistics serialise");
    let per_rank: Vec<serde_json::Value> = crate::dist::allgather_bytes(comm, &bytes)?
        .iter()
        .map(|b| serde_json::from_slice(b).expect("a rank's statistics, serialised above"))
        .collect();
    let mut stats = serde_json::Map::new();
    stats.insert("ranks".into(), comm.size().into());
    stats.insert("rank_labels".into(), serde_json::json!(shards.counts()));
    stats.insert("rank_seconds".into(), serde_json::json!(rank_seconds));
    for key in mine.keys().filter(|k| k.ends_with("_total")) {
        let total: u64 = per_rank.iter().filter_map(|r| r[key].as_u64()).sum();
        stats.insert(key.clone(), total.into());
    }
    stats.insert("per_rank".into(), per_rank.into());
    Ok(stats)
}

/// Reads and checks a shard manifest: the shards tile the labels in order.
fn read_manifest(path: &Path) -> Result<ShardManifest, Error> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    let bad = |msg: String| Error::Checkpoint { path: path.to_path_buf(), msg };
    let m: ShardManifest = serde_json::from_str(&text).map_err(|e| bad(format!("not a shard manifest: {e}")))?;
    let mut next = 0usize;
    for (r, e) in m.shards.iter().enumerate() {
        if e.first != next || e.file.contains('/') || e.file.contains("..") {
            return Err(bad(format!("shard {r} ({}) does not continue the labels at {next}", e.file)));
        }
        next = next.checked_add(e.labels).ok_or_else(|| bad("label counts overflow".into()))?;
    }
    if m.shards.is_empty() || next != m.n_labels {
        return Err(bad(format!("the shards hold {next} labels, the manifest says {}", m.n_labels)));
    }
    Ok(m)
}

/// The sparse rows of a data set (dense rows keep their non-zeros).
fn rows(ds: &Dataset) -> std::borrow::Cow<'_, SparseRows> {
    match &ds.features {
        Features::Sparse(x) => std::borrow::Cow::Borrowed(x),
        Features::Dense(m) => std::borrow::Cow::Owned(farout_linear::data::dense_to_rows(m)),
    }
}

/// The `k` best labels of the first `n` samples of `ds` (all: `n = ds.len()`), best first, with
/// global label ids, over the labels of every rank.
pub fn predict(
    model: &LinearModel,
    ds: &Dataset,
    n: usize,
    k: usize,
    comm: &dyn Collective,
) -> Result<Vec<Vec<Hit>>, Error> {
    // No more hits than labels exist: a larger k (up to usize::MAX) must not size a buffer.
    let k = k.min(model.n_labels);
    let mut local = model.model.predictor().predict_first(&rows(ds), n, k);
    local.iter_mut().flatten().for_each(|h| h.class += model.first as u32);
    Ok(merge_top_k(comm, local, k)?)
}

/// P@k, nDCG@k (and accuracy for single-label data) of `model` on the first `max_samples`
/// samples of `ds` (0 = all), over every rank's labels. A linear model has no test loss, so
/// none is reported.
pub fn evaluate(
    model: &LinearModel,
    ds: &Dataset,
    max_samples: usize,
    comm: &dyn Collective,
) -> Result<BTreeMap<String, f64>, Error> {
    let n = if max_samples == 0 { ds.len() } else { ds.len().min(max_samples) };
    let hits = predict(model, ds, n, 5, comm)?;
    let mut sums = RankingSums::default();
    for (i, h) in hits.iter().enumerate() {
        sums.add(h, ds.labels.get(i), 0.0);
    }
    let mut metrics = sums.finish(ds.labels.is_multiclass());
    metrics.remove("loss");
    Ok(metrics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_dist::Local;

    fn config(extra: &str) -> Config {
        let text = format!(
            "[data]\nformat = \"synthetic_xmc\"\n[data.xmc]\nn_samples = 600\nn_features = 300\nn_labels = 20\n\
             [log]\nprogress = false\ntensorboard = false\n{extra}"
        );
        let mut c = Config::parse(&text, &[]).unwrap();
        c.name = "linear-test".into();
        c.check().unwrap();
        c
    }

    #[test]
    fn a_linear_run_trains_evaluates_saves_and_reloads_the_same_predictions() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config("[linear]\nsolver = \"dismec\"\n");
        c.log.dir = Some(dir.path().join("run"));
        let run = LinearRun::new(c).unwrap();
        let summary = run.train(&Local).unwrap();
        assert_eq!(summary.estimator, "dismec");
        assert!(summary.metrics["p@1"] > 0.3, "{:?}", summary.metrics);
        assert!(!summary.metrics.contains_key("loss"));
        let jsonl = std::fs::read_to_string(dir.path().join("run/metrics.jsonl")).unwrap();
        let v: serde_json::Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
        assert_eq!(v["eval/p@1"].as_f64(), Some(summary.metrics["p@1"]));
        let model = run.load_model(None, &Local).unwrap();
        let test = run.data().test.as_ref().unwrap();
        assert_eq!(evaluate(&model, test, 0, &Local).unwrap(), summary.metrics);
        let preds = predict(&model, test, test.len(), 3, &Local).unwrap();
        assert_eq!(preds.len(), test.len());
        assert!(preds.iter().all(|p| p.len() == 3));
    }

    #[test]
    fn a_model_of_other_data_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config("[linear]\nsolver = \"dismec\"\n");
        c.log.dir = Some(dir.path().to_path_buf());
        let run = LinearRun::new(c.clone()).unwrap();
        let path = run.model_path(None);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        SparseModel::new(3, true).save(&path).unwrap();
        let e = run.load_model(None, &Local).unwrap_err().to_string();
        assert!(e.contains("linear.model") && e.contains("the model has 3 features"), "{e}");
    }

    #[test]
    fn a_model_saved_as_shards_loads_as_the_whole_model() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config("[linear]\nsolver = \"dismec\"\n");
        c.log.dir = Some(dir.path().join("run"));
        let run = LinearRun::new(c).unwrap();
        run.train(&Local).unwrap();
        let whole = run.load_model(None, &Local).unwrap();
        assert_eq!((whole.first, whole.n_labels), (0, 20));
        // Three shards as three ranks would have written them, and their manifest.
        let ck = run.model_path(None).parent().unwrap().to_path_buf();
        let train = TrainSet::from_dataset(&run.data().train).unwrap();
        let shards = label_shards(&train, 3).unwrap();
        assert_eq!(shards.rows(), 20);
        let mut entries = Vec::new();
        for r in 0..3 {
            let file = shard_file(r, 3);
            whole.model.slice(shards.range(r)).unwrap().save(&ck.join(&file)).unwrap();
            entries.push(ShardEntry { file, first: shards.range(r).start, labels: shards.len(r) });
        }
        std::fs::remove_file(ck.join(MODEL_FILE)).unwrap();
        let manifest = ShardManifest { n_features: 300, n_labels: 20, shards: entries };
        let write =
            |m: &ShardManifest| std::fs::write(ck.join(SHARDS_FILE), serde_json::to_string(m).unwrap()).unwrap();
        write(&manifest);
        assert_eq!(run.load_model(None, &Local).unwrap(), whole);
        // A gap between shards, a missing shard, a shard of other labels: named errors.
        let mut gap = manifest.clone();
        gap.shards[1].first += 1;
        write(&gap);
        let e = run.load_model(None, &Local).unwrap_err().to_string();
        assert!(e.contains(SHARDS_FILE) && e.contains("does not continue the labels"), "{e}");
        let mut swapped = manifest.clone();
        swapped.shards[0].file = shard_file(1, 3);
        write(&swapped);
        let e = run.load_model(None, &Local).unwrap_err().to_string();
        assert!(e.contains(&shard_file(1, 3)) && e.contains("the manifest says"), "{e}");
        write(&manifest);
        std::fs::remove_file(ck.join(shard_file(2, 3))).unwrap();
        let e = run.load_model(None, &Local).unwrap_err().to_string();
        assert!(e.contains(&shard_file(2, 3)), "{e}");
    }

    #[test]
    fn label_shards_balance_positives_plus_a_fixed_cost() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config("[linear]\nsolver = \"dismec\"\n");
        c.log.dir = Some(dir.path().to_path_buf());
        let run = LinearRun::new(c).unwrap();
        let train = TrainSet::from_dataset(&run.data().train).unwrap();
        let cost = |j: usize| train.labels.positives(j).len() as u64;
        let mean = (0..20).map(cost).sum::<u64>().div_ceil(20);
        for ranks in [1, 2, 4, 7] {
            let shards = label_shards(&train, ranks).unwrap();
            let load: Vec<u64> = (0..ranks).map(|r| shards.range(r).map(|j| cost(j) + mean).sum()).collect();
            let total: u64 = load.iter().sum();
            // The bottleneck is within one label's cost of a perfect split.
            let worst = (0..20).map(|j| cost(j) + mean).max().unwrap();
            assert!(*load.iter().max().unwrap() <= total / ranks as u64 + worst, "{ranks} ranks: {load:?}");
        }
    }
}
