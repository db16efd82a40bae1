//! Rows of an f32 matrix that several threads read and update without locks (Hogwild!, Niu et
//! al. 2011), as word2vec, gensim and fastText do for their embedding tables.
//!
//! Two memory models, chosen by `model.skip_gram.hogwild`:
//! - [`AtomicRows`] (`"atomic"`, the default): every element is an `AtomicU32` holding the
//!   float's bits, accessed with relaxed ordering. Concurrent updates of one row can still be
//!   lost or interleave element by element (what Hogwild's analysis allows for), but there is
//!   no data race, so no undefined behaviour. Relaxed loads and stores compile to plain moves on
//!   x86; what they cost is that LLVM does not merge them into vector loads and stores. So the
//!   rows are worked on in blocks of [`BLOCK`] elements: loaded one by one into registers, the
//!   arithmetic done on the block, stored back one by one, and the operations the trainer
//!   needs are fused ([`HogwildRows::dot_step`]) so that each element is loaded twice and
//!   stored once per update.
//! - [`RacyRows`] (`"racy"`, opt-in): plain loads and stores through raw pointers, so the vector
//!   kernels run on the shared rows directly, as word2vec's C code does. Threads updating the
//!   same row race, which is a data race under Rust's memory model: undefined behaviour, that
//!   the compiler is allowed to assume never happens. It works in practice (the kernels compile
//!   to the same loads and stores as word2vec's), but nothing guarantees it will with another
//!   compiler version or target. Use it knowingly, for its speed.
//!
//! Both give bit-identical results with one thread (tested against a scalar reference).
//!
//! Atomic rows are the default because racy ones train only slightly faster, at the same
//! quality (see docs/decisions.md, "hogwild-variant").

use farout_core::{Matrix, kernels};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Elements [`AtomicRows`] works on at a time: the lanes of [`kernels::dot`], so that its dot
/// products sum in the same order and agree bit for bit with [`RacyRows`].
const BLOCK: usize = 8;
/// Atomic words of a block (two floats each).
const WORDS: usize = BLOCK / 2;

/// Rows shared by Hogwild threads.
///
/// Besides whole-row reads, it has the two updates of word2vec's inner loop, so each memory
/// model can do them in as few passes over the row as it allows: [`axpy`](Self::axpy) for the
/// input vector and [`dot_step`](Self::dot_step), which fuses the score, the gradient
/// accumulation and the update of an output vector. Rows have [`cols`](Self::cols) elements
/// and every slice passed in has that length.
pub trait HogwildRows: Sync + Send {
    /// A `rows x cols` table holding `m`, in `m`'s own memory where the layout allows (no copy).
    fn from_matrix(m: Matrix) -> Self;
    /// The table back as a matrix, in the same memory where it was taken over without a copy.
    fn into_matrix(self) -> Matrix;
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
    /// Starts loading row `r` into the caches (a hint, no effect on any value).
    fn prefetch(&self, r: usize);
    /// `row_r += alpha x`.
    fn axpy(&self, r: usize, alpha: f32, x: &[f32]);
    /// One negative-sampling step on output row `r` (see [`crate::sgns`]): `g = step(row_r .
    /// x)`, then `err += g row_r` and `row_r += g x` (both with the row before the update).
    /// The dot product sums as [`kernels::dot`] does.
    fn dot_step(&self, r: usize, x: &[f32], step: impl FnOnce(f32) -> f32, err: &mut [f32]);
}

/// `err += g row`, then `row += g x`, element by element (one pass; the vectoriser sees three
/// disjoint slices).
#[inline(always)]
fn step_in_place(g: f32, row: &mut [f32], x: &[f32], err: &mut [f32]) {
    for ((v, xi), e) in row.iter_mut().zip(x).zip(err.iter_mut()) {
        *e += g * *v;
        *v += g * xi;
    }
}

/// Hogwild rows with plain (racy) memory accesses; see the module docs.
pub struct RacyRows {
    data: Box<[UnsafeCell<f32>]>,
    cols: usize,
}

// SAFETY: it is not. Concurrent access is the point of this type, and threads updating the same
// row race: undefined behaviour under Rust's memory model, accepted for speed where the user
// opts in (module docs). No reference outlives a method call.
unsafe impl Sync for RacyRows {}

impl RacyRows {
    /// Row `r` as a slice.
    ///
    /// # Safety
    /// The caller accepts the data race of the module docs: other threads may write the row
    /// while the slice lives. Drop it before the method returns.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    unsafe fn row(&self, r: usize) -> &mut [f32] {
        let row = &self.data[r * self.cols..(r + 1) * self.cols];
        // SAFETY: in bounds (the slice above); UnsafeCell<f32> has f32's layout; aliasing as
        // the caller accepted.
        unsafe { std::slice::from_raw_parts_mut(UnsafeCell::raw_get(row.as_ptr()), self.cols) }
    }
}

impl HogwildRows for RacyRows {
    fn from_matrix(m: Matrix) -> Self {
        let cols = m.cols();
        let data = Box::into_raw(m.into_vec().into_boxed_slice());
        // SAFETY: UnsafeCell<f32> is repr(transparent) over f32: the same layout, so the box's
        // allocation is freed with the layout it was made with.
        Self { data: unsafe { Box::from_raw(data as *mut [UnsafeCell<f32>]) }, cols }
    }

    fn into_matrix(self) -> Matrix {
        let rows = self.rows();
        // SAFETY: as in `from_matrix`, the other way; `self` is consumed, so nothing shares it.
        let data = unsafe { Box::from_raw(Box::into_raw(self.data) as *mut [f32]) };
        Matrix::from_vec(rows, self.cols, data.into_vec()).expect("rows x cols values")
    }

    fn rows(&self) -> usize {
        self.data.len() / self.cols.max(1)
    }

    fn cols(&self) -> usize {
        self.cols
    }

    #[inline]
    fn read(&self, r: usize, out: &mut [f32]) {
        // SAFETY: races accepted (module docs); the slice lives for this call only.
        out.copy_from_slice(unsafe { self.row(r) });
    }

    #[inline]
    fn prefetch(&self, r: usize) {
        kernels::prefetch(&self.data[r * self.cols..(r + 1) * self.cols]);
    }

    #[inline]
    fn axpy(&self, r: usize, alpha: f32, x: &[f32]) {
        // SAFETY: as in `read`.
        kernels::axpy(alpha, x, unsafe { self.row(r) });
    }

    #[inline]
    fn dot_step(&self, r: usize, x: &[f32], step: impl FnOnce(f32) -> f32, err: &mut [f32]) {
        // SAFETY: as in `read`.
        let row = unsafe { self.row(r) };
        let g = step(kernels::dot(row, x));
        step_in_place(g, row, x, err);
    }
}

/// Hogwild rows of relaxed atomics, two floats to an `AtomicU64`; see the module docs.
pub struct AtomicRows {
    /// Row `r` is `words()[r * stride..(r + 1) * stride]`; an odd row ends in a padding float.
    data: Words,
    rows: usize,
    cols: usize,
    stride: usize,
}

/// Where [`AtomicRows`] keeps its words.
enum Words {
    /// The matrix's own buffer, its floats read in pairs: rows of even length in memory that is
    /// 8-byte aligned (what the system allocator returns). `cap` is the buffer's capacity in
    /// floats, to give it back as the `Vec<f32>` it was.
    InPlace { ptr: std::ptr::NonNull<AtomicU64>, len: usize, cap: usize },
    /// A copy, each odd row padded to a whole number of words.
    Padded(Box<[AtomicU64]>),
}

// SAFETY: `InPlace` owns its buffer as a `Vec<f32>` would, and only ever hands out `&[AtomicU64]`,
// which is Send and Sync.
unsafe impl Send for Words {}
// SAFETY: as above.
unsafe impl Sync for Words {}

impl Words {
    #[inline]
    fn as_slice(&self) -> &[AtomicU64] {
        match self {
            // SAFETY: `ptr` points at `len` initialised, 8-byte aligned words owned by `self`.
            Words::InPlace { ptr, len, .. } => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), *len) },
            Words::Padded(words) => words,
        }
    }

    /// The buffer of `InPlace` back as the vector it was (`None` for `Padded`, which is dropped).
    fn into_vec(self) -> Option<Vec<f32>> {
        let Words::InPlace { ptr, len, cap } = self else { return None };
        std::mem::forget(self);
        // SAFETY: the vector's own pointer, length and capacity (`from_matrix`); `self` is
        // forgotten, so the buffer is freed once, as a Vec<f32>.
        Some(unsafe { Vec::from_raw_parts(ptr.as_ptr().cast(), 2 * len, cap) })
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        if let Words::InPlace { ptr, len, cap } = *self {
            // SAFETY: as in `into_vec` (which does not run this).
            drop(unsafe { Vec::from_raw_parts(ptr.as_ptr().cast::<f32>(), 2 * len, cap) });
        }
    }
}

/// The two floats of a word: the low half first.
#[inline(always)]
fn split(w: u64) -> [f32; 2] {
    [f32::from_bits(w as u32), f32::from_bits((w >> 32) as u32)]
}

/// [`split`]'s inverse.
#[inline(always)]
fn join(v: [f32; 2]) -> u64 {
    v[0].to_bits() as u64 | (v[1].to_bits() as u64) << 32
}

impl AtomicRows {
    #[inline]
    fn row(&self, r: usize) -> &[AtomicU64] {
        &self.data.as_slice()[r * self.stride..(r + 1) * self.stride]
    }

    /// Row `r` as `n` whole blocks and the words after them (with a padding float, an odd row
    /// ending in 7 floats mod 8 fills a last block that `x` does not have).
    #[inline]
    fn blocks(&self, r: usize, n: usize) -> (&[[AtomicU64; WORDS]], &[AtomicU64]) {
        let (blocks, tail) = self.row(r).split_at(n * WORDS);
        (blocks.as_chunks::<WORDS>().0, tail)
    }

    /// Whether the rows live in the matrix's own memory (no copy was made).
    pub fn in_place(&self) -> bool {
        matches!(self.data, Words::InPlace { .. })
    }
}

impl HogwildRows for AtomicRows {
    fn from_matrix(m: Matrix) -> Self {
        let (rows, cols) = (m.rows(), m.cols());
        let stride = cols.div_ceil(2);
        let aligned = (m.as_slice().as_ptr() as usize).is_multiple_of(align_of::<AtomicU64>());
        // `join` puts the first float in the low half: the little-endian layout of the pair.
        if cols.is_multiple_of(2) && cfg!(target_endian = "little") && aligned && !m.as_slice().is_empty() {
            let mut v = std::mem::ManuallyDrop::new(m.into_vec());
            let ptr = std::ptr::NonNull::new(v.as_mut_ptr().cast::<AtomicU64>()).expect("a vector's pointer");
            return Self { data: Words::InPlace { ptr, len: v.len() / 2, cap: v.capacity() }, rows, cols, stride };
        }
        let mut data = Vec::with_capacity(rows * stride);
        for row in m.iter_rows() {
            data.extend(row.chunks(2).map(|p| AtomicU64::new(join([p[0], p.get(1).copied().unwrap_or(0.0)]))));
        }
        Self { data: Words::Padded(data.into()), rows, cols, stride }
    }

    fn into_matrix(self) -> Matrix {
        if !self.in_place() {
            return self.to_matrix();
        }
        let (rows, cols) = (self.rows, self.cols);
        let v = self.data.into_vec().expect("in place");
        Matrix::from_vec(rows, cols, v).expect("rows x cols values")
    }

    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    #[inline]
    fn read(&self, r: usize, out: &mut [f32]) {
        debug_assert_eq!(out.len(), self.cols);
        let row = self.row(r);
        let (pairs, last) = out.as_chunks_mut::<2>();
        for (o, w) in pairs.iter_mut().zip(row) {
            *o = split(w.load(Relaxed));
        }
        if let ([o], Some(w)) = (last, row.last()) {
            *o = split(w.load(Relaxed))[0];
        }
    }

    #[inline]
    fn prefetch(&self, r: usize) {
        kernels::prefetch(self.row(r));
    }

    #[inline]
    fn axpy(&self, r: usize, alpha: f32, x: &[f32]) {
        debug_assert_eq!(x.len(), self.cols);
        let (xb, xt) = x.as_chunks::<BLOCK>();
        let (blocks, tail) = self.blocks(r, xb.len());
        blocks::best::axpy(alpha, blocks, xb);
        for (w, x) in tail.iter().zip(xt.chunks(2)) {
            let mut v = split(w.load(Relaxed));
            kernels::axpy(alpha, x, &mut v[..x.len()]);
            w.store(join(v), Relaxed);
        }
    }

    #[inline]
    fn dot_step(&self, r: usize, x: &[f32], step: impl FnOnce(f32) -> f32, err: &mut [f32]) {
        debug_assert!(x.len() == self.cols && err.len() == self.cols);
        let (xb, xt) = x.as_chunks::<BLOCK>();
        let (blocks, tail) = self.blocks(r, xb.len());
        let (eb, et) = err.as_chunks_mut::<BLOCK>();
        // The dot product as `kernels::dot` sums it: lane by lane, then the lanes, then the tail.
        let acc = blocks::best::dot(blocks, xb);
        let mut t = 0.0;
        for (w, x) in tail.iter().zip(xt.chunks(2)) {
            for (v, x) in split(w.load(Relaxed)).iter().zip(x) {
                t += v * x;
            }
        }
        let g = step(acc.iter().sum::<f32>() + t);
        // The update reloads the row rather than keeping the first pass's copy: as in word2vec,
        // it starts from the row as it is now, which loses fewer concurrent updates.
        blocks::best::step(g, blocks, xb, eb);
        for ((w, x), e) in tail.iter().zip(xt.chunks(2)).zip(et.chunks_mut(2)) {
            let mut v = split(w.load(Relaxed));
            step_in_place(g, &mut v[..x.len()], x, e);
            w.store(join(v), Relaxed);
        }
    }
}

/// [`AtomicRows`]' work on whole blocks: [`BLOCK`] floats in [`WORDS`] atomic words. `best`
/// is what the target has: SSE2 on x86-64, else the portable code. Both do the same float
/// operations in the same order, so they agree bit for bit (tested).
mod blocks {
    use super::{BLOCK, WORDS, join, split, step_in_place};
    use farout_core::kernels;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    pub use sse2 as best;

    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    pub use portable as best;

    /// Element-wise code; LLVM vectorises the arithmetic and moves the words through general
    /// registers.
    #[cfg_attr(all(target_arch = "x86_64", target_feature = "sse2"), allow(dead_code))]
    pub mod portable {
        use super::*;

        #[inline(always)]
        fn load(a: &[AtomicU64; WORDS]) -> [f32; BLOCK] {
            let w = a.each_ref().map(|w| w.load(Relaxed));
            std::array::from_fn(|l| split(w[l / 2])[l % 2])
        }

        #[inline(always)]
        fn store(a: &[AtomicU64; WORDS], v: &[f32; BLOCK]) {
            for (w, v) in a.iter().zip(v.as_chunks::<2>().0) {
                w.store(join(*v), Relaxed);
            }
        }

        /// The lane sums of `kernels::dot` over the blocks.
        #[inline(always)]
        pub fn dot(a: &[[AtomicU64; WORDS]], x: &[[f32; BLOCK]]) -> [f32; BLOCK] {
            let mut acc = [0.0f32; BLOCK];
            for (a, x) in a.iter().zip(x) {
                let v = load(a);
                for l in 0..BLOCK {
                    acc[l] += v[l] * x[l];
                }
            }
            acc
        }

        /// `err += g row`, `row += g x`.
        #[inline(always)]
        pub fn step(g: f32, a: &[[AtomicU64; WORDS]], x: &[[f32; BLOCK]], err: &mut [[f32; BLOCK]]) {
            for ((a, x), e) in a.iter().zip(x).zip(err) {
                let mut v = load(a);
                step_in_place(g, &mut v, x, e);
                store(a, &v);
            }
        }

        /// `row += alpha x`.
        #[inline(always)]
        pub fn axpy(alpha: f32, a: &[[AtomicU64; WORDS]], x: &[[f32; BLOCK]]) {
            for (a, x) in a.iter().zip(x) {
                let mut v = load(a);
                kernels::axpy(alpha, x, &mut v);
                store(a, &v);
            }
        }
    }

    /// The same with explicit SSE2, half a block per register. LLVM neither turns the relaxed
    /// loads into vector loads nor vectorises the row's update in the portable code (it
    /// updates the floats one by one between the words' halves); here each word goes through
    /// a general register once each way, the arithmetic is 4-wide, and there are half as many
    /// atomic accesses as with one float per atomic. Multiplies and adds stay separate (no
    /// fused multiply-add), as in the portable code.
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    pub mod sse2 {
        use super::*;
        use std::arch::x86_64::*;

        /// Floats `4h..4h + 4` of a block.
        #[inline(always)]
        fn load(a: &[AtomicU64; WORDS], h: usize) -> __m128 {
            let (lo, hi) = (a[2 * h].load(Relaxed), a[2 * h + 1].load(Relaxed));
            // SAFETY: SSE2 is enabled (cfg). Lane 0 is the low half of `lo`, as in `split`.
            unsafe { _mm_castsi128_ps(_mm_set_epi64x(hi as i64, lo as i64)) }
        }

        #[inline(always)]
        fn store(a: &[AtomicU64; WORDS], h: usize, v: __m128) {
            // SAFETY: SSE2 is enabled (cfg).
            let (lo, hi) = unsafe {
                let v = _mm_castps_si128(v);
                (_mm_cvtsi128_si64(v), _mm_cvtsi128_si64(_mm_unpackhi_epi64(v, v)))
            };
            a[2 * h].store(lo as u64, Relaxed);
            a[2 * h + 1].store(hi as u64, Relaxed);
        }

        #[inline(always)]
        fn get(x: &[f32; BLOCK], h: usize) -> __m128 {
            // SAFETY: SSE2 is enabled (cfg); floats 4h..4h + 4 <= 8 are in the block.
            unsafe { _mm_loadu_ps(x[4 * h..].as_ptr()) }
        }

        #[inline(always)]
        fn put(x: &mut [f32; BLOCK], h: usize, v: __m128) {
            // SAFETY: as in `get`.
            unsafe { _mm_storeu_ps(x[4 * h..].as_mut_ptr(), v) }
        }

        /// See [`portable::dot`](super::portable::dot).
        #[inline(always)]
        pub fn dot(a: &[[AtomicU64; WORDS]], x: &[[f32; BLOCK]]) -> [f32; BLOCK] {
            // SAFETY: SSE2 is enabled (cfg).
            unsafe {
                let mut acc = [_mm_setzero_ps(); 2];
                for (a, x) in a.iter().zip(x) {
                    for (h, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm_add_ps(*acc, _mm_mul_ps(load(a, h), get(x, h)));
                    }
                }
                let mut out = [0.0; BLOCK];
                for (h, acc) in acc.into_iter().enumerate() {
                    put(&mut out, h, acc);
                }
                out
            }
        }

        /// See [`portable::step`](super::portable::step).
        #[inline(always)]
        pub fn step(g: f32, a: &[[AtomicU64; WORDS]], x: &[[f32; BLOCK]], err: &mut [[f32; BLOCK]]) {
            // SAFETY: SSE2 is enabled (cfg).
            unsafe {
                let g = _mm_set1_ps(g);
                for ((a, x), e) in a.iter().zip(x).zip(err) {
                    for h in 0..2 {
                        let v = load(a, h);
                        put(e, h, _mm_add_ps(get(e, h), _mm_mul_ps(g, v)));
                        store(a, h, _mm_add_ps(v, _mm_mul_ps(g, get(x, h))));
                    }
                }
            }
        }

        /// See [`portable::axpy`](super::portable::axpy).
        #[inline(always)]
        pub fn axpy(alpha: f32, a: &[[AtomicU64; WORDS]], x: &[[f32; BLOCK]]) {
            // SAFETY: SSE2 is enabled (cfg).
            unsafe {
                let alpha = _mm_set1_ps(alpha);
                for (a, x) in a.iter().zip(x) {
                    for h in 0..2 {
                        store(a, h, _mm_add_ps(load(a, h), _mm_mul_ps(alpha, get(x, h))));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_core::rng::{self, RngExt};

    /// The scalar reference: a plain matrix, element by element (the dot product by
    /// `kernels::dot`, whose summation order the types promise).
    struct Reference(Matrix);

    impl Reference {
        fn axpy(&mut self, r: usize, alpha: f32, x: &[f32]) {
            for (y, x) in self.0.row_mut(r).iter_mut().zip(x) {
                *y += alpha * x;
            }
        }

        fn dot_step(&mut self, r: usize, x: &[f32], step: impl FnOnce(f32) -> f32, err: &mut [f32]) {
            let g = step(kernels::dot(self.0.row(r), x));
            for ((y, x), e) in self.0.row_mut(r).iter_mut().zip(x).zip(err) {
                *e += g * *y;
                *y += g * x;
            }
        }
    }

    fn random(n: usize, rng: &mut farout_core::Rng) -> Vec<f32> {
        (0..n).map(|_| 2.0 * rng.random::<f32>() - 1.0).collect()
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|x| x.to_bits()).collect()
    }

    /// A random sequence of reads, axpys and dot steps on `R` and on the reference; every read,
    /// score, gradient and the final table agree bit for bit.
    fn matches_the_reference<R: HogwildRows>(cols: usize) {
        let mut rng = rng::seeded(7, cols as u64);
        let rows = 5;
        let m = Matrix::from_vec(rows, cols, random(rows * cols, &mut rng)).unwrap();
        let (shared, mut reference) = (R::from_matrix(m.clone()), Reference(m));
        assert_eq!((shared.rows(), shared.cols()), (rows, cols));
        let (mut out, mut err, mut want_err) = (vec![0.0; cols], random(cols, &mut rng), vec![0.0; cols]);
        want_err.copy_from_slice(&err);
        for i in 0..200 {
            let r = rng.random_range(0..rows);
            let x = random(cols, &mut rng);
            let alpha = 2.0 * rng.random::<f32>() - 1.0;
            match i % 3 {
                0 => {
                    shared.read(r, &mut out);
                    assert_eq!(bits(&out), bits(reference.0.row(r)), "read {i}");
                }
                1 => {
                    shared.axpy(r, alpha, &x);
                    reference.axpy(r, alpha, &x);
                }
                _ => {
                    // A step that depends non-linearly on the score, as the trainer's does.
                    let step = |f: f32| alpha * (1.0 / (1.0 + (-f).exp()));
                    let (mut got, mut want) = (f32::NAN, f32::NAN);
                    let (on_shared, on_reference) = (
                        |f| {
                            got = f;
                            step(f)
                        },
                        |f| {
                            want = f;
                            step(f)
                        },
                    );
                    shared.dot_step(r, &x, on_shared, &mut err);
                    reference.dot_step(r, &x, on_reference, &mut want_err);
                    assert_eq!(got.to_bits(), want.to_bits(), "score {i}");
                    assert_eq!(bits(&err), bits(&want_err), "gradient {i}");
                }
            }
        }
        let back = shared.to_matrix();
        assert_eq!(bits(back.as_slice()), bits(reference.0.as_slice()));
        let back = shared.into_matrix();
        assert_eq!((back.rows(), back.cols()), (rows, cols));
        assert_eq!(bits(back.as_slice()), bits(reference.0.as_slice()));
    }

    /// Rows taken over and handed back keep the matrix's memory: no copy, for racy rows always,
    /// for atomic rows with rows of even length (the system allocator aligns to 16 bytes).
    #[test]
    fn tables_are_shared_in_place() {
        for cols in [4, 100, 7] {
            let m = Matrix::from_vec(3, cols, (0..3 * cols).map(|x| x as f32).collect()).unwrap();
            let ptr = m.as_slice().as_ptr();
            let copy = m.clone();
            let copy_ptr = copy.as_slice().as_ptr();
            let racy = RacyRows::from_matrix(copy);
            racy.axpy(1, 1.0, &vec![0.5; cols]);
            let back = racy.into_matrix();
            let mut want = m.clone();
            want.row_mut(1).iter_mut().for_each(|x| *x += 0.5);
            assert_eq!(back, want);
            assert_eq!(back.as_slice().as_ptr(), copy_ptr);
            let atomic = AtomicRows::from_matrix(m);
            #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
            assert_eq!(atomic.in_place(), cols % 2 == 0, "{cols}");
            let in_place = atomic.in_place();
            atomic.axpy(1, 1.0, &vec![0.5; cols]);
            let back = atomic.into_matrix();
            assert_eq!(back, want);
            assert_eq!(back.as_slice().as_ptr() == ptr, in_place, "{cols}");
        }
    }

    #[test]
    fn both_memory_models_match_the_scalar_reference_bit_for_bit() {
        // Whole blocks, tails only, both, and odd rows (with a padding float).
        for cols in [1, 2, 3, 7, 8, 15, 16, 21, 100, 301] {
            matches_the_reference::<RacyRows>(cols);
            matches_the_reference::<AtomicRows>(cols);
        }
    }

    /// The SSE2 block kernels against the portable ones (the reference test above runs only
    /// the kernels the target has).
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    #[test]
    fn sse2_blocks_match_the_portable_ones_bit_for_bit() {
        let mut rng = rng::seeded(8, 0);
        let n = 13;
        let new = |v: &[f32]| -> Vec<[AtomicU64; WORDS]> {
            v.as_chunks::<BLOCK>()
                .0
                .iter()
                .map(|b| std::array::from_fn(|k| AtomicU64::new(join([b[2 * k], b[2 * k + 1]]))))
                .collect()
        };
        let floats = |a: &[[AtomicU64; WORDS]]| -> Vec<u32> {
            a.iter().flatten().flat_map(|w| split(w.load(Relaxed))).map(f32::to_bits).collect()
        };
        let row = random(n * BLOCK, &mut rng);
        let (a, b) = (new(&row), new(&row));
        let x = random(n * BLOCK, &mut rng);
        let xb = x.as_chunks::<BLOCK>().0;
        for i in 0..20 {
            let g = 2.0 * rng.random::<f32>() - 1.0;
            assert_eq!(bits(&blocks::sse2::dot(&a, xb)), bits(&blocks::portable::dot(&b, xb)), "dot {i}");
            if i % 2 == 0 {
                blocks::sse2::axpy(g, &a, xb);
                blocks::portable::axpy(g, &b, xb);
            } else {
                let mut e = random(n * BLOCK, &mut rng);
                let mut f = e.clone();
                blocks::sse2::step(g, &a, xb, e.as_chunks_mut::<BLOCK>().0);
                blocks::portable::step(g, &b, xb, f.as_chunks_mut::<BLOCK>().0);
                assert_eq!(bits(&e), bits(&f), "gradient {i}");
            }
            assert_eq!(floats(&a), floats(&b), "rows {i}");
        }
    }

    #[test]
    fn both_memory_models_read_and_update_rows() {
        fn check<R: HogwildRows>() {
            let m = Matrix::from_vec(3, 4, (0..12).map(|x| x as f32).collect()).unwrap();
            let rows = R::from_matrix(m.clone());
            let mut s = vec![0.0; 4];
            rows.read(1, &mut s);
            assert_eq!(s, [4.0, 5.0, 6.0, 7.0]);
            rows.axpy(2, 0.5, &[2.0, 2.0, 2.0, 2.0]);
            let mut err = vec![0.0; 4];
            // Row 0 . 1 = 6, so g = 3: err = 3 row 0, row 0 += 3.
            rows.dot_step(0, &[1.0; 4], |f| f / 2.0, &mut err);
            assert_eq!(err, [0.0, 3.0, 6.0, 9.0]);
            let back = rows.to_matrix();
            assert_eq!(back.row(0), [3.0, 4.0, 5.0, 6.0]);
            assert_eq!(back.row(1), m.row(1));
            assert_eq!(back.row(2), [9.0, 10.0, 11.0, 12.0]);
        }
        check::<RacyRows>();
        check::<AtomicRows>();
    }

    /// Threads updating disjoint rows never race: every update lands, as with one thread.
    fn disjoint_updates_all_land<R: HogwildRows>() {
        let cols = 21;
        let rows = R::from_matrix(Matrix::zeros(8, cols));
        std::thread::scope(|s| {
            for t in 0..4 {
                let rows = &rows;
                s.spawn(move || {
                    let mut err = vec![0.0; cols];
                    for _ in 0..1000 {
                        rows.axpy(2 * t, 1.0, &vec![1.0; cols]);
                        rows.dot_step(2 * t + 1, &vec![1.0; cols], |_| -1.0, &mut err);
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

    /// Threads hammering the same rows (the Hogwild case): updates may be lost, but every
    /// element ends up a sum of some of them, and nothing tears a float.
    #[test]
    fn shared_atomic_rows_lose_updates_but_never_tear() {
        let (cols, n_threads, steps) = (101, 4, 20_000);
        let rows = AtomicRows::from_matrix(Matrix::zeros(2, cols));
        std::thread::scope(|s| {
            for _ in 0..n_threads {
                let rows = &rows;
                s.spawn(move || {
                    let (ones, mut err, mut out) = (vec![1.0; cols], vec![0.0; cols], vec![0.0; cols]);
                    for i in 0..steps {
                        rows.axpy(i % 2, 1.0, &ones);
                        rows.dot_step(1 - i % 2, &ones, |_| 1.0, &mut err);
                        rows.read(i % 2, &mut out);
                        assert!(out.iter().all(|x| x.fract() == 0.0 && (0.0..=(n_threads * steps) as f32).contains(x)));
                    }
                });
            }
        });
        let m = rows.to_matrix();
        assert!(m.as_slice().iter().all(|&x| x.fract() == 0.0 && x >= 1.0 && x <= (n_threads * steps) as f32));
    }
}
