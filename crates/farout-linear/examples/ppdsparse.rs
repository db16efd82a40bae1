//! Trains PPDSparse on an XMC data set (`train.txt`, `test.txt` in `--data`) and prints one JSON
//! object: training wall and CPU time, threads, the top-5 prediction time per test row, test P@k,
//! and the solver's per-label statistics.
//!
//! ```text
//! cargo run --release -p farout-linear --example ppdsparse -- --data DIR --tfidf
//! options: --tfidf (tf-idf + L2 row normalisation)  --threads N  --labels N (a random subset
//!          of N labels, for quick profiles; P@k is then over those labels only)
//!          --lambda X  --tau X  --kappa N  --min-kappa N  --delta X  --tol X  --max-iter N  --inner-sweeps N
//! ```

use anyhow::{Context, Result, bail};
use farout_core::metrics::RankingSums;
use farout_core::topk::Hit;
use farout_data::{Features, LabelSets, xmc};
use farout_linear::{FeatureTransform, LinearSolver, PpdSparseConfig, TrainSet};
use std::path::PathBuf;
use std::time::Instant;

struct Args {
    data: PathBuf,
    config: PpdSparseConfig,
    transform: FeatureTransform,
    threads: usize,
    labels: usize,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        data: PathBuf::new(),
        config: PpdSparseConfig::default(),
        transform: FeatureTransform::default(),
        threads: 0,
        labels: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--data" => args.data = value()?.into(),
            "--tfidf" => args.transform = FeatureTransform { tfidf: true, normalize_rows: true },
            "--threads" => args.threads = value()?.parse().context("--threads")?,
            "--labels" => args.labels = value()?.parse().context("--labels")?,
            "--lambda" => args.config.lambda = value()?.parse().context("--lambda")?,
            "--tau" => args.config.tau = value()?.parse().context("--tau")?,
            "--kappa" => args.config.kappa = value()?.parse().context("--kappa")?,
            "--min-kappa" => args.config.min_kappa = value()?.parse().context("--min-kappa")?,
            "--delta" => args.config.delta = value()?.parse().context("--delta")?,
            "--tol" => args.config.tol = value()?.parse().context("--tol")?,
            "--max-iter" => args.config.max_iter = value()?.parse().context("--max-iter")?,
            "--inner-sweeps" => args.config.inner_sweeps = value()?.parse().context("--inner-sweeps")?,
            other => bail!("unknown option {other}"),
        }
    }
    if args.data.as_os_str().is_empty() {
        bail!("--data DIR (with train.txt and test.txt) is required");
    }
    Ok(args)
}

/// User + system CPU seconds of this process so far (clock tick 1/100 s on Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest.split_whitespace().skip(11).take(2).filter_map(|v| v.parse().ok()).collect();
    if f.len() == 2 { (f[0] + f[1]) / 100.0 } else { f64::NAN }
}

/// Keeps the labels `keep` (renumbered 0..) of every sample.
fn subset(labels: &LabelSets, keep: &[u32]) -> LabelSets {
    let mut map = vec![u32::MAX; labels.n_labels];
    keep.iter().enumerate().for_each(|(at, &k)| map[k as usize] = at as u32);
    let mut out = LabelSets::new(keep.len());
    let mut row = Vec::new();
    for i in 0..labels.len() {
        row.clear();
        row.extend(labels.get(i).iter().map(|&k| map[k as usize]).filter(|&k| k != u32::MAX));
        out.push(&row);
    }
    out
}

fn main() -> Result<()> {
    let args = parse_args()?;
    args.config.check()?;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(args.threads).build()?;
    let read = |name: &str| -> Result<_> {
        let path = args.data.join(name);
        let ds = xmc::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let Features::Sparse(x) = ds.features else { bail!("{}: dense features", path.display()) };
        Ok((x, ds.labels))
    };
    let (mut train_x, mut train_y) = read("train.txt")?;
    let (mut test_x, mut test_y) = read("test.txt")?;
    if args.labels > 0 && args.labels < train_y.n_labels {
        // A reproducible random subset (a multiplicative hash of the label id, lowest first).
        let mut ids: Vec<u32> = (0..train_y.n_labels as u32).collect();
        ids.sort_by_key(|&k| (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17));
        ids.truncate(args.labels);
        ids.sort_unstable();
        train_y = subset(&train_y, &ids);
        test_y = subset(&test_y, &ids);
    }
    let fitted = args.transform.fit(&train_x);
    fitted.apply(&mut train_x)?;
    fitted.apply(&mut test_x)?;
    let data = TrainSet::new(train_x, &train_y)?;

    let cpu_start = cpu_seconds();
    let start = Instant::now();
    let fit = pool.install(|| args.config.fit(&data, &farout_linear::Silent))?;
    let train_s = start.elapsed().as_secs_f64();
    let train_cpu_s = cpu_seconds() - cpu_start;

    let start = Instant::now();
    let predictor = fit.model.predictor();
    let predicted: Vec<Vec<Hit>> = pool.install(|| predictor.predict(&test_x, 5));
    let predict_s = start.elapsed().as_secs_f64();
    let mut sums = RankingSums::default();
    predicted.iter().enumerate().for_each(|(i, hits)| sums.add(hits, test_y.get(i), 0.0));
    let m = sums.finish(false);
    let round = |x: f64, d: i32| (x * 10f64.powi(d)).round() / 10f64.powi(d);
    let p = |k: usize| round(100.0 * m[&format!("p@{k}")], 2);
    let out = serde_json::json!({
        "data": args.data.display().to_string(),
        "labels": data.n_labels(),
        "threads": fit.summary.threads,
        "train_s": round(train_s, 2),
        "train_cpu_s": round(train_cpu_s, 2),
        "predict_ms_per_sample": round(1e3 * predict_s / test_x.n_rows().max(1) as f64, 4),
        "p@1": p(1), "p@3": p(3), "p@5": p(5),
        "nnz_after_pruning": fit.summary.nnz_after_pruning,
        "stats": fit.summary.stats,
    });
    println!("{out}");
    Ok(())
}
