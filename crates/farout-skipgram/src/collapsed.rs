//! The LDGS paper's collapsed skip-gram objective (eq. 9) and gradient descent on it
//! (Section 5.3: GD, GD-MIPS, GD-Decomp-MIPS).
//!
//! Grouping the pairs of a corpus by context word x, with `c_xy` the number of times centre y
//! occurs in a window of x and `c_x = sum_y c_xy`,
//!
//! `L = sum_x [ c_x log sum_k exp(z_xk) - sum_y c_xy z_xy ]`, `z_x = V u_x`,
//! `dL/dz_xk = c_x softmax(z_x)_k - c_xk`
//!
//! (eq. 9 up to the constant factor 1/N, N the number of pairs). Only the softmax part is
//! expensive, and it is the gradient of an ordinary one-positive softmax loss plus a known
//! term: `c_x softmax(z) - c_x = c_x (softmax(z) - e_p) + c_x e_p - c_x.` for any class p. So any
//! estimator of the softmax gradient — exact, MIPS (Algorithm 1), LDGS (Algorithm 2), sampled
//! softmax — is asked for the sample with positive p = x's most frequent centre, its gradient
//! is scaled by `c_x`, and `c_x e_p - c_x.` is added exactly. One GD epoch visits every context
//! word once (a batch of context words per step), so a search-based estimator queries its
//! index K times per epoch rather than once per pair.
//!
//! The paper alternates updates of the input and output vectors ([`Updates::Alternating`]: each
//! epoch is a pass over the context words that moves `U` with `V` fixed, then one that moves
//! `V` with `U` fixed); [`Updates::Simultaneous`] moves both from the same gradient in one pass.

use crate::batch::{EpochMeter, InputTable, Moving, close_epoch, train_rows};
use crate::pairs::{for_each_pair, subsample};
use crate::sgns::{EpochStats, Progress};
use crate::{Error, REPORT_INTERVAL, Updates};
use farout_core::rng;
use farout_core::rng::RngCore;
use farout_core::{ClassId, Matrix, Rng, SparseGrad, gemm, kernels};
use farout_data::corpus::{TextSpec, Vocab, for_each_line, split_lines};
use farout_estimators::{Batch, BatchEstimate, BatchGrad, Ctx, Estimate, GradientEstimator};
use farout_layer::OutputLayer;
use rayon::prelude::*;
use std::path::Path;
use std::time::Instant;

/// Co-occurrence counts `c_xy` of (context x, centre y), grouped by context (CSR).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cooccurrence {
    /// Row `x` spans `indptr[x]..indptr[x + 1]` of `centres` and `counts`.
    indptr: Vec<usize>,
    centres: Vec<ClassId>,
    counts: Vec<f32>,
    /// Number of pairs counted.
    pub pairs: u64,
}

impl Cooccurrence {
    /// Counts the pairs of one pass over `corpus` drawn as training draws them (subsampling
    /// and dynamic windows from `seed`), with `threads` threads over disjoint byte ranges.
    pub fn count(
        corpus: &Path,
        spec: &TextSpec,
        vocab: &Vocab,
        window: usize,
        seed: u64,
        threads: usize,
    ) -> Result<Self, Error> {
        let keep = vocab.keep_probs(spec.subsample, spec.t);
        let ranges = split_lines(corpus, threads.max(1))?;
        let parts: Vec<Result<Vec<u64>, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = ranges
                .iter()
                .enumerate()
                .map(|(t, range)| {
                    let (range, keep) = (range.clone(), &keep);
                    s.spawn(move || {
                        let mut r = rng::seeded(seed, (1 << 40) + t as u64);
                        let (mut sentence, mut keys) = (Vec::new(), Vec::new());
                        for_each_line(
                            corpus,
                            range,
                            spec.lowercase,
                            |_, text| {
                                sentence.clear();
                                subsample(text, vocab, keep, &mut r, &mut sentence);
                                for_each_pair(&sentence, window, &mut r, |_, x, y| {
                                    keys.push(((x as u64) << 32) | y as u64)
                                });
                                true
                            },
                            |_| true,
                        )?;
                        Ok(keys)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("counting thread panicked")).collect()
        });
        let parts: Vec<Vec<u64>> = parts.into_iter().collect::<Result<_, _>>()?;
        let mut keys = Vec::with_capacity(parts.iter().map(Vec::len).sum());
        for p in parts {
            keys.extend(p);
        }
        keys.par_sort_unstable();
        Ok(Self::from_sorted_keys(&keys, vocab.len()))
    }

    /// From sorted `(x << 32) | y` keys, one per pair.
    fn from_sorted_keys(keys: &[u64], n_words: usize) -> Self {
        let mut indptr = vec![0usize; n_words + 1];
        let (mut centres, mut counts) = (Vec::new(), Vec::new());
        let mut j = 0;
        while j < keys.len() {
            let key = keys[j];
            let run = keys[j..].iter().take_while(|&&k| k == key).count();
            let (x, y) = ((key >> 32) as usize, key as u32);
            indptr[x + 1] += 1;
            centres.push(y);
            counts.push(run as f32);
            j += run;
        }
        for x in 0..n_words {
            indptr[x + 1] += indptr[x];
        }
        Self { indptr, centres, counts, pairs: keys.len() as u64 }
    }

    /// The centres of context `x` and their counts.
    pub fn row(&self, x: usize) -> (&[ClassId], &[f32]) {
        let r = self.indptr[x]..self.indptr[x + 1];
        (&self.centres[r.clone()], &self.counts[r])
    }

    /// Context words with at least one pair.
    pub fn contexts(&self) -> Vec<u32> {
        (0..self.indptr.len() - 1).filter(|&x| self.indptr[x + 1] > self.indptr[x]).map(|x| x as u32).collect()
    }

    /// Distinct (context, centre) pairs.
    pub fn distinct(&self) -> usize {
        self.centres.len()
    }

    /// Memory held, in bytes.
    pub fn bytes(&self) -> usize {
        self.indptr.len() * 8 + self.centres.len() * 4 + self.counts.len() * 4
    }
}

/// How the softmax part of the collapsed gradient is computed.
pub enum SoftmaxPart<'a> {
    /// Exactly, by one matrix product per batch (GD).
    Exact,
    /// By an estimator of the one-positive softmax gradient (GD-MIPS with `mips`, GD-Decomp-MIPS
    /// with `ldgs`, or sampled softmax).
    Estimated(&'a dyn GradientEstimator),
}

/// The collapsed objective's gradient estimator: a sample is a context word x (its id in
/// [`Batch::ids`], its centres in [`Batch::positives`]), its counts come from the table.
pub struct Collapsed<'a> {
    /// The counts.
    pub cooc: &'a Cooccurrence,
    /// The softmax part.
    pub softmax: SoftmaxPart<'a>,
}

impl Collapsed<'_> {
    /// `c_x`, and x's most frequent centre (the positive the softmax estimator is asked for).
    fn total_and_top(&self, x: usize) -> (f32, ClassId) {
        let (ys, cs) = self.cooc.row(x);
        let top = cs.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i);
        (cs.iter().sum(), ys[top])
    }

    /// GD: `z = Phi W^T` by one matrix product, then `c_x softmax(z_x) - c_x.` row by row.
    fn exact_batch(&self, ctx: &Ctx, batch: Batch, out: &mut BatchGrad) -> BatchEstimate {
        let (b, k) = (batch.phi.rows(), ctx.n_classes());
        out.reset_dense(b, k);
        let d = batch.phi.cols();
        gemm::scores(batch.phi.as_slice(), b, ctx.w.as_slice(), k, d, out.dense.as_mut_slice());
        out.losses.resize(b, 0.0);
        let loss: f64 = out
            .dense
            .as_mut_slice()
            .par_chunks_mut(k)
            .zip(&mut out.losses)
            .enumerate()
            .map(|(i, (g, sample_loss))| {
                if let Some(bias) = ctx.bias {
                    g.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
                }
                let x = batch.ids[i];
                let (ys, cs) = self.cooc.row(x);
                let lse = kernels::log_sum_exp(g);
                let c_x: f32 = cs.iter().sum();
                let mut loss = c_x as f64 * lse as f64;
                for (&y, &c) in ys.iter().zip(cs) {
                    loss -= c as f64 * g[y as usize] as f64;
                }
                g.iter_mut().for_each(|v| *v = c_x * (*v - lse).exp());
                for (&y, &c) in ys.iter().zip(cs) {
                    g[y as usize] -= c;
                }
                *sample_loss = loss as f32;
                loss
            })
            .sum();
        BatchEstimate { loss_sum: loss, classes_scored: b * k }
    }

    /// `- sum_y c_xy z_xy` and the entries `-c_xy` of the gradient.
    fn positive_part(&self, ctx: &Ctx, x: usize, phi: &[f32], out: &mut SparseGrad) -> f32 {
        let (ys, cs) = self.cooc.row(x);
        let mut loss = 0.0;
        for (&y, &c) in ys.iter().zip(cs) {
            loss -= c * ctx.score(y as usize, phi);
            out.push(y, -c);
        }
        loss
    }

    /// Context `x`'s term from the inner estimate for positive `top` (its loss
    /// `lse(z) - z_top` and its gradient, in `g`): the gradient scaled by `c_x`, `c_x e_top`
    /// and the positive part added. Returns the term's loss.
    fn finish(
        &self,
        ctx: &Ctx,
        x: usize,
        phi: &[f32],
        (c_x, top): (f32, ClassId),
        inner_loss: f32,
        g: &mut SparseGrad,
    ) -> f32 {
        g.values.iter_mut().for_each(|v| *v *= c_x);
        g.push(top, c_x);
        let lse = inner_loss + ctx.score(top as usize, phi);
        c_x * lse + self.positive_part(ctx, x, phi, g)
    }

    /// [`GradientEstimator::estimate_batch`] with the inner estimator asked sample by sample.
    fn estimate_each(
        &self,
        ctx: &Ctx,
        batch: Batch,
        inner: &dyn GradientEstimator,
        rng: &mut Rng,
        out: &mut BatchGrad,
    ) -> BatchEstimate {
        out.reset_sparse(batch.phi.rows());
        out.losses.resize(batch.phi.rows(), 0.0);
        let seed = rng.next_u64();
        let loss = out
            .sparse
            .par_iter_mut()
            .zip(&mut out.losses)
            .enumerate()
            .map(|(i, (g, sample_loss))| {
                let x = batch.ids[i];
                let phi = batch.phi.row(i);
                let (c_x, top) = self.total_and_top(x);
                let mut r = rng::seeded(seed, i as u64);
                let est = inner.estimate(ctx, phi, &[top], &mut r, g);
                *sample_loss = self.finish(ctx, x, phi, (c_x, top), est.loss, g);
                (*sample_loss as f64, est.classes_scored + self.cooc.row(x).0.len())
            })
            .fold(|| (0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
            .reduce(|| (0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        BatchEstimate { loss_sum: loss.0, classes_scored: loss.1 }
    }
}

impl GradientEstimator for Collapsed<'_> {
    fn name(&self) -> &'static str {
        match self.softmax {
            SoftmaxPart::Exact => "gd",
            SoftmaxPart::Estimated(e) if e.uses_index() => "gd_search",
            SoftmaxPart::Estimated(_) => "gd_sampled",
        }
    }

    fn uses_index(&self) -> bool {
        matches!(self.softmax, SoftmaxPart::Estimated(e) if e.uses_index())
    }

    /// One sample without its context id: the positives are taken as a multiset of centres
    /// (count = multiplicity), which is what the table holds for a context.
    fn estimate(&self, ctx: &Ctx, phi: &[f32], positives: &[ClassId], rng: &mut Rng, out: &mut SparseGrad) -> Estimate {
        out.clear();
        let Some(&top) = positives.first() else { return Estimate::default() };
        let n = positives.len() as f32;
        // `n lse(z)` and its gradient `n softmax(z)`, exactly or estimated.
        let (n_lse, scored) = match self.softmax {
            SoftmaxPart::Exact => {
                let k = ctx.n_classes();
                let z: Vec<f32> = (0..k).map(|c| ctx.score(c, phi)).collect();
                let lse = kernels::log_sum_exp(&z);
                for (c, &v) in z.iter().enumerate() {
                    out.push(c as u32, n * (v - lse).exp());
                }
                (n * lse, k)
            }
            SoftmaxPart::Estimated(e) => {
                let est = e.estimate(ctx, phi, &[top], rng, out);
                out.values.iter_mut().for_each(|v| *v *= n);
                out.push(top, n);
                (n * (est.loss + ctx.score(top as usize, phi)), est.classes_scored)
            }
        };
        let mut loss = n_lse;
        for &y in positives {
            loss -= ctx.score(y as usize, phi);
            out.push(y, -1.0);
        }
        Estimate { loss, classes_scored: scored + positives.len() }
    }

    fn estimate_batch(&self, ctx: &Ctx, batch: Batch, rng: &mut Rng, out: &mut BatchGrad) -> BatchEstimate {
        let b = batch.phi.rows();
        assert_eq!(batch.ids.len(), b, "collapsed batches carry their context ids");
        let inner = match self.softmax {
            SoftmaxPart::Exact => return self.exact_batch(ctx, batch, out),
            SoftmaxPart::Estimated(e) => e,
        };
        // The inner estimator sees the whole batch (search estimators send every query to
        // the index together) with positive p = x's top centre; then, per sample, its
        // gradient is scaled by c_x and the known terms are added.
        let tops: Vec<(f32, ClassId)> = batch.ids.iter().map(|&x| self.total_and_top(x)).collect();
        let top_sets: Vec<[ClassId; 1]> = tops.iter().map(|&(_, top)| [top]).collect();
        let positives: Vec<&[ClassId]> = top_sets.iter().map(|t| t.as_slice()).collect();
        out.losses.clear();
        let inner_total = inner.estimate_batch(ctx, Batch::new(batch.phi, &positives).with_ids(batch.ids), rng, out);
        if out.is_dense || out.losses.len() != b {
            // An estimator that gives only the batch's loss: sample by sample instead.
            return self.estimate_each(ctx, batch, inner, rng, out);
        }
        let mut losses = std::mem::take(&mut out.losses);
        let loss = out
            .sparse
            .par_iter_mut()
            .zip(&mut losses)
            .enumerate()
            .map(|(i, (g, sample_loss))| {
                let x = batch.ids[i];
                let phi = batch.phi.row(i);
                *sample_loss = self.finish(ctx, x, phi, tops[i], *sample_loss, g);
                (*sample_loss as f64, self.cooc.row(x).0.len())
            })
            .reduce(|| (0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        out.losses = losses;
        BatchEstimate { loss_sum: loss.0, classes_scored: inner_total.classes_scored + loss.1 }
    }
}

/// Gradient descent on the collapsed objective: each epoch visits every context word once, in
/// a fresh random order, `batch_size` context words per step.
pub struct GdJob<'a> {
    /// The counts (the objective).
    pub cooc: &'a Cooccurrence,
    /// Context words per step.
    pub batch_size: usize,
    /// Seed of the visiting order and of the estimator's draws.
    pub seed: u64,
    /// Epochs of the schedule.
    pub epochs: usize,
    /// Alternating (the paper's) or simultaneous updates of the two tables.
    pub updates: Updates,
    /// Stop when this instant passes.
    pub deadline: Option<Instant>,
    /// Corpus words one epoch stands for (progress is reported in words, like the other
    /// trainers: the share of the pairs covered).
    pub epoch_words: u64,
}

impl GdJob<'_> {
    /// Trains epochs `start_epoch..self.epochs`; `progress` and `epoch_end` as for
    /// [`crate::batch::BatchJob::run`]. The loss reported is the objective per pair.
    pub fn run(
        &self,
        input: &mut InputTable,
        layer: &mut OutputLayer,
        softmax: SoftmaxPart,
        start_epoch: usize,
        progress: &mut dyn FnMut(&Progress, &InputTable, &OutputLayer),
        epoch_end: &mut dyn FnMut(&EpochStats, &InputTable, &OutputLayer) -> Result<bool, Error>,
    ) -> Result<Vec<EpochStats>, Error> {
        if self.batch_size == 0 {
            return Err(farout_core::ParamError::message("train.batch_size", "must be >= 1").into());
        }
        let estimator = Collapsed { cooc: self.cooc, softmax };
        let total_words = self.epoch_words * self.epochs as u64;
        let mut contexts = self.cooc.contexts();
        let mut phi = Matrix::default();
        let mut all = Vec::new();
        let passes: &[Moving] = match self.updates {
            Updates::Alternating => &[Moving::Input, Moving::Output],
            Updates::Simultaneous => &[Moving::Both],
        };
        // Progress in corpus words: the share of the epoch's pairs covered, over its passes.
        let per_pair = |pairs: u64| {
            (pairs as f64 / (self.cooc.pairs.max(1) * passes.len() as u64) as f64 * self.epoch_words as f64) as u64
        };
        for epoch in start_epoch..self.epochs {
            let t0 = Instant::now();
            // The visiting order does not depend on what the estimator draws.
            let mut order = rng::seeded(self.seed, (1 << 48) + epoch as u64);
            let mut r = rng::seeded(self.seed, (1 << 49) + epoch as u64);
            let mut meter = EpochMeter::default();
            let mut last_report = Instant::now();
            let mut stopped = false;
            'passes: for &moving in passes {
                rng::shuffle(&mut contexts, &mut order);
                for chunk in contexts.chunks(self.batch_size) {
                    let positives: Vec<&[ClassId]> = chunk.iter().map(|&x| self.cooc.row(x as usize).0).collect();
                    let step_pairs: u64 =
                        chunk.iter().map(|&x| self.cooc.row(x as usize).1.iter().sum::<f32>() as u64).sum();
                    let l = train_rows(layer, &estimator, input, chunk, &positives, &mut phi, &mut r, moving);
                    if !l.is_finite() {
                        let words = self.epoch_words * epoch as u64 + per_pair(meter.pairs());
                        return Err(Error::Diverged { epoch, words });
                    }
                    meter.add(l, step_pairs);
                    if last_report.elapsed() >= REPORT_INTERVAL {
                        last_report = Instant::now();
                        let words = self.epoch_words * epoch as u64 + per_pair(meter.pairs());
                        progress(&meter.report(epoch, words, total_words, input), input, layer);
                    }
                    if farout_core::stop::due(self.deadline) {
                        stopped = true;
                        break 'passes;
                    }
                }
            }
            let words = per_pair(meter.pairs());
            let last = meter.report(epoch, self.epoch_words * epoch as u64 + words, total_words, input);
            let stats = meter.stats(epoch, words, stopped);
            if !close_epoch(t0, last, stats, &mut all, input, layer, progress, epoch_end)? {
                break;
            }
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::InputTable;
    use farout_data::corpus::Subsampling;
    use farout_estimators::{Exact, Mips, Softmax};
    use farout_layer::{OptimizerConfig, OutputLayerConfig};
    use farout_search::IndexConfig;
    use std::io::Write;

    fn corpus(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn no_subsampling() -> TextSpec {
        TextSpec { min_count: 1, subsample: Subsampling::None, ..TextSpec::default() }
    }

    #[test]
    fn counts_are_the_window_pairs_whatever_the_threads() {
        // Window 1: every neighbour pair, both ways.
        let f = corpus("a b c\nb a\nc\na b\n");
        let spec = no_subsampling();
        let vocab = Vocab::build(f.path(), &spec, 1).unwrap();
        let id = |w: &str| vocab.id(w).unwrap();
        for threads in [1, 2, 3] {
            let c = Cooccurrence::count(f.path(), &spec, &vocab, 1, 7, threads).unwrap();
            assert_eq!(c.pairs, 8);
            let (ys, cs) = c.row(id("a") as usize);
            let mut got: Vec<(u32, f32)> = ys.iter().copied().zip(cs.iter().copied()).collect();
            got.sort_by_key(|e| e.0);
            assert_eq!(got, [(id("b"), 3.0)]);
            let (ys, cs) = c.row(id("b") as usize);
            let mut got: Vec<(u32, f32)> = ys.iter().copied().zip(cs.iter().copied()).collect();
            got.sort_by_key(|e| e.0);
            let mut want = vec![(id("a"), 3.0), (id("c"), 1.0)];
            want.sort_by_key(|e| e.0);
            assert_eq!(got, want);
            assert_eq!(c.contexts().len(), 3);
        }
    }

    fn random(rows: usize, cols: usize, seed: u64) -> Matrix {
        let mut r = rng::seeded(seed, 0);
        Matrix::from_vec(rows, cols, (0..rows * cols).map(|_| rng::normal(&mut r)).collect()).unwrap()
    }

    /// A table over 5 words from explicit keys.
    fn table() -> Cooccurrence {
        let pairs = [(0u64, 1u64), (0, 1), (0, 3), (2, 0), (2, 4), (2, 4), (2, 4), (4, 2)];
        let mut keys: Vec<u64> = pairs.iter().map(|&(x, y)| (x << 32) | y).collect();
        keys.sort_unstable();
        Cooccurrence::from_sorted_keys(&keys, 5)
    }

    /// Dense gradients of a batch (sparse entries summed per class).
    fn dense(g: &BatchGrad, k: usize) -> Vec<Vec<f32>> {
        if g.is_dense {
            return g.dense.iter_rows().map(<[f32]>::to_vec).collect();
        }
        g.sparse
            .iter()
            .map(|s| {
                let mut row = vec![0.0; k];
                s.iter().for_each(|(c, v)| row[c as usize] += v);
                row
            })
            .collect()
    }

    /// Context `x`'s term of eq. 9 at scores `z`: `c_x lse(z) - sum_y c_xy z_y` and its
    /// gradient `c_x softmax(z) - c_x.`, written out.
    fn eq9_term(cooc: &Cooccurrence, x: usize, z: &[f32]) -> (f64, Vec<f32>) {
        let lse = kernels::log_sum_exp(z);
        let (ys, cs) = cooc.row(x);
        let c_x: f32 = cs.iter().sum();
        let mut g: Vec<f32> = z.iter().map(|v| c_x * (v - lse).exp()).collect();
        let mut loss = (c_x * lse) as f64;
        for (&y, &c) in ys.iter().zip(cs) {
            g[y as usize] -= c;
            loss -= (c * z[y as usize]) as f64;
        }
        (loss, g)
    }

    #[test]
    fn the_gradient_is_eq_9s_whichever_way_the_softmax_part_is_computed() {
        let (k, d) = (5, 3);
        let (w, phi) = (random(k, d, 1), random(3, d, 2));
        let cooc = table();
        let ids = [0usize, 2, 4];
        let positives: Vec<&[ClassId]> = ids.iter().map(|&x| cooc.row(x).0).collect();
        let batch = Batch::new(&phi, &positives).with_ids(&ids);
        // Brute force: L = sum_x c_x lse(z_x) - sum_y c_xy z_xy.
        let (mut want_loss, mut want) = (0.0f64, Vec::new());
        for (i, &x) in ids.iter().enumerate() {
            let z: Vec<f32> = (0..k).map(|c| kernels::dot(w.row(c), phi.row(i))).collect();
            let (loss, g) = eq9_term(&cooc, x, &z);
            want_loss += loss;
            want.push(g);
        }
        let exact_inner = Exact::new(Softmax);
        // A search that retrieves every class: sparse gradients, the batch searched at once.
        let mips = Mips::new(Softmax, k).unwrap();
        let index = farout_search::BlockIndex::build(&w, &IndexConfig::exact(), 1);
        for (softmax, index) in [
            (SoftmaxPart::Exact, None),
            (SoftmaxPart::Estimated(&exact_inner), None),
            (SoftmaxPart::Estimated(&mips), Some(&index)),
        ] {
            let ctx = Ctx { w: &w, bias: None, index };
            let est = Collapsed { cooc: &cooc, softmax };
            let mut out = BatchGrad::default();
            let e = est.estimate_batch(&ctx, batch, &mut rng::seeded(1, 1), &mut out);
            assert!((e.loss_sum - want_loss).abs() < 1e-4, "{} vs {want_loss}", e.loss_sum);
            let per_sample: f64 = out.losses.iter().map(|&l| l as f64).sum();
            assert!((per_sample - want_loss).abs() < 1e-4, "per sample: {:?} vs {want_loss}", out.losses);
            for (got, want) in dense(&out, k).iter().zip(&want) {
                for (a, b) in got.iter().zip(want) {
                    assert!((a - b).abs() < 1e-5, "{got:?} vs {want:?}");
                }
            }
            // One sample with its centres as a multiset: the same gradient.
            let multiset: Vec<ClassId> = cooc
                .row(2)
                .0
                .iter()
                .zip(cooc.row(2).1)
                .flat_map(|(&y, &c)| std::iter::repeat_n(y, c as usize))
                .collect();
            let mut g = SparseGrad::new();
            est.estimate(&ctx, phi.row(1), &multiset, &mut rng::seeded(1, 2), &mut g);
            let mut row = vec![0.0; k];
            g.iter().for_each(|(c, v)| row[c as usize] += v);
            for (a, b) in row.iter().zip(&want[1]) {
                assert!((a - b).abs() < 1e-5, "{row:?} vs {:?}", want[1]);
            }
        }
    }

    /// Runs `epochs` of GD from (u, v) with SGD step `lr` and batch `batch_size`; returns the
    /// epochs' losses and the final tables.
    #[allow(clippy::too_many_arguments)]
    fn run(
        softmax: SoftmaxPart,
        index: bool,
        updates: Updates,
        cooc: &Cooccurrence,
        u: &Matrix,
        v: &Matrix,
        epochs: usize,
        batch_size: usize,
        lr: f32,
    ) -> (Vec<f64>, Matrix, Matrix) {
        let (k, d) = (v.rows(), v.cols());
        let opt = OptimizerConfig::Sgd { lr, decay: 0.0, l2: 0.0 };
        let mut layer =
            OutputLayer::new(k, d, &OutputLayerConfig { bias: false, init_std: 0.0, ..Default::default() }, &opt, 1)
                .unwrap();
        layer.set_weights(v.clone()).unwrap();
        if index {
            let config = IndexConfig::exact();
            layer.attach_index(config, 1, farout_layer::IndexUpkeep::default()).unwrap();
        }
        let mut input = InputTable { vectors: u.clone(), optimizer: opt.build(k, d) };
        let job = GdJob { cooc, batch_size, seed: 3, epochs, updates, deadline: None, epoch_words: 100 };
        let stats = job.run(&mut input, &mut layer, softmax, 0, &mut |_, _, _| {}, &mut |_, _, _| Ok(true)).unwrap();
        (stats.iter().map(|s| s.loss).collect(), input.vectors, layer.weights().clone())
    }

    #[test]
    fn gd_lowers_the_objective_and_search_with_every_class_retrieved_is_gd() {
        let f = corpus(&"the cat sat on the mat and the dog sat on the log\n".repeat(20));
        let spec = no_subsampling();
        let vocab = Vocab::build(f.path(), &spec, 1).unwrap();
        let cooc = Cooccurrence::count(f.path(), &spec, &vocab, 2, 1, 2).unwrap();
        let (k, d) = (vocab.len(), 4);
        let (u, v) = (random(k, d, 5), random(k, d, 6));
        for updates in [Updates::Alternating, Updates::Simultaneous] {
            let (exact, ..) = run(SoftmaxPart::Exact, false, updates, &cooc, &u, &v, 6, 4, 0.002);
            assert!(exact.windows(2).all(|w| w[1] < w[0]), "{updates:?}: {exact:?}");
            let mips = Mips::new(Softmax, k).unwrap();
            let (search, ..) = run(SoftmaxPart::Estimated(&mips), true, updates, &cooc, &u, &v, 6, 4, 0.002);
            for (a, b) in exact.iter().zip(&search) {
                assert!((a - b).abs() < 1e-4 * a.abs(), "{updates:?}: {exact:?} vs {search:?}");
            }
        }
    }

    /// The eq. 9 gradients written out: `G_x = ` [`eq9_term`]'s gradient at `z = u_x V^T`,
    /// `dL/dU = G V`, `dL/dV = G^T U` (rows of contexts without pairs are zero).
    fn eq9_gradients(cooc: &Cooccurrence, u: &Matrix, v: &Matrix) -> (Matrix, Matrix) {
        let (k, d) = (v.rows(), v.cols());
        let (mut gu, mut gv) = (Matrix::zeros(u.rows(), d), Matrix::zeros(k, d));
        for x in cooc.contexts() {
            let x = x as usize;
            let z: Vec<f32> = (0..k).map(|c| kernels::dot(v.row(c), u.row(x))).collect();
            let (_, g) = eq9_term(cooc, x, &z);
            for (c, &gc) in g.iter().enumerate() {
                kernels::axpy(gc, v.row(c), gu.row_mut(x));
                kernels::axpy(gc, u.row(x), gv.row_mut(c));
            }
        }
        (gu, gv)
    }

    fn step(m: &Matrix, g: &Matrix, lr: f32) -> Matrix {
        let mut out = m.clone();
        kernels::axpy(-lr, g.as_slice(), out.as_mut_slice());
        out
    }

    fn assert_close(got: &Matrix, want: &Matrix, what: &str) {
        for (a, b) in got.as_slice().iter().zip(want.as_slice()) {
            assert!((a - b).abs() < 1e-5 * (1.0 + b.abs()), "{what}: {a} vs {b}");
        }
    }

    #[test]
    fn an_alternating_epoch_moves_u_with_v_fixed_then_v_with_the_new_u() {
        // One batch holds every context word, so each pass is one full gradient step.
        let cooc = table();
        let (k, d, lr) = (5, 3, 0.1);
        let (u0, v0) = (random(k, d, 7), random(k, d, 8));
        let (_, u, v) = run(SoftmaxPart::Exact, false, Updates::Alternating, &cooc, &u0, &v0, 1, 64, lr);
        let u1 = step(&u0, &eq9_gradients(&cooc, &u0, &v0).0, lr);
        let v1 = step(&v0, &eq9_gradients(&cooc, &u1, &v0).1, lr);
        // (The step is large enough that the order of the passes shows.)
        assert!(
            v1.as_slice()
                .iter()
                .zip(step(&v0, &eq9_gradients(&cooc, &u0, &v0).1, lr).as_slice())
                .any(|(a, b)| (a - b).abs() > 1e-3)
        );
        assert_close(&u, &u1, "U");
        assert_close(&v, &v1, "V");
        // Simultaneous: both from the gradient at (u0, v0).
        let (_, u, v) = run(SoftmaxPart::Exact, false, Updates::Simultaneous, &cooc, &u0, &v0, 1, 64, lr);
        let (gu, gv) = eq9_gradients(&cooc, &u0, &v0);
        assert_close(&u, &step(&u0, &gu, lr), "U (simultaneous)");
        assert_close(&v, &step(&v0, &gv, lr), "V (simultaneous)");
    }
}
