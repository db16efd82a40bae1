//! `farout` under `mpirun -np 1/2/4` (feature `mpi`): label-parallel DiSMEC and PPDSparse give
//! the model of one process, a sharded model evaluates and predicts at any rank count, the
//! class-sharded layer trains like one process and resumes after a kill, and what cannot run on
//! several ranks says so once.
//!
//! Run with `cargo test --release --features mpi --test mpi` (needs `mpirun`; Open MPI from
//! `openmpi-bin`). Each launch is bounded by a timeout, so a hung collective fails the test.
#![cfg(feature = "mpi")]

use farout_linear::SparseModel;
use farout_train::linear::{MODEL_FILE, SHARDS_FILE, ShardManifest};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const FAROUT: &str = env!("CARGO_BIN_EXE_farout");
const TIMEOUT: Duration = Duration::from_secs(300);

/// One mpirun at a time: 4 oversubscribed ranks already fill a 2-core machine.
static MPIRUN: Mutex<()> = Mutex::new(());

/// `mpirun` with one app context per entry of `apps` (`-np ranks farout args... : ...`), from the
/// project root; waits at most `TIMEOUT`.
fn mpirun_apps(apps: &[(usize, Vec<String>)]) -> Output {
    let _one_at_a_time = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new("mpirun");
    // --allow-run-as-root: CI runs as root; --oversubscribe: 4 ranks on 2 cores.
    cmd.args(["--allow-run-as-root", "--oversubscribe"]);
    for (i, (ranks, args)) in apps.iter().enumerate() {
        if i > 0 {
            cmd.arg(":");
        }
        cmd.args(["-np", &ranks.to_string(), FAROUT]).args(args);
    }
    cmd.current_dir(env!("CARGO_MANIFEST_DIR")).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().expect("mpirun runs (apt-get install openmpi-bin)");
    while child.try_wait().expect("wait for mpirun").is_none() {
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect mpirun output");
            panic!("mpirun did not finish within {TIMEOUT:?}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("collect mpirun output")
}

fn mpirun(ranks: usize, args: &[String]) -> Output {
    mpirun_apps(&[(ranks, args.to_vec())])
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: &Output) -> &Output {
    assert!(o.status.success(), "farout failed under mpirun:\n{}", stderr(o));
    o
}

/// A linear config on a generated multi-label problem (the same on every rank: seeded).
fn config(dir: &Path, solver: &str) -> PathBuf {
    let path = dir.join(format!("{solver}.toml"));
    let text = format!(
        "name = \"mpi-{solver}\"\n\
         [data]\nformat = \"synthetic_xmc\"\n\
         [data.xmc]\nn_samples = 1500\nn_features = 800\nn_labels = 57\n\
         [linear]\nsolver = \"{solver}\"\n\
         [log]\nprogress = false\ntensorboard = false\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `train|eval|predict CONFIG` with the run's directories in `run`, plus `extra`.
fn args(command: &str, config: &Path, run: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = vec![command.to_string(), config.display().to_string()];
    for set in [format!("log.dir=\"{}\"", run.display()), format!("checkpoint.dir=\"{}\"", run.join("ckpt").display())]
    {
        a.extend(["--set".to_string(), set]);
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// The whole model a run saved: `linear.model`, or its shards joined in manifest order.
fn saved_model(run: &Path) -> SparseModel {
    let ck = run.join("ckpt");
    if ck.join(MODEL_FILE).exists() {
        return SparseModel::load(&ck.join(MODEL_FILE)).unwrap();
    }
    let m: ShardManifest = serde_json::from_str(&std::fs::read_to_string(ck.join(SHARDS_FILE)).unwrap()).unwrap();
    let parts: Vec<SparseModel> = m.shards.iter().map(|s| SparseModel::load(&ck.join(&s.file)).unwrap()).collect();
    SparseModel::concat(&parts).unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&ok(o).stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

#[test]
fn label_parallel_models_equal_the_one_process_model() {
    let dir = tempfile::tempdir().unwrap();
    for solver in ["dismec", "ppdsparse"] {
        let cfg = config(dir.path(), solver);
        let mut reference: Option<(SparseModel, serde_json::Value)> = None;
        let mut totals1 = serde_json::Value::Null;
        for ranks in [1, 2, 4] {
            let run = dir.path().join(format!("{solver}-np{ranks}"));
            let out = mpirun(ranks, &args("train", &cfg, &run, &[]));
            // One summary on standard output and one rank's log lines on standard error.
            let summary = json(&out);
            let err = stderr(&out);
            assert_eq!(err.matches("saved the model").count(), 1, "{err}");
            assert!(!err.contains("(rank "), "{err}");
            let model = saved_model(&run);
            assert_eq!(model.n_labels(), 57);
            if ranks > 1 {
                let stats = &summary["linear"]["stats"];
                assert_eq!(stats["ranks"], ranks, "{summary}");
                let labels: Vec<u64> =
                    stats["rank_labels"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
                assert_eq!((labels.len(), labels.iter().sum::<u64>()), (ranks, 57), "{summary}");
                assert!(labels.iter().all(|&n| n > 0), "{summary}");
                assert!(run.join("ckpt").join(SHARDS_FILE).exists());
                // Counters add up over the ranks' own statistics.
                let per_rank = stats["per_rank"].as_array().unwrap();
                assert_eq!(per_rank.len(), ranks);
                for key in ["cg_steps_total", "newton_iters_total", "cd_steps_total"] {
                    if let Some(total) = stats[key].as_u64() {
                        assert_eq!(total, per_rank.iter().map(|r| r[key].as_u64().unwrap()).sum::<u64>());
                        assert!(total > 0, "{key}: {summary}");
                    }
                }
            }
            match &reference {
                None => {
                    totals1 = summary["linear"]["stats"].clone();
                    reference = Some((model, summary["metrics"].clone()));
                }
                Some((m1, metrics1)) => {
                    // Every label trains exactly as in one process (its own generator, the same
                    // data statistics), and the merged top-k breaks ties as one process does.
                    assert!(&model == m1, "{solver}: the model of {ranks} ranks differs from one process's");
                    assert_eq!(&summary["metrics"], metrics1, "{solver}, {ranks} ranks");
                    let nnz = summary["linear"]["nnz_after_pruning"].as_u64().unwrap();
                    assert_eq!(nnz as usize, m1.nnz(), "{summary}");
                    for key in ["cg_steps_total", "newton_iters_total", "cd_steps_total"] {
                        assert_eq!(summary["linear"]["stats"][key], totals1[key], "{key}");
                    }
                }
            }
        }
    }
}

/// Label `k` of `model` as a dense row of `d` weights.
fn dense_label(model: &SparseModel, k: usize, d: usize) -> Vec<f32> {
    let mut row = vec![0f32; d];
    let (features, weights, _) = model.label(k);
    features.iter().zip(weights).for_each(|(&j, &w)| row[j as usize] = w);
    row
}

#[test]
fn memoir_with_its_class_matrix_split_over_ranks_trains_the_one_process_model() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "memoir");
    // The exact oracle (the default HNSW draws its graph levels unseeded), 4 epochs.
    let set = ["--set", "linear.oracle={kind=\"exact\"}", "--set", "linear.epochs=4"];
    let mut reference: Option<(SparseModel, serde_json::Value)> = None;
    for ranks in [1, 2, 4] {
        let run = dir.path().join(format!("memoir-np{ranks}"));
        let summary = json(&mpirun(ranks, &args("train", &cfg, &run, &set)));
        let model = saved_model(&run);
        assert_eq!(model.n_labels(), 57);
        let stats = &summary["linear"]["stats"];
        let epochs = if ranks == 1 { &stats["epochs"] } else { &stats["per_rank"][0]["epochs"] };
        let violations: Vec<f64> =
            epochs.as_array().unwrap().iter().map(|e| e["violations"].as_f64().unwrap()).collect();
        assert_eq!(violations.len(), 4, "{summary}");
        match &reference {
            None => reference = Some((model, summary.clone())),
            Some((m1, s1)) => {
                // An even split of the classes, as the output layer's.
                let counts: Vec<u64> =
                    stats["rank_labels"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
                assert_eq!(counts.iter().sum::<u64>(), 57);
                assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1, "{counts:?}");
                // Every pair is decided as in one process; the weights differ by the rounding of
                // the summed norms only.
                let v1: Vec<f64> = s1["linear"]["stats"]["epochs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| e["violations"].as_f64().unwrap())
                    .collect();
                assert_eq!(violations, v1, "{ranks} ranks");
                let d = m1.n_features();
                let mut largest = 0f32;
                for k in 0..57 {
                    for (a, b) in dense_label(&model, k, d).iter().zip(dense_label(m1, k, d)) {
                        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{ranks} ranks, label {k}: {a} vs {b}");
                        largest = largest.max(b.abs());
                    }
                }
                assert!(largest > 0.0);
                for key in ["p@1", "p@3", "p@5"] {
                    let (a, b) = (summary["metrics"][key].as_f64().unwrap(), s1["metrics"][key].as_f64().unwrap());
                    assert!((a - b).abs() <= 1e-3, "{key}: {ranks} ranks {a}, one process {b}");
                }
            }
        }
    }
}

#[test]
fn a_sharded_model_evaluates_and_predicts_at_any_rank_count() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "dismec");
    let run = dir.path().join("np4");
    let trained = json(&mpirun(4, &args("train", &cfg, &run, &[])));
    for ranks in [1, 2, 4] {
        let metrics = json(&mpirun(ranks, &args("eval", &cfg, &run, &[])));
        assert_eq!(metrics, trained["metrics"], "eval at {ranks} ranks");
    }
    let predict = |ranks| ok(&mpirun(ranks, &args("predict", &cfg, &run, &["--top-k", "7"]))).stdout.clone();
    let one = predict(1);
    let n_test = trained["n_test"].as_u64().unwrap() as usize;
    assert!(n_test > 100, "{trained}");
    assert_eq!(String::from_utf8_lossy(&one).lines().count(), n_test, "one line per test sample");
    for ranks in [2, 4] {
        assert!(predict(ranks) == one, "predictions at {ranks} ranks differ from one process's");
    }
}

#[test]
fn what_cannot_run_on_several_ranks_says_so_once() {
    let dir = tempfile::tempdir().unwrap();
    let once = |o: &Output, needle: &str| {
        assert!(!o.status.success());
        let err = stderr(o);
        assert_eq!(err.matches("error:").count(), 1, "{err}");
        assert!(err.contains(needle), "{err}");
    };
    let quick = PathBuf::from("configs/quickstart.toml");
    let partial = ["--set", "output.estimator=\"ldgs\"", "--set", "output.rescore=\"partial\""];
    once(&mpirun(2, &args("train", &quick, &dir.path().join("q"), &partial)), "key `output.estimator`");
    let corpus = PathBuf::from("configs/skipgram-quickstart.toml");
    once(&mpirun(2, &args("train", &corpus, &dir.path().join("s"), &[])), "run it without mpirun");
    let corpus = ["data", "gen", "corpus", "--tokens", "10", "--vocab", "5", "--out"];
    let mut corpus: Vec<String> = corpus.iter().map(|s| s.to_string()).collect();
    corpus.push(dir.path().join("c.txt").display().to_string());
    once(&mpirun(2, &corpus), "run it without mpirun");
    assert!(!dir.path().join("c.txt").exists());
    // Ranks started with different overrides.
    let dismec = config(dir.path(), "dismec");
    let run = dir.path().join("d");
    let a = args("train", &dismec, &run, &["--set", "linear.c=1.0"]);
    let b = args("train", &dismec, &run, &["--set", "linear.c=2.0"]);
    once(&mpirun_apps(&[(1, a), (1, b)]), "loaded different configs");
}

#[test]
fn a_class_sharded_softmax_layer_steps_like_one_process() {
    let bench_chunked = |ranks: usize, estimator: &str, class_chunk: usize| {
        let chunk = class_chunk.to_string();
        let args = [
            "bench",
            "layer",
            "--estimator",
            estimator,
            "--k",
            "20000",
            "--d",
            "48",
            "--batch",
            "64",
            "--steps",
            "50",
            "--class-chunk",
            &chunk,
        ];
        mpirun(ranks, &args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    };
    let bench = |ranks: usize, estimator: &str| bench_chunked(ranks, estimator, 0);
    let losses = |o: &Output| -> Vec<f64> {
        json(o)["losses"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
    };
    // One process: the exact softmax estimator on the whole layer; several: the sharded step.
    let one = losses(&bench(1, "softmax"));
    assert_eq!(one.len(), 50);
    assert!(one[49] < 0.9 * one[0], "the loss falls: {one:?}");
    // The classes visited 3,000 at a time (a size that divides no shard), on 1, 2 and 4 ranks.
    let chunked = [(1, 3000), (2, 0), (2, 3000), (4, 0), (4, 3000)];
    for (ranks, chunk) in chunked {
        let out = bench_chunked(ranks, "softmax", chunk);
        let j = json(&out);
        assert_eq!(j["class_chunk"], chunk, "{j}");
        assert_eq!((j["ranks"].as_u64(), j["sharded"].as_bool()), (Some(ranks as u64), Some(true)), "{j}");
        assert_eq!(j["rows_of_rank_0"], 20000 / ranks, "{j}");
        for (step, (a, b)) in losses(&out).iter().zip(&one).enumerate() {
            assert!((a - b).abs() <= 1e-4 * b.abs(), "{ranks} ranks, chunk {chunk}, step {step}: {a} against {b}");
        }
    }
    let o = bench(2, "ar_softmax");
    assert!(!o.status.success());
    let err = stderr(&o);
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    assert!(err.contains("class-sharded exact softmax"), "{err}");
}

/// The quickstart's face task, small: 1,000 identities, 10,000 samples, 2 epochs (64 steps),
/// the training loss logged at every step.
fn face_args(command: &str, run: &Path, extra: &[&str]) -> Vec<String> {
    let sets = [
        "data.face.n_classes=1000",
        "data.face.n_samples=10000",
        "train.epochs=2",
        "train.log_every=1",
        "log.progress=false",
    ];
    let mut a = args(command, Path::new("configs/quickstart.toml"), run, &[]);
    for s in sets {
        a.extend(["--set".to_string(), s.to_string()]);
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// (step, train/loss) of every step a run logged.
fn step_losses(run: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|v| Some((v["step"].as_u64()?, v["train/loss"].as_f64()?)))
        .collect()
}

#[test]
fn a_class_sharded_softmax_layer_trains_like_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let run = |ranks: usize| dir.path().join(format!("np{ranks}"));
    let one = json(&mpirun(1, &face_args("train", &run(1), &[])));
    let losses1 = step_losses(&run(1));
    assert_eq!(losses1.len(), 64);
    assert!(one["metrics"]["p@1"].as_f64().unwrap() > 0.5, "{one}");
    for ranks in [2, 4] {
        let out = mpirun(ranks, &face_args("train", &run(ranks), &[]));
        let s = json(&out);
        assert!(!stderr(&out).contains("(rank "), "{}", stderr(&out));
        // The loss of every step, and the final metrics, are one process's.
        let losses = step_losses(&run(ranks));
        assert_eq!(losses.len(), 64, "one log line per step, from rank 0 only");
        for ((step, a), (_, b)) in losses.iter().zip(&losses1) {
            assert!((a - b).abs() <= 1e-4 * b.abs(), "{ranks} ranks, step {step}: {a} against {b}");
        }
        for key in ["p@1", "p@5", "loss"] {
            let (a, b) = (s["metrics"][key].as_f64().unwrap(), one["metrics"][key].as_f64().unwrap());
            assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{ranks} ranks, {key}: {a} against {b}");
        }
        assert_eq!(s["model_bytes"], one["model_bytes"], "the ranks' rows add up to the layer");
        for r in 0..ranks {
            assert!(run(ranks).join("ckpt").join(format!("rank-{r}-of-{ranks}")).join("layer.bin").exists());
        }
    }
    // The checkpoint of 2 ranks evaluates at 2 ranks to the final metrics; other counts are refused.
    let trained = json(&mpirun(2, &face_args("train", &dir.path().join("again"), &["--set", "train.epochs=1"])));
    let eval = json(&mpirun(2, &face_args("eval", &dir.path().join("again"), &[])));
    assert_eq!(eval, trained["metrics"]);
    for ranks in [1, 4] {
        let o = mpirun(ranks, &face_args("eval", &dir.path().join("again"), &[]));
        assert!(!o.status.success());
        let err = stderr(&o);
        assert_eq!(err.matches("error:").count(), 1, "{err}");
        assert!(err.contains("holds the checkpoints of 2 MPI ranks"), "{err}");
    }
    // Resumed after its first epoch at 2 ranks, the run ends as the uninterrupted one.
    let resumed = json(&mpirun(2, &face_args("train", &dir.path().join("again"), &["--resume"])));
    let straight = json(&mpirun(2, &face_args("train", &run(2), &["--overwrite"])));
    for key in ["p@1", "loss"] {
        let (a, b) = (resumed["metrics"][key].as_f64().unwrap(), straight["metrics"][key].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{key}: resumed {a}, straight {b}");
    }
}

/// The sharded phases' milliseconds (`train/phase_*_ms`, `train/comm_ms`) of every step a run
/// logged that has them.
fn phase_ms(run: &Path) -> Vec<std::collections::BTreeMap<String, f64>> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| {
            let o = v.as_object().unwrap();
            let timed = o.iter().filter(|(k, _)| k.starts_with("train/phase_") || *k == "train/comm_ms");
            timed.map(|(k, x)| (k.clone(), x.as_f64().unwrap())).collect::<std::collections::BTreeMap<_, _>>()
        })
        .filter(|m| !m.is_empty())
        .collect()
}

/// The face task's settings for a search or sampling estimator: `estimator` with its defaults
/// on a layer without bias (the indexes search W alone), ldgs on 4 blocks of 32 dimensions.
fn estimator_sets(estimator: &str) -> Vec<String> {
    let mut sets = vec![format!("output.estimator=\"{estimator}\""), "output.layer.bias=false".to_string()];
    if estimator == "ldgs" {
        sets.push("output.blocks=4".to_string());
    }
    sets.into_iter().flat_map(|s| ["--set".to_string(), s]).collect()
}

/// The exact margin gathers the classes near each sample's best negative; with brute-force
/// indexes, every block's top-Q over the ranks is the top-Q of the whole layer; sampled softmax,
/// negative sampling, OVE and A&R draw the same classes on every rank (A&R's per-sample state
/// updated alike on every rank): all nine take one process's steps at 2 and 4 ranks.
#[test]
fn margin_search_and_sampling_estimators_step_like_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let estimators = ["margin", "mips", "ldgs", "sampled_softmax", "negative_sampling", "ove"];
    for estimator in estimators.into_iter().chain(["ar_softmax", "ar_probit", "ar_logistic"]) {
        let mut sets = estimator_sets(estimator);
        sets.extend(["--set".to_string(), "index.kind=\"exact\"".to_string()]);
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let run = |ranks: usize| dir.path().join(format!("{estimator}-np{ranks}"));
        let one = json(&mpirun(1, &face_args("train", &run(1), &sets)));
        let losses1 = step_losses(&run(1));
        assert_eq!(losses1.len(), 64, "{estimator}");
        if estimator == "negative_sampling" {
            // Its objective rises over the first steps here (rows align with the features' common
            // direction, so random negatives score higher), but it learns: P@1 0.085, chance 0.001.
            assert!(one["metrics"]["p@1"].as_f64().unwrap() > 0.05, "{estimator}: {one}");
        } else {
            assert!(losses1[63].1 < 0.9 * losses1[0].1, "{estimator}: the loss falls: {losses1:?}");
        }
        assert!(phase_ms(&run(1)).is_empty(), "{estimator}: one process has no sharded phases");
        for ranks in [2, 4] {
            let s = json(&mpirun(ranks, &face_args("train", &run(ranks), &sets)));
            // Every step's log has the sharded step's phases (rank 0's), searched or drawn.
            let phases = phase_ms(&run(ranks));
            assert_eq!(phases.len(), 64, "{estimator}: {phases:?}");
            let search = if estimator.starts_with("ar_")
                || ["sampled_softmax", "negative_sampling", "ove"].contains(&estimator)
            {
                "search"
            } else {
                "candidates"
            };
            assert!(
                phases.iter().all(|p| p["train/comm_ms"] >= 0.0 && p[&format!("train/phase_{search}_ms")] > 0.0),
                "{estimator}: {phases:?}"
            );
            for ((step, a), (_, b)) in step_losses(&run(ranks)).iter().zip(&losses1) {
                assert!((a - b).abs() <= 1e-4 * b.abs(), "{estimator}, {ranks} ranks, step {step}: {a} against {b}");
            }
            let (a, b) = (s["metrics"]["p@1"].as_f64().unwrap(), one["metrics"]["p@1"].as_f64().unwrap());
            assert!((a - b).abs() <= 0.001, "{estimator}, {ranks} ranks: p@1 {a} against {b}");
            // Each rank rounds its block products up to full rows: up to one class per rank.
            let (a, b) =
                (s["classes_scored_per_sample"].as_f64().unwrap(), one["classes_scored_per_sample"].as_f64().unwrap());
            assert!((a - b).abs() <= ranks as f64, "{estimator}, {ranks} ranks: {a} classes scored against {b}");
        }
    }
}

/// With approximate indexes (each rank's over its own rows) the ranks' search differs from one
/// process's, so the runs differ: over 3 seeds, the mean test P@1 of mips, ldgs and sampled
/// softmax at 2 and 4 ranks is at most 0.5 points below one process's (ldgs' is above it: the
/// ranks' indexes together return P top-Q lists of a block, of which the merge keeps the best
/// Q, a larger pool than one index's Q). The indexes: mips' spherical
/// index calibrated to its default recall, ldgs' probing a fixed 5 Q rows per block and query
/// (split over the ranks), on 5,000 identities around a 12-d subspace (test set: 10,000).
#[test]
fn search_and_sampling_estimators_reach_one_process_accuracy_over_3_seeds() {
    let dir = tempfile::tempdir().unwrap();
    for estimator in ["mips", "ldgs", "sampled_softmax"] {
        let mut sets = estimator_sets(estimator);
        let common = [
            "data.face.n_classes=5000",
            "data.face.n_samples=50000",
            "data.face.intrinsic_dim=12",
            "train.epochs=1",
            "eval.final_max_samples=0",
            "index.kind=\"spherical\"",
        ];
        sets.extend(common.iter().flat_map(|s| ["--set".to_string(), s.to_string()]));
        if estimator == "ldgs" {
            sets.extend(["--set".to_string(), "index.candidate_factor=5.0".to_string()]);
        }
        let mean_p1 = |ranks: usize| -> f64 {
            let p1: Vec<f64> = (1..=3)
                .map(|seed| {
                    let run = dir.path().join(format!("{estimator}-np{ranks}-seed{seed}"));
                    let mut extra = sets.clone();
                    extra.extend(["--set".to_string(), format!("seed={seed}")]);
                    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                    let s = json(&mpirun(ranks, &face_args("train", &run, &extra)));
                    s["metrics"]["p@1"].as_f64().unwrap()
                })
                .collect();
            eprintln!("{estimator} at {ranks} ranks: test p@1 {p1:?}");
            p1.iter().sum::<f64>() / 3.0
        };
        let one = mean_p1(1);
        assert!(one > 0.3, "{estimator} learns: mean p@1 {one}");
        for ranks in [2, 4] {
            let p = mean_p1(ranks);
            assert!(p >= one - 0.005, "{estimator}, {ranks} ranks: mean p@1 {p} against {one} in one process");
        }
    }
}

/// A document-tagging config in `dir`: 10,000 synthetic documents over 2,000 features and 300
/// labels, two epochs of 64 documents, the exact softmax.
fn doc_config(dir: &Path) -> PathBuf {
    let config = dir.join("doc.toml");
    let text = "seed = 3\n\
         [data]\nformat = \"synthetic_xmc\"\n\
         [data.xmc]\nn_samples = 10000\nn_features = 2000\nn_labels = 300\n\
         [model]\nencoder = \"doc_encoder\"\n\
         [model.doc_encoder]\nd_model = 32\noptimizer = { kind = \"adagrad\", lr = 0.05 }\n\
         [output.optimizer]\nkind = \"adagrad\"\nlr = 0.05\n\
         [train]\nepochs = 2\nbatch_size = 64\nlog_every = 1\n\
         [log]\nprogress = false\ntensorboard = false\n";
    std::fs::write(&config, text).unwrap();
    config
}

/// The document encoder trains with its output layer class-sharded, data-parallel (each rank
/// encodes its share of the batch and the ranks sum the encoder's gradients), replicated
/// (every rank encodes the whole batch) and feature-sharded (each rank holds every P-th
/// feature's row and the ranks sum the bags). With the exact softmax and sampled softmax,
/// every step's loss at 2 and 4 ranks is one process's, and so is the final P@1. ldgs over
/// brute-force indexes takes the same steps up to the order of the sums over the ranks, which
/// moves a class across the edge of a block's top-Q now and then: its final P@1 is within 0.5
/// points.
#[test]
fn a_document_encoder_trains_data_parallel_replicated_and_feature_sharded_like_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let config = doc_config(dir.path());
    let runs = [("softmax", "data"), ("ldgs", "data"), ("sampled_softmax", "data"), ("softmax", "replicated")];
    let more = [("ldgs", "replicated"), ("softmax", "features"), ("ldgs", "features")];
    for (estimator, mode) in runs.into_iter().chain(more) {
        let mut sets = vec![format!("output.estimator=\"{estimator}\""), format!("model.doc_encoder.ranks=\"{mode}\"")];
        if estimator == "ldgs" {
            sets.extend(["output.layer.bias=false".into(), "output.blocks=4".into(), "index.kind=\"exact\"".into()]);
        }
        let sets: Vec<String> = sets.into_iter().flat_map(|s| ["--set".to_string(), s]).collect();
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let run = |ranks: usize| dir.path().join(format!("{estimator}-{mode}-np{ranks}"));
        let one = json(&mpirun(1, &args("train", &config, &run(1), &sets)));
        let losses1 = step_losses(&run(1));
        assert!(losses1.len() > 60, "{estimator}: {} steps", losses1.len());
        assert!(losses1.last().unwrap().1 < 0.9 * losses1[0].1, "{estimator}: the loss falls: {losses1:?}");
        for ranks in [2, 4] {
            let s = json(&mpirun(ranks, &args("train", &config, &run(ranks), &sets)));
            let losses = step_losses(&run(ranks));
            let at = format!("{estimator}, {mode}, {ranks} ranks");
            assert_eq!(losses.len(), losses1.len(), "{at}");
            let (a, b) = (s["metrics"]["p@1"].as_f64().unwrap(), one["metrics"]["p@1"].as_f64().unwrap());
            if estimator == "ldgs" {
                assert!((a - b).abs() <= 0.005, "{at}: p@1 {a} against {b}");
                continue;
            }
            for ((step, a), (_, b)) in losses.iter().zip(&losses1) {
                assert!((a - b).abs() <= 1e-4 * b.abs(), "{at}, step {step}: {a} against {b}");
            }
            assert!((a - b).abs() <= 0.001, "{at}: p@1 {a} against {b}");
        }
    }
}

/// A feature-sharded document encoder's checkpoint holds the whole input table: written by 2
/// ranks, it evaluates to the same metrics on 2 ranks and, re-sharded, in one process; and a
/// run resumed from it on 2 ranks ends as the uninterrupted one.
#[test]
fn a_feature_sharded_document_encoder_saves_the_whole_table_and_resumes_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = doc_config(dir.path());
    let (first, resumed, straight) =
        (dir.path().join("first"), dir.path().join("resumed"), dir.path().join("straight"));
    let softmax = ["--set", "output.estimator=\"softmax\""];
    let one_epoch = [&softmax[..], &["--set", "train.epochs=1"]].concat();
    let trained = json(&mpirun(2, &args("train", &config, &first, &one_epoch)));
    let ck = first.join("ckpt");
    let tables: Vec<Vec<u8>> =
        (0..2).map(|r| std::fs::read(ck.join(format!("rank-{r}-of-2")).join("table.bin")).unwrap()).collect();
    assert!(tables[0] == tables[1], "every rank writes the whole table");
    let one = dir.path().join("one");
    reshard(&ck, &one, 1);
    for (ranks, ckpt) in [(2, &ck), (1, &one)] {
        let at = ckpt.display().to_string();
        let metrics =
            json(&mpirun(ranks, &args("eval", &config, &first, &[&softmax[..], &["--checkpoint", &at]].concat())));
        for key in ["p@1", "p@5", "loss"] {
            let (a, b) = (metrics[key].as_f64().unwrap(), trained["metrics"][key].as_f64().unwrap());
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{ranks} ranks, {key}: {a} against {b}");
        }
    }
    let moved = format!("checkpoint.dir=\"{}\"", ck.display());
    let out = mpirun(2, &args("train", &config, &resumed, &[&softmax[..], &["--resume", "--set", &moved]].concat()));
    assert!(stderr(&out).contains("resuming at step 125"), "{}", stderr(&out));
    let (resumed, straight) = (json(&out), json(&mpirun(2, &args("train", &config, &straight, &softmax))));
    assert_eq!(resumed["steps"], straight["steps"]);
    for key in ["p@1", "p@5", "loss"] {
        let (a, b) = (resumed["metrics"][key].as_f64().unwrap(), straight["metrics"][key].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{key}: resumed {a}, straight {b}");
    }
}

/// The step of the checkpoint rank `r` of 2 last completed in `ckpt` (0 before the first).
fn checkpoint_step(ckpt: &Path, r: usize) -> u64 {
    let state = ckpt.join(format!("rank-{r}-of-2")).join("state.json");
    std::fs::read_to_string(state)
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|v| v["step"].as_u64())
        .unwrap_or(0)
}

/// The pid of rank `rank` among the children of `mpirun` (its environment names its rank).
fn rank_pid(mpirun: u32, rank: usize) -> Option<u32> {
    let env = format!("OMPI_COMM_WORLD_RANK={rank}");
    let pids = std::fs::read_dir("/proc").ok()?.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
    pids.into_iter().find(|pid| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        ppid == Some(mpirun)
            && std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|vars| vars.split(|&b| b == 0).any(|v| v == env.as_bytes()))
    })
}

/// How long the ranks of a job may take to stop after one of them was killed (they take 1 to 3
/// seconds); past it the test kills the job and fails.
const STOP_WITHIN: Duration = Duration::from_secs(20);

/// The step a run's log says it resumed at.
fn resumed_at(log: &str) -> Option<u64> {
    let (_, rest) = log.split_once("resuming at step ")?;
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Starts `mpirun MPIRUN_OPTS -np 2 farout ARGS`, waits until both ranks have checkpointed
/// `steps` steps past the run's start (step 0, or the step its log says it resumed at) in
/// `ckpt`, kills rank `victim` with SIGKILL and waits for the job to end. Returns the time
/// from the kill to the end of `mpirun`, its standard error and the step it resumed at. A job
/// still running `STOP_WITHIN` after the kill fails the test.
fn kill_a_rank(
    mpirun_opts: &[&str],
    args: &[String],
    ckpt: &Path,
    steps: u64,
    victim: usize,
) -> (Duration, String, Option<u64>) {
    let _one_at_a_time = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    let log = ckpt.parent().unwrap().with_extension(format!("kill-{victim}.err"));
    let mut child = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe"])
        .args(mpirun_opts)
        .args(["-np", "2", FAROUT])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("mpirun runs");
    let start = Instant::now();
    let resume = args.iter().any(|a| a == "--resume");
    let mut from = None;
    while from.is_none_or(|f| checkpoint_step(ckpt, 0).min(checkpoint_step(ckpt, 1)) < f + steps) {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before it could be killed:\n{}", read(&log));
        assert!(start.elapsed() < TIMEOUT, "no checkpoint within {TIMEOUT:?}");
        from = if resume { resumed_at(&read(&log)) } else { Some(0) };
        std::thread::sleep(Duration::from_millis(10));
    }
    let pids: Vec<u32> = (0..2).map(|r| rank_pid(child.id(), r).expect("the ranks are mpirun's children")).collect();
    let kill = |pid: u32| Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    assert!(kill(pids[victim]).success());
    let killed = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if killed.elapsed() > STOP_WITHIN {
            pids.iter().for_each(|&p| {
                let _ = kill(p);
            });
            let _ = child.kill();
            let _ = child.wait();
            panic!("rank {victim} was killed and the job still ran {STOP_WITHIN:?} later:\n{}", read(&log));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (killed.elapsed(), read(&log), from.filter(|_| resume))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A rank killed with SIGKILL mid-epoch stops the job within seconds, with a message naming
/// it: Open MPI's `mpirun` aborts the job itself; with that turned off (`--enable-recovery`)
/// the other rank's watchdog stops it. Each time `--resume` continues from the ranks' last
/// checkpoints (every 7 of 640 steps), and the run ends as the one that was never killed.
#[test]
fn a_killed_two_rank_run_resumes_and_ends_as_the_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let longer = ["--set", "train.epochs=20", "--set", "checkpoint.every_steps=7"];
    let straight = json(&mpirun(2, &face_args("train", &dir.path().join("straight"), &longer)));
    let run = dir.path().join("killed");
    let ckpt = run.join("ckpt");
    let (took, err, _) = kill_a_rank(&[], &face_args("train", &run, &longer), &ckpt, 16, 1);
    assert!(err.contains("process rank 1 with PID") && err.contains("signal 9"), "{err}");
    eprintln!("rank 1 killed: mpirun ended {took:?} later");
    let mut resume = face_args("train", &run, &longer);
    resume.push("--resume".into());
    // Resumed, and rank 0 killed 16 steps on, under an mpirun that does not abort the job.
    let recovery = ["--mca", "orte_enable_recovery", "1"];
    let (took, err, first) = kill_a_rank(&recovery, &resume, &ckpt, 16, 0);
    let first = first.unwrap();
    assert!((16..640).contains(&first), "resumed at step {first}");
    assert!(err.contains("(rank 1) rank 0 (pid ") && err.contains("farout train CONFIG --resume"), "{err}");
    eprintln!("resumed at step {first}, rank 0 killed: rank 1 stopped the job {took:?} later");
    let out = mpirun(2, &resume);
    let second = resumed_at(&stderr(&out));
    assert!(second.is_some_and(|s| (first + 16..640).contains(&s)), "{}", stderr(&out));
    let same_end = |out: &Output| {
        let resumed = json(out);
        assert_eq!(resumed["steps"], straight["steps"]);
        for key in ["p@1", "p@5", "loss"] {
            let (a, b) = (resumed["metrics"][key].as_f64().unwrap(), straight["metrics"][key].as_f64().unwrap());
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{key}: resumed {a}, straight {b}");
        }
    };
    same_end(&out);
    // A kill between the ranks' saves, rebuilt: rank 1 back at its previous checkpoint (step
    // 637, the last of every 7) while rank 0 is at 640 (the final save). Rank 0 goes back to the
    // one it kept, and both finish again.
    let rank1 = run.join("ckpt").join("rank-1-of-2");
    std::fs::remove_dir_all(&rank1).unwrap();
    std::fs::rename(run.join("ckpt").join("rank-1-of-2.prev"), &rank1).unwrap();
    assert_eq!((checkpoint_step(&run.join("ckpt"), 0), checkpoint_step(&run.join("ckpt"), 1)), (640, 637));
    let out = mpirun(2, &resume);
    let err = stderr(&out);
    assert!(err.contains("did not finish on every rank: all ranks resume from step 637"), "{err}");
    same_end(&out);
    // With no previous checkpoint to go back to, the resume is refused on every rank, once.
    std::fs::remove_dir_all(run.join("ckpt").join("rank-0-of-2.prev")).unwrap();
    std::fs::remove_dir_all(&rank1).unwrap();
    std::fs::rename(run.join("ckpt").join("rank-1-of-2.prev"), &rank1).unwrap();
    let o = mpirun(2, &resume);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("at steps 637 to 640") && err.contains("kept none at step 637"), "{err}");
}

/// `farout reshard CHECKPOINT --ranks P --out DIR`, in one process; its JSON summary.
fn reshard(from: &Path, to: &Path, ranks: usize) -> serde_json::Value {
    let out = Command::new(FAROUT)
        .args(["reshard", &from.display().to_string(), "--ranks", &ranks.to_string()])
        .args(["--out", &to.display().to_string()])
        .output()
        .unwrap();
    json(&out)
}

/// A checkpoint written by 2 ranks, re-sharded for 4 ranks and for one process, evaluates there
/// to the metrics of the 2 ranks, comes back from 4 to 2 as the same layer files, and a run
/// resumed from it on 4 ranks ends as the uninterrupted run on 2.
#[test]
fn a_checkpoint_of_two_ranks_moves_to_one_and_to_four_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let trained = json(&mpirun(2, &face_args("train", &run, &["--set", "train.epochs=1"])));
    let (ck, four, one, back) =
        (run.join("ckpt"), dir.path().join("four"), dir.path().join("one"), dir.path().join("back"));
    let r = reshard(&ck, &four, 4);
    assert_eq!(
        (r["from_ranks"].as_u64(), r["to_ranks"].as_u64(), r["classes"].as_u64()),
        (Some(2), Some(4), Some(1000))
    );
    assert_eq!(r["rows_per_rank"], serde_json::json!([250, 250, 250, 250]));
    reshard(&ck, &one, 1);
    reshard(&four, &back, 2);
    for r in 0..2 {
        let layer = |d: &Path| std::fs::read(d.join(format!("rank-{r}-of-2")).join("layer.bin")).unwrap();
        assert!(layer(&back) == layer(&ck), "rank {r}'s rows differ after 2 -> 4 -> 2");
    }
    for (ranks, ckpt) in [(4, &four), (1, &one)] {
        let at = ckpt.display().to_string();
        let metrics = json(&mpirun(ranks, &face_args("eval", &run, &["--checkpoint", &at])));
        for key in ["p@1", "p@5", "loss"] {
            let (a, b) = (metrics[key].as_f64().unwrap(), trained["metrics"][key].as_f64().unwrap());
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{ranks} ranks, {key}: {a} against {b}");
        }
    }
    // A search estimator's ranks each save the index of their own rows: left out, and built
    // again where the checkpoint goes.
    let mut sets = estimator_sets("ldgs");
    sets.extend(["--set", "train.epochs=1", "--set", "index.kind=\"exact\""].map(String::from));
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let ldgs = dir.path().join("ldgs");
    let trained = json(&mpirun(2, &face_args("train", &ldgs, &sets)));
    assert!(ldgs.join("ckpt").join("rank-1-of-2").join("index.bin").exists());
    let ldgs_one = dir.path().join("ldgs-one");
    reshard(&ldgs.join("ckpt"), &ldgs_one, 1);
    assert!(!ldgs_one.join("index.bin").exists());
    let at = ldgs_one.display().to_string();
    let mut eval = sets.clone();
    eval.extend(["--checkpoint", &at]);
    let metrics = json(&mpirun(1, &face_args("eval", &ldgs, &eval)));
    for key in ["p@1", "p@5"] {
        let (a, b) = (metrics[key].as_f64().unwrap(), trained["metrics"][key].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-5, "ldgs in one process, {key}: {a} against {b} on 2 ranks");
    }
    // The second epoch on 4 ranks, from the checkpoint of the first on 2.
    let moved = format!("checkpoint.dir=\"{}\"", four.display());
    let resumed = mpirun(4, &face_args("train", &run, &["--resume", "--set", &moved]));
    assert!(stderr(&resumed).contains("resuming at step 32"), "{}", stderr(&resumed));
    let straight = json(&mpirun(2, &face_args("train", &dir.path().join("straight"), &[])));
    let resumed = json(&resumed);
    assert_eq!(resumed["steps"], straight["steps"]);
    for key in ["p@1", "p@5", "loss"] {
        let (a, b) = (resumed["metrics"][key].as_f64().unwrap(), straight["metrics"][key].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{key}: resumed on 4 ranks {a}, straight on 2 {b}");
    }
}
