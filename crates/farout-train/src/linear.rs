//! Linear extreme classifiers from a config: `[linear] solver = "dismec"` (or `"ppdsparse"`,
//! `"memoir"`) trains one of farout-linear's solvers on the features `[data]` names, with the
//! same data loading, progress bar, `metrics.jsonl` and summary as the network trainers, so
//! `farout compare` puts linear and neural runs in one table.
//!
//! The trained model is saved to `<checkpoint dir>/linear.model` (farout-linear's checked file
//! format, replaced atomically); `farout eval` and `farout predict` read it back.

use crate::config::Config;
use crate::data::{self, TaskData};
use crate::metrics::RankingSums;
use crate::report::progress_bar;
use crate::sinks::{MetricsSink, Sinks};
use crate::trainer::peak_rss_bytes;
use crate::{Error, Summary, io_err};
use farout_core::topk::Hit;
use farout_data::{Dataset, Features, SparseRows};
use farout_linear::{SolverConfig, SparseModel, TrainSet};
use indicatif::ProgressBar;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The model's file name in the checkpoint directory.
pub const MODEL_FILE: &str = "linear.model";

/// A linear config with its data loaded (train, test and the training set's idf).
pub struct LinearRun {
    config: Config,
    data: TaskData,
}

/// The progress bar as farout-linear's progress sink.
struct Bar(ProgressBar);

impl farout_linear::Progress for Bar {
    fn begin(&self, total: u64, unit: &'static str) {
        self.0.set_length(total);
        self.0.set_message(unit);
    }

    fn advance(&self, n: u64) {
        self.0.inc(n);
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
    /// the model (unless `checkpoint.enabled = false`) and returns the summary.
    pub fn train(&self) -> Result<Summary, Error> {
        let cfg = &self.config;
        let solver = self.solver();
        let log_dir = cfg.log_dir();
        std::fs::create_dir_all(&log_dir).map_err(io_err(&log_dir))?;
        let mut sinks = Sinks::open(&log_dir, &cfg.log, true)?;
        let train = TrainSet::from_dataset(&self.data.train)?;
        log::info!(
            "{}: {} on {} samples, {} features, {} labels, {} threads",
            cfg.name,
            solver.name(),
            train.n_samples(),
            train.n_features(),
            train.n_labels(),
            rayon::current_num_threads()
        );
        let bar = progress_bar(
            cfg.log.progress,
            0,
            "{prefix} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} {msg}, ETA {eta}",
        );
        bar.set_prefix(format!("{} ({})", cfg.name, solver.name()));
        let fitted = solver.params().fit(&train, &Bar(bar.clone()))?;
        bar.finish();
        drop(train);
        let seconds = fitted.summary.seconds;
        let test = self.data.test.as_ref().filter(|t| !t.is_empty()).unwrap_or(&self.data.train);
        let metrics = evaluate(&fitted.model, test, cfg.eval.final_max_samples);
        let mut values: Vec<(String, f64)> = vec![("eval/epoch".into(), 1.0), ("train/seconds".into(), seconds)];
        values.extend(metrics.iter().map(|(k, v)| (format!("eval/{k}"), *v)));
        let values: Vec<(&str, f64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        sinks.record(1, seconds, &values)?;
        sinks.flush()?;
        if cfg.checkpoint.enabled {
            let path = self.model_path(None);
            let dir = path.parent().expect("a file in a directory");
            std::fs::create_dir_all(dir).map_err(io_err(dir))?;
            fitted.model.save(&path)?;
            log::info!("saved the model to {}", path.display());
        }
        let n_train = self.data.train.len();
        Ok(Summary {
            name: cfg.name.clone(),
            task: cfg.task(),
            estimator: solver.name().to_string(),
            metrics,
            train_seconds: seconds,
            steps: 1,
            epochs: 1,
            samples_per_s: n_train as f64 / seconds.max(1e-9),
            classes_scored_per_sample: self.data.n_classes as f64,
            index_recall: None,
            grad_cosine: None,
            model_bytes: fitted.model.file_len(),
            peak_rss_bytes: peak_rss_bytes(),
            n_classes: self.data.n_classes,
            d_model: self.data.n_features,
            n_train,
            n_test: self.data.test.as_ref().map_or(0, |t| t.len()),
            seed: cfg.seed,
            log_dir,
            linear: Some(serde_json::to_value(&fitted.summary).expect("summaries serialise")),
        })
    }

    /// Reads the model saved by [`LinearRun::train`] (from `dir`, default the checkpoint
    /// directory) and checks that it fits the data.
    pub fn load_model(&self, dir: Option<&Path>) -> Result<SparseModel, Error> {
        let path = self.model_path(dir);
        let model = SparseModel::load(&path)?;
        if model.n_features() != self.data.n_features || model.n_labels() != self.data.n_classes {
            return Err(Error::DataMismatch {
                path,
                msg: format!(
                    "the model has {} features and {} labels, the data {} and {}",
                    model.n_features(),
                    model.n_labels(),
                    self.data.n_features,
                    self.data.n_classes
                ),
            });
        }
        Ok(model)
    }

    /// A file to predict on, read and transformed as the training set was.
    pub fn load_input(&self, path: &Path, labels: Option<&Path>) -> Result<Dataset, Error> {
        let mut ds = data::load_split(&self.config, path, labels, Some(&self.data.train))?;
        data::prepare(&self.config, self.data.idf.as_deref(), &mut ds);
        Ok(ds)
    }
}

/// The sparse rows of a data set (dense rows keep their non-zeros).
fn rows(ds: &Dataset) -> std::borrow::Cow<'_, SparseRows> {
    match &ds.features {
        Features::Sparse(x) => std::borrow::Cow::Borrowed(x),
        Features::Dense(m) => std::borrow::Cow::Owned(farout_linear::data::dense_to_rows(m)),
    }
}

/// The `k` best labels of every sample of `ds`, best first.
pub fn predict(model: &SparseModel, ds: &Dataset, k: usize) -> Vec<Vec<Hit>> {
    model.predictor().predict(&rows(ds), k)
}

/// P@k, nDCG@k (and accuracy for single-label data) of `model` on the first `max_samples`
/// samples of `ds` (0 = all). A linear model has no test loss, so none is reported.
pub fn evaluate(model: &SparseModel, ds: &Dataset, max_samples: usize) -> BTreeMap<String, f64> {
    let n = if max_samples == 0 { ds.len() } else { ds.len().min(max_samples) };
    let x = rows(ds);
    let predictor = model.predictor();
    let sums = (0..n)
        .into_par_iter()
        .fold(
            || (RankingSums::default(), Vec::new(), Vec::new()),
            |(mut sums, mut scores, mut hits), i| {
                let (c, v) = x.row(i);
                predictor.top_k(c, v, 5, &mut scores, &mut hits);
                sums.add(&hits, ds.labels.get(i), 0.0);
                (sums, scores, hits)
            },
        )
        .map(|t| t.0)
        .reduce(RankingSums::default, |mut a, b| {
            a.merge(&b);
            a
        });
    let mut metrics = sums.finish(ds.labels.is_multiclass());
    metrics.remove("loss");
    metrics
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let summary = run.train().unwrap();
        assert_eq!(summary.estimator, "dismec");
        assert!(summary.metrics["p@1"] > 0.3, "{:?}", summary.metrics);
        assert!(!summary.metrics.contains_key("loss"));
        let jsonl = std::fs::read_to_string(dir.path().join("run/metrics.jsonl")).unwrap();
        let v: serde_json::Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
        assert_eq!(v["eval/p@1"].as_f64(), Some(summary.metrics["p@1"]));
        let model = run.load_model(None).unwrap();
        let test = run.data().test.as_ref().unwrap();
        assert_eq!(evaluate(&model, test, 0), summary.metrics);
        let preds = predict(&model, test, 3);
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
        let e = run.load_model(None).unwrap_err().to_string();
        assert!(e.contains("linear.model") && e.contains("the model has 3 features"), "{e}");
    }
}
