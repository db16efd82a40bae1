use crate::{Hit, MipsIndex, Rows};
use farout_core::topk::TopK;
use farout_core::{ClassId, kernels};
use std::cell::RefCell;

/// Brute force: scores every row (vectorised dot products, streamed into a top-k heap).
/// Cost K D per query; the reference every approximate index is measured against.
#[derive(Clone, Debug, Default)]
pub struct ExactIndex;

thread_local! {
    static HEAP: RefCell<TopK> = RefCell::new(TopK::default());
}

impl ExactIndex {
    /// The exact index (it stores nothing).
    pub fn new() -> Self {
        Self
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

    fn refresh(&mut self, _w: Rows, _rows: &[ClassId]) {}

    fn memory_bytes(&self) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_core::Matrix;
    use farout_core::topk::top_k;

    #[test]
    fn block_view_searches_the_block_only() {
        let w = Matrix::from_vec(3, 4, vec![1.0, 0.0, 0.0, 9.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0]).unwrap();
        let mut out = Vec::new();
        // Block 1..3 of each row: (0, 0), (1, 0), (0, 2); query (1, 1).
        let cost = ExactIndex.search(Rows::block(&w, 1, 3), &[1.0, 1.0], 2, &mut out);
        assert_eq!((out[0].class, out[0].score, out[1].class, cost), (2, 2.0, 1, 3));
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
            top_k(&z, k, &mut b);
            assert_eq!(a, b, "k = {k}");
        }
    }
}
