//! Fuzz tests of the word-vector readers and of the analogy and word-pair readers: random bytes
//! and mutations of valid word2vec text and binary files, of farout's model files and of
//! evaluation files give `Ok` or an error naming the file, never a panic, and never allocate more
//! than a bound linear in the file's length (see farout-data's `tests/fuzz_readers.rs`).
//!
//! Cases per test: `FAROUT_FUZZ_CASES` (default [`fuzz::DEFAULT_CASES`]), drawn from
//! `FAROUT_FUZZ_SEED` (default fixed).

use farout_core::Matrix;
use farout_core::fuzz::{self, Mutation, PeakAlloc, peak_during};
use farout_skipgram::eval::{read_pairs, read_questions};
use farout_skipgram::subwords::NgramTable;
use farout_skipgram::vectors::{Format, Vectors};
use proptest::prelude::*;
use proptest::test_runner::{RngSeed, TestRunner};

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

/// Bound on the peak heap bytes of one read: `PER_BYTE x file length + FIXED`. A word takes at
/// least four bytes of text (`w 1\n`) or six of binary (`w ` and an f32); in memory a `String`
/// in the word list (24 bytes, reserved from the header count once it is checked against the
/// file's length), its copy in the word index (a 32-byte slot in a hash table that doubles, the
/// old table alive while it moves) and 4 bytes per value: about 40 x at worst. Measured by
/// `fuzz_bound_holds_for_the_costliest_files`: 15 x. `FIXED` covers the 8 KiB read buffer.
const PER_BYTE: u64 = 48;
const FIXED: u64 = 1 << 20;

fn valid_files() -> Vec<(Vec<u8>, Format)> {
    let dir = tempfile::tempdir().unwrap();
    let m = Matrix::from_vec(3, 2, vec![0.5, -1.25, 1e-7, 3.0e8, -0.0, f32::MIN_POSITIVE]).unwrap();
    let ngrams = NgramTable::new(2, 3, Matrix::from_vec(2, 2, vec![1.0, 2.0, 3.0, 4.0]).unwrap());
    let v = Vectors::new(vec!["the".into(), "día".into(), "x'y".into()], m).unwrap().with_ngrams(ngrams).unwrap();
    [Format::Text, Format::Binary, Format::Model]
        .into_iter()
        .map(|format| {
            let p = dir.path().join("v");
            v.save(&p, format).unwrap();
            (std::fs::read(&p).unwrap(), format)
        })
        .collect()
}

fn input() -> impl Strategy<Value = (Vec<u8>, Format)> {
    let valid = valid_files();
    let format = prop_oneof![Just(Format::Text), Just(Format::Binary), Just(Format::Model)];
    let mutations = prop::collection::vec((any::<u8>(), any::<u64>(), any::<u64>()), 1..6);
    prop_oneof![
        1 => (prop::collection::vec(any::<u8>(), 0..256), format.clone()),
        1 => ("[0-9 .e\\-\na-c]{0,200}".prop_map(String::into_bytes), format),
        4 => (0..valid.len(), mutations).prop_map(move |(i, ms)| {
            let ms: Vec<Mutation> = ms.into_iter().map(|(kind, at, arg)| Mutation { kind, at, arg }).collect();
            (fuzz::mutate(&valid[i].0, &ms), valid[i].1)
        }),
    ]
}

fn fuzz_vectors_load() {
    let dir = tempfile::tempdir_in(fuzz::scratch_root()).unwrap();
    let path = dir.path().join("vectors");
    let _alone = fuzz::exclusive();
    let rng_seed = RngSeed::Fixed(fuzz::seed());
    let config =
        ProptestConfig { cases: fuzz::cases(), rng_seed, failure_persistence: None, ..ProptestConfig::default() };
    let result = TestRunner::new(config).run(&input(), |(bytes, format)| {
        std::fs::write(&path, &bytes).unwrap();
        let (result, peak) = peak_during(|| Vectors::load(&path, format));
        let limit = PER_BYTE * bytes.len() as u64 + FIXED;
        prop_assert!(peak <= limit, "{format:?}: peak {peak} bytes for a {}-byte file", bytes.len());
        match result {
            Err(e) => prop_assert!(e.to_string().contains(&path.display().to_string()), "{e}"),
            Ok(v) => {
                let finite = v.ngrams().is_none_or(|t| t.as_slice().iter().all(|x| x.is_finite()));
                prop_assert!(v.matrix().first_non_finite().is_none() && finite, "non-finite vectors accepted");
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The bound holds for the files that cost the reader the most memory per byte: many distinct
/// one-letter-and-number words of dimension 1 (printed with `--nocapture`).
fn fuzz_bound_holds_for_the_costliest_files() {
    let _alone = fuzz::exclusive();
    let dir = tempfile::tempdir_in(fuzz::scratch_root()).unwrap();
    let n = 300_000;
    let word = |i: usize| format!("{}{}", (b'a' + (i % 26) as u8) as char, i / 26);
    let text: String = format!("{n} 1\n") + &(0..n).map(|i| format!("{} 1\n", word(i))).collect::<String>();
    let mut binary = format!("{n} 1\n").into_bytes();
    (0..n).for_each(|i| binary.extend(format!("{} ", word(i)).bytes().chain(1f32.to_le_bytes())));
    for (bytes, format) in [(text.into_bytes(), Format::Text), (binary, Format::Binary)] {
        let path = dir.path().join("v");
        std::fs::write(&path, &bytes).unwrap();
        let (result, peak) = peak_during(|| Vectors::load(&path, format));
        assert_eq!(result.unwrap().words().len(), n);
        let len = bytes.len() as u64;
        eprintln!("{format:?}: {len} bytes, peak {peak} = {:.1} x", peak as f64 / len as f64);
        assert!(peak <= PER_BYTE * len + FIXED, "{format:?}: peak {peak} for {len} bytes");
    }
}

/// Bound of the analogy and word-pair readers: every line is kept as a `String` (24 bytes for
/// one byte of `\n`, in a vector that doubles: 72 x at the move), then its words (a question
/// of four one-letter words, `a b c d\n`, takes 4 x 24 bytes for 8: 12 x). Measured by
/// `fuzz_eval_files_cost_at_most_their_bound`: 70 x (blank lines), 38 x (questions), 33 x (pairs).
const EVAL_PER_BYTE: u64 = 96;

/// Random text and mutations of valid analogy and word-pair files (with NaN and infinite scores
/// and empty files among them) read by [`read_questions`] and [`read_pairs`]: `Ok` or an error
/// naming the file, scores always finite, and a bounded peak allocation.
fn fuzz_eval_files() {
    let dir = tempfile::tempdir_in(fuzz::scratch_root()).unwrap();
    let path = dir.path().join("eval.txt");
    let _alone = fuzz::exclusive();
    let valid: Vec<Vec<u8>> = [
        ": capitals\nathens greece paris france\n\n: family\nboy girl man woman\n",
        "# word pairs\ntiger cat 7.35\nbook\tpaper\t7.46\n",
        "a b nan\nc d 1e999\n",
        "",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let mutations = prop::collection::vec((any::<u8>(), any::<u64>(), any::<u64>()), 1..6);
    let n = valid.len();
    let bytes = prop_oneof![
        1 => "[a-c :#.0-9e\t\n-]{0,200}".prop_map(String::into_bytes),
        4 => (0..n, mutations).prop_map(move |(i, ms)| {
            let ms: Vec<Mutation> = ms.into_iter().map(|(kind, at, arg)| Mutation { kind, at, arg }).collect();
            fuzz::mutate(&valid[i], &ms)
        }),
    ];
    let rng_seed = RngSeed::Fixed(fuzz::seed());
    let config =
        ProptestConfig { cases: fuzz::cases(), rng_seed, failure_persistence: None, ..ProptestConfig::default() };
    let result = TestRunner::new(config).run(&bytes, |bytes| {
        std::fs::write(&path, &bytes).unwrap();
        let limit = EVAL_PER_BYTE * bytes.len() as u64 + FIXED;
        let (questions, peak) = peak_during(|| read_questions(&path));
        prop_assert!(peak <= limit, "questions: peak {peak} bytes for a {}-byte file", bytes.len());
        if let Err(e) = questions {
            prop_assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        }
        let (pairs, peak) = peak_during(|| read_pairs(&path));
        prop_assert!(peak <= limit, "pairs: peak {peak} bytes for a {}-byte file", bytes.len());
        match pairs {
            Err(e) => prop_assert!(e.to_string().contains(&path.display().to_string()), "{e}"),
            Ok(p) => prop_assert!(p.iter().all(|(_, _, s)| s.is_finite()), "a non-finite score was accepted"),
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The bound holds for the costliest analogy and word-pair files: blank lines, and the
/// shortest questions and pairs (printed with `--nocapture`).
fn fuzz_eval_files_cost_at_most_their_bound() {
    let _alone = fuzz::exclusive();
    let dir = tempfile::tempdir_in(fuzz::scratch_root()).unwrap();
    let n = 300_000;
    let cases = [
        ("blank lines (questions)", format!(": s\n{}a b c d\n", "\n".repeat(n)), true),
        ("questions", format!(": s\n{}", "a b c d\n".repeat(n)), true),
        ("pairs", "a b 1\n".repeat(n), false),
    ];
    for (name, text, questions) in cases {
        let path = dir.path().join("f.txt");
        std::fs::write(&path, &text).unwrap();
        let (ok, peak) = if questions {
            let (r, peak) = peak_during(|| read_questions(&path).map(drop));
            (r.is_ok(), peak)
        } else {
            let (r, peak) = peak_during(|| read_pairs(&path).map(drop));
            (r.is_ok(), peak)
        };
        let len = text.len() as u64;
        eprintln!("{name}: {len} bytes, peak {peak} = {:.1} x", peak as f64 / len as f64);
        assert!(ok, "{name}");
        assert!(peak <= EVAL_PER_BYTE * len + FIXED, "{name}: peak {peak} for {len} bytes");
    }
}

/// One test runs every case in turn: the counting allocator sees every thread, and a test
/// thread starting beside a measured call would be counted in its peak.
#[test]
fn fuzz_readers() {
    fuzz_vectors_load();
    fuzz_bound_holds_for_the_costliest_files();
    fuzz_eval_files();
    fuzz_eval_files_cost_at_most_their_bound();
}
