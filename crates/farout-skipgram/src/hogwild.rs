//! Rows of an f32 matrix that several threads read and update without locks (Hogwild!, Niu et
//! al. 2011), as word2vec, gensim and fastText do for their embedding tables.
//!
//! Two memory models, chosen by `model.skip_gram.hogwild`:
//! - [`RacyRows`]: plain loads and stores through raw pointers, so the vector kernels run on the
//!   shared rows directly. Concurrent updates of one row race: an update can be lost or see a
//!   half-written row. That is word2vec's choice and what Hogwild's analysis allows for; it is
//!   formally a data race under Rust's memory model (the compiler could assume it away), which
//!   is why the second model exists.
//! - [`AtomicRows`]: every element is an `AtomicU32` accessed with relaxed ordering: the same
//!   lost updates, no undefined behaviour, but element-wise loads and stores that LLVM does not
//!   vectorise.
//!
//! Measured on dict-gcide (skip-gram, negative sampling, 2 threads; see the crate docs), racy
//! rows train faster, so they are the default.

use farout_core::{Matrix, kernels};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};

/// Rows shared by Hogwild threads. `scratch` buffers are the caller's, so nothing allocates.
pub trait HogwildRows: Sync + Send {
    /// A `rows x cols` table holding `m`.
    fn from_matrix(m: Matrix) -> Self;
    /// Rows.
    fn rows(&self) -> usize;
    /// Columns.
    fn cols(&self) -> usize;
    /// The table as a matrix (call when no thread is updating it).
    fn to_matrix(&self) -> Matrix {
        let mut m = Matrix::zeros(self.rows(), self.cols());
        for r in 0..self.rows() {
            self.read(r, m.row_mut(r));
        }
        m
    }
    /// Copies row `r` into `out`.
    fn read(&self, r: usize, out: &mut [f32]);
    /// `row_r += alpha x`.
    fn axpy(&self, r: usize, alpha: f32, x: &[f32], scratch: &mut [f32]);
}

/// Hogwild rows with plain (racy) memory accesses; see the module docs.
pub struct RacyRows {
    data: Box<[UnsafeCell<f32>]>,
    cols: usize,
}

// SAFETY: concurrent access is the point of this type: races between threads updating the same
// row are accepted (Hogwild) and documented above. No reference outlives a method call.
unsafe impl Sync for RacyRows {}

impl RacyRows {
    #[inline]
    fn ptr(&self, r: usize) -> *mut f32 {
        let row = &self.data[r * self.cols..(r + 1) * self.cols];
        UnsafeCell::raw_get(row.as_ptr())
    }
}

impl HogwildRows for RacyRows {
    fn from_matrix(m: Matrix) -> Self {
        let cols = m.cols();
        Self { data: m.into_vec().into_iter().map(UnsafeCell::new).collect(), cols }
    }

    fn rows(&self) -> usize {
        self.data.len() / self.cols.max(1)
    }

    fn cols(&self) -> usize {
        self.cols
    }

    #[inline]
    fn read(&self, r: usize, out: &mut [f32]) {
        // SAFETY: in bounds (checked by `ptr`); races accepted (module docs).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(r), out.as_mut_ptr(), self.cols.min(out.len())) }
    }

    #[inline]
    fn axpy(&self, r: usize, alpha: f32, x: &[f32], _: &mut [f32]) {
        // SAFETY: as in `read`; the slice lives for this call only.
        let row = unsafe { std::slice::from_raw_parts_mut(self.ptr(r), self.cols) };
        kernels::axpy(alpha, x, row);
    }
}

/// Hogwild rows of relaxed atomics; see the module docs.
pub struct AtomicRows {
    data: Box<[AtomicU32]>,
    cols: usize,
}

impl HogwildRows for AtomicRows {
    fn from_matrix(m: Matrix) -> Self {
        let cols = m.cols();
        Self { data: m.into_vec().into_iter().map(|x| AtomicU32::new(x.to_bits())).collect(), cols }
    }

    fn rows(&self) -> usize {
        self.data.len() / self.cols.max(1)
    }

    fn cols(&self) -> usize {
        self.cols
    }

    #[inline]
    fn read(&self, r: usize, out: &mut [f32]) {
        let row = &self.data[r * self.cols..(r + 1) * self.cols];
        for (o, a) in out.iter_mut().zip(row) {
            *o = f32::from_bits(a.load(Ordering::Relaxed));
        }
    }

    #[inline]
    fn axpy(&self, r: usize, alpha: f32, x: &[f32], scratch: &mut [f32]) {
        self.read(r, scratch);
        kernels::axpy(alpha, x, scratch);
        let row = &self.data[r * self.cols..(r + 1) * self.cols];
        for (a, v) in row.iter().zip(scratch.iter()) {
            a.store(v.to_bits(), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<R: HogwildRows>() {
        let m = Matrix::from_vec(3, 4, (0..12).map(|x| x as f32).collect()).unwrap();
        let rows = R::from_matrix(m.clone());
        let mut s = vec![0.0; 4];
        rows.read(1, &mut s);
        assert_eq!(s, [4.0, 5.0, 6.0, 7.0]);
        rows.axpy(2, 0.5, &[2.0, 2.0, 2.0, 2.0], &mut s);
        let back = rows.to_matrix();
        assert_eq!(back.row(0), m.row(0));
        assert_eq!(back.row(2), [9.0, 10.0, 11.0, 12.0]);
    }

    #[test]
    fn both_memory_models_read_and_update_rows() {
        check::<RacyRows>();
        check::<AtomicRows>();
    }

    /// Threads updating disjoint rows never race: every update lands.
    fn disjoint_updates_all_land<R: HogwildRows>() {
        let rows = R::from_matrix(Matrix::zeros(8, 16));
        std::thread::scope(|s| {
            for t in 0..4 {
                let rows = &rows;
                s.spawn(move || {
                    let mut scratch = vec![0.0; 16];
                    for _ in 0..1000 {
                        rows.axpy(2 * t, 1.0, &[1.0; 16], &mut scratch);
                        rows.axpy(2 * t + 1, -1.0, &[1.0; 16], &mut scratch);
                    }
                });
            }
        });
        let m = rows.to_matrix();
        for r in 0..8 {
            let want = if r % 2 == 0 { 1000.0 } else { -1000.0 };
            assert!(m.row(r).iter().all(|&x| x == want), "row {r}: {:?}", m.row(r));
        }
    }

    #[test]
    fn disjoint_concurrent_updates_are_exact() {
        disjoint_updates_all_land::<RacyRows>();
        disjoint_updates_all_land::<AtomicRows>();
    }
}
