//! Every shipped config loads, validates, and names data that exist.

use farout_train::Config;
use farout_train::config::DataFormat;
use std::path::Path;

use crate::public_data;

#[test]
fn every_config_loads_validates_and_finds_its_data() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    // configs/*.toml and the compare sets in configs/compare/*/.
    let mut paths = Vec::new();
    let mut dirs = vec![root.join("configs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "toml") {
                paths.push(path);
            }
        }
    }
    // Without the public data sets every config still loads and validates; only the files
    // they name are not checked.
    let have_data = public_data("every_config_loads_validates_and_finds_its_data (its file checks)", "").is_some();
    for path in paths {
        n += 1;
        let c = Config::load(&path, &[]).unwrap_or_else(|e| panic!("{e}"));
        if !matches!(c.data.format, DataFormat::SyntheticFace | DataFormat::SyntheticXmc) {
            let files = [&c.data.train, &c.data.test, &c.data.train_labels, &c.data.test_labels, &c.data.corpus];
            for p in files.into_iter().flatten().filter(|_| have_data) {
                assert!(root.join(p).exists(), "{}: {} does not exist", path.display(), p.display());
            }
        }
        for p in [&c.eval.analogy, &c.eval.similarity].into_iter().flatten().filter(|_| have_data) {
            assert!(root.join(p).exists(), "{}: {} does not exist", path.display(), p.display());
        }
    }
    assert!(n >= 30, "expected the shipped configs, found {n}");
}
