//! Int8 scoring in [`SphericalIndex`] (`scoring = "int8"`): the probed clusters are scanned on
//! int8 codes of their rows ([`crate::quant`]), which rank them almost as exact scores do; this
//! file rescores the best `rescore * k` of them (at least [`RESCORE_MARGIN`] more than `k`)
//! exactly from the f32 copies and keeps the top `k`, for one query
//! ([`SphericalIndex::rescore`]) or a batch ([`SphericalIndex::rescore_batch`]).
//!
//! [`SphericalIndex`]: super::SphericalIndex

use super::SphericalIndex;
use super::search::{BatchProbes, per_result, probed};
use crate::Hit;
use farout_core::topk::{self, NthBest};
use farout_core::{Matrix, kernels};
use rayon::prelude::*;

/// Rows rescored beyond `k` at least: at small `k` a few near-ties on the codes decide the last
/// places (at top 10 of 200,000 rows, rescoring 10 rows lost 0.6 points of recall against f32
/// scoring, rescoring 50 none), and a few dozen dot products cost nothing beside the scan.
const RESCORE_MARGIN: usize = 32;

/// Rows whose copies are requested ahead of the one being rescored: the gathered rows are
/// scattered over the clusters, so loading them a few at a time overlaps the memory latency.
const AHEAD: usize = 8;

impl SphericalIndex {
    /// Rows rescored exactly per query for `k` results (int8 scoring).
    pub(super) fn depth(&self, k: usize) -> usize {
        per_result(k, self.config.rescore).max(k + RESCORE_MARGIN)
    }

    /// The per-query end of int8 scoring: `candidates` (the best probed rows by approximate
    /// score) rescored exactly from the copies (gathered: loading [`AHEAD`] rows ahead), their
    /// `k` best into `out`. Returns the number of rows rescored.
    pub(super) fn rescore(&self, candidates: &mut Vec<Hit>, query: &[f32], k: usize, out: &mut Vec<Hit>) -> usize {
        let d = query.len();
        for h in candidates.iter().take(AHEAD) {
            kernels::prefetch(self.copy_of(h.class, d));
        }
        for t in 0..candidates.len() {
            if let Some(next) = candidates.get(t + AHEAD) {
                kernels::prefetch(self.copy_of(next.class, d));
            }
            candidates[t].score = kernels::dot(self.copy_of(candidates[t].class, d), query);
        }
        let rescored = candidates.len();
        keep_best(candidates, k, out);
        rescored
    }

    /// The int8 path's end of the batched search, from the approximate scores (`blocks`):
    /// every query's cut, the `depth`-th best approximate score of its probed rows; then,
    /// cluster by cluster, the rows reaching the cut of a query probing the cluster are rescored
    /// exactly from the f32 copy (each copy is read once, while it is in cache, for all its
    /// queries, instead of gathering rows query by query); then each query's `k` best of its
    /// rescored rows into `out`. Returns the number of rows rescored.
    pub(super) fn rescore_batch(
        &self,
        probes: &BatchProbes,
        blocks: &[(Vec<f32>, usize)],
        queries: &Matrix,
        k: usize,
        out: &mut [Vec<Hit>],
    ) -> usize {
        let (d, depth) = (queries.cols(), self.depth(k));
        // Per query: rows scoring at least this are rescored (`depth` of them, more on ties).
        let cuts: Vec<f32> = probes
            .slots
            .par_iter()
            .map_init(
                || (Vec::new(), NthBest::default()),
                |(parts, nth), slots| {
                    parts.clear();
                    parts.extend(probed(slots, &self.clusters, blocks).map(|(scores, _)| scores));
                    nth.of(parts, depth)
                },
            )
            .collect();
        // For the `s`-th query probing cluster `j`: `hits[starts[s]..starts[s + 1]]` of
        // `rescored[j]`.
        let rescored: Vec<(Vec<Hit>, Vec<u32>)> = probes
            .queries_of
            .par_iter()
            .zip(blocks)
            .zip(&self.clusters)
            .map_init(
                || (Vec::new(), Vec::new()),
                |(positions, kept), ((qs, (z, stride)), cluster)| {
                    // The rows reaching each query's cut: `positions[starts[s]..starts[s + 1]]`.
                    let mut starts = Vec::with_capacity(qs.len() + 1);
                    positions.clear();
                    for (s, &q) in qs.iter().enumerate() {
                        starts.push(positions.len() as u32);
                        kept.clear();
                        kernels::keep_at_least(
                            &z[s * stride..s * stride + cluster.len()],
                            cuts[q as usize],
                            positions,
                            kept,
                        );
                    }
                    starts.push(positions.len() as u32);
                    // With many results per query most rows are needed by some query: load them
                    // all in one stream. With few, load only the rows needed, a few ahead.
                    let stream = positions.len() >= cluster.len() / 2;
                    if stream {
                        kernels::prefetch(&cluster.rows);
                    }
                    let mut hits = Vec::with_capacity(positions.len());
                    for (s, &q) in qs.iter().enumerate() {
                        let mine = &positions[starts[s] as usize..starts[s + 1] as usize];
                        let query = queries.row(q as usize);
                        if !stream {
                            mine.iter().take(AHEAD).for_each(|&i| kernels::prefetch(cluster.row(i as usize, d)));
                        }
                        for (t, &i) in mine.iter().enumerate() {
                            if !stream && let Some(&next) = mine.get(t + AHEAD) {
                                kernels::prefetch(cluster.row(next as usize, d));
                            }
                            let score = kernels::dot_simd(cluster.row(i as usize, d), query);
                            hits.push(Hit { class: cluster.ids[i as usize], score });
                        }
                    }
                    (hits, starts)
                },
            )
            .collect();
        out.par_iter_mut()
            .zip(&probes.slots)
            .map_init(Vec::new, |candidates, (found, slots)| {
                candidates.clear();
                for &(j, slot) in slots {
                    let (hits, starts) = &rescored[j as usize];
                    candidates
                        .extend_from_slice(&hits[starts[slot as usize] as usize..starts[slot as usize + 1] as usize]);
                }
                let n = candidates.len();
                keep_best(candidates, k, found);
                n
            })
            .sum()
    }
}

/// The `k` best of `candidates` (emptied) into `out`, in no particular order.
fn keep_best(candidates: &mut Vec<Hit>, k: usize, out: &mut Vec<Hit>) {
    if candidates.len() > k {
        if k > 0 {
            candidates.select_nth_unstable_by(k - 1, topk::by_score);
        }
        candidates.truncate(k);
    }
    out.clear();
    out.append(candidates);
}

#[cfg(test)]
mod tests {
    use super::super::both_scorings;
    use crate::testutil::clustered;
    use crate::{MipsIndex, Rows, SphericalIndex};
    use farout_core::ClassId;

    /// Int8 scoring ranks the probed rows almost as exact scores do: with nothing rescored
    /// beyond the `k` returned, its top 100 holds at least 99% of what f32 scoring finds among
    /// the same probed rows (same centroids), in the per-query and the batched search.
    #[test]
    fn int8_scoring_finds_what_f32_scoring_finds() {
        let (w, q) = clustered(20_000, 32);
        let [f32s, int8] = both_scorings().map(|c| SphericalIndex::build(Rows::all(&w), &c));
        assert_eq!(f32s.assign, int8.assign, "same clusters");
        let (mut a, mut b, mut batch) = (Vec::new(), Vec::new(), Vec::new());
        let mut overlap = (0, 0);
        int8.search_batch(Rows::all(&w), &q, 100, &mut batch);
        for (i, batched) in batch.iter().enumerate() {
            f32s.search(Rows::all(&w), q.row(i), 100, &mut a);
            int8.search(Rows::all(&w), q.row(i), 100, &mut b);
            let truth: std::collections::HashSet<ClassId> = a.iter().map(|h| h.class).collect();
            overlap.0 += b.iter().filter(|h| truth.contains(&h.class)).count();
            overlap.1 += batched.iter().filter(|h| truth.contains(&h.class)).count();
        }
        let total = 100 * q.rows();
        assert!(overlap.0 as f64 >= 0.99 * total as f64, "per query: {} of {total}", overlap.0);
        assert!(overlap.1 as f64 >= 0.99 * total as f64, "batched: {} of {total}", overlap.1);
    }
}
