//! Search in [`SphericalIndex`]: rank the centroids by `c_j . [q, 0]` (the query's augmented
//! coordinate is 0, so only their first D coordinates count), probe the clusters of the best
//! ones until the budget of rows (`calibrate.rs`) has been scored, keep the top `k`.
//!
//! Per query ([`SphericalIndex::search_one`]) the probed clusters' copies are scored by dot
//! products and the best selected once. A batch ([`SphericalIndex::search_batched`]) shares the
//! work cluster by cluster: all centroid scores by one matrix product, then each probed
//! cluster's copy against every query probing it by one small product. With int8 scoring the
//! scans run on codes and `int8.rs` rescores the best exactly; with pq4 scoring a lone query
//! scans 4-bit codes instead (`pq4.rs`).
//!
//! [`SphericalIndex`]: super::SphericalIndex

use super::SphericalIndex;
use super::calibrate::Plan;
use super::cluster::Cluster;
use crate::pq4::{self, Codebook};
use crate::quant::{self, QuantQueries};
use crate::{ExactIndex, Hit, MipsIndex, Rows};
use farout_core::gemm::{self, Op};
use farout_core::{ClassId, Matrix, kernels, topk};
use rayon::prelude::*;
use std::cell::RefCell;

/// Clusters ordered by centroid score before counting probed rows, at least (more only if
/// needed).
const PROBE_HEAD: usize = 64;

/// Per-thread buffers of one search: centroid scores, their keys and order, the probed rows'
/// parts ([`Part`]) and the rows of them kept (merged from several parts), and the int8 path's
/// cluster scores, candidates and their places.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    keys: Vec<u64>,
    order: Vec<u32>,
    parts: Vec<Part>,
    kept: Kept,
    block: Vec<f32>,
    candidates: Vec<Hit>,
    places: Vec<Place>,
    tables: pq4::Tables,
}

/// One share of a lone query's probed clusters (all of them unless the query is split among
/// threads): its rows' scores and those of them kept.
#[derive(Default)]
struct Part {
    probed: Vec<f32>,
    kept: Kept,
}

/// The probed rows that can be among the `n` best (see [`Kept::keep`]): their positions among
/// all the probed rows (ascending) and their scores, the floor they reach, and a copy of the
/// scores to select the `n`-th best from.
#[derive(Default)]
struct Kept {
    positions: Vec<u32>,
    scores: Vec<f32>,
    floor: f32,
    cut: Vec<f32>,
}

impl Kept {
    /// Keeps the `scores` (of the probed rows from position `first`) that reach a floor at
    /// most their `n`-th best, placed by bisection until at most `2 n` reach it
    /// ([`topk::nth_best_floor_within`]: a few passes fewer than the closest floor), by a vector
    /// pass ([`kernels::keep_at_least`]). NaN scores are never kept.
    fn keep(&mut self, scores: &[f32], n: usize, first: usize) {
        self.positions.clear();
        self.scores.clear();
        self.floor = topk::nth_best_floor_within(scores, n, n);
        kernels::keep_at_least(scores, self.floor, &mut self.positions, &mut self.scores);
        if first > 0 {
            self.positions.iter_mut().for_each(|at| *at += first as u32);
        }
    }

    /// The rows the `parts` kept that reach the highest of their floors, in the parts' order.
    /// Each part's floor is at most its `n`-th best score, so at most the `n`-th best of all
    /// the parts' scores, and the rows reaching it hold the `n` best of them all.
    fn merge(&mut self, parts: &[Part]) {
        self.floor = parts.iter().map(|p| p.kept.floor).fold(f32::NEG_INFINITY, f32::max);
        self.positions.clear();
        self.scores.clear();
        for Part { kept, .. } in parts {
            for (&at, &score) in kept.positions.iter().zip(&kept.scores) {
                if score >= self.floor {
                    self.positions.push(at);
                    self.scores.push(score);
                }
            }
        }
    }
}

/// Where a row's copy is: member `at` of cluster `cluster`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Place {
    pub(super) cluster: u32,
    pub(super) at: u32,
}

/// What a lone query's probed rows are scored with: the query, its int8 codes with int8
/// scoring, and its 4-bit tables where it scans 4-bit codes (`pq4.rs`).
struct Lone<'a> {
    query: &'a [f32],
    codes: Option<&'a QuantQueries>,
    tables: Option<&'a pq4::Tables>,
}

impl Lone<'_> {
    /// Appends the scores of `cluster`'s members to `out`: on their 4-bit codes where the
    /// query has tables (and the cluster codes), else on their int8 codes where it has codes,
    /// else on the copies (`block`: scratch for the padded int8 scores).
    fn score(&self, cluster: &Cluster, block: &mut Vec<f32>, out: &mut Vec<f32>) {
        match (self.tables.and_then(|t| Some((t, cluster.pq4.get()?))), &cluster.codes, self.codes) {
            (Some((tables, p)), _, _) => {
                let at = out.len();
                pq4::scores(&p.rows, tables, kernels::dot(&p.mean, self.query), out);
                out.truncate(at + cluster.len());
            }
            (_, Some(rows), Some(codes)) => {
                quant::scores(rows, codes, &[0], block);
                out.extend_from_slice(&block[..rows.len()]);
            }
            _ => out.extend(cluster.rows.chunks_exact(self.query.len()).map(|row| kernels::dot(row, self.query))),
        }
    }
}

/// Probed rows from which a lone query's scan is shared among rayon's threads: below them
/// waking another thread costs about what it saves (docs/decisions.md, "lone-query-split").
const SPLIT_ROWS: usize = 30_000;

/// Rows rescored from which a lone query shared among threads also shares its rescoring
/// ([`SphericalIndex::rescore_shared`]).
const SHARED_RESCORING: usize = 256;

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl SphericalIndex {
    /// The top `k` of one query ([`crate::MipsIndex::search`]).
    pub(super) fn search_one(&self, w: Rows, query: &[f32], k: usize, out: &mut Vec<Hit>) -> usize {
        match self.plan(w, query, k) {
            Plan::Probe(budget) => self.search_one_with(w, query, k, budget, out),
            Plan::BruteForce => ExactIndex::new().search(w, query, k, out),
        }
    }

    /// The top `k` of one query, probing `budget` rows.
    fn search_one_with(&self, w: Rows, query: &[f32], k: usize, budget: usize, out: &mut Vec<Hit>) -> usize {
        // 4-bit codes where they pay (`pq4.rs`), made first if none are yet, with the rows
        // rescored after them fitted to the calibration and the choice between them and int8
        // codes timed on its sample: before this thread's buffers are
        // borrowed, as the thread doing either runs other searches while it waits for parts of
        // that work.
        let pq4 = self
            .pq4_pays(k, budget, self.pq4_depth(k))
            .then(|| self.pq4_book())
            .flatten()
            .and_then(|book| Some((book, self.lone_pq4_depth(w, k, book)?)));
        self.scan_one(w, query, k, budget, pq4, out)
    }

    /// The top `k` of one query, probing `budget` rows, on 4-bit codes when `pq4` gives their
    /// codebook and the rows to rescore after them, else on the index's scoring.
    pub(super) fn scan_one(
        &self,
        w: Rows,
        query: &[f32],
        k: usize,
        budget: usize,
        pq4: Option<(&Codebook, usize)>,
        out: &mut Vec<Hit>,
    ) -> usize {
        // A query to be shared among the pool's threads runs on one of them: called from a
        // thread outside the pool, each shared step would wake a pool thread and then wait to be
        // woken itself (docs/decisions.md, "lone-query-split").
        if budget >= SPLIT_ROWS && rayon::current_thread_index().is_none() && rayon::current_num_threads() > 1 {
            return rayon::scope(|_| self.scan_one(w, query, k, budget, pq4, out));
        }
        let d = w.dim();
        let (pq4, pq4_depth) = (pq4.map(|(book, _)| book), pq4.map_or(0, |(_, depth)| depth));
        // Taken from this thread's slot rather than borrowed: while parts of this query run on
        // other threads, this one may run another search's part, which then finds the slot
        // empty and fills its own.
        let mut scratch = SCRATCH.take();
        let Scratch { scores, keys, order, parts, kept, block, candidates, places, tables } = &mut scratch;
        let codes = self.config.scoring.int8_codes().then(|| QuantQueries::new(query, d));
        // The query's augmented coordinate is 0, so only the first D centroid coordinates count.
        scores.clear();
        match (&self.centroid_codes, &codes) {
            (Some(rows), Some(codes)) => {
                quant::scores(rows, codes, &[0], block);
                scores.extend_from_slice(&block[..rows.len()]);
            }
            _ => scores.extend(self.centroids_d.iter_rows().map(|c| kernels::dot(c, query))),
        }
        self.probe_order(scores, budget, self.probe_head(budget), keys, order);
        // Every probed row is scored (on the cluster copies, their int8 codes, or their 4-bit
        // codes where those pay: `pq4.rs`) and the best `n` selected once: exactly the top `k`
        // on the copies, else the `depth` best by approximate score, rescored.
        if let Some(book) = pq4 {
            tables.fill(book, query);
        }
        let lone = Lone { query, codes: codes.as_ref(), tables: pq4.map(|_| &*tables) };
        let n = match (&codes, pq4) {
            (None, _) => k,
            (Some(_), Some(_)) => pq4_depth,
            (Some(_), None) => self.depth(k),
        };
        let probed = self.scan_probed(order, &lone, n, parts, block);
        let shared = parts.len() > 1;
        let kept = match &mut parts[..] {
            [one] => &mut one.kept,
            all => {
                kept.merge(all);
                kept
            }
        };
        let scanned = probed + self.centroids.rows();
        let rescored = if codes.is_none() {
            out.clear();
            self.take_kept(kept, order, n, |_, class, score| out.push(Hit { class, score }));
            0
        } else {
            let mut select = |candidates: &mut Vec<Hit>, places: &mut Vec<Place>| {
                candidates.clear();
                places.clear();
                self.take_kept(kept, order, n, |place, class, score| {
                    candidates.push(Hit { class, score });
                    places.push(place);
                });
            };
            if shared && n >= SHARED_RESCORING {
                self.rescore_shared(select, candidates, places, query, k, out)
            } else {
                select(candidates, places);
                self.rescore(candidates, places, query, k, out)
            }
        };
        SCRATCH.set(scratch);
        scanned + rescored
    }

    /// Scores the members of the clusters `order` (one cluster after another) against the
    /// `lone` query and keeps those that can be among the `n` best ([`Kept::keep`]), in
    /// `parts`: one, or where they are at least [`SPLIT_ROWS`], one per rayon thread, each
    /// scoring and keeping its share of the clusters (of about equal rows) on its own thread.
    /// One core streams codes from memory at well under what the memory delivers to several,
    /// and each part keeps its rows at once, so the threads are busy until they are merged
    /// (docs/decisions.md, "lone-query-split"). Returns the rows scored.
    fn scan_probed(&self, order: &[u32], lone: &Lone, n: usize, parts: &mut Vec<Part>, block: &mut Vec<f32>) -> usize {
        let len = |j: &u32| self.clusters[*j as usize].len();
        let rows: usize = order.iter().map(len).sum();
        let threads = if rows >= SPLIT_ROWS { rayon::current_num_threads() } else { 1 };
        parts.resize_with(threads.max(1), Part::default);
        if let [part] = &mut parts[..] {
            self.scan_share(part, order, 0, lone, n, block);
            return rows;
        }
        // Contiguous shares of `order` (with the position of their first row), each but the
        // last ending at the first cluster that takes the rows to its share of all of them.
        let mut shares = Vec::with_capacity(parts.len());
        let (mut start, mut first, mut seen) = (0, 0, 0);
        for (i, j) in order.iter().enumerate() {
            seen += len(j);
            if shares.len() + 1 < parts.len() && seen * parts.len() >= rows * (shares.len() + 1) {
                shares.push((&order[start..=i], first));
                (start, first) = (i + 1, seen);
            }
        }
        shares.push((&order[start..], first));
        parts.truncate(shares.len());
        parts.par_iter_mut().zip(shares).for_each_init(Vec::new, |block, (part, (clusters, first))| {
            self.scan_share(part, clusters, first, lone, n, block);
        });
        rows
    }

    /// Scores the members of `clusters`, whose first row is probed row `first`, against the
    /// `lone` query into `part` and keeps those that can be among the `n` best.
    fn scan_share(&self, part: &mut Part, clusters: &[u32], first: usize, lone: &Lone, n: usize, block: &mut Vec<f32>) {
        part.probed.clear();
        for &j in clusters {
            lone.score(&self.clusters[j as usize], block, &mut part.probed);
        }
        part.kept.keep(&part.probed, n, first);
    }

    /// The `n` best rows by `probed`, the scores of the members of the clusters `order` (one
    /// cluster after another), into `out` in that order (see
    /// [`SphericalIndex::take_kept`]).
    fn best_probed(&self, probed: &[f32], order: &[u32], n: usize, kept: &mut Kept, out: &mut Vec<Hit>) {
        out.clear();
        kept.keep(probed, n, 0);
        self.take_kept(kept, order, n, |_, class, score| out.push(Hit { class, score }));
    }

    /// Calls `take(place, id, score)` for each of the `n` best rows of those `kept` (all the
    /// probed rows reaching a floor at most the `n`-th best score of all, [`Kept::keep`]), the
    /// members of the clusters `order` (one cluster after another), in that order (so in the
    /// order of the cluster copies, which [`SphericalIndex::rescore`] reads, by the places it
    /// is given): the `n`-th best of the kept scores selected (on a copy, `cut`) and the kept
    /// rows above it taken, with the first ones equal to it that make `n`. Only the taken rows'
    /// ids are looked up.
    fn take_kept(&self, kept: &mut Kept, order: &[u32], n: usize, mut take: impl FnMut(Place, ClassId, f32)) {
        let Kept { positions, scores, cut, .. } = kept;
        // How many rows equal to the `n`-th best score are taken (all when fewer than `n`
        // were kept).
        let (mut nth, mut ties) = (f32::NEG_INFINITY, usize::MAX);
        if scores.len() > n {
            if n == 0 {
                return;
            }
            cut.clear();
            cut.extend_from_slice(scores);
            nth = *cut.select_nth_unstable_by(n - 1, |a, b| b.total_cmp(a)).1;
            ties = n - cut[..n - 1].iter().filter(|&&x| x > nth).count();
        }
        // Positions ascend: walk the clusters along them.
        let (mut clusters, mut start) = (order.iter(), 0);
        let (mut ids, mut cluster): (&[ClassId], u32) = (&[], 0);
        for (&at, &score) in positions.iter().zip(scores.iter()) {
            if score < nth || (score == nth && ties == 0) {
                continue;
            }
            ties -= (score == nth) as usize;
            let mut at = at as usize - start;
            while at >= ids.len() {
                (at, start) = (at - ids.len(), start + ids.len());
                cluster = *clusters.next().expect("every probed score belongs to a probed cluster");
                ids = &self.clusters[cluster as usize].ids;
            }
            take(Place { cluster, at: at as u32 }, ids[at], score);
        }
    }

    /// The top `k` of every row of `queries` ([`crate::MipsIndex::search_batch`]): centroid
    /// scores of all queries at once (one matrix product, or one int8 kernel call on the
    /// centroids' codes); then, cluster by cluster, the members' copy (or codes) is scored
    /// against every query probing that cluster while its rows are in cache (dot products, one
    /// matrix product where many queries probe it, or the int8 kernel); with f32 scores each
    /// query's are selected as a lone query's ([`SphericalIndex::best_probed`]), with int8
    /// codes the rows reaching each query's cut are rescored
    /// ([`SphericalIndex::search_int8_batch`], [`SphericalIndex::rescore_batch`]).
    /// Returns what [`SphericalIndex::search_one`] returns for each query (up to rounding: the
    /// batch's products and kernels may differ from a lone query's in the last bits). Probes
    /// the rows a search for `probe_for` (at least `k`) results would: its budget.
    pub(super) fn search_batched(
        &self,
        w: Rows,
        queries: &Matrix,
        k: usize,
        probe_for: usize,
        out: &mut Vec<Vec<Hit>>,
    ) -> usize {
        match self.plan(w, queries.as_slice(), probe_for.max(k)) {
            Plan::Probe(budget) => self.search_batched_with(w, queries, k, budget, out),
            Plan::BruteForce => ExactIndex::new().search_batch(w, queries, k, out),
        }
    }

    /// The top `k` of every row of `queries`, probing `budget` rows for each.
    pub(super) fn search_batched_with(
        &self,
        w: Rows,
        queries: &Matrix,
        k: usize,
        budget: usize,
        out: &mut Vec<Vec<Hit>>,
    ) -> usize {
        let codes = self.config.scoring.int8_codes().then(|| QuantQueries::new(queries.as_slice(), w.dim()));
        let probes = self.probe_batch(queries, codes.as_ref(), budget);
        out.resize_with(queries.rows(), Vec::new);
        out.truncate(queries.rows());
        let scanned: usize = probes.slots.iter().flatten().map(|&(j, _)| self.clusters[j as usize].len()).sum();
        let centroids = queries.rows() * self.centroids.rows();
        if let Some(codes) = &codes {
            // Few rows rescored per probed row: keep them while scanning. Many: score all the
            // probed rows, then select.
            let rescored = if self.depth(k) * FILTER_WHILE_SCANNING <= budget {
                self.search_int8_batch(&probes, codes, queries, k, budget, out)
            } else {
                let blocks = self.score_batch(&probes, queries, Some(codes));
                self.rescore_batch(&probes, &blocks, queries, k, out)
            };
            return scanned + rescored + centroids;
        }
        let blocks = self.score_batch(&probes, queries, None);
        // Exact scores: each query's, gathered in its probing order, selected as a lone query's.
        out.par_iter_mut().zip(&probes.slots).for_each_init(
            || (Vec::new(), Vec::new(), Kept::default()),
            |(scores, order, kept), (found, slots)| {
                scores.clear();
                probed(slots, &self.clusters, &blocks).for_each(|(z, _)| scores.extend_from_slice(z));
                order.clear();
                order.extend(slots.iter().map(|&(j, _)| j));
                self.best_probed(scores, order, k, kept, found);
            },
        );
        scanned + centroids
    }

    /// Clusters to order fully before counting rows for `budget`: twice what clusters of the
    /// mean size would need, at least [`PROBE_HEAD`].
    fn probe_head(&self, budget: usize) -> usize {
        (2 * budget * self.clusters.len() / self.assign.len().max(1) + 16).max(PROBE_HEAD)
    }

    /// The clusters a query probes, best centroid score first, into `order`: as many as it
    /// takes for their members to reach `budget` rows (or all). Orders only the best `head`
    /// first, the rest only when those do not hold the budget (`keys`: scratch).
    fn probe_order(
        &self,
        centroid_scores: &[f32],
        budget: usize,
        head: usize,
        keys: &mut Vec<u64>,
        order: &mut Vec<u32>,
    ) {
        keys.clear();
        keys.extend(centroid_scores.iter().enumerate().map(|(j, &s)| topk::descending_key(s, j as u32)));
        let head = head.min(keys.len());
        if head < keys.len() {
            keys.select_nth_unstable(head);
        }
        keys[..head].sort_unstable();
        let mut rows = 0;
        let mut reached = |key: &u64| {
            rows += self.clusters[*key as u32 as usize].len();
            rows >= budget
        };
        let probed = match keys[..head].iter().position(&mut reached) {
            Some(p) => p + 1,
            None => {
                keys[head..].sort_unstable();
                keys[head..].iter().position(reached).map_or(keys.len(), |p| head + p + 1)
            }
        };
        order.clear();
        order.extend(keys[..probed].iter().map(|&key| key as u32));
    }

    /// Every query's centroid scores, `queries.rows() x stride` row-major with the `C` scores
    /// first in each row: exact by one matrix product, or approximate on the codes with int8
    /// scoring (`codes`: the queries' codes).
    pub(super) fn centroid_scores(&self, queries: &Matrix, codes: Option<&QuantQueries>) -> (Vec<f32>, usize) {
        if let (Some(rows), Some(codes)) = (&self.centroid_codes, codes) {
            let (all, mut s): (Vec<u32>, _) = ((0..queries.rows() as u32).collect(), Vec::new());
            quant::scores(rows, codes, &all, &mut s);
            return (s, rows.padded_len());
        }
        let (n, d, c) = (queries.rows(), queries.cols(), self.centroids.rows());
        let mut s = vec![0.0f32; n * c];
        gemm::gemm(
            &mut s,
            n,
            c,
            0.0,
            1.0,
            queries.as_slice(),
            (n, d),
            Op::N,
            self.centroids_d.as_slice(),
            (c, d),
            Op::T,
        );
        (s, c)
    }

    /// The clusters every query of a batch probes for `budget` rows, and who probes each
    /// cluster.
    pub(super) fn probe_batch(&self, queries: &Matrix, codes: Option<&QuantQueries>, budget: usize) -> BatchProbes {
        let c = self.centroids.rows();
        let (s, stride) = self.centroid_scores(queries, codes);
        let head = self.probe_head(budget);
        let probes: Vec<Vec<u32>> = s
            .par_chunks(stride)
            .map_init(Vec::new, |keys, row| {
                let mut probed = Vec::new();
                self.probe_order(&row[..c], budget, head, keys, &mut probed);
                probed
            })
            .collect();
        let mut queries_of = vec![Vec::new(); c];
        let slots = probes
            .iter()
            .enumerate()
            .map(|(q, probed)| {
                probed
                    .iter()
                    .map(|&j| {
                        let list: &mut Vec<u32> = &mut queries_of[j as usize];
                        list.push(q as u32);
                        (j, list.len() as u32 - 1)
                    })
                    .collect()
            })
            .collect();
        BatchProbes { slots, queries_of }
    }

    /// Scores of every probed cluster's members against the queries probing it: `nq x stride`,
    /// row-major, so that each query's scores are contiguous (`stride` = the members, padded for
    /// int8 codes). Exact on the f32 copies, approximate on the codes when `codes` is given.
    pub(super) fn score_batch(
        &self,
        probes: &BatchProbes,
        queries: &Matrix,
        codes: Option<&QuantQueries>,
    ) -> Vec<(Vec<f32>, usize)> {
        let d = queries.cols();
        probes
            .queries_of
            .par_iter()
            .zip(&self.clusters)
            .map(|(qs, cluster)| {
                if qs.is_empty() {
                    return (Vec::new(), 0);
                }
                if let (Some(rows), Some(codes)) = (&cluster.codes, codes) {
                    let mut z = Vec::new();
                    quant::scores(rows, codes, qs, &mut z);
                    return (z, rows.padded_len());
                }
                // Probed by a few queries, one dot product per query and row (on the widest
                // vector unit) while the rows are in cache: a matrix product would first copy
                // them into its panels. By many (an index not yet fitted to trained rows probes
                // most clusters for every query), one matrix product, whose copy they share
                // (docs/decisions.md, "f32-batch-dots").
                let (m, nq) = (cluster.len(), qs.len());
                let mut z = vec![0.0f32; nq * m];
                if nq >= PRODUCT_FROM_QUERIES {
                    let mut qm = Matrix::zeros(nq, d);
                    for (r, &q) in qs.iter().enumerate() {
                        qm.row_mut(r).copy_from_slice(queries.row(q as usize));
                    }
                    gemm::gemm(&mut z, nq, m, 0.0, 1.0, qm.as_slice(), (nq, d), Op::N, &cluster.rows, (m, d), Op::T);
                    return (z, m);
                }
                for (zq, &q) in z.chunks_exact_mut(m.max(1)).zip(qs) {
                    let query = queries.row(q as usize);
                    for (zr, row) in zq.iter_mut().zip(cluster.rows.chunks_exact(d)) {
                        *zr = kernels::dot_simd(row, query);
                    }
                }
                (z, m)
            })
            .collect()
    }
}

/// The batched int8 search keeps each query's best rows while it scans
/// ([`SphericalIndex::search_int8_batch`]) when it probes at least this many rows per row it
/// rescores; else it writes all the probed rows' scores out and selects from them
/// ([`SphericalIndex::rescore_batch`]). Keeping rows pays where a query probes many rows per
/// row it rescores, and costs where it probes few (see docs/decisions.md,
/// "filter-while-scanning").
const FILTER_WHILE_SCANNING: usize = 128;

/// With f32 scoring, a cluster probed by at least this many queries of a batch is scored by
/// one matrix product; by fewer, by dot products (see docs/decisions.md, "f32-batch-dots").
const PRODUCT_FROM_QUERIES: usize = 32;

/// Who probes what in a batched search.
pub(super) struct BatchProbes {
    /// Per query, its probed clusters in probing order, each as `(cluster, the query's place in
    /// that cluster's list)`.
    pub(super) slots: Vec<Vec<(u32, u32)>>,
    /// Per cluster, the queries probing it.
    pub(super) queries_of: Vec<Vec<u32>>,
}

/// The scores a query's probed clusters got in the batched search (`slots`: the query's
/// `(cluster, row of the cluster's score block)` pairs; `blocks`: every cluster's scores and
/// their row stride), each with the cluster's ids.
pub(super) fn probed<'a>(
    slots: &'a [(u32, u32)],
    clusters: &'a [Cluster],
    blocks: &'a [(Vec<f32>, usize)],
) -> impl Iterator<Item = (&'a [f32], &'a [ClassId])> + 'a {
    slots.iter().map(|&(j, slot)| {
        let members = &clusters[j as usize].ids[..];
        let (z, stride) = &blocks[j as usize];
        let at = slot as usize * stride;
        (&z[at..at + members.len()], members)
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Scoring, SphericalConfig, both_scorings};
    use super::*;
    use crate::MipsIndex;
    use crate::testutil::{assert_exact_scores, clustered};
    use farout_core::rng;

    /// The partial ordering of the centroids probes the same clusters as sorting them all, also
    /// when the budget reaches past the clusters ordered first.
    #[test]
    fn probe_order_equals_a_full_sort() {
        let (w, _) = clustered(20_000, 8);
        let config = SphericalConfig { n_centroids: 400, iterations: 2, ..SphericalConfig::default() };
        let index = SphericalIndex::build(Rows::all(&w), &config);
        let mut r = rng::seeded(3, 0);
        let (mut keys, mut order) = (Vec::new(), Vec::new());
        for budget in [1, 10, 1_000, 5_000, 15_000, 30_000] {
            // Coarse scores: many ties, broken by centroid id.
            let scores: Vec<f32> = (0..400).map(|_| (rng::normal(&mut r) * 4.0).round()).collect();
            let mut all: Vec<u32> = (0..400).collect();
            all.sort_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]).then(a.cmp(&b)));
            let mut rows = 0;
            let n = all
                .iter()
                .position(|&j| {
                    rows += index.clusters[j as usize].len();
                    rows >= budget
                })
                .map_or(all.len(), |p| p + 1);
            all.truncate(n);
            for head in [8, PROBE_HEAD, index.probe_head(budget)] {
                index.probe_order(&scores, budget, head, &mut keys, &mut order);
                assert_eq!(order, all, "budget {budget}, head {head}");
            }
        }
    }

    /// Each hit's class and the bits of its score, to compare results bit for bit.
    fn bits(hits: &[Hit]) -> Vec<(ClassId, u32)> {
        hits.iter().map(|h| (h.class, h.score.to_bits())).collect()
    }

    /// A lone query probing enough rows to be shared among threads returns what it returns on
    /// one thread, bit for bit, in every scoring (three threads: parts of uneven rows).
    #[test]
    fn lone_query_split_among_threads_equals_one_thread() {
        let (w, queries) = clustered(40_000, 32);
        let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("a thread pool");
        let (one, three) = (pool(1), pool(3));
        for scoring in [Scoring::F32, Scoring::Int8, Scoring::Pq4] {
            let config =
                SphericalConfig { scoring, n_centroids: 200, candidate_factor: Some(64.0), ..Default::default() };
            let index = SphericalIndex::build(Rows::all(&w), &config);
            for q in 0..6 {
                let (mut alone, mut shared) = (Vec::new(), Vec::new());
                let scanned = one.install(|| index.search(Rows::all(&w), queries.row(q), 500, &mut alone));
                assert!(scanned >= SPLIT_ROWS, "{scoring:?}: {scanned} rows scanned, too few to share");
                three.install(|| index.search(Rows::all(&w), queries.row(q), 500, &mut shared));
                assert_eq!(alone.len(), 500, "{scoring:?}");
                assert_eq!(bits(&alone), bits(&shared), "{scoring:?}, query {q}");
                // From this thread, outside the pools: moved into the global pool.
                index.search(Rows::all(&w), queries.row(q), 500, &mut shared);
                assert_eq!(bits(&alone), bits(&shared), "{scoring:?}, query {q}, from outside the pool");
            }
        }
    }

    /// The `n` best of the probed rows are those a full sort of their scores puts first, in the
    /// order probed: with coarse scores (ties at the cut), NaN, empty clusters among those
    /// probed, and more asked for than there are scores.
    #[test]
    fn best_probed_equals_a_full_sort() {
        let (w, _) = clustered(5_000, 8);
        let index = SphericalIndex::build(Rows::all(&w), &SphericalConfig { n_centroids: 60, ..Default::default() });
        let mut r = rng::seeded(5, 0);
        let (mut kept, mut out) = (Kept::default(), Vec::new());
        for (round, n) in [1, 7, 40, 300, 100_000].into_iter().enumerate() {
            let mut order: Vec<u32> = (0..60u32).filter(|j| !(j * 7 + round as u32).is_multiple_of(3)).collect();
            order.swap(0, 5);
            let ids: Vec<ClassId> = order.iter().flat_map(|&j| index.clusters[j as usize].ids.clone()).collect();
            let probed: Vec<f32> = (0..ids.len())
                .map(|i| if i % 97 == 3 { f32::NAN } else { (rng::normal(&mut r) * 8.0).round() })
                .collect();
            index.best_probed(&probed, &order, n, &mut kept, &mut out);
            // Each taken row's place holds it.
            let mut places = Vec::new();
            kept.keep(&probed, n, 0);
            index.take_kept(&mut kept, &order, n, |p, class, _| places.push((p, class)));
            assert_eq!(places.len(), out.len(), "n = {n}");
            for (p, class) in places {
                assert_eq!(index.clusters[p.cluster as usize].ids[p.at as usize], class, "n = {n}");
            }
            // Kept in parts (of uneven rows, one of no cluster) and merged: the same rows.
            let cuts = [0, 1, order.len() / 3, order.len() / 3, order.len()];
            let mut parts: Vec<Part> = Vec::new();
            for share in cuts.windows(2) {
                let first: usize = order[..share[0]].iter().map(|&j| index.clusters[j as usize].len()).sum();
                let rows: usize = order[share[0]..share[1]].iter().map(|&j| index.clusters[j as usize].len()).sum();
                let mut part = Part::default();
                part.kept.keep(&probed[first..first + rows], n, first);
                parts.push(part);
            }
            let (mut merged, mut from_parts) = (Kept::default(), Vec::new());
            merged.merge(&parts);
            index.take_kept(&mut merged, &order, n, |_, class, score| from_parts.push(Hit { class, score }));
            assert_eq!(bits(&from_parts), bits(&out), "n = {n}: kept in parts");
            // In the order probed.
            let at = |h: &Hit| ids.iter().position(|&c| c == h.class).expect("a probed row");
            assert!(out.windows(2).all(|p| at(&p[0]) < at(&p[1])), "n = {n}: out of the probed order");
            let mut all: Vec<Hit> = ids
                .iter()
                .zip(&probed)
                .filter(|(_, s)| !s.is_nan())
                .map(|(&class, &score)| Hit { class, score })
                .collect();
            all.sort_by(topk::by_score);
            assert_eq!(out.len(), n.min(all.len()), "n = {n}");
            let cut = all[out.len() - 1].score;
            out.sort_by(topk::by_score);
            // Above the cut the same rows; at the cut any of the tied ones.
            let above = |h: &[Hit]| h.iter().filter(|h| h.score > cut).copied().collect::<Vec<_>>();
            assert_eq!(above(&out), above(&all[..out.len()]), "n = {n}");
            for h in &out {
                assert_eq!(probed[at(h)], h.score, "n = {n}: row {} with another's score", h.class);
            }
        }
    }

    #[test]
    fn returned_scores_are_exact() {
        let (w, q) = clustered(5_000, 16);
        for config in both_scorings() {
            let index = SphericalIndex::build(Rows::all(&w), &config);
            assert_exact_scores(&index, &w, &q);
        }
    }

    #[test]
    fn batched_search_returns_the_per_query_results() {
        for config in both_scorings() {
            batched_search_returns_the_per_query_results_with(&config);
        }
        // F32 scoring probing most clusters for every query: clusters probed by many queries of
        // the batch are scored by a matrix product, the others by dot products.
        batched_search_returns_the_per_query_results_with(&SphericalConfig {
            scoring: super::super::Scoring::F32,
            candidate_factor: Some(400.0),
            ..SphericalConfig::default()
        });
        // Int8 scoring with rows rescored beyond the k returned.
        batched_search_returns_the_per_query_results_with(&SphericalConfig {
            scoring: super::super::Scoring::Int8,
            rescore: 2.0,
            candidate_factor: Some(5.0),
            ..SphericalConfig::default()
        });
    }

    /// A batch searched as for 40 results but keeping 10 scores the rows the search for 40
    /// scores (the same cost) and returns the best 10 of its results, with f32 scores on the
    /// spherical index and on the exact index (the trait's default).
    #[test]
    fn a_search_probing_for_more_keeps_the_best_of_what_it_scored() {
        let (w, q) = clustered(10_000, 16);
        let config = SphericalConfig { candidate_factor: Some(5.0), ..SphericalConfig::default() };
        let spherical = SphericalIndex::build(Rows::all(&w), &config);
        let indexes: [&dyn MipsIndex; 2] = [&spherical, &ExactIndex::new()];
        for index in indexes {
            let (mut wide, mut kept) = (Vec::new(), Vec::new());
            let cost = index.search_batch(Rows::all(&w), &q, 40, &mut wide);
            assert_eq!(index.search_batch_probing(Rows::all(&w), &q, 10, 40, &mut kept), cost, "{}", index.name());
            for (i, (wide, kept)) in wide.iter_mut().zip(&mut kept).enumerate() {
                wide.sort_unstable_by(topk::by_score);
                kept.sort_unstable_by(topk::by_score);
                assert_eq!(kept, &wide[..10], "{}, query {i}", index.name());
            }
        }
    }

    /// Also at `k` = 5, where the int8 path's per-query rows are compacted many times while
    /// the clusters are scanned (its floors rise far above the first rows' scores).
    fn batched_search_returns_the_per_query_results_with(config: &SphericalConfig) {
        let (w, q) = clustered(10_000, 16);
        let index = SphericalIndex::build(Rows::all(&w), config);
        for k in [5, 40] {
            batched_search_returns_the_per_query_results_at(&index, &w, &q, k);
        }
    }

    fn batched_search_returns_the_per_query_results_at(index: &SphericalIndex, w: &Matrix, q: &Matrix, k: usize) {
        let mut batch = Vec::new();
        let cost = index.search_batch(Rows::all(w), q, k, &mut batch);
        let mut total = 0;
        for (i, batched) in batch.iter_mut().enumerate() {
            let mut one = Vec::new();
            total += index.search(Rows::all(w), q.row(i), k, &mut one);
            one.sort_unstable_by(topk::by_score);
            batched.sort_unstable_by(topk::by_score);
            // Same candidates and selection; the batch's f32 scores come from the widest dot
            // kernel, a lone query's from the portable one (the scores every index returns), so
            // they may differ in the last bits: compare classes, and scores to a tolerance.
            assert_eq!(
                batched.iter().map(|h| h.class).collect::<Vec<_>>(),
                one.iter().map(|h| h.class).collect::<Vec<_>>(),
                "query {i}, k = {k}"
            );
            for (a, b) in batched.iter().zip(&one) {
                assert!((a.score - b.score).abs() < 1e-5);
            }
        }
        assert_eq!(cost, total);
    }
}
