//! Building a classifier run from its config: data, encoder, output layer, estimator and index,
//! the optional mean-separating initialisation, and the checks of a classifier config.

use super::{Encoder, State, Trainer, embed_in_place};
use crate::Error;
use crate::config::{Config, ConfigError, DataFormat, EncoderKind};
use crate::data::{self, TaskData};
use farout_core::Matrix;
use farout_dist::{Collective, Strided};
use farout_estimators::{Built, GradientEstimator, Problem};
use farout_layer::{LayerInit, OutputLayer, sharded_sparse};
use farout_models::{DocEncoder, EncoderRanks, FaceHead};
use std::time::Instant;

/// The checks of a classifier config: the encoder goes with the data's features (the face head
/// with dense embeddings, the document encoder with sparse documents), then the training
/// sections every network has.
pub(crate) fn check_config(config: &Config) -> Result<(), ConfigError> {
    config.check_encoder_and_estimator()?;
    let sparse = matches!(config.data.format, DataFormat::Xmc | DataFormat::SyntheticXmc);
    match (config.model.encoder, sparse) {
        (EncoderKind::FaceHead, true) => {
            return Err(ConfigError::key(
                "model.encoder",
                "\"face_head\" needs dense features (data.format npy, raw or synthetic_face)",
            ));
        }
        (EncoderKind::DocEncoder, false) => {
            return Err(ConfigError::key(
                "model.encoder",
                "\"doc_encoder\" needs sparse features (data.format xmc or synthetic_xmc)",
            ));
        }
        _ => {}
    }
    config.check_training()
}

/// Whether `output.class_chunk`, when set, goes with the exact softmax and no warm-up, and if
/// not the key that says why. The estimator of a class-sharded layer is checked once built
/// ([`check_sharded_estimator`]).
fn check_class_chunk(config: &Config) -> Result<(), Error> {
    let why = |key: &str, msg: String| Err(Error::Key(ConfigError::key(key, msg)));
    if config.output.class_chunk > 0 {
        if config.output.estimator.name() != "softmax" {
            return why(
                "output.estimator",
                format!(
                    "with output.class_chunk = {} the classes are visited in chunks by the exact \"softmax\" \
                     only; found {:?}, which trains with output.class_chunk = 0",
                    config.output.class_chunk,
                    config.output.estimator.name()
                ),
            );
        }
        if config.output.warmup_steps > 0 {
            return why("output.warmup_steps", "must be 0 with output.class_chunk > 0".to_string());
        }
    }
    Ok(())
}

/// Whether `estimator` trains a layer whose classes are split over `ranks` ranks
/// ([`sharded_sparse::trains_sharded`]), and if not the error naming the key.
fn check_sharded_estimator(estimator: &dyn GradientEstimator, ranks: usize) -> Result<(), Error> {
    if sharded_sparse::trains_sharded(estimator) {
        return Ok(());
    }
    Err(Error::Key(ConfigError::key(
        "output.estimator",
        format!(
            "on {ranks} MPI ranks the class-sharded layer trains the exact \"softmax\" and \"margin\", \
             \"mips\", \"sampled_softmax\", \"negative_sampling\", \"ove\", \"ar_softmax\", \"ar_probit\", \"ar_logistic\", \
             and \"ldgs\" with iterations = \"fixed_point\" and rescore = \"exact\" (its defaults); found {:?} with \
             these settings, which trains in one process",
            estimator.name()
        ),
    )))
}

/// An error, before the model is allocated, if the output layer (W, its optimiser state and an
/// index's copy) and the document encoder's table (with its optimiser state) do not fit in the
/// memory available.
fn check_model_memory(config: &Config, data: &TaskData) -> Result<(), Error> {
    let (k, v) = (data.n_classes as u64, data.n_features as u64);
    let (d, table) = match config.model.encoder {
        EncoderKind::DocEncoder => {
            let d = config.model.doc_encoder.d_model as u64;
            (d, farout_core::resources::array_bytes(&[v, d, 2], 4))
        }
        _ => (v, 0),
    };
    let layer = farout_core::resources::array_bytes(&[k, d, 3], 4);
    // The exact estimators score every class of a batch and keep a dense gradient: [B, K] twice
    // (or [B, output.class_chunk] with chunks).
    let exact = matches!(config.output.estimator.name(), "softmax" | "margin");
    let chunk = if config.output.class_chunk > 0 { k.min(config.output.class_chunk as u64) } else { k };
    let scores =
        if exact { farout_core::resources::array_bytes(&[config.train.batch_size as u64, chunk, 2], 4) } else { 0 };
    let what = format!(
        "the model ({k} classes x {d} output layer, {v} input features{})",
        if exact { format!(", a batch's scores over {chunk} classes") } else { String::new() }
    );
    let change = "lower model.doc_encoder.d_model, train.batch_size (or set output.class_chunk), or the data's \
                  classes (one more than the largest label id) and features";
    Ok(farout_core::resources::check_memory(layer + table + scores, what, change)?)
}

/// The data of `config`, loaded once its output settings are checked, and checked: a training
/// set with classes, and a model that fits in memory.
fn load_checked(config: &Config) -> Result<TaskData, Error> {
    check_class_chunk(config)?;
    let data = data::load(config)?;
    if data.train.is_empty() {
        return Err(Error::NoData("the training set is empty"));
    }
    if data.n_classes == 0 {
        return Err(Error::NoData("the data have no classes (K = 0)"));
    }
    check_model_memory(config, &data)?;
    Ok(data)
}

/// The encoder of `config` over `data`'s features, and the dimension of the features it gives
/// the output layer. The face head's embeddings replace `data`'s features (computed once). A
/// document encoder beside a layer sharded over the ranks of `comm` holds its rank's features
/// when feature-sharded (`model.doc_encoder.ranks = "features"`).
fn build_encoder(config: &Config, data: &mut TaskData, comm: &dyn Collective) -> Result<(Encoder, usize), Error> {
    let encoder = match config.model.encoder {
        EncoderKind::FaceHead => {
            let head = FaceHead::new(&config.model.face_head, data.n_features)?;
            embed_in_place(&head, &mut data.train, config.eval.batch_size);
            if let Some(t) = &mut data.test {
                embed_in_place(&head, t, config.eval.batch_size);
            }
            Encoder::Face(head)
        }
        EncoderKind::DocEncoder => {
            let enc = &config.model.doc_encoder;
            let deal = match enc.ranks {
                EncoderRanks::Features if comm.size() > 1 => Strided::new(data.n_features, comm.rank(), comm.size())?,
                _ => Strided::whole(data.n_features),
            };
            Encoder::Doc(DocEncoder::dealt(enc, config.seed, deal)?)
        }
        EncoderKind::SkipGram => unreachable!("data::load rejects text corpora"),
    };
    let d_model = match &encoder {
        Encoder::Face(h) => h.d_out(data.n_features),
        Encoder::Doc(e) => e.d_model(),
    };
    Ok((encoder, d_model))
}

/// This rank's classes of the output layer (every P-th class, [`Strided`]), and with several
/// ranks its shard.
fn class_rows(n_classes: usize, comm: &dyn Collective) -> Result<(Strided, Option<Strided>), Error> {
    if n_classes < comm.size() {
        return Err(Error::NoData("fewer classes than MPI ranks: every rank needs one"));
    }
    let rows = Strided::new(n_classes, comm.rank(), comm.size())?;
    Ok((rows, (comm.size() > 1).then_some(rows)))
}

/// The output layer of the classes `rows` (features of dimension `d_model`) with the index of `config`'s
/// estimator attached, and the estimators (the run's and the warm-up's) for `data`. With
/// several ranks (`sharded`) the estimators must train a class-sharded layer.
fn layer_and_estimators(
    config: &Config,
    data: &TaskData,
    rows: Strided,
    d_model: usize,
    comm: &dyn Collective,
    sharded: bool,
) -> Result<(OutputLayer, crate::estimators::RunEstimator), Error> {
    let (out, seed) = (&config.output, config.seed);
    let mut layer = OutputLayer::with_classes(rows, d_model, &out.layer, &out.optimizer, seed)?;
    let (labels, k) = (&data.train.labels, data.n_classes);
    let label_counts = || {
        let mut counts = vec![0u64; k];
        labels.labels.iter().for_each(|&c| counts[c as usize] += 1);
        counts
    };
    let problem = Problem { n_classes: k, n_data: data.train.len(), dim: d_model, label_counts: &label_counts };
    let run = crate::estimators::build(config, &problem)?;
    crate::estimators::attach_index(&mut layer, &run.built, config, k, comm.size())?;
    if sharded {
        check_sharded_estimator(run.built.estimator.as_ref(), comm.size())?;
        if let Some(w) = &run.warmup {
            check_sharded_estimator(w.as_ref(), comm.size())?;
        }
    }
    Ok((layer, run))
}

/// An error if `estimator` models one label per sample and a training sample of `data` has
/// several.
fn check_single_label(estimator: &dyn GradientEstimator, data: &TaskData) -> Result<(), Error> {
    if estimator.single_label() {
        let (most, i) = data.train.labels.most_labels();
        if most > 1 {
            return Err(Error::Key(ConfigError::key(
                "data.first_label",
                format!(
                    "output.estimator = \"{}\" models one label per sample, but training sample {i} has {most} \
                 labels; set data.first_label = true (the A&R paper keeps each sample's first label)",
                    estimator.name()
                ),
            )));
        }
    }
    Ok(())
}

impl<'c> Trainer<'c> {
    /// [`Trainer::new`] as one of the ranks of `comm`: with several ranks, each holds an even
    /// share of the output layer's classes, every P-th (see [`farout_layer::sharded`]).
    pub fn new(config: Config, comm: &'c dyn Collective) -> Result<Self, Error> {
        let mut data = load_checked(&config)?;
        let (encoder, d_model) = build_encoder(&config, &mut data, comm)?;
        let (rows, shard) = class_rows(data.n_classes, comm)?;
        let (layer, run) = layer_and_estimators(&config, &data, rows, d_model, comm, shard.is_some())?;
        let crate::estimators::RunEstimator { built, warmup } = run;
        let reference = built.reference();
        let Built { estimator, loss, search, .. } = built;
        let (loss, search_top) = (loss.boxed(), search.map_or(0, |s| s.top));
        check_single_label(estimator.as_ref(), &data)?;
        let mut trainer = Self {
            comm,
            config,
            data,
            encoder,
            layer,
            estimator,
            warmup,
            search_top,
            reference,
            last_recall: None,
            loss,
            state: State::default(),
            phi: Matrix::default(),
            shard,
        };
        if trainer.config.output.layer.init == LayerInit::Msi {
            trainer.init_msi()?;
        }
        Ok(trainer)
    }

    /// Sets W (and the bias) by the mean-separating initialisation over the features of the
    /// training set as the encoder computes them now (one pass).
    fn init_msi(&mut self) -> Result<(), Error> {
        let start = Instant::now();
        let (train, batch) = (&self.data.train, self.config.eval.batch_size);
        let mut sums = farout_linear::init::OutputLayerMsi::new(train.labels.n_labels, self.layer.d_model());
        let mut row_norms = 0.0f64;
        for start in (0..train.len()).step_by(batch) {
            let idx: Vec<usize> = (start..(start + batch).min(train.len())).collect();
            let phi = self.features(train, &idx)?;
            for (row, &i) in phi.as_slice().chunks_exact(phi.cols().max(1)).zip(&idx) {
                sums.add(row, train.labels.get(i));
                row_norms += farout_core::kernels::norm(row) as f64;
            }
        }
        let cfg = &self.config.output.layer;
        // Without a bias only x̄ can score msi_t: a small x̄ takes a large multiple of it.
        let mean_row_norm = row_norms / train.len().max(1) as f64;
        if !cfg.bias && cfg.msi_t != 0.0 && sums.mean_norm() < 0.1 * mean_row_norm {
            log::warn!(
                "output.layer.init = \"msi\" without a bias: the mean of the training features has norm {:.3} \
                 against {:.3} for a row, so scoring it msi_t = {} puts a large multiple of it into every row of W; \
                 msi_t = 0.0 (or output.layer.bias = true) avoids that",
                sums.mean_norm(),
                mean_row_norm,
                cfg.msi_t
            );
        }
        let msi = farout_linear::Msi { s: cfg.msi_s as f64, t: cfg.msi_t as f64 };
        let (w, b) = sums.finish(cfg.bias, msi);
        // This rank's rows of the K x D initialisation (all of them in one process).
        let (k, d) = (self.layer.n_classes(), self.layer.d_model());
        let (w, b) = match self.shard {
            Some(s) => {
                let w = (0..k).flat_map(|l| &w[s.global(l) * d..(s.global(l) + 1) * d]).copied().collect();
                (w, if b.is_empty() { b } else { (0..k).map(|l| b[s.global(l)]).collect() })
            }
            None => (w, b),
        };
        self.layer.set_weights(Matrix::from_vec(k, d, w).expect("K x D weights"))?;
        if cfg.bias {
            self.layer.set_bias(b)?;
        }
        log::info!("output layer: mean-separating initialisation in {:.2} s", start.elapsed().as_secs_f64());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::tiny_face;
    use super::*;
    use farout_dist::Local;

    #[test]
    fn a_classifier_config_pairs_its_encoder_with_its_features() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = tiny_face(dir.path(), "");
        assert!(check_config(&c).is_ok());
        c.data.format = DataFormat::SyntheticXmc;
        let e = check_config(&c).unwrap_err().to_string();
        assert!(e.contains("model.encoder") && e.contains("dense features"), "{e}");
        c.model.encoder = EncoderKind::DocEncoder;
        assert!(check_config(&c).is_ok());
        c.data.format = DataFormat::SyntheticFace;
        let e = check_config(&c).unwrap_err().to_string();
        assert!(e.contains("sparse features"), "{e}");
    }

    #[test]
    fn new_builds_a_layer_of_the_data_shape_on_every_class() {
        let dir = tempfile::tempdir().unwrap();
        let t = Trainer::new(tiny_face(dir.path(), ""), &Local).unwrap();
        assert_eq!(t.layer().n_classes(), 40);
        assert_eq!(t.data().n_classes, 40);
        assert!(t.shard.is_none(), "one process holds every class");
        assert_eq!(t.step(), 0);
    }

    #[test]
    fn class_chunks_go_with_the_exact_softmax_only() {
        let dir = tempfile::tempdir().unwrap();
        let c = tiny_face(dir.path(), "");
        let mut chunked = c.clone();
        chunked.output.class_chunk = 8;
        assert!(Trainer::new(chunked.clone(), &Local).is_ok());
        chunked.output.estimator = serde_json::from_value(serde_json::json!({"estimator": "margin"})).unwrap();
        let e = Trainer::new(chunked, &Local).err().expect("margin in chunks is refused").to_string();
        assert!(e.contains("output.estimator") && e.contains("class_chunk"), "{e}");
    }

    #[test]
    fn msi_sets_every_row_of_w_from_the_class_means() {
        let dir = tempfile::tempdir().unwrap();
        let zero = Trainer::new(tiny_face(dir.path(), "[output.layer]\ninit_std = 0.0"), &Local).unwrap();
        assert!(zero.layer().weights().as_slice().iter().all(|&w| w == 0.0));
        let msi =
            Trainer::new(tiny_face(dir.path(), "[output.layer]\ninit_std = 0.0\ninit = \"msi\""), &Local).unwrap();
        let w = msi.layer().weights();
        let nonzero_rows = (0..w.rows()).filter(|&k| w.row(k).iter().any(|&x| x != 0.0)).count();
        assert_eq!(nonzero_rows, w.rows(), "every class has training samples, so every row moves");
    }
}
