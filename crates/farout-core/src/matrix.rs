use serde::{Deserialize, Serialize};

/// A dense row-major `rows x cols` matrix of f32.
///
/// Row `i` is `data[i * cols .. (i + 1) * cols]`; rows are what the output layer updates and what
/// indexes store, so they are contiguous.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Matrix {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl Matrix {
    /// A `rows x cols` matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self { rows, cols, data: vec![0.0; rows * cols] }
    }

    /// Wraps `data` (row-major); fails when its length is not `rows * cols`.
    pub fn from_vec(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self, crate::Error> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(crate::Error::Shape {
                op: "Matrix::from_vec",
                detail: format!("{} values for a {rows} x {cols} matrix", data.len()),
            });
        }
        Ok(Self { rows, cols, data })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `i`.
    #[inline]
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }

    /// Row `i`, mutable.
    #[inline]
    pub fn row_mut(&mut self, i: usize) -> &mut [f32] {
        &mut self.data[i * self.cols..(i + 1) * self.cols]
    }

    /// The row and column of the first NaN or infinite value, if any: a check for matrices
    /// that come from outside farout's own code (an index or a layer trusts finite values).
    pub fn first_non_finite(&self) -> Option<(usize, usize)> {
        let at = self.as_slice().iter().position(|x| !x.is_finite())?;
        let cols = self.cols().max(1);
        Some((at / cols, at % cols))
    }

    /// All values, row-major.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// All values, row-major, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// The values, consuming the matrix.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// Resizes to `rows x cols`, keeping the allocation; the contents are unspecified afterwards.
    pub fn reshape_for_overwrite(&mut self, rows: usize, cols: usize) {
        self.rows = rows;
        self.cols = cols;
        self.data.resize(rows * cols, 0.0);
    }

    /// Iterator over rows.
    pub fn iter_rows(&self) -> impl ExactSizeIterator<Item = &[f32]> {
        // `max(1)` keeps chunks_exact valid for 0-column matrices (which then have no rows to show).
        self.data.chunks_exact(self.cols.max(1)).take(self.rows)
    }

    /// Number of bytes held by the values.
    pub fn bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
    }

    /// Makes the rows orthonormal in place (Gram-Schmidt, each projection removed twice so the
    /// result stays orthogonal in f32); a row that becomes zero stays zero.
    pub fn orthonormalize_rows(&mut self) {
        let c = self.cols;
        for j in 0..self.rows {
            let (done, rest) = self.data.split_at_mut(j * c);
            let v = &mut rest[..c];
            for _ in 0..2 {
                for b in done.chunks_exact(c.max(1)) {
                    let p = crate::kernels::dot(v, b);
                    crate::kernels::axpy(-p, b, v);
                }
            }
            crate::kernels::normalize(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orthonormalized_rows_are_orthonormal_and_span_the_same_space() {
        let mut r = crate::rng::seeded(3, 0);
        let orig = Matrix::from_vec(5, 40, (0..200).map(|_| crate::rng::normal(&mut r)).collect()).unwrap();
        let mut m = orig.clone();
        m.orthonormalize_rows();
        for i in 0..5 {
            for j in 0..5 {
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((crate::kernels::dot(m.row(i), m.row(j)) - want).abs() < 1e-5, "({i}, {j})");
            }
            // Every original row is reproduced by its projection on the new rows.
            let v = orig.row(i);
            let proj2: f32 = m.iter_rows().map(|b| crate::kernels::dot(v, b).powi(2)).sum();
            assert!((proj2 - crate::kernels::dot(v, v)).abs() < 1e-3 * crate::kernels::dot(v, v));
        }
    }
}
