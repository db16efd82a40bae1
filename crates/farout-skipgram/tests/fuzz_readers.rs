//! Fuzz tests of the word-vector readers: random bytes and mutations of valid word2vec text and
//! binary files and of farout's model files give `Ok` or an error naming the file, never a panic, and never allocate more
//! than a bound linear in the file's length (see farout-data's `tests/fuzz_readers.rs`).
//!
//! Cases per test: `FAROUT_FUZZ_CASES` (default [`fuzz::DEFAULT_CASES`]), drawn from
//! `FAROUT_FUZZ_SEED` (default fixed).

use farout_core::Matrix;
use farout_core::fuzz::{self, Mutation, PeakAlloc, peak_during};
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
        if let Err(e) = result {
            prop_assert!(e.to_string().contains(&path.display().to_string()), "{e}");
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

/// One test runs every case in turn: the counting allocator sees every thread, and a test
/// thread starting beside a measured call would be counted in its peak.
#[test]
fn fuzz_readers() {
    fuzz_vectors_load();
    fuzz_bound_holds_for_the_costliest_files();
}
