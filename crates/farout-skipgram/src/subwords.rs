//! Subword input vectors (Bojanowski et al. 2017), built exactly as fastText builds them.
//!
//! A word `w` is seen as `<w>` and cut into its character n-grams of `minn..=maxn` characters
//! (not bytes: a multi-byte UTF-8 character counts once), leaving out the one-character grams
//! `<` and `>`. Each n-gram `g` is hashed into one of `buckets` rows after the vocabulary's:
//! row `words + fnv1a(g) mod buckets`. A vocabulary word's input vector is the mean of its own
//! row and its n-grams' rows,
//!
//! `u_w = (1 / (1 + |G_w|)) (U[w] + sum_{g in G_w} U[words + h(g)])`,
//!
//! and a word outside the vocabulary gets the mean of its n-grams' rows alone (fastText's
//! `getWordVector`; the sum that the paper writes, up to a scale that cosine similarity
//! ignores). Training takes the gradient step `e` on `u_w` and adds all of it to every one of
//! those rows, as fastText's skip-gram and CBOW do (it is not divided by the number of rows).
//!
//! The hash is fastText's 32-bit FNV-1a, including its sign extension of bytes >= 0x80, so a
//! word's n-grams land in the same buckets as in fastText (tested against fastText 0.9.2's own
//! bucket numbers).

use farout_core::{Matrix, kernels};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// fastText's n-gram hash: 32-bit FNV-1a over the bytes, each byte sign-extended first (C's
/// `uint32_t(int8_t(c))`), which only changes bytes >= 0x80.
#[inline]
pub fn hash(bytes: &[u8]) -> u32 {
    let mut h: u32 = 2_166_136_261;
    for &b in bytes {
        h ^= b as i8 as i32 as u32;
        h = h.wrapping_mul(16_777_619);
    }
    h
}

/// The n-gram settings (`model.skip_gram.minn`, `maxn`, `buckets`); `maxn = 0` turns
/// subwords off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NgramSpec {
    /// Shortest n-gram, in characters.
    pub minn: usize,
    /// Longest n-gram, in characters (0: no subwords).
    pub maxn: usize,
    /// Rows the n-grams are hashed into.
    pub buckets: usize,
}

impl NgramSpec {
    /// Whether words have n-grams at all.
    pub fn enabled(&self) -> bool {
        self.maxn > 0 && self.buckets > 0
    }

    /// Calls `f` with the bytes of every n-gram of `<word>`, in fastText's order: by start
    /// character, then by length.
    pub fn for_each_ngram(&self, word: &str, mut f: impl FnMut(&[u8])) {
        if !self.enabled() {
            return;
        }
        let mut padded = Vec::with_capacity(word.len() + 2);
        padded.push(b'<');
        padded.extend_from_slice(word.as_bytes());
        padded.push(b'>');
        let continuation = |b: u8| b & 0xC0 == 0x80;
        for i in 0..padded.len() {
            if continuation(padded[i]) {
                continue;
            }
            let (mut j, mut n) = (i, 1);
            while j < padded.len() && n <= self.maxn {
                j += 1;
                while j < padded.len() && continuation(padded[j]) {
                    j += 1;
                }
                if n >= self.minn && !(n == 1 && (i == 0 || j == padded.len())) {
                    f(&padded[i..j]);
                }
                n += 1;
            }
        }
    }

    /// Appends the bucket (0-based, before adding the vocabulary size) of each n-gram of
    /// `word` to `out`.
    pub fn buckets_of(&self, word: &str, out: &mut Vec<u32>) {
        let buckets = self.buckets as u32;
        self.for_each_ngram(word, |g| out.push(hash(g) % buckets));
    }
}

/// Every vocabulary word's input rows: its own row, then its n-grams' rows.
#[derive(Clone, Debug)]
pub struct Subwords {
    spec: NgramSpec,
    words: usize,
    /// Word `i`'s rows are `rows[offsets[i]..offsets[i + 1]]`.
    offsets: Vec<usize>,
    rows: Vec<u32>,
}

impl Subwords {
    /// The rows of `words` (the vocabulary, in id order) under `spec`. Without n-grams, every
    /// word has its own row only.
    pub fn new(words: &[String], spec: NgramSpec) -> Self {
        let mut offsets = Vec::with_capacity(words.len() + 1);
        let mut rows = Vec::new();
        let mut grams = Vec::new();
        offsets.push(0);
        for (i, w) in words.iter().enumerate() {
            rows.push(i as u32);
            grams.clear();
            spec.buckets_of(w, &mut grams);
            rows.extend(grams.iter().map(|&b| words.len() as u32 + b));
            offsets.push(rows.len());
        }
        Self { spec, words: words.len(), offsets, rows }
    }

    /// The n-gram settings.
    pub fn spec(&self) -> NgramSpec {
        self.spec
    }

    /// Rows of the input table: the words' and the buckets'.
    pub fn table_rows(&self) -> usize {
        self.words + if self.spec.enabled() { self.spec.buckets } else { 0 }
    }

    /// The input rows of vocabulary word `id`.
    #[inline]
    pub fn rows(&self, id: u32) -> &[u32] {
        let i = id as usize;
        &self.rows[self.offsets[i]..self.offsets[i + 1]]
    }

    /// The vocabulary's input vectors: each word's rows of `input` averaged.
    pub fn word_vectors(&self, input: &Matrix) -> Matrix {
        let mut out = Matrix::zeros(self.words, input.cols());
        for w in 0..self.words {
            mean_of_rows(input.as_slice(), input.cols(), self.rows(w as u32), out.row_mut(w));
        }
        out
    }
}

/// `out` = the mean of `rows` of the rows of length `dim` in `data` (zero for no rows).
fn mean_of_rows(data: &[f32], dim: usize, rows: &[u32], out: &mut [f32]) {
    out.fill(0.0);
    for &r in rows {
        let r = r as usize;
        kernels::axpy(1.0, &data[r * dim..(r + 1) * dim], out);
    }
    if rows.len() > 1 {
        let inv = 1.0 / rows.len() as f32;
        out.iter_mut().for_each(|x| *x *= inv);
    }
}

/// The n-gram rows of words outside the vocabulary: an input table's bucket rows with their
/// settings, enough to give any word a vector. They are owned (read from a file) or borrowed
/// (the rows after the words' in a table being trained).
#[derive(Clone, Debug, PartialEq)]
pub struct NgramTable<'a> {
    /// Shortest n-gram, in characters.
    pub minn: usize,
    /// Longest n-gram.
    pub maxn: usize,
    dim: usize,
    /// One row of `dim` values per bucket.
    rows: Cow<'a, [f32]>,
}

impl NgramTable<'static> {
    /// The table of `buckets`, one row per bucket.
    pub fn new(minn: usize, maxn: usize, buckets: Matrix) -> Self {
        let dim = buckets.cols();
        Self { minn, maxn, dim, rows: Cow::Owned(buckets.into_vec()) }
    }
}

impl<'a> NgramTable<'a> {
    /// The table of the rows of length `dim` in `rows`, borrowed.
    pub fn borrowed(minn: usize, maxn: usize, dim: usize, rows: &'a [f32]) -> Self {
        assert!(dim > 0 && rows.len().is_multiple_of(dim), "whole rows of length {dim}");
        Self { minn, maxn, dim, rows: Cow::Borrowed(rows) }
    }

    /// Rows (buckets).
    pub fn buckets(&self) -> usize {
        self.rows.len().checked_div(self.dim).unwrap_or(0)
    }

    /// Length of a row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The rows, one after the other.
    pub fn as_slice(&self) -> &[f32] {
        &self.rows
    }

    /// The settings.
    pub fn spec(&self) -> NgramSpec {
        NgramSpec { minn: self.minn, maxn: self.maxn, buckets: self.buckets() }
    }

    /// The vector of a word outside the vocabulary, the mean of its n-grams' rows, into `out`;
    /// `false` (and `out` untouched) if the word has no n-gram.
    pub fn oov_vector(&self, word: &str, out: &mut [f32]) -> bool {
        let mut rows = Vec::new();
        self.spec().buckets_of(word, &mut rows);
        if rows.is_empty() {
            return false;
        }
        mean_of_rows(&self.rows, self.dim, &rows, out);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_core::rng::{self, RngExt};

    const FASTTEXT: NgramSpec = NgramSpec { minn: 3, maxn: 6, buckets: 2_000_000 };

    fn grams(spec: NgramSpec, word: &str) -> Vec<String> {
        let mut out = Vec::new();
        spec.for_each_ngram(word, |g| out.push(String::from_utf8(g.to_vec()).unwrap()));
        out
    }

    /// fastText 0.9.2 (`fasttext.train_unsupervised(..., minn=3, maxn=6, bucket=2000000)`,
    /// then `get_subwords(word)`, ids minus the vocabulary size): n-grams in order, with their
    /// buckets. `naïve` and `日本` check the character (not byte) lengths and the sign-extended
    /// hash of bytes >= 0x80.
    #[test]
    fn ngrams_and_buckets_are_fasttexts() {
        let cases: [(&str, &[(&str, u32)]); 4] = [
            (
                "where",
                &[
                    ("<wh", 167652),
                    ("<whe", 989715),
                    ("<wher", 1526707),
                    ("<where", 1071586),
                    ("whe", 420941),
                    ("wher", 312621),
                    ("where", 969176),
                    ("where>", 121234),
                    ("her", 1473420),
                    ("here", 1540811),
                    ("here>", 114991),
                    ("ere", 1529033),
                    ("ere>", 1568469),
                    ("re>", 867498),
                ],
            ),
            (
                "naïve",
                &[
                    ("<na", 1806890),
                    ("<naï", 1907692),
                    ("<naïv", 878190),
                    ("<naïve", 933201),
                    ("naï", 1590546),
                    ("naïv", 1719404),
                    ("naïve", 832043),
                    ("naïve>", 156687),
                    ("aïv", 356832),
                    ("aïve", 1223007),
                    ("aïve>", 1505331),
                    ("ïve", 1711570),
                    ("ïve>", 1788548),
                    ("ve>", 1088654),
                ],
            ),
            ("日本", &[("<日本", 758587), ("<日本>", 1313759), ("日本>", 196157)]),
            ("a", &[("<a>", 1087600)]),
        ];
        for (word, want) in cases {
            let names: Vec<&str> = want.iter().map(|w| w.0).collect();
            assert_eq!(grams(FASTTEXT, word), names, "{word}");
            let mut b = Vec::new();
            FASTTEXT.buckets_of(word, &mut b);
            assert_eq!(b, want.iter().map(|w| w.1).collect::<Vec<_>>(), "{word}");
        }
    }

    /// The n-grams against a slow reference: every character window of `<w>` of a length in
    /// `minn..=maxn`, except `<` and `>` alone.
    #[test]
    fn ngrams_match_a_slow_reference() {
        let words = ["", "x", "ab", "über", "日本語テキスト", "antidisestablishment", "a>b<c"];
        for spec in [(1, 1), (1, 3), (2, 4), (3, 6), (5, 5), (4, 20)] {
            let spec = NgramSpec { minn: spec.0, maxn: spec.1, buckets: 7 };
            for w in words {
                let chars: Vec<char> = format!("<{w}>").chars().collect();
                let mut want = Vec::new();
                for i in 0..chars.len() {
                    for n in spec.minn..=spec.maxn {
                        let Some(g) = chars.get(i..i + n) else { continue };
                        if n == 1 && (i == 0 || i + 1 == chars.len()) {
                            continue;
                        }
                        want.push(g.iter().collect::<String>());
                    }
                }
                assert_eq!(grams(spec, w), want, "{w} {spec:?}");
            }
        }
        assert!(grams(NgramSpec { minn: 3, maxn: 0, buckets: 10 }, "word").is_empty());
    }

    #[test]
    fn the_hash_is_fnv1a_with_sign_extended_bytes() {
        // FNV-1a of the empty string and of "a" (unsigned bytes: the standard values).
        assert_eq!(hash(b""), 0x811c9dc5);
        assert_eq!(hash(b"a"), 0xe40c292c);
        // A byte >= 0x80 is xored as 0xffffff80 | b.
        let h = (2_166_136_261u32 ^ 0xffff_ffc3).wrapping_mul(16_777_619);
        assert_eq!(hash(&[0xc3]), h);
    }

    /// A word's rows and vectors against a slow reference that sums the rows by hand; an
    /// out-of-vocabulary word gets the mean of its n-grams' bucket rows.
    #[test]
    fn word_and_oov_vectors_average_their_rows() {
        let spec = NgramSpec { minn: 2, maxn: 3, buckets: 11 };
        let words: Vec<String> = ["cat", "cats", "dog"].map(String::from).to_vec();
        let sw = Subwords::new(&words, spec);
        assert_eq!(sw.table_rows(), 3 + 11);
        let mut r = rng::seeded(3, 0);
        let dim = 5;
        let input = Matrix::from_vec(14, dim, (0..14 * dim).map(|_| r.random::<f32>() - 0.5).collect()).unwrap();
        let vectors = sw.word_vectors(&input);
        for (i, w) in words.iter().enumerate() {
            let mut rows = vec![i];
            for g in grams(spec, w) {
                rows.push(3 + (hash(g.as_bytes()) % 11) as usize);
            }
            assert_eq!(sw.rows(i as u32).iter().map(|&r| r as usize).collect::<Vec<_>>(), rows);
            for c in 0..dim {
                let want = rows.iter().map(|&r| input.row(r)[c] as f64).sum::<f64>() / rows.len() as f64;
                assert!((vectors.row(i)[c] as f64 - want).abs() < 1e-6, "{w} {c}");
            }
        }
        let table = NgramTable::borrowed(2, 3, dim, &input.as_slice()[3 * dim..]);
        assert_eq!(table.buckets(), 11);
        let mut v = vec![0.0; dim];
        assert!(table.oov_vector("cow", &mut v));
        let g = grams(spec, "cow");
        assert_eq!(g, ["<c", "<co", "co", "cow", "ow", "ow>", "w>"]);
        for (c, &got) in v.iter().enumerate() {
            let want = g.iter().map(|g| input.row(3 + (hash(g.as_bytes()) % 11) as usize)[c] as f64).sum::<f64>()
                / g.len() as f64;
            assert!((got as f64 - want).abs() < 1e-6);
        }
        let none = NgramTable::new(5, 6, Matrix::zeros(11, dim));
        assert!(!none.oov_vector("ab", &mut v), "`<ab>` has no 5-gram");
    }

    #[test]
    fn without_ngrams_every_word_is_its_own_row() {
        let words: Vec<String> = ["a", "b"].map(String::from).to_vec();
        let sw = Subwords::new(&words, NgramSpec { minn: 3, maxn: 0, buckets: 100 });
        assert_eq!((sw.rows(0), sw.rows(1), sw.table_rows()), (&[0u32][..], &[1u32][..], 2));
    }
}
