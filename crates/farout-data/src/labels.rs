//! Label files: text (one sample per line, comma-separated class ids, empty line = no label) or
//! `.npy` (1-D integers, one label per sample).

use crate::{Error, LabelSets, Result, io_err};
use std::io::BufRead;
use std::path::Path;

/// Reads labels from `path` (`.npy` by extension, text otherwise), checking ids `< n_labels`
/// when given; otherwise K is one more than the largest id.
pub fn read(path: &Path, n_labels: Option<usize>) -> Result<LabelSets> {
    let npy = path.extension().is_some_and(|e| e == "npy");
    let sets = if npy {
        let ids = crate::npy::read_ids(path)?;
        let k = ids.iter().map(|&i| i as usize + 1).max().unwrap_or(0);
        LabelSets::from_single(ids, k)
    } else {
        read_text(path)?
    };
    match n_labels {
        Some(k) => {
            if let Some((i, &l)) = sets.labels.iter().enumerate().find(|(_, l)| **l as usize >= k) {
                // The sample (1-based): the line of a text file.
                let sample = sets.indptr.partition_point(|&p| p <= i);
                let msg = format!("label {l} out of range: n_classes is {k}");
                let path = path.to_path_buf();
                return Err(if npy {
                    Error::Format { path, msg: format!("{msg} (sample {sample})") }
                } else {
                    Error::Parse { path, line: sample, msg }
                });
            }
            Ok(LabelSets { n_labels: k, ..sets })
        }
        None => Ok(sets),
    }
}

fn read_text(path: &Path) -> Result<LabelSets> {
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let mut sets = LabelSets::new(0);
    let mut buf = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| Error::Parse { path: path.to_path_buf(), line: i + 1, msg: e.to_string() })?;
        buf.clear();
        for tok in line.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let l: u32 = tok.parse().map_err(|_| Error::Parse {
                path: path.to_path_buf(),
                line: i + 1,
                msg: format!("label `{tok}` is not a non-negative integer"),
            })?;
            buf.push(l);
        }
        sets.push(&buf);
    }
    sets.n_labels = sets.labels.iter().map(|&l| l as usize + 1).max().unwrap_or(0);
    Ok(sets)
}

/// Writes label sets as text, one line per sample.
pub fn write_text(path: &Path, sets: &LabelSets) -> Result<()> {
    use std::io::Write;
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).map_err(io_err(path))?);
    for i in 0..sets.len() {
        let line: Vec<String> = sets.get(i).iter().map(|l| l.to_string()).collect();
        writeln!(w, "{}", line.join(",")).map_err(io_err(path))?;
    }
    w.flush().map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_labels_round_trip_and_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l.txt");
        std::fs::write(&p, "1,2\n\n0\n").unwrap();
        let s = read(&p, Some(3)).unwrap();
        assert_eq!((s.get(0), s.get(1), s.get(2)), (&[1, 2][..], &[][..], &[0][..]));
        let e = read(&p, Some(2)).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}:1: label 2 out of range", p.display())), "{e}");
        std::fs::write(&p, "1\nx\n").unwrap();
        let e = read(&p, None).unwrap_err().to_string();
        assert!(e.contains("l.txt:2: label `x`"), "{e}");
    }

    #[test]
    fn huge_and_out_of_range_ids_name_the_file_and_sample() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l.txt");
        std::fs::write(&p, "1\n4294967295\n").unwrap();
        // Without a declared K the largest id decides it; nothing is allocated for it here.
        assert_eq!(read(&p, None).unwrap().n_labels, 1 << 32);
        let e = read(&p, Some(10)).unwrap_err().to_string();
        assert!(e.ends_with("l.txt:2: label 4294967295 out of range: n_classes is 10"), "{e}");
        std::fs::write(&p, "4294967296\n").unwrap();
        let e = read(&p, None).unwrap_err().to_string();
        assert!(e.ends_with("l.txt:1: label `4294967296` is not a non-negative integer"), "{e}");
        let q = dir.path().join("l.npy");
        crate::npy::write_ids(&q, &[0, 3_000_000_000]).unwrap();
        let e = read(&q, Some(10)).unwrap_err().to_string();
        assert!(e.ends_with("l.npy: label 3000000000 out of range: n_classes is 10 (sample 2)"), "{e}");
    }
}
