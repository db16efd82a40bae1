//! The output layer with its classes split over ranks (model parallelism, as the
//! vocabulary-parallel softmax of Megatron-LM and insightface's Partial FC).
//!
//! Rank r owns the contiguous rows `first..first + K_r` of W, their bias and optimiser state.
//! Every rank sees the same batch `Phi`. For exact softmax, with the local scores
//! `z_r = W_r phi + b_r` of a sample with positives P:
//!
//! ```text
//! M     = max_r max_k z_rk                      (allreduce max, one value per sample)
//! S     = sum_r sum_k exp(z_rk - M)             (allreduce sum)
//! s_P   = sum_{p in P} z_p                      (allreduce sum: each positive has one owner)
//! L     = |P| (M + ln S) - s_P
//! dL/dz_rk = |P| exp(z_rk - M) / S - [k in P]   (local)
//! dL/dphi  = sum_r (dL/dz_r)^T W_r              (allreduce sum of B x D)
//! ```
//!
//! so a step moves `3B` numbers per sample batch for the loss and `B D` for `dL/dphi`, however
//! large K is; every rank then updates only its rows. Prediction merges every rank's top-k
//! ([`ShardedLayer::top_k`]). The loss and gradient equal [`farout_estimators::Softmax`]'s over
//! the whole layer, up to the order of floating-point sums.
//!
//! The free functions ([`softmax_step`], [`merged_top_k`], [`softmax_losses`]) work on any
//! [`OutputLayer`] that holds a rank's rows (the trainer keeps its own); [`ShardedLayer`] bundles
//! the rows with their offset.

use crate::{OutputLayer, StepStats};
use farout_core::topk::{Hit, top_k};
use farout_core::{ClassId, Matrix, kernels, vexp};
use farout_dist::{Collective, DistError, local_index, merge_top_k};
use farout_estimators::{Batch, BatchEstimate};
use rayon::prelude::*;
use std::cell::RefCell;
use std::ops::Range;
use std::time::Instant;

/// One exact-softmax step of `layer`, the rows `first..` of an `n_classes`-class layer split over
/// the ranks of `comm`, on `phi` (the same batch on every rank) with global class ids in
/// `positives`: the loss of the whole layer (the same on every rank), `dL/dphi` summed over the
/// ranks (in `layer.dphi()`, when `want_dphi`), and this rank's rows updated. Also returns the
/// seconds spent in collectives.
///
/// `class_chunk` > 0 visits the rank's classes that many at a time
/// ([`OutputLayer::train_dense_in_passes`]): the class gradients then take `B x class_chunk`
/// numbers instead of `B x K_r`, for one more score product per step (4 instead of 3).
#[allow(clippy::too_many_arguments)]
pub fn softmax_step(
    layer: &mut OutputLayer,
    first: usize,
    n_classes: usize,
    comm: &dyn Collective,
    phi: &Matrix,
    positives: &[&[ClassId]],
    want_dphi: bool,
    class_chunk: usize,
) -> Result<(StepStats, f64), DistError> {
    let (stats, mut comm_seconds) = if class_chunk > 0 {
        softmax_step_in_passes(layer, first, n_classes, comm, phi, positives, want_dphi, class_chunk)?
    } else {
        softmax_step_whole(layer, first, n_classes, comm, phi, positives, want_dphi)?
    };
    if want_dphi {
        comm_seconds += allreduce_dphi(layer, comm)?;
    }
    Ok((stats, comm_seconds))
}

/// Sums `layer.dphi()` over the ranks of `comm`, in place; returns the seconds it took.
pub(crate) fn allreduce_dphi(layer: &mut OutputLayer, comm: &dyn Collective) -> Result<f64, DistError> {
    let t = Instant::now();
    comm.allreduce_sum_f32(layer.dphi_mut().as_mut_slice())?;
    Ok(t.elapsed().as_secs_f64())
}

/// The positives of a row among the local classes `rows` of a rank owning `first..`, as offsets
/// into `rows`.
fn positives_in<'a>(pos: &'a [ClassId], first: usize, rows: &Range<usize>) -> impl Iterator<Item = usize> + 'a {
    let (start, n) = (first + rows.start, rows.len());
    pos.iter().filter_map(move |&p| local_index(p as usize, start, n))
}

/// [`softmax_step`] with all the rank's classes at once (the B x K_r gradients in the layer's
/// buffer), up to the allreduce of `dL/dphi`; returns the seconds spent in collectives.
fn softmax_step_whole(
    layer: &mut OutputLayer,
    first: usize,
    n_classes: usize,
    comm: &dyn Collective,
    phi: &Matrix,
    positives: &[&[ClassId]],
    want_dphi: bool,
) -> Result<(StepStats, f64), DistError> {
    let mut comm_seconds = 0.0;
    let stats = layer.train_step_with(Batch::new(phi, positives), want_dphi, |ctx, batch, grads| {
        let (b, k, d) = (batch.phi.rows(), ctx.w.rows(), ctx.w.cols());
        grads.reset_dense(b, k);
        let z = grads.dense.as_mut_slice();
        farout_core::gemm::scores(batch.phi.as_slice(), b, ctx.w.as_slice(), k, d, z);
        if let Some(bias) = ctx.bias {
            z.par_chunks_mut(k).for_each(|row| row.iter_mut().zip(bias).for_each(|(v, b)| *v += b));
        }
        // Per sample, locally: the positives' scores this rank owns, the local max m_r, the
        // exponentials exp(z - m_r) in place and their sum.
        let mut local = vec![(0f32, 0f64, 0f64); b];
        z.par_chunks_mut(k).zip(local.par_iter_mut()).zip(batch.positives.par_iter()).for_each(
            |((row, (m, e, s)), pos)| {
                *s = positives_in(pos, first, &(0..k)).map(|l| f64::from(row[l])).sum();
                *m = kernels::max(row);
                *e = vexp::exp_shifted(row, *m);
            },
        );
        let t = Instant::now();
        let all = Normalisers::combine(comm, &local)?;
        comm_seconds += t.elapsed().as_secs_f64();
        let loss_sum = z
            .par_chunks_mut(k)
            .zip(batch.positives.par_iter())
            .zip(local.par_iter())
            .enumerate()
            .map(|(i, ((row, pos), &(m_r, _, _)))| {
                if pos.is_empty() {
                    row.fill(0.0);
                    return 0.0;
                }
                // exp(z - M) = exp(z - m_r) exp(m_r - M).
                let scale = (pos.len() as f64 * f64::from(m_r - all.max[i]).exp() / all.exp_sum(i)) as f32;
                row.iter_mut().for_each(|v| *v *= scale);
                for l in positives_in(pos, first, &(0..k)) {
                    row[l] -= 1.0;
                }
                all.loss(i, pos.len())
            })
            .sum();
        Ok(BatchEstimate { loss_sum, classes_scored: b * n_classes })
    })?;
    Ok((stats, comm_seconds))
}

thread_local! {
    /// A chunk row's exponentials in the first pass of [`softmax_step_in_passes`].
    static EXP_SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// [`softmax_step`] over the classes `chunk` at a time, up to the allreduce of `dL/dphi`: a
/// first pass gathers each row's
/// [`LocalNormaliser`] chunk by chunk (an online max and rescaled sum of exponentials), the
/// ranks combine them, and a second pass recomputes each chunk's scores and turns them into
/// its gradients `|P| exp(z - M) / S - [k in P]`; returns the seconds spent in collectives.
#[allow(clippy::too_many_arguments)]
fn softmax_step_in_passes(
    layer: &mut OutputLayer,
    first: usize,
    n_classes: usize,
    comm: &dyn Collective,
    phi: &Matrix,
    positives: &[&[ClassId]],
    want_dphi: bool,
    chunk: usize,
) -> Result<(StepStats, f64), DistError> {
    let b = phi.rows();
    let local = RefCell::new(vec![(f32::NEG_INFINITY, 0f64, 0f64); b]);
    let all = RefCell::new(None::<Normalisers>);
    let (mut comm_seconds, mut loss_sum) = (0.0, 0.0);
    let rows_updated = layer.train_dense_in_passes(
        phi,
        chunk,
        want_dphi,
        |rows, z| {
            let n = rows.len();
            let mut local = local.borrow_mut();
            z.par_chunks(n).zip(local.par_iter_mut()).zip(positives.par_iter()).for_each(|((row, (m, e, s)), pos)| {
                *s += positives_in(pos, first, &rows).map(|l| f64::from(row[l])).sum::<f64>();
                let chunk_max = kernels::max(row);
                if chunk_max > *m {
                    // Rescale the sum so far to the new max (0 before any finite score).
                    *e *= f64::from(*m - chunk_max).exp();
                    *m = chunk_max;
                }
                // Into a scratch copy: the second pass recomputes the scores anyway.
                EXP_SCRATCH.with_borrow_mut(|x| {
                    x.clear();
                    x.extend_from_slice(row);
                    *e += vexp::exp_shifted(x, *m);
                });
            });
        },
        || {
            let t = Instant::now();
            let combined = Normalisers::combine(comm, &local.borrow())?;
            comm_seconds += t.elapsed().as_secs_f64();
            loss_sum = positives
                .iter()
                .enumerate()
                .filter(|(_, pos)| !pos.is_empty())
                .map(|(i, pos)| combined.loss(i, pos.len()))
                .sum();
            *all.borrow_mut() = Some(combined);
            Ok(())
        },
        |rows, z| {
            let n = rows.len();
            let all = all.borrow();
            let all = all.as_ref().expect("the normalisers are combined between the passes");
            z.par_chunks_mut(n).zip(positives.par_iter()).enumerate().for_each(|(i, (row, pos))| {
                if pos.is_empty() {
                    row.fill(0.0);
                    return;
                }
                let (max, scale) = (all.max[i], (pos.len() as f64 / all.exp_sum(i)) as f32);
                vexp::exp_shifted(row, max);
                row.iter_mut().for_each(|v| *v *= scale);
                for l in positives_in(pos, first, &rows) {
                    row[l] -= 1.0;
                }
            });
        },
    )?;
    Ok((StepStats { loss_sum, classes_scored: b * n_classes, rows_updated }, comm_seconds))
}

/// The `k` best classes of every row of the local scores `z` (`[B, K_r]`, classes `first..`)
/// over all ranks, best first, with global ids; on every rank.
pub fn merged_top_k(comm: &dyn Collective, z: &Matrix, first: usize, k: usize) -> Result<Vec<Vec<Hit>>, DistError> {
    let local: Vec<Vec<Hit>> = (0..z.rows())
        .into_par_iter()
        .map(|i| {
            let mut hits = Vec::with_capacity(k);
            top_k(z.row(i), k, &mut hits);
            hits.iter_mut().for_each(|h| h.class += first as ClassId);
            hits
        })
        .collect();
    merge_top_k(comm, local, k)
}

/// The softmax loss `|P| log sum_k exp(z_k) - sum_{p in P} z_p` of every row of the local scores
/// `z` (`[B, K_r]`, classes `first..`) over the classes of all ranks (0 for a row without
/// positives); on every rank. Three numbers per row travel, as in [`softmax_step`].
pub fn softmax_losses(
    comm: &dyn Collective,
    z: &Matrix,
    first: usize,
    positives: &[&[ClassId]],
) -> Result<Vec<f64>, DistError> {
    let k = z.cols();
    let local: Vec<LocalNormaliser> = (0..z.rows())
        .into_par_iter()
        .map(|i| {
            let row = z.row(i);
            let m = kernels::max(row);
            let e = row.iter().map(|&v| f64::from((v - m).exp())).sum();
            (m, e, positives_in(positives[i], first, &(0..k)).map(|l| f64::from(row[l])).sum())
        })
        .collect();
    let all = Normalisers::combine(comm, &local)?;
    Ok(positives.iter().enumerate().map(|(i, pos)| if pos.is_empty() { 0.0 } else { all.loss(i, pos.len()) }).collect())
}

/// What a rank holds of a row's softmax normaliser: its largest score `m_r`, the sum of
/// `exp(z_k - m_r)` over its classes, and the sum of the positives' scores it owns.
type LocalNormaliser = (f32, f64, f64);

/// Rows' softmax normalisers over all ranks.
struct Normalisers {
    /// The largest score `M` of each row.
    max: Vec<f32>,
    /// `S = sum_r exp(m_r - M) sum_k exp(z_rk - m_r)` of each row, then the rows' positive
    /// score sums.
    sums: Vec<f64>,
}

impl Normalisers {
    /// Combines every rank's [`LocalNormaliser`] per row: an allreduce of the maxima, then one
    /// of the local sums rescaled to the global max together with the positive score sums.
    fn combine(comm: &dyn Collective, local: &[LocalNormaliser]) -> Result<Self, DistError> {
        let b = local.len();
        let mut max: Vec<f32> = local.iter().map(|l| l.0).collect();
        comm.allreduce_max_f32(&mut max)?;
        let mut sums = vec![0f64; 2 * b];
        for (i, &(m, e, s)) in local.iter().enumerate() {
            sums[i] = e * f64::from(m - max[i]).exp();
            sums[b + i] = s;
        }
        comm.allreduce_sum_f64(&mut sums)?;
        Ok(Self { max, sums })
    }

    /// `S` of row `i`.
    fn exp_sum(&self, i: usize) -> f64 {
        self.sums[i]
    }

    /// The softmax loss of row `i` with `n_pos` positives: `n_pos (M + ln S) - sum_P z_p`.
    fn loss(&self, i: usize, n_pos: usize) -> f64 {
        n_pos as f64 * (f64::from(self.max[i]) + self.sums[i].ln()) - self.sums[self.max.len() + i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OptimizerConfig, OutputLayerConfig, ShardedLayer};
    use farout_core::rng;
    use farout_dist::Local;
    use farout_estimators::{Exact, Loss, Softmax};

    /// One rank: the sharded step is the exact softmax step of the whole layer, with the classes
    /// at once or in chunks (of one class, of a size that does not divide K, of all of them),
    /// with AdaGrad and with SGD.
    #[test]
    fn one_shard_steps_like_the_exact_softmax_layer() {
        let adagrad = OptimizerConfig::Adagrad { lr: 0.2, eps: 1e-8, l2: 0.0 };
        let sgd = OptimizerConfig::Sgd { lr: 0.5, decay: 0.0, l2: 0.01 };
        for (chunk, opt) in
            [(0, &adagrad), (1, &adagrad), (7, &adagrad), (300, &adagrad), (1000, &adagrad), (0, &sgd), (64, &sgd)]
        {
            one_shard_steps_like_the_exact_softmax_layer_with(chunk, opt);
        }
    }

    fn one_shard_steps_like_the_exact_softmax_layer_with(chunk: usize, opt: &OptimizerConfig) {
        let (k, d, b) = (300, 16, 24);
        let cfg = OutputLayerConfig { bias: true, init_std: 0.3, ..Default::default() };
        let mut sharded = ShardedLayer::new(k, 0, 1, d, &cfg, opt, 7).unwrap();
        let mut whole = OutputLayer::new(k, d, &cfg, opt, 7).unwrap();
        let mut r = rng::seeded(1, 0);
        let phi = Matrix::from_vec(b, d, (0..b * d).map(|_| rng::normal(&mut r)).collect()).unwrap();
        let labels: Vec<Vec<u32>> =
            (0..b).map(|i| if i == 3 { vec![] } else { vec![(i * 37 % k) as u32, 5] }).collect();
        let pos: Vec<&[u32]> = labels.iter().map(Vec::as_slice).collect();
        let est = Exact::new(Softmax);
        for step in 0..5 {
            let a = sharded.softmax_step(&Local, &phi, &pos, true, chunk).unwrap();
            let e = whole.train_step(&est, Batch::new(&phi, &pos), &mut r, true);
            assert!(
                (a.loss_sum - e.loss_sum).abs() <= 1e-5 * e.loss_sum.abs(),
                "chunk {chunk}, step {step}: {a:?} vs {e:?}"
            );
            assert_eq!((a.classes_scored, a.rows_updated), (e.classes_scored, e.rows_updated));
            let diff = |x: &Matrix, y: &Matrix| {
                x.as_slice().iter().zip(y.as_slice()).map(|(u, v)| (u - v).abs()).fold(0.0f32, f32::max)
            };
            assert!(diff(sharded.layer().dphi(), whole.dphi()) < 1e-5, "chunk {chunk}, step {step}");
            assert!(diff(sharded.layer().weights(), whole.weights()) < 1e-5, "chunk {chunk}, step {step}");
            let bias_diff =
                sharded.layer().bias().unwrap().iter().zip(whole.bias().unwrap()).map(|(u, v)| (u - v).abs());
            assert!(bias_diff.fold(0.0f32, f32::max) < 1e-5, "chunk {chunk}, step {step}");
        }
        let mut z = Matrix::default();
        whole.scores(&phi, &mut z);
        let losses = softmax_losses(&Local, &z, 0, &pos).unwrap();
        for (i, l) in losses.iter().enumerate() {
            let mut grad = vec![0.0; k];
            let want = Softmax.value_and_grad(z.row(i), pos[i], &mut grad, &mut Default::default());
            assert!((l - f64::from(want)).abs() <= 1e-4 * f64::from(want).abs().max(1.0), "row {i}: {l} vs {want}");
        }
        let hits = sharded.top_k(&Local, &phi, 4).unwrap();
        for (i, h) in hits.iter().enumerate() {
            let mut want = Vec::new();
            top_k(z.row(i), 4, &mut want);
            assert_eq!(h.iter().map(|h| h.class).collect::<Vec<_>>(), want.iter().map(|h| h.class).collect::<Vec<_>>());
        }
    }

    /// The shards' initial rows are the whole layer's rows.
    #[test]
    fn shards_start_as_the_rows_of_the_whole_layer() {
        let cfg = OutputLayerConfig { bias: false, init_std: 0.5, ..Default::default() };
        let opt = OptimizerConfig::Sgd { lr: 0.1, decay: 0.0, l2: 0.0 };
        let whole = OutputLayer::new(10, 3, &cfg, &opt, 9).unwrap();
        for rank in 0..3 {
            let s = ShardedLayer::new(10, rank, 3, 3, &cfg, &opt, 9).unwrap();
            for (local, global) in s.rows().enumerate() {
                assert_eq!(s.layer().weights().row(local), whole.weights().row(global));
            }
        }
        assert!(ShardedLayer::new(2, 0, 3, 3, &cfg, &opt, 9).is_err());
    }
}
