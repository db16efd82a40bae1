use crate::{Hit, MipsIndex};
use farout_core::topk::TopK;
use farout_core::{ClassId, Matrix, kernels};
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

    fn search(&self, w: &Matrix, query: &[f32], k: usize, out: &mut Vec<Hit>) {
        HEAP.with_borrow_mut(|heap| {
            heap.reset(k);
            for (i, row) in w.iter_rows().enumerate() {
                let s = kernels::dot(row, query);
                if s > heap.threshold() {
                    heap.push(i as ClassId, s);
                }
            }
            heap.drain_sorted(out);
        });
    }

    fn refresh(&mut self, _w: &Matrix, _rows: &[ClassId]) {}

    fn memory_bytes(&self) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_core::topk::top_k;

    #[test]
    fn exact_index_equals_full_scoring_then_top_k() {
        let mut r = farout_core::rng::seeded(4, 0);
        let w = Matrix::from_vec(500, 12, (0..6000).map(|_| farout_core::rng::normal(&mut r)).collect()).unwrap();
        let q: Vec<f32> = (0..12).map(|_| farout_core::rng::normal(&mut r)).collect();
        let mut z = vec![0.0; 500];
        kernels::gemv(w.as_slice(), &q, &mut z);
        for k in [1, 10, 499, 500, 600] {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            ExactIndex.search(&w, &q, k, &mut a);
            top_k(&z, k, &mut b);
            assert_eq!(a, b, "k = {k}");
        }
    }
}
