//! Every shipped config loads, validates, and names data that exist.

use farout_train::Config;
use farout_train::config::DataFormat;
use std::path::Path;

#[test]
fn every_config_loads_validates_and_finds_its_data() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for entry in std::fs::read_dir(root.join("configs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        n += 1;
        let c = Config::load(&path, &[]).unwrap_or_else(|e| panic!("{e}"));
        if !matches!(c.data.format, DataFormat::SyntheticFace | DataFormat::SyntheticXmc) {
            for p in [&c.data.train, &c.data.test, &c.data.train_labels, &c.data.test_labels].into_iter().flatten() {
                assert!(root.join(p).exists(), "{}: {} does not exist", path.display(), p.display());
            }
        }
    }
    assert!(n >= 7, "expected the shipped configs, found {n}");
}
