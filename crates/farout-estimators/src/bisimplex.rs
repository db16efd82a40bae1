//! The Euclidean projection behind the smoothed max-margin gradient ([`crate::SmoothedMargin`],
//! LDGS paper eq. 11): for `v = (z + 1_N) / mu` the gradient is
//!
//! ```text
//! proj_C(v) = argmin_{a in C} |a - v|^2,
//! C         = {a : sum_N a = -sum_P a = s <= 1, a_N >= 0, a_P <= 0}.
//! ```
//!
//! The LDGS paper computes it in O(K log K) by sorting, with the procedure of PD-Sparse (Yen et
//! al. 2016); this module does it in expected linear time.
//!
//! For a fixed `s` the problem splits into two simplex projections: `a_N = proj_{Δ_s}(v_N)` and
//! `-a_P = proj_{Δ_s}(-v_P)` with `Δ_s = {x >= 0, sum x = s}`, each of the form
//! `x_i = max(u_i - θ(s), 0)`. The squared distance `f(s)` is convex with
//! `f'(s) = -2 (θ_N(s) + θ_P(s))`, so the optimal `s` is the root of `θ_N + θ_P` clipped to
//! `[0, 1]`. At an interior root `θ_P = -θ_N = -t` with `t` the root of
//!
//! `h(t) = sum_N max(v_n - t, 0) - sum_P max(t - v_p, 0)`,
//!
//! a non-increasing piecewise-linear function whose breakpoints are the values themselves; then
//! `s = sum_N max(v_n - t, 0)`. When that `s` exceeds 1, `s = 1` and each side is a simplex
//! projection of its own, whose threshold is again the root of such a function.
//!
//! Roots are found by pivoting ([`root`]), as quickselect finds a median: evaluate `h` at a
//! random remaining breakpoint, which settles on which side the root lies, fold the values whose
//! term is then fixed into two running sums, and keep the others. Expected time is linear in the
//! number of values, without sorting them (sorting, as PD-Sparse does, costs O(K log K) when
//! every class is a candidate, as with an untrained layer's equal scores).
//!
//! Before that, a linear pass keeps only values that can be in a support: since
//! `x_1 - θ <= s <= 1`, values more than 1 below the side's top never are.

use farout_core::ClassId;

/// Reusable buffers of the projection.
#[derive(Debug, Default)]
pub struct BisimplexScratch {
    /// Negatives' values that can be in the support.
    neg: Vec<f32>,
    /// Positives' values (not negated) that can be in the support.
    pos: Vec<f32>,
    /// Working copies [`root`] partitions.
    work_up: Vec<f32>,
    work_down: Vec<f32>,
}

/// Projects `v` onto the bi-simplex; `positives` are the positions in `P`. Allocating convenience
/// around the in-place routine the losses use.
pub fn project_bisimplex(v: &[f32], positives: &[ClassId]) -> Vec<f32> {
    let mut is_pos = vec![false; v.len()];
    for &p in positives {
        is_pos[p as usize] = true;
    }
    let mut out = v.to_vec();
    project_bisimplex_into(&mut out, &is_pos, &mut BisimplexScratch::default());
    out
}

/// Projects `v` onto the bi-simplex in place; `is_pos[i]` says whether `i` is in `P`.
pub(crate) fn project_bisimplex_into(v: &mut [f32], is_pos: &[bool], s: &mut BisimplexScratch) {
    let (max_n, min_p) = side_extremes(v, is_pos);
    // Empty N or P forces s = 0; so does a positive that already beats every negative by the
    // margin (θ_N(0+) + θ_P(0+) = max_N v - min_P v <= 0).
    if !(max_n - min_p > 0.0) || !max_n.is_finite() || !min_p.is_finite() {
        v.fill(0.0);
        return;
    }
    s.neg.clear();
    s.pos.clear();
    // `>=`, not `>`: at magnitudes beyond 2^24 `max - 1.0` rounds to `max` itself, and the top
    // element must always be kept (a diverging run's scores reach such values).
    for (&x, &p) in v.iter().zip(is_pos) {
        if p {
            if x <= min_p + 1.0 {
                s.pos.push(x);
            }
        } else if x >= max_n - 1.0 {
            s.neg.push(x);
        }
    }
    let (theta_n, theta_p) = thresholds(s);
    // In f64: with ten thousands of near-equal values, f32 differences `x - θ` of values near 1
    // would carry errors of 1e-7 each, a mass error of 1e-3 in sum.
    for (x, &p) in v.iter_mut().zip(is_pos) {
        let y = f64::from(*x);
        *x = if p { -(-y - theta_p).max(0.0) as f32 } else { (y - theta_n).max(0.0) as f32 };
    }
}

/// The largest negative and the smallest positive value.
fn side_extremes(v: &[f32], is_pos: &[bool]) -> (f32, f32) {
    let (mut max_n, mut min_p) = (f32::NEG_INFINITY, f32::INFINITY);
    for (&x, &p) in v.iter().zip(is_pos) {
        if p {
            min_p = min_p.min(x);
        } else {
            max_n = max_n.max(x);
        }
    }
    (max_n, min_p)
}

/// `(θ_N, θ_P)` of the projection of the candidate values in `s.neg` and `s.pos` (both
/// non-empty): `a_n = max(v_n - θ_N, 0)`, `a_p = -max(-v_p - θ_P, 0)`.
fn thresholds(s: &mut BisimplexScratch) -> (f64, f64) {
    let mut pivots = PivotRng(0x9E37_79B9_7F4A_7C15 ^ (s.neg.len() as u64) << 20 ^ s.pos.len() as u64);
    s.work_up.clone_from(&s.neg);
    s.work_down.clone_from(&s.pos);
    let t = root(&mut s.work_up, &mut s.work_down, 0.0, &mut pivots);
    let mass: f64 = s.neg.iter().map(|&x| (f64::from(x) - t).max(0.0)).sum();
    if mass <= 1.0 {
        return (t, -t);
    }
    // s = 1: two simplex projections, `Σ max(v_n - θ_N, 0) = 1` and `Σ max(-v_p - θ_P, 0) = 1`.
    s.work_up.clone_from(&s.neg);
    s.work_down.clear();
    let theta_n = root(&mut s.work_up, &mut s.work_down, 1.0, &mut pivots);
    s.work_up.clear();
    s.work_up.extend(s.pos.iter().map(|&x| -x));
    let theta_p = root(&mut s.work_up, &mut s.work_down, 1.0, &mut pivots);
    (theta_n, theta_p)
}

/// The root `t` of `h(t) = Σ_{x in up} max(x - t, 0) - Σ_{y in down} max(t - y, 0) - c`, which
/// must exist and where `h` must be strictly decreasing (some value active on either side).
/// Empties `up` and `down`.
///
/// Pivoting: each round evaluates `h` at a random remaining value `p`, which tells on which side
/// of `p` the root is. On that side the term of every value at or beyond `p` is fixed (always
/// active, folded into the running count and sum, or never active, dropped); only the others
/// are kept. The pivot itself always leaves, and on average a constant fraction goes with it,
/// so the expected work is linear. With no value left, `h` is linear and solved directly.
fn root(up: &mut Vec<f32>, down: &mut Vec<f32>, c: f64, pivots: &mut PivotRng) -> f64 {
    // Values known to be active between the current bounds: count and sum of each side.
    let (mut n_up, mut sum_up, mut n_down, mut sum_down) = (0usize, 0f64, 0usize, 0f64);
    while !(up.is_empty() && down.is_empty()) {
        let at = pivots.below(up.len() + down.len());
        let p = if at < up.len() { up[at] } else { down[at - up.len()] };
        let pf = f64::from(p);
        let (k_up, s_up) = count_and_sum(up, |x| x > p);
        let (k_down, s_down) = count_and_sum(down, |y| y < p);
        let (k_up, s_up) = (n_up + k_up, sum_up + s_up);
        let (k_down, s_down) = (n_down + k_down, sum_down + s_down);
        let h = (s_up - pf * k_up as f64) - (pf * k_down as f64 - s_down) - c;
        if h == 0.0 {
            return pf;
        }
        if h > 0.0 {
            // The root is above p: values of `up` at or below p are never active there, values
            // of `down` at or below p always are.
            let (k, s) = count_and_sum(down, |y| y <= p);
            (n_down, sum_down) = (n_down + k, sum_down + s);
            keep(up, |x| x > p);
            keep(down, |y| y > p);
        } else {
            // The root is below p: values of `up` at or above p are always active there, values
            // of `down` at or above p never are.
            let (k, s) = count_and_sum(up, |x| x >= p);
            (n_up, sum_up) = (n_up + k, sum_up + s);
            keep(up, |x| x < p);
            keep(down, |y| y < p);
        }
    }
    // h(t) = sum_up - n_up t - (n_down t - sum_down) - c on the final interval.
    (sum_up + sum_down - c) / (n_up + n_down) as f64
}

/// How many of `values` satisfy `pred`, and their sum; without branches on the data (the
/// values near a pivot fall on either side at random), with eight partial sums.
#[inline]
fn count_and_sum(values: &[f32], pred: impl Fn(f32) -> bool) -> (usize, f64) {
    let (mut k, mut s) = ([0usize; 8], [0f64; 8]);
    let chunks = values.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            let hit = pred(c[j]);
            k[j] += usize::from(hit);
            s[j] += if hit { f64::from(c[j]) } else { 0.0 };
        }
    }
    for (j, &x) in tail.iter().enumerate() {
        let hit = pred(x);
        k[j] += usize::from(hit);
        s[j] += if hit { f64::from(x) } else { 0.0 };
    }
    (k.iter().sum(), s.iter().sum())
}

/// Keeps the values that satisfy `pred`, in order, by branch-free compaction.
#[inline]
fn keep(values: &mut Vec<f32>, pred: impl Fn(f32) -> bool) {
    let mut kept = 0;
    for i in 0..values.len() {
        let x = values[i];
        values[kept] = x;
        kept += usize::from(pred(x));
    }
    values.truncate(kept);
}

/// A small deterministic generator for pivot positions (xorshift64*): the projection is a pure
/// function of its input.
struct PivotRng(u64);

impl PivotRng {
    /// A position in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as usize * n) >> 32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Default)]
    struct SortedScratch {
        neg: Vec<f32>,
        pos: Vec<f32>,
        neg_prefix: Vec<f64>,
        pos_prefix: Vec<f64>,
    }

    /// The sort-based projection (walk the merged breakpoints of the sorted candidates, as
    /// PD-Sparse does): the reference of the pivoting one.
    fn sorted_reference(v: &mut [f32], is_pos: &[bool]) {
        let mut s = SortedScratch::default();
        let s = &mut s;
        let mut max_n = f32::NEG_INFINITY;
        let mut max_p = f32::NEG_INFINITY;
        for (&x, &p) in v.iter().zip(is_pos) {
            if p {
                max_p = max_p.max(-x);
            } else {
                max_n = max_n.max(x);
            }
        }
        // Empty N or P forces s = 0; so does a positive that already beats every negative by the
        // margin (θ_N(0+) + θ_P(0+) = u_1 + w_1 <= 0).
        if !(max_n + max_p > 0.0) || !max_n.is_finite() || !max_p.is_finite() {
            v.fill(0.0);
            return;
        }
        s.neg.clear();
        s.pos.clear();
        // `>=`, not `>`: at magnitudes beyond 2^24 `max - 1.0` rounds to `max` itself, and the top
        // element must always be kept (a diverging run's scores reach such values).
        for (&x, &p) in v.iter().zip(is_pos) {
            if p {
                if -x >= max_p - 1.0 {
                    s.pos.push(-x);
                }
            } else if x >= max_n - 1.0 {
                s.neg.push(x);
            }
        }
        let desc = |a: &f32, b: &f32| b.total_cmp(a);
        s.neg.sort_unstable_by(desc);
        s.pos.sort_unstable_by(desc);
        prefix_sums(&s.neg, &mut s.neg_prefix);
        prefix_sums(&s.pos, &mut s.pos_prefix);
        // Breakpoint at which the support of u grows from j to j + 1 elements (j >= 1).
        let breakpoint = |u: &[f32], prefix: &[f64], j: usize| -> f64 {
            if j < u.len() { prefix[j] - j as f64 * u[j] as f64 } else { f64::INFINITY }
        };
        let (mut jn, mut jp, mut lo) = (1usize, 1usize, 0.0f64);
        let s_opt = loop {
            let next_n = breakpoint(&s.neg, &s.neg_prefix, jn);
            let next_p = breakpoint(&s.pos, &s.pos_prefix, jp);
            let hi = next_n.min(next_p).min(1.0);
            let (sn, sp) = (s.neg_prefix[jn] / jn as f64, s.pos_prefix[jp] / jp as f64);
            let root = (sn + sp) / (1.0 / jn as f64 + 1.0 / jp as f64);
            if root <= hi {
                break root.max(lo);
            }
            if hi >= 1.0 {
                break 1.0;
            }
            if next_n <= next_p {
                jn += 1;
            } else {
                jp += 1;
            }
            lo = hi;
        };
        let theta_n = ((s.neg_prefix[jn] - s_opt) / jn as f64) as f32;
        let theta_p = ((s.pos_prefix[jp] - s_opt) / jp as f64) as f32;
        for (x, &p) in v.iter_mut().zip(is_pos) {
            *x = if p { -(-*x - theta_p).max(0.0) } else { (*x - theta_n).max(0.0) };
        }
    }

    fn prefix_sums(u: &[f32], prefix: &mut Vec<f64>) {
        prefix.clear();
        prefix.push(0.0);
        let mut acc = 0.0;
        for &x in u {
            acc += x as f64;
            prefix.push(acc);
        }
    }

    /// Scores of an output layer: `n` classes, the first `n_pos` positive, spread `spread`
    /// (0: an untrained layer's equal scores), the margin shift on negatives, divided by `mu`.
    fn layer_values(seed: u64, n: usize, n_pos: usize, spread: f32, mu: f32) -> (Vec<f32>, Vec<bool>) {
        let mut r = farout_core::rng::seeded(seed, 0);
        let is_pos: Vec<bool> = (0..n).map(|i| i < n_pos).collect();
        let v = is_pos
            .iter()
            .map(|&p| (spread * farout_core::rng::normal(&mut r) + if p { 0.0 } else { 1.0 }) / mu)
            .collect();
        (v, is_pos)
    }

    #[test]
    fn pivoting_equals_the_sorted_projection() {
        let mut scratch = BisimplexScratch::default();
        let mut cases = 0;
        for seed in 0..40u64 {
            for &(n, n_pos, spread, mu) in &[
                (100_000, 1, 0.0, 1.0),
                (100_000, 1, 0.01, 1.0),
                (20_000, 5, 0.3, 5.0),
                (5_000, 40, 1.0, 1.0),
                (1_000, 999, 0.5, 1.0),
                (3, 1, 2.0, 1.0),
                (50_000, 3, 0.0001, 0.1),
            ] {
                let (v, is_pos) = layer_values(seed * 7 + n as u64, n, n_pos, spread, mu);
                let (mut fast, mut slow) = (v.clone(), v.clone());
                project_bisimplex_into(&mut fast, &is_pos, &mut scratch);
                sorted_reference(&mut slow, &is_pos);
                let sum_n: f64 = fast.iter().zip(&is_pos).filter(|(_, p)| !**p).map(|(&a, _)| f64::from(a)).sum();
                for (i, (a, b)) in fast.iter().zip(&slow).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-6,
                        "n {n}, {n_pos} positives, spread {spread}, seed {seed}: a[{i}] = {a}, sorted {b}"
                    );
                }
                assert!(sum_n <= 1.0 + 1e-5, "n {n}, {n_pos} positives, spread {spread}, seed {seed}: mass {sum_n}");
                cases += 1;
            }
        }
        assert_eq!(cases, 280);
    }

    #[test]
    fn scores_beyond_f32_integer_precision_project_without_panicking() {
        // max - 1.0 == max for these: the top elements must still be kept.
        for scale in [1e8f32, 1e20, 3e38] {
            let v = [scale, -scale, 0.5 * scale, 0.0];
            let a = project_bisimplex(&v, &[1]);
            let (sum_n, sum_p): (f32, f32) = (a[0] + a[2] + a[3], a[1]);
            assert!(a.iter().all(|x| x.is_finite()), "{scale}: {a:?}");
            assert!((sum_n + sum_p).abs() <= 1e-6 && (0.0..=1.0 + 1e-6).contains(&sum_n), "{scale}: {a:?}");
        }
    }

    /// Reference simplex projection onto {x >= 0, sum x = s} (Duchi et al. 2008), in f64.
    fn simplex(u: &[f64], s: f64) -> Vec<f64> {
        if s <= 0.0 {
            return vec![0.0; u.len()];
        }
        let mut sorted = u.to_vec();
        sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
        let mut acc = 0.0;
        // The top element is always in the support: start from its threshold so that a tiny s
        // (where x - t rounds to 0) still gives a feasible point.
        let mut theta = sorted[0] - s;
        for (j, &x) in sorted.iter().enumerate() {
            acc += x;
            let t = (acc - s) / (j + 1) as f64;
            if x - t > 0.0 {
                theta = t;
            }
        }
        u.iter().map(|&x| (x - theta).max(0.0)).collect()
    }

    /// Brute force: golden-section search over s of the two reference simplex projections.
    fn brute_force(v: &[f32], is_pos: &[bool]) -> Vec<f64> {
        let vn: Vec<f64> = v.iter().zip(is_pos).filter(|(_, p)| !**p).map(|(x, _)| *x as f64).collect();
        let vp: Vec<f64> = v.iter().zip(is_pos).filter(|(_, p)| **p).map(|(x, _)| -*x as f64).collect();
        let assemble = |s: f64| {
            let (an, ap) = (simplex(&vn, s), simplex(&vp, s));
            let (mut i, mut j) = (0, 0);
            is_pos
                .iter()
                .map(|&p| {
                    if p {
                        j += 1;
                        -ap[j - 1]
                    } else {
                        i += 1;
                        an[i - 1]
                    }
                })
                .collect::<Vec<f64>>()
        };
        let dist = |s: f64| assemble(s).iter().zip(v).map(|(a, &x)| (a - x as f64).powi(2)).sum::<f64>();
        if vn.is_empty() || vp.is_empty() {
            return vec![0.0; v.len()];
        }
        let (mut a, mut b) = (0.0f64, 1.0f64);
        let g = (5f64.sqrt() - 1.0) / 2.0;
        for _ in 0..200 {
            let (c, d) = (b - g * (b - a), a + g * (b - a));
            if dist(c) <= dist(d) { b = d } else { a = c }
        }
        assemble((a + b) / 2.0)
    }

    proptest! {
        #[test]
        fn projection_matches_brute_force(
            v in prop::collection::vec(-3.0f32..3.0, 1..12),
            pos_mask in prop::collection::vec(any::<bool>(), 12),
        ) {
            let is_pos: Vec<bool> = pos_mask[..v.len()].to_vec();
            let positives: Vec<u32> = (0..v.len() as u32).filter(|&i| is_pos[i as usize]).collect();
            let got = project_bisimplex(&v, &positives);
            let expect = brute_force(&v, &is_pos);
            for (g, e) in got.iter().zip(&expect) {
                prop_assert!((*g as f64 - e).abs() < 1e-4, "got {:?} expected {:?} for v {:?}", got, expect, v);
            }
        }
    }

    #[test]
    fn projection_is_feasible_and_idempotent() {
        let v = [0.9f32, 0.8, 0.7, -0.2, 0.3, 0.1];
        let a = project_bisimplex(&v, &[3, 4]);
        let sum_n: f32 = [0, 1, 2, 5].iter().map(|&i| a[i]).sum();
        let sum_p: f32 = [3, 4].iter().map(|&i| a[i]).sum();
        assert!((sum_n + sum_p).abs() < 1e-6 && sum_n <= 1.0 + 1e-6);
        assert!([0, 1, 2, 5].iter().all(|&i| a[i] >= 0.0) && [3, 4].iter().all(|&i| a[i] <= 0.0));
        let b = project_bisimplex(&a, &[3, 4]);
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-6);
        }
    }

    #[test]
    fn all_equal_scores_spread_the_gradient_evenly() {
        // Untrained layer: z = 0, v = 1/mu on negatives, 0 on the positive; every negative ties.
        // With a_n = s / 999 the distance is 999 (1 - s/999)^2 + s^2, minimal at s = 999/1000.
        let mut v = vec![1.0f32; 1000];
        v[0] = 0.0;
        let a = project_bisimplex(&v, &[0]);
        assert!((a[0] + 0.999).abs() < 1e-5, "{}", a[0]);
        assert!(a[1..].iter().all(|&x| (x - 0.001).abs() < 1e-6));
    }
}
