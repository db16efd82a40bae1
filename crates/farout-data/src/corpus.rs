//! Plain-text corpora for word embeddings: one sentence per line, tokens separated by
//! whitespace (the One Billion Word benchmark's format).
//!
//! Files are never loaded whole: [`split_lines`] cuts a file into byte ranges that start at
//! line starts, and each thread streams its own range with [`for_each_line`]. The vocabulary
//! ([`Vocab::build`]) is counted that way in parallel, then sorted by decreasing frequency (ties
//! in order of first appearance, like word2vec and gensim), so id 0 is the most frequent word
//! (what log-uniform proposals and `--restrict` assume).
//!
//! Invalid UTF-8 is handled as [`TextSpec::invalid_utf8`] says: `error` (the default) stops
//! with the file and 1-based line; `skip` drops the line and counts it in [`Vocab::skipped_lines`].

use crate::word_ids::WordIds;
use crate::{Error, Result, io_err};
use farout_core::ParamError;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::Path;

/// What a reader does with a line that is not valid UTF-8.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvalidUtf8 {
    /// Stop with an error naming the file and line.
    #[default]
    Error,
    /// Drop the line (counted).
    Skip,
}

/// Which frequent-word subsampling rule drops tokens during training (t = [`TextSpec::t`],
/// f = the word's relative frequency).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Subsampling {
    /// Keep every token.
    None,
    /// word2vec's C code (and gensim): keep with probability `sqrt(t/f) + t/f`.
    #[default]
    Word2vec,
    /// The LDGS paper and Mikolov et al. (2013b): drop with probability `max(1 - sqrt(t/f), 0)`.
    Paper,
}

/// How a text corpus is tokenised and which words form the vocabulary (`[data.text]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TextSpec {
    /// Lower-case every token (Unicode-aware).
    pub lowercase: bool,
    /// Words seen fewer times are dropped.
    pub min_count: u64,
    /// Keep at most this many of the most frequent words (0 = no limit).
    pub max_vocab: usize,
    /// Frequent-word subsampling rule.
    pub subsample: Subsampling,
    /// Subsampling threshold t.
    pub t: f64,
    /// Lines that are not valid UTF-8.
    pub invalid_utf8: InvalidUtf8,
}

impl Default for TextSpec {
    fn default() -> Self {
        Self {
            lowercase: false,
            min_count: 5,
            max_vocab: 0,
            subsample: Subsampling::Word2vec,
            t: 1e-4,
            invalid_utf8: InvalidUtf8::Error,
        }
    }
}

impl TextSpec {
    /// The ranges `farout tune` draws from (keys relative to `[data.text]`): the subsampling
    /// threshold t, log-uniformly over word2vec's usual 1e-5 to 1e-3.
    pub fn search_space(&self) -> Vec<farout_core::space::Dim> {
        vec![farout_core::space::Dim::float_log("t", 1e-5, 1e-3)]
    }

    /// Checks the values; errors name the key relative to `[data.text]`.
    pub fn check(&self) -> std::result::Result<(), ParamError> {
        if self.min_count == 0 {
            return Err(ParamError::message("min_count", "must be >= 1"));
        }
        if !(self.t > 0.0 && self.t < 1.0) {
            return Err(ParamError::message("t", format!("{} must be in (0, 1)", self.t)));
        }
        Ok(())
    }
}

/// Splits `path` into at most `parts` byte ranges of similar size, each starting at a line
/// start and ending after a newline (or at the end of the file). Empty files give no range.
pub fn split_lines(path: &Path, parts: usize) -> Result<Vec<Range<u64>>> {
    let mut f = File::open(path).map_err(io_err(path))?;
    let len = f.metadata().map_err(io_err(path))?.len();
    let parts = parts.max(1) as u64;
    let mut cuts = vec![0u64];
    let mut byte = [0u8; 1];
    for p in 1..parts {
        let mut pos = (len * p / parts).max(*cuts.last().unwrap());
        if pos >= len {
            break;
        }
        // Move to just after the next newline at or after pos - 1 (pos itself may be a start).
        if pos > 0 {
            f.seek(SeekFrom::Start(pos - 1)).map_err(io_err(path))?;
            let mut r = BufReader::new(&mut f);
            loop {
                match r.read(&mut byte).map_err(io_err(path))? {
                    0 => {
                        pos = len;
                        break;
                    }
                    _ if byte[0] == b'\n' => break,
                    _ => pos += 1,
                }
            }
        }
        if pos < len && pos > *cuts.last().unwrap() {
            cuts.push(pos);
        }
    }
    cuts.push(len);
    Ok(cuts.windows(2).filter(|w| w[1] > w[0]).map(|w| w[0]..w[1]).collect())
}

/// Calls `f(line_in_range, text)` for every line of `range` (0-based line numbers counted from
/// the range's start; trailing `\r\n` / `\n` removed). With `lowercase`, ASCII letters are
/// lower-cased in place and other text through `str::to_lowercase`. Lines that are not valid
/// UTF-8 are passed to `bad(line_in_range)`, which says whether to go on. Returns the number
/// of lines read. `f` returns `false` to stop early.
pub fn for_each_line(
    path: &Path,
    range: Range<u64>,
    lowercase: bool,
    mut f: impl FnMut(usize, &str) -> bool,
    mut bad: impl FnMut(usize) -> bool,
) -> Result<usize> {
    let mut file = File::open(path).map_err(io_err(path))?;
    file.seek(SeekFrom::Start(range.start)).map_err(io_err(path))?;
    let mut r =
        BufReader::with_capacity(crate::buffer_len(range.end - range.start), file.take(range.end - range.start));
    let mut buf = Vec::with_capacity(4096);
    let mut lower = String::new();
    let mut line = 0;
    loop {
        buf.clear();
        if r.read_until(b'\n', &mut buf).map_err(io_err(path))? == 0 {
            return Ok(line);
        }
        while matches!(buf.last(), Some(b'\n' | b'\r')) {
            buf.pop();
        }
        if lowercase {
            buf.make_ascii_lowercase();
        }
        let go_on = match std::str::from_utf8(&buf) {
            Ok(s) if lowercase && !s.is_ascii() => {
                lower.clear();
                lower.extend(s.chars().flat_map(char::to_lowercase));
                f(line, &lower)
            }
            Ok(s) => f(line, s),
            Err(_) => bad(line),
        };
        line += 1;
        if !go_on {
            return Ok(line);
        }
    }
}

/// Words of a corpus with their counts, most frequent first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Vocab {
    words: Vec<String>,
    counts: Vec<u64>,
    ids: WordIds,
    /// Tokens of the corpus, in the vocabulary or not.
    pub corpus_tokens: u64,
    /// Lines of the corpus.
    pub corpus_lines: u64,
    /// Lines dropped because they were not valid UTF-8 (`invalid_utf8 = "skip"`).
    pub skipped_lines: u64,
}

/// One thread's share of a vocabulary count: per word, its count and the index of its first
/// token in the thread's range.
#[derive(Default)]
struct Counts {
    words: FxHashMap<String, (u64, u64)>,
    tokens: u64,
    lines: usize,
    skipped: u64,
    first_bad: Option<usize>,
}

impl Vocab {
    /// Counts the words of `path` with `threads` threads (each reads a disjoint byte range)
    /// and keeps those `spec` admits.
    pub fn build(path: &Path, spec: &TextSpec, threads: usize) -> Result<Self> {
        spec.check()?;
        let ranges = split_lines(path, threads.max(1))?;
        let skip = spec.invalid_utf8 == InvalidUtf8::Skip;
        let parts: Vec<Result<Counts>> = std::thread::scope(|s| {
            let handles: Vec<_> = ranges
                .iter()
                .map(|range| {
                    let range = range.clone();
                    s.spawn(move || {
                        let mut c = Counts::default();
                        let (mut bad_line, mut skipped) = (None, 0);
                        c.lines = for_each_line(
                            path,
                            range,
                            spec.lowercase,
                            |_, text| {
                                for tok in text.split_whitespace() {
                                    match c.words.get_mut(tok) {
                                        Some((n, _)) => *n += 1,
                                        None => {
                                            c.words.insert(tok.to_owned(), (1, c.tokens));
                                        }
                                    }
                                    c.tokens += 1;
                                }
                                true
                            },
                            |line| {
                                bad_line.get_or_insert(line);
                                skipped += 1;
                                skip
                            },
                        )?;
                        c.first_bad = bad_line;
                        c.skipped = skipped;
                        Ok(c)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("vocabulary thread panicked")).collect()
        });
        // Per word: count, and the corpus position of its first token (ties are ordered by it).
        let mut total = FxHashMap::<String, (u64, u64)>::default();
        let (mut tokens, mut lines, mut skipped) = (0u64, 0u64, 0u64);
        for part in parts {
            let part = part?;
            if let (Some(local), false) = (part.first_bad, skip) {
                return Err(Error::Parse {
                    path: path.to_path_buf(),
                    line: lines as usize + local + 1,
                    msg: "not valid UTF-8 (set data.text.invalid_utf8 = \"skip\" to drop such lines)".into(),
                });
            }
            skipped += part.skipped;
            for (w, (n, first)) in part.words {
                let e = total.entry(w).or_insert((0, tokens + first));
                e.0 += n;
            }
            tokens += part.tokens;
            lines += part.lines as u64;
        }
        let mut by_first: Vec<(String, (u64, u64))> = total.into_iter().collect();
        by_first.sort_unstable_by_key(|(_, (_, first))| *first);
        let mut v = Self::from_counts(by_first.into_iter().map(|(w, (n, _))| (w, n)), spec.min_count, spec.max_vocab);
        v.corpus_tokens = tokens;
        v.corpus_lines = lines;
        v.skipped_lines = skipped;
        Ok(v)
    }

    /// The vocabulary of words counted at least `min_count` times, at most `max_vocab` of them
    /// (0 = all), sorted by decreasing count; ties keep the order of `counts` ([`Self::build`]
    /// gives words in order of first appearance, as word2vec and gensim order them).
    pub fn from_counts(counts: impl IntoIterator<Item = (String, u64)>, min_count: u64, max_vocab: usize) -> Self {
        let mut kept: Vec<(String, u64)> = counts.into_iter().filter(|(_, n)| *n >= min_count).collect();
        kept.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        if max_vocab > 0 {
            kept.truncate(max_vocab);
        }
        let (words, counts): (Vec<String>, _) = kept.into_iter().unzip();
        let ids = WordIds::new(&words);
        Self { words, counts, ids, ..Self::default() }
    }

    /// Number of words.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// Whether no word was kept.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Id of `word`.
    #[inline]
    pub fn id(&self, word: &str) -> Option<u32> {
        self.ids.get(word)
    }

    /// Every word's id (fewer than [`Self::len`] when a word was given twice).
    pub fn id_map(&self) -> &WordIds {
        &self.ids
    }

    /// The word with id `id`.
    pub fn word(&self, id: u32) -> &str {
        &self.words[id as usize]
    }

    /// All words, most frequent first.
    pub fn words(&self) -> &[String] {
        &self.words
    }

    /// Count of every word, by id.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Corpus tokens that are in the vocabulary.
    pub fn train_tokens(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Probability of keeping each word under `rule` with threshold `t`.
    pub fn keep_probs(&self, rule: Subsampling, t: f64) -> Vec<f32> {
        let total = self.train_tokens().max(1) as f64;
        self.counts
            .iter()
            .map(|&n| {
                let r = t / (n as f64 / total);
                let p = match rule {
                    Subsampling::None => 1.0,
                    Subsampling::Word2vec => r.sqrt() + r,
                    Subsampling::Paper => r.sqrt(),
                };
                p.min(1.0) as f32
            })
            .collect()
    }

    /// Writes `word count` lines, most frequent first.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut w = std::io::BufWriter::new(File::create(path).map_err(io_err(path))?);
        for (word, n) in self.words.iter().zip(&self.counts) {
            writeln!(w, "{word} {n}").map_err(io_err(path))?;
        }
        w.flush().map_err(io_err(path))
    }

    /// Reads what [`Self::save`] wrote.
    pub fn load(path: &Path) -> Result<Self> {
        let r = BufReader::new(File::open(path).map_err(io_err(path))?);
        let mut counts = Vec::new();
        for (i, line) in r.lines().enumerate() {
            let line = line.map_err(io_err(path))?;
            let parse = || {
                let (w, n) = line.rsplit_once(' ')?;
                Some((w.to_owned(), n.parse::<u64>().ok()?))
            };
            let entry = parse().ok_or_else(|| Error::Parse {
                path: path.to_path_buf(),
                line: i + 1,
                msg: format!("expected `word count`, found {line:?}"),
            })?;
            counts.push(entry);
        }
        let v = Self::from_counts(counts.iter().cloned(), 0, 0);
        if v.words.iter().zip(&counts).any(|(w, (cw, _))| w != cw) {
            return Err(Error::Format { path: path.to_path_buf(), msg: "words are not sorted by count".into() });
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    #[test]
    fn ranges_cover_the_file_at_line_starts() {
        let text: String = (0..500).map(|i| format!("line {i} {}\n", "x".repeat(i % 17))).collect();
        let f = file(text.as_bytes());
        for parts in [1, 2, 3, 7, 64, 10_000] {
            let ranges = split_lines(f.path(), parts).unwrap();
            assert!(ranges.len() <= parts);
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges.last().unwrap().end, text.len() as u64);
            let mut lines = Vec::new();
            for (i, r) in ranges.iter().enumerate() {
                if i > 0 {
                    assert_eq!(r.start, ranges[i - 1].end);
                    assert_eq!(text.as_bytes()[r.start as usize - 1], b'\n');
                }
                for_each_line(
                    f.path(),
                    r.clone(),
                    false,
                    |_, l| {
                        lines.push(l.to_owned());
                        true
                    },
                    |_| false,
                )
                .unwrap();
            }
            let expected: Vec<&str> = text.lines().collect();
            assert_eq!(lines, expected, "parts = {parts}");
        }
    }

    #[test]
    fn vocabulary_is_counted_sorted_and_cut() {
        let f = file(b"the cat sat on the mat\nThe dog sat\r\n\nthe end");
        let spec = TextSpec { min_count: 2, ..TextSpec::default() };
        for threads in [1, 2, 3] {
            let v = Vocab::build(f.path(), &spec, threads).unwrap();
            assert_eq!(v.words(), ["the", "sat"]);
            assert_eq!(v.counts(), [3, 2]);
            assert_eq!(v.corpus_tokens, 11);
            assert_eq!(v.corpus_lines, 4);
        }
        // Ties in order of first appearance, whatever the number of threads.
        let lower = TextSpec { min_count: 1, lowercase: true, ..TextSpec::default() };
        for threads in [1, 2, 3] {
            let v = Vocab::build(f.path(), &lower, threads).unwrap();
            assert_eq!(v.words(), ["the", "sat", "cat", "on", "mat", "dog", "end"], "{threads} threads");
        }
        let v = Vocab::build(f.path(), &TextSpec { max_vocab: 3, ..lower }, 2).unwrap();
        assert_eq!(v.words(), ["the", "sat", "cat"]);
        assert_eq!(v.id("sat"), Some(1));
        assert_eq!(v.id("dog"), None);
    }

    #[test]
    fn unicode_is_lower_cased() {
        let f = file("Émile ÉMILE émile\n".as_bytes());
        let spec = TextSpec { min_count: 1, lowercase: true, ..TextSpec::default() };
        let v = Vocab::build(f.path(), &spec, 1).unwrap();
        assert_eq!(v.words(), ["émile"]);
        assert_eq!(v.counts(), [3]);
    }

    #[test]
    fn invalid_utf8_names_the_line_or_is_skipped() {
        let f = file(b"good line\nalso good\nbad \xff\xfe line\ngood again\n");
        for threads in [1, 2, 4] {
            let err = Vocab::build(f.path(), &TextSpec { min_count: 1, ..TextSpec::default() }, threads).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(":3: not valid UTF-8"), "{msg}");
            let spec = TextSpec { min_count: 1, invalid_utf8: InvalidUtf8::Skip, ..TextSpec::default() };
            let v = Vocab::build(f.path(), &spec, threads).unwrap();
            assert_eq!(v.skipped_lines, 1);
            assert_eq!(v.corpus_tokens, 6);
            assert_eq!(v.id("bad"), None);
        }
    }

    #[test]
    fn keep_probabilities_follow_the_two_rules() {
        let v = Vocab::from_counts([("a".to_string(), 9_000u64), ("b".to_string(), 1_000)], 1, 0);
        let t = 1e-2;
        // f(a) = 0.9, f(b) = 0.1.
        let w2v = v.keep_probs(Subsampling::Word2vec, t);
        let paper = v.keep_probs(Subsampling::Paper, t);
        let close = |x: f32, y: f64| (x as f64 - y).abs() < 1e-6;
        assert!(close(w2v[0], (t / 0.9).sqrt() + t / 0.9));
        assert!(close(w2v[1], (t / 0.1).sqrt() + t / 0.1));
        assert!(close(paper[0], (t / 0.9).sqrt()));
        assert!(close(paper[1], (0.1f64).sqrt()));
        assert_eq!(v.keep_probs(Subsampling::None, t), [1.0, 1.0]);
    }

    #[test]
    fn vocabulary_round_trips_and_bad_files_name_the_line() {
        let v = Vocab::from_counts([("x".to_string(), 3u64), ("y".to_string(), 7), ("z".to_string(), 1)], 2, 0);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vocab.txt");
        v.save(&p).unwrap();
        let back = Vocab::load(&p).unwrap();
        assert_eq!(back.words(), v.words());
        assert_eq!(back.counts(), v.counts());
        std::fs::write(&p, "y 7\nx three\n").unwrap();
        assert!(Vocab::load(&p).unwrap_err().to_string().contains(":2: expected `word count`"));
    }
}
