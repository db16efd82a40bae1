//! `farout.linear`: DiSMEC, PPDSparse and MEMOIR fitted on CSR arrays, the model they give
//! (the CLI's `linear.model` file), tf-idf, and the XMC / LIBSVM reader. The scikit-learn
//! classes are Python (`farout/linear.py`) over these functions.

use crate::arrays::{CsrArrays, TopK, csr, csr_arrays, label_sets, top_k_arrays};
use crate::errors::{IntoPy, invalid};
use farout_data::{Dataset, Features, SparseRows};
use farout_dist::Local;
use farout_linear::{Predictor, Silent, SolverConfig, SparseModel, TrainSet};
use farout_train::linear::LinearModel as Model;
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use std::path::PathBuf;

/// A CSR matrix as the four values the Python side passes.
type Csr<'py> = (PyReadonlyArray1<'py, i64>, PyReadonlyArray1<'py, i64>, PyReadonlyArray1<'py, f32>, usize);
/// Label sets as offsets, ids and the number of labels.
type Labels<'py> = (PyReadonlyArray1<'py, i64>, PyReadonlyArray1<'py, i64>, usize);

fn rows(what: &str, x: Csr<'_>) -> PyResult<SparseRows> {
    csr(what, x.0, x.1, x.2, x.3)
}

/// The solver `params` (a JSON object of `[linear]` keys with `solver`) describes, checked.
fn solver(params: &str) -> PyResult<SolverConfig> {
    let solver: SolverConfig = serde_json::from_str(params).map_err(|e| invalid(e.to_string()))?;
    solver.params().check().map_err(|e| invalid(e.to_string()))?;
    Ok(solver)
}

/// The default parameters of solver `name` as a JSON object (what `[linear]` gives when only
/// `solver` is set).
#[pyfunction]
pub fn linear_defaults(name: &str) -> PyResult<String> {
    let solver: SolverConfig =
        serde_json::from_value(serde_json::json!({ "solver": name })).map_err(|e| invalid(e.to_string()))?;
    serde_json::to_string(&solver).map_err(|e| invalid(e.to_string()))
}

/// A trained linear model: one sparse weight vector (and bias) per label.
#[pyclass(module = "farout._farout", frozen)]
pub struct LinearModel {
    model: Model,
    predictor: Predictor,
    summary: Option<String>,
}

impl LinearModel {
    fn new(model: SparseModel, summary: Option<String>) -> Self {
        let predictor = model.predictor();
        Self { model: Model::whole(model), predictor, summary }
    }

    fn check_features(&self, x: &SparseRows) -> PyResult<()> {
        if x.n_cols > self.model.model.n_features() {
            return Err(invalid(format!(
                "X has {} features; the model was fitted on {}",
                x.n_cols,
                self.model.model.n_features()
            )));
        }
        Ok(())
    }
}

/// Fits solver `params` (JSON) on features `x` and labels `y`; releases the GIL while it trains,
/// and Ctrl-C stops it after the labels being solved (`KeyboardInterrupt`, no model kept).
#[pyfunction]
pub fn fit_linear(py: Python<'_>, params: &str, x: Csr<'_>, y: Labels<'_>) -> PyResult<LinearModel> {
    let solver = solver(params)?;
    let x = rows("X", x)?;
    let y = label_sets(y.0, y.1, y.2)?;
    if x.n_rows() != y.len() {
        return Err(invalid(format!("X has {} rows but Y has {} samples", x.n_rows(), y.len())));
    }
    if x.n_rows() == 0 {
        return Err(invalid("X has no rows: there is nothing to fit"));
    }
    let fitted = crate::runs::outcome(crate::runs::interruptible(py, || {
        let train = TrainSet::new(x, &y)?;
        solver.params().fit(&train, &Silent)
    })?)?;
    let summary = serde_json::to_string(&fitted.summary).ok();
    Ok(LinearModel::new(fitted.model, summary))
}

#[pymethods]
impl LinearModel {
    /// Labels `int64[n, k]` and scores `float32[n, k]` of the `k` best labels of every row of
    /// `x`, best first (`k` is capped at the number of labels).
    fn predict<'py>(&self, py: Python<'py>, x: Csr<'py>, k: usize) -> PyResult<TopK<'py>> {
        let x = rows("X", x)?;
        self.check_features(&x)?;
        let k = k.min(self.model.n_labels);
        if k == 0 {
            return Err(invalid("k must be at least 1 (and the model needs labels)"));
        }
        let n = x.n_rows();
        let (labels, scores) = py.detach(|| top_k(&self.predictor, &x, k));
        top_k_arrays(py, n, k, labels, scores)
    }

    /// P@1/3/5, nDCG@1/3/5 (and accuracy for single-label data) on `x` with labels `y`, as the
    /// CLI's `farout eval` computes them (JSON).
    fn evaluate(&self, py: Python<'_>, x: Csr<'_>, y: Labels<'_>) -> PyResult<String> {
        let x = rows("X", x)?;
        self.check_features(&x)?;
        let labels = label_sets(y.0, y.1, y.2)?;
        if x.n_rows() != labels.len() {
            return Err(invalid(format!("X has {} rows but Y has {} samples", x.n_rows(), labels.len())));
        }
        let ds = Dataset { features: Features::Sparse(x), labels };
        let metrics = py.detach(|| farout_train::linear::evaluate(&self.model, &ds, 0, &Local)).py_err()?;
        serde_json::to_string(&metrics).map_err(|e| invalid(e.to_string()))
    }

    /// Writes the model file the CLI reads (`<checkpoint dir>/linear.model`), atomically.
    fn save(&self, path: PathBuf) -> PyResult<()> {
        self.model.model.save(&path).py_err()
    }

    /// Reads a model file written by `save` or by `farout train`.
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let model = py.detach(|| SparseModel::load(&path)).py_err()?;
        Ok(Self::new(model, None))
    }

    /// Number of labels.
    #[getter]
    fn n_labels(&self) -> usize {
        self.model.n_labels
    }

    /// Number of features the model was fitted on.
    #[getter]
    fn n_features(&self) -> usize {
        self.model.model.n_features()
    }

    /// Non-zero weights (biases included).
    #[getter]
    fn nnz(&self) -> usize {
        self.model.model.nnz()
    }

    /// What fitting reported (JSON), or None for a loaded model.
    #[getter]
    fn summary(&self) -> Option<String> {
        self.summary.clone()
    }
}

/// Every row's `k` best labels and scores, flattened row-major.
fn top_k(predictor: &Predictor, x: &SparseRows, k: usize) -> (Vec<i64>, Vec<f32>) {
    let hits = predictor.predict(x, k);
    let labels = hits.iter().flatten().map(|h| i64::from(h.class)).collect();
    let scores = hits.iter().flatten().map(|h| h.score).collect();
    (labels, scores)
}

/// The smoothed idf `ln((1 + N)/(1 + df)) + 1` of every column of `x` (as the CLI's
/// `data.tfidf` fits it on the training set).
#[pyfunction]
pub fn fit_idf<'py>(py: Python<'py>, x: Csr<'py>) -> PyResult<Bound<'py, PyArray1<f32>>> {
    Ok(rows("X", x)?.idf().into_pyarray(py))
}

/// `x` with every column scaled by `idf` (if given), then every row scaled to unit L2 norm (if
/// `normalize`): the CLI's `data.tfidf` and `data.normalize`, in that order.
#[pyfunction]
#[pyo3(signature = (x, idf, normalize))]
pub fn transform<'py>(
    py: Python<'py>,
    x: Csr<'py>,
    idf: Option<PyReadonlyArray1<'py, f32>>,
    normalize: bool,
) -> PyResult<CsrArrays<'py>> {
    let mut x = rows("X", x)?;
    if let Some(idf) = idf {
        let idf = idf.as_slice().map_err(|_| invalid("idf: expected a contiguous array"))?;
        if idf.len() != x.n_cols {
            return Err(invalid(format!("idf has {} columns, X {}", idf.len(), x.n_cols)));
        }
        x.scale_columns(idf);
    }
    if normalize {
        x.normalize_rows();
    }
    Ok(csr_arrays(py, x))
}

/// Reads an Extreme Classification Repository file (`N D K` header) or a LIBSVM file: the
/// features as CSR arrays, their number of columns, label offsets and ids, number of labels.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub fn read_xmc<'py>(
    py: Python<'py>,
    path: PathBuf,
) -> PyResult<(CsrArrays<'py>, usize, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, usize)> {
    let ds = py.detach(|| farout_data::xmc::read(&path)).py_err()?;
    let x = match ds.features {
        Features::Sparse(x) => x,
        Features::Dense(m) => farout_linear::data::dense_to_rows(&m),
    };
    let n_cols = x.n_cols;
    let labels = ds.labels;
    let indptr: Vec<i64> = labels.indptr.iter().map(|&p| p as i64).collect();
    let ids: Vec<i64> = labels.labels.iter().map(|&l| i64::from(l)).collect();
    Ok((csr_arrays(py, x), n_cols, indptr.into_pyarray(py), ids.into_pyarray(py), labels.n_labels))
}
