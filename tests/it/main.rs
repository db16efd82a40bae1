//! End-to-end tests of the `farout` command line on small data (one binary, several modules).

mod cli;
mod configs;
mod errors;
mod quality;
mod skipgram;

use std::path::Path;
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
