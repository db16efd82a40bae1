//! Fuzz test of the model-file reader: random bytes and mutations of valid model files (sizes
//! in the header replaced by huge values among them) give `Ok` or an error naming the file, never
//! a panic, and never allocate more than a bound linear in the file's length (see
//! farout-data's `tests/fuzz_readers.rs`).
//!
//! A binary of its own because it installs a counting global allocator. Cases:
//! `FAROUT_FUZZ_CASES` (default [`fuzz::DEFAULT_CASES`]), drawn from `FAROUT_FUZZ_SEED`
//! (default fixed).

use farout_core::fuzz::{self, Mutation, PeakAlloc, peak_during};
use farout_linear::model::{HEADER_LEN, SparseModel};
use proptest::prelude::*;
use proptest::test_runner::{RngSeed, TestRunner};

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

/// Bound on the peak heap bytes of one read: `PER_BYTE x file length + FIXED`. The file's
/// bytes, then the parsed arrays, sized by the header only after its sizes were checked against
/// the file's length: offsets take 8 bytes in the file and in memory, everything else 4 and 4,
/// so twice the file. Measured by `fuzz_bound_holds_for_the_costliest_files`: 2.0 x.
const PER_BYTE: u64 = 3;
const FIXED: u64 = 64 << 10;

fn valid_files() -> Vec<Vec<u8>> {
    let mut m = SparseModel::new(5, true);
    m.push_label(&[0, 3], &[0.5, -1.25], 0.25);
    m.push_label(&[], &[], -0.5);
    m.push_label(&[1, 3, 4], &[2.0, 0.75, -0.125], 0.0);
    vec![m.to_bytes(), SparseModel::new(0, false).to_bytes()]
}

/// A mutation of a valid file with its checksum recomputed half of the time, so that the
/// checks after the checksum see inconsistent content too.
fn input() -> impl Strategy<Value = Vec<u8>> {
    let valid = valid_files();
    let mutations = prop::collection::vec((any::<u8>(), any::<u64>(), any::<u64>()), 1..6);
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..256),
        4 => (0..valid.len(), mutations, any::<bool>()).prop_map(move |(i, ms, fix_crc)| {
            let ms: Vec<Mutation> = ms.into_iter().map(|(kind, at, arg)| Mutation { kind, at, arg }).collect();
            let mut b = fuzz::mutate(&valid[i], &ms);
            if fix_crc && b.len() >= HEADER_LEN {
                let crc = crc32fast::hash(&b[HEADER_LEN..]);
                b[HEADER_LEN - 4..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
            }
            b
        }),
    ]
}

fn fuzz_sparse_model_load() {
    let dir = tempfile::tempdir_in(fuzz::scratch_root()).unwrap();
    let path = dir.path().join("model.bin");
    let _alone = fuzz::exclusive();
    let rng_seed = RngSeed::Fixed(fuzz::seed());
    let config =
        ProptestConfig { cases: fuzz::cases(), rng_seed, failure_persistence: None, ..ProptestConfig::default() };
    let result = TestRunner::new(config).run(&input(), |bytes| {
        std::fs::write(&path, &bytes).unwrap();
        let (result, peak) = peak_during(|| SparseModel::load(&path));
        let limit = PER_BYTE * bytes.len() as u64 + FIXED;
        prop_assert!(peak <= limit, "peak {peak} bytes for a {}-byte file", bytes.len());
        if let Err(e) = result {
            prop_assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The bound holds for a large model (printed with `--nocapture`): labels without weights cost
/// the most memory per byte (12 bytes in the file, 8 + 4 in memory, plus the file's bytes).
fn fuzz_bound_holds_for_the_costliest_files() {
    let _alone = fuzz::exclusive();
    let dir = tempfile::tempdir_in(fuzz::scratch_root()).unwrap();
    let mut m = SparseModel::new(10, true);
    (0..300_000).for_each(|k| m.push_label(&[], &[], k as f32));
    m.push_label(&[1, 4], &[0.5, 2.0], 1.0);
    let path = dir.path().join("model.bin");
    m.save(&path).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let (result, peak) = peak_during(|| SparseModel::load(&path));
    assert_eq!(result.unwrap(), m);
    eprintln!("model: {len} bytes, peak {peak} = {:.1} x", peak as f64 / len as f64);
    assert!(peak <= PER_BYTE * len + FIXED, "peak {peak} for {len} bytes");
}

/// One test runs every case in turn: the counting allocator sees every thread, and a test
/// thread starting beside a measured call would be counted in its peak.
#[test]
fn fuzz_readers() {
    fuzz_sparse_model_load();
    fuzz_bound_holds_for_the_costliest_files();
}
