//! Int8 scoring of many rows against a few queries: the candidate scan of [`SphericalIndex`]
//! with `scoring = "int8"`.
//!
//! **Quantisation.** A row `w` is stored as codes `c_i = round(w_i / s_w)` in `[-127, 127]` with
//! its own scale `s_w = max_i |w_i| / 127`; a query `q` as `u_i = round(q_i / s_q) + 128` in
//! `[1, 255]` (unsigned, as the VNNI instruction wants it), `s_q = max_i |q_i| / 127`. Then
//!
//! ```text
//! w . q  ~  s_w s_q (sum_i u_i c_i - 128 sum_i c_i)
//! ```
//!
//! The integer sum is exact; the only approximation is the rounding of `w` and `q` (each
//! coordinate within half a step, `max|w| / 254`). The scan therefore ranks rows almost as exact
//! scores do, and the index rescores the best of them exactly.
//!
//! **Layout.** Rows are stored in groups of 16; a group holds, for each 4-dimension chunk, the
//! 16 rows' 4 codes side by side (64 bytes). One AVX-512 VNNI `vpdpbusd` multiplies a query's
//! chunk (4 bytes, broadcast) with a group's chunk and adds the 4 products of every row into its
//! own 32-bit lane: 64 multiply-adds per instruction against 16 for f32 FMA, on a quarter of the
//! bytes, and no horizontal sums. The kernel scores two groups against four queries at a time
//! (8 accumulators); the one to three queries left over go through a tile of their own, two
//! queries four groups at a time and a query alone eight (8 accumulators again: with two, the
//! scan waits on `vpdpbusd`'s latency; docs/decisions.md, `vnni-one-query`). Each group
//! starts on a cache line, so no 64-byte load straddles two.
//!
//! **AMX** (Intel Sapphire Rapids and later) multiplies whole tiles: `tdpbusd` takes 16 queries'
//! codes of 64 dimensions (16 rows of 64 bytes) and 16 chunks of one group, which in the layout
//! above are 16 rows of 64 bytes, exactly its second operand's layout, and adds 16 x 16 32-bit
//! sums: 16,384 multiply-adds per instruction. The kernel gathers the queries into tiles, scores
//! two query tiles against two groups at a time, then converts the sums as the other kernels
//! do. It runs when the dimension is a multiple of 64 and at least [`AMX_MIN_QUERIES`] queries
//! share the rows (the VNNI kernel scores the others): in the batched search, a cluster against
//! the queries probing it.
//!
//! **AVX2** has no VNNI, and its unsigned-by-signed byte product `vpmaddubsw` saturates the
//! 16-bit sum of two products (`2 x 255 x 127 > 32767`). Its kernel multiplies signed codes
//! instead, `q_i = u_i - 128`, by the usual sign trick: `maddubs(|c|, sign(q, c))` gives
//! `c_i q_i` pair sums of at most `2 x 127 x 127 = 32258`, so nothing saturates and
//! `sum_i q_i c_i = sum_i u_i c_i - 128 sum_i c_i` exactly; `vpmaddwd` against ones widens the
//! pairs into each row's 32-bit lane. A 64-byte chunk is two 8-row halves; four queries share
//! each load (8 accumulators).
//!
//! All kernels compute the same integers and the same float operations as the portable
//! [`scores_scalar`], so all give bit-identical scores (a test checks every kernel the CPU
//! has). [`scores`] picks the fastest the CPU has ([`Kernel::best`]); the portable code is far
//! slower than f32 scoring, so int8 scoring is for CPUs with AVX2, AVX-512 VNNI or AMX.
//!
//! [`SphericalIndex`]: crate::SphericalIndex

use crate::ReserveByEighths;
use farout_core::hugepages::{HugeVec, huge_vec};

/// Rows per group (32-bit lanes of a 512-bit register).
const GROUP: usize = 16;
/// Groups scored together by the kernel; storage is padded to a multiple of this many groups.
const GROUPS_PER_TILE: usize = 2;
/// Rows of the padded storage come in multiples of this.
pub const ROW_TILE: usize = GROUP * GROUPS_PER_TILE;
/// Queries scored together by the kernel.
const QUERY_TILE: usize = 4;

/// Rows rescored beyond `k` at least after ranking on codes: at small `k` a few near-ties on
/// the codes decide the last places (at top 10 of 200,000 rows, rescoring 10 rows lost 0.6
/// points of recall against f32 scoring, rescoring 50 none), and a few dozen dot products cost
/// nothing beside the scan.
pub(crate) const RESCORE_MARGIN: usize = 32;

/// Rows to rescore exactly for `k` results ranked on int8 codes: `rescore * k`, and at least
/// `k +` [`RESCORE_MARGIN`].
pub(crate) fn rescore_depth(k: usize, rescore: f32) -> usize {
    ((k as f32 * rescore).ceil() as usize).max(k + RESCORE_MARGIN)
}

/// Keeps the `scores` at or above `floor` and the `tags` beside them (in the same order): a
/// query's rows kept while scanning codes, cut back when its floor rises.
#[inline]
pub(crate) fn retain_at_least<T: Copy>(scores: &mut Vec<f32>, tags: &mut Vec<T>, floor: f32) {
    let mut m = 0;
    for t in 0..scores.len() {
        if scores[t] >= floor {
            scores[m] = scores[t];
            tags[m] = tags[t];
            m += 1;
        }
    }
    scores.truncate(m);
    tags.truncate(m);
}

/// The `k` best of `candidates` (emptied; exact scores after rescoring) into `out`, in no
/// particular order.
pub(crate) fn keep_best(candidates: &mut Vec<crate::Hit>, k: usize, out: &mut Vec<crate::Hit>) {
    if candidates.len() > k {
        if k > 0 {
            candidates.select_nth_unstable_by(k - 1, farout_core::topk::by_score);
        }
        candidates.truncate(k);
    }
    out.clear();
    out.append(candidates);
}

/// 64 bytes on a cache line of their own: the unit of the codes' storage, so that no load of
/// a group's chunk (64 bytes) straddles two lines (AMX's tile loads, 16 such rows each, run
/// several times slower when they do).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Line([i8; 64]);

/// The int8 codes of a growing and changing set of rows of dimension `dim` (see the module
/// docs), addressed by position `0..len()`. Held in huge pages shared with other code buffers
/// ([`HugeVec`]): a batch's scan streams a thousand of them one after another, faster from huge
/// pages (docs/decisions.md, "pooled-huge-pages").
#[derive(Clone, Debug)]
pub struct QuantRows {
    dim: usize,
    /// `ceil(dim / 4)`.
    chunks: usize,
    len: usize,
    /// `padded_len / 16` groups of `chunks` lines of 64 bytes.
    codes: HugeVec<Line>,
    /// `s_w` per row (0 in the padding).
    scale: HugeVec<f32>,
    /// `-128 sum_i c_i` per row (0 in the padding).
    offset: HugeVec<i32>,
}

impl QuantRows {
    /// No rows yet, of dimension `dim`.
    pub fn new(dim: usize) -> Self {
        Self::with_capacity(dim, 0)
    }

    /// No rows yet, of dimension `dim`, with room for `rows` rows.
    pub fn with_capacity(dim: usize, rows: usize) -> Self {
        let (chunks, padded) = (dim.div_ceil(4), rows.next_multiple_of(ROW_TILE));
        Self {
            dim,
            chunks,
            len: 0,
            codes: huge_vec(padded / GROUP * chunks),
            scale: huge_vec(padded),
            offset: huge_vec(padded),
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rows including the zero padding: the stride of [`scores`]'s output.
    pub fn padded_len(&self) -> usize {
        self.scale.len()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        64 * self.codes.capacity() + 4 * (self.scale.capacity() + self.offset.capacity())
    }

    /// Appends `row` (length `dim`).
    pub fn push(&mut self, row: &[f32]) {
        if self.len == self.padded_len() {
            self.codes.reserve_by_eighths(GROUPS_PER_TILE * self.chunks);
            self.scale.reserve_by_eighths(ROW_TILE);
            self.offset.reserve_by_eighths(ROW_TILE);
            self.codes.resize(self.codes.len() + GROUPS_PER_TILE * self.chunks, Line([0; 64]));
            self.scale.resize(self.scale.len() + ROW_TILE, 0.0);
            self.offset.resize(self.offset.len() + ROW_TILE, 0);
        }
        self.len += 1;
        self.set(self.len - 1, row);
    }

    /// Overwrites row `at` with the codes of `row`.
    pub fn set(&mut self, at: usize, row: &[f32]) {
        assert!(at < self.len && row.len() == self.dim, "row {at} of {} (dim {} != {})", self.len, row.len(), self.dim);
        let (scale, inv) = scale_of(row);
        let mut sum = 0i32;
        // Quantise `PART` values at a time into a buffer (one loop the compiler vectorises),
        // then scatter them 4 bytes per chunk; the last chunk's missing values stay 0.
        const PART: usize = 64;
        let mut code = [0i8; PART];
        for (p, part) in row.chunks(PART).enumerate() {
            code.fill(0);
            for (b, x) in code.iter_mut().zip(part) {
                *b = code_of(x * inv) as i8;
            }
            sum += code.iter().map(|&b| b as i32).sum::<i32>();
            for (c, four) in code[..part.len().next_multiple_of(4)].chunks_exact(4).enumerate() {
                let at = self.byte(at, p * PART / 4 + c);
                self.code_bytes_mut()[at..at + 4].copy_from_slice(four);
            }
        }
        self.scale[at] = scale;
        self.offset[at] = -128 * sum;
    }

    /// Asks for the cache lines [`QuantRows::set`] will write for row `at` (`ceil(dim / 4)`
    /// lines: a row's codes are spread over its group's chunks).
    pub fn prefetch(&self, at: usize) {
        if at < self.len {
            (0..self.chunks).for_each(|c| farout_core::kernels::prefetch(&self.code_bytes()[self.byte(at, c)..][..1]));
        }
    }

    /// Asks for the lines of the codes at once, at most [`PREFETCH_LINES`] (see
    /// [`scores_with`]).
    fn prefetch_codes(&self) {
        farout_core::kernels::prefetch(&self.codes[..self.codes.len().min(PREFETCH_LINES)]);
    }

    /// Removes row `at` by moving the last row into its place (the positions of the others do
    /// not change).
    pub fn swap_remove(&mut self, at: usize) {
        assert!(at < self.len, "row {at} of {}", self.len);
        let last = self.len - 1;
        for c in 0..self.chunks {
            let (from, to) = (self.byte(last, c), self.byte(at, c));
            self.code_bytes_mut().copy_within(from..from + 4, to);
            self.code_bytes_mut()[from..from + 4].fill(0);
        }
        self.scale[at] = self.scale[last];
        self.offset[at] = self.offset[last];
        (self.scale[last], self.offset[last]) = (0.0, 0);
        self.len = last;
        // Give back a whole tile once it is empty.
        if self.padded_len() - self.len >= ROW_TILE {
            let rows = self.padded_len() - ROW_TILE;
            self.codes.truncate(rows / GROUP * self.chunks);
            self.scale.truncate(rows);
            self.offset.truncate(rows);
        }
    }

    /// The codes as bytes.
    fn code_bytes(&self) -> &[i8] {
        // SAFETY: a `Line` is 64 bytes (`repr(C)`, no padding), so the lines are contiguous
        // bytes; `i8` has no alignment or validity requirement.
        unsafe { std::slice::from_raw_parts(self.codes.as_ptr().cast(), 64 * self.codes.len()) }
    }

    /// The codes as bytes, writable.
    fn code_bytes_mut(&mut self) -> &mut [i8] {
        // SAFETY: as for `code_bytes`; every byte pattern is a valid `Line`.
        unsafe { std::slice::from_raw_parts_mut(self.codes.as_mut_ptr().cast(), 64 * self.codes.len()) }
    }

    /// Position in [`QuantRows::code_bytes`] of chunk `c` of row `at`.
    fn byte(&self, at: usize, c: usize) -> usize {
        (at / GROUP) * self.chunks * 64 + c * 64 + (at % GROUP) * 4
    }
}

/// The quantisation step `s = max_i |x_i| / 127` of a vector and its inverse (both 0 for a zero
/// or non-finite vector, whose codes are then all 0).
fn scale_of(x: &[f32]) -> (f32, f32) {
    let max = farout_core::kernels::max_of(x, f32::abs);
    if max > 0.0 && max.is_finite() { (max / 127.0, 127.0 / max) } else { (0.0, 0.0) }
}

/// `x.round().clamp(-127.0, 127.0)` (0 for NaN) without `round`, which the baseline x86-64
/// target compiles to a call into libm (quantising the rows a training step changed spent most
/// of its time there): the truncation of the clamped value is exact, and its fraction rounds
/// half away from zero, as `round` does.
#[inline]
fn code_of(x: f32) -> i32 {
    let y = x.clamp(-127.0, 127.0);
    let t = y as i32;
    let fraction = y - t as f32;
    t + (fraction >= 0.5) as i32 - (fraction <= -0.5) as i32
}

/// Queries quantised for [`scores`] (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct QuantQueries {
    chunks: usize,
    /// `chunks x 4` bytes per query (padding dimensions hold 128, the code of 0).
    codes: Vec<u8>,
    scale: Vec<f32>,
}

impl QuantQueries {
    /// Quantises every row of `queries` (`n x dim`, row-major).
    pub fn new(queries: &[f32], dim: usize) -> Self {
        let chunks = dim.div_ceil(4);
        let mut q = Self { chunks, codes: Vec::new(), scale: Vec::new() };
        for row in queries.chunks_exact(dim.max(1)) {
            q.push(row);
        }
        q
    }

    /// Number of queries.
    pub fn len(&self) -> usize {
        self.scale.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.scale.is_empty()
    }

    fn push(&mut self, q: &[f32]) {
        let (scale, inv) = scale_of(q);
        let start = self.codes.len();
        self.codes.resize(start + 4 * self.chunks, 128);
        for (u, x) in self.codes[start..].iter_mut().zip(q) {
            *u = (code_of(x * inv) + 128) as u8;
        }
        self.scale.push(scale);
    }

    fn codes(&self, j: usize) -> &[u8] {
        &self.codes[j * 4 * self.chunks..(j + 1) * 4 * self.chunks]
    }
}

/// Approximate scores of every row of `rows` against the queries `which` of `queries`:
/// `out[s * rows.padded_len() + i]` for the `s`-th query of `which` and row `i` (padding rows
/// score 0), by the fastest kernel the CPU has ([`Kernel::best`]); all agree bit for bit.
pub fn scores(rows: &QuantRows, queries: &QuantQueries, which: &[u32], out: &mut Vec<f32>) {
    scores_with(Kernel::best(), rows, queries, which, out);
}

/// An implementation of [`scores`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// AMX-INT8 tiles: `tdpbusd`, 16,384 multiply-adds per instruction, for rows of a
    /// dimension that is a multiple of 64 scored against at least [`AMX_MIN_QUERIES`]
    /// queries; the VNNI kernel scores the others.
    Amx,
    /// AVX-512 with VNNI: `vpdpbusd`, 64 multiply-adds per instruction.
    Vnni,
    /// AVX2: the sign trick with `vpmaddubsw` and `vpmaddwd`.
    Avx2,
    /// Portable code ([`scores_scalar`]), the reference of the others.
    Scalar,
}

impl Kernel {
    /// The kernels this CPU runs within [`simd_cap`](farout_core::kernels::simd_cap), fastest
    /// first (checked once).
    pub fn available() -> &'static [Kernel] {
        use farout_core::kernels::{SimdLevel, simd_cap};
        use std::sync::OnceLock;
        static HAS: OnceLock<Vec<Kernel>> = OnceLock::new();
        HAS.get_or_init(|| {
            let mut kernels = Vec::new();
            #[cfg(target_arch = "x86_64")]
            {
                if simd_cap() >= SimdLevel::Avx512
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vnni")
                {
                    #[cfg(target_os = "linux")]
                    if simd_cap() >= SimdLevel::Amx && is_x86_feature_detected!("popcnt") && amx::usable() {
                        kernels.push(Kernel::Amx);
                    }
                    kernels.push(Kernel::Vnni);
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
pub fn scores_with(kernel: Kernel, rows: &QuantRows, queries: &QuantQueries, which: &[u32], out: &mut Vec<f32>) {
    assert!(Kernel::available().contains(&kernel), "the CPU does not run the {kernel:?} kernel");
    if kernel == Kernel::Scalar {
        return scores_scalar(rows, queries, which, out);
    }
    size_output(rows, queries, which, out);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has the features the kernel is compiled for (checked just above); the
    // kernels read within `rows`, `queries` and `out` as sized here.
    unsafe {
        match kernel {
            #[cfg(target_os = "linux")]
            Kernel::Amx if amx::fits(rows.chunks) && which.len() >= AMX_MIN_QUERIES => {
                amx::scan::<false>(rows, queries, which, out, &[], &mut [])
            }
            Kernel::Amx | Kernel::Vnni => {
                // With several queries the codes are read once from memory, then from cache by
                // every further tile. The VNNI kernel scores lines faster than its own loads
                // bring them in, one after another, so asking for all the lines at once first
                // keeps many more in flight (a cluster of 1,000 rows, 13 queries: a quarter
                // less time). The AVX2 kernel is slow enough for the hardware to keep ahead
                // (asking first cost it a seventh), and a lone query only streams
                // (docs/decisions.md, "int8-scan-prefetch").
                if which.len() >= 2 {
                    rows.prefetch_codes();
                }
                let tiles = [vnni::tile::<1>, vnni::tile::<2>, vnni::tile::<3>, vnni::tile::<4>];
                by_query_tiles(rows, queries, which, out, tiles)
            }
            Kernel::Avx2 => by_query_tiles(
                rows,
                queries,
                which,
                out,
                [avx2::tile::<1>, avx2::tile::<2>, avx2::tile::<3>, avx2::tile::<4>],
            ),
            Kernel::Scalar => unreachable!(),
        }
    }
}

/// The rows of one query that [`scores_at_least`] keeps: their positions, ascending, and their
/// approximate scores, as many of each (a kernel may panic on an `Above` where they differ).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Above {
    /// Positions of the rows in the [`QuantRows`] scanned.
    pub positions: Vec<u32>,
    /// Their approximate scores.
    pub scores: Vec<f32>,
}

impl Above {
    /// Rows kept.
    fn len(&self) -> usize {
        self.positions.len()
    }

    /// Sets both lengths to `len`.
    ///
    /// # Safety
    /// Both vectors have `len` entries written within their capacity.
    unsafe fn set_len(&mut self, len: usize) {
        // SAFETY: the caller's contract.
        unsafe {
            self.positions.set_len(len);
            self.scores.set_len(len);
        }
    }

    /// No rows (the capacity is kept).
    pub fn clear(&mut self) {
        self.positions.clear();
        self.scores.clear();
    }
}

/// For each query `which[s]`, appends to `above[s]` the rows of `rows` whose approximate score
/// is at least `floors[s]` (padding rows never): bit for bit what [`scores`] followed by
/// [`kernels::keep_at_least`](farout_core::kernels::keep_at_least) on each query's scores
/// gives. The AMX kernel compares each tile row of sums with the floor as it converts them and
/// writes only the rows kept, instead of writing every score and reading it back; the other
/// kernels score into `scratch` first.
pub fn scores_at_least(
    rows: &QuantRows,
    queries: &QuantQueries,
    which: &[u32],
    floors: &[f32],
    above: &mut [Above],
    scratch: &mut Vec<f32>,
) {
    scores_at_least_with(Kernel::best(), rows, queries, which, floors, above, scratch);
}

/// [`scores_at_least`] for a caller that wants the best `n` rows of all it scans: a query
/// whose floor is minus infinity (nothing scanned yet) keeps these rows' scores that reach a
/// value at least `n` of them reach ([`floor_of_maxima`](farout_core::topk::floor_of_maxima), one pass over them),
/// instead of every row. The AMX kernel, which never writes the scores out, keeps the floors as
/// given.
pub fn scores_at_least_of_best(
    rows: &QuantRows,
    queries: &QuantQueries,
    which: &[u32],
    floors: &[f32],
    n: usize,
    above: &mut [Above],
    scratch: &mut Vec<f32>,
) {
    keep_at_least(Kernel::best(), rows, queries, which, floors, n, above, scratch);
}

/// [`scores_at_least`] by the given kernel, one of [`Kernel::available`].
pub fn scores_at_least_with(
    kernel: Kernel,
    rows: &QuantRows,
    queries: &QuantQueries,
    which: &[u32],
    floors: &[f32],
    above: &mut [Above],
    scratch: &mut Vec<f32>,
) {
    keep_at_least(kernel, rows, queries, which, floors, 0, above, scratch);
}

/// [`scores_at_least_with`], and with `n` > 0 [`scores_at_least_of_best`]'s floors.
#[allow(clippy::too_many_arguments)]
fn keep_at_least(
    kernel: Kernel,
    rows: &QuantRows,
    queries: &QuantQueries,
    which: &[u32],
    floors: &[f32],
    n: usize,
    above: &mut [Above],
    scratch: &mut Vec<f32>,
) {
    assert!(floors.len() == which.len() && above.len() == which.len(), "a floor and an output per query");
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if kernel == Kernel::Amx && amx::fits(rows.chunks) && which.len() >= AMX_MIN_QUERIES {
        assert_eq!(rows.chunks, queries.chunks, "rows and queries of different dimensions");
        assert!(Kernel::available().contains(&kernel), "the CPU does not run the {kernel:?} kernel");
        // SAFETY: the CPU has AMX, enabled, and POPCNT (`available`); the kernel reads within `rows` and
        // `queries`, and writes nothing in keeping mode but `above`.
        unsafe { amx::scan::<true>(rows, queries, which, &mut [], floors, above) };
        return;
    }
    scores_with(kernel, rows, queries, which, scratch);
    let padded = rows.padded_len();
    for (s, (a, &floor)) in above.iter_mut().zip(floors).enumerate() {
        let scores = &scratch[s * padded..s * padded + rows.len()];
        let floor =
            if n > 0 && floor == f32::NEG_INFINITY { farout_core::topk::floor_of_maxima(scores, n) } else { floor };
        farout_core::kernels::keep_at_least(scores, floor, &mut a.positions, &mut a.scores);
    }
}

/// Queries scored together at least for the AMX kernel, which scores them 32 at a time (and
/// pads the last 32): fewer go to the VNNI kernel.
const AMX_MIN_QUERIES: usize = 8;

/// Checks that `rows` and `queries` have the same dimension and sizes `out` for [`scores`].
fn size_output(rows: &QuantRows, queries: &QuantQueries, which: &[u32], out: &mut Vec<f32>) {
    assert_eq!(rows.chunks, queries.chunks, "rows and queries of different dimensions");
    // Every kernel writes every score: only the length matters (zeroing a block of scores that
    // is about to be overwritten cost an eighth of the AMX kernel's time).
    out.resize(which.len() * rows.padded_len(), 0.0);
}

/// [`scores`] in portable scalar code (the reference the kernels are tested against).
pub fn scores_scalar(rows: &QuantRows, queries: &QuantQueries, which: &[u32], out: &mut Vec<f32>) {
    size_output(rows, queries, which, out);
    let (n, codes) = (rows.padded_len(), rows.code_bytes());
    for (s, &j) in which.iter().enumerate() {
        let (u, sq) = (queries.codes(j as usize), queries.scale[j as usize]);
        for i in 0..n {
            let mut acc = 0i32;
            for c in 0..rows.chunks {
                let at = rows.byte(i, c);
                for b in 0..4 {
                    acc += u[4 * c + b] as i32 * codes[at + b] as i32;
                }
            }
            out[s * n + i] = (acc + rows.offset[i]) as f32 * rows.scale[i] * sq;
        }
    }
}

/// Lines of codes asked for before a VNNI scan of several queries ([`scores_with`]): 512 KB, half
/// of a Zen 4 core's L2 cache, so that the lines asked for first are still there when the
/// kernel reads them (clusters of the spherical index are far smaller at sqrt(K) centroids).
const PREFETCH_LINES: usize = (512 << 10) / 64;

/// A kernel's scoring of all rows against some queries, written from `out[0]` on.
#[cfg(target_arch = "x86_64")]
type Tile = unsafe fn(&QuantRows, &QuantQueries, &[u32], &mut [f32]);

/// Runs a kernel over `which`, `QUERY_TILE` queries at a time: `tiles[q - 1]` is its tile
/// of `q` queries (the last tile takes the remaining ones: a query scored by a one-query tile
/// costs about twice what it costs in a tile of four, where each load of the codes serves four
/// queries). `out` is sized `which.len() x rows.padded_len()`.
///
/// # Safety
/// The CPU must have the features the tiles are compiled for; the tiles' other obligations
/// hold when `rows.chunks == queries.chunks` and `out` holds at least
/// `which.len() x rows.padded_len()` floats.
#[cfg(target_arch = "x86_64")]
unsafe fn by_query_tiles(
    rows: &QuantRows,
    queries: &QuantQueries,
    which: &[u32],
    out: &mut [f32],
    tiles: [Tile; QUERY_TILE],
) {
    let n = rows.padded_len();
    debug_assert_eq!(out.len(), which.len() * n);
    for (t, tile) in which.chunks(QUERY_TILE).enumerate() {
        // SAFETY: as for the function; `out` holds `tile.len()` rows of `n` scores from here.
        unsafe { tiles[tile.len() - 1](rows, queries, tile, &mut out[t * QUERY_TILE * n..]) };
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{GROUP, GROUPS_PER_TILE, QuantQueries, QuantRows};
    use std::arch::x86_64::*;

    /// Scores all rows against the `Q` queries `which` into `out[s * n + i]`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, AVX-512BW and AVX-512 VNNI. `rows.chunks == queries.chunks`
    /// (the query codes are read for every chunk of the rows), and `out` holds at least
    /// `Q x rows.padded_len()` floats: the stores are unchecked. (`which` holds at least `Q`
    /// queries of `queries`; that one is checked.)
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn tile<const Q: usize>(rows: &QuantRows, queries: &QuantQueries, which: &[u32], out: &mut [f32]) {
        let groups = rows.padded_len() / GROUP;
        // One or two queries have only 2 or 4 independent sums in a pair of groups, too few to
        // hide vpdpbusd's latency: they take WIDE or 4 groups at a time while those last, then
        // pairs (the group count is even).
        let start = match Q {
            1 => groups / WIDE * WIDE,
            2 => groups / 4 * 4,
            _ => 0,
        };
        // SAFETY: as for this function; the ranges lie within the groups.
        unsafe {
            match Q {
                1 => tile_groups::<Q, WIDE>(rows, queries, which, out, 0..start),
                2 => tile_groups::<Q, 4>(rows, queries, which, out, 0..start),
                _ => {}
            }
            tile_groups::<Q, GROUPS_PER_TILE>(rows, queries, which, out, start..groups);
        }
    }

    /// Groups scored together by the one-query tile.
    const WIDE: usize = 8;

    /// [`tile`] over the groups `groups` of the rows (`G` groups at a time; the range's length
    /// is a multiple of `G`).
    ///
    /// # Safety
    /// As for [`tile`], and `groups.end <= rows.padded_len() / GROUP`.
    // The accumulators are a `Q x G` register tile: indices read clearer than nested iterators.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile_groups<const Q: usize, const G: usize>(
        rows: &QuantRows,
        queries: &QuantQueries,
        which: &[u32],
        out: &mut [f32],
        groups: std::ops::Range<usize>,
    ) {
        debug_assert_eq!(groups.len() % G, 0);
        let (n, chunks) = (rows.padded_len(), rows.chunks);
        let group_bytes = chunks * 64;
        let u: [*const i32; Q] = std::array::from_fn(|s| queries.codes(which[s] as usize).as_ptr().cast::<i32>());
        let sq: [__m512; Q] = std::array::from_fn(|s| _mm512_set1_ps(queries.scale[which[s] as usize]));
        let codes = rows.code_bytes().as_ptr();
        for g in groups.step_by(G) {
            let mut acc = [[_mm512_setzero_si512(); G]; Q];
            for c in 0..chunks {
                let mut w = [_mm512_setzero_si512(); G];
                for (t, w) in w.iter_mut().enumerate() {
                    // SAFETY: group g + t < n / GROUP and chunk c < chunks lie within `codes`
                    // (padded_len / GROUP groups of `group_bytes`).
                    *w = unsafe { _mm512_loadu_si512(codes.add((g + t) * group_bytes + c * 64).cast()) };
                }
                for s in 0..Q {
                    // SAFETY: chunk c < chunks of the query's codes (`rows.chunks ==
                    // queries.chunks`, the caller's contract); unaligned 4-byte read.
                    let b = _mm512_set1_epi32(unsafe { u[s].add(c).read_unaligned() });
                    for t in 0..G {
                        acc[s][t] = _mm512_dpbusd_epi32(acc[s][t], b, w[t]);
                    }
                }
            }
            for t in 0..G {
                let row = (g + t) * GROUP;
                // SAFETY: rows row..row + 16 exist in `offset` and `scale` (padded storage).
                let (offset, scale) = unsafe {
                    (
                        _mm512_loadu_si512(rows.offset.as_ptr().add(row).cast()),
                        _mm512_loadu_ps(rows.scale.as_ptr().add(row)),
                    )
                };
                for s in 0..Q {
                    let v = _mm512_mul_ps(
                        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(acc[s][t], offset)), scale),
                        sq[s],
                    );
                    // SAFETY: out holds Q x n floats from here (sized by the caller).
                    unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(s * n + row), v) };
                }
            }
        }
    }
}

/// AMX (Intel Sapphire Rapids and later): int8 matrix products on tiles of 16 rows x 64 bytes.
/// `tdpbusd` multiplies a tile of 16 queries' unsigned codes (64 dimensions each) by a tile of
/// one 16-row group (16 chunks: a tile row is one chunk of the 16 rows, the layout `tdpbusd`
/// reads its second operand in, so the groups are loaded as they are stored) and adds into
/// 16 x 16 32-bit sums: 16,384 multiply-adds per instruction against 64 for `vpdpbusd`. The
/// kernel holds two query tiles against two groups (four tiles of sums), stores the sums and
/// turns them into scores with the same float operations as the other kernels.
///
/// The tile registers need Linux's permission (`arch_prctl`, asked once by [`usable`]) and are
/// written by inline assembly: Rust has no stable AMX intrinsics.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx {
    use super::{Above, GROUP, Line, QuantQueries, QuantRows};
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::cell::RefCell;

    /// Chunks in a tile row (64 bytes).
    const STEP: usize = 16;
    /// Queries in a tile.
    const TILE: usize = 16;
    /// Queries scored per pass over the rows: two tiles.
    const PASS: usize = 2 * TILE;
    /// Groups of rows whose kept lanes are given room at once.
    const KEEP_BLOCK: usize = 64;

    /// Whether the kernel scores rows of `chunks` chunks (dimension a multiple of 64).
    pub fn fits(chunks: usize) -> bool {
        chunks.is_multiple_of(STEP)
    }

    /// Whether the CPU has AMX-INT8 and Linux lets this process use the tile registers: asks
    /// for them (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, Linux 5.16 and later).
    pub fn usable() -> bool {
        // Leaf 7 counts only where it exists.
        let (max_leaf, features) = (__cpuid(0).eax, __cpuid_count(7, 0).edx);
        let (amx_tile, amx_int8) = (features >> 24 & 1 == 1, features >> 25 & 1 == 1);
        if max_leaf < 7 || !amx_tile || !amx_int8 {
            return false;
        }
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a system call without memory arguments; older kernels refuse it cleanly.
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
    }

    /// A tile configuration (palette 1): `colsb` bytes per row and `rows` rows of each tile.
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
        reserved_end: [u8; 16],
    }

    /// Eight tiles of 16 rows x 64 bytes: tmm0-3 the sums (query tile a or b by group 0 or 1:
    /// a0, a1, b0, b1), tmm4-5 the query tiles, tmm6-7 the groups.
    static CONFIG: TileConfig = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
        rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
        reserved_end: [0; 16],
    };

    /// The four tiles of sums, stored (`sums[t][r]`: row `r` of tile `t`).
    #[repr(C, align(64))]
    struct Sums([[[i32; GROUP]; TILE]; 4]);

    thread_local! {
        /// The queries' codes gathered into tile rows (whole lines: `fits` makes a query's
        /// codes a multiple of 64 bytes).
        static GATHERED: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
    }

    /// Scores all rows against the queries `which`, [`PASS`] queries at a time (the last pass
    /// padded with zero codes, whose scores are dropped): into `out[s * n + i]`, or with `KEEP`
    /// only the rows scoring at least `floors[s]` (not the padding), appended to `above[s]`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, POPCNT and AMX-INT8, enabled by [`usable`];
    /// `fits(rows.chunks)`; `out` holds `which.len() x rows.padded_len()` floats, or with `KEEP`
    /// `floors` and `above` hold `which.len()` entries.
    #[target_feature(enable = "avx512f,popcnt")]
    pub unsafe fn scan<const KEEP: bool>(
        rows: &QuantRows,
        queries: &QuantQueries,
        which: &[u32],
        out: &mut [f32],
        floors: &[f32],
        above: &mut [Above],
    ) {
        let (n, chunks) = (rows.padded_len(), rows.chunks);
        let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let (query_bytes, group_bytes) = (4 * chunks, 64 * chunks);
        GATHERED.with_borrow_mut(|gathered| {
            gather_queries(gathered, queries, which, query_bytes);
            let mut sums = Sums([[[0; GROUP]; TILE]; 4]);
            // SAFETY: the CPU has AMX, enabled (the caller's contract); CONFIG is a valid
            // palette-1 configuration.
            unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
            for first in (0..which.len()).step_by(PASS) {
                let a = gathered[first * query_bytes / 64..].as_ptr().cast::<u8>();
                // The pass's query scales and floors, looked up once (not per group).
                let in_pass = which.len().min(first + PASS) - first;
                let mut sq = [0.0f32; PASS];
                let mut floor = [f32::INFINITY; PASS];
                for p in 0..in_pass {
                    sq[p] = queries.scale[which[first + p] as usize];
                    if KEEP {
                        floor[p] = floors[first + p];
                    }
                }
                let mut ends = Ends::at(above.get(first..).unwrap_or_default(), in_pass);
                for g in (0..n / GROUP).step_by(2) {
                    if KEEP && g % KEEP_BLOCK == 0 {
                        ends.make_room(&mut above[first..first + in_pass], KEEP_BLOCK.min(n / GROUP - g));
                    }
                    let b = rows.code_bytes()[g * group_bytes..].as_ptr();
                    // SAFETY: the tiles read 16 rows of 64 bytes from query row `first` (+ 16)
                    // at byte 4c of `query_bytes`-byte rows (gathered holds whole passes), and
                    // from group g (+ 1) at byte 64c of the 64-byte chunk rows (the padded
                    // storage holds an even number of groups); c + 16 <= chunks (`fits`).
                    unsafe { tile_sums(a, b, chunks, query_bytes, group_bytes, &mut sums) };
                    for (t, tile) in sums.0.iter().enumerate() {
                        let row = (g + t % 2) * GROUP;
                        // SAFETY: rows row..row + 16 exist in `offset` and `scale` (padded).
                        let (offset, scale) = unsafe {
                            (
                                _mm512_loadu_si512(rows.offset.as_ptr().add(row).cast()),
                                _mm512_loadu_ps(rows.scale.as_ptr().add(row)),
                            )
                        };
                        let from = first + TILE * (t / 2);
                        // The lanes holding rows, not padding.
                        let rows_here = rows.len.saturating_sub(row).min(GROUP);
                        let real = ((1u32 << rows_here) - 1) as __mmask16;
                        if KEEP && real == 0 {
                            continue;
                        }
                        let p0 = from - first;
                        let count = in_pass.saturating_sub(p0).min(TILE);
                        for (t, sum) in tile.iter().enumerate().take(count) {
                            let p = p0 + t;
                            // SAFETY: the CPU has AVX-512F (this function's contract).
                            let v = unsafe { scores_of_sums(sum, offset, scale, _mm512_set1_ps(sq[p])) };
                            if !KEEP {
                                // SAFETY: out holds which.len() x n floats (the caller's contract).
                                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add((first + p) * n + row), v) };
                                continue;
                            }
                            let mask = _mm512_mask_cmp_ps_mask::<_CMP_GE_OQ>(real, v, _mm512_set1_ps(floor[p]));
                            let at = _mm512_add_epi32(_mm512_set1_epi32(row as i32), lane);
                            // SAFETY: AVX-512F (this function's contract); `make_room` made room
                            // for this block of groups.
                            unsafe { ends.push(p, mask, at, v) };
                        }
                    }
                }
                if KEEP {
                    ends.close(&mut above[first..first + in_pass]);
                }
            }
            // SAFETY: gives the tile state back (cheaper context switches).
            unsafe { asm!("tilerelease", options(nostack, nomem)) };
        });
    }

    /// The ends of the rows each query of a pass keeps (its [`Above`]'s two vectors): a group's
    /// kept lanes are compressed in a register and stored whole at the end without a branch on
    /// whether any pass, which mispredicted often enough to cost more than the stores
    /// (docs/decisions.md, "amx-keep-branchless"). Every store needs room for 16 lanes past the
    /// end, made a block of [`KEEP_BLOCK`] groups at a time.
    struct Ends([(*mut u32, *mut f32, usize); PASS]);

    impl Ends {
        /// The ends of `above`'s first `count` entries (at most [`PASS`]).
        ///
        /// # Panics
        /// If one of them holds more positions than scores or fewer (one end serves both).
        fn at(above: &[Above], count: usize) -> Self {
            let mut ends = Self([(std::ptr::null_mut(), std::ptr::null_mut(), 0); PASS]);
            for (end, a) in ends.0.iter_mut().zip(above).take(count) {
                assert_eq!(a.positions.len(), a.scores.len(), "kept rows' positions and scores differ in number");
                end.2 = a.len();
            }
            ends
        }

        /// Gives `above` (the pass's queries) the rows stored so far, then makes room in each
        /// for every row of `groups` more groups and 16 lanes beyond.
        fn make_room(&mut self, above: &mut [Above], groups: usize) {
            self.close(above);
            for (end, a) in self.0.iter_mut().zip(above) {
                a.positions.reserve(GROUP * groups + GROUP);
                a.scores.reserve(GROUP * groups + GROUP);
                *end = (a.positions.as_mut_ptr(), a.scores.as_mut_ptr(), a.len());
            }
        }

        /// Appends the lanes of `mask` to the `p`-th query's rows: positions `at`, scores `v`.
        ///
        /// # Safety
        /// The CPU must have AVX-512F; since the last [`Ends::make_room`], the `p`-th query had
        /// fewer pushes than the groups it made room for.
        #[inline(always)]
        unsafe fn push(&mut self, p: usize, mask: __mmask16, at: __m512i, v: __m512) {
            let (positions, scores, len) = &mut self.0[p];
            // SAFETY: 16 entries past `len` are within the capacity (the contract).
            unsafe {
                _mm512_storeu_si512(positions.add(*len).cast(), _mm512_maskz_compress_epi32(mask, at));
                _mm512_storeu_ps(scores.add(*len), _mm512_maskz_compress_ps(mask, v));
            }
            *len += mask.count_ones() as usize;
        }

        /// Gives `above` the rows stored.
        fn close(&self, above: &mut [Above]) {
            for (end, a) in self.0.iter().zip(above) {
                // SAFETY: entries up to `end.2` are written: those `above` held, then pushes.
                unsafe { a.set_len(end.2) };
            }
        }
    }

    /// The codes of the queries `which` as tile rows of [`scan`]: `query_bytes` bytes (whole
    /// lines) per query, the last pass padded with zero codes.
    #[inline(always)]
    fn gather_queries(gathered: &mut Vec<Line>, queries: &QuantQueries, which: &[u32], query_bytes: usize) {
        gathered.clear();
        gathered.resize(which.len().next_multiple_of(PASS) * query_bytes / 64, Line([0; 64]));
        for (to, &q) in gathered.chunks_exact_mut(query_bytes / 64).zip(which) {
            for (line, from) in to.iter_mut().zip(queries.codes(q as usize).chunks_exact(64)) {
                line.0.iter_mut().zip(from).for_each(|(b, &u)| *b = u as i8);
            }
        }
    }

    /// The four tiles of sums (query tile a or b by group 0 or 1) of the query tiles at `a` and
    /// `TILE` rows of `query_bytes` further, by the groups at `b` and `group_bytes` further,
    /// over all `chunks` chunks, stored into `sums`.
    ///
    /// # Safety
    /// AMX is enabled and [`CONFIG`] loaded; the tiles read 16 rows of 64 bytes from `a` (+ 16
    /// rows) at byte 4c of `query_bytes`-byte rows and from `b` (+ `group_bytes`) at byte 64c
    /// of 64-byte rows, for every c < `chunks` in steps of 16: all must be readable.
    #[inline(always)]
    unsafe fn tile_sums(
        a: *const u8,
        b: *const i8,
        chunks: usize,
        query_bytes: usize,
        group_bytes: usize,
        sums: &mut Sums,
    ) {
        // SAFETY: the reads are the caller's contract; the stores fill `sums` (4 x 1024 bytes).
        unsafe {
            asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
            for c in (0..chunks).step_by(STEP) {
                asm!(
                    "tileloadd tmm4, [{a} + {sa} * 1]",
                    "tileloadd tmm5, [{a2} + {sa} * 1]",
                    "tileloadd tmm6, [{b} + {sb} * 1]",
                    "tileloadd tmm7, [{b2} + {sb} * 1]",
                    "tdpbusd tmm0, tmm4, tmm6",
                    "tdpbusd tmm1, tmm4, tmm7",
                    "tdpbusd tmm2, tmm5, tmm6",
                    "tdpbusd tmm3, tmm5, tmm7",
                    a = in(reg) a.add(4 * c),
                    a2 = in(reg) a.add(TILE * query_bytes + 4 * c),
                    b = in(reg) b.add(64 * c),
                    b2 = in(reg) b.add(group_bytes + 64 * c),
                    sa = in(reg) query_bytes,
                    sb = in(reg) 64usize,
                    options(nostack, readonly),
                );
            }
            let to = sums.0.as_mut_ptr().cast::<u8>();
            asm!(
                "tilestored [{t0} + {s} * 1], tmm0",
                "tilestored [{t1} + {s} * 1], tmm1",
                "tilestored [{t2} + {s} * 1], tmm2",
                "tilestored [{t3} + {s} * 1], tmm3",
                t0 = in(reg) to,
                t1 = in(reg) to.add(1024),
                t2 = in(reg) to.add(2048),
                t3 = in(reg) to.add(3072),
                s = in(reg) 64usize,
                options(nostack),
            );
        }
    }

    /// One query's 16 sums of a group as scores, with the same float operations as the other
    /// kernels: `(sum + offset) × scale × sq` (the rows' `offset` and `scale`, the query's `sq`).
    ///
    /// # Safety
    /// The CPU must have AVX-512F (inlined into [`scan`], which has it).
    #[inline(always)]
    unsafe fn scores_of_sums(sum: &[i32; GROUP], offset: __m512i, scale: __m512, sq: __m512) -> __m512 {
        // SAFETY: a 16-lane row of `sums`; AVX-512F is the caller's contract.
        unsafe {
            let sum = _mm512_loadu_si512(sum.as_ptr().cast());
            _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(sum, offset)), scale), sq)
        }
    }
}
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{GROUP, QuantQueries, QuantRows};
    use std::arch::x86_64::*;

    /// Scores all rows against the `Q` queries `which` into `out[s * n + i]`, one 16-row group
    /// (two 8-row halves) at a time.
    ///
    /// # Safety
    /// The CPU must have AVX2. `rows.chunks == queries.chunks` (the query codes are read for
    /// every chunk of the rows), and `out` holds at least `Q x rows.padded_len()` floats: the
    /// stores are unchecked. (`which` holds at least `Q` queries of `queries`; that one is
    /// checked.)
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2")]
    pub unsafe fn tile<const Q: usize>(rows: &QuantRows, queries: &QuantQueries, which: &[u32], out: &mut [f32]) {
        let (n, chunks) = (rows.padded_len(), rows.chunks);
        let group_bytes = chunks * 64;
        let u: [*const i32; Q] = std::array::from_fn(|s| queries.codes(which[s] as usize).as_ptr().cast::<i32>());
        let sq: [__m256; Q] = std::array::from_fn(|s| _mm256_set1_ps(queries.scale[which[s] as usize]));
        let (codes, ones) = (rows.code_bytes().as_ptr(), _mm256_set1_epi16(1));
        // Flips the top bit of each byte: the unsigned code u becomes the signed u - 128.
        let flip = _mm256_set1_epi8(-128);
        for g in 0..n / GROUP {
            let mut acc = [[_mm256_setzero_si256(); 2]; Q];
            for c in 0..chunks {
                // SAFETY: group g < n / GROUP and chunk c < chunks lie within `codes`; query
                // chunk c within its codes (unaligned 4-byte read).
                let (w, magnitude) = unsafe {
                    let at = codes.add(g * group_bytes + c * 64);
                    let w = [_mm256_loadu_si256(at.cast()), _mm256_loadu_si256(at.add(32).cast())];
                    (w, [_mm256_abs_epi8(w[0]), _mm256_abs_epi8(w[1])])
                };
                for s in 0..Q {
                    // SAFETY: as above: chunk c of the query's codes, an unaligned 4-byte read.
                    let q = _mm256_xor_si256(_mm256_set1_epi32(unsafe { u[s].add(c).read_unaligned() }), flip);
                    for h in 0..2 {
                        // |c| * (q with c's sign) = c q, summed in pairs (at most 2 x 127 x
                        // 127: no saturation), then the pairs of each row into its lane.
                        let pairs = _mm256_maddubs_epi16(magnitude[h], _mm256_sign_epi8(q, w[h]));
                        acc[s][h] = _mm256_add_epi32(acc[s][h], _mm256_madd_epi16(pairs, ones));
                    }
                }
            }
            for h in 0..2 {
                let row = g * GROUP + 8 * h;
                // SAFETY: rows row..row + 8 exist in `scale` (padded storage).
                let scale = unsafe { _mm256_loadu_ps(rows.scale.as_ptr().add(row)) };
                for s in 0..Q {
                    // acc holds sum (u - 128) c = sum u c + offset: the scalar code's integer.
                    let v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[s][h]), scale), sq[s]);
                    // SAFETY: out holds Q x n floats from here (sized by the caller).
                    unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(s * n + row), v) };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_core::{kernels, rng};

    fn random(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut r = rng::seeded(seed, 0);
        (0..n * dim).map(|_| rng::normal(&mut r)).collect()
    }

    /// Codes of `n_rows` random rows and `n_queries` random queries (seeds `seed` and
    /// `seed + 1`), and every query, last first (so that a kernel cannot assume they are in
    /// order).
    fn problem(dim: usize, n_rows: usize, n_queries: usize, seed: u64) -> (QuantRows, QuantQueries, Vec<u32>) {
        let mut rows = QuantRows::new(dim);
        random(n_rows, dim, seed).chunks_exact(dim).for_each(|r| rows.push(r));
        let queries = QuantQueries::new(&random(n_queries, dim, seed + 1), dim);
        (rows, queries, (0..n_queries as u32).rev().collect())
    }

    /// Every kernel the CPU has and the scalar code agree bit for bit, on dimensions
    /// that are and are not multiples of 4 (and of 64, AMX's tile row), row counts that do and
    /// do not fill a tile, and query counts with and without a remainder of the 4-query tile
    /// (and of AMX's 32 queries per pass, above and below its minimum).
    #[test]
    fn kernel_equals_scalar_code() {
        let shapes = [
            (128, 100, 7),
            (13, 33, 4),
            (64, 32, 1),
            (5, 1, 3),
            (16, 0, 2),
            (128, 100, 50),
            (64, 70, 33),
            (192, 40, 8),
            (128, 64, 64),
            (100, 40, 40),
            // One pair of groups, one query tile (the AMX kernel pads the second), and a tile
            // and one query.
            (64, 20, 16),
            (128, 32, 17),
            // Single queries take eight groups at a time, then pairs: 20 groups (16 + 4) and
            // 10 groups (8 + 2).
            (64, 300, 5),
            (32, 129, 1),
            // Two queries take four groups at a time, then pairs: 6 groups (4 + 2, after a tile
            // of four queries) and 12 (4 x 3); three queries take pairs.
            (64, 70, 6),
            (64, 170, 2),
            (32, 129, 7),
        ];
        for (dim, n_rows, n_queries) in shapes {
            let (rows, queries, which) = problem(dim, n_rows, n_queries, 1);
            let mut slow = Vec::new();
            scores_scalar(&rows, &queries, &which, &mut slow);
            for &kernel in Kernel::available() {
                let mut fast = Vec::new();
                scores_with(kernel, &rows, &queries, &which, &mut fast);
                assert_eq!(fast.len(), n_queries * rows.padded_len());
                assert_eq!(fast, slow, "{kernel:?}: dim {dim}, {n_rows} rows, {n_queries} queries");
            }
        }
    }

    /// Codes at the ends of their ranges, where a saturating 16-bit pair sum would show: rows
    /// and queries of +-1 only (codes +-127) give the exact integer 127 x 127 x dim (times the
    /// scales) in every kernel.
    #[test]
    fn extreme_codes_do_not_saturate() {
        let dim = 64;
        let plus = vec![1.0f32; dim];
        let alternating: Vec<f32> = (0..dim).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }).collect();
        let minus: Vec<f32> = plus.iter().map(|x| -x).collect();
        let mut rows = QuantRows::new(dim);
        for r in [&plus, &alternating, &minus] {
            rows.push(r);
        }
        let queries = QuantQueries::new(&[plus.clone(), alternating.clone(), minus.clone()].concat(), dim);
        // Exact: the vectors are +-1, so their codes are exactly +-127 and the scores +-dim or 0.
        for &kernel in Kernel::available() {
            let mut out = Vec::new();
            scores_with(kernel, &rows, &queries, &[0, 1, 2], &mut out);
            for (s, q) in [&plus, &alternating, &minus].into_iter().enumerate() {
                for (i, r) in [&plus, &alternating, &minus].into_iter().enumerate() {
                    let got = out[s * rows.padded_len() + i];
                    assert!((got - kernels::dot(q, r)).abs() < 1e-3, "{kernel:?}: query {s}, row {i}: {got}");
                }
            }
        }
    }

    /// Scores approximate the exact inner products within the rounding bound: each coordinate of
    /// `w` and `q` is off by at most half a quantisation step, so
    /// `|err| <= s_w/2 |q|_1 + s_q/2 |w|_1 + D s_w s_q / 4`.
    #[test]
    fn scores_are_within_the_rounding_bound() {
        let dim = 128;
        let w = random(200, dim, 3);
        let q = random(5, dim, 4);
        let mut rows = QuantRows::new(dim);
        w.chunks_exact(dim).for_each(|r| rows.push(r));
        let queries = QuantQueries::new(&q, dim);
        let mut out = Vec::new();
        scores(&rows, &queries, &[0, 1, 2, 3, 4], &mut out);
        let l1 = |x: &[f32]| x.iter().map(|v| v.abs()).sum::<f32>();
        let maxabs = |x: &[f32]| x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (s, qr) in q.chunks_exact(dim).enumerate() {
            for (i, wr) in w.chunks_exact(dim).enumerate() {
                let (sw, sq) = (maxabs(wr) / 127.0, maxabs(qr) / 127.0);
                let bound = sw / 2.0 * l1(qr) + sq / 2.0 * l1(wr) + dim as f32 * sw * sq / 4.0;
                let err = (out[s * rows.padded_len() + i] - kernels::dot(wr, qr)).abs();
                assert!(err <= bound * 1.001 + 1e-4, "query {s}, row {i}: error {err} > bound {bound}");
            }
        }
    }

    /// Every value's code lands where the kernels read it (chunk `c` of row `at` at
    /// `byte(at, c)`), padding values are 0, and the offset holds the codes' sum: dimensions
    /// below, at and above the 64 values quantised at a time, multiples of 4 or not.
    #[test]
    fn set_writes_every_code_where_the_kernels_read_it() {
        for dim in [1, 5, 13, 64, 100, 130] {
            let w = random(20, dim, 7);
            let mut rows = QuantRows::new(dim);
            w.chunks_exact(dim).for_each(|r| rows.push(r));
            for (at, row) in w.chunks_exact(dim).enumerate() {
                let (_, inv) = scale_of(row);
                let want: Vec<i8> =
                    (0..4 * rows.chunks).map(|i| row.get(i).map_or(0, |x| code_of(x * inv) as i8)).collect();
                let got: Vec<i8> =
                    (0..rows.chunks).flat_map(|c| rows.code_bytes()[rows.byte(at, c)..][..4].to_vec()).collect();
                assert_eq!(got, want, "dim {dim}, row {at}");
                assert_eq!(rows.offset[at], -128 * want.iter().map(|&b| b as i32).sum::<i32>());
            }
        }
    }

    /// The largest magnitude, found sixteen values at a time, is the sequential one, NaN skipped.
    #[test]
    fn the_scale_is_the_largest_magnitude_over_127() {
        for n in [0, 1, 15, 16, 17, 100] {
            let x = random(1, n, 8);
            let max = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(scale_of(&x).0, max / 127.0, "{n} values");
        }
        assert_eq!(scale_of(&[f32::NAN, -2.0]).0, 2.0 / 127.0);
        assert_eq!(scale_of(&[f32::INFINITY, 1.0]), (0.0, 0.0));
    }

    /// Overwriting and swap-removing rows keeps every remaining row's scores as if the rows had
    /// been pushed fresh in their final order; emptied tiles are released.
    #[test]
    fn set_and_swap_remove_keep_the_codes_consistent() {
        let dim = 20;
        let w = random(70, dim, 5);
        let mut rows = QuantRows::new(dim);
        let mut order: Vec<usize> = (0..70).collect();
        w.chunks_exact(dim).for_each(|r| rows.push(r));
        // Row 3 takes row 69's values, then 40 rows leave.
        rows.set(3, &w[69 * dim..70 * dim]);
        order[3] = 69;
        for at in [0, 5, 3, 10, 20, 1, 2, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19, 21] {
            rows.swap_remove(at);
            order.swap_remove(at);
        }
        for _ in 0..20 {
            rows.swap_remove(0);
            order.swap_remove(0);
        }
        let mut fresh = QuantRows::new(dim);
        order.iter().for_each(|&i| fresh.push(&w[i * dim..(i + 1) * dim]));
        assert_eq!((rows.len(), rows.padded_len()), (30, 32));
        let queries = QuantQueries::new(&random(3, dim, 6), dim);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        scores(&rows, &queries, &[0, 1, 2], &mut a);
        scores(&fresh, &queries, &[0, 1, 2], &mut b);
        assert_eq!(a, b);
    }

    /// Every kernel's [`scores_at_least_with`] keeps what the scalar scores filtered by the
    /// scalar `keep_at_least` keep, bit for bit and in the same order, appended after what the
    /// outputs held: floors of -inf and below every score (padding rows must still be left
    /// out), each query's lowest score, median, 99th percentile and highest (ties with the floor
    /// pass), above all and NaN (none kept), and per query different; on every tile of the
    /// kernels (one to four queries, one and two queries several groups at a time), padding
    /// within a group and a whole group of it, and no rows.
    #[test]
    fn keeping_kernels_equal_scoring_then_filtering() {
        let shapes = [
            (128, 100, 7),
            (64, 70, 33),
            (128, 4_000, 40),
            (192, 40, 8),
            (13, 33, 12),
            // One query: eight groups at a time, then pairs (20 groups: 16 + 4; 10: 8 + 2).
            (64, 300, 5),
            (32, 129, 1),
            // Two queries: four groups at a time (12 groups, after a tile of four; 6: 4 + 2);
            // three queries: pairs.
            (64, 170, 6),
            (64, 70, 2),
            (32, 129, 3),
            // A whole group of padding (48 rows in 64), and no rows.
            (64, 48, 3),
            (16, 0, 2),
        ];
        for (dim, n_rows, n_queries) in shapes {
            let (rows, queries, which) = problem(dim, n_rows, n_queries, 4);
            let mut scores = Vec::new();
            scores_scalar(&rows, &queries, &which, &mut scores);
            let n = rows.padded_len();
            // Query s's own score at quantile f (0 without rows).
            let quantile = |s: usize, f: f64| {
                let mut own = scores[s * n..s * n + n_rows].to_vec();
                own.sort_unstable_by(|a, b| a.total_cmp(b));
                own.get((n_rows.saturating_sub(1) as f64 * f) as usize).copied().unwrap_or(0.0)
            };
            let each = |f: f64| (0..n_queries).map(|s| quantile(s, f)).collect::<Vec<f32>>();
            for floors in [
                vec![f32::NEG_INFINITY; n_queries],
                vec![f32::MIN; n_queries],
                each(0.0),
                each(0.5),
                each(0.99),
                each(1.0),
                vec![f32::MAX; n_queries],
                vec![f32::NAN; n_queries],
                (0..n_queries).map(|s| quantile(s, s as f64 / n_queries as f64)).collect(),
            ] {
                let start = Above { positions: vec![7], scores: vec![0.5] };
                let mut slow = vec![start.clone(); n_queries];
                for (s, a) in slow.iter_mut().enumerate() {
                    kernels::keep_at_least_scalar(
                        &scores[s * n..s * n + n_rows],
                        floors[s],
                        &mut a.positions,
                        &mut a.scores,
                    );
                }
                for &kernel in Kernel::available() {
                    let mut fast = vec![start.clone(); n_queries];
                    scores_at_least_with(kernel, &rows, &queries, &which, &floors, &mut fast, &mut Vec::new());
                    assert_eq!(
                        fast, slow,
                        "{kernel:?}: dim {dim}, {n_rows} rows, {n_queries} queries, floor {}",
                        floors[0]
                    );
                }
            }
        }
    }

    /// The rounding of the codes is `round` clamped to the code range, halves and NaN included.
    #[test]
    fn codes_round_as_round_does() {
        let mut xs: Vec<f32> = (-600..=600).map(|i| i as f32 * 0.25).collect();
        xs.extend(random(100_000, 1, 3).iter().map(|x| 60.0 * x));
        xs.extend([0.49999997, -0.49999997, 0.5000001, 126.5, -126.5, 127.49, f32::MAX, f32::MIN, -0.0]);
        for x in xs {
            assert_eq!(code_of(x), x.round().clamp(-127.0, 127.0) as i32, "{x}");
        }
        assert_eq!(code_of(f32::NAN), f32::NAN.round().clamp(-127.0, 127.0) as i32);
    }

    #[test]
    fn zero_rows_and_queries_score_zero() {
        let mut rows = QuantRows::new(8);
        rows.push(&[0.0; 8]);
        rows.push(&[1.0; 8]);
        let queries = QuantQueries::new(&[0.0; 8], 8);
        let mut out = Vec::new();
        scores(&rows, &queries, &[0], &mut out);
        assert!(out.iter().all(|&s| s == 0.0), "{out:?}");
    }
}
