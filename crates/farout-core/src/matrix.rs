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
        if data.len() != rows * cols {
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
}
