//! Training data of the linear solvers.
//!
//! Features are farout-data's CSR [`SparseRows`] (what the XMC reader returns), canonicalised
//! once (columns sorted and unique within a row) so that Σ x_ij² of the preconditioner is
//! right. The bias is not stored: solvers treat it as an implicit feature x_0 = 1 at position
//! `n_features` of their dense weight vectors (the *last* coordinate).
//!
//! - [`LabelIndex`]: the transpose of [`LabelSets`], label → sorted sample ids (the positives
//!   P of each binary problem);
//! - [`DataStats`]: n, Σ_i x_i and ‖x̄‖², computed once and shared by MSI (eqs. 22–24) and
//!   the stopping rule's ‖g(0)‖ (eq. 12);
//! - [`FeatureTransform`]: optional tf-idf and L2 row normalisation, fitted on the training
//!   rows and applied to both splits; the arithmetic is farout-data's
//!   ([`SparseRows::idf`], [`SparseRows::scale_columns`], [`SparseRows::normalize_rows`]).

use crate::{Error, Result};
use farout_data::{Dataset, Features, LabelSets};
use serde::{Deserialize, Serialize};

pub use farout_data::SparseRows;

/// Label → sorted ids of the samples that carry it (CSR over labels).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelIndex {
    indptr: Vec<usize>,
    samples: Vec<u32>,
}

impl LabelIndex {
    /// Transposes `labels` (a label repeated within one sample counts once).
    pub fn new(labels: &LabelSets) -> Self {
        let k = labels.n_labels;
        let mut counts = vec![0usize; k + 1];
        labels.labels.iter().for_each(|&l| counts[l as usize + 1] += 1);
        for j in 0..k {
            counts[j + 1] += counts[j];
        }
        let mut fill = counts.clone();
        let mut samples = vec![0u32; labels.labels.len()];
        // Samples are visited in increasing order, so each label's list comes out sorted.
        for i in 0..labels.len() {
            for &l in labels.get(i) {
                samples[fill[l as usize]] = i as u32;
                fill[l as usize] += 1;
            }
        }
        let mut indptr = vec![0usize; k + 1];
        let mut out = Vec::with_capacity(samples.len());
        for j in 0..k {
            let list = &mut samples[counts[j]..counts[j + 1]];
            let start = out.len();
            for &s in list.iter() {
                if out.len() == start || *out.last().unwrap() != s {
                    out.push(s);
                }
            }
            indptr[j + 1] = out.len();
        }
        Self { indptr, samples: out }
    }

    /// Number of labels K.
    pub fn n_labels(&self) -> usize {
        self.indptr.len() - 1
    }

    /// The sorted samples carrying label `k`.
    pub fn positives(&self, k: usize) -> &[u32] {
        &self.samples[self.indptr[k]..self.indptr[k + 1]]
    }
}

/// Per-data-set statistics shared by all labels: n, Σ_i x_i, and ‖x̄‖².
#[derive(Clone, Debug, PartialEq)]
pub struct DataStats {
    /// Number of samples n.
    pub n_samples: usize,
    /// Σ_i x_i over the features (without the bias coordinate, whose sum is n).
    pub sum: Vec<f64>,
    /// Whether the implicit bias feature x_0 = 1 is part of every x_i.
    pub bias: bool,
}

impl DataStats {
    /// One pass over the rows (f64 sums).
    pub fn new(x: &SparseRows, bias: bool) -> Self {
        let mut sum = vec![0.0f64; x.n_cols];
        for (&c, &v) in x.indices.iter().zip(&x.values) {
            sum[c as usize] += v as f64;
        }
        Self { n_samples: x.n_rows(), sum, bias }
    }

    /// Number of weights of a label: features, plus one for the bias.
    pub fn n_vars(&self) -> usize {
        self.sum.len() + self.bias as usize
    }

    /// Σ_i x_i with the bias coordinate (= n) last when `bias`.
    pub fn sum_with_bias(&self, j: usize) -> f64 {
        if j == self.sum.len() { self.n_samples as f64 } else { self.sum[j] }
    }

    /// Coordinate `j` of the mean x̄ (the bias coordinate, if any, is 1).
    pub fn mean(&self, j: usize) -> f64 {
        self.sum_with_bias(j) / self.n_samples.max(1) as f64
    }

    /// ‖x̄‖², bias coordinate included.
    pub fn mean_norm_sq(&self) -> f64 {
        (0..self.n_vars()).map(|j| self.mean(j).powi(2)).sum()
    }
}

/// Optional preprocessing of the features (none by default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FeatureTransform {
    /// Multiply each feature by its smoothed idf `ln((1 + N)/(1 + df)) + 1`, fitted on the
    /// training rows.
    pub tfidf: bool,
    /// Scale every row to unit L2 norm (after tf-idf).
    pub normalize_rows: bool,
}

/// A [`FeatureTransform`] with its idf weights fitted.
#[derive(Clone, Debug, PartialEq)]
pub struct FittedTransform {
    idf: Option<Vec<f32>>,
    normalize_rows: bool,
}

impl FeatureTransform {
    /// Fits the idf weights (if any) on the training rows.
    pub fn fit(&self, train: &SparseRows) -> FittedTransform {
        FittedTransform { idf: self.tfidf.then(|| train.idf()), normalize_rows: self.normalize_rows }
    }
}

impl FittedTransform {
    /// Applies the transform in place (rows of another split must have the same columns).
    pub fn apply(&self, rows: &mut SparseRows) -> Result<()> {
        if let Some(idf) = &self.idf {
            if rows.n_cols != idf.len() {
                return Err(Error::Shape {
                    what: "feature transform",
                    detail: format!("fitted on {} features, applied to {}", idf.len(), rows.n_cols),
                });
            }
            rows.scale_columns(idf);
        }
        if self.normalize_rows {
            rows.normalize_rows();
        }
        Ok(())
    }
}

/// Sorts each row's columns and merges repeated columns by adding their values.
pub fn canonicalize_rows(rows: &mut SparseRows) {
    *rows = canonical_rows(rows);
}

/// A copy of `rows` with each row's columns sorted and duplicates added (see
/// [`canonicalize_rows`]); the input is only read.
pub fn canonical_rows(rows: &SparseRows) -> SparseRows {
    let mut out = SparseRows::new(rows.n_cols);
    out.indices.reserve(rows.indices.len());
    out.values.reserve(rows.values.len());
    let mut pairs: Vec<(u32, f32)> = Vec::new();
    for i in 0..rows.n_rows() {
        let (c, v) = rows.row(i);
        if c.windows(2).all(|w| w[0] < w[1]) {
            out.push_row(c, v);
            continue;
        }
        pairs.clear();
        pairs.extend(c.iter().copied().zip(v.iter().copied()));
        pairs.sort_by_key(|p| p.0);
        let start = out.indices.len();
        for &(c, v) in &pairs {
            if out.indices.len() > start && *out.indices.last().unwrap() == c {
                *out.values.last_mut().unwrap() += v;
            } else {
                out.indices.push(c);
                out.values.push(v);
            }
        }
        out.indptr.push(out.indices.len());
    }
    out
}

/// The non-zero coordinates of each row of `m` as CSR rows.
pub fn dense_to_rows(m: &farout_core::Matrix) -> SparseRows {
    let mut x = SparseRows::new(m.cols());
    let (mut cols, mut vals) = (Vec::with_capacity(m.cols()), Vec::with_capacity(m.cols()));
    for i in 0..m.rows() {
        cols.clear();
        vals.clear();
        for (j, &v) in m.row(i).iter().enumerate() {
            if v != 0.0 {
                cols.push(j as u32);
                vals.push(v);
            }
        }
        x.push_row(&cols, &vals);
    }
    x
}

/// Features and label index of a training set.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainSet {
    /// Canonical CSR rows (sorted, unique columns).
    pub features: SparseRows,
    /// Label → positives.
    pub labels: LabelIndex,
    /// Sample → labels (what multiclass solvers such as MEMOIR walk).
    pub sample_labels: LabelSets,
}

impl TrainSet {
    /// Checks that there is one label set per row, canonicalises the rows, transposes labels.
    pub fn new(features: SparseRows, labels: &LabelSets) -> Result<Self> {
        Self::from_rows(&features, labels)
    }

    /// [`Self::new`] from borrowed rows (the canonical copy is the only one made).
    pub fn from_rows(features: &SparseRows, labels: &LabelSets) -> Result<Self> {
        if features.n_rows() != labels.len() {
            return Err(Error::Shape {
                what: "training set",
                detail: format!("{} feature rows but {} label sets", features.n_rows(), labels.len()),
            });
        }
        Ok(Self { labels: LabelIndex::new(labels), sample_labels: labels.clone(), features: canonical_rows(features) })
    }

    /// From a data set, which is only read; dense features (face embeddings) become CSR rows
    /// holding every non-zero coordinate.
    pub fn from_dataset(data: &Dataset) -> Result<Self> {
        match &data.features {
            Features::Sparse(x) => Self::from_rows(x, &data.labels),
            Features::Dense(m) => Self::new(dense_to_rows(m), &data.labels),
        }
    }

    /// Number of samples n.
    pub fn n_samples(&self) -> usize {
        self.features.n_rows()
    }

    /// Number of features d (without the bias).
    pub fn n_features(&self) -> usize {
        self.features.n_cols
    }

    /// Number of labels K.
    pub fn n_labels(&self) -> usize {
        self.labels.n_labels()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_index_is_the_sorted_deduplicated_transpose() {
        let mut l = LabelSets::new(4);
        l.push(&[2, 0]);
        l.push(&[]);
        l.push(&[0, 0, 3]);
        l.push(&[2]);
        let idx = LabelIndex::new(&l);
        assert_eq!(idx.n_labels(), 4);
        assert_eq!(idx.positives(0), &[0, 2]);
        assert!(idx.positives(1).is_empty());
        assert_eq!(idx.positives(2), &[0, 3]);
        assert_eq!(idx.positives(3), &[2]);
    }

    #[test]
    fn stats_hold_the_sum_and_the_mean_norm_with_the_bias() {
        let mut x = SparseRows::new(3);
        x.push_row(&[0, 2], &[1.0, 2.0]);
        x.push_row(&[2], &[4.0]);
        let s = DataStats::new(&x, true);
        assert_eq!((s.n_samples, s.sum.clone(), s.n_vars()), (2, vec![1.0, 0.0, 6.0], 4));
        assert_eq!(s.mean(3), 1.0);
        assert!((s.mean_norm_sq() - (0.25 + 9.0 + 1.0)).abs() < 1e-12);
        assert!((DataStats::new(&x, false).mean_norm_sq() - 9.25).abs() < 1e-12);
    }

    #[test]
    fn dense_rows_keep_their_non_zeros() {
        let m = farout_core::Matrix::from_vec(2, 3, vec![1.0, 0.0, -2.0, 0.0, 0.0, 0.5]).unwrap();
        let x = dense_to_rows(&m);
        assert_eq!(x.row(0), (&[0u32, 2][..], &[1.0f32, -2.0][..]));
        assert_eq!(x.row(1), (&[2u32][..], &[0.5f32][..]));
    }

    #[test]
    fn canonical_rows_are_sorted_with_duplicates_added() {
        let mut x = SparseRows::new(5);
        x.push_row(&[3, 1, 3], &[1.0, 2.0, 0.5]);
        x.push_row(&[0, 4], &[1.0, 1.0]);
        canonicalize_rows(&mut x);
        assert_eq!(x.row(0), (&[1u32, 3][..], &[2.0f32, 1.5][..]));
        assert_eq!(x.row(1), (&[0u32, 4][..], &[1.0f32, 1.0][..]));
    }

    #[test]
    fn transform_uses_train_idf_on_both_splits_then_normalises() {
        let mut train = SparseRows::new(2);
        train.push_row(&[0, 1], &[1.0, 1.0]);
        train.push_row(&[0], &[1.0]);
        let fitted = FeatureTransform { tfidf: true, normalize_rows: true }.fit(&train);
        let mut test = train.clone();
        fitted.apply(&mut test).unwrap();
        let idf1 = (3.0f32 / 2.0).ln() + 1.0;
        let norm = (1.0 + idf1 * idf1).sqrt();
        assert!((test.values[1] - idf1 / norm).abs() < 1e-6 && (test.values[2] - 1.0).abs() < 1e-6);
        assert!(fitted.apply(&mut SparseRows::new(3)).is_err());
    }
}
