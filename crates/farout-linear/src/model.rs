//! The trained sparse one-vs-all model, its prediction copy, and its file format.
//!
//! [`SparseModel`] stores each label's pruned weights as sorted `(feature, weight)` pairs plus
//! a bias: the natural output of per-label training. Prediction needs the transpose: for a
//! sample x the scores are `s_k = b_k + Σ_{j∈x} x_j W_jk` (eq. 1), so [`Predictor`] keeps, per
//! feature j, the labels with W_jk ≠ 0, and a query walks only the sample's features (see
//! [`crate::predictor`]).
//!
//! File format (little-endian), version 1:
//!
//! ```text
//! magic     8 bytes  "FOLINMDL"
//! version   u32      1
//! flags     u32      bit 0: the model has a bias
//! n_features u64, n_labels u64, nnz u64
//! crc32     u32      CRC-32 (IEEE) of the payload
//! payload:  label_ptr u64 × (n_labels + 1), bias f32 × n_labels,
//!           feature u32 × nnz, weight f32 × nnz
//! ```
//!
//! [`SparseModel::load`] reads the file's bytes, checks magic and version, computes the payload
//! length from the header with checked arithmetic and compares it with the actual length
//! *before* sizing anything by the header, verifies the checksum, then the structure (offsets
//! monotone, features sorted and in range, values finite). Every failure is a typed
//! [`ModelFileError`], never a panic.

use crate::predictor::Predictor;
use crate::{Error, Result};
use std::path::Path;

/// Magic bytes of a model file.
pub const MAGIC: [u8; 8] = *b"FOLINMDL";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 8 + 4 + 4 + 8 + 8 + 8 + 4;
const FLAG_BIAS: u32 = 1;

/// What is wrong with a model file.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelFileError {
    /// The file does not start with [`MAGIC`].
    #[error("wrong magic bytes: not a farout-linear model file")]
    Foreign,
    /// A version this build cannot read.
    #[error("format version {found}, this build reads version {supported}")]
    Version {
        /// The file's version.
        found: u32,
        /// [`VERSION`].
        supported: u32,
    },
    /// Shorter than the header says (or than the header itself).
    #[error("truncated: {found} bytes, {expected} expected")]
    Truncated {
        /// Length the header implies.
        expected: u64,
        /// Actual length.
        found: u64,
    },
    /// Longer than the header says.
    #[error("{found} bytes, but the header describes {expected}: trailing data")]
    TrailingBytes {
        /// Length the header implies.
        expected: u64,
        /// Actual length.
        found: u64,
    },
    /// The header's sizes overflow.
    #[error("header sizes overflow: {n_labels} labels, {nnz} weights")]
    Sizes {
        /// Declared labels.
        n_labels: u64,
        /// Declared weights.
        nnz: u64,
    },
    /// The payload checksum does not match.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// In the header.
        stored: u32,
        /// Of the payload.
        computed: u32,
    },
    /// The checksum matched but the content is inconsistent.
    #[error("inconsistent content: {0}")]
    Inconsistent(&'static str),
}

/// Per-label sparse weights `(feature, weight)` sorted by feature, plus biases.
#[derive(Clone, Debug, PartialEq)]
pub struct SparseModel {
    n_features: usize,
    bias: bool,
    label_ptr: Vec<usize>,
    features: Vec<u32>,
    weights: Vec<f32>,
    biases: Vec<f32>,
}

impl SparseModel {
    /// An empty model for `n_features` features.
    pub fn new(n_features: usize, bias: bool) -> Self {
        Self { n_features, bias, label_ptr: vec![0], features: Vec::new(), weights: Vec::new(), biases: Vec::new() }
    }

    /// Appends the next label's weights (`features` strictly increasing and `< n_features`).
    pub fn push_label(&mut self, features: &[u32], weights: &[f32], bias: f32) {
        debug_assert!(features.windows(2).all(|w| w[0] < w[1]));
        debug_assert!(features.iter().all(|&f| (f as usize) < self.n_features));
        self.features.extend_from_slice(features);
        self.weights.extend_from_slice(weights);
        self.biases.push(if self.bias { bias } else { 0.0 });
        self.label_ptr.push(self.features.len());
    }

    /// Number of labels K.
    pub fn n_labels(&self) -> usize {
        self.biases.len()
    }

    /// Number of features d.
    pub fn n_features(&self) -> usize {
        self.n_features
    }

    /// Whether the model has a bias.
    pub fn has_bias(&self) -> bool {
        self.bias
    }

    /// Stored non-zero weights: feature weights plus non-zero biases.
    pub fn nnz(&self) -> usize {
        self.features.len() + self.biases.iter().filter(|&&b| b != 0.0).count()
    }

    /// Label `k`: (features, weights, bias).
    pub fn label(&self, k: usize) -> (&[u32], &[f32], f32) {
        let r = self.label_ptr[k]..self.label_ptr[k + 1];
        (&self.features[r.clone()], &self.weights[r], self.biases[k])
    }

    /// The labels `labels` as a model of their own (one rank's shard of a label-parallel model);
    /// `None` when the range is not within `0..n_labels()`.
    pub fn slice(&self, labels: std::ops::Range<usize>) -> Option<Self> {
        if labels.start > labels.end || labels.end > self.n_labels() {
            return None;
        }
        let mut out = Self::new(self.n_features, self.bias);
        for k in labels {
            let (f, w, b) = self.label(k);
            out.push_label(f, w, b);
        }
        Some(out)
    }

    /// The labels of `parts` one after the other (the shards of a label-parallel model, in rank
    /// order); `None` unless every part has the same feature count and bias as the first.
    pub fn concat(parts: &[Self]) -> Option<Self> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.n_features != first.n_features || p.bias != first.bias) {
            return None;
        }
        let mut out = Self::new(first.n_features, first.bias);
        for p in parts {
            for k in 0..p.n_labels() {
                let (f, w, b) = p.label(k);
                out.push_label(f, w, b);
            }
        }
        Some(out)
    }

    /// The feature-major copy used for prediction ([`Predictor::new`]).
    pub fn predictor(&self) -> Predictor {
        Predictor::new(self)
    }

    /// Length of the model file, without writing it.
    pub fn file_len(&self) -> usize {
        HEADER_LEN + self.payload_len()
    }

    fn payload_len(&self) -> usize {
        8 * self.label_ptr.len() + 4 * self.biases.len() + 8 * self.features.len()
    }

    /// The file's bytes (see the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut payload = Vec::with_capacity(self.payload_len());
        self.label_ptr.iter().for_each(|&p| payload.extend_from_slice(&(p as u64).to_le_bytes()));
        self.biases.iter().for_each(|b| payload.extend_from_slice(&b.to_le_bytes()));
        self.features.iter().for_each(|f| payload.extend_from_slice(&f.to_le_bytes()));
        self.weights.iter().for_each(|w| payload.extend_from_slice(&w.to_le_bytes()));
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(if self.bias { FLAG_BIAS } else { 0 }).to_le_bytes());
        for v in [self.n_features, self.n_labels(), self.features.len()] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// Parses a model file's bytes, checking everything (see the module docs).
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Self, ModelFileError> {
        use ModelFileError as E;
        let found = bytes.len() as u64;
        if bytes.len() < MAGIC.len() || bytes[..MAGIC.len()] != MAGIC {
            return Err(E::Foreign);
        }
        if bytes.len() < HEADER_LEN {
            return Err(E::Truncated { expected: HEADER_LEN as u64, found });
        }
        let mut r = Reader { bytes, at: MAGIC.len() };
        let version = r.u32();
        if version != VERSION {
            return Err(E::Version { found: version, supported: VERSION });
        }
        let flags = r.u32();
        let (n_features, n_labels, nnz) = (r.u64(), r.u64(), r.u64());
        let stored = r.u32();
        if flags & !FLAG_BIAS != 0 {
            return Err(E::Inconsistent("unknown flag bits"));
        }
        let expected = (|| {
            let ptr = n_labels.checked_add(1)?.checked_mul(8)?;
            let bias = n_labels.checked_mul(4)?;
            let entries = nnz.checked_mul(8)?;
            ptr.checked_add(bias)?.checked_add(entries)?.checked_add(HEADER_LEN as u64)
        })()
        .ok_or(E::Sizes { n_labels, nnz })?;
        if found < expected {
            return Err(E::Truncated { expected, found });
        }
        if found > expected {
            return Err(E::TrailingBytes { expected, found });
        }
        let computed = crc32fast::hash(&bytes[HEADER_LEN..]);
        if computed != stored {
            return Err(E::Checksum { stored, computed });
        }
        if n_features > u32::MAX as u64 + 1 {
            return Err(E::Inconsistent("more features than 32-bit ids address"));
        }
        // The lengths are now bounded by the file's: the allocations below are safe.
        let (n_labels, nnz) = (n_labels as usize, nnz as usize);
        let label_ptr: Vec<usize> = (0..=n_labels).map(|_| r.u64() as usize).collect();
        let biases: Vec<f32> = (0..n_labels).map(|_| f32::from_bits(r.u32())).collect();
        let features: Vec<u32> = (0..nnz).map(|_| r.u32()).collect();
        let weights: Vec<f32> = (0..nnz).map(|_| f32::from_bits(r.u32())).collect();
        if label_ptr[0] != 0 || label_ptr[n_labels] != nnz || label_ptr.windows(2).any(|w| w[0] > w[1]) {
            return Err(E::Inconsistent("label offsets are not monotone from 0 to nnz"));
        }
        for k in 0..n_labels {
            let f = &features[label_ptr[k]..label_ptr[k + 1]];
            if f.windows(2).any(|w| w[0] >= w[1]) || f.last().is_some_and(|&l| l as u64 >= n_features) {
                return Err(E::Inconsistent("a label's features are unsorted or out of range"));
            }
        }
        let bias = flags & FLAG_BIAS != 0;
        if !weights.iter().chain(&biases).all(|w| w.is_finite()) || (!bias && biases.iter().any(|&b| b != 0.0)) {
            return Err(E::Inconsistent("a weight is not finite, or a bias is set in a model without bias"));
        }
        Ok(Self { n_features: n_features as usize, bias, label_ptr, features, weights, biases })
    }

    /// Writes the model to `path`, atomically (a temporary file renamed over it): a crash leaves
    /// the old model whole.
    pub fn save(&self, path: &Path) -> Result<()> {
        farout_core::binio::write_atomically(path, &self.to_bytes())
            .map_err(|(path, source)| Error::Io { path, source })
    }

    /// Reads and checks a model file.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
        Self::from_bytes(&bytes).map_err(|problem| Error::ModelFile { path: path.to_path_buf(), problem })
    }
}

/// Little-endian cursor over bytes whose length was checked beforehand.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let out = self.bytes[self.at..self.at + N].try_into().expect("length checked against the header");
        self.at += N;
        out
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_model() -> SparseModel {
        let mut m = SparseModel::new(5, true);
        m.push_label(&[0, 3], &[0.5, -1.25], 0.25);
        m.push_label(&[], &[], -0.5);
        m.push_label(&[1, 3, 4], &[2.0, 0.75, -0.125], 0.0);
        m
    }

    #[test]
    fn slices_concatenate_back_to_the_model() {
        let m = small_model();
        for cut in 0..=3 {
            let parts = [m.slice(0..cut).unwrap(), m.slice(cut..3).unwrap()];
            assert_eq!((parts[0].n_labels(), parts[1].n_labels()), (cut, 3 - cut));
            assert_eq!(SparseModel::concat(&parts).unwrap(), m);
        }
        assert_eq!(m.slice(1..2).unwrap().label(0), m.label(1));
        assert!(m.slice(2..4).is_none());
        assert!(SparseModel::concat(&[]).is_none());
        assert!(SparseModel::concat(&[m.clone(), SparseModel::new(4, true)]).is_none());
        assert!(SparseModel::concat(&[m, SparseModel::new(5, false)]).is_none());
    }

    #[test]
    fn file_len_is_the_length_of_the_written_bytes() {
        let mut m = SparseModel::new(7, true);
        assert_eq!(m.file_len(), m.to_bytes().len());
        m.push_label(&[1, 4], &[0.5, -2.0], 0.25);
        m.push_label(&[], &[], 0.0);
        assert_eq!(m.file_len(), m.to_bytes().len());
    }

    #[test]
    fn save_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.bin");
        let m = small_model();
        m.save(&p).unwrap();
        assert_eq!(SparseModel::load(&p).unwrap(), m);
        assert_eq!(m.nnz(), 7);
        let empty = SparseModel::new(0, false);
        assert_eq!(SparseModel::from_bytes(&empty.to_bytes()).unwrap(), empty);
    }

    #[test]
    fn every_truncation_is_a_typed_error() {
        let bytes = small_model().to_bytes();
        for len in 0..bytes.len() {
            let e = SparseModel::from_bytes(&bytes[..len]).unwrap_err();
            let ok =
                matches!(e, ModelFileError::Truncated { .. }) || (len < MAGIC.len() && e == ModelFileError::Foreign);
            assert!(ok, "length {len}: {e:?}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(SparseModel::from_bytes(&longer), Err(ModelFileError::TrailingBytes { .. })));
    }

    #[test]
    fn corrupt_foreign_and_future_files_are_typed_errors() {
        let bytes = small_model().to_bytes();
        // Any flipped payload bit fails the checksum.
        for at in HEADER_LEN..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            assert!(matches!(SparseModel::from_bytes(&b), Err(ModelFileError::Checksum { .. })), "byte {at}");
        }
        let mut b = bytes.clone();
        b[0] = b'X';
        assert_eq!(SparseModel::from_bytes(&b), Err(ModelFileError::Foreign));
        let mut b = bytes.clone();
        b[8] = 2;
        assert_eq!(SparseModel::from_bytes(&b), Err(ModelFileError::Version { found: 2, supported: VERSION }));
        // A header announcing 2^40 weights: no allocation, just a size error.
        let mut b = bytes.clone();
        b[32..40].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(SparseModel::from_bytes(&b), Err(ModelFileError::Truncated { .. })));
        b[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(SparseModel::from_bytes(&b), Err(ModelFileError::Sizes { .. })));
        // A consistent checksum over inconsistent content (feature 9 >= n_features = 5).
        let mut b = bytes.clone();
        let feature0 = HEADER_LEN + 8 * 4 + 4 * 3;
        b[feature0..feature0 + 4].copy_from_slice(&9u32.to_le_bytes());
        let crc = crc32fast::hash(&b[HEADER_LEN..]);
        b[HEADER_LEN - 4..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(SparseModel::from_bytes(&b), Err(ModelFileError::Inconsistent(_))));
    }

    #[test]
    fn load_names_the_file_in_its_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.bin");
        std::fs::write(&p, b"FOLINMDL\x01").unwrap();
        let e = SparseModel::load(&p).unwrap_err();
        assert!(matches!(&e, Error::ModelFile { problem: ModelFileError::Truncated { .. }, .. }), "{e:?}");
        assert!(e.to_string().starts_with(&format!("{}: not a valid farout-linear model: truncated", p.display())));
        assert!(matches!(SparseModel::load(&dir.path().join("missing")), Err(Error::Io { .. })));
    }

    #[test]
    fn huge_header_sizes_and_truncation_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.bin");
        let bytes = small_model().to_bytes();
        let mut huge = bytes.clone();
        huge[24..32].copy_from_slice(&1_000_000_000_000u64.to_le_bytes());
        std::fs::write(&p, &huge).unwrap();
        let e = SparseModel::load(&p).unwrap_err().to_string();
        let want =
            format!("{}: not a valid farout-linear model: truncated: 128 bytes, 12000000000092 expected", p.display());
        assert_eq!(e, want);
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        let e = SparseModel::load(&p).unwrap_err().to_string();
        assert!(e.ends_with("m.bin: not a valid farout-linear model: truncated: 125 bytes, 128 expected"), "{e}");
    }

    proptest::proptest! {
        #[test]
        fn any_model_round_trips_through_its_bytes(
            bias in proptest::bool::ANY,
            labels in proptest::collection::vec(
                (proptest::collection::btree_map(0u32..40, -5.0f32..5.0, 0..8), -3.0f32..3.0), 0..12),
        ) {
            let mut m = SparseModel::new(40, bias);
            for (weights, b) in &labels {
                let (f, w): (Vec<u32>, Vec<f32>) = weights.iter().map(|(a, b)| (*a, *b)).unzip();
                m.push_label(&f, &w, *b);
            }
            proptest::prop_assert_eq!(SparseModel::from_bytes(&m.to_bytes()).unwrap(), m);
        }
    }
}
