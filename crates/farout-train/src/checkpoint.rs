//! Checkpoint directories written atomically: files go into `<dir>.tmp`, which is then swapped
//! in for `<dir>`, so a crash or a divergence never leaves a half-written or poisoned checkpoint.

use crate::{Error, io_err as io};
use std::path::{Path, PathBuf};

/// Calls `fill` on an empty temporary directory, then replaces `dir` with it.
pub fn replace_dir(dir: &Path, fill: impl FnOnce(&Path) -> Result<(), Error>) -> Result<PathBuf, Error> {
    let tmp = dir.with_extension("tmp");
    let old = dir.with_extension("old");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    fill(&tmp)?;
    if dir.exists() {
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(io(&old))?;
        }
        std::fs::rename(dir, &old).map_err(io(dir))?;
    }
    std::fs::rename(&tmp, dir).map_err(io(&tmp))?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(io(&old))?;
    }
    Ok(dir.to_path_buf())
}

/// Writes `values` as little-endian f32 to `path`.
pub fn write_f32_file(path: &Path, values: &[f32]) -> Result<(), Error> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io(path))?);
    farout_core::binio::write_f32s(&mut f, values).and_then(|_| std::io::Write::flush(&mut f)).map_err(io(path))
}

/// Reads exactly `out.len()` little-endian f32 from `path`.
pub fn read_f32_file(path: &Path, out: &mut [f32]) -> Result<(), Error> {
    let len = std::fs::metadata(path).map_err(io(path))?.len();
    if len != out.len() as u64 * 4 {
        return Err(Error::Checkpoint {
            path: path.to_path_buf(),
            msg: format!("{len} bytes, expected {} ({} f32 values)", out.len() * 4, out.len()),
        });
    }
    let mut f = std::io::BufReader::new(std::fs::File::open(path).map_err(io(path))?);
    farout_core::binio::read_f32s(&mut f, out).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_fill_keeps_the_old_checkpoint() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ck");
        replace_dir(&dir, |t| write_f32_file(&t.join("a.bin"), &[1.0, 2.0])).unwrap();
        let err = replace_dir(&dir, |_| Err(Error::NoData("boom")));
        assert!(err.is_err());
        let mut back = [0.0; 2];
        read_f32_file(&dir.join("a.bin"), &mut back).unwrap();
        assert_eq!(back, [1.0, 2.0]);
        assert!(read_f32_file(&dir.join("a.bin"), &mut [0.0; 3]).unwrap_err().to_string().contains("expected 12"));
    }
}
