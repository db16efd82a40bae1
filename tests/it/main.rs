//! End-to-end tests of the `farout` command line on small data (one binary, several modules).

mod cli;
mod config_reference;
mod configs;
mod errors;
mod index;
mod quality;
mod robustness;
mod skipgram;
mod tune;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `farout` with `args` from the project root.
pub fn farout(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_farout"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the farout binary runs")
}

/// Standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `--set log.dir=...` and `--set checkpoint.dir=...` pointing into `dir`, progress off.
pub fn quiet_in(dir: &Path) -> Vec<String> {
    vec![
        "--set".into(),
        format!("log.dir=\"{}\"", dir.join("log").display()),
        "--set".into(),
        format!("checkpoint.dir=\"{}\"", dir.join("ckpt").display()),
        "--set".into(),
        "log.progress=false".into(),
    ]
}

/// Runs `farout train CONFIG --set S ...` with logs and checkpoints in `dir`, progress off
/// ([`quiet_in`]).
pub fn train_in(dir: &Path, config: &str, sets: &[&str]) -> Output {
    let mut args = vec!["train", config];
    for s in sets {
        args.extend(["--set", s]);
    }
    let q = quiet_in(dir);
    args.extend(q.iter().map(String::as_str));
    farout(&args)
}

/// Parses the JSON summary `farout train` prints on standard output.
pub fn summary(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "farout failed: {}", stderr(o));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("summary is not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

/// Runs `farout compare CONFIGS --out OUT --set SET ...`, which must succeed, and returns its
/// `summary.csv` after checking it has a header and one row per config.
pub fn compare_table(configs: &[&str], out: &Path, sets: &[&str]) -> String {
    let mut args = vec!["compare"];
    args.extend(configs);
    args.extend(["--out", out.to_str().unwrap()]);
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = farout(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let csv = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert_eq!(csv.lines().count(), configs.len() + 1, "a header and one row per config: {csv}");
    csv
}

/// The public data set path `rel` (e.g. `xmc/bibtex`) under `$FAROUT_DATA` (default
/// `../shared/data`, as farout resolves it), or `None` when it is absent: then `test` is
/// reported as skipped on the terminal (written past the test harness's output capture).
pub fn public_data(test: &str, rel: &str) -> Option<PathBuf> {
    let root = std::env::var_os("FAROUT_DATA")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data"));
    let path = root.join(rel);
    if path.exists() {
        return Some(path);
    }
    let note = format!("skipped {test}: {} not found (set FAROUT_DATA to the public data sets)\n", path.display());
    let _ = std::io::stderr().write_all(note.as_bytes());
    None
}

/// `--set` arguments pointing an XMC config at the small committed fixture (150 documents,
/// 200 features, 20 labels, several per document; `farout data gen xmc --samples 150
/// --features 200 --labels 20 --features-per-sample 8`).
pub fn tiny_xmc() -> Vec<String> {
    ["train", "test"]
        .iter()
        .flat_map(|s| ["--set".to_string(), format!("data.{s}=\"tests/data/xmc-tiny/{s}.txt\"")])
        .collect()
}
