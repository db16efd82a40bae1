//! Trains DiSMEC on an XMC data set (`train.txt`, `test.txt` in `--data`) and prints one JSON
//! object: training time, threads, test P@k and nDCG@k, Newton and CG iterations per label,
//! model size before and after pruning, and peak RSS.
//!
//! ```text
//! cargo run --release -p farout-linear --example dismec -- --data ../shared/data/xmc/bibtex --init msi
//! options: --init zero|bias|msi  --tfidf (tf-idf + L2 row normalisation)  --threads N
//!          --eps0 X  --c X  --prune X  --bias-init X  --msi-t X  --save PATH
//! ```
//!
//! P@k and nDCG@k are `farout_core::metrics` (samples without labels are skipped), as in
//! `farout train`; they are printed in percent.

use anyhow::{Context, Result, bail};
use farout_core::metrics::RankingSums;
use farout_core::topk::Hit;
use farout_data::{Features, LabelSets, xmc};
use farout_linear::{Dismec, DismecConfig, FeatureTransform, InitKind, TrainSet};
use std::path::PathBuf;
use std::time::Instant;

struct Args {
    data: PathBuf,
    config: DismecConfig,
    transform: FeatureTransform,
    threads: usize,
    save: Option<PathBuf>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        data: PathBuf::new(),
        config: DismecConfig::default(),
        transform: FeatureTransform::default(),
        threads: 0,
        save: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--data" => args.data = value()?.into(),
            "--init" => {
                args.config.init = match value()?.as_str() {
                    "zero" => InitKind::Zero,
                    "bias" => InitKind::Bias,
                    "msi" => InitKind::Msi,
                    other => bail!("--init {other}: expected zero, bias or msi"),
                }
            }
            "--tfidf" => args.transform = FeatureTransform { tfidf: true, normalize_rows: true },
            "--threads" => args.threads = value()?.parse().context("--threads")?,
            "--eps0" => args.config.eps0 = value()?.parse().context("--eps0")?,
            "--c" => args.config.c = value()?.parse().context("--c")?,
            "--prune" => args.config.prune_threshold = value()?.parse().context("--prune")?,
            "--bias-init" => args.config.bias_init = value()?.parse().context("--bias-init")?,
            "--msi-t" => args.config.msi_t = value()?.parse().context("--msi-t")?,
            "--save" => args.save = Some(value()?.into()),
            other => bail!("unknown option {other}"),
        }
    }
    if args.data.as_os_str().is_empty() {
        bail!("--data DIR (with train.txt and test.txt) is required");
    }
    Ok(args)
}

/// Mean and 95% quantile (nearest rank) of `v`.
fn mean_p95(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    let p95 = v.get(((0.95 * v.len() as f64).ceil() as usize).saturating_sub(1)).copied().unwrap_or(0.0);
    (mean, p95)
}

/// P@1,3,5 and nDCG@1,3,5 in percent over samples with at least one label.
fn ranking_metrics(predicted: &[Vec<Hit>], labels: &LabelSets) -> ([f64; 3], [f64; 3]) {
    let mut sums = RankingSums::default();
    predicted.iter().enumerate().for_each(|(i, hits)| sums.add(hits, labels.get(i), 0.0));
    let m = sums.finish(false);
    let pct = |name: &str| [1, 3, 5].map(|k| 100.0 * m[&format!("{name}@{k}")]);
    (pct("p"), pct("ndcg"))
}

/// User + system CPU seconds of this process so far (from /proc; the clock tick is 1/100 s on
/// Linux). Less sensitive than wall time to other jobs on a busy machine.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest.split_whitespace().skip(11).take(2).filter_map(|v| v.parse().ok()).collect();
    if f.len() == 2 { (f[0] + f[1]) / 100.0 } else { f64::NAN }
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    args.config.check()?;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(args.threads).build()?;
    let load_start = Instant::now();
    let read = |name: &str| -> Result<_> {
        let path = args.data.join(name);
        let ds = xmc::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let Features::Sparse(x) = ds.features else { bail!("{}: dense features", path.display()) };
        Ok((x, ds.labels))
    };
    let (mut train_x, train_y) = read("train.txt")?;
    let (mut test_x, test_y) = read("test.txt")?;
    let fitted = args.transform.fit(&train_x);
    fitted.apply(&mut train_x)?;
    fitted.apply(&mut test_x)?;
    let data = TrainSet::new(train_x, &train_y)?;
    let load_s = load_start.elapsed().as_secs_f64();

    let dismec = Dismec::new(&args.config)?;
    let cpu_start = cpu_seconds();
    let trained = pool.install(|| dismec.train(&data))?;
    let train_cpu_s = cpu_seconds() - cpu_start;
    let report = &trained.report;

    let predict_start = Instant::now();
    let predictor = trained.model.predictor();
    let predicted = pool.install(|| predictor.predict(&test_x, 5));
    let predict_s = predict_start.elapsed().as_secs_f64();
    let (p, ndcg) = ranking_metrics(&predicted, &test_y);

    let bytes = trained.model.to_bytes();
    if let Some(path) = &args.save {
        trained.model.save(path)?;
    }
    let per_label = |f: &dyn Fn(&farout_linear::LabelStats) -> f64| mean_p95(report.labels.iter().map(f).collect());
    let (newton_mean, newton_p95) = per_label(&|s| s.newton_iters as f64);
    let (cg_mean, cg_p95) = per_label(&|s| s.cg_steps as f64);
    let (label_s_mean, label_s_p95) = per_label(&|s| s.seconds);
    let (active0, _) = per_label(&|s| s.initial_active_fraction);
    let (active, _) = per_label(&|s| s.active_fraction);
    let (active_iter, _) = per_label(&|s| s.mean_active_fraction);
    let (step, _) = per_label(&|s| s.mean_step);
    let round = |x: f64, d: i32| (x * 10f64.powi(d)).round() / 10f64.powi(d);
    // Newton iterations and label time by |P| ([M] Figs. 6-8: flat in |P| with MSI).
    let by_positives: Vec<serde_json::Value> = [(0, 1), (2, 4), (5, 16), (17, 64), (65, usize::MAX)]
        .iter()
        .filter_map(|&(lo, hi)| {
            let group: Vec<_> = report.labels.iter().filter(|s| (lo..=hi).contains(&s.n_positives)).collect();
            if group.is_empty() {
                return None;
            }
            let (it, it95) = mean_p95(group.iter().map(|s| s.newton_iters as f64).collect());
            let (ms, _) = mean_p95(group.iter().map(|s| 1e3 * s.seconds).collect());
            let range = if hi == usize::MAX { format!("{lo}+") } else { format!("{lo}-{hi}") };
            Some(serde_json::json!({"positives": range, "labels": group.len(), "newton_mean": round(it, 2), "newton_p95": it95, "ms_mean": round(ms, 2)}))
        })
        .collect();
    let out = serde_json::json!({
        "data": args.data.display().to_string(),
        "features": if args.transform.tfidf { "tfidf+l2" } else { "raw" },
        "init": args.config.init,
        "c": args.config.c,
        "eps0": args.config.eps0,
        "threads": report.threads,
        "n_train": data.n_samples(), "n_features": data.n_features(), "n_labels": data.n_labels(),
        "load_s": round(load_s, 3),
        "train_s": round(report.seconds, 3),
        "train_cpu_s": round(train_cpu_s, 2),
        "loadavg": std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| l.split_whitespace().next().map(str::to_owned)),
        "predict_ms_per_sample": round(1e3 * predict_s / test_x.n_rows().max(1) as f64, 4),
        "p@1": round(p[0], 2), "p@3": round(p[1], 2), "p@5": round(p[2], 2),
        "ndcg@1": round(ndcg[0], 2), "ndcg@3": round(ndcg[1], 2), "ndcg@5": round(ndcg[2], 2),
        "newton_iters": {"mean": round(newton_mean, 2), "p95": newton_p95},
        "cg_steps": {"mean": round(cg_mean, 2), "p95": cg_p95},
        "label_ms": {"mean": round(1e3 * label_s_mean, 3), "p95": round(1e3 * label_s_p95, 3)},
        "active_fraction": {"initial_mean": round(active0, 4), "per_iteration_mean": round(active_iter, 4), "final_mean": round(active, 4)},
        "line_search_step_mean": round(step, 3),
        "by_positives": by_positives,
        "line_search_failures": report.labels.iter().filter(|s| s.line_search_failed).count(),
        "nnz_before_pruning": report.nnz_before_pruning,
        "nnz_after_pruning": report.nnz_after_pruning,
        "model_bytes": bytes.len(),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    });
    println!("{out}");
    Ok(())
}
