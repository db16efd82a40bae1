//! Integration tests of farout-linear on the public data sets (`$FAROUT_DATA`, default
//! `../shared/data` beside the repository); each test is skipped, with a note on stderr, when
//! its data set is absent.

mod bibtex;

use std::io::Write;
use std::path::{Path, PathBuf};

/// The data set `rel` (e.g. `xmc/bibtex`) or `None` (the test is reported as skipped).
pub fn public_data(test: &str, rel: &str) -> Option<PathBuf> {
    let root = std::env::var_os("FAROUT_DATA")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data"));
    let path = root.join(rel);
    if path.exists() {
        return Some(path);
    }
    let note = format!("skipped {test}: {} not found (set FAROUT_DATA to the public data sets)\n", path.display());
    let _ = std::io::stderr().write_all(note.as_bytes());
    None
}
