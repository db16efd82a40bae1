//! One binary DiSMEC problem solved by LIBLINEAR's (>= 2.40) line-search truncated Newton
//! method (Galli & Lin 2021; \[M\] Sect. 2 and 5).
//!
//! For one label with y_i = +1 on its positives P and −1 on the rest N (eqs. 3–5):
//!
//! ```text
//! L(w) = ½‖w‖² + C Σ_i φ(y_i wᵀx_i),    φ(m) = max(0, 1 − m)²
//! I    = { i : y_i wᵀx_i < 1 }                                       (eq. 19)
//! g    = w + 2C Σ_{i∈I} (wᵀx_i − y_i) x_i                            (eq. 20; y_i² = 1)
//! Hd   = d + 2C Σ_{i∈I} (x_iᵀd) x_i                                  (eq. 20, generalised Hessian)
//! g(0) = −2C Σ_i y_i x_i = −2C (2|P| p̄ − n x̄)                         (all i ∈ I at w = 0)
//! ```
//!
//! x_i carries the implicit bias feature x_0 = 1 as its last coordinate. Only the active set
//! I enters g, Hd and the preconditioner, so a good start (few negatives in I) makes every CG
//! step cheap: that is what MSI buys ("implicit negative mining", \[M\] Sect. 3).
//!
//! The iteration is LIBLINEAR's `newton.cpp` rule for rule:
//! stopping tolerance `eps = eps0 · max(1, min(|P|,|N|)) / n` (eq. 13) relative to ‖g(0)‖
//! taken at w = 0 even when warm-started (eq. 12); the diagonal preconditioner
//! `M = (1 − α) + α·diag(H)`; CG stopped by the Nash–Sofer relative decrease of the quadratic
//! model, not by a residual norm; Armijo backtracking on `f(w + αs)`, each trial O(n) with the
//! products z_i = x_iᵀs cached. All sums are f64; the features stay f32.

use crate::data::{DataStats, SparseRows};
use crate::init::{InitContext, WeightInit};

/// CG stops when the model decrease of step j satisfies `j·(Q_j − Q_{j−1}) ≥ CG_EPS_MAX·Q_j`
/// (the tolerance is `min(CG_EPS_MAX, sqrt(‖g‖_{M⁻¹}))`): \[M\] Sect. 5, "ε = 0.5".
pub const CG_EPS_MAX: f64 = 0.5;
/// Preconditioner mixing α: `M = (1 − α)·1 + α·diag(H)` (\[M\] Sect. 5, α = 0.01).
pub const PRECOND_ALPHA: f64 = 0.01;
/// Armijo constant η of the line search: accept when `f(w+αs) − f(w) ≤ η α gᵀs`.
pub const LINE_SEARCH_ETA: f64 = 0.01;
/// Step halvings tried before the line search gives up.
pub const LINE_SEARCH_STEPS: usize = 20;
/// Newton stops when the objective changes by at most this fraction of |f| (LIBLINEAR's
/// "actred too small").
pub const MIN_RELATIVE_DECREASE: f64 = 1e-12;
/// CG stops when the curvature `dᵀHd` is at most this (avoids 0/0).
pub const MIN_CURVATURE: f64 = 1e-16;
/// CG runs at most `max(n_vars, MIN_CG_STEPS)` steps.
pub const MIN_CG_STEPS: usize = 5;

/// Parameters of the Newton solver, already checked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NewtonParams {
    /// Loss weight C.
    pub c: f64,
    /// ε0 of eq. 13.
    pub eps0: f64,
    /// Maximum Newton iterations.
    pub max_iter: usize,
}

/// What the solver did for one label.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct LabelStats {
    /// The label.
    pub label: u32,
    /// |P|.
    pub n_positives: usize,
    /// Accepted Newton steps.
    pub newton_iters: u32,
    /// CG steps (Hessian-vector products) over all Newton iterations.
    pub cg_steps: u32,
    /// |I|/n at the returned weights.
    pub active_fraction: f64,
    /// |I|/n at the initial weights.
    pub initial_active_fraction: f64,
    /// Mean of |I|/n over the Newton iterations (the sets the CG steps of each iteration used).
    pub mean_active_fraction: f64,
    /// Mean accepted line-search step α (1 when the quadratic model is trusted).
    pub mean_step: f64,
    /// ‖g(0)‖ (eq. 12).
    pub gnorm0: f64,
    /// ‖g‖ at the returned weights.
    pub gnorm: f64,
    /// L(w) at the returned weights.
    pub objective: f64,
    /// Whether the last line search found no acceptable step.
    pub line_search_failed: bool,
    /// Non-zero weights (bias included) before pruning.
    pub nnz_before_pruning: usize,
    /// Non-zero weights (bias included) after pruning.
    pub nnz_after_pruning: usize,
    /// Wall time of this label (initialisation, Newton, pruning).
    pub seconds: f64,
}

impl crate::ova::LabelStat for LabelStats {
    fn shared_as(&self, label: usize) -> Self {
        Self { label: label as u32, seconds: 0.0, ..self.clone() }
    }
}

/// The stopping tolerance of eq. 13: `eps0 · max(1, min(|P|, |N|)) / n`.
pub fn stopping_eps(eps0: f64, n_positives: usize, n_samples: usize) -> f64 {
    let n_negatives = n_samples - n_positives;
    eps0 * n_positives.min(n_negatives).max(1) as f64 / n_samples.max(1) as f64
}

/// The rows X with the implicit bias feature as the last coordinate.
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    x: &'a SparseRows,
    bias: bool,
}

impl<'a> Rows<'a> {
    /// Views `x`, with x_0 = 1 appended when `bias`.
    pub fn new(x: &'a SparseRows, bias: bool) -> Self {
        Self { x, bias }
    }

    /// Number of weights: features plus bias.
    pub fn n_vars(&self) -> usize {
        self.x.n_cols + self.bias as usize
    }

    /// Number of samples.
    pub fn n_rows(&self) -> usize {
        self.x.n_rows()
    }

    /// Row i's (columns, values), read from the CSR fields directly: `SparseRows::row` lives in
    /// another crate and is not inlined without LTO, and this is the solver's innermost loop.
    #[inline(always)]
    fn row(&self, i: usize) -> (&'a [u32], &'a [f32]) {
        let r = self.x.indptr[i]..self.x.indptr[i + 1];
        (&self.x.indices[r.clone()], &self.x.values[r])
    }

    /// x_iᵀv, in four interleaved f64 sums: one running sum waits on the add latency at every
    /// entry, which made this the hottest loop (the line search's X·s over all rows).
    #[inline]
    pub fn dot(&self, i: usize, v: &[f64]) -> f64 {
        let (cols, vals) = self.row(i);
        let mut acc = [0.0f64; 4];
        let (cc, vc) = (cols.chunks_exact(4), vals.chunks_exact(4));
        let (c_rest, v_rest) = (cc.remainder(), vc.remainder());
        for (c, x) in cc.zip(vc) {
            for l in 0..4 {
                acc[l] += x[l] as f64 * v[c[l] as usize];
            }
        }
        let mut tail = if self.bias { v[self.x.n_cols] } else { 0.0 };
        for (&c, &x) in c_rest.iter().zip(v_rest) {
            tail += x as f64 * v[c as usize];
        }
        (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
    }

    /// out += a x_i.
    #[inline]
    pub fn axpy(&self, i: usize, a: f64, out: &mut [f64]) {
        let (cols, vals) = self.row(i);
        if self.bias {
            out[self.x.n_cols] += a;
        }
        for (&c, &x) in cols.iter().zip(vals) {
            out[c as usize] += a * x as f64;
        }
    }

    /// out += a · (x_ij²)_j.
    #[inline]
    fn axpy_sq(&self, i: usize, a: f64, out: &mut [f64]) {
        let (cols, vals) = self.row(i);
        if self.bias {
            out[self.x.n_cols] += a;
        }
        for (&c, &x) in cols.iter().zip(vals) {
            out[c as usize] += a * (x as f64 * x as f64);
        }
    }
}

/// Per-thread buffers of the solver: dense vectors of length n_vars and n, reused across labels
/// so that the label loop allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct Scratch {
    /// The weights: the solution after [`solve`].
    pub w: Vec<f64>,
    g: Vec<f64>,
    s: Vec<f64>,
    r: Vec<f64>,
    z: Vec<f64>,
    d: Vec<f64>,
    hd: Vec<f64>,
    m: Vec<f64>,
    /// Margins wᵀx_i.
    wx: Vec<f64>,
    /// x_iᵀs of the line search.
    xs: Vec<f64>,
    y: Vec<f64>,
    active: Vec<u32>,
}

impl Scratch {
    /// Buffers for `n_vars` weights and `n` samples.
    pub fn new(n_vars: usize, n: usize) -> Self {
        let v = || vec![0.0; n_vars];
        Self {
            w: v(),
            g: v(),
            s: v(),
            r: v(),
            z: v(),
            d: v(),
            hd: v(),
            m: v(),
            wx: vec![0.0; n],
            xs: vec![0.0; n],
            y: vec![0.0; n],
            active: Vec::with_capacity(n),
        }
    }
}

#[inline]
fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm(a: &[f64]) -> f64 {
    dot(a, a).sqrt()
}

/// C φ(m) summed from margins: `C Σ_i max(0, 1 − y_i(wx_i + α xs_i))²`.
fn loss(c: f64, y: &[f64], wx: &[f64], xs: &[f64], alpha: f64) -> f64 {
    let mut acc = 0.0;
    for i in 0..y.len() {
        let d = 1.0 - y[i] * (wx[i] + alpha * xs[i]);
        if d > 0.0 {
            acc += d * d;
        }
    }
    c * acc
}

/// L(w) from the margins wx: `½‖w‖² + C Σ φ(y_i wx_i)`.
pub fn objective(c: f64, w: &[f64], y: &[f64], wx: &[f64]) -> f64 {
    let mut acc = 0.0;
    for (&yi, &m) in y.iter().zip(wx) {
        let d = 1.0 - yi * m;
        if d > 0.0 {
            acc += d * d;
        }
    }
    0.5 * dot(w, w) + c * acc
}

/// Collects I (eq. 19) into `active` and writes g (eq. 20) into `g`.
pub fn active_set_and_gradient(
    rows: Rows,
    c: f64,
    w: &[f64],
    y: &[f64],
    wx: &[f64],
    active: &mut Vec<u32>,
    g: &mut [f64],
) {
    active.clear();
    g.copy_from_slice(w);
    for i in 0..y.len() {
        if y[i] * wx[i] < 1.0 {
            active.push(i as u32);
            rows.axpy(i, 2.0 * c * (wx[i] - y[i]), g);
        }
    }
}

/// `out = d + 2C Σ_{i∈I} (x_iᵀd) x_i` (eq. 20), the sum restricted to the active set.
pub fn hessian_vec(rows: Rows, c: f64, active: &[u32], d: &[f64], out: &mut [f64]) {
    out.copy_from_slice(d);
    for &i in active {
        let t = rows.dot(i as usize, d);
        rows.axpy(i as usize, 2.0 * c * t, out);
    }
}

/// The diagonal preconditioner `M_j = (1 − α) + α(1 + 2C Σ_{i∈I} x_ij²)`.
fn preconditioner(rows: Rows, c: f64, active: &[u32], m: &mut [f64]) {
    m.fill(1.0);
    for &i in active {
        rows.axpy_sq(i as usize, 2.0 * c, m);
    }
    m.iter_mut().for_each(|v| *v = (1.0 - PRECOND_ALPHA) + PRECOND_ALPHA * *v);
}

/// ‖g(0)‖ = 2C ‖2 Σ_P x_i − Σ_i x_i‖ (eq. 12 with g(0) of eq. 20); `tmp` is overwritten.
pub fn gnorm_at_zero(rows: Rows, c: f64, positives: &[u32], stats: &DataStats, tmp: &mut [f64]) -> f64 {
    tmp.fill(0.0);
    for &i in positives {
        rows.axpy(i as usize, 1.0, tmp);
    }
    let sq: f64 = (0..tmp.len()).map(|j| (2.0 * tmp[j] - stats.sum_with_bias(j)).powi(2)).sum();
    2.0 * c * sq.sqrt()
}

/// Preconditioned CG on `H s = −g` with the Nash–Sofer stop; returns the number of steps.
#[allow(clippy::too_many_arguments)]
fn pcg(
    rows: Rows,
    c: f64,
    active: &[u32],
    g: &[f64],
    m: &[f64],
    s: &mut [f64],
    r: &mut [f64],
    z: &mut [f64],
    d: &mut [f64],
    hd: &mut [f64],
) -> u32 {
    let n = g.len();
    for j in 0..n {
        s[j] = 0.0;
        r[j] = -g[j];
        z[j] = r[j] / m[j];
        d[j] = z[j];
    }
    let mut z_t_r = dot(z, r);
    let cgtol = CG_EPS_MAX.min(z_t_r.sqrt().sqrt());
    let max_steps = n.max(MIN_CG_STEPS);
    let mut q = 0.0;
    let mut steps = 0u32;
    while (steps as usize) < max_steps {
        steps += 1;
        hessian_vec(rows, c, active, d, hd);
        let d_hd = dot(d, hd);
        if d_hd <= MIN_CURVATURE {
            break;
        }
        let alpha = z_t_r / d_hd;
        for j in 0..n {
            s[j] += alpha * d[j];
            r[j] -= alpha * hd[j];
        }
        // Quadratic model at s: Q(s) = gᵀs + ½ sᵀHs = −½(sᵀr − sᵀg), since r = −g − Hs.
        let q_new = -0.5 * (dot(s, r) - dot(s, g));
        let q_diff = q_new - q;
        if q_new <= 0.0 && q_diff <= 0.0 {
            if steps as f64 * q_diff >= cgtol * q_new {
                break;
            }
        } else {
            break;
        }
        q = q_new;
        for j in 0..n {
            z[j] = r[j] / m[j];
        }
        let z_t_r_new = dot(z, r);
        let beta = z_t_r_new / z_t_r;
        for j in 0..n {
            d[j] = z[j] + beta * d[j];
        }
        z_t_r = z_t_r_new;
    }
    steps
}

/// Armijo backtracking along s from α = 1. On success updates w, wx and f and returns α; on
/// failure returns 0 and leaves them unchanged.
#[allow(clippy::too_many_arguments)]
fn line_search(
    rows: Rows,
    c: f64,
    w: &mut [f64],
    wx: &mut [f64],
    y: &[f64],
    s: &[f64],
    g: &[f64],
    xs: &mut [f64],
    f: &mut f64,
) -> f64 {
    for (i, v) in xs.iter_mut().enumerate() {
        *v = rows.dot(i, s);
    }
    let (w_t_w, w_t_s, s_t_s, g_t_s) = (dot(w, w), dot(w, s), dot(s, s), dot(g, s));
    let f_old = *f;
    let mut alpha = 1.0;
    for _ in 0..LINE_SEARCH_STEPS {
        // f(w + αs) = ½(wᵀw + 2α wᵀs + α² sᵀs) + C Σ φ(y_i(wx_i + α z_i))
        let f_new = 0.5 * (w_t_w + 2.0 * alpha * w_t_s + alpha * alpha * s_t_s) + loss(c, y, wx, xs, alpha);
        if f_new - f_old <= LINE_SEARCH_ETA * alpha * g_t_s {
            wx.iter_mut().zip(xs.iter()).for_each(|(m, z)| *m += alpha * z);
            w.iter_mut().zip(s).for_each(|(wj, sj)| *wj += alpha * sj);
            *f = f_new;
            return alpha;
        }
        alpha *= 0.5;
    }
    0.0
}

/// Trains label `label` (its positives `positives`): writes the weights (bias last) into `scratch.w` and returns the stats
/// (`label`, `seconds` and the pruning counts are left for the caller).
pub fn solve(
    rows: Rows,
    params: &NewtonParams,
    label: usize,
    positives: &[u32],
    stats: &DataStats,
    init: &dyn WeightInit,
    scratch: &mut Scratch,
) -> LabelStats {
    let n = rows.n_rows();
    let c = params.c;
    let Scratch { w, g, s, r, z, d, hd, m, wx, xs, y, active } = scratch;
    y.fill(-1.0);
    positives.iter().for_each(|&i| y[i as usize] = 1.0);

    let gnorm0 = gnorm_at_zero(rows, c, positives, stats, g);
    let eps = stopping_eps(params.eps0, positives.len(), n);

    w.fill(0.0);
    init.init(&InitContext { label, features: rows.x, positives, stats }, w);
    if w.iter().all(|&v| v == 0.0) {
        wx.fill(0.0);
    } else {
        wx.iter_mut().enumerate().for_each(|(i, v)| *v = rows.dot(i, w));
    }
    let mut f = objective(c, w, y, wx);
    active_set_and_gradient(rows, c, w, y, wx, active, g);
    let mut gnorm = norm(g);
    let mut out = LabelStats {
        n_positives: positives.len(),
        gnorm0,
        initial_active_fraction: active.len() as f64 / n.max(1) as f64,
        ..Default::default()
    };

    let (mut active_sum, mut step_sum) = (0.0, 0.0);
    if gnorm > eps * gnorm0 {
        for _ in 0..params.max_iter {
            active_sum += active.len() as f64;
            preconditioner(rows, c, active, m);
            out.cg_steps += pcg(rows, c, active, g, m, s, r, z, d, hd);
            let f_old = f;
            let alpha = line_search(rows, c, w, wx, y, s, g, xs, &mut f);
            if alpha == 0.0 {
                out.line_search_failed = true;
                break;
            }
            out.newton_iters += 1;
            step_sum += alpha;
            active_set_and_gradient(rows, c, w, y, wx, active, g);
            gnorm = norm(g);
            if gnorm <= eps * gnorm0 || (f_old - f).abs() <= MIN_RELATIVE_DECREASE * f.abs() {
                break;
            }
        }
    }
    out.active_fraction = active.len() as f64 / n.max(1) as f64;
    if out.newton_iters > 0 {
        out.mean_active_fraction = active_sum / (out.newton_iters as f64 * n as f64);
        out.mean_step = step_sum / out.newton_iters as f64;
    }
    out.gnorm = gnorm;
    out.objective = f;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::{Bias, Msi, Zero};
    use crate::testutil::{dense_rows, random_problem};

    const C: f64 = 1.0;

    fn labels(n: usize, positives: &[u32]) -> Vec<f64> {
        let mut y = vec![-1.0; n];
        positives.iter().for_each(|&i| y[i as usize] = 1.0);
        y
    }

    /// L(w) and ∇L(w) straight from the definition, over dense rows.
    fn slow_objective_and_gradient(xd: &[Vec<f64>], y: &[f64], w: &[f64]) -> (f64, Vec<f64>) {
        let mut f = 0.5 * dot(w, w);
        let mut g = w.to_vec();
        for (x, &yi) in xd.iter().zip(y) {
            let m = dot(x, w);
            let slack = 1.0 - yi * m;
            if slack > 0.0 {
                f += C * slack * slack;
                // d/dw C(1 − y m)² = −2C y (1 − y m) x
                g.iter_mut().zip(x).for_each(|(gj, xj)| *gj += -2.0 * C * yi * slack * xj);
            }
        }
        (f, g)
    }

    /// Plain gradient descent with step 1/(1 + 2C Σ‖x_i‖²), an upper bound of the gradient's
    /// Lipschitz constant, until the gradient vanishes.
    fn gradient_descent(xd: &[Vec<f64>], y: &[f64]) -> Vec<f64> {
        let lipschitz = 1.0 + 2.0 * C * xd.iter().map(|x| dot(x, x)).sum::<f64>();
        let mut w = vec![0.0; xd[0].len()];
        for _ in 0..2_000_000 {
            let (_, g) = slow_objective_and_gradient(xd, y, &w);
            if norm(&g) < 1e-13 {
                return w;
            }
            w.iter_mut().zip(&g).for_each(|(wj, gj)| *wj -= gj / lipschitz);
        }
        panic!("gradient descent did not converge");
    }

    fn solve_dense(x: &SparseRows, positives: &[u32], init: &dyn WeightInit, eps0: f64) -> (Vec<f64>, LabelStats) {
        let rows = Rows::new(x, true);
        let stats = DataStats::new(x, true);
        let mut scratch = Scratch::new(rows.n_vars(), rows.n_rows());
        let params = NewtonParams { c: C, eps0, max_iter: 1000 };
        let st = solve(rows, &params, 0, positives, &stats, init, &mut scratch);
        (scratch.w, st)
    }

    fn rel_diff(a: &[f64], b: &[f64]) -> f64 {
        let diff: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
        norm(&diff) / norm(b)
    }

    #[test]
    fn newton_cg_matches_gradient_descent_on_the_strictly_convex_problem() {
        for seed in 0..4 {
            let (x, positives) = random_problem(seed, 40, 8);
            let xd = dense_rows(&x, true);
            let y = labels(x.n_rows(), &positives);
            let reference = gradient_descent(&xd, &y);
            let (w, st) = solve_dense(&x, &positives, &Zero, 1e-8);
            let rel = rel_diff(&w, &reference);
            assert!(rel <= 1e-6, "seed {seed}: ‖Δw‖/‖w‖ = {rel:e}, stats {st:?}");
            assert!(st.newton_iters >= 1 && !st.line_search_failed);
        }
    }

    #[test]
    fn gradient_and_hessian_vector_products_match_finite_differences() {
        let (x, positives) = random_problem(11, 30, 6);
        let xd = dense_rows(&x, true);
        let y = labels(x.n_rows(), &positives);
        let rows = Rows::new(&x, true);
        let nv = rows.n_vars();
        let mut rng = farout_core::rng::seeded(5, 0);
        use rand::Rng as _;
        let w: Vec<f64> = (0..nv).map(|_| rng.random_range(-0.5..0.5)).collect();
        let d: Vec<f64> = (0..nv).map(|_| rng.random_range(-1.0..1.0)).collect();
        let grad_at = |w: &[f64]| {
            let wx: Vec<f64> = (0..x.n_rows()).map(|i| rows.dot(i, w)).collect();
            let (mut active, mut g) = (Vec::new(), vec![0.0; nv]);
            active_set_and_gradient(rows, C, w, &y, &wx, &mut active, &mut g);
            (objective(C, w, &y, &wx), g, active)
        };
        let (f, g, active) = grad_at(&w);
        let (f_slow, g_slow) = slow_objective_and_gradient(&xd, &y, &w);
        assert!((f - f_slow).abs() <= 1e-12 * f_slow && rel_diff(&g, &g_slow) <= 1e-12);
        assert!(!active.is_empty() && active.len() < x.n_rows(), "the test point should have a partial active set");

        let h = 1e-6;
        let shifted = |j: usize, t: f64| {
            let mut v = w.clone();
            v[j] += t;
            grad_at(&v).0
        };
        for (j, &gj) in g.iter().enumerate() {
            let fd = (shifted(j, h) - shifted(j, -h)) / (2.0 * h);
            assert!((fd - gj).abs() <= 1e-6 * (1.0 + gj.abs()), "g[{j}] = {gj} vs finite difference {fd}");
        }
        let mut hd = vec![0.0; nv];
        hessian_vec(rows, C, &active, &d, &mut hd);
        let along = |t: f64| grad_at(&w.iter().zip(&d).map(|(a, b)| a + t * b).collect::<Vec<_>>()).1;
        let (gp, gm) = (along(h), along(-h));
        for j in 0..nv {
            let fd = (gp[j] - gm[j]) / (2.0 * h);
            assert!((fd - hd[j]).abs() <= 1e-6 * (1.0 + hd[j].abs()), "Hd[{j}] = {} vs finite difference {fd}", hd[j]);
        }

        // The sum over I equals the full sum over all samples with the generalised second
        // derivative D_ii = [y_i wᵀx_i < 1].
        let mut full = d.clone();
        for (xi, &yi) in xd.iter().zip(&y) {
            if yi * dot(xi, &w) < 1.0 {
                let t = dot(xi, &d);
                full.iter_mut().zip(xi).for_each(|(o, v)| *o += 2.0 * C * t * v);
            }
        }
        assert!(rel_diff(&hd, &full) <= 1e-13);
    }

    #[test]
    fn stopping_eps_follows_eq_13() {
        assert_eq!(stopping_eps(0.01, 1, 100), 0.01 / 100.0);
        assert_eq!(stopping_eps(0.01, 0, 100), 0.01 / 100.0);
        assert_eq!(stopping_eps(0.01, 30, 100), 0.01 * 30.0 / 100.0);
        assert_eq!(stopping_eps(0.01, 70, 100), 0.01 * 30.0 / 100.0);
        assert_eq!(stopping_eps(1.0, 50, 100), 0.5);
    }

    #[test]
    fn gnorm0_is_the_gradient_norm_at_zero_for_every_init() {
        let (x, positives) = random_problem(3, 50, 7);
        let xd = dense_rows(&x, true);
        let y = labels(x.n_rows(), &positives);
        let (_, g0) = slow_objective_and_gradient(&xd, &y, &vec![0.0; xd[0].len()]);
        // 2C‖2|P| p̄ − n x̄‖ from the means.
        let (np, n) = (positives.len() as f64, x.n_rows() as f64);
        let nv = xd[0].len();
        let pbar: Vec<f64> = (0..nv).map(|j| positives.iter().map(|&i| xd[i as usize][j]).sum::<f64>() / np).collect();
        let xbar: Vec<f64> = (0..nv).map(|j| xd.iter().map(|r| r[j]).sum::<f64>() / n).collect();
        let by_means: Vec<f64> = (0..nv).map(|j| 2.0 * np * pbar[j] - n * xbar[j]).collect();
        let expected = 2.0 * C * norm(&by_means);
        assert!((norm(&g0) - expected).abs() <= 1e-10 * expected);
        let inits: [&dyn WeightInit; 4] =
            [&Zero, &Bias { lambda: 1.0 }, &Bias { lambda: 2.0 }, &Msi { s: 1.0, t: -2.0 }];
        for init in inits {
            let (_, st) = solve_dense(&x, &positives, init, 0.01);
            assert!((st.gnorm0 - expected).abs() <= 1e-10 * expected, "{init:?}: {} vs {expected}", st.gnorm0);
            assert!(st.gnorm <= stopping_eps(0.01, positives.len(), x.n_rows()) * expected || st.line_search_failed);
        }
    }

    #[test]
    fn zero_bias_and_msi_reach_the_same_optimum() {
        for seed in 20..24 {
            let (x, positives) = random_problem(seed, 60, 10);
            let (w_zero, _) = solve_dense(&x, &positives, &Zero, 1e-8);
            let inits: [&dyn WeightInit; 3] = [&Bias { lambda: 1.0 }, &Bias { lambda: 2.0 }, &Msi { s: 1.0, t: -2.0 }];
            for init in inits {
                let (w, st) = solve_dense(&x, &positives, init, 1e-8);
                let rel = rel_diff(&w, &w_zero);
                assert!(rel <= 1e-6, "seed {seed}, {init:?}: ‖Δw‖/‖w‖ = {rel:e} ({st:?})");
            }
        }
    }

    #[test]
    fn one_exact_newton_step_on_a_quadratic_piece_is_the_last() {
        // Four identical positives x = (1; bias 1): every margin stays below 1, L is one
        // quadratic, (1, 1) is an eigenvector of H and of M, so one CG step and one Newton step
        // reach the minimiser and the solver must stop there.
        let mut x = SparseRows::new(1);
        for _ in 0..4 {
            x.push_row(&[0], &[1.0]);
        }
        let (w, st) = solve_dense(&x, &[0, 1, 2, 3], &Zero, 0.01);
        // Minimiser of ½(a² + b²) + 4(1 − a − b)²: a = b = 8/17.
        assert!((w[0] - 8.0 / 17.0).abs() < 1e-9 && (w[1] - 8.0 / 17.0).abs() < 1e-9, "{w:?}");
        assert_eq!(st.newton_iters, 1);
    }
}
