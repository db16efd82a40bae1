//! numpy arrays in and out: CSR matrices and label sets built from the arrays the Python side
//! passes (already converted to the dtypes below, C-contiguous), each value checked once.

use crate::errors::invalid;
use farout_core::Matrix;
use farout_data::{LabelSets, SparseRows};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;

/// A CSR matrix from scipy's arrays (`indptr` int64, `indices` int64, `data` float32), checked:
/// offsets that rise to `indices.len()`, columns below `n_cols`, finite values. `what` names
/// the argument in errors. The arrays are copied once into farout's CSR rows.
pub fn csr(
    what: &str,
    indptr: PyReadonlyArray1<'_, i64>,
    indices: PyReadonlyArray1<'_, i64>,
    data: PyReadonlyArray1<'_, f32>,
    n_cols: usize,
) -> PyResult<SparseRows> {
    let (indptr, indices, data) = (slice(&indptr, what)?, slice(&indices, what)?, slice(&data, what)?);
    if indptr.first() != Some(&0) || indices.len() != data.len() || indptr.last() != Some(&(indices.len() as i64)) {
        return Err(invalid(format!("{what}: not a CSR matrix (indptr must rise from 0 to nnz)")));
    }
    if n_cols > u32::MAX as usize {
        return Err(invalid(format!("{what}: {n_cols} columns; at most {} are supported", u32::MAX)));
    }
    let mut rows = SparseRows::new(n_cols);
    rows.indptr = Vec::with_capacity(indptr.len());
    for (i, w) in indptr.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(invalid(format!("{what}: indptr falls at row {i}")));
        }
        let r = w[0] as usize..w[1] as usize;
        for (&c, &v) in indices[r.clone()].iter().zip(&data[r]) {
            if c < 0 || c as usize >= n_cols {
                return Err(invalid(format!("{what}: row {i} has column {c}, outside 0..{n_cols}")));
            }
            if !v.is_finite() {
                return Err(invalid(format!("{what}: row {i}, column {c} is {v}; values must be finite")));
            }
        }
    }
    rows.indptr.extend(indptr.iter().map(|&p| p as usize));
    rows.indices = indices.iter().map(|&c| c as u32).collect();
    rows.values = data.to_vec();
    Ok(rows)
}

/// Label sets from offsets and label ids (a CSR indicator matrix's `indptr`/`indices`, or
/// flattened lists), every id below `n_labels`.
pub fn label_sets(
    indptr: PyReadonlyArray1<'_, i64>,
    labels: PyReadonlyArray1<'_, i64>,
    n_labels: usize,
) -> PyResult<LabelSets> {
    let (indptr, labels) = (slice(&indptr, "Y")?, slice(&labels, "Y")?);
    if indptr.first() != Some(&0) || indptr.last() != Some(&(labels.len() as i64)) {
        return Err(invalid("Y: offsets must rise from 0 to the number of labels"));
    }
    if n_labels > u32::MAX as usize {
        return Err(invalid(format!("Y: {n_labels} labels; at most {} are supported", u32::MAX)));
    }
    let mut sets = LabelSets { indptr: Vec::with_capacity(indptr.len()), labels: Vec::new(), n_labels };
    sets.labels.reserve(labels.len());
    for (i, w) in indptr.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(invalid(format!("Y: offsets fall at sample {i}")));
        }
        for &l in &labels[w[0] as usize..w[1] as usize] {
            if l < 0 || l as usize >= n_labels {
                return Err(invalid(format!("Y: sample {i} has label {l}, outside 0..{n_labels}")));
            }
            sets.labels.push(l as u32);
        }
    }
    sets.indptr.extend(indptr.iter().map(|&p| p as usize));
    Ok(sets)
}

/// The array's elements, which the Python side made contiguous.
fn slice<'a, T: numpy::Element>(a: &'a PyReadonlyArray1<'_, T>, what: &str) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| invalid(format!("{what}: expected a contiguous array")))
}

/// A CSR matrix as scipy's `(indptr, indices, data)` arrays (int64, int64, float32).
pub type CsrArrays<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<f32>>);

/// `rows` as [`CsrArrays`].
pub fn csr_arrays(py: Python<'_>, rows: SparseRows) -> CsrArrays<'_> {
    let indptr: Vec<i64> = rows.indptr.iter().map(|&p| p as i64).collect();
    let indices: Vec<i64> = rows.indices.iter().map(|&c| i64::from(c)).collect();
    (indptr.into_pyarray(py), indices.into_pyarray(py), rows.values.into_pyarray(py))
}

/// The `k` best classes of `n` rows: ids `int64[n, k]` and scores `float32[n, k]`.
pub type TopK<'py> = (Bound<'py, PyArray2<i64>>, Bound<'py, PyArray2<f32>>);

/// [`TopK`] arrays from row-major ids and scores of `n` rows of `k`.
pub fn top_k_arrays(py: Python<'_>, n: usize, k: usize, ids: Vec<i64>, scores: Vec<f32>) -> PyResult<TopK<'_>> {
    let shape_err = |e: numpy::ndarray::ShapeError| invalid(e.to_string());
    let ids = Array2::from_shape_vec((n, k), ids).map_err(shape_err)?;
    let scores = Array2::from_shape_vec((n, k), scores).map_err(shape_err)?;
    Ok((ids.into_pyarray(py), scores.into_pyarray(py)))
}

/// The values of a C-contiguous `[n, d]` array with every value finite; `what` names the
/// argument in errors, which give the first row holding a NaN or infinity.
pub fn finite_rows<'a>(a: &'a PyReadonlyArray2<'_, f32>, what: &str) -> PyResult<(&'a [f32], usize, usize)> {
    let [n, d] = [a.shape()[0], a.shape()[1]];
    let values = a.as_slice().map_err(|_| invalid(format!("{what}: expected a C-contiguous float32 array")))?;
    if let Some(at) = values.iter().position(|x| !x.is_finite()) {
        return Err(invalid(format!("{what}: row {} holds {}; values must be finite", at / d.max(1), values[at])));
    }
    Ok((values, n, d))
}

/// A copy of `m` as a new `float32[rows, cols]` array.
pub fn matrix_array<'py>(py: Python<'py>, m: &Matrix) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let a = Array2::from_shape_vec((m.rows(), m.cols()), m.as_slice().to_vec()).map_err(|e| invalid(e.to_string()))?;
    Ok(a.into_pyarray(py))
}
