//! Norm augmentation: maximum inner product search turned into cosine (angular) search, the
//! reduction the spherical, SimpleLSH and HNSW indexes share.
//!
//! Inner products are not a similarity that k-means, hashing by angle or a metric graph can
//! organise: a row can score higher against a query than the query against itself. Appending
//! one coordinate makes every row a unit vector while keeping the inner products' order
//! (Bachrach et al. 2014; in this scaled form, Neyshabur & Srebro 2015). With a norm bound
//! `M >= max_k |w_k|`, a row `w` (length D) becomes
//!
//! ```text
//! x = [w / M, sqrt(1 - |w|^2 / M^2)]        (length D + 1, |x| = 1)
//! ```
//!
//! and a query `q` becomes `[q, 0]`, so that
//!
//! ```text
//! x . [q, 0] = w . q / M
//! ```
//!
//! For one query the order of inner products is then the order of cosines between the unit `x`
//! and `[q, 0]`, and of Euclidean distances to the unit query `[q / |q|, 0]`:
//! `|x - [q / |q|, 0]|^2 = 2 - 2 w . q / (M |q|)`. Indexes never augment queries: their extra
//! coordinate is 0, so only the first D coordinates of centroids or projections meet them.
//!
//! `M = (1 + headroom) max_k |w_k|` leaves rows room to grow during training. A row whose norm
//! passes `M` would need an imaginary last coordinate ([`NormAugmentation::augment_row`] clamps
//! it to 0, leaving the row off the unit sphere and its ranking wrong): the index must be
//! rebuilt with a new bound ([`NormAugmentation::outgrown`]).

use crate::Rows;
use farout_core::kernels;

/// The norm bound `M` of the augmentation `x = [w / M, sqrt(1 - |w|^2 / M^2)]` (see the module
/// docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct NormAugmentation {
    max_norm: f32,
}

impl NormAugmentation {
    /// The bound for the rows of `w`: `M = (1 + headroom) max_k |w_k|` (a negative headroom
    /// counts as 0; the largest norm at least `w`'s [`Rows::norm_floor`]), or 1 when every row
    /// is zero or there are none (any positive bound holds them).
    pub(crate) fn fit(w: Rows, headroom: f32) -> Self {
        let largest = w.iter().map(kernels::norm).fold(w.norm_floor(), f32::max);
        let max_norm = if largest > 0.0 { largest * (1.0 + headroom.max(0.0)) } else { 1.0 };
        Self { max_norm }
    }

    /// The bound M.
    #[cfg(test)]
    pub(crate) fn max_norm(&self) -> f32 {
        self.max_norm
    }

    /// The bound M, as a saved index stores it.
    pub(crate) fn bound(&self) -> f32 {
        self.max_norm
    }

    /// The augmentation of bound `max_norm` (a saved index's), if it is a positive finite number.
    pub(crate) fn with_bound(max_norm: f32) -> Option<Self> {
        (max_norm.is_finite() && max_norm > 0.0).then_some(Self { max_norm })
    }

    /// `out = [row / M, sqrt(max(0, 1 - |row|^2 / M^2))]`; `row`: `[D]`, `out`: `[D + 1]`.
    pub(crate) fn augment_row(&self, row: &[f32], out: &mut [f32]) {
        let d = row.len();
        debug_assert_eq!(out.len(), d + 1);
        for (o, x) in out[..d].iter_mut().zip(row) {
            *o = x / self.max_norm;
        }
        let n2 = kernels::dot(&out[..d], &out[..d]);
        out[d] = (1.0 - n2).max(0.0).sqrt();
    }

    /// Whether `row` outgrew the bound (`|row| > M`): its augmentation is no longer a unit
    /// vector, so the index holding it must be rebuilt.
    pub(crate) fn outgrown(&self, row: &[f32]) -> bool {
        kernels::norm(row) > self.max_norm
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_core::{Matrix, rng};

    /// 200 rows of dimension 24 with norms spread over (0, 3].
    fn rows_of_varied_norms() -> Matrix {
        let mut r = rng::seeded(11, 0);
        let mut w = Matrix::from_vec(200, 24, (0..200 * 24).map(|_| rng::normal(&mut r)).collect()).unwrap();
        for i in 0..200 {
            let target = 3.0 * (i + 1) as f32 / 200.0;
            let n = kernels::normalize(w.row_mut(i));
            assert!(n > 0.0);
            kernels::scale(target, w.row_mut(i));
        }
        w
    }

    #[test]
    fn bound_is_the_largest_norm_with_headroom() {
        let w = rows_of_varied_norms();
        let aug = NormAugmentation::fit(Rows::all(&w), 0.1);
        assert!((aug.max_norm() - 3.3).abs() < 1e-5, "{}", aug.max_norm());
        // Negative headroom counts as none; zero or no rows get the bound 1.
        assert!((NormAugmentation::fit(Rows::all(&w), -0.5).max_norm() - 3.0).abs() < 1e-5);
        assert_eq!(NormAugmentation::fit(Rows::all(&Matrix::zeros(3, 4)), 0.1).max_norm(), 1.0);
        assert_eq!(NormAugmentation::fit(Rows::all(&Matrix::zeros(0, 4)), 0.1).max_norm(), 1.0);
        // A norm floor (the largest norm of the other shards' rows) raises the bound, never lowers it.
        let floored = |floor| NormAugmentation::fit(Rows::all(&w).with_norm_floor(floor), 0.1).max_norm();
        assert!((floored(10.0) - 11.0).abs() < 1e-5 && (floored(1.0) - 3.3).abs() < 1e-5);
        let zeros = Matrix::zeros(3, 4);
        assert!((NormAugmentation::fit(Rows::all(&zeros).with_norm_floor(2.0), 0.1).max_norm() - 2.2).abs() < 1e-5);
    }

    #[test]
    fn augmented_rows_have_unit_norm() {
        let w = rows_of_varied_norms();
        let aug = NormAugmentation::fit(Rows::all(&w), 0.1);
        let mut x = vec![0.0; 25];
        for row in w.iter_rows() {
            aug.augment_row(row, &mut x);
            assert!((kernels::norm(&x) - 1.0).abs() < 1e-5, "|x| = {}", kernels::norm(&x));
            assert!(!aug.outgrown(row));
        }
        // The zero row maps to the pole [0, ..., 0, 1].
        aug.augment_row(&[0.0; 24], &mut x);
        assert_eq!(x[24], 1.0);
        assert!(x[..24].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn inner_product_with_an_augmented_query_is_the_scaled_inner_product() {
        let w = rows_of_varied_norms();
        let aug = NormAugmentation::fit(Rows::all(&w), 0.1);
        let mut r = rng::seeded(12, 0);
        let mut q: Vec<f32> = (0..24).map(|_| rng::normal(&mut r)).collect();
        q.push(0.0);
        let mut x = vec![0.0; 25];
        for row in w.iter_rows() {
            aug.augment_row(row, &mut x);
            let expected = kernels::dot(row, &q[..24]) / aug.max_norm();
            assert!((kernels::dot(&x, &q) - expected).abs() < 1e-5 * (1.0 + expected.abs()));
        }
    }

    #[test]
    fn a_row_past_the_bound_has_outgrown_it() {
        let w = rows_of_varied_norms();
        let aug = NormAugmentation::fit(Rows::all(&w), 0.1);
        // Row 199 has norm 3; the bound is 3.3.
        let mut row = w.row(199).to_vec();
        kernels::scale(1.09, &mut row);
        assert!(!aug.outgrown(&row));
        kernels::scale(1.02, &mut row);
        assert!(aug.outgrown(&row));
        // Its augmentation is clamped: no NaN, last coordinate 0.
        let mut x = vec![0.0; 25];
        aug.augment_row(&row, &mut x);
        assert_eq!(x[24], 0.0);
    }
}
