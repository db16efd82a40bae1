//! Little-endian binary I/O of f32 slices and u64 headers, used by checkpoints, and atomic
//! replacement of a file.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

const CHUNK: usize = 1 << 20;

/// Writes `v` as little-endian f32, in chunks (no full-size temporary).
pub fn write_f32s(w: &mut impl Write, v: &[f32]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(v.len().min(CHUNK) * 4);
    for chunk in v.chunks(CHUNK) {
        buf.clear();
        chunk.iter().for_each(|x| buf.extend_from_slice(&x.to_le_bytes()));
        w.write_all(&buf)?;
    }
    Ok(())
}

/// Fills `out` with little-endian f32 values read from `r`.
pub fn read_f32s(r: &mut impl Read, out: &mut [f32]) -> std::io::Result<()> {
    let mut buf = vec![0u8; out.len().min(CHUNK) * 4];
    for chunk in out.chunks_mut(CHUNK) {
        let bytes = &mut buf[..chunk.len() * 4];
        r.read_exact(bytes)?;
        for (x, b) in chunk.iter_mut().zip(bytes.chunks_exact(4)) {
            *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
    Ok(())
}

/// Writes a u64.
pub fn write_u64(w: &mut impl Write, v: u64) -> std::io::Result<()> {
    w.write_all(&v.to_le_bytes())
}

/// Reads a u64.
pub fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Writes `bytes` to `path` atomically: into `<path>.tmp` beside it, synced, then renamed over
/// `path`, so a crash leaves the old file whole. An error names the file it happened on.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), (PathBuf, std::io::Error)> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    write().map_err(|e| (tmp.clone(), e))?;
    std::fs::rename(&tmp, path).map_err(|e| (path.to_path_buf(), e))
}

#[cfg(test)]
mod tests {
    #[test]
    fn f32s_round_trip() {
        let v: Vec<f32> = (0..3000).map(|i| i as f32 * 0.25 - 7.0).collect();
        let mut buf = Vec::new();
        super::write_f32s(&mut buf, &v).unwrap();
        super::write_u64(&mut buf, 42).unwrap();
        let mut out = vec![0.0; 3000];
        let mut r = &buf[..];
        super::read_f32s(&mut r, &mut out).unwrap();
        assert_eq!((out, super::read_u64(&mut r).unwrap()), (v, 42));
    }
}
