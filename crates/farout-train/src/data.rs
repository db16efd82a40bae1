//! Loading the data sets a config names.

use crate::Error;
use crate::config::{Config, ConfigError, DataFormat};
use farout_core::resources;
use farout_data::synth::{FaceGenerator, Split, XmcGenerator};
use farout_data::{Dataset, Features, LabelSets, labels, npy, raw, xmc};
use std::path::Path;

/// Training and test data of a task.
#[derive(Debug)]
pub struct TaskData {
    /// Training set.
    pub train: Dataset,
    /// Test set, when the config names one (with `data.holdout`, the held-out training rows).
    pub test: Option<Dataset>,
    /// The validation split a run selecting its best weights is scored on
    /// ([`Config::selects_best`]): `train.valid_fraction` of the training rows, set aside.
    /// `None` with `data.holdout`, whose rows are the validation split already.
    pub valid: Option<Dataset>,
    /// Number of classes K.
    pub n_classes: usize,
    /// Input dimension (features).
    pub n_features: usize,
    /// Inverse document frequencies of the training set, when `data.tfidf` is on.
    pub idf: Option<Vec<f32>>,
}

/// Loads (or generates) the train and test sets of `config`.
pub fn load(config: &Config) -> Result<TaskData, Error> {
    let d = &config.data;
    let (mut train, mut test) = match d.format {
        DataFormat::SyntheticFace => {
            let bytes = d.face.generator_bytes() + d.face.features_bytes();
            let what = format!("the synthetic faces ({} x {} features)", d.face.n_samples, d.face.dim);
            resources::check_memory(bytes, what, "lower data.face.n_samples, n_classes or dim")?;
            let g = FaceGenerator::new(d.face.clone()).map_err(|e| generator_err("data.face", e))?;
            (g.dataset(Split::Train), Some(g.dataset(Split::Test)))
        }
        DataFormat::SyntheticXmc => {
            let bytes = d.xmc.generator_bytes() + d.xmc.data_bytes();
            let what = format!("the synthetic documents ({} of them)", d.xmc.n_samples);
            resources::check_memory(bytes, what, "lower data.xmc.n_samples, n_features or n_labels")?;
            let g = XmcGenerator::new(d.xmc.clone()).map_err(|e| generator_err("data.xmc", e))?;
            (g.dataset(Split::Train), Some(g.dataset(Split::Test)))
        }
        DataFormat::Text => {
            return Err(Error::Key(ConfigError::key(
                "data.format",
                "a text corpus trains skip-gram embeddings (farout_train::skipgram), not a classifier",
            )));
        }
        _ => {
            let train_path = d.train.as_deref().expect("config check requires data.train");
            let train = load_split(config, train_path, d.train_labels.as_deref(), None)?;
            require_labelled(&train, train_path, "data.train_labels")?;
            // A validation split replaces the test set, which is then never read.
            let test = match &d.test {
                Some(p) if d.holdout == 0.0 => {
                    let test = load_split(config, p, d.test_labels.as_deref(), Some(&train))?;
                    require_labelled(&test, p, "data.test_labels")?;
                    Some(test)
                }
                _ => None,
            };
            (train, test)
        }
    };
    // Rows set aside: the held-out rows that replace the test set, or else the validation
    // split of a run that selects its best weights (the test set is then kept for the report).
    let carve_valid = d.holdout == 0.0 && config.selects_best();
    let mut valid = None;
    if d.holdout > 0.0 || d.train_fraction < 1.0 || carve_valid {
        let fraction = if carve_valid { config.train.valid_fraction } else { d.holdout };
        let (kept, rows) = crate::tune::split::split(&train, fraction, d.train_fraction, config.seed);
        train = kept;
        if d.holdout > 0.0 {
            test = Some(rows);
        } else if carve_valid {
            valid = Some(rows);
        }
    }
    // The idf comes from the raw training rows; every split is weighted by it.
    let idf = match (&train.features, d.tfidf) {
        (Features::Sparse(f), true) => Some(f.idf()),
        _ => None,
    };
    prepare(config, idf.as_deref(), &mut train);
    for t in test.iter_mut().chain(valid.iter_mut()) {
        prepare(config, idf.as_deref(), t);
    }
    if d.first_label {
        for t in std::iter::once(&mut train).chain(test.iter_mut()).chain(valid.iter_mut()) {
            t.labels.keep_first();
        }
    }
    // The validation rows come from the training set and share its label count.
    let mut n_classes = train.labels.n_labels.max(test.as_ref().map_or(0, |t| t.labels.n_labels));
    if d.n_classes > 0 {
        let largest = train.labels.labels.iter().chain(test.iter().flat_map(|t| t.labels.labels.iter())).max();
        if let Some(&l) = largest.filter(|&&l| l as usize >= d.n_classes) {
            return Err(Error::Key(ConfigError::key(
                "data.n_classes",
                format!(" = {} but the data contain label {l}", d.n_classes),
            )));
        }
        n_classes = d.n_classes;
    }
    train.labels.n_labels = n_classes;
    for t in test.iter_mut().chain(valid.iter_mut()) {
        t.labels.n_labels = n_classes;
    }
    let n_features = train.features.n_cols();
    Ok(TaskData { train, test, valid, n_classes, n_features, idf })
}

/// A generator's error, its parameter's key under `section` (e.g. `data.face.dim`).
fn generator_err(section: &str, e: farout_data::Error) -> Error {
    match e {
        farout_data::Error::Param(p) => Error::Key(ConfigError::param(section, p)),
        e => e.into(),
    }
}

/// An error unless `ds` (read from `path`) has samples and at least one label: an empty test
/// set would leave the final metrics to the training set, and unlabelled data train nothing.
fn require_labelled(ds: &Dataset, path: &Path, labels_key: &str) -> Result<(), Error> {
    let msg = if ds.is_empty() {
        "holds no samples".to_string()
    } else if ds.labels.labels.is_empty() {
        format!("none of its {} samples has a label (npy/raw features take theirs from {labels_key})", ds.len())
    } else {
        return Ok(());
    };
    Err(Error::DataMismatch { path: path.to_path_buf(), msg })
}

/// Widens sparse data `ds` to the training set's features and labels where it has fewer, as
/// LIBSVM does: a LIBSVM file without a header takes its sizes from the largest ids it holds,
/// so a test file that never uses the last features or labels is narrower but valid.
fn pad_sparse_to(ds: &mut Dataset, train: &Dataset) {
    if let (Features::Sparse(rows), Features::Sparse(t)) = (&mut ds.features, &train.features) {
        rows.n_cols = rows.n_cols.max(t.n_cols);
        ds.labels.n_labels = ds.labels.n_labels.max(train.labels.n_labels);
    }
}

/// Applies the configured feature transforms to sparse rows: tf-idf weighting (with the
/// training set's `idf`), then L2 normalisation.
pub fn prepare(config: &Config, idf: Option<&[f32]>, ds: &mut Dataset) {
    if let Features::Sparse(rows) = &mut ds.features {
        if let Some(idf) = idf {
            rows.scale_columns(idf);
        }
        if config.data.normalize {
            rows.normalize_rows();
        }
    }
}

/// Loads one file of the config's format, untransformed (see [`prepare`]); `like` (the training set) fixes the dimensions that a
/// test or prediction file must match.
pub fn load_split(
    config: &Config,
    path: &Path,
    labels_path: Option<&Path>,
    like: Option<&Dataset>,
) -> Result<Dataset, Error> {
    let d = &config.data;
    let k_hint = (d.n_classes > 0).then_some(d.n_classes);
    let mut ds = match d.format {
        DataFormat::Xmc => xmc::read(path)?,
        DataFormat::Npy | DataFormat::Raw => {
            let features =
                if d.format == DataFormat::Npy { npy::read_f32_matrix(path)? } else { raw::read_f32(path, d.dim)? };
            let labels = match labels_path {
                Some(lp) => {
                    let l = labels::read(lp, k_hint)?;
                    if l.len() != features.rows() {
                        return Err(Error::DataMismatch {
                            path: lp.to_path_buf(),
                            msg: format!(
                                "{} label lines but {} has {} samples",
                                l.len(),
                                path.display(),
                                features.rows()
                            ),
                        });
                    }
                    l
                }
                None => LabelSets {
                    indptr: vec![0; features.rows() + 1],
                    labels: Vec::new(),
                    n_labels: k_hint.unwrap_or(0),
                },
            };
            Dataset { features: Features::Dense(features), labels }
        }
        DataFormat::SyntheticFace | DataFormat::SyntheticXmc | DataFormat::Text => {
            return Err(Error::Key(ConfigError::key(
                "data.format",
                format!(
                    "{:?} is generated in memory or streamed and is not read as a data set ({})",
                    d.format,
                    path.display()
                ),
            )));
        }
    };
    if let Some(train) = like {
        pad_sparse_to(&mut ds, train);
        if ds.features.n_cols() != train.features.n_cols() {
            return Err(Error::DataMismatch {
                path: path.to_path_buf(),
                msg: format!("{} features but the training set has {}", ds.features.n_cols(), train.features.n_cols()),
            });
        }
        if d.format == DataFormat::Xmc && ds.labels.n_labels != train.labels.n_labels {
            return Err(Error::DataMismatch {
                path: path.to_path_buf(),
                msg: format!(
                    "declares {} labels but the training set declares {}",
                    ds.labels.n_labels, train.labels.n_labels
                ),
            });
        }
    }
    Ok(ds)
}
