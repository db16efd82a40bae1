//! The Extreme Classification Repository sparse format, and LIBSVM's (the same lines without
//! the header).
//!
//! ```text
//! N D K                      <- samples, features, labels (optional)
//! 3,23,61 0:1 5:0.5 20:1     <- labels (comma separated), then feature:value pairs (0-based)
//!  4:1 9:1                   <- a sample without labels starts with a space
//! ```
//! A first line of exactly three integers is the header; otherwise the file has none and D and
//! K are one more than the largest feature and label ids found (ids are taken as they are, so
//! LIBSVM's 1-based features leave column 0 empty). A sample's labels and features must be
//! distinct, its values finite. The reader checks the header's sample count against the file's length (a line, so at least a
//! byte, per sample) before reserving for it, streams lines, checks every id against the header
//! and the sample count at the end, and names the file and 1-based line of the first problem.

use crate::{Dataset, Error, Features, LabelSets, Result, SparseRows, buffer_len, check_len, io_err};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

/// Reads an XMC file.
pub fn read(path: &Path) -> Result<Dataset> {
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    read_checked(BufReader::with_capacity(buffer_len(len), file), path, Some(len))
}

/// Reads XMC data from `reader`; `path` is only used in error messages. Without the file's
/// length nothing is reserved from the header's sample count: memory grows with the data read.
pub fn read_from(reader: impl BufRead, path: &Path) -> Result<Dataset> {
    read_checked(reader, path, None)
}

/// Ids are `u32`: a header declaring more features or labels than that cannot be right.
const MAX_IDS: u64 = 1 << 32;

/// [`read_from`], checking the header's sample count against the input's length `len` (a line,
/// so at least a byte, per sample) before reserving for it.
fn read_checked(mut reader: impl BufRead, path: &Path, len: Option<u64>) -> Result<Dataset> {
    let mut line = String::new();
    let n = reader.read_line(&mut line).map_err(io_err(path))?;
    let mut xmc = XmcReader::start(path, &line, n, len)?;
    let mut first_sample = (!xmc.has_header).then(|| std::mem::take(&mut line));
    loop {
        line.clear();
        let n = if let Some(first) = first_sample.take() {
            line = first;
            line.len()
        } else {
            xmc.read_line(&mut reader, &mut line)?
        };
        if n == 0 {
            break;
        }
        xmc.push_line(&line).map_err(|e| xmc.explain_first_line(e))?;
    }
    xmc.finish()
}

/// An XMC file being read: its sizes (from the header `N D K`; without one, any number of
/// samples and as many features and labels as 32-bit ids address), the samples so far and the
/// number of the line read last.
struct XmcReader<'p> {
    path: &'p Path,
    has_header: bool,
    n_samples: usize,
    n_features: usize,
    n_labels: usize,
    /// 1-based; 0 before the first line of a file without header.
    line_no: usize,
    features: SparseRows,
    labels: LabelSets,
    label_buf: Vec<u32>,
    scratch: Vec<u32>,
}

impl<'p> XmcReader<'p> {
    /// The reader after the first line, `line` of `n` bytes: the header checked and, given the
    /// input's length `len`, room reserved for the samples it announces.
    fn start(path: &'p Path, line: &str, n: usize, len: Option<u64>) -> Result<Self> {
        let parse_err = |line: usize, msg: String| Error::Parse { path: path.to_path_buf(), line, msg };
        if n == 0 {
            return Err(parse_err(1, "empty file: expected a header `N D K`".into()));
        }
        let header: Vec<&str> = line.split_whitespace().collect();
        let nums: Vec<usize> = header.iter().filter_map(|s| s.parse().ok()).collect();
        let has_header = header.len() == 3 && nums.len() == 3;
        // Without a header, the first line is a sample and the sizes are found from the ids.
        let (n_samples, n_features, n_labels) =
            if has_header { (nums[0], nums[1], nums[2]) } else { (usize::MAX, MAX_IDS as usize, MAX_IDS as usize) };
        for (n, what) in [(n_features, "features"), (n_labels, "labels")] {
            if n as u64 > MAX_IDS {
                return Err(parse_err(1, format!("the header declares {n} {what}, more than 32-bit ids address")));
            }
        }
        let mut features = SparseRows::new(n_features);
        let mut labels = LabelSets::new(n_labels);
        if let Some(len) = len.filter(|_| has_header) {
            let needed = (n as u64).checked_add(n_samples as u64);
            check_len(path, Some(1), needed, len, &format!("a header of {n_samples} samples (a line each)"))?;
            features.indptr.reserve(n_samples);
            labels.indptr.reserve(n_samples);
        }
        let line_no = if has_header { 1 } else { 0 };
        let (label_buf, scratch) = (Vec::new(), Vec::new());
        Ok(Self { path, has_header, n_samples, n_features, n_labels, line_no, features, labels, label_buf, scratch })
    }

    /// An error on the first line of a file without header says which format was assumed and
    /// why: the line may have been meant as a malformed header.
    fn explain_first_line(&self, e: Error) -> Error {
        match e {
            Error::Parse { path, line: 1, msg } if !self.has_header => Error::Parse {
                path,
                line: 1,
                msg: format!(
                    "{msg} (line 1 is not an XMC header of three integers `N D K`, so the file was read as \
                     LIBSVM, without a header, and line 1 as its first sample)"
                ),
            },
            e => e,
        }
    }

    /// A parse error at the line read last.
    fn parse_err(&self, msg: String) -> Error {
        Error::Parse { path: self.path.to_path_buf(), line: self.line_no, msg }
    }

    /// The next line into `line`; its length in bytes, 0 at the end of the input.
    fn read_line(&self, reader: &mut impl BufRead, line: &mut String) -> Result<usize> {
        reader.read_line(line).map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                Error::Parse { path: self.path.to_path_buf(), line: self.line_no + 1, msg: "invalid UTF-8".into() }
            } else {
                Error::Io { path: self.path.to_path_buf(), source: e }
            }
        })
    }

    /// The next line after the header: a sample, or a blank line to skip.
    fn push_line(&mut self, line: &str) -> Result<()> {
        self.line_no += 1;
        let n_samples = self.n_samples;
        let text = line.trim_end_matches(['\n', '\r']);
        // With a header, a blank line is a sample with neither labels nor features; blank lines
        // after the announced samples (a trailing newline too many), or in a file without a
        // header, are ignored.
        if (self.labels.len() == n_samples || !self.has_header) && text.trim().is_empty() {
            return Ok(());
        }
        if self.labels.len() == n_samples {
            return Err(self.parse_err(format!("more samples than the {n_samples} the header announces")));
        }
        let (label_tok, rest) = split_labels(text);
        self.push_labels(label_tok)?;
        self.push_features(rest)
    }

    /// The sample's labels, `label_tok` (comma separated; empty for none).
    fn push_labels(&mut self, label_tok: &str) -> Result<()> {
        let n_labels = self.n_labels;
        self.label_buf.clear();
        if !label_tok.is_empty() {
            for tok in label_tok.split(',') {
                let l: u32 =
                    tok.parse().map_err(|_| self.parse_err(format!("label `{tok}` is not a non-negative integer")))?;
                if l as usize >= n_labels {
                    return Err(self.parse_err(format!(
                        "label {l} out of range: the header declares {n_labels} labels (ids 0..{})",
                        n_labels
                    )));
                }
                self.label_buf.push(l);
            }
        }
        if let Some(l) = first_duplicate(&self.label_buf, &mut self.scratch) {
            return Err(self.parse_err(format!("label {l} appears twice")));
        }
        self.labels.push(&self.label_buf);
        Ok(())
    }

    /// The sample's `feature:value` pairs, `rest` of its line.
    fn push_features(&mut self, rest: &str) -> Result<()> {
        let n_features = self.n_features;
        let row_start = self.features.indices.len();
        for tok in rest.split_whitespace() {
            let Some((f, v)) = tok.split_once(':') else {
                return Err(self.parse_err(format!("expected `feature:value`, found `{tok}`")));
            };
            let f: u32 =
                f.parse().map_err(|_| self.parse_err(format!("feature id `{f}` is not a non-negative integer")))?;
            if f as usize >= n_features {
                return Err(
                    self.parse_err(format!("feature {f} out of range: the header declares {n_features} features"))
                );
            }
            let v: f32 = v.parse().map_err(|_| self.parse_err(format!("feature value `{v}` is not a number")))?;
            if !v.is_finite() {
                return Err(self.parse_err(format!("feature value `{v}` is not finite")));
            }
            self.features.indices.push(f);
            self.features.values.push(v);
        }
        if let Some(f) = first_duplicate(&self.features.indices[row_start..], &mut self.scratch) {
            return Err(self.parse_err(format!("feature {f} appears twice (a sample's features are distinct)")));
        }
        self.features.indptr.push(self.features.indices.len());
        Ok(())
    }

    /// The dataset: without a header, D and K one more than the largest ids found; with one,
    /// after checking that the file had the samples it announced.
    fn finish(mut self) -> Result<Dataset> {
        if !self.has_header {
            self.features.n_cols = self.features.indices.iter().max().map_or(0, |&f| f as usize + 1);
            self.labels.n_labels = self.labels.labels.iter().max().map_or(0, |&l| l as usize + 1);
        } else if self.labels.len() != self.n_samples {
            let (n_samples, found) = (self.n_samples, self.labels.len());
            return Err(self.parse_err(format!("the header announces {n_samples} samples but the file has {}", found)));
        }
        Ok(Dataset { features: Features::Sparse(self.features), labels: self.labels })
    }
}

/// A sample line's label token and the rest: labels are the first whitespace-free token unless
/// it contains ':' or the line starts with a space (no labels).
fn split_labels(text: &str) -> (&str, &str) {
    let (label_tok, rest) = if text.starts_with([' ', '\t']) {
        ("", text)
    } else {
        match text.find([' ', '\t']) {
            Some(i) => (&text[..i], &text[i..]),
            None => (text, ""),
        }
    };
    if label_tok.contains(':') { ("", text) } else { (label_tok, rest) }
}

/// The smallest id that occurs more than once in `ids`, if any; O(n) for ascending ids (the
/// usual order), else sorted in `scratch`.
fn first_duplicate(ids: &[u32], scratch: &mut Vec<u32>) -> Option<u32> {
    if ids.windows(2).all(|w| w[0] < w[1]) {
        return None;
    }
    scratch.clear();
    scratch.extend_from_slice(ids);
    scratch.sort_unstable();
    scratch.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
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
    fn reads_the_headerless_libsvm_form_with_sizes_from_the_ids() {
        let d = parse("1,4 1:1 9:0.5\n 2:1\n0 3:2\n").unwrap();
        assert_eq!((d.labels.len(), d.labels.n_labels, d.features.n_cols()), (3, 5, 10));
        assert_eq!(d.labels.get(0), &[1, 4]);
        let Features::Sparse(f) = &d.features else { panic!() };
        assert_eq!(f.row(2), (&[3u32][..], &[2.0f32][..]));
        let with_header = parse("3 10 5\n1,4 1:1 9:0.5\n 2:1\n0 3:2\n").unwrap();
        assert_eq!(with_header.labels.labels, d.labels.labels);
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
            ("1 10\n", "t.txt:1: expected `feature:value`, found `10`"),
            ("1 0:1 0:2\n", "t.txt:1: feature 0 appears twice"),
            ("2 10 5\n1,3,1 0:1\n", "t.txt:2: label 1 appears twice"),
            ("2 10 5\n1 3:1 0:1 3:1\n", "t.txt:2: feature 3 appears twice"),
            ("2 10 5\na,1 0:1\n", "t.txt:2: label `a` is not"),
        ];
        for (text, expect) in cases {
            let msg = parse(text).unwrap_err().to_string();
            assert!(msg.starts_with(expect), "{msg:?} should start with {expect:?}");
        }
    }

    #[test]
    fn a_malformed_header_says_the_file_was_read_as_libsvm_and_why() {
        let msg = parse(
            "100 50
1 0:1
",
        )
        .unwrap_err()
        .to_string();
        assert!(msg.starts_with("t.txt:1: expected `feature:value`, found `50`"), "{msg}");
        assert!(
            msg.contains("line 1 is not an XMC header of three integers `N D K`, so the file was read as LIBSVM"),
            "{msg}"
        );
        // An error on a later line of a LIBSVM file is only that line's.
        let msg = parse(
            "1 0:1
1 0-1
",
        )
        .unwrap_err()
        .to_string();
        assert!(!msg.contains("XMC header"), "{msg}");
    }

    #[test]
    fn header_sizes_are_checked_against_the_file_before_allocating() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("huge.txt");
        std::fs::write(&p, "1000000000000 10 5\n1 0:1\n").unwrap();
        let msg = read(&p).unwrap_err().to_string();
        let want = "huge.txt:1: a header of 1000000000000 samples (a line each) needs at least 1000000000019 bytes \
                    but the file has 25";
        assert!(msg.ends_with(want), "{msg}");
        std::fs::write(&p, "1 10 1099511627776\n1 0:1\n").unwrap();
        let msg = read(&p).unwrap_err().to_string();
        assert!(msg.ends_with("huge.txt:1: the header declares 1099511627776 labels, more than 32-bit ids address"));
        // Without a length to check against, the count is not trusted for reserving either.
        assert!(parse("1000000000000 10 5\n1 0:1\n").unwrap_err().to_string().contains("announces 1000000000000"));
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
