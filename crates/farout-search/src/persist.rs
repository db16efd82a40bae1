//! Saved indexes: an index written to a file loads without being built again and answers as
//! it did when it was saved.
//!
//! An index never owns `W` ([`MipsIndex`]), so a file holds the index's own state (centroids,
//! cluster members and their row copies, hash planes and codes, calibrated budgets, counters)
//! and a fingerprint of the rows it was built over: their shape and CRC-32. Loading checks the
//! rows it is given against that fingerprint, because an index over other rows would return
//! wrong neighbours without any error. A file may also carry the rows themselves
//! (`with_rows`), for callers that keep nothing else (the Python `Index`), and the
//! [`IndexConfig`] the index was built from, so that a loaded index can be rebuilt alike when
//! it asks to be.
//!
//! What each kind stores: `exact` nothing; `spherical` everything but what is computed from
//! what it stores (the centroids' first D coordinates and codes, the rows' int8 codes, their
//! positions in the clusters); `flat_int8` its parameters only, since its codes are the
//! quantised rows and re-quantising them costs as little as reading them; `simple_lsh` and
//! `hamming` their projections, codes and buckets; `auto` the index it uses and its counters.
//! `hnsw` cannot be saved: `hnsw_rs` 0.3 reloads a graph only as a value borrowing its loader
//! (see [`Unsupported`]).
//!
//! File format (little-endian), version 2:
//!
//! ```text
//! magic      8 bytes  "FOMIPSIX"
//! version    u32      2
//! flags      u32      bit 0: the rows are stored
//! n_rows u64, dim u64, n_blocks u64
//! rows_crc   u32      CRC-32 (IEEE) of the rows, row-major f32
//! payload_len u64
//! crc32      u32      CRC-32 (IEEE) of the payload
//! payload:   [rows: f32 × n_rows × dim, when stored]
//!            config (u64 length, JSON of the IndexConfig; empty when not given)
//!            per block: kind (u64 length, UTF-8), the index's state
//! ```
//!
//! Version 2 adds to each of the spherical index's calibrations what its lone queries scan
//! (`spherical/calibrate.rs`); a version 1 file loads with that still to be fitted.
//!
//! Reading checks magic, version, length and checksum before parsing anything, and every
//! length read inside the payload against the bytes left before allocating; the structure
//! (cluster members against assignments, codes against buckets, ids against the row count)
//! is checked before an index is returned, so a damaged or crafted file is an error, never a
//! panic.

use crate::{BlockIndex, IndexConfig, MipsIndex, Rows};
use farout_core::Matrix;
use std::path::{Path, PathBuf};

/// Magic bytes of an index file.
pub const MAGIC: [u8; 8] = *b"FOMIPSIX";
/// The format version this build writes; it reads [`OLDEST_VERSION`] to this.
pub const VERSION: u32 = 2;
/// The oldest format version this build reads.
pub const OLDEST_VERSION: u32 = 1;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 8 + 4 + 4 + 8 + 8 + 8 + 4 + 8 + 4;
const FLAG_ROWS: u32 = 1;

/// An index kind that cannot be saved, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a {kind:?} index cannot be saved: {why}")]
pub struct Unsupported {
    /// The index's name.
    pub kind: &'static str,
    /// Why, and what to do instead.
    pub why: &'static str,
}

/// What is wrong with the bytes of an index file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// The file does not start with [`MAGIC`].
    #[error("wrong magic bytes: not a farout index file")]
    Foreign,
    /// A version this build cannot read.
    #[error("format version {found}, this build reads versions {OLDEST_VERSION} to {VERSION}")]
    Version {
        /// The file's version.
        found: u32,
    },
    /// Shorter than its header says (or than a header).
    #[error("truncated: {found} bytes, {expected} expected")]
    Truncated {
        /// Length the header implies.
        expected: u64,
        /// Actual length.
        found: u64,
    },
    /// Longer than its header says.
    #[error("{found} bytes, but the header describes {expected}: trailing data")]
    TrailingBytes {
        /// Length the header implies.
        expected: u64,
        /// Actual length.
        found: u64,
    },
    /// The payload checksum does not match.
    #[error("CRC-32 of the payload is {computed:08x}, the header says {stored:08x}: the file is corrupt")]
    Checksum {
        /// From the header.
        stored: u32,
        /// Of the bytes read.
        computed: u32,
    },
    /// The payload parses but does not describe a valid index.
    #[error("inconsistent index: {0}")]
    Inconsistent(String),
    /// The rows given are not the rows the index was saved over.
    #[error(
        "the index was saved over {saved_rows} rows of {saved_dim} values (CRC-32 {saved_crc:08x}), \
         not over these {rows} rows of {dim} (CRC-32 {crc:08x}): load it with the vectors it was built on"
    )]
    OtherRows {
        /// Shape and checksum in the file.
        saved_rows: u64,
        /// See `saved_rows`.
        saved_dim: u64,
        /// See `saved_rows`.
        saved_crc: u32,
        /// Shape and checksum of the rows given.
        rows: u64,
        /// See `rows`.
        dim: u64,
        /// See `rows`.
        crc: u32,
    },
    /// The file stores no rows and none were given.
    #[error("the file holds no rows: give the vectors the index was built on")]
    NoRows,
}

/// Errors of saving and loading index files; each names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// Reading or writing failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a valid index file (or not for these rows).
    #[error("{}: {problem}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: Problem,
    },
    /// The index's kind cannot be saved.
    #[error("{}: {source}", path.display())]
    Unsupported {
        /// The file that was to be written.
        path: PathBuf,
        /// Which kind, and why.
        source: Unsupported,
    },
}

/// An index read from a file: its blocks and, when the file stores them, the rows.
pub struct Loaded {
    /// The index, one block per column block of the rows.
    pub index: BlockIndex,
    /// The rows, when the file stores them (`with_rows` at saving).
    pub rows: Option<Matrix>,
    /// The configuration the index was built from, when it was given at saving.
    pub config: Option<IndexConfig>,
}

/// The bytes of an index file for `index` (built from `config`, when given) over the rows of
/// `w` (see the module docs); the rows themselves are included when `with_rows`.
pub fn to_bytes(
    index: &BlockIndex,
    config: Option<&IndexConfig>,
    w: &Matrix,
    with_rows: bool,
) -> Result<Vec<u8>, Unsupported> {
    let mut payload = Enc::default();
    if with_rows {
        payload.f32s_raw(w.as_slice());
    }
    match config {
        Some(c) => payload.config(c),
        None => payload.str(""),
    }
    for j in 0..index.n_blocks() {
        let block = index.block(j);
        payload.str(block.name());
        block.save_state(&mut payload)?;
    }
    let payload = payload.into_bytes();
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(if with_rows { FLAG_ROWS } else { 0 }).to_le_bytes());
    for v in [w.rows(), w.cols(), index.n_blocks()] {
        out.extend_from_slice(&(v as u64).to_le_bytes());
    }
    out.extend_from_slice(&rows_crc(w).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Parses an index file's bytes; `w` are the rows to search (checked against the file's
/// fingerprint), or `None` to take the rows the file stores.
pub fn from_bytes(bytes: &[u8], w: Option<&Matrix>) -> Result<Loaded, Problem> {
    let header = Header::parse(bytes)?;
    let mut dec = Dec::written_in(&bytes[HEADER_LEN..], header.version);
    let stored = if header.flags & FLAG_ROWS != 0 {
        let n = header.n_rows.checked_mul(header.dim).ok_or_else(|| inconsistent("the row count overflows"))?;
        let data = dec.f32s_raw(usize::try_from(n).map_err(|_| inconsistent("the row count overflows"))?)?;
        Some(Matrix::from_vec(header.n_rows as usize, header.dim as usize, data).map_err(inconsistent)?)
    } else {
        None
    };
    let rows = match (w, &stored) {
        (Some(w), _) => w,
        (None, Some(s)) => s,
        (None, None) => return Err(Problem::NoRows),
    };
    header.check_rows(rows)?;
    let config = match dec.str()? {
        s if s.is_empty() => None,
        s => {
            let c: IndexConfig =
                serde_json::from_str(&s).map_err(|e| inconsistent(format!("the configuration: {e}")))?;
            c.check().map_err(inconsistent)?;
            Some(c)
        }
    };
    let n_blocks = header.n_blocks as usize;
    if n_blocks == 0 || !rows.cols().is_multiple_of(n_blocks) {
        return Err(inconsistent(format!("{n_blocks} blocks over {} columns", rows.cols())));
    }
    let width = rows.cols() / n_blocks;
    let mut blocks = Vec::with_capacity(n_blocks);
    for j in 0..n_blocks {
        let kind = dec.str()?;
        blocks.push(restore(&kind, &mut dec, Rows::block(rows, j * width, (j + 1) * width))?);
    }
    dec.finish()?;
    let rows = if w.is_some() { None } else { stored };
    Ok(Loaded { index: BlockIndex::from_blocks(blocks, width), rows, config })
}

/// Writes `index` (built from `config`, when given) over the rows of `w` to `path` atomically
/// (a temporary file renamed over it), with the rows when `with_rows`. Callers make sure
/// `path` is not one of their inputs.
pub fn save(
    path: &Path,
    index: &BlockIndex,
    config: Option<&IndexConfig>,
    w: &Matrix,
    with_rows: bool,
) -> Result<(), FileError> {
    let bytes = to_bytes(index, config, w, with_rows)
        .map_err(|source| FileError::Unsupported { path: path.to_path_buf(), source })?;
    farout_core::binio::write_atomically(path, &bytes).map_err(|(path, source)| FileError::Io { path, source })
}

/// Reads the index file `path` (see [`from_bytes`]).
pub fn load(path: &Path, w: Option<&Matrix>) -> Result<Loaded, FileError> {
    let bytes = std::fs::read(path).map_err(|source| FileError::Io { path: path.to_path_buf(), source })?;
    from_bytes(&bytes, w).map_err(|problem| FileError::Format { path: path.to_path_buf(), problem })
}

/// The index of `kind` restored from `dec` over the rows `w`.
fn restore(kind: &str, dec: &mut Dec, w: Rows) -> Result<Box<dyn MipsIndex>, Problem> {
    Ok(match kind {
        "exact" => Box::new(crate::ExactIndex::new()),
        "spherical" => Box::new(crate::SphericalIndex::restore(dec, w)?),
        "flat_int8" => Box::new(crate::FlatInt8Index::restore(dec, w)?),
        "simple_lsh" => Box::new(crate::SimpleLshIndex::restore(dec, w)?),
        "hamming" => Box::new(crate::HammingIndex::restore(dec, w)?),
        "auto" => Box::new(crate::AutoIndex::restore(dec, w)?),
        other => return Err(inconsistent(format!("unknown index kind {other:?}"))),
    })
}

/// CRC-32 of the rows of `w` as little-endian f32, row-major.
pub fn rows_crc(w: &Matrix) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = Vec::with_capacity(1 << 16);
    for chunk in w.as_slice().chunks(1 << 14) {
        buf.clear();
        chunk.iter().for_each(|x| buf.extend_from_slice(&x.to_le_bytes()));
        hasher.update(&buf);
    }
    hasher.finalize()
}

/// The fixed-size header (see the module docs).
struct Header {
    version: u32,
    flags: u32,
    n_rows: u64,
    dim: u64,
    n_blocks: u64,
    rows_crc: u32,
}

impl Header {
    /// Checks magic, version, length and checksum of `bytes`, and returns the header.
    fn parse(bytes: &[u8]) -> Result<Self, Problem> {
        let found = bytes.len() as u64;
        if bytes.len() < MAGIC.len() || bytes[..MAGIC.len()] != MAGIC {
            return Err(Problem::Foreign);
        }
        if bytes.len() < HEADER_LEN {
            return Err(Problem::Truncated { expected: HEADER_LEN as u64, found });
        }
        let mut h = Dec::new(&bytes[MAGIC.len()..HEADER_LEN]);
        let version = h.u32()?;
        if !(OLDEST_VERSION..=VERSION).contains(&version) {
            return Err(Problem::Version { found: version });
        }
        let (flags, n_rows, dim, n_blocks, rows_crc) = (h.u32()?, h.u64()?, h.u64()?, h.u64()?, h.u32()?);
        let (payload_len, stored) = (h.u64()?, h.u32()?);
        if flags & !FLAG_ROWS != 0 {
            return Err(inconsistent("unknown flag bits"));
        }
        let expected = payload_len.checked_add(HEADER_LEN as u64).ok_or_else(|| inconsistent("payload length"))?;
        if found < expected {
            return Err(Problem::Truncated { expected, found });
        }
        if found > expected {
            return Err(Problem::TrailingBytes { expected, found });
        }
        let computed = crc32fast::hash(&bytes[HEADER_LEN..]);
        if computed != stored {
            return Err(Problem::Checksum { stored, computed });
        }
        Ok(Self { version, flags, n_rows, dim, n_blocks, rows_crc })
    }

    /// Whether `w` is what the index was saved over (shape and CRC-32).
    fn check_rows(&self, w: &Matrix) -> Result<(), Problem> {
        let crc = rows_crc(w);
        if (w.rows() as u64, w.cols() as u64, crc) == (self.n_rows, self.dim, self.rows_crc) {
            return Ok(());
        }
        Err(Problem::OtherRows {
            saved_rows: self.n_rows,
            saved_dim: self.dim,
            saved_crc: self.rows_crc,
            rows: w.rows() as u64,
            dim: w.cols() as u64,
            crc,
        })
    }
}

/// An [`Problem::Inconsistent`] saying `what`.
pub(crate) fn inconsistent(what: impl std::fmt::Display) -> Problem {
    Problem::Inconsistent(what.to_string())
}

/// The writer of an index's state: little-endian numbers and length-prefixed sequences.
#[derive(Default)]
pub struct Enc {
    buf: Vec<u8>,
}

impl Enc {
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    /// A byte.
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    /// A u32.
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A u64 (`usize` values are written as u64).
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// An f32.
    pub fn f32(&mut self, v: f32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// An f64.
    pub fn f64(&mut self, v: f64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A string, length first.
    pub fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.buf.extend_from_slice(s.as_bytes());
    }

    /// f32 values without their length (the reader knows it).
    pub fn f32s_raw(&mut self, v: &[f32]) {
        self.buf.reserve(4 * v.len());
        v.iter().for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
    }

    /// f32 values, length first.
    pub fn f32s(&mut self, v: &[f32]) {
        self.u64(v.len() as u64);
        self.f32s_raw(v);
    }

    /// u32 values, length first.
    pub fn u32s(&mut self, v: &[u32]) {
        self.u64(v.len() as u64);
        self.buf.reserve(4 * v.len());
        v.iter().for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
    }

    /// u64 values, length first.
    pub fn u64s(&mut self, v: &[u64]) {
        self.u64(v.len() as u64);
        self.buf.reserve(8 * v.len());
        v.iter().for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
    }

    /// A matrix: rows, columns, values.
    pub fn matrix(&mut self, m: &Matrix) {
        self.u64(m.rows() as u64);
        self.u64(m.cols() as u64);
        self.f32s_raw(m.as_slice());
    }

    /// A parameter struct, as JSON.
    pub fn config(&mut self, c: &impl serde::Serialize) {
        self.str(&serde_json::to_string(c).expect("parameter structs serialise"));
    }
}

/// The reader of an index's state (see [`Enc`]): every read checks the bytes left, every
/// length is checked against them before anything is allocated.
pub struct Dec<'a> {
    bytes: &'a [u8],
    at: usize,
    /// The format version the bytes were written in.
    version: u32,
}

impl<'a> Dec<'a> {
    /// A reader of `bytes` written in this build's [`VERSION`].
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self::written_in(bytes, VERSION)
    }

    /// A reader of `bytes` written in format `version`.
    pub(crate) fn written_in(bytes: &'a [u8], version: u32) -> Self {
        Self { bytes, at: 0, version }
    }

    /// The format version the bytes were written in.
    pub(crate) fn version(&self) -> u32 {
        self.version
    }

    /// The next `n` bytes.
    fn take(&mut self, n: usize) -> Result<&'a [u8], Problem> {
        if self.bytes.len() - self.at < n {
            return Err(inconsistent(format!(
                "a field of {n} bytes at payload offset {} runs past the payload's end",
                self.at
            )));
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Problem> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    /// Errors unless every byte was read.
    fn finish(&self) -> Result<(), Problem> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(inconsistent(format!("{} bytes left after the last block", self.bytes.len() - self.at)))
        }
    }

    /// A byte.
    pub fn u8(&mut self) -> Result<u8, Problem> {
        Ok(self.take(1)?[0])
    }

    /// A u32.
    pub fn u32(&mut self) -> Result<u32, Problem> {
        self.array().map(u32::from_le_bytes)
    }

    /// A u64.
    pub fn u64(&mut self) -> Result<u64, Problem> {
        self.array().map(u64::from_le_bytes)
    }

    /// A u64 that must fit a `usize` and be at most `max`; `what` names it in the error.
    pub fn usize_at_most(&mut self, max: usize, what: &str) -> Result<usize, Problem> {
        let v = self.u64()?;
        usize::try_from(v).ok().filter(|&v| v <= max).ok_or_else(|| inconsistent(format!("{what} {v} exceeds {max}")))
    }

    /// An f32.
    pub fn f32(&mut self) -> Result<f32, Problem> {
        self.array().map(f32::from_le_bytes)
    }

    /// An f64.
    pub fn f64(&mut self) -> Result<f64, Problem> {
        self.array().map(f64::from_le_bytes)
    }

    /// A length of items of `size` bytes, checked against the bytes left.
    fn len_of(&mut self, size: usize) -> Result<usize, Problem> {
        let left = (self.bytes.len() - self.at) as u64;
        let n = self.u64()?;
        if n.checked_mul(size as u64).is_none_or(|b| b > left) {
            return Err(inconsistent(format!("a sequence of {n} items runs past the payload's end")));
        }
        Ok(n as usize)
    }

    /// A string.
    pub fn str(&mut self) -> Result<String, Problem> {
        let n = self.len_of(1)?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| inconsistent("a name is not UTF-8"))
    }

    /// `n` f32 values without a length.
    pub fn f32s_raw(&mut self, n: usize) -> Result<Vec<f32>, Problem> {
        let bytes = self.take(n.checked_mul(4).ok_or_else(|| inconsistent("a length overflows"))?)?;
        Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect())
    }

    /// f32 values, length first.
    pub fn f32s(&mut self) -> Result<Vec<f32>, Problem> {
        let n = self.len_of(4)?;
        self.f32s_raw(n)
    }

    /// u32 values, length first.
    pub fn u32s(&mut self) -> Result<Vec<u32>, Problem> {
        let n = self.len_of(4)?;
        Ok(self.take(4 * n)?.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).collect())
    }

    /// u64 values, length first.
    pub fn u64s(&mut self) -> Result<Vec<u64>, Problem> {
        let n = self.len_of(8)?;
        Ok(self.take(8 * n)?.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).collect())
    }

    /// A matrix.
    pub fn matrix(&mut self) -> Result<Matrix, Problem> {
        let (rows, cols) = (self.u64()?, self.u64()?);
        let n = rows.checked_mul(cols).and_then(|n| usize::try_from(n).ok());
        let n = n.ok_or_else(|| inconsistent(format!("a {rows} x {cols} matrix overflows")))?;
        let data = self.f32s_raw(n)?;
        Matrix::from_vec(rows as usize, cols as usize, data).map_err(inconsistent)
    }

    /// A parameter struct, as JSON; the error names `kind`.
    pub fn config<T: serde::de::DeserializeOwned>(&mut self, kind: &str) -> Result<T, Problem> {
        let s = self.str()?;
        serde_json::from_str(&s).map_err(|e| inconsistent(format!("the {kind} parameters: {e}")))
    }
}

/// Checks that `values` has `n` items; `what` names them.
pub(crate) fn expect_len<T>(values: &[T], n: usize, what: &str) -> Result<(), Problem> {
    if values.len() == n { Ok(()) } else { Err(inconsistent(format!("{} {what}, {n} expected", values.len()))) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{clustered, move_rows_onto};
    use crate::{
        AutoConfig, ExactIndex, FlatInt8Config, HammingConfig, Hit, HnswConfig, IndexConfig, Scoring, SimpleLshConfig,
        SphericalConfig,
    };
    use farout_core::topk::by_score;

    /// Every kind a config can name (the spherical index calibrated, with a fixed budget on
    /// int8 codes, and calibrated with 4-bit codes), built over more rows than the automatic
    /// index's `exact_below`.
    fn saveable_kinds() -> Vec<IndexConfig> {
        let calibrated = SphericalConfig { exact_below: 0, calibration_queries: 64, ..SphericalConfig::default() };
        let fixed =
            SphericalConfig { scoring: Scoring::Int8, candidate_factor: Some(10.0), ..SphericalConfig::default() };
        // 4-bit codes for lone queries, which they scan (no more rows rescored than after int8).
        let pq4 = SphericalConfig { scoring: Scoring::Pq4, pq4_rescore: 1.0, ..calibrated.clone() };
        vec![
            IndexConfig::exact(),
            IndexConfig::Spherical(calibrated),
            IndexConfig::Spherical(fixed),
            IndexConfig::Spherical(pq4),
            IndexConfig::SimpleLsh(SimpleLshConfig::default()),
            IndexConfig::Hamming(HammingConfig::default()),
            IndexConfig::FlatInt8(FlatInt8Config::default()),
            IndexConfig::Auto(AutoConfig::default()),
        ]
    }

    /// The index's answers to every query of `q`, batched and one at a time, for two `k`, each
    /// sorted best first.
    fn answers(index: &dyn MipsIndex, w: &Matrix, q: &Matrix) -> Vec<Vec<Hit>> {
        let mut all = Vec::new();
        for k in [10, 25] {
            let mut batch = Vec::new();
            index.search_batch(Rows::all(w), q, k, &mut batch);
            all.extend(batch);
            for i in 0..q.rows() {
                let mut one = Vec::new();
                index.search(Rows::all(w), q.row(i), k, &mut one);
                all.push(one);
            }
        }
        all.iter_mut().for_each(|h| h.sort_unstable_by(by_score));
        all
    }

    /// An index of `config` over `w` that has calibrated on `q` and re-indexed moved rows, as
    /// one in the middle of training would be; if `lone`, after a query searched alone (which
    /// makes the spherical index's 4-bit codes with `pq4` scoring).
    fn used_index(config: &IndexConfig, w: &mut Matrix, q: &Matrix, lone: bool) -> BlockIndex {
        let mut index = BlockIndex::build(w, config, 1);
        if lone {
            index.search_block(w, 0, q.row(1), 10, &mut Vec::new());
        }
        let mut found = Vec::new();
        for k in [10, 25] {
            for _ in 0..2 {
                index.search_block_batch(w, 0, q, k, &mut found);
            }
        }
        let moved = move_rows_onto(w, q.row(0));
        index.sync(w, &moved);
        index.refresh(w, &moved);
        index
    }

    #[test]
    fn a_loaded_index_answers_as_the_saved_one_for_every_kind() {
        for (config, lone) in saveable_kinds().into_iter().flat_map(|c| [(c.clone(), false), (c, true)]) {
            let (mut w, q) = clustered(10_000, 32);
            let index = used_index(&config, &mut w, &q, lone);
            let bytes = to_bytes(&index, None, &w, false).unwrap();
            let loaded = from_bytes(&bytes, Some(&w)).unwrap();
            assert!(loaded.rows.is_none());
            let (a, b) = (index.block(0), loaded.index.block(0));
            assert_eq!(a.name(), b.name());
            assert_eq!(a.calibrations(), b.calibrations(), "{}", a.name());
            assert_eq!(a.needs_rebuild(), b.needs_rebuild());
            // The same answers, and the same again after both calibrate anew.
            for _ in 0..2 {
                assert!(answers(a, &w, &q) == answers(b, &w, &q), "{config:?}, lone query first: {lone}");
            }
        }
    }

    /// Rows without structure: the automatic index hands over to int8 brute force, and the
    /// saved index is that one.
    #[test]
    fn an_automatic_index_saved_after_choosing_brute_force_loads_as_brute_force() {
        let mut r = farout_core::rng::seeded(5, 0);
        let mut w = Matrix::zeros(5_000, 32);
        w.as_mut_slice().iter_mut().for_each(|x| *x = farout_core::rng::normal(&mut r));
        let mut q = Matrix::zeros(300, 32);
        q.as_mut_slice().iter_mut().for_each(|x| *x = farout_core::rng::normal(&mut r));
        let mut index = BlockIndex::build(&w, &IndexConfig::default(), 1);
        let mut found = Vec::new();
        index.search_block_batch(&w, 0, &q, 10, &mut found);
        index.sync(&w, &[]);
        assert!(index.block(0).calibrations().iter().all(|c| c.budget.is_none()));
        let loaded = from_bytes(&to_bytes(&index, None, &w, false).unwrap(), Some(&w)).unwrap().index;
        assert_eq!(index.block(0).calibrations(), loaded.block(0).calibrations());
        assert!(answers(index.block(0), &w, &q) == answers(loaded.block(0), &w, &q));
    }

    #[test]
    fn a_file_with_its_rows_loads_them_and_blocks_keep_their_columns() {
        let (w, q) = clustered(3_000, 32);
        let config = IndexConfig::Spherical(SphericalConfig { candidate_factor: Some(8.0), ..Default::default() });
        let index = BlockIndex::build(&w, &config, 2);
        let loaded = from_bytes(&to_bytes(&index, Some(&config), &w, true).unwrap(), None).unwrap();
        assert_eq!(loaded.config.as_ref(), Some(&config));
        let rows = loaded.rows.expect("stored rows");
        assert_eq!(rows.as_slice(), w.as_slice());
        assert_eq!((loaded.index.n_blocks(), loaded.index.width()), (2, 16));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for j in 0..2 {
            index.search_block_batch(&w, j, &q, 20, &mut a);
            loaded.index.search_block_batch(&rows, j, &q, 20, &mut b);
            assert_eq!(a, b);
        }
    }

    fn small_file() -> (Matrix, Vec<u8>) {
        let (mut w, q) = clustered(10_000, 16);
        let config =
            IndexConfig::Spherical(SphericalConfig { exact_below: 0, calibration_queries: 32, ..Default::default() });
        let index = used_index(&config, &mut w, &q, true);
        let bytes = to_bytes(&index, Some(&config), &w, false).unwrap();
        (w, bytes)
    }

    #[test]
    fn a_corrupt_truncated_or_foreign_file_is_refused() {
        let (w, bytes) = small_file();
        for at in [0, 9, HEADER_LEN - 1, HEADER_LEN + 3, bytes.len() / 2, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            let e = from_bytes(&bad, Some(&w)).err().expect("a flipped byte is refused");
            assert!(!matches!(e, Problem::Inconsistent(_)), "byte {at}: {e}");
        }
        let mut payload_flip = bytes.clone();
        payload_flip[bytes.len() / 2] ^= 1;
        assert!(matches!(from_bytes(&payload_flip, Some(&w)), Err(Problem::Checksum { .. })));
        for len in [0, 7, 8, HEADER_LEN - 1, HEADER_LEN, bytes.len() - 1] {
            let e = from_bytes(&bytes[..len], Some(&w)).err().expect("a truncated file is refused");
            assert!(matches!(e, Problem::Truncated { .. } | Problem::Foreign), "{len}: {e}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(from_bytes(&longer, Some(&w)), Err(Problem::TrailingBytes { .. })));
        for found in [OLDEST_VERSION - 1, VERSION + 1] {
            let mut version = bytes.clone();
            version[8..12].copy_from_slice(&found.to_le_bytes());
            assert_eq!(from_bytes(&version, Some(&w)).err(), Some(Problem::Version { found }));
        }
        assert_eq!(from_bytes(&bytes, None).err(), Some(Problem::NoRows));
    }

    #[test]
    fn other_rows_than_the_saved_ones_are_refused() {
        let (mut w, bytes) = small_file();
        w.row_mut(17)[3] += 1.0;
        let e = from_bytes(&bytes, Some(&w)).err().expect("other rows are refused");
        assert!(matches!(e, Problem::OtherRows { .. }));
        assert!(e.to_string().contains("load it with the vectors it was built on"), "{e}");
    }

    /// `bytes` with the header's payload length and checksum made to match its payload.
    fn reseal(mut bytes: Vec<u8>) -> Vec<u8> {
        let len = (bytes.len() - HEADER_LEN) as u64;
        bytes[HEADER_LEN - 12..HEADER_LEN - 4].copy_from_slice(&len.to_le_bytes());
        let crc = crc32fast::hash(&bytes[HEADER_LEN..]);
        bytes[HEADER_LEN - 4..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// A payload cut anywhere, or with any byte changed, under a header that matches it: an
    /// error or an index, never a panic (the checks of lengths and structure, not the
    /// checksum, stand between such a file and the search).
    #[test]
    fn a_damaged_payload_with_a_matching_checksum_never_panics() {
        let (w, bytes) = small_file();
        let step = (bytes.len() - HEADER_LEN) / 400 + 1;
        for cut in (HEADER_LEN..bytes.len()).step_by(step) {
            let e = from_bytes(&reseal(bytes[..cut].to_vec()), Some(&w));
            assert!(matches!(e, Err(Problem::Inconsistent(_))), "cut at {cut}");
        }
        for at in (HEADER_LEN..bytes.len()).step_by(step) {
            for bit in [0x01, 0x80] {
                let mut bad = bytes.clone();
                bad[at] ^= bit;
                if let Ok(mut loaded) = from_bytes(&reseal(bad), Some(&w)) {
                    let mut out = Vec::new();
                    loaded.index.search_block(&w, 0, w.row(0), 50, &mut out);
                    let all: Vec<u32> = (0..w.rows() as u32).collect();
                    loaded.index.refresh(&w, &all);
                }
            }
        }
    }

    #[test]
    fn an_hnsw_index_says_why_it_cannot_be_saved() {
        let (w, _) = clustered(500, 16);
        let index = BlockIndex::build(&w, &IndexConfig::Hnsw(HnswConfig::default()), 1);
        let e = to_bytes(&index, None, &w, false).expect_err("hnsw is refused");
        assert_eq!(e.kind, "hnsw");
        assert!(e.to_string().contains("hnsw_rs"), "{e}");
        let exact = BlockIndex::from_blocks(vec![Box::new(ExactIndex::new())], 16);
        assert!(to_bytes(&exact, None, &w, false).is_ok());
    }
}
