//! Spherical clustering for MIPS (Auvolat et al. 2015; the index of the LDGS experiments).
//!
//! **Reduction to cosine search** (`NormAugmentation`). With `M >= max_k |w_k|`, append one
//! coordinate to every row scaled by `1/M`: `x_k = [w_k / M, sqrt(1 - |w_k|^2 / M^2)]`, a unit
//! vector; a query becomes `[q, 0]`. Then `x_k . [q, 0] = w_k . q / M`: the largest inner
//! products are the largest cosines, which spherical k-means can organise.
//!
//! **Index.** Spherical k-means (unit centroids, assignment by largest dot product) with
//! `C ~ sqrt(K)` centroids, so that probing costs about as much as scanning one cluster.
//!
//! **Search.** Rank centroids by `c_j . [q, 0]`, scan the members of the best ones until
//! `candidate_factor * k` rows have been scored, return the top `k` by exact score `w_k . q`.
//!
//! **Layout.** Every cluster keeps a copy of its members' rows, contiguous, and scores those:
//! scanning a cluster streams memory instead of gathering rows scattered over `W` (at
//! K = 1,000,000 a batch of 256 queries probes nearly every cluster; the gather cost more than
//! the scoring). The copies are kept equal to `W` by [`MipsIndex::sync`] (the output layer calls
//! it after every step, copying the changed rows). Two ways to score them (`scoring`):
//! - `f32`: on the copies themselves; the scores are exact, nothing is rescored.
//! - `int8`: on int8 codes of the rows with a scale per row ([`crate::quant`]; kept beside the
//!   copies, a quarter of their size), by an AVX-512 VNNI kernel several times faster per row
//!   than f32 matrix products (the centroids are ranked on their codes too); the best
//!   `rescore * k` probed rows by approximate score are then rescored exactly from the copies
//!   and the top `k` of those returned. Rounding moves scores by well under their spread near
//!   the cut, so the approximate ranking loses almost nothing that the rescoring cannot
//!   restore. It pays when many rows are probed per result (factor 10 and more); at the
//!   default 5 the rescoring costs more than the scan saves.
//!
//! **Refresh.** A changed row's copy is updated and the row re-augmented and reassigned to its
//! nearest centroid (cost C D per row, the paper's `k_r C D`) — only if it has drifted: its
//! cosine with its own centroid fell by more than `refresh_drift` since it was assigned (a check
//! of D per row). Rows that moved little, the most in training, keep their cluster, so a refresh
//! after every step costs little more than the sync. Centroids are not moved; when a row
//! outgrows `M` (its augmented coordinate would be imaginary) the index asks for a rebuild.

use crate::augment::NormAugmentation;
use crate::quant::{self, QuantQueries, QuantRows};
use crate::{Hit, MipsIndex, Rows};
use farout_core::gemm::{self, Op};
use farout_core::topk::NthBest;
use farout_core::{ClassId, Matrix, kernels, rng, topk};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;

/// Parameters of [`SphericalIndex`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SphericalConfig {
    /// Number of centroids C (0 = round(sqrt(K))).
    pub n_centroids: usize,
    /// Spherical k-means iterations.
    pub iterations: usize,
    /// Probe clusters until `candidate_factor * k` rows have been scored.
    pub candidate_factor: f32,
    /// Norm bound `M = (1 + norm_headroom) * max_k |w_k|`: room for rows to grow before a
    /// rebuild is needed.
    pub norm_headroom: f32,
    /// Seed of the centroid initialisation.
    pub seed: u64,
    /// k-means fits the centroids on at most this many rows per centroid (a random subset;
    /// FAISS's default is 256), then assigns every row once: build time stops growing with K.
    pub points_per_centroid: usize,
    /// A refresh reassigns a changed row only when its cosine with its centroid (augmented
    /// space) has fallen by more than this since its assignment; negative = every changed row.
    pub refresh_drift: f32,
    /// How probed rows are scored: on f32 copies (exact) or on int8 codes (approximate, then
    /// the best `rescore * k` rescored exactly from the f32 copies).
    pub scoring: Scoring,
    /// `int8` scoring: rows rescored exactly per result (at least 1).
    pub rescore: f32,
}

/// How [`SphericalIndex`] scores the rows of the clusters it probes (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scoring {
    /// Exact scores on f32 copies of the rows.
    #[default]
    F32,
    /// Approximate scores on int8 codes, the best rescored exactly. Needs AVX2 or AVX-512 VNNI
    /// to pay (elsewhere the same scores come from slow portable code).
    Int8,
}

impl Default for SphericalConfig {
    fn default() -> Self {
        Self {
            n_centroids: 0,
            iterations: 8,
            candidate_factor: 5.0,
            norm_headroom: 0.1,
            seed: 1,
            points_per_centroid: 256,
            refresh_drift: 0.02,
            scoring: Scoring::default(),
            rescore: 1.0,
        }
    }
}

/// The spherical-clustering index (see the module docs).
#[derive(Clone, Debug)]
pub struct SphericalIndex {
    config: SphericalConfig,
    /// The norm bound M of the reduction to cosine search.
    augmentation: NormAugmentation,
    /// Unit centroids in the augmented space, `C x (D + 1)`.
    centroids: Matrix,
    /// Their first D coordinates, `C x D` (queries have 0 in the augmented one).
    centroids_d: Matrix,
    /// With int8 scoring, the codes of `centroids_d`: probing ranks the centroids by
    /// approximate scores too.
    centroid_codes: Option<QuantRows>,
    /// Cluster of every row.
    assign: Vec<u32>,
    /// Every row's cosine with its centroid when it was assigned (the drift reference).
    assigned_cos: Vec<f32>,
    /// Position of every row in its cluster's member list.
    pos: Vec<u32>,
    clusters: Vec<Cluster>,
    rebuild: bool,
}

/// The members of one cluster and a copy of their rows (`ids.len() x D`, row-major, in the same
/// order) as of their last build, sync or refresh; with int8 scoring also the rows' codes.
#[derive(Clone, Debug)]
struct Cluster {
    ids: Vec<ClassId>,
    rows: Vec<f32>,
    codes: Option<QuantRows>,
}

impl Cluster {
    fn new(scoring: Scoring, d: usize, capacity: usize) -> Self {
        Self {
            ids: Vec::with_capacity(capacity),
            rows: Vec::with_capacity(capacity * d),
            codes: (scoring == Scoring::Int8).then(|| QuantRows::new(d)),
        }
    }

    fn len(&self) -> usize {
        self.ids.len()
    }

    /// The copy of member `at`.
    fn row(&self, at: usize, d: usize) -> &[f32] {
        &self.rows[at * d..(at + 1) * d]
    }

    /// Overwrites the copy of member `at`.
    fn set(&mut self, at: usize, row: &[f32]) {
        self.rows[at * row.len()..(at + 1) * row.len()].copy_from_slice(row);
        if let Some(codes) = &mut self.codes {
            codes.set(at, row);
        }
    }

    fn push(&mut self, id: ClassId, row: &[f32]) {
        self.ids.push(id);
        self.rows.extend_from_slice(row);
        if let Some(codes) = &mut self.codes {
            codes.push(row);
        }
    }

    /// Removes member `at` by moving the last one into its place; returns the moved id.
    fn swap_remove(&mut self, at: usize, d: usize) -> Option<ClassId> {
        let last = self.ids.len() - 1;
        self.ids.swap_remove(at);
        if at != last {
            self.rows.copy_within(last * d..(last + 1) * d, at * d);
        }
        self.rows.truncate(last * d);
        if let Some(codes) = &mut self.codes {
            codes.swap_remove(at);
        }
        self.ids.get(at).copied()
    }

    fn bytes(&self) -> usize {
        4 * (self.ids.capacity() + self.rows.capacity()) + self.codes.as_ref().map_or(0, QuantRows::bytes)
    }
}

/// Clusters ordered by centroid score before counting probed rows, at least (more only if
/// needed).
const PROBE_HEAD: usize = 64;

/// Rows per block of the k-means assignment product (bounds its temporary to block x C).
const ASSIGN_BLOCK: usize = 4096;

/// Per-thread buffers of one search: centroid scores, their keys and order, the probed rows'
/// scores and ids, the threshold sample of `topk::select_best`, and the int8 path's cluster
/// scores and candidates.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    keys: Vec<u64>,
    order: Vec<u32>,
    probed: Vec<f32>,
    ids: Vec<ClassId>,
    sample: Vec<f32>,
    block: Vec<f32>,
    candidates: Vec<Hit>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl SphericalIndex {
    /// Builds the index over the rows of `w`.
    pub fn build(w: Rows, config: &SphericalConfig) -> Self {
        let (k, d) = (w.len(), w.dim());
        let augmentation = NormAugmentation::fit(w, config.norm_headroom);
        let c = if config.n_centroids > 0 { config.n_centroids } else { (k as f64).sqrt().round() as usize }
            .clamp(1, k.max(1));
        // Initialise with distinct random rows.
        let mut order: Vec<usize> = (0..k).collect();
        let mut r = rng::seeded(config.seed, 0x5F4E);
        rng::shuffle(&mut order, &mut r);
        let mut centroids = Matrix::zeros(c, d + 1);
        for (j, &i) in order.iter().take(c).enumerate() {
            augmentation.augment_row(w.row(i), centroids.row_mut(j));
        }
        // Fit the centroids on at most `points_per_centroid * C` rows (a random subset), then
        // assign every row once.
        let cap = config.points_per_centroid.saturating_mul(c).max(c);
        let fit: Option<Vec<ClassId>> = (k > cap).then(|| order[..cap].iter().map(|&i| i as ClassId).collect());
        let fit_row = |i: usize| fit.as_ref().map_or(i, |f| f[i] as usize);
        let mut fit_assign = vec![0u32; fit.as_ref().map_or(k, Vec::len)];
        let mut fit_cos = vec![0.0f32; fit_assign.len()];
        for it in 0..config.iterations {
            assign_rows(w, &augmentation, &centroids, fit.as_deref(), &mut fit_assign, &mut fit_cos);
            // Centroid = normalised sum of its members' augmented rows; an empty cluster is
            // re-seeded with a random row.
            let mut sums = Matrix::zeros(c, d + 1);
            let mut counts = vec![0usize; c];
            let mut x = vec![0.0; d + 1];
            for (i, &a) in fit_assign.iter().enumerate() {
                augmentation.augment_row(w.row(fit_row(i)), &mut x);
                kernels::axpy(1.0, &x, sums.row_mut(a as usize));
                counts[a as usize] += 1;
            }
            for j in 0..c {
                if counts[j] == 0 {
                    let i = order[(c + it * c + j) % k.max(1)];
                    augmentation.augment_row(w.row(i), sums.row_mut(j));
                }
                kernels::normalize(sums.row_mut(j));
            }
            centroids = sums;
        }
        let (mut assign, mut assigned_cos) = (vec![0u32; k], vec![0.0f32; k]);
        assign_rows(w, &augmentation, &centroids, None, &mut assign, &mut assigned_cos);
        let mut sizes = vec![0usize; c];
        for &a in &assign {
            sizes[a as usize] += 1;
        }
        let mut clusters: Vec<Cluster> = sizes.iter().map(|&n| Cluster::new(config.scoring, d, n)).collect();
        let mut pos = vec![0u32; k];
        for (i, &a) in assign.iter().enumerate() {
            pos[i] = clusters[a as usize].len() as u32;
            clusters[a as usize].push(i as ClassId, w.row(i));
        }
        let mut centroids_d = Matrix::zeros(c, d);
        for j in 0..c {
            centroids_d.row_mut(j).copy_from_slice(&centroids.row(j)[..d]);
        }
        let centroid_codes = (config.scoring == Scoring::Int8).then(|| {
            let mut codes = QuantRows::new(d);
            centroids_d.iter_rows().for_each(|row| codes.push(row));
            codes
        });
        Self {
            config: config.clone(),
            augmentation,
            centroids,
            centroids_d,
            centroid_codes,
            assign,
            assigned_cos,
            pos,
            clusters,
            rebuild: false,
        }
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

    /// Rows probed per query for `k` results.
    fn budget(&self, k: usize) -> usize {
        per_result(k, self.config.candidate_factor)
    }

    /// Rows rescored exactly per query for `k` results (int8 scoring).
    fn depth(&self, k: usize) -> usize {
        per_result(k, self.config.rescore)
    }

    /// The cluster copy of row `i` (equal to `W`'s row as of its last sync).
    fn copy_of(&self, i: ClassId, d: usize) -> &[f32] {
        self.clusters[self.assign[i as usize] as usize].row(self.pos[i as usize] as usize, d)
    }

    /// Every query's centroid scores, `queries.rows() x stride` row-major with the `C` scores
    /// first in each row: exact by one matrix product, or approximate on the codes with int8
    /// scoring (`codes`: the queries' codes).
    fn centroid_scores(&self, queries: &Matrix, codes: Option<&QuantQueries>) -> (Vec<f32>, usize) {
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
    fn probe_batch(&self, queries: &Matrix, codes: Option<&QuantQueries>, budget: usize) -> BatchProbes {
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
    fn score_batch(
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
                let (m, nq) = (cluster.len(), qs.len());
                let mut qm = Matrix::zeros(nq, d);
                for (r, &q) in qs.iter().enumerate() {
                    qm.row_mut(r).copy_from_slice(queries.row(q as usize));
                }
                let mut z = vec![0.0f32; nq * m];
                gemm::gemm(&mut z, nq, m, 0.0, 1.0, qm.as_slice(), (nq, d), Op::N, &cluster.rows, (m, d), Op::T);
                (z, m)
            })
            .collect()
    }

    /// The int8 path's end of the batched search, from the approximate scores (`blocks`):
    /// every query's cut, the `depth`-th best approximate score of its probed rows; then,
    /// cluster by cluster, the rows reaching the cut of a query probing the cluster are rescored
    /// exactly from the f32 copy (each copy is read once, while it is in cache, for all its
    /// queries, instead of gathering rows query by query); then each query's `k` best of its
    /// rescored rows into `out`. Returns the number of rows rescored.
    fn rescore_batch(
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
                    let (mut hits, mut starts) = (Vec::new(), Vec::with_capacity(qs.len() + 1));
                    // Most rows are needed by some query: start loading them all in one stream.
                    if !qs.is_empty() {
                        kernels::prefetch(&cluster.rows);
                    }
                    for (s, &q) in qs.iter().enumerate() {
                        starts.push(hits.len() as u32);
                        let approximate = &z[s * stride..s * stride + cluster.len()];
                        positions.clear();
                        kept.clear();
                        kernels::keep_at_least(approximate, cuts[q as usize], positions, kept);
                        let query = queries.row(q as usize);
                        hits.extend(positions.iter().map(|&i| Hit {
                            class: cluster.ids[i as usize],
                            score: kernels::dot_simd(cluster.row(i as usize, d), query),
                        }));
                    }
                    starts.push(hits.len() as u32);
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

    /// Number of centroids C.
    pub fn n_centroids(&self) -> usize {
        self.centroids.rows()
    }

    /// Sizes of the clusters.
    pub fn cluster_sizes(&self) -> Vec<usize> {
        self.clusters.iter().map(Cluster::len).collect()
    }
}

/// Who probes what in a batched search.
struct BatchProbes {
    /// Per query, its probed clusters in probing order, each as `(cluster, the query's place in
    /// that cluster's list)`.
    slots: Vec<Vec<(u32, u32)>>,
    /// Per cluster, the queries probing it.
    queries_of: Vec<Vec<u32>>,
}

/// `factor * k` rows, rounded up, at least `k` (a factor below 1, or NaN, counts as 1).
fn per_result(k: usize, factor: f32) -> usize {
    ((k as f32 * factor).ceil() as usize).max(k)
}

/// The scores a query's probed clusters got in the batched search (`slots`: the query's
/// `(cluster, row of the cluster's score block)` pairs; `blocks`: every cluster's scores and
/// their row stride), each with the cluster's ids.
fn probed<'a>(
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

/// Assigns rows to the centroid with the largest dot product (into `cos`), by blocked matrix
/// products: every row when `rows` is `None` (`assign` has K entries), else `rows[j]` into
/// `assign[j]`.
fn assign_rows(
    w: Rows,
    augmentation: &NormAugmentation,
    centroids: &Matrix,
    rows: Option<&[ClassId]>,
    assign: &mut [u32],
    cos: &mut [f32],
) {
    let (d, c) = (w.dim(), centroids.rows());
    let blocks = assign.par_chunks_mut(ASSIGN_BLOCK).zip(cos.par_chunks_mut(ASSIGN_BLOCK));
    blocks.enumerate().for_each(|(b, (out, out_cos))| {
        let start = b * ASSIGN_BLOCK;
        let n = out.len();
        let mut x = Matrix::zeros(n, d + 1);
        for j in 0..n {
            let r = rows.map_or(start + j, |rows| rows[start + j] as usize);
            augmentation.augment_row(w.row(r), x.row_mut(j));
        }
        let mut s = vec![0.0f32; n * c];
        gemm::gemm(&mut s, n, c, 0.0, 1.0, x.as_slice(), (n, d + 1), Op::N, centroids.as_slice(), (c, d + 1), Op::T);
        for ((o, o_cos), row) in out.iter_mut().zip(out_cos.iter_mut()).zip(s.chunks_exact(c)) {
            let mut best = (f32::NEG_INFINITY, 0u32);
            for (j, &v) in row.iter().enumerate() {
                if v > best.0 {
                    best = (v, j as u32);
                }
            }
            (*o_cos, *o) = best;
        }
    });
}

impl MipsIndex for SphericalIndex {
    fn name(&self) -> &'static str {
        "spherical"
    }

    fn search(&self, w: Rows, query: &[f32], k: usize, out: &mut Vec<Hit>) -> usize {
        let (budget, d) = (self.budget(k), w.dim());
        SCRATCH.with_borrow_mut(|Scratch { scores, keys, order, probed, ids, sample, block, candidates }| {
            let codes = (self.config.scoring == Scoring::Int8).then(|| QuantQueries::new(query, d));
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
            // Every probed row is scored (on the cluster copies), so collect them all and
            // select once.
            probed.clear();
            ids.clear();
            for &j in order.iter() {
                let cluster = &self.clusters[j as usize];
                ids.extend_from_slice(&cluster.ids);
                match (&cluster.codes, &codes) {
                    (Some(rows), Some(codes)) => {
                        quant::scores(rows, codes, &[0], block);
                        probed.extend_from_slice(&block[..rows.len()]);
                    }
                    _ => probed.extend(cluster.rows.chunks_exact(d).map(|row| kernels::dot(row, query))),
                }
            }
            let parts = [(&probed[..], &ids[..])];
            if codes.is_none() {
                topk::select_best(&parts, k, sample, out);
                return probed.len() + self.centroids.rows();
            }
            // Rescore the best by approximate score exactly, from the copies (gathered: start
            // loading a few rows ahead).
            topk::select_best(&parts, self.depth(k), sample, candidates);
            const AHEAD: usize = 8;
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
            probed.len() + rescored + self.centroids.rows()
        })
    }

    /// Batched search: centroid scores of all queries at once (one matrix product, or one int8
    /// kernel call on the centroids' codes); then, cluster by cluster, the members' copy (or
    /// codes) is scored against every query probing that cluster at once (a small matrix
    /// product, or the int8 kernel), instead of per-query scattered dot products; with int8
    /// codes the best are then rescored cluster by cluster ([`SphericalIndex::rescore_batch`]).
    /// Returns what [`MipsIndex::search`] returns for each query (up to rounding: products and
    /// dot kernels may differ in the last bits).
    fn search_batch(&self, w: Rows, queries: &Matrix, k: usize, out: &mut Vec<Vec<Hit>>) -> usize {
        let codes = (self.config.scoring == Scoring::Int8).then(|| QuantQueries::new(queries.as_slice(), w.dim()));
        let probes = self.probe_batch(queries, codes.as_ref(), self.budget(k));
        let blocks = self.score_batch(&probes, queries, codes.as_ref());
        out.resize_with(queries.rows(), Vec::new);
        out.truncate(queries.rows());
        let scanned: usize = probes.slots.iter().flatten().map(|&(j, _)| self.clusters[j as usize].len()).sum();
        let centroids = queries.rows() * self.centroids.rows();
        if codes.is_some() {
            return scanned + self.rescore_batch(&probes, &blocks, queries, k, out) + centroids;
        }
        // Exact scores: select.
        out.par_iter_mut().zip(&probes.slots).for_each_init(
            || (Vec::new(), Vec::new()),
            |(parts, sample), (found, slots)| {
                parts.clear();
                parts.extend(probed(slots, &self.clusters, &blocks));
                topk::select_best(parts, k, sample, found);
            },
        );
        scanned + centroids
    }

    fn sync(&mut self, w: Rows, rows: &[ClassId]) {
        for &i in rows {
            self.clusters[self.assign[i as usize] as usize].set(self.pos[i as usize] as usize, w.row(i as usize));
        }
    }

    fn refresh(&mut self, w: Rows, rows: &[ClassId]) {
        self.rebuild |= rows.iter().any(|&i| self.augmentation.outgrown(w.row(i as usize)));
        let d = w.dim();
        // Rows still as close to their centroid as when assigned (within the drift) stay.
        let drift = self.config.refresh_drift;
        let mut x = vec![0.0f32; d + 1];
        let mut drifted = Vec::with_capacity(rows.len());
        for &i in rows {
            let (a, at) = (self.assign[i as usize] as usize, self.pos[i as usize] as usize);
            self.clusters[a].set(at, w.row(i as usize));
            self.augmentation.augment_row(w.row(i as usize), &mut x);
            if drift < 0.0 || kernels::dot(&x, self.centroids.row(a)) < self.assigned_cos[i as usize] - drift {
                drifted.push(i);
            }
        }
        let (mut nearest, mut cos) = (vec![0u32; drifted.len()], vec![0.0f32; drifted.len()]);
        assign_rows(w, &self.augmentation, &self.centroids, Some(&drifted), &mut nearest, &mut cos);
        for ((&i, &new), &c) in drifted.iter().zip(&nearest).zip(&cos) {
            self.assigned_cos[i as usize] = c;
            let (old, at) = (self.assign[i as usize], self.pos[i as usize] as usize);
            if new == old {
                continue;
            }
            // O(1) removal: move the last member into the freed slot.
            if let Some(moved) = self.clusters[old as usize].swap_remove(at, d) {
                self.pos[moved as usize] = at as u32;
            }
            self.pos[i as usize] = self.clusters[new as usize].len() as u32;
            self.clusters[new as usize].push(i, w.row(i as usize));
            self.assign[i as usize] = new;
        }
    }

    fn needs_rebuild(&self) -> bool {
        self.rebuild
    }

    fn memory_bytes(&self) -> usize {
        self.centroids.bytes()
            + self.centroids_d.bytes()
            + 4 * (self.assign.len() + self.assigned_cos.len() + self.pos.len())
            + self.clusters.iter().map(Cluster::bytes).sum::<usize>()
    }
}

impl crate::IndexParams for SphericalConfig {
    fn build(&self, w: Rows) -> Box<dyn MipsIndex> {
        Box::new(SphericalIndex::build(w, self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recall;
    use crate::testutil::{assert_exact_scores, assert_exact_top, clustered, move_rows_onto};

    /// The default configuration with each way of scoring.
    fn both_scorings() -> [SphericalConfig; 2] {
        [Scoring::F32, Scoring::Int8].map(|scoring| SphericalConfig { scoring, ..SphericalConfig::default() })
    }

    /// 20,000 rows in 400 natural clusters; with 400 centroids and 1,000 candidates scored per
    /// query (5% of the rows) the measured recall of the top 100 is 0.93 (0.85 with 500).
    #[test]
    fn recall_of_top_100_on_clustered_rows_is_at_least_0_9() {
        let (w, q) = clustered(20_000, 32);
        for base in both_scorings() {
            let config = SphericalConfig { n_centroids: 400, candidate_factor: 10.0, ..base };
            let index = SphericalIndex::build(Rows::all(&w), &config);
            let r = recall(&index, Rows::all(&w), &q, 100);
            assert!(r >= 0.9, "recall {r} ({:?})", config.scoring);
            let sizes = index.cluster_sizes();
            assert_eq!((sizes.len(), sizes.iter().sum::<usize>()), (400, 20_000));
        }
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
        for i in 0..q.rows() {
            f32s.search(Rows::all(&w), q.row(i), 100, &mut a);
            int8.search(Rows::all(&w), q.row(i), 100, &mut b);
            let truth: std::collections::HashSet<ClassId> = a.iter().map(|h| h.class).collect();
            overlap.0 += b.iter().filter(|h| truth.contains(&h.class)).count();
            overlap.1 += batch[i].iter().filter(|h| truth.contains(&h.class)).count();
        }
        let total = 100 * q.rows();
        assert!(overlap.0 as f64 >= 0.99 * total as f64, "per query: {} of {total}", overlap.0);
        assert!(overlap.1 as f64 >= 0.99 * total as f64, "batched: {} of {total}", overlap.1);
    }

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

    #[test]
    fn default_centroid_count_is_sqrt_k() {
        let (w, _) = clustered(20_000, 8);
        assert_eq!(
            SphericalIndex::build(Rows::all(&w), &SphericalConfig { iterations: 1, ..SphericalConfig::default() })
                .n_centroids(),
            141
        );
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

    #[test]
    fn batched_search_returns_the_per_query_results() {
        for config in both_scorings() {
            batched_search_returns_the_per_query_results_with(&config);
        }
        // Int8 scoring with rows rescored beyond the k returned.
        batched_search_returns_the_per_query_results_with(&SphericalConfig {
            scoring: Scoring::Int8,
            rescore: 2.0,
            ..SphericalConfig::default()
        });
    }

    fn batched_search_returns_the_per_query_results_with(config: &SphericalConfig) {
        let (w, q) = clustered(10_000, 16);
        let index = SphericalIndex::build(Rows::all(&w), config);
        let mut batch = Vec::new();
        let cost = index.search_batch(Rows::all(&w), &q, 40, &mut batch);
        let mut total = 0;
        for i in 0..q.rows() {
            let mut one = Vec::new();
            total += index.search(Rows::all(&w), q.row(i), 40, &mut one);
            one.sort_unstable_by(topk::by_score);
            batch[i].sort_unstable_by(topk::by_score);
            // Same candidates and selection; scores from a matrix product may differ from the
            // dot kernel in the last bits, so compare classes and scores to a tolerance.
            assert_eq!(
                batch[i].iter().map(|h| h.class).collect::<Vec<_>>(),
                one.iter().map(|h| h.class).collect::<Vec<_>>(),
                "query {i}"
            );
            for (a, b) in batch[i].iter().zip(&one) {
                assert!((a.score - b.score).abs() < 1e-5);
            }
        }
        assert_eq!(cost, total);
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
