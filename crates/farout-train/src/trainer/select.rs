//! Keeping the weights that are best on validation, and stopping once they stop improving.
//!
//! A run that selects ([`Config::selects_best`]: `train.select = "best"`, or `"auto"` under a
//! time budget) trains on the rows left after `train.valid_fraction` of the training set is set
//! aside (`data.holdout`'s rows serve instead when set). At every evaluation point (each epoch,
//! or every `eval.every_steps`) and at the last step, the weights are scored on those rows by
//! `train.select_metric`; a strictly better figure writes them to `<checkpoint dir>-best`, a
//! checkpoint beside the resume checkpoint, which it never replaces. After `train.patience`
//! evaluations in a row without a better figure the run stops (early stopping; 0 = never).
//!
//! At the end the test set is scored twice, with the last step's weights and with the kept
//! ones: the summary's `metrics` are the kept weights', and [`Selection`] holds the last
//! step's beside them with where the best was reached. The test set is read only for these
//! reports and the logged curves, never for a choice: the validation rows alone decide.

use super::{Point, Summary, Trainer};
use crate::Error;
use crate::config::ConfigError;
use crate::sinks::{MetricsSink, Sinks};
use farout_data::Dataset;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What a run that kept its best weights reports beside their test metrics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    /// The validation metric that chose them (`train.select_metric`).
    pub metric: String,
    /// Validation rows (the carved split, or the `data.holdout` rows).
    pub valid_rows: usize,
    /// The kept weights' validation figure.
    pub best_valid: f64,
    /// The last step's validation figure.
    pub last_valid: f64,
    /// The step of the kept weights.
    pub best_step: u64,
    /// Epochs completed at that step (fractional).
    pub best_epoch: f64,
    /// Training seconds at that step.
    pub best_seconds: f64,
    /// Validation evaluations made.
    pub evaluations: u64,
    /// Whether `train.patience` evaluations without improvement stopped the run.
    pub stopped_early: bool,
    /// The test metrics of the last step's weights (the summary's `metrics` are the kept ones').
    pub last_metrics: BTreeMap<String, f64>,
    /// The checkpoint of the kept weights (`farout eval` reads it by default).
    pub checkpoint: PathBuf,
}

impl Trainer<'_> {
    /// The rows the run chooses its weights on, when it selects: the carved validation split,
    /// or the held-out rows of `data.holdout` (which then stand in for the test set).
    pub(super) fn selection_set(&self) -> Option<&Dataset> {
        if !self.config.selects_best() {
            return None;
        }
        let holdout = self.data.test.as_ref().filter(|_| self.config.data.holdout > 0.0);
        self.data.valid.as_ref().or(holdout).filter(|d| !d.is_empty())
    }

    /// Whether the last `train.patience` evaluations found nothing better.
    pub(super) fn patience_spent(&self) -> bool {
        let p = self.config.train.patience;
        p > 0 && self.selection_set().is_some() && self.state.valid.since_best >= p
    }

    /// Scores the current weights on the validation rows (once per step), records `valid/*`
    /// and keeps the weights when they beat the best so far; returns the progress-bar suffix.
    pub(super) fn validate(&mut self, sinks: &mut Sinks) -> Result<String, Error> {
        let Some(valid) = self.selection_set() else { return Ok(String::new()) };
        if self.state.valid.last.is_some_and(|p| p.step == self.state.step) {
            return Ok(String::new());
        }
        let m = self.evaluate(valid, self.config.eval.max_samples)?;
        let name = self.config.train.select_metric.clone();
        let Some(&value) = m.get(&name) else {
            let have = m.keys().cloned().collect::<Vec<_>>().join(", ");
            let msg = format!(" = {name:?} is not reported by this run (it reports {have})");
            return Err(Error::Key(ConfigError::key("train.select_metric", msg)));
        };
        let values: Vec<(String, f64)> = m.iter().map(|(k, v)| (format!("valid/{k}"), *v)).collect();
        let refs: Vec<(&str, f64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        sinks.record(self.state.step, self.state.train_seconds, &refs)?;
        sinks.flush()?;
        let per_epoch = self.steps_per_epoch() as f64;
        let s = &self.state;
        let point = Point {
            step: s.step,
            epoch: s.epoch as f64 + s.batch_in_epoch as f64 / per_epoch,
            seconds: s.train_seconds,
            value,
        };
        let higher = name != "loss";
        // A non-finite figure is never better: the weights it scores are not kept.
        let better = value.is_finite()
            && self.state.valid.best.is_none_or(|b| if higher { value > b.value } else { value < b.value });
        let v = &mut self.state.valid;
        v.last = Some(point);
        v.evaluations += 1;
        if better {
            v.best = Some(point);
            v.since_best = 0;
            // Only evaluated (weights alone), never resumed from: no index.
            let dir = self.config.best_checkpoint_dir();
            crate::dist::agree(self.comm, self.write_checkpoint_in(&dir, false))?;
        } else {
            v.since_best += 1;
        }
        Ok(format!(" | valid {name} {value:.4}"))
    }

    /// At the end of a selecting run: loads the kept weights (unless they are the last step's),
    /// scores them on the test set (the training set without one; the first `max_samples`,
    /// 0 = all) and puts their metrics in `summary`, with the [`Selection`] report holding the
    /// last step's (`summary.metrics` on entry). A run that keeps its last step leaves `summary`
    /// as it is, and removes stale kept weights (from an earlier part of a resumed run).
    pub(super) fn keep_best(&mut self, max_samples: usize, summary: &mut Summary) -> Result<(), Error> {
        let dir = self.config.best_checkpoint_dir();
        let Some(valid_rows) = self.selection_set().map(Dataset::len) else {
            if self.comm.is_root() {
                for d in crate::checkpoint::with_siblings(&dir) {
                    if d.exists() {
                        std::fs::remove_dir_all(&d).map_err(crate::io_err(&d))?;
                    }
                }
            }
            return Ok(());
        };
        let v = self.state.valid.clone();
        let (Some(best), Some(last)) = (v.best, v.last) else { return Ok(()) };
        let stopped_early = self.patience_spent();
        let last_metrics = summary.metrics.clone();
        if best.step != self.state.step {
            self.load_checkpoint(&dir)?;
            let test = self.data.test.as_ref().filter(|t| !t.is_empty()).unwrap_or(&self.data.train);
            summary.metrics = self.evaluate(test, max_samples)?;
        }
        summary.selection = Some(Selection {
            metric: self.config.train.select_metric.clone(),
            valid_rows,
            best_valid: best.value,
            last_valid: last.value,
            best_step: best.step,
            best_epoch: best.epoch,
            best_seconds: best.seconds,
            evaluations: v.evaluations,
            stopped_early,
            last_metrics,
            checkpoint: dir,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::tiny_face;
    use super::*;
    use crate::Config;
    use crate::task::Task;
    use farout_dist::Local;

    /// A tiny face run under a time budget of a minute (never reached) for `epochs` epochs.
    fn budgeted(dir: &std::path::Path, epochs: usize, patience: u64) -> Config {
        let mut c = tiny_face(dir, "[output.optimizer]\nkind = \"sgd\"\nlr = 2.0");
        (c.train.epochs, c.train.max_seconds, c.train.patience) = (epochs, 60.0, patience);
        c
    }

    #[test]
    fn a_budgeted_run_keeps_its_best_weights_beside_the_last_and_reports_both() {
        let dir = tempfile::tempdir().unwrap();
        let config = budgeted(dir.path(), 6, 0);
        let mut t = Trainer::new(config.clone(), &Local).unwrap();
        // The generator's 958 training rows: 96 set aside for validation.
        assert_eq!((t.data().train.len(), t.data().valid.as_ref().map(Dataset::len)), (862, Some(96)));
        let s = t.run().unwrap();
        let sel = s.selection.clone().expect("a budgeted run selects");
        assert_eq!((sel.valid_rows, sel.evaluations, sel.stopped_early), (96, 6, false));
        assert_eq!(s.steps, 6 * t.steps_per_epoch(), "patience 0 runs every epoch");
        assert!(sel.best_step < s.steps, "this run's best is before its end: {sel:?}");
        assert!(sel.best_valid > sel.last_valid, "{sel:?}");
        assert_ne!(s.metrics, sel.last_metrics, "two sets of weights, two test figures");
        assert_eq!(sel.checkpoint, config.best_checkpoint_dir());
        // The kept checkpoint, read back as `farout eval` reads it, gives the reported figures;
        // the resume checkpoint holds the last step, and gives the last step's.
        let mut kept = Trainer::new(config.clone(), &Local).unwrap();
        Task::load(&mut kept, None).unwrap();
        let test = kept.data().test.clone().unwrap();
        assert_eq!(kept.evaluate(&test, 0).unwrap(), s.metrics);
        assert_eq!(kept.step(), sel.best_step);
        let mut last = Trainer::new(config.clone(), &Local).unwrap();
        Task::load(&mut last, Some(&config.checkpoint_dir())).unwrap();
        assert_eq!(last.evaluate(&test, 0).unwrap(), sel.last_metrics);
        assert_eq!(last.step(), s.steps);
    }

    #[test]
    fn a_run_without_budget_trains_on_every_row_and_keeps_its_last_step() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = budgeted(dir.path(), 1, 0);
        config.train.max_seconds = 0.0;
        let mut t = Trainer::new(config.clone(), &Local).unwrap();
        assert_eq!((t.data().train.len(), t.data().valid.is_none()), (958, true));
        assert!(t.run().unwrap().selection.is_none());
        assert!(!config.best_checkpoint_dir().exists());
        config.train.select = crate::config::Select::Best;
        assert!(config.selects_best(), "select = \"best\" selects without a budget");
    }

    #[test]
    fn a_resumed_run_continues_its_validation_record_and_keeps_the_same_weights() {
        let dir = tempfile::tempdir().unwrap();
        let whole = Trainer::new(budgeted(dir.path(), 6, 0), &Local).unwrap().run().unwrap().selection.unwrap();
        Trainer::new(budgeted(dir.path(), 3, 0), &Local).unwrap().run().unwrap();
        let mut t = Trainer::new(budgeted(dir.path(), 6, 0), &Local).unwrap();
        t.resume().unwrap();
        let resumed = t.run().unwrap().selection.unwrap();
        assert_eq!(
            (resumed.best_step, resumed.best_valid, resumed.last_valid, resumed.evaluations),
            (whole.best_step, whole.best_valid, whole.last_valid, whole.evaluations),
        );
    }

    #[test]
    fn patience_stops_a_run_once_validation_stops_improving() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = Trainer::new(budgeted(dir.path(), 40, 2), &Local).unwrap();
        let s = t.run().unwrap();
        let sel = s.selection.expect("a budgeted run selects");
        assert!(sel.stopped_early && s.epochs < 40, "{sel:?}, {} epochs", s.epochs);
        assert_eq!(s.steps, sel.best_step + 2 * t.steps_per_epoch(), "two epochs past the best");
    }

    /// A metrics.jsonl record without its clock.
    fn without_time(line: &str) -> String {
        let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
        v.as_object_mut().unwrap().retain(|k, _| k != "wall_seconds" && k != "time");
        v.to_string()
    }

    #[test]
    fn the_test_set_never_changes_which_weights_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let run = |plant: bool| {
            let mut t = Trainer::new(budgeted(dir.path(), 6, 0), &Local).unwrap();
            if plant {
                // Every test label moved to the next class: a different test set altogether.
                let test = t.data.test.as_mut().unwrap();
                let k = test.labels.n_labels as u32;
                test.labels.labels.iter_mut().for_each(|l| *l = (*l + 1) % k);
            }
            let s = t.run().unwrap();
            let valid = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
            let valid: Vec<String> = valid.lines().filter(|l| l.contains("valid/p@1")).map(without_time).collect();
            let sel = s.selection.unwrap();
            (s.metrics, valid, (sel.best_step, sel.best_valid, sel.last_valid, sel.evaluations))
        };
        let (metrics, valid, chosen) = run(false);
        let (planted_metrics, planted_valid, planted_chosen) = run(true);
        assert_ne!(metrics["p@1"], planted_metrics["p@1"], "the plant changes the test figures");
        assert_eq!(valid.len(), 6);
        assert_eq!(valid, planted_valid, "the same validation figures");
        assert_eq!(chosen, planted_chosen, "the same choice");
    }

    #[test]
    fn selection_keys_out_of_range_are_refused_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = tiny_face(dir.path(), "");
        c.train.valid_fraction = 1.0;
        assert!(c.check().unwrap_err().to_string().contains("train.valid_fraction"));
        c.train.valid_fraction = 0.1;
        c.train.select_metric = "p@2".into();
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains("train.select_metric") && e.contains("p@1, p@3"), "{e}");
    }
}
