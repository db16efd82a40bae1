//! Word-vector evaluation with the usual protocols (those of word2vec's `compute-accuracy` and
//! gensim's `evaluate_word_analogies` / `evaluate_word_pairs`).
//!
//! - **Analogy** (Mikolov et al. 2013a): for `a b c d`, predict
//!   `argmax_w cos(w, b^ - a^ + c^)` over the `restrict` most frequent words (the first rows of
//!   the file), excluding `a`, `b`, `c` (`x^` = x / |x|, "3CosAdd"). Questions with a word outside
//!   the restricted vocabulary are skipped and counted. Words are matched case-insensitively
//!   (the question file is lower-cased against lower-cased vectors, as gensim does).
//! - **Similarity**: Spearman's rank correlation (average ranks for ties) between the cosine of
//!   each pair and the human score. A word outside the vocabulary gets its n-gram vector when
//!   the vectors have n-gram rows (subword models, `.model` files; such pairs are counted as
//!   `oov`); otherwise its pairs are skipped and counted.

use crate::vectors::Vectors;
use crate::{Error, format_err, io_err, parse_err};
use farout_core::{Matrix, gemm, kernels};
use rayon::prelude::*;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::io::BufRead;
use std::path::Path;

/// Accuracy on one section of the analogy file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Section {
    /// Its name (the `: name` line).
    pub name: String,
    /// Questions answered correctly.
    pub correct: usize,
    /// Questions asked (all four words known).
    pub asked: usize,
    /// Questions skipped (a word outside the restricted vocabulary).
    pub skipped: usize,
}

impl Section {
    /// `correct / asked` (0 when nothing was asked).
    pub fn accuracy(&self) -> f64 {
        if self.asked == 0 { 0.0 } else { self.correct as f64 / self.asked as f64 }
    }
}

/// Result of [`analogy`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AnalogyReport {
    /// Accuracy over all asked questions.
    pub accuracy: f64,
    /// Totals over all sections (name `total`).
    pub total: Section,
    /// Candidates considered (the restricted vocabulary's size).
    pub candidates: usize,
    /// Per section, in file order.
    pub sections: Vec<Section>,
}

/// Result of [`similarity`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SimilarityReport {
    /// Spearman's rank correlation.
    pub spearman: f64,
    /// Pearson's correlation.
    pub pearson: f64,
    /// Pairs scored.
    pub pairs: usize,
    /// Pairs skipped (unknown word).
    pub skipped: usize,
    /// Pairs scored with an out-of-vocabulary word's n-gram vector.
    #[serde(default)]
    pub oov: usize,
}

/// Unit-length rows of the first `restrict` words (0 = all) and a lower-cased word index; the
/// first (most frequent) spelling wins when lower-casing merges words.
fn unit_rows(v: &Vectors, restrict: usize) -> (Matrix, FxHashMap<String, usize>) {
    let index = lower_index(v, restrict);
    let n = if restrict == 0 { v.words().len() } else { restrict.min(v.words().len()) };
    let mut m = Matrix::zeros(n, v.matrix().cols());
    for i in 0..n {
        m.row_mut(i).copy_from_slice(v.matrix().row(i));
        kernels::normalize(m.row_mut(i));
    }
    (m, index)
}

/// The lower-cased word index of [`unit_rows`] alone.
fn lower_index(v: &Vectors, restrict: usize) -> FxHashMap<String, usize> {
    let n = if restrict == 0 { v.words().len() } else { restrict.min(v.words().len()) };
    let mut index = FxHashMap::default();
    for (i, w) in v.words()[..n].iter().enumerate() {
        index.entry(w.to_lowercase()).or_insert(i);
    }
    index
}

fn read_lines(path: &Path) -> Result<Vec<String>, Error> {
    let f = std::fs::File::open(path).map_err(io_err(path))?;
    std::io::BufReader::new(f)
        .lines()
        .enumerate()
        .map(|(i, l)| l.map_err(|e| parse_err(path, i + 1, format!("unreadable line: {e}"))))
        .collect()
}

/// The sections of an analogy file in file order: each one's name (its `: name` line) and its
/// questions `a b c d`.
pub type Questions = Vec<(String, Vec<[String; 4]>)>;

/// Reads an analogy file (`: section` lines, then `a b c d` lines; blank lines skipped). A
/// question before the first section, a line of other than four words, or a file without any
/// question is an error naming the file (and line).
pub fn read_questions(path: &Path) -> Result<Questions, Error> {
    let mut sections: Questions = Vec::new();
    for (i, line) in read_lines(path)?.iter().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix(':') {
            sections.push((name.trim().to_owned(), Vec::new()));
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let bad = |msg: String| parse_err(path, i + 1, msg);
        let Ok(q) = <[&str; 4]>::try_from(words.as_slice()) else {
            return Err(bad(format!("expected four words, found {}", words.len())));
        };
        let Some((_, questions)) = sections.last_mut() else {
            return Err(bad("a question before the first `: section` line".into()));
        };
        questions.push(q.map(str::to_owned));
    }
    if sections.iter().all(|(_, q)| q.is_empty()) {
        return Err(format_err(path, "holds no analogy questions (`: section` lines, then `a b c d` lines)"));
    }
    Ok(sections)
}

/// Analogy accuracy of `v` on the questions in `path` (module docs).
pub fn analogy(v: &Vectors, path: &Path, restrict: usize) -> Result<AnalogyReport, Error> {
    let questions = read_questions(path)?;
    let (units, index) = unit_rows(v, restrict);
    let d = units.cols();
    let mut sections: Vec<Section> = Vec::new();
    // (section, [a, b, c, expected]) of the questions asked.
    let mut asked: Vec<(usize, [usize; 4])> = Vec::new();
    for (s, (name, qs)) in questions.iter().enumerate() {
        sections.push(Section { name: name.clone(), ..Section::default() });
        for q in qs {
            match q.each_ref().map(|w| index.get(&w.to_lowercase()).copied()) {
                [Some(a), Some(b), Some(c), Some(e)] => {
                    sections[s].asked += 1;
                    asked.push((s, [a, b, c, e]));
                }
                _ => sections[s].skipped += 1,
            }
        }
    }
    // Score every candidate for a chunk of questions with one matrix product.
    const CHUNK: usize = 256;
    let n = units.rows();
    let mut queries = Matrix::zeros(CHUNK, d);
    let mut scores = vec![0.0f32; CHUNK * n];
    for chunk in asked.chunks(CHUNK) {
        for (q, (_, [a, b, c, _])) in chunk.iter().enumerate() {
            let row = queries.row_mut(q);
            row.copy_from_slice(units.row(*b));
            kernels::axpy(-1.0, units.row(*a), row);
            kernels::axpy(1.0, units.row(*c), row);
        }
        let m = chunk.len();
        gemm::scores(&queries.as_slice()[..m * d], m, units.as_slice(), n, d, &mut scores[..m * n]);
        for (q, &(s, [a, b, c, e])) in chunk.iter().enumerate() {
            let row = &scores[q * n..(q + 1) * n];
            // With fewer than four candidates (a tiny vocabulary) a question may have none left:
            // it is asked and answered wrongly.
            let best = (0..n)
                .filter(|&w| w != a && w != b && w != c)
                .max_by(|&x, &y| row[x].total_cmp(&row[y]).then(y.cmp(&x)));
            if best == Some(e) {
                sections[s].correct += 1;
            }
        }
    }
    let total = Section {
        name: "total".into(),
        correct: sections.iter().map(|s| s.correct).sum(),
        asked: sections.iter().map(|s| s.asked).sum(),
        skipped: sections.iter().map(|s| s.skipped).sum(),
    };
    Ok(AnalogyReport { accuracy: total.accuracy(), total, candidates: n, sections })
}

/// Similarity correlation of `v` with the human scores of `path` (`word1 word2 score` per line,
/// tab or space separated, `#` comments).
pub fn similarity(v: &Vectors, path: &Path) -> Result<SimilarityReport, Error> {
    let index = lower_index(v, 0);
    let (mut model, mut human) = (Vec::new(), Vec::new());
    let (mut skipped, mut oov) = (0, 0);
    let d = v.matrix().cols();
    let (mut a, mut b) = (vec![0.0; d], vec![0.0; d]);
    // The unit vector of a word into `out`; whether it comes from n-grams; `None` if it has none.
    let unit = |word: &str, out: &mut [f32]| -> Option<bool> {
        let word = word.to_lowercase();
        if let Some(&i) = index.get(&word) {
            out.copy_from_slice(v.matrix().row(i));
            kernels::normalize(out);
            return Some(false);
        }
        v.ngrams()?.oov_vector(&word, out).then(|| kernels::normalize(out)).map(|_| true)
    };
    for (w1, w2, score) in read_pairs(path)? {
        match (unit(&w1, &mut a), unit(&w2, &mut b)) {
            (Some(oa), Some(ob)) => {
                model.push(kernels::dot(&a, &b) as f64);
                human.push(score);
                oov += usize::from(oa || ob);
            }
            _ => skipped += 1,
        }
    }
    Ok(SimilarityReport {
        spearman: pearson(&ranks(&model), &ranks(&human)),
        pearson: pearson(&model, &human),
        pairs: model.len(),
        skipped,
        oov,
    })
}

/// Reads a word-pair file: `word1 word2 score` per line, tab or space separated, `#` comments
/// and blank lines skipped. A line of other than three fields, a score that is not a finite
/// number, or a file without any pair is an error naming the file (and line).
pub fn read_pairs(path: &Path) -> Result<Vec<(String, String, f64)>, Error> {
    let mut pairs = Vec::new();
    for (i, line) in read_lines(path)?.iter().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let bad = |msg: String| parse_err(path, i + 1, msg);
        let [w1, w2, score] = f[..] else {
            return Err(bad(format!("expected `word word score`, found {} fields", f.len())));
        };
        let score: f64 = score.parse().map_err(|_| bad(format!("score {score:?} is not a number")))?;
        if !score.is_finite() {
            return Err(bad(format!("score {score} is not finite")));
        }
        pairs.push((w1.to_owned(), w2.to_owned(), score));
    }
    if pairs.is_empty() {
        return Err(format_err(path, "holds no word pairs (`word word score` lines)"));
    }
    Ok(pairs)
}

/// Ranks 1..n with ties given their average rank.
pub fn ranks(x: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && x[order[j + 1]] == x[order[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &o in &order[i..=j] {
            r[o] = avg;
        }
        i = j + 1;
    }
    r
}

/// Pearson's correlation (NaN for fewer than two points or a constant input).
pub fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    sxy / (sxx * syy).sqrt()
}

/// The full-softmax skip-gram loss averaged over `pairs` of (context x, centre y):
/// `mean [log sum_k exp(u_x . v_k) - u_x . v_y]` with `U = input`, `V = output` — the
/// objective (eq. 9 of the LDGS paper, uncollapsed) that sampling and search estimators
/// approximate. Costs one score row per distinct context word.
pub fn softmax_objective(input: &Matrix, output: &Matrix, pairs: &[(u32, u32)]) -> f64 {
    if pairs.is_empty() {
        return f64::NAN;
    }
    let (k, d) = (output.rows(), output.cols());
    let mut sorted = pairs.to_vec();
    sorted.sort_unstable();
    // Distinct contexts, and for each the range of its pairs.
    let mut groups: Vec<(u32, std::ops::Range<usize>)> = Vec::new();
    for (j, &(x, _)) in sorted.iter().enumerate() {
        match groups.last_mut() {
            Some((gx, r)) if *gx == x => r.end = j + 1,
            _ => groups.push((x, j..j + 1)),
        }
    }
    const CHUNK: usize = 128;
    let mut q = Matrix::zeros(CHUNK, d);
    let mut z = vec![0.0f32; CHUNK * k];
    let mut total = 0.0f64;
    for chunk in groups.chunks(CHUNK) {
        for (i, (x, _)) in chunk.iter().enumerate() {
            q.row_mut(i).copy_from_slice(input.row(*x as usize));
        }
        let m = chunk.len();
        gemm::scores(&q.as_slice()[..m * d], m, output.as_slice(), k, d, &mut z[..m * k]);
        total += z[..m * k]
            .par_chunks(k)
            .zip(chunk.par_iter())
            .map(|(row, (_, range))| {
                let lse = kernels::log_sum_exp(row) as f64;
                sorted[range.clone()].iter().map(|&(_, y)| lse - row[y as usize] as f64).sum::<f64>()
            })
            .sum::<f64>();
    }
    total / pairs.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vectors(words: &[(&str, [f32; 3])]) -> Vectors<'static> {
        let data = words.iter().flat_map(|(_, v)| *v).collect();
        Vectors::new(
            words.iter().map(|(w, _)| w.to_string()).collect(),
            Matrix::from_vec(words.len(), 3, data).unwrap(),
        )
        .unwrap()
    }

    /// A hand-made space where king - man + woman = queen exactly, paris - france + italy = rome
    /// and one question has a rarer word than the restriction allows.
    #[test]
    fn analogies_are_answered_by_3cosadd_with_skips() {
        let v = vectors(&[
            ("man", [1.0, 0.0, 0.0]),
            ("woman", [0.0, 1.0, 0.0]),
            ("king", [1.0, 0.0, 1.0]),
            ("queen", [0.0, 1.0, 1.0]),
            ("France", [0.0, 0.0, 1.0]),
            ("paris", [1.0, 1.0, 0.2]),
            ("italy", [0.2, -1.0, 1.0]),
            ("rome", [1.0, 0.0, -0.1]),
            ("berlin", [0.9, 0.9, 0.9]),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("q.txt");
        std::fs::write(
            &p,
            ": family\nman woman king queen\nMan Woman King Queen\nwoman man queen king\n\
             : capitals\nfrance paris italy rome\nfrance paris italy berlin\nparis france rome zzz\n",
        )
        .unwrap();
        let r = analogy(&v, &p, 0).unwrap();
        assert_eq!(r.sections.len(), 2);
        assert_eq!((r.sections[0].correct, r.sections[0].asked, r.sections[0].skipped), (3, 3, 0));
        // Brute force decides the capitals; the second question's expected answer is wrong.
        let brute = |a: &str, b: &str, c: &str| {
            let u = |w: &str| {
                let mut x = v.get(w).or_else(|| v.get("France")).unwrap().to_vec();
                kernels::normalize(&mut x);
                x
            };
            let q: Vec<f32> = (0..3).map(|i| u(b)[i] - u(a)[i] + u(c)[i]).collect();
            v.words()
                .iter()
                .filter(|w| ![a, b, c].contains(&w.to_lowercase().as_str()))
                .max_by(|x, y| kernels::dot(&u(x), &q).total_cmp(&kernels::dot(&u(y), &q)))
                .unwrap()
                .clone()
        };
        assert_eq!(brute("france", "paris", "italy"), "rome");
        assert_eq!((r.sections[1].correct, r.sections[1].asked, r.sections[1].skipped), (1, 2, 1));
        assert_eq!((r.total.correct, r.total.asked, r.total.skipped), (4, 5, 1));
        assert!((r.accuracy - 0.8).abs() < 1e-12);
        // Restricting to the 4 most frequent words skips the capitals entirely.
        let r = analogy(&v, &p, 4).unwrap();
        assert_eq!((r.total.correct, r.total.asked, r.total.skipped, r.candidates), (3, 3, 3, 4));
    }

    #[test]
    fn empty_question_and_pair_files_and_non_finite_scores_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let v = vectors(&[("a", [1.0, 0.0, 0.0]), ("b", [0.0, 1.0, 0.0])]);
        for text in ["", "\n: family\n\n"] {
            let e = analogy(&v, &file("q.txt", text), 0).unwrap_err().to_string();
            assert!(e.ends_with("q.txt: holds no analogy questions (`: section` lines, then `a b c d` lines)"), "{e}");
        }
        // Three words: a question using all of them has no candidate left, and is answered wrongly.
        let v3 = vectors(&[("a", [1.0, 0.0, 0.0]), ("b", [0.0, 1.0, 0.0]), ("c", [0.0, 0.0, 1.0])]);
        let r = analogy(&v3, &file("q.txt", ": s\na b c a\n"), 0).unwrap();
        assert_eq!((r.total.correct, r.total.asked), (0, 1));
        let e = read_questions(&file("q.txt", "a b c d\n")).unwrap_err().to_string();
        assert!(e.ends_with("q.txt:1: a question before the first `: section` line"), "{e}");
        let e = similarity(&v, &file("p.txt", "# only a comment\n")).unwrap_err().to_string();
        assert!(e.ends_with("p.txt: holds no word pairs (`word word score` lines)"), "{e}");
        for (score, shown) in [("nan", "NaN"), ("inf", "inf"), ("-1e999", "-inf")] {
            let e = similarity(&v, &file("p.txt", &format!("a b 1.0\nb a {score}\n"))).unwrap_err().to_string();
            assert!(e.ends_with(&format!("p.txt:2: score {shown} is not finite")), "{e}");
        }
    }

    #[test]
    fn similarity_is_spearman_of_cosines() {
        let v =
            vectors(&[("a", [1.0, 0.0, 0.0]), ("b", [1.0, 1.0, 0.0]), ("c", [0.0, 1.0, 0.0]), ("d", [1.0, 0.1, 0.0])]);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pairs.tsv");
        // cos: a-d 0.995 > a-b 0.707 > a-c 0; human scores in the same order: Spearman 1.
        std::fs::write(&p, "# comment\na\td\t9.5\nA\tb\t5\na\tc\t1\na\tzzz\t3\n").unwrap();
        let r = similarity(&v, &p).unwrap();
        assert_eq!((r.pairs, r.skipped), (3, 1));
        assert!((r.spearman - 1.0).abs() < 1e-12, "{r:?}");
        // Reversed human order: Spearman -1.
        std::fs::write(&p, "a d 1\na b 5\na c 9.5\n").unwrap();
        assert!((similarity(&v, &p).unwrap().spearman + 1.0).abs() < 1e-12);
        std::fs::write(&p, "a d\n").unwrap();
        assert!(similarity(&v, &p).unwrap_err().to_string().contains(":1: expected `word word score`"));
    }

    /// With n-gram rows, an unknown word is scored by its n-gram vector instead of skipped.
    #[test]
    fn similarity_scores_unknown_words_by_their_ngrams() {
        use crate::subwords::NgramTable;
        let v = vectors(&[("a", [1.0, 0.0, 0.0]), ("b", [0.0, 1.0, 0.0])]);
        // Every n-gram row points along (1, 0.1, 0): "zzz" is close to a, far from b.
        let rows = Matrix::from_vec(4, 3, [1.0, 0.1, 0.0].repeat(4)).unwrap();
        let v = v.with_ngrams(NgramTable::new(1, 2, rows)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pairs.tsv");
        std::fs::write(&p, "a ZZZ 9\nb zzz 1\na b 0\n").unwrap();
        let r = similarity(&v, &p).unwrap();
        assert_eq!((r.pairs, r.skipped, r.oov), (3, 0, 2));
        assert!((r.spearman - 1.0).abs() < 1e-12, "{r:?}");
    }

    #[test]
    fn ties_share_their_average_rank() {
        assert_eq!(ranks(&[10.0, 20.0, 10.0, 5.0]), [2.5, 4.0, 2.5, 1.0]);
        let x = [1.0, 2.0, 3.0, 4.0];
        assert!((pearson(&x, &[2.0, 4.0, 6.0, 8.0]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn softmax_objective_matches_a_direct_sum() {
        let input = Matrix::from_vec(3, 2, vec![0.5, -1.0, 2.0, 0.25, -0.5, 1.5]).unwrap();
        let output = Matrix::from_vec(4, 2, vec![1.0, 0.0, 0.0, 1.0, -1.0, 0.5, 0.3, 0.3]).unwrap();
        let pairs: [(u32, u32); 5] = [(0, 1), (2, 3), (0, 0), (1, 2), (0, 1)];
        let direct: f64 = pairs
            .iter()
            .map(|&(x, y)| {
                let z: Vec<f64> = (0..4).map(|k| kernels::dot(input.row(x as usize), output.row(k)) as f64).collect();
                z.iter().map(|v| v.exp()).sum::<f64>().ln() - z[y as usize]
            })
            .sum::<f64>()
            / pairs.len() as f64;
        let fast = softmax_objective(&input, &output, &pairs);
        assert!((fast - direct).abs() < 1e-5, "{fast} vs {direct}");
    }
}
