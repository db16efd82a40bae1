use crate::estimator::{Ctx, Estimate, GradientEstimator};
use crate::loss::{Loss, LossScratch, Softmax};
use farout_core::rng::RngExt;
use farout_core::{ClassId, Rng, SparseGrad};
use std::cell::RefCell;

/// Sampled softmax (Jean et al. 2015; TensorFlow's `sampled_softmax_loss` semantics) with a
/// uniform proposal — the LDGS paper's Sampled-Softmax baseline and the warm-up estimator of
/// the search-based ones.
///
/// Draw `n` classes `S` uniformly with replacement; each has expected count `E = n / K`. The
/// loss is the softmax cross-entropy (eq. 2) over the candidates `P ∪ S'`, where `S'` is `S`
/// without accidental hits (sampled positives) and every logit is corrected by `-log E`:
///
/// `L = sum_{p in P} ( log sum_{c in P ∪ S'} exp(z_c - log E_c) - (z_p - log E_p) )`.
///
/// With a uniform proposal the correction is the same for every class and cancels; it is kept
/// explicit for the other proposals. A class drawn twice enters once. Gradient: that of the
/// softmax over the candidates, zero elsewhere. Cost: `n + |P|` scores per sample.
#[derive(Clone, Debug)]
pub struct SampledSoftmax {
    n_samples: usize,
}

#[derive(Default)]
struct Scratch {
    classes: Vec<ClassId>,
    z: Vec<f32>,
    grad: Vec<f32>,
    pos: Vec<ClassId>,
    loss: LossScratch,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl SampledSoftmax {
    /// Draws `n_samples` negatives per sample.
    pub fn new(n_samples: usize) -> Result<Self, crate::Error> {
        if n_samples == 0 {
            return Err(crate::Error::Param {
                name: "n_samples",
                value: "0".into(),
                reason: "must draw at least one class",
            });
        }
        Ok(Self { n_samples })
    }
}

impl GradientEstimator for SampledSoftmax {
    fn name(&self) -> &'static str {
        "sampled_softmax"
    }

    fn estimate(&self, ctx: &Ctx, phi: &[f32], positives: &[ClassId], rng: &mut Rng, out: &mut SparseGrad) -> Estimate {
        let k = ctx.n_classes();
        let log_expected = (self.n_samples as f32 / k as f32).ln();
        SCRATCH.with_borrow_mut(|s| {
            s.classes.clear();
            s.classes.extend_from_slice(positives);
            for _ in 0..self.n_samples {
                let c = rng.random_range(0..k as ClassId);
                s.classes.push(c);
            }
            // Accidental hits and repeats: keep each class once, positives first.
            let n_pos = positives.len();
            s.classes[n_pos..].sort_unstable();
            let mut w = n_pos;
            for r in n_pos..s.classes.len() {
                let c = s.classes[r];
                if (w > n_pos && s.classes[w - 1] == c) || positives.contains(&c) {
                    continue;
                }
                s.classes[w] = c;
                w += 1;
            }
            s.classes.truncate(w);
            s.z.clear();
            s.z.extend(s.classes.iter().map(|&c| ctx.score(c as usize, phi) - log_expected));
            s.pos.clear();
            s.pos.extend(0..n_pos as ClassId);
            s.grad.resize(s.z.len(), 0.0);
            let loss = Softmax.value_and_grad(&s.z, &s.pos, &mut s.grad, &mut s.loss);
            out.clear();
            for (&c, &g) in s.classes.iter().zip(&s.grad) {
                if g != 0.0 {
                    out.push(c, g);
                }
            }
            Estimate { loss, classes_scored: s.classes.len() }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Exact;
    use crate::mips::dphi_cosine;
    use farout_core::{Matrix, rng};

    #[test]
    fn gradient_approaches_the_exact_one_as_the_sample_grows() {
        // Mean cosine between sampled and exact dL/dphi over 200 (sample, seed) pairs, for
        // growing n: it must rise towards 1 (stated tolerance: >= 0.99 at n = 4K).
        let (k, d) = (500, 16);
        let mut r = rng::seeded(3, 0);
        let w = Matrix::from_vec(k, d, (0..k * d).map(|_| 0.3 * rng::normal(&mut r)).collect()).unwrap();
        let phi = Matrix::from_vec(20, d, (0..20 * d).map(|_| rng::normal(&mut r)).collect()).unwrap();
        let ctx = Ctx::new(&w, None);
        let exact = Exact::new(Softmax);
        let mean_cos = |n: usize| {
            let est = SampledSoftmax::new(n).unwrap();
            let mut total = 0.0;
            for i in 0..20 {
                let mut g_exact = SparseGrad::new();
                exact.estimate(&ctx, phi.row(i), &[i as u32], &mut rng::seeded(0, 0), &mut g_exact);
                for seed in 0..10 {
                    let mut g = SparseGrad::new();
                    est.estimate(&ctx, phi.row(i), &[i as u32], &mut rng::seeded(seed, i as u64), &mut g);
                    total += dphi_cosine(&ctx, &g, &g_exact) as f64;
                }
            }
            total / 200.0
        };
        let c: Vec<f64> = [10, 50, 250, 2000].iter().map(|&n| mean_cos(n)).collect();
        assert!(c.windows(2).all(|p| p[1] > p[0]), "{c:?}");
        assert!(c[3] >= 0.99, "{c:?}");
    }

    #[test]
    fn accidental_hits_and_repeats_are_removed() {
        let w = Matrix::from_vec(3, 1, vec![1.0, 2.0, 3.0]).unwrap();
        let ctx = Ctx::new(&w, None);
        let mut g = SparseGrad::new();
        let e = SampledSoftmax::new(50).unwrap().estimate(&ctx, &[1.0], &[1], &mut rng::seeded(1, 0), &mut g);
        let mut classes: Vec<u32> = g.classes().to_vec();
        classes.sort_unstable();
        assert_eq!(classes, vec![0, 1, 2], "50 draws over 3 classes: each once, positive once");
        assert_eq!(e.classes_scored, 3);
        // With every class present the sampled loss is the exact one.
        let exact = (1f32.exp() + 2f32.exp() + 3f32.exp()).ln() - 2.0;
        assert!((e.loss - exact).abs() < 1e-5);
    }
}
