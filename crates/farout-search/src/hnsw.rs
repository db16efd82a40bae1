//! HNSW (Malkov & Yashunin) over the norm-augmented rows, via the `hnsw_rs` crate.

use crate::augment::NormAugmentation;
use crate::{ExactIndex, Hit, MipsIndex, Rows};
use farout_core::{ClassId, kernels};
use hnsw_rs::prelude::{DistL2, Hnsw};
use rayon::prelude::*;

/// Parameters of [`HnswIndex`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HnswConfig {
    /// Links per node and layer (M).
    pub max_connections: usize,
    /// Candidate list size while inserting.
    pub ef_construction: usize,
    /// Candidate list size while searching (raised to the number of candidates asked for).
    pub ef_search: usize,
    /// Graph neighbours fetched and rescored exactly per result.
    pub candidate_factor: f32,
    /// Norm bound `M = (1 + norm_headroom) * max_k |w_k|` of the augmentation.
    pub norm_headroom: f32,
    /// Rebuild once stale versions exceed this fraction of the rows.
    pub stale_fraction: f32,
}

impl Default for HnswConfig {
    fn default() -> Self {
        Self {
            max_connections: 24,
            ef_construction: 200,
            ef_search: 64,
            candidate_factor: 1.5,
            norm_headroom: 0.1,
            stale_fraction: 0.5,
        }
    }
}

/// HNSW over `x = [w / M, sqrt(1 - |w|^2 / M^2)]` (`NormAugmentation`) with the Euclidean
/// distance (`DistL2`).
///
/// Inner product is not a metric, so the graph never sees raw dot products: for unit `x` and a
/// query `q = [phi / |phi|, 0]`, `|x - q|^2 = 2 - 2 x.q` and `x.q = w.phi / (M |phi|)`, so the
/// nearest augmented rows are the largest inner products. A query fetches
/// `candidate_factor * k` neighbours (search list `max(ef_search, that)`) and rescores them
/// exactly against the current `W`. A query asking for that many rows or more than there are,
/// or whose walk reaches fewer than `k` rows (duplicate rows sit out of the graph's reach),
/// scores every row instead.
///
/// `hnsw_rs` cannot move or delete points, so a refreshed row is inserted again under a fresh
/// internal id; searches filter out ids that are no longer a row's current version, and the
/// index asks for a rebuild when stale versions pass `stale_fraction` of the rows or a row
/// outgrows `M`.
pub struct HnswIndex {
    config: HnswConfig,
    graph: Hnsw<'static, f32, DistL2>,
    augmentation: NormAugmentation,
    dim: usize,
    /// Row of every internal id (version).
    row_of: Vec<ClassId>,
    /// Current internal id of every row.
    current: Vec<u32>,
    stale: usize,
    rebuild: bool,
}

impl HnswIndex {
    /// Builds the graph over the rows of `w` (parallel insertion).
    pub fn build(w: Rows, config: &HnswConfig) -> Self {
        let (k, d) = (w.len(), w.dim());
        let augmentation = NormAugmentation::fit(w, config.norm_headroom);
        let layers = 16.min(((k.max(2)) as f64).ln().ceil() as usize).max(1);
        let graph = Hnsw::new(config.max_connections.clamp(2, 256), k, layers, config.ef_construction.max(1), DistL2);
        let augmented: Vec<Vec<f32>> = (0..k).into_par_iter().map(|i| augment(&augmentation, w.row(i))).collect();
        let items: Vec<(&[f32], usize)> = augmented.iter().enumerate().map(|(i, x)| (x.as_slice(), i)).collect();
        graph.parallel_insert_slice(&items);
        Self {
            config: config.clone(),
            graph,
            augmentation,
            dim: d,
            row_of: (0..k as ClassId).collect(),
            current: (0..k as u32).collect(),
            stale: 0,
            rebuild: false,
        }
    }

    /// Stale versions still in the graph.
    pub fn stale(&self) -> usize {
        self.stale
    }
}

/// The augmentation of `row`, as the graph stores it.
fn augment(augmentation: &NormAugmentation, row: &[f32]) -> Vec<f32> {
    let mut x = vec![0.0; row.len() + 1];
    augmentation.augment_row(row, &mut x);
    x
}

impl MipsIndex for HnswIndex {
    fn name(&self) -> &'static str {
        "hnsw"
    }

    fn save_state(&self, _out: &mut crate::persist::Enc) -> Result<(), crate::persist::Unsupported> {
        Err(crate::persist::Unsupported {
            kind: "hnsw",
            why: "hnsw_rs 0.3 reloads a graph only as a value borrowing its loader, which the index \
                  cannot keep; build it again from the vectors, or save an \"auto\" or \"spherical\" index",
        })
    }

    fn search(&self, w: Rows, query: &[f32], k: usize, out: &mut Vec<Hit>) -> usize {
        out.clear();
        let rows = self.current.len();
        let fetch = ((k as f32 * self.config.candidate_factor).ceil() as usize).max(k).min(rows);
        if fetch == rows {
            // Every row is asked for: scoring them all is exact, and cheaper than a walk that
            // visits them all.
            return ExactIndex.search(w, query, k, out);
        }
        let norm = kernels::norm(query);
        let mut q: Vec<f32> = query.iter().map(|v| v / norm.max(f32::MIN_POSITIVE)).collect();
        q.push(0.0);
        let ef = self.config.ef_search.max(fetch);
        let live = |id: &usize| self.current[self.row_of[*id] as usize] as usize == *id;
        let found = if self.stale == 0 {
            self.graph.search(&q, fetch, ef)
        } else {
            self.graph.search_filter(&q, fetch, ef, Some(&live))
        };
        out.extend(found.iter().map(|n| {
            let row = self.row_of[n.d_id];
            Hit { class: row, score: kernels::dot(w.row(row as usize), query) }
        }));
        let scored = out.len();
        // The graph walk's distance evaluations are not reported by hnsw_rs; ef x M is the
        // usual estimate of its cost.
        let walk = scored + ef * self.config.max_connections;
        if scored < k {
            // The walk reached fewer live rows than asked for. hnsw_rs links few of many points
            // at the same place (duplicate rows; all rows, when W starts at zero), so such rows
            // are out of its reach: 300 equal rows gave 97 of 299 asked for. Score every row.
            return walk + ExactIndex.search(w, query, k, out);
        }
        let by_score = |a: &Hit, b: &Hit| b.score.total_cmp(&a.score).then(a.class.cmp(&b.class));
        out.sort_unstable_by(by_score);
        out.truncate(k);
        walk
    }

    fn refresh(&mut self, w: Rows, rows: &[ClassId]) {
        debug_assert_eq!(w.dim(), self.dim);
        self.rebuild |= rows.iter().any(|&i| self.augmentation.outgrown(w.row(i as usize)));
        let augmented: Vec<Vec<f32>> =
            rows.par_iter().map(|&i| augment(&self.augmentation, w.row(i as usize))).collect();
        let mut items = Vec::with_capacity(rows.len());
        for (&i, x) in rows.iter().zip(&augmented) {
            let id = self.row_of.len();
            self.row_of.push(i);
            self.current[i as usize] = id as u32;
            self.stale += 1;
            items.push((x.as_slice(), id));
        }
        self.graph.parallel_insert_slice(&items);
        self.rebuild |= self.stale as f32 > self.config.stale_fraction * self.current.len() as f32;
    }

    fn needs_rebuild(&self) -> bool {
        self.rebuild
    }

    fn memory_bytes(&self) -> usize {
        // Augmented vectors plus about 2 M links per point on layer 0 (hnsw_rs does not report).
        let points = self.row_of.len();
        points * ((self.dim + 1) * 4 + 2 * self.config.max_connections * 8) + 4 * (points + self.current.len())
    }
}

impl crate::IndexParams for HnswConfig {
    fn check(&self) -> Result<(), farout_core::ParamError> {
        crate::count_in("max_connections", self.max_connections, 2..=256, "must be in 2..=256 (hnsw_rs's range)")?;
        crate::count_in("ef_construction", self.ef_construction, 1..=usize::MAX, "must be > 0")?;
        crate::finite_at_least("candidate_factor", self.candidate_factor, 1.0)?;
        crate::finite_at_least("norm_headroom", self.norm_headroom, 0.0)?;
        if !(self.stale_fraction > 0.0 && self.stale_fraction.is_finite()) {
            let value = self.stale_fraction.to_string();
            return Err(farout_core::ParamError::new("stale_fraction", value, "must be a finite number > 0"));
        }
        Ok(())
    }

    fn build(&self, w: Rows) -> Box<dyn MipsIndex> {
        Box::new(HnswIndex::build(w, self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recall;
    use crate::testutil::{assert_exact_scores, assert_exact_top, clustered, move_rows_onto};

    #[test]
    fn recall_of_top_100_on_clustered_rows_is_at_least_0_9() {
        // The spherical index's test task: 20,000 rows in 400 clusters, 32-d, top 100.
        let (w, q) = clustered(20_000, 32);
        let index = HnswIndex::build(Rows::all(&w), &HnswConfig::default());
        let r = recall(&index, Rows::all(&w), &q, 100);
        assert!(r >= 0.9, "recall {r}");
    }

    /// The graph reached 97 of 300 equal rows: every row is scored when the walk finds fewer
    /// than asked for.
    #[test]
    fn equal_rows_are_all_found() {
        let (w, q) = clustered(1_000, 16);
        let equal = farout_core::Matrix::from_vec(300, 16, w.row(0).repeat(300)).unwrap();
        let index = HnswIndex::build(Rows::all(&equal), &HnswConfig::default());
        let mut out = Vec::new();
        for k in [10, 100, 299, 300, 600] {
            index.search(Rows::all(&equal), q.row(0), k, &mut out);
            assert_eq!(out.len(), k.min(300), "k = {k}");
        }
    }

    #[test]
    fn returned_scores_are_exact() {
        let (w, q) = clustered(5_000, 16);
        let index = HnswIndex::build(Rows::all(&w), &HnswConfig::default());
        assert_exact_scores(&index, &w, &q);
    }

    #[test]
    fn refreshed_rows_are_found_and_stale_versions_are_not() {
        let (mut w, q) = clustered(10_000, 16);
        let mut index = HnswIndex::build(Rows::all(&w), &HnswConfig::default());
        // 50 rows moved onto the query (norms just under the bound 1.1) become its top 50.
        let moved = move_rows_onto(&mut w, q.row(0));
        index.refresh(Rows::all(&w), &moved);
        assert_eq!(index.stale(), 50);
        assert!(!index.needs_rebuild());
        assert_exact_top(&index, &w, q.row(0), 50);
        // No row appears twice (its stale version is filtered out) in a larger result.
        let mut out = Vec::new();
        index.search(Rows::all(&w), q.row(0), 500, &mut out);
        let mut classes: Vec<ClassId> = out.iter().map(|h| h.class).collect();
        classes.sort_unstable();
        classes.dedup();
        assert_eq!(classes.len(), out.len());
        // Past the stale threshold (half the rows) or the norm bound, a rebuild is asked for.
        kernels::scale(10.0, w.row_mut(3));
        index.refresh(Rows::all(&w), &[3]);
        assert!(index.needs_rebuild());
    }
}
