//! The Extreme Classification Repository sparse format.
//!
//! ```text
//! N D K                      <- samples, features, labels
//! 3,23,61 0:1 5:0.5 20:1     <- labels (comma separated), then feature:value pairs (0-based)
//!  4:1 9:1                   <- a sample without labels starts with a space
//! ```
//! The reader streams lines, checks every id against the header and the sample count at the end,
//! and names the file and 1-based line of the first problem.

use crate::{Dataset, Error, Features, LabelSets, Result, SparseRows, io_err};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

/// Reads an XMC file.
pub fn read(path: &Path) -> Result<Dataset> {
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    read_from(BufReader::with_capacity(1 << 20, file), path)
}

/// Reads XMC data from `reader`; `path` is only used in error messages.
pub fn read_from(mut reader: impl BufRead, path: &Path) -> Result<Dataset> {
    let parse_err = |line: usize, msg: String| Error::Parse { path: path.to_path_buf(), line, msg };
    let mut line = String::new();
    let n = reader.read_line(&mut line).map_err(io_err(path))?;
    if n == 0 {
        return Err(parse_err(1, "empty file: expected a header `N D K`".into()));
    }
    let header: Vec<&str> = line.split_whitespace().collect();
    let nums: Vec<usize> = header.iter().filter_map(|s| s.parse().ok()).collect();
    if header.len() != 3 || nums.len() != 3 {
        return Err(parse_err(
            1,
            format!("expected a header `N D K` (samples, features, labels), found `{}`", line.trim_end()),
        ));
    }
    let (n_samples, n_features, n_labels) = (nums[0], nums[1], nums[2]);
    let mut features = SparseRows::new(n_features);
    let mut labels = LabelSets::new(n_labels);
    features.indptr.reserve(n_samples);
    labels.indptr.reserve(n_samples);
    let mut line_no = 1;
    let mut label_buf = Vec::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                parse_err(line_no + 1, "invalid UTF-8".into())
            } else {
                Error::Io { path: path.to_path_buf(), source: e }
            }
        })?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let text = line.trim_end_matches(['\n', '\r']);
        // A blank line is a sample with neither labels nor features; blank lines after the
        // announced samples (a trailing newline too many) are ignored.
        if labels.len() == n_samples && text.trim().is_empty() {
            continue;
        }
        if labels.len() == n_samples {
            return Err(parse_err(line_no, format!("more samples than the {n_samples} the header announces")));
        }
        // Labels are the first whitespace-free token unless it contains ':' or the line starts
        // with a space (no labels).
        let (label_tok, rest) = if text.starts_with([' ', '\t']) {
            ("", text)
        } else {
            match text.find([' ', '\t']) {
                Some(i) => (&text[..i], &text[i..]),
                None => (text, ""),
            }
        };
        let (label_tok, rest) = if label_tok.contains(':') { ("", text) } else { (label_tok, rest) };
        label_buf.clear();
        if !label_tok.is_empty() {
            for tok in label_tok.split(',') {
                let l: u32 = tok
                    .parse()
                    .map_err(|_| parse_err(line_no, format!("label `{tok}` is not a non-negative integer")))?;
                if l as usize >= n_labels {
                    return Err(parse_err(
                        line_no,
                        format!("label {l} out of range: the header declares {n_labels} labels (ids 0..{})", n_labels),
                    ));
                }
                label_buf.push(l);
            }
        }
        labels.push(&label_buf);
        for tok in rest.split_whitespace() {
            let Some((f, v)) = tok.split_once(':') else {
                return Err(parse_err(line_no, format!("expected `feature:value`, found `{tok}`")));
            };
            let f: u32 =
                f.parse().map_err(|_| parse_err(line_no, format!("feature id `{f}` is not a non-negative integer")))?;
            if f as usize >= n_features {
                return Err(parse_err(
                    line_no,
                    format!("feature {f} out of range: the header declares {n_features} features"),
                ));
            }
            let v: f32 = v.parse().map_err(|_| parse_err(line_no, format!("feature value `{v}` is not a number")))?;
            if !v.is_finite() {
                return Err(parse_err(line_no, format!("feature value `{v}` is not finite")));
            }
            features.indices.push(f);
            features.values.push(v);
        }
        features.indptr.push(features.indices.len());
    }
    if labels.len() != n_samples {
        return Err(parse_err(
            line_no,
            format!("the header announces {n_samples} samples but the file has {}", labels.len()),
        ));
    }
    Ok(Dataset { features: Features::Sparse(features), labels })
}

/// Writes sparse features and labels in XMC format.
pub fn write(path: &Path, features: &SparseRows, labels: &LabelSets) -> Result<()> {
    let file = std::fs::File::create(path).map_err(io_err(path))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    write_to(&mut w, features, labels).map_err(io_err(path))?;
    w.flush().map_err(io_err(path))
}

/// Writes XMC data to `w`.
pub fn write_to(w: &mut impl Write, features: &SparseRows, labels: &LabelSets) -> std::io::Result<()> {
    writeln!(w, "{} {} {}", labels.len(), features.n_cols, labels.n_labels)?;
    for i in 0..labels.len() {
        write_row(w, labels.get(i), features.row(i))?;
    }
    Ok(())
}

/// Writes one sample's line.
pub fn write_row(w: &mut impl Write, labels: &[u32], (cols, vals): (&[u32], &[f32])) -> std::io::Result<()> {
    for (j, l) in labels.iter().enumerate() {
        if j > 0 {
            w.write_all(b",")?;
        }
        write!(w, "{l}")?;
    }
    for (c, v) in cols.iter().zip(vals) {
        write!(w, " {c}:{v}")?;
    }
    w.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(text: &str) -> Result<Dataset> {
        read_from(text.as_bytes(), Path::new("t.txt"))
    }

    #[test]
    fn reads_labels_features_and_unlabelled_lines() {
        let d = parse("3 10 5\n1,4 0:1 9:0.5\n 2:1\n0\n").unwrap();
        assert_eq!(d.labels.get(0), &[1, 4]);
        assert!(d.labels.get(1).is_empty());
        assert_eq!(d.labels.get(2), &[0]);
        let Features::Sparse(f) = &d.features else { panic!() };
        assert_eq!(f.row(0), (&[0u32, 9][..], &[1.0f32, 0.5][..]));
        assert_eq!(f.row(1), (&[2u32][..], &[1.0f32][..]));
        assert_eq!(f.row(2).0.len(), 0);
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let cases = [
            ("2 10 5\n1 0:1\n7 0:1\n", "t.txt:3: label 7 out of range"),
            ("2 10 5\n1 0:1\n1 12:1\n", "t.txt:3: feature 12 out of range"),
            ("2 10 5\n1 0:1\n1 0-1\n", "t.txt:3: expected `feature:value`"),
            ("2 10 5\n1 0:x\n", "t.txt:2: feature value `x` is not a number"),
            ("3 10 5\n1 0:1\n", "t.txt:2: the header announces 3 samples but the file has 1"),
            ("1 10 5\n1 0:1\n1 0:1\n", "t.txt:3: more samples"),
            ("1 10\n", "t.txt:1: expected a header"),
            ("2 10 5\na,1 0:1\n", "t.txt:2: label `a` is not"),
        ];
        for (text, expect) in cases {
            let msg = parse(text).unwrap_err().to_string();
            assert!(msg.starts_with(expect), "{msg:?} should start with {expect:?}");
        }
    }

    proptest! {
        #[test]
        fn write_then_read_round_trips(rows in prop::collection::vec(
            (prop::collection::btree_set(0u32..20, 0..4), prop::collection::btree_map(0u32..50, -5.0f32..5.0, 0..6)), 0..10)) {
            let mut f = SparseRows::new(50);
            let mut l = LabelSets::new(20);
            for (labels, feats) in &rows {
                let labels: Vec<u32> = labels.iter().copied().collect();
                let (c, v): (Vec<u32>, Vec<f32>) = feats.iter().map(|(a, b)| (*a, *b)).unzip();
                f.push_row(&c, &v);
                l.push(&labels);
            }
            let mut buf = Vec::new();
            write_to(&mut buf, &f, &l).unwrap();
            let d = read_from(&buf[..], Path::new("rt")).unwrap();
            prop_assert_eq!(d.labels, l);
            prop_assert_eq!(d.features, Features::Sparse(f));
        }
    }
}
