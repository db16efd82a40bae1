//! The search estimators ([`farout_estimators::ShardPlan::Search`]: mips, and ldgs at its
//! exact fixed point) on a class-sharded layer, each sample worked on by one rank.
//!
//! Rank `e` of `P` works on the samples `B e / P..B (e + 1) / P` of the batch (every rank
//! holds the whole batch); class `c` is owned by rank `c mod P` ([`Strided`]). Only a class's
//! owner ever finds it in a search, so the owner can score it without being told which of its
//! hits the other ranks' hits pushed out: only where the cut falls. One step, with several
//! blocks or a bias (ldgs):
//!
//! ```text
//! search:     each rank searches its block indexes for all B samples, probing the rows a
//!             search for Q probes but keeping its share of the top-Q: about Q / P + 4 sd
//! thresholds: sample i's hits go to the rank e(i) working on it, which learns each block's
//!             cut: the Q-th best hit over the ranks                        one alltoallv
//!             (where a rank's share may stop short of the cut: rarely, every rank sends its
//!             whole top-Q of that row and it is cut again      one allgather, or three)
//!             every rank learns every sample's cuts                        one allgather
//! score:      each owner keeps its hits at or above the cut (the top-Q of the whole layer
//!             that it holds), adds its positives and scores that part of U_i exactly,
//!             completing what the searches did not score (the other blocks, the bias); the
//!             parts go to e(i), whose U_i is their concatenation            one alltoallv
//! loss:       e(i) evaluates L(z_U, P) and sends each owner the nonzero gradients of its
//!             classes, with its part of the loss and of the cost           one alltoallv
//! ```
//!
//! With one block and no bias (mips) the searches' scores are the exact scores: e(i) receives
//! the hits themselves with the positives' scores (one alltoallv), keeps each block's top-Q
//! over the ranks, and the loss follows.
//!
//! A rank sends each hit once, to one rank; `U` is built and the loss evaluated for `B / P`
//! samples; each candidate is scored once, by its owner, and its score travels only to the
//! rank that needs it: no work is repeated on every rank. Scores and gradients travel as the
//! bits of f32 in `u32` messages; the scores are [`complete_scores`]'s, so with brute-force
//! indexes the step is one process's (to rounding: `U` comes in another order).

use crate::sharded_sparse::{Candidates, StepComm, split_per_sample};
use farout_core::ClassId;
use farout_core::topk::{Hit, descending_key};
use farout_dist::{DistError, Strided};
use farout_estimators::{
    Batch, BatchEstimate, BatchGrad, Ctx, FewSlots, Loss, LossScratch, RescoreScratch, complete_scores,
};
use rayon::prelude::*;
use std::cell::RefCell;
use std::ops::Range;

/// The samples of a batch of `b` that rank `r` of `ranks` works on.
pub(crate) fn part(b: usize, r: usize, ranks: usize) -> Range<usize> {
    b * r / ranks..b * (r + 1) / ranks
}

/// The rank working on each row `j * b + i` of `n_blocks` blocks' rows of a batch of `b`.
fn workers(b: usize, ranks: usize, n_blocks: usize) -> Vec<usize> {
    let worker = (0..ranks).flat_map(|r| part(b, r, ranks).map(move |_| r));
    let worker: Vec<usize> = worker.collect();
    (0..n_blocks).flat_map(|_| worker.iter().copied()).collect()
}

/// Hits of each block's top-`top` that a rank of `ranks` keeps per sample: its expected share
/// `top / P` (classes are dealt, so a rank holds each of the best with chance `1 / P`), plus four
/// standard deviations of that share, `sqrt(top (P - 1)) / P`, plus 8; at most `top`. A rank
/// holding more of some row is asked for its whole top-`top` ([`StepComm::recut`]), so the cut
/// does not depend on it. At 2 ranks and `top` = 350: 221 hits instead of 350 per row.
pub(crate) fn rank_top(top: usize, ranks: usize) -> usize {
    if ranks <= 1 {
        return top;
    }
    let (q, p) = (top as f64, ranks as f64);
    let share = q / p + 4.0 * (q * (p - 1.0)).sqrt() / p + 8.0;
    (share.ceil() as usize).min(top)
}

/// One sample's candidates on the rank working on it.
#[derive(Default)]
struct Worked {
    c: Candidates,
    /// The rank owning each candidate ...
    owner: Vec<u32>,
    /// ... and the block products its scores cost beyond the searches (over all ranks).
    dots: usize,
}

/// Per-thread buffers of an owner's part of a sample's candidates ([`owned_part`]).
#[derive(Default)]
struct OwnedScratch {
    /// Where each local class sits in the part.
    slots: FewSlots,
    /// The part: local ids ...
    local: Vec<ClassId>,
    /// ... the searches' block scores of its classes, (position, block, score) ...
    found: Vec<(usize, usize, f32)>,
    /// ... and its exact scores.
    total: Vec<f32>,
    rescore: RescoreScratch,
}

thread_local! {
    static OWNED: RefCell<OwnedScratch> = RefCell::new(OwnedScratch::default());
}

/// Rank `shard.rank()`'s part of sample `i`'s candidates, as `[n, dots, (class, score) x n]`
/// (global ids): its own positives first (in order, once each), then its hits of each block
/// (`rows[j * B + i]`, local ids) at or above that block's cut (`cuts[j * B + i]`, a
/// [`descending_key`] of a global id), once each; the exact scores ([`complete_scores`]) and the
/// block products they cost.
fn owned_part(ctx: &Ctx, shard: &Strided, batch: Batch, rows: &[Vec<Hit>], cuts: &[u64], i: usize) -> Vec<u32> {
    let (b, n_blocks) = (batch.phi.rows(), cuts.len() / batch.phi.rows());
    let global = |l: ClassId| shard.global(l as usize) as ClassId;
    OWNED.with_borrow_mut(|s| {
        let OwnedScratch { slots, local, found, total, rescore } = s;
        let hits = (0..n_blocks).map(|j| rows[j * b + i].len()).sum::<usize>();
        slots.begin(batch.positives[i].len() + hits);
        local.clear();
        found.clear();
        let mut put = |l: ClassId| {
            let (u, new) = slots.insert(l, local.len());
            if new {
                local.push(l);
            }
            u
        };
        for &p in batch.positives[i] {
            if let Some(l) = shard.local(p as usize) {
                put(l as ClassId);
            }
        }
        for j in 0..n_blocks {
            let (hits, cut) = (&rows[j * b + i], cuts[j * b + i]);
            for h in hits.iter().filter(|h| descending_key(h.score, global(h.class)) <= cut) {
                found.push((put(h.class), j, h.score));
            }
        }
        let dots = complete_scores(ctx, n_blocks, batch.phi.row(i), local, found.iter().copied(), rescore, total);
        let mut out = Vec::with_capacity(2 + 2 * local.len());
        out.extend([local.len() as u32, dots as u32]);
        out.extend(local.iter().zip(total.iter()).flat_map(|(&l, z)| [global(l), z.to_bits()]));
        out
    })
}

/// `buf` (an alltoallv's output) cut into every rank's part.
fn parts<'b>(buf: &'b [u32], counts: &[usize]) -> Vec<&'b [u32]> {
    let mut at = 0;
    counts
        .iter()
        .map(|&n| {
            at += n;
            &buf[at - n..at]
        })
        .collect()
}

/// Messages to every rank in one buffer, with its counts, for an alltoallv: to each rank
/// `header`, then per sample of `samples` `[n, entry x n]`, the entries of `width` words that
/// `entries(sample, emit)` emits to that rank (`emit(rank, words)`). Two passes over
/// `entries`: the first counts each rank's words, the second writes them in place, so no
/// per-rank buffer grows and none is copied into the one sent.
fn per_sample_messages<S>(
    ranks: usize,
    header: &[u32],
    width: usize,
    samples: &[S],
    entries: impl Fn(&S, &mut dyn FnMut(usize, &[u32])),
) -> (Vec<u32>, Vec<usize>) {
    let mut counts = vec![header.len() + samples.len(); ranks];
    for sample in samples {
        entries(sample, &mut |r, words| counts[r] += words.len());
    }
    let mut at = farout_dist::starts_of(&counts);
    let mut send = vec![0u32; counts.iter().sum()];
    for a in at.iter_mut() {
        send[*a..*a + header.len()].copy_from_slice(header);
        *a += header.len();
    }
    let mut heads = vec![0; ranks];
    for sample in samples {
        heads.copy_from_slice(&at);
        at.iter_mut().for_each(|a| *a += 1);
        entries(sample, &mut |r, words| {
            send[at[r]..at[r] + words.len()].copy_from_slice(words);
            at[r] += words.len();
        });
        for (&h, &a) in heads.iter().zip(&at) {
            send[h] = ((a - h - 1) / width) as u32;
        }
    }
    (send, counts)
}

impl StepComm<'_> {
    /// One search step's estimate (see the module documentation): `loss` on each sample's
    /// candidates, `top` classes retrieved per block, the gradients of this rank's classes into
    /// `grads` (local ids). Returns the batch's loss and the classes scored by all ranks.
    pub(crate) fn search_estimate(
        &mut self,
        ctx: &Ctx,
        batch: Batch,
        top: usize,
        loss: &dyn Loss,
        grads: &mut BatchGrad,
    ) -> Result<BatchEstimate, DistError> {
        let index = ctx.index.expect("a search estimator's layer has its index attached");
        let n_blocks = index.n_blocks();
        let b = batch.phi.rows();
        // Row j * B + i: block j's hits of sample i, local ids. With several blocks or a bias
        // each rank keeps only its share of every block's top-Q ([`rank_top`]), from the rows a
        // search for all Q probes.
        let completes = n_blocks > 1 || ctx.bias.is_some();
        let kept = if completes { rank_top(top, self.comm.size()) } else { top };
        let mut rows = Vec::with_capacity(n_blocks * b);
        let (mut hits, mut search_dots) = (Vec::new(), 0);
        for j in 0..n_blocks {
            search_dots += index.search_block_batch_probing(ctx.w, j, batch.phi, kept, top, &mut hits);
            rows.append(&mut hits);
        }
        self.phases.search += self.lap();
        let worked = if completes {
            let cuts = self.cuts(ctx, batch, &mut rows, top, kept)?;
            self.phases.candidates += self.lap();
            let worked = self.owners_parts(ctx, batch, &rows, &cuts)?;
            self.phases.score += self.lap();
            worked
        } else {
            let shard = self.shard;
            rows.iter_mut().flatten().for_each(|h| h.class = shard.global(h.class as usize) as ClassId);
            let worked = self.routed_hits(ctx, batch, rows, top)?;
            self.phases.candidates += self.lap();
            worked
        };
        let cost = search_dots.div_ceil(n_blocks) + worked.iter().map(|w| w.dots.div_ceil(n_blocks)).sum::<usize>();
        let (loss_sum, classes_scored) = self.routed_loss(grads, b, &worked, loss, cost)?;
        self.phases.loss += self.lap();
        Ok(BatchEstimate { loss_sum, classes_scored })
    }

    /// Every block's cut of every sample of the batch, on every rank: the [`descending_key`] of
    /// its `top`-th best hit over the ranks (row `j * B + i`, as `rows`, [`owned_part`]'s;
    /// `u64::MAX` where the ranks found fewer together). Each rank sends its best `kept` hits of
    /// each row to the rank working on its sample, which cuts them
    /// ([`farout_dist::route_cuts`]); where a rank's share may stop short of the cut, every rank
    /// searches the row again for its whole top-`top` and the row is cut again
    /// ([`StepComm::recut`]). Then every rank learns every cut.
    fn cuts(
        &mut self,
        ctx: &Ctx,
        batch: Batch,
        rows: &mut [Vec<Hit>],
        top: usize,
        kept: usize,
    ) -> Result<Vec<u64>, DistError> {
        let (comm, shard, b) = (self.comm, self.shard, batch.phi.rows());
        let (ranks, n_blocks) = (comm.size(), rows.len() / b.max(1));
        let dest = workers(b, ranks, n_blocks);
        self.bytes += 8 * rows.iter().map(Vec::len).sum::<usize>();
        let mut cut = farout_dist::Cuts::default();
        self.timed(&mut || {
            let global = |l: ClassId| shard.global(l as usize) as ClassId;
            cut = farout_dist::route_cuts(comm, rows, &global, &dest, top, kept)?;
            Ok(())
        })?;
        let mut mine = cut.cuts;
        // This rank's rows whose cut waits for more hits, as rows of the batch (j * B + i).
        let own: Vec<usize> = (0..rows.len()).filter(|&row| dest[row] == comm.rank()).collect();
        let mut again: Vec<u32> =
            own.iter().zip(&cut.ask).filter(|(_, a)| !a.is_empty()).map(|(&r, _)| r as u32).collect();
        loop {
            // Rank r's cuts arrive block-major over its samples, as two u32 each, then how
            // many of its rows are to be cut again.
            let mut send: Vec<u32> = mine.iter().flat_map(|&key| [key as u32, (key >> 32) as u32]).collect();
            send.push(again.len() as u32);
            let counts: Vec<usize> = (0..ranks).map(|r| 2 * n_blocks * part(b, r, ranks).len() + 1).collect();
            let mut all = vec![0u32; counts.iter().sum()];
            self.bytes += 4 * send.len();
            self.timed(&mut || comm.allgatherv_u32(&send, &counts, &mut all))?;
            let mut cuts = vec![u64::MAX; n_blocks * b];
            let mut n_again = Vec::with_capacity(ranks);
            let mut at = 0;
            for (r, &count) in counts.iter().enumerate() {
                let mut pairs =
                    all[at..at + count - 1].chunks_exact(2).map(|p| u64::from(p[0]) | (u64::from(p[1]) << 32));
                for j in 0..n_blocks {
                    for (cut, key) in cuts[j * b..(j + 1) * b][part(b, r, ranks)].iter_mut().zip(&mut pairs) {
                        *cut = key;
                    }
                }
                n_again.push(all[at + count - 1] as usize);
                at += count;
            }
            if n_again.iter().all(|&n| n == 0) {
                return Ok(cuts);
            }
            self.recut(ctx, batch, rows, top, (&again, &n_again), &mut mine)?;
            again.clear();
        }
    }

    /// The rows where some rank's share may stop short of the cut (`again`: this rank's;
    /// `n_again`: how many each rank has): every rank learns them, searches each again for its
    /// whole top-`top` (in `rows`, which its part of the candidates is taken from) and sends
    /// it, and the rank working on the row cuts it again, exactly, into `mine` (its cuts, in
    /// the order of the rows it works on). Rare: a rank holds more than its share of a
    /// row's top-`top` only some standard deviations from its mean ([`rank_top`]). The repeated
    /// searches are not counted in the classes scored, which count the estimator's work as one
    /// process does it.
    fn recut(
        &mut self,
        ctx: &Ctx,
        batch: Batch,
        rows: &mut [Vec<Hit>],
        top: usize,
        (again, n_again): (&[u32], &[usize]),
        mine: &mut [u64],
    ) -> Result<(), DistError> {
        let (comm, shard, b) = (self.comm, self.shard, batch.phi.rows());
        let (ranks, n_blocks) = (comm.size(), rows.len() / b.max(1));
        let index = ctx.index.expect("a search estimator's layer has its index attached");
        let dest = workers(b, ranks, n_blocks);
        let mut all = vec![0u32; n_again.iter().sum()];
        self.bytes += 4 * again.len();
        self.timed(&mut || comm.allgatherv_u32(again, n_again, &mut all))?;
        // Every rank searches those rows again, block by block, for its whole top-`top`.
        for j in 0..n_blocks {
            let samples: Vec<usize> =
                all.iter().map(|&row| row as usize).filter(|&row| row / b == j).map(|row| row % b).collect();
            if samples.is_empty() {
                continue;
            }
            let mut phi = farout_core::Matrix::zeros(samples.len(), batch.phi.cols());
            for (n, &i) in samples.iter().enumerate() {
                phi.row_mut(n).copy_from_slice(batch.phi.row(i));
            }
            let mut hits = Vec::new();
            index.search_block_batch(ctx.w, j, &phi, top, &mut hits);
            for (i, hits) in samples.into_iter().zip(hits) {
                rows[j * b + i] = hits;
            }
        }
        let again_rows: Vec<Vec<Hit>> = all.iter().map(|&row| rows[row as usize].clone()).collect();
        let again_dest: Vec<usize> = all.iter().map(|&row| dest[row as usize]).collect();
        self.bytes += 8 * again_rows.iter().map(Vec::len).sum::<usize>();
        let mut cut = farout_dist::Cuts::default();
        self.timed(&mut || {
            let global = |l: ClassId| shard.global(l as usize) as ClassId;
            cut = farout_dist::route_cuts(comm, &again_rows, &global, &again_dest, top, top)?;
            Ok(())
        })?;
        // This rank's rows come back in the order it listed them; row j * B + i is its
        // (j m + i - start)-th, of m samples from `start`.
        let mine_samples = part(b, comm.rank(), ranks);
        for (&row, c) in again.iter().zip(cut.cuts) {
            let (j, i) = (row as usize / b, row as usize % b);
            mine[j * mine_samples.len() + i - mine_samples.start] = c;
        }
        Ok(())
    }

    /// This rank's samples' candidates, each owner's part ([`owned_part`]: its hits at or above
    /// the `cuts`, its positives, scored exactly) sent to the rank working on the sample, where
    /// `U` is the parts in rank order.
    fn owners_parts(
        &mut self,
        ctx: &Ctx,
        batch: Batch,
        rows: &[Vec<Hit>],
        cuts: &[u64],
    ) -> Result<Vec<Worked>, DistError> {
        let (comm, shard, b) = (self.comm, self.shard, batch.phi.rows());
        let (ranks, me) = (comm.size(), comm.rank());
        let owned: Vec<Vec<u32>> =
            (0..b).into_par_iter().map(|i| owned_part(ctx, shard, batch, rows, cuts, i)).collect();
        let counts: Vec<usize> = (0..ranks).map(|r| part(b, r, ranks).map(|i| owned[i].len()).sum()).collect();
        let send = owned.concat();
        let (mut got, mut got_counts) = (Vec::new(), Vec::new());
        self.bytes += 4 * send.len();
        self.timed(&mut || comm.alltoallv_u32(&send, &counts, &mut got, &mut got_counts))?;
        // Where each of this rank's samples' parts starts in each rank's message.
        let from = parts(&got, &got_counts);
        let mine = part(b, me, ranks);
        let malformed =
            |r: usize| DistError::Mpi(format!("rank {r} sent rank {me} a malformed part of the candidates"));
        let mut starts = vec![Vec::with_capacity(ranks); mine.len()];
        for (r, msg) in from.iter().enumerate() {
            let mut at = 0;
            for s in starts.iter_mut() {
                let n = *msg.get(at).ok_or_else(|| malformed(r))? as usize;
                s.push(at);
                at += 2 + 2 * n;
            }
            if at != msg.len() {
                return Err(malformed(r));
            }
        }
        let mut worked: Vec<Worked> = (0..mine.len()).map(|_| Worked::default()).collect();
        worked.par_iter_mut().zip(&starts).zip(mine).try_for_each(|((w, starts), i)| {
            let mut first = Vec::with_capacity(ranks);
            for (r, (&at, msg)) in starts.iter().zip(&from).enumerate() {
                let n = msg[at] as usize;
                first.push(w.c.classes.len());
                w.dots += msg[at + 1] as usize;
                for pair in msg[at + 2..at + 2 + 2 * n].chunks_exact(2) {
                    w.c.classes.push(pair[0]);
                    w.c.z.push(f32::from_bits(pair[1]));
                }
                w.owner.resize(w.c.classes.len(), r as u32);
            }
            // Each owner's part starts with its positives, in order, once each.
            let mut taken = vec![0; ranks];
            for (k, &p) in batch.positives[i].iter().enumerate() {
                let u = match batch.positives[i][..k].iter().position(|&q| q == p) {
                    Some(earlier) => w.c.pos[earlier] as usize,
                    None => {
                        let r = shard.owner(p as usize);
                        taken[r] += 1;
                        first[r] + taken[r] - 1
                    }
                };
                if w.c.classes.get(u) != Some(&p) {
                    return Err(malformed(shard.owner(p as usize)));
                }
                w.c.pos.push(u as ClassId);
            }
            Ok(())
        })?;
        Ok(worked)
    }

    /// With one block and no bias: every block's hits routed to the rank working on their
    /// sample, with the exact scores of the positives this rank owns; the candidates of this
    /// rank's samples are the top-`top` over the ranks and the positives (a positive no search
    /// found takes its owner's score, one block product).
    fn routed_hits(
        &mut self,
        ctx: &Ctx,
        batch: Batch,
        rows: Vec<Vec<Hit>>,
        top: usize,
    ) -> Result<Vec<Worked>, DistError> {
        let (comm, shard, b) = (self.comm, self.shard, batch.phi.rows());
        let (ranks, me) = (comm.size(), comm.rank());
        let dest: Vec<usize> = (0..ranks).flat_map(|r| part(b, r, ranks).map(move |_| r)).collect();
        // To rank q: the scores of the positives this rank owns, of q's samples in order.
        let positives: Vec<Vec<u32>> = (0..ranks)
            .map(|q| {
                let owned =
                    |i: usize| batch.positives[i].iter().filter_map(move |&p| shard.local(p as usize).map(|l| (i, l)));
                part(b, q, ranks).flat_map(owned).map(|(i, l)| ctx.score(l, batch.phi.row(i)).to_bits()).collect()
            })
            .collect();
        self.phases.score += self.lap();
        self.bytes +=
            8 * rows.iter().map(|r| r.len()).sum::<usize>() + 4 * positives.iter().map(Vec::len).sum::<usize>();
        let mut routed = farout_dist::Routed::default();
        let mut rows = Some(rows);
        self.timed(&mut || {
            routed = farout_dist::route_top_k(comm, rows.take().unwrap_or_default(), &dest, top, &positives)?;
            Ok(())
        })?;
        let mine = part(b, me, ranks);
        let mut worked: Vec<Worked> = (0..mine.len()).map(|_| Worked::default()).collect();
        worked.par_iter_mut().zip(&routed.rows).zip(mine).for_each(|((w, hits), i)| {
            w.c.set_single(hits, batch.positives[i]);
            for &(u, _, score) in &w.c.found {
                w.c.z[u as usize] = score;
            }
            w.owner.extend(w.c.classes.iter().map(|&c| shard.owner(c as usize) as u32));
        });
        // The positives no search found take their owner's score.
        let from = parts(&routed.extra, &routed.extra_counts);
        let mut next: Vec<usize> = vec![0; ranks];
        for w in worked.iter_mut() {
            let searched = w.c.found.len();
            for &u in &w.c.pos {
                let owner = w.owner[u as usize] as usize;
                let score = from[owner].get(next[owner]).ok_or_else(|| {
                    DistError::Mpi(format!("rank {owner} sent rank {me} fewer positives' scores than it owns"))
                })?;
                next[owner] += 1;
                if u as usize >= searched {
                    w.c.z[u as usize] = f32::from_bits(*score);
                }
            }
            w.dots = w.c.classes.len() - searched;
        }
        Ok(worked)
    }

    /// `loss` on this rank's samples' candidates; each owner is sent the nonzero gradients of
    /// its classes (per sample: [count, (class, gradient) x count]) after this rank's loss sum
    /// (f64) and `cost` (u64), and keeps what it receives in `grads`. Returns the batch's loss
    /// (the ranks' sums added in rank order) and classes scored, the same on every rank.
    fn routed_loss(
        &mut self,
        grads: &mut BatchGrad,
        b: usize,
        worked: &[Worked],
        loss: &dyn Loss,
        cost: usize,
    ) -> Result<(f64, usize), DistError> {
        let (comm, shard) = (self.comm, self.shard);
        let ranks = comm.size();
        let cands: Vec<&Candidates> = worked.iter().map(|w| &w.c).collect();
        let mut values = vec![0f32; cands.iter().map(|c| 1 + c.z.len()).sum()];
        // Per sample: its loss, then the gradient of each candidate.
        let mut per_sample = split_per_sample(&mut values, cands.iter().copied());
        per_sample.par_iter_mut().zip(cands.par_iter()).for_each_init(LossScratch::default, |scratch, (out, c)| {
            let (l, grad) = out.split_first_mut().expect("a sample's loss");
            *l = loss.value_and_grad(&c.z, &c.pos, grad, scratch);
        });
        let loss_sum: f64 = per_sample.iter().map(|v| f64::from(v[0])).sum();
        let (l, c) = (loss_sum.to_bits(), cost as u64);
        let header = [l as u32, (l >> 32) as u32, c as u32, (c >> 32) as u32];
        let grads_of: Vec<(&Worked, &[f32])> = worked.iter().zip(&per_sample).map(|(w, v)| (w, &v[1..])).collect();
        let (send, counts) = per_sample_messages(ranks, &header, 2, &grads_of, |&(w, g), emit| {
            for ((&class, &owner), &v) in w.c.classes.iter().zip(&w.owner).zip(g).filter(|&(_, &v)| v != 0.0) {
                emit(owner as usize, &[class, v.to_bits()]);
            }
        });
        let (mut got, mut got_counts) = (Vec::new(), Vec::new());
        self.bytes += 4 * send.len();
        self.timed(&mut || comm.alltoallv_u32(&send, &counts, &mut got, &mut got_counts))?;
        grads.reset_sparse(b);
        let (mut total_loss, mut total_cost) = (0f64, 0u64);
        for (e, msg) in parts(&got, &got_counts).into_iter().enumerate() {
            let word = |k: usize| u64::from(msg[k]) | (u64::from(msg[k + 1]) << 32);
            total_loss += f64::from_bits(word(0));
            total_cost = total_cost.saturating_add(word(2));
            let mut at = 4;
            for i in part(b, e, ranks) {
                let n = msg[at] as usize;
                for pair in msg[at + 1..at + 1 + 2 * n].chunks_exact(2) {
                    let local = shard.local(pair[0] as usize).ok_or_else(|| not_held(e, comm.rank(), pair[0]))?;
                    grads.sparse[i].push(local as ClassId, f32::from_bits(pair[1]));
                }
                at += 1 + 2 * n;
            }
        }
        Ok((total_loss, total_cost as usize))
    }
}

/// Rank `from` sent rank `to` a class it does not hold (the ranks disagree on the layout).
fn not_held(from: usize, to: usize, class: u32) -> DistError {
    DistError::Mpi(format!("rank {from} sent rank {to} class {class}, which rank {to} does not hold"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_sample_messages_lay_out_header_counts_and_entries_per_rank() {
        // Per sample, (rank, class, value) entries; an entry is emitted in two parts.
        let samples: Vec<Vec<(usize, u32, u32)>> =
            vec![vec![(2, 10, 100), (0, 11, 101), (2, 12, 102)], vec![], vec![(1, 13, 103)]];
        let (send, counts) = per_sample_messages(3, &[7, 8], 2, &samples, |entries, emit| {
            for &(r, class, value) in entries {
                emit(r, &[class]);
                emit(r, &[value]);
            }
        });
        let rank0 = [7, 8, 1, 11, 101, 0, 0];
        let rank1 = [7, 8, 0, 0, 1, 13, 103];
        let rank2 = [7, 8, 2, 10, 100, 12, 102, 0, 0];
        assert_eq!(counts, [rank0.len(), rank1.len(), rank2.len()]);
        assert_eq!(send, [&rank0[..], &rank1[..], &rank2[..]].concat());
    }
}
