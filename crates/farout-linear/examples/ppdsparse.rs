//! Trains PPDSparse on an XMC data set (`train.txt`, `test.txt` in `--data`) and prints one
//! JSON object with the same fields as the `dismec` example (training time, threads, test P@k
//! and nDCG@k, model size before and after pruning, model bytes, peak RSS) plus the solver's
//! statistics (outer iterations, final |A|, nnz(w), nnz(w̃), duality gaps).
//!
//! ```text
//! cargo run --release -p farout-linear --example ppdsparse -- --data ../shared/data/xmc/bibtex --tfidf
//! options: --tfidf (tf-idf + L2 row normalisation)  --threads N  --lambda X  --tau X  --kappa N
//!          --max-iter N  --inner-sweeps N  --delta X  --column-threshold X  --tol X  --prune X
//!          --seed N  --save PATH
//! ```
//!
//! P@k and nDCG@k are computed exactly as in the `dismec` example (samples without labels are
//! skipped).

use anyhow::{Context, Result, bail};
use farout_core::topk::Hit;
use farout_data::{Features, LabelSets, xmc};
use farout_linear::{FeatureTransform, LinearSolver, PpdSparseConfig, Silent, TrainSet};
use std::path::PathBuf;
use std::time::Instant;

struct Args {
    data: PathBuf,
    config: PpdSparseConfig,
    transform: FeatureTransform,
    threads: usize,
    save: Option<PathBuf>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        data: PathBuf::new(),
        config: PpdSparseConfig::default(),
        transform: FeatureTransform::default(),
        threads: 0,
        save: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        let c = &mut args.config;
        match flag.as_str() {
            "--data" => args.data = value()?.into(),
            "--tfidf" => args.transform = FeatureTransform { tfidf: true, normalize_rows: true },
            "--threads" => args.threads = value()?.parse().context("--threads")?,
            "--lambda" => c.lambda = value()?.parse().context("--lambda")?,
            "--tau" => c.tau = value()?.parse().context("--tau")?,
            "--kappa" => c.kappa = value()?.parse().context("--kappa")?,
            "--max-iter" => c.max_iter = value()?.parse().context("--max-iter")?,
            "--inner-sweeps" => c.inner_sweeps = value()?.parse().context("--inner-sweeps")?,
            "--delta" => c.delta = value()?.parse().context("--delta")?,
            "--column-threshold" => c.column_threshold = value()?.parse().context("--column-threshold")?,
            "--tol" => c.tol = value()?.parse().context("--tol")?,
            "--prune" => c.prune_threshold = value()?.parse().context("--prune")?,
            "--seed" => c.seed = value()?.parse().context("--seed")?,
            "--save" => args.save = Some(value()?.into()),
            other => bail!("unknown option {other}"),
        }
    }
    if args.data.as_os_str().is_empty() {
        bail!("--data DIR (with train.txt and test.txt) is required");
    }
    Ok(args)
}

/// P@1,3,5 and nDCG@1,3,5 in percent over samples with at least one label.
fn ranking_metrics(predicted: &[Vec<Hit>], labels: &LabelSets) -> ([f64; 3], [f64; 3]) {
    let ks = [1usize, 3, 5];
    let (mut p, mut nd, mut n) = ([0.0; 3], [0.0; 3], 0usize);
    for (i, hits) in predicted.iter().enumerate() {
        let pos = labels.get(i);
        if pos.is_empty() {
            continue;
        }
        n += 1;
        let (mut hit, mut dcg) = (0usize, 0.0);
        for r in 0..5 {
            if hits.get(r).is_some_and(|h| pos.contains(&h.class)) {
                hit += 1;
                dcg += 1.0 / ((r + 2) as f64).log2();
            }
            if let Some(at) = ks.iter().position(|&k| k == r + 1) {
                let idcg: f64 = (0..ks[at].min(pos.len())).map(|j| 1.0 / ((j + 2) as f64).log2()).sum();
                p[at] += hit as f64 / ks[at] as f64;
                nd[at] += dcg / idcg;
            }
        }
    }
    let pct = |v: [f64; 3]| v.map(|x| 100.0 * x / n.max(1) as f64);
    (pct(p), pct(nd))
}

/// User + system CPU seconds of this process so far (from /proc; the clock tick is 1/100 s on
/// Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
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

    let cpu_start = cpu_seconds();
    let trained = pool.install(|| args.config.fit(&data, &Silent))?;
    let train_cpu_s = cpu_seconds() - cpu_start;
    let summary = &trained.summary;

    let predict_start = Instant::now();
    let predictor = trained.model.predictor();
    let predicted = pool.install(|| predictor.predict(&test_x, 5));
    let predict_s = predict_start.elapsed().as_secs_f64();
    let (p, ndcg) = ranking_metrics(&predicted, &test_y);

    let bytes = trained.model.to_bytes();
    if let Some(path) = &args.save {
        trained.model.save(path)?;
    }
    let round = |x: f64, d: i32| (x * 10f64.powi(d)).round() / 10f64.powi(d);
    let out = serde_json::json!({
        "data": args.data.display().to_string(),
        "features": if args.transform.tfidf { "tfidf+l2" } else { "raw" },
        "solver": summary.solver,
        "config": args.config,
        "threads": summary.threads,
        "n_train": data.n_samples(), "n_features": data.n_features(), "n_labels": data.n_labels(),
        "load_s": round(load_s, 3),
        "train_s": round(summary.seconds, 3),
        "train_cpu_s": round(train_cpu_s, 2),
        "loadavg": std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| l.split_whitespace().next().map(str::to_owned)),
        "predict_ms_per_sample": round(1e3 * predict_s / test_x.n_rows().max(1) as f64, 4),
        "p@1": round(p[0], 2), "p@3": round(p[1], 2), "p@5": round(p[2], 2),
        "ndcg@1": round(ndcg[0], 2), "ndcg@3": round(ndcg[1], 2), "ndcg@5": round(ndcg[2], 2),
        "nnz_before_pruning": summary.nnz_before_pruning,
        "nnz_after_pruning": summary.nnz_after_pruning,
        "model_bytes": bytes.len(),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "stats": summary.stats,
    });
    println!("{out}");
    Ok(())
}
