//! `farout.KeyedVectors`: word vectors read from word2vec text and binary files and farout's
//! `.model` (with n-gram rows for words outside the vocabulary), their nearest words by cosine
//! through farout's search index (`farout_skipgram::nearest`: brute force for the first
//! queries, the automatic index after), the evaluations of `farout eval`, and
//! `farout.train_word_vectors`. The Python class (`farout/_vectors.py`) wraps this one.

use crate::arrays::{TopK, finite_rows, matrix_array, top_k_arrays};
use crate::errors::{IntoPy, invalid};
use farout_core::Matrix;
use farout_search::IndexConfig;
use farout_skipgram::nearest::Neighbours;
use farout_skipgram::vectors::{Format, Lookup, Vectors};
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::OnceLock;

/// Word vectors and their nearest-neighbour search (built at the first query).
#[pyclass(module = "farout._farout", frozen)]
pub struct NativeVectors {
    v: Vectors<'static>,
    neighbours: OnceLock<Neighbours>,
}

impl NativeVectors {
    fn new(v: Vectors<'static>) -> Self {
        Self { v, neighbours: OnceLock::new() }
    }

    fn neighbours(&self) -> &Neighbours {
        self.neighbours.get_or_init(|| {
            Neighbours::new(self.v.matrix(), IndexConfig::default()).expect("the default index parameters are valid")
        })
    }
}

#[pymethods]
impl NativeVectors {
    /// Reads word vectors: farout's model for `.model`, word2vec binary for `.bin`, else
    /// word2vec text (NaN and infinite values refused, naming the word); GIL released.
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let v = py.detach(|| Vectors::load(&path, Format::from_path(&path))).py_err()?;
        Ok(Self::new(v))
    }

    /// Vectors from `words` and `vectors` (`float32[n, D]`, C-contiguous, finite).
    #[staticmethod]
    fn from_arrays(words: Vec<String>, vectors: PyReadonlyArray2<'_, f32>) -> PyResult<Self> {
        let [n, d] = [vectors.shape()[0], vectors.shape()[1]];
        let values = vectors.as_slice().map_err(|_| invalid("vectors: expected a C-contiguous float32 array"))?;
        if let Some(at) = values.iter().position(|x| !x.is_finite()) {
            return Err(invalid(format!("vectors: row {} holds {}; values must be finite", at / d.max(1), values[at])));
        }
        let m = Matrix::from_vec(n, d, values.to_vec()).expect("n rows of d values");
        Ok(Self::new(Vectors::new(words, m).py_err()?))
    }

    /// Number of words.
    fn __len__(&self) -> usize {
        self.v.words().len()
    }

    /// Dimension of the vectors.
    #[getter]
    fn dim(&self) -> usize {
        self.v.matrix().cols()
    }

    /// Whether words outside the vocabulary get a vector from n-gram rows.
    #[getter]
    fn has_ngrams(&self) -> bool {
        self.v.ngrams().is_some()
    }

    /// The words, in file order.
    fn words(&self) -> Vec<String> {
        self.v.words().to_vec()
    }

    /// Row of `word`, if it is in the vocabulary.
    fn index_of(&self, word: &str) -> Option<usize> {
        self.v.id(word)
    }

    /// The vector of `word`: its own, or the mean of its n-grams' rows for a word outside the
    /// vocabulary; `None` when it has neither.
    fn vector<'py>(&self, py: Python<'py>, word: &str) -> Option<Bound<'py, PyArray1<f32>>> {
        let mut x = vec![0.0; self.v.matrix().cols()];
        (self.v.vector(word, &mut x) != Lookup::Missing).then(|| x.into_pyarray(py))
    }

    /// A copy of the vectors, `float32[n, D]`.
    fn vectors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        matrix_array(py, self.v.matrix())
    }

    /// Rows `int64[n, topn]` and cosines `float32[n, topn]` of the `topn` words nearest each
    /// query (`float32[n, D]`), best first, leaving out the rows `exclude[i]` for query `i`
    /// (-1 and -inf past the words there are); GIL released.
    fn most_similar<'py>(
        &self,
        py: Python<'py>,
        queries: PyReadonlyArray2<'py, f32>,
        exclude: Vec<Vec<usize>>,
        topn: usize,
    ) -> PyResult<TopK<'py>> {
        let [n, d] = [queries.shape()[0], queries.shape()[1]];
        if d != self.v.matrix().cols() || exclude.len() != n || topn == 0 {
            return Err(invalid(format!(
                "queries of {d} values (the vectors have {}), {} exclusion lists for {n} queries, topn {topn} (>= 1)",
                self.v.matrix().cols(),
                exclude.len()
            )));
        }
        let (q, ..) = finite_rows(&queries, "queries")?;
        let q = Matrix::from_vec(n, d, q.to_vec()).expect("n rows of d values");
        let found = py.detach(|| self.neighbours().search(&q, topn, |i| exclude[i].clone()));
        let (mut ids, mut scores) = (vec![-1i64; n * topn], vec![f32::NEG_INFINITY; n * topn]);
        for (i, hits) in found.iter().enumerate() {
            for (j, h) in hits.iter().enumerate() {
                (ids[i * topn + j], scores[i * topn + j]) = (i64::from(h.class), h.score);
            }
        }
        top_k_arrays(py, n, topn, ids, scores)
    }

    /// Spearman and Pearson correlations of cosines with the scores of a word-pair file (as
    /// `farout eval similarity`), as JSON.
    fn evaluate_word_pairs(&self, py: Python<'_>, path: PathBuf) -> PyResult<String> {
        let report = py.detach(|| farout_skipgram::eval::similarity(&self.v, &path)).py_err()?;
        serde_json::to_string(&report).map_err(|e| invalid(e.to_string()))
    }

    /// Accuracy on an analogy question file over the first `restrict` words (0: all), as
    /// `farout eval analogy`, as JSON.
    fn evaluate_analogies(&self, py: Python<'_>, path: PathBuf, restrict: usize) -> PyResult<String> {
        let report = py.detach(|| farout_skipgram::eval::analogy(&self.v, &path, restrict)).py_err()?;
        serde_json::to_string(&report).map_err(|e| invalid(e.to_string()))
    }

    /// Writes the vectors: farout's model for `.model`, word2vec binary for `.bin`, else text.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| self.v.save(&path, Format::from_path(&path))).py_err()
    }
}

/// Trains skip-gram word vectors as `farout train` would on the config `json` (a skip-gram
/// config's tables) and reads the vectors it exports to `export` (a `.model`, with the n-gram
/// rows when the model has subwords); Ctrl-C stops it within a sentence, keeping nothing.
#[pyfunction]
pub fn train_word_vectors(py: Python<'_>, json: &str, export: PathBuf) -> PyResult<NativeVectors> {
    let text = crate::runs::toml_text(json)?;
    let config = farout_train::Config::from_text(&text, &[], "word_vectors")
        .map_err(|e| invalid(format!("word vectors: {e}")))?;
    let options =
        farout_train::TrainOptions { resume: false, overwrite: true, export_vectors: Some(&export), warm_start: None };
    crate::runs::outcome(crate::runs::interruptible(py, || {
        farout_train::train(&config, &options, &farout_dist::Local)
    })?)?;
    NativeVectors::load(py, export)
}
