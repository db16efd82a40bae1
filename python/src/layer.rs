//! `farout.OutputLayer`: farout's output layer `z = W φ + b` for a training loop written in
//! any framework. `step(features, labels)` estimates the loss and `dL/dφ` with the configured
//! estimator (exact softmax or margin, LDGS, MIPS, sampled softmax, ...), updates the rows of W
//! that carry gradient with the layer's optimiser, and keeps the estimator's index up to date,
//! exactly as `farout train` does inside its own loop.

use crate::arrays::{TopK, label_sets, matrix_array, top_k_arrays};
use crate::errors::{IntoPy, invalid};
use farout_core::rng::{self, Rng};
use farout_core::{ClassId, Matrix};
use farout_estimators::{Batch, Built, Problem};
use farout_train::config::{IndexSection, OutputConfig};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use std::path::PathBuf;

/// The file names of a saved layer (a directory).
const WEIGHTS_FILE: &str = "layer.bin";
const CONFIG_FILE: &str = "output.json";

/// An output layer with its estimator, optimiser and index.
#[pyclass(module = "farout._farout")]
pub struct OutputLayer {
    layer: farout_layer::OutputLayer,
    built: Built,
    rng: Rng,
    /// `{"n_classes", "dim", "seed", "output", "index"}`: what `load` rebuilds the layer from.
    spec: serde_json::Value,
}

impl OutputLayer {
    fn build(spec: serde_json::Value, label_counts: Option<Vec<u64>>) -> PyResult<Self> {
        let get = |key: &str| spec.get(key).cloned().unwrap_or(serde_json::Value::Null);
        let n_classes =
            get("n_classes").as_u64().ok_or_else(|| invalid("n_classes: expected an integer >= 1"))? as usize;
        let dim = get("dim").as_u64().ok_or_else(|| invalid("dim: expected an integer >= 1"))? as usize;
        let seed = get("seed").as_u64().unwrap_or(1);
        let output: OutputConfig =
            serde_json::from_value(get("output")).map_err(|e| invalid(format!("output: {e}")))?;
        let index: IndexSection = match get("index") {
            serde_json::Value::Null => IndexSection::default(),
            serde_json::Value::Object(map) if map.is_empty() => IndexSection::default(),
            table => serde_json::from_value(table).map_err(|e| invalid(format!("index: {e}")))?,
        };
        if n_classes == 0 || dim == 0 || n_classes > u32::MAX as usize {
            return Err(invalid(format!("a {n_classes} x {dim} layer: both must be >= 1 (and n_classes < 2^32)")));
        }
        // W and its optimiser state, before allocating them.
        let bytes = (n_classes as u128) * (dim as u128) * 8;
        farout_core::resources::check_memory(bytes, "the output layer", "n_classes or dim").py_err()?;
        let counts = move || label_counts.clone().unwrap_or_else(|| vec![1; n_classes]);
        let problem = Problem { n_classes, n_data: 0, dim, label_counts: &counts };
        let built = output.estimator.build(&problem).map_err(|e| invalid(format!("output: {e}")))?;
        let mut layer =
            farout_layer::OutputLayer::new(n_classes, dim, &output.layer, &output.optimizer, seed).py_err()?;
        if let Some(shape) = built.search {
            layer.attach_index(index.index.for_shard(n_classes, 1), shape.blocks, index.upkeep()).py_err()?;
        }
        Ok(Self { layer, built, rng: rng::seeded(seed, 0x5eed), spec })
    }

    /// `features` as a `[B, dim]` matrix (one copy), refusing NaN and wrong shapes.
    fn features(&self, features: &PyReadonlyArray2<'_, f32>) -> PyResult<Matrix> {
        let view = features.as_array();
        if view.ncols() != self.layer.d_model() {
            return Err(invalid(format!(
                "features have {} columns; the layer's dim is {}",
                view.ncols(),
                self.layer.d_model()
            )));
        }
        let data: Vec<f32> = view.iter().copied().collect();
        let phi = Matrix::from_vec(view.nrows(), view.ncols(), data).map_err(|e| invalid(e.to_string()))?;
        if let Some((row, col)) = phi.first_non_finite() {
            let value = phi.row(row)[col];
            return Err(invalid(format!("features: row {row}, column {col} is {value}; values must be finite")));
        }
        Ok(phi)
    }
}

#[pymethods]
impl OutputLayer {
    /// Builds the layer from its spec (JSON, made by the Python constructor) and, for the
    /// unigram proposal, the classes' label counts.
    #[new]
    #[pyo3(signature = (spec, label_counts=None))]
    fn new(spec: &str, label_counts: Option<Vec<u64>>) -> PyResult<Self> {
        let spec: serde_json::Value = serde_json::from_str(spec).map_err(|e| invalid(e.to_string()))?;
        Self::build(spec, label_counts)
    }

    /// One training step on `features` `[B, dim]` with labels (offsets and ids): returns the
    /// mean loss over the batch and `dL/dφ` `[B, dim]` (of the summed loss, as the CLI's
    /// trainer back-propagates it), and updates W.
    fn step<'py>(
        &mut self,
        py: Python<'py>,
        features: PyReadonlyArray2<'py, f32>,
        offsets: PyReadonlyArray1<'py, i64>,
        ids: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<(f64, Bound<'py, PyArray2<f32>>)> {
        let phi = self.features(&features)?;
        let labels = label_sets(offsets, ids, self.layer.n_classes())?;
        if labels.len() != phi.rows() {
            return Err(invalid(format!("{} feature rows but {} label sets", phi.rows(), labels.len())));
        }
        if phi.rows() == 0 {
            return Err(invalid("an empty batch"));
        }
        let Self { layer, built, rng, .. } = self;
        let (loss, dphi) = py.detach(|| {
            let positives: Vec<&[ClassId]> = (0..labels.len()).map(|i| labels.get(i)).collect();
            let stats = layer.train_step(built.estimator.as_ref(), Batch::new(&phi, &positives), rng, true);
            (stats.loss_sum / phi.rows() as f64, layer.dphi().as_slice().to_vec())
        });
        if !loss.is_finite() {
            return Err(invalid(format!("the loss is {loss}: training diverged; lower the optimiser's learning rate")));
        }
        let dphi = Array2::from_shape_vec((phi.rows(), phi.cols()), dphi).map_err(|e| invalid(e.to_string()))?;
        Ok((loss, dphi.into_pyarray(py)))
    }

    /// The `k` best classes of every row of `features` by exact score `w_k·φ + b_k`, best
    /// first: ids `int64[B, k]` and scores `float32[B, k]`.
    fn scores<'py>(&self, py: Python<'py>, features: PyReadonlyArray2<'py, f32>, k: usize) -> PyResult<TopK<'py>> {
        let phi = self.features(&features)?;
        let k = k.min(self.layer.n_classes());
        if k == 0 {
            return Err(invalid("k must be at least 1"));
        }
        let (ids, scores) = py.detach(|| {
            let mut z = Matrix::zeros(phi.rows(), self.layer.n_classes());
            self.layer.scores(&phi, &mut z);
            let (mut ids, mut scores) = (Vec::with_capacity(phi.rows() * k), Vec::with_capacity(phi.rows() * k));
            let mut hits = Vec::with_capacity(k);
            for i in 0..phi.rows() {
                farout_core::topk::top_k(z.row(i), k, &mut hits);
                for h in &hits {
                    ids.push(i64::from(h.class));
                    scores.push(h.score);
                }
            }
            (ids, scores)
        });
        top_k_arrays(py, phi.rows(), k, ids, scores)
    }

    /// W as a new `float32[n_classes, dim]` array.
    #[getter]
    fn weights<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        matrix_array(py, self.layer.weights())
    }

    /// The bias as a new `float32[n_classes]` array, or None for a layer without one.
    #[getter]
    fn bias<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<f32>>> {
        self.layer.bias().map(|b| b.to_vec().into_pyarray(py))
    }

    /// Steps taken.
    #[getter]
    fn steps(&self) -> u64 {
        self.layer.step()
    }

    /// The estimator's name.
    #[getter]
    fn estimator(&self) -> &'static str {
        self.built.estimator.name()
    }

    /// The spec the layer was built from (JSON).
    #[getter]
    fn spec(&self) -> String {
        self.spec.to_string()
    }

    /// Writes the layer (W, bias, optimiser state, its index once built, and its spec) into the
    /// directory `path`.
    fn save(&self, path: PathBuf) -> PyResult<()> {
        std::fs::create_dir_all(&path).py_err()?;
        self.layer.save(&path.join(WEIGHTS_FILE)).py_err()?;
        self.layer.save_index(&path).py_err()?;
        std::fs::write(path.join(CONFIG_FILE), self.spec.to_string()).py_err()
    }

    /// Reads a layer saved by `save`.
    #[staticmethod]
    fn load(path: PathBuf) -> PyResult<Self> {
        let spec = std::fs::read_to_string(path.join(CONFIG_FILE)).py_err()?;
        let spec: serde_json::Value =
            serde_json::from_str(&spec).map_err(|e| invalid(format!("{}: {e}", path.join(CONFIG_FILE).display())))?;
        let mut layer = Self::build(spec, None)?;
        layer.layer.load(&path.join(WEIGHTS_FILE)).py_err()?;
        layer.layer.load_index(&path).py_err()?;
        Ok(layer)
    }
}
