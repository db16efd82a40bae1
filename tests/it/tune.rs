//! `farout tune`: reproducible with a fixed seed and one thread, its best.toml runs and gives
//! the reported figure (a network's final run keeping its weights best on validation), bad
//! spaces and outputs onto inputs are refused.

use crate::{farout, stderr, summary};
use std::path::Path;

const LINEAR: &str = "seed = 1\n[data]\nformat = \"xmc\"\ntrain = \"tests/data/xmc-tiny/train.txt\"\n\
                      test = \"tests/data/xmc-tiny/test.txt\"\n[train]\nthreads = 1\n[linear]\nsolver = \"dismec\"\n";

/// Writes `text` as `dir/base.toml`; returns its path.
fn config(dir: &Path, text: &str) -> String {
    let path = dir.join("base.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// `farout tune CONFIG --out OUT --max-settings N ARGS...`.
fn tune(config: &str, out: &Path, settings: usize, args: &[&str]) -> std::process::Output {
    let out = out.display().to_string();
    let n = settings.to_string();
    let mut all = vec!["tune", config, "--out", &out, "--budget", "600", "--max-settings", &n];
    all.extend(args);
    farout(&all)
}

/// The trials file without its two time columns (seconds, elapsed).
fn trials_without_times(out: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(out.join("trials.csv")).unwrap();
    text.lines()
        .map(|l| {
            let (fields, settings) = l.split_once(",\"").unwrap_or((l, ""));
            let f: Vec<&str> = fields.split(',').collect();
            format!("{},{},{},{},{} {settings}", f[0], f[1], f[2], f[3], f[6])
        })
        .collect()
}

#[test]
fn a_tune_with_a_fixed_seed_and_one_thread_is_reproducible() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), LINEAR);
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for out in [&a, &b] {
        let o = tune(&c, out, 5, &["--seed", "3"]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let ta = trials_without_times(&a);
    assert!(ta.len() > 5, "every setting at the first rung and the promoted ones above: {ta:?}");
    assert_eq!(ta, trials_without_times(&b));
    assert_eq!(std::fs::read(a.join("best.toml")).unwrap(), std::fs::read(b.join("best.toml")).unwrap());
    for f in ["progress.png", "progress.svg", "trials.md", "runs/base-tuned@0/summary.json"] {
        assert!(a.join(f).exists(), "{f}");
    }
}

#[test]
fn best_toml_runs_and_gives_the_reported_figure() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), LINEAR);
    let out = dir.path().join("tune");
    let o = tune(&c, &out, 3, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let json_end = text.find("\n}\n").expect("a JSON summary first") + 2;
    let reported: serde_json::Value = serde_json::from_str(&text[..json_end]).unwrap();
    assert!(text[json_end..].contains("| id | rung |"), "the trials' table follows: {text}");
    let best = out.join("best.toml").display().to_string();
    let log = format!("log.dir=\"{}\"", dir.path().join("again").display());
    let again = summary(&farout(&["train", &best, "--set", &log, "--set", "log.progress=false"]));
    assert_eq!(again["metrics"]["p@1"], reported["metrics"]["p@1"], "{again}\n{reported}");
    assert_eq!(again["n_train"], 120, "best.toml trains on the whole training set");
    assert_eq!(again["n_test"], 30, "and scores the test set");
    // `farout compare --from` reads the tune directory: its final run, named with its trials.
    let cmp = dir.path().join("cmp");
    let o = farout(&["compare", "--from", &out.display().to_string(), "--out", &cmp.display().to_string()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("| base-tuned (tuned, ") && table.contains(" trials) | dismec |"), "{table}");
}

const NETWORK: &str = "seed = 1\n[data]\nformat = \"xmc\"\ntrain = \"tests/data/xmc-tiny/train.txt\"\n\
                       test = \"tests/data/xmc-tiny/test.txt\"\n[model]\nencoder = \"doc_encoder\"\n\
                       [model.doc_encoder]\nd_model = 16\n[output]\nestimator = \"softmax\"\n\
                       [train]\nepochs = 9\nbatch_size = 16\nthreads = 1\n[log]\ntensorboard = false\n";

#[test]
fn a_network_tunes_final_run_keeps_its_best_weights_and_best_toml_gives_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), NETWORK);
    let out = dir.path().join("tune");
    let o = tune(&c, &out, 3, &["--seed", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let reported: serde_json::Value = serde_json::from_str(&text[..text.find("\n}\n").unwrap() + 2]).unwrap();
    let sel = &reported["selection"];
    assert!(sel["best_step"].as_u64().is_some() && sel["last_metrics"]["p@1"].is_f64(), "{reported}");
    assert!(std::fs::read_to_string(out.join("best.toml")).unwrap().contains("select = \"best\""));
    let best = out.join("best.toml").display().to_string();
    let log = format!("log.dir=\"{}\"", dir.path().join("again").display());
    let again = summary(&farout(&["train", &best, "--set", &log, "--set", "log.progress=false"]));
    assert_eq!(again["metrics"]["p@1"], reported["metrics"]["p@1"], "{again}\n{reported}");
    assert_eq!(again["selection"]["best_step"], sel["best_step"]);
    assert_eq!(again["selection"]["last_metrics"]["p@1"], sel["last_metrics"]["p@1"]);
}

/// The trials file without its two time columns, and the run's standard error.
fn tune_trials(c: &str, out: &Path, args: &[&str]) -> (Vec<String>, String) {
    let o = tune(c, out, 3, args);
    assert!(o.status.success(), "{}", stderr(&o));
    (trials_without_times(out), stderr(&o))
}

#[test]
fn warm_started_trials_give_the_cold_trials_figures() {
    let dir = tempfile::tempdir().unwrap();
    // A promoted network trial continues its run of the rung below: the same steps, the same
    // validation figures and kept weights as training from scratch, so the same trials.
    let c = config(dir.path(), NETWORK);
    let (warm, log) = tune_trials(&c, &dir.path().join("warm"), &["--seed", "2"]);
    let (cold, cold_log) = tune_trials(&c, &dir.path().join("cold"), &["--seed", "2", "--cold"]);
    assert!(log.contains("(rung 2) continues its run of rung 1"), "{log}");
    assert!(!cold_log.contains("continues its run"), "{cold_log}");
    assert_eq!(warm, cold);
    // DiSMEC trials start from the models of earlier trials with the same data settings (here
    // all of them), the final run from the best trial's.
    let c = config(dir.path(), LINEAR);
    let space = dir.path().join("space.toml");
    std::fs::write(&space, "\"data.tfidf\" = { choice = [false] }\n\"data.normalize\" = { choice = [true] }\n")
        .unwrap();
    let args = ["--seed", "3", "--space", space.to_str().unwrap()];
    let args = [&args[..], &["--jobs", "1"]].concat();
    let (warm, log) = tune_trials(&c, &dir.path().join("lwarm"), &args);
    let (cold, _) = tune_trials(&c, &dir.path().join("lcold"), &[&args[..], &["--cold"]].concat());
    assert!(log.contains("trial 1 (rung 0) starts from the model in"), "{log}");
    assert_eq!(warm, cold, "the same validation figures to the solver's tolerance");
    let init = |name: &str| {
        let s = std::fs::read_to_string(dir.path().join(name).join("runs/base-tuned@0/summary.json")).unwrap();
        serde_json::from_str::<serde_json::Value>(&s).unwrap()["linear"]["stats"]["init"].clone()
    };
    assert_eq!((init("lwarm"), init("lcold")), ("warm".into(), "msi".into()));
}

/// The trials file's `start` column by trial (`id-r<rung>`).
fn starts(out: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(out.join("trials.csv")).unwrap();
    text.lines()
        .skip(1)
        .map(|l| l.split(',').take(8).collect::<Vec<_>>())
        .map(|f| format!("{}-r{}: {}", f[0], f[1], f[7]))
        .collect()
}

/// (start, end) search seconds of trial `id` at rung 0.
fn span(out: &Path, id: &str) -> (f64, f64) {
    let text = std::fs::read_to_string(out.join("trials.csv")).unwrap();
    let f: Vec<f64> = text
        .lines()
        .find(|l| l.starts_with(&format!("{id},0,")))
        .unwrap()
        .split(',')
        .skip(4)
        .take(2)
        .map(|x| x.parse().unwrap())
        .collect();
    (f[1] - f[0], f[1])
}

#[test]
fn parallel_and_sequential_tunes_with_the_same_seed_give_the_same_trials() {
    let dir = tempfile::tempdir().unwrap();
    // One-thread network trials are deterministic: the same settings, figures, promotions and
    // starts (a promoted trial continues its own run) with one job and with three.
    let c = config(dir.path(), NETWORK);
    let (one, many) = (dir.path().join("one"), dir.path().join("many"));
    let (seq, _) = tune_trials(&c, &one, &["--seed", "2", "--jobs", "1"]);
    let (par, log) = tune_trials(&c, &many, &["--seed", "2", "--jobs", "3"]);
    assert!(log.contains("3 trial(s) at once, 1 thread(s) each"), "{log}");
    assert_eq!(seq, par);
    assert_eq!(starts(&one), starts(&many));
    assert!(starts(&many).iter().any(|s| s.contains("-r2: continues ")), "{:?}", starts(&many));
    assert!(
        span(&many, "1").0 < span(&many, "0").1,
        "trials 0 and 1 overlap: {:?}",
        (span(&many, "0"), span(&many, "1"))
    );
    assert!(span(&one, "1").0 >= span(&one, "0").1 - 0.002, "one after the other with one job");
    assert_eq!(std::fs::read(one.join("best.toml")).unwrap(), std::fs::read(many.join("best.toml")).unwrap());
    // A trial that was running when the search stopped (not in trials.csv) is run again.
    let csv = many.join("trials.csv");
    let text = std::fs::read_to_string(&csv).unwrap();
    std::fs::write(&csv, text.lines().filter(|l| !l.starts_with("1,0,")).collect::<Vec<_>>().join("\n") + "\n")
        .unwrap();
    let o = tune(&c, &many, 3, &["--seed", "2", "--jobs", "3", "--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(trials_without_times(&many), seq, "the missing trial ran again, the others were reused");
    // DiSMEC trials start from the models of trials that had ended with one job; with two, the
    // trial launched just before is left out, whichever job ends first.
    let c = config(dir.path(), LINEAR);
    let space = dir.path().join("space.toml");
    std::fs::write(&space, "\"data.tfidf\" = { choice = [false] }\n\"data.normalize\" = { choice = [true] }\n")
        .unwrap();
    let args = ["--seed", "3", "--space", space.to_str().unwrap()];
    let (lone, lmany) = (dir.path().join("lone"), dir.path().join("lmany"));
    let (seq, _) = tune_trials(&c, &lone, &[&args[..], &["--jobs", "1"]].concat());
    let (par, _) = tune_trials(&c, &lmany, &[&args[..], &["--jobs", "2"]].concat());
    assert_eq!(seq, par, "the same validation figures to the solver's tolerance");
    assert_eq!(starts(&lone)[..3], ["0-r0: scratch", "1-r0: from 0-r0", "2-r0: from 1-r0"]);
    assert_eq!(starts(&lmany)[..3], ["0-r0: scratch", "1-r0: scratch", "2-r0: from 0-r0"]);
}

#[test]
fn a_space_with_a_bad_key_or_range_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), LINEAR);
    for (space, key, why) in [
        ("\"linear.cee\" = { log = [0.1, 1.0] }", "linear.cee", "cee"),
        ("\"linear.c\" = { log = [0.0, 1.0] }", "linear.c", "lo > 0"),
        ("\"linear.c\" = { float = [-1.0, 1.0] }", "linear.c", "refuses linear.c = -1.0"),
        ("\"linear.init\" = { choice = [\"msi\", \"warm\"] }", "linear.init", "warm"),
        ("[linear.c]\nlog = [1.0]", "linear.c", "[lo, hi]"),
        ("\"linear.c\" = { range = [1, 2] }", "linear.c", "unknown form `range`"),
        ("\"linear.c\" = { log = [0.1, 1.0], int = [1, 2] }", "linear.c", "exactly one of"),
    ] {
        let path = dir.path().join("space.toml");
        std::fs::write(&path, space).unwrap();
        let out = dir.path().join("out");
        let o = tune(&c, &out, 1, &["--space", &path.display().to_string()]);
        assert!(!o.status.success(), "{space} was accepted");
        let e = stderr(&o);
        assert!(e.contains("--space") && e.contains(key) && e.contains(why), "{space}: {e}");
        assert!(!out.join("trials.csv").exists(), "refused before the search");
    }
}

#[test]
fn the_output_directory_is_never_an_input() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), LINEAR);
    let ckpt = dir.path().join("ckpt");
    let ckpt_set = format!("checkpoint.dir=\"{}\"", ckpt.display());
    for (out, extra) in [
        (Path::new("tests/data/xmc-tiny").to_path_buf(), None),
        (Path::new("tests/data/xmc-tiny/train.txt").to_path_buf(), None),
        (dir.path().to_path_buf(), None),
        (ckpt.join("tune"), Some(ckpt_set.as_str())),
    ] {
        let mut args = vec![];
        if let Some(s) = extra {
            args.extend(["--set", s]);
        }
        let o = tune(&c, &out, 1, &args);
        assert!(!o.status.success());
        assert!(stderr(&o).contains("--out"), "{}", stderr(&o));
    }
    assert_eq!(std::fs::read_to_string(&c).unwrap(), LINEAR);
}

#[test]
fn a_tune_writes_nothing_into_the_base_configs_checkpoint_directory() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), NETWORK);
    let ckpt = dir.path().join("base-ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    std::fs::write(ckpt.join("layer.bin"), b"the base run's model").unwrap();
    let set = format!("checkpoint.dir=\"{}\"", ckpt.display());
    let out = dir.path().join("tune");
    let o = tune(&c, &out, 2, &["--set", &set]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(ckpt.join("layer.bin")).unwrap(), b"the base run's model");
    assert_eq!(std::fs::read_dir(&ckpt).unwrap().count(), 1, "nothing added");
    assert!(!dir.path().join("base-ckpt-best").exists(), "no kept weights beside it");
    assert!(out.join("runs/base-tuned@0/checkpoint/layer.bin").exists(), "the final run's model is in DIR");
}

#[test]
fn an_interrupted_tune_resumes_from_its_trials() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), LINEAR);
    let out = dir.path().join("tune");
    assert!(tune(&c, &out, 2, &[]).status.success());
    let first = std::fs::read_to_string(out.join("trials.csv")).unwrap();
    let o = tune(&c, &out, 2, &[]);
    assert!(!o.status.success() && stderr(&o).contains("--resume"), "{}", stderr(&o));
    let o = tune(&c, &out, 4, &["--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let again = std::fs::read_to_string(out.join("trials.csv")).unwrap();
    // The first two settings' rung-0 rows are reused as they were (same seconds).
    let row = |text: &str, id: &str| text.lines().find(|l| l.starts_with(&format!("{id},0,"))).unwrap().to_string();
    assert_eq!(row(&first, "0").split(',').nth(4), row(&again, "0").split(',').nth(4));
    assert!(again.lines().any(|l| l.starts_with("3,0,")), "{again}");
}

#[test]
fn every_shipped_config_takes_both_ends_of_every_range_of_its_default_space() {
    use farout_train::tune::{recipe::Recipe, space};
    let mut paths: Vec<std::path::PathBuf> = Vec::new();
    for dir in std::iter::once(Path::new("configs").to_path_buf())
        .chain(std::fs::read_dir("configs/compare").unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()))
    {
        let entries = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path());
        paths.extend(entries.filter(|p| p.extension().is_some_and(|e| e == "toml")));
    }
    assert!(paths.len() > 30, "{paths:?}");
    for path in paths {
        let (recipe, base) = Recipe::load(&path, &[]).unwrap();
        let dims = space::default_space(&base);
        assert!(!dims.is_empty(), "{}: nothing to tune", path.display());
        space::check_space(&dims, &recipe, "the default space").unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// The checkpoint directories (`<trial>/checkpoint*`) left under `out/trials`.
fn trial_checkpoints(out: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for trial in std::fs::read_dir(out.join("trials")).unwrap() {
        let trial = trial.unwrap().path();
        for e in std::fs::read_dir(&trial).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            if name.starts_with("checkpoint") {
                found.push(format!("{}/{name}", trial.file_name().unwrap().to_string_lossy()));
            }
        }
    }
    found.sort();
    found
}

#[test]
fn a_tune_keeps_no_trial_checkpoint_that_no_later_trial_needs() {
    let dir = tempfile::tempdir().unwrap();
    // Network trials: the promoted ones continue their runs, then nothing is left to continue.
    let c = config(dir.path(), NETWORK);
    let out = dir.path().join("net");
    let o = tune(&c, &out, 3, &["--seed", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("(rung 2) continues its run of rung 1"), "{}", stderr(&o));
    assert_eq!(trial_checkpoints(&out), Vec::<String>::new());
    assert!(out.join("runs/base-tuned@0/checkpoint").is_dir(), "the final run's model stays");
    // DiSMEC trials: their models are starts until the final run has started from the best's.
    let c = config(dir.path(), LINEAR);
    let out = dir.path().join("linear");
    assert!(tune(&c, &out, 3, &["--seed", "3"]).status.success());
    assert_eq!(trial_checkpoints(&out), Vec::<String>::new());
    let s = std::fs::read_to_string(out.join("runs/base-tuned@0/summary.json")).unwrap();
    let s: serde_json::Value = serde_json::from_str(&s).unwrap();
    assert_eq!(s["linear"]["stats"]["init"], "warm", "the final run started from the best trial's model");
    assert!(out.join("runs/base-tuned@0/checkpoint/linear.model").exists());
    for f in ["best.toml", "trials.csv", "trials.md"] {
        assert!(out.join(f).exists(), "{f}");
    }
}

#[test]
fn a_search_stopped_between_rungs_resumes_from_the_checkpoints_it_kept() {
    let dir = tempfile::tempdir().unwrap();
    let text = NETWORK.replace("d_model = 16", "d_model = 256").replace("threads = 1", "threads = 1\npatience = 1000");
    let c = config(dir.path(), &text);
    let (whole, _) = tune_trials(&c, &dir.path().join("whole"), &["--seed", "2"]);
    let out = dir.path().join("stopped");
    let csv = out.join("trials.csv");
    let rows = |rung: &str| {
        let text = std::fs::read_to_string(&csv).unwrap_or_default();
        text.lines().filter(|l| l.split(',').nth(1) == Some(rung)).count()
    };
    // Killed as soon as rung 1 has ended, while rung 2's trial trains (again if too late).
    for _ in 0..5 {
        let _ = std::fs::remove_dir_all(&out);
        let o = out.display().to_string();
        let args = ["tune", &c, "--out", &o, "--budget", "600", "--max-settings", "3", "--seed", "2"];
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_farout"))
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        while rows("1") == 0 && child.try_wait().unwrap().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        if rows("1") == 1 && rows("2") == 0 {
            break;
        }
    }
    assert_eq!((rows("1"), rows("2")), (1, 0), "stopped between rungs 1 and 2");
    let kept = trial_checkpoints(&out);
    assert!(kept.iter().any(|k| k.ends_with("-r1/checkpoint")), "the rung-1 trial's run stays: {kept:?}");
    let o = tune(&c, &out, 3, &["--seed", "2", "--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("(rung 2) continues its run of rung 1"), "{}", stderr(&o));
    assert_eq!(trials_without_times(&out), whole);
    assert_eq!(trial_checkpoints(&out), Vec::<String>::new());
}

#[test]
fn a_network_search_grows_the_epochs_up_to_three_times_the_recipes() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), &NETWORK.replace("epochs = 9", "epochs = 1"));
    let resources = |out: &Path| {
        let text = std::fs::read_to_string(out.join("trials.csv")).unwrap();
        text.lines()
            .skip(1)
            .map(|l| format!("r{}: {}", l.split(',').nth(1).unwrap(), l.split(',').nth(2).unwrap()))
            .collect::<Vec<_>>()
    };
    // A one-epoch recipe: rungs of 1, 1 and 3 epochs; best.toml trains the best trial's 3.
    let out = dir.path().join("default");
    let o = tune(&c, &out, 3, &["--seed", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(resources(&out), ["r0: 1", "r0: 1", "r0: 1", "r1: 1", "r2: 3"]);
    let best = std::fs::read_to_string(out.join("best.toml")).unwrap();
    assert!(best.contains("train.epochs=3") && best.contains("epochs = 3"), "{best}");
    // --max-epochs sets the top rung.
    let out = dir.path().join("nine");
    assert!(tune(&c, &out, 3, &["--seed", "2", "--max-epochs", "9"]).status.success());
    assert_eq!(resources(&out), ["r0: 1", "r0: 1", "r0: 1", "r1: 3", "r2: 9"]);
    let o = tune(&config(dir.path(), LINEAR), &dir.path().join("lin"), 1, &["--max-epochs", "9"]);
    assert!(!o.status.success() && stderr(&o).contains("--max-epochs"), "{}", stderr(&o));
}
