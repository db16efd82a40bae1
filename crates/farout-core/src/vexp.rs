//! Exponentials of whole score vectors, for softmax: `x <- exp(x - shift)` and the sum.
//!
//! `f32::exp` calls libm once per element, which no compiler vectorises; a softmax over 100,000
//! classes spends much of its time there. [`exp_shifted`] evaluates the exponential in a form
//! LLVM vectorises, compiled for AVX-512 or AVX2 when the CPU has them:
//!
//! ```text
//! e^y = 2^n e^r,   n = round(y log2 e),   r = y - n ln 2  (|r| <= ln 2 / 2, ln 2 in two parts)
//! e^r ~ 1 + r + r^2/2! + ... + r^7/7!      (truncation below 2e-9 relative on that range)
//! 2^n built in the exponent bits (of two factors, so that n = 128 and -126 fit)
//! ```
//!
//! Relative error against libm: below 3e-7 (a few ulps) wherever `e^y` is a normal float;
//! `y < -87.33` (where `e^y` is below the smallest normal float, 1.2e-38) gives 0, `y > 88.72`
//! gives infinity, NaN stays NaN.

/// ln 2 in two parts: `LN2_HI` has its low mantissa bits zero, so `n * LN2_HI` is exact for the
/// `n` that occur (|n| <= 128).
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// Adding then subtracting 1.5 * 2^23 rounds to the nearest integer (for |v| < 2^22).
const ROUND: f32 = 12_582_912.0;
/// Below this `e^y` is not a normal float.
const MIN_ARG: f32 = -87.336_54;
/// Above this `e^y` overflows.
const MAX_ARG: f32 = 88.722_83;

/// `e^y`, in a form that vectorises (no branch, no call); see the module docs.
#[inline(always)]
pub fn exp(y: f32) -> f32 {
    let t = y * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    // The integer n sits in the low mantissa bits of t.
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = (y - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    // 2^n as two factors, each a normal float for every n in [-126, 128].
    let half = ni >> 1;
    let pow2 = |e: i32| f32::from_bits((e.wrapping_add(127) as u32).wrapping_shl(23));
    let v = p * pow2(half) * pow2(ni.wrapping_sub(half));
    // Out of range: selects, not branches. NaN fails both tests and stays NaN.
    let v = if y < MIN_ARG { 0.0 } else { v };
    if y > MAX_ARG { f32::INFINITY } else { v }
}

#[cfg(target_arch = "x86_64")]
use crate::kernels::Isa;

/// Elements per partial sum in [`exp_shifted`]: summed in f32 lanes, then added in f64.
const BLOCK: usize = 64;

/// `x <- exp(x - shift)` element by element; returns the sum of the results (in f64, from f32
/// partial sums of [`BLOCK`] elements). The widest vector unit the CPU has is used.
pub fn exp_shifted(x: &mut [f32], shift: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    match Isa::best() {
        // SAFETY: the CPU has the instruction set (checked by `Isa::best`).
        Isa::Avx512 => return unsafe { exp_shifted_avx512(x, shift) },
        // SAFETY: as above.
        Isa::Avx2 => return unsafe { exp_shifted_avx2(x, shift) },
        Isa::Baseline => {}
    }
    exp_shifted_portable(x, shift)
}

/// [`exp_shifted`] compiled for AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F (as `Isa::best` checks). No other obligation: the body is
/// safe code.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn exp_shifted_avx512(x: &mut [f32], shift: f32) -> f64 {
    exp_shifted_portable(x, shift)
}

/// [`exp_shifted`] compiled for AVX2 and FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA (as `Isa::best` checks). No other obligation: the body
/// is safe code.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_shifted_avx2(x: &mut [f32], shift: f32) -> f64 {
    exp_shifted_portable(x, shift)
}

/// [`exp_shifted`] for whatever target features the caller was compiled with.
#[inline(always)]
fn exp_shifted_portable(x: &mut [f32], shift: f32) -> f64 {
    let mut total = 0.0f64;
    for block in x.chunks_mut(BLOCK) {
        let mut lanes = [0.0f32; 16];
        let mut parts = block.chunks_exact_mut(16);
        for part in &mut parts {
            for (l, v) in part.iter_mut().enumerate() {
                *v = exp(*v - shift);
                lanes[l] += *v;
            }
        }
        let mut tail = 0.0f32;
        for v in parts.into_remainder() {
            *v = exp(*v - shift);
            tail += *v;
        }
        total += f64::from(lanes.iter().sum::<f32>() + tail);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against libm on a dense sweep of the normal range, and at the range's edges.
    #[test]
    fn exp_matches_libm_to_a_few_ulps() {
        let mut worst = 0.0f64;
        let mut y = -87.3f32;
        while y < 88.7 {
            let (got, want) = (f64::from(exp(y)), f64::from(y).exp());
            worst = worst.max((got - want).abs() / want);
            y += 0.000_7;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        for y in [0.0f32, -0.0, 1e-30, -1e-30, 1.0, -1.0, std::f32::consts::LN_2, 80.0, -80.0] {
            let (got, want) = (f64::from(exp(y)), f64::from(y).exp());
            assert!((got - want).abs() / want < 3e-7, "exp({y}) = {got}, want {want}");
        }
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-87.4), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-1e30), 0.0);
        assert_eq!(exp(88.8), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
    }

    /// Every dispatch path gives the scalar function's values, and the sum of them, for lengths
    /// around the block and lane sizes.
    #[test]
    fn exp_shifted_equals_the_scalar_exponentials_and_their_sum() {
        for n in [0, 1, 15, 16, 17, 63, 64, 65, 100, 1000] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 2000) as f32 / 100.0 - 15.0).collect();
            let shift = 4.5;
            let mut got = x.clone();
            let sum = exp_shifted(&mut got, shift);
            let want: Vec<f32> = x.iter().map(|&v| exp(v - shift)).collect();
            assert_eq!(got, want, "n = {n}");
            let want_sum: f64 = x.iter().map(|&v| f64::from(v - shift).exp()).sum();
            assert!((sum - want_sum).abs() <= 1e-6 * want_sum.max(1e-30), "n = {n}: {sum} vs {want_sum}");
            let mut portable = x.clone();
            assert_eq!(exp_shifted_portable(&mut portable, shift), sum, "n = {n}");
            assert_eq!(portable, got);
        }
        let mut with_nan = vec![0.0, f32::NAN, 1.0];
        assert!(exp_shifted(&mut with_nan, 0.0).is_nan());
    }
}
