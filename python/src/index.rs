//! `farout.Index`: maximum inner product search over the rows of a `float32[K, D]` array with
//! any of farout's indexes (`farout_search`), kept up to date row by row, saved and loaded
//! without being built again. The Python class (`farout/_index.py`) checks and converts the
//! arguments and calls this one.
//!
//! The index keeps its own copy of the vectors (farout's indexes search a matrix they are
//! given, and the caller's array may change under them): the vectors are copied once when the
//! index is built, and `update` writes the new rows into that copy. Queries are read in place
//! when they are C-contiguous float32 (the Python side makes them so, copying only other
//! layouts and dtypes) and copied once into farout's matrix type before a batched search.

use crate::arrays::{TopK, finite_rows, matrix_array, top_k_arrays};
use crate::errors::{IntoPy, invalid};
use farout_core::Matrix;
use farout_core::topk::{Hit, by_score};
use farout_search::{BlockIndex, IndexConfig, Rows, persist};
use numpy::{PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use std::path::PathBuf;

/// An index over the rows of its own copy of the vectors (see the module docs).
#[pyclass(module = "farout._farout")]
pub struct NativeIndex {
    w: Matrix,
    config: IndexConfig,
    index: BlockIndex,
}

/// The index configuration `params` (a JSON object of `[index]` keys with `kind`), checked.
fn config(params: &str) -> PyResult<IndexConfig> {
    let config: IndexConfig = serde_json::from_str(params).map_err(|e| invalid(format!("index parameters: {e}")))?;
    config.check().map_err(|e| invalid(format!("index parameters: {e}")))?;
    Ok(config)
}

/// `hits` as row `i` of the results (best first; ids -1 and scores -inf past the hits found).
fn write_row(hits: &mut [Hit], ids: &mut [i64], scores: &mut [f32]) {
    hits.sort_unstable_by(by_score);
    ids.fill(-1);
    scores.fill(f32::NEG_INFINITY);
    for ((h, id), s) in hits.iter().zip(ids.iter_mut()).zip(scores.iter_mut()) {
        (*id, *s) = (i64::from(h.class), h.score);
    }
}

impl NativeIndex {
    fn check_dim(&self, what: &str, d: usize) -> PyResult<()> {
        if d == self.w.cols() {
            return Ok(());
        }
        Err(invalid(format!("{what} have {d} columns; the index's vectors have {}", self.w.cols())))
    }

    fn check_k(&self, k: usize) -> PyResult<()> {
        if (1..=self.w.rows()).contains(&k) {
            return Ok(());
        }
        Err(invalid(format!("k = {k}: must be between 1 and the number of vectors, {}", self.w.rows())))
    }

    /// The top `k` of every query of `q` (`[n, d]`, row-major) as `(ids, scores)`, row-major.
    fn top_k(&self, q: &[f32], n: usize, k: usize) -> (Vec<i64>, Vec<f32>) {
        let (mut ids, mut scores) = (vec![0i64; n * k], vec![0f32; n * k]);
        if n == 1 {
            // One query: no matrix, and the thread pool only where the index shares a query
            // probing many rows among its threads (the per-call cost of a lone query).
            let mut hits = Vec::with_capacity(k);
            self.index.block(0).search(Rows::all(&self.w), q, k, &mut hits);
            write_row(&mut hits, &mut ids, &mut scores);
            return (ids, scores);
        }
        let queries = Matrix::from_vec(n, self.w.cols(), q.to_vec()).expect("n rows of d values");
        let mut found = Vec::new();
        self.index.search_block_batch(&self.w, 0, &queries, k, &mut found);
        for (i, hits) in found.iter_mut().enumerate() {
            write_row(hits, &mut ids[i * k..(i + 1) * k], &mut scores[i * k..(i + 1) * k]);
        }
        (ids, scores)
    }
}

#[pymethods]
impl NativeIndex {
    /// Builds the index of `params` (JSON of `[index]` keys with `kind`) over a copy of
    /// `vectors` (`float32[K, D]`, C-contiguous, finite); releases the GIL while it builds.
    #[new]
    fn new(py: Python<'_>, vectors: PyReadonlyArray2<'_, f32>, params: &str) -> PyResult<Self> {
        let config = config(params)?;
        let (values, n, d) = finite_rows(&vectors, "vectors")?;
        if n == 0 || d == 0 {
            return Err(invalid(format!("vectors: shape ({n}, {d}); the index needs at least one row and column")));
        }
        let w = Matrix::from_vec(n, d, values.to_vec()).expect("n rows of d values");
        let index = py.detach(|| BlockIndex::build(&w, &config, 1));
        Ok(Self { w, config, index })
    }

    /// Ids `int64[n, k]` and scores `float32[n, k]` of the `k` rows with the largest inner
    /// product with every query (`float32[n, D]`), best first; GIL released.
    fn search<'py>(&self, py: Python<'py>, queries: PyReadonlyArray2<'py, f32>, k: usize) -> PyResult<TopK<'py>> {
        let (q, n, d) = finite_rows(&queries, "queries")?;
        self.check_dim("queries", d)?;
        self.check_k(k)?;
        let (ids, scores) = py.detach(|| self.top_k(q, n, k));
        top_k_arrays(py, n, k, ids, scores)
    }

    /// Replaces rows `ids` (`int64[m]`, distinct, in range) by `rows` (`float32[m, D]`) and
    /// re-indexes only those rows; an index that asks to be rebuilt (a row outgrew its norm
    /// bound) is rebuilt from the same parameters. GIL released.
    fn update(
        &mut self,
        py: Python<'_>,
        ids: PyReadonlyArray1<'_, i64>,
        rows: PyReadonlyArray2<'_, f32>,
    ) -> PyResult<()> {
        let (values, m, d) = finite_rows(&rows, "rows")?;
        self.check_dim("rows", d)?;
        let ids = ids.as_slice().map_err(|_| invalid("ids: expected a contiguous int64 array"))?;
        if ids.len() != m {
            return Err(invalid(format!("{} ids for {m} rows", ids.len())));
        }
        let n = self.w.rows();
        let mut seen = vec![false; n];
        let mut classes = Vec::with_capacity(m);
        for &i in ids {
            if i < 0 || i as usize >= n || std::mem::replace(&mut seen[i as usize], true) {
                return Err(invalid(format!("ids: {i} is outside 0..{n} or given twice")));
            }
            classes.push(i as u32);
        }
        py.detach(|| {
            for (j, &i) in classes.iter().enumerate() {
                self.w.row_mut(i as usize).copy_from_slice(&values[j * d..(j + 1) * d]);
            }
            self.index.refresh(&self.w, &classes);
            if self.index.needs_rebuild() {
                self.index = BlockIndex::build(&self.w, &self.config, 1);
            }
        });
        Ok(())
    }

    /// Mean recall of the index's top `k` against brute force over `queries`, both batched.
    fn recall(&self, py: Python<'_>, queries: PyReadonlyArray2<'_, f32>, k: usize) -> PyResult<f64> {
        let (q, n, d) = finite_rows(&queries, "queries")?;
        self.check_dim("queries", d)?;
        self.check_k(k)?;
        let queries = Matrix::from_vec(n, d, q.to_vec()).expect("n rows of d values");
        Ok(py.detach(|| self.index.recall(&self.w, &queries, k)))
    }

    /// Writes the index, its parameters and the vectors to `path` (farout's index file,
    /// checksummed, replaced atomically); GIL released.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| persist::save(&path, &self.index, Some(&self.config), &self.w, true)).py_err()
    }

    /// Reads an index file written by `save` (or by `farout index` with its vectors), without
    /// building the index again; GIL released.
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let loaded = py.detach(|| persist::load(&path, None)).py_err()?;
        let w = loaded.rows.ok_or_else(|| invalid(format!("{}: the file holds no vectors", path.display())))?;
        let config = match loaded.config {
            Some(c) => c,
            None => serde_json::from_value(serde_json::json!({ "kind": loaded.index.block(0).name() }))
                .map_err(|e| invalid(e.to_string()))?,
        };
        if loaded.index.n_blocks() != 1 {
            return Err(invalid(format!(
                "{}: an index of {} column blocks (a layer's); farout.Index holds one",
                path.display(),
                loaded.index.n_blocks()
            )));
        }
        Ok(Self { w, config, index: loaded.index })
    }

    /// Number of vectors.
    fn __len__(&self) -> usize {
        self.w.rows()
    }

    /// Dimension of the vectors.
    #[getter]
    fn dim(&self) -> usize {
        self.w.cols()
    }

    /// The index in use (`exact`, `spherical`, `flat_int8`, ... ; `auto` reports itself).
    #[getter]
    fn kind(&self) -> &'static str {
        self.index.block(0).name()
    }

    /// The parameters it was built from, as JSON.
    #[getter]
    fn params(&self) -> PyResult<String> {
        serde_json::to_string(&self.config).map_err(|e| invalid(e.to_string()))
    }

    /// A copy of the vectors, `float32[K, D]`.
    fn vectors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        matrix_array(py, &self.w)
    }
}
