//! Raw little-endian f32 files whose shape comes from the config (`data.dim`).

use crate::{Error, Result, io_err};
use farout_core::Matrix;
use std::path::Path;

/// Reads `path` as rows of `dim` little-endian f32 values; NaN or infinite values are an error
/// naming the first one's row and column ([`crate::check_finite`]).
pub fn read_f32(path: &Path, dim: usize) -> Result<Matrix> {
    let row_bytes = dim.checked_mul(4).filter(|&b| b > 0).ok_or_else(|| {
        farout_core::ParamError::message(
            "data.dim",
            format!("raw f32 features need 0 < dim <= {}, got {dim}", usize::MAX / 4),
        )
    })?;
    let mut file = std::fs::File::open(path).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    if len % row_bytes as u64 != 0 {
        return Err(Error::Format {
            path: path.to_path_buf(),
            msg: format!("{len} bytes is not a whole number of rows of {dim} f32 values ({row_bytes} bytes each)"),
        });
    }
    let mut data = vec![0f32; (len / 4) as usize];
    farout_core::binio::read_f32s(&mut file, &mut data).map_err(io_err(path))?;
    crate::check_finite(path, &data, dim)?;
    Ok(Matrix::from_vec(data.len() / dim, dim, data).expect("length checked above"))
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
        let nan = [1.0f32, 2.0, 3.0, 4.0, f32::NAN, 6.0];
        std::fs::write(&p, nan.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        let e = read_f32(&p, 3).unwrap_err().to_string();
        assert!(e.contains("x.f32: row 1, column 1 holds NaN"), "{e}");
    }

    #[test]
    fn a_dimension_whose_rows_overflow_is_a_parameter_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.f32");
        std::fs::write(&p, [0u8; 8]).unwrap();
        for dim in [0, usize::MAX / 2] {
            let e = read_f32(&p, dim).unwrap_err().to_string();
            assert!(e.starts_with("invalid data.dim: raw f32 features need 0 < dim"), "{e}");
        }
        let e = read_f32(&p, usize::MAX / 4).unwrap_err().to_string();
        assert!(e.contains("x.f32: 8 bytes is not a whole number of rows"), "{e}");
    }
}
