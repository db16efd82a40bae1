//! The contract of a linear solver plug-in: the [`LinearSolver`] trait its parameter struct
//! implements (check, fit), the [`Progress`] it reports to, and what fitting returns
//! ([`Fitted`]: the model and a [`FitSummary`]). The list of solvers a config can name is
//! [`crate::SolverConfig`] (`solver.rs`); this file does not know it.

use crate::Result;
use crate::data::TrainSet;
use crate::model::SparseModel;
use farout_core::ParamError;
use farout_core::space::Dim;
use farout_dist::{Collective, Shards};
use serde::Serialize;
use std::ops::Range;
use std::sync::Arc;

/// A linear extreme classifier: its checked parameters, and training.
pub trait LinearSolver: Send + Sync + std::fmt::Debug {
    /// Checks every parameter; the error names the key relative to `[linear]` and what is
    /// allowed.
    fn check(&self) -> std::result::Result<(), ParamError>;

    /// The ranges `farout tune` draws this solver's parameters from (keys relative to
    /// `[linear]`, as in [`LinearSolver::check`]'s errors): the scales log-uniformly around the
    /// papers' defaults. Default: nothing to tune.
    fn search_space(&self) -> Vec<Dim> {
        Vec::new()
    }

    /// Trains on `data` (parameters already checked), reporting work done to `progress`.
    fn fit(&self, data: &TrainSet, progress: &dyn Progress) -> Result<Fitted>;

    /// Whether every label is a problem of its own (one-vs-all), so that the labels can be
    /// split over processes and trained by [`LinearSolver::fit_labels`] without talking to
    /// each other. Such a run's shards are balanced by label cost; the shards of a solver that
    /// trains its labels jointly are even.
    fn label_parallel(&self) -> bool {
        false
    }

    /// Trains only the labels `labels` of `data` (one rank's shard): the model's label `i` is
    /// label `labels.start + i`, and it equals that label of [`LinearSolver::fit`]'s model.
    /// Solvers that train all labels jointly refuse a proper subset.
    fn fit_labels(&self, data: &TrainSet, labels: Range<usize>, progress: &dyn Progress) -> Result<Fitted> {
        if labels == (0..data.n_labels()) {
            return self.fit(data, progress);
        }
        Err(crate::Error::Shape {
            what: "label shard",
            detail: format!(
                "labels {labels:?} of {}: this solver trains all labels jointly, not a subset",
                data.n_labels()
            ),
        })
    }

    /// Whether [`LinearSolver::fit_labels_from`] can start from an earlier model. Default: no.
    fn warm_starts(&self) -> bool {
        false
    }

    /// [`LinearSolver::fit_labels`] starting every label from its weights in `start`, a model
    /// of the same features (an earlier fit with other parameters or fewer rows; all labels,
    /// whichever `labels` this call trains). The answer is the cold fit's to the solver's
    /// tolerance: only solvers whose iterate is the primal weights and whose stopping rule does
    /// not depend on the start say yes in [`LinearSolver::warm_starts`]; the others refuse.
    fn fit_labels_from(
        &self,
        data: &TrainSet,
        labels: Range<usize>,
        start: Arc<SparseModel>,
        progress: &dyn Progress,
    ) -> Result<Fitted> {
        let _ = (data, labels, start, progress);
        Err(crate::Error::NoWarmStart { why: "this solver cannot start from an earlier model" })
    }

    /// One rank's part of a run on `comm.size()` ranks: the model of the labels
    /// `shards.range(comm.rank())`. Label-parallel solvers train their labels alone
    /// ([`LinearSolver::fit_labels`]); a solver that trains all labels jointly overrides this
    /// and exchanges what it needs through `comm` (MEMOIR).
    fn fit_shard(
        &self,
        data: &TrainSet,
        shards: &Shards,
        comm: &dyn Collective,
        progress: &dyn Progress,
    ) -> Result<Fitted> {
        self.fit_labels(data, shards.range(comm.rank()), progress)
    }
}

/// Where a solver reports its progress (a progress bar, or nothing). Called from rayon
/// workers, hence `Sync`.
pub trait Progress: Sync {
    /// Work is about to start: `total` units of `unit` (`"labels"`, `"batches"`).
    fn begin(&self, total: u64, unit: &'static str);
    /// `n` more units are done.
    fn advance(&self, n: u64);
    /// Epoch `epoch` (from 1) of an iterative solver ended, with its statistics as named
    /// values (`"train/accuracy"`, ...). Solvers without epochs never call it.
    fn epoch(&self, _epoch: usize, _values: &[(&'static str, f64)]) {}
}

/// Progress that goes nowhere.
#[derive(Clone, Copy, Debug, Default)]
pub struct Silent;

impl Progress for Silent {
    fn begin(&self, _total: u64, _unit: &'static str) {}
    fn advance(&self, _n: u64) {}
}

/// A trained model and how training went.
#[derive(Debug)]
pub struct Fitted {
    /// The model.
    pub model: SparseModel,
    /// Totals and the solver's own statistics.
    pub summary: FitSummary,
}

/// What every solver reports, plus its own statistics (`stats`: Newton and CG iterations for
/// DiSMEC, active-set sizes and duality gaps for PPDSparse, oracle recall for MEMOIR).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FitSummary {
    /// The solver's config name.
    pub solver: String,
    /// Wall time of [`LinearSolver::fit`].
    pub seconds: f64,
    /// Threads of the rayon pool it ran on.
    pub threads: usize,
    /// Non-zero weights (biases included) before pruning.
    pub nnz_before_pruning: usize,
    /// Non-zero weights (biases included) after pruning.
    pub nnz_after_pruning: usize,
    /// Solver-specific figures, by name.
    pub stats: serde_json::Map<String, serde_json::Value>,
}

impl FitSummary {
    /// A summary whose solver-specific figures are the fields of the JSON object `stats`.
    pub fn new(
        solver: &str,
        seconds: f64,
        threads: usize,
        nnz_before_pruning: usize,
        nnz_after_pruning: usize,
        stats: serde_json::Value,
    ) -> Self {
        let stats = match stats {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        Self { solver: solver.into(), seconds, threads, nnz_before_pruning, nnz_after_pruning, stats }
    }
}

/// Mean and 95% quantile of `values` (0 and 0 when empty), for summaries.
pub fn mean_and_q95(values: impl IntoIterator<Item = f64>) -> (f64, f64) {
    let mut v: Vec<f64> = values.into_iter().collect();
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let at = ((v.len() - 1) as f64 * 0.95).round() as usize;
    (mean, v[at])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        assert_eq!(mean_and_q95([]), (0.0, 0.0));
        let (m, q) = mean_and_q95((1..=100).map(f64::from));
        assert_eq!((m, q), (50.5, 95.0));
    }
}
