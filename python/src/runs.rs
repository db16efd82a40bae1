//! `farout.train`, `farout.evaluate`, `farout.compare`: the CLI's commands on a config file or
//! a config given as a dict (passed here as JSON), with the GIL released and Ctrl-C stopping a
//! run cleanly between steps.

use crate::errors::{IntoPy, invalid, to_py};
use farout_train::{CompareOptions, Config, TrainOptions};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

/// Loads the config at `path`, or the JSON tables `json` (named `name` unless they set one),
/// with `key=value` overrides.
fn load(path: Option<PathBuf>, json: Option<String>, overrides: &[String]) -> PyResult<Config> {
    match (path, json) {
        (Some(path), None) => Config::load(&path, overrides).py_err(),
        (None, Some(json)) => {
            let text = toml_text(&json)?;
            Config::from_text(&text, overrides, "run").map_err(|e| invalid(format!("config: {e}")))
        }
        _ => Err(invalid("give a config file's path or a dict of its tables")),
    }
}

/// The TOML text of JSON tables (`null` values are refused: TOML has none).
#[pyfunction]
pub fn toml_text(json: &str) -> PyResult<String> {
    let value: serde_json::Value = serde_json::from_str(json).map_err(|e| invalid(e.to_string()))?;
    let table = toml::Value::try_from(value).map_err(|e| invalid(format!("config: {e}")))?;
    toml::to_string(&table).map_err(|e| invalid(format!("config: {e}")))
}

/// Runs `work` on a thread of its own with the GIL released, checking for signals every 100
/// ms: Ctrl-C asks the run to stop after its current step ([`farout_train::stop`]) and waits
/// for it. Returns what `work` returned and the signal's exception, if one came.
pub fn interruptible<T: Send>(py: Python<'_>, work: impl FnOnce() -> T + Send) -> PyResult<(T, Option<PyErr>)> {
    farout_train::stop::clear();
    std::thread::scope(|scope| {
        let (done, finished) = mpsc::channel();
        let worker = scope.spawn(move || {
            let out = work();
            let _ = done.send(());
            out
        });
        let mut interrupted = None;
        let mut finished = Some(finished);
        loop {
            let rx = finished.take().expect("put back every turn");
            let (done, rx) = py.detach(move || (rx.recv_timeout(Duration::from_millis(100)), rx));
            finished = Some(rx);
            if done.is_ok() || worker.is_finished() {
                break;
            }
            if let Err(e) = py.check_signals() {
                farout_train::stop::request();
                interrupted.get_or_insert(e);
            }
        }
        let out =
            py.detach(|| worker.join()).map_err(|_| invalid("farout panicked; this is a bug, please report it"))?;
        Ok((out, interrupted))
    })
}

/// The outcome of an interruptible run or fit: its error (a run stopped by Ctrl-C says where
/// its checkpoint is), else the signal's exception, else its value.
pub fn outcome<T, E: std::error::Error + 'static>((out, interrupted): (Result<T, E>, Option<PyErr>)) -> PyResult<T> {
    match (out, interrupted) {
        (Err(e), _) => Err(to_py(&e)),
        (Ok(_), Some(signal)) => Err(signal),
        (Ok(value), None) => Ok(value),
    }
}

/// Runs `work` on a rayon pool of `threads` threads (0: one per core), as the CLI does.
fn on_pool<T: Send>(threads: usize, work: impl FnOnce() -> T + Send) -> PyResult<T> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(|e| invalid(e.to_string()))?;
    Ok(pool.install(work))
}

/// The pool's error first (a pool that could not be built ran nothing).
fn flatten<T>((pooled, interrupted): (PyResult<T>, Option<PyErr>)) -> PyResult<(T, Option<PyErr>)> {
    Ok((pooled?, interrupted))
}

/// `farout train`: trains the config and returns its JSON summary.
#[pyfunction]
#[pyo3(signature = (path, json, overrides, overwrite, resume))]
pub fn train(
    py: Python<'_>,
    path: Option<PathBuf>,
    json: Option<String>,
    overrides: Vec<String>,
    overwrite: bool,
    resume: bool,
) -> PyResult<String> {
    let config = load(path, json, &overrides)?;
    let options = TrainOptions { resume, overwrite, export_vectors: None, warm_start: None };
    let threads = config.train.threads;
    let run = || on_pool(threads, || farout_train::train(&config, &options, &farout_dist::Local));
    Ok(outcome(flatten(interruptible(py, run)?)?)?.to_json())
}

/// `farout eval`: the metrics of the trained model (from `checkpoint`, default the config's)
/// on the config's test set, as JSON.
#[pyfunction]
#[pyo3(signature = (path, json, overrides, checkpoint))]
pub fn evaluate(
    py: Python<'_>,
    path: Option<PathBuf>,
    json: Option<String>,
    overrides: Vec<String>,
    checkpoint: Option<PathBuf>,
) -> PyResult<String> {
    let config = load(path, json, &overrides)?;
    let threads = config.train.threads;
    let work = || -> Result<String, farout_train::Error> {
        let task = farout_train::task::open_trained(config, checkpoint.as_deref(), &farout_dist::Local)?;
        let test = task.test().ok_or(farout_train::Error::NoData("the config names no test set (data.test)"))?;
        Ok(serde_json::to_string(&task.evaluate(test)?).expect("metrics serialise"))
    };
    outcome(flatten(interruptible(py, || on_pool(threads, work))?)?)
}

/// `farout compare`: trains the configs and writes the comparison to `out`; returns the
/// directory (its `summary.csv` holds one row per run).
#[pyfunction]
#[pyo3(signature = (configs, out, budget, overrides, overwrite, repeats))]
pub fn compare(
    py: Python<'_>,
    configs: Vec<PathBuf>,
    out: PathBuf,
    budget: Option<f64>,
    overrides: Vec<String>,
    overwrite: bool,
    repeats: usize,
) -> PyResult<PathBuf> {
    let options = CompareOptions { configs, out, budget, repeats, set: overrides, overwrite, ..Default::default() };
    let run = || on_pool(0, || farout_train::compare(&options));
    Ok(outcome(flatten(interruptible(py, run)?)?)?.out)
}
