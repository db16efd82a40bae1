//! Seeded random numbers.
//!
//! Every random choice in farout comes from a [`Rng`] derived from the run's seed and a stream
//! number (epoch, thread, sample), so that runs are reproducible and resumable.

use rand::SeedableRng;

/// The generator used everywhere: xoshiro256++ (fast, small state, good statistical quality;
/// its output is fixed by its definition, unlike `rand`'s `StdRng`).
pub type Rng = rand_xoshiro::Xoshiro256PlusPlus;

pub use rand::{Rng as RngExt, RngCore};

/// A generator for `(seed, stream)`: independent streams from one seed (SplitMix64 mixing).
pub fn seeded(seed: u64, stream: u64) -> Rng {
    Rng::seed_from_u64(splitmix64(seed ^ splitmix64(stream.wrapping_add(0x9E37_79B9_7F4A_7C15))))
}

/// SplitMix64 finaliser: a bijective 64-bit mixer.
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fisher-Yates shuffle driven by `rng`.
pub fn shuffle<T>(items: &mut [T], rng: &mut Rng) {
    use rand::Rng as _;
    for i in (1..items.len()).rev() {
        let j = rng.random_range(0..=i);
        items.swap(i, j);
    }
}

/// A standard normal draw (Box-Muller; avoids a dependency for one function).
pub fn normal(rng: &mut Rng) -> f32 {
    use rand::Rng as _;
    let u1: f64 = 1.0 - rng.random::<f64>(); // in (0, 1]: ln is finite
    let u2: f64 = rng.random::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        use rand::RngCore;
        assert_eq!(seeded(1, 2).next_u64(), seeded(1, 2).next_u64());
        assert_ne!(seeded(1, 2).next_u64(), seeded(1, 3).next_u64());
        assert_ne!(seeded(1, 2).next_u64(), seeded(2, 2).next_u64());
    }

    #[test]
    fn normal_has_unit_variance() {
        let mut rng = seeded(7, 0);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| normal(&mut rng) as f64).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        // Standard errors: 1/sqrt(n) = 0.0022 for the mean, sqrt(2/n) = 0.0032 for the variance.
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.015, "var {var}");
    }
}
