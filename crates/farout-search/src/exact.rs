use crate::{Hit, MipsIndex, Rows};
use farout_core::gemm::{self, Op};
use farout_core::topk::{self, TopK};
use farout_core::{ClassId, Matrix, kernels};

/// Queries scored per matrix product by [`ExactIndex`]'s batched search (bounds the
/// `queries x K` temporary: 64 x 1 M floats = 256 MB at most).
pub const EXACT_BATCH: usize = 64;
use std::cell::RefCell;

/// Brute force: scores every row (vectorised dot products, streamed into a top-k heap).
/// Cost K D per query; the reference every approximate index is measured against.
#[derive(Clone, Debug, Default)]
pub struct ExactIndex;

thread_local! {
    static HEAP: RefCell<TopK> = RefCell::new(TopK::default());
    /// The threshold sample of `topk::select_best` in batched searches.
    static SAMPLE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
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

    /// Batched brute force: scores of up to [`EXACT_BATCH`] queries against all rows by one
    /// matrix product, then a top-k selection per query.
    fn search_batch(&self, w: Rows, queries: &Matrix, k: usize, out: &mut Vec<Vec<Hit>>) -> usize {
        use rayon::prelude::*;
        let (n, kk, d) = (queries.rows(), w.len(), w.dim());
        // A contiguous copy of the rows when the view is a column block.
        let owned;
        let rows: &[f32] = if d * kk == w.matrix().as_slice().len() {
            w.matrix().as_slice()
        } else {
            let mut copy = Vec::with_capacity(kk * d);
            w.iter().for_each(|r| copy.extend_from_slice(r));
            owned = copy;
            &owned
        };
        out.resize_with(n, Vec::new);
        out.truncate(n);
        if kk == 0 {
            // No rows, no hits (and no score rows to select from: chunks of length 0 panic).
            out.iter_mut().for_each(Vec::clear);
            return 0;
        }
        let ids: Vec<ClassId> = (0..kk as ClassId).collect();
        let mut z = Vec::new();
        for start in (0..n).step_by(EXACT_BATCH) {
            let m = (n - start).min(EXACT_BATCH);
            z.resize(m * kk, 0.0);
            gemm::gemm(
                &mut z,
                m,
                kk,
                0.0,
                1.0,
                &queries.as_slice()[start * d..(start + m) * d],
                (m, d),
                Op::N,
                rows,
                (kk, d),
                Op::T,
            );
            out[start..start + m].par_iter_mut().zip(z.par_chunks(kk)).for_each(|(o, row)| {
                SAMPLE.with_borrow_mut(|sample| topk::select_best(&[(row, &ids[..])], k, sample, o));
                o.sort_unstable_by(topk::by_score);
            });
        }
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
