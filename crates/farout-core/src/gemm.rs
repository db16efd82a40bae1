//! Matrix products over row-major slices, delegated to the `gemm` crate.
//!
//! We chose `gemm` (pure Rust, runtime CPU dispatch to AVX2/AVX-512/NEON micro-kernels, rayon
//! parallelism) over `matrixmultiply` because it is several times faster on wide matrices and
//! needs no system BLAS; over OpenBLAS because CI and users should not need C libraries.
//!
//! All functions compute `C = beta_c * C + alpha * op(A) op(B)` with `C` row-major; the `gemm`
//! crate names the two scalars the other way round (`alpha` for the destination).

use gemm::Parallelism;

fn parallelism() -> Parallelism {
    let n = rayon::current_num_threads();
    if n > 1 { Parallelism::Rayon(n) } else { Parallelism::None }
}

/// Layout of an operand: row-major as stored, or its transpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Use the matrix as stored (`rows x cols`).
    N,
    /// Use its transpose.
    T,
}

/// `C (m x n) = beta_c * C + alpha * op(A) * op(B)` where `A` is stored row-major as `a_rows x
/// a_cols` and likewise `B`; `op` picks the matrix or its transpose. Panics when shapes disagree
/// (callers own the shapes; user input never reaches here unchecked). Runs on the threads of
/// the current rayon pool.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    c: &mut [f32],
    m: usize,
    n: usize,
    beta_c: f32,
    alpha: f32,
    a: &[f32],
    a_shape: (usize, usize),
    op_a: Op,
    b: &[f32],
    b_shape: (usize, usize),
    op_b: Op,
) {
    gemm_on(parallelism(), c, m, n, beta_c, alpha, a, a_shape, op_a, b, b_shape, op_b);
}

/// [`gemm`] on the calling thread only: for small products that are themselves run in
/// parallel (one per tile of a larger computation), where splitting each again would only add
/// synchronisation.
#[allow(clippy::too_many_arguments)]
pub fn gemm_serial(
    c: &mut [f32],
    m: usize,
    n: usize,
    beta_c: f32,
    alpha: f32,
    a: &[f32],
    a_shape: (usize, usize),
    op_a: Op,
    b: &[f32],
    b_shape: (usize, usize),
    op_b: Op,
) {
    gemm_on(Parallelism::None, c, m, n, beta_c, alpha, a, a_shape, op_a, b, b_shape, op_b);
}

#[allow(clippy::too_many_arguments)]
fn gemm_on(
    parallelism: Parallelism,
    c: &mut [f32],
    m: usize,
    n: usize,
    beta_c: f32,
    alpha: f32,
    a: &[f32],
    a_shape: (usize, usize),
    op_a: Op,
    b: &[f32],
    b_shape: (usize, usize),
    op_b: Op,
) {
    let (ar, ac) = a_shape;
    let (br, bc) = b_shape;
    assert_eq!(a.len(), ar * ac, "gemm: A has {} values for {ar} x {ac}", a.len());
    assert_eq!(b.len(), br * bc, "gemm: B has {} values for {br} x {bc}", b.len());
    assert_eq!(c.len(), m * n, "gemm: C has {} values for {m} x {n}", c.len());
    // (rows, inner, row stride, col stride) of op(A) and op(B) in element units.
    let (am, ak, a_rs, a_cs) = match op_a {
        Op::N => (ar, ac, ac as isize, 1isize),
        Op::T => (ac, ar, 1isize, ac as isize),
    };
    let (bk, bn, b_rs, b_cs) = match op_b {
        Op::N => (br, bc, bc as isize, 1isize),
        Op::T => (bc, br, 1isize, bc as isize),
    };
    assert_eq!(am, m, "gemm: op(A) has {am} rows, C has {m}");
    assert_eq!(bn, n, "gemm: op(B) has {bn} columns, C has {n}");
    assert_eq!(ak, bk, "gemm: inner dimensions {ak} and {bk} differ");
    if m == 0 || n == 0 {
        return;
    }
    if ak == 0 {
        for v in c.iter_mut() {
            *v *= beta_c;
        }
        return;
    }
    // SAFETY: the asserts above check that every slice holds exactly the elements the strides
    // address; `c` is borrowed mutably, so it cannot alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            ak,
            c.as_mut_ptr(),
            1,
            n as isize,
            beta_c != 0.0,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            beta_c,
            alpha,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Scores of a batch: `Z (b x k) = X (b x d) W^T` with `W` stored `k x d`.
pub fn scores(x: &[f32], b: usize, w: &[f32], k: usize, d: usize, z: &mut [f32]) {
    gemm(z, b, k, 0.0, 1.0, x, (b, d), Op::N, w, (k, d), Op::T);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], a_shape: (usize, usize), op_a: Op, b: &[f32], b_shape: (usize, usize), op_b: Op) -> Vec<f32> {
        let get = |m: &[f32], shape: (usize, usize), op: Op, i: usize, j: usize| match op {
            Op::N => m[i * shape.1 + j],
            Op::T => m[j * shape.1 + i],
        };
        let (m, k) = if op_a == Op::N { a_shape } else { (a_shape.1, a_shape.0) };
        let n = if op_b == Op::N { b_shape.1 } else { b_shape.0 };
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|l| get(a, a_shape, op_a, i, l) * get(b, b_shape, op_b, l, j)).sum();
            }
        }
        c
    }

    #[test]
    fn gemm_matches_naive_product_for_all_transpositions() {
        let (m, k, n) = (7, 13, 5);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.3).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.7).cos()).collect();
        for (op_a, a_shape) in [(Op::N, (m, k)), (Op::T, (k, m))] {
            for (op_b, b_shape) in [(Op::N, (k, n)), (Op::T, (n, k))] {
                let mut c = vec![1.0; m * n];
                gemm(&mut c, m, n, 0.5, 2.0, &a, a_shape, op_a, &b, b_shape, op_b);
                let r = naive(&a, a_shape, op_a, &b, b_shape, op_b);
                for (x, y) in c.iter().zip(&r) {
                    assert!((x - (0.5 + 2.0 * y)).abs() < 1e-4, "{op_a:?} {op_b:?}: {x} vs {y}");
                }
            }
        }
    }
}
