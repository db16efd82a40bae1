//! The search estimators ([`farout_estimators::ShardPlan::Search`]: mips, and ldgs at its
//! exact fixed point) on a class-sharded layer, each sample worked on by one rank.
//!
//! Rank `e` of `P` works on the samples `B e / P..B (e + 1) / P` of the batch (every rank
//! holds the whole batch); class `c` is owned by rank `c mod P` ([`Strided`]). One step:
//!
//! ```text
//! search:   each rank searches its block indexes for all B samples: every block's top-Q of its rows
//! route:    sample i's hits go to the rank e(i) working on it, with the exact scores of the
//!           positives each rank owns                                        one alltoallv
//! merge:    e(i) keeps every block's top-Q over the ranks (the top-Q of the whole layer);
//!           U_i = their union and the positives, as one process builds it
//! complete: (several blocks, or a bias) e(i) asks each owner for what the searches did not
//!           score of its candidates (the unknown blocks, the bias); the owners answer
//!                                                                           two alltoallv
//! loss:     e(i) evaluates L(z_U, P) and sends each owner the nonzero gradients of its classes,
//!           with its part of the loss and of the dot products              one alltoallv
//! ```
//!
//! Against every rank gathering every rank's hits and building every sample's `U` (and an
//! allreduce of every candidate's score), a rank sends each hit once, to one rank, merges and
//! builds `U` for `B / P` samples, and the scores travel only as far as the rank that needs
//! them: no work is repeated on every rank. Scores and gradients travel as the bits of f32
//! in `u32` messages; a sample's candidates' scores are the sums of [`complete_scores`], so
//! with brute-force indexes the step is one process's (to rounding).

use crate::sharded_sparse::{Candidates, StepComm, split_per_sample};
use farout_core::ClassId;
use farout_core::topk::Hit;
use farout_dist::DistError;
use farout_estimators::{
    Batch, BatchEstimate, BatchGrad, Ctx, Loss, LossScratch, RescoreScratch, complete_scores, completes_whole_row,
};
use rayon::prelude::*;
use std::ops::Range;

/// The samples of a batch of `b` that rank `r` of `ranks` works on.
pub(crate) fn part(b: usize, r: usize, ranks: usize) -> Range<usize> {
    b * r / ranks..b * (r + 1) / ranks
}

/// One sample's candidates on the rank working on it, with which blocks the searches scored.
#[derive(Default)]
struct Worked {
    c: Candidates,
    /// Per candidate, `words` u32 of bits: block j scored by a search when bit j is set ...
    known: Vec<u32>,
    /// ... how many blocks that is, and the rank owning the candidate.
    n_known: Vec<u32>,
    owner: Vec<u32>,
}

impl Worked {
    /// Candidate `u`'s known-blocks mask.
    fn mask(&self, u: usize, words: usize) -> &[u32] {
        &self.known[u * words..(u + 1) * words]
    }
}

/// Messages to every rank in one buffer, with its counts, for an alltoallv: to each rank
/// `header`, then per sample of `samples` `[n, entry x n]`, the entries of `width` words that
/// `entries(sample, emit)` emits to that rank (`emit(rank, words)`; an entry may be emitted in
/// parts). Two passes over `entries`: the first counts each rank's words, the second writes
/// them in place, so no per-rank buffer grows and none is copied into the one sent.
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
    let mut at: Vec<usize> = counts.iter().scan(0, |acc, &n| Some(std::mem::replace(acc, *acc + n))).collect();
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
        // Row j * B + i: block j's hits of sample i, global ids.
        let mut rows = Vec::with_capacity(n_blocks * b);
        let (mut hits, mut search_dots) = (Vec::new(), 0);
        for j in 0..n_blocks {
            search_dots += index.search_block_batch(ctx.w, j, batch.phi, top, &mut hits);
            rows.append(&mut hits);
        }
        let shard = self.shard;
        rows.iter_mut().flatten().for_each(|h| h.class = shard.global(h.class as usize) as ClassId);
        self.phases.search += self.lap();
        let mut worked = self.routed_candidates(ctx, batch, rows, top, n_blocks)?;
        let cost = search_dots.div_ceil(n_blocks) + self.found_cost(&worked, n_blocks, ctx.bias.is_some());
        self.phases.candidates += self.lap();
        if n_blocks > 1 || ctx.bias.is_some() {
            self.complete(ctx, batch, n_blocks, &mut worked)?;
        }
        self.phases.score += self.lap();
        let (loss_sum, classes_scored) = self.routed_loss(grads, b, &worked, loss, cost)?;
        self.phases.loss += self.lap();
        Ok(BatchEstimate { loss_sum, classes_scored })
    }

    /// Routes every block's hits to the rank working on their sample, with the exact scores of
    /// the positives this rank owns, and builds this rank's samples' candidates: each block's
    /// top-`top` over the ranks, their union and the positives (a positive no search found
    /// takes its owner's score).
    fn routed_candidates(
        &mut self,
        ctx: &Ctx,
        batch: Batch,
        rows: Vec<Vec<Hit>>,
        top: usize,
        n_blocks: usize,
    ) -> Result<Vec<Worked>, DistError> {
        let (comm, shard, b) = (self.comm, self.shard, batch.phi.rows());
        let (ranks, me) = (comm.size(), comm.rank());
        let worker: Vec<usize> = (0..ranks).flat_map(|r| part(b, r, ranks).map(move |_| r)).collect();
        let dest: Vec<usize> = (0..n_blocks).flat_map(|_| worker.iter().copied()).collect();
        // To rank q: the scores of the positives this rank owns, of q's samples in order.
        let positives: Vec<Vec<u32>> = (0..ranks)
            .map(|q| {
                let owned =
                    |i: usize| batch.positives[i].iter().filter_map(move |&p| shard.local(p as usize).map(|l| (i, l)));
                part(b, q, ranks).flat_map(owned).map(|(i, l)| ctx.score(l, batch.phi.row(i)).to_bits()).collect()
            })
            .collect();
        self.bytes +=
            8 * rows.iter().map(|r| r.len()).sum::<usize>() + 4 * positives.iter().map(Vec::len).sum::<usize>();
        let mut routed = farout_dist::Routed::default();
        let mut rows = Some(rows);
        self.timed(&mut || {
            routed = farout_dist::route_top_k(comm, rows.take().unwrap_or_default(), &dest, top, &positives)?;
            Ok(())
        })?;
        let mine = part(b, me, ranks);
        let m = mine.len();
        let words = n_blocks.div_ceil(32);
        let mut worked: Vec<Worked> = (0..m).map(|_| Worked::default()).collect();
        worked.par_iter_mut().enumerate().for_each(|(ii, w)| {
            let positives = batch.positives[mine.start + ii];
            if n_blocks == 1 {
                w.c.set_single(&routed.rows[ii], positives);
            } else {
                let blocks = (0..n_blocks).map(|j| routed.rows[j * m + ii].as_slice());
                w.c.set_searched(blocks, positives, shard.rows());
            }
            w.known.clear();
            w.known.resize(w.c.classes.len() * words, 0);
            w.n_known.clear();
            w.n_known.resize(w.c.classes.len(), 0);
            for &(u, j, score) in &w.c.found {
                w.known[u as usize * words + j as usize / 32] |= 1 << (j % 32);
                w.n_known[u as usize] += 1;
                w.c.z[u as usize] += score;
            }
            w.owner.clear();
            w.owner.extend(w.c.classes.iter().map(|&c| shard.owner(c as usize) as u32));
        });
        // The positives no search found take their owner's score.
        let from = parts(&routed.extra, &routed.extra_counts);
        let mut next: Vec<usize> = vec![0; ranks];
        for w in worked.iter_mut() {
            for &u in &w.c.pos {
                let owner = w.owner[u as usize] as usize;
                let score = f32::from_bits(from[owner][next[owner]]);
                next[owner] += 1;
                if w.n_known[u as usize] == 0 {
                    w.c.z[u as usize] = score;
                }
            }
        }
        Ok(worked)
    }

    /// The block products this rank's samples' candidates cost beyond the searches, as one
    /// process counts them: a positive no search found costs its row; with several blocks or a
    /// bias, a found class its unknown blocks ([`complete_scores`]). In classes: per sample,
    /// the products over the blocks, rounded up.
    fn found_cost(&self, worked: &[Worked], n_blocks: usize, bias: bool) -> usize {
        let completes = n_blocks > 1 || bias;
        let dots = |w: &Worked, u: usize| match w.n_known[u] as usize {
            0 => n_blocks,
            _ if !completes => 0,
            k if completes_whole_row(n_blocks, k) => n_blocks,
            k => n_blocks - k,
        };
        worked.iter().map(|w| (0..w.c.classes.len()).map(|u| dots(w, u)).sum::<usize>().div_ceil(n_blocks)).sum()
    }

    /// The scores of this rank's samples' found candidates completed by their owners: each is
    /// asked for the candidates' unknown blocks (and bias), as (class, known-blocks mask) per
    /// sample, and answers with what [`complete_scores`] adds to the found scores (or the whole
    /// score, where it computes the whole row).
    fn complete(&mut self, ctx: &Ctx, batch: Batch, n_blocks: usize, worked: &mut [Worked]) -> Result<(), DistError> {
        let (comm, shard, b) = (self.comm, self.shard, batch.phi.rows());
        let ranks = comm.size();
        let words = n_blocks.div_ceil(32);
        // A found class with blocks unknown, or any found class when there is a bias to add (a
        // positive no search found has its score already).
        let bias = ctx.bias.is_some();
        let asked = |w: &Worked, u: usize| {
            let known = w.n_known[u] as usize;
            known > 0 && (bias || known < n_blocks)
        };
        // Requests: per owner, per sample of this rank, [count, (class, mask) x count].
        let (send, counts) = per_sample_messages(ranks, &[], 1 + words, worked, |w, emit| {
            for (u, &class) in w.c.classes.iter().enumerate().filter(|&(u, _)| asked(w, u)) {
                let owner = w.owner[u] as usize;
                emit(owner, &[class]);
                emit(owner, w.mask(u, words));
            }
        });
        let (mut got, mut got_counts) = (Vec::new(), Vec::new());
        self.bytes += 4 * send.len();
        self.timed(&mut || comm.alltoallv_u32(&send, &counts, &mut got, &mut got_counts))?;
        // Answers: the asking rank's samples in order, one value per class asked.
        let mut answers = vec![Vec::new(); ranks];
        let mut scratch = (RescoreScratch::default(), Vec::new(), Vec::new(), Vec::new());
        for (e, msg) in parts(&got, &got_counts).into_iter().enumerate() {
            let mut at = 0;
            for i in part(b, e, ranks) {
                let n = msg[at] as usize;
                let entries = &msg[at + 1..at + 1 + n * (1 + words)];
                at += 1 + n * (1 + words);
                let (rescore, local, found, total) = &mut scratch;
                local.clear();
                found.clear();
                for (u, entry) in entries.chunks_exact(1 + words).enumerate() {
                    let l = shard.local(entry[0] as usize).ok_or_else(|| not_held(e, comm.rank(), entry[0]))?;
                    local.push(l as ClassId);
                    found.extend((0..n_blocks).filter(|&j| entry[1 + j / 32] >> (j % 32) & 1 == 1).map(|j| (u, j)));
                }
                let found = found.iter().map(|&(u, j)| (u, j, 0.0));
                complete_scores(ctx, n_blocks, batch.phi.row(i), local, found, rescore, total);
                answers[e].extend(total.iter().map(|z| z.to_bits()));
            }
        }
        let counts: Vec<usize> = answers.iter().map(Vec::len).collect();
        let send = answers.concat();
        self.bytes += 4 * send.len();
        self.timed(&mut || comm.alltoallv_u32(&send, &counts, &mut got, &mut got_counts))?;
        let from = parts(&got, &got_counts);
        let mut next = vec![0; ranks];
        for w in worked.iter_mut() {
            for u in 0..w.c.classes.len() {
                if !asked(w, u) {
                    continue;
                }
                let owner = w.owner[u] as usize;
                let answer = f32::from_bits(from[owner][next[owner]]);
                next[owner] += 1;
                let whole = completes_whole_row(n_blocks, w.n_known[u] as usize);
                w.c.z[u] = if whole { answer } else { w.c.z[u] + answer };
            }
        }
        Ok(())
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
