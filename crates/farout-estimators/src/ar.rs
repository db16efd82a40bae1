//! Augment & Reduce (Ruiz et al. 2018) and the One-vs-Each bound (Titsias 2016): lower bounds
//! on `log p(y | psi)` of a categorical whose sums over classes are replaced by unbiased
//! estimates from `|S|` uniformly drawn negatives, scaled by `c = (K-1)/|S|`.
//!
//! All four estimators model one label per sample (`y` = the first positive); their reported
//! loss is the negative bound estimate, `-ELBO`, an upper bound (in expectation) on `-log p`.
//!
//! The utility view (Section 2 of the A&R paper): `y = argmax_k (psi_k + eps_k)` with i.i.d.
//! noise of density `phi` and CDF `Phi` — Gumbel gives the softmax, Gaussian the multinomial
//! probit, logistic the multinomial logistic — so that (eq. 5)
//!
//! `p(y | psi) = ∫ phi(eps) prod_{k != y} Phi(eps + psi_y - psi_k) d eps`.
//!
//! Augmenting with `eps` and a variational `q(eps)` gives the ELBO (eq. 7), a sum over classes
//! that sampling reduces.
//!
//! # The estimators
//!
//! The scores are `psi = z`, `S` holds the negatives drawn uniformly with replacement from the
//! classes other than `y`, `c = (K-1)/|S|` and `d_j = z_j - z_y`. Every term depends on the scores
//! through the `d_j` only, so `dL/dz_y = -sum_{j in S} dL/dz_j`, and the classes outside
//! `S ∪ {y}` get no gradient. Cost: `|S| + 1` scores per sample.
//!
//! ```text
//! ove (eq. 10):
//!     L_OVE   = sum_{k != y} log sigmoid(z_y - z_k)
//!     L       = c sum_{j in S} softplus(d_j)                                 estimates -L_OVE
//!     dL/dz_j = c sigmoid(d_j)
//!
//! ar_softmax (eq. 8, Algorithm 1): q(eps) = Gumbel(log eta, 1)
//!     ELBO    = 1 - log eta - (1/eta) (1 + sum_{k != y} exp(z_k - z_y))
//!               (tight at eta = 1 + sum_{k != y} exp(z_k - z_y), where it is log p(y))
//!     local:    eta_hat = 1 + c sum_{j in S} exp(d_j)
//!               eta <- (1 - a) eta + a eta_hat,        a = (1 + t)^-0.9
//!     L       = log eta + eta_hat / eta - 1                                  estimates -ELBO
//!     global:   dL/dz_j = (c / eta) exp(d_j)
//!
//! ar_probit, ar_logistic (eq. 7, 9, Algorithm 2): q(eps) = mu + sigma u, sigma = softplus(gamma)
//!     log p~(y, eps) = log phi(eps) + c sum_{j in S} log Phi(eps - d_j)
//!     local:    u standard noise, eps = mu + sigma u, g_eps = d/d eps log p~(y, eps)
//!               mu    += a g_eps
//!               gamma += a (g_eps u + 1/sigma) sigmoid(gamma),     a = 0.01 (1 + t)^-0.9
//!     global:   a fresh eps ~ q,   dL/dz_j = c phi(eps - d_j) / Phi(eps - d_j)
//!     L       = -(log phi(eps) + H[q] + c sum_{j in S} log Phi(eps - d_j))   estimates -ELBO
//! ```
//!
//! `t` counts the sample's visits ([`crate::SampleState`]). The noises: standard Gaussian
//! (`H[q] = 1/2 + log sqrt(2 pi) + log sigma`) for the probit model, standard logistic
//! (`phi(x) = sigmoid(x) sigmoid(-x)`, `Phi = sigmoid`, `H[q] = log sigma + 2`) for the logistic
//! one.
//! Without a sample id ([`crate::GradientEstimator::estimate`]) no state is kept: `ar_softmax`
//! takes `eta = eta_hat`, which makes its loss `log eta_hat`, the sampled estimate of the softmax
//! loss, and the utility models use the initial `q` (`mu = 0`, `sigma = 1`). [`softmax_elbo`],
//! [`ove_bound`] and [`utility_log_prob`] compute the bounds and `log p(y | psi)` over all
//! classes, for evaluation and tests.

use crate::contract::{Built, EstimatorParams, ExactLoss, Negatives, Problem};
use crate::estimator::{Batch, BatchEstimate, BatchGrad, Ctx, Estimate, GradientEstimator, for_each_sample};
use crate::loss::{Loss, LossScratch};
use crate::loss::{sigmoid, softplus};
use crate::shard::{Drawn, DrawnLoss, ShardDraw, ShardPlan, draw_per_sample};
use crate::state::SampleState;
use farout_core::rng::{RngCore, RngExt};
use farout_core::{ClassId, Rng, SparseGrad};

/// The candidates of OVE and A&R: the label `y`, then `n` classes drawn uniformly from
/// `{0..k} \ {y}` (with replacement), into `out`.
fn draw_candidates(k: usize, y: ClassId, n: usize, rng: &mut Rng, out: &mut Vec<ClassId>) {
    out.clear();
    out.push(y);
    if k >= 2 {
        out.extend((0..n).map(|_| {
            let c = rng.random_range(0..k as ClassId - 1);
            if c >= y { c + 1 } else { c }
        }));
    }
}

/// [`draw_candidates`] for every sample of a batch over `n_classes` classes, from the
/// generators the one-process batch path gives its samples (a sample without a label draws
/// nothing): the [`ShardDraw`] of OVE and A&R.
fn draw_batch_candidates(n: usize, n_classes: usize, positives: &[&[ClassId]], rng: &mut Rng, out: &mut Vec<Drawn>) {
    draw_per_sample(positives, rng, out, |pos, r, drawn| {
        drawn.classes.clear();
        drawn.positives = 0;
        if let Some(&y) = pos.first() {
            draw_candidates(n_classes, y, n, r, &mut drawn.classes);
            drawn.positives = 1;
        }
        drawn.corrections.clear();
        drawn.corrections.resize(drawn.classes.len(), 0.0);
    });
}

/// The gaps `d_j = psi_j - psi_y` of the drawn negatives, from the candidates' scores `z`
/// (the label's first).
fn gaps(z: &[f32]) -> impl Iterator<Item = f64> + '_ {
    let psi_y = z.first().map_or(0.0, |&v| f64::from(v));
    z.iter().skip(1).map(move |&v| f64::from(v) - psi_y)
}

/// Writes `dL/dz_j = g(d_j)` for the negatives and `-sum_j g(d_j)` for the label (position 0).
fn fill_grad(grad: &mut [f32], z: &[f32], g: impl Fn(f64) -> f64) {
    let mut sum = 0.0;
    for (out, d) in grad[1..].iter_mut().zip(gaps(z)) {
        let v = g(d);
        sum += v;
        *out = v as f32;
    }
    grad[0] = -sum as f32;
}

/// One sample's estimate on its candidates, as the one-process path computes it: draws the
/// label `positives[0]` and `n` negatives with `rng`, scores them, evaluates
/// `loss(z, rng, grad, scratch)` (which may draw more from `rng`) and writes the gradient's
/// nonzeros by class (a probit gradient underflows to 0 far below the label). No positive:
/// nothing drawn, a zero estimate.
fn estimate_on_candidates(
    ctx: &Ctx,
    phi: &[f32],
    positives: &[ClassId],
    n: usize,
    rng: &mut Rng,
    out: &mut SparseGrad,
    loss: impl FnOnce(&[f32], &mut Rng, &mut [f32], &mut LossScratch) -> f32,
) -> Estimate {
    out.clear();
    let Some(&y) = positives.first() else { return Estimate::default() };
    SCRATCH.with_borrow_mut(|s| {
        draw_candidates(ctx.n_classes(), y, n, rng, &mut s.classes);
        s.z.clear();
        s.z.extend(s.classes.iter().map(|&c| ctx.score(c as usize, phi)));
        s.grad.clear();
        s.grad.resize(s.z.len(), 0.0);
        let l = loss(&s.z, rng, &mut s.grad, &mut s.loss);
        out.set_nonzero(&s.classes, &s.grad);
        Estimate { loss: l, classes_scored: s.classes.len() }
    })
}

/// Per-thread buffers of [`estimate_on_candidates`]: the candidates, their scores and
/// gradient, the loss's scratch.
#[derive(Default)]
struct CandidateScratch {
    classes: Vec<ClassId>,
    z: Vec<f32>,
    grad: Vec<f32>,
    loss: LossScratch,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<CandidateScratch> = std::cell::RefCell::new(CandidateScratch::default());
}

/// Runs `step` on the row of sample `id` in `state` and writes the row it returns back;
/// `step(None)` without a sample id (no state is read or written).
fn with_state<T, const W: usize>(
    state: &SampleState,
    id: Option<usize>,
    step: impl FnOnce(Option<[f64; W]>) -> (T, [f64; W]),
) -> T {
    let Some(id) = id else { return step(None).0 };
    let mut row = [0.0f32; W];
    state.read(id, &mut row);
    let (out, next) = step(Some(row.map(f64::from)));
    state.write(id, &next.map(|v| v as f32));
    out
}

/// The batch path of the estimators with per-sample state: for every sample `i` in parallel,
/// runs `step(i, Some(row), rng_i, grad_i)` on its row of `state` (at `batch.ids[i]`, written
/// back) with a generator seeded from one draw of `rng` and `i`.
fn with_sample_state<const W: usize>(
    name: &str,
    state: &SampleState,
    batch: Batch,
    rng: &mut Rng,
    out: &mut BatchGrad,
    step: impl Fn(usize, Option<[f64; W]>, &mut Rng, &mut SparseGrad) -> (Estimate, [f64; W]) + Sync + Send,
) -> BatchEstimate {
    assert_eq!(batch.ids.len(), batch.phi.rows(), "{name} keeps per-sample state: the batch needs sample ids");
    let seed = rng.next_u64();
    for_each_sample(out, batch.phi.rows(), |i, g| {
        let mut r = farout_core::rng::seeded(seed, i as u64);
        with_state(state, Some(batch.ids[i]), |row| step(i, row, &mut r, g))
    })
}

/// One A&R sample's local and global step on its candidates' scores `z` (the label's first),
/// with `c = (K-1)/|S|` and the sample's state (`None`: stateless), drawing from the sample's
/// generator: the loss, `dL/dz` into the gradient, and the new state.
type ArSampleLoss<const W: usize> = fn(f64, &[f32], Option<[f64; W]>, &mut Rng, &mut [f32]) -> (f32, [f64; W]);

/// An A&R estimator's step on one sample in one process: its label and `n` negatives drawn and
/// scored, then `loss`. Returns the estimate and the new state (`prev` without a label).
#[allow(clippy::too_many_arguments)]
fn ar_step<const W: usize>(
    ctx: &Ctx,
    phi: &[f32],
    positives: &[ClassId],
    n: usize,
    prev: Option<[f64; W]>,
    rng: &mut Rng,
    out: &mut SparseGrad,
    loss: ArSampleLoss<W>,
) -> (Estimate, [f64; W]) {
    let c = class_scale(ctx.n_classes(), n);
    let mut next = prev.unwrap_or([0.0; W]);
    let e = estimate_on_candidates(ctx, phi, positives, n, rng, out, |z, rng, grad, _| {
        let (l, state) = loss(c, z, prev, rng, grad);
        next = state;
        l
    });
    (e, next)
}

/// An A&R estimator's [`DrawnLoss`]: `loss` on the sample's state (`id`) with `c = scale`,
/// drawing from the sample's generator after its candidates, as [`ar_step`] does in one
/// process. Loss 0 without a label (or without `scale`: no shard plan).
fn ar_drawn_loss<const W: usize>(
    scale: Option<f64>,
    state: &SampleState,
    id: Option<usize>,
    drawn: &Drawn,
    z: &[f32],
    grad: &mut [f32],
    loss: ArSampleLoss<W>,
) -> f32 {
    grad.fill(0.0);
    let Some(c) = scale.filter(|_| drawn.positives > 0) else { return 0.0 };
    let mut rng = drawn.rng.clone().expect("A&R's draws keep every sample's generator");
    with_state(state, id, |prev| loss(c, z, prev, &mut rng, grad))
}

/// The importance weight `(K-1)/|S|` of one drawn negative.
fn class_scale(k: usize, n: usize) -> f64 {
    (k.saturating_sub(1)) as f64 / n as f64
}

fn check_samples(n: usize) -> Result<(), crate::Error> {
    crate::at_least_one("n_samples", n, "the bound needs at least one sampled negative class")
}

/// One-vs-Each bound (Titsias 2016; eq. 10 of the A&R paper), a lower bound on the softmax
/// log-likelihood: `L_OVE = sum_{k != y} log sigma(psi_y - psi_k)`, estimated with `|S|`
/// uniform negatives: `-L ≈ c sum_{j in S} softplus(psi_j - psi_y)`, whose gradient is
/// `dL/dpsi_j = c sigma(psi_j - psi_y)`, `dL/dpsi_y = -sum_j` (negatives weighted by how
/// strongly they beat the label). Unbiased for the bound and its gradient; cost `|S| + 1`.
#[derive(Clone, Debug)]
pub struct Ove {
    n_samples: usize,
    /// The loss on drawn candidates, once the number of classes is known: what a class-sharded
    /// layer evaluates ([`Ove::with_classes`]).
    loss: Option<OneVsEach>,
}

impl Ove {
    /// `n_samples` negatives per sample.
    pub fn new(n_samples: usize) -> Result<Self, crate::Error> {
        check_samples(n_samples)?;
        Ok(Self { n_samples, loss: None })
    }

    /// The same estimator for a layer of `n_classes` classes, which then also trains with its
    /// classes split over ranks ([`GradientEstimator::shard_plan`]).
    pub fn with_classes(mut self, n_classes: usize) -> Self {
        self.loss = Some(OneVsEach { scale: class_scale(n_classes, self.n_samples) });
        self
    }
}

/// OVE's estimate as a loss on its candidates: position `y = positives[0]` is the label, every
/// other position a drawn negative, `L = c sum_j softplus(z_j - z_y)`,
/// `dL/dz_j = c sigma(z_j - z_y)`, `dL/dz_y = -sum_j`. No positive: loss 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OneVsEach {
    /// `c = (K - 1)/|S|`.
    pub scale: f64,
}

impl Loss for OneVsEach {
    fn name(&self) -> &'static str {
        "one_vs_each"
    }

    fn value_and_grad(&self, z: &[f32], positives: &[ClassId], grad: &mut [f32], _: &mut LossScratch) -> f32 {
        grad.fill(0.0);
        let Some(&y) = positives.first() else { return 0.0 };
        let (y, psi_y) = (y as usize, f64::from(z[y as usize]));
        let (mut loss, mut sum) = (0.0f64, 0.0f64);
        for (j, (&z, g)) in z.iter().zip(grad.iter_mut()).enumerate() {
            if j != y {
                let d = f64::from(z) - psi_y;
                let v = self.scale * sigmoid(d);
                loss += softplus(d);
                sum += v;
                *g = v as f32;
            }
        }
        grad[y] = -sum as f32;
        (self.scale * loss) as f32
    }

    fn sparse_gradient(&self) -> bool {
        true
    }
}

impl ShardDraw for Ove {
    /// The draws of [`GradientEstimator::estimate_batch`]: per sample, a generator seeded from
    /// one draw of `rng`; the label `y` first, then `n_samples` uniform classes other than `y`.
    fn draw_batch(&self, n_classes: usize, positives: &[&[ClassId]], rng: &mut Rng, out: &mut Vec<Drawn>) {
        draw_batch_candidates(self.n_samples, n_classes, positives, rng, out);
    }
}

impl GradientEstimator for Ove {
    fn name(&self) -> &'static str {
        "ove"
    }

    fn single_label(&self) -> bool {
        true
    }

    /// With [`Ove::with_classes`]: the same draws on every rank, each class scored by its owner.
    fn shard_plan(&self) -> Option<ShardPlan<'_>> {
        self.loss.as_ref().map(|loss| ShardPlan::Draw { draw: self, loss })
    }

    fn estimate(&self, ctx: &Ctx, phi: &[f32], positives: &[ClassId], rng: &mut Rng, out: &mut SparseGrad) -> Estimate {
        let loss = OneVsEach { scale: class_scale(ctx.n_classes(), self.n_samples) };
        estimate_on_candidates(ctx, phi, positives, self.n_samples, rng, out, |z, _, grad, scratch| {
            loss.value_and_grad(z, &[0], grad, scratch)
        })
    }
}

/// Softmax A&R, Algorithm 1 of the A&R paper. With Gumbel noise the optimal `q(eps)` is
/// `Gumbel(log eta, 1)` and the ELBO is (eq. 8)
///
/// `L(eta) = 1 - log eta - (1/eta) (1 + sum_{k != y} exp(psi_k - psi_y))`,
///
/// tight at `eta* = 1 + sum_{k != y} exp(psi_k - psi_y)` (then `L = log p(y)`). Each sample
/// keeps its own `eta` (initialised to 1) across epochs. Per visit `t` of a sample:
/// - local step: `eta_hat = 1 + c sum_{j in S} exp(psi_j - psi_y)`,
///   `eta <- (1 - a) eta + a eta_hat` with `a = (1 + t)^-0.9`;
/// - global step (with the new `eta`): `dL/dpsi_j = (c / eta) exp(psi_j - psi_y)`,
///   `dL/dpsi_y = -sum_j`, unbiased for the gradient of `-L(eta)` (tested).
///
/// `eta` is kept as `log eta` so that large score gaps cannot overflow. Without a sample id
/// ([`GradientEstimator::estimate`]) the local step is taken with `a = 1` (`eta = eta_hat`),
/// which makes the loss `log eta_hat`, the sampled estimate of the softmax loss.
#[derive(Debug)]
pub struct ArSoftmax {
    n_samples: usize,
    /// Per sample: `[log eta, visits]`.
    state: SampleState,
    /// `c = (K - 1)/|S|` once the number of classes is known ([`ArSoftmax::with_classes`]).
    scale: Option<f64>,
}

impl ArSoftmax {
    /// `n_samples` negatives per sample, state for `n_data` training samples.
    pub fn new(n_samples: usize, n_data: usize) -> Result<Self, crate::Error> {
        check_samples(n_samples)?;
        Ok(Self { n_samples, state: SampleState::new(n_data, &[0.0, 0.0]), scale: None })
    }

    /// The same estimator for a layer of `n_classes` classes, which then also trains with its
    /// classes split over ranks ([`GradientEstimator::shard_plan`]).
    pub fn with_classes(mut self, n_classes: usize) -> Self {
        self.scale = Some(class_scale(n_classes, self.n_samples));
        self
    }

    /// One sample on its candidates' scores `z` (the label's first) with `c = (K-1)/|S|`:
    /// local step on `log eta` (from `prev`, `None` = stateless), then the global gradient
    /// into `grad` (no draws). Returns the loss and the new `(log eta, visits)`.
    fn sample_loss(c: f64, z: &[f32], prev: Option<[f64; 2]>, _: &mut Rng, grad: &mut [f32]) -> (f32, [f64; 2]) {
        // log eta_hat = log(1 + c sum_j exp(d_j)) = softplus(log c + logsumexp(d)).
        let m = gaps(z).fold(f64::NEG_INFINITY, f64::max);
        let lse = if z.len() < 2 { f64::NEG_INFINITY } else { m + gaps(z).map(|d| (d - m).exp()).sum::<f64>().ln() };
        let log_eta_hat = softplus(c.ln() + lse);
        // Without state (`prev = None`) the local step takes a = 1: eta = eta_hat.
        let [log_eta, visits] = match prev {
            Some([log_eta, visits]) => {
                let t = visits + 1.0;
                let a = (1.0 + t).powf(-0.9);
                [log_add_exp((1.0 - a).ln() + log_eta, a.ln() + log_eta_hat), t]
            }
            None => [log_eta_hat, 0.0],
        };
        Self::global_step(grad, z, c, log_eta);
        let elbo = 1.0 - log_eta - (log_eta_hat - log_eta).exp();
        (-elbo as f32, [log_eta, visits])
    }

    /// The global step given `eta`: `dL/dpsi_j = (c / eta) exp(psi_j - psi_y)`.
    fn global_step(grad: &mut [f32], z: &[f32], c: f64, log_eta: f64) {
        fill_grad(grad, z, |d| c * (d - log_eta).exp());
    }
}

/// `log(e^a + e^b)`.
fn log_add_exp(a: f64, b: f64) -> f64 {
    let m = a.max(b);
    if m == f64::NEG_INFINITY { m } else { m + ((a - m).exp() + (b - m).exp()).ln() }
}

impl ShardDraw for ArSoftmax {
    /// The draws of [`GradientEstimator::estimate_batch`], as OVE's.
    fn draw_batch(&self, n_classes: usize, positives: &[&[ClassId]], rng: &mut Rng, out: &mut Vec<Drawn>) {
        draw_batch_candidates(self.n_samples, n_classes, positives, rng, out);
    }
}

impl DrawnLoss for ArSoftmax {
    /// [`ArSoftmax::sample_loss`] on the sample's state (`id`), as the one-process step.
    fn drawn_value_and_grad(
        &self,
        id: Option<usize>,
        drawn: &Drawn,
        z: &[f32],
        _: &[ClassId],
        grad: &mut [f32],
        _: &mut LossScratch,
    ) -> f32 {
        ar_drawn_loss(self.scale, &self.state, id, drawn, z, grad, Self::sample_loss)
    }
}

impl GradientEstimator for ArSoftmax {
    fn name(&self) -> &'static str {
        "ar_softmax"
    }

    fn single_label(&self) -> bool {
        true
    }

    fn sample_state(&self) -> Option<&SampleState> {
        Some(&self.state)
    }

    /// With [`ArSoftmax::with_classes`]: the same draws on every rank, each class scored by its
    /// owner, and every rank's copy of the per-sample state updated alike.
    fn shard_plan(&self) -> Option<ShardPlan<'_>> {
        self.scale.map(|_| ShardPlan::Draw { draw: self, loss: self })
    }

    fn estimate(&self, ctx: &Ctx, phi: &[f32], positives: &[ClassId], rng: &mut Rng, out: &mut SparseGrad) -> Estimate {
        ar_step(ctx, phi, positives, self.n_samples, None, rng, out, Self::sample_loss).0
    }

    fn estimate_batch(&self, ctx: &Ctx, batch: Batch, rng: &mut Rng, out: &mut BatchGrad) -> BatchEstimate {
        with_sample_state(self.name(), &self.state, batch, rng, out, |i, prev, r, g| {
            ar_step(ctx, batch.phi.row(i), batch.positives[i], self.n_samples, prev, r, g, Self::sample_loss)
        })
    }
}

/// The noise of a random-utility model: density `phi`, CDF `Phi`, and what A&R's
/// reparameterised steps need of them.
pub trait Noise: Send + Sync + 'static {
    /// Config name of the A&R estimator for this noise.
    const NAME: &'static str;
    /// `log phi(x)`.
    fn log_pdf(x: f64) -> f64;
    /// `d/dx log phi(x)`.
    fn dlog_pdf(x: f64) -> f64;
    /// `log Phi(x)`.
    fn log_cdf(x: f64) -> f64;
    /// `d/dx log Phi(x) = phi(x) / Phi(x)`.
    fn dlog_cdf(x: f64) -> f64;
    /// A standard draw `u` (the variational `q` is `mu + scale * u`).
    fn standard(rng: &mut Rng) -> f64;
    /// Entropy of `mu + scale * u`.
    fn entropy(scale: f64) -> f64;
}

/// Standard Gaussian noise: the multinomial probit.
#[derive(Clone, Copy, Debug)]
pub struct Gaussian;

const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

impl Noise for Gaussian {
    const NAME: &'static str = "ar_probit";

    fn log_pdf(x: f64) -> f64 {
        -0.5 * x * x - LN_SQRT_2PI
    }
    fn dlog_pdf(x: f64) -> f64 {
        -x
    }
    fn log_cdf(x: f64) -> f64 {
        if x > -30.0 {
            (0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)).ln()
        } else {
            // Mills-ratio asymptotics: Phi(x) ~ phi(x)/(-x) (1 - 1/x^2 + 3/x^4).
            let x2 = x * x;
            Self::log_pdf(x) - (-x).ln() + (1.0 - 1.0 / x2 + 3.0 / (x2 * x2)).ln()
        }
    }
    fn dlog_cdf(x: f64) -> f64 {
        if x > -30.0 {
            (Self::log_pdf(x) - Self::log_cdf(x)).exp()
        } else {
            let x2 = x * x;
            -x / (1.0 - 1.0 / x2 + 3.0 / (x2 * x2))
        }
    }
    fn standard(rng: &mut Rng) -> f64 {
        farout_core::rng::normal(rng) as f64
    }
    fn entropy(scale: f64) -> f64 {
        0.5 + LN_SQRT_2PI + scale.ln()
    }
}

/// Standard logistic noise: the multinomial logistic.
#[derive(Clone, Copy, Debug)]
pub struct Logistic;

impl Noise for Logistic {
    const NAME: &'static str = "ar_logistic";

    fn log_pdf(x: f64) -> f64 {
        -softplus(-x) - softplus(x)
    }
    fn dlog_pdf(x: f64) -> f64 {
        1.0 - 2.0 * sigmoid(x)
    }
    fn log_cdf(x: f64) -> f64 {
        -softplus(-x)
    }
    fn dlog_cdf(x: f64) -> f64 {
        sigmoid(-x)
    }
    fn standard(rng: &mut Rng) -> f64 {
        let v: f64 = rng.random::<f64>().clamp(1e-300, 1.0 - 1e-16);
        v.ln() - (-v).ln_1p()
    }
    fn entropy(scale: f64) -> f64 {
        scale.ln() + 2.0
    }
}

/// A&R for a general random-utility model, Algorithm 2 of the A&R paper (multinomial probit
/// with [`Gaussian`] noise, multinomial logistic with [`Logistic`] noise).
///
/// `q(eps) = mu + sigma u` with `u` standard noise and `sigma = softplus(gamma)`; each sample
/// keeps `(mu, gamma)` (initialised to `(0, softplus^-1(1))`). With the reduced log-joint
/// `log p~(y, eps) = log phi(eps) + c sum_{j in S} log Phi(eps + psi_y - psi_j)`, per visit `t`:
/// - local step (reparameterised, eq. 9): `g_eps = d/d eps log p~`,
///   `mu += a g_eps`, `gamma += a (g_eps u + 1/sigma) sigmoid(gamma)`, `a = 0.01 (1+t)^-0.9`;
/// - global step with a fresh `eps ~ q`: `dL/dpsi_j = c Phi'/Phi(eps + psi_y - psi_j)`,
///   `dL/dpsi_y = -sum_j`;
/// - loss: `-(log phi(eps) + H[q] + c sum_j log Phi(eps + psi_y - psi_j))`, a one-sample
///   estimate of `-ELBO` (eq. 7).
#[derive(Debug)]
pub struct ArUtility<N: Noise> {
    n_samples: usize,
    /// Per sample: `[mu, gamma, visits]`.
    state: SampleState,
    /// `c = (K - 1)/|S|` once the number of classes is known ([`ArUtility::with_classes`]).
    scale: Option<f64>,
    noise: std::marker::PhantomData<N>,
}

/// `gamma` with `softplus(gamma) = 1`.
const GAMMA_UNIT: f32 = 0.541_324_85;

impl<N: Noise> ArUtility<N> {
    /// `n_samples` negatives per sample, state for `n_data` training samples.
    pub fn new(n_samples: usize, n_data: usize) -> Result<Self, crate::Error> {
        check_samples(n_samples)?;
        Ok(Self {
            n_samples,
            state: SampleState::new(n_data, &[0.0, GAMMA_UNIT, 0.0]),
            scale: None,
            noise: std::marker::PhantomData,
        })
    }

    /// The same estimator for a layer of `n_classes` classes, which then also trains with its
    /// classes split over ranks ([`GradientEstimator::shard_plan`]).
    pub fn with_classes(mut self, n_classes: usize) -> Self {
        self.scale = Some(class_scale(n_classes, self.n_samples));
        self
    }

    /// The reparameterised one-sample gradient of the ELBO in `(mu, gamma)` (eq. 9) for the
    /// standard draw `u`, on the candidates' scores `z` (the label's first).
    fn local_gradient(z: &[f32], c: f64, mu: f64, gamma: f64, u: f64) -> (f64, f64) {
        let sigma = softplus(gamma);
        let eps = mu + sigma * u;
        let g_eps = N::dlog_pdf(eps) + c * gaps(z).map(|d| N::dlog_cdf(eps - d)).sum::<f64>();
        // d eps/d mu = 1; d eps/d gamma = u sigmoid(gamma); dH/d gamma = sigmoid(gamma) / sigma.
        (g_eps, (g_eps * u + 1.0 / sigma) * sigmoid(gamma))
    }

    /// One sample on its candidates' scores `z` (the label's first) with `c = (K-1)/|S|`: the
    /// local step on `(mu, gamma)` from `prev` (`None`: the initial `q`, no local step), then
    /// the global gradient into `grad` with a fresh `eps ~ q`; both draw from `rng`. Returns
    /// the loss and the new `(mu, gamma, visits)`.
    fn sample_loss(c: f64, z: &[f32], prev: Option<[f64; 3]>, rng: &mut Rng, grad: &mut [f32]) -> (f32, [f64; 3]) {
        let [mut mu, mut gamma, mut visits] = prev.unwrap_or([0.0, GAMMA_UNIT as f64, 0.0]);
        if prev.is_some() {
            visits += 1.0;
            let a = 0.01 * (1.0 + visits).powf(-0.9);
            let (g_mu, g_gamma) = Self::local_gradient(z, c, mu, gamma, N::standard(rng));
            mu += a * g_mu;
            gamma += a * g_gamma;
        }
        let sigma = softplus(gamma);
        let eps = mu + sigma * N::standard(rng);
        fill_grad(grad, z, |d| c * N::dlog_cdf(eps - d));
        let elbo = N::log_pdf(eps) + N::entropy(sigma) + c * gaps(z).map(|d| N::log_cdf(eps - d)).sum::<f64>();
        (-elbo as f32, [mu, gamma, visits])
    }
}

impl<N: Noise> ShardDraw for ArUtility<N> {
    /// The draws of [`GradientEstimator::estimate_batch`], as OVE's.
    fn draw_batch(&self, n_classes: usize, positives: &[&[ClassId]], rng: &mut Rng, out: &mut Vec<Drawn>) {
        draw_batch_candidates(self.n_samples, n_classes, positives, rng, out);
    }
}

impl<N: Noise> DrawnLoss for ArUtility<N> {
    /// [`ArUtility::sample_loss`] on the sample's state (`id`), its noise drawn from the
    /// sample's generator after its candidates, as the one-process step.
    fn drawn_value_and_grad(
        &self,
        id: Option<usize>,
        drawn: &Drawn,
        z: &[f32],
        _: &[ClassId],
        grad: &mut [f32],
        _: &mut LossScratch,
    ) -> f32 {
        ar_drawn_loss(self.scale, &self.state, id, drawn, z, grad, Self::sample_loss)
    }
}

impl<N: Noise> GradientEstimator for ArUtility<N> {
    fn name(&self) -> &'static str {
        N::NAME
    }

    fn single_label(&self) -> bool {
        true
    }

    fn sample_state(&self) -> Option<&SampleState> {
        Some(&self.state)
    }

    /// With [`ArUtility::with_classes`]: the same draws on every rank, each class scored by its
    /// owner, and every rank's copy of the per-sample state updated alike.
    fn shard_plan(&self) -> Option<ShardPlan<'_>> {
        self.scale.map(|_| ShardPlan::Draw { draw: self, loss: self })
    }

    /// Without a sample id: the initial `q` (`mu = 0, sigma = 1`), no local step.
    fn estimate(&self, ctx: &Ctx, phi: &[f32], positives: &[ClassId], rng: &mut Rng, out: &mut SparseGrad) -> Estimate {
        ar_step(ctx, phi, positives, self.n_samples, None, rng, out, Self::sample_loss).0
    }

    fn estimate_batch(&self, ctx: &Ctx, batch: Batch, rng: &mut Rng, out: &mut BatchGrad) -> BatchEstimate {
        with_sample_state(N::NAME, &self.state, batch, rng, out, |i, prev, r, g| {
            ar_step(ctx, batch.phi.row(i), batch.positives[i], self.n_samples, prev, r, g, Self::sample_loss)
        })
    }
}

/// The multinomial probit A&R estimator.
pub type ArProbit = ArUtility<Gaussian>;
/// The multinomial logistic A&R estimator.
pub type ArLogistic = ArUtility<Logistic>;

/// `log p(y | psi)` of the random-utility model with noise `N` (eq. 5), by the trapezoid rule
/// over `eps` in log space: the integrand `phi(eps) prod_{k != y} Phi(eps + psi_y - psi_k)` is
/// smooth on the scale of one, so a step of 0.02 over a range that covers the noise density
/// and the largest score gap is exact to many digits (tested against the softmax for Gumbel
/// noise). Cost O(K x grid); meant for evaluation.
pub fn utility_log_prob<N: Noise>(psi: &[f32], y: usize) -> f64 {
    let psi_y = psi[y] as f64;
    let gap = psi.iter().map(|&p| p as f64 - psi_y).fold(0.0f64, f64::max);
    let (lo, hi) = (-40.0, gap + 40.0);
    let h = 0.02;
    let steps = ((hi - lo) / h).ceil() as usize;
    let mut terms = Vec::with_capacity(steps + 1);
    for i in 0..=steps {
        let eps = lo + i as f64 * h;
        let mut v = N::log_pdf(eps);
        for (k, &p) in psi.iter().enumerate() {
            if k != y {
                v += N::log_cdf(eps + psi_y - p as f64);
            }
        }
        let w: f64 = if i == 0 || i == steps { 0.5 } else { 1.0 };
        terms.push(v + w.ln());
    }
    let m = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    m + terms.iter().map(|t| (t - m).exp()).sum::<f64>().ln() + h.ln()
}

/// The softmax A&R bound (eq. 8) with every class: `1 - log eta - (1/eta)(1 + sum_{k != y}
/// exp(psi_k - psi_y))`, for evaluation and tests.
pub fn softmax_elbo(psi: &[f32], y: usize, log_eta: f64) -> f64 {
    let psi_y = psi[y] as f64;
    let sum: f64 = psi.iter().enumerate().filter(|&(k, _)| k != y).map(|(_, &p)| (p as f64 - psi_y).exp()).sum();
    1.0 - log_eta - (1.0 + sum) / log_eta.exp()
}

/// The One-vs-Each bound (eq. 10) with every class.
pub fn ove_bound(psi: &[f32], y: usize) -> f64 {
    let psi_y = psi[y] as f64;
    -psi.iter().enumerate().filter(|&(k, _)| k != y).map(|(_, &p)| softplus(p as f64 - psi_y)).sum::<f64>()
}

/// Declares the parameters of a sampling estimator of the softmax that only needs its number
/// of negatives: a [`Negatives`] (`n_samples`, `sample_fraction`) and how to build it.
macro_rules! negatives_config {
    ($(#[doc = $doc:literal])* $name:ident => |$n:ident, $problem:ident| $build:expr) => {
        $(#[doc = $doc])*
        #[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Negatives);

        impl EstimatorParams for $name {
            fn check(&self) -> Result<(), farout_core::ParamError> {
                self.0.check()
            }

            fn loss(&self) -> Result<ExactLoss, crate::Error> {
                Ok(ExactLoss::Softmax)
            }

            fn build(&self, $problem: &Problem) -> Result<Built, crate::Error> {
                let $n = self.0.count($problem.n_classes)?;
                Ok(Built::sampling(Box::new($build), ExactLoss::Softmax))
            }
        }
    };
}

negatives_config!(
    /// `[output] estimator = "ove"`.
    OveConfig => |n, problem| Ove::new(n)?.with_classes(problem.n_classes)
);
negatives_config!(
    /// `[output] estimator = "ar_softmax"`.
    ArSoftmaxConfig => |n, problem| ArSoftmax::new(n, problem.n_data)?.with_classes(problem.n_classes)
);
negatives_config!(
    /// `[output] estimator = "ar_probit"`.
    ArProbitConfig => |n, problem| ArProbit::new(n, problem.n_data)?.with_classes(problem.n_classes)
);
negatives_config!(
    /// `[output] estimator = "ar_logistic"`.
    ArLogisticConfig => |n, problem| ArLogistic::new(n, problem.n_data)?.with_classes(problem.n_classes)
);

#[cfg(test)]
mod tests {
    use super::*;
    use farout_core::{Matrix, rng};

    /// A K x 1 layer whose scores are its biases (phi = [0]): psi is set directly.
    fn layer(psi: &[f32]) -> (Matrix, Vec<f32>) {
        (Matrix::zeros(psi.len(), 1), psi.to_vec())
    }

    /// The label `y` and `n` uniform negatives of a layer whose scores are its biases, with their
    /// scores (the label's first).
    fn drawn_scores(ctx: &Ctx, y: ClassId, n: usize, r: &mut Rng) -> (Vec<ClassId>, Vec<f32>) {
        let mut classes = Vec::new();
        draw_candidates(ctx.n_classes(), y, n, r, &mut classes);
        let z = classes.iter().map(|&c| ctx.score(c as usize, &[0.0])).collect();
        (classes, z)
    }

    fn random_psi(k: usize, spread: f32, seed: u64) -> Vec<f32> {
        let mut r = rng::seeded(seed, 0);
        (0..k).map(|_| spread * rng::normal(&mut r)).collect()
    }

    fn log_softmax(psi: &[f32], y: usize) -> f64 {
        let m = psi.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        psi[y] as f64 - m - psi.iter().map(|&p| (p as f64 - m).exp()).sum::<f64>().ln()
    }

    /// Mean and standard error of each class's gradient over `seeds` estimates.
    fn gradient_moments(k: usize, seeds: u64, mut f: impl FnMut(&mut Rng, &mut SparseGrad)) -> (Vec<f64>, Vec<f64>) {
        let (mut s1, mut s2) = (vec![0.0f64; k], vec![0.0f64; k]);
        let mut g = SparseGrad::new();
        let mut dense = vec![0.0f64; k];
        for seed in 0..seeds {
            f(&mut rng::seeded(seed, 99), &mut g);
            dense.fill(0.0);
            for (c, v) in g.iter() {
                dense[c as usize] += v as f64;
            }
            for j in 0..k {
                s1[j] += dense[j];
                s2[j] += dense[j] * dense[j];
            }
        }
        let n = seeds as f64;
        let mean: Vec<f64> = s1.iter().map(|v| v / n).collect();
        let se = s2.iter().zip(&mean).map(|(v, m)| ((v / n - m * m).max(0.0) / n).sqrt()).collect();
        (mean, se)
    }

    /// Every coordinate within 5 standard errors (plus 1e-9 for coordinates without variance).
    fn assert_unbiased(mean: &[f64], se: &[f64], exact: &[f64], what: &str) {
        for j in 0..exact.len() {
            assert!(
                (mean[j] - exact[j]).abs() <= 5.0 * se[j] + 1e-9,
                "{what}, class {j}: mean {} vs exact {} (se {})",
                mean[j],
                exact[j],
                se[j]
            );
        }
    }

    #[test]
    fn softmax_bound_is_tight_at_eta_star_and_below_elsewhere() {
        for seed in 0..20 {
            let psi = random_psi(200, 2.0, seed);
            let y = (seed as usize * 13) % 200;
            let eta_star: f64 = 1.0
                + psi
                    .iter()
                    .enumerate()
                    .filter(|&(k, _)| k != y)
                    .map(|(_, &p)| (p as f64 - psi[y] as f64).exp())
                    .sum::<f64>();
            let log_p = log_softmax(&psi, y);
            assert!((softmax_elbo(&psi, y, eta_star.ln()) - log_p).abs() < 1e-9 * log_p.abs().max(1.0));
            for f in [0.3f64, 0.9, 1.1, 4.0] {
                assert!(softmax_elbo(&psi, y, (f * eta_star).ln()) < log_p);
            }
            assert!(ove_bound(&psi, y) < log_p, "OVE is a lower bound too");
        }
    }

    #[test]
    fn ar_softmax_global_step_is_unbiased_for_its_elbo_given_eta() {
        // Given eta, E_S[(c/eta) exp(psi_j - psi_y)] summed over draws = the exact gradient of
        // -L(eta): (1/eta) exp(psi_k - psi_y) for k != y and minus their sum for y.
        let k = 40;
        let psi = random_psi(k, 1.5, 1);
        let (w, b) = layer(&psi);
        let ctx = Ctx::new(&w, Some(&b));
        let (y, n, log_eta) = (7u32, 5, 1.3f64);
        let c = class_scale(k, n);
        let (mean, se) = gradient_moments(k, 40_000, |r, g| {
            let (classes, z) = drawn_scores(&ctx, y, n, r);
            let mut grad = vec![0.0; z.len()];
            ArSoftmax::global_step(&mut grad, &z, c, log_eta);
            g.clear();
            classes.iter().zip(&grad).for_each(|(&c, &v)| g.push(c, v));
        });
        let mut exact: Vec<f64> = psi.iter().map(|&p| (p as f64 - psi[y as usize] as f64 - log_eta).exp()).collect();
        exact[y as usize] = 0.0;
        exact[y as usize] = -exact.iter().sum::<f64>();
        assert_unbiased(&mean, &se, &exact, "ar_softmax");
    }

    #[test]
    fn ove_gradient_and_bound_estimates_are_unbiased() {
        let k = 40;
        let psi = random_psi(k, 1.5, 2);
        let (w, b) = layer(&psi);
        let ctx = Ctx::new(&w, Some(&b));
        let (y, n) = (3u32, 4);
        let est = Ove::new(n).unwrap();
        let mut loss_sum = 0.0;
        let (mean, se) =
            gradient_moments(k, 40_000, |r, g| loss_sum += est.estimate(&ctx, &[0.0], &[y], r, g).loss as f64);
        let mut exact: Vec<f64> = psi.iter().map(|&p| sigmoid(p as f64 - psi[y as usize] as f64)).collect();
        exact[y as usize] = 0.0;
        exact[y as usize] = -exact.iter().sum::<f64>();
        assert_unbiased(&mean, &se, &exact, "ove");
        let bound = -ove_bound(&psi, y as usize);
        assert!(
            (loss_sum / 40_000.0 - bound).abs() < 0.02 * bound,
            "mean loss {} vs -L_OVE {bound}",
            loss_sum / 40_000.0
        );
    }

    /// Gumbel noise: the random-utility model it defines is the softmax.
    struct Gumbel;
    impl Noise for Gumbel {
        const NAME: &'static str = "gumbel";
        fn log_pdf(x: f64) -> f64 {
            -x - (-x).exp()
        }
        fn dlog_pdf(x: f64) -> f64 {
            -1.0 + (-x).exp()
        }
        fn log_cdf(x: f64) -> f64 {
            -(-x).exp()
        }
        fn dlog_cdf(x: f64) -> f64 {
            (-x).exp()
        }
        fn standard(_: &mut Rng) -> f64 {
            unreachable!()
        }
        fn entropy(_: f64) -> f64 {
            unreachable!()
        }
    }

    #[test]
    fn utility_quadrature_recovers_the_softmax_and_normalises() {
        let psi = random_psi(30, 2.0, 5);
        for y in [0, 7, 29] {
            let (q, e) = (utility_log_prob::<Gumbel>(&psi, y), log_softmax(&psi, y));
            assert!((q - e).abs() < 1e-6, "Gumbel quadrature {q} vs softmax {e}");
        }
        let total_probit: f64 = (0..30).map(|y| utility_log_prob::<Gaussian>(&psi, y).exp()).sum();
        let total_logistic: f64 = (0..30).map(|y| utility_log_prob::<Logistic>(&psi, y).exp()).sum();
        assert!(
            (total_probit - 1.0).abs() < 1e-6 && (total_logistic - 1.0).abs() < 1e-6,
            "{total_probit} {total_logistic}"
        );
    }

    #[test]
    fn noise_derivatives_match_finite_differences() {
        fn check<N: Noise>() {
            for x in [-45.0, -31.0, -29.0, -5.0, -0.3, 0.0, 0.7, 6.0, 35.0] {
                let h = 1e-5;
                let fd_pdf = (N::log_pdf(x + h) - N::log_pdf(x - h)) / (2.0 * h);
                let fd_cdf = (N::log_cdf(x + h) - N::log_cdf(x - h)) / (2.0 * h);
                assert!((fd_pdf - N::dlog_pdf(x)).abs() < 1e-4 * (1.0 + fd_pdf.abs()), "{} pdf at {x}", N::NAME);
                assert!(
                    (fd_cdf - N::dlog_cdf(x)).abs() < 1e-3 * (1.0 + fd_cdf.abs()),
                    "{} cdf at {x}: {fd_cdf} vs {}",
                    N::NAME,
                    N::dlog_cdf(x)
                );
                assert!(N::log_cdf(x) <= 0.0 && N::log_cdf(x).is_finite());
            }
        }
        check::<Gaussian>();
        check::<Logistic>();
    }

    /// ELBO of `q = mu + sigma u` for one sample with every class (quadrature over `u`).
    fn utility_elbo<N: Noise>(psi: &[f32], y: usize, mu: f64, sigma: f64) -> f64 {
        let h = 0.01;
        let mut total = 0.0;
        let mut mass = 0.0;
        let mut u = -40.0;
        while u <= 40.0 {
            let w = N::log_pdf(u).exp() * h;
            let eps = mu + sigma * u;
            let mut f = N::log_pdf(eps);
            for (k, &p) in psi.iter().enumerate() {
                if k != y {
                    f += N::log_cdf(eps + psi[y] as f64 - p as f64);
                }
            }
            total += w * f;
            mass += w;
            u += h;
        }
        total / mass + N::entropy(sigma)
    }

    fn local_steps_tighten_the_bound<N: Noise>() {
        // One sample, fixed scores: repeated visits (local steps only move q) must raise the
        // exact ELBO from its initial value towards log p(y), staying below it.
        let k = 50;
        let psi = random_psi(k, 1.0, 9);
        let y = 4usize;
        let (w, b) = layer(&psi);
        let ctx = Ctx::new(&w, Some(&b));
        let est = ArUtility::<N>::new(10, 1).unwrap();
        let phi = Matrix::zeros(1, 1);
        let pos = [y as u32];
        let refs: Vec<&[u32]> = vec![&pos];
        let mut bg = BatchGrad::default();
        let initial = utility_elbo::<N>(&psi, y, 0.0, 1.0);
        for step in 0..20_000u64 {
            est.estimate_batch(&ctx, Batch::new(&phi, &refs).with_ids(&[0]), &mut rng::seeded(step, 0), &mut bg);
        }
        let mut s = [0.0f32; 3];
        est.sample_state().unwrap().read(0, &mut s);
        let fitted = utility_elbo::<N>(&psi, y, s[0] as f64, softplus(s[1] as f64));
        let log_p = utility_log_prob::<N>(&psi, y);
        assert!(fitted <= log_p + 1e-6, "{}: ELBO {fitted} above log p {log_p}", N::NAME);
        assert!(
            fitted > initial && log_p - fitted < 0.5 * (log_p - initial),
            "{}: initial {initial}, fitted {fitted}, log p {log_p}, state {s:?}",
            N::NAME
        );
    }

    fn local_gradient_is_unbiased<N: Noise>() {
        // E_{u,S}[local gradient] = the gradient of the exact ELBO (all classes, quadrature) in
        // (mu, gamma), by central differences; 5 standard errors over 200k draws.
        let k = 20;
        let psi = random_psi(k, 1.0, 12);
        let (w, b) = layer(&psi);
        let ctx = Ctx::new(&w, Some(&b));
        let (y, n, mu, gamma) = (2u32, 4, 0.7, -0.2);
        let c = class_scale(k, n);
        let draws = 200_000;
        let (mut s1, mut s2) = ([0.0f64; 2], [0.0f64; 2]);
        let mut r = rng::seeded(21, 0);
        for _ in 0..draws {
            let (_, z) = drawn_scores(&ctx, y, n, &mut r);
            let (gm, gg) = ArUtility::<N>::local_gradient(&z, c, mu, gamma, N::standard(&mut r));
            for (j, v) in [gm, gg].into_iter().enumerate() {
                s1[j] += v;
                s2[j] += v * v;
            }
        }
        let h = 1e-3;
        let elbo = |m: f64, g: f64| utility_elbo::<N>(&psi, y as usize, m, softplus(g));
        let exact = [
            (elbo(mu + h, gamma) - elbo(mu - h, gamma)) / (2.0 * h),
            (elbo(mu, gamma + h) - elbo(mu, gamma - h)) / (2.0 * h),
        ];
        for j in 0..2 {
            let mean = s1[j] / draws as f64;
            let se = ((s2[j] / draws as f64 - mean * mean) / draws as f64).sqrt();
            assert!(
                (mean - exact[j]).abs() <= 5.0 * se + 1e-4,
                "{} parameter {j}: mean {mean} vs exact {} (se {se})",
                N::NAME,
                exact[j]
            );
        }
    }

    #[test]
    fn probit_local_gradient_is_unbiased() {
        local_gradient_is_unbiased::<Gaussian>();
    }

    #[test]
    fn logistic_local_gradient_is_unbiased() {
        local_gradient_is_unbiased::<Logistic>();
    }

    #[test]
    fn probit_local_steps_tighten_the_bound() {
        local_steps_tighten_the_bound::<Gaussian>();
    }

    #[test]
    fn logistic_local_steps_tighten_the_bound() {
        local_steps_tighten_the_bound::<Logistic>();
    }

    #[test]
    fn ar_softmax_local_steps_reach_eta_star() {
        // Fixed scores, repeated visits: eta converges (Robbins-Monro) to eta*, where the
        // bound is tight.
        let k = 60;
        let psi = random_psi(k, 1.0, 4);
        let y = 10usize;
        let (w, b) = layer(&psi);
        let ctx = Ctx::new(&w, Some(&b));
        let est = ArSoftmax::new(8, 1).unwrap();
        let phi = Matrix::zeros(1, 1);
        let pos = [y as u32];
        let refs: Vec<&[u32]> = vec![&pos];
        let mut bg = BatchGrad::default();
        for step in 0..5_000u64 {
            est.estimate_batch(&ctx, Batch::new(&phi, &refs).with_ids(&[0]), &mut rng::seeded(step, 1), &mut bg);
        }
        let mut s = [0.0f32; 2];
        est.sample_state().unwrap().read(0, &mut s);
        let log_p = log_softmax(&psi, y);
        let gap = log_p - softmax_elbo(&psi, y, s[0] as f64);
        assert!((0.0..0.01).contains(&gap), "bound gap {gap} after 5000 visits (log eta {})", s[0]);
        assert_eq!(s[1], 5000.0, "visits are counted");
    }
}
