//! Raw little-endian f32 files whose shape comes from the config (`data.dim`).

use crate::{Error, Result, io_err};
use farout_core::Matrix;
use std::path::Path;

/// Reads `path` as rows of `dim` little-endian f32 values.
pub fn read_f32(path: &Path, dim: usize) -> Result<Matrix> {
    if dim == 0 {
        return Err(Error::Param { name: "data.dim", msg: "raw f32 features need dim > 0".into() });
    }
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    if bytes.len() % (4 * dim) != 0 {
        return Err(Error::Format {
            path: path.to_path_buf(),
            msg: format!(
                "{} bytes is not a whole number of rows of {dim} f32 values ({} bytes each)",
                bytes.len(),
                4 * dim
            ),
        });
    }
    let data = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    Ok(Matrix::from_vec(bytes.len() / (4 * dim), dim, data).expect("length checked above"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rows_and_rejects_ragged_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.f32");
        let vals = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        std::fs::write(&p, vals.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        let m = read_f32(&p, 3).unwrap();
        assert_eq!((m.rows(), m.row(1)), (2, &[4.0, 5.0, 6.0][..]));
        let e = read_f32(&p, 4).unwrap_err().to_string();
        assert!(e.contains("x.f32") && e.contains("not a whole number of rows"), "{e}");
    }
}
