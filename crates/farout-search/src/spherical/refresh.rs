//! Keeping [`SphericalIndex`] up to date while `W` changes: [`SphericalIndex::sync_rows`]
//! copies changed rows into their clusters (scores stay exact; after every step), and
//! [`SphericalIndex::refresh_rows`] also reassigns the rows that drifted away from their
//! centroid.
//!
//! A changed row is re-augmented and reassigned to its nearest centroid (cost C D per row, the
//! paper's `k_r C D`) only if its cosine with its own centroid fell by more than
//! `refresh_drift` since it was assigned (a check of D per row): rows that moved little, the
//! most in training, keep their cluster, so a refresh after every step costs little more than
//! the sync. Centroids are not moved; a row that outgrows the norm bound `M` asks for a rebuild.
//!
//! [`SphericalIndex`]: super::SphericalIndex

use super::cluster::Cluster;
use super::{SphericalIndex, kmeans};
use crate::Rows;
use farout_core::{ClassId, kernels};
use rayon::prelude::*;

/// Rows whose memory is requested ahead of the one being updated.
const AHEAD: usize = 4;

impl SphericalIndex {
    /// Copies the new values of `rows` of `w` into their clusters ([`crate::MipsIndex::sync`]).
    pub(super) fn sync_rows(&mut self, w: Rows, rows: &[ClassId]) {
        update_by_cluster(&mut self.clusters, &self.assign, &self.pos, w, rows, |_, _, _, _| false);
    }

    /// Syncs `rows` of `w` and reassigns those that drifted ([`crate::MipsIndex::refresh`]).
    pub(super) fn refresh_rows(&mut self, w: Rows, rows: &[ClassId]) {
        self.rebuild |= rows.par_iter().any(|&i| self.augmentation.outgrown(w.row(i as usize)));
        let d = w.dim();
        // Rows still as close to their centroid as when assigned (within the drift) stay.
        let (drift, augmentation, centroids, assigned_cos) =
            (self.config.refresh_drift, &self.augmentation, &self.centroids, &self.assigned_cos);
        let drifted = update_by_cluster(&mut self.clusters, &self.assign, &self.pos, w, rows, |x, i, row, a| {
            if drift < 0.0 {
                return true;
            }
            x.resize(d + 1, 0.0);
            augmentation.augment_row(row, x);
            kernels::dot(x, centroids.row(a)) < assigned_cos[i as usize] - drift
        });
        let (mut nearest, mut cos) = (vec![0u32; drifted.len()], vec![0.0f32; drifted.len()]);
        kmeans::assign_rows(w, &self.augmentation, &self.centroids, Some(&drifted), &mut nearest, &mut cos);
        let mut moved_rows = 0;
        for ((&i, &new), &c) in drifted.iter().zip(&nearest).zip(&cos) {
            self.assigned_cos[i as usize] = c;
            let (old, at) = (self.assign[i as usize], self.pos[i as usize] as usize);
            if new == old {
                continue;
            }
            moved_rows += 1;
            // O(1) removal: move the last member into the freed slot.
            if let Some(moved) = self.clusters[old as usize].swap_remove(at, d) {
                self.pos[moved as usize] = at as u32;
            }
            self.pos[i as usize] = self.clusters[new as usize].len() as u32;
            self.clusters[new as usize].push(i, w.row(i as usize));
            self.assign[i as usize] = new;
        }
        // Clusters changed: the probe budgets are renewed once enough rows have moved.
        self.calibrations.count_reassigned(moved_rows);
    }
}

/// Copies the new values of `rows` of `w` into their clusters (`assign` and `pos`: every row's
/// cluster and place in it), cluster by cluster on all threads, each cluster's copy and codes
/// written by one; returns the rows for which `drifted(buffer, row, its values, its cluster)`
/// holds, cluster after cluster. The changed rows are scattered over `W` and the clusters, and
/// a row's codes over its group's cache lines: each row's memory is requested [`AHEAD`] rows
/// early, so that the updates overlap their waits on memory (most of a refresh's time at
/// K = 672,000).
fn update_by_cluster(
    clusters: &mut [Cluster],
    assign: &[u32],
    pos: &[u32],
    w: Rows,
    rows: &[ClassId],
    drifted: impl Fn(&mut Vec<f32>, ClassId, &[f32], usize) -> bool + Sync,
) -> Vec<ClassId> {
    let d = w.dim();
    let (starts, by_cluster) = farout_core::group_rows(rows, clusters.len(), |i| assign[i as usize] as usize);
    clusters
        .par_iter_mut()
        .enumerate()
        .map_init(Vec::new, |x, (a, cluster)| {
            let mine = &by_cluster[starts[a]..starts[a + 1]];
            let ask = |cluster: &Cluster, i: ClassId| {
                kernels::prefetch(w.row(i as usize));
                cluster.prefetch(pos[i as usize] as usize, d);
            };
            mine.iter().take(AHEAD).for_each(|&i| ask(cluster, i));
            let mut moved = Vec::new();
            for (t, &i) in mine.iter().enumerate() {
                if let Some(&ahead) = mine.get(t + AHEAD) {
                    ask(cluster, ahead);
                }
                let row = w.row(i as usize);
                cluster.set(pos[i as usize] as usize, row);
                if drifted(x, i, row, a) {
                    moved.push(i);
                }
            }
            moved
        })
        .flatten_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::{Scoring, SphericalConfig, both_scorings};
    use super::*;
    use crate::MipsIndex;
    use crate::quant::{self, QuantQueries, QuantRows};
    use crate::testutil::{assert_exact_scores, assert_exact_top, clustered, move_rows_onto};

    #[test]
    fn refreshed_rows_are_found_where_they_now_belong() {
        for config in both_scorings() {
            refreshed_rows_are_found_with(&config);
        }
    }

    fn refreshed_rows_are_found_with(config: &SphericalConfig) {
        let (mut w, q) = clustered(10_000, 16);
        let mut index = SphericalIndex::build(Rows::all(&w), config);
        // Move 50 rows onto the (unit) query, scaled to norms in (1.085, 1.09]: they outscore
        // every unit mean, so they become its top 50, and stay within the norm bound 1.1.
        let mut moved = move_rows_onto(&mut w, q.row(0));
        // And nudge 50 other rows slightly, so most stay in their clusters: their copies must
        // follow too.
        let nudged: Vec<ClassId> = (0..50).map(|j| j * 191 + 11).filter(|c| !moved.contains(c)).collect();
        for &c in &nudged {
            kernels::scale(1.01, w.row_mut(c as usize));
        }
        index.refresh(Rows::all(&w), &[&moved[..], &nudged[..]].concat());
        assert!(!index.needs_rebuild(), "the moved rows stay within the norm bound");
        let out = assert_exact_top(&index, &w, q.row(0), 50);
        let mut found: Vec<ClassId> = out.iter().map(|h| h.class).collect();
        found.sort_unstable();
        moved.sort_unstable();
        assert_eq!(found, moved);
        // Membership bookkeeping stays consistent, and so do the codes: they score as codes
        // made afresh from the members' rows in their order.
        let query = QuantQueries::new(q.row(1), 16);
        for (c, cluster) in index.clusters.iter().enumerate() {
            for (p, &i) in cluster.ids.iter().enumerate() {
                assert_eq!((index.assign[i as usize] as usize, index.pos[i as usize] as usize), (c, p));
                assert_eq!(&cluster.rows[p * 16..(p + 1) * 16], w.row(i as usize), "the copy of row {i}");
            }
            if let Some(codes) = &cluster.codes {
                let mut fresh = QuantRows::new(16);
                cluster.ids.iter().for_each(|&i| fresh.push(w.row(i as usize)));
                let (mut a, mut b) = (Vec::new(), Vec::new());
                quant::scores(codes, &query, &[0], &mut a);
                quant::scores(&fresh, &query, &[0], &mut b);
                assert_eq!(a, b, "codes of cluster {c}");
            }
        }
    }

    /// A refresh reassigns the rows whose cosine with their centroid fell by more than
    /// `refresh_drift` (to their nearest centroid, as a brute-force argmax finds it) and leaves
    /// the others where they are; with a negative drift it reassigns every changed row.
    #[test]
    fn refresh_reassigns_the_rows_that_drifted() {
        let (w0, q) = clustered(10_000, 16);
        for drift in [0.02f32, -1.0] {
            let mut w = w0.clone();
            let config = SphericalConfig { refresh_drift: drift, ..SphericalConfig::default() };
            let mut index = SphericalIndex::build(Rows::all(&w), &config);
            let (before, cos_before) = (index.assign.clone(), index.assigned_cos.clone());
            let moved = move_rows_onto(&mut w, q.row(0));
            // Shrinking a row by 1% changes its augmented cosine by far less than 0.02.
            let nudged: Vec<ClassId> = (0..50).map(|j| j * 191 + 11).filter(|c| !moved.contains(c)).collect();
            for &c in &nudged {
                kernels::scale(0.99, w.row_mut(c as usize));
            }
            index.refresh(Rows::all(&w), &[&moved[..], &nudged[..]].concat());
            let nearest = |i: ClassId| {
                let mut x = vec![0.0f32; 17];
                index.augmentation.augment_row(w.row(i as usize), &mut x);
                let scores: Vec<f32> =
                    (0..index.n_centroids()).map(|c| kernels::dot(&x, index.centroids.row(c))).collect();
                (0..scores.len()).max_by(|&a, &b| scores[a].total_cmp(&scores[b])).unwrap() as u32
            };
            for &i in &moved {
                assert_eq!(index.assign[i as usize], nearest(i), "moved row {i}, drift {drift}");
            }
            for &i in &nudged {
                let expected = if drift < 0.0 { nearest(i) } else { before[i as usize] };
                assert_eq!(index.assign[i as usize], expected, "nudged row {i}, drift {drift}");
            }
            // Skipped rows keep their drift reference; reassigned ones get a new one.
            let skipped = nudged.iter().filter(|&&i| index.assigned_cos[i as usize] == cos_before[i as usize]).count();
            assert_eq!(skipped, if drift < 0.0 { 0 } else { nudged.len() }, "drift {drift}");
            // Scores stay exact either way.
            let _ = assert_exact_top(&index, &w, q.row(0), 50);
        }
    }

    /// Sync updates the cluster copies without moving rows: scores are those of the new rows.
    #[test]
    fn synced_rows_are_scored_with_their_new_values_in_place() {
        for config in both_scorings() {
            synced_rows_are_scored_with(&config);
        }
    }

    fn synced_rows_are_scored_with(config: &SphericalConfig) {
        let (mut w, q) = clustered(5_000, 16);
        let mut index = SphericalIndex::build(Rows::all(&w), config);
        let before = index.assign.clone();
        for (i, x) in w.as_mut_slice().iter_mut().enumerate() {
            *x *= 1.0 + 0.1 * ((i % 7) as f32 - 3.0) / 3.0;
        }
        let all: Vec<ClassId> = (0..5_000).collect();
        index.sync(Rows::all(&w), &all);
        assert_eq!(index.assign, before, "sync does not reassign");
        assert_exact_scores(&index, &w, &q);
        let mut batch = Vec::new();
        index.search_batch(Rows::all(&w), &q, 50, &mut batch);
        for (i, hits) in batch.iter().enumerate() {
            // Batched scores come from a matrix product: equal to the dot kernel's up to
            // rounding (scores here are about 1).
            for h in hits {
                assert!((h.score - kernels::dot(w.row(h.class as usize), q.row(i))).abs() < 1e-5);
            }
        }
    }

    /// Rows moving between clusters grow the clusters they join by little more than those rows:
    /// after a tenth of the rows change places, the index holds at most an eighth more memory
    /// (storage that doubled on a cluster's first new member would hold up to twice as much).
    #[test]
    fn rows_changing_clusters_grow_the_index_by_little_more_than_they_hold() {
        let (w0, _) = clustered(10_000, 32);
        let pq4 = SphericalConfig { scoring: Scoring::Pq4, ..both_scorings()[1].clone() };
        for config in both_scorings().into_iter().chain([pq4]) {
            let mut w = w0.clone();
            let config = SphericalConfig { n_centroids: 100, refresh_drift: -1.0, ..config };
            let mut index = SphericalIndex::build(Rows::all(&w), &config);
            // A lone query makes the 4-bit codes (`pq4.rs`), a small part of the whole: they
            // are checked on their own too.
            index.search(Rows::all(&w), w.row(0), 10, &mut Vec::new());
            let pq4_bytes = |index: &SphericalIndex| -> usize {
                index.clusters.iter().filter_map(|c| c.pq4.get()).map(|p| p.rows.bytes()).sum()
            };
            let (built, built_pq4) = (index.memory_bytes(), pq4_bytes(&index));
            // Row i takes row i + 5,003's values: mostly another cluster's.
            let moved: Vec<ClassId> = (0..1_000).map(|j| j * 10).collect();
            for &i in &moved {
                let from = w0.row((i as usize + 5_003) % 10_000).to_vec();
                w.row_mut(i as usize).copy_from_slice(&from);
            }
            let before = index.assign.clone();
            index.refresh(Rows::all(&w), &moved);
            let changed = moved.iter().filter(|&&i| index.assign[i as usize] != before[i as usize]).count();
            assert!(changed > 800, "{changed} rows changed clusters");
            let grown = index.memory_bytes() as f64 / built as f64;
            assert!(grown <= 1.125, "memory grew {grown:.3}x ({:?})", config.scoring);
            if built_pq4 > 0 {
                let grown = pq4_bytes(&index) as f64 / built_pq4 as f64;
                assert!(grown <= 1.125, "4-bit codes grew {grown:.3}x");
            }
        }
    }

    #[test]
    fn a_row_outgrowing_the_norm_bound_asks_for_a_rebuild() {
        let (mut w, _) = clustered(2_000, 8);
        let mut index = SphericalIndex::build(Rows::all(&w), &SphericalConfig::default());
        kernels::scale(10.0, w.row_mut(3));
        index.refresh(Rows::all(&w), &[3]);
        assert!(index.needs_rebuild());
    }
}
