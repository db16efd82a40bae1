//! Reproductions of the A&R paper's experiments (Ruiz et al. 2018, Section 4), each returning
//! one serialisable report.
//!
//! Both use the framework's own pieces — [`OutputLayer`] with the paper's step-size schedule
//! ([`OptimizerConfig::ArSchedule`]) and the estimators of `farout-estimators` — so they measure
//! what a config would run.

use crate::Error;
use farout_core::rng::{self, RngExt};
use farout_core::{AliasTable, ClassId, Matrix, kernels};
use farout_estimators::{
    ArLogistic, ArProbit, ArSoftmax, Batch, Exact, Gaussian, GradientEstimator, Logistic, Ove, Softmax, ove_bound,
    utility_log_prob,
};
use farout_layer::{OptimizerConfig, OutputLayer, OutputLayerConfig};
use indicatif::ProgressBar;
use rayon::prelude::*;
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// Settings of the synthetic experiment (Section 4.1); defaults are the paper's except the
/// number of iterations (the paper runs 5 x 10^5).
#[derive(Clone, Debug)]
pub struct ArSyntheticOptions {
    /// Classes before dropping the ones no observation falls in (the paper: 10^4).
    pub classes: usize,
    /// Observations N (the paper: 3 x 10^5).
    pub observations: usize,
    /// Minibatch of observations |B| (500).
    pub batch: usize,
    /// Sampled negative classes per observation |S| (100).
    pub negatives: usize,
    /// Iterations per method.
    pub iterations: u64,
    /// Seed of the data and of both runs.
    pub seed: u64,
    /// Show progress bars.
    pub progress: bool,
}

impl Default for ArSyntheticOptions {
    fn default() -> Self {
        Self {
            classes: 10_000,
            observations: 300_000,
            batch: 500,
            negatives: 100,
            iterations: 30_000,
            seed: 0,
            progress: false,
        }
    }
}

/// What `farout repro ar-synthetic` prints.
#[derive(Clone, Debug, Serialize)]
pub struct ArSyntheticReport {
    /// A&R softmax bound on the whole data's log marginal likelihood (sum of eq. 8 over n,
    /// each with its own eta). The paper: -2.62e6.
    pub elbo_ar: f64,
    /// OVE bound on the same (sum of eq. 10). The paper: -1.40e9.
    pub elbo_ove: f64,
    /// Exact log-likelihood of the data under the A&R-fitted probabilities.
    pub log_lik_ar: f64,
    /// Exact log-likelihood under the OVE-fitted probabilities.
    pub log_lik_ove: f64,
    /// The maximum log-likelihood (at the empirical frequencies).
    pub log_lik_max: f64,
    /// Mean absolute error of the A&R-fitted probabilities against the maximum-likelihood
    /// ones (the empirical frequencies). The paper: 3.00e-6.
    pub mae_ar: f64,
    /// The same for OVE. The paper: 3.65e-6.
    pub mae_ove: f64,
    /// Mean absolute error against the generating probabilities (renormalised over the
    /// effective classes), for scale: the sampling noise of the data itself.
    pub mae_ar_vs_generating: f64,
    /// The same for OVE.
    pub mae_ove_vs_generating: f64,
    /// The empirical frequencies' own error against the generating probabilities.
    pub mae_frequencies_vs_generating: f64,
    /// Wall-clock minutes per epoch (N/|B| iterations) of A&R softmax. The paper: 0.196 (one
    /// core, MATLAB).
    pub minutes_per_epoch_ar: f64,
    /// The same for OVE. The paper: 0.189.
    pub minutes_per_epoch_ove: f64,
    /// Iterations per method.
    pub iterations: u64,
    /// Epochs per method.
    pub epochs: f64,
    /// Classes with at least one observation (the K used; the paper: 9,035).
    pub effective_classes: usize,
    /// Observations.
    pub observations: usize,
    /// Rayon threads used.
    pub threads: usize,
}

/// Trains biases only (`psi_nk = b_k`, no covariates: a constant zero feature) with `est`.
/// Returns the fitted biases and the training seconds.
fn train_biases(
    est: &dyn GradientEstimator,
    labels: &[ClassId],
    k: usize,
    opts: &ArSyntheticOptions,
    name: &str,
) -> Result<(Vec<f32>, f64), Error> {
    let cfg = OutputLayerConfig { bias: true, init_std: 0.0, ..Default::default() };
    let mut layer = OutputLayer::new(k, 1, &cfg, &paper_schedule(labels.len(), opts.batch), opts.seed)?;
    let mut phi = Matrix::zeros(opts.batch, 1);
    let run = PaperRun { batch: opts.batch, iterations: opts.iterations, seed: opts.seed, salt: 0xA5 };
    let bar = progress_bar(opts.progress, opts.iterations, name);
    let seconds = run.train(&mut layer, est, labels, &bar, &mut phi, |_, _| {})?;
    Ok((layer.bias().expect("layer has a bias").to_vec(), seconds))
}

/// The A&R paper's step sizes for `n` observations in minibatches of `batch`: rho0 = 0.02,
/// x0.9 every 2000 iterations, the batch-sum gradient scaled by N/|B| as in A&R's code.
fn paper_schedule(n: usize, batch: usize) -> OptimizerConfig {
    OptimizerConfig::ArSchedule {
        rho0: 0.02,
        decay: 0.9,
        decay_every: 2000,
        grad_scale: n as f32 / batch as f32,
        l2: 0.0,
    }
}

/// The training loop of both reproductions: `iterations` minibatches of `batch` single-label
/// observations, reshuffled each epoch (stream `1000 + epoch` of `seed`), step `it` sampling
/// from stream `it` of `seed ^ salt`.
struct PaperRun {
    batch: usize,
    iterations: u64,
    seed: u64,
    salt: u64,
}

impl PaperRun {
    /// Trains `layer` with `est` on `labels` (`fill(ids, phi)` writes the batch's features into
    /// `phi`); returns the training seconds.
    fn train(
        &self,
        layer: &mut OutputLayer,
        est: &dyn GradientEstimator,
        labels: &[ClassId],
        bar: &ProgressBar,
        phi: &mut Matrix,
        mut fill: impl FnMut(&[usize], &mut Matrix),
    ) -> Result<f64, Error> {
        let n = labels.len();
        let mut order: Vec<usize> = (0..n).collect();
        let (mut pos, mut epoch, mut seconds) = (n, 0u64, 0.0);
        for it in 0..self.iterations {
            if pos + self.batch > n {
                rng::shuffle(&mut order, &mut rng::seeded(self.seed, 1000 + epoch));
                epoch += 1;
                pos = 0;
            }
            let ids = &order[pos..pos + self.batch];
            pos += self.batch;
            let t0 = Instant::now();
            fill(ids, phi);
            let positives: Vec<[ClassId; 1]> = ids.iter().map(|&i| [labels[i]]).collect();
            let refs: Vec<&[ClassId]> = positives.iter().map(|p| &p[..]).collect();
            let mut r = rng::seeded(self.seed ^ self.salt, it);
            let stats = layer.train_step(est, Batch::new(phi, &refs).with_ids(ids), &mut r, false);
            seconds += t0.elapsed().as_secs_f64();
            if !stats.loss_sum.is_finite() {
                return Err(Error::Diverged {
                    step: it,
                    why: format!("loss = {}", stats.loss_sum),
                    kept: "a reproduction keeps no checkpoint".into(),
                    keys: "--lr".into(),
                });
            }
            if it % 50 == 0 {
                bar.set_position(it);
                bar.set_message(format!("loss/obs {:.3}", stats.loss_sum / self.batch as f64));
            }
        }
        bar.finish_and_clear();
        Ok(seconds)
    }
}

fn progress_bar(show: bool, len: u64, name: &str) -> ProgressBar {
    let bar =
        crate::report::progress_bar(show, len, "{prefix} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} {msg}");
    bar.set_prefix(name.to_string());
    bar
}

/// Softmax of `b` in f64.
fn softmax64(b: &[f32]) -> Vec<f64> {
    let m = f64::from(kernels::max(b));
    let e: Vec<f64> = b.iter().map(|&x| (x as f64 - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|x| x / z).collect()
}

fn mae(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>() / a.len() as f64
}

/// Section 4.1: `classes` classes with `p_k ∝ u_k^2`, `u_k ~ U[0, 1]`; N labels drawn from
/// p; classes no label fell in are dropped; only the biases are learned, by softmax A&R and by
/// OVE, with the same step-size schedule and batches.
pub fn ar_synthetic(opts: &ArSyntheticOptions) -> Result<ArSyntheticReport, Error> {
    if opts.batch == 0 || opts.batch > opts.observations || opts.negatives == 0 || opts.classes < 2 {
        return Err(Error::Option {
            name: "batch",
            msg: format!(
                "ar-synthetic needs 0 < batch ({}) <= observations ({}), negatives >= 1 ({}) and classes >= 2 ({})",
                opts.batch, opts.observations, opts.negatives, opts.classes
            ),
        });
    }
    let mut r = rng::seeded(opts.seed, 0);
    let u2: Vec<f64> = (0..opts.classes).map(|_| r.random::<f64>().powi(2)).collect();
    let table = AliasTable::new(&u2).expect("u^2 weights are positive");
    let raw: Vec<ClassId> = (0..opts.observations).map(|_| table.sample(&mut r)).collect();
    // Keep the classes that occur, renumbered.
    let mut counts = vec![0u64; opts.classes];
    raw.iter().for_each(|&c| counts[c as usize] += 1);
    let mut new_id = vec![u32::MAX; opts.classes];
    let mut k = 0usize;
    for c in 0..opts.classes {
        if counts[c] > 0 {
            new_id[c] = k as u32;
            k += 1;
        }
    }
    let labels: Vec<ClassId> = raw.iter().map(|&c| new_id[c as usize]).collect();
    let n = labels.len() as f64;
    let counts: Vec<u64> = counts.into_iter().filter(|&c| c > 0).collect();
    let freqs: Vec<f64> = counts.iter().map(|&c| c as f64 / n).collect();
    let gen_total: f64 = (0..opts.classes).filter(|&c| new_id[c] != u32::MAX).map(|c| u2[c]).sum();
    let generating: Vec<f64> =
        (0..opts.classes).filter(|&c| new_id[c] != u32::MAX).map(|c| u2[c] / gen_total).collect();

    let ar = ArSoftmax::new(opts.negatives, labels.len())?;
    let (b_ar, secs_ar) = train_biases(&ar, &labels, k, opts, "ar_softmax")?;
    let ove = Ove::new(opts.negatives)?;
    let (b_ove, secs_ove) = train_biases(&ove, &labels, k, opts, "ove")?;

    // Whole-data bounds. A&R: eq. 8 per observation with its own eta; sum_{k' != y} exp(b_k'
    // - b_y) = Z / exp(b_y) - 1 is shared by the observations of a class.
    let z_ar: f64 = b_ar.iter().map(|&b| (b as f64).exp()).sum();
    let mut state = vec![0.0f32; 2];
    let elbo_ar: f64 = (0..labels.len())
        .map(|i| {
            ar.sample_state().expect("ar_softmax has state").read(i, &mut state);
            let y = labels[i] as usize;
            let rest = z_ar / (b_ar[y] as f64).exp() - 1.0;
            let log_eta = state[0] as f64;
            1.0 - log_eta - (1.0 + rest) / log_eta.exp()
        })
        .sum();
    // OVE: sum over classes y of count_y * (eq. 10 for label y), every class.
    let elbo_ove: f64 = (0..k).into_par_iter().map(|y| counts[y] as f64 * ove_bound(&b_ove, y)).sum();
    let (p_ar, p_ove) = (softmax64(&b_ar), softmax64(&b_ove));
    let log_lik = |p: &[f64]| counts.iter().zip(p).map(|(&c, &q)| c as f64 * q.ln()).sum::<f64>();
    let epochs = opts.iterations as f64 * opts.batch as f64 / n;
    Ok(ArSyntheticReport {
        elbo_ar,
        elbo_ove,
        log_lik_ar: log_lik(&p_ar),
        log_lik_ove: log_lik(&p_ove),
        log_lik_max: log_lik(&freqs),
        mae_ar: mae(&p_ar, &freqs),
        mae_ove: mae(&p_ove, &freqs),
        mae_ar_vs_generating: mae(&p_ar, &generating),
        mae_ove_vs_generating: mae(&p_ove, &generating),
        mae_frequencies_vs_generating: mae(&freqs, &generating),
        minutes_per_epoch_ar: secs_ar / 60.0 / epochs,
        minutes_per_epoch_ove: secs_ove / 60.0 / epochs,
        iterations: opts.iterations,
        epochs,
        effective_classes: k,
        observations: labels.len(),
        threads: rayon::current_num_threads(),
    })
}

/// Settings of the Bibtex experiment (Section 4.2, Table 1's Bibtex row).
#[derive(Clone, Debug)]
pub struct ArBibtexOptions {
    /// Minibatch of observations |B| (488).
    pub batch: usize,
    /// Sampled negatives |S| (20).
    pub negatives: usize,
    /// Iterations per method (5,000).
    pub iterations: u64,
    /// Seed (initialisation, batches, samples).
    pub seed: u64,
    /// Show progress bars.
    pub progress: bool,
}

impl Default for ArBibtexOptions {
    fn default() -> Self {
        Self { batch: 488, negatives: 20, iterations: 5_000, seed: 0, progress: false }
    }
}

/// One method's results on Bibtex.
#[derive(Clone, Debug, Serialize)]
pub struct MethodResult {
    /// Estimator name.
    pub method: String,
    /// Mean test log-likelihood per observation under the method's model (eq. 1 for the
    /// softmax-based ones, eq. 5 by quadrature for probit and logistic).
    pub test_log_lik: f64,
    /// Test accuracy (argmax of the mean utilities).
    pub accuracy: f64,
    /// Seconds per epoch of training.
    pub seconds_per_epoch: f64,
}

/// What `farout repro ar-bibtex` prints.
#[derive(Clone, Debug, Serialize)]
pub struct ArBibtexReport {
    /// Exact softmax, OVE, A&R softmax, A&R probit, A&R logistic.
    pub methods: Vec<MethodResult>,
    /// Classes (distinct first labels over train and test; the paper: 148).
    pub classes: usize,
    /// Training observations (with at least one label).
    pub n_train: usize,
    /// Test observations (with at least one label).
    pub n_test: usize,
    /// Iterations per method.
    pub iterations: u64,
}

/// Which model a method's test log-likelihood is computed under.
#[derive(Clone, Copy)]
enum Model {
    Softmax,
    Probit,
    Logistic,
}

/// The sparse features of `ds`, read from `dir/file`; an error if they are dense.
fn sparse_features(dir: &Path, ds: &farout_data::Dataset, file: &str) -> Result<farout_data::SparseRows, Error> {
    match &ds.features {
        farout_data::Features::Sparse(s) => Ok(s.clone()),
        farout_data::Features::Dense(_) => {
            Err(Error::DataMismatch { path: dir.join(file), msg: "bibtex features should be sparse".into() })
        }
    }
}

/// Bibtex as the experiment sees it: the observations with at least one label, their features
/// as dense rows and their first label, renumbered over the `classes` that occur as one.
struct FirstLabels {
    phi_tr: Matrix,
    y_tr: Vec<ClassId>,
    phi_te: Matrix,
    y_te: Vec<ClassId>,
    classes: usize,
}

impl FirstLabels {
    /// From the train and test sets and their sparse features.
    fn new(
        (train, xtr): (&farout_data::Dataset, &farout_data::SparseRows),
        (test, xte): (&farout_data::Dataset, &farout_data::SparseRows),
    ) -> Self {
        let d = xtr.n_cols.max(xte.n_cols);
        // First labels, renumbered over the classes that occur as a first label.
        let first = |ds: &farout_data::Dataset| -> Vec<Option<ClassId>> {
            (0..ds.len()).map(|i| ds.labels.get(i).first().copied()).collect()
        };
        let (ytr, yte) = (first(train), first(test));
        let mut ids: Vec<ClassId> = ytr.iter().chain(&yte).flatten().copied().collect();
        ids.sort_unstable();
        ids.dedup();
        let remap = |y: ClassId| ids.binary_search(&y).expect("collected above") as ClassId;
        let dense = |x: &farout_data::SparseRows, ys: &[Option<ClassId>]| {
            let rows: Vec<usize> = (0..ys.len()).filter(|&i| ys[i].is_some()).collect();
            let mut m = Matrix::zeros(rows.len(), d);
            for (r, &i) in rows.iter().enumerate() {
                let (cols, vals) = x.row(i);
                for (&c, &v) in cols.iter().zip(vals) {
                    m.row_mut(r)[c as usize] = v;
                }
            }
            let labels: Vec<ClassId> = rows.iter().map(|&i| remap(ys[i].expect("filtered"))).collect();
            (m, labels)
        };
        let (phi_tr, y_tr) = dense(xtr, &ytr);
        let (phi_te, y_te) = dense(xte, &yte);
        Self { phi_tr, y_tr, phi_te, y_te, classes: ids.len() }
    }

    /// Trains a linear model with `est` on the training observations (the paper's schedule)
    /// and tests it under `model`.
    fn train_and_test(
        &self,
        est: &dyn GradientEstimator,
        model: Model,
        opts: &ArBibtexOptions,
    ) -> Result<MethodResult, Error> {
        let (k, d, n) = (self.classes, self.phi_tr.cols(), self.y_tr.len());
        let cfg = OutputLayerConfig { bias: true, init_std: 0.1, ..Default::default() };
        let mut layer = OutputLayer::new(k, d, &cfg, &paper_schedule(n, opts.batch), opts.seed)?;
        let mut phi = Matrix::zeros(opts.batch, d);
        let run = PaperRun { batch: opts.batch, iterations: opts.iterations, seed: opts.seed, salt: 0xB1B };
        let bar = progress_bar(opts.progress, opts.iterations, est.name());
        let seconds = run.train(&mut layer, est, &self.y_tr, &bar, &mut phi, |ids, phi| {
            for (r, &i) in ids.iter().enumerate() {
                phi.row_mut(r).copy_from_slice(self.phi_tr.row(i));
            }
        })?;
        let (ll, correct) = self.test_sums(&layer, model);
        let epochs = opts.iterations as f64 * opts.batch as f64 / n as f64;
        Ok(MethodResult {
            method: est.name().to_string(),
            test_log_lik: ll / self.y_te.len() as f64,
            accuracy: correct as f64 / self.y_te.len() as f64,
            seconds_per_epoch: seconds / epochs,
        })
    }

    /// The test log-likelihood under `model` of `layer`'s utilities, summed over the test
    /// observations, and how many of them have their label as the argmax.
    fn test_sums(&self, layer: &OutputLayer, model: Model) -> (f64, usize) {
        let y_te = &self.y_te;
        let mut z = Matrix::default();
        layer.scores(&self.phi_te, &mut z);
        (0..y_te.len())
            .into_par_iter()
            .map(|i| {
                let psi = z.row(i);
                let y = y_te[i] as usize;
                let ll = match model {
                    Model::Softmax => {
                        let m = f64::from(kernels::max(psi));
                        psi[y] as f64 - m - psi.iter().map(|&p| (p as f64 - m).exp()).sum::<f64>().ln()
                    }
                    Model::Probit => utility_log_prob::<Gaussian>(psi, y),
                    Model::Logistic => utility_log_prob::<Logistic>(psi, y),
                };
                let best = (0..psi.len()).max_by(|&a, &b| psi[a].total_cmp(&psi[b])).unwrap_or(0);
                (ll, (best == y) as usize)
            })
            .reduce(|| (0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }
}

/// Section 4.2 on Bibtex: keep each observation's first label, linear model on the raw
/// features (`psi = W x + b`), 5,000 iterations of |B| = 488, |S| = 20 with the paper's step
/// schedule, for exact softmax, OVE and the three A&R estimators.
pub fn ar_bibtex(dir: &Path, opts: &ArBibtexOptions) -> Result<ArBibtexReport, Error> {
    let train = farout_data::xmc::read(&dir.join("train.txt"))?;
    let test = farout_data::xmc::read(&dir.join("test.txt"))?;
    let (xtr, xte) = (sparse_features(dir, &train, "train.txt")?, sparse_features(dir, &test, "test.txt")?);
    let data = FirstLabels::new((&train, &xtr), (&test, &xte));
    let k = data.classes;
    let n = data.y_tr.len();
    if opts.batch == 0 || opts.batch > n {
        return Err(Error::Option { name: "batch", msg: format!("{} must be in 1..={n}", opts.batch) });
    }
    let methods: Vec<(Box<dyn GradientEstimator>, Model)> = vec![
        (Box::new(Exact::new(Softmax)), Model::Softmax),
        (Box::new(Ove::new(opts.negatives)?), Model::Softmax),
        (Box::new(ArSoftmax::new(opts.negatives, n)?), Model::Softmax),
        (Box::new(ArProbit::new(opts.negatives, n)?), Model::Probit),
        (Box::new(ArLogistic::new(opts.negatives, n)?), Model::Logistic),
    ];
    let mut results = Vec::new();
    for (est, model) in &methods {
        results.push(data.train_and_test(est.as_ref(), *model, opts)?);
    }
    Ok(ArBibtexReport {
        methods: results,
        classes: k,
        n_train: n,
        n_test: data.y_te.len(),
        iterations: opts.iterations,
    })
}
