//! Euclidean projection onto the bi-simplex of the smoothed max-margin loss (LDGS eq. 11):
//!
//! `C = {a : sum_N a = -sum_P a = s <= 1, a_N >= 0, a_P <= 0}`.
//!
//! For a fixed `s` the problem splits into two simplex projections: `a_N = proj_{Δ_s}(v_N)` and
//! `-a_P = proj_{Δ_s}(-v_P)` with `Δ_s = {x >= 0, sum x = s}`, each of the form
//! `x_i = max(u_i - θ(s), 0)`. The squared distance `f(s)` is convex with
//! `f'(s) = -2 (θ_N(s) + θ_P(s))`, and `θ(s)` is piecewise linear and decreasing in `s` with
//! breakpoints `c_j = S_j - j u_j` (u sorted descending, `S_j` its prefix sums): on
//! `(c_j, c_{j+1}]` the support is the top `j` and `θ = (S_j - s) / j`. So the optimal `s` is the
//! root of `θ_N + θ_P` clipped to `[0, 1]`, found by walking the merged breakpoints and solving
//! one linear equation on the segment that holds it.
//!
//! Cost: because `x_1 = u_1 - θ <= s <= 1`, only values above `u_1 - 1` can be in a support; a
//! linear pass keeps those and only they are sorted. With untrained (all-equal) scores that is
//! every class, O(K log K) as in PD-Sparse; once scores spread out it is a handful.

use farout_core::ClassId;

/// Reusable buffers of the projection.
#[derive(Debug, Default)]
pub struct BisimplexScratch {
    neg: Vec<f32>,
    pos: Vec<f32>,
    neg_prefix: Vec<f64>,
    pos_prefix: Vec<f64>,
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

/// `prefix[j] = sum of the first j values` (prefix[0] = 0).
fn prefix_sums(u: &[f32], prefix: &mut Vec<f64>) {
    prefix.clear();
    prefix.push(0.0);
    let mut acc = 0.0;
    for &x in u {
        acc += x as f64;
        prefix.push(acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
