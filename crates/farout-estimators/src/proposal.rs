//! Where sampled classes come from (TensorFlow's candidate samplers), for
//! [`crate::SampledSoftmax`] and [`crate::NegativeSampling`]: a [`Proposal`] `Q` over the K
//! classes, and [`Draws`], one sample's draws with the expected count of each class.
//!
//! ```text
//! uniform       Q(k) = 1/K
//! log_uniform   Q(k) = log((k + 2) / (k + 1)) / log(K + 1)   Zipf over ids sorted by frequency
//! unigram       Q(k) = count_k^alpha / sum_j count_j^alpha     word2vec: alpha = 0.75
//! ```
//!
//! A draw costs O(1): log-uniform by inverting its distribution function,
//! `k = floor(exp(u log(K + 1))) - 1` for `u` uniform in [0, 1), unigram from an alias table. The
//! expected number of times class `c` appears among the draws is
//!
//! ```text
//! n draws with replacement                           E_c = n Q(c)
//! draws until n distinct classes, T draws in all      E_c = 1 - (1 - Q(c))^T
//! ```
//!
//! (TensorFlow's `unique = false` and `unique = true`; when `n` covers every class the proposal
//! can draw, all of them are taken, with `E_c = 1`). Sampled softmax subtracts `log E_c` from
//! each candidate's logit.

use farout_core::rng::RngExt;
use farout_core::{AliasTable, ClassId, Rng};
use std::collections::HashSet;

/// Where sampled negatives come from (TensorFlow's candidate samplers).
#[derive(Clone, Debug)]
pub enum Proposal {
    /// `Q(k) = 1/K`.
    Uniform,
    /// Zipf over frequency-sorted ids: `Q(k) = log((k+2)/(k+1)) / log(K+1)`. Right when class
    /// ids are ranks by frequency (vocabularies); wrong otherwise.
    LogUniform,
    /// `Q(k) ∝ count_k^alpha` (word2vec: alpha = 0.75), drawn in O(1) from an alias table.
    Unigram(AliasTable),
}

impl Proposal {
    /// The unigram^alpha proposal from class counts; `None` when every count is zero.
    pub fn unigram(counts: &[u64], alpha: f64) -> Option<Self> {
        let w: Vec<f64> = counts.iter().map(|&c| (c as f64).powf(alpha)).collect();
        AliasTable::new(&w).map(Proposal::Unigram)
    }

    /// Config name.
    pub fn name(&self) -> &'static str {
        match self {
            Proposal::Uniform => "uniform",
            Proposal::LogUniform => "log_uniform",
            Proposal::Unigram(_) => "unigram",
        }
    }

    /// One draw from `0..k`.
    #[inline]
    pub fn draw(&self, k: usize, rng: &mut Rng) -> ClassId {
        match self {
            Proposal::Uniform => rng.random_range(0..k as ClassId),
            Proposal::LogUniform => {
                let u: f64 = rng.random();
                let c = ((u * ((k + 1) as f64).ln()).exp() - 1.0) as usize;
                c.min(k - 1) as ClassId
            }
            Proposal::Unigram(t) => t.sample(rng),
        }
    }

    /// `Q(c)` for a proposal over `0..k`.
    #[inline]
    pub fn prob(&self, k: usize, c: ClassId) -> f64 {
        match self {
            Proposal::Uniform => 1.0 / k as f64,
            Proposal::LogUniform => (((c + 2) as f64) / ((c + 1) as f64)).ln() / ((k + 1) as f64).ln(),
            Proposal::Unigram(t) => t.prob(c as usize),
        }
    }

    /// Number of classes the proposal can draw.
    pub fn support(&self, k: usize) -> usize {
        match self {
            Proposal::Uniform | Proposal::LogUniform => k,
            Proposal::Unigram(t) => t.support(),
        }
    }

    /// Checks that the proposal covers `k` classes.
    pub fn check(&self, k: usize) -> Result<(), farout_core::ParamError> {
        match self {
            Proposal::Unigram(t) if t.len() != k => Err(farout_core::ParamError::new(
                "proposal",
                format!("unigram over {} classes", t.len()),
                "the counts must cover every class of the layer",
            )),
            _ => Ok(()),
        }
    }
}

/// The proposal a config names (`output.proposal`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposalKind {
    /// Every class equally likely.
    Uniform,
    /// Zipf over ids (ids sorted by decreasing frequency).
    LogUniform,
    /// Training label counts raised to `output.alpha`.
    Unigram,
}

impl ProposalKind {
    /// The proposal over `k` classes; `counts` (training label counts) is called for `unigram`.
    pub fn build(self, k: usize, alpha: f64, counts: &dyn Fn() -> Vec<u64>) -> Result<Proposal, crate::Error> {
        let proposal = match self {
            Self::Uniform => Proposal::Uniform,
            Self::LogUniform => Proposal::LogUniform,
            Self::Unigram => Proposal::unigram(&counts(), alpha).ok_or(crate::Error::Param(
                farout_core::ParamError::new("proposal", "\"unigram\"", "the training set has no labels to count"),
            ))?,
        };
        proposal.check(k)?;
        Ok(proposal)
    }
}

/// Checks the unigram exponent `alpha` (finite, >= 0).
pub(crate) fn check_alpha(alpha: f64) -> Result<(), farout_core::ParamError> {
    if !(alpha >= 0.0 && alpha.is_finite()) {
        return Err(farout_core::ParamError::new("alpha", alpha, "must be a finite number >= 0"));
    }
    Ok(())
}

/// A set of drawn classes with `log E_c`, the log of the expected number of times each was
/// drawn (the correction sampled softmax subtracts from the logits).
#[derive(Clone, Debug, Default)]
pub struct Draws {
    /// Distinct (unique sampling) or repeated (with replacement) classes.
    pub classes: Vec<ClassId>,
    /// `log E_c`, aligned with `classes`.
    pub log_expected: Vec<f32>,
    /// Draws made (with unique sampling: until `n` distinct classes were seen).
    pub tries: usize,
    seen: HashSet<ClassId>,
}

impl Draws {
    /// Draws `n` classes from `proposal` over `0..k`.
    ///
    /// With `unique`, draws until `n` distinct classes were seen, `T` tries in all (when `n`
    /// covers every class the proposal can draw, takes them all with `E_c = 1`); a class's expected presence is then `1 - (1 - Q(c))^T` (TensorFlow's
    /// `unique=True` semantics). Otherwise `n` draws with replacement, repeats kept, and
    /// `E_c = n Q(c)`.
    pub fn sample(&mut self, proposal: &Proposal, k: usize, n: usize, unique: bool, rng: &mut Rng) {
        self.classes.clear();
        self.log_expected.clear();
        if unique && n >= proposal.support(k) {
            // Every drawable class: present with certainty (E_c = 1, no correction).
            self.tries = usize::MAX;
            self.classes.extend((0..k as ClassId).filter(|&c| proposal.prob(k, c) > 0.0));
        } else if unique {
            self.seen.clear();
            self.tries = 0;
            while self.classes.len() < n {
                let c = proposal.draw(k, rng);
                self.tries += 1;
                if self.seen.insert(c) {
                    self.classes.push(c);
                }
            }
        } else {
            self.tries = n;
            self.classes.extend((0..n).map(|_| proposal.draw(k, rng)));
        }
        for i in 0..self.classes.len() {
            let e = self.expected(proposal, k, self.classes[i], unique);
            self.log_expected.push(e.ln() as f32);
        }
    }

    /// `E_c` of class `c` under the last draw's settings (also for positives).
    pub fn expected(&self, proposal: &Proposal, k: usize, c: ClassId, unique: bool) -> f64 {
        let q = proposal.prob(k, c);
        if unique {
            // 1 - (1-q)^T, computed without cancellation for small q.
            -f64::exp_m1(self.tries as f64 * f64::ln_1p(-q.min(1.0 - 1e-16)))
        } else {
            self.tries as f64 * q
        }
        .max(f64::MIN_POSITIVE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_core::rng::seeded;

    fn frequencies(p: &Proposal, k: usize, n: usize) -> Vec<f64> {
        let mut r = seeded(11, 0);
        let mut c = vec![0usize; k];
        for _ in 0..n {
            c[p.draw(k, &mut r) as usize] += 1;
        }
        c.iter().map(|&x| x as f64 / n as f64).collect()
    }

    #[test]
    fn draws_follow_the_stated_probabilities() {
        let k = 20;
        let n = 300_000;
        for p in
            [Proposal::Uniform, Proposal::LogUniform, Proposal::unigram(&(1..=20).collect::<Vec<_>>(), 0.75).unwrap()]
        {
            let f = frequencies(&p, k, n);
            let total: f64 = (0..k).map(|c| p.prob(k, c as ClassId)).sum();
            assert!((total - 1.0).abs() < 1e-9, "{}: probabilities sum to {total}", p.name());
            for (c, &fc) in f.iter().enumerate() {
                let q = p.prob(k, c as ClassId);
                let se = (q * (1.0 - q) / n as f64).sqrt();
                assert!((fc - q).abs() <= 5.0 * se, "{} class {c}: {fc} vs {q}", p.name());
            }
        }
    }

    #[test]
    fn unique_draws_of_the_whole_support_take_every_drawable_class() {
        // Two classes have zero count: drawing 5 distinct classes must stop at the 3 drawable.
        let p = Proposal::unigram(&[4, 0, 1, 0, 9], 0.75).unwrap();
        let mut d = Draws::default();
        d.sample(&p, 5, 5, true, &mut seeded(1, 0));
        assert_eq!(d.classes, vec![0, 2, 4]);
        assert!(d.log_expected.iter().all(|&l| l == 0.0), "{:?}", d.log_expected);
    }

    #[test]
    fn unique_draws_have_the_expected_presence() {
        // Over many repetitions, the frequency with which class c is present in a unique draw
        // of n classes equals 1 - (1 - Q(c))^T on average (T varies between repetitions, so
        // compare the mean of the formula with the observed frequency).
        let (k, n, reps) = (30, 8, 40_000);
        let p = Proposal::LogUniform;
        let mut d = Draws::default();
        let mut present = vec![0.0f64; k];
        let mut predicted = vec![0.0f64; k];
        let mut r = seeded(2, 0);
        for _ in 0..reps {
            d.sample(&p, k, n, true, &mut r);
            assert_eq!(d.classes.len(), n);
            for &c in &d.classes {
                present[c as usize] += 1.0;
            }
            for (c, predicted) in predicted.iter_mut().enumerate().take(k) {
                *predicted += d.expected(&p, k, c as ClassId, true);
            }
        }
        for c in 0..k {
            let (f, e) = (present[c] / reps as f64, predicted[c] / reps as f64);
            let se = (f * (1.0 - f) / reps as f64).sqrt().max(1e-4);
            assert!((f - e).abs() <= 5.0 * se + 0.01, "class {c}: present {f}, predicted {e}");
        }
    }
}
