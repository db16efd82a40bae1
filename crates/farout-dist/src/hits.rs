//! Hits (class, score) that every rank found among its own rows, gathered over the ranks: the
//! merged top-k of a class-sharded prediction or search, ties to the lower class as one process
//! breaks them.

use crate::{Collective, DistError};
use farout_core::topk::{Hit, by_score};
use rayon::prelude::*;

/// Rows whose per-rank hits travel in one exchange, at most (bounds the buffers of
/// [`merge_top_k`] and [`gather_all_hits`]) ...
const MERGE_ROWS: usize = 16_384;
/// ... and hits per rank in one exchange, about (at least one row).
const MERGE_VALUES: usize = 1 << 22;

/// Every rank's top-k per row (`local[i]`: at most `k` hits, global ids) merged into the top-k
/// over all ranks, on every rank; ties go to the lower class, as
/// [`top_k`](farout_core::topk::top_k) breaks them over all
/// scores, so the result equals a one-process prediction. Every rank must pass as many rows.
pub fn merge_top_k(comm: &dyn Collective, local: Vec<Vec<Hit>>, k: usize) -> Result<Vec<Vec<Hit>>, DistError> {
    gather_hits(comm, local, k, k)
}

/// Every rank's hits per row (global ids) gathered on every rank: each row's hits over all
/// ranks, best first (ties to the lower class); on one rank, `local` as it is. Every rank must
/// pass as many rows. Also returns the hits each rank sent per row (the most any rank holds).
pub fn gather_all_hits(comm: &dyn Collective, local: Vec<Vec<Hit>>) -> Result<(Vec<Vec<Hit>>, usize), DistError> {
    let mut width = [local.iter().map(Vec::len).max().unwrap_or(0) as f64];
    if comm.size() == 1 {
        return Ok((local, width[0] as usize));
    }
    comm.allreduce_max_f64(&mut width)?;
    let width = width[0] as usize;
    Ok((gather_hits(comm, local, width, usize::MAX)?, width))
}

/// Every rank's at most `width` hits per row gathered on every rank, sorted best first and cut
/// to the `keep` best.
fn gather_hits(
    comm: &dyn Collective,
    mut local: Vec<Vec<Hit>>,
    width: usize,
    keep: usize,
) -> Result<Vec<Vec<Hit>>, DistError> {
    let ranks = comm.size();
    if ranks == 1 || width == 0 {
        return Ok(local);
    }
    // Each rank's lists best first (searches return them so; then this costs one pass), so
    // that the ranks' lists of a row merge in one pass.
    local.par_iter_mut().for_each(|hits| {
        if !hits.is_sorted_by(|a, b| by_score(a, b).is_le()) {
            hits.sort_unstable_by(by_score);
        }
    });
    let mut merged = Vec::with_capacity(local.len());
    let (mut scores, mut ids) = (Vec::new(), Vec::new());
    let (mut all_scores, mut all_ids) = (Vec::new(), Vec::new());
    // Rows per exchange: at most MERGE_ROWS, and about MERGE_VALUES values from each rank.
    let rows = (MERGE_VALUES / width).clamp(1, MERGE_ROWS);
    for chunk in local.chunks(rows) {
        scores.clear();
        ids.clear();
        for hits in chunk {
            // Padded to `width`: a rank may hold fewer hits.
            scores.extend(hits.iter().map(|h| h.score).chain(std::iter::repeat(f32::NEG_INFINITY)).take(width));
            ids.extend(hits.iter().map(|h| h.class).chain(std::iter::repeat(u32::MAX)).take(width));
        }
        all_scores.resize(scores.len() * ranks, 0.0);
        all_ids.resize(ids.len() * ranks, 0);
        comm.allgather_f32(&scores, &mut all_scores)?;
        comm.allgather_u32(&ids, &mut all_ids)?;
        let per_rank = scores.len();
        let (all_scores, all_ids) = (&all_scores, &all_ids);
        let rows_merged: Vec<Vec<Hit>> = (0..chunk.len())
            .into_par_iter()
            .map(|i| {
                // The ranks' sorted lists of row i, each up to its padding.
                let lists: Vec<(&[f32], &[u32])> = (0..ranks)
                    .map(|r| {
                        let at = r * per_rank + i * width;
                        let ids = &all_ids[at..at + width];
                        let n = ids.iter().position(|&c| c == u32::MAX).unwrap_or(width);
                        (&all_scores[at..at + n], &ids[..n])
                    })
                    .collect();
                merge_sorted(&lists, keep)
            })
            .collect();
        merged.extend(rows_merged);
    }
    Ok(merged)
}

/// The `keep` best hits of `lists` (each `(scores, ids)` sorted best first, as [`by_score`]
/// orders), best first: a merge of the lists' heads.
fn merge_sorted(lists: &[(&[f32], &[u32])], keep: usize) -> Vec<Hit> {
    let total: usize = lists.iter().map(|l| l.1.len()).sum();
    let mut out = Vec::with_capacity(total.min(keep));
    let mut heads = vec![0usize; lists.len()];
    while out.len() < keep {
        let best = (0..lists.len())
            .filter(|&r| heads[r] < lists[r].1.len())
            .map(|r| (r, Hit { class: lists[r].1[heads[r]], score: lists[r].0[heads[r]] }))
            .min_by(|a, b| by_score(&a.1, &b.1));
        let Some((r, hit)) = best else { break };
        out.push(hit);
        heads[r] += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Local, Threads};

    /// The hits of ranks that hold every third class: each rank's top-k over its own classes.
    fn rank_hits(rank: usize, ranks: usize, scores: &[Vec<f32>], k: usize) -> Vec<Vec<Hit>> {
        scores
            .iter()
            .map(|row| {
                let own = row.iter().enumerate().filter(|(c, _)| c % ranks == rank);
                let mut hits: Vec<Hit> = own.map(|(c, &score)| Hit { class: c as u32, score }).collect();
                hits.sort_unstable_by(by_score);
                hits.truncate(k);
                hits
            })
            .collect()
    }

    #[test]
    fn the_merged_top_k_of_the_ranks_is_the_top_k_of_all_classes() {
        // Few distinct scores, so that ties between ranks are common.
        let scores: Vec<Vec<f32>> = (0..50).map(|i| (0..40).map(|c| ((i * 7 + c * 13) % 5) as f32).collect()).collect();
        let k = 6;
        let want = rank_hits(0, 1, &scores, k);
        assert_eq!(merge_top_k(&Local, want.clone(), k).unwrap(), want);
        for ranks in [2, 3] {
            let got = Threads::run(ranks, |c| merge_top_k(c, rank_hits(c.rank(), ranks, &scores, k), k).unwrap());
            assert!(got.iter().all(|g| g == &want), "{ranks} ranks");
            let all = Threads::run(ranks, |c| gather_all_hits(c, rank_hits(c.rank(), ranks, &scores, 40)).unwrap());
            assert!(all.iter().all(|(g, _)| g == &rank_hits(0, 1, &scores, 40)), "{ranks} ranks, every hit");
        }
    }
}
