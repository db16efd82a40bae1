//! Sampling estimators: sampled softmax ([`SampledSoftmax`], Jean et al. 2015, with TensorFlow's
//! `sampled_softmax_loss` semantics) and word2vec's negative sampling ([`NegativeSampling`],
//! Mikolov et al. 2013), both drawing classes from a [`crate::Proposal`] `Q`, and their
//! parameters.
//!
//! # Sampled softmax
//!
//! Draw `n` classes `S` from `Q`, with `E_c` the expected number of times class `c` is drawn
//! ([`crate::Draws`]). The candidates are `C = P ∪ S'`, where `S'` is `S` without the positives it
//! hit (accidental hits), and every candidate's logit, positives included, is corrected by
//! `-log E_c`:
//!
//! ```text
//! z'_c     = z_c - log E_c                                          for c in C
//! L        = sum_{p in P} ( log sum_{c in C} exp(z'_c) - z'_p )       LDGS eq. 2 on C
//! dL/dz_c  = |P| exp(z'_c) / sum_{c' in C} exp(z'_c') - [c in P]     for c in C; 0 elsewhere
//! ```
//!
//! The correction is an importance weight: for draws with replacement,
//! `sum_{draws c} exp(z_c) / E_c` is an unbiased estimate of the partition function
//! `sum_k exp(z_k)`, and the gradient tends to the exact softmax gradient as `n` grows (tested).
//! Draws are made per sample, or once per batch with `shared` (TensorFlow's default). Cost:
//! `|S| + |P|` scores per sample.
//!
//! # Negative sampling
//!
//! Draw `n` classes `k_1..k_n` from `Q` (word2vec: unigram^0.75 of the class counts), skip the
//! draws that hit a positive, and evaluate the binary logistic loss ([`crate::BinaryLogistic`]):
//!
//! ```text
//! L             = -sum_{p in P} log sigma(z_p) - sum_j log sigma(-z_{k_j})
//! dL/dz_p       = sigma(z_p) - 1
//! dL/dz_{k_j}   = sigma(z_{k_j})                           (a class drawn twice counts twice)
//! ```
//!
//! It is no estimate of the softmax loss but a different objective whose optimum ranks classes
//! alike: the fast baseline of skip-gram training. Cost: `n + |P|` scores per sample.

use crate::contract::{Built, EstimatorParams, ExactLoss, Negatives, Problem};
use crate::estimator::{Batch, BatchEstimate, BatchGrad, Ctx, Estimate, GradientEstimator, for_each_sample};
use crate::loss::{BinaryLogistic, Loss, LossScratch, Softmax};
use crate::proposal::{Draws, Proposal, ProposalKind, check_alpha};
use crate::shard::{Drawn, ShardDraw, ShardPlan, draw_per_sample};
use farout_core::rng::RngCore;
use farout_core::{ClassId, Rng, SparseGrad};
use std::cell::RefCell;

/// Sampled softmax (Jean et al. 2015; TensorFlow's `sampled_softmax_loss` semantics) — the LDGS
/// paper's Sampled-Softmax baseline and the warm-up estimator of the search-based ones.
///
/// Draw a set `S` of classes from a proposal `Q` (uniform, log-uniform or unigram^alpha), with
/// `E_c` the expected number of times class `c` is drawn (`n Q(c)` with replacement;
/// `1 - (1 - Q(c))^T` when drawing until `n` distinct classes, `T` tries). The loss is the
/// softmax cross-entropy (eq. 2 of the LDGS paper) over the candidates `P ∪ S'`, where `S'` is
/// `S` without accidental hits (sampled positives), every logit corrected by `-log E_c`:
///
/// `L = sum_{p in P} ( log sum_{c in P ∪ S'} exp(z_c - log E_c) - (z_p - log E_p) )`.
///
/// The gradient is that of the softmax over the candidates, zero elsewhere; it converges to the
/// exact softmax gradient as `n` grows (tested). Samples are drawn per sample or, with `shared`,
/// once per batch (TensorFlow's default; cheaper to draw, correlated across the batch). Cost:
/// `|S| + |P|` scores per sample.
#[derive(Clone, Debug)]
pub struct SampledSoftmax {
    n_samples: usize,
    proposal: Proposal,
    unique: bool,
    shared: bool,
}

#[derive(Default)]
struct Scratch {
    draws: Draws,
    candidates: Drawn,
    z: Vec<f32>,
    grad: Vec<f32>,
    pos: Vec<ClassId>,
    loss: LossScratch,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl SampledSoftmax {
    /// Draws `n_samples` distinct uniform negatives per sample (the LDGS paper's baseline).
    pub fn new(n_samples: usize) -> Result<Self, crate::Error> {
        Self::with_proposal(n_samples, Proposal::Uniform, true, false)
    }

    /// Full control: the proposal, `unique` (draw until `n_samples` distinct classes) and
    /// `shared` (one draw per batch).
    pub fn with_proposal(
        n_samples: usize,
        proposal: Proposal,
        unique: bool,
        shared: bool,
    ) -> Result<Self, crate::Error> {
        crate::at_least_one("n_samples", n_samples, "must draw at least one class")?;
        Ok(Self { n_samples, proposal, unique, shared })
    }

    /// One sample's candidates given the draws `d`: its positives, then the drawn classes that
    /// are not positives, each with the correction `-log E_c` of its logit.
    fn candidates(&self, k: usize, positives: &[ClassId], d: &Draws, out: &mut Drawn) {
        out.classes.clear();
        out.positives = positives.len();
        out.corrections.clear();
        for &p in positives {
            out.classes.push(p);
            out.corrections.push(-(d.expected(&self.proposal, k, p, self.unique).ln() as f32));
        }
        for (&c, &log_e) in d.classes.iter().zip(&d.log_expected) {
            if !positives.contains(&c) {
                out.classes.push(c);
                out.corrections.push(-log_e);
            }
        }
    }

    /// One sample's loss and gradient, given the draws `d`.
    fn estimate_with(
        &self,
        ctx: &Ctx,
        phi: &[f32],
        positives: &[ClassId],
        d: &Draws,
        s: &mut Scratch,
        out: &mut SparseGrad,
    ) -> Estimate {
        self.candidates(ctx.n_classes(), positives, d, &mut s.candidates);
        s.z.clear();
        s.z.extend(
            s.candidates.classes.iter().zip(&s.candidates.corrections).map(|(&c, &e)| ctx.score(c as usize, phi) + e),
        );
        s.pos.clear();
        s.pos.extend(0..positives.len() as ClassId);
        s.grad.resize(s.z.len(), 0.0);
        let loss = Softmax.value_and_grad(&s.z, &s.pos, &mut s.grad, &mut s.loss);
        out.set_nonzero(&s.candidates.classes, &s.grad);
        Estimate { loss, classes_scored: s.candidates.classes.len() }
    }
}

impl ShardDraw for SampledSoftmax {
    /// The draws of [`GradientEstimator::estimate_batch`]: one generator per sample seeded from
    /// one draw of `rng`, or one draw for the batch when `shared`.
    fn draw_batch(&self, n_classes: usize, positives: &[&[ClassId]], rng: &mut Rng, out: &mut Vec<Drawn>) {
        let mut d = Draws::default();
        if self.shared {
            out.resize_with(positives.len(), Drawn::default);
            out.truncate(positives.len());
            d.sample(&self.proposal, n_classes, self.n_samples, self.unique, rng);
            for (pos, drawn) in positives.iter().zip(out.iter_mut()) {
                self.candidates(n_classes, pos, &d, drawn);
                drawn.rng = None;
            }
            return;
        }
        draw_per_sample(positives, rng, out, |pos, r, drawn| {
            d.sample(&self.proposal, n_classes, self.n_samples, self.unique, r);
            self.candidates(n_classes, pos, &d, drawn);
        });
    }
}

impl GradientEstimator for SampledSoftmax {
    fn name(&self) -> &'static str {
        "sampled_softmax"
    }

    /// The same draws on every rank, each class scored by the rank that owns it.
    fn shard_plan(&self) -> Option<ShardPlan<'_>> {
        Some(ShardPlan::Draw { draw: self, loss: &Softmax })
    }

    fn estimate(&self, ctx: &Ctx, phi: &[f32], positives: &[ClassId], rng: &mut Rng, out: &mut SparseGrad) -> Estimate {
        SCRATCH.with_borrow_mut(|s| {
            let mut d = std::mem::take(&mut s.draws);
            d.sample(&self.proposal, ctx.n_classes(), self.n_samples, self.unique, rng);
            let e = self.estimate_with(ctx, phi, positives, &d, s, out);
            s.draws = d;
            e
        })
    }

    fn estimate_batch(&self, ctx: &Ctx, batch: Batch, rng: &mut Rng, out: &mut BatchGrad) -> BatchEstimate {
        if !self.shared {
            let seed = rng.next_u64();
            return for_each_sample(out, batch.phi.rows(), |i, g| {
                let mut r = farout_core::rng::seeded(seed, i as u64);
                self.estimate(ctx, batch.phi.row(i), batch.positives[i], &mut r, g)
            });
        }
        let mut d = Draws::default();
        d.sample(&self.proposal, ctx.n_classes(), self.n_samples, self.unique, rng);
        for_each_sample(out, batch.phi.rows(), |i, g| {
            SCRATCH.with_borrow_mut(|s| self.estimate_with(ctx, batch.phi.row(i), batch.positives[i], &d, s, g))
        })
    }
}

/// Negative sampling, word2vec's objective (Mikolov et al. 2013): for positives `P` and `n`
/// negatives `k_j` drawn from a proposal (unigram^0.75 of class counts; uniform without
/// counts), skipping draws that hit a positive,
///
/// `L = - sum_{p in P} log sigma(z_p) - sum_j log sigma(-z_{k_j})`,
///
/// `dL/dz_p = sigma(z_p) - 1`, `dL/dz_{k_j} = sigma(z_{k_j})` (a class drawn twice counts
/// twice). It is not an estimate of the softmax loss but a different objective whose optimum
/// ranks classes similarly; it is the fast baseline of skip-gram training. Cost: `n + |P|`.
#[derive(Clone, Debug)]
pub struct NegativeSampling {
    n_samples: usize,
    proposal: Proposal,
}

impl NegativeSampling {
    /// `n_samples` negatives per sample from `proposal` (word2vec: unigram^0.75).
    pub fn new(n_samples: usize, proposal: Proposal) -> Result<Self, crate::Error> {
        crate::at_least_one("n_samples", n_samples, "must draw at least one negative")?;
        Ok(Self { n_samples, proposal })
    }
}

impl NegativeSampling {
    /// One sample's candidates: its positives, then each of the `n_samples` draws from `rng`
    /// that is not a positive (duplicates kept). No corrections.
    fn candidates(&self, k: usize, positives: &[ClassId], rng: &mut Rng, out: &mut Drawn) {
        out.classes.clear();
        out.classes.extend_from_slice(positives);
        out.positives = positives.len();
        for _ in 0..self.n_samples {
            let c = self.proposal.draw(k, rng);
            if !positives.contains(&c) {
                out.classes.push(c);
            }
        }
        out.corrections.clear();
        out.corrections.resize(out.classes.len(), 0.0);
    }
}

impl ShardDraw for NegativeSampling {
    /// The draws of [`GradientEstimator::estimate_batch`]: one generator per sample, seeded from
    /// one draw of `rng`.
    fn draw_batch(&self, n_classes: usize, positives: &[&[ClassId]], rng: &mut Rng, out: &mut Vec<Drawn>) {
        draw_per_sample(positives, rng, out, |pos, r, drawn| self.candidates(n_classes, pos, r, drawn));
    }
}

impl GradientEstimator for NegativeSampling {
    fn name(&self) -> &'static str {
        "negative_sampling"
    }

    /// The same draws on every rank, each class scored by the rank that owns it.
    fn shard_plan(&self) -> Option<ShardPlan<'_>> {
        Some(ShardPlan::Draw { draw: self, loss: &BinaryLogistic })
    }

    fn estimate(&self, ctx: &Ctx, phi: &[f32], positives: &[ClassId], rng: &mut Rng, out: &mut SparseGrad) -> Estimate {
        SCRATCH.with_borrow_mut(|s| {
            self.candidates(ctx.n_classes(), positives, rng, &mut s.candidates);
            let classes = &s.candidates.classes;
            s.z.clear();
            s.z.extend(classes.iter().map(|&c| ctx.score(c as usize, phi)));
            s.pos.clear();
            s.pos.extend(0..positives.len() as ClassId);
            s.grad.resize(s.z.len(), 0.0);
            let loss = BinaryLogistic.value_and_grad(&s.z, &s.pos, &mut s.grad, &mut s.loss);
            out.clear();
            classes.iter().zip(&s.grad).for_each(|(&c, &g)| out.push(c, g));
            Estimate { loss, classes_scored: classes.len() }
        })
    }
}

/// `[output] estimator = "sampled_softmax"`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SampledSoftmaxConfig {
    /// Negatives per sample (0 = use `sample_fraction`).
    pub n_samples: usize,
    /// Negatives as a fraction of K when `n_samples = 0` (the LDGS paper: 0.01).
    pub sample_fraction: f64,
    /// Where negatives come from: `uniform`, `log_uniform` (ids sorted by frequency) or
    /// `unigram` (training label counts ^ `alpha`).
    pub proposal: ProposalKind,
    /// Exponent of the unigram proposal (word2vec: 0.75).
    pub alpha: f64,
    /// Draw until `n` distinct classes (TensorFlow's `unique = true`) rather than `n` draws
    /// with replacement.
    pub unique: bool,
    /// One set of negatives for the whole batch instead of one per sample.
    pub shared_samples: bool,
}

impl Default for SampledSoftmaxConfig {
    fn default() -> Self {
        let n = Negatives::default();
        Self {
            n_samples: n.n_samples,
            sample_fraction: n.sample_fraction,
            proposal: ProposalKind::Uniform,
            alpha: 0.75,
            unique: true,
            shared_samples: false,
        }
    }
}

impl SampledSoftmaxConfig {
    fn negatives(&self) -> Negatives {
        Negatives { n_samples: self.n_samples, sample_fraction: self.sample_fraction }
    }
}

impl EstimatorParams for SampledSoftmaxConfig {
    /// The negatives per sample (log-uniform: the cost is linear in them), unless they are set
    /// as a fraction of K.
    fn search_space(&self) -> Vec<farout_core::space::Dim> {
        use farout_core::space::Dim;
        if self.sample_fraction > 0.0 { Vec::new() } else { vec![Dim::int("n_samples", 2, 64, true)] }
    }

    fn check(&self) -> Result<(), farout_core::ParamError> {
        self.negatives().check()?;
        check_alpha(self.alpha)
    }

    fn loss(&self) -> Result<ExactLoss, crate::Error> {
        Ok(ExactLoss::Softmax)
    }

    fn build(&self, problem: &Problem) -> Result<Built, crate::Error> {
        let k = problem.n_classes;
        let proposal = self.proposal.build(k, self.alpha, problem.label_counts)?;
        let n = self.negatives().count(k)?;
        let estimator = SampledSoftmax::with_proposal(n, proposal, self.unique, self.shared_samples)?;
        Ok(Built::sampling(Box::new(estimator), ExactLoss::Softmax))
    }

    fn estimates_softmax(&self) -> bool {
        true
    }
}

/// `[output] estimator = "negative_sampling"`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NegativeSamplingConfig {
    /// Negatives per sample (0 = use `sample_fraction`; skip-gram: word2vec's 5).
    pub n_samples: usize,
    /// Negatives as a fraction of K when `n_samples = 0`.
    pub sample_fraction: f64,
    /// Where negatives come from (word2vec: `unigram`).
    pub proposal: ProposalKind,
    /// Exponent of the unigram proposal (word2vec: 0.75).
    pub alpha: f64,
}

impl Default for NegativeSamplingConfig {
    fn default() -> Self {
        let n = Negatives::default();
        Self {
            n_samples: n.n_samples,
            sample_fraction: n.sample_fraction,
            proposal: ProposalKind::Unigram,
            alpha: 0.75,
        }
    }
}

impl EstimatorParams for NegativeSamplingConfig {
    /// The negatives per sample (log-uniform: the cost is linear in them), unless they are set
    /// as a fraction of K.
    fn search_space(&self) -> Vec<farout_core::space::Dim> {
        use farout_core::space::Dim;
        if self.sample_fraction > 0.0 { Vec::new() } else { vec![Dim::int("n_samples", 2, 64, true)] }
    }

    fn check(&self) -> Result<(), farout_core::ParamError> {
        Negatives { n_samples: self.n_samples, sample_fraction: self.sample_fraction }.check()?;
        check_alpha(self.alpha)
    }

    fn loss(&self) -> Result<ExactLoss, crate::Error> {
        Ok(ExactLoss::Softmax)
    }

    fn build(&self, problem: &Problem) -> Result<Built, crate::Error> {
        let k = problem.n_classes;
        let proposal = self.proposal.build(k, self.alpha, problem.label_counts)?;
        let n = Negatives { n_samples: self.n_samples, sample_fraction: self.sample_fraction }.count(k)?;
        Ok(Built::sampling(Box::new(NegativeSampling::new(n, proposal)?), ExactLoss::Softmax))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Exact;
    use crate::estimator::{Batch, BatchGrad};
    use crate::mips::dphi_cosine;
    use farout_core::{Matrix, rng};

    /// Mean cosine between the estimator's and the exact dL/dphi over 20 samples x 10 seeds.
    fn mean_cosine(est: &dyn GradientEstimator) -> f64 {
        let (k, d) = (500, 16);
        let mut r = rng::seeded(3, 0);
        let w = Matrix::from_vec(k, d, (0..k * d).map(|_| 0.3 * rng::normal(&mut r)).collect()).unwrap();
        let phi = Matrix::from_vec(20, d, (0..20 * d).map(|_| rng::normal(&mut r)).collect()).unwrap();
        let ctx = Ctx::new(&w, None);
        let exact = Exact::new(Softmax);
        let positives: Vec<[u32; 1]> = (0..20).map(|i| [(i * 7) as u32]).collect();
        let refs: Vec<&[u32]> = positives.iter().map(|p| &p[..]).collect();
        let mut total = 0.0;
        for seed in 0..10 {
            let mut bg = BatchGrad::default();
            est.estimate_batch(&ctx, Batch::new(&phi, &refs), &mut rng::seeded(seed, 0), &mut bg);
            for (i, positives) in refs.iter().enumerate().take(20) {
                let mut g_exact = SparseGrad::new();
                exact.estimate(&ctx, phi.row(i), positives, &mut rng::seeded(0, 0), &mut g_exact);
                total += dphi_cosine(&ctx, &bg.sparse[i], &g_exact) as f64;
            }
        }
        total / 200.0
    }

    #[test]
    fn gradient_approaches_the_exact_one_as_the_sample_grows() {
        // For every proposal, with and without unique sampling, per-sample and shared: the mean
        // cosine to the exact dL/dphi rises with n (stated tolerance: >= 0.99 at n = 4K).
        let counts: Vec<u64> = (0..500u64).map(|c| 1 + (c * 37) % 100).collect();
        let proposals = [Proposal::Uniform, Proposal::LogUniform, Proposal::unigram(&counts, 0.75).unwrap()];
        for p in &proposals {
            for (unique, shared) in [(true, false), (false, false), (true, true)] {
                let c: Vec<f64> = [10, 50, 250, 2000]
                    .iter()
                    .map(|&n| mean_cosine(&SampledSoftmax::with_proposal(n, p.clone(), unique, shared).unwrap()))
                    .collect();
                let what = format!("{} unique={unique} shared={shared}: {c:?}", p.name());
                assert!(c.windows(2).all(|p| p[1] > p[0]), "{what}");
                assert!(c[3] >= 0.99, "{what}");
            }
        }
    }

    #[test]
    fn negative_sampling_gradient_is_the_derivative_of_its_loss() {
        // Same seed -> same negatives: central differences of the loss in each touched score.
        let (k, d) = (50, 4);
        let mut r = rng::seeded(8, 0);
        let w = Matrix::from_vec(k, d, (0..k * d).map(|_| rng::normal(&mut r)).collect()).unwrap();
        let phi: Vec<f32> = (0..d).map(|_| rng::normal(&mut r)).collect();
        let est = NegativeSampling::new(5, Proposal::Uniform).unwrap();
        let mut g = SparseGrad::new();
        est.estimate(&Ctx::new(&w, None), &phi, &[3], &mut rng::seeded(1, 0), &mut g);
        assert_eq!(g.len(), 6, "one positive and five negatives (none hit class 3 with this seed)");
        let bias0 = vec![0.0f32; k];
        let loss_at = |b: &[f32]| {
            let mut gg = SparseGrad::new();
            est.estimate(&Ctx::new(&w, Some(b)), &phi, &[3], &mut rng::seeded(1, 0), &mut gg).loss as f64
        };
        let mut dense = vec![0.0f64; k];
        for (c, v) in g.iter() {
            dense[c as usize] += v as f64;
        }
        for c in 0..k {
            let h = 1e-2;
            let (mut bp, mut bm) = (bias0.clone(), bias0.clone());
            bp[c] += h;
            bm[c] -= h;
            let fd = (loss_at(&bp) - loss_at(&bm)) / (2.0 * h as f64);
            assert!((fd - dense[c]).abs() < 2e-3, "class {c}: fd {fd} vs {}", dense[c]);
        }
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
