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

    /// Replaces the entries by the nonzero `values[i]` at `indices[i]` (a gradient over a
    /// candidate set, of which most entries are often exactly 0).
    pub fn set_nonzero(&mut self, indices: &[u32], values: &[f32]) {
        self.clear();
        for (&i, &v) in indices.iter().zip(values) {
            if v != 0.0 {
                self.push(i, v);
            }
        }
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

/// `rows` grouped by `bucket_of` (a counting sort, stable): bucket `b`'s rows are
/// `sorted[starts[b]..starts[b + 1]]` of the returned `(starts, sorted)`. Indexes use it to
/// update the changed rows of each cluster or block of codes on one thread; a linear predictor
/// lists the labels of each group.
pub fn group_rows(
    rows: &[ClassId],
    buckets: usize,
    bucket_of: impl Fn(ClassId) -> usize,
) -> (Vec<usize>, Vec<ClassId>) {
    let mut starts = vec![0usize; buckets + 1];
    rows.iter().for_each(|&i| starts[bucket_of(i) + 1] += 1);
    for b in 0..buckets {
        starts[b + 1] += starts[b];
    }
    let mut next = starts.clone();
    let mut sorted = vec![0 as ClassId; rows.len()];
    for &i in rows {
        let slot = &mut next[bucket_of(i)];
        sorted[*slot] = i;
        *slot += 1;
    }
    (starts, sorted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_nonzero_keeps_the_nonzero_entries_only() {
        let mut v = SparseVec::new();
        v.push(99, 1.0);
        v.set_nonzero(&[7, 3, 5, 1], &[0.5, 0.0, -2.0, -0.0]);
        assert_eq!((v.indices, v.values), (vec![7, 5], vec![0.5, -2.0]));
    }
}
