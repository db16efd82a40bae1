//! Row updates from dense class gradients, for every dense step: the whole layer at once and
//! the chunked passes (`OutputLayer::update_rows_dense`, products on the thread pool) and the
//! tiled step (one tile per thread, products on that thread).

use crate::optim::UpdateRule;
use farout_core::gemm::{self, Op};
use farout_core::kernels;
use rayon::prelude::*;

/// The rows of W, the bias and their optimiser state that one update covers (`acc_w`, `bias`
/// and `acc_b` empty when there is none).
pub(super) struct Rows<'a> {
    pub w: &'a mut [f32],
    pub acc_w: &'a mut [f32],
    pub bias: &'a mut [f32],
    pub acc_b: &'a mut [f32],
}

/// The rows `rows` of a table of `width` values per row, or the empty table as it is.
pub(super) fn rows_of<'a>(table: &'a mut [f32], rows: &std::ops::Range<usize>, width: usize) -> &'a mut [f32] {
    if table.is_empty() { table } else { &mut table[rows.start * width..rows.end * width] }
}

/// Applies the dense gradients `g` (`[B, n]`, row-major) of the `n` rows in `rows` with the
/// rules `(W, bias)`: the bias takes the column sums of `g`, W takes `dW = g^T Phi` (fused into
/// one product for SGD, through the `n x D` scratch `dw` for adaptive rules). `parallel` runs
/// the product and the rows' rule on the thread pool; otherwise on the calling thread.
#[allow(clippy::too_many_arguments)]
pub(super) fn apply(
    rows: Rows,
    g: &[f32],
    phi: &[f32],
    (b, n, d): (usize, usize, usize),
    (rule_w, rule_b): (UpdateRule, UpdateRule),
    (dw, grad_b): (&mut Vec<f32>, &mut Vec<f32>),
    parallel: bool,
) {
    debug_assert_eq!(g.len(), b * n);
    let Rows { w, acc_w, bias, acc_b } = rows;
    let product = if parallel { gemm::gemm } else { gemm::gemm_serial };
    if !bias.is_empty() {
        grad_b.clear();
        grad_b.resize(n, 0.0);
        g.chunks_exact(n).for_each(|row| kernels::axpy(1.0, row, grad_b));
        rule_b.apply_scalars(bias, acc_b, grad_b);
    }
    if let UpdateRule::Sgd { lr, l2 } = rule_w {
        // Fused: W <- (1 - lr l2) W - lr G^T Phi, no n x D temporary.
        product(w, n, d, 1.0 - lr * l2, -lr, g, (b, n), Op::T, phi, (b, d), Op::N);
        return;
    }
    dw.resize(n * d, 0.0);
    product(dw, n, d, 0.0, 1.0, g, (b, n), Op::T, phi, (b, d), Op::N);
    let apply = |((row, a), grad): ((&mut [f32], &mut [f32]), &[f32])| rule_w.apply(row, a, grad);
    if parallel {
        w.par_chunks_mut(d).zip(acc_w.par_chunks_mut(d)).zip(dw.par_chunks(d)).for_each(apply);
    } else {
        w.chunks_mut(d).zip(acc_w.chunks_mut(d)).zip(dw.chunks(d)).for_each(apply);
    }
}
