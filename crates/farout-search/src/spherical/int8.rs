//! Int8 scoring in [`SphericalIndex`] (`scoring = "int8"`): the probed clusters are scanned on
//! int8 codes of their rows ([`crate::quant`]), which rank them almost as exact scores do; this
//! file rescores the best `rescore * k` of them (at least [`quant::RESCORE_MARGIN`] more than `k`)
//! exactly from the f32 copies and keeps the top `k`, for one query
//! ([`SphericalIndex::rescore`]) or a batch ([`SphericalIndex::search_int8_batch`]).
//!
//! [`SphericalIndex`]: super::SphericalIndex

use super::SphericalIndex;
use super::cluster::Cluster;
use super::search::{BatchProbes, Place, probed};
use crate::Hit;
use crate::quant::{self, Above, QuantQueries};
use farout_core::topk::{self, NthBest};
use farout_core::{Matrix, kernels};
use rayon::prelude::*;
use std::sync::OnceLock;
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};

/// Rows whose copies are requested ahead of the one being rescored: the gathered rows are
/// scattered over the clusters, so loading them a few at a time overlaps the memory latency.
const AHEAD: usize = 8;

/// Rows a thread claims at a time in [`SphericalIndex::rescore_shared`].
const RUN: usize = 64;

/// The rows of a lone query's rescoring shared between two threads
/// ([`SphericalIndex::rescore_shared`]): their places and exact scores (the bits of each `f32`)
/// once posted, the first row not yet claimed, and whether the posting thread is done posting
/// (or failed to post).
#[derive(Default)]
struct Board {
    rows: OnceLock<(Vec<Place>, Vec<AtomicU32>)>,
    next: AtomicUsize,
    closed: AtomicBool,
}

impl Board {
    /// Scores runs of the posted `rows` until none is left unclaimed.
    fn work(&self, index: &SphericalIndex, (places, exact): &(Vec<Place>, Vec<AtomicU32>), query: &[f32]) {
        loop {
            let start = self.next.fetch_add(RUN, Relaxed);
            if start >= places.len() {
                return;
            }
            let run = start..(start + RUN).min(places.len());
            index.score_copies(&places[run.clone()], query, |t, s| exact[run.start + t].store(s.to_bits(), Relaxed));
        }
    }

    /// Waits until rows are posted, then [`Board::work`]s on them; returns at once if the board
    /// closes without rows.
    fn wait_and_work(&self, index: &SphericalIndex, query: &[f32]) {
        loop {
            if let Some(rows) = self.rows.get() {
                return self.work(index, rows, query);
            }
            if self.closed.load(Acquire) {
                return;
            }
            std::hint::spin_loop();
        }
    }
}

/// Closes a [`Board`] when dropped: after its rows are posted, or on a panic before, so that
/// the waiting thread never waits for rows that will not come.
struct Closing<'a>(&'a Board);

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        self.0.closed.store(true, Release);
    }
}

impl SphericalIndex {
    /// Rows rescored exactly per query for `k` results (int8 scoring).
    pub(super) fn depth(&self, k: usize) -> usize {
        quant::rescore_depth(k, self.config.rescore)
    }

    /// The per-query end of int8 (and pq4) scoring: `candidates` (the best probed rows by
    /// approximate score, in the order of the copies: rows of one cluster together, in their
    /// order in it, as [`SphericalIndex::take_kept`] gives them, with their `places` in
    /// the clusters) rescored exactly from the copies (requesting them [`AHEAD`] rows ahead into
    /// the second-level cache, as the batched gather does: docs/decisions.md,
    /// "int8-rescoring-prefetch-l2"), their `k` best into `out`. Returns the number of rows
    /// rescored. Rows of one cluster are loaded together, from memory the preceding rows
    /// opened (about a tenth faster on the K = 200,000 benchmark than in order of score). The
    /// copies are found by their places, not by the rows' ids: looking an id's cluster and
    /// position up reads two arrays of K entries at random, which made this loop 1.7x slower
    /// (docs/decisions.md, "rescore-by-place").
    pub(super) fn rescore(
        &self,
        candidates: &mut Vec<Hit>,
        places: &[Place],
        query: &[f32],
        k: usize,
        out: &mut Vec<Hit>,
    ) -> usize {
        debug_assert_eq!(candidates.len(), places.len());
        self.score_copies(places, query, |t, score| candidates[t].score = score);
        let rescored = candidates.len();
        quant::keep_best(candidates, k, out);
        rescored
    }

    /// Calls `score(t, s)` with the exact score `s` of the copy at each `places[t]` against
    /// `query`, in order (requesting the copies [`AHEAD`] rows ahead into the second-level
    /// cache).
    fn score_copies(&self, places: &[Place], query: &[f32], mut score: impl FnMut(usize, f32)) {
        let d = query.len();
        let copy = |p: &Place| self.clusters[p.cluster as usize].row(p.at as usize, d);
        for p in places.iter().take(AHEAD) {
            kernels::prefetch_l2(copy(p));
        }
        for (t, p) in places.iter().enumerate() {
            if let Some(next) = places.get(t + AHEAD) {
                kernels::prefetch_l2(copy(next));
            }
            score(t, kernels::dot(copy(p), query));
        }
    }

    /// [`SphericalIndex::rescore`] shared with another thread of rayon's pool: `select` (run
    /// on this thread) fills `candidates` and `places`, which are then rescored in runs of
    /// [`RUN`] rows by this thread and, if it took up the waiting task meanwhile, another.
    /// The other thread waits while `select` runs, so that it is awake when the rows come: a
    /// thread that has gone to sleep takes longer to wake than the rescoring of a lone query's
    /// rows lasts (docs/decisions.md, "lone-query-split"). Returns the number of rows rescored.
    pub(super) fn rescore_shared(
        &self,
        select: impl FnOnce(&mut Vec<Hit>, &mut Vec<Place>) + Send,
        candidates: &mut Vec<Hit>,
        places: &mut Vec<Place>,
        query: &[f32],
        k: usize,
        out: &mut Vec<Hit>,
    ) -> usize {
        let board = Board::default();
        rayon::join(
            || {
                let _closed = Closing(&board);
                select(candidates, places);
                let exact = (0..places.len()).map(|_| AtomicU32::new(0)).collect();
                let rows = board.rows.get_or_init(|| (std::mem::take(places), exact));
                board.work(self, rows, query);
            },
            || board.wait_and_work(self, query),
        );
        let (posted, exact) = board.rows.into_inner().expect("the rows are posted before the board closes");
        *places = posted;
        for (h, s) in candidates.iter_mut().zip(exact) {
            h.score = f32::from_bits(s.into_inner());
        }
        let rescored = candidates.len();
        quant::keep_best(candidates, k, out);
        rescored
    }

    /// The int8 path of the batched search after the probes are chosen: every probed cluster's
    /// codes are scored against the queries probing it, and each query keeps only the rows that
    /// can still reach its cut (the `depth`-th best approximate score of all its probed rows)
    /// while the cluster's scores are in cache; then, cluster by cluster, the rows reaching the
    /// cut of a query probing the cluster are rescored exactly from its copy (each copy read once,
    /// while in cache, for all its queries, instead of gathering rows query by query), and each
    /// query's `k` best go to `out`. Returns the number of rows rescored (those reaching the
    /// cuts, as [`SphericalIndex::rescore`] does per query).
    ///
    /// Which rows can reach the cut: every query has a floor, a score no higher than its cut,
    /// shared by the threads scanning different clusters. It starts just below the `depth`-th
    /// best score of the query's first probed clusters, scored alone (about [`SEED`] `x depth`
    /// rows, at most 1 / [`SEED_SHARE`] of the `budget` it probes): the `depth`-th best of a
    /// subset of the probed rows is at most the cut, the `depth`-th best of all of them. Rows
    /// below the floor are dropped as they are scored. When a thread holds [`COMPACT_AT`]
    /// `x depth` rows of a query, the `depth`-th best of them is again a lower bound of the cut,
    /// so it raises the floor and drops the rows below it. Floors need not be exact, only at or
    /// below the cut: they are placed by bisection ([`topk::nth_best_floor`]), within a
    /// 4,096th of the scores' range below the `depth`-th best, which costs less than selecting
    /// it. (The cut itself is selected exactly.) The scan thus writes a few times
    /// `depth` rows per query instead of all the probed rows' scores, which
    /// [`SphericalIndex::rescore_batch`] reads twice (once for the cut, once for the rows
    /// reaching it): at K = 672,000 with 108,000 rows probed per query, 110 MB less memory per
    /// batch of 256 queries.
    pub(super) fn search_int8_batch(
        &self,
        probes: &BatchProbes,
        codes: &QuantQueries,
        queries: &Matrix,
        k: usize,
        budget: usize,
        out: &mut [Vec<Hit>],
    ) -> usize {
        let (nq, depth) = (queries.rows(), self.depth(k));
        let seed = (SEED * depth).min(budget / SEED_SHARE);
        // Each query's floor starts just below the `depth`-th best score of its first probed clusters
        // (best centroid score first: the clusters holding most of its best rows), scored
        // alone before the scan: `seed` rows or a few more (scanning those clusters batched
        // first, with no floor, costs more: docs/decisions.md, "int8-floor-seeding").
        let floors: Vec<AtomicU32> = probes
            .slots
            .par_iter()
            .enumerate()
            .map_init(
                || (Vec::new(), Vec::new()),
                |(scores, seen), (q, slots)| {
                    seen.clear();
                    for &(j, _) in slots {
                        let cluster = &self.clusters[j as usize];
                        let rows = cluster.codes.as_ref().expect("int8 scoring keeps the clusters' codes");
                        quant::scores(rows, codes, &[q as u32], scores);
                        seen.extend_from_slice(&scores[..cluster.len()]);
                        if seen.len() >= seed {
                            break;
                        }
                    }
                    let floor = topk::nth_best_floor(seen, depth);
                    AtomicU32::new(ordered(floor))
                },
            )
            .collect();
        // The buffers of the last batch this thread searched, with their capacity (taken: a
        // nested search on this thread gets fresh ones).
        let Buffers { mut scans, mut reaching, mut spans } = BUFFERS.take();
        // Contiguous runs of clusters of about equal work (rows x queries probing them), a few
        // per thread so that the threads stay busy.
        let n = self.clusters.len();
        let runs = (RUNS_PER_THREAD * rayon::current_num_threads()).clamp(1, n.max(1));
        let bounds =
            balanced_runs(self.clusters.iter().zip(&probes.queries_of).map(|(c, qs)| c.len() * qs.len()), runs);
        scans.resize_with(runs, Scan::default);
        scans.par_iter_mut().zip(bounds.par_windows(2)).for_each(|(scan, run)| {
            scan.start(nq);
            for j in run[0]..run[1] {
                scan.cluster(j, &self.clusters[j], &probes.queries_of[j], codes, &floors, depth);
            }
        });
        // Per query, the rows reaching its cut, ordered by (cluster, member); and where those
        // of each cluster it probes lie among them, at `spans[first[j] + s]` for the `s`-th
        // query probing cluster `j`. Each query places its own spans while its rows are in
        // cache: searched for from the clusters' side, every pair's search would wait on
        // memory.
        let first = span_starts(&probes.queries_of);
        spans.resize_with(first[n], || AtomicU64::new(0));
        spans.truncate(first[n]);
        reaching.resize_with(nq, Vec::new);
        reaching.truncate(nq);
        reaching.par_iter_mut().enumerate().for_each_init(
            || (Vec::new(), NthBest::default()),
            |(parts, nth), (q, rows)| {
                parts.clear();
                parts.extend(scans.iter().map(|s| &s.kept[q].scores[..]));
                let cut = nth.of(parts, depth);
                rows.clear();
                for kept in scans.iter().map(|s| &s.kept[q]) {
                    let at = kept.scores.iter().zip(&kept.at).filter(|(score, _)| **score >= cut);
                    rows.extend(at.map(|(_, &at)| at));
                }
                rows.sort_unstable();
                for &(j, slot) in &probes.slots[q] {
                    let from = rows.partition_point(|&(c, _)| c < j);
                    let to = from + rows[from..].partition_point(|&(c, _)| c == j);
                    spans[first[j as usize] + slot as usize].store(span(from, to), Relaxed);
                }
            },
        );
        let rescored = self.rescore_by_cluster(probes, queries, k, out, |j, s, q, positions, _| {
            let (from, to) = unspan(spans[first[j] + s].load(Relaxed));
            positions.extend(reaching[q as usize][from..to].iter().map(|&(_, i)| i));
        });
        BUFFERS.set(Buffers { scans, reaching, spans });
        rescored
    }

    /// The int8 path's end of the batched search from every probed row's approximate score
    /// (`blocks`, as [`SphericalIndex::score_batch`] writes them): every query's cut, the
    /// `depth`-th best approximate score of its probed rows, then the rows reaching it rescored
    /// ([`SphericalIndex::rescore_by_cluster`]). Returns the number of rows rescored.
    pub(super) fn rescore_batch(
        &self,
        probes: &BatchProbes,
        blocks: &[(Vec<f32>, usize)],
        queries: &Matrix,
        k: usize,
        out: &mut [Vec<Hit>],
    ) -> usize {
        let depth = self.depth(k);
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
        // The `s`-th query probing cluster `j` has its scores at `s * stride` of `blocks[j]`.
        self.rescore_by_cluster(probes, queries, k, out, |j, s, q, positions, kept| {
            let (z, stride) = &blocks[j];
            let at = s * stride;
            kept.clear();
            kernels::keep_at_least(&z[at..at + self.clusters[j].len()], cuts[q as usize], positions, kept);
        })
    }

    /// Cluster by cluster, for every query `q` probing cluster `j` (its `s`-th), the members
    /// `rows_of(j, s, q, positions, scratch)` appends (ascending) are rescored exactly from the
    /// copy (each copy read once, while it is in cache, for all its queries, instead of
    /// gathering rows query by query); then each query's `k` best of its rescored rows go to
    /// `out`. Returns the number of rows rescored.
    fn rescore_by_cluster(
        &self,
        probes: &BatchProbes,
        queries: &Matrix,
        k: usize,
        out: &mut [Vec<Hit>],
        rows_of: impl Fn(usize, usize, u32, &mut Vec<u32>, &mut Vec<f32>) + Sync,
    ) -> usize {
        let d = queries.cols();
        // For the `s`-th query probing cluster `j`: `hits[starts[s]..starts[s + 1]]` of
        // `rescored[j]`.
        let rescored: Vec<(Vec<Hit>, Vec<u32>)> = probes
            .queries_of
            .par_iter()
            .zip(&self.clusters)
            .enumerate()
            .map_init(
                || (Vec::new(), Vec::new()),
                |(positions, scratch), (j, (qs, cluster))| {
                    // The rows of the `s`-th query: `positions[starts[s]..starts[s + 1]]`.
                    let mut starts = Vec::with_capacity(qs.len() + 1);
                    positions.clear();
                    for (s, &q) in qs.iter().enumerate() {
                        starts.push(positions.len() as u32);
                        rows_of(j, s, q, positions, scratch);
                    }
                    starts.push(positions.len() as u32);
                    // With many results per query most rows are needed by some query: load them
                    // all in one stream. With few, load only the rows needed, a few ahead.
                    let stream = positions.len() >= cluster.len() / 2;
                    if stream {
                        kernels::prefetch(&cluster.rows);
                    }
                    // Requests run ahead over all the queries' rows: a query reaches only a few
                    // rows of each cluster it probes (docs/decisions.md, "int8-rescoring-gather").
                    // They ask for the second-level cache: first-level requests for eight rows
                    // ahead would wait for the core's few line-fill buffers
                    // (docs/decisions.md, "int8-rescoring-prefetch-l2").
                    let ask = |t: usize| {
                        if !stream && let Some(&i) = positions.get(t) {
                            kernels::prefetch_l2(cluster.row(i as usize, d));
                        }
                    };
                    (0..AHEAD).for_each(ask);
                    let mut hits = Vec::with_capacity(positions.len());
                    for (s, &q) in qs.iter().enumerate() {
                        let query = queries.row(q as usize);
                        let (from, to) = (starts[s] as usize, starts[s + 1] as usize);
                        for (t, &i) in positions[from..to].iter().enumerate() {
                            ask(from + t + AHEAD);
                            let i = i as usize;
                            let score = kernels::dot_simd(cluster.row(i, d), query);
                            hits.push(Hit { class: cluster.ids[i], score });
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
                quant::keep_best(candidates, k, found);
                n
            })
            .sum()
    }
}

/// Runs of clusters per thread in the scan of [`SphericalIndex::search_int8_batch`].
const RUNS_PER_THREAD: usize = 4;

/// The bounds `b` of `runs` contiguous runs `b[r]..b[r + 1]` of the items whose `work` is given,
/// cut where the running sum of the work passes each `r / runs` of its total.
fn balanced_runs(work: impl ExactSizeIterator<Item = usize>, runs: usize) -> Vec<usize> {
    let work: Vec<usize> = work.collect();
    let total: usize = work.iter().sum();
    let mut bounds = vec![0];
    let mut sum = 0;
    for (j, &w) in work.iter().enumerate() {
        sum += w;
        // Item j ends run r when the sum through it first reaches (r + 1) / runs of the total.
        while bounds.len() < runs && sum * runs >= bounds.len() * total.max(1) {
            bounds.push(j + 1);
        }
    }
    bounds.resize(runs, work.len());
    bounds.push(work.len());
    bounds
}

/// A query's floor is first placed among at least this many times `depth` rows of its best
/// clusters ([`SphericalIndex::search_int8_batch`]), or ...
const SEED: usize = 2;

/// ... at most this share of the rows it probes (with many results per query, scoring rows
/// one query at a time would cost more than the scan saves).
const SEED_SHARE: usize = 16;

/// A thread's rows of each query ([`SphericalIndex::search_int8_batch`]) are compacted when
/// they reach this many times the rows rescored per query.
const COMPACT_AT: usize = 2;

/// The buffers of [`SphericalIndex::search_int8_batch`], kept between batches by the thread
/// that searches. Allocated for every batch, their vectors (two per query and run of clusters,
/// one per query) would grow from nothing each time (see docs/decisions.md,
/// "int8-scan-buffers").
#[derive(Default)]
struct Buffers {
    scans: Vec<Scan>,
    reaching: Vec<Vec<(u32, u32)>>,
    spans: Vec<AtomicU64>,
}

thread_local! {
    static BUFFERS: std::cell::RefCell<Buffers> = std::cell::RefCell::new(Buffers::default());
}

/// One thread's share of [`SphericalIndex::search_int8_batch`]: per query, the rows it scanned
/// that reached the query's floor, and the buffers of the scan.
#[derive(Default)]
struct Scan {
    kept: Vec<Kept>,
    /// Per query of the cluster being scanned: its floor, and the rows reaching it.
    floors: Vec<f32>,
    above: Vec<Above>,
    scores: Vec<f32>,
}

/// Rows of one query: approximate scores and `(cluster, member)` of each.
#[derive(Default)]
struct Kept {
    scores: Vec<f32>,
    at: Vec<(u32, u32)>,
}

impl Scan {
    /// Empties the rows kept, for a batch of `queries` queries.
    fn start(&mut self, queries: usize) {
        self.kept.resize_with(queries, Kept::default);
        self.kept.truncate(queries);
        for kept in &mut self.kept {
            kept.scores.clear();
            kept.at.clear();
        }
    }

    /// Scores cluster `j`'s codes against the queries `qs` probing it and keeps, per query,
    /// the rows at or above its floor; compacts a query's rows when they reach
    /// [`COMPACT_AT`] `x depth`, raising its floor.
    fn cluster(
        &mut self,
        j: usize,
        cluster: &Cluster,
        qs: &[u32],
        codes: &QuantQueries,
        floors: &[AtomicU32],
        depth: usize,
    ) {
        if qs.is_empty() {
            return;
        }
        let rows = cluster.codes.as_ref().expect("int8 scoring keeps the clusters' codes");
        self.floors.clear();
        self.floors.extend(qs.iter().map(|&q| unordered(floors[q as usize].load(Relaxed))));
        if self.above.len() < qs.len() {
            self.above.resize_with(qs.len(), Above::default);
        }
        self.above[..qs.len()].iter_mut().for_each(Above::clear);
        quant::scores_at_least(rows, codes, qs, &self.floors, &mut self.above[..qs.len()], &mut self.scores);
        for (above, &q) in self.above.iter().zip(qs) {
            let (kept, floor) = (&mut self.kept[q as usize], &floors[q as usize]);
            kept.scores.extend_from_slice(&above.scores);
            kept.at.extend(above.positions.iter().map(|&i| (j as u32, i)));
            if kept.scores.len() >= COMPACT_AT * depth.max(1) {
                let bound = topk::nth_best_floor(&kept.scores, depth);
                let raised = unordered(floor.fetch_max(ordered(bound), Relaxed).max(ordered(bound)));
                quant::retain_at_least(&mut kept.scores, &mut kept.at, raised);
            }
        }
    }
}

/// Where each cluster's queries start in a flat list of (cluster, query probing it) pairs:
/// `first[j]..first[j + 1]` for cluster `j`, and `first[clusters]` pairs in all.
fn span_starts(queries_of: &[Vec<u32>]) -> Vec<usize> {
    let mut first = Vec::with_capacity(queries_of.len() + 1);
    first.push(0);
    for qs in queries_of {
        first.push(first.last().unwrap() + qs.len());
    }
    first
}

/// The range `from..to` as one word (for a span written by one thread and read by another).
fn span(from: usize, to: usize) -> u64 {
    (from as u64) << 32 | to as u64
}

/// The inverse of [`span`].
fn unspan(word: u64) -> (usize, usize) {
    ((word >> 32) as usize, word as u32 as usize)
}

/// An integer whose order is `x`'s order (for a floor shared through an atomic maximum; NaN
/// does not occur: the scores are finite).
fn ordered(x: f32) -> u32 {
    let bits = x.to_bits();
    if bits >> 31 == 1 { !bits } else { bits | 1 << 31 }
}

/// The inverse of [`ordered`].
fn unordered(key: u32) -> f32 {
    f32::from_bits(if key >> 31 == 1 { key & !(1 << 31) } else { !key })
}

#[cfg(test)]
mod tests {
    use super::super::both_scorings;
    use crate::testutil::clustered;
    use crate::{MipsIndex, Rows, SphericalIndex};
    use farout_core::ClassId;

    /// The two ends of the batched int8 search, keeping rows while scanning and selecting
    /// from all the probed rows' scores, rescore the same rows and return the same results, at
    /// budgets where the floors rise far above the first rows' scores (`k` = 5) and where
    /// most probed rows are kept.
    #[test]
    fn filtering_while_scanning_equals_selecting_after() {
        use super::super::Scoring;
        use crate::quant::QuantQueries;
        use farout_core::topk;
        let (w, q) = clustered(20_000, 32);
        let config = super::super::SphericalConfig { scoring: Scoring::Int8, ..Default::default() };
        let index = SphericalIndex::build(Rows::all(&w), &config);
        let codes = QuantQueries::new(q.as_slice(), w.cols());
        for (k, budget) in [(5, 200), (5, 4_000), (40, 1_000), (40, 8_000), (300, 2_000)] {
            let probes = index.probe_batch(&q, Some(&codes), budget);
            let (mut a, mut b) = (vec![Vec::new(); q.rows()], vec![Vec::new(); q.rows()]);
            let filtered = index.search_int8_batch(&probes, &codes, &q, k, budget, &mut a);
            let blocks = index.score_batch(&probes, &q, Some(&codes));
            let selected = index.rescore_batch(&probes, &blocks, &q, k, &mut b);
            assert_eq!(filtered, selected, "rows rescored, k = {k}, budget {budget}");
            for (i, (x, y)) in a.iter_mut().zip(&mut b).enumerate() {
                x.sort_unstable_by(topk::by_score);
                y.sort_unstable_by(topk::by_score);
                assert_eq!(x, y, "query {i}, k = {k}, budget {budget}");
            }
        }
    }

    /// The scan's runs cover every cluster once, in order, and split the work about evenly.
    #[test]
    fn balanced_runs_cover_the_clusters_with_even_work() {
        let work: Vec<usize> = (0..100).map(|j| (j * 37) % 11 * 100 + 1).collect();
        let total: usize = work.iter().sum();
        for runs in [1, 3, 8] {
            let b = super::balanced_runs(work.iter().copied(), runs);
            assert_eq!((b.len(), b[0], b[runs]), (runs + 1, 0, work.len()), "runs = {runs}");
            assert!(b.windows(2).all(|r| r[0] <= r[1]), "ordered: {b:?}");
            let largest = work.iter().max().unwrap();
            for r in b.windows(2) {
                let sum: usize = work[r[0]..r[1]].iter().sum();
                assert!(sum <= total / runs + largest, "run {r:?} holds {sum} of {total}, runs = {runs}");
            }
        }
        assert_eq!(super::balanced_runs([0, 0, 0].into_iter(), 2), vec![0, 3, 3]);
        assert_eq!(super::balanced_runs(std::iter::empty(), 2), vec![0, 0, 0]);
    }

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
