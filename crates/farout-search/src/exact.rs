use crate::{Hit, MipsIndex, Rows};
use farout_core::gemm::{self, Op};
use farout_core::topk::{self, TopK};
use farout_core::{ClassId, Matrix, kernels};

use std::cell::RefCell;

/// Queries scored per matrix product by [`ExactIndex`]'s batched search.
pub const EXACT_BATCH: usize = 64;

/// Rows scored per matrix product by [`ExactIndex`]'s batched search: the scores of a product
/// take `EXACT_BATCH x EXACT_ROWS` floats (8 MB), and a column block of `W` is copied (to be
/// contiguous) this many rows at a time. Scoring all rows at once took a `queries x K`
/// temporary and a copy of the whole block: at K = 672,000 and D = 64, 344 MB beside a
/// training run whose memory is bounded.
const EXACT_ROWS: usize = 32_768;

/// Brute force: scores every row (vectorised dot products, streamed into a top-k heap).
/// Cost K D per query; the reference every approximate index is measured against.
#[derive(Clone, Debug, Default)]
pub struct ExactIndex;

thread_local! {
    static HEAP: RefCell<TopK> = RefCell::new(TopK::default());
    /// The threshold sample of `topk::select_best` and its output in batched searches.
    static SCRATCH: RefCell<(Vec<f32>, Vec<Hit>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

impl ExactIndex {
    /// The exact index (it stores nothing).
    pub fn new() -> Self {
        Self
    }
}

/// `[index] kind = "exact"`: brute force; no parameters.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExactConfig {}

impl crate::IndexParams for ExactConfig {
    fn build(&self, _: Rows) -> Box<dyn MipsIndex> {
        Box::new(ExactIndex::new())
    }
}

impl MipsIndex for ExactIndex {
    fn name(&self) -> &'static str {
        "exact"
    }

    /// Brute force has no state: nothing to write.
    fn save_state(&self, _out: &mut crate::persist::Enc) -> Result<(), crate::persist::Unsupported> {
        Ok(())
    }

    fn search(&self, w: Rows, query: &[f32], k: usize, out: &mut Vec<Hit>) -> usize {
        HEAP.with_borrow_mut(|heap| {
            heap.reset(k);
            for (i, row) in w.iter().enumerate() {
                let s = kernels::dot(row, query);
                if s > heap.threshold() {
                    heap.push(i as ClassId, s);
                }
            }
            heap.drain_sorted(out);
        });
        w.len()
    }

    /// Batched brute force: scores of up to [`EXACT_BATCH`] queries against [`EXACT_ROWS`]
    /// rows at a time by one matrix product; each query keeps the best `k` of the rows so far.
    fn search_batch(&self, w: Rows, queries: &Matrix, k: usize, out: &mut Vec<Vec<Hit>>) -> usize {
        use rayon::prelude::*;
        let (n, kk, d) = (queries.rows(), w.len(), w.dim());
        out.resize_with(n, Vec::new);
        out.truncate(n);
        out.iter_mut().for_each(Vec::clear);
        // The rows are contiguous unless the view is a column block: then they are copied, a
        // part at a time.
        let contiguous = d * kk == w.matrix().as_slice().len();
        let (mut copy, mut z, mut ids) = (Vec::new(), Vec::new(), Vec::new());
        for first in (0..kk).step_by(EXACT_ROWS) {
            let r = (kk - first).min(EXACT_ROWS);
            let rows: &[f32] = if contiguous {
                &w.matrix().as_slice()[first * d..(first + r) * d]
            } else {
                copy.clear();
                (first..first + r).for_each(|i| copy.extend_from_slice(w.row(i)));
                &copy
            };
            ids.clear();
            ids.extend(first as ClassId..(first + r) as ClassId);
            for start in (0..n).step_by(EXACT_BATCH) {
                let m = (n - start).min(EXACT_BATCH);
                z.resize(m * r, 0.0);
                let batch = &queries.as_slice()[start * d..(start + m) * d];
                gemm::gemm(&mut z, m, r, 0.0, 1.0, batch, (m, d), Op::N, rows, (r, d), Op::T);
                out[start..start + m].par_iter_mut().zip(z.par_chunks(r)).for_each(|(o, scores)| {
                    SCRATCH.with_borrow_mut(|(sample, best)| {
                        topk::select_best(&[(scores, &ids[..])], k, sample, best);
                        o.append(best);
                        // The best k of these rows and of the rows before: the same order
                        // (score, then the lower class) as `select_best`'s.
                        if o.len() > k {
                            o.select_nth_unstable_by(k.max(1) - 1, topk::by_score);
                            o.truncate(k);
                        }
                    })
                });
            }
        }
        out.par_iter_mut().for_each(|o| o.sort_unstable_by(topk::by_score));
        n * kk
    }

    fn refresh(&mut self, _w: Rows, _rows: &[ClassId]) {}

    fn memory_bytes(&self) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_view_searches_the_block_only() {
        let w = Matrix::from_vec(3, 4, vec![1.0, 0.0, 0.0, 9.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0]).unwrap();
        let mut out = Vec::new();
        // Block 1..3 of each row: (0, 0), (1, 0), (0, 2); query (1, 1).
        let cost = ExactIndex.search(Rows::block(&w, 1, 3), &[1.0, 1.0], 2, &mut out);
        assert_eq!((out[0].class, out[0].score, out[1].class, cost), (2, 2.0, 1, 3));
    }

    /// The batched search over more rows than one product scores and more queries than one
    /// product takes, on all rows and on a column block, returns exactly the best `k` by
    /// (score, lower class): integer values make every score exact, and ties frequent.
    #[test]
    fn batched_search_over_many_parts_equals_sorting_every_score() {
        let (kk, d, n) = (2 * EXACT_ROWS + 123, 8, EXACT_BATCH + 6);
        let mut r = farout_core::rng::seeded(5, 0);
        let mut int = |_| (farout_core::rng::normal(&mut r) * 2.0).round().clamp(-4.0, 4.0);
        let w = Matrix::from_vec(kk, d, (0..kk * d).map(&mut int).collect()).unwrap();
        let q = Matrix::from_vec(n, d, (0..n * d).map(&mut int).collect()).unwrap();
        for (view, from, to) in [(Rows::all(&w), 0, d), (Rows::block(&w, 2, 7), 2, 7)] {
            let mut queries = Matrix::zeros(n, to - from);
            (0..n).for_each(|i| queries.row_mut(i).copy_from_slice(&q.row(i)[from..to]));
            for k in [0, 1, 40, 5_000] {
                let mut batch = Vec::new();
                assert_eq!(ExactIndex.search_batch(view, &queries, k, &mut batch), n * kk);
                for (i, found) in batch.iter().enumerate() {
                    let mut all: Vec<Hit> = (0..kk)
                        .map(|c| Hit { class: c as ClassId, score: kernels::dot(view.row(c), queries.row(i)) })
                        .collect();
                    all.sort_unstable_by(topk::by_score);
                    all.truncate(k);
                    assert_eq!(found, &all, "query {i}, k = {k}, columns {from}..{to}");
                }
            }
        }
    }

    #[test]
    fn batched_search_over_no_rows_finds_nothing() {
        let (w, q) = (Matrix::zeros(0, 4), Matrix::zeros(3, 4));
        let mut out = vec![vec![Hit { class: 0, score: 1.0 }]];
        assert_eq!(ExactIndex.search_batch(Rows::all(&w), &q, 5, &mut out), 0);
        assert_eq!(out, vec![Vec::new(); 3]);
    }

    #[test]
    fn exact_index_equals_full_scoring_then_top_k() {
        let mut r = farout_core::rng::seeded(4, 0);
        let w = Matrix::from_vec(500, 12, (0..6000).map(|_| farout_core::rng::normal(&mut r)).collect()).unwrap();
        let q: Vec<f32> = (0..12).map(|_| farout_core::rng::normal(&mut r)).collect();
        let mut z = vec![0.0; 500];
        kernels::gemv(w.as_slice(), &q, &mut z);
        for k in [1, 10, 499, 500, 600] {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            ExactIndex.search(Rows::all(&w), &q, k, &mut a);
            topk::top_k(&z, k, &mut b);
            assert_eq!(a, b, "k = {k}");
        }
        // The batched path (matrix product) agrees on classes, and on scores to rounding.
        let mut batch = Vec::new();
        for view in [Rows::all(&w), Rows::block(&w, 3, 9)] {
            let qv = if view.dim() == 12 { &q[..] } else { &q[3..9] };
            let queries = Matrix::from_vec(1, qv.len(), qv.to_vec()).unwrap();
            ExactIndex.search_batch(view, &queries, 20, &mut batch);
            let mut one = Vec::new();
            ExactIndex.search(view, qv, 20, &mut one);
            assert_eq!(
                batch[0].iter().map(|h| h.class).collect::<Vec<_>>(),
                one.iter().map(|h| h.class).collect::<Vec<_>>()
            );
        }
    }
}
