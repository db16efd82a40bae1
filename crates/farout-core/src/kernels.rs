//! Dense f32 vector kernels.
//!
//! Written with eight independent accumulators so that LLVM vectorises them (a single running
//! sum would serialise on the floating-point add latency). Each has a scalar reference in the
//! tests.

const LANES: usize = 8;

/// Inner product `a . b`. Panics in debug builds when the lengths differ.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0.0;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    acc.iter().sum::<f32>() + tail
}

/// Inner product `a . b` on the widest vector unit the CPU has, chosen at run time: with
/// AVX-512, 32 fused multiply-adds per step in two 16-lane accumulators; with AVX2 and FMA, 32
/// per step in four 8-lane ones; elsewhere [`dot`]. Agrees with [`dot`] up to rounding (other
/// summation order, fused products), so use one or the other wherever results are compared bit
/// for bit. [`dot`] compiles for the baseline x86-64 target (SSE2); this is for hot loops over
/// long vectors.
#[inline]
pub fn dot_simd(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    match Isa::best() {
        // SAFETY: the CPU has the instruction set (checked by `Isa::best`).
        Isa::Avx512 => return unsafe { avx512::dot(a, b) },
        // SAFETY: as above.
        Isa::Avx2 => return unsafe { avx2::dot(a, b) },
        Isa::Baseline => {}
    }
    dot(a, b)
}

/// Appends to `positions` the positions (in `scores`) of the scores at or above `threshold`,
/// ascending, and the scores themselves to `kept` (NaN never passes). With AVX-512, 16 scores
/// per step by one compare and two compress-stores; with AVX2, 8 per step by a compare and two
/// permutations from a table indexed by the comparison mask; elsewhere a branch-free scalar
/// loop. All give the same output.
#[inline]
pub fn keep_at_least(scores: &[f32], threshold: f32, positions: &mut Vec<u32>, kept: &mut Vec<f32>) {
    #[cfg(target_arch = "x86_64")]
    match Isa::best() {
        // SAFETY: the CPU has the instruction set and POPCNT (checked by `Isa::best`).
        Isa::Avx512 => return unsafe { avx512::keep_at_least(scores, threshold, positions, kept) },
        // SAFETY: as above.
        Isa::Avx2 => return unsafe { avx2::keep_at_least(scores, threshold, positions, kept) },
        Isa::Baseline => {}
    }
    keep_at_least_scalar(scores, threshold, positions, kept);
}

/// How many of `scores` are at least `threshold` (NaN never is).
pub fn count_at_least(scores: &[f32], threshold: f32) -> usize {
    #[cfg(target_arch = "x86_64")]
    match Isa::best() {
        // SAFETY: the CPU has the instruction set and POPCNT (checked by `Isa::best`).
        Isa::Avx512 => return unsafe { avx512::count_at_least(scores, threshold) },
        // SAFETY: as above.
        Isa::Avx2 => return unsafe { avx2::count_at_least(scores, threshold) },
        Isa::Baseline => {}
    }
    count_at_least_scalar(scores, threshold)
}

/// [`count_at_least`] in portable code (the reference of the vector kernels).
pub fn count_at_least_scalar(scores: &[f32], threshold: f32) -> usize {
    scores.iter().map(|&s| (s >= threshold) as usize).sum()
}

/// A level of x86 vector instructions that kernels may use, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// Whatever the build targets (SSE2 on x86-64).
    Baseline,
    /// AVX2 with FMA.
    Avx2,
    /// AVX-512 (and the extensions each kernel checks for).
    Avx512,
    /// AVX-512 and the AMX tile instructions (int8 scoring).
    Amx,
}

/// The environment variable that caps [`simd_cap`].
pub const SIMD_ENV: &str = "FAROUT_SIMD";

/// The widest vector instructions farout's kernels may use, whatever the CPU has:
/// `FAROUT_SIMD=avx512` makes a machine with AMX run the AVX-512 kernels only, `avx2` (or
/// `baseline`) the kernels of a CPU without AVX-512, to measure and test those paths; unset or
/// `amx`, no cap. Read once; another value is reported on standard error and ignored.
pub fn simd_cap() -> SimdLevel {
    static CAP: std::sync::OnceLock<SimdLevel> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| match std::env::var(SIMD_ENV).as_deref() {
        Err(_) | Ok("" | "amx") => SimdLevel::Amx,
        Ok("avx512") => SimdLevel::Avx512,
        Ok("avx2") => SimdLevel::Avx2,
        Ok("baseline") => SimdLevel::Baseline,
        Ok(other) => {
            eprintln!("warning: {SIMD_ENV}={other:?} is not amx, avx512, avx2 or baseline; ignored");
            SimdLevel::Amx
        }
    })
}

/// The vector instructions the kernels of this crate run with: the CPU's widest within
/// [`simd_cap`].
pub fn simd_in_use() -> SimdLevel {
    #[cfg(target_arch = "x86_64")]
    return match Isa::best() {
        Isa::Avx512 => SimdLevel::Avx512,
        Isa::Avx2 => SimdLevel::Avx2,
        Isa::Baseline => SimdLevel::Baseline,
    };
    #[cfg(not(target_arch = "x86_64"))]
    SimdLevel::Baseline
}

/// The widest vector instruction set of this CPU that the kernels use.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX-512F.
    Avx512,
    /// AVX2 with FMA.
    Avx2,
    /// Whatever the build targets (SSE2 on x86-64).
    Baseline,
}

impl Isa {
    /// Checked once, within [`simd_cap`].
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn best() -> Isa {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let cap = simd_cap();
            // POPCNT too (every CPU with AVX2 has it): the keep and count kernels count the
            // lanes of a mask with it, which without it compiles to a dozen bit operations.
            let popcnt = is_x86_feature_detected!("popcnt");
            if cap >= SimdLevel::Avx512 && is_x86_feature_detected!("avx512f") && popcnt {
                Isa::Avx512
            } else if cap >= SimdLevel::Avx2
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && popcnt
            {
                Isa::Avx2
            } else {
                Isa::Baseline
            }
        })
    }
}

/// [`keep_at_least`] in portable code (also the reference it is tested against).
pub fn keep_at_least_scalar(scores: &[f32], threshold: f32, positions: &mut Vec<u32>, kept: &mut Vec<f32>) {
    let (p0, k0) = (positions.len(), kept.len());
    positions.resize(p0 + scores.len(), 0);
    kept.resize(k0 + scores.len(), 0.0);
    let mut m = 0;
    for (i, &s) in scores.iter().enumerate() {
        // Write every entry, advance only past the kept ones: no branch to mispredict.
        positions[p0 + m] = i as u32;
        kept[k0 + m] = s;
        m += (s >= threshold) as usize;
    }
    positions.truncate(p0 + m);
    kept.truncate(k0 + m);
}

/// The vector kernels' tail of [`keep_at_least`]: the scores from position `from` on.
#[cfg(target_arch = "x86_64")]
fn keep_tail(scores: &[f32], from: usize, threshold: f32, positions: &mut Vec<u32>, kept: &mut Vec<f32>) {
    for (j, &s) in scores.iter().enumerate().skip(from) {
        if s >= threshold {
            positions.push(j as u32);
            kept.push(s);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// [`dot`](super::dot) with AVX-512: `a` and `b` may differ in length (the shorter one
    /// decides).
    ///
    /// # Safety
    /// The CPU must support AVX-512F. Every load is bounds-checked against both slices here, so
    /// there is no obligation on the arguments.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut i = 0;
        while i + 32 <= n {
            // SAFETY: i + 32 <= n floats are in bounds of both slices.
            unsafe {
                let (pa, pb) = (a.as_ptr().add(i), b.as_ptr().add(i));
                s0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa), _mm512_loadu_ps(pb), s0);
                s1 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(16)), _mm512_loadu_ps(pb.add(16)), s1);
            }
            i += 32;
        }
        if i + 16 <= n {
            // SAFETY: as above.
            unsafe { s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a.as_ptr().add(i)), _mm512_loadu_ps(b.as_ptr().add(i)), s0) };
            i += 16;
        }
        _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) + a[i..n].iter().zip(&b[i..n]).map(|(x, y)| x * y).sum::<f32>()
    }

    /// [`super::count_at_least`], 16 scores per step.
    ///
    /// # Safety
    /// The CPU must support AVX-512F and POPCNT.
    #[target_feature(enable = "avx512f,popcnt")]
    pub unsafe fn count_at_least(scores: &[f32], threshold: f32) -> usize {
        let thr = _mm512_set1_ps(threshold);
        let blocks = scores.chunks_exact(16);
        let tail = super::count_at_least_scalar(blocks.remainder(), threshold);
        let body: usize = blocks
            .map(|b| {
                // SAFETY: each block holds 16 floats; AVX-512F is the caller's contract.
                let kept = unsafe { _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_loadu_ps(b.as_ptr()), thr) };
                kept.count_ones() as usize
            })
            .sum();
        body + tail
    }

    /// [`keep_at_least`](super::keep_at_least) with AVX-512.
    ///
    /// # Safety
    /// The CPU must support AVX-512F and POPCNT. The function reserves the room it writes into
    /// itself, so there is no obligation on the arguments.
    #[target_feature(enable = "avx512f,popcnt")]
    pub unsafe fn keep_at_least(scores: &[f32], threshold: f32, positions: &mut Vec<u32>, kept: &mut Vec<f32>) {
        let n = scores.len();
        let (p0, k0) = (positions.len(), kept.len());
        // Room for every score; trimmed to the kept ones at the end.
        positions.reserve(n);
        kept.reserve(n);
        let (thr, step) = (_mm512_set1_ps(threshold), _mm512_set1_epi32(16));
        let mut at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let (mut i, mut m) = (0, 0);
        // The kept lanes are compressed in a register and stored as a whole vector: a
        // compress-store to memory is microcoded on AMD Zen 4 (tens of cycles) and would cost
        // more than the comparisons. Every block stores, kept lanes or none, and the end moves
        // by their count: no branch, which a scan keeping rows in some blocks and not in others
        // would mispredict.
        // SAFETY: loads read scores[i..i + 16] with i + 16 <= n; the stores write 16 entries
        // from p0 + m and k0 + m, m <= i, so m + 16 <= n: within the capacity reserved for n.
        unsafe {
            let (pos, out) = (positions.as_mut_ptr().add(p0), kept.as_mut_ptr().add(k0));
            while i + 16 <= n {
                let v = _mm512_loadu_ps(scores.as_ptr().add(i));
                let mask = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, thr);
                _mm512_storeu_si512(pos.add(m).cast(), _mm512_maskz_compress_epi32(mask, at));
                _mm512_storeu_ps(out.add(m), _mm512_maskz_compress_ps(mask, v));
                m += mask.count_ones() as usize;
                at = _mm512_add_epi32(at, step);
                i += 16;
            }
            positions.set_len(p0 + m);
            kept.set_len(k0 + m);
        }
        super::keep_tail(scores, i, threshold, positions, kept);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// [`dot`](super::dot) with AVX2 and FMA: `a` and `b` may differ in length (the shorter
    /// one decides).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA. Every load is bounds-checked against both slices
    /// here, so there is no obligation on the arguments.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let mut s = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (t, s) in s.iter_mut().enumerate() {
                // SAFETY: i + 32 <= n floats are in bounds of both slices.
                unsafe {
                    let (pa, pb) = (a.as_ptr().add(i + 8 * t), b.as_ptr().add(i + 8 * t));
                    *s = _mm256_fmadd_ps(_mm256_loadu_ps(pa), _mm256_loadu_ps(pb), *s);
                }
            }
            i += 32;
        }
        while i + 8 <= n {
            // SAFETY: as above.
            unsafe {
                s[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), s[0])
            };
            i += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3]));
        let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        let v = _mm_add_ss(v, _mm_shuffle_ps::<1>(v, v));
        _mm_cvtss_f32(v) + a[i..n].iter().zip(&b[i..n]).map(|(x, y)| x * y).sum::<f32>()
    }

    /// `PACK[m]`: the lanes whose bit is set in the 8-bit mask `m`, ascending, then zeros — the
    /// permutation that moves the kept lanes to the front.
    const PACK: [[u32; 8]; 256] = {
        let mut table = [[0u32; 8]; 256];
        let mut m = 0;
        while m < 256 {
            let (mut lane, mut k) = (0, 0);
            while lane < 8 {
                if m & (1 << lane) != 0 {
                    table[m][k] = lane as u32;
                    k += 1;
                }
                lane += 1;
            }
            m += 1;
        }
        table
    };

    /// [`super::count_at_least`], 8 scores per step.
    ///
    /// # Safety
    /// The CPU must support AVX2 and POPCNT.
    #[target_feature(enable = "avx2,popcnt")]
    pub unsafe fn count_at_least(scores: &[f32], threshold: f32) -> usize {
        let thr = _mm256_set1_ps(threshold);
        let blocks = scores.chunks_exact(8);
        let tail = super::count_at_least_scalar(blocks.remainder(), threshold);
        let body: usize = blocks
            .map(|b| {
                // SAFETY: each block holds 8 floats; AVX2 is the caller's contract.
                let kept = unsafe { _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_loadu_ps(b.as_ptr()), thr)) };
                kept.count_ones() as usize
            })
            .sum();
        body + tail
    }

    /// [`keep_at_least`](super::keep_at_least) with AVX2.
    ///
    /// # Safety
    /// The CPU must support AVX2 and POPCNT. The function reserves the room it writes into
    /// itself, so there is no obligation on the arguments.
    #[target_feature(enable = "avx2,popcnt")]
    pub unsafe fn keep_at_least(scores: &[f32], threshold: f32, positions: &mut Vec<u32>, kept: &mut Vec<f32>) {
        let n = scores.len();
        let (p0, k0) = (positions.len(), kept.len());
        // Room for every score; trimmed to the kept ones at the end.
        positions.reserve(n);
        kept.reserve(n);
        let (thr, step) = (_mm256_set1_ps(threshold), _mm256_set1_epi32(8));
        let mut at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let (mut i, mut m) = (0, 0);
        // SAFETY: loads read scores[i..i + 8] with i + 8 <= n; the stores write 8 entries from
        // p0 + m and k0 + m, m <= i, so within the capacity reserved for n; PACK rows are 8 u32.
        unsafe {
            let (pos, out) = (positions.as_mut_ptr().add(p0), kept.as_mut_ptr().add(k0));
            while i + 8 <= n {
                let v = _mm256_loadu_ps(scores.as_ptr().add(i));
                let mask = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(v, thr)) as usize;
                if mask != 0 {
                    let pack = _mm256_loadu_si256(PACK[mask].as_ptr().cast());
                    _mm256_storeu_si256(pos.add(m).cast(), _mm256_permutevar8x32_epi32(at, pack));
                    _mm256_storeu_ps(out.add(m), _mm256_permutevar8x32_ps(v, pack));
                    m += mask.count_ones() as usize;
                }
                at = _mm256_add_epi32(at, step);
                i += 8;
            }
            positions.set_len(p0 + m);
            kept.set_len(k0 + m);
        }
        super::keep_tail(scores, i, threshold, positions, kept);
    }
}

/// Asks the CPU to start loading `x` into its caches (a hint: no effect on any result). Useful
/// before reading rows scattered over a large matrix, so that several loads overlap.
#[inline]
pub fn prefetch<T>(x: &[T]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_T0 }, T>(x);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// Asks the CPU to start loading `x` into its second-level cache, not the first (a hint: no
/// effect on any result). For many scattered rows requested ahead of their use: a first-level
/// request holds one of the core's few line-fill buffers until its line arrives, so requests for
/// a few rows ahead fill them and stall the next ones; second-level requests queue in the
/// larger second-level miss queue, and the row moves to the first level when it is read.
#[inline]
pub fn prefetch_l2<T>(x: &[T]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_T1 }, T>(x);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// `_mm_prefetch` with `HINT` of one address per 64-byte cache line of `x` and of its last
/// element, in case `x` does not start a line.
#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetch_lines<const HINT: i32, T>(x: &[T]) {
    for v in x.iter().step_by((64 / size_of::<T>().max(1)).max(1)).chain(x.last()) {
        // SAFETY: a prefetch reads nothing architecturally and never faults; the address is in
        // bounds anyway.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>((v as *const T).cast()) };
    }
}

/// `y += alpha * x`.
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// `x *= alpha`.
#[inline]
pub fn scale(alpha: f32, x: &mut [f32]) {
    for xi in x {
        *xi *= alpha;
    }
}

/// Euclidean norm.
#[inline]
pub fn norm(x: &[f32]) -> f32 {
    dot(x, x).sqrt()
}

/// Cosine of the angle between `a` and `b`; 1 when both are zero (identical), 0 when only one
/// is (used to compare approximate gradients with exact ones).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (na, nb) = (norm(a), norm(b));
    if na == 0.0 && nb == 0.0 { 1.0 } else { dot(a, b) / (na * nb).max(f32::MIN_POSITIVE) }
}

/// Scales `x` to unit Euclidean norm; a zero vector stays zero. Returns the old norm.
#[inline]
pub fn normalize(x: &mut [f32]) -> f32 {
    let n = norm(x);
    if n > 0.0 {
        scale(1.0 / n, x);
    }
    n
}

/// `out[i] = w_i . x` for every row `w_i` of the row-major `rows x x.len()` matrix `w`.
pub fn gemv(w: &[f32], x: &[f32], out: &mut [f32]) {
    let d = x.len();
    debug_assert_eq!(w.len(), out.len() * d);
    for (o, row) in out.iter_mut().zip(w.chunks_exact(d.max(1))) {
        *o = dot(row, x);
    }
}

/// The largest `x_i`, NaN skipped (`-inf` when none is left): [`max_of`] the values themselves.
#[inline]
pub fn max(x: &[f32]) -> f32 {
    max_of(x, |v| v)
}

/// The largest `f(x_i)`, values for which `f` gives NaN skipped (`-inf` when none is left):
/// sixteen running maxima side by side, which LLVM vectorises (a sequential fold does not).
#[inline]
pub fn max_of(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    const MAX_LANES: usize = 16;
    let larger = |m: f32, v: f32| if v > m { v } else { m };
    let mut lanes = [f32::NEG_INFINITY; MAX_LANES];
    let mut blocks = x.chunks_exact(MAX_LANES);
    for block in &mut blocks {
        for (m, &v) in lanes.iter_mut().zip(block) {
            *m = larger(*m, f(v));
        }
    }
    let tail = blocks.remainder().iter().map(|&v| f(v));
    lanes.into_iter().chain(tail).fold(f32::NEG_INFINITY, larger)
}

/// Numerically stable `log(sum_i exp(z_i))`; `-inf` for an empty slice.
pub fn log_sum_exp(z: &[f32]) -> f32 {
    let max = max(z);
    if !max.is_finite() {
        return max;
    }
    let s: f32 = z.iter().map(|&v| (v - max).exp()).sum();
    max + s.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane-wise maximum is the sequential one on every length around the lane count,
    /// NaN skipped, `-inf` for none.
    #[test]
    fn max_of_equals_the_sequential_maximum() {
        for n in 0..40 {
            let x: Vec<f32> =
                (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) * if i % 7 == 3 { f32::NAN } else { 1.0 }).collect();
            let want = x.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
            assert_eq!(max(&x), want, "{n} values");
            let want_abs = x.iter().fold(f32::NEG_INFINITY, |m, &v| if v.abs() > m { v.abs() } else { m });
            assert_eq!(max_of(&x, f32::abs), want_abs, "{n} values, magnitudes");
        }
        assert_eq!(max(&[f32::NAN]), f32::NEG_INFINITY);
        assert_eq!(max(&[1.0, f32::INFINITY]), f32::INFINITY);
    }

    fn scalar_dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
    }

    type Dot = fn(&[f32], &[f32]) -> f32;
    type Keep = fn(&[f32], f32, &mut Vec<u32>, &mut Vec<f32>);

    /// Every implementation of the dot kernels that this CPU runs, by name.
    fn dots() -> Vec<(&'static str, Dot)> {
        let mut dots: Vec<(&str, Dot)> = vec![("dot", dot), ("dot_simd", dot_simd)];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has the features (checked just above).
                dots.push(("avx2", |a, b| unsafe { avx2::dot(a, b) }));
            }
            if is_x86_feature_detected!("avx512f") {
                // SAFETY: as above.
                dots.push(("avx512", |a, b| unsafe { avx512::dot(a, b) }));
            }
        }
        dots
    }

    /// Every implementation of [`keep_at_least`] that this CPU runs, by name.
    fn keeps() -> Vec<(&'static str, Keep)> {
        let mut keeps: Vec<(&str, Keep)> = vec![("keep_at_least", keep_at_least), ("scalar", keep_at_least_scalar)];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("popcnt") {
                // SAFETY: the CPU has the features (checked just above).
                keeps.push(("avx2", |s, t, p, k| unsafe { avx2::keep_at_least(s, t, p, k) }));
            }
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("popcnt") {
                // SAFETY: as above.
                keeps.push(("avx512", |s, t, p, k| unsafe { avx512::keep_at_least(s, t, p, k) }));
            }
        }
        keeps
    }

    /// Every dot kernel, on every tail length past the vector widths (8, 16 and 32 floats).
    #[test]
    fn dots_match_scalar_reference_for_every_tail_length() {
        for (name, kernel) in dots() {
            for n in 0..100 {
                let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
                let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
                assert!((kernel(&a, &b) as f64 - scalar_dot(&a, &b)).abs() < 1e-5, "{name}, n = {n}");
            }
        }
    }

    /// Scores of every length below 70 (every tail past 8 and 16) with NaN and values tied at
    /// the threshold 0.25, each with thresholds from minus to plus infinity.
    fn filter_cases() -> impl Iterator<Item = (usize, Vec<f32>, f32)> {
        (0..70).flat_map(|n| {
            let scores: Vec<f32> = (0..n)
                .map(|i| match i % 11 {
                    3 => f32::NAN,
                    5 => 0.25,
                    _ => (i as f32 * 0.77).sin(),
                })
                .collect();
            [f32::NEG_INFINITY, -0.5, 0.25, 0.9, f32::INFINITY].map(move |t| (n, scores.clone(), t))
        })
    }

    /// Every keep kernel appends what a filter keeps, for every tail length past 8 and 16, with
    /// NaN, ties at the threshold and earlier content in the outputs.
    #[test]
    fn keep_at_least_kernels_equal_a_filter() {
        let keeps = keeps();
        for (n, scores, threshold) in filter_cases() {
            let want: Vec<(u32, f32)> =
                scores.iter().enumerate().filter(|(_, s)| **s >= threshold).map(|(i, &s)| (i as u32, s)).collect();
            for (name, kernel) in &keeps {
                let (mut positions, mut kept) = (vec![7u32], vec![7.0f32]);
                kernel(&scores, threshold, &mut positions, &mut kept);
                let got: Vec<(u32, f32)> = positions.into_iter().zip(kept).collect();
                assert_eq!(got[0], (7, 7.0));
                assert_eq!(got[1..], want[..], "{name}: n = {n}, threshold {threshold}");
            }
        }
    }

    /// Every count kernel counts what a filter keeps, for every tail length past 8 and 16,
    /// with NaN and ties at the threshold.
    #[test]
    fn count_at_least_kernels_equal_a_filter() {
        type Count = fn(&[f32], f32) -> usize;
        let mut counts: Vec<(&str, Count)> = vec![("count_at_least", count_at_least)];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("popcnt") {
                // SAFETY: the CPU has the features (checked just above).
                counts.push(("avx2", |s, t| unsafe { avx2::count_at_least(s, t) }));
            }
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("popcnt") {
                // SAFETY: as above.
                counts.push(("avx512", |s, t| unsafe { avx512::count_at_least(s, t) }));
            }
        }
        for (n, scores, threshold) in filter_cases() {
            let want = scores.iter().filter(|s| **s >= threshold).count();
            assert_eq!(count_at_least_scalar(&scores, threshold), want, "scalar: n = {n}, threshold {threshold}");
            for (name, kernel) in &counts {
                assert_eq!(kernel(&scores, threshold), want, "{name}: n = {n}, threshold {threshold}");
            }
        }
    }

    #[test]
    fn gemv_matches_row_dots() {
        let w: Vec<f32> = (0..35).map(|i| i as f32 * 0.1).collect();
        let x = [1.0, -2.0, 0.5, 0.0, 3.0];
        let mut out = [0.0; 7];
        gemv(&w, &x, &mut out);
        for (r, o) in out.iter().enumerate() {
            assert!((*o as f64 - scalar_dot(&w[r * 5..r * 5 + 5], &x)).abs() < 1e-5);
        }
    }

    #[test]
    fn log_sum_exp_is_stable_for_large_inputs() {
        let z = [1000.0, 1000.0];
        assert!((log_sum_exp(&z) - (1000.0 + 2f32.ln())).abs() < 1e-3);
        assert_eq!(log_sum_exp(&[]), f32::NEG_INFINITY);
    }

    #[test]
    fn normalize_gives_unit_norm_and_keeps_zero() {
        let mut x = [3.0, 4.0];
        assert_eq!(normalize(&mut x), 5.0);
        assert!((norm(&x) - 1.0).abs() < 1e-6);
        let mut z = [0.0, 0.0];
        normalize(&mut z);
        assert_eq!(z, [0.0, 0.0]);
    }
}
