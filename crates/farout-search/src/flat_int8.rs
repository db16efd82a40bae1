//! Brute force on int8 codes: every row is scored against the query on its int8 codes
//! ([`crate::quant`]), and the best `rescore · k` rows by that approximate score are rescored
//! exactly from `W` (FAISS calls the scan `IndexScalarQuantizer` with 8-bit codes, "SQ8").
//!
//! **Why.** Brute force in f32 is one multiply-add per row and dimension, bound by the FMA
//! units. On int8 codes the same scan is 4x narrower, and CPUs multiply bytes far faster than
//! floats: AVX-512 VNNI does 64 multiply-adds per instruction against 16 for f32 FMA, and AMX
//! (Sapphire Rapids) 16,384 per tile instruction. The search stays linear in K, and every row
//! is looked at, so nothing a partitioning or a graph could miss is missed: a row is lost only
//! when rounding moves it below `rescore · k` others. That makes it the oracle for weights that
//! change faster than any index structure can follow (MEMOIR changes a fifth of `W`'s rows per
//! batch): refreshing a row is quantising it again, `D` operations.
//!
//! **Error.** A row `w` is rounded to steps of `max_i |w_i| / 127` and the query likewise, so
//! each approximate score is within about `sqrt(D) · (|w|_∞ |q|_2 + |q|_∞ |w|_2) / 254` of the
//! exact one (half a step per coordinate, errors of random sign). Rows whose exact scores lie
//! closer than that to the `k`-th best are ranked by chance among themselves; rescoring
//! `rescore · k` (and at least `k + 32`) of them exactly returns the exact top `k` unless more
//! than that many rows crowd within the error.
//!
//! **Layout and scan.** Rows are quantised in blocks of [`BLOCK_ROWS`] (half a megabyte of
//! codes at D = 128, which stays in L2 cache while a chunk of [`QUERY_CHUNK`] queries is scored
//! against it). For each block and each query, only the scores at or above the query's floor
//! (a lower bound of its `depth`-th best approximate score so far) are kept; when a query holds
//! [`COMPACT_AT`] times `depth` rows, the floor rises to their `depth`-th best and the rest
//! are dropped. At the end the `depth` best kept rows are rescored exactly.
//!
//! On a CPU without a SIMD int8 kernel (neither AVX2 nor AVX-512 VNNI) the portable int8 code
//! is slower than f32 brute force, so the index is brute force there.

use crate::quant::{self, Above, QuantQueries, QuantRows};
use crate::{Hit, MipsIndex, Rows};
use farout_core::topk::{self, NthBest};
use farout_core::{ClassId, Matrix, kernels};
use rayon::prelude::*;
use std::cell::RefCell;

/// Rows per block of codes (a multiple of [`quant::ROW_TILE`]).
const BLOCK_ROWS: usize = 4096;
/// Queries scored together against a block (their scores take `QUERY_CHUNK x BLOCK_ROWS x 4`
/// bytes: one megabyte).
const QUERY_CHUNK: usize = 64;
/// Rows ahead whose values the exact rescoring requests while scoring the current one.
const RESCORE_AHEAD: usize = 8;
/// A query's kept rows are cut back to its `depth` best once it holds this many times `depth`.
const COMPACT_AT: usize = 4;

/// Parameters of [`FlatInt8Index`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlatInt8Config {
    /// Rows rescored exactly per result: the best `rescore * k` rows by int8 score (and at least
    /// `k + 32`).
    pub rescore: f32,
}

impl Default for FlatInt8Config {
    fn default() -> Self {
        Self { rescore: 1.0 }
    }
}

impl crate::IndexParams for FlatInt8Config {
    fn check(&self) -> Result<(), farout_core::ParamError> {
        crate::finite_at_least("rescore", self.rescore, 1.0)
    }

    fn build(&self, w: Rows) -> Box<dyn MipsIndex> {
        Box::new(FlatInt8Index::build(w, self))
    }
}

/// Brute force on int8 codes with exact rescoring (see the module docs).
pub struct FlatInt8Index {
    config: FlatInt8Config,
    /// The codes of rows `b * BLOCK_ROWS ..` in block `b`.
    blocks: Vec<QuantRows>,
    rows: usize,
    /// The CPU has no SIMD int8 kernel (neither AVX2 nor AVX-512 VNNI, or `FAROUT_SIMD` caps
    /// them): portable int8 code is slower than f32 brute force, which answers instead.
    f32_only: bool,
}

/// Queries per chunk of a batch of `n` on `threads` threads: [`QUERY_CHUNK`], or fewer so that
/// every thread gets a chunk (each query costs a scan of every code either way; the kernels
/// amortise loading a tile of codes over the queries of a chunk, so chunks stay as large as
/// the threads allow).
fn chunk_size(n: usize, threads: usize) -> usize {
    QUERY_CHUNK.min(n.div_ceil(threads.max(1))).max(1)
}

/// A query's rows kept during the scan: ids and approximate scores, side by side.
#[derive(Default)]
struct Kept {
    ids: Vec<ClassId>,
    scores: Vec<f32>,
    floor: f32,
}

/// One thread's buffers for a chunk of queries.
#[derive(Default)]
struct Scratch {
    kept: Vec<Kept>,
    /// Per query of the chunk: its floor, and the rows of a block reaching it.
    floors: Vec<f32>,
    above: Vec<Above>,
    scores: Vec<f32>,
    nth: NthBest,
    candidates: Vec<Hit>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl FlatInt8Index {
    /// Quantises every row of `w` (nothing on a CPU without a SIMD int8 kernel: brute force
    /// in f32 answers there).
    pub fn build(w: Rows, config: &FlatInt8Config) -> Self {
        let f32_only = quant::Kernel::best() == quant::Kernel::Scalar;
        let blocks = (0..if f32_only { 0 } else { w.len().div_ceil(BLOCK_ROWS) })
            .into_par_iter()
            .map(|b| {
                let mut codes = QuantRows::new(w.dim());
                (b * BLOCK_ROWS..((b + 1) * BLOCK_ROWS).min(w.len())).for_each(|i| codes.push(w.row(i)));
                codes
            })
            .collect();
        Self { config: config.clone(), blocks, rows: w.len(), f32_only }
    }

    /// The index saved as [`MipsIndex::save_state`] wrote it, over the rows `w`: its codes
    /// are the quantised rows (kept equal to `W` by every sync), quantised again here at the
    /// cost of reading them.
    pub(crate) fn restore(dec: &mut crate::persist::Dec, w: Rows) -> Result<Self, crate::persist::Problem> {
        let config: FlatInt8Config = dec.config("flat_int8")?;
        crate::IndexParams::check(&config).map_err(crate::persist::inconsistent)?;
        Ok(Self::build(w, &config))
    }

    /// Rows rescored exactly per query for `k` results.
    fn depth(&self, k: usize) -> usize {
        quant::rescore_depth(k, self.config.rescore)
    }

    /// Searches the queries `which` of `codes` (quantised rows of `queries`, row-major of
    /// `w.dim()` values): `out[s]` gets the top `k` of query `which[s]`. Returns the number of
    /// rows scored (on codes and exactly).
    fn search_chunk(
        &self,
        w: Rows,
        queries: &[f32],
        codes: &QuantQueries,
        which: &[u32],
        k: usize,
        out: &mut [Vec<Hit>],
    ) -> usize {
        let depth = self.depth(k);
        SCRATCH.with_borrow_mut(|s| {
            let Scratch { kept, floors, above, scores, nth, candidates } = s;
            kept.resize_with(which.len(), Kept::default);
            above.resize_with(which.len(), Above::default);
            for q in kept.iter_mut() {
                q.ids.clear();
                q.scores.clear();
                q.floor = f32::NEG_INFINITY;
            }
            for (b, block) in self.blocks.iter().enumerate() {
                floors.clear();
                floors.extend(kept.iter().map(|q| q.floor));
                above.iter_mut().for_each(Above::clear);
                quant::scores_at_least_of_best(block, codes, which, floors, depth, above, scores);
                let first = (b * BLOCK_ROWS) as ClassId;
                for (q, a) in kept.iter_mut().zip(above.iter()) {
                    q.scores.extend_from_slice(&a.scores);
                    q.ids.extend(a.positions.iter().map(|&p| first + p));
                    if q.scores.len() >= COMPACT_AT * depth {
                        q.floor = nth.of(&[&q.scores], depth);
                        quant::retain_at_least(&mut q.scores, &mut q.ids, q.floor);
                    }
                }
            }
            let mut scored = which.len() * self.rows;
            for ((q, &j), o) in kept.iter().zip(which).zip(out.iter_mut()) {
                let query = &queries[j as usize * w.dim()..(j as usize + 1) * w.dim()];
                // The scores buffer is free once every block is scanned: the selection's sample.
                topk::select_best(&[(&q.scores, &q.ids)], depth, scores, candidates);
                // The rows are scattered over W: each is requested a few rows ahead, so that
                // their loads overlap instead of waiting one by one.
                for i in 0..candidates.len() {
                    if let Some(ahead) = candidates.get(i + RESCORE_AHEAD) {
                        kernels::prefetch(w.row(ahead.class as usize));
                    }
                    let h = &mut candidates[i];
                    h.score = kernels::dot(w.row(h.class as usize), query);
                }
                scored += candidates.len();
                quant::keep_best(candidates, k, o);
            }
            scored
        })
    }
}

impl MipsIndex for FlatInt8Index {
    fn name(&self) -> &'static str {
        "flat_int8"
    }

    /// The parameters only: the codes are the quantised rows (see [`FlatInt8Index::restore`]).
    fn save_state(&self, out: &mut crate::persist::Enc) -> Result<(), crate::persist::Unsupported> {
        out.config(&self.config);
        Ok(())
    }

    fn search(&self, w: Rows, query: &[f32], k: usize, out: &mut Vec<Hit>) -> usize {
        if self.f32_only {
            return crate::ExactIndex.search(w, query, k, out);
        }
        let codes = QuantQueries::new(query, w.dim());
        self.search_chunk(w, query, &codes, &[0], k, std::slice::from_mut(out))
    }

    /// The queries in chunks of [`QUERY_CHUNK`] (smaller when that leaves a thread without a
    /// chunk: a training batch of 16 queries scans on every core), the chunks in parallel,
    /// each scanning every block of codes.
    fn search_batch(&self, w: Rows, queries: &Matrix, k: usize, out: &mut Vec<Vec<Hit>>) -> usize {
        if self.f32_only {
            return crate::ExactIndex.search_batch(w, queries, k, out);
        }
        out.resize_with(queries.rows(), Vec::new);
        out.truncate(queries.rows());
        let codes = QuantQueries::new(queries.as_slice(), w.dim());
        let chunk = chunk_size(queries.rows(), rayon::current_num_threads());
        out.par_chunks_mut(chunk)
            .enumerate()
            .map(|(c, o)| {
                let which: Vec<u32> = (c * chunk..c * chunk + o.len()).map(|j| j as u32).collect();
                self.search_chunk(w, queries.as_slice(), &codes, &which, k, o)
            })
            .sum()
    }

    /// Quantises the rows again (the codes are the index: nothing else to re-index).
    fn sync(&mut self, w: Rows, rows: &[ClassId]) {
        self.refresh(w, rows);
    }

    fn refresh(&mut self, w: Rows, rows: &[ClassId]) {
        assert_eq!(w.len(), self.rows, "the index was built over {} rows, not {}", self.rows, w.len());
        if self.f32_only {
            return;
        }
        // The rows by block, then the blocks in parallel (a training step changes thousands
        // of rows).
        let (starts, by_block) = farout_core::group_rows(rows, self.blocks.len(), |i| i as usize / BLOCK_ROWS);
        self.blocks.par_iter_mut().enumerate().for_each(|(b, block)| {
            let ids = &by_block[starts[b]..starts[b + 1]];
            ids.iter().for_each(|&i| block.set(i as usize - b * BLOCK_ROWS, w.row(i as usize)));
        });
    }

    fn memory_bytes(&self) -> usize {
        self.blocks.iter().map(QuantRows::bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IndexParams;
    use crate::testutil::{assert_exact_scores, assert_exact_top, clustered, move_rows_onto, move_these_rows_onto};

    /// 10,000 rows of 128 dimensions: three blocks of codes (the last one partial) and, where
    /// the CPU has it, the AMX kernel (a multiple of 64 dimensions, 64 queries per chunk).
    #[test]
    fn batched_and_single_searches_return_brute_force_top_k_over_several_blocks() {
        let (w, q) = clustered(10_000, 128);
        let index = FlatInt8Index::build(Rows::all(&w), &FlatInt8Config::default());
        assert_eq!(index.blocks.len(), if index.f32_only { 0 } else { 3 });
        let mut batched = Vec::new();
        index.search_batch(Rows::all(&w), &q, 10, &mut batched);
        // Rescoring 42 rows per query for 10 results: rounding never pushes one of the ten
        // best below 42 others on these rows.
        for (i, b) in batched.iter_mut().enumerate() {
            b.sort_unstable_by(topk::by_score);
            assert_eq!(*b, assert_exact_top(&index, &w, q.row(i), 10), "query {i}");
        }
        assert_exact_scores(&index, &w, &q);
    }

    /// The rescoring depth is what corrects rounding: with rows crowded far closer than the
    /// codes resolve, only the exact rescoring of enough of them finds the top.
    #[test]
    fn rescoring_enough_rows_recovers_the_order_the_codes_blur() {
        // 2,000 rows that all score within 1e-4 of each other against the query, the best
        // last. Their largest value (1) sets a code step of 1/127, in which the scores
        // (0.4 to 0.4001) all round to 51 steps: the codes tie them, and ties go to the lower
        // ids.
        let d = 64;
        let query: Vec<f32> = (0..d).map(|i| if i == 1 { 1.0 } else { 0.0 }).collect();
        let mut w = Matrix::zeros(2_000, d);
        for r in 0..2_000 {
            let row = w.row_mut(r);
            row[0] = 1.0;
            row[1] = 0.4 + 1e-4 * r as f32 / 2_000.0;
        }
        let q = Matrix::from_vec(1, d, query).unwrap();
        let found = |rescore: f32| {
            let index = FlatInt8Index::build(Rows::all(&w), &FlatInt8Config { rescore });
            crate::recall(&index, Rows::all(&w), &q, 5)
        };
        assert_eq!(found(1.0), 0.0, "the codes alone tie these rows");
        assert_eq!(found(400.0), 1.0, "rescoring every row finds the exact top 5");
    }

    #[test]
    fn changed_rows_are_found_after_sync_or_refresh() {
        let (mut w, q) = clustered(10_000, 64);
        let mut synced = FlatInt8Index::build(Rows::all(&w), &FlatInt8Config::default());
        let mut refreshed = FlatInt8Index::build(Rows::all(&w), &FlatInt8Config::default());
        let moved = move_rows_onto(&mut w, q.row(0));
        synced.sync(Rows::all(&w), &moved);
        refreshed.refresh(Rows::all(&w), &moved);
        for index in [&synced, &refreshed] {
            let top = assert_exact_top(index, &w, q.row(0), 50);
            assert!(top.iter().all(|h| moved.contains(&h.class)));
        }
    }

    /// A query's whole top lies in the first block it scans: the floor it sets there keeps
    /// every one of them (and the later blocks add none).
    #[test]
    fn a_top_held_by_the_first_block_is_found_whole() {
        let (mut w, q) = clustered(10_000, 64);
        let moved = move_these_rows_onto(&mut w, q.row(0), (0..50).map(|j| j * 80 + 3).collect());
        assert!(moved.iter().all(|&r| (r as usize) < BLOCK_ROWS));
        let index = FlatInt8Index::build(Rows::all(&w), &FlatInt8Config::default());
        let mut batched = Vec::new();
        index.search_batch(Rows::all(&w), &q, 50, &mut batched);
        for top in [assert_exact_top(&index, &w, q.row(0), 50), batched.swap_remove(0)] {
            let mut found: Vec<ClassId> = top.iter().map(|h| h.class).collect();
            found.sort_unstable();
            assert_eq!(found, moved);
        }
    }

    #[test]
    fn small_batches_are_cut_into_a_chunk_per_thread() {
        assert_eq!(chunk_size(16, 2), 8);
        assert_eq!(chunk_size(15, 2), 8);
        assert_eq!(chunk_size(1, 2), 1);
        assert_eq!(chunk_size(256, 2), QUERY_CHUNK);
        assert_eq!(chunk_size(100, 1), QUERY_CHUNK);
        assert_eq!(chunk_size(0, 2), 1);
    }

    #[test]
    fn a_rescore_below_one_names_its_key() {
        let e = FlatInt8Config { rescore: 0.5 }.check().unwrap_err();
        assert_eq!(e.key_and_message().0, "rescore");
        assert!(FlatInt8Config { rescore: f32::NAN }.check().is_err());
        assert!(FlatInt8Config::default().check().is_ok());
    }
}
