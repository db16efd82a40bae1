//! Fuzz tests of every reader of farout-data: random bytes and mutations of valid files (bits
//! flipped, bytes inserted or deleted, truncation, header numbers replaced by huge values) give
//! `Ok` or an error naming the file, never a panic, and never allocate more than a bound linear
//! in the file's length.
//!
//! A binary of its own because it installs a counting global allocator; its tests run one at a
//! time ([`fuzz::exclusive`]). Cases per test: `FAROUT_FUZZ_CASES` (default
//! [`fuzz::DEFAULT_CASES`]), drawn from `FAROUT_FUZZ_SEED` (default fixed), e.g.
//! `FAROUT_FUZZ_CASES=100000 cargo test --release -p farout-data --test fuzz_readers`.

use farout_core::Matrix;
use farout_core::fuzz::{self, Mutation, PeakAlloc, peak_during};
use farout_data::corpus::{TextSpec, Vocab};
use farout_data::{LabelSets, SparseRows, labels, npy, raw, xmc};
use proptest::prelude::*;
use proptest::test_runner::{RngSeed, TestCaseError, TestRunner};
use std::path::Path;

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

const MIB: u64 = 1 << 20;

/// Bound on the peak heap bytes of one read: `per_byte x file length + fixed`.
#[derive(Clone, Copy)]
struct Bound {
    per_byte: u64,
    fixed: u64,
}

fn config() -> ProptestConfig {
    let rng_seed = RngSeed::Fixed(fuzz::seed());
    ProptestConfig { cases: fuzz::cases(), rng_seed, failure_persistence: None, ..ProptestConfig::default() }
}

/// Random bytes, random text over the characters of the text formats, or one of `valid`
/// mutated a few times.
fn input(valid: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let n = valid.len();
    let mutations = prop::collection::vec((any::<u8>(), any::<u64>(), any::<u64>()), 1..6);
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..256),
        1 => "[0-9 :,.e\\-\t\na-c]{0,200}".prop_map(String::into_bytes),
        4 => (0..n, mutations).prop_map(move |(i, ms)| {
            let ms: Vec<Mutation> = ms.into_iter().map(|(kind, at, arg)| Mutation { kind, at, arg }).collect();
            fuzz::mutate(&valid[i], &ms)
        }),
    ]
}

/// Writes `bytes` to `path`, reads it with `read` and checks: no panic (proptest fails the
/// case on one), an error names the file, and the peak allocation is within `bound`.
fn check<T, E: std::fmt::Display>(
    path: &Path,
    bytes: &[u8],
    bound: Bound,
    read: impl FnOnce(&Path) -> Result<T, E>,
) -> Result<(), TestCaseError> {
    std::fs::write(path, bytes).unwrap();
    let (result, peak) = peak_during(|| read(path));
    let len = bytes.len() as u64;
    let limit = bound.per_byte * len + bound.fixed;
    prop_assert!(peak <= limit, "peak {peak} bytes for a {len}-byte file (bound {limit})");
    if let Err(e) = result {
        let msg = e.to_string();
        prop_assert!(msg.contains(&path.display().to_string()), "error does not name the file: {msg}");
    }
    Ok(())
}

fn xmc_files() -> Vec<Vec<u8>> {
    let mut f = SparseRows::new(12);
    let mut l = LabelSets::new(6);
    f.push_row(&[0, 3, 11], &[1.0, 0.5, -2.25]);
    l.push(&[1, 5]);
    f.push_row(&[], &[]);
    l.push(&[]);
    f.push_row(&[7], &[1e-3]);
    l.push(&[0]);
    let mut written = Vec::new();
    xmc::write_to(&mut written, &f, &l).unwrap();
    vec![written, b"3 10 5\n1,4 0:1 9:0.5\n 2:1\n0\n".to_vec(), b"1 4 2\n\n".to_vec()]
}

fn npy_files() -> Vec<Vec<u8>> {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let m = dir.join("valid-m.npy");
    npy::write_f32_matrix(&m, &Matrix::from_vec(3, 2, vec![1.0, -2.0, 3.5, 0.0, 1e-7, 9.0]).unwrap()).unwrap();
    let e = dir.join("valid-e.npy");
    npy::write_f32_matrix(&e, &Matrix::zeros(0, 4)).unwrap();
    let ids = dir.join("valid-ids.npy");
    npy::write_ids(&ids, &[0, 5, 4_000_000, 2]).unwrap();
    [m, e, ids].iter().map(|p| std::fs::read(p).unwrap()).collect()
}

// The bounds, `per_byte x file length + fixed`: from the data structures each reader builds,
// counting growth by doubling (capacity up to 2 x) with the old block alive while it moves
// (3 x at the move); `fuzz_bounds_hold_for_the_costliest_files` measures the costliest files
// (figures in its comments). `fixed` covers read buffers (1 MiB at most, less for smaller files).

/// `.npy`: the values (1 x) and a chunk buffer of at most the same size; ids: the raw integers
/// then the u32s. Measured 2.9 x.
const NPY: Bound = Bound { per_byte: 4, fixed: 2 * MIB };

/// XMC: a blank line is a sample, two `usize` offsets (16 bytes) per byte of input, reserved from
/// the checked header count by [`xmc::read`], grown (3 x) by the streaming [`xmc::read_from`];
/// labels and features take at most 4 bytes of memory per byte of text. Measured 17 x (file),
/// 36 x (streamed).
const XMC: Bound = Bound { per_byte: 48, fixed: 2 * MIB };

/// Label text: a blank line is a sample, one growing `usize` offset (24 x). Measured 21 x.
const LABELS: Bound = Bound { per_byte: 32, fixed: MIB };

/// Raw f32: the values, then a chunk buffer of at most the same size. Measured 2 x.
const RAW: Bound = Bound { per_byte: 3, fixed: MIB };

/// Vocabulary files and corpora: a distinct word takes three bytes (`a1 `) and a `String`, a
/// count and the first position in a growing hash map (about 45 bytes a slot), then a sorted
/// copy and the id map. Measured 31 x.
const VOCAB: Bound = Bound { per_byte: 64, fixed: 2 * MIB };

/// Runs [`fuzz::cases`] cases of `strategy`, each written to the file `name` of one temporary
/// directory and checked by `case(path, value)`.
fn fuzz<S: Strategy>(name: &str, strategy: S, case: impl Fn(&Path, S::Value) -> Result<(), TestCaseError>) {
    let _alone = fuzz::exclusive();
    let dir = tempfile::tempdir_in(fuzz::scratch_root()).unwrap();
    let path = dir.path().join(name);
    if let Err(e) = TestRunner::new(config()).run(&strategy, |value| case(&path, value)) {
        panic!("{e}");
    }
}

/// LIBSVM files (the XMC lines without a header; sizes from the ids), valid and with a
/// non-finite value or a malformed header for the mutations to start from.
fn libsvm_files() -> Vec<Vec<u8>> {
    vec![
        b"1,4 1:1 9:0.5\n 2:1\n0 3:2e-3\n".to_vec(),
        b"3 1:0.25 2:-1\n3,7 5:1\n".to_vec(),
        b"1 2:nan 4:1\n0 1:inf\n".to_vec(),
        b"100 50\n1 0:1\n".to_vec(),
    ]
}

/// Whether every value of a read data set is finite: the readers refuse NaN and infinities.
fn all_finite(d: &farout_data::Dataset) -> bool {
    match &d.features {
        farout_data::Features::Sparse(s) => s.values.iter().all(|v| v.is_finite()),
        farout_data::Features::Dense(m) => m.as_slice().iter().all(|v| v.is_finite()),
    }
}

fn fuzz_xmc_read() {
    let bytes = input(xmc_files());
    fuzz("data.txt", bytes, |path, bytes| {
        check(path, &bytes, XMC, xmc::read)?;
        // The streaming entry point, without a file length to check against.
        check(path, &bytes, XMC, |p| xmc::read_from(&bytes[..], p))
    });
}

fn fuzz_libsvm_read() {
    let bytes = input(libsvm_files());
    fuzz("data.libsvm", bytes, |path, bytes| {
        check(path, &bytes, XMC, |p| {
            let d = xmc::read(p)?;
            assert!(all_finite(&d), "a non-finite value was accepted");
            Ok::<_, farout_data::Error>(d)
        })
    });
}

fn fuzz_npy_f32_matrix() {
    let bytes = input(npy_files());
    fuzz("x.npy", bytes, |path, bytes| check(path, &bytes, NPY, npy::read_f32_matrix));
}

/// Vector files as `farout bench search --vectors` and the data readers take them: float
/// matrices, a few holding NaN or infinities, mutated; what is read is finite.
fn fuzz_npy_vectors() {
    let tmp = tempfile::tempdir().unwrap();
    let matrices = [
        Matrix::from_vec(2, 3, vec![0.5, -1.0, 3.0e38, 1e-40, 0.0, -0.0]).unwrap(),
        Matrix::from_vec(2, 2, vec![1.0, f32::NAN, 2.0, 3.0]).unwrap(),
        Matrix::from_vec(1, 3, vec![f32::NEG_INFINITY, 1.0, 2.0]).unwrap(),
    ];
    let valid = matrices
        .iter()
        .map(|m| {
            let p = tmp.path().join("v.npy");
            npy::write_f32_matrix(&p, m).unwrap();
            std::fs::read(p).unwrap()
        })
        .collect();
    fuzz("w.npy", input(valid), |path, bytes| {
        check(path, &bytes, NPY, |p| {
            let m = npy::read_f32_matrix(p)?;
            assert!(m.first_non_finite().is_none(), "a non-finite value was accepted");
            Ok::<_, farout_data::Error>(m)
        })
    });
}

fn fuzz_npy_ids() {
    let bytes = input(npy_files());
    fuzz("y.npy", bytes, |path, bytes| check(path, &bytes, NPY, npy::read_ids));
}

fn fuzz_npy_header() {
    let bytes = input(npy_files());
    fuzz("h.npy", bytes, |path, bytes| {
        check(path, &bytes, NPY, |p| npy::read_header(&mut std::fs::File::open(p).unwrap(), p))
    });
}

fn fuzz_labels_text() {
    let valid = vec![b"1,2\n\n0\n".to_vec(), b"4\n4,1,0\n3\n".to_vec()];
    fuzz("labels.txt", (input(valid), prop::option::of(0usize..8)), |path, (bytes, k)| {
        check(path, &bytes, LABELS, |p| labels::read(p, k))
    });
}

fn fuzz_labels_npy() {
    fuzz("labels.npy", (input(npy_files()), prop::option::of(0usize..8)), |path, (bytes, k)| {
        check(path, &bytes, NPY, |p| labels::read(p, k))
    });
}

fn fuzz_raw_f32() {
    let valid = vec![vec![0u8; 24], (0..=255).collect()];
    let dim = prop_oneof![1usize..9, Just(usize::MAX / 4)];
    fuzz("x.f32", (input(valid), dim), |path, (bytes, dim)| {
        check(path, &bytes, RAW, |p| {
            let m = raw::read_f32(p, dim)?;
            assert!(m.first_non_finite().is_none(), "a non-finite value was accepted");
            Ok::<_, farout_data::Error>(m)
        })
    });
}

fn fuzz_vocab_load() {
    let bytes = input(vec![b"the 10\nof 7\nx'y 7\n\xc3\xa9 1\n".to_vec()]);
    fuzz("vocab.txt", bytes, |path, bytes| check(path, &bytes, VOCAB, Vocab::load));
}

fn fuzz_vocab_build() {
    let bytes = input(vec![b"the cat sat on the mat\nThe dog sat\r\n\nthe \xc3\x89mile end".to_vec()]);
    fuzz("corpus.txt", (bytes, 1usize..4, any::<bool>()), |path, (bytes, threads, lowercase)| {
        let spec = TextSpec { min_count: 1, lowercase, ..TextSpec::default() };
        check(path, &bytes, VOCAB, |p| Vocab::build(p, &spec, threads))
    });
}

/// The bounds hold for the files that cost each reader the most memory per byte (printed with
/// `--nocapture`: the figures the constants above are chosen from).
fn fuzz_bounds_hold_for_the_costliest_files() {
    let _alone = fuzz::exclusive();
    let dir = tempfile::tempdir_in(fuzz::scratch_root()).unwrap();
    let n = 300_000;
    let rep = |s: &str| s.repeat(n);
    // Distinct words, as short as they can be: a letter and a number.
    let words =
        |sep: &str| (0..n).map(|i| format!("{}{}{sep}", (b'a' + (i % 26) as u8) as char, i / 26)).collect::<String>();
    let matrix = {
        let p = dir.path().join("m.npy");
        npy::write_f32_matrix(&p, &Matrix::zeros(n, 1)).unwrap();
        std::fs::read(p).unwrap()
    };
    let ids = {
        let p = dir.path().join("i.npy");
        npy::write_ids(&p, &vec![1; n]).unwrap();
        std::fs::read(p).unwrap()
    };
    type Read = Box<dyn Fn(&Path) -> Result<(), String>>;
    let ok = |r: Result<(), String>| r;
    let cases: Vec<(&str, Vec<u8>, Bound, Read)> = vec![
        (
            "xmc blank lines",
            format!("{n} 1 1\n{}", rep("\n")).into_bytes(),
            XMC,
            Box::new(|p| xmc::read(p).map(drop).map_err(|e| e.to_string())),
        ),
        (
            "xmc features",
            // Distinct ids (a sample's features are distinct), as short as they can be.
            format!("1 {n} 1\n{}", (0..n).map(|i| format!(" {i}:1")).collect::<String>()).into_bytes(),
            XMC,
            Box::new(|p| xmc::read(p).map(drop).map_err(|e| e.to_string())),
        ),
        (
            "xmc labels",
            format!("1 1 {n}\n{}0", (1..n).map(|i| format!("{i},")).collect::<String>()).into_bytes(),
            XMC,
            Box::new(|p| xmc::read(p).map(drop).map_err(|e| e.to_string())),
        ),
        (
            "xmc blank lines, streamed",
            format!("{n} 1 1\n{}", rep("\n")).into_bytes(),
            XMC,
            Box::new(|p| {
                let bytes = std::fs::read(p).unwrap();
                xmc::read_from(&bytes[..], p).map(drop).map_err(|e| e.to_string())
            }),
        ),
        (
            "labels blank lines",
            rep("\n").into_bytes(),
            LABELS,
            Box::new(|p| labels::read(p, None).map(drop).map_err(|e| e.to_string())),
        ),
        (
            "labels ids",
            rep("0,").into_bytes(),
            LABELS,
            Box::new(|p| labels::read(p, None).map(drop).map_err(|e| e.to_string())),
        ),
        ("npy f32", matrix, NPY, Box::new(|p| npy::read_f32_matrix(p).map(drop).map_err(|e| e.to_string()))),
        ("npy ids", ids, NPY, Box::new(|p| npy::read_ids(p).map(drop).map_err(|e| e.to_string()))),
        ("raw f32", vec![0; 4 * n], RAW, Box::new(|p| raw::read_f32(p, 1).map(drop).map_err(|e| e.to_string()))),
        (
            "corpus, 1 thread",
            words(" ").into_bytes(),
            VOCAB,
            Box::new(|p| {
                Vocab::build(p, &TextSpec { min_count: 1, ..TextSpec::default() }, 1)
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
        ),
        (
            "corpus, 3 threads",
            words("\n").into_bytes(),
            VOCAB,
            Box::new(|p| {
                Vocab::build(p, &TextSpec { min_count: 1, ..TextSpec::default() }, 3)
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
        ),
        (
            "vocab file",
            words(" 1\n").into_bytes(),
            VOCAB,
            Box::new(|p| Vocab::load(p).map(drop).map_err(|e| e.to_string())),
        ),
    ];
    for (name, bytes, bound, read) in cases {
        // (The streamed case also counts its copy of the file: 1 x of its bound.)
        let path = dir.path().join("f");
        std::fs::write(&path, &bytes).unwrap();
        let (result, peak) = peak_during(|| read(&path));
        ok(result).unwrap_or_else(|e| panic!("{name}: {e}"));
        let len = bytes.len() as u64;
        eprintln!("{name}: {len} bytes, peak {peak} = {:.1} x", peak as f64 / len as f64);
        assert!(peak <= bound.per_byte * len + bound.fixed, "{name}: peak {peak} for {len} bytes");
    }
}

/// One test runs every case in turn: the counting allocator sees every thread, and a test
/// thread starting beside a measured call would be counted in its peak.
#[test]
fn fuzz_readers() {
    fuzz_xmc_read();
    fuzz_npy_f32_matrix();
    fuzz_npy_ids();
    fuzz_npy_header();
    fuzz_labels_text();
    fuzz_labels_npy();
    fuzz_raw_f32();
    fuzz_libsvm_read();
    fuzz_npy_vectors();
    fuzz_vocab_load();
    fuzz_vocab_build();
    fuzz_bounds_hold_for_the_costliest_files();
}
