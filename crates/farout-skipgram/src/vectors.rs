//! Word vectors in word2vec's text and binary formats (what gensim's
//! `KeyedVectors.load_word2vec_format` reads), and in farout's model format, which adds the
//! n-gram rows of subword vectors so that words outside the vocabulary get a vector too.
//!
//! word2vec's formats start with a `count dim` line. Text: one `word v1 ... v_dim` line per
//! word. Binary: `word ` followed by `dim` little-endian f32 and a newline, per word.
//!
//! The model format (`.model`), all integers little-endian:
//!
//! ```text
//! magic     8 bytes  "FOWORDVM"
//! version   u32      1
//! dim       u64
//! words     u64
//! minn      u64      shortest n-gram (characters)
//! maxn      u64      longest n-gram; 0: no n-grams
//! buckets   u64      n-gram rows
//! words     words x (u32 byte length, UTF-8 bytes)
//! vectors   words x dim f32   the words' vectors (their rows' mean, see crate::subwords)
//! ngrams    buckets x dim f32 the n-gram rows
//! crc32     u32      CRC-32 (IEEE) of everything after the version
//! ```

use crate::subwords::NgramTable;
use crate::{Error, format_err, io_err as io, parse_err};
use farout_core::Matrix;
use farout_data::corpus::Vocab;
use farout_data::word_ids::WordIds;
use std::borrow::Cow;
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
    /// farout's model: the words' vectors and the n-gram rows (module docs).
    Model,
}

impl Format {
    /// `binary` for paths ending in `.bin`, `model` for `.model`, else `text`.
    pub fn from_path(path: &Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some("bin") => Format::Binary,
            Some("model") => Format::Model,
            _ => Format::Text,
        }
    }
}

/// The model format's first bytes.
pub const MAGIC: [u8; 8] = *b"FOWORDVM";
/// The model format's version.
pub const VERSION: u32 = 1;

/// Where a word's vector came from ([`Vectors::vector`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The word is in the vocabulary.
    Known,
    /// Out of the vocabulary: the mean of its n-grams' rows.
    FromNgrams,
    /// Out of the vocabulary, and no n-gram rows to build it from.
    Missing,
}

/// Words and their vectors, in file order (frequency order for files farout writes). The
/// vectors are owned (read from a file) or borrowed (a table being trained, evaluated in place),
/// and so are the words and their ids (borrowed from the training vocabulary: at 800,000 words
/// a copy of both is about 100 MB).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Vectors<'a> {
    words: Cow<'a, [String]>,
    matrix: Cow<'a, Matrix>,
    ids: Cow<'a, WordIds>,
    ngrams: Option<NgramTable<'a>>,
}

impl Vectors<'static> {
    /// Row `i` of `matrix` is the vector of `words[i]`. Words must be distinct and contain no
    /// whitespace.
    pub fn new(words: Vec<String>, matrix: Matrix) -> Result<Self, Error> {
        Vectors::with_matrix(words, Cow::Owned(matrix))
    }
}

impl<'a> Vectors<'a> {
    /// [`Vectors::new`] on a borrowed matrix.
    pub fn borrowed(words: Vec<String>, matrix: &'a Matrix) -> Result<Self, Error> {
        Self::with_matrix(words, Cow::Borrowed(matrix))
    }

    /// The vectors of `vocab`'s words (row `i` of `matrix` is word `i`'s), with the words and
    /// their ids borrowed from it rather than copied.
    pub fn of_vocab(vocab: &'a Vocab, matrix: Cow<'a, Matrix>) -> Result<Self, Error> {
        let (words, ids) = (vocab.words(), vocab.id_map());
        Self::check_words(words, matrix.rows())?;
        // The map holds each word once: a vocabulary read from a file may repeat one.
        check_distinct(words, ids)?;
        Ok(Self { words: Cow::Borrowed(words), matrix, ids: Cow::Borrowed(ids), ngrams: None })
    }

    fn with_matrix(words: Vec<String>, matrix: Cow<'a, Matrix>) -> Result<Self, Error> {
        Self::check_words(&words, matrix.rows())?;
        let ids = WordIds::new(&words);
        check_distinct(&words, &ids)?;
        Ok(Self { words: Cow::Owned(words), matrix, ids: Cow::Owned(ids), ngrams: None })
    }

    /// An error unless there is one word per row and every word is non-empty without whitespace.
    fn check_words(words: &[String], rows: usize) -> Result<(), Error> {
        if words.len() != rows {
            return Err(Error::Vectors { msg: format!("{} words for {} vectors", words.len(), rows) });
        }
        match words.iter().find(|w| w.is_empty() || w.contains(char::is_whitespace)) {
            Some(w) => Err(Error::Vectors { msg: format!("word {w:?} is empty or contains whitespace") }),
            None => Ok(()),
        }
    }

    /// The same vectors, with n-gram rows that give words outside the vocabulary a vector.
    pub fn with_ngrams(mut self, ngrams: NgramTable<'a>) -> Result<Self, Error> {
        if ngrams.buckets() > 0 && ngrams.dim() != self.matrix.cols() {
            return Err(Error::Vectors {
                msg: format!("n-gram rows of dimension {} for vectors of {}", ngrams.dim(), self.matrix.cols()),
            });
        }
        self.ngrams = Some(ngrams).filter(|t| t.spec().enabled());
        Ok(self)
    }

    /// The n-gram rows, if the vectors have them.
    pub fn ngrams(&self) -> Option<&NgramTable<'a>> {
        self.ngrams.as_ref()
    }

    /// The vector of any word into `out`: its own, or for a word outside the vocabulary the
    /// mean of its n-grams' rows (`out` is zero when there are none).
    pub fn vector(&self, word: &str, out: &mut [f32]) -> Lookup {
        if let Some(v) = self.get(word) {
            out.copy_from_slice(v);
            return Lookup::Known;
        }
        if self.ngrams.as_ref().is_some_and(|t| t.oov_vector(word, out)) {
            return Lookup::FromNgrams;
        }
        out.fill(0.0);
        Lookup::Missing
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
        self.ids.get(word).map(|i| i as usize)
    }

    /// Vector of `word`.
    pub fn get(&self, word: &str) -> Option<&[f32]> {
        self.id(word).map(|i| self.matrix.row(i))
    }

    /// Writes the vectors to `path` in `format`.
    pub fn save(&self, path: &Path, format: Format) -> Result<(), Error> {
        if format == Format::Model {
            return self.save_model(path);
        }
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
                    Format::Model => unreachable!("written above"),
                }
                writeln!(w)?;
            }
            w.flush()
        };
        write().map_err(io(path))
    }

    /// Reads a file in `format` (see [`Format::from_path`]). A `.npy` file is refused by name,
    /// and so are NaN or infinite values (they would drop out of every nearest-neighbour search
    /// and bias a score silently), naming the first word that holds one.
    pub fn load(path: &Path, format: Format) -> Result<Vectors<'static>, Error> {
        let mut start = [0u8; 6];
        let n = File::open(path).and_then(|mut f| f.read(&mut start)).map_err(io(path))?;
        if start[..n] == *b"\x93NUMPY" {
            return Err(format_err(
                path,
                "a numpy .npy array, not word vectors: give a word2vec text file, a word2vec binary file \
                 (.bin) or a farout model (.model)",
            ));
        }
        let v = Self::read_file(path, format)?;
        check_finite(path, format, &v)?;
        Ok(v)
    }

    /// [`Self::load`] without its checks of the values.
    fn read_file(path: &Path, format: Format) -> Result<Vectors<'static>, Error> {
        if format == Format::Model {
            return Self::load_model(path);
        }
        let file = File::open(path).map_err(io(path))?;
        let file_len = file.metadata().map_err(io(path))?.len();
        let mut r = BufReader::new(file);
        let mut header = String::new();
        r.read_line(&mut header).map_err(not_text(path, 1))?;
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
            Format::Binary | Format::Model => (dim as u64).checked_mul(4).and_then(|b| b.checked_add(2)),
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
                    if r.read_line(&mut line).map_err(not_text(path, lineno))? == 0 {
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
            Format::Binary | Format::Model => {
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
        Vectors::new(words, matrix).map_err(|e| format_err(path, e.to_string()))
    }
}

impl Vectors<'_> {
    fn save_model(&self, path: &Path) -> Result<(), Error> {
        let empty = NgramTable::new(0, 0, Matrix::default());
        let t = self.ngrams.as_ref().unwrap_or(&empty);
        let write = || -> std::io::Result<()> {
            let mut w = Crc32Writer { inner: BufWriter::new(File::create(path)?), crc: crc32fast::Hasher::new() };
            w.inner.write_all(&MAGIC)?;
            w.inner.write_all(&VERSION.to_le_bytes())?;
            for v in [self.matrix.cols(), self.words.len(), t.minn, t.maxn, t.buckets()] {
                w.write_all(&(v as u64).to_le_bytes())?;
            }
            for word in self.words.iter() {
                w.write_all(&(word.len() as u32).to_le_bytes())?;
                w.write_all(word.as_bytes())?;
            }
            farout_core::binio::write_f32s(&mut w, self.matrix.as_slice())?;
            farout_core::binio::write_f32s(&mut w, t.as_slice())?;
            let crc = w.crc.clone().finalize();
            w.inner.write_all(&crc.to_le_bytes())?;
            w.inner.flush()
        };
        write().map_err(io(path))
    }

    fn load_model(path: &Path) -> Result<Vectors<'static>, Error> {
        let file = File::open(path).map_err(io(path))?;
        let file_len = file.metadata().map_err(io(path))?.len();
        let mut r = Crc32Reader { inner: BufReader::new(file), crc: crc32fast::Hasher::new() };
        let bad = |msg: String| format_err(path, msg);
        let truncated = |what: &str| bad(format!("the file ends inside {what}: truncated"));
        let mut magic = [0u8; 8];
        r.inner.read_exact(&mut magic).map_err(|_| truncated("the header"))?;
        if magic != MAGIC {
            return Err(bad("not a farout word-vector model (wrong magic bytes)".into()));
        }
        let mut version = [0u8; 4];
        r.inner.read_exact(&mut version).map_err(|_| truncated("the header"))?;
        let version = u32::from_le_bytes(version);
        if version != VERSION {
            return Err(bad(format!("format version {version}; this farout reads version {VERSION}")));
        }
        let mut header = [0u64; 5];
        for h in &mut header {
            *h = farout_core::binio::read_u64(&mut r).map_err(|_| truncated("the header"))?;
        }
        let [dim, n, minn, maxn, buckets] = header;
        // Every vector and n-gram row is 4 dim bytes, and every word at least 5 more.
        let needed = dim
            .checked_mul(4)
            .and_then(|row| n.checked_mul(row + 5)?.checked_add(buckets.checked_mul(row)?))
            .and_then(|b| b.checked_add(8 + 4 + 40 + 4));
        let what = format!("a header of {n} words and {buckets} n-gram rows of dimension {dim}");
        farout_data::check_len(path, None, needed, file_len, &what)?;
        if dim == 0 || (maxn > 0 && !(1..=maxn).contains(&minn)) {
            return Err(bad(format!("invalid header: dimension {dim}, n-grams of {minn} to {maxn} characters")));
        }
        let (n, dim, buckets) = (n as usize, dim as usize, buckets as usize);
        let mut words = Vec::with_capacity(n);
        for i in 0..n {
            let mut len = [0u8; 4];
            r.read_exact(&mut len).map_err(|_| truncated("the words"))?;
            let len = u32::from_le_bytes(len) as u64;
            if len > file_len {
                return Err(bad(format!("word {} has length {len}, longer than the file", i + 1)));
            }
            let mut word = vec![0u8; len as usize];
            r.read_exact(&mut word).map_err(|_| truncated("the words"))?;
            words.push(String::from_utf8(word).map_err(|_| bad(format!("word {} is not valid UTF-8", i + 1)))?);
        }
        let mut matrix = Matrix::zeros(n, dim);
        farout_core::binio::read_f32s(&mut r, matrix.as_mut_slice()).map_err(|_| truncated("the vectors"))?;
        let mut rows = Matrix::zeros(buckets, dim);
        farout_core::binio::read_f32s(&mut r, rows.as_mut_slice()).map_err(|_| truncated("the n-gram rows"))?;
        let computed = r.crc.clone().finalize();
        let mut stored = [0u8; 4];
        r.inner.read_exact(&mut stored).map_err(|_| truncated("the checksum"))?;
        if u32::from_le_bytes(stored) != computed {
            return Err(bad("checksum mismatch: the file is corrupt".into()));
        }
        if r.inner.read(&mut [0u8]).map_err(io(path))? != 0 {
            return Err(bad("bytes after the checksum: the file is corrupt".into()));
        }
        let ngrams = NgramTable::new(minn as usize, maxn as usize, rows);
        Vectors::new(words, matrix).and_then(|v| v.with_ngrams(ngrams)).map_err(|e| bad(e.to_string()))
    }
}

/// The error of a failed read of line `line` of a text file: invalid UTF-8 says which formats
/// are binary, since a binary file read as text fails that way.
fn not_text(path: &Path, line: usize) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| {
        if e.kind() == std::io::ErrorKind::InvalidData {
            parse_err(
                path,
                line,
                "not valid UTF-8, so not a word2vec text file: word2vec binary files are read from names ending \
                 in .bin, farout models from names ending in .model",
            )
        } else {
            io(path)(e)
        }
    }
}

/// An error naming the first word of `v` (read from `path`) whose vector holds NaN or an
/// infinity, or saying that an n-gram row does.
fn check_finite(path: &Path, format: Format, v: &Vectors) -> Result<(), Error> {
    let m = v.matrix();
    let mut bad = (0..m.rows()).filter(|&i| m.row(i).iter().any(|x| !x.is_finite()));
    if let Some(first) = bad.next() {
        let line = if format == Format::Text { format!(", line {}", first + 2) } else { String::new() };
        return Err(format_err(
            path,
            format!(
                "{} of {} vectors hold NaN or infinite values (the first: `{}`{line}); the model diverged or the \
                 file is corrupt",
                bad.count() + 1,
                m.rows(),
                v.words()[first]
            ),
        ));
    }
    if v.ngrams().is_some_and(|t| t.as_slice().iter().any(|x| !x.is_finite())) {
        return Err(format_err(
            path,
            "n-gram rows hold NaN or infinite values; the model diverged or the file is corrupt",
        ));
    }
    Ok(())
}

/// A writer that hashes what goes through it.
struct Crc32Writer<W> {
    inner: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Write for Crc32Writer<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes what goes through it.
struct Crc32Reader<R> {
    inner: R,
    crc: crc32fast::Hasher,
}

impl<R: Read> Read for Crc32Reader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }
}

/// An error naming the first word of `words` given twice, when `ids` (their map) holds fewer.
fn check_distinct(words: &[String], ids: &WordIds) -> Result<(), Error> {
    if ids.len() == words.len() {
        return Ok(());
    }
    Err(Error::Vectors { msg: format!("word {:?} appears twice", WordIds::first_repeat(words).unwrap_or("")) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vectors<'static> {
        let m = Matrix::from_vec(3, 2, vec![0.5, -1.25, 1e-7, 3.0e8, -0.0, f32::MIN_POSITIVE]).unwrap();
        Vectors::new(vec!["the".into(), "día".into(), "x'y".into()], m).unwrap()
    }

    #[test]
    fn nan_vectors_npy_files_and_binary_read_as_text_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let m = Matrix::from_vec(3, 2, vec![0.5, 1.0, f32::NAN, 0.0, 1.0, f32::INFINITY]).unwrap();
        let v = Vectors::new(vec!["the".into(), "cat".into(), "dog".into()], m).unwrap();
        for (name, format, line) in [("v.txt", Format::Text, ", line 3"), ("v.bin", Format::Binary, "")] {
            let p = dir.path().join(name);
            v.save(&p, format).unwrap();
            let e = Vectors::load(&p, format).unwrap_err().to_string();
            let want = format!("{name}: 2 of 3 vectors hold NaN or infinite values (the first: `cat`{line})");
            assert!(e.contains(&want), "{e}");
        }
        let npy = dir.path().join("w.npy");
        farout_data::npy::write_f32_matrix(&npy, &Matrix::zeros(2, 2)).unwrap();
        let e = Vectors::load(&npy, Format::from_path(&npy)).unwrap_err().to_string();
        assert!(e.contains("w.npy: a numpy .npy array, not word vectors"), "{e}");
        let bin = dir.path().join("v.vec");
        sample().save(&bin, Format::Binary).unwrap();
        std::fs::write(&bin, [&b"3 2\n\xff\xfe"[..], &std::fs::read(&bin).unwrap()[4..]].concat()).unwrap();
        let e = Vectors::load(&bin, Format::Text).unwrap_err().to_string();
        assert!(e.contains("v.vec:2: not valid UTF-8, so not a word2vec text file"), "{e}");
    }

    /// Vectors of a vocabulary borrow its words and ids (no copy), look words up and save as
    /// copied words do, and a vocabulary read from a file with a word twice is refused.
    #[test]
    fn vectors_of_a_vocabulary_borrow_its_words() {
        let counts = [("the", 9u64), ("cat", 5), ("día", 5)].map(|(w, n)| (w.to_string(), n));
        let vocab = Vocab::from_counts(counts, 1, 0);
        let m = Matrix::from_vec(3, 2, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let v = Vectors::of_vocab(&vocab, Cow::Borrowed(&m)).unwrap();
        assert_eq!(v.words().as_ptr(), vocab.words().as_ptr());
        assert!(matches!((&v.words, &v.ids), (Cow::Borrowed(_), Cow::Borrowed(_))));
        assert_eq!((v.id("día"), v.get("cat"), v.id("dog")), (Some(2), Some(&[3.0, 4.0][..]), None));
        let copied = Vectors::borrowed(vocab.words().to_vec(), &m).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.bin"), dir.path().join("b.bin"));
        v.save(&a, Format::Binary).unwrap();
        copied.save(&b, Format::Binary).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        let file = dir.path().join("vocab.txt");
        std::fs::write(&file, "the 9\ncat 5\ncat 5\n").unwrap();
        let twice = Vocab::load(&file).unwrap();
        let e = Vectors::of_vocab(&twice, Cow::Owned(Matrix::zeros(3, 2))).unwrap_err().to_string();
        assert!(e.contains("\"cat\" appears twice"), "{e}");
        assert!(Vectors::of_vocab(&vocab, Cow::Owned(Matrix::zeros(2, 2))).is_err());
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

    fn with_ngrams() -> Vectors<'static> {
        let rows = Matrix::from_vec(5, 2, (0..10).map(|i| i as f32 - 4.5).collect()).unwrap();
        sample().with_ngrams(NgramTable::new(2, 3, rows)).unwrap()
    }

    #[test]
    fn the_model_format_round_trips_with_its_ngram_rows() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v.model");
        assert_eq!(Format::from_path(&p), Format::Model);
        for v in [sample(), with_ngrams()] {
            v.save(&p, Format::Model).unwrap();
            let back = Vectors::load(&p, Format::Model).unwrap();
            assert_eq!(back, v);
        }
        // Known words keep their vector; unknown ones get their n-grams' mean, or nothing.
        let v = Vectors::load(&p, Format::Model).unwrap();
        let mut out = [0.0; 2];
        assert_eq!(v.vector("día", &mut out), Lookup::Known);
        assert_eq!(out, [1e-7, 3.0e8]);
        assert_eq!(v.vector("unseen", &mut out), Lookup::FromNgrams);
        let mut want = [0.0; 2];
        assert!(v.ngrams().unwrap().oov_vector("unseen", &mut want));
        assert_eq!(out, want);
        assert_eq!(sample().vector("unseen", &mut out), Lookup::Missing);
        assert_eq!(out, [0.0, 0.0]);
    }

    #[test]
    fn corrupt_and_truncated_models_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v.model");
        with_ngrams().save(&p, Format::Model).unwrap();
        let good = std::fs::read(&p).unwrap();
        let load = |bytes: &[u8]| {
            std::fs::write(&p, bytes).unwrap();
            Vectors::load(&p, Format::Model).unwrap_err().to_string()
        };
        let mut flipped = good.clone();
        let at = good.len() - 12;
        flipped[at] ^= 1;
        assert!(load(&flipped).contains("checksum mismatch"), "{}", load(&flipped));
        for cut in [3, 20, good.len() - 30, good.len() - 1] {
            let msg = load(&good[..cut]);
            assert!(msg.contains("truncated") || msg.contains("needs at least"), "cut {cut}: {msg}");
        }
        assert!(load(b"FOLINMDL\x01\x00\x00\x00").contains("wrong magic"));
        let mut v2 = good.clone();
        v2[8] = 2;
        assert!(load(&v2).contains("format version 2"));
        let mut longer = good.clone();
        longer.push(0);
        assert!(load(&longer).contains("bytes after the checksum"));
    }
}
