use farout_core::{Matrix, ParamError, kernels};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Optimiser of the output layer's rows (and of other sparse tables such as encoder inputs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum OptimizerConfig {
    /// SGD with cooling: `lr_t = lr / (1 + decay * t)`, t = steps taken. `decay = 1` is the
    /// LDGS paper's literal `1/(1+t)` scheme; smaller values cool more slowly.
    Sgd {
        /// Initial step size (the paper picks from {1, 0.1, 0.01}).
        lr: f32,
        /// Cooling rate.
        #[serde(default = "default_decay")]
        decay: f32,
        /// L2 penalty (applied to touched rows).
        #[serde(default)]
        l2: f32,
    },
    /// AdaGrad: `acc += g^2; w -= lr * g / (sqrt(acc) + eps)` per coordinate.
    Adagrad {
        /// Step size.
        lr: f32,
        /// Added to the denominator.
        #[serde(default = "default_eps")]
        eps: f32,
        /// L2 penalty (applied to touched rows).
        #[serde(default)]
        l2: f32,
    },
    /// The A&R paper's schedule (Kucukelbir et al. 2017, RMSProp/AdaGrad mix):
    /// `g' = grad_scale g + l2 w; s = 0.1 g'^2 + 0.9 s` (`s = g'^2` on a coordinate's first
    /// update); `w -= rho_t g' / (1 + sqrt(s))` with `rho_t = rho0 decay^floor(t / decay_every)
    /// t^(-1/2)`, t = 1, 2, ... the step. A&R's code multiplies the batch-sum gradient by
    /// `N/|B|` (a full-data estimate): set `grad_scale` to that to match it. Rows are updated
    /// lazily: `s` of an untouched coordinate does not decay.
    ArSchedule {
        /// Base step size (the paper: 0.02).
        #[serde(default = "default_rho0")]
        rho0: f32,
        /// Factor applied to `rho0` every `decay_every` steps (the paper: 0.9 every 2000).
        #[serde(default = "default_ar_decay")]
        decay: f32,
        /// Steps between decays.
        #[serde(default = "default_decay_every")]
        decay_every: u64,
        /// Multiplies the gradient before use.
        #[serde(default = "default_one")]
        grad_scale: f32,
        /// L2 penalty (applied to touched rows).
        #[serde(default)]
        l2: f32,
    },
}

fn default_rho0() -> f32 {
    0.02
}
fn default_ar_decay() -> f32 {
    0.9
}
fn default_decay_every() -> u64 {
    2000
}
fn default_one() -> f32 {
    1.0
}

fn default_decay() -> f32 {
    1e-4
}
fn default_eps() -> f32 {
    1e-8
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig::Adagrad { lr: 0.1, eps: default_eps(), l2: 0.0 }
    }
}

impl OptimizerConfig {
    /// The ranges `farout tune` draws from (keys relative to the optimiser's table): the step
    /// size, log-uniformly over a decade either side of the configured one (a step size is a
    /// scale, and the configured one is where a recipe starts). The A&R schedule keeps its own.
    pub fn search_space(&self) -> Vec<farout_core::space::Dim> {
        use farout_core::space::Dim;
        match *self {
            OptimizerConfig::Sgd { lr, .. } | OptimizerConfig::Adagrad { lr, .. } if lr > 0.0 && lr.is_finite() => {
                vec![Dim::float_log("lr", f64::from(lr) / 10.0, f64::from(lr) * 10.0)]
            }
            _ => Vec::new(),
        }
    }

    /// Checks the values; errors name the key relative to the optimizer's table (`lr`, `eps`).
    pub fn check(&self) -> Result<(), ParamError> {
        // The step size's key: `lr`, or `rho0` for the A&R schedule.
        let (lr_key, lr, l2) = match *self {
            OptimizerConfig::Sgd { lr, decay, l2 } => {
                if !(decay >= 0.0) {
                    return Err(ParamError::new("decay", decay, "must be >= 0"));
                }
                ("lr", lr, l2)
            }
            OptimizerConfig::Adagrad { lr, eps, l2 } => {
                if !(eps > 0.0) {
                    return Err(ParamError::new("eps", eps, "must be > 0"));
                }
                ("lr", lr, l2)
            }
            OptimizerConfig::ArSchedule { rho0, decay, decay_every, grad_scale, l2 } => {
                if !(decay > 0.0 && decay <= 1.0) {
                    return Err(ParamError::new("decay", decay, "must be in (0, 1]"));
                }
                if decay_every == 0 {
                    return Err(ParamError::new("decay_every", decay_every, "must be >= 1"));
                }
                if !(grad_scale > 0.0 && grad_scale.is_finite()) {
                    return Err(ParamError::new("grad_scale", grad_scale, "must be > 0"));
                }
                ("rho0", rho0, l2)
            }
        };
        if !(lr > 0.0 && lr.is_finite()) {
            return Err(ParamError::new(lr_key, lr, "must be a finite number > 0"));
        }
        if !(l2 >= 0.0) {
            return Err(ParamError::new("l2", l2, "must be >= 0"));
        }
        Ok(())
    }

    /// The optimiser for a `rows x cols` table.
    pub fn build(&self, rows: usize, cols: usize) -> Optimizer {
        let accum = match self {
            OptimizerConfig::Adagrad { .. } | OptimizerConfig::ArSchedule { .. } => vec![0.0; rows * cols],
            OptimizerConfig::Sgd { .. } => Vec::new(),
        };
        Optimizer { config: self.clone(), accum, step: 0 }
    }
}

/// Optimiser state of a `rows x cols` table: AdaGrad's accumulators and the step counter.
#[derive(Clone, Debug, PartialEq)]
pub struct Optimizer {
    config: OptimizerConfig,
    /// AdaGrad squared-gradient sums, row-major like the table (empty for SGD).
    pub(crate) accum: Vec<f32>,
    /// Steps taken (drives SGD cooling).
    pub(crate) step: u64,
}

impl Optimizer {
    /// The configuration.
    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }

    /// Steps taken so far.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Sets the step counter (when resuming from a checkpoint).
    pub fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    /// AdaGrad accumulators, row-major like the table (empty for SGD).
    pub fn accum(&self) -> &[f32] {
        &self.accum
    }

    /// Marks the end of a step (advances the cooling schedule).
    pub fn advance(&mut self) {
        self.step += 1;
    }

    /// The current SGD step size (AdaGrad: its base step size).
    pub fn lr(&self) -> f32 {
        match self.config {
            OptimizerConfig::Sgd { lr, decay, .. } => lr / (1.0 + decay * self.step as f32),
            OptimizerConfig::Adagrad { lr, .. } => lr,
            OptimizerConfig::ArSchedule { rho0, decay, decay_every, .. } => {
                let t = self.step + 1;
                rho0 * decay.powi((t / decay_every).min(i32::MAX as u64) as i32) / (t as f32).sqrt()
            }
        }
    }

    /// Whether updates need the per-element gradient (AdaGrad) rather than a fused product.
    pub fn is_adaptive(&self) -> bool {
        matches!(self.config, OptimizerConfig::Adagrad { .. } | OptimizerConfig::ArSchedule { .. })
    }

    /// The L2 penalty.
    pub fn l2(&self) -> f32 {
        match self.config {
            OptimizerConfig::Sgd { l2, .. }
            | OptimizerConfig::Adagrad { l2, .. }
            | OptimizerConfig::ArSchedule { l2, .. } => l2,
        }
    }

    /// The update rule of the current step (a copy, so that rows and accumulators can be
    /// borrowed mutably while it is applied).
    pub fn rule(&self) -> UpdateRule {
        match self.config {
            OptimizerConfig::Sgd { l2, .. } => UpdateRule::Sgd { lr: self.lr(), l2 },
            OptimizerConfig::Adagrad { lr, eps, l2 } => UpdateRule::Adagrad { lr, eps, l2 },
            OptimizerConfig::ArSchedule { grad_scale, l2, .. } => {
                UpdateRule::ArSchedule { lr: self.lr(), scale: grad_scale, l2 }
            }
        }
    }

    /// Accumulator rows (row-major, like the table; empty for SGD).
    pub fn accum_mut(&mut self) -> &mut [f32] {
        &mut self.accum
    }

    /// The accumulator slice of row `r` for a table with `cols` columns (empty for SGD).
    pub fn accum_row(&mut self, r: usize, cols: usize) -> &mut [f32] {
        if self.accum.is_empty() { &mut [] } else { &mut self.accum[r * cols..(r + 1) * cols] }
    }

    /// One step of [`Self::rule`] on the rows `ids` of `table` (ascending, distinct), row `j`
    /// of `grads` being the gradient of row `ids[j]`. Ranges of about equal numbers of rows
    /// run in parallel, each owning its rows of the table and of the optimiser state; the
    /// step counter is not advanced.
    pub fn apply_rows(&mut self, table: &mut Matrix, ids: &[u32], grads: &Matrix) {
        let d = table.cols();
        assert!(grads.rows() == ids.len() && grads.cols() == d, "a gradient row of {d} values per id");
        assert!(ids.windows(2).all(|p| p[0] < p[1]), "ids ascending and distinct");
        if ids.is_empty() {
            return;
        }
        let rule = self.rule();
        // Runs of ids, a few per thread, each owning the table rows from its first id on.
        let per = ids.len().div_ceil(4 * rayon::current_num_threads());
        let runs: Vec<&[u32]> = ids.chunks(per).collect();
        let cuts: Vec<usize> = runs[1..].iter().map(|run| run[0] as usize).collect();
        let firsts = std::iter::once(0).chain(cuts.iter().copied());
        let acc_width = if self.accum.is_empty() { 0 } else { d };
        let parts =
            split_rows(table.as_mut_slice(), &cuts, d).into_iter().zip(split_rows(&mut self.accum, &cuts, acc_width));
        let work: Vec<_> = parts.zip(firsts).zip(runs.into_iter().zip(grads.as_slice().chunks(per * d))).collect();
        work.into_par_iter().for_each(|(((rows, acc), first), (ids, grads))| {
            for (t, (&id, g)) in ids.iter().zip(grads.chunks_exact(d)).enumerate() {
                // The rows are scattered over the table: request the ones a few ids ahead.
                if let Some(&next) = ids.get(t + ROWS_AHEAD) {
                    let r = next as usize - first;
                    kernels::prefetch(&rows[r * d..(r + 1) * d]);
                    if !acc.is_empty() {
                        kernels::prefetch(&acc[r * d..(r + 1) * d]);
                    }
                }
                let r = id as usize - first;
                let acc_row = if acc.is_empty() { &mut [][..] } else { &mut acc[r * d..(r + 1) * d] };
                rule.apply(&mut rows[r * d..(r + 1) * d], acc_row, g);
            }
        });
    }
}

/// Rows ahead whose values and optimiser state [`Optimizer::apply_rows`] requests.
const ROWS_AHEAD: usize = 4;

/// Cuts a table of rows `width` long into the parts starting at row 0 and at each of `cuts`
/// (increasing row numbers).
pub(crate) fn split_rows<'a>(mut rows: &'a mut [f32], cuts: &[usize], width: usize) -> Vec<&'a mut [f32]> {
    let mut parts = Vec::with_capacity(cuts.len() + 1);
    let mut at = 0;
    for &cut in cuts {
        let (part, rest) = std::mem::take(&mut rows).split_at_mut((cut - at) * width);
        parts.push(part);
        rows = rest;
        at = cut;
    }
    parts.push(rows);
    parts
}

/// One step's update rule for a row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UpdateRule {
    /// `w -= lr (g + l2 w)`.
    Sgd {
        /// Step size of this step.
        lr: f32,
        /// L2 penalty.
        l2: f32,
    },
    /// `g += l2 w; acc += g^2; w -= lr g / (sqrt(acc) + eps)`.
    Adagrad {
        /// Step size.
        lr: f32,
        /// Added to the denominator.
        eps: f32,
        /// L2 penalty.
        l2: f32,
    },
    /// `g = scale g + l2 w; s = 0.1 g^2 + 0.9 s (s = g^2 at first); w -= lr g / (1 + sqrt(s))`.
    ArSchedule {
        /// `rho_t` of this step.
        lr: f32,
        /// Gradient multiplier.
        scale: f32,
        /// L2 penalty.
        l2: f32,
    },
}

impl UpdateRule {
    /// Applies `grad` to `row`; `acc` is the row's AdaGrad accumulator (ignored by SGD).
    #[inline]
    pub fn apply(&self, row: &mut [f32], acc: &mut [f32], grad: &[f32]) {
        match *self {
            UpdateRule::Sgd { lr, l2 } => {
                for (w, g) in row.iter_mut().zip(grad) {
                    *w -= lr * (g + l2 * *w);
                }
            }
            UpdateRule::Adagrad { lr, eps, l2 } => {
                debug_assert_eq!(acc.len(), row.len());
                for ((w, a), g) in row.iter_mut().zip(acc.iter_mut()).zip(grad) {
                    let g = g + l2 * *w;
                    *a += g * g;
                    *w -= lr * g / (a.sqrt() + eps);
                }
            }
            UpdateRule::ArSchedule { lr, scale, l2 } => {
                debug_assert_eq!(acc.len(), row.len());
                for ((w, s), g) in row.iter_mut().zip(acc.iter_mut()).zip(grad) {
                    let g = scale * g + l2 * *w;
                    *s = if *s == 0.0 { g * g } else { 0.1 * g * g + 0.9 * *s };
                    *w -= lr * g / (1.0 + s.sqrt());
                }
            }
        }
    }

    /// Applies per-element gradients to a table of scalars (a bias), `acc` empty for SGD.
    pub fn apply_scalars(&self, values: &mut [f32], acc: &mut [f32], grad: &[f32]) {
        for j in 0..values.len() {
            let a = if acc.is_empty() { &mut [][..] } else { &mut acc[j..j + 1] };
            self.apply(&mut values[j..j + 1], a, &grad[j..j + 1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parallel ranges of [`Optimizer::apply_rows`] step every named row (and its AdaGrad
    /// state) exactly as one loop over the rows does, and leave the other rows alone: many ids
    /// (many ranges), a few, one, none.
    #[test]
    fn applying_rows_in_parallel_ranges_equals_the_row_by_row_loop() {
        let mut r = farout_core::rng::seeded(3, 0);
        for n_ids in [0, 1, 5, 300] {
            for config in [
                OptimizerConfig::Adagrad { lr: 0.1, eps: 1e-6, l2: 0.01 },
                OptimizerConfig::Sgd { lr: 0.5, decay: 0.0, l2: 0.0 },
            ] {
                let (n, d) = (1_000, 7);
                let mut table = Matrix::zeros(n, d);
                table.as_mut_slice().iter_mut().for_each(|x| *x = farout_core::rng::normal(&mut r));
                // Scattered rows: 7 i + 3 runs through every residue mod 1,000 once.
                let ids: Vec<u32> = (0..n as u32).filter(|i| (i * 7 + 3) % 1_000 < n_ids as u32).collect();
                let mut grads = Matrix::zeros(ids.len(), d);
                grads.as_mut_slice().iter_mut().for_each(|x| *x = farout_core::rng::normal(&mut r));
                let (mut fast, mut slow) = (config.build(n, d), config.build(n, d));
                let (mut a, mut b) = (table.clone(), table.clone());
                for _ in 0..2 {
                    fast.apply_rows(&mut a, &ids, &grads);
                    let rule = slow.rule();
                    for (j, &f) in ids.iter().enumerate() {
                        rule.apply(b.row_mut(f as usize), slow.accum_row(f as usize, d), grads.row(j));
                    }
                }
                assert_eq!(a, b, "{n_ids} ids, {config:?}");
                assert_eq!(fast.accum, slow.accum);
                assert_eq!(a == table, ids.is_empty());
            }
        }
    }

    #[test]
    fn sgd_cools_as_one_over_one_plus_t() {
        let mut o = OptimizerConfig::Sgd { lr: 1.0, decay: 1.0, l2: 0.0 }.build(1, 1);
        assert_eq!(o.lr(), 1.0);
        o.advance();
        o.advance();
        assert!((o.lr() - 1.0 / 3.0).abs() < 1e-7);
    }

    #[test]
    fn adagrad_step_is_lr_on_first_update() {
        let mut o = OptimizerConfig::Adagrad { lr: 0.5, eps: 0.0, l2: 0.0 }.build(1, 2);
        let rule = o.rule();
        let mut row = [1.0, 1.0];
        rule.apply(&mut row, o.accum_row(0, 2), &[2.0, -0.1]);
        // First AdaGrad step moves each coordinate by lr * sign(g).
        assert!((row[0] - 0.5).abs() < 1e-6 && (row[1] - 1.5).abs() < 1e-6);
    }

    #[test]
    fn ar_schedule_follows_the_papers_formula() {
        let bad = OptimizerConfig::ArSchedule { rho0: 0.0, decay: 0.9, decay_every: 2, grad_scale: 10.0, l2: 0.0 };
        assert_eq!(bad.check().unwrap_err().name, "rho0", "rho0 is named");
        let cfg = OptimizerConfig::ArSchedule { rho0: 0.02, decay: 0.9, decay_every: 2, grad_scale: 10.0, l2: 0.0 };
        let mut o = cfg.build(1, 1);
        let mut w = [0.0f32];
        // t = 1: s = (10*0.5)^2 = 25, rho = 0.02; step = 0.02 * 5 / (1 + 5).
        o.rule().apply(&mut w, o.accum_row(0, 1), &[0.5]);
        assert!((w[0] + 0.02 * 5.0 / 6.0).abs() < 1e-7, "{}", w[0]);
        o.advance();
        // t = 2: rho = 0.02 * 0.9 / sqrt(2); s = 0.1 * 1 + 0.9 * 25 = 22.6.
        let before = w[0];
        o.rule().apply(&mut w, o.accum_row(0, 1), &[0.1]);
        let expect = 0.02 * 0.9 / 2f32.sqrt() * 1.0 / (1.0 + 22.6f32.sqrt());
        assert!((before - w[0] - expect).abs() < 1e-7, "{} vs {expect}", before - w[0]);
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = OptimizerConfig::Sgd { lr: -1.0, decay: 0.0, l2: 0.0 }.check().unwrap_err();
        assert_eq!(e.name, "lr", "{e}");
    }
}
