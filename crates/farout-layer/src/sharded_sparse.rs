//! Search, sampling and margin estimators on a class-sharded output layer (see
//! [`crate::sharded`] for the layout and [`farout_estimators::ShardPlan`] for why these
//! estimators decompose).
//!
//! One step on `B` samples, the same batch on every rank. The search estimators work each
//! sample on one rank (`sharded_search`: each rank's hits are routed to the rank working on
//! their sample, which merges them or, with several blocks or a bias, learns where each
//! block's top-Q is cut and receives its candidates scored by their owners; it evaluates the
//! loss and sends each owner its classes' gradients). The others:
//!
//! ```text
//! near:    each rank scores all its classes; the best negative score M over the ranks;
//!          gather the classes scoring at least M - width, and the positives
//! draw:    every rank draws the same classes    -> the candidates, with score corrections
//! score:   each rank scores the candidates it owns exactly, 0 for the others; allreduce sum
//! loss:    each rank evaluates L(z_U, P) on its part of the samples (B / P of them); one
//!          allgather gives every rank every sample's dL/dz_U (a drawn loss, which may keep
//!          per-sample state that every rank holds, is evaluated by every rank instead)
//! update:  each rank keeps dL/dz_c of its own classes: its rows, dL/dphi summed by allreduce
//! ```
//!
//! A near step moves, per sample, the classes near the best, one score per candidate and, from
//! the rank that evaluated the sample, one gradient per candidate; a draw step one score per
//! candidate. On one rank the step is the estimator's own one-process step, and with
//! brute-force indexes the steps of P ranks are those of one process. The ranks' indexes
//! rebuild together, with the norm bound of all the ranks' rows and, for spherical indexes,
//! on rank 0's centroids (so that every rank's clusters, and the rows it probes, stay alike).

use crate::sharded::allreduce_dphi;
use crate::{OutputLayer, StepStats};
use farout_core::topk::Hit;
use farout_core::{ClassId, Matrix, Rng};
use farout_dist::{Collective, DistError, Strided};
use farout_estimators::{
    Batch, BatchEstimate, Ctx, Drawn, DrawnLoss, GradientEstimator, Loss, LossScratch, RescoreScratch, ShardPlan,
    Slots, complete_scores,
};
use rayon::prelude::*;
use std::cell::RefCell;
use std::time::Instant;

/// One sample's candidates `U` over all ranks, in the order one process builds them.
#[derive(Default)]
pub(crate) struct Candidates {
    /// Global class ids.
    pub(crate) classes: Vec<ClassId>,
    /// Scores: the corrections of drawn classes (0 for searched ones) until the ranks' exact
    /// scores are added.
    pub(crate) z: Vec<f32>,
    /// Positions of the positives in `classes`.
    pub(crate) pos: Vec<ClassId>,
    /// The block scores the searches found: (position in `classes`, block, score).
    pub(crate) found: Vec<(u32, u32, f32)>,
}

impl Candidates {
    /// Every block's merged top-Q (`blocks[j]`), in block order, then the positives, over a
    /// layer of `k` classes (placed with this thread's [`Slots`]).
    pub(crate) fn set_searched<'a>(
        &mut self,
        blocks: impl Iterator<Item = &'a [Hit]>,
        positives: &[ClassId],
        k: usize,
    ) {
        self.classes.clear();
        self.found.clear();
        self.pos.clear();
        SLOTS.with_borrow_mut(|slots| {
            slots.begin(k);
            let mut at = |classes: &mut Vec<ClassId>, c: ClassId| {
                let (u, new) = slots.insert(c, classes.len());
                if new {
                    classes.push(c);
                }
                u as u32
            };
            for (j, hits) in blocks.enumerate() {
                for h in hits {
                    let u = at(&mut self.classes, h.class);
                    self.found.push((u, j as u32, h.score));
                }
            }
            for &p in positives {
                let u = at(&mut self.classes, p);
                self.pos.push(u);
            }
        });
        self.z.clear();
        self.z.resize(self.classes.len(), 0.0);
    }

    /// One block's merged top-Q (`hits`, distinct classes), then the positives it misses:
    /// [`Self::set_searched`] of one block without a hash map (a positive is looked up among
    /// the hits, as one process's mips does).
    pub(crate) fn set_single(&mut self, hits: &[Hit], positives: &[ClassId]) {
        self.classes.clear();
        self.found.clear();
        self.pos.clear();
        self.classes.extend(hits.iter().map(|h| h.class));
        self.found.extend(hits.iter().enumerate().map(|(u, h)| (u as u32, 0, h.score)));
        for &p in positives {
            let u = self.classes.iter().position(|&c| c == p).unwrap_or_else(|| {
                self.classes.push(p);
                self.classes.len() - 1
            });
            self.pos.push(u as ClassId);
        }
        self.z.clear();
        self.z.resize(self.classes.len(), 0.0);
    }

    /// Drawn classes: the positives come first.
    fn set_drawn(&mut self, drawn: &Drawn) {
        self.classes.clone_from(&drawn.classes);
        self.z.clone_from(&drawn.corrections);
        self.found.clear();
        self.pos.clear();
        self.pos.extend(0..drawn.positives as ClassId);
    }
}

/// Per-thread buffers of the owner's scoring.
#[derive(Default)]
struct OwnerScratch {
    /// The candidates this rank owns: local ids, and their positions in the sample's `U`.
    local: Vec<ClassId>,
    at: Vec<usize>,
    /// Position of each candidate among `local` (`u32::MAX`: another rank's).
    of: Vec<u32>,
    scores: Vec<f32>,
    rescore: RescoreScratch,
}

impl OwnerScratch {
    /// The exact scores of the candidates of `c` that the rank holding `shard` (its rows in
    /// `ctx`) owns, into `out` (one per candidate; the others' left 0), completing the block
    /// scores found by `n_blocks` searches. Returns the classes scored, in full rows.
    fn score(
        &mut self,
        ctx: &Ctx,
        n_blocks: usize,
        shard: &Strided,
        phi: &[f32],
        c: &Candidates,
        out: &mut [f32],
    ) -> usize {
        self.local.clear();
        self.at.clear();
        self.of.clear();
        for (u, &class) in c.classes.iter().enumerate() {
            match shard.local(class as usize) {
                Some(l) => {
                    self.of.push(self.local.len() as u32);
                    self.local.push(l as ClassId);
                    self.at.push(u);
                }
                None => self.of.push(u32::MAX),
            }
        }
        let of = &self.of;
        let found = c
            .found
            .iter()
            .filter(|f| of[f.0 as usize] != u32::MAX)
            .map(|&(u, j, score)| (of[u as usize] as usize, j as usize, score));
        let dots = complete_scores(ctx, n_blocks, phi, &self.local, found, &mut self.rescore, &mut self.scores);
        for (&u, &z) in self.at.iter().zip(&self.scores) {
            out[u] = z;
        }
        dots.div_ceil(n_blocks)
    }
}

thread_local! {
    /// The batch's candidates, kept with their capacity across steps (on the calling thread).
    static CANDIDATES: RefCell<(Vec<Candidates>, Vec<Drawn>, Vec<f32>)> = RefCell::new(Default::default());
    static OWNER: RefCell<OwnerScratch> = RefCell::new(OwnerScratch::default());
    /// Where each class sits in the candidate set being built ([`Candidates::set_searched`]).
    static SLOTS: RefCell<Slots> = RefCell::new(Slots::default());
}

/// One step of the estimator planned by `plan` on `layer`, the classes `shard` of a layer split
/// over the ranks of `comm`, on `batch` (the same on every rank;
/// global class ids) with `rng` (in the same state on every rank: sampling estimators draw
/// from it). Returns the loss of the whole layer's estimate and the classes scored by all ranks
/// (the same on every rank), with this rank's rows updated and its index refreshed, `dL/dphi`
/// summed over the ranks (in `layer.dphi()`, when `want_dphi`), and what the collectives cost.
#[allow(clippy::too_many_arguments)]
pub fn sparse_step(
    layer: &mut OutputLayer,
    shard: &Strided,
    comm: &dyn Collective,
    plan: ShardPlan,
    batch: Batch,
    rng: &mut Rng,
    want_dphi: bool,
) -> Result<(StepStats, CommCost), DistError> {
    let mut ranks = StepComm { comm, shard, seconds: 0.0, bytes: 0, clock: Instant::now(), phases: Phases::default() };
    if comm.size() > 1 && matches!(plan, ShardPlan::Search { .. }) {
        ranks.rebuild_indexes_together(layer)?;
    }
    let stats = layer.train_step_with(batch, want_dphi, |ctx, batch, grads| {
        ranks.phases.index += ranks.lap();
        CANDIDATES.with_borrow_mut(|(cands, drawn, scores_buf)| {
            let b = batch.phi.rows();
            cands.resize_with(b, Candidates::default);
            cands.truncate(b);
            // 1. The candidates: every block's top-Q over the ranks, or the draws.
            let (cost, loss, n_blocks) = match plan {
                ShardPlan::Search { top, loss } => return ranks.search_estimate(ctx, batch, top, loss, grads),
                ShardPlan::Near { width, loss } => {
                    let cost = ranks.near_candidates(ctx, batch, width, cands, scores_buf)?;
                    (cost, StepLoss::Scores(loss), 1)
                }
                ShardPlan::Draw { draw, loss } => {
                    draw.draw_batch(shard.rows(), batch.positives, rng, drawn);
                    cands.par_iter_mut().zip(drawn.par_iter()).for_each(|(c, d)| c.set_drawn(d));
                    ranks.phases.search += ranks.lap();
                    (0, StepLoss::Drawn(loss, drawn.as_slice()), 1)
                }
            };
            // 2. The exact scores, each from the rank that owns the class.
            let classes_scored = ranks.exact_scores(ctx, batch, n_blocks, cands, cost)?;
            ranks.phases.score += ranks.lap();
            // 3. The loss: of the scores alone, each rank evaluates its part of the samples and
            //    the ranks gather the gradients; of the draws (which may keep per-sample state,
            //    held by every rank), every rank evaluates it. Each keeps its own classes'.
            let loss_sum = match loss {
                StepLoss::Scores(loss) if comm.size() > 1 => ranks.split_loss(grads, cands, loss)?,
                _ => own_class_gradients(batch, grads, cands, loss, shard),
            };
            ranks.phases.loss += ranks.lap();
            Ok(BatchEstimate { loss_sum, classes_scored })
        })
    })?;
    if want_dphi {
        ranks.seconds += allreduce_dphi(layer, comm)?;
        ranks.bytes += 4 * layer.dphi().as_slice().len();
    }
    ranks.phases.update += ranks.lap();
    Ok((stats, CommCost { seconds: ranks.seconds, bytes: ranks.bytes, phases: ranks.phases }))
}

/// Every block's centroids as bytes: the number of blocks, then per block its rows and
/// columns (`u32`) and values (`f32`), little-endian; nothing for none.
fn centroid_bytes(blocks: &[Matrix]) -> Vec<u8> {
    let mut out = (blocks.len() as u32).to_le_bytes().to_vec();
    for m in blocks {
        out.extend((m.rows() as u32).to_le_bytes());
        out.extend((m.cols() as u32).to_le_bytes());
        out.extend(m.as_slice().iter().flat_map(|v| v.to_le_bytes()));
    }
    out
}

/// The centroids [`centroid_bytes`] wrote (none for no bytes).
fn centroids_of_bytes(bytes: &[u8]) -> Result<Vec<Matrix>, DistError> {
    let bad = || DistError::Mpi(format!("rank 0 broadcast {} bytes that are not an index's centroids", bytes.len()));
    let mut words = bytes.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
    if !bytes.len().is_multiple_of(4) {
        return Err(bad());
    }
    let n_blocks = words.next().unwrap_or(0) as usize;
    let mut blocks = Vec::with_capacity(n_blocks.min(bytes.len()));
    for _ in 0..n_blocks {
        let (rows, cols) = (words.next().ok_or_else(bad)? as usize, words.next().ok_or_else(bad)? as usize);
        let n = rows.checked_mul(cols).filter(|&n| n <= words.len()).ok_or_else(bad)?;
        let values: Vec<f32> = words.by_ref().take(n).map(f32::from_bits).collect();
        blocks.push(Matrix::from_vec(rows, cols, values).map_err(|_| bad())?);
    }
    if words.next().is_some() { Err(bad()) } else { Ok(blocks) }
}

/// The collectives of one [`sparse_step`] of the rank holding `shard`, and what they cost it.
pub(crate) struct StepComm<'c> {
    pub(crate) comm: &'c dyn Collective,
    pub(crate) shard: &'c Strided,
    /// Wall time in collectives so far.
    seconds: f64,
    /// Bytes contributed so far.
    pub(crate) bytes: usize,
    /// The end of the last phase timed, and the phases so far.
    clock: Instant,
    pub(crate) phases: Phases,
}

impl StepComm<'_> {
    /// Seconds since the end of the last phase timed: the phase that ends now.
    pub(crate) fn lap(&mut self) -> f64 {
        let now = Instant::now();
        let seconds = now.duration_since(self.clock).as_secs_f64();
        self.clock = now;
        seconds
    }

    /// Runs the collective `f`, adding its wall time to `seconds`.
    pub(crate) fn timed(&mut self, f: &mut dyn FnMut() -> Result<(), DistError>) -> Result<(), DistError> {
        let t = Instant::now();
        let r = f();
        self.seconds += t.elapsed().as_secs_f64();
        r
    }

    /// One rank's rebuild is every rank's (otherwise each rank's would stall the others),
    /// with the norm bound of the whole layer's rows, and on rank 0's centroids where its index
    /// has some: rank 0 builds first and broadcasts them, so that every rank's clusters stay
    /// alike in size as rows move between them ([`farout_search::IndexConfig::build_on`]).
    fn rebuild_indexes_together(&mut self, layer: &mut OutputLayer) -> Result<(), DistError> {
        let comm = self.comm;
        let mut due = [f32::from(u8::from(layer.index_rebuild_due()))];
        self.timed(&mut || comm.allreduce_max_f32(&mut due))?;
        self.bytes += 4;
        if due[0] > 0.0 {
            let mut norms = layer.index_block_norms();
            self.timed(&mut || comm.allreduce_max_f32(&mut norms))?;
            self.bytes += 4 * norms.len();
            layer.request_index_rebuild(norms);
            let mut shared = Vec::new();
            if comm.is_root() {
                layer.build_index_on(Vec::new());
                shared = layer.index_centroids().map_or_else(Vec::new, |c| centroid_bytes(&c));
            }
            self.bytes += shared.len();
            self.timed(&mut || comm.broadcast_bytes(0, &mut shared))?;
            if !comm.is_root() {
                layer.build_index_on(centroids_of_bytes(&shared)?);
            }
        }
        Ok(())
    }

    /// Near: every class of the rank scored (into `scores_buf`), the best negative score M over
    /// the ranks, and as `U` the positives and the classes scoring at least M − `width`,
    /// gathered from all ranks. Returns the classes scored.
    fn near_candidates(
        &mut self,
        ctx: &Ctx,
        batch: Batch,
        width: f32,
        cands: &mut [Candidates],
        scores_buf: &mut Vec<f32>,
    ) -> Result<usize, DistError> {
        let (comm, shard, b) = (self.comm, self.shard, batch.phi.rows());
        let (k_local, d) = (ctx.n_classes(), ctx.w.cols());
        // Every score of the rank, without the bias (the owner's scoring adds it).
        scores_buf.resize(b * k_local, 0.0);
        farout_core::gemm::scores(batch.phi.as_slice(), b, ctx.w.as_slice(), k_local, d, scores_buf);
        let cost = b * k_local;
        let with_bias = |l: usize, z: f32| z + ctx.bias.map_or(0.0, |bias| bias[l]);
        let is_pos = |i: usize, l: usize| batch.positives[i].contains(&(shard.global(l) as ClassId));
        let mut best: Vec<f32> = scores_buf
            .par_chunks(k_local.max(1))
            .enumerate()
            .map(|(i, z)| {
                let negatives = z.iter().enumerate().filter(|&(l, _)| !is_pos(i, l));
                negatives.map(|(l, &z)| with_bias(l, z)).fold(f32::NEG_INFINITY, f32::max)
            })
            .collect();
        self.timed(&mut || comm.allreduce_max_f32(&mut best))?;
        self.phases.search += self.lap();
        // The positives, and the negatives a little wider than the loss needs (a
        // class at the edge has no gradient anyway). `!(z < cut)` keeps non-finite
        // scores, so that a diverged model's loss is NaN, as in one process.
        let mut local: Vec<Vec<Hit>> = scores_buf
            .par_chunks(k_local.max(1))
            .zip(&best)
            .enumerate()
            .map(|(i, (z, &m))| {
                let cut = m - width * (1.0 + 1e-4) - 1e-6 * m.abs();
                let near = z.iter().enumerate().filter(|&(l, &z)| is_pos(i, l) || !(with_bias(l, z) < cut));
                near.map(|(l, &score)| Hit { class: shard.global(l) as ClassId, score }).collect()
            })
            .collect();
        let (mut merged, mut sent) = (Vec::new(), 0);
        self.timed(&mut || {
            (merged, sent) = farout_dist::gather_all_hits(comm, std::mem::take(&mut local))?;
            Ok(())
        })?;
        self.bytes += 4 * b + 8 * sent * b; // the best scores, then the hits' scores and ids
        cands.par_iter_mut().zip(&merged).zip(batch.positives).for_each(|((c, hits), pos)| {
            c.set_searched(std::iter::once(hits.as_slice()), pos, shard.rows());
        });
        self.phases.candidates += self.lap();
        Ok(cost)
    }

    /// Each rank scores the candidates it owns exactly (completing the block scores of
    /// `n_blocks` searches), 0 for the others; the allreduced sums are added to the candidates'
    /// `z`. Returns the classes scored by all ranks, `cost` (this rank's so far) included.
    fn exact_scores(
        &mut self,
        ctx: &Ctx,
        batch: Batch,
        n_blocks: usize,
        cands: &mut [Candidates],
        mut cost: usize,
    ) -> Result<usize, DistError> {
        let (comm, shard, b) = (self.comm, self.shard, batch.phi.rows());
        // Up to MAX_FUSED_RANKS ranks, the rank's cost travels after the scores ([`cost_limbs`]).
        let fused = comm.size() <= MAX_FUSED_RANKS;
        let n_scores = cands.iter().map(|c| c.classes.len()).sum();
        let mut scores = vec![0f32; n_scores + if fused { COST_LIMBS } else { 0 }];
        let mut parts = Vec::with_capacity(b);
        let mut rest = scores.as_mut_slice();
        for c in cands.iter() {
            let (part, tail) = rest.split_at_mut(c.classes.len());
            parts.push(part);
            rest = tail;
        }
        cost += parts
            .par_iter_mut()
            .zip(cands.par_iter())
            .enumerate()
            .map(|(i, (out, c))| OWNER.with_borrow_mut(|o| o.score(ctx, n_blocks, shard, batch.phi.row(i), c, out)))
            .sum::<usize>();
        let mut cost_sum = [cost as u64];
        if fused {
            scores[n_scores..].copy_from_slice(&cost_limbs(cost as u64));
        }
        self.bytes += 4 * scores.len() + if fused { 0 } else { 8 };
        self.timed(&mut || {
            comm.allreduce_sum_f32(&mut scores)?;
            if fused { Ok(()) } else { comm.allreduce_sum_u64(&mut cost_sum) }
        })?;
        if fused {
            cost_sum[0] = cost_of_limbs(&scores[n_scores..]);
        }
        let mut at = 0;
        for c in cands.iter_mut() {
            let n = c.classes.len();
            c.z.iter_mut().zip(&scores[at..at + n]).for_each(|(z, s)| *z += s);
            at += n;
        }
        Ok(cost_sum[0] as usize)
    }
}

impl StepComm<'_> {
    /// `loss` on every sample's candidates, split over the ranks: rank r evaluates the samples
    /// of its part (`B r / P..B (r + 1) / P`), one allgather gives every rank each sample's loss
    /// and gradient in sample order, and each keeps the gradient of its own classes in `grads`.
    /// The values are those of [`own_class_gradients`], which every rank would compute alike;
    /// the ranks evaluate `B / P` samples each and send `4 (B / P + sum |U_i|)` bytes more.
    /// Returns the batch's loss sum.
    fn split_loss(
        &mut self,
        grads: &mut farout_estimators::BatchGrad,
        cands: &[Candidates],
        loss: &dyn Loss,
    ) -> Result<f64, DistError> {
        let (comm, shard, b) = (self.comm, self.shard, cands.len());
        let ranks = comm.size();
        let part = |r: usize| b * r / ranks..b * (r + 1) / ranks;
        // Sample i travels as its loss, then one gradient per candidate.
        let counts: Vec<usize> = (0..ranks).map(|r| cands[part(r)].iter().map(|c| 1 + c.z.len()).sum()).collect();
        let mine = &cands[part(comm.rank())];
        let mut send = vec![0f32; counts[comm.rank()]];
        split_per_sample(&mut send, mine).into_par_iter().zip(mine.par_iter()).for_each_init(
            LossScratch::default,
            |scratch, (out, c)| {
                let (l, grad) = out.split_first_mut().expect("a sample's loss");
                *l = loss.value_and_grad(&c.z, &c.pos, grad, scratch);
            },
        );
        let mut all = vec![0f32; counts.iter().sum()];
        self.bytes += 4 * send.len();
        self.timed(&mut || comm.allgatherv_f32(&send, &counts, &mut all))?;
        grads.reset_sparse(b);
        grads.losses.resize(b, 0.0);
        let owned = |c: ClassId| shard.local(c as usize);
        let samples = split_per_sample(&mut all, cands);
        grads.sparse.par_iter_mut().zip(grads.losses.par_iter_mut()).zip(samples).zip(cands).for_each(
            |(((g, l), got), c)| {
                *l = got[0];
                for (&class, &v) in c.classes.iter().zip(&got[1..]) {
                    if let Some(local) = owned(class)
                        && v != 0.0
                    {
                        g.push(local as ClassId, v);
                    }
                }
            },
        );
        Ok(grads.losses.iter().map(|&l| f64::from(l)).sum())
    }
}

/// Ranks up to which a step's cost (a count of dot products) travels in the scores' allreduce,
/// as [`COST_LIMBS`] limbs of 16 bits, one f32 each: a sum of P limbs is at most
/// `P (2^16 - 1)`, an integer f32 holds exactly while it is below 2^24, so up to 256 ranks
/// the summed limbs carry the exact sum, and one meeting of the ranks per step is saved.
const MAX_FUSED_RANKS: usize = 256;
/// Limbs of 16 bits in a u64.
const COST_LIMBS: usize = 4;

/// `cost` as its four 16-bit limbs, least significant first.
fn cost_limbs(cost: u64) -> [f32; COST_LIMBS] {
    std::array::from_fn(|j| ((cost >> (16 * j)) & 0xFFFF) as f32)
}

/// The sum whose limbs (each summed over the ranks) are `limbs`: `sum_j limbs[j] 2^(16 j)`.
fn cost_of_limbs(limbs: &[f32]) -> u64 {
    let sum: u128 = limbs.iter().enumerate().map(|(j, &l)| (l as u128) << (16 * j)).sum();
    u64::try_from(sum).unwrap_or(u64::MAX)
}

/// `buf` cut into one slice per sample of `cands`: its loss and one value per candidate.
pub(crate) fn split_per_sample<'b, 'c>(
    mut buf: &'b mut [f32],
    cands: impl IntoIterator<Item = &'c Candidates>,
) -> Vec<&'b mut [f32]> {
    let mut out = Vec::new();
    for c in cands {
        let (head, tail) = std::mem::take(&mut buf).split_at_mut(1 + c.z.len());
        out.push(head);
        buf = tail;
    }
    out
}

/// The same loss on every rank, from the candidates' scores; each rank keeps the gradient of
/// its own classes (`shard`) in `grads`. Returns the batch's loss sum.
fn own_class_gradients(
    batch: Batch,
    grads: &mut farout_estimators::BatchGrad,
    cands: &[Candidates],
    loss: StepLoss,
    shard: &Strided,
) -> f64 {
    let b = batch.phi.rows();
    let owned = |c: ClassId| shard.local(c as usize);
    grads.reset_sparse(b);
    grads.losses.resize(b, 0.0);
    grads
        .sparse
        .par_iter_mut()
        .zip(grads.losses.par_iter_mut())
        .zip(cands.par_iter())
        .enumerate()
        .map_init(
            || (Vec::new(), LossScratch::default()),
            |(grad, scratch), (i, ((g, l), c))| {
                grad.resize(c.z.len(), 0.0);
                *l = match loss {
                    StepLoss::Scores(loss) => loss.value_and_grad(&c.z, &c.pos, grad, scratch),
                    StepLoss::Drawn(loss, drawn) => {
                        let id = batch.ids.get(i).copied();
                        loss.drawn_value_and_grad(id, &drawn[i], &c.z, &c.pos, grad, scratch)
                    }
                };
                for (&class, &v) in c.classes.iter().zip(grad.iter()) {
                    if let Some(local) = owned(class)
                        && v != 0.0
                    {
                        g.push(local as ClassId, v);
                    }
                }
                f64::from(*l)
            },
        )
        .sum()
}

/// The loss a step evaluates on every sample's candidates: of their scores alone, or of a
/// Draw plan's draws too (which may keep per-sample state by the batch's ids).
#[derive(Clone, Copy)]
enum StepLoss<'a> {
    Scores(&'a dyn Loss),
    Drawn(&'a dyn DrawnLoss, &'a [Drawn]),
}

/// Whether `estimator` trains a class-sharded layer: the exact softmax, from the ranks'
/// normalisers ([`crate::sharded::softmax_step`]), or an estimator with a [`ShardPlan`]
/// ([`sparse_step`]).
pub fn trains_sharded(estimator: &dyn GradientEstimator) -> bool {
    is_exact_softmax(estimator) || estimator.shard_plan().is_some()
}

/// Whether `estimator` is the exact softmax, the one a class-sharded layer may visit in class
/// chunks.
pub fn is_exact_softmax(estimator: &dyn GradientEstimator) -> bool {
    estimator.name() == "softmax"
}

/// One step of `estimator` ([`trains_sharded`]) on `layer`, the classes `shard` of a layer split
/// over the ranks of `comm`: [`crate::sharded::softmax_step`]
/// (visiting the classes `class_chunk` at a time, when > 0) for the exact softmax,
/// [`sparse_step`] for the others, which take no `class_chunk`.
#[allow(clippy::too_many_arguments)]
pub fn estimator_step(
    layer: &mut OutputLayer,
    shard: &Strided,
    comm: &dyn Collective,
    estimator: &dyn GradientEstimator,
    batch: Batch,
    rng: &mut Rng,
    want_dphi: bool,
    class_chunk: usize,
) -> Result<(StepStats, CommCost), DistError> {
    match estimator.shard_plan() {
        Some(plan) if !is_exact_softmax(estimator) => sparse_step(layer, shard, comm, plan, batch, rng, want_dphi),
        _ => {
            let (phi, positives) = (batch.phi, batch.positives);
            let (stats, seconds) =
                crate::sharded::softmax_step(layer, shard, comm, phi, positives, want_dphi, class_chunk)?;
            let bytes = crate::ShardedLayer::softmax_step_bytes(phi.rows(), layer.d_model(), want_dphi);
            Ok((stats, CommCost { seconds, bytes, phases: Phases::default() }))
        }
    }
}

/// What the collectives of a step cost one rank, and where its time went.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CommCost {
    /// Wall time spent in collectives (waiting for the slowest rank included).
    pub seconds: f64,
    /// Bytes this rank contributed to the collectives (each counted once).
    pub bytes: usize,
    /// The wall time of the step's phases ([`sparse_step`]'s; all 0 for the exact softmax).
    pub phases: Phases,
}

/// Wall time of the phases of one [`sparse_step`] on one rank, in seconds, each with the
/// collectives it ends with (waiting for the slowest rank included). They add up to the step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Phases {
    /// Agreeing on a rebuild of the indexes, and building them when due.
    pub index: f64,
    /// Finding the candidates on this rank: its searches (every score of its classes and
    /// their best for the exact margin; the draws for a sampling estimator).
    pub search: f64,
    /// Gathering the ranks' hits and building each sample's candidate set.
    pub candidates: f64,
    /// The owners' exact scores of the candidates, summed over the ranks.
    pub score: f64,
    /// The loss and its gradients, gathered over the ranks.
    pub loss: f64,
    /// Updating this rank's rows and index; `dL/dphi` summed over the ranks.
    pub update: f64,
}

impl Phases {
    /// The phases' names, as [`Phases::seconds`] lists them.
    pub const NAMES: [&'static str; 6] = ["index", "search", "candidates", "score", "loss", "update"];

    /// The phases' seconds, in the order of [`Phases::NAMES`].
    pub fn seconds(&self) -> [f64; 6] {
        [self.index, self.search, self.candidates, self.score, self.loss, self.update]
    }

    /// Adds `other`'s seconds to these.
    pub fn add(&mut self, other: &Phases) {
        self.index += other.index;
        self.search += other.search;
        self.candidates += other.candidates;
        self.score += other.score;
        self.loss += other.loss;
        self.update += other.update;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IndexUpkeep, OptimizerConfig, OutputLayerConfig};
    use farout_core::{Matrix, rng};
    use farout_dist::Local;
    use farout_estimators::{
        ActiveSet, ArLogistic, ArProbit, ArSoftmax, GradientEstimator, Iterations, Ldgs, Mips, NegativeSampling, Ove,
        Proposal, Rescore, SampledSoftmax, SmoothedMargin, Softmax,
    };
    use farout_search::IndexConfig;

    /// On one rank, `sparse_step` takes the estimator's own steps: the same losses, costs,
    /// rows, `dL/dphi` and weights over several steps (the index refreshed in between).
    fn steps_like_the_estimator(
        name: &str,
        est: &dyn GradientEstimator,
        index: Option<(IndexConfig, usize)>,
        bias: bool,
    ) {
        steps_like_the_estimator_from(name, est, est, index, bias, 0.5);
    }

    /// [`steps_like_the_estimator`] from W with entries of standard deviation `init_std`, the
    /// sharded step taken by `est` and the one-process step by `twin` (a second instance of
    /// the same estimator when it keeps per-sample state). The batch has sample ids.
    fn steps_like_the_estimator_from(
        name: &str,
        est: &dyn GradientEstimator,
        twin: &dyn GradientEstimator,
        index: Option<(IndexConfig, usize)>,
        bias: bool,
        init_std: f32,
    ) {
        let (k, d, b) = (2000, 32, 40);
        let cfg = OutputLayerConfig { bias, init_std, ..Default::default() };
        let opt = OptimizerConfig::Adagrad { lr: 0.3, eps: 1e-8, l2: 0.0 };
        let mut sharded = OutputLayer::new(k, d, &cfg, &opt, 5).unwrap();
        let mut whole = OutputLayer::new(k, d, &cfg, &opt, 5).unwrap();
        if let Some((config, blocks)) = index {
            sharded.attach_index(config.clone(), blocks, IndexUpkeep::default()).unwrap();
            whole.attach_index(config, blocks, IndexUpkeep::default()).unwrap();
        }
        let (phi, labels) = problem(k, d, b);
        let pos: Vec<&[u32]> = labels.iter().map(Vec::as_slice).collect();
        let ids: Vec<usize> = (0..b).map(|i| 3 * i + 1).collect();
        let batch = Batch::new(&phi, &pos).with_ids(&ids);
        let plan = est.shard_plan().unwrap_or_else(|| panic!("{name} has a shard plan"));
        let (mut ra, mut rb) = (rng::seeded(9, 0), rng::seeded(9, 0));
        for step in 0..4 {
            let (a, _) = sparse_step(&mut sharded, &Strided::whole(k), &Local, plan, batch, &mut ra, true).unwrap();
            let e = whole.train_step(twin, batch, &mut rb, true);
            assert!((a.loss_sum - e.loss_sum).abs() <= 1e-5 * e.loss_sum.abs(), "{name}, step {step}: {a:?} vs {e:?}");
            assert_eq!((a.classes_scored, a.rows_updated), (e.classes_scored, e.rows_updated), "{name}, step {step}");
            let diff = |x: &Matrix, y: &Matrix| {
                x.as_slice().iter().zip(y.as_slice()).map(|(u, v)| (u - v).abs()).fold(0.0f32, f32::max)
            };
            assert!(diff(sharded.dphi(), whole.dphi()) < 1e-5, "{name}, step {step}");
            assert!(diff(sharded.weights(), whole.weights()) < 1e-5, "{name}, step {step}");
            assert!(step > 0 || e.rows_updated > 0, "{name}: the first step moves rows: {e:?}");
        }
        if let (Some(a), Some(b)) = (est.sample_state(), twin.sample_state()) {
            assert_eq!(a.to_vec(), b.to_vec(), "{name}: the per-sample state");
            // A&R counts its visits last: 4 for every batch sample with a label, by its id.
            let mut row = vec![0.0; a.width()];
            for (i, &id) in ids.iter().enumerate() {
                a.read(id, &mut row);
                assert_eq!(row[a.width() - 1], if i == 5 { 0.0 } else { 4.0 }, "{name}: visits of sample {id}");
            }
        }
    }

    /// Phi (`b x d`, standard normal) and two labels per sample (none for sample 5).
    fn problem(k: usize, d: usize, b: usize) -> (Matrix, Vec<Vec<u32>>) {
        let mut r = rng::seeded(2, 0);
        let phi = Matrix::from_vec(b, d, (0..b * d).map(|_| rng::normal(&mut r)).collect()).unwrap();
        let labels =
            (0..b).map(|i| if i == 5 { vec![] } else { vec![(i * 97 % k) as u32, (i * 13 % k) as u32] }).collect();
        (phi, labels)
    }

    /// The cost's limbs summed over as many ranks as may fuse them give the exact sum of the
    /// costs, at the edges of the limbs and for large counts.
    #[test]
    fn costs_summed_as_limbs_are_exact() {
        for cost in [0u64, 1, 65_535, 65_536, (1 << 40) + 12_345, (1 << 55) - 1, 3 << 54] {
            let mut sums = [0f32; COST_LIMBS];
            for _ in 0..MAX_FUSED_RANKS {
                sums.iter_mut().zip(cost_limbs(cost)).for_each(|(s, l)| *s += l);
            }
            let want = u128::from(cost) * MAX_FUSED_RANKS as u128;
            assert_eq!(u128::from(cost_of_limbs(&sums)), want.min(u128::from(u64::MAX)), "cost {cost}");
        }
    }

    /// A step's phases are each timed: a search step spends time searching, building the
    /// candidates, scoring them, in the loss and updating, and the phases add up to no more
    /// than the step's wall time (at 2 ranks, with the collectives' time a part of them).
    #[test]
    fn a_steps_phases_are_timed_and_add_up_to_the_step() {
        let (k, d, b) = (2000, 32, 40);
        let cfg = OutputLayerConfig { bias: false, init_std: 0.5, ..Default::default() };
        let opt = OptimizerConfig::Adagrad { lr: 0.3, eps: 1e-8, l2: 0.0 };
        let (phi, labels) = problem(k, d, b);
        let pos: Vec<&[u32]> = labels.iter().map(Vec::as_slice).collect();
        let mips = Mips::new(SmoothedMargin::new(1.0).unwrap(), 50).unwrap();
        let plan = mips.shard_plan().unwrap();
        farout_dist::Threads::run(2, |comm| {
            let shard = Strided::new(k, comm.rank(), 2).unwrap();
            let mut layer = OutputLayer::with_classes(shard, d, &cfg, &opt, 5).unwrap();
            layer.attach_index(IndexConfig::exact(), 1, IndexUpkeep::default()).unwrap();
            let mut r = rng::seeded(9, 0);
            for step in 0..3 {
                let t = Instant::now();
                let (_, cost) =
                    sparse_step(&mut layer, &shard, comm, plan, Batch::new(&phi, &pos), &mut r, true).unwrap();
                let wall = t.elapsed().as_secs_f64();
                let p = cost.phases.seconds();
                let at = format!("rank {}, step {step}: {:?}, wall {wall}", comm.rank(), cost.phases);
                assert!(p.iter().all(|&s| s >= 0.0) && p.iter().sum::<f64>() <= wall, "{at}");
                assert!(p[1..].iter().all(|&s| s > 0.0), "{at}");
                assert!(cost.seconds > 0.0 && cost.seconds <= p.iter().sum::<f64>(), "{at}, comm {}", cost.seconds);
            }
        });
    }

    #[test]
    fn one_rank_steps_like_the_search_and_sampling_estimators() {
        let margin = SmoothedMargin::new(1.0).unwrap();
        let fixed =
            |top| Ldgs::new(margin, top, Iterations::FixedPoint, ActiveSet::Union, 1e-3, Rescore::Exact).unwrap();
        for config in [IndexConfig::exact(), IndexConfig::default()] {
            let at = |blocks| Some((config.clone(), blocks));
            steps_like_the_estimator("mips margin", &Mips::new(margin, 50).unwrap(), at(1), false);
            steps_like_the_estimator("mips softmax", &Mips::new(Softmax, 50).unwrap(), at(1), false);
            steps_like_the_estimator("mips with bias", &Mips::new(margin, 50).unwrap(), at(1), true);
            steps_like_the_estimator("ldgs", &fixed(40), at(4), false);
            steps_like_the_estimator("ldgs with bias", &fixed(40), at(4), true);
        }
        for (unique, shared) in [(true, false), (false, false), (true, true)] {
            let est = SampledSoftmax::with_proposal(100, Proposal::LogUniform, unique, shared).unwrap();
            steps_like_the_estimator(&format!("sampled unique={unique} shared={shared}"), &est, None, true);
        }
        for proposal in [Proposal::Uniform, Proposal::LogUniform] {
            let est = NegativeSampling::new(100, proposal).unwrap();
            steps_like_the_estimator("negative sampling", &est, None, true);
        }
        steps_like_the_estimator("ove", &Ove::new(100).unwrap().with_classes(2000), None, true);
        for (name, [est, twin]) in augment_and_reduce(2000, 200) {
            steps_like_the_estimator_from(name, est.as_ref(), twin.as_ref(), None, true, 0.5);
        }
    }

    /// At 2 and 3 ranks (threads of this process), the sampling estimators take one process's
    /// steps: the same losses, every rank's rows those of the whole layer, and every rank's
    /// copy of A&R's per-sample state the one process's.
    #[test]
    fn ranks_as_threads_step_like_one_process_with_the_sampling_estimators() {
        let (k, d, b) = (2000, 32, 40);
        let cfg = OutputLayerConfig { bias: true, init_std: 0.5, ..Default::default() };
        let opt = OptimizerConfig::Adagrad { lr: 0.3, eps: 1e-8, l2: 0.0 };
        let (phi, labels) = problem(k, d, b);
        let pos: Vec<&[u32]> = labels.iter().map(Vec::as_slice).collect();
        let ids: Vec<usize> = (0..b).map(|i| 3 * i + 1).collect();
        let batch = Batch::new(&phi, &pos).with_ids(&ids);
        type Make = Box<dyn Fn() -> Box<dyn GradientEstimator> + Sync>;
        let mut makes: Vec<(&str, Make)> = vec![
            ("ove", Box::new(move || Box::new(Ove::new(100).unwrap().with_classes(k)))),
            ("negative sampling", Box::new(|| Box::new(NegativeSampling::new(100, Proposal::LogUniform).unwrap()))),
            (
                "sampled softmax",
                Box::new(|| Box::new(SampledSoftmax::with_proposal(100, Proposal::LogUniform, true, false).unwrap())),
            ),
        ];
        for (i, name) in ["ar_softmax", "ar_probit", "ar_logistic"].into_iter().enumerate() {
            makes.push((
                name,
                Box::new(move || augment_and_reduce(k, 200).swap_remove(i).1.into_iter().next().unwrap()),
            ));
        }
        for (name, make) in &makes {
            let one = make();
            let mut whole = OutputLayer::new(k, d, &cfg, &opt, 5).unwrap();
            let mut r = rng::seeded(9, 0);
            let losses: Vec<f64> =
                (0..4).map(|_| whole.train_step(one.as_ref(), batch, &mut r, true).loss_sum).collect();
            for ranks in [2, 3] {
                farout_dist::Threads::run(ranks, |comm| {
                    let est = make();
                    let mut layer = crate::ShardedLayer::new(k, comm.rank(), ranks, d, &cfg, &opt, 5).unwrap();
                    let mut r = rng::seeded(9, 0);
                    for (step, want) in losses.iter().enumerate() {
                        let got = layer.step(comm, est.as_ref(), batch, &mut r, true, 0).unwrap().loss_sum;
                        assert!((got - want).abs() <= 1e-5 * want.abs(), "{name}, {ranks} ranks, step {step}");
                    }
                    let mine = crate::sharded::tests::rows_of(whole.weights(), layer.shard());
                    let diff = layer.layer().weights().as_slice().iter().zip(&mine).map(|(u, v)| (u - v).abs());
                    assert!(diff.fold(0.0f32, f32::max) < 1e-5, "{name}, {ranks} ranks, rank {}", comm.rank());
                    if let Some(state) = est.sample_state() {
                        assert_eq!(state.to_vec(), one.sample_state().unwrap().to_vec(), "{name}, {ranks} ranks");
                    }
                });
            }
        }
    }

    /// `sparse_step` on `layer` (rng seeded 9, as the one-process steps were) takes the steps
    /// `want` (one process's stats and `dL/dphi`): the same loss, classes scored and `dL/dphi`.
    fn steps_like(
        layer: &mut OutputLayer,
        shard: &Strided,
        comm: &dyn Collective,
        plan: ShardPlan,
        batch: Batch,
        want: &[(StepStats, Matrix)],
        at: &str,
    ) {
        let mut r = rng::seeded(9, 0);
        for (step, (e, dphi)) in want.iter().enumerate() {
            let (s, _) = sparse_step(layer, shard, comm, plan, batch, &mut r, true).unwrap();
            let (at, loss) = (format!("{at}, step {step}"), e.loss_sum);
            assert!((s.loss_sum - loss).abs() <= 1e-5 * loss.abs(), "{at}: {} vs {loss}", s.loss_sum);
            assert_eq!(s.classes_scored, e.classes_scored, "{at}: classes scored");
            let diff = layer.dphi().as_slice().iter().zip(dphi.as_slice()).map(|(u, v)| (u - v).abs());
            assert!(diff.fold(0.0f32, f32::max) < 1e-4, "{at}: dL/dphi");
        }
    }

    /// At 2 and 3 ranks (threads of this process), with brute-force indexes, with and without a
    /// bias, the search estimators and the exact margin take one process's steps, each rank
    /// evaluating the loss of its part of the samples: the same losses, classes scored and
    /// `dL/dphi`, every rank's rows those of the whole layer.
    #[test]
    fn ranks_as_threads_step_like_one_process_with_the_search_estimators() {
        let (k, d, b) = (2000, 32, 40);
        let opt = OptimizerConfig::Adagrad { lr: 0.3, eps: 1e-8, l2: 0.0 };
        let (phi, labels) = problem(k, d, b);
        let pos: Vec<&[u32]> = labels.iter().map(Vec::as_slice).collect();
        let batch = Batch::new(&phi, &pos);
        let margin = SmoothedMargin::new(1.0).unwrap();
        let ldgs = Ldgs::new(margin, 40, Iterations::FixedPoint, ActiveSet::Union, 1e-3, Rescore::Exact).unwrap();
        let estimators: Vec<(&str, Box<dyn GradientEstimator>, usize)> = vec![
            ("mips", Box::new(Mips::new(margin, 50).unwrap()), 1),
            ("mips softmax", Box::new(Mips::new(Softmax, 50).unwrap()), 1),
            ("ldgs", Box::new(ldgs), 4),
            ("margin", Box::new(farout_estimators::Exact::new(margin)), 0),
        ];
        let with_index = |layer: &mut OutputLayer, blocks: usize| {
            if blocks > 0 {
                layer.attach_index(IndexConfig::exact(), blocks, IndexUpkeep::default()).unwrap();
            }
        };
        for ((name, est, blocks), bias) in estimators.iter().flat_map(|e| [(e, true), (e, false)]) {
            let cfg = OutputLayerConfig { bias, init_std: 0.5, ..Default::default() };
            let mut whole = OutputLayer::new(k, d, &cfg, &opt, 5).unwrap();
            with_index(&mut whole, *blocks);
            let mut r = rng::seeded(9, 0);
            let want: Vec<(StepStats, Matrix)> =
                (0..3).map(|_| (whole.train_step(est.as_ref(), batch, &mut r, true), whole.dphi().clone())).collect();
            let plan = est.shard_plan().unwrap();
            for ranks in [2, 3] {
                farout_dist::Threads::run(ranks, |comm| {
                    let shard = Strided::new(k, comm.rank(), ranks).unwrap();
                    let mut layer = OutputLayer::with_classes(shard, d, &cfg, &opt, 5).unwrap();
                    with_index(&mut layer, *blocks);
                    let at = format!("{name}, bias {bias}, {ranks} ranks, rank {}", comm.rank());
                    steps_like(&mut layer, &shard, comm, plan, batch, &want, &at);
                    let mine = crate::sharded::tests::rows_of(whole.weights(), &shard);
                    let diff = layer.weights().as_slice().iter().zip(&mine).map(|(u, v)| (u - v).abs());
                    assert!(
                        diff.fold(0.0f32, f32::max) < 1e-5,
                        "{name}, bias {bias}, {ranks} ranks, rank {}",
                        comm.rank()
                    );
                });
            }
        }
    }

    /// LDGS whose best classes all sit on rank 0 (their rows scaled up): rank 0 holds more than
    /// its share of every row's top-Q, so every row is searched again and cut again, and the
    /// steps of 2 and 3 ranks are still one process's (brute-force indexes), with and without a
    /// bias; at 2 ranks a rank keeps 137 of Q = 200 hits per row.
    #[test]
    fn ranks_holding_more_than_their_share_of_the_best_are_asked_for_all_of_it() {
        let (k, d, b, top) = (2000, 32, 40, 200);
        assert_eq!(crate::sharded_search::rank_top(top, 2), 137);
        let opt = OptimizerConfig::Adagrad { lr: 0.3, eps: 1e-8, l2: 0.0 };
        let (phi, labels) = problem(k, d, b);
        let pos: Vec<&[u32]> = labels.iter().map(Vec::as_slice).collect();
        let batch = Batch::new(&phi, &pos);
        let margin = SmoothedMargin::new(1.0).unwrap();
        let ldgs = Ldgs::new(margin, top, Iterations::FixedPoint, ActiveSet::Union, 1e-3, Rescore::Exact).unwrap();
        for bias in [false, true] {
            let cfg = OutputLayerConfig { bias, init_std: 0.5, ..Default::default() };
            let mut whole = OutputLayer::new(k, d, &cfg, &opt, 5).unwrap();
            // Classes dealt to rank 0 at 2 and 3 ranks (multiples of 6) score far above the rest.
            let mut w = whole.weights().clone();
            (0..k).filter(|c| c % 6 == 0).for_each(|c| w.row_mut(c).iter_mut().for_each(|x| *x *= 8.0));
            whole.set_weights(w.clone()).unwrap();
            whole.attach_index(IndexConfig::exact(), 2, IndexUpkeep::default()).unwrap();
            let mut r = rng::seeded(9, 0);
            let want: Vec<(StepStats, Matrix)> =
                (0..2).map(|_| (whole.train_step(&ldgs, batch, &mut r, true), whole.dphi().clone())).collect();
            let plan = ldgs.shard_plan().unwrap();
            for ranks in [2, 3] {
                farout_dist::Threads::run(ranks, |comm| {
                    let shard = Strided::new(k, comm.rank(), ranks).unwrap();
                    let mut layer = OutputLayer::with_classes(shard, d, &cfg, &opt, 5).unwrap();
                    let mine = crate::sharded::tests::rows_of(&w, &shard);
                    layer.set_weights(Matrix::from_vec(shard.len(), d, mine).unwrap()).unwrap();
                    layer.attach_index(IndexConfig::exact(), 2, IndexUpkeep::default()).unwrap();
                    let at = format!("bias {bias}, {ranks} ranks, rank {}", comm.rank());
                    steps_like(&mut layer, &shard, comm, plan, batch, &want, &at);
                });
            }
        }
    }

    /// At 2 and 3 ranks with spherical indexes (one and two blocks), every rank's indexes are
    /// built on rank 0's centroids, at the first build and at every rebuild, and rank 0's are
    /// fitted to its own rows (they change with the rebuild).
    #[test]
    fn ranks_build_their_spherical_indexes_on_rank_zeros_centroids() {
        let (k, d, b) = (2000, 32, 40);
        let opt = OptimizerConfig::Adagrad { lr: 0.3, eps: 1e-8, l2: 0.0 };
        let (phi, labels) = problem(k, d, b);
        let pos: Vec<&[u32]> = labels.iter().map(Vec::as_slice).collect();
        let batch = Batch::new(&phi, &pos);
        let spherical = farout_search::SphericalConfig { candidate_factor: Some(3.0), ..Default::default() };
        let mips = Mips::new(SmoothedMargin::new(1.0).unwrap(), 30).unwrap();
        let upkeep = IndexUpkeep { refresh_every: 1, rebuild_every: 2 };
        for (ranks, blocks) in [(2, 1), (3, 2)] {
            let cfg = OutputLayerConfig { init_std: 0.5, ..Default::default() };
            let centroids = farout_dist::Threads::run(ranks, |comm| {
                let shard = Strided::new(k, comm.rank(), ranks).unwrap();
                let mut layer = OutputLayer::with_classes(shard, d, &cfg, &opt, 5).unwrap();
                layer.attach_index(IndexConfig::Spherical(spherical.clone()), blocks, upkeep).unwrap();
                let mut r = rng::seeded(9, 0);
                let mut built = Vec::new();
                for _ in 0..3 {
                    sparse_step(&mut layer, &shard, comm, mips.shard_plan().unwrap(), batch, &mut r, false).unwrap();
                    built.push(layer.index_centroids().expect("spherical indexes have centroids"));
                }
                built
            });
            for (rank, built) in centroids.iter().enumerate() {
                assert_eq!(built[0].len(), blocks);
                assert_eq!(built[0][0].cols(), d / blocks + 1, "augmented centroids");
                assert_eq!(built, &centroids[0], "{ranks} ranks: rank {rank}'s centroids are rank 0's");
            }
            // Built at step 0, kept at step 1, rebuilt at step 2 on the trained rows.
            assert_eq!(centroids[0][0], centroids[0][1]);
            assert_ne!(centroids[0][1], centroids[0][2], "{ranks} ranks: the rebuild fits new centroids");
        }
    }

    /// Centroids cross the ranks as bytes and come back as they were; bytes that are not
    /// centroids are refused.
    #[test]
    fn centroids_round_trip_through_bytes() {
        let blocks = vec![Matrix::from_vec(2, 3, vec![1.0, -2.0, 3.5, 0.0, 1e-7, -0.25]).unwrap(), Matrix::zeros(1, 1)];
        let bytes = centroid_bytes(&blocks);
        assert_eq!(centroids_of_bytes(&bytes).unwrap(), blocks);
        assert_eq!(centroids_of_bytes(&[]).unwrap(), Vec::<Matrix>::new());
        for bad in [&bytes[..bytes.len() - 4], &bytes[..bytes.len() - 1], &[bytes.as_slice(), &[0; 4]].concat()] {
            assert!(centroids_of_bytes(bad).is_err(), "{} bytes", bad.len());
        }
    }

    /// Two instances of each A&R estimator (the per-sample state is the estimator's) for a
    /// `k`-class layer, with state for `n_data` samples.
    fn augment_and_reduce(k: usize, n_data: usize) -> Vec<(&'static str, [Box<dyn GradientEstimator>; 2])> {
        let softmax = || Box::new(ArSoftmax::new(50, n_data).unwrap().with_classes(k)) as Box<dyn GradientEstimator>;
        let probit = || Box::new(ArProbit::new(50, n_data).unwrap().with_classes(k)) as Box<dyn GradientEstimator>;
        let logistic = || Box::new(ArLogistic::new(50, n_data).unwrap().with_classes(k)) as Box<dyn GradientEstimator>;
        vec![
            ("ar_softmax", [softmax(), softmax()]),
            ("ar_probit", [probit(), probit()]),
            ("ar_logistic", [logistic(), logistic()]),
        ]
    }

    /// The exact margin from the classes near the best negative: with scores spread (few
    /// candidates) and with an untrained layer's near-equal scores (every class a candidate).
    #[test]
    fn one_rank_steps_like_the_exact_margin() {
        for mu in [1.0, 5.0] {
            let exact = farout_estimators::Exact::new(SmoothedMargin::new(mu).unwrap());
            for (bias, init_std) in [(false, 0.5), (true, 0.5), (true, 1e-3)] {
                let name = format!("margin mu {mu}, std {init_std}");
                steps_like_the_estimator_from(&name, &exact, &exact, None, bias, init_std);
            }
        }
    }

    /// Only LDGS's fixed point with exact rescoring is a loss on its candidates.
    #[test]
    fn ldgs_shards_only_at_its_exact_fixed_point() {
        let margin = SmoothedMargin::new(1.0).unwrap();
        let ldgs = |it, rescore| Ldgs::new(margin, 10, it, ActiveSet::Union, 1e-3, rescore).unwrap();
        assert!(ldgs(Iterations::FixedPoint, Rescore::Exact).shard_plan().is_some());
        assert!(ldgs(Iterations::FixedPoint, Rescore::Partial).shard_plan().is_none());
        assert!(ldgs(Iterations::Steps(5), Rescore::Exact).shard_plan().is_none());
        assert!(farout_estimators::Exact::new(Softmax).shard_plan().is_none(), "the softmax has its own step");
    }
}
