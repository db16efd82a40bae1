//! Word vectors in word2vec's text and binary formats (what gensim's
//! `KeyedVectors.load_word2vec_format` reads).
//!
//! Both start with a `count dim` line. Text: one `word v1 ... v_dim` line per word. Binary:
//! `word ` followed by `dim` little-endian f32 and a newline, per word.

use crate::{Error, format_err, io_err as io, parse_err};
use farout_core::Matrix;
use rustc_hash::FxHashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::Path;

/// Which word2vec format a file is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One line of text per word.
    Text,
    /// Raw little-endian f32 after each word.
    Binary,
}

impl Format {
    /// `binary` for paths ending in `.bin`, else `text`.
    pub fn from_path(path: &Path) -> Self {
        if path.extension().is_some_and(|e| e == "bin") { Format::Binary } else { Format::Text }
    }
}

/// Words and their vectors, in file order (frequency order for files farout writes).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Vectors {
    words: Vec<String>,
    matrix: Matrix,
    ids: FxHashMap<String, u32>,
}

impl Vectors {
    /// Row `i` of `matrix` is the vector of `words[i]`. Words must be distinct and contain no
    /// whitespace.
    pub fn new(words: Vec<String>, matrix: Matrix) -> Result<Self, Error> {
        if words.len() != matrix.rows() {
            return Err(Error::Config {
                key: "vectors",
                msg: format!("{} words for {} vectors", words.len(), matrix.rows()),
            });
        }
        let mut ids = FxHashMap::default();
        for (i, w) in words.iter().enumerate() {
            if w.is_empty() || w.contains(char::is_whitespace) {
                return Err(Error::Config {
                    key: "vectors",
                    msg: format!("word {w:?} is empty or contains whitespace"),
                });
            }
            if ids.insert(w.clone(), i as u32).is_some() {
                return Err(Error::Config { key: "vectors", msg: format!("word {w:?} appears twice") });
            }
        }
        Ok(Self { words, matrix, ids })
    }

    /// The words.
    pub fn words(&self) -> &[String] {
        &self.words
    }

    /// The vectors, one row per word.
    pub fn matrix(&self) -> &Matrix {
        &self.matrix
    }

    /// Row of `word`.
    pub fn id(&self, word: &str) -> Option<usize> {
        self.ids.get(word).map(|&i| i as usize)
    }

    /// Vector of `word`.
    pub fn get(&self, word: &str) -> Option<&[f32]> {
        self.id(word).map(|i| self.matrix.row(i))
    }

    /// Writes the vectors to `path` in `format`.
    pub fn save(&self, path: &Path, format: Format) -> Result<(), Error> {
        let mut w = BufWriter::new(File::create(path).map_err(io(path))?);
        let mut write = || -> std::io::Result<()> {
            writeln!(w, "{} {}", self.words.len(), self.matrix.cols())?;
            for (word, v) in self.words.iter().zip(self.matrix.iter_rows()) {
                match format {
                    Format::Text => {
                        write!(w, "{word}")?;
                        for x in v {
                            write!(w, " {x}")?;
                        }
                    }
                    Format::Binary => {
                        write!(w, "{word} ")?;
                        for x in v {
                            w.write_all(&x.to_le_bytes())?;
                        }
                    }
                }
                writeln!(w)?;
            }
            w.flush()
        };
        write().map_err(io(path))
    }

    /// Reads a file in `format` (see [`Format::from_path`]).
    pub fn load(path: &Path, format: Format) -> Result<Self, Error> {
        let file = File::open(path).map_err(io(path))?;
        let file_len = file.metadata().map_err(io(path))?.len();
        let mut r = BufReader::new(file);
        let mut header = String::new();
        r.read_line(&mut header).map_err(io(path))?;
        let mut it = header.split_whitespace().map(str::parse::<usize>);
        let (Some(Ok(n)), Some(Ok(dim)), None) = (it.next(), it.next(), it.next()) else {
            return Err(parse_err(path, 1, format!("expected `count dim`, found {:?}", header.trim_end())));
        };
        if dim == 0 {
            return Err(parse_err(path, 1, "dimension 0"));
        }
        // The fewest bytes a vector takes: a one-byte word and `dim` one-digit values, each after
        // a space (text), or a one-byte word, a space and `dim` f32 (binary).
        let per_vector = match format {
            Format::Text => (dim as u64).checked_mul(2).and_then(|b| b.checked_add(1)),
            Format::Binary => (dim as u64).checked_mul(4).and_then(|b| b.checked_add(2)),
        };
        let needed = per_vector.and_then(|b| b.checked_mul(n as u64)).and_then(|b| b.checked_add(header.len() as u64));
        let what = format!("a header of {n} vectors of dimension {dim}");
        farout_data::check_len(path, Some(1), needed, file_len, &what)?;
        // Both fit in the file now: n * dim < file_len / 2.
        let mut words = Vec::with_capacity(n);
        let mut data = Vec::with_capacity(n * dim);
        match format {
            Format::Text => {
                let mut line = String::new();
                for i in 0..n {
                    line.clear();
                    let lineno = i + 2;
                    if r.read_line(&mut line).map_err(io(path))? == 0 {
                        return Err(parse_err(path, lineno, format!("the file ends after {i} of {n} vectors")));
                    }
                    let mut fields = line.split_whitespace();
                    let word = fields.next().ok_or_else(|| parse_err(path, lineno, "empty line"))?;
                    let before = data.len();
                    for f in fields {
                        data.push(
                            f.parse::<f32>().map_err(|_| parse_err(path, lineno, format!("{f:?} is not a number")))?,
                        );
                    }
                    if data.len() - before != dim {
                        return Err(parse_err(path, lineno, format!("{} values, expected {dim}", data.len() - before)));
                    }
                    words.push(word.to_owned());
                }
            }
            Format::Binary => {
                let mut bytes = vec![0u8; 4 * dim];
                for i in 0..n {
                    let mut word = Vec::new();
                    r.read_until(b' ', &mut word).map_err(io(path))?;
                    if word.pop() != Some(b' ') {
                        return Err(format_err(path, format!("the file ends after {i} of {n} vectors")));
                    }
                    // word2vec puts a newline after each vector; some writers do not.
                    let start = word.iter().position(|&b| b != b'\n').unwrap_or(word.len());
                    let word = String::from_utf8(word[start..].to_vec())
                        .map_err(|_| format_err(path, format!("word {} is not valid UTF-8", i + 1)))?;
                    r.read_exact(&mut bytes)
                        .map_err(|_| format_err(path, format!("the file ends inside vector {} ({word:?})", i + 1)))?;
                    data.extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
                    words.push(word);
                }
            }
        }
        let matrix = Matrix::from_vec(n, dim, data).expect("n * dim values were read");
        Self::new(words, matrix).map_err(|e| format_err(path, e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vectors {
        let m = Matrix::from_vec(3, 2, vec![0.5, -1.25, 1e-7, 3.0e8, -0.0, f32::MIN_POSITIVE]).unwrap();
        Vectors::new(vec!["the".into(), "día".into(), "x'y".into()], m).unwrap()
    }

    #[test]
    fn both_formats_round_trip_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let v = sample();
        for (name, format) in [("v.txt", Format::Text), ("v.bin", Format::Binary)] {
            let p = dir.path().join(name);
            assert_eq!(Format::from_path(&p), format);
            v.save(&p, format).unwrap();
            let back = Vectors::load(&p, format).unwrap();
            assert_eq!(back.words(), v.words());
            let bits = |m: &Matrix| m.as_slice().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(back.matrix()), bits(v.matrix()), "{name}");
            assert_eq!(back.get("día"), v.get("día"));
        }
    }

    #[test]
    fn malformed_files_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.txt");
        let cases = [
            ("2 2\na 1 2\nb 1\n", ":3: 1 values, expected 2"),
            ("2 2\na 1 2\nb 1 zz\n", ":3: \"zz\" is not a number"),
            ("3 2\na 1.5 2.5\nb 1.5 2.5\n", ":4: the file ends after 2 of 3"),
            (
                "3 2\na 1 2\nb 1 2\n",
                ":1: a header of 3 vectors of dimension 2 needs at least 19 bytes but the file has 16",
            ),
            ("two 2\n", ":1: expected `count dim`"),
            ("2 2\na 1 2\na 3 4\n", "appears twice"),
        ];
        for (text, want) in cases {
            std::fs::write(&p, text).unwrap();
            let msg = Vectors::load(&p, Format::Text).unwrap_err().to_string();
            assert!(msg.contains(want), "{text:?}: {msg}");
        }
        std::fs::write(&p, b"1 2\nabcdefgh \x00\x00").unwrap();
        let msg = Vectors::load(&p, Format::Binary).unwrap_err().to_string();
        assert!(msg.contains("ends inside vector 1"), "{msg}");
    }

    #[test]
    fn huge_counts_and_truncated_files_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v.bin");
        let cases: [(&[u8], Format, &str); 6] = [
            (
                b"1000000000000 100\nab \x00\x00",
                Format::Binary,
                "v.bin:1: a header of 1000000000000 vectors of dimension 100 needs at least 402000000000018 bytes \
                 but the file has 23",
            ),
            (
                b"1000000000000 100\na 1\n",
                Format::Text,
                "v.bin:1: a header of 1000000000000 vectors of dimension 100 needs at least 201000000000018 bytes \
                 but the file has 22",
            ),
            (
                b"4 4611686018427387904\nab\n",
                Format::Binary,
                "v.bin:1: a header of 4 vectors of dimension 4611686018427387904 needs more than",
            ),
            (b"2 1\nab \x00\x00\x00\x00\ncd \x00\x00", Format::Binary, "v.bin: the file ends inside vector 2 (\"cd\")"),
            (b"2 1\nabcdefgh \x00\x00\x00\x00\ncdefgh", Format::Binary, "v.bin: the file ends after 1 of 2 vectors"),
            (
                b"2 1\nab \x00\x00\x00\x00\ncd",
                Format::Binary,
                "v.bin:1: a header of 2 vectors of dimension 1 needs at least 16 bytes but the file has 14",
            ),
        ];
        for (bytes, format, want) in cases {
            std::fs::write(&p, bytes).unwrap();
            let msg = Vectors::load(&p, format).unwrap_err().to_string();
            assert!(msg.starts_with(&format!("{}/{want}", dir.path().display())), "{msg}");
        }
    }
}
