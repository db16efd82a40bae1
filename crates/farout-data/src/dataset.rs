use farout_core::{ClassId, Matrix};

/// Sparse rows in CSR form (`indptr[i]..indptr[i+1]` are row `i`'s entries).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SparseRows {
    /// Row offsets, `n_rows + 1` of them.
    pub indptr: Vec<usize>,
    /// Column of each entry.
    pub indices: Vec<u32>,
    /// Value of each entry.
    pub values: Vec<f32>,
    /// Number of columns (features).
    pub n_cols: usize,
}

impl SparseRows {
    /// An empty matrix with `n_cols` columns.
    pub fn new(n_cols: usize) -> Self {
        Self { indptr: vec![0], indices: Vec::new(), values: Vec::new(), n_cols }
    }

    /// Number of rows.
    pub fn n_rows(&self) -> usize {
        self.indptr.len() - 1
    }

    /// Row `i` as (columns, values).
    pub fn row(&self, i: usize) -> (&[u32], &[f32]) {
        let r = self.indptr[i]..self.indptr[i + 1];
        (&self.indices[r.clone()], &self.values[r])
    }

    /// Appends a row.
    pub fn push_row(&mut self, cols: &[u32], vals: &[f32]) {
        self.indices.extend_from_slice(cols);
        self.values.extend_from_slice(vals);
        self.indptr.push(self.indices.len());
    }

    /// Inverse document frequencies `ln((1 + N) / (1 + df_f)) + 1` of every column (the smoothed
    /// idf of scikit-learn), from these rows.
    pub fn idf(&self) -> Vec<f32> {
        let mut df = vec![0u32; self.n_cols];
        self.indices.iter().for_each(|&c| df[c as usize] += 1);
        let n = self.n_rows() as f32;
        df.iter().map(|&d| ((1.0 + n) / (1.0 + d as f32)).ln() + 1.0).collect()
    }

    /// Multiplies every value by its column's weight.
    pub fn scale_columns(&mut self, weights: &[f32]) {
        for (v, &c) in self.values.iter_mut().zip(&self.indices) {
            *v *= weights[c as usize];
        }
    }

    /// Scales every row to unit Euclidean norm (rows of zeros stay zero).
    pub fn normalize_rows(&mut self) {
        for i in 0..self.n_rows() {
            let r = self.indptr[i]..self.indptr[i + 1];
            let v = &mut self.values[r];
            farout_core::kernels::normalize(v);
        }
    }
}

/// Label sets in CSR form.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSets {
    /// Offsets, `n_samples + 1` of them.
    pub indptr: Vec<usize>,
    /// Labels of every sample, concatenated.
    pub labels: Vec<ClassId>,
    /// Number of classes K.
    pub n_labels: usize,
}

impl LabelSets {
    /// No samples yet, `n_labels` classes.
    pub fn new(n_labels: usize) -> Self {
        Self { indptr: vec![0], labels: Vec::new(), n_labels }
    }

    /// One label per sample (multiclass).
    pub fn from_single(labels: Vec<ClassId>, n_labels: usize) -> Self {
        Self { indptr: (0..=labels.len()).collect(), labels, n_labels }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.indptr.len() - 1
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Labels of sample `i`.
    pub fn get(&self, i: usize) -> &[ClassId] {
        &self.labels[self.indptr[i]..self.indptr[i + 1]]
    }

    /// Appends a sample's labels.
    pub fn push(&mut self, labels: &[ClassId]) {
        self.labels.extend_from_slice(labels);
        self.indptr.push(self.labels.len());
    }

    /// Keeps only each sample's first label (samples without labels stay without).
    pub fn keep_first(&mut self) {
        let mut out = LabelSets::new(self.n_labels);
        for i in 0..self.len() {
            out.push(&self.get(i)[..self.get(i).len().min(1)]);
        }
        *self = out;
    }

    /// Largest number of labels of one sample, with the first such sample.
    pub fn most_labels(&self) -> (usize, usize) {
        (0..self.len()).map(|i| (self.get(i).len(), i)).fold((0, 0), |a, b| if b.0 > a.0 { b } else { a })
    }

    /// Whether every sample has exactly one label.
    pub fn is_multiclass(&self) -> bool {
        self.indptr.windows(2).all(|w| w[1] - w[0] == 1)
    }
}

/// Input features of a data set.
#[derive(Clone, Debug, PartialEq)]
pub enum Features {
    /// Sparse bag-of-words or tf-idf rows (document tagging).
    Sparse(SparseRows),
    /// Dense vectors, one row per sample (face embeddings).
    Dense(Matrix),
}

impl Features {
    /// Number of samples.
    pub fn n_rows(&self) -> usize {
        match self {
            Features::Sparse(s) => s.n_rows(),
            Features::Dense(m) => m.rows(),
        }
    }

    /// Input dimension (number of features).
    pub fn n_cols(&self) -> usize {
        match self {
            Features::Sparse(s) => s.n_cols,
            Features::Dense(m) => m.cols(),
        }
    }
}

/// Features with their label sets.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// One row per sample.
    pub features: Features,
    /// One label set per sample.
    pub labels: LabelSets,
}

impl Dataset {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}
