//! Spherical k-means over the norm-augmented rows: the centroids of [`SphericalIndex`] and the
//! assignment of rows to them (at build and when a refresh reassigns drifted rows).
//!
//! Centroids are unit vectors in the augmented space (`D + 1` coordinates); a row belongs to the
//! centroid with the largest dot product (cosine) with its augmentation. With `C ~ sqrt(K)`
//! centroids, probing costs about as much as scanning one cluster. Each iteration sets a
//! centroid to the normalised sum of its members' augmented rows. The fit runs on a random
//! subset of at most `points_per_centroid * C` rows, so build time stops growing with K; the
//! index then assigns every row once.
//!
//! [`SphericalIndex`]: super::SphericalIndex

use super::SphericalConfig;
use crate::Rows;
use crate::augment::NormAugmentation;
use farout_core::gemm::{self, Op};
use farout_core::{ClassId, Matrix, kernels, rng};
use rayon::prelude::*;

/// Rows per block of the k-means assignment product (bounds its temporary to block x C).
const ASSIGN_BLOCK: usize = 4096;

/// Number of centroids for `k` rows: `config.n_centroids`, or round(sqrt(K)) when that is 0;
/// at least 1, at most K.
pub(super) fn n_centroids(k: usize, config: &SphericalConfig) -> usize {
    if config.n_centroids > 0 { config.n_centroids } else { (k as f64).sqrt().round() as usize }.clamp(1, k.max(1))
}

/// Unit centroids, `C x (D + 1)`, fitted by `config.iterations` rounds of spherical k-means on
/// the augmented rows of `w` (a random subset of them when K is large).
pub(super) fn fit(w: Rows, augmentation: &NormAugmentation, config: &SphericalConfig) -> Matrix {
    let (k, d) = (w.len(), w.dim());
    let c = n_centroids(k, config);
    // Initialise with distinct random rows.
    let mut order: Vec<usize> = (0..k).collect();
    let mut r = rng::seeded(config.seed, 0x5F4E);
    rng::shuffle(&mut order, &mut r);
    let mut centroids = Matrix::zeros(c, d + 1);
    for (j, &i) in order.iter().take(c).enumerate() {
        augmentation.augment_row(w.row(i), centroids.row_mut(j));
    }
    if k == 0 {
        // No rows: nothing to fit or to re-seed an empty cluster with; one zero centroid
        // heads the one (empty) cluster.
        return centroids;
    }
    // Fit the centroids on at most `points_per_centroid * C` rows (a random subset), then
    // assign every row once.
    let cap = config.points_per_centroid.saturating_mul(c).max(c);
    let fit: Option<Vec<ClassId>> = (k > cap).then(|| order[..cap].iter().map(|&i| i as ClassId).collect());
    let fit_row = |i: usize| fit.as_ref().map_or(i, |f| f[i] as usize);
    let mut fit_assign = vec![0u32; fit.as_ref().map_or(k, Vec::len)];
    let mut fit_cos = vec![0.0f32; fit_assign.len()];
    for it in 0..config.iterations {
        assign_rows(w, augmentation, &centroids, fit.as_deref(), &mut fit_assign, &mut fit_cos);
        // Centroid = normalised sum of its members' augmented rows; an empty cluster is
        // re-seeded with a random row.
        let mut sums = Matrix::zeros(c, d + 1);
        let mut counts = vec![0usize; c];
        let mut x = vec![0.0; d + 1];
        for (i, &a) in fit_assign.iter().enumerate() {
            augmentation.augment_row(w.row(fit_row(i)), &mut x);
            kernels::axpy(1.0, &x, sums.row_mut(a as usize));
            counts[a as usize] += 1;
        }
        for j in 0..c {
            if counts[j] == 0 {
                let i = order[(c + it * c + j) % k.max(1)];
                augmentation.augment_row(w.row(i), sums.row_mut(j));
            }
            kernels::normalize(sums.row_mut(j));
        }
        centroids = sums;
    }
    centroids
}

/// Assigns rows to the centroid with the largest dot product (into `cos`), by blocked matrix
/// products: every row when `rows` is `None` (`assign` has K entries), else `rows[j]` into
/// `assign[j]`.
pub(super) fn assign_rows(
    w: Rows,
    augmentation: &NormAugmentation,
    centroids: &Matrix,
    rows: Option<&[ClassId]>,
    assign: &mut [u32],
    cos: &mut [f32],
) {
    let (d, c) = (w.dim(), centroids.rows());
    let blocks = assign.par_chunks_mut(ASSIGN_BLOCK).zip(cos.par_chunks_mut(ASSIGN_BLOCK));
    blocks.enumerate().for_each(|(b, (out, out_cos))| {
        let start = b * ASSIGN_BLOCK;
        let n = out.len();
        let mut x = Matrix::zeros(n, d + 1);
        for j in 0..n {
            let r = rows.map_or(start + j, |rows| rows[start + j] as usize);
            augmentation.augment_row(w.row(r), x.row_mut(j));
        }
        let mut s = vec![0.0f32; n * c];
        gemm::gemm(&mut s, n, c, 0.0, 1.0, x.as_slice(), (n, d + 1), Op::N, centroids.as_slice(), (c, d + 1), Op::T);
        for ((o, o_cos), row) in out.iter_mut().zip(out_cos.iter_mut()).zip(s.chunks_exact(c)) {
            let (best, j) = first_max(row);
            (*o_cos, *o) = (best, j as u32);
        }
    });
}

/// Values of `row` [`first_max`] checks at once for the maximum.
const LANES: usize = 16;

/// The largest value of `row` and its first position, as a scan that keeps the first value
/// strictly larger than all before it returns them (`(-inf, 0)` when no value exceeds -inf).
/// In two passes the compiler vectorises: lane-wise maxima ([`kernels::max_of`]), then the
/// first block of [`LANES`] values holding the maximum (a branchy scan, one value at a time,
/// took a fifth of the k-means time at 100,000 rows and 316 centroids).
fn first_max(row: &[f32]) -> (f32, usize) {
    let best = kernels::max(row);
    if best == f32::NEG_INFINITY {
        return (best, 0);
    }
    let start = row
        .chunks(LANES)
        .position(|block| block.iter().fold(false, |hit, &v| hit | (v == best)))
        .map_or(0, |b| b * LANES);
    let j = start + row[start..].iter().position(|&v| v == best).unwrap_or(0);
    (row[j], j)
}

#[cfg(test)]
mod tests {
    use super::super::SphericalIndex;
    use super::*;
    use crate::testutil::clustered;
    use farout_core::rng::RngExt;

    #[test]
    fn an_index_over_no_rows_finds_nothing() {
        let w = Matrix::zeros(0, 8);
        let index = SphericalIndex::build(Rows::all(&w), &SphericalConfig::default());
        assert_eq!(index.cluster_sizes(), [0]);
        let mut out = Vec::new();
        crate::MipsIndex::search(&index, Rows::all(&w), &[1.0; 8], 5, &mut out);
        assert!(out.is_empty());
    }

    /// The first position of the largest value, as the one-by-one scan finds it: ties, signed
    /// zeros, infinities, NaN and every length around the lane count.
    #[test]
    fn first_max_equals_the_scan() {
        let scan = |row: &[f32]| {
            let mut best = (f32::NEG_INFINITY, 0);
            for (j, &v) in row.iter().enumerate() {
                if v > best.0 {
                    best = (v, j);
                }
            }
            best
        };
        let mut r = rng::seeded(3, 0);
        let special = [0.0, -0.0, 1.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        for n in 0..70 {
            for trial in 0..50 {
                let row: Vec<f32> = (0..n)
                    .map(|_| match trial % 3 {
                        0 => r.random::<f32>(),
                        1 => (r.random::<f32>() * 4.0).floor(), // many ties
                        _ => special[(r.random::<f32>() * 6.0) as usize % 6],
                    })
                    .collect();
                let (a, b) = (first_max(&row), scan(&row));
                assert_eq!((a.0.to_bits(), a.1), (b.0.to_bits(), b.1), "{row:?}");
            }
        }
    }

    #[test]
    fn default_centroid_count_is_sqrt_k() {
        let (w, _) = clustered(20_000, 8);
        assert_eq!(
            SphericalIndex::build(Rows::all(&w), &SphericalConfig { iterations: 1, ..SphericalConfig::default() })
                .n_centroids(),
            141
        );
    }
}
