//! The exact dense step a tile of classes at a time, for losses with a tile-by-tile form
//! ([`TiledGradient`]: the softmax, whose normaliser is summarised per tile and merged).
//!
//! The whole-batch step computes `Z = Phi W^T` (`[B, K]`), passes over Z for the loss, then
//! reads the gradients `G` twice more, for `dL/dphi = G W` and `dW = G^T Phi`: at B = 256 and
//! K = 100,000 that is 100 MB streamed through memory five or six times a step, which holds
//! the step well below the rate of the products. Here the classes are cut into tiles of
//! about [`TILE_BYTES`] of scores, each handled by one thread:
//!
//! ```text
//! pass 1, each tile t in parallel:  Z_t = Phi W_t^T (+ b_t);  scan each row (max, exp, sum) while Z_t is in cache
//! merge, each sample:               the tiles' summaries -> its loss and normaliser
//! pass 2, each tile t in parallel:  G_t from the stored Z_t;  dL/dphi += G_t W_t;  W_t -= update(G_t^T Phi)
//! ```
//!
//! so the scores go to memory once and come back once, and the three products are the same
//! as the whole-batch step's (no score is recomputed). `dL/dphi` uses W before its update (a
//! tile's rows are read for it just before they change). Partial sums of `dL/dphi` are kept per
//! fixed group of tiles and added in group order, so the result does not depend on the number
//! of threads.

use super::OutputLayer;
use super::dense_update::{self, Rows, rows_of};
use crate::StepStats;
use crate::optim::UpdateRule;
use farout_core::gemm::{self, Op};
use farout_core::kernels;
use farout_estimators::{Batch, LogSumExp, TiledGradient};
use rayon::prelude::*;
use std::cell::RefCell;
use std::ops::Range;

/// The scores of one tile (`B x tile` floats) are sized to stay in a core's L2 cache beside
/// the tile's rows of W.
pub const TILE_BYTES: usize = 256 * 1024;

/// Groups of tiles with their own partial `dL/dphi` (fewer when there are fewer tiles).
const GROUPS: usize = 32;

/// Classes per tile for a batch of `b`: a multiple of 16 in `[16, k]` near [`TILE_BYTES`].
pub(crate) fn tile_classes(b: usize, k: usize) -> usize {
    let t = (TILE_BYTES / (4 * b.max(1))) / 16 * 16;
    t.clamp(16, k.max(16))
}

thread_local! {
    /// A tile's gradients `[B, tile]`, its `dW` (`tile x D`, adaptive optimisers) and its bias
    /// gradient.
    static TILE_SCRATCH: RefCell<[Vec<f32>; 3]> = const { RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// What one group of tiles of pass 2 reads and writes: its classes' rows of W, optimiser
/// state and bias, their stored scans, and the group's partial `dL/dphi`.
struct Group<'a> {
    classes: Range<usize>,
    w: &'a mut [f32],
    acc_w: &'a mut [f32],
    bias: &'a mut [f32],
    acc_b: &'a mut [f32],
    stored: &'a [f32],
    dphi: &'a mut [f32],
}

impl OutputLayer {
    /// One training step of a dense loss in its tiled form (module docs): the loss and
    /// gradients equal the whole-batch step's up to the order of floating-point sums.
    pub(super) fn train_step_tiled(&mut self, loss: &dyn TiledGradient, batch: Batch, want_dphi: bool) -> StepStats {
        match self.train_dense_tiled(loss, batch, want_dphi, |_| Ok::<_, std::convert::Infallible>(())) {
            Ok(stats) => stats,
            Err(never) => match never {},
        }
    }

    /// The tiled step (module docs) of a layer that may hold only some of the classes: the
    /// positives are rows of this layer, and a positive another rank holds is any id past its
    /// rows (it counts in the number of positives `|P|`, and has no row here). `combine`
    /// turns each sample's summary of this layer's classes into that of all classes (an
    /// allreduce over the ranks of a class-sharded layer) before any gradient is formed; an
    /// error there leaves W, the bias and the optimisers as they were. `dL/dphi` is this
    /// layer's part (the ranks' parts sum to it).
    pub fn train_dense_tiled<E>(
        &mut self,
        loss: &dyn TiledGradient,
        batch: Batch,
        want_dphi: bool,
        combine: impl FnOnce(&mut [LogSumExp]) -> Result<(), E>,
    ) -> Result<StepStats, E> {
        let (b, k) = (batch.phi.rows(), self.n_classes());
        let tile = tile_classes(b, k);
        self.grads.reset_dense(b, k);
        let tile_sums = self.scan_tiles(loss, batch, tile);
        let mut all: Vec<LogSumExp> =
            (0..b).map(|i| tile_sums.iter().fold(LogSumExp::default(), |acc, sums| acc.merge(sums[i]))).collect();
        combine(&mut all)?;
        let loss_sum = all.iter().zip(batch.positives).map(|(s, pos)| s.loss(pos.len())).sum();
        let n_tiles = tile_sums.len();
        let tiles_per_group = n_tiles.div_ceil(GROUPS.min(n_tiles));
        let mut partial =
            vec![0.0f32; if want_dphi { n_tiles.div_ceil(tiles_per_group) * b * self.d_model() } else { 0 }];
        let rules = (self.opt_w.rule(), self.opt_b.rule());
        let groups = self.groups(tile * tiles_per_group, &mut partial);
        groups.into_par_iter().for_each(|g| {
            let first_tile = g.classes.start / tile;
            update_group(g, loss, batch, tile, &tile_sums[first_tile..], &all, rules);
        });
        if want_dphi {
            let d = self.d_model();
            self.dphi.reshape_for_overwrite(b, d);
            let dphi = self.dphi.as_mut_slice();
            dphi.fill(0.0);
            for part in partial.chunks_exact(b * d) {
                kernels::axpy(1.0, part, dphi);
            }
        }
        self.after_update(None);
        self.opt_w.advance();
        self.opt_b.advance();
        Ok(StepStats { loss_sum, classes_scored: b * k, rows_updated: k })
    }

    /// Pass 1: every tile's scores into the gradient buffer (tile-major: tile t's `[B, n_t]`
    /// block starts at `B * t * tile`), scanned row by row; returns each tile's per-sample
    /// summaries.
    fn scan_tiles(&mut self, loss: &dyn TiledGradient, batch: Batch, tile: usize) -> Vec<Vec<LogSumExp>> {
        let (b, k, d) = (batch.phi.rows(), self.n_classes(), self.d_model());
        let (w, bias) = (self.w.as_slice(), self.bias.as_deref());
        let phi = batch.phi.as_slice();
        self.grads
            .dense
            .as_mut_slice()
            .par_chunks_mut(b * tile)
            .enumerate()
            .map(|(t, z)| {
                let rows = t * tile..((t + 1) * tile).min(k);
                let n = rows.len();
                gemm::gemm_serial(
                    z,
                    b,
                    n,
                    0.0,
                    1.0,
                    phi,
                    (b, d),
                    Op::N,
                    &w[rows.start * d..rows.end * d],
                    (n, d),
                    Op::T,
                );
                z.chunks_exact_mut(n)
                    .zip(batch.positives)
                    .map(|(row, pos)| {
                        if let Some(bias) = bias {
                            row.iter_mut().zip(&bias[rows.clone()]).for_each(|(v, c)| *v += c);
                        }
                        loss.scan(rows.clone(), row, pos)
                    })
                    .collect()
            })
            .collect()
    }

    /// The layer's classes cut into groups of `classes_per_group`, each with its slices of W,
    /// the optimisers' state, the bias, the stored scans and `partial` (`[B, D]` per group,
    /// empty when `dL/dphi` is not wanted).
    fn groups<'a>(&'a mut self, classes_per_group: usize, partial: &'a mut [f32]) -> Vec<Group<'a>> {
        let (b, k, d) = (self.grads.dense.rows(), self.n_classes(), self.d_model());
        let n = k.div_ceil(classes_per_group);
        let split = |s: &'a mut [f32], per: usize| -> Vec<&'a mut [f32]> {
            if s.is_empty() { (0..n).map(|_| Default::default()).collect() } else { s.chunks_mut(per).collect() }
        };
        let w = split(self.w.as_mut_slice(), classes_per_group * d);
        let acc_w = split(self.opt_w.accum_mut(), classes_per_group * d);
        let bias = split(self.bias.as_deref_mut().unwrap_or_default(), classes_per_group);
        let acc_b = split(self.opt_b.accum_mut(), classes_per_group);
        let dphi = split(partial, b * d);
        let stored = self.grads.dense.as_slice().chunks(classes_per_group * b);
        let parts = w.into_iter().zip(acc_w).zip(bias).zip(acc_b).zip(stored).zip(dphi);
        parts
            .enumerate()
            .map(|(g, (((((w, acc_w), bias), acc_b), stored), dphi))| Group {
                classes: g * classes_per_group..((g + 1) * classes_per_group).min(k),
                w,
                acc_w,
                bias,
                acc_b,
                stored,
                dphi,
            })
            .collect()
    }
}

/// Pass 2 over one group's tiles, one after another: each tile's gradients from its stored
/// scan, its contribution to the group's `dL/dphi` (W before the update), then its rows' update.
fn update_group(
    group: Group,
    loss: &dyn TiledGradient,
    batch: Batch,
    tile: usize,
    tile_sums: &[Vec<LogSumExp>],
    all: &[LogSumExp],
    rules: (UpdateRule, UpdateRule),
) {
    let Group { classes, w, acc_w, bias, acc_b, stored, dphi } = group;
    let (b, d) = (batch.phi.rows(), batch.phi.cols());
    let phi = batch.phi.as_slice();
    TILE_SCRATCH.with_borrow_mut(|[grad, dw, grad_b]| {
        for (t, start) in classes.clone().step_by(tile).enumerate() {
            let rows = start..(start + tile).min(classes.end);
            let (n, local) = (rows.len(), rows.start - classes.start..rows.end - classes.start);
            grad.resize(b * n, 0.0);
            let tile_stored = &stored[b * local.start..b * local.end];
            for (i, (z, g)) in tile_stored.chunks_exact(n).zip(grad.chunks_exact_mut(n)).enumerate() {
                loss.gradient(rows.clone(), z, batch.positives[i], &tile_sums[t][i], &all[i], g);
            }
            let w_rows = &mut w[local.start * d..local.end * d];
            if !dphi.is_empty() {
                gemm::gemm_serial(dphi, b, d, 1.0, 1.0, grad, (b, n), Op::N, w_rows, (n, d), Op::N);
            }
            let target = Rows {
                w: w_rows,
                acc_w: rows_of(acc_w, &local, d),
                bias: rows_of(bias, &local, 1),
                acc_b: rows_of(acc_b, &local, 1),
            };
            dense_update::apply(target, grad, phi, (b, n, d), rules, (dw, grad_b), false);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OptimizerConfig, OutputLayerConfig};
    use farout_core::{Matrix, rng};
    use farout_estimators::{Exact, GradientEstimator, Softmax};

    /// The tiled step against the whole-batch step (the estimator's dense gradients through
    /// `train_step_with`) over three steps: W, the bias, `dL/dphi` and the loss, with more
    /// tiles than groups, a last tile shorter than the others, several positives, a sample
    /// without positives, and each optimiser.
    #[test]
    fn tiled_steps_equal_whole_batch_steps() {
        let (b, d) = (300, 8);
        let tile = tile_classes(b, usize::MAX);
        let k = (GROUPS + 3) * tile + 5;
        let mut r = rng::seeded(3, 0);
        let phi = Matrix::from_vec(b, d, (0..b * d).map(|_| rng::normal(&mut r)).collect()).unwrap();
        let pos: Vec<Vec<u32>> = (0..b as u32)
            .map(|i| match i % 7 {
                0 => vec![],
                1 => vec![i * 31 % k as u32, (i * 97 + 5) % k as u32],
                _ => vec![(i * 7919) % k as u32],
            })
            .collect();
        let refs: Vec<&[u32]> = pos.iter().map(|p| p.as_slice()).collect();
        let batch = Batch::new(&phi, &refs);
        let est = Exact::new(Softmax);
        for opt in [
            OptimizerConfig::Sgd { lr: 0.5, decay: 0.0, l2: 0.01 },
            // AdaGrad's first step moves an element by lr g / (|g| + eps): about lr sign(g) for
            // any |g| >> eps, so with a tiny eps an element whose gradient cancels to near 0
            // moves by an amount set by rounding; eps = 0.1 keeps the comparison well posed.
            OptimizerConfig::Adagrad { lr: 0.5, eps: 0.1, l2: 0.0 },
            OptimizerConfig::ArSchedule { rho0: 0.5, decay: 0.9, decay_every: 2000, grad_scale: 3.0, l2: 0.1 },
        ] {
            let cfg = OutputLayerConfig { bias: true, init_std: 0.3, ..Default::default() };
            let mut tiled = OutputLayer::new(k, d, &cfg, &opt, 5).unwrap();
            let mut whole = OutputLayer::new(k, d, &cfg, &opt, 5).unwrap();
            for step in 0..3 {
                let got = tiled.train_step(&est, batch, &mut rng::seeded(0, 0), true);
                let want = whole
                    .train_step_with(batch, true, |ctx, batch, grads| {
                        Ok::<_, ()>(est.estimate_batch(ctx, batch, &mut rng::seeded(0, 0), grads))
                    })
                    .unwrap();
                let what = format!("{opt:?}, step {step}");
                assert!((got.loss_sum - want.loss_sum).abs() < 1e-5 * want.loss_sum.abs(), "{what}: loss");
                assert_eq!((got.classes_scored, got.rows_updated), (want.classes_scored, want.rows_updated));
                close(tiled.dphi().as_slice(), whole.dphi().as_slice(), &format!("{what}: dphi"));
                close(tiled.weights().as_slice(), whole.weights().as_slice(), &format!("{what}: W"));
                close(tiled.bias().unwrap(), whole.bias().unwrap(), &format!("{what}: bias"));
            }
        }
    }

    fn close(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{what} [{i}]: {x} vs {y}");
        }
    }

    #[test]
    fn tiles_fit_the_cache_budget_and_the_layer() {
        assert_eq!(tile_classes(256, 100_000), 256);
        assert_eq!(tile_classes(300, 100_000) % 16, 0);
        assert_eq!(tile_classes(100_000, 100_000), 16);
        assert_eq!(tile_classes(1, 40), 40);
    }
}
