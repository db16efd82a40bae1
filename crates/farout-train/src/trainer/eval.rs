//! Evaluation of a classifier: test metrics (merged over the ranks of a class-sharded layer),
//! predictions, the layer's rows and the encoder's features for export, the gradient fidelity
//! of an approximate estimator, and the run's summary.

use super::{Encoder, Summary, Trainer, embed_in_place, peak_rss_bytes};
use crate::Error;
use crate::data;
use crate::metrics::RankingSums;
use crate::sinks::{MetricsSink, Sinks};
use farout_core::topk::{Hit, top_k};
use farout_core::{ClassId, Matrix, rng};
use farout_data::Dataset;
use farout_dist::Strided;
use farout_estimators::{Batch, GradientEstimator, LossScratch};
use farout_layer::sharded;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// Bytes of scores an evaluation batch holds at most: at K = 672,000 a batch of 256 rows took
/// 688 MB beside a training run (the largest allocation after the features), so large output
/// layers are scored fewer rows at a time (24 there).
const EVAL_SCORE_BYTES: usize = 64 << 20;

impl Trainer<'_> {
    /// The output layer's search problem, its rows: W, with the bias as a last column when the
    /// layer has one, so that [`Trainer::feature_rows`] · rowsᵀ are the layer's scores (a
    /// class-sharded layer gives its own rows).
    pub fn class_rows(&self) -> Matrix {
        let w = self.layer.weights();
        let Some(bias) = self.layer.bias() else { return w.clone() };
        let d = w.cols();
        let mut rows = Matrix::zeros(w.rows(), d + 1);
        for (k, &b) in bias.iter().enumerate() {
            rows.row_mut(k)[..d].copy_from_slice(w.row(k));
            rows.row_mut(k)[d] = b;
        }
        rows
    }

    /// The queries of the output layer's search: the encoder's features of every sample of
    /// `ds`, with a trailing 1 when the layer has a bias ([`Trainer::class_rows`]).
    pub fn feature_rows(&self, ds: &Dataset) -> Result<Matrix, Error> {
        let d = self.layer.d_model();
        let cols = d + usize::from(self.layer.bias().is_some());
        let mut rows = Matrix::zeros(ds.len(), cols);
        self.feature_batches(ds, ds.len(), self.config.eval.batch_size, |idx, phi| {
            for (r, &i) in idx.iter().enumerate() {
                let row = rows.row_mut(i);
                row[..d].copy_from_slice(phi.row(r));
                if cols > d {
                    row[d] = 1.0;
                }
            }
            Ok(())
        })?;
        Ok(rows)
    }

    /// Evaluates on (the first `max_samples`, 0 = all, of) `ds`: P@k, nDCG@k, exact loss.
    fn evaluate_local(&self, ds: &Dataset, max_samples: usize) -> BTreeMap<String, f64> {
        debug_assert!(self.shard.is_none(), "a class-sharded layer evaluates through its ranks");
        let n = if max_samples == 0 { ds.len() } else { ds.len().min(max_samples) };
        let mut sums = RankingSums::default();
        self.scored_batches(ds, n, |idx, z| {
            let k = z.cols();
            // Each sample's figures in parallel, summed in sample order: the same metrics to
            // the last bit whatever the threads did (a parallel reduction's split points vary).
            let per_sample: Vec<RankingSums> = z
                .as_slice()
                .par_chunks(k)
                .zip(idx.par_iter())
                .map_init(
                    || (Vec::new(), Vec::new(), LossScratch::default()),
                    |(hits, grad, scratch), (row, &i)| {
                        let pos = ds.labels.get(i);
                        top_k(row, 5, hits);
                        grad.resize(k, 0.0);
                        let l = if pos.is_empty() { 0.0 } else { self.loss.value_and_grad(row, pos, grad, scratch) };
                        let mut s = RankingSums::default();
                        s.add(hits, pos, l as f64);
                        s
                    },
                )
                .collect();
            per_sample.iter().for_each(|s| sums.merge(s));
            Ok(())
        })
        .expect("one process does not communicate");
        sums.finish(ds.labels.is_multiclass())
    }

    /// Scores the first `n` samples of `ds` batch by batch (`eval.batch_size` rows, fewer when
    /// their scores would take more than [`EVAL_SCORE_BYTES`]): `f(idx, z)` with the batch's
    /// sample indices and their scores over this rank's classes.
    fn scored_batches(
        &self,
        ds: &Dataset,
        n: usize,
        mut f: impl FnMut(&[usize], &Matrix) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let per_row = 4 * self.layer.n_classes().max(1);
        let rows = self.config.eval.batch_size.min((EVAL_SCORE_BYTES / per_row).max(1));
        let mut z = Matrix::default();
        self.feature_batches(ds, n, rows, |idx, phi| {
            self.layer.scores(phi, &mut z);
            f(idx, &z)
        })
    }

    /// Runs `f(idx, features)` on the first `n` samples of `ds` in batches of `rows`.
    fn feature_batches(
        &self,
        ds: &Dataset,
        n: usize,
        rows: usize,
        mut f: impl FnMut(&[usize], &Matrix) -> Result<(), Error>,
    ) -> Result<(), Error> {
        for start in (0..n).step_by(rows) {
            let idx: Vec<usize> = (start..(start + rows).min(n)).collect();
            f(&idx, &self.features(ds, &idx)?)?;
        }
        Ok(())
    }

    /// [`Trainer::evaluate`] as one of the ranks of `comm`: with a class-sharded layer, the
    /// ranks' top-5 are merged and the softmax loss combines their normalisers; the same
    /// metrics on every rank. Other losses (the smoothed margin's projection needs every score
    /// of a row in one place) are left out of a class-sharded layer's metrics.
    pub fn evaluate(&self, ds: &Dataset, max_samples: usize) -> Result<BTreeMap<String, f64>, Error> {
        let comm = self.comm;
        let Some(shard) = self.shard else { return Ok(self.evaluate_local(ds, max_samples)) };
        let n = if max_samples == 0 { ds.len() } else { ds.len().min(max_samples) };
        let softmax = self.loss.name() == "softmax";
        let mut sums = RankingSums::default();
        self.scored_batches(ds, n, |idx, z| {
            let positives: Vec<&[ClassId]> = idx.iter().map(|&i| ds.labels.get(i)).collect();
            let hits = sharded::merged_top_k(comm, z, &shard, 5)?;
            let losses = if softmax {
                sharded::softmax_losses(comm, z, &shard, &positives)?
            } else {
                vec![0.0; positives.len()]
            };
            for ((h, pos), l) in hits.iter().zip(&positives).zip(losses) {
                sums.add(h, pos, l);
            }
            Ok(())
        })?;
        let mut metrics = sums.finish(ds.labels.is_multiclass());
        if !softmax {
            metrics.remove("loss");
        }
        Ok(metrics)
    }

    /// [`Trainer::predict`] as one of the ranks of `comm` (a class-sharded layer merges the
    /// ranks' top-k); the same predictions on every rank.
    pub fn predict(&self, ds: &Dataset, k: usize) -> Result<Vec<Vec<Hit>>, Error> {
        let comm = self.comm;
        let shard = self.shard.unwrap_or(Strided::whole(self.data.n_classes));
        // No more hits than classes exist: a larger k (up to usize::MAX) must not size a buffer.
        let k = k.min(self.data.n_classes);
        let mut out = Vec::with_capacity(ds.len());
        self.scored_batches(ds, ds.len(), |_, z| {
            out.extend(sharded::merged_top_k(comm, z, &shard, k)?);
            Ok(())
        })?;
        Ok(out)
    }

    /// Loads a data file in the config's format for prediction (features of the training set's
    /// dimension; labels optional).
    pub fn load_input(&self, path: &Path, labels: Option<&Path>) -> Result<Dataset, Error> {
        let mut ds = data::load_split(&self.config, path, labels, Some(&self.data.train))?;
        data::prepare(&self.config, self.data.idf.as_deref(), &mut ds);
        if let Encoder::Face(head) = &self.encoder {
            embed_in_place(head, &mut ds, self.config.eval.batch_size);
        }
        Ok(ds)
    }

    /// Mean cosine between the estimator's `dL/dphi` and the exact one on the first `n`
    /// training samples (see [`Summary::grad_cosine`]); `None` for exact estimators. Runs the
    /// estimator's batch path (A&R state is read and updated as in a training step). `None`
    /// with a class-sharded layer too: the reference would need every rank's rows.
    pub fn gradient_fidelity(&self, n: usize) -> Option<f64> {
        if self.shard.is_some() || (self.estimator.uses_index() && self.layer.index().is_none()) {
            return None; // search never started (warm-up covered the run)
        }
        let reference = self.reference.as_ref()?;
        let idx: Vec<usize> = (0..n.min(self.data.train.len())).collect();
        let ctx = self.layer.ctx();
        // The exact gradient holds every score of its batch: as many rows at a time as an
        // evaluation batch.
        let rows = (EVAL_SCORE_BYTES / (4 * self.layer.n_classes().max(1))).max(1);
        let mut cos = 0.0;
        for (part, idx) in idx.chunks(rows).enumerate() {
            let phi = self.features(&self.data.train, idx).ok()?;
            let positives: Vec<&[ClassId]> = idx.iter().map(|&i| self.data.train.labels.get(i)).collect();
            let batch = Batch::new(&phi, &positives).with_ids(idx);
            let dphi = |e: &dyn GradientEstimator| {
                let (mut g, mut out) = (farout_estimators::BatchGrad::default(), Matrix::default());
                e.estimate_batch(&ctx, batch, &mut rng::seeded(self.config.seed, 0xF1D + part as u64), &mut g);
                g.dphi(ctx.w, &mut out);
                out
            };
            let (a, b) = (dphi(self.estimator.as_ref()), dphi(reference.as_ref()));
            cos += (0..idx.len()).map(|i| farout_core::kernels::cosine(a.row(i), b.row(i)) as f64).sum::<f64>();
        }
        Some(cos / idx.len().max(1) as f64)
    }

    /// Periodic evaluation on the test set (if any); returns the progress-bar suffix.
    pub(super) fn log_eval(&self, sinks: &mut Sinks, max_samples: usize) -> Result<String, Error> {
        let Some(test) = self.data.test.as_ref().filter(|t| !t.is_empty()) else {
            return Ok(String::new());
        };
        let m = self.evaluate_and_log(test, max_samples, sinks)?;
        Ok(format!(" | test p@1 {:.4}", m["p@1"]))
    }

    /// Evaluates on `ds` and records the metrics as `eval/<name>` at the current step.
    pub(super) fn evaluate_and_log(
        &self,
        ds: &Dataset,
        max_samples: usize,
        sinks: &mut Sinks,
    ) -> Result<BTreeMap<String, f64>, Error> {
        let m = self.evaluate(ds, max_samples)?;
        let mut values: Vec<(String, f64)> = m.iter().map(|(k, v)| (format!("eval/{k}"), *v)).collect();
        // Epochs completed, fractional: the x axis of comparisons against epochs.
        let per_epoch = self.data.train.len().div_ceil(self.config.train.batch_size) as f64;
        values.push(("eval/epoch".into(), self.state.epoch as f64 + self.state.batch_in_epoch as f64 / per_epoch));
        let refs: Vec<(&str, f64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        sinks.record(self.state.step, self.state.train_seconds, &refs)?;
        sinks.flush()?;
        Ok(m)
    }

    pub(super) fn summary(&self, metrics: BTreeMap<String, f64>) -> Summary {
        let s = &self.state;
        let encoder_bytes = match &self.encoder {
            Encoder::Face(_) => 0,
            Encoder::Doc(e) => e.memory_bytes(),
        };
        Summary {
            name: self.config.name.clone(),
            task: self.config.task(),
            estimator: self.estimator.name().to_string(),
            metrics,
            selection: None,
            train_seconds: s.train_seconds,
            steps: s.step,
            epochs: s.epoch,
            samples_per_s: s.samples as f64 / s.train_seconds.max(1e-9),
            classes_scored_per_sample: s.classes_scored as f64 / s.samples.max(1) as f64,
            index_recall: self.last_recall,
            grad_cosine: None,
            model_bytes: self.layer.memory_bytes() + encoder_bytes,
            peak_rss_bytes: peak_rss_bytes(),
            n_classes: self.data.n_classes,
            d_model: self.layer.d_model(),
            n_train: self.data.train.len(),
            n_test: self.data.test.as_ref().map_or(0, |t| t.len()),
            seed: self.config.seed,
            log_dir: self.config.log_dir(),
            linear: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::tiny_face;
    use super::*;
    use farout_dist::Local;

    /// The scores `feature_rows · class_rowsᵀ` by brute force.
    fn brute_force(t: &Trainer, ds: &Dataset) -> Matrix {
        let (f, w) = (t.feature_rows(ds).unwrap(), t.class_rows());
        let mut z = Matrix::zeros(f.rows(), w.rows());
        for i in 0..f.rows() {
            for k in 0..w.rows() {
                z.row_mut(i)[k] = farout_core::kernels::dot(f.row(i), w.row(k));
            }
        }
        z
    }

    #[test]
    fn predictions_are_the_top_of_the_brute_force_scores() {
        let dir = tempfile::tempdir().unwrap();
        let t = Trainer::new(tiny_face(dir.path(), "[output.layer]\nbias = true"), &Local).unwrap();
        let test = t.data().test.as_ref().unwrap();
        let z = brute_force(&t, test);
        let preds = t.predict(test, 3).unwrap();
        assert_eq!(preds.len(), test.len());
        for (i, hits) in preds.iter().enumerate() {
            let mut want = Vec::new();
            top_k(z.row(i), 3, &mut want);
            let classes = |h: &[Hit]| h.iter().map(|h| h.class).collect::<Vec<_>>();
            assert_eq!(classes(hits), classes(&want), "sample {i}");
            for (h, w) in hits.iter().zip(&want) {
                assert!((h.score - w.score).abs() <= 1e-4 * w.score.abs().max(1.0), "{h:?} {w:?}");
            }
        }
    }

    #[test]
    fn evaluation_counts_the_brute_force_top_one_and_batches_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let t = Trainer::new(tiny_face(dir.path(), "[eval]\nbatch_size = 7"), &Local).unwrap();
        let test = t.data().test.as_ref().unwrap();
        let z = brute_force(&t, test);
        let hits = (0..test.len())
            .filter(|&i| {
                let mut top = Vec::new();
                top_k(z.row(i), 1, &mut top);
                test.labels.get(i).contains(&top[0].class)
            })
            .count();
        let m = t.evaluate(test, 0).unwrap();
        assert!((m["p@1"] - hits as f64 / test.len() as f64).abs() < 1e-9, "{m:?}");
        let mut whole = tiny_face(dir.path(), "[eval]\nbatch_size = 4096");
        whole.name = t.config().name.clone();
        let m2 = Trainer::new(whole, &Local).unwrap().evaluate(test, 0).unwrap();
        assert_eq!(m["p@1"], m2["p@1"]);
        assert!((m["loss"] - m2["loss"]).abs() < 1e-6 * m["loss"].abs());
        let first = t.evaluate(test, 10).unwrap();
        assert!(first["p@1"] * 10.0 == (first["p@1"] * 10.0).round(), "10 samples: {first:?}");
    }

    #[test]
    fn an_exact_estimator_reports_no_gradient_fidelity() {
        let dir = tempfile::tempdir().unwrap();
        let exact = Trainer::new(tiny_face(dir.path(), ""), &Local).unwrap();
        assert_eq!(exact.gradient_fidelity(16), None);
        let sampled = tiny_face(dir.path(), "");
        let mut sampled = sampled;
        sampled.output.estimator =
            serde_json::from_value(serde_json::json!({"estimator": "sampled_softmax", "n_samples": 20})).unwrap();
        let t = Trainer::new(sampled, &Local).unwrap();
        let cos = t.gradient_fidelity(16).expect("an approximate estimator is measured");
        assert!(cos > 0.0 && cos <= 1.0 + 1e-9, "{cos}");
    }
}
