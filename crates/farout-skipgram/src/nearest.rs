//! The nearest words of a word or a vector, by cosine similarity, through farout's search
//! index.
//!
//! The cosine of a query `q` and a word vector `v` is `(q / |q|) . (v / |v|)`: an inner product
//! of unit vectors. [`Neighbours`] keeps a copy of the vectors scaled to unit length (a zero
//! vector stays zero and has cosine 0 with everything) and searches it with a [`MipsIndex`]
//! for the largest inner products with the unit query: maximum inner product search on unit
//! rows is cosine search, and the index returns exact scores for what it finds.
//!
//! **When the index pays.** Brute force scores every word per query; an index first has to be
//! built (k-means over the words for the automatic and spherical indexes) and then calibrated,
//! which the automatic index does by answering its first `calibration_queries` (256) queries by
//! brute force. So [`Neighbours`] answers by brute force, exactly, until it has been asked
//! [`INDEX_AFTER_QUERIES`] queries, and builds the configured index only then; the automatic
//! index is itself brute force below `exact_below` words (2,000). A few words asked from the
//! command line never build an index; a session asking thousands does, once.

use crate::Error;
use crate::vectors::{Lookup, Vectors};
use farout_core::topk::{Hit, by_score};
use farout_core::{Matrix, kernels};
use farout_search::{ExactIndex, IndexConfig, MipsIndex, Rows};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Queries answered by brute force before the index is built: as many as the automatic
/// index's calibration sample, which it would answer by brute force anyway (module docs).
pub const INDEX_AFTER_QUERIES: usize = 256;

/// Nearest rows by cosine similarity over a set of vectors (see the module docs).
pub struct Neighbours {
    /// The vectors scaled to unit length, `[words, dim]`.
    unit: Matrix,
    config: IndexConfig,
    index: OnceLock<Box<dyn MipsIndex>>,
    /// Queries asked so far.
    asked: AtomicUsize,
}

impl Neighbours {
    /// Nearest-neighbour search over the rows of `vectors` (`[words, dim]`) with the index of
    /// `config` (checked here; the error names the `[index]` key).
    pub fn new(vectors: &Matrix, config: IndexConfig) -> Result<Self, Error> {
        config.check()?;
        let mut unit = vectors.clone();
        (0..unit.rows()).for_each(|i| _ = kernels::normalize(unit.row_mut(i)));
        Ok(Self { unit, config, index: OnceLock::new(), asked: AtomicUsize::new(0) })
    }

    /// Number of rows searched.
    pub fn len(&self) -> usize {
        self.unit.rows()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.unit.rows() == 0
    }

    /// Whether the index has been built (else every query so far was answered by brute force).
    pub fn index_built(&self) -> bool {
        self.index.get().is_some()
    }

    /// For every row of `queries` (`[n, dim]`), the `topn` rows with the largest cosine, best
    /// first, leaving out the rows `exclude(i)` lists for query `i` (the query words
    /// themselves). `hits[j].score` is the cosine.
    pub fn search(&self, queries: &Matrix, topn: usize, exclude: impl Fn(usize) -> Vec<usize>) -> Vec<Vec<Hit>> {
        let mut unit = queries.clone();
        (0..unit.rows()).for_each(|i| _ = kernels::normalize(unit.row_mut(i)));
        let skip: Vec<Vec<usize>> = (0..unit.rows()).map(exclude).collect();
        let k = (topn + skip.iter().map(Vec::len).max().unwrap_or(0)).min(self.len());
        let asked = self.asked.fetch_add(unit.rows(), Ordering::Relaxed) + unit.rows();
        let rows = Rows::all(&self.unit);
        let mut found = Vec::new();
        if asked <= INDEX_AFTER_QUERIES && !self.index_built() {
            ExactIndex::new().search_batch(rows, &unit, k, &mut found);
        } else {
            self.index.get_or_init(|| self.config.build(rows)).search_batch(rows, &unit, k, &mut found);
        }
        for (hits, skip) in found.iter_mut().zip(&skip) {
            hits.retain(|h| !skip.contains(&(h.class as usize)));
            hits.sort_unstable_by(by_score);
            hits.truncate(topn);
        }
        found
    }
}

/// The query vector of `word` in `v` and its row (to leave out of its own neighbours): its
/// vector, or for a word outside the vocabulary the mean of its n-grams' rows (row `None`); an
/// error when it has neither.
pub fn word_query(v: &Vectors, word: &str) -> Result<(Vec<f32>, Option<usize>), Error> {
    let mut x = vec![0.0; v.matrix().cols()];
    match v.vector(word, &mut x) {
        Lookup::Known => Ok((x, v.id(word))),
        Lookup::FromNgrams => Ok((x, None)),
        Lookup::Missing => Err(Error::Vectors {
            msg: format!(
                "{word:?} is not in the vocabulary{}",
                if v.ngrams().is_some() {
                    " and has no n-gram in the model"
                } else {
                    ", and the vectors have no n-gram rows (a .model with subwords has)"
                }
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_core::rng;

    /// `n` words of `d` standard normal values, drawn around 40 directions so that an index
    /// has clusters to find.
    fn vectors(n: usize, d: usize) -> Matrix {
        let mut r = rng::seeded(11, 0);
        let centres: Vec<f32> = (0..40 * d).map(|_| rng::normal(&mut r)).collect();
        let mut m = Matrix::zeros(n, d);
        for i in 0..n {
            let c = &centres[(i % 40) * d..(i % 40 + 1) * d];
            m.row_mut(i).iter_mut().zip(c).for_each(|(x, &c)| *x = c + 0.5 * rng::normal(&mut r));
        }
        m
    }

    /// The `topn` rows of `m` with the largest cosine with row `q` (itself left out), in f64,
    /// best first.
    fn brute_force(m: &Matrix, q: usize, topn: usize) -> Vec<(usize, f64)> {
        let unit = |x: &[f32]| -> Vec<f64> {
            let n = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt();
            x.iter().map(|&v| v as f64 / n).collect()
        };
        let uq = unit(m.row(q));
        let mut all: Vec<(usize, f64)> = (0..m.rows())
            .filter(|&i| i != q)
            .map(|i| (i, unit(m.row(i)).iter().zip(&uq).map(|(a, b)| a * b).sum()))
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all.truncate(topn);
        all
    }

    fn queries(m: &Matrix, rows: std::ops::Range<usize>) -> Matrix {
        let mut q = Matrix::zeros(rows.len(), m.cols());
        rows.clone().enumerate().for_each(|(j, i)| q.row_mut(j).copy_from_slice(m.row(i)));
        q
    }

    /// Below the crossover (the first queries) and with the exact index, the neighbours are
    /// brute force's top-k, cosines to 1e-6.
    #[test]
    fn nearest_words_equal_brute_force_cosine_top_k() {
        let m = vectors(3_000, 24);
        for config in [IndexConfig::default(), IndexConfig::exact()] {
            let n = Neighbours::new(&m, config).unwrap();
            let found = n.search(&queries(&m, 0..100), 10, |i| vec![i]);
            assert!(!n.index_built());
            for (q, hits) in found.iter().enumerate() {
                let exact = brute_force(&m, q, 10);
                assert_eq!(
                    hits.iter().map(|h| h.class as usize).collect::<Vec<_>>(),
                    exact.iter().map(|e| e.0).collect::<Vec<_>>()
                );
                for (h, e) in hits.iter().zip(&exact) {
                    assert!((h.score as f64 - e.1).abs() < 1e-6, "{} vs {}", h.score, e.1);
                }
            }
        }
    }

    /// Past the crossover the automatic index answers: exact cosines, recall of the top 10 at
    /// least 0.9 against brute force.
    #[test]
    fn past_the_crossover_the_index_finds_the_nearest_words() {
        let m = vectors(6_000, 24);
        let n = Neighbours::new(&m, IndexConfig::default()).unwrap();
        n.search(&queries(&m, 0..INDEX_AFTER_QUERIES), 10, |i| vec![i]);
        let found = n.search(&queries(&m, 1000..1400), 10, |i| vec![1000 + i]);
        assert!(n.index_built());
        let mut hit = 0;
        for (j, hits) in found.iter().enumerate() {
            let exact = brute_force(&m, 1000 + j, 10);
            hit += hits.iter().filter(|h| exact.iter().any(|e| e.0 == h.class as usize)).count();
            for h in hits {
                let c = kernels::cosine(m.row(h.class as usize), m.row(1000 + j));
                assert!((h.score - c).abs() < 1e-5 && h.class as usize != 1000 + j);
            }
        }
        let recall = hit as f64 / (10.0 * found.len() as f64);
        assert!(recall >= 0.9, "recall {recall}");
    }

    #[test]
    fn a_word_without_a_vector_is_an_error_naming_it() {
        let m = vectors(10, 4);
        let v = Vectors::new((0..10).map(|i| format!("w{i}")).collect(), m).unwrap();
        assert_eq!(word_query(&v, "w3").unwrap().1, Some(3));
        let e = word_query(&v, "nowhere").unwrap_err().to_string();
        assert!(e.contains("\"nowhere\" is not in the vocabulary"), "{e}");
    }
}
