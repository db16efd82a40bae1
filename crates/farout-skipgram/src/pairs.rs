//! From text to skip-gram training pairs, the same way for every trainer: vocabulary lookup,
//! frequent-word subsampling, then every (context, centre) pair within a window drawn uniformly
//! from 1..=window around each centre (word2vec's dynamic window, which weights near contexts
//! more).

use crate::Error;
use farout_core::Rng;
use farout_core::rng::{self, RngExt};
use farout_data::corpus::{TextSpec, Vocab, for_each_line};
use std::path::Path;

/// Appends the ids of `text`'s vocabulary words that survive subsampling (keep probabilities
/// `keep`) to `out`; returns the number of vocabulary words read.
#[inline]
pub fn subsample(text: &str, vocab: &Vocab, keep: &[f32], rng: &mut Rng, out: &mut Vec<u32>) -> u64 {
    let mut words = 0;
    for tok in text.split_whitespace() {
        if let Some(id) = vocab.id(tok) {
            words += 1;
            let p = keep[id as usize];
            if p >= 1.0 || rng.random::<f32>() < p {
                out.push(id);
            }
        }
    }
    words
}

/// Calls `f(rng, context, centre)` for every pair of `sentence` (dynamic windows drawn from
/// `rng`, which `f` may use too).
#[inline]
pub fn for_each_pair(sentence: &[u32], window: usize, rng: &mut Rng, mut f: impl FnMut(&mut Rng, u32, u32)) {
    let n = sentence.len();
    for pos in 0..n {
        let b = rng.random_range(1..=window);
        for c in pos.saturating_sub(b)..(pos + b + 1).min(n) {
            if c != pos {
                f(rng, sentence[c], sentence[pos]);
            }
        }
    }
}

/// Calls `f(rng, contexts, centre)` for every word of `sentence` that has a context: the words
/// within a dynamic window drawn from `rng` as [`for_each_pair`] draws it (CBOW's input).
#[inline]
pub fn for_each_window(sentence: &[u32], window: usize, rng: &mut Rng, mut f: impl FnMut(&mut Rng, &[u32], u32)) {
    let n = sentence.len();
    let mut contexts = Vec::with_capacity(2 * window);
    for pos in 0..n {
        let b = rng.random_range(1..=window);
        contexts.clear();
        let around = pos.saturating_sub(b)..(pos + b + 1).min(n);
        contexts.extend(around.filter(|&c| c != pos).map(|c| sentence[c]));
        if !contexts.is_empty() {
            f(rng, &contexts, sentence[pos]);
        }
    }
}

/// The first `max_pairs` pairs of `corpus` (all when 0), as training would draw them with
/// `seed`: a fixed sample for evaluating the objective.
pub fn sample_pairs(
    corpus: &Path,
    spec: &TextSpec,
    vocab: &Vocab,
    window: usize,
    seed: u64,
    max_pairs: usize,
) -> Result<Vec<(u32, u32)>, Error> {
    let keep = vocab.keep_probs(spec.subsample, spec.t);
    let mut rng = rng::seeded(seed, u64::MAX - 1);
    let (mut sentence, mut pairs) = (Vec::new(), Vec::new());
    let limit = if max_pairs == 0 { usize::MAX } else { max_pairs };
    for_each_line(
        corpus,
        0..u64::MAX,
        spec.lowercase,
        |_, text| {
            sentence.clear();
            subsample(text, vocab, &keep, &mut rng, &mut sentence);
            for_each_pair(&sentence, window, &mut rng, |_, x, y| pairs.push((x, y)));
            pairs.len() < limit
        },
        |_| true,
    )?;
    pairs.truncate(limit);
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_dynamic_and_symmetric() {
        let sentence: Vec<u32> = (0..50).collect();
        let mut rng = farout_core::rng::seeded(1, 0);
        let mut dist = [0usize; 6];
        let mut n = 0;
        for _ in 0..200 {
            for_each_pair(&sentence, 5, &mut rng, |_, x, y| {
                let d = (x as i64 - y as i64).unsigned_abs() as usize;
                assert!((1..=5).contains(&d));
                dist[d] += 1;
                n += 1;
            });
        }
        // P(distance d is used) = (6 - d) / 5 for a window drawn from 1..=5.
        let per_word = n as f64 / (200.0 * 50.0);
        assert!((per_word - 6.0).abs() < 0.3, "{per_word} pairs per word, expected about 2 x 3");
        for d in 1..5 {
            assert!(dist[d] > dist[d + 1], "{dist:?}");
        }
    }
}
