//! Nothing lost, nothing silent: divergence, corrupt or half-written checkpoints, runs that
//! would replace other runs and absurd requests end with a clear error, and the last good state
//! stays loadable.

use crate::errors::fails_with;
use crate::{farout, quiet_in, stderr, summary, tiny_xmc};
use std::path::Path;

/// `farout <command> <config>` on the tiny XMC data with logs and checkpoints in `dir`.
fn tiny(command: &str, config: &str, dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec![command.into(), config.into()];
    v.extend(tiny_xmc());
    v.extend(quiet_in(dir));
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn run(args: &[String]) -> std::process::Output {
    farout(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Like [`fails_with`], but after the run's own log lines: the error is the last line.
fn fails(args: &[String], expect: &[&str]) {
    let o = run(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "expected failure for {args:?}");
    assert!(!err.contains("panicked"), "panic for {args:?}: {err}");
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert!(last.starts_with("error: "), "the error is the last line: {err}");
    for e in expect {
        assert!(last.contains(e), "{last:?} should contain {e:?}");
    }
}

const SOFTMAX: &str = "configs/bibtex-softmax.toml";
const PLAIN_SGD: [&str; 4] = [
    "--set",
    "output.optimizer={kind=\"sgd\",lr=0.02,decay=0.0}",
    "--set",
    "model.doc_encoder.optimizer={kind=\"sgd\",lr=0.02,decay=0.0}",
];
const BLOW_UP: [&str; 4] = [
    "--set",
    "output.optimizer={kind=\"sgd\",lr=1000.0,decay=0.0}",
    "--set",
    "model.doc_encoder.optimizer={kind=\"sgd\",lr=1000.0,decay=0.0}",
];

/// Test P@1 of the checkpoint in `dir` by `farout eval`.
fn eval_p1(dir: &Path, config: &str, extra: &[&str]) -> f64 {
    let o = run(&tiny("eval", config, dir, extra));
    assert!(o.status.success(), "eval failed: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["loss"].as_f64().is_some_and(f64::is_finite), "{v}");
    v["p@1"].as_f64().unwrap()
}

#[test]
fn margin_mips_and_ldgs_stop_on_divergence_and_name_the_keys() {
    let mips =
        ["--set", "output.estimator=\"mips\"", "--set", "index.kind=\"exact\"", "--set", "output.layer.bias=false"];
    for (config, extra) in [("margin", &[][..]), ("margin", &mips[..]), ("ldgs", &[][..])] {
        let dir = tempfile::tempdir().unwrap();
        let mut args = tiny("train", &format!("configs/bibtex-{config}.toml"), dir.path(), &BLOW_UP);
        args.extend(extra.iter().map(|s| s.to_string()));
        fails(&args, &["training diverged at step", "output.optimizer.lr", "model.doc_encoder.optimizer.lr"]);
    }
}

#[test]
fn a_diverged_resume_keeps_the_last_good_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut good = tiny("train", SOFTMAX, dir.path(), &["--set", "train.epochs=1"]);
    good.extend(PLAIN_SGD.map(String::from));
    summary(&run(&good));
    let before = eval_p1(dir.path(), SOFTMAX, &PLAIN_SGD);
    let mut args = tiny("train", SOFTMAX, dir.path(), &["--resume", "--set", "train.epochs=3"]);
    args.extend(BLOW_UP.map(String::from));
    fails(&args, &["training diverged at step", "the last good checkpoint (step 8) is kept at"]);
    assert_eq!(eval_p1(dir.path(), SOFTMAX, &PLAIN_SGD), before, "the kept checkpoint is the one of the good run");
}

#[test]
fn a_corrupt_checkpoint_is_refused_by_eval_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    summary(&run(&tiny("train", SOFTMAX, dir.path(), &["--set", "train.epochs=1"])));
    let layer = dir.path().join("ckpt/layer.bin");
    let mut bytes = std::fs::read(&layer).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&layer, &bytes).unwrap();
    fails(&tiny("eval", SOFTMAX, dir.path(), &[]), &["layer.bin", "the file is corrupt"]);
    fails(&tiny("train", SOFTMAX, dir.path(), &["--resume"]), &["layer.bin", "the file is corrupt"]);
    std::fs::write(&layer, &bytes[..mid]).unwrap();
    fails(&tiny("eval", SOFTMAX, dir.path(), &[]), &["layer.bin", "truncated"]);
}

#[test]
fn a_save_interrupted_between_its_renames_is_found_and_resumed() {
    let dir = tempfile::tempdir().unwrap();
    summary(&run(&tiny("train", SOFTMAX, dir.path(), &["--set", "train.epochs=1"])));
    let before = eval_p1(dir.path(), SOFTMAX, &[]);
    // The state a kill leaves after `ckpt` was renamed to `ckpt.old` and before `ckpt.tmp`
    // became `ckpt` (the old one, complete, beside the new one, complete).
    let (ck, tmp, old) = (dir.path().join("ckpt"), dir.path().join("ckpt.tmp"), dir.path().join("ckpt.old"));
    std::fs::rename(&ck, &tmp).unwrap();
    let o = run(&tiny("eval", SOFTMAX, dir.path(), &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("ckpt.tmp"), "says which checkpoint it loaded: {}", stderr(&o));
    assert_eq!(eval_p1(dir.path(), SOFTMAX, &[]), before);
    // An incomplete older directory next to it changes nothing.
    std::fs::create_dir_all(&old).unwrap();
    std::fs::write(old.join("layer.bin"), b"half").unwrap();
    let s = summary(&run(&tiny("train", SOFTMAX, dir.path(), &["--resume", "--set", "train.epochs=2"])));
    assert_eq!(s["steps"].as_u64(), Some(16), "resumed at step 8: {s}");
    assert!(ck.join("manifest.json").exists() && !tmp.exists() && !old.exists());
}

#[test]
fn a_run_is_never_replaced_silently() {
    let dir = tempfile::tempdir().unwrap();
    summary(&run(&tiny("train", SOFTMAX, dir.path(), &["--set", "train.epochs=1"])));
    let before = eval_p1(dir.path(), SOFTMAX, &[]);
    fails(&tiny("train", SOFTMAX, dir.path(), &[]), &["already holds a run", "--resume", "--overwrite"]);
    assert_eq!(eval_p1(dir.path(), SOFTMAX, &[]), before, "the refused run changed nothing");
    fails(&tiny("train", SOFTMAX, dir.path(), &["--resume", "--overwrite"]), &["--overwrite", "--resume"]);
    let s = summary(&run(&tiny("train", SOFTMAX, dir.path(), &["--overwrite", "--set", "train.epochs=2"])));
    assert_eq!(s["steps"].as_u64(), Some(16), "a fresh run from step 0: {s}");
}

#[test]
fn a_directory_in_use_by_another_run_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    std::fs::create_dir_all(&log).unwrap();
    let lock = std::fs::File::create(log.join("farout.lock")).unwrap();
    lock.lock().unwrap();
    fails(&tiny("train", SOFTMAX, dir.path(), &[]), &["farout.lock", "another farout run is writing"]);
    lock.unlock().unwrap();
    summary(&run(&tiny("train", SOFTMAX, dir.path(), &["--set", "train.epochs=1"])));
}

#[test]
fn compare_refuses_a_useless_budget_and_an_earlier_comparison() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    for budget in ["0", "nan", "-1", "inf"] {
        fails_with(
            &["compare", SOFTMAX, "configs/bibtex-sampled-softmax.toml", "--out", out, &format!("--budget={budget}")],
            &["--budget", "positive, finite number of seconds"],
        );
    }
    std::fs::write(dir.path().join("summary.csv"), "method\n").unwrap();
    fails_with(&["compare", SOFTMAX, "--out", out], &["holds an earlier comparison", "--overwrite"]);
}

#[test]
fn absurd_sizes_are_refused_before_anything_is_allocated_or_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gen");
    let out = out.to_str().unwrap();
    let memory = "of memory are available";
    fails_with(&["bench", "search", "--index", "exact", "--k", "1000000000000", "--d", "128"], &["--k", memory]);
    fails_with(&["bench", "layer", "--k", "1000000000000"], &["--k", memory]);
    fails_with(
        &["data", "gen", "xmc", "--samples", "100", "--features", "100", "--labels", "1000000000000", "--out", out],
        &["--labels", memory],
    );
    fails_with(
        &["data", "gen", "face", "--classes", "1000", "--samples", "100000000000", "--out", out],
        &["--samples", memory],
    );
    let corpus = dir.path().join("corpus.txt");
    fails_with(
        &["data", "gen", "corpus", "--tokens", "100000000000000", "--out", corpus.to_str().unwrap()],
        &["--tokens", "are free on the disk holding"],
    );
    assert!(!Path::new(out).exists() && !corpus.exists(), "nothing was written");
    fails(
        &tiny("train", "configs/quickstart.toml", dir.path(), &["--set", "data.face.n_samples=100000000000"]),
        &["data.face.n_samples", memory],
    );
    fails(
        &tiny(
            "train",
            "configs/skipgram-quickstart.toml",
            dir.path(),
            &["--set", "data.synthetic.tokens=100000000000000"],
        ),
        &["data.synthetic.tokens", "are free on the disk holding"],
    );
    // A header's feature count is not bounded by the file's length: the model it implies is.
    let huge = dir.path().join("huge.txt");
    std::fs::write(&huge, "2 1000000000 20\n1 0:1 3:1\n2 4:1\n").unwrap();
    let path = format!("\"{}\"", huge.display());
    fails(
        &tiny(
            "train",
            SOFTMAX,
            dir.path(),
            &["--set", &format!("data.train={path}"), "--set", &format!("data.test={path}")],
        ),
        &["1000000000 input features", memory],
    );
}

#[test]
fn settings_that_would_give_a_silently_wrong_result_are_errors_or_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        format!("\"{}\"", p.display())
    };
    let empty = file("empty.txt", "0 200 20\n");
    let unlabelled = file("unlabelled.txt", "2 200 20\n 0:1 3:1\n 4:1\n");
    let set = |kv: &str| tiny("train", SOFTMAX, dir.path(), &["--set", kv]);
    fails(&set(&format!("data.test={empty}")), &["empty.txt", "holds no samples"]);
    fails(&set(&format!("data.train={unlabelled}")), &["unlabelled.txt", "none of its 2 samples has a label"]);
    fails(&set("train.epochs=0"), &["train.epochs", "must be >= 1"]);
    fails(
        &tiny("train", "configs/bibtex-sampled-softmax.toml", dir.path(), &["--set", "output.n_samples=20"]),
        &["output.n_samples", "K = 20 classes", "must be smaller than K"],
    );
    let o = run(&tiny("train", SOFTMAX, dir.path(), &["--set", "train.threads=100000", "--set", "train.epochs=1"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("train.threads = 100000 is more than the"), "{}", stderr(&o));
    let vectors = dir.path().join("v.txt");
    std::fs::write(&vectors, "3 2\nthe 0.1 0.2\ncat nan 0.3\ndog 0.2 0.1\n").unwrap();
    let pairs = dir.path().join("pairs.tsv");
    std::fs::write(&pairs, "the cat 5.0\ncat dog 7.0\nthe dog 2.0\n").unwrap();
    fails_with(
        &["eval", "similarity", "--vectors", vectors.to_str().unwrap(), "--pairs", pairs.to_str().unwrap()],
        &["v.txt", "1 of 3 vectors hold NaN or infinite values (the first: `cat`, line 3)"],
    );
}

#[test]
fn outputs_never_overwrite_the_inputs() {
    let dir = tempfile::tempdir().unwrap();
    summary(&run(&tiny("train", SOFTMAX, dir.path(), &["--set", "train.epochs=1"])));
    let input = dir.path().join("input.txt");
    std::fs::copy("tests/data/xmc-tiny/test.txt", &input).unwrap();
    let before = std::fs::read(&input).unwrap();
    let input = input.to_str().unwrap();
    fails(
        &tiny("predict", SOFTMAX, dir.path(), &["--input", input, "--out", input]),
        &["--out", "is the --input file"],
    );
    fails(&tiny("predict", SOFTMAX, dir.path(), &["--out", SOFTMAX]), &["--out", "is the config file"]);
    fails(
        &tiny("predict", SOFTMAX, dir.path(), &["--out", "tests/data/xmc-tiny/train.txt"]),
        &["--out", "is the data.train file"],
    );
    assert_eq!(std::fs::read(input).unwrap(), before);
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(&corpus, "a b c a b c a b\n".repeat(50)).unwrap();
    let c = format!("data.corpus=\"{}\"", corpus.display());
    let mut args: Vec<String> =
        ["train", "configs/skipgram-quickstart.toml", "--set", &c, "--export-vectors"].map(String::from).to_vec();
    args.push(corpus.display().to_string());
    args.extend(quiet_in(dir.path()));
    fails(&args, &["--export-vectors", "is the data.corpus file"]);
}

/// Kills (SIGKILL) a training run at several moments, checkpointing every few steps: every
/// line of `metrics.jsonl` written so far is whole JSON, the newest complete checkpoint loads,
/// and `--resume` finishes the run.
#[test]
fn a_run_killed_at_any_moment_keeps_its_log_and_a_checkpoint_that_resumes() {
    let face = [
        "--set",
        "data.face.n_classes=200",
        "--set",
        "data.face.n_samples=3000",
        "--set",
        "train.batch_size=16",
        "--set",
        "train.log_every=1",
        "--set",
        "checkpoint.every_steps=3",
        "--set",
        "train.epochs=30",
    ];
    let mut resumed = 0;
    for delay_ms in [700, 1100, 1500, 1900, 2300] {
        let dir = tempfile::tempdir().unwrap();
        let args = tiny("train", "configs/quickstart.toml", dir.path(), &face);
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_farout"))
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        if child.try_wait().unwrap().is_some() {
            continue; // finished before the kill: nothing to check
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let log = std::fs::read_to_string(dir.path().join("log/metrics.jsonl")).unwrap_or_default();
        for line in log.lines() {
            assert!(serde_json::from_str::<serde_json::Value>(line).is_ok(), "a torn log line: {line:?}");
        }
        let ck = dir.path().join("ckpt");
        let any = ["", ".tmp", ".old"].iter().any(|s| Path::new(&format!("{}{s}", ck.display())).exists());
        if !any {
            continue; // killed before the first checkpoint
        }
        let o = run(&tiny("eval", "configs/quickstart.toml", dir.path(), &face));
        assert!(o.status.success(), "killed after {delay_ms} ms, eval: {}", stderr(&o));
        let mut resume = tiny("train", "configs/quickstart.toml", dir.path(), &face);
        resume.extend(["--resume".into(), "--set".into(), "train.epochs=1".into()]);
        let o = run(&resume);
        // Resuming a run past its (now shorter) end is fine: it stops at once and evaluates.
        assert!(o.status.success(), "killed after {delay_ms} ms, resume: {}", stderr(&o));
        resumed += 1;
    }
    assert!(resumed >= 2, "only {resumed} of 5 kills came after a checkpoint and before the end");
}

#[test]
#[cfg(not(feature = "mpi"))]
fn several_mpi_ranks_without_the_mpi_feature_are_refused_and_only_rank_0_says_why() {
    let launched = |rank: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_farout"))
            .args(["train", "configs/quickstart.toml"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("OMPI_COMM_WORLD_SIZE", "2")
            .env("OMPI_COMM_WORLD_RANK", rank)
            .output()
            .unwrap()
    };
    let (root, other) = (launched("0"), launched("1"));
    assert!(!root.status.success() && !other.status.success());
    let msg = stderr(&root);
    assert!(msg.contains("mpirun with 2 ranks (OMPI_COMM_WORLD_SIZE=2)"), "{msg}");
    assert!(msg.contains("rebuild with --features mpi"), "{msg}");
    assert!(stderr(&other).is_empty(), "{}", stderr(&other));
}

#[test]
fn a_closed_output_pipe_ends_the_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    summary(&run(&tiny("train", SOFTMAX, dir.path(), &["--set", "train.epochs=1"])));
    let input = dir.path().join("many.txt");
    std::fs::write(&input, format!("5000 200 20\n{}", "1 0:1 3:0.5\n".repeat(5000))).unwrap();
    let args = tiny("predict", SOFTMAX, dir.path(), &["--input", input.to_str().unwrap(), "--top-k", "20"]);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_farout"))
        .args(&args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut first).unwrap();
    assert!(first.contains(':'), "{first}");
    // The reader is gone (like `farout predict ... | head -1`): ~1 MB more output must not panic.
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(o.status.success(), "exit {:?}: {err}", o.status);
}

/// `path` as a `--set` value (a quoted TOML string).
fn quoted(path: &Path) -> String {
    format!("\"{}\"", path.display())
}

/// Every path farout writes is checked against what the run reads or owns: the summary, the
/// predictions and the exported vectors never replace the config, the data or the trained
/// model, and a generated data set never replaces an earlier one silently.
#[test]
fn no_output_replaces_the_config_the_data_or_the_trained_model() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::copy(SOFTMAX, &config).unwrap();
    let config = config.to_str().unwrap();
    let before = std::fs::read(config).unwrap();
    let epoch = ["--set", "train.epochs=1"];
    fails(
        &tiny("train", config, dir.path(), &[&epoch[..], &["--summary", config]].concat()),
        &["--summary", "is the config file"],
    );
    assert_eq!(std::fs::read(config).unwrap(), before);
    summary(&run(&tiny("train", config, dir.path(), &epoch)));
    let manifest = dir.path().join("ckpt/manifest.json");
    let (m, layer) = (manifest.to_str().unwrap(), dir.path().join("ckpt/layer.bin"));
    let layer_before = std::fs::read(&layer).unwrap();
    fails(
        &tiny("train", config, dir.path(), &["--resume", "--set", "train.epochs=2", "--summary", m]),
        &[
            "--summary",
            "lies in the checkpoint directory (the trained model)",
            &dir.path().join("ckpt").display().to_string(),
        ],
    );
    fails(
        &tiny("predict", config, dir.path(), &["--out", layer.to_str().unwrap()]),
        &["--out", "lies in the checkpoint directory"],
    );
    fails(
        &tiny("export", config, dir.path(), &["--out", &dir.path().join("ckpt/w.npy").display().to_string()]),
        &["--out", "lies in the checkpoint directory"],
    );
    assert_eq!(std::fs::read(&layer).unwrap(), layer_before);
    assert!(manifest.exists());
    eval_p1(dir.path(), config, &[]);
    let data = dir.path().join("gen");
    let generate = |extra: &[&str]| {
        let mut a = vec!["data", "gen", "xmc", "--samples", "50", "--features", "30", "--labels", "5"];
        a.extend(["--out", data.to_str().unwrap()]);
        a.extend(extra);
        farout(&a)
    };
    assert!(generate(&[]).status.success());
    let o = generate(&["--seed", "2"]);
    assert!(!o.status.success() && stderr(&o).contains("already exist"), "{}", stderr(&o));
    assert!(stderr(&o).contains("train.txt") && stderr(&o).contains("--overwrite"), "{}", stderr(&o));
    assert!(generate(&["--seed", "2", "--overwrite"]).status.success());
}

/// NaN and infinities are refused where they enter, naming the file and row: `.npy` features
/// and the vectors `bench search --vectors` searches (which made the HNSW index panic), word
/// vectors, word-pair scores.
#[test]
fn nan_and_infinite_values_are_refused_at_every_entry() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.npy");
    let mut m = farout_core::Matrix::from_vec(3, 2, vec![1.0, 0.5, 0.2, 0.1, -0.3, 0.7]).unwrap();
    let q = dir.path().join("q.npy");
    farout_data::npy::write_f32_matrix(&q, &m).unwrap();
    m.row_mut(1)[0] = f32::NAN;
    farout_data::npy::write_f32_matrix(&w, &m).unwrap();
    for index in ["hnsw", "spherical", "simple_lsh", "hamming"] {
        let (w, q) = (w.to_str().unwrap(), q.to_str().unwrap());
        fails_with(
            &["bench", "search", "--index", index, "--vectors", w, "--query-vectors", q],
            &["w.npy: row 1, column 0 holds NaN"],
        );
    }
    let labels = dir.path().join("l.npy");
    farout_data::npy::write_ids(&labels, &[0, 1, 2]).unwrap();
    let npy = [
        "--set".to_string(),
        "data.format=\"npy\"".into(),
        "--set".into(),
        format!("data.train={}", quoted(&w)),
        "--set".into(),
        format!("data.train_labels={}", quoted(&labels)),
        "--set".into(),
        format!("data.test={}", quoted(&q)),
        "--set".into(),
        format!("data.test_labels={}", quoted(&labels)),
    ];
    let mut args = tiny("train", "configs/quickstart.toml", dir.path(), &[]);
    args.extend(npy);
    fails(&args, &["w.npy: row 1, column 0 holds NaN"]);
    let pairs = dir.path().join("pairs.tsv");
    std::fs::write(&pairs, "the cat 5.0\ncat dog nan\n").unwrap();
    let vectors = dir.path().join("v.txt");
    std::fs::write(&vectors, "3 2\nthe 0.1 0.2\ncat 0.4 0.3\ndog 0.2 0.1\n").unwrap();
    fails_with(
        &["eval", "similarity", "--vectors", vectors.to_str().unwrap(), "--pairs", pairs.to_str().unwrap()],
        &["pairs.tsv:2: score NaN is not finite"],
    );
    std::fs::write(&vectors, "3 2\nthe 0.1 0.2\ncat inf 0.3\ndog 0.2 0.1\n").unwrap();
    fails_with(
        &["vectors", "--vectors", vectors.to_str().unwrap(), "cat"],
        &["v.txt: 1 of 3 vectors hold NaN or infinite values (the first: `cat`, line 3)"],
    );
}

/// Sizes that reach an allocation are checked first, with the key to change: a label id of
/// 10^8 (K = 10^8 + 1 classes and a batch's scores over them), the skip-gram tables before the
/// corpus is written, a `--top-k` of 2^64 - 1.
#[test]
fn sizes_are_checked_before_they_are_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    farout_data::npy::write_f32_matrix(&x, &farout_core::Matrix::from_vec(2, 1, vec![0.5, -0.5]).unwrap()).unwrap();
    let labels = dir.path().join("l.npy");
    farout_data::npy::write_ids(&labels, &[0, 100_000_000]).unwrap();
    let mut args = tiny("train", "configs/quickstart.toml", dir.path(), &[]);
    for (key, p) in [("train", &x), ("train_labels", &labels), ("test", &x), ("test_labels", &labels)] {
        args.extend(["--set".into(), format!("data.{key}={}", quoted(p))]);
    }
    args.extend(["--set".into(), "data.format=\"npy\"".into(), "--set".into(), "train.batch_size=256".into()]);
    fails(&args, &["100000001 classes", "a batch's scores", "train.batch_size", "of memory are available"]);
    let sg =
        tiny("train", "configs/skipgram-quickstart.toml", dir.path(), &["--set", "model.skip_gram.dim=1000000000"]);
    fails(&sg, &["the skip-gram tables", "model.skip_gram.dim", "of memory are available"]);
    assert!(!dir.path().join("log/corpus.txt").exists(), "no corpus was written");
    let buckets = ["--set", "model.skip_gram.maxn=6", "--set", "model.skip_gram.buckets=1073741824"];
    let sg = tiny("train", "configs/skipgram-quickstart.toml", dir.path(), &buckets);
    fails(&sg, &["1073741824 n-gram rows", "model.skip_gram.buckets", "of memory are available"]);
    assert!(!dir.path().join("log/corpus.txt").exists(), "no corpus was written");
    summary(&run(&tiny("train", SOFTMAX, dir.path(), &["--set", "train.epochs=1"])));
    let o = run(&tiny("predict", SOFTMAX, dir.path(), &["--top-k", "18446744073709551615"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let first = String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or_default().to_string();
    assert_eq!(first.split_whitespace().count(), 20, "every one of the K = 20 classes: {first}");
}

/// A blow-up the loss does not show (SGD at lr 10^20 with the margin loss, which is 0 once
/// every margin is met, however large the weights) is caught by the weights' scale.
#[test]
fn weights_that_blow_up_behind_a_small_loss_stop_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let sgd = ["--set", "output.optimizer={kind=\"sgd\",lr=1e20,decay=0.0}", "--set", "train.epochs=2"];
    fails(
        &tiny("train", "configs/bibtex-margin.toml", dir.path(), &sgd),
        &["training diverged at step", "an output-layer weight reaches", "output.optimizer.lr"],
    );
}

/// Messages say what was assumed and which key to change.
#[test]
fn messages_name_the_format_assumed_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let bad_header = file("bad.txt", "2 200\n1 0:1\n3 4:1\n");
    fails(
        &tiny("train", SOFTMAX, dir.path(), &["--set", &format!("data.train={}", quoted(&bad_header))]),
        &["bad.txt:1:", "not an XMC header of three integers `N D K`, so the file was read as LIBSVM"],
    );
    fails(
        &tiny("train", "configs/quickstart.toml", dir.path(), &["--set", "data.face.dim=0"]),
        &["data.face.dim", "must be > 0"],
    );
    fails(&tiny("train", SOFTMAX, dir.path(), &["--set", "index.recall_queries=0"]), &["index.recall_queries"]);
    // A LIBSVM test file narrower than the training file is padded, as LIBSVM does.
    let train = file("train.libsvm", "0 0:1 5:1\n1 1:1 6:1\n2 2:1 3:1\n0 0:1 4:1\n");
    let test = file("test.libsvm", "0 0:1\n1 1:1\n");
    let mut libsvm: Vec<String> = vec!["train".into(), SOFTMAX.into()];
    for (key, p) in [("train", &train), ("test", &test)] {
        libsvm.extend(["--set".into(), format!("data.{key}={}", quoted(p))]);
    }
    libsvm.extend(quiet_in(dir.path()));
    libsvm.extend(["--set".into(), "train.epochs=1".into()]);
    summary(&run(&libsvm));
    // Evaluation needs no optimiser state: a run trained with another optimiser evaluates.
    let run_dir = dir.path().join("sgd");
    let sgd = ["--set", "output.optimizer={kind=\"sgd\",lr=0.02,decay=0.0}", "--set", "train.epochs=1"];
    summary(&run(&tiny("train", SOFTMAX, &run_dir, &sgd)));
    eval_p1(&run_dir, SOFTMAX, &[]);
    let npy = dir.path().join("v.npy");
    farout_data::npy::write_f32_matrix(&npy, &farout_core::Matrix::zeros(2, 2)).unwrap();
    fails_with(
        &["vectors", "--vectors", npy.to_str().unwrap(), "cat"],
        &["v.npy: a numpy .npy array, not word vectors"],
    );
    // A network config pointed at a linear model's checkpoint.
    let linear = dir.path().join("linear");
    summary(&run(&tiny("train", "configs/bibtex-dismec.toml", &linear, &[])));
    let ck = linear.join("ckpt");
    fails(
        &tiny("eval", SOFTMAX, dir.path(), &["--checkpoint", ck.to_str().unwrap()]),
        &["holds a linear model (linear.model), not a network's checkpoint"],
    );
}

/// Results that would be silently meaningless are errors: a corpus that gives no training
/// pair, an analogy or word-pair file without questions.
#[test]
fn degenerate_inputs_are_errors_not_meaningless_results() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("tiny.txt");
    std::fs::write(&corpus, "the cat sat\n").unwrap();
    let sets = ["--set", &format!("data.corpus={}", quoted(&corpus)), "--set", "data.text.min_count=1"];
    fails(
        &tiny("train", "configs/skipgram-quickstart.toml", dir.path(), &sets),
        &["tiny.txt", "trained no (context, centre) pair"],
    );
    let vectors = dir.path().join("v.txt");
    std::fs::write(&vectors, "3 2\nthe 0.1 0.2\ncat 0.4 0.3\ndog 0.2 0.1\n").unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let (v, e) = (vectors.to_str().unwrap(), empty.to_str().unwrap());
    fails_with(&["eval", "analogy", "--vectors", v, "--questions", e], &["empty.txt: holds no analogy questions"]);
    fails_with(&["eval", "similarity", "--vectors", v, "--pairs", e], &["empty.txt: holds no word pairs"]);
}
