//! Search-based gradients, Algorithm 1 of the LDGS paper (Section 2.1), with top-Q retrieval in
//! place of the paper's threshold ([`Mips`], `[output] estimator = "mips"`), and
//! [`dphi_cosine`], the measure of an estimator against the exact gradient (the cosine between
//! the two `dL/dphi = sum_k g_k W_k`).
//!
//! For a sample with features `phi` and positives `P`, with `L` the cross-entropy (eq. 2) or the
//! smoothed max-margin (eq. 10-11) of `loss.rs`:
//!
//! ```text
//! U        = the top Q classes of the layer's index for phi, and P      (Q = top, default K/100)
//! z_U      = their exact scores W_k . phi + b_k
//! L~       = L(z_U, P)
//! g_k      = dL(z_U, P)/dz_k   for k in U;      g_k = 0 otherwise
//! ```
//!
//! # Classes that were not retrieved
//!
//! Algorithm 1 asks the index for every class with `|z_k| > tau` and counts the others as 0,
//! which is then within `tau` of the truth: the loss is off by at most `tau` times the loss's
//! l_inf Lipschitz constant (2 for the max-margin loss, `O(|P| log K)` for the cross-entropy). A
//! top-Q search bounds nothing, so a 0 can be far from the truth; the classes outside `U` are
//! left out of the loss instead:
//!
//! - smoothed max-margin: a negative more than `mu` below the best negative has no gradient and
//!   does not change the loss ([`crate::Loss::support_width`]); once the Q-th score is that far
//!   below the top, the estimate is exact for every class the index found;
//! - softmax: the partition function is summed over `U` only, a lower bound of the exact one,
//!   which over-weights the retrieved classes by the unretrieved probability mass. The paper's
//!   remedy (Section 4: retrieve classes in decreasing order of gradient, and decide whether to
//!   retrieve more from the lower bound of the partition function the retrieved ones give) is
//!   not implemented.
//!
//! Cost per sample: the index's inner products, plus one per positive the search missed.

use crate::contract::{Built, EstimatorParams, ExactLoss, LossKind, Problem, SearchShape};
use crate::estimator::{Batch, BatchEstimate, BatchGrad, Ctx, Estimate, GradientEstimator, for_each_sample};
use crate::loss::{Loss, LossScratch, Softmax};
use crate::shard::ShardPlan;
use farout_core::{ClassId, Rng, SparseGrad, kernels};
use farout_search::Hit;
use std::cell::RefCell;

/// Search-based gradient, Algorithm 1 of the LDGS paper ("MIPS").
///
/// Retrieve the `top` (Q) classes with the largest scores `z_k = W_k . phi` from the layer's
/// MIPS index, add the positives, and evaluate the loss and its gradient on the sparse score
/// vector of these candidates `U`; classes outside `U` get no gradient:
///
/// `g_k = dL(z_U, P)/dz_k` for `k in U`, `0` otherwise.
///
/// How good this is depends on the loss (ARCHITECTURE.md, "Classes that were not retrieved"):
/// - smoothed max-margin: a class below the Q-th score carries no gradient once that score is
///   more than the margin under the top, so with good recall the gradient is exact;
/// - softmax: the partition function is summed over `U` only, a lower bound of the exact one,
///   which over-weights the retrieved classes; the error is the unretrieved probability mass.
///
/// Cost per sample: the index's inner products plus |P|. Requires a layer without bias (the
/// index searches `W` alone) and an index attached to the layer.
#[derive(Clone, Debug)]
pub struct Mips<L> {
    loss: L,
    top: usize,
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

impl<L: Loss> Mips<L> {
    /// Retrieves `top` classes per sample (the paper: K/100; K/20 for skip-gram).
    pub fn new(loss: L, top: usize) -> Result<Self, crate::Error> {
        crate::at_least_one("top", top, "must retrieve at least one class")?;
        Ok(Self { loss, top })
    }
}

impl<L: Loss> GradientEstimator for Mips<L> {
    fn name(&self) -> &'static str {
        "mips"
    }

    fn uses_index(&self) -> bool {
        true
    }

    /// Each rank's top-Q, merged into the top-Q over all ranks.
    fn shard_plan(&self) -> Option<ShardPlan<'_>> {
        Some(ShardPlan::Search { top: self.top, loss: &self.loss })
    }

    fn estimate(
        &self,
        ctx: &Ctx,
        phi: &[f32],
        positives: &[ClassId],
        _rng: &mut Rng,
        out: &mut SparseGrad,
    ) -> Estimate {
        let index = ctx.index.expect("the mips estimator needs an index attached to the output layer");
        debug_assert_eq!(index.n_blocks(), 1, "Algorithm 1 searches one index over all columns");
        let mut hits = Vec::new();
        let cost = index.search_block(ctx.w, 0, phi, self.top, &mut hits);
        self.estimate_from_hits(ctx, phi, positives, &hits, cost, out)
    }

    /// The batch's queries go to the index together ([`farout_search::MipsIndex::search_batch`],
    /// which shares the work across queries), then every sample's loss in parallel.
    fn estimate_batch(&self, ctx: &Ctx, batch: Batch, _rng: &mut Rng, out: &mut BatchGrad) -> BatchEstimate {
        let index = ctx.index.expect("the mips estimator needs an index attached to the output layer");
        let mut hits = Vec::new();
        let search_cost = index.search_block_batch(ctx.w, 0, batch.phi, self.top, &mut hits);
        let mut total = for_each_sample(out, batch.phi.rows(), |i, g| {
            self.estimate_from_hits(ctx, batch.phi.row(i), batch.positives[i], &hits[i], 0, g)
        });
        total.classes_scored += search_cost;
        total
    }
}

impl<L: Loss> Mips<L> {
    /// Algorithm 1 after retrieval: `hits` are the retrieved classes with exact scores, `cost`
    /// what retrieving them cost.
    fn estimate_from_hits(
        &self,
        ctx: &Ctx,
        phi: &[f32],
        positives: &[ClassId],
        hits: &[Hit],
        cost: usize,
        out: &mut SparseGrad,
    ) -> Estimate {
        SCRATCH.with_borrow_mut(|s| {
            let mut cost = cost;
            s.classes.clear();
            s.z.clear();
            for h in hits {
                s.classes.push(h.class);
                s.z.push(h.score + ctx.bias.map_or(0.0, |b| b[h.class as usize]));
            }
            // Positives the search missed are scored exactly; `pos` holds positions in `classes`.
            s.pos.clear();
            for &p in positives {
                let at = match s.classes.iter().position(|&c| c == p) {
                    Some(i) => i,
                    None => {
                        s.classes.push(p);
                        s.z.push(ctx.score(p as usize, phi));
                        cost += 1;
                        s.classes.len() - 1
                    }
                };
                s.pos.push(at as ClassId);
            }
            s.grad.resize(s.z.len(), 0.0);
            let loss = self.loss.value_and_grad(&s.z, &s.pos, &mut s.grad, &mut s.loss);
            out.set_nonzero(&s.classes, &s.grad);
            Estimate { loss, classes_scored: cost }
        })
    }
}

/// Cosine between two sparse class gradients mapped through `W`: the `dL/dphi` they imply.
/// Used to measure estimators against the exact gradient.
pub fn dphi_cosine(ctx: &Ctx, a: &SparseGrad, b: &SparseGrad) -> f32 {
    let d = ctx.w.cols();
    let (mut va, mut vb) = (vec![0.0; d], vec![0.0; d]);
    for (k, g) in a.iter() {
        kernels::axpy(g, ctx.w.row(k as usize), &mut va);
    }
    for (k, g) in b.iter() {
        kernels::axpy(g, ctx.w.row(k as usize), &mut vb);
    }
    kernels::cosine(&va, &vb)
}

/// `[output] estimator = "mips"`: Algorithm 1 of the LDGS paper.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MipsConfig {
    /// The loss approximated on the retrieved scores.
    pub loss: LossKind,
    /// Smoothing of the margin loss.
    pub mu: f32,
    /// Classes retrieved per sample (0 = K / 100, the paper's batch query).
    pub top: usize,
}

impl Default for MipsConfig {
    fn default() -> Self {
        Self { loss: LossKind::Margin, mu: 1.0, top: 0 }
    }
}

/// Classes retrieved per search: `top`, or the LDGS paper's K / 100 when it is 0.
pub(crate) fn search_top(top: usize, n_classes: usize) -> usize {
    if top > 0 { top } else { (n_classes / 100).max(1) }
}

impl EstimatorParams for MipsConfig {
    /// μ of the margin loss and the classes retrieved (top), both log-uniform.
    fn search_space(&self) -> Vec<farout_core::space::Dim> {
        use farout_core::space::Dim;
        let mut space = vec![Dim::int("top", 5, 200, true)];
        if self.loss == LossKind::Margin {
            space.push(Dim::float_log("mu", 0.5, 20.0));
        }
        space
    }

    fn check(&self) -> Result<(), farout_core::ParamError> {
        self.loss()?;
        Ok(())
    }

    fn loss(&self) -> Result<ExactLoss, crate::Error> {
        ExactLoss::of(self.loss, self.mu)
    }

    fn build(&self, problem: &Problem) -> Result<Built, crate::Error> {
        let loss = self.loss()?;
        let top = search_top(self.top, problem.n_classes);
        let estimator: Box<dyn GradientEstimator> = match loss {
            ExactLoss::Softmax => Box::new(Mips::new(Softmax, top)?),
            ExactLoss::Margin(m) => Box::new(Mips::new(m, top)?),
        };
        Ok(Built { estimator, loss, exact: false, search: Some(SearchShape { top, blocks: 1 }) })
    }

    fn estimates_softmax(&self) -> bool {
        EstimatorParams::loss(self).is_ok_and(|l| l.is_softmax())
    }

    fn needs_no_bias(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Exact, SmoothedMargin, Softmax};
    use farout_core::{Matrix, rng};
    use farout_search::{BlockIndex, IndexConfig};

    fn exact_index(w: &Matrix, blocks: usize) -> BlockIndex {
        BlockIndex::build(w, &IndexConfig::exact(), blocks)
    }

    fn layer(k: usize, d: usize) -> (Matrix, Matrix) {
        let mut r = rng::seeded(11, 0);
        let w = Matrix::from_vec(k, d, (0..k * d).map(|_| rng::normal(&mut r)).collect()).unwrap();
        let phi = Matrix::from_vec(20, d, (0..20 * d).map(|_| 0.5 * rng::normal(&mut r)).collect()).unwrap();
        (w, phi)
    }

    #[test]
    fn retrieving_every_class_gives_the_exact_gradient() {
        let (w, phi) = layer(300, 16);
        let index = exact_index(&w, 1);
        let ctx = Ctx { w: &w, bias: None, index: Some(&index) };
        let margin = SmoothedMargin::new(1.0).unwrap();
        for (name, approx, exact) in [
            (
                "softmax",
                Box::new(Mips::new(Softmax, 300).unwrap()) as Box<dyn GradientEstimator>,
                Box::new(Exact::new(Softmax)) as Box<dyn GradientEstimator>,
            ),
            ("margin", Box::new(Mips::new(margin, 300).unwrap()), Box::new(Exact::new(margin))),
        ] {
            for i in 0..20 {
                let pos = [(i * 7) as u32 % 300];
                let (mut a, mut b) = (SparseGrad::new(), SparseGrad::new());
                let ea = approx.estimate(&ctx, phi.row(i), &pos, &mut rng::seeded(0, 0), &mut a);
                let eb = exact.estimate(&ctx, phi.row(i), &pos, &mut rng::seeded(0, 0), &mut b);
                assert!(
                    (ea.loss - eb.loss).abs() < 1e-3 * eb.loss.abs().max(1.0),
                    "{name}: {} vs {}",
                    ea.loss,
                    eb.loss
                );
                assert!(dphi_cosine(&ctx, &a, &b) > 0.9999, "{name}");
            }
        }
    }

    #[test]
    fn batched_estimates_equal_per_sample_estimates() {
        let (w, phi) = layer(3000, 16);
        let margin = SmoothedMargin::new(1.0).unwrap();
        let pos: Vec<Vec<u32>> = (0..20).map(|i| vec![(i * 131) as u32 % 3000]).collect();
        let refs: Vec<&[u32]> = pos.iter().map(|p| p.as_slice()).collect();
        for config in [IndexConfig::exact(), IndexConfig::default()] {
            let index = BlockIndex::build(&w, &config, 1);
            let ctx = Ctx { w: &w, bias: None, index: Some(&index) };
            let est = Mips::new(margin, 40).unwrap();
            let mut bg = crate::BatchGrad::default();
            let total = est.estimate_batch(&ctx, crate::Batch::new(&phi, &refs), &mut rng::seeded(0, 0), &mut bg);
            let mut loss = 0.0;
            let mut cost = 0;
            for (i, p) in pos.iter().enumerate().take(20) {
                let (mut g, e) = (
                    SparseGrad::new(),
                    est.estimate(&ctx, phi.row(i), p, &mut rng::seeded(0, 0), &mut SparseGrad::new()),
                );
                est.estimate(&ctx, phi.row(i), p, &mut rng::seeded(0, 0), &mut g);
                loss += e.loss as f64;
                cost += e.classes_scored;
                let (mut a, mut b): (Vec<_>, Vec<_>) = (g.iter().collect(), bg.sparse[i].iter().collect());
                a.sort_by_key(|x| x.0);
                b.sort_by_key(|x| x.0);
                assert_eq!(a.len(), b.len(), "{} sample {i}", config.name());
                for (x, y) in a.iter().zip(&b) {
                    assert!(x.0 == y.0 && (x.1 - y.1).abs() < 1e-4, "{} sample {i}: {x:?} vs {y:?}", config.name());
                }
            }
            assert!((loss - total.loss_sum).abs() < 1e-3 * loss.max(1.0), "{}", config.name());
            assert_eq!(cost, total.classes_scored, "{}", config.name());
        }
    }

    #[test]
    fn margin_gradient_is_exact_when_the_support_is_retrieved() {
        // Scores spread widely: the margin gradient's support (classes within ~mu of the top)
        // is far smaller than Q = 30, so top-30 retrieval reproduces the exact gradient.
        let (mut w, phi) = layer(2000, 16);
        kernels::scale(4.0, w.as_mut_slice());
        let index = exact_index(&w, 1);
        let ctx = Ctx { w: &w, bias: None, index: Some(&index) };
        let margin = SmoothedMargin::new(1.0).unwrap();
        let (approx, exact) = (Mips::new(margin, 30).unwrap(), Exact::new(margin));
        for i in 0..20 {
            let (mut a, mut b) = (SparseGrad::new(), SparseGrad::new());
            let pos = [i as u32];
            let e = approx.estimate(&ctx, phi.row(i), &pos, &mut rng::seeded(0, 0), &mut a);
            exact.estimate(&ctx, phi.row(i), &pos, &mut rng::seeded(0, 0), &mut b);
            let mut a_sorted: Vec<(u32, f32)> = a.iter().collect();
            let mut b_sorted: Vec<(u32, f32)> = b.iter().collect();
            a_sorted.sort_by_key(|x| x.0);
            b_sorted.sort_by_key(|x| x.0);
            assert_eq!(a_sorted.len(), b_sorted.len(), "sample {i}");
            for (x, y) in a_sorted.iter().zip(&b_sorted) {
                assert!(x.0 == y.0 && (x.1 - y.1).abs() < 1e-5, "sample {i}: {x:?} vs {y:?}");
            }
            assert!(e.classes_scored <= 2000 + 1);
        }
    }
}
