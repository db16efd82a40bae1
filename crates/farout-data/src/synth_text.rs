//! A synthetic text corpus with word-frequency and co-occurrence structure, for the skip-gram
//! quickstart, tests, and corpora at the One Billion Word benchmark's scale (451 K words,
//! hundreds of millions of tokens) without downloading it.
//!
//! Words `w0, w1, ...` have Zipfian frequencies (`p(r) ~ 1/(r+1)^s`, r the rank) and belong to
//! topics (word r to topic `r mod topics`). Each sentence picks a topic; each token comes from
//! the global Zipf distribution with probability `mix` ("function words") and otherwise from
//! the topic's own Zipf distribution. Words of one topic therefore co-occur, which is what
//! skip-gram learns: [`TextGenSpec::topic_of`] is the ground truth the tests check embeddings
//! against.

use crate::{Result, io_err};
use farout_core::rng::{self, RngExt};
use farout_core::{AliasTable, ParamError};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

/// Parameters of the corpus (`[data.synthetic]` of skip-gram configs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TextGenSpec {
    /// Distinct words.
    pub words: usize,
    /// Tokens in total (approximately: whole sentences).
    pub tokens: u64,
    /// Zipf exponent s.
    pub exponent: f64,
    /// Topics.
    pub topics: usize,
    /// Probability that a token ignores the sentence's topic.
    pub mix: f64,
    /// Shortest sentence.
    pub min_len: usize,
    /// Longest sentence.
    pub max_len: usize,
    /// Seed.
    pub seed: u64,
}

impl Default for TextGenSpec {
    fn default() -> Self {
        Self { words: 5_000, tokens: 2_000_000, exponent: 1.0, topics: 50, mix: 0.3, min_len: 5, max_len: 25, seed: 1 }
    }
}

/// Sentences generated per parallel part (each part has its own random stream).
const PART: u64 = 1 << 14;

impl TextGenSpec {
    /// Bytes of the corpus file, from above: every token written as `w<rank>` and a separator.
    pub fn text_bytes(&self) -> u128 {
        let digits = (self.words.max(1) as f64).log10().floor() as u128 + 1;
        self.tokens as u128 * (digits + 2)
    }

    /// Bytes the generator holds: its alias tables (16 bytes per entry).
    pub fn generator_bytes(&self) -> u128 {
        16 * (self.words as u128 + self.words.div_ceil(self.topics.max(1)) as u128)
    }

    /// Checks the values; errors name the key relative to `[data.synthetic]`.
    pub fn check(&self) -> std::result::Result<(), ParamError> {
        let bad = |name, msg: String| Err(ParamError::message(name, msg));
        if self.topics == 0 || self.words < 2 * self.topics {
            return bad("words", format!("{} must be >= 2 x topics ({})", self.words, self.topics));
        }
        if self.tokens == 0 {
            return bad("tokens", "must be >= 1".into());
        }
        if !(self.exponent >= 0.0 && self.exponent.is_finite()) {
            return bad("exponent", format!("{} must be >= 0", self.exponent));
        }
        if !(0.0..=1.0).contains(&self.mix) {
            return bad("mix", format!("{} must be in [0, 1]", self.mix));
        }
        if self.min_len == 0 || self.max_len < self.min_len {
            return bad("max_len", format!("need 1 <= min_len <= max_len, found {}..{}", self.min_len, self.max_len));
        }
        Ok(())
    }

    /// The topic of word `w<r>`.
    pub fn topic_of(&self, rank: usize) -> usize {
        rank % self.topics
    }

    /// Writes the corpus to `path`, calling `progress(tokens written)` now and then.
    pub fn write(&self, path: &Path, progress: &(dyn Fn(u64) + Sync)) -> Result<u64> {
        // The spec is `[data.synthetic]` of a config: its keys named in full, as the config's.
        self.check().map_err(|e| e.under("data.synthetic"))?;
        let zipf =
            |n: usize| AliasTable::new(&(0..n).map(|r| (r as f64 + 1.0).powf(-self.exponent)).collect::<Vec<_>>());
        let global = zipf(self.words).expect("words >= 2");
        let per_topic = self.words.div_ceil(self.topics);
        let local = zipf(per_topic).expect("per_topic >= 2");
        let mean_len = (self.min_len + self.max_len) as u64 / 2;
        let sentences = self.tokens.div_ceil(mean_len.max(1));
        let parts = sentences.div_ceil(PART);
        let mut w = std::io::BufWriter::with_capacity(1 << 22, std::fs::File::create(path).map_err(io_err(path))?);
        let mut written = 0u64;
        // Generate a batch of parts in parallel, write them in order.
        let batch = 4 * rayon::current_num_threads() as u64;
        for first in (0..parts).step_by(batch as usize) {
            let texts: Vec<(String, u64)> = (first..(first + batch).min(parts))
                .into_par_iter()
                .map(|p| {
                    let mut r = rng::seeded(self.seed, p);
                    let mut text = String::with_capacity((PART * mean_len * 7) as usize);
                    let mut tokens = 0u64;
                    let n = PART.min(sentences - p * PART);
                    for _ in 0..n {
                        let topic = r.random_range(0..self.topics);
                        let len = r.random_range(self.min_len..=self.max_len);
                        for i in 0..len {
                            let word = loop {
                                let w = if r.random::<f64>() < self.mix {
                                    global.sample(&mut r) as usize
                                } else {
                                    topic + self.topics * local.sample(&mut r) as usize
                                };
                                if w < self.words {
                                    break w;
                                }
                            };
                            if i > 0 {
                                text.push(' ');
                            }
                            text.push('w');
                            text.push_str(itoa(word, &mut [0u8; 20]));
                        }
                        text.push('\n');
                        tokens += len as u64;
                    }
                    (text, tokens)
                })
                .collect();
            for (text, tokens) in texts {
                w.write_all(text.as_bytes()).map_err(io_err(path))?;
                written += tokens;
            }
            progress(written);
        }
        w.flush().map_err(io_err(path))?;
        Ok(written)
    }
}

/// Decimal digits of `x` (no allocation).
fn itoa(mut x: usize, buf: &mut [u8; 20]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (x % 10) as u8;
        x /= 10;
        if x == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[i..]).expect("digits are ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::{TextSpec, Vocab};

    #[test]
    fn corpus_has_the_requested_size_zipf_order_and_topics() {
        let spec = TextGenSpec { words: 400, tokens: 200_000, topics: 8, ..TextGenSpec::default() };
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.txt");
        let n = spec.write(&p, &|_| {}).unwrap();
        assert!((n as f64 - 200_000.0).abs() < 200_000.0 * 0.01, "{n}");
        let v = Vocab::build(&p, &TextSpec { min_count: 1, ..TextSpec::default() }, 2).unwrap();
        assert_eq!(v.corpus_tokens, n);
        // The most frequent words are the lowest ranks.
        assert_eq!(v.word(0), "w0");
        assert!(v.words()[..5].iter().all(|w| w[1..].parse::<usize>().unwrap() < 10), "{:?}", &v.words()[..5]);
        // Same seed, same corpus.
        let q = dir.path().join("d.txt");
        spec.write(&q, &|_| {}).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), std::fs::read(&q).unwrap());
        // Within a sentence, topic words agree far more often than the 1/8 of chance.
        let text = std::fs::read_to_string(&p).unwrap();
        let (mut same, mut pairs) = (0, 0);
        for line in text.lines().take(2000) {
            let ids: Vec<usize> = line.split(' ').map(|w| w[1..].parse().unwrap()).collect();
            for w in ids.windows(2) {
                pairs += 1;
                same += (spec.topic_of(w[0]) == spec.topic_of(w[1])) as usize;
            }
        }
        assert!(same as f64 / pairs as f64 > 0.4, "{same} / {pairs}");
    }

    #[test]
    fn bad_parameters_name_the_key() {
        let e = TextGenSpec { words: 10, topics: 8, ..TextGenSpec::default() }.check().unwrap_err();
        assert_eq!(e.name, "words", "{e}");
        assert_eq!(itoa(0, &mut [0; 20]), "0");
        assert_eq!(itoa(450_999, &mut [0; 20]), "450999");
    }
}
