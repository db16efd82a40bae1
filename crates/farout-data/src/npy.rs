//! `.npy` files: 2-D f32 features and 1-D integer labels.
//!
//! Written by hand rather than with a crate: numpy's header is a short Python dict literal, the
//! subset we accept (little-endian `<f4` C-order matrices, `<i4 <i8 <u4 <u8` vectors) takes a
//! page, and owning it lets every error name the file and say exactly what shape or type was
//! expected. Writers stream rows, so generated data sets larger than memory can be written.

use crate::{Error, Result, buffer_len, check_len, io_err};
use farout_core::Matrix;
use std::io::{BufWriter, Read, Seek, Write};
use std::path::Path;

const MAGIC: &[u8] = b"\x93NUMPY";

/// Header fields of a `.npy` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Element type, e.g. `<f4`.
    pub descr: String,
    /// Whether the data are stored column-major.
    pub fortran_order: bool,
    /// Array shape.
    pub shape: Vec<usize>,
}

fn format_err(path: &Path, msg: impl Into<String>) -> Error {
    Error::Format { path: path.to_path_buf(), msg: msg.into() }
}

/// Reads the header, leaving `r` at the first data byte.
pub fn read_header(r: &mut impl Read, path: &Path) -> Result<Header> {
    let mut pre = [0u8; 8];
    r.read_exact(&mut pre).map_err(|_| format_err(path, "not a .npy file (too short)"))?;
    if &pre[..6] != MAGIC {
        return Err(format_err(path, "not a .npy file (bad magic bytes)"));
    }
    let len = match pre[6] {
        1 => {
            let mut b = [0u8; 2];
            r.read_exact(&mut b).map_err(|_| format_err(path, "truncated .npy header"))?;
            u16::from_le_bytes(b) as u64
        }
        2 | 3 => {
            let mut b = [0u8; 4];
            r.read_exact(&mut b).map_err(|_| format_err(path, "truncated .npy header"))?;
            u32::from_le_bytes(b) as u64
        }
        v => return Err(format_err(path, format!("unsupported .npy version {v}"))),
    };
    // Read through `take`, not into a buffer of the announced size: the length field of a
    // corrupt file may announce 4 GB.
    let mut text = Vec::new();
    r.take(len).read_to_end(&mut text).map_err(io_err(path))?;
    if text.len() as u64 != len {
        return Err(format_err(path, format!("truncated .npy header: {len} bytes announced, {} present", text.len())));
    }
    let text = String::from_utf8_lossy(&text);
    parse_header(&text).ok_or_else(|| format_err(path, format!("unreadable .npy header `{}`", text.trim())))
}

fn parse_header(text: &str) -> Option<Header> {
    let field = |key: &str| -> Option<&str> {
        let at = text.find(&format!("'{key}'"))? + key.len() + 2;
        let rest = text[at..].trim_start().strip_prefix(':')?.trim_start();
        Some(rest)
    };
    let descr_rest = field("descr")?;
    let quote = descr_rest.chars().next()?;
    let descr = descr_rest[quote.len_utf8()..].split(quote).next()?.to_string();
    let fortran_order = field("fortran_order")?.starts_with("True");
    let shape_rest = field("shape")?.strip_prefix('(')?;
    let shape_text = &shape_rest[..shape_rest.find(')')?];
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse().ok())
        .collect::<Option<Vec<usize>>>()?;
    Some(Header { descr, fortran_order, shape })
}

/// An open `.npy` file after its header, with the header's and the file's lengths in bytes.
struct Opened {
    r: std::io::BufReader<std::fs::File>,
    header: Header,
    header_len: u64,
    file_len: u64,
}

fn open(path: &Path) -> Result<Opened> {
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let file_len = file.metadata().map_err(io_err(path))?.len();
    let mut r = std::io::BufReader::with_capacity(buffer_len(file_len), file);
    let header = read_header(&mut r, path)?;
    if header.fortran_order {
        return Err(format_err(path, "Fortran-order arrays are not supported: save with np.ascontiguousarray"));
    }
    let header_len = r.stream_position().map_err(io_err(path))?;
    Ok(Opened { r, header, header_len, file_len })
}

impl Opened {
    /// Number of values of `width` bytes the shape holds, checked against the file's length
    /// (exactly: the header, then the data, then nothing) before anything is allocated for them.
    fn count(&self, path: &Path, width: u64) -> Result<usize> {
        let h = &self.header;
        let data = h.shape.iter().try_fold(width, |n, &d| n.checked_mul(d as u64));
        let what = format!("shape {} of '{}' after a {}-byte header", shape_text(&h.shape), h.descr, self.header_len);
        let total = data.and_then(|d| d.checked_add(self.header_len));
        check_len(path, None, total, self.file_len, &what)?;
        match (data, total) {
            (Some(data), Some(total)) if total == self.file_len => Ok((data / width) as usize),
            _ => Err(format_err(
                path,
                format!("{what} needs {} bytes but the file has {}: trailing data", total.unwrap_or(0), self.file_len),
            )),
        }
    }
}

/// Reads a 2-D little-endian f32 array (`descr '<f4'`); NaN or infinite values are an error
/// naming the first one's row and column ([`crate::check_finite`]).
pub fn read_f32_matrix(path: &Path) -> Result<Matrix> {
    let mut f = open(path)?;
    let h = &f.header;
    if h.descr != "<f4" {
        return Err(format_err(path, format!("expected float32 data ('<f4'), found '{}'", h.descr)));
    }
    let [rows, cols] = h.shape[..] else {
        return Err(format_err(path, format!("expected a 2-D array [samples, dim], found shape {:?}", h.shape)));
    };
    let mut data = vec![0f32; f.count(path, 4)?];
    farout_core::binio::read_f32s(&mut f.r, &mut data).map_err(io_err(path))?;
    crate::check_finite(path, &data, cols)?;
    Ok(Matrix::from_vec(rows, cols, data).expect("length checked above"))
}

/// Reads a 1-D integer array (`<i4 <i8 <u4 <u8`) as non-negative ids.
pub fn read_ids(path: &Path) -> Result<Vec<u32>> {
    let mut f = open(path)?;
    let h = &f.header;
    if h.shape.len() != 1 {
        return Err(format_err(path, format!("expected a 1-D array of labels, found shape {:?}", h.shape)));
    }
    let width = match h.descr.as_str() {
        "<i4" | "<u4" => 4,
        "<i8" | "<u8" => 8,
        d => {
            return Err(format_err(
                path,
                format!("expected integer labels ('<i4', '<i8', '<u4' or '<u8'), found '{d}'"),
            ));
        }
    };
    let signed = h.descr.starts_with("<i");
    let n = f.count(path, width as u64)?;
    let mut bytes = vec![0u8; n * width];
    f.r.read_exact(&mut bytes).map_err(io_err(path))?;
    bytes
        .chunks_exact(width)
        .enumerate()
        .map(|(i, b)| {
            let v: i128 = match (width, signed) {
                (4, true) => i32::from_le_bytes(b.try_into().unwrap()) as i128,
                (4, false) => u32::from_le_bytes(b.try_into().unwrap()) as i128,
                (_, true) => i64::from_le_bytes(b.try_into().unwrap()) as i128,
                (_, false) => u64::from_le_bytes(b.try_into().unwrap()) as i128,
            };
            u32::try_from(v).map_err(|_| format_err(path, format!("label {v} at index {i} is not a valid class id")))
        })
        .collect()
}

/// numpy's spelling of a shape: `(3, 2)`, `(7,)`.
fn shape_text(shape: &[usize]) -> String {
    match shape {
        [n] => format!("({n},)"),
        s => format!("({})", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    }
}

fn header_bytes(descr: &str, shape: &[usize]) -> Vec<u8> {
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {}, }}", shape_text(shape));
    // Pad so that magic + version + length + dict + '\n' is a multiple of 64 (numpy's alignment).
    let total = MAGIC.len() + 2 + 2 + dict.len() + 1;
    dict.extend(std::iter::repeat_n(' ', (64 - total % 64) % 64));
    dict.push('\n');
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

/// Streams the rows of a 2-D f32 array of known shape into a `.npy` file.
pub struct MatrixWriter {
    w: BufWriter<std::fs::File>,
    path: std::path::PathBuf,
    remaining: usize,
    cols: usize,
}

impl MatrixWriter {
    /// Creates `path` for a `rows x cols` array.
    pub fn create(path: &Path, rows: usize, cols: usize) -> Result<Self> {
        let file = std::fs::File::create(path).map_err(io_err(path))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        w.write_all(&header_bytes("<f4", &[rows, cols])).map_err(io_err(path))?;
        Ok(Self { w, path: path.to_path_buf(), remaining: rows, cols })
    }

    /// Appends rows (a multiple of `cols` values).
    pub fn write_rows(&mut self, values: &[f32]) -> Result<()> {
        let n = values.len() / self.cols.max(1);
        if !values.len().is_multiple_of(self.cols.max(1)) || n > self.remaining {
            return Err(format_err(&self.path, "more rows written than declared"));
        }
        self.remaining -= n;
        let mut buf = Vec::with_capacity(values.len() * 4);
        for v in values {
            buf.extend_from_slice(&v.to_le_bytes());
        }
        self.w.write_all(&buf).map_err(io_err(&self.path))
    }

    /// Flushes; fails when fewer rows than declared were written.
    pub fn finish(mut self) -> Result<()> {
        if self.remaining != 0 {
            return Err(format_err(&self.path, format!("{} declared rows were never written", self.remaining)));
        }
        self.w.flush().map_err(io_err(&self.path))
    }
}

/// Writes a whole matrix.
pub fn write_f32_matrix(path: &Path, m: &Matrix) -> Result<()> {
    let mut w = MatrixWriter::create(path, m.rows(), m.cols())?;
    w.write_rows(m.as_slice())?;
    w.finish()
}

/// Writes ids as a 1-D `<i8` array (numpy's default integer type).
pub fn write_ids(path: &Path, ids: &[u32]) -> Result<()> {
    let file = std::fs::File::create(path).map_err(io_err(path))?;
    let mut w = BufWriter::new(file);
    w.write_all(&header_bytes("<i8", &[ids.len()])).map_err(io_err(path))?;
    for &i in ids {
        w.write_all(&(i as i64).to_le_bytes()).map_err(io_err(path))?;
    }
    w.flush().map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_and_ids_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let m = Matrix::from_vec(3, 2, vec![1.0, -2.0, 3.5, 0.0, 1e-7, 9.0]).unwrap();
        let p = dir.path().join("x.npy");
        write_f32_matrix(&p, &m).unwrap();
        assert_eq!(read_f32_matrix(&p).unwrap(), m);
        let q = dir.path().join("y.npy");
        write_ids(&q, &[0, 5, 4_000_000]).unwrap();
        assert_eq!(read_ids(&q).unwrap(), vec![0, 5, 4_000_000]);
    }

    #[test]
    fn parses_numpy_written_headers() {
        let h = parse_header("{'descr': '<f4', 'fortran_order': False, 'shape': (100, 128), }").unwrap();
        assert_eq!(h, Header { descr: "<f4".into(), fortran_order: false, shape: vec![100, 128] });
        let h = parse_header("{'descr': '<i8', 'fortran_order': False, 'shape': (7,), }").unwrap();
        assert_eq!(h.shape, vec![7]);
    }

    /// A file written by [`write_f32_matrix`] or [`write_ids`] with its header's `from` replaced
    /// by the longer `to`, taken from the header's padding so that the length stays the same.
    fn with_shape(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
        let end = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        let dict = std::str::from_utf8(&bytes[10..end]).unwrap();
        let replaced = dict.replacen(from, to, 1);
        let mut out = bytes[..10].to_vec();
        out.extend_from_slice(&replaced.as_bytes()[..dict.len() - 1]);
        out.push(b'\n');
        out.extend_from_slice(&bytes[end..]);
        out
    }

    #[test]
    fn huge_shapes_and_headers_are_errors_not_allocations() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.npy");
        write_f32_matrix(&p, &Matrix::zeros(3, 2)).unwrap();
        let valid = std::fs::read(&p).unwrap();
        std::fs::write(&p, with_shape(&valid, "(3, 2)", "(1000000000000, 8)")).unwrap();
        let e = read_f32_matrix(&p).unwrap_err().to_string();
        let want = "x.npy: shape (1000000000000, 8) of '<f4' after a 128-byte header needs at least 32000000000128 \
                    bytes but the file has 152";
        assert_eq!(e, format!("{}/{want}", dir.path().display()));
        std::fs::write(&p, with_shape(&valid, "(3, 2)", "(4611686018427387904, 8)")).unwrap();
        let e = read_f32_matrix(&p).unwrap_err().to_string();
        assert!(e.contains("x.npy: shape (4611686018427387904, 8) of '<f4'") && e.contains("needs more than"), "{e}");
        let mut longer = valid.clone();
        longer.extend_from_slice(&[0; 4]);
        std::fs::write(&p, &longer).unwrap();
        let e = read_f32_matrix(&p).unwrap_err().to_string();
        assert!(e.ends_with("x.npy: shape (3, 2) of '<f4' after a 128-byte header needs 152 bytes but the file has 156: trailing data"), "{e}");
        // A version-2 header announcing 4 GB of header text.
        let mut v2 = valid[..8].to_vec();
        v2[6] = 2;
        v2.extend_from_slice(&u32::MAX.to_le_bytes());
        v2.extend_from_slice(b"{'descr'");
        std::fs::write(&p, &v2).unwrap();
        let e = read_f32_matrix(&p).unwrap_err().to_string();
        assert!(e.ends_with("x.npy: truncated .npy header: 4294967295 bytes announced, 8 present"), "{e}");
        let q = dir.path().join("y.npy");
        write_ids(&q, &[1, 2]).unwrap();
        let ids = std::fs::read(&q).unwrap();
        std::fs::write(&q, with_shape(&ids, "(2,)", "(1000000000000,)")).unwrap();
        let e = read_ids(&q).unwrap_err().to_string();
        assert!(
            e.contains("y.npy: shape (1000000000000,) of '<i8' after a 128-byte header needs at least 8000000000128"),
            "{e}"
        );
    }

    #[test]
    fn a_multibyte_quote_in_the_header_is_an_error_not_a_panic() {
        let h = parse_header("{'descr': \u{e9}<f4', 'fortran_order': False, 'shape': (1,), }").unwrap();
        assert!(h.descr.starts_with("<f4'"), "{h:?}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("q.npy");
        write_ids(&p, &[1]).unwrap();
        let mut b = std::fs::read(&p).unwrap();
        let at = b.windows(3).position(|w| w == b"'<i").unwrap();
        b[at] = 0xe9; // not UTF-8: read lossily as U+FFFD, three bytes
        std::fs::write(&p, &b).unwrap();
        let e = read_ids(&p).unwrap_err().to_string();
        assert!(e.contains("q.npy") && e.contains("expected integer labels"), "{e}");
    }

    #[test]
    fn nan_and_infinite_values_are_refused_with_their_row() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.npy");
        let m = Matrix::from_vec(3, 2, vec![1.0, 2.0, 3.0, f32::INFINITY, f32::NAN, 0.0]).unwrap();
        write_f32_matrix(&p, &m).unwrap();
        let e = read_f32_matrix(&p).unwrap_err().to_string();
        assert!(e.ends_with("w.npy: row 1, column 1 holds inf (2 of 6 values are not finite); farout refuses NaN and infinite values"), "{e}");
    }

    #[test]
    fn wrong_shape_and_type_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v.npy");
        write_ids(&p, &[1, 2]).unwrap();
        let e = read_f32_matrix(&p).unwrap_err().to_string();
        assert!(e.contains("v.npy") && e.contains("expected float32"), "{e}");
        let q = dir.path().join("m.npy");
        write_f32_matrix(&q, &Matrix::zeros(2, 2)).unwrap();
        let e = read_ids(&q).unwrap_err().to_string();
        assert!(e.contains("m.npy") && e.contains("1-D"), "{e}");
        std::fs::write(dir.path().join("bad.npy"), b"hello").unwrap();
        let e = read_f32_matrix(&dir.path().join("bad.npy")).unwrap_err().to_string();
        assert!(e.contains("not a .npy file"), "{e}");
    }
}
