//! Initial weights of the per-label Newton solver (\[M\] Sects. 3–4).
//!
//! The optimum of each binary problem is unique (the objective is strictly convex), so the
//! start changes only the time to reach it. A good start puts most negatives beyond the
//! margin from the first iteration, making I (eq. 19), hence every Hessian-vector product,
//! small; and it keeps the local quadratic model of φ honest, so the line search accepts
//! full steps.
//!
//! The trait has one required method, [`WeightInit::init`], which writes into a zeroed
//! weight vector: initialisers only read shared, immutable data ([`InitContext`]), so they can
//! run on every rayon thread without locks, and write into the thread's own buffer, so the
//! label loop allocates nothing. [`FromModel`] starts every label from an earlier model's
//! weights for it (a warm start: another C, or fewer rows); the OvA-primal start of eq. 15 is
//! such a model.

use crate::data::{DataStats, SparseRows};
use crate::model::SparseModel;
use std::sync::Arc;

/// What an initialiser may read for one label.
#[derive(Clone, Copy, Debug)]
pub struct InitContext<'a> {
    /// The label (its id in the whole label set, also on one rank's shard).
    pub label: usize,
    /// All training rows (canonical CSR).
    pub features: &'a SparseRows,
    /// The label's positives P, sorted.
    pub positives: &'a [u32],
    /// n, Σ x_i and whether the bias feature (last weight coordinate) is present.
    pub stats: &'a DataStats,
}

/// A rule for the initial weights of one label.
pub trait WeightInit: Send + Sync + std::fmt::Debug {
    /// Writes w0 into `w` (length `stats.n_vars()`, the bias weight last), which arrives zeroed.
    fn init(&self, ctx: &InitContext<'_>, w: &mut [f64]);
}

/// w0 = 0: LIBLINEAR's and the original DiSMEC's start.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Zero;

impl WeightInit for Zero {
    fn init(&self, _ctx: &InitContext<'_>, _w: &mut [f64]) {}
}

/// w0 = λ w_b with w_b = −e_0 (bias weight −λ): every sample starts with margin −λ, i.e. on
/// the negative side (\[M\] Sect. 3; λ = 2 was fastest on AmazonCat-13K). Needs the bias.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bias {
    /// λ.
    pub lambda: f64,
}

impl WeightInit for Bias {
    fn init(&self, ctx: &InitContext<'_>, w: &mut [f64]) {
        if ctx.stats.bias {
            w[ctx.stats.sum.len()] = -self.lambda;
        }
    }
}

/// A warm start: label k starts from label k of an earlier model of the same features (its
/// pruned f32 weights and bias; a label the model lacks starts from 0).
///
/// The optimum of each label's problem is unique, and the solver stops when
/// `‖g(w)‖ ≤ eps · ‖g(0)‖` with the gradient norm taken at w = 0 whatever the start
/// ([`crate::newton`], eq. 12), so a warm-started label ends at the same optimum to the same
/// tolerance as a cold one; a start near the optimum (a neighbouring C, the same problem on a
/// part of the rows) needs fewer Newton iterations, each over a smaller active set.
#[derive(Clone, Debug)]
pub struct FromModel {
    /// The earlier model (all labels, whatever part of them this process trains).
    pub model: Arc<SparseModel>,
}

impl WeightInit for FromModel {
    fn init(&self, ctx: &InitContext<'_>, w: &mut [f64]) {
        if ctx.label >= self.model.n_labels() {
            return;
        }
        let (features, weights, bias) = self.model.label(ctx.label);
        let d = ctx.stats.sum.len();
        for (&j, &v) in features.iter().zip(weights) {
            if let Some(wj) = w[..d].get_mut(j as usize) {
                *wj = f64::from(v);
            }
        }
        if ctx.stats.bias {
            w[d] = f64::from(bias);
        }
    }
}

/// Mean-separating initialisation (\[M\] Sect. 4).
///
/// Asks the mean of the positives p̄ to score s and the mean of the negatives n̄ to score t
/// (eq. 21), with the minimal-norm w0 = u p̄ + v x̄ (x̄ the mean of all samples; span(p̄, n̄) =
/// span(p̄, x̄)). With `a = ⟨p̄,p̄⟩, b = ⟨x̄,p̄⟩, c = ⟨x̄,x̄⟩` and `r = ⟨w0,x̄⟩ = t + (s − t)|P|/n`
/// (eq. 22, x̄ = (|P| p̄ + |N| n̄)/n):
///
/// ```text
/// u = (b·r − s·c) / (b² − a·c)                                        (eq. 23)
/// v = (s − u·a) / b  ≡  (a·r − b·s) / (a·c − b²)                      (eq. 24, no division by b)
/// ```
///
/// Vectors include the bias coordinate (p̄_0 = x̄_0 = 1). Cost O(nnz(P) + d). Degenerate
/// cases (App. 7.3 is not in the text; project choice): with no positives, or p̄ and x̄ nearly
/// parallel (`|b² − ac| ≤ 1e-6·ac`), w0 = (r/c) x̄, which gives every sample's mean score r.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Msi {
    /// Target score of the positive mean (1).
    pub s: f64,
    /// Target score of the negative mean (−2 for squared hinge).
    pub t: f64,
}

/// Relative size of `|b² − ac|` against `ac` below which MSI falls back to a multiple of x̄.
pub const MSI_DEGENERATE: f64 = 1e-6;

/// The coefficients (u, v) of `w0 = u p̄ + v x̄` from the Gram entries; `None` when degenerate.
pub fn msi_coefficients(a: f64, b: f64, c: f64, r: f64, s: f64) -> Option<(f64, f64)> {
    let det = a * c - b * b;
    if !(det.abs() > MSI_DEGENERATE * a * c) {
        return None;
    }
    Some(((b * r - s * c) / (b * b - a * c), (a * r - b * s) / det))
}

impl WeightInit for Msi {
    fn init(&self, ctx: &InitContext<'_>, w: &mut [f64]) {
        let stats = ctx.stats;
        let n = stats.n_samples as f64;
        let n_pos = ctx.positives.len();
        let d = stats.sum.len();
        let r = self.t + (self.s - self.t) * n_pos as f64 / n.max(1.0);
        let c = stats.mean_norm_sq();
        // w holds Σ_P x_i, then p̄, then w0.
        for &i in ctx.positives {
            let (cols, vals) = ctx.features.row(i as usize);
            for (&j, &x) in cols.iter().zip(vals) {
                w[j as usize] += x as f64;
            }
        }
        if stats.bias {
            w[d] = n_pos as f64;
        }
        let coefficients = if n_pos == 0 {
            None
        } else {
            let inv = 1.0 / n_pos as f64;
            w.iter_mut().for_each(|v| *v *= inv);
            let a: f64 = w.iter().map(|v| v * v).sum();
            let b: f64 = w.iter().enumerate().map(|(j, v)| v * stats.mean(j)).sum();
            msi_coefficients(a, b, c, r, self.s)
        };
        match coefficients {
            Some((u, v)) => w.iter_mut().enumerate().for_each(|(j, wj)| *wj = u * *wj + v * stats.mean(j)),
            None => {
                let scale = if c > 0.0 { r / c } else { 0.0 };
                w.iter_mut().enumerate().for_each(|(j, wj)| *wj = scale * stats.mean(j));
            }
        }
    }
}

/// MSI for a dense output layer over fixed features φ: every class k gets
/// `W_k = u_k p̄_k + v_k x̄` and, with `bias`, `b_k = u_k + v_k` — [`Msi`] applied to φ with the
/// bias as the appended constant feature (a_k = 1 + ‖p̄_k‖², b_k = 1 + p̄_kᵀx̄, c = 1 + ‖x̄‖²).
/// Without a bias and with (nearly) centred features (‖x̄‖² ≤ 1e-6 · ‖p̄_k‖²) the system is
/// singular and the class gets `W_k = s p̄_k/‖p̄_k‖²`, which scores its own mean s (project
/// choice). Classes without samples stay zero.
///
/// The rows arrive one at a time ([`OutputLayerMsi::add`]), so the features need not be held
/// in memory twice: the state is the K × D class sums, which [`OutputLayerMsi::finish`] turns
/// into W in place, plus Σ x_i in f64. Cost: O(D) per (row, label), then O(KD) in parallel.
#[derive(Clone, Debug)]
pub struct OutputLayerMsi {
    d: usize,
    class_sums: Vec<f32>,
    counts: Vec<u64>,
    total: Vec<f64>,
    n: u64,
}

impl OutputLayerMsi {
    /// No rows yet, for `k` classes and `d` features.
    pub fn new(k: usize, d: usize) -> Self {
        Self { d, class_sums: vec![0.0; k * d], counts: vec![0; k], total: vec![0.0; d], n: 0 }
    }

    /// Adds one training row `x` (length D) with its labels.
    pub fn add(&mut self, x: &[f32], labels: &[u32]) {
        debug_assert_eq!(x.len(), self.d);
        self.n += 1;
        self.total.iter_mut().zip(x).for_each(|(t, &v)| *t += v as f64);
        for &k in labels {
            let (k, d) = (k as usize, self.d);
            self.counts[k] += 1;
            self.class_sums[k * d..(k + 1) * d].iter_mut().zip(x).for_each(|(s, &v)| *s += v);
        }
    }

    /// Adds one sparse training row (`cols`, `vals`) with its labels.
    pub fn add_sparse(&mut self, cols: &[u32], vals: &[f32], labels: &[u32]) {
        self.n += 1;
        cols.iter().zip(vals).for_each(|(&j, &v)| self.total[j as usize] += v as f64);
        for &k in labels {
            let row = &mut self.class_sums[k as usize * self.d..(k as usize + 1) * self.d];
            self.counts[k as usize] += 1;
            cols.iter().zip(vals).for_each(|(&j, &v)| row[j as usize] += v);
        }
    }

    /// ‖x̄‖, the norm of the mean of the rows added so far (without the bias coordinate).
    pub fn mean_norm(&self) -> f64 {
        let n = self.n.max(1) as f64;
        self.total.iter().map(|t| (t / n) * (t / n)).sum::<f64>().sqrt()
    }

    /// W (K × D, row-major) and the biases (empty without `bias`).
    pub fn finish(self, bias: bool, msi: Msi) -> (Vec<f32>, Vec<f32>) {
        use rayon::prelude::*;
        let Self { d, mut class_sums, counts, total, n } = self;
        let n = n.max(1) as f64;
        let mean: Vec<f64> = total.iter().map(|t| t / n).collect();
        let one = bias as u8 as f64; // the bias coordinate of p̄ and x̄
        let c = one + mean.iter().map(|m| m * m).sum::<f64>();
        let mut biases = vec![0.0f32; counts.len()];
        class_sums.par_chunks_mut(d.max(1)).zip(&counts).zip(&mut biases).for_each(|((row, &n_pos), bias_k)| {
            if n_pos == 0 {
                return;
            }
            let inv = 1.0 / n_pos as f64;
            let p_bar: Vec<f64> = row.iter().map(|&s| s as f64 * inv).collect();
            let a_x: f64 = p_bar.iter().map(|p| p * p).sum();
            let (a, b) = (one + a_x, one + p_bar.iter().zip(&mean).map(|(p, m)| p * m).sum::<f64>());
            let (u, v) = if !bias && a_x > 0.0 && c <= MSI_DEGENERATE * a_x {
                (msi.s / a_x, 0.0)
            } else {
                let r = msi.t + (msi.s - msi.t) * n_pos as f64 / n;
                msi_coefficients(a, b, c, r, msi.s).unwrap_or((0.0, if c > 0.0 { r / c } else { 0.0 }))
            };
            row.iter_mut().zip(p_bar.iter().zip(&mean)).for_each(|(w, (p, m))| *w = (u * p + v * m) as f32);
            *bias_k = (u + v) as f32;
        });
        if !bias {
            biases.clear();
        }
        (class_sums, biases)
    }
}

/// [`OutputLayerMsi`] over every row of `phi` and its labels.
pub fn msi_output_layer(
    phi: &SparseRows,
    labels: &farout_data::LabelSets,
    bias: bool,
    msi: Msi,
) -> (Vec<f32>, Vec<f32>) {
    let mut sums = OutputLayerMsi::new(labels.n_labels, phi.n_cols);
    for i in 0..phi.n_rows() {
        let (cols, vals) = phi.row(i);
        sums.add_sparse(cols, vals, labels.get(i));
    }
    sums.finish(bias, msi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::dense_rows;
    use proptest::prelude::*;

    fn dot(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    fn msi(x: &SparseRows, positives: &[u32]) -> Vec<f64> {
        let stats = DataStats::new(x, true);
        let mut w = vec![0.0; stats.n_vars()];
        Msi { s: 1.0, t: -2.0 }.init(&InitContext { label: 0, features: x, positives, stats: &stats }, &mut w);
        w
    }

    #[test]
    fn msi_hand_example() {
        // Bias first in the paper's notation: x = (1,1,0) positive, (1,0,1), (1,0,2) negative.
        // Here the bias is the last coordinate: features (1,0), (0,1), (0,2).
        let mut x = SparseRows::new(2);
        x.push_row(&[0], &[1.0]);
        x.push_row(&[1], &[1.0]);
        x.push_row(&[1], &[2.0]);
        // p̄ = (1,1,0), x̄ = (1,1/3,1): a = 2, b = 4/3, c = 19/9, r = −1.
        let (u, v) = msi_coefficients(2.0, 4.0 / 3.0, 19.0 / 9.0, -1.0, 1.0).unwrap();
        assert!((u - 31.0 / 22.0).abs() < 1e-14 && (v + 15.0 / 11.0).abs() < 1e-14, "u {u}, v {v}");
        let w = msi(&x, &[0]);
        let expected = [21.0 / 22.0, -30.0 / 22.0, 1.0 / 22.0];
        for (a, b) in w.iter().zip(expected) {
            assert!((a - b).abs() < 1e-14, "{w:?}");
        }
        let (p_bar, n_bar) = ([1.0, 0.0, 1.0], [0.0, 1.5, 1.0]);
        assert!((dot(&w, &p_bar) - 1.0).abs() < 1e-14 && (dot(&w, &n_bar) + 2.0).abs() < 1e-14);
    }

    #[test]
    fn msi_without_positives_or_with_parallel_means_scales_the_mean() {
        let mut x = SparseRows::new(2);
        x.push_row(&[0], &[1.0]);
        x.push_row(&[0], &[1.0]);
        // No positives: r = t = −2, w0 = (r/c) x̄ with x̄ = (1, 0, 1), c = 2.
        assert_eq!(msi(&x, &[]), vec![-1.0, 0.0, -1.0]);
        // Identical rows: p̄ = x̄, b² = ac; r = −2 + 3·½ = −0.5.
        let w = msi(&x, &[0]);
        assert_eq!(w, vec![-0.25, 0.0, -0.25]);
    }

    proptest! {
        #[test]
        fn msi_separates_the_means_with_a_vector_in_their_span(seed in 0u64..10_000, n in 4usize..30, d in 2usize..12) {
            let (x, positives) = crate::testutil::random_problem(seed, n, d);
            let n_pos = positives.len();
            prop_assume!(n_pos > 0 && n_pos < n);
            let w = msi(&x, &positives);
            let xd = dense_rows(&x, true);
            let nv = xd[0].len();
            let mean = |ids: &mut dyn Iterator<Item = usize>| {
                let mut m = vec![0.0; nv];
                let mut k = 0.0;
                for i in ids {
                    m.iter_mut().zip(&xd[i]).for_each(|(a, b)| *a += b);
                    k += 1.0;
                }
                m.iter_mut().for_each(|a| *a /= k);
                m
            };
            let is_pos = |i: &usize| positives.contains(&(*i as u32));
            let p_bar = mean(&mut (0..n).filter(is_pos));
            let n_bar = mean(&mut (0..n).filter(|i| !is_pos(i)));
            let x_bar = mean(&mut (0..n));
            let (a, b, c) = (dot(&p_bar, &p_bar), dot(&p_bar, &x_bar), dot(&x_bar, &x_bar));
            prop_assume!((a * c - b * b).abs() > 1e-3 * a * c);
            let scale = 1.0 + dot(&w, &w).sqrt();
            prop_assert!((dot(&w, &p_bar) - 1.0).abs() < 1e-9 * scale);
            prop_assert!((dot(&w, &n_bar) + 2.0).abs() < 1e-9 * scale);
            // w − its projection on span(p̄, x̄) vanishes.
            let (wp, wx) = (dot(&w, &p_bar), dot(&w, &x_bar));
            let det = a * c - b * b;
            let (alpha, beta) = ((c * wp - b * wx) / det, (a * wx - b * wp) / det);
            let residual: f64 = (0..nv).map(|j| (w[j] - alpha * p_bar[j] - beta * x_bar[j]).powi(2)).sum::<f64>().sqrt();
            prop_assert!(residual < 1e-9 * scale, "residual {}", residual);
        }
    }

    /// Scores of the mean of the positives and of the negatives of class `k` under row `w`, `b`.
    fn mean_scores(phi: &[Vec<f64>], labels: &[usize], k: usize, w: &[f32], b: f32) -> (f64, f64) {
        let score = |x: &Vec<f64>| x.iter().zip(w).map(|(x, w)| x * *w as f64).sum::<f64>() + b as f64;
        let (mut pos, mut neg) = ((0.0, 0usize), (0.0, 0usize));
        for (x, &y) in phi.iter().zip(labels) {
            let slot = if y == k { &mut pos } else { &mut neg };
            slot.0 += score(x);
            slot.1 += 1;
        }
        (pos.0 / pos.1 as f64, neg.0 / neg.1 as f64)
    }

    fn layer_data(seed: u64, shift: f64) -> (Vec<Vec<f64>>, Vec<usize>, SparseRows, farout_data::LabelSets) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let (n, d, k) = (60, 5, 4);
        let labels: Vec<usize> = (0..n).map(|i| i % k).collect();
        let phi: Vec<Vec<f64>> = labels
            .iter()
            .map(|&y| (0..d).map(|j| if j == y { 2.0 } else { 0.0 } + shift + rng.random_range(-0.5..0.5)).collect())
            .collect();
        let mut x = SparseRows::new(d);
        let mut sets = farout_data::LabelSets::new(k);
        for (row, &y) in phi.iter().zip(&labels) {
            let vals: Vec<f32> = row.iter().map(|&v| v as f32).collect();
            x.push_row(&(0..d as u32).collect::<Vec<_>>(), &vals);
            sets.push(&[y as u32]);
        }
        // The f32 rows, as the layer sees them.
        let phi = phi.iter().map(|r| r.iter().map(|&v| v as f32 as f64).collect()).collect();
        (phi, labels, x, sets)
    }

    #[test]
    fn output_layer_msi_puts_each_class_mean_at_s_and_the_rest_at_t() {
        let msi = Msi { s: 1.0, t: -2.0 };
        for bias in [true, false] {
            let (phi, labels, x, index) = layer_data(7, 0.3);
            let (w, b) = msi_output_layer(&x, &index, bias, msi);
            assert_eq!((w.len(), b.len()), (4 * 5, if bias { 4 } else { 0 }));
            for k in 0..4 {
                let bk = if bias { b[k] } else { 0.0 };
                let (p, n) = mean_scores(&phi, &labels, k, &w[k * 5..(k + 1) * 5], bk);
                assert!((p - 1.0).abs() < 1e-4 && (n + 2.0).abs() < 1e-4, "bias {bias}, class {k}: {p} {n}");
            }
        }
    }

    #[test]
    fn output_layer_msi_from_dense_rows_equals_sparse_rows_with_several_labels() {
        let (phi, labels, _, _) = layer_data(9, 0.3);
        let (mut dense, mut sparse) = (OutputLayerMsi::new(4, 5), OutputLayerMsi::new(4, 5));
        let cols: Vec<u32> = (0..5).collect();
        for (i, (row, &y)) in phi.iter().zip(&labels).enumerate() {
            let x: Vec<f32> = row.iter().map(|&v| v as f32).collect();
            // Every third sample also carries the next label.
            let set: Vec<u32> = if i % 3 == 0 { vec![y as u32, (y as u32 + 1) % 4] } else { vec![y as u32] };
            dense.add(&x, &set);
            sparse.add_sparse(&cols, &x, &set);
        }
        let msi = Msi { s: 1.0, t: -2.0 };
        assert_eq!(dense.clone().finish(true, msi), sparse.finish(true, msi));
        let (w, b) = dense.finish(false, msi);
        assert!(b.is_empty() && w.iter().all(|v| v.is_finite()) && w.iter().any(|&v| v != 0.0));
    }

    #[test]
    fn output_layer_msi_without_bias_on_centred_features_scores_each_class_mean_s() {
        let (phi, labels, _, _) = layer_data(8, 0.0);
        // Centre exactly.
        let d = 5;
        let mean: Vec<f64> = (0..d).map(|j| phi.iter().map(|r| r[j]).sum::<f64>() / phi.len() as f64).collect();
        let mut x = SparseRows::new(d);
        let mut sets = farout_data::LabelSets::new(4);
        let mut centred = Vec::new();
        for (row, &y) in phi.iter().zip(&labels) {
            let r: Vec<f32> = row.iter().zip(&mean).map(|(v, m)| (v - m) as f32).collect();
            centred.push(r.iter().map(|&v| v as f64).collect::<Vec<f64>>());
            x.push_row(&(0..d as u32).collect::<Vec<_>>(), &r);
            sets.push(&[y as u32]);
        }
        let (w, _) = msi_output_layer(&x, &sets, false, Msi { s: 1.0, t: -2.0 });
        for k in 0..4 {
            let (p, _) = mean_scores(&centred, &labels, k, &w[k * 5..(k + 1) * 5], 0.0);
            assert!((p - 1.0).abs() < 1e-4, "class {k}: {p}");
        }
    }
}
