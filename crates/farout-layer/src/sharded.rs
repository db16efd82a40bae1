//! The output layer with its classes split over ranks (model parallelism, as the
//! vocabulary-parallel softmax of Megatron-LM and insightface's Partial FC).
//!
//! Rank r of P owns every P-th class, `r, r + P, r + 2P, ...` ([`Strided`]: rows dealt
//! round-robin, so that classes numbered by frequency spread evenly), as the rows of its W,
//! bias and optimiser state. Every rank sees the same batch `Phi`. For exact softmax, with the local scores
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
//! the rows with their [`Strided`] map.

use crate::{OutputLayer, StepStats};
use farout_core::topk::{Hit, top_k};
use farout_core::{ClassId, Matrix, vexp};
use farout_dist::{Collective, DistError, Strided, merge_top_k};
use farout_estimators::{Batch, LogSumExp, Softmax, TiledGradient};
use rayon::prelude::*;
use std::cell::RefCell;
use std::ops::Range;
use std::time::Instant;

/// One exact-softmax step of `layer`, the classes `shard` of a layer split over the ranks of
/// `comm`, on `phi` (the same batch on every rank) with global class ids in
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
    shard: &Strided,
    comm: &dyn Collective,
    phi: &Matrix,
    positives: &[&[ClassId]],
    want_dphi: bool,
    class_chunk: usize,
) -> Result<(StepStats, f64), DistError> {
    let local = local_positives(shard, positives);
    let positives: Vec<&[ClassId]> = local.iter().map(Vec::as_slice).collect();
    let (stats, mut comm_seconds) = if class_chunk > 0 {
        softmax_step_in_passes(layer, comm, phi, &positives, want_dphi, class_chunk)?
    } else {
        softmax_step_whole(layer, comm, phi, &positives, want_dphi)?
    };
    let stats = StepStats { classes_scored: phi.rows() * shard.rows(), ..stats };
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

/// Every sample's positives as rows of the rank holding `shard`: a positive another rank
/// holds becomes `ClassId::MAX`, past every row, so that it still counts in `|P|`.
pub fn local_positives(shard: &Strided, positives: &[&[ClassId]]) -> Vec<Vec<ClassId>> {
    let local = |&p: &ClassId| shard.local(p as usize).map_or(ClassId::MAX, |l| l as ClassId);
    positives.iter().map(|pos| pos.iter().map(local).collect()).collect()
}

/// The positives (rows of this rank, [`local_positives`]) among the rows `rows`, as offsets
/// into `rows`.
fn positives_in<'a>(pos: &'a [ClassId], rows: &'a Range<usize>) -> impl Iterator<Item = usize> + 'a {
    pos.iter().map(|&p| p as usize).filter(|p| rows.contains(p)).map(|p| p - rows.start)
}

/// [`softmax_step`] with all the rank's classes at once, a tile at a time
/// ([`OutputLayer::train_dense_tiled`]), up to the allreduce of `dL/dphi`, on the positives as
/// the rank's rows ([`local_positives`]); returns the seconds spent in collectives.
fn softmax_step_whole(
    layer: &mut OutputLayer,
    comm: &dyn Collective,
    phi: &Matrix,
    positives: &[&[ClassId]],
    want_dphi: bool,
) -> Result<(StepStats, f64), DistError> {
    let mut comm_seconds = 0.0;
    let stats = layer.train_dense_tiled(&Softmax, Batch::new(phi, positives), want_dphi, |sums| {
        let t = Instant::now();
        combine_over_ranks(comm, sums)?;
        comm_seconds += t.elapsed().as_secs_f64();
        Ok(())
    })?;
    Ok((stats, comm_seconds))
}

thread_local! {
    /// A chunk row's scores in the first pass of [`softmax_step_in_passes`].
    static EXP_SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// [`softmax_step`] over the classes `chunk` at a time, up to the allreduce of `dL/dphi`: a
/// first pass merges each row's [`LogSumExp`] summary chunk by chunk, the ranks combine them,
/// and a second pass recomputes each chunk's scores and turns them into its gradients
/// `|P| exp(z - M) / S - [k in P]`, on the positives as the rank's rows ([`local_positives`]);
/// returns the seconds spent in collectives.
fn softmax_step_in_passes(
    layer: &mut OutputLayer,
    comm: &dyn Collective,
    phi: &Matrix,
    positives: &[&[ClassId]],
    want_dphi: bool,
    chunk: usize,
) -> Result<(StepStats, f64), DistError> {
    let b = phi.rows();
    let sums = RefCell::new(vec![LogSumExp::default(); b]);
    let (mut comm_seconds, mut loss_sum) = (0.0, 0.0);
    let rows_updated = layer.train_dense_in_passes(
        phi,
        chunk,
        want_dphi,
        |rows, z| {
            let mut sums = sums.borrow_mut();
            z.par_chunks(rows.len()).zip(sums.par_iter_mut()).zip(positives.par_iter()).for_each(
                |((row, sum), pos)| {
                    // Into a scratch copy: the second pass recomputes the scores anyway.
                    EXP_SCRATCH.with_borrow_mut(|x| {
                        x.clear();
                        x.extend_from_slice(row);
                        *sum = sum.merge(Softmax.scan(rows.clone(), x, pos));
                    });
                },
            );
        },
        || {
            let t = Instant::now();
            combine_over_ranks(comm, &mut sums.borrow_mut())?;
            comm_seconds += t.elapsed().as_secs_f64();
            loss_sum = sums.borrow().iter().zip(positives).map(|(s, pos)| s.loss(pos.len())).sum();
            Ok(())
        },
        |rows, z| {
            let n = rows.len();
            let sums = sums.borrow();
            z.par_chunks_mut(n).zip(positives.par_iter()).zip(sums.par_iter()).for_each(|((row, pos), all)| {
                if pos.is_empty() {
                    row.fill(0.0);
                    return;
                }
                let scale = (pos.len() as f64 / all.exp_sum) as f32;
                vexp::exp_shifted(row, all.max);
                row.iter_mut().for_each(|v| *v *= scale);
                for l in positives_in(pos, &rows) {
                    row[l] -= 1.0;
                }
            });
        },
    )?;
    Ok((StepStats { loss_sum, classes_scored: b * layer.n_classes(), rows_updated }, comm_seconds))
}

/// The `k` best classes of every row of the local scores `z` (`[B, K_r]`, the classes `shard`)
/// over all ranks, best first, with global ids; on every rank.
pub fn merged_top_k(comm: &dyn Collective, z: &Matrix, shard: &Strided, k: usize) -> Result<Vec<Vec<Hit>>, DistError> {
    let local: Vec<Vec<Hit>> = (0..z.rows())
        .into_par_iter()
        .map(|i| {
            let mut hits = Vec::with_capacity(k);
            top_k(z.row(i), k, &mut hits);
            hits.iter_mut().for_each(|h| h.class = shard.global(h.class as usize) as ClassId);
            hits
        })
        .collect();
    merge_top_k(comm, local, k)
}

/// The softmax loss `|P| log sum_k exp(z_k) - sum_{p in P} z_p` of every row of the local scores
/// `z` (`[B, K_r]`, the classes `shard`) over the classes of all ranks (0 for a row without
/// positives); on every rank. Three numbers per row travel, as in [`softmax_step`].
pub fn softmax_losses(
    comm: &dyn Collective,
    z: &Matrix,
    shard: &Strided,
    positives: &[&[ClassId]],
) -> Result<Vec<f64>, DistError> {
    let k = z.cols();
    let local = local_positives(shard, positives);
    let mut sums: Vec<LogSumExp> =
        (0..z.rows()).into_par_iter().map(|i| Softmax.scan(0..k, &mut z.row(i).to_vec(), &local[i])).collect();
    combine_over_ranks(comm, &mut sums)?;
    Ok(sums.iter().zip(positives).map(|(s, pos)| s.loss(pos.len())).collect())
}

/// Turns every rank's [`LogSumExp`] summaries of its classes into those of all classes, in
/// place: an allreduce of the maxima `M`, then one of the sums rescaled to `M` together with
/// the positive score sums (each positive has one owner).
fn combine_over_ranks(comm: &dyn Collective, sums: &mut [LogSumExp]) -> Result<(), DistError> {
    let b = sums.len();
    let mut max: Vec<f32> = sums.iter().map(|s| s.max).collect();
    comm.allreduce_max_f32(&mut max)?;
    let mut totals = vec![0f64; 2 * b];
    for (i, s) in sums.iter().enumerate() {
        totals[i] = s.exp_sum_at(max[i]);
        totals[b + i] = s.pos_sum;
    }
    comm.allreduce_sum_f64(&mut totals)?;
    for (i, s) in sums.iter_mut().enumerate() {
        *s = LogSumExp { max: max[i], exp_sum: totals[i], pos_sum: totals[b + i] };
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
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
        let losses = softmax_losses(&Local, &z, &Strided::whole(k), &pos).unwrap();
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

    /// Ranks as threads: the class-sharded softmax step, whole (several tiles per rank, the
    /// positives often on another rank) and in chunks, equals the one-process step of the whole
    /// layer: the loss, `dL/dphi` (summed over the ranks) and each rank's rows.
    #[test]
    fn ranks_as_threads_step_like_the_whole_softmax_layer() {
        let (k, d, b) = (3001, 8, 300);
        let cfg = OutputLayerConfig { bias: true, init_std: 0.3, ..Default::default() };
        let opt = OptimizerConfig::Sgd { lr: 0.5, decay: 0.0, l2: 0.01 };
        let mut r = rng::seeded(4, 0);
        let phi = Matrix::from_vec(b, d, (0..b * d).map(|_| rng::normal(&mut r)).collect()).unwrap();
        let labels: Vec<Vec<u32>> = (0..b).map(|i| vec![(i * 7919 % k) as u32, (i * 13 % k) as u32]).collect();
        let pos: Vec<&[u32]> = labels.iter().map(Vec::as_slice).collect();
        let mut whole = OutputLayer::new(k, d, &cfg, &opt, 7).unwrap();
        let steps: Vec<(f64, Matrix)> = (0..3)
            .map(|_| {
                let s = whole.train_step(&Exact::new(Softmax), Batch::new(&phi, &pos), &mut r, true);
                (s.loss_sum, whole.dphi().clone())
            })
            .collect();
        for (ranks, chunk) in [(2, 0), (3, 0), (2, 500)] {
            farout_dist::Threads::run(ranks, |comm| {
                let mut layer = ShardedLayer::new(k, comm.rank(), ranks, d, &cfg, &opt, 7).unwrap();
                for (step, (loss, dphi)) in steps.iter().enumerate() {
                    let got = layer.softmax_step(comm, &phi, &pos, true, chunk).unwrap();
                    let what = format!("{ranks} ranks, chunk {chunk}, step {step}");
                    assert!((got.loss_sum - loss).abs() <= 1e-5 * loss.abs(), "{what}: {} vs {loss}", got.loss_sum);
                    // Relative to the largest element: dL/dphi sums B x K products.
                    let (got, want) = (layer.layer().dphi().as_slice(), dphi.as_slice());
                    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
                    let e = got.iter().zip(want).map(|(u, v)| (u - v).abs()).fold(0.0f32, f32::max) / scale;
                    assert!(e < 1e-5, "{what}: dphi, relative error {e} (largest element {scale})");
                }
                let mine = rows_of(whole.weights(), layer.shard());
                let diff = layer.layer().weights().as_slice().iter().zip(&mine).map(|(u, v)| (u - v).abs());
                assert!(diff.fold(0.0f32, f32::max) < 1e-5, "{ranks} ranks, chunk {chunk}, rank {}", comm.rank());
            });
        }
    }

    /// The rows of `w` that the rank holding `shard` holds, in its order.
    pub(crate) fn rows_of(w: &Matrix, shard: &Strided) -> Vec<f32> {
        (0..shard.len()).flat_map(|l| w.row(shard.global(l)).to_vec()).collect()
    }

    /// The shards' initial rows are the whole layer's rows: class c on rank c mod 3.
    #[test]
    fn shards_start_as_the_rows_of_the_whole_layer() {
        let cfg = OutputLayerConfig { bias: false, init_std: 0.5, ..Default::default() };
        let opt = OptimizerConfig::Sgd { lr: 0.1, decay: 0.0, l2: 0.0 };
        let whole = OutputLayer::new(10, 3, &cfg, &opt, 9).unwrap();
        for rank in 0..3 {
            let s = ShardedLayer::new(10, rank, 3, 3, &cfg, &opt, 9).unwrap();
            assert_eq!(s.layer().n_classes(), [4, 3, 3][rank]);
            for local in 0..s.layer().n_classes() {
                assert_eq!(s.layer().weights().row(local), whole.weights().row(3 * local + rank));
            }
        }
        assert!(ShardedLayer::new(2, 0, 3, 3, &cfg, &opt, 9).is_err());
    }
}
