use crate::ClassId;

/// A sparse vector: parallel lists of indices and values (indices need not be sorted).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SparseVec {
    /// Positions of the non-zero entries.
    pub indices: Vec<u32>,
    /// Values at those positions.
    pub values: Vec<f32>,
}

impl SparseVec {
    /// An empty vector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Removes every entry, keeping the allocations.
    pub fn clear(&mut self) {
        self.indices.clear();
        self.values.clear();
    }

    /// Appends entry `(index, value)`.
    #[inline]
    pub fn push(&mut self, index: u32, value: f32) {
        self.indices.push(index);
        self.values.push(value);
    }

    /// Number of stored entries.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether no entry is stored.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// Iterator over `(index, value)` pairs.
    pub fn iter(&self) -> impl Iterator<Item = (u32, f32)> + '_ {
        self.indices.iter().copied().zip(self.values.iter().copied())
    }

    /// Dot product with a dense vector.
    pub fn dot_dense(&self, dense: &[f32]) -> f32 {
        self.iter().map(|(i, v)| v * dense[i as usize]).sum()
    }
}

/// A sparse class gradient: pairs `(k, dL/dz_k)`, what an estimator returns for one sample.
pub type SparseGrad = SparseVec;

/// Convenience: the class ids of a sparse gradient.
impl SparseVec {
    /// The stored indices as class ids.
    pub fn classes(&self) -> &[ClassId] {
        &self.indices
    }
}
