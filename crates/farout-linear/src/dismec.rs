//! DiSMEC: every label's binary problem trained independently, in parallel, then pruned.
//!
//! Labels run through [`crate::ova::one_vs_all`] (largest first, one [`Scratch`] of dense f64
//! vectors of length d + 1 and n per worker); a label's computation never depends on the thread
//! that runs it, so the model is bit-identical for any number of threads.
//!
//! Pruning (\[M\] Sect. 5): after training, weights with |w| < threshold become 0; the bias is
//! not exempt (the paper does not exempt it).
//!
//! Parameters (`[linear] solver = "dismec"`), with their defaults (\[M\] Sect. 5 and
//! LIBLINEAR's):
//!
//! ```toml
//! c = 1.0               # loss weight C (the paper has none, i.e. C = 1)
//! eps0 = 0.01           # stopping tolerance of eq. 13 (1 for dense features, [M] Sect. 5)
//! max_iter = 1000       # Newton iterations per label
//! bias = true           # implicit constant feature x_0 = 1 with a regularised weight
//! prune_threshold = 0.01
//! init = "msi"          # "zero" | "bias" | "msi"
//! bias_init = 1.0       # lambda of the bias initialiser -lambda e_0
//! msi_s = 1.0           # MSI target margin of the positive mean (eq. 21)
//! msi_t = -2.0          # MSI target margin of the negative mean
//! ```

use crate::contract::{FitSummary, Fitted, LinearSolver, Progress, Silent, mean_and_q95};
use crate::data::{DataStats, TrainSet};
use crate::init::{Bias, FromModel, Msi, WeightInit, Zero};
use crate::model::SparseModel;
use crate::newton::{self, LabelStats, NewtonParams, Rows, Scratch};
use crate::ova::{check_label_range, one_vs_all};
use crate::{Error, Result};
use farout_core::ParamError;
use farout_core::space::{Dim, Value};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

/// Which initial weights the Newton solver starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InitKind {
    /// w = 0 (LIBLINEAR's and DiSMEC's default).
    Zero,
    /// w = −λ e_0: every sample starts on the negative side (\[M\] Sect. 3).
    Bias,
    /// Mean-separating initialisation (\[M\] Sect. 4, eqs. 21–24).
    #[default]
    Msi,
}

/// DiSMEC parameters (see the module docs for the TOML form and defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DismecConfig {
    /// Loss weight C of `½‖w‖² + C Σ φ(y_i wᵀx_i)`; \[M\] fixes C = 1.
    pub c: f64,
    /// ε0 of the stopping rule `‖g‖ ≤ ε0 · max(1, min(|P|,|N|))/n · ‖g(0)‖` (eqs. 12–13).
    pub eps0: f64,
    /// Maximum number of Newton iterations per label.
    pub max_iter: usize,
    /// Whether to add the constant feature x_0 = 1 (an ordinary, regularised weight).
    pub bias: bool,
    /// Weights with |w| below this are set to zero after training (\[M\] Sect. 5: 0.01).
    pub prune_threshold: f64,
    /// Initial weights.
    pub init: InitKind,
    /// λ of the bias initialiser `λ w_b`, `w_b = −e_0` (\[M\] tries 0.9, 1 and 2).
    pub bias_init: f64,
    /// MSI: target score s of the positive mean (eq. 21).
    pub msi_s: f64,
    /// MSI: target score t of the negative mean (eq. 21; −2 for squared hinge, −3 for logistic).
    pub msi_t: f64,
}

impl Default for DismecConfig {
    fn default() -> Self {
        Self {
            c: 1.0,
            eps0: 0.01,
            max_iter: 1000,
            bias: true,
            prune_threshold: 0.01,
            init: InitKind::Msi,
            bias_init: 1.0,
            msi_s: 1.0,
            msi_t: -2.0,
        }
    }
}

impl DismecConfig {
    /// Checks every value; the error names the key (`c`, relative to `[linear]`) and what is
    /// allowed.
    pub fn check(&self) -> std::result::Result<(), ParamError> {
        if !(self.c > 0.0 && self.c.is_finite()) {
            return Err(ParamError::new("c", self.c, "must be a finite number > 0"));
        }
        if !(self.eps0 > 0.0 && self.eps0.is_finite()) {
            return Err(ParamError::new(
                "eps0",
                self.eps0,
                "must be a finite number > 0 (0.01 for sparse, 1 for dense features)",
            ));
        }
        if self.max_iter == 0 {
            return Err(ParamError::new("max_iter", self.max_iter, "must be an integer >= 1"));
        }
        if !(self.prune_threshold >= 0.0 && self.prune_threshold.is_finite()) {
            return Err(ParamError::new(
                "prune_threshold",
                self.prune_threshold,
                "must be a finite number >= 0 (0 keeps every weight)",
            ));
        }
        match self.init {
            InitKind::Zero => {}
            InitKind::Bias => {
                if !self.bias {
                    return Err(ParamError::new(
                        "init",
                        "\"bias\" with bias = false",
                        "must be \"zero\" or \"msi\" when bias = false",
                    ));
                }
                if !(self.bias_init > 0.0 && self.bias_init.is_finite()) {
                    return Err(ParamError::new(
                        "bias_init",
                        self.bias_init,
                        "must be a finite number > 0 (0.9, 1 or 2 in [M])",
                    ));
                }
            }
            InitKind::Msi => {
                if !self.msi_s.is_finite() {
                    return Err(ParamError::new("msi_s", self.msi_s, "must be a finite number greater than msi_t"));
                }
                if !(self.msi_t.is_finite() && self.msi_t < self.msi_s) {
                    return Err(ParamError::new(
                        "msi_t",
                        self.msi_t,
                        "must be a finite number less than msi_s (-2 in [M])",
                    ));
                }
            }
        }
        Ok(())
    }

    /// The initialiser this config selects.
    pub fn weight_init(&self) -> Box<dyn WeightInit> {
        match self.init {
            InitKind::Zero => Box::new(Zero),
            InitKind::Bias => Box::new(Bias { lambda: self.bias_init }),
            InitKind::Msi => Box::new(Msi { s: self.msi_s, t: self.msi_t }),
        }
    }
}

impl LinearSolver for DismecConfig {
    fn check(&self) -> std::result::Result<(), ParamError> {
        DismecConfig::check(self)
    }

    /// C over two decades around \[M\]'s 1 (the loss weight is a scale), the pruning
    /// threshold around \[M\]'s 0.01, and the initialisation (MSI or zero).
    fn search_space(&self) -> Vec<Dim> {
        vec![
            Dim::float_log("c", 0.1, 10.0),
            Dim::float_log("prune_threshold", 0.001, 0.1),
            Dim::choice("init", vec![Value::Str("msi".into()), Value::Str("zero".into())]),
        ]
    }

    fn fit(&self, data: &TrainSet, progress: &dyn Progress) -> Result<Fitted> {
        self.fit_labels(data, 0..data.n_labels(), progress)
    }

    fn label_parallel(&self) -> bool {
        true
    }

    fn fit_labels(&self, data: &TrainSet, labels: Range<usize>, progress: &dyn Progress) -> Result<Fitted> {
        self.fit_labels_with(data, labels, self.weight_init(), false, progress)
    }

    fn warm_starts(&self) -> bool {
        true
    }

    /// The Newton solver from `start`'s weights ([`FromModel`]): the same optimum, reached to
    /// the same tolerance (eq. 12's ‖g(0)‖ is taken at w = 0), in fewer iterations.
    fn fit_labels_from(
        &self,
        data: &TrainSet,
        labels: Range<usize>,
        start: Arc<SparseModel>,
        progress: &dyn Progress,
    ) -> Result<Fitted> {
        if start.n_features() != data.n_features() || start.n_labels() != data.n_labels() {
            return Err(Error::Shape {
                what: "warm start",
                detail: format!(
                    "the start model has {} labels of {} features, the data {} of {}",
                    start.n_labels(),
                    start.n_features(),
                    data.n_labels(),
                    data.n_features()
                ),
            });
        }
        self.fit_labels_with(data, labels, Box::new(FromModel { model: start }), true, progress)
    }
}

impl DismecConfig {
    /// Trains `labels` from `init` (the summary's `init` is the config's, or `"warm"` for a
    /// warm start).
    fn fit_labels_with(
        &self,
        data: &TrainSet,
        labels: Range<usize>,
        init: Box<dyn WeightInit>,
        warm: bool,
        progress: &dyn Progress,
    ) -> Result<Fitted> {
        let trained = Dismec::with_init(self, init).train_labels(data, labels, progress)?;
        let r = &trained.report;
        let labels = &r.labels;
        let (newton_mean, newton_q95) = mean_and_q95(labels.iter().map(|s| f64::from(s.newton_iters)));
        let (cg_mean, cg_q95) = mean_and_q95(labels.iter().map(|s| f64::from(s.cg_steps)));
        let (active, _) = mean_and_q95(labels.iter().map(|s| s.mean_active_fraction));
        let (step, _) = mean_and_q95(labels.iter().map(|s| s.mean_step));
        let stats = json!({
            "init": if warm { json!("warm") } else { json!(self.init) },
            "newton_iters_mean": newton_mean,
            "newton_iters_q95": newton_q95,
            "newton_iters_total": labels.iter().map(|s| u64::from(s.newton_iters)).sum::<u64>(),
            "cg_steps_mean": cg_mean,
            "cg_steps_q95": cg_q95,
            "cg_steps_total": labels.iter().map(|s| u64::from(s.cg_steps)).sum::<u64>(),
            "mean_active_fraction": active,
            "mean_line_search_step": step,
            "line_search_failures": labels.iter().filter(|s| s.line_search_failed).count(),
            "labels_without_positives": labels.iter().filter(|s| s.n_positives == 0).count(),
        });
        let summary = FitSummary::new("dismec", r.seconds, r.threads, r.nnz_before_pruning, r.nnz_after_pruning, stats);
        Ok(Fitted { model: trained.model, summary })
    }
}

/// A checked DiSMEC trainer.
#[derive(Debug)]
pub struct Dismec {
    params: NewtonParams,
    bias: bool,
    prune_threshold: f64,
    init: Box<dyn WeightInit>,
}

/// What training returns.
#[derive(Debug)]
pub struct Trained {
    /// The pruned model.
    pub model: SparseModel,
    /// How training went.
    pub report: TrainReport,
}

/// Per-label statistics and totals of a training run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TrainReport {
    /// One entry per label, in label order.
    pub labels: Vec<LabelStats>,
    /// Wall time of [`Dismec::train`], statistics included.
    pub seconds: f64,
    /// rayon threads used.
    pub threads: usize,
    /// Non-zero weights (biases included) before pruning.
    pub nnz_before_pruning: usize,
    /// Non-zero weights (biases included) after pruning.
    pub nnz_after_pruning: usize,
}

/// The weights with |w| ≥ `threshold`, as sorted (feature, weight) pairs, and the bias (the last
/// coordinate when `bias`, also pruned).
pub fn prune(w: &[f64], bias: bool, threshold: f64) -> (Vec<u32>, Vec<f32>, f32) {
    let n_features = w.len() - bias as usize;
    let (mut features, mut weights) = (Vec::new(), Vec::new());
    for (j, &v) in w[..n_features].iter().enumerate() {
        if v.abs() >= threshold && v != 0.0 {
            features.push(j as u32);
            weights.push(v as f32);
        }
    }
    let b = if bias && w[n_features].abs() >= threshold { w[n_features] as f32 } else { 0.0 };
    (features, weights, b)
}

impl Dismec {
    /// Checks `config` and builds the trainer with the initialiser it names.
    pub fn new(config: &DismecConfig) -> Result<Self> {
        config.check()?;
        Ok(Self::with_init(config, config.weight_init()))
    }

    /// As [`Dismec::new`] with another initialiser (`config.init` is ignored; `config` must
    /// have passed [`DismecConfig::check`]).
    pub fn with_init(config: &DismecConfig, init: Box<dyn WeightInit>) -> Self {
        Self {
            params: NewtonParams { c: config.c, eps0: config.eps0, max_iter: config.max_iter },
            bias: config.bias,
            prune_threshold: config.prune_threshold,
            init,
        }
    }

    /// The statistics training uses (computed by [`Dismec::train`]; exposed for callers that
    /// train single labels).
    pub fn stats(&self, data: &TrainSet) -> DataStats {
        DataStats::new(&data.features, self.bias)
    }

    /// Trains label `k` alone: its unpruned dense weights (bias last) and stats.
    pub fn train_label(&self, data: &TrainSet, stats: &DataStats, k: usize) -> (Vec<f64>, LabelStats) {
        let rows = Rows::new(&data.features, self.bias);
        let mut scratch = Scratch::new(rows.n_vars(), rows.n_rows());
        let st = self.solve(data, stats, k, &mut scratch);
        (scratch.w, st)
    }

    fn solve(&self, data: &TrainSet, stats: &DataStats, k: usize, scratch: &mut Scratch) -> LabelStats {
        let start = Instant::now();
        let rows = Rows::new(&data.features, self.bias);
        let mut st = newton::solve(rows, &self.params, k, data.labels.positives(k), stats, self.init.as_ref(), scratch);
        st.label = k as u32;
        st.nnz_before_pruning = scratch.w.iter().filter(|&&v| v != 0.0).count();
        st.seconds = start.elapsed().as_secs_f64();
        st
    }

    /// Trains every label in parallel on the current rayon pool and prunes the weights.
    pub fn train(&self, data: &TrainSet) -> Result<Trained> {
        self.train_with(data, &Silent)
    }

    /// As [`Dismec::train`], advancing `progress` by one per finished label.
    pub fn train_with(&self, data: &TrainSet, progress: &dyn Progress) -> Result<Trained> {
        self.train_labels(data, 0..data.n_labels(), progress)
    }

    /// As [`Dismec::train_with`] for the labels `labels` only (one rank's shard): the model's
    /// label `i` is label `labels.start + i`, identical to that label of the whole model.
    pub fn train_labels(&self, data: &TrainSet, labels: Range<usize>, progress: &dyn Progress) -> Result<Trained> {
        check_label_range(&labels, data.n_labels())?;
        let start = Instant::now();
        let n = data.n_samples();
        if n == 0 {
            return Err(Error::Shape { what: "training set", detail: "no samples".into() });
        }
        if n > u32::MAX as usize {
            return Err(Error::Shape { what: "training set", detail: format!("{n} samples: ids are 32-bit") });
        }
        let stats = self.stats(data);
        let n_vars = stats.n_vars();
        let (model, labels) = one_vs_all(
            data,
            labels,
            self.bias,
            progress,
            || Scratch::new(n_vars, n),
            |scratch, j| {
                let start = Instant::now();
                let mut st = self.solve(data, &stats, j, scratch);
                let (f, w, b) = prune(&scratch.w, self.bias, self.prune_threshold);
                st.nnz_after_pruning = f.len() + (b != 0.0) as usize;
                st.seconds = start.elapsed().as_secs_f64();
                (f, w, b, st)
            },
        )?;
        let report = TrainReport {
            nnz_before_pruning: labels.iter().map(|s| s.nnz_before_pruning).sum(),
            nnz_after_pruning: model.nnz(),
            labels,
            seconds: start.elapsed().as_secs_f64(),
            threads: rayon::current_num_threads(),
        };
        Ok(Trained { model, report })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::random_dataset;

    fn train_set(seed: u64) -> TrainSet {
        let (x, labels) = random_dataset(seed, 300, 40, 12);
        TrainSet::new(x, &labels).unwrap()
    }

    #[test]
    fn pruning_keeps_exactly_the_weights_at_or_above_the_threshold() {
        let w = [0.5, -0.01, 0.00999, -0.2, 0.0, 0.010000001, -0.009];
        let (f, v, b) = prune(&w, true, 0.01);
        assert_eq!(f, vec![0, 1, 3, 5]);
        assert_eq!(v, vec![0.5, -0.01, -0.2, 0.010000001]);
        assert_eq!(b, 0.0, "the bias is pruned like any weight");
        let (f, _, b) = prune(&w, false, 0.0);
        assert_eq!((f, b), (vec![0, 1, 2, 3, 5, 6], 0.0));
        // Against a trained model: every kept weight has |w| ≥ threshold, every dropped one less.
        let data = train_set(1);
        for threshold in [0.0, 0.01, 0.05] {
            let config = DismecConfig { prune_threshold: threshold, ..Default::default() };
            let dismec = Dismec::new(&config).unwrap();
            let trained = dismec.train(&data).unwrap();
            let stats = dismec.stats(&data);
            for k in 0..data.n_labels() {
                let (dense, _) = dismec.train_label(&data, &stats, k);
                let (f, w, b) = trained.model.label(k);
                let kept: Vec<u32> = (0..data.n_features() as u32)
                    .filter(|&j| dense[j as usize].abs() >= threshold && dense[j as usize] != 0.0)
                    .collect();
                assert_eq!(f, &kept[..]);
                assert!(f.iter().zip(w).all(|(&j, &v)| v == dense[j as usize] as f32));
                let db = *dense.last().unwrap();
                assert_eq!(b, if db.abs() >= threshold { db as f32 } else { 0.0 });
            }
        }
    }

    #[test]
    fn labels_without_positives_get_the_solution_each_would_get_alone() {
        let (x, labels) = random_dataset(12, 60, 12, 40);
        let data = TrainSet::new(x, &labels).unwrap();
        let empty: Vec<usize> = (0..40).filter(|&j| data.labels.positives(j).is_empty()).collect();
        assert!(empty.len() >= 3, "{empty:?}");
        let config = DismecConfig::default();
        let dismec = Dismec::new(&config).unwrap();
        let trained = dismec.train(&data).unwrap();
        let stats = dismec.stats(&data);
        for &k in &empty {
            let (dense, _) = dismec.train_label(&data, &stats, k);
            let (f, w, b) = prune(&dense, true, config.prune_threshold);
            assert_eq!(trained.model.label(k), (&f[..], &w[..], b), "label {k}");
        }
    }

    #[test]
    fn sparse_prediction_equals_dense_prediction() {
        let data = train_set(2);
        let trained = Dismec::new(&DismecConfig::default()).unwrap().train(&data).unwrap();
        let m = &trained.model;
        assert!(trained.report.nnz_after_pruning < trained.report.nnz_before_pruning);
        // Dense W (K x d) from the pruned model; scores in the sample's feature order.
        let mut w = vec![vec![0f32; m.n_features()]; m.n_labels()];
        for (k, row) in w.iter_mut().enumerate() {
            let (f, v, _) = m.label(k);
            f.iter().zip(v).for_each(|(&j, &x)| row[j as usize] = x);
        }
        let (test, _) = random_dataset(99, 50, 40, 12);
        let predicted = m.predictor().predict(&test, 5);
        for (i, hits) in predicted.iter().enumerate() {
            let (c, v) = test.row(i);
            let dense: Vec<f32> = (0..m.n_labels())
                .map(|k| c.iter().zip(v).fold(m.label(k).2, |s, (&j, &x)| s + x * w[k][j as usize]))
                .collect();
            let mut expected = Vec::new();
            farout_core::topk::top_k(&dense, 5, &mut expected);
            assert_eq!(hits, &expected, "sample {i}");
        }
    }

    #[test]
    fn the_model_does_not_depend_on_the_thread_count() {
        let data = train_set(3);
        let dismec = Dismec::new(&DismecConfig::default()).unwrap();
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| dismec.train(&data).unwrap())
        };
        let one = run(1);
        assert_eq!(one.report.threads, 1);
        let iters = |t: &Trained| t.report.labels.iter().map(|s| (s.newton_iters, s.cg_steps)).collect::<Vec<_>>();
        for threads in [2, 4] {
            let other = run(threads);
            assert_eq!(other.report.threads, threads);
            assert_eq!(one.model.to_bytes(), other.model.to_bytes(), "{threads} threads");
            assert_eq!(iters(&one), iters(&other));
        }
    }

    #[test]
    fn every_label_converges_from_every_init_to_the_same_model() {
        let data = train_set(4);
        let models: Vec<Trained> = [InitKind::Zero, InitKind::Bias, InitKind::Msi]
            .into_iter()
            .map(|init| {
                Dismec::new(&DismecConfig { init, eps0: 1e-6, ..Default::default() }).unwrap().train(&data).unwrap()
            })
            .collect();
        for t in &models {
            for s in &t.report.labels {
                let eps = newton::stopping_eps(1e-6, s.n_positives, data.n_samples());
                assert!(s.gnorm <= eps * s.gnorm0 && !s.line_search_failed, "{s:?}");
            }
        }
        for k in 0..data.n_labels() {
            let (f0, w0, b0) = models[0].model.label(k);
            for other in &models[1..] {
                let (f, w, b) = other.model.label(k);
                // Weights near the threshold may fall either side of it.
                let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * (1.0 + a.abs());
                assert!(close(b, b0), "label {k}: bias {b} vs {b0}");
                for (j, v) in f.iter().zip(w) {
                    let v0 = f0.binary_search(j).map(|at| w0[at]).unwrap_or(0.0);
                    assert!(close(*v, v0) || v.abs() < 0.0101, "label {k} feature {j}: {v} vs {v0}");
                }
            }
        }
    }

    #[test]
    fn a_warm_start_from_another_c_ends_at_the_cold_fits_model_in_fewer_iterations() {
        let data = train_set(5);
        let config = |c| DismecConfig { c, eps0: 1e-6, ..Default::default() };
        let fit = |c, start: Option<&SparseModel>| {
            let cfg = config(c);
            let labels = 0..data.n_labels();
            match start {
                None => cfg.fit_labels(&data, labels, &Silent).unwrap(),
                Some(m) => cfg.fit_labels_from(&data, labels, Arc::new(m.clone()), &Silent).unwrap(),
            }
        };
        let earlier = fit(0.5, None);
        let (cold, warm) = (fit(1.0, None), fit(1.0, Some(&earlier.model)));
        let iters = |f: &Fitted| f.summary.stats["newton_iters_total"].as_u64().unwrap();
        assert!(iters(&warm) < iters(&cold), "warm {} vs cold {} Newton iterations", iters(&warm), iters(&cold));
        assert_eq!(warm.summary.stats["init"], "warm");
        let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * (1.0 + a.abs());
        for k in 0..data.n_labels() {
            let ((fc, wc, bc), (fw, ww, bw)) = (cold.model.label(k), warm.model.label(k));
            assert!(close(bc, bw), "label {k}: bias {bw} vs {bc}");
            for (j, v) in fw.iter().zip(ww) {
                let v0 = fc.binary_search(j).map(|at| wc[at]).unwrap_or(0.0);
                // Weights near the pruning threshold may fall either side of it.
                assert!(close(*v, v0) || v.abs() < 0.0101, "label {k} feature {j}: {v} vs {v0}");
            }
        }
        let (test, _) = random_dataset(98, 60, 40, 12);
        // The same top 3 on unseen rows, scores equal to the solver's tolerance.
        let (pc, pw) = (cold.model.predictor().predict(&test, 3), warm.model.predictor().predict(&test, 3));
        for (c, w) in pc.iter().flatten().zip(pw.iter().flatten()) {
            assert!(c.class == w.class && close(c.score, w.score), "{c:?} vs {w:?}");
        }
        let other = TrainSet::new(random_dataset(6, 50, 30, 12).0, &random_dataset(6, 50, 30, 12).1).unwrap();
        let e = config(1.0).fit_labels_from(&other, 0..other.n_labels(), Arc::new(earlier.model), &Silent);
        assert!(matches!(e, Err(Error::Shape { what: "warm start", .. })), "{e:?}");
    }

    #[test]
    fn a_training_set_without_samples_is_an_error() {
        let data = TrainSet::new(farout_data::SparseRows::new(3), &farout_data::LabelSets::new(2)).unwrap();
        assert!(matches!(Dismec::new(&DismecConfig::default()).unwrap().train(&data), Err(Error::Shape { .. })));
    }

    #[test]
    fn defaults_are_the_papers_and_an_empty_table_gives_them() {
        let c: DismecConfig = toml::from_str("").unwrap();
        assert_eq!(c, DismecConfig::default());
        assert_eq!((c.c, c.eps0, c.max_iter, c.prune_threshold), (1.0, 0.01, 1000, 0.01));
        assert_eq!((c.msi_s, c.msi_t, c.init), (1.0, -2.0, InitKind::Msi));
        c.check().unwrap();
    }

    #[test]
    fn unknown_keys_and_unknown_inits_are_rejected() {
        assert!(toml::from_str::<DismecConfig>("cee = 1.0").is_err());
        assert!(toml::from_str::<DismecConfig>("init = \"ovap\"").is_err());
        let c: DismecConfig = toml::from_str("init = \"zero\"\neps0 = 0.1").unwrap();
        assert_eq!((c.init, c.eps0), (InitKind::Zero, 0.1));
    }

    #[test]
    fn check_names_the_key_and_the_allowed_values() {
        let cases: [(DismecConfig, &str); 6] = [
            (DismecConfig { c: 0.0, ..Default::default() }, "`c` = 0: must be a finite number > 0"),
            (DismecConfig { eps0: f64::NAN, ..Default::default() }, "`eps0` = NaN"),
            (DismecConfig { max_iter: 0, ..Default::default() }, "`max_iter` = 0"),
            (DismecConfig { prune_threshold: -1.0, ..Default::default() }, "`prune_threshold` = -1"),
            (DismecConfig { init: InitKind::Bias, bias: false, ..Default::default() }, "`init`"),
            (DismecConfig { msi_t: 2.0, ..Default::default() }, "`msi_t` = 2"),
        ];
        for (c, expect) in cases {
            let msg = c.check().unwrap_err().to_string();
            assert!(msg.contains(expect), "{msg:?} should contain {expect:?}");
        }
    }
}
