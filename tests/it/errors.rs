//! Bad input: a non-zero exit and one line naming the file:line, key or path; never a panic.

use crate::{farout, quiet_in, stderr, tiny_xmc};
use std::path::Path;

pub fn fails_with(args: &[&str], expect: &[&str]) {
    let o = farout(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "expected failure for {args:?}");
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "panic for {args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line expected: {err}");
    // A cause printed twice ("path: cause: cause") reads as two errors.
    let parts: Vec<&str> = err.trim_end().split(": ").collect();
    assert!(parts.windows(2).all(|w| w[0] != w[1]), "a cause is repeated: {err}");
    for e in expect {
        assert!(err.contains(e), "{err:?} should contain {e:?}");
    }
}

fn xmc_run(dir: &Path, train: &Path) -> Vec<String> {
    let mut v = vec!["train".into(), "configs/bibtex-softmax.toml".into()];
    v.extend(tiny_xmc());
    v.extend(["--set".into(), format!("data.train=\"{}\"", train.display())]);
    v.extend(quiet_in(dir));
    v
}

#[test]
fn malformed_xmc_line_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.txt");
    std::fs::write(&f, "2 10 5\n1 0:1 3:1\n2 4:x\n").unwrap();
    let args = xmc_run(dir.path(), &f);
    fails_with(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[&format!("{}:3:", f.display()), "feature value `x`"],
    );
}

#[test]
fn label_out_of_range_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.txt");
    std::fs::write(&f, "2 10 5\n1 0:1\n9 4:1\n").unwrap();
    let args = xmc_run(dir.path(), &f);
    fails_with(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[&format!("{}:3:", f.display()), "label 9 out of range"],
    );
}

#[test]
fn unknown_config_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c.toml");
    std::fs::write(&c, std::fs::read_to_string("configs/quickstart.toml").unwrap().replace("epochs = 3", "epoch = 3"))
        .unwrap();
    fails_with(&["train", c.to_str().unwrap()], &["c.toml", "key `train.epoch`", "unknown field `epoch`", "epochs"]);
    fails_with(
        &["train", "configs/quickstart.toml", "--set", "output.estimator=\"lsh\""],
        &["output.estimator", "unknown variant `lsh`", "softmax"],
    );
}

#[test]
fn missing_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    fails_with(&["train", "configs/nope.toml"], &["configs/nope.toml", "No such file"]);
    let args = xmc_run(dir.path(), &dir.path().join("missing.txt"));
    fails_with(&args.iter().map(String::as_str).collect::<Vec<_>>(), &["missing.txt", "No such file"]);
}

#[test]
fn wrong_shaped_npy_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    let y = dir.path().join("y.npy");
    farout_data::npy::write_ids(&x, &[1, 2, 3]).unwrap(); // 1-D integers where 2-D f32 is expected
    farout_data::npy::write_ids(&y, &[1, 2, 3]).unwrap();
    let mut args: Vec<String> =
        ["train", "configs/face-synthetic-softmax.toml", "--set", "data.format=\"npy\""].map(String::from).to_vec();
    args.extend([
        "--set".into(),
        format!("data.train=\"{}\"", x.display()),
        "--set".into(),
        format!("data.train_labels=\"{}\"", y.display()),
    ]);
    args.extend(quiet_in(dir.path()));
    fails_with(&args.iter().map(String::as_str).collect::<Vec<_>>(), &["x.npy", "expected float32"]);
    let m = dir.path().join("m.npy");
    farout_data::npy::write_f32_matrix(&m, &farout_core::Matrix::zeros(4, 3)).unwrap();
    args[5] = format!("data.train=\"{}\"", m.display());
    fails_with(&args.iter().map(String::as_str).collect::<Vec<_>>(), &["has 4 samples", "y.npy", "3 label lines"]);
}

#[test]
fn divergence_stops_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = [
        "train",
        "configs/bibtex-softmax.toml",
        "--set",
        "output.optimizer={kind=\"sgd\",lr=1000.0,decay=0.0}",
        "--set",
        "model.doc_encoder.optimizer={kind=\"sgd\",lr=1000.0,decay=0.0}",
    ]
    .map(String::from)
    .to_vec();
    args.extend(tiny_xmc());
    args.extend(quiet_in(dir.path()));
    fails_with(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &["training diverged at step", "no checkpoint had been written yet"],
    );
}

#[test]
fn single_label_estimator_on_multi_label_data_names_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let q = quiet_in(dir.path());
    let tiny = tiny_xmc();
    let mut args =
        vec!["train", "configs/bibtex-ove.toml", "--set", "data.first_label=false", "--set", "output.n_samples=5"];
    args.extend(tiny.iter().map(String::as_str));
    args.extend(q.iter().map(String::as_str));
    fails_with(&args, &["ove", "data.first_label = true"]);
}

#[test]
fn compare_rejects_mismatched_unreadable_and_missing_configs() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string("configs/quickstart.toml").unwrap();
    let a = dir.path().join("a.toml");
    let b = dir.path().join("b.toml");
    std::fs::write(&a, &base).unwrap();
    std::fs::write(&b, base.replace("seed = 1", "seed = 7")).unwrap();
    let out = dir.path().join("out");
    let (a, b, o) = (a.to_str().unwrap(), b.to_str().unwrap(), out.to_str().unwrap());
    fails_with(&["compare", a, b, "--out", o], &["differ in `seed`", "--allow-diff"]);
    fails_with(&["compare", a, "/nonexistent/c.toml", "--out", o], &["/nonexistent/c.toml"]);
    fails_with(&["compare", "--out", o], &["nothing to compare"]);
}

#[test]
fn index_bench_and_compare_errors_name_their_key_option_or_file() {
    // An index parameter is checked by its index and named with its section.
    fails_with(
        &["train", "configs/quickstart.toml", "--set", "index.kind=\"hnsw\"", "--set", "index.max_connections=1"],
        &["index.max_connections", "2..=256"],
    );
    // A bench size out of range names the option.
    fails_with(&["bench", "search", "--k", "0"], &["--k", "must be > 0"]);
    // A compare directory whose run summary is not JSON names the file.
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("runs").join("softmax@0");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("summary.json"), "{").unwrap();
    let (from, out) = (dir.path().to_str().unwrap(), dir.path().join("out"));
    fails_with(&["compare", "--from", from, "--out", out.to_str().unwrap()], &["softmax@0/summary.json"]);
    // A directory that is not a compare output is named as such.
    fails_with(
        &["compare", "--from", "/nonexistent", "--out", out.to_str().unwrap()],
        &["/nonexistent", "not a `farout compare` output directory"],
    );
}

#[test]
fn a_truncated_linear_model_is_named_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("linear.model"), b"FOLINMDL\x01\x00\x00\x00").unwrap();
    let sets =
        ["--set", "data.format=\"synthetic_xmc\"", "--set", "data.xmc.n_samples=200", "--set", "data.xmc.n_labels=10"];
    let checkpoint = dir.path().to_string_lossy().into_owned();
    let args = [&["eval", "configs/bibtex-dismec.toml", "--checkpoint", checkpoint.as_str()][..], &sets[..]].concat();
    fails_with(&args, &["linear.model", "not a valid farout-linear model", "truncated"]);
}
