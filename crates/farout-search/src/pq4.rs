//! 4-bit product-quantisation fast scan: the scan of one query over [`SphericalIndex`]'s
//! clusters with `scoring = "pq4"`, on a quarter of the bytes of int8 codes.
//!
//! **Codes.** A row `w` of cluster `j` is coded as its residual `r = w - mu_j` from the
//! cluster's mean: each dimension `s` of `r` is replaced by the nearest of 16 levels of that
//! dimension ([`Codebook`], fitted by one-dimensional k-means on a sample of all clusters'
//! residuals): 4 bits a dimension, so at D = 128 a row is 64 bytes, against 128 bytes of int8
//! codes. A dimension is a product-quantisation sub-space of one value; with 16 sorted levels
//! the nearest is found by four comparisons with the midpoints, which keeps coding the rows a
//! training step changed cheap. Then
//!
//! ```text
//! w . q  ~  mu_j . q + sum_s t_s[c_s(w)],   t_s[c] = q_s level_s[c]
//! ```
//!
//! with one table of 16 values per dimension for the query, shared by every cluster (the
//! residuals share the codebook), and `mu_j . q` one dot product per probed cluster.
//!
//! **Tables in registers.** The tables are quantised to bytes ([`Tables`]): each sub-space's
//! 16 values less their minimum `b_m`, in steps `delta` common to all sub-spaces
//! (`u_m[c] = round((t_m[c] - b_m) / delta)`), so that
//!
//! ```text
//! sum_m t_m[c_m]  ~  sum_m b_m + delta sum_m u_m[c_m]
//! ```
//!
//! with an integer sum: each `u` is at most `top = min(127, 65,535 / m)`, so two sub-spaces'
//! values sum within a byte and all `m` within a 16-bit lane. A table of 16 bytes is one
//! 128-bit lane, and `vpshufb` looks up 16 (AVX2: 32, AVX-512: 64) codes in one instruction,
//! each lane in its own table. (127 levels rather than 255 moved recall by at most 0.0002 where
//! measured, and the byte sums make the kernel about a sixth faster on codes in cache:
//! docs/decisions.md, "pq4-byte-sums".)
//!
//! **Layout.** Rows come in blocks of [`BLOCK`] = 32. For each pair of sub-spaces `(2p,
//! 2p + 1)` a block holds 32 bytes: byte `b < 16` holds the code of row `b` in sub-space `2p`
//! (low nibble) and of row `b + 16` (high nibble), bytes `16 + b` the same for sub-space
//! `2p + 1`. One 256-bit load is then two 128-bit lanes, one per sub-space, matching a register
//! holding the two sub-spaces' tables: the low nibbles look up rows 0-15, the high nibbles rows
//! 16-31. The bytes looked up from two loads (the next sub-spaces, the same rows) are first
//! added as bytes, then summed in 16-bit lanes without unpacking: adding the register as
//! 16-bit values adds `u_even + 256 u_odd` (pairs of neighbouring rows), adding it shifted
//! right by 8 adds `u_odd` alone, and at the end `sum_even = sum_1 - 256 sum_2` (mod 2^16,
//! exact since the true sums fit 16 bits).
//!
//! Every kernel computes the same integers and the same float operations as the portable
//! [`scores_scalar`] (a test checks every kernel the CPU has).
//!
//! [`SphericalIndex`]: crate::SphericalIndex

use crate::ReserveByEighths;
use farout_core::hugepages::{HugeVec, huge_vec};
use farout_core::rng::{self, RngExt};

/// Levels per dimension (4 bits).
const WORDS: usize = 16;
/// Rows per block of the layout.
pub const BLOCK: usize = 32;
/// Sub-spaces (dimensions) are padded to a multiple of this (two pairs: one 512-bit load).
const SUB_ALIGN: usize = 4;
/// Rows of residuals the codebook is fitted on, at most (16 levels of one dimension need few).
pub const TRAIN_ROWS: usize = 16_384;
/// Lloyd iterations of each dimension's k-means.
const TRAIN_ITERATIONS: usize = 10;

/// Sub-spaces for rows of `dim` values (one a dimension, padded to [`SUB_ALIGN`]).
fn sub_spaces(dim: usize) -> usize {
    dim.next_multiple_of(SUB_ALIGN).max(SUB_ALIGN)
}

/// The 16 levels of every dimension, ascending (see the module docs); the padding sub-spaces
/// past the dimension have all-zero levels.
#[derive(Clone, Debug, PartialEq)]
pub struct Codebook {
    dim: usize,
    /// `m x 16`: level `c` of dimension `s` at `s * 16 + c`, ascending in `c`.
    levels: Vec<f32>,
    /// `m x 16`: the midpoints between neighbouring levels, then `+inf`: the code of `x` is
    /// the number of midpoints below it.
    mids: Vec<f32>,
}

impl Codebook {
    /// Fits the levels of every dimension by k-means on (a seeded sample of at most
    /// [`TRAIN_ROWS`] of) the rows of `residuals` (`n x dim`, row-major).
    pub fn fit(residuals: &[f32], dim: usize, seed: u64) -> Self {
        use rayon::prelude::*;
        let n = residuals.len() / dim.max(1);
        let mut r = rng::seeded(seed, 0x9b4);
        let sample: Vec<usize> =
            if n <= TRAIN_ROWS { (0..n).collect() } else { (0..TRAIN_ROWS).map(|_| r.random_range(0..n)).collect() };
        let mut levels = vec![0.0f32; sub_spaces(dim) * WORDS];
        levels.par_chunks_mut(WORDS).take(dim).enumerate().for_each(|(s, levels)| {
            let points: Vec<f32> = sample.iter().map(|&i| residuals[i * dim + s]).collect();
            kmeans_1d(&points, levels, &mut rng::seeded(seed, s as u64));
        });
        Self::from_levels(dim, levels).expect("k-means of finite residuals gives finite levels")
    }

    /// The codebook of rows of `dim` values with these levels (as [`Codebook::levels`] gives
    /// them); `None` unless they are as many as `dim` needs, finite and ascending per
    /// dimension.
    pub fn from_levels(dim: usize, mut levels: Vec<f32>) -> Option<Self> {
        if levels.len() != sub_spaces(dim) * WORDS || !levels.iter().all(|x| x.is_finite()) {
            return None;
        }
        levels.chunks_exact_mut(WORDS).for_each(|l| l.sort_unstable_by(f32::total_cmp));
        let mut mids = Vec::with_capacity(levels.len());
        for l in levels.chunks_exact(WORDS) {
            mids.extend(l.windows(2).map(|p| p[0] + 0.5 * (p[1] - p[0])));
            mids.push(f32::INFINITY);
        }
        Some(Self { dim, levels, mids })
    }

    /// The levels: `m x 16`, level `c` of dimension `s` at `s * 16 + c`, ascending.
    pub fn levels(&self) -> &[f32] {
        &self.levels
    }

    /// The code of dimension `s` of `x - mean` (both of length `dim`; 0 for a padding
    /// sub-space): the nearest level, by a binary search of the midpoints (ties go to the
    /// lower level).
    #[inline]
    pub fn code_of(&self, s: usize, x: &[f32], mean: &[f32]) -> u8 {
        if s >= self.dim {
            return 0;
        }
        let (r, mids) = (x[s] - mean[s], &self.mids[s * WORDS..(s + 1) * WORDS]);
        let mut c = 0;
        for step in [8, 4, 2, 1] {
            c += step * (r > mids[c + step - 1]) as usize;
        }
        c as u8
    }

    /// Sub-spaces (dimensions, padded).
    pub fn sub_spaces(&self) -> usize {
        self.levels.len() / WORDS
    }
}

/// Lloyd's k-means of the values `points` into the 16 `levels`, started from spread quantiles
/// of a seeded shuffle (an empty level takes a random point).
fn kmeans_1d(points: &[f32], levels: &mut [f32], r: &mut rng::Rng) {
    let n = points.len();
    if n == 0 {
        return;
    }
    for (c, level) in levels.iter_mut().enumerate() {
        let i = if n >= WORDS { (c * n / WORDS + r.random_range(0..n / WORDS)) % n } else { c % n };
        *level = points[i];
    }
    for _ in 0..TRAIN_ITERATIONS {
        let (mut sums, mut counts) = ([0.0f64; WORDS], [0usize; WORDS]);
        for &x in points {
            let c = nearest(levels, x);
            counts[c] += 1;
            sums[c] += x as f64;
        }
        for c in 0..WORDS {
            levels[c] = if counts[c] == 0 { points[r.random_range(0..n)] } else { (sums[c] / counts[c] as f64) as f32 };
        }
    }
}

/// The level of `levels` nearest to `x`.
fn nearest(levels: &[f32], x: f32) -> usize {
    let mut best = (f32::INFINITY, 0);
    for (c, &l) in levels.iter().enumerate() {
        if (l - x).abs() < best.0 {
            best = ((l - x).abs(), c);
        }
    }
    best.1
}

/// The 4-bit codes of a growing and changing set of rows (see the module docs), addressed by
/// position `0..len()`, in huge pages shared with other code buffers ([`HugeVec`]).
#[derive(Clone, Debug)]
pub struct Pq4Rows {
    /// Sub-spaces (a multiple of [`SUB_ALIGN`]).
    m: usize,
    len: usize,
    /// `ceil(len / 32)` blocks of `m / 2` pairs of 32 bytes.
    codes: HugeVec<u8>,
}

impl Pq4Rows {
    /// No rows yet, of `m` sub-spaces ([`Codebook::sub_spaces`]).
    pub fn new(m: usize) -> Self {
        debug_assert!(m.is_multiple_of(SUB_ALIGN));
        Self { m, len: 0, codes: huge_vec(0) }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rows including the padding of the last block: the length of [`scores`]'s output.
    pub fn padded_len(&self) -> usize {
        self.codes.len() / self.block_bytes() * BLOCK
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.codes.capacity()
    }

    fn block_bytes(&self) -> usize {
        self.m / 2 * BLOCK
    }

    /// Appends a row's codes (`m` of them, each below 16).
    pub fn push(&mut self, codes: &[u8]) {
        assert_eq!(codes.len(), self.m, "codes of {} sub-spaces for {}", codes.len(), self.m);
        self.push_with(|s| codes[s]);
    }

    /// Overwrites row `at` with `codes`.
    pub fn set(&mut self, at: usize, codes: &[u8]) {
        assert_eq!(codes.len(), self.m, "codes of {} sub-spaces for {}", codes.len(), self.m);
        self.set_with(at, |s| codes[s]);
    }

    /// Overwrites row `at` with the codes `code(s)` of its sub-spaces `s` (each below 16).
    pub fn set_with(&mut self, at: usize, code: impl Fn(usize) -> u8) {
        assert!(at < self.len, "row {at} of {}", self.len);
        for s in 0..self.m {
            let (byte, high) = self.place(at, s);
            let (old, c) = (self.codes[byte], code(s) & 0x0f);
            self.codes[byte] = if high { (old & 0x0f) | c << 4 } else { (old & 0xf0) | c };
        }
    }

    /// Appends a row by its codes `code(s)`.
    pub fn push_with(&mut self, code: impl Fn(usize) -> u8) {
        if self.len == self.padded_len() {
            let block = self.block_bytes();
            self.codes.reserve_by_eighths(block);
            self.codes.resize(self.codes.len() + block, 0);
        }
        self.len += 1;
        self.set_with(self.len - 1, code);
    }

    /// The code of row `at` in sub-space `s`.
    pub fn code(&self, at: usize, s: usize) -> u8 {
        let (byte, high) = self.place(at, s);
        if high { self.codes[byte] >> 4 } else { self.codes[byte] & 0x0f }
    }

    /// Removes row `at` by moving the last row into its place (the others keep their places).
    pub fn swap_remove(&mut self, at: usize) {
        assert!(at < self.len, "row {at} of {}", self.len);
        let last = self.len - 1;
        for s in 0..self.m {
            let c = self.code(last, s);
            let (byte, high) = self.place(at, s);
            let old = self.codes[byte];
            self.codes[byte] = if high { (old & 0x0f) | c << 4 } else { (old & 0xf0) | c };
        }
        self.set_with(last, |_| 0);
        self.len = last;
        if self.padded_len() - self.len >= BLOCK {
            self.codes.truncate(self.codes.len() - self.block_bytes());
        }
    }

    /// The byte holding row `at`'s code of sub-space `s`, and whether it is the high nibble.
    fn place(&self, at: usize, s: usize) -> (usize, bool) {
        let (block, r) = (at / BLOCK, at % BLOCK);
        let byte = block * self.block_bytes() + (s / 2) * BLOCK + (s % 2) * 16 + r % 16;
        (byte, r >= 16)
    }
}

/// A query's tables quantised to bytes (see the module docs): `u_m[c]` at `m * 16 + c`, and
/// `sum_m t_m[c_m] ~ bias + delta sum_m u_m[c_m]`.
#[derive(Clone, Debug, Default)]
pub struct Tables {
    bytes: Vec<u8>,
    bias: f32,
    delta: f32,
    /// Every sub-space's `b_m`.
    lows: Vec<f32>,
}

impl Tables {
    /// Fills the tables of `query` (length `dim`) for `book`.
    pub fn fill(&mut self, book: &Codebook, query: &[f32]) {
        let m = book.sub_spaces();
        // The largest sum of bytes a 16-bit lane can hold, spread over the sub-spaces, and
        // at most 127, so that the kernels can add two sub-spaces' bytes as bytes.
        let top = (u16::MAX as usize / m).min(i8::MAX as usize) as f32;
        let q = |s: usize| query.get(s).copied().unwrap_or(0.0);
        // The levels ascend, so each table's extremes are at its ends.
        self.lows.clear();
        let (mut bias, mut range) = (0.0f32, 0.0f32);
        for (s, l) in book.levels.chunks_exact(WORDS).enumerate() {
            let (a, b) = (q(s) * l[0], q(s) * l[WORDS - 1]);
            self.lows.push(a.min(b));
            bias += a.min(b);
            range = range.max((a - b).abs());
        }
        let delta = if range > 0.0 && range.is_finite() { range / top } else { 1.0 };
        let inv = 1.0 / delta;
        self.bytes.resize(m * WORDS, 0);
        for (s, (l, out)) in book.levels.chunks_exact(WORDS).zip(self.bytes.chunks_exact_mut(WORDS)).enumerate() {
            let (q, lo) = (q(s), self.lows[s]);
            // Fixed-length arrays: the 16 conversions compile to vector instructions.
            let (l, out): (&[f32; WORDS], &mut [u8; WORDS]) =
                (l.try_into().expect("16 levels"), out.try_into().expect("16 bytes"));
            for c in 0..WORDS {
                // Non-negative, so adding a half and truncating rounds (`round` is a libm
                // call); `max` and `min` bound it to [0, top] (NaN gives 0).
                let v = ((q * l[c] - lo) * inv + 0.5).max(0.0).min(top);
                // SAFETY: `v` is finite and in [0, 255].
                out[c] = unsafe { v.to_int_unchecked::<i32>() } as u8;
            }
        }
        (self.bias, self.delta) = (bias, delta);
    }
}

/// Appends to `out` the approximate scores of every row of `rows` for the query of `tables`,
/// plus `offset` (the cluster's `mu_j . q`): `rows.padded_len()` of them, row `i`'s `i`-th
/// (padding rows score the tables' bias), by the fastest kernel the CPU has
/// ([`Kernel::best`]); all agree bit for bit. Appending lets a search gather the scores of all
/// the clusters it probes without copying them.
pub fn scores(rows: &Pq4Rows, tables: &Tables, offset: f32, out: &mut Vec<f32>) {
    scores_with(Kernel::best(), rows, tables, offset, out);
}

/// An implementation of [`scores`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// AVX-512BW: `vpshufb` on four sub-spaces' tables at once.
    Avx512,
    /// AVX2: `vpshufb` on two sub-spaces' tables at once.
    Avx2,
    /// Portable code ([`scores_scalar`]), the reference of the others.
    Scalar,
}

impl Kernel {
    /// The kernels this CPU runs within [`simd_cap`](farout_core::kernels::simd_cap), fastest
    /// first (checked once).
    pub fn available() -> &'static [Kernel] {
        use std::sync::OnceLock;
        static HAS: OnceLock<Vec<Kernel>> = OnceLock::new();
        HAS.get_or_init(|| {
            #[allow(unused_mut)]
            let mut kernels = Vec::new();
            #[cfg(target_arch = "x86_64")]
            {
                use farout_core::kernels::{SimdLevel, simd_cap};
                if simd_cap() >= SimdLevel::Avx512
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                {
                    kernels.push(Kernel::Avx512);
                }
                if simd_cap() >= SimdLevel::Avx2 && is_x86_feature_detected!("avx2") {
                    kernels.push(Kernel::Avx2);
                }
            }
            kernels.push(Kernel::Scalar);
            kernels
        })
    }

    /// The fastest kernel this CPU runs.
    pub fn best() -> Kernel {
        Kernel::available()[0]
    }
}

/// [`scores`] by the given kernel, which must be one of [`Kernel::available`] (panics
/// otherwise: running it would be undefined behaviour).
pub fn scores_with(kernel: Kernel, rows: &Pq4Rows, tables: &Tables, offset: f32, out: &mut Vec<f32>) {
    assert!(Kernel::available().contains(&kernel), "the CPU does not run the {kernel:?} kernel");
    assert_eq!(rows.m * WORDS, tables.bytes.len(), "codes and tables of different sub-spaces");
    if kernel == Kernel::Scalar {
        return scores_scalar(rows, tables, offset, out);
    }
    let (at, n, base) = (out.len(), rows.padded_len(), tables.bias + offset);
    out.reserve(n);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has the kernel's features (checked above); the tables hold 16 bytes a
    // sub-space of the codes (asserted above); the kernel writes all `n` floats from `at`,
    // within the capacity reserved, before they are counted in the length.
    unsafe {
        let to = out.as_mut_ptr().add(at);
        match kernel {
            Kernel::Avx2 => x86::scan_avx2(rows, &tables.bytes, tables.delta, base, to),
            _ => x86::scan_avx512(rows, &tables.bytes, tables.delta, base, to),
        }
        out.set_len(at + n);
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("only the portable kernel exists off x86-64: {at} {n} {base}");
}

/// [`scores`] in portable scalar code (the reference the kernels are tested against).
pub fn scores_scalar(rows: &Pq4Rows, tables: &Tables, offset: f32, out: &mut Vec<f32>) {
    let base = tables.bias + offset;
    out.extend((0..rows.padded_len()).map(|i| {
        let sum: u32 = (0..rows.m).map(|s| tables.bytes[s * WORDS + rows.code(i, s) as usize] as u32).sum();
        sum as f32 * tables.delta + base
    }));
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{BLOCK, Pq4Rows};
    use std::arch::x86_64::*;

    /// The scores of one block's 32 rows from its four 16-bit accumulators (see the module
    /// docs): `lo`/`hi` for rows 0-15 (`lo += u`, `hi += u >> 8`), then the same for rows
    /// 16-31, each a 128-bit lane per sub-space already summed over the lanes.
    ///
    /// # Safety
    /// AVX2; `out` holds 32 floats.
    #[target_feature(enable = "avx2")]
    unsafe fn finish(acc: [__m128i; 4], delta: __m256, base: __m256, out: *mut f32) {
        for half in 0..2 {
            let (sum, odd) = (acc[2 * half], acc[2 * half + 1]);
            let even = _mm_sub_epi16(sum, _mm_slli_epi16(odd, 8));
            let rows = [_mm_unpacklo_epi16(even, odd), _mm_unpackhi_epi16(even, odd)];
            for (t, r) in rows.into_iter().enumerate() {
                let v = _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(r));
                let v = _mm256_add_ps(_mm256_mul_ps(v, delta), base);
                // SAFETY: rows 16 half + 8 t .. + 8 of the block's 32 (the caller's contract).
                unsafe { _mm256_storeu_ps(out.add(16 * half + 8 * t), v) };
            }
        }
    }

    /// Scores of every block of `rows` with the byte tables `lut` (16 per sub-space).
    ///
    /// # Safety
    /// AVX2; `lut` holds `16 m` bytes and `out` has room for `rows.padded_len()` floats.
    #[target_feature(enable = "avx2")]
    pub unsafe fn scan_avx2(rows: &Pq4Rows, lut: &[u8], delta: f32, base: f32, out: *mut f32) {
        let pairs = rows.m / 2;
        let (delta, base, low) = (_mm256_set1_ps(delta), _mm256_set1_ps(base), _mm256_set1_epi8(0x0f));
        for (b, block) in rows.codes.chunks_exact(pairs * BLOCK).enumerate() {
            let mut acc = [_mm256_setzero_si256(); 4];
            let lookup = |p: usize| {
                // SAFETY: pair p's (p < pairs) 32 bytes of the block and of the tables (16 m
                // bytes).
                let (c, t) = unsafe {
                    (
                        _mm256_loadu_si256(block.as_ptr().add(p * BLOCK).cast()),
                        _mm256_loadu_si256(lut.as_ptr().add(p * BLOCK).cast()),
                    )
                };
                let u0 = _mm256_shuffle_epi8(t, _mm256_and_si256(c, low));
                let u1 = _mm256_shuffle_epi8(t, _mm256_and_si256(_mm256_srli_epi16(c, 4), low));
                (u0, u1)
            };
            let mut add = |(u0, u1): (__m256i, __m256i)| {
                acc[0] = _mm256_add_epi16(acc[0], u0);
                acc[1] = _mm256_add_epi16(acc[1], _mm256_srli_epi16(u0, 8));
                acc[2] = _mm256_add_epi16(acc[2], u1);
                acc[3] = _mm256_add_epi16(acc[3], _mm256_srli_epi16(u1, 8));
            };
            // Two pairs' bytes (each at most 127) summed as bytes first (`m` is a multiple of 4,
            // so the pairs are even).
            for p in (0..pairs).step_by(2) {
                let ((a0, a1), (b0, b1)) = (lookup(p), lookup(p + 1));
                add((_mm256_add_epi8(a0, b0), _mm256_add_epi8(a1, b1)));
            }
            let lanes = acc.map(|a| _mm_add_epi16(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1)));
            // SAFETY: block b's 32 rows lie within `out` (padded_len floats).
            unsafe { finish(lanes, delta, base, out.add(b * BLOCK)) };
        }
    }

    /// [`scan_avx2`] four sub-spaces at a time.
    ///
    /// # Safety
    /// AVX-512F and AVX-512BW; as for [`scan_avx2`].
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    pub unsafe fn scan_avx512(rows: &Pq4Rows, lut: &[u8], delta: f32, base: f32, out: *mut f32) {
        let quads = rows.m / 4;
        let (delta, base, low) = (_mm256_set1_ps(delta), _mm256_set1_ps(base), _mm512_set1_epi8(0x0f));
        for (b, block) in rows.codes.chunks_exact(quads * 2 * BLOCK).enumerate() {
            let mut acc = [_mm512_setzero_si512(); 4];
            let lookup = |p: usize| {
                // SAFETY: sub-spaces 4p..4p + 4 (p < quads): 64 bytes of the block and of the
                // tables.
                let (c, t) = unsafe {
                    (
                        _mm512_loadu_si512(block.as_ptr().add(p * 2 * BLOCK).cast()),
                        _mm512_loadu_si512(lut.as_ptr().add(p * 2 * BLOCK).cast()),
                    )
                };
                let u0 = _mm512_shuffle_epi8(t, _mm512_and_si512(c, low));
                let u1 = _mm512_shuffle_epi8(t, _mm512_and_si512(_mm512_srli_epi16(c, 4), low));
                (u0, u1)
            };
            let mut add = |(u0, u1): (__m512i, __m512i)| {
                acc[0] = _mm512_add_epi16(acc[0], u0);
                acc[1] = _mm512_add_epi16(acc[1], _mm512_srli_epi16(u0, 8));
                acc[2] = _mm512_add_epi16(acc[2], u1);
                acc[3] = _mm512_add_epi16(acc[3], _mm512_srli_epi16(u1, 8));
            };
            // Two quads' bytes (each at most 127) summed as bytes first.
            for p in (0..quads & !1).step_by(2) {
                let ((a0, a1), (b0, b1)) = (lookup(p), lookup(p + 1));
                add((_mm512_add_epi8(a0, b0), _mm512_add_epi8(a1, b1)));
            }
            if quads % 2 == 1 {
                add(lookup(quads - 1));
            }
            let lanes = acc.map(|a| {
                let half = _mm256_add_epi16(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
                _mm_add_epi16(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1))
            });
            // SAFETY: block b's 32 rows lie within `out` (padded_len floats).
            unsafe { finish(lanes, delta, base, out.add(b * BLOCK)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_core::rng;

    /// Random rows with their residual codes, and a random query's tables.
    fn rows_and_tables(n: usize, dim: usize, seed: u64) -> (Codebook, Pq4Rows, Vec<f32>, Tables, Vec<f32>) {
        let mut r = rng::seeded(seed, 0);
        let w: Vec<f32> = (0..n * dim).map(|_| rng::normal(&mut r)).collect();
        let q: Vec<f32> = (0..dim).map(|_| rng::normal(&mut r)).collect();
        let book = Codebook::fit(&w, dim, seed);
        let mut rows = Pq4Rows::new(book.sub_spaces());
        let zero = vec![0.0f32; dim];
        for row in w.chunks_exact(dim) {
            rows.push_with(|s| book.code_of(s, row, &zero));
        }
        let mut tables = Tables::default();
        tables.fill(&book, &q);
        (book, rows, w, tables, q)
    }

    /// Every kernel the CPU has gives the portable code's scores bit for bit, for dimensions
    /// with padding sub-spaces, row counts with a partial last block, and an offset.
    #[test]
    fn kernels_equal_the_scalar_reference() {
        for (n, dim) in [(1, 3), (31, 128), (100, 128), (77, 30), (64, 257)] {
            let (_, rows, _, tables, _) = rows_and_tables(n, dim, n as u64);
            let mut reference = Vec::new();
            scores_scalar(&rows, &tables, 0.25, &mut reference);
            assert_eq!(reference.len(), n.next_multiple_of(BLOCK));
            for &kernel in Kernel::available() {
                let mut got = Vec::new();
                scores_with(kernel, &rows, &tables, 0.25, &mut got);
                assert_eq!(got, reference, "{kernel:?}, n = {n}, dim = {dim}");
            }
        }
    }

    /// The approximate score is the sum of the exact tables of the codes to within the
    /// quantisation of the tables (half a step per sub-space), and the codes' scores follow
    /// the exact scores closely (correlation above 0.9 on Gaussian rows).
    #[test]
    fn scores_approximate_the_inner_products() {
        let (n, dim) = (2_000, 64);
        let (book, rows, w, tables, q) = rows_and_tables(n, dim, 7);
        let mut got = Vec::new();
        scores(&rows, &tables, 0.0, &mut got);
        let (m, zero) = (book.sub_spaces(), vec![0.0f32; dim]);
        let (mut sxy, mut sxx, mut syy) = (0.0f64, 0.0f64, 0.0f64);
        for (i, row) in w.chunks_exact(dim).enumerate() {
            let level = |s: usize| book.levels()[s * WORDS + book.code_of(s, row, &zero) as usize];
            let table_sum: f32 = (0..m).map(|s| q.get(s).map_or(0.0, |q| q * level(s))).sum();
            assert!((got[i] - table_sum).abs() <= 0.5 * tables.delta * m as f32 + 1e-4, "row {i}");
            let exact = farout_core::kernels::dot(row, &q) as f64;
            (sxy, sxx, syy) = (sxy + exact * got[i] as f64, sxx + exact * exact, syy + (got[i] as f64).powi(2));
        }
        let correlation = sxy / (sxx * syy).sqrt();
        assert!(correlation > 0.9, "correlation {correlation}");
    }

    /// Setting, removing and reading codes keeps every other row's codes.
    #[test]
    fn swap_remove_moves_the_last_row() {
        let mut rows = Pq4Rows::new(8);
        for i in 0..40u8 {
            rows.push(&[i % 16, (i + 1) % 16, 3, 4, 5, 6, 7, i / 3 % 16]);
        }
        rows.swap_remove(5);
        assert_eq!((rows.len(), rows.padded_len()), (39, 64));
        assert_eq!((0..8).map(|s| rows.code(5, s)).collect::<Vec<_>>(), [39 % 16, 40 % 16, 3, 4, 5, 6, 7, 13]);
        for _ in 0..8 {
            rows.swap_remove(0);
        }
        assert_eq!((rows.len(), rows.padded_len()), (31, 32));
        assert_eq!(rows.code(6, 0), 6);
    }
}
