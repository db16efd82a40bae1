//! 4-bit product-quantisation scoring in [`SphericalIndex`] (`scoring = "pq4"`): every
//! cluster also keeps 4-bit codes of its rows' residuals from the cluster's mean
//! ([`crate::pq4`]), on which a query searched alone is scanned, 64 bytes a row at D = 128
//! against 128 of int8 codes; the best `pq4_rescore * k` (at least
//! [`quant::RESCORE_MARGIN`](crate::quant) more than `k`) are then rescored exactly from the
//! copies. A lone query shares its loads with no other query, so the bytes it scans set its
//! speed; a batch shares each cluster's int8 codes between the queries probing it and keeps
//! the int8 scan (see docs/decisions.md, "pq4-single-query").
//!
//! The codebook is fitted once, on a sample of all the clusters' residuals, and each cluster's
//! mean is fixed when its codes are made: a synced or moved row is coded against the codebook
//! and mean it finds. A saved index keeps the codebook and the means, and loading codes the
//! copies with them again.
//!
//! [`SphericalIndex`]: super::SphericalIndex

use super::SphericalIndex;
use super::cluster::{Cluster, Pq4Codes};
use crate::persist::{Dec, Enc, Problem, expect_len, inconsistent};
use crate::pq4::{self, Codebook};
use rayon::prelude::*;
use std::sync::Arc;

/// Gives every cluster 4-bit codes of its rows (`d` wide): the clusters' means, a codebook
/// fitted on the residuals of an even sample of the rows (at most [`pq4::TRAIN_ROWS`]), the
/// codes.
pub(super) fn attach(clusters: &mut [Cluster], d: usize, seed: u64) {
    let means: Vec<Vec<f32>> = clusters.par_iter().map(|c| mean_of(&c.rows, d)).collect();
    let n: usize = clusters.iter().map(Cluster::len).sum();
    let step = n.div_ceil(pq4::TRAIN_ROWS).max(1);
    let mut residuals = Vec::with_capacity(n.div_ceil(step) * d);
    let mut at = 0usize;
    for (cluster, mean) in clusters.iter().zip(&means) {
        // Rows `at..at + len` of the clusters in order; the sample takes every `step`-th.
        let first = at.next_multiple_of(step) - at;
        for row in cluster.rows.chunks_exact(d.max(1)).skip(first).step_by(step) {
            residuals.extend(row.iter().zip(mean).map(|(x, m)| x - m));
        }
        at += cluster.len();
    }
    let book = Arc::new(Codebook::fit(&residuals, d, seed));
    clusters.par_iter_mut().zip(means).for_each(|(cluster, mean)| {
        cluster.pq4 = Some(Pq4Codes::new(&cluster.rows, mean, Arc::clone(&book)));
    });
}

/// Writes the codebook and every cluster's mean (what [`restore`] codes the copies with).
pub(super) fn save(clusters: &[Cluster], out: &mut Enc) {
    let codes = clusters.iter().map(|c| c.pq4.as_ref().expect("pq4 scoring keeps 4-bit codes"));
    if let Some(first) = clusters.first().and_then(|c| c.pq4.as_ref()) {
        out.f32s(first.book.levels());
    } else {
        out.f32s(&[]);
    }
    for p in codes {
        out.f32s(&p.mean);
    }
}

/// Reads what [`save`] wrote and codes every cluster's copies (`d` wide) with it.
pub(super) fn restore(dec: &mut Dec, clusters: &mut [Cluster], d: usize) -> Result<(), Problem> {
    let levels = dec.f32s()?;
    let book = Codebook::from_levels(d, levels).ok_or_else(|| inconsistent("the 4-bit codebook"))?;
    let book = Arc::new(book);
    for (j, cluster) in clusters.iter_mut().enumerate() {
        let mean = dec.f32s()?;
        expect_len(&mean, d, "values in a cluster's mean")?;
        if mean.iter().any(|x| !x.is_finite()) {
            return Err(inconsistent(format!("a non-finite value in the mean of cluster {j}")));
        }
        cluster.pq4 = Some(Pq4Codes::new(&cluster.rows, mean, Arc::clone(&book)));
    }
    Ok(())
}

/// The mean of `rows` (row-major, `d` wide; zeros for none).
fn mean_of(rows: &[f32], d: usize) -> Vec<f32> {
    let mut mean = vec![0.0f32; d];
    let n = rows.len() / d.max(1);
    for row in rows.chunks_exact(d.max(1)) {
        mean.iter_mut().zip(row).for_each(|(m, x)| *m += x);
    }
    mean.iter_mut().for_each(|m| *m /= n.max(1) as f32);
    mean
}

/// A lone query scans 4-bit codes when it probes at least this many rows per row it then
/// rescores beyond what int8 scoring rescores: the 4-bit scan saves a little on every probed
/// row, each extra row rescored is a gather of its copy from memory. At K = 200,000 the 4-bit
/// scan ran 0.8-1.2x int8 scoring's speed at top 100 (127 rows probed per extra row rescored;
/// on a shared machine) and 0.7x at top 2,000 (11); at top 10, where neither rescores more than
/// `k + 32`, 1.4-2.1x (docs/decisions.md, "pq4-single-query").
const PROBED_PER_EXTRA_RESCORED: usize = 64;

impl SphericalIndex {
    /// Rows rescored exactly per query for `k` results on 4-bit codes.
    pub(super) fn pq4_depth(&self, k: usize) -> usize {
        crate::quant::rescore_depth(k, self.config.pq4_rescore)
    }

    /// Whether a lone query for `k` results probing `budget` rows gains by scanning 4-bit codes
    /// (see [`PROBED_PER_EXTRA_RESCORED`]).
    pub(super) fn pq4_pays(&self, k: usize, budget: usize) -> bool {
        let extra = self.pq4_depth(k).saturating_sub(self.depth(k));
        budget >= PROBED_PER_EXTRA_RESCORED * extra
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Scoring, SphericalConfig};
    use super::*;
    use crate::testutil::{assert_exact_scores, clustered, move_rows_onto};
    use crate::{MipsIndex, Rows};
    use farout_core::{ClassId, kernels};
    use std::collections::HashSet;

    /// A fixed budget of 10 rows per result, and no more rows rescored after a scan of 4-bit
    /// codes than after one of int8 codes, so that lone queries scan the 4-bit codes.
    fn config(scoring: Scoring) -> SphericalConfig {
        SphericalConfig { scoring, candidate_factor: Some(10.0), pq4_rescore: 1.0, ..SphericalConfig::default() }
    }

    /// Lone queries scan 4-bit codes where the budget is large beside the extra rows rescored,
    /// int8 codes where not.
    #[test]
    fn pq4_scans_where_the_budget_outweighs_the_extra_rescoring() {
        let (w, _) = clustered(5_000, 32);
        let index = SphericalIndex::build(Rows::all(&w), &SphericalConfig { pq4_rescore: 2.5, ..config(Scoring::Pq4) });
        // Top 100: 250 rows rescored against 132, 118 more.
        assert!(index.pq4_pays(100, 118 * PROBED_PER_EXTRA_RESCORED));
        assert!(!index.pq4_pays(100, 118 * PROBED_PER_EXTRA_RESCORED - 1));
        // Top 10: k + 32 rescored either way.
        assert!(index.pq4_pays(10, 1));
    }

    /// A lone query scanned on 4-bit codes returns exact scores and, probing the same clusters,
    /// at least 98% of what int8 scoring finds in its top 100.
    #[test]
    fn lone_queries_on_pq4_codes_find_what_int8_codes_find() {
        let (w, q) = clustered(20_000, 32);
        let [int8, pq4] = [Scoring::Int8, Scoring::Pq4].map(|s| SphericalIndex::build(Rows::all(&w), &config(s)));
        assert!(pq4.clusters.iter().all(|c| c.pq4.is_some()) && int8.clusters.iter().all(|c| c.pq4.is_none()));
        assert_exact_scores(&pq4, &w, &q);
        let (mut a, mut b, mut overlap) = (Vec::new(), Vec::new(), 0);
        for i in 0..q.rows() {
            int8.search(Rows::all(&w), q.row(i), 100, &mut a);
            pq4.search(Rows::all(&w), q.row(i), 100, &mut b);
            let found: HashSet<ClassId> = a.iter().map(|h| h.class).collect();
            overlap += b.iter().filter(|h| found.contains(&h.class)).count();
        }
        let total = 100 * q.rows();
        assert!(overlap as f64 >= 0.98 * total as f64, "{overlap} of {total}");
    }

    /// After rows are synced and moved between clusters, every cluster's 4-bit codes are the
    /// codes of its copies against its mean, and the moved rows are found.
    #[test]
    fn refreshed_rows_keep_the_codes_of_their_copies() {
        let (mut w, q) = clustered(10_000, 16);
        let mut index = SphericalIndex::build(Rows::all(&w), &config(Scoring::Pq4));
        let moved = move_rows_onto(&mut w, q.row(0));
        let nudged: Vec<ClassId> = (0..50).map(|j| j * 191 + 11).filter(|c| !moved.contains(c)).collect();
        for &c in &nudged {
            kernels::scale(1.01, w.row_mut(c as usize));
        }
        index.refresh(Rows::all(&w), &[&moved[..], &nudged[..]].concat());
        for (j, cluster) in index.clusters.iter().enumerate() {
            let p = cluster.pq4.as_ref().expect("pq4 codes");
            let fresh = Pq4Codes::new(&cluster.rows, p.mean.clone(), Arc::clone(&p.book));
            assert_eq!(p.rows.len(), cluster.len(), "cluster {j}");
            for at in 0..cluster.len() {
                for s in 0..p.book.sub_spaces() {
                    assert_eq!(p.rows.code(at, s), fresh.rows.code(at, s), "cluster {j}, member {at}");
                }
            }
        }
        let mut out = Vec::new();
        index.search(Rows::all(&w), q.row(0), 50, &mut out);
        let found: HashSet<ClassId> = out.iter().map(|h| h.class).collect();
        assert!(moved.iter().all(|c| found.contains(c)), "the moved rows are the query's top 50");
    }
}
