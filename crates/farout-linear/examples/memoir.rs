//! Trains MEMOIR on face-synthetic embeddings (farout-data's `FaceGenerator`) or an XMC data set
//! and prints one JSON object: the per-epoch curve (training seconds, test accuracy, oracle
//! recall, |m − m̄|, rows changed and refresh time per batch, objective) and totals.
//!
//! ```text
//! cargo run --release -p farout-linear --example memoir -- --classes 100000 --per-class 5 --dim 128 --oracle hnsw
//! cargo run --release -p farout-linear --example memoir -- --data ../shared/data/xmc/bibtex --oracle exact
//! options: --oracle exact|hnsw|simple_lsh|hamming|flat_int8  --variant l2|l1  --epochs N  --batch N  --eta0 X
//!          --eta-step X  --lambda X  --seed N  --threads N  --test-sample N  --rebuild-fraction X
//!          --headroom X (norm headroom of hnsw/simple_lsh)  --ef-construction N  --ef-search N
//!          --max-connections N  --bits N  --tables N  --candidate-factor X  --noise X
//!          --code-bits N (hamming)
//!          --intrinsic-dim N
//! ```
//!
//! Test accuracy is the exact argmax of Wx (for multi-label data: P@1, the top class among the
//! sample's labels) on `--test-sample` test samples, computed from V after each epoch (outside
//! the timed training).

use anyhow::{Context, Result, bail};
use farout_core::Matrix;
use farout_data::synth::{FaceGenerator, FaceSpec, Split};
use farout_data::{Dataset, Features, LabelSets, SparseRows, xmc};
use farout_linear::TrainSet;
use farout_linear::memoir::{EpochStats, Memoir, MemoirConfig, Variant};
use farout_search::{HammingConfig, HnswConfig, IndexConfig, MipsIndex, Rows, SimpleLshConfig};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Default)]
struct Args {
    data: Option<PathBuf>,
    classes: usize,
    per_class: usize,
    dim: usize,
    noise: f32,
    intrinsic_dim: usize,
    oracle: String,
    test_sample: usize,
    threads: usize,
    hnsw: HnswConfig,
    lsh: SimpleLshConfig,
    hamming: HammingConfig,
    config: MemoirConfig,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        classes: 100_000,
        per_class: 5,
        dim: 128,
        noise: 1.0,
        oracle: "hnsw".into(),
        test_sample: 10_000,
        hnsw: HnswConfig { norm_headroom: 1.0, ..Default::default() },
        lsh: SimpleLshConfig { norm_headroom: 1.0, ..Default::default() },
        hamming: HammingConfig { norm_headroom: 1.0, ..Default::default() },
        config: MemoirConfig { epochs: 3, ..Default::default() },
        ..Default::default()
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        macro_rules! num {
            ($field:expr) => {
                $field = value()?.parse().with_context(|| flag.clone())?
            };
        }
        match flag.as_str() {
            "--data" => a.data = Some(value()?.into()),
            "--classes" => num!(a.classes),
            "--per-class" => num!(a.per_class),
            "--dim" => num!(a.dim),
            "--noise" => num!(a.noise),
            "--intrinsic-dim" => num!(a.intrinsic_dim),
            "--oracle" => a.oracle = value()?,
            "--variant" => {
                a.config.variant = match value()?.as_str() {
                    "l2" => Variant::L2,
                    "l1" => Variant::L1,
                    other => bail!("--variant {other}: expected l2 or l1"),
                }
            }
            "--epochs" => num!(a.config.epochs),
            "--batch" => num!(a.config.batch),
            "--eta0" => num!(a.config.eta0),
            "--eta-step" => num!(a.config.eta_step),
            "--lambda" => num!(a.config.lambda),
            "--seed" => num!(a.config.seed),
            "--rebuild-fraction" => num!(a.config.rebuild_fraction),
            "--monitor" => num!(a.config.monitor),
            "--threads" => num!(a.threads),
            "--test-sample" => num!(a.test_sample),
            "--headroom" => {
                num!(a.hnsw.norm_headroom);
                a.lsh.norm_headroom = a.hnsw.norm_headroom;
                a.hamming.norm_headroom = a.hnsw.norm_headroom;
            }
            "--ef-construction" => num!(a.hnsw.ef_construction),
            "--ef-search" => num!(a.hnsw.ef_search),
            "--max-connections" => num!(a.hnsw.max_connections),
            "--stale-fraction" => num!(a.hnsw.stale_fraction),
            "--bits" => num!(a.lsh.bits),
            "--tables" => num!(a.lsh.tables),
            "--code-bits" => num!(a.hamming.bits),
            "--candidate-factor" => {
                num!(a.lsh.candidate_factor);
                a.hnsw.candidate_factor = a.lsh.candidate_factor;
                a.hamming.candidate_factor = a.lsh.candidate_factor;
            }
            other => bail!("unknown option {other}"),
        }
    }
    a.config.oracle = match a.oracle.as_str() {
        "exact" => IndexConfig::exact(),
        "hnsw" => IndexConfig::Hnsw(a.hnsw.clone()),
        "simple_lsh" => IndexConfig::SimpleLsh(a.lsh.clone()),
        "hamming" => IndexConfig::Hamming(a.hamming.clone()),
        "flat_int8" => IndexConfig::FlatInt8(farout_search::FlatInt8Config::default()),
        other => bail!("--oracle {other}: expected exact, hnsw, simple_lsh, hamming or flat_int8"),
    };
    Ok(a)
}

/// (train, test) from the XMC directory or the face generator.
fn load(a: &Args) -> Result<(Dataset, Dataset, serde_json::Value)> {
    if let Some(dir) = &a.data {
        let read = |name: &str| {
            let path = dir.join(name);
            xmc::read(&path).with_context(|| format!("reading {}", path.display()))
        };
        return Ok((read("train.txt")?, read("test.txt")?, serde_json::json!({"xmc": dir.display().to_string()})));
    }
    let spec = FaceSpec {
        n_classes: a.classes,
        n_samples: a.classes * a.per_class,
        dim: a.dim,
        noise: a.noise,
        min_per_class: a.per_class,
        intrinsic_dim: a.intrinsic_dim,
        ..FaceSpec::default()
    };
    let described = serde_json::to_value(&spec)?;
    let g = FaceGenerator::new(spec)?;
    Ok((g.dataset(Split::Train), g.dataset(Split::Test), serde_json::json!({"face": described})))
}

/// Fraction of test samples whose top class (exact argmax of V x) is one of their labels.
fn accuracy(v: &Matrix, x: &Matrix, labels: &LabelSets) -> f64 {
    let mut hits = Vec::new();
    farout_search::ExactIndex::new().search_batch(Rows::all(v), x, 1, &mut hits);
    let ok = hits.iter().enumerate().filter(|(i, h)| h.first().is_some_and(|h| labels.get(*i).contains(&h.class)));
    ok.count() as f64 / x.rows().max(1) as f64
}

fn dense_sample(features: &Features, labels: &LabelSets, n: usize) -> (Matrix, LabelSets) {
    let rows: Vec<usize> = (0..labels.len()).filter(|&i| !labels.get(i).is_empty()).take(n).collect();
    let d = match features {
        Features::Dense(m) => m.cols(),
        Features::Sparse(s) => s.n_cols,
    };
    let mut m = Matrix::zeros(rows.len(), d);
    let mut l = LabelSets::new(labels.n_labels);
    for (at, &i) in rows.iter().enumerate() {
        match features {
            Features::Dense(x) => m.row_mut(at).copy_from_slice(x.row(i)),
            Features::Sparse(s) => {
                let (c, v) = SparseRows::row(s, i);
                c.iter().zip(v).for_each(|(&j, &x)| {
                    if (j as usize) < d {
                        m.row_mut(at)[j as usize] = x
                    }
                });
            }
        }
        l.push(labels.get(i));
    }
    (m, l)
}

fn main() -> Result<()> {
    let a = parse_args()?;
    a.config.check()?;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(a.threads).build()?;
    let t0 = Instant::now();
    let (train, test, source) = pool.install(|| load(&a))?;
    let (test_x, test_y) = dense_sample(&test.features, &test.labels, a.test_sample);
    let data = TrainSet::from_dataset(&train)?;
    let load_s = t0.elapsed().as_secs_f64();
    let memoir = Memoir::new(&a.config)?;
    let mut curve = Vec::new();
    let mut train_s = 0.0;
    let trained = pool.install(|| {
        memoir.train_with(&data, &farout_linear::Silent, &mut |e: &EpochStats, v: &Matrix| {
            train_s += e.seconds;
            let acc = accuracy(v, &test_x, &test_y);
            eprintln!(
                "epoch {} {:.1}s acc {:.4} recall {:.3} rebuilds {}",
                e.epoch, e.seconds, acc, e.recall, e.rebuilds
            );
            curve.push(serde_json::json!({
                "epoch": e.epoch, "seconds": e.seconds, "train_seconds_total": train_s,
                "test_accuracy": acc, "recall": e.recall, "margin_gap_mean": e.margin_gap_mean,
                "margin_gap_q95": e.margin_gap_q95, "objective": e.objective, "train_accuracy": e.train_accuracy,
                "violations": e.violations, "query_seconds": e.query_seconds, "update_seconds": e.update_seconds,
                "refresh_seconds": e.refresh_seconds, "rows_changed_per_batch": e.rows_changed_mean,
                "refresh_ms_per_batch": e.refresh_ms_mean, "rebuilds": e.rebuilds,
                "oracle_cost_per_query": e.oracle_cost_mean, "batches": e.batches,
            }));
        })
    })?;
    let r = &trained.report;
    let n_epochs = r.epochs.len().max(1) as f64;
    let out = serde_json::json!({
        "source": source,
        "variant": a.config.variant,
        "oracle": a.config.oracle,
        "classes": data.n_labels(), "features": data.n_features(), "pairs": r.n_pairs,
        "test_samples": test_x.rows(),
        "batch": r.batch, "batches": r.batches, "lambda": r.lambda, "eta0": a.config.eta0, "eta_step": a.config.eta_step,
        "seed": a.config.seed, "threads": r.threads,
        "load_s": load_s,
        "train_s": train_s,
        "seconds_per_epoch": train_s / n_epochs,
        "wall_s_with_monitoring": r.seconds,
        "final_test_accuracy": curve.last().map(|c| c["test_accuracy"].clone()),
        "nnz": r.nnz_before_pruning,
        "loadavg": std::fs::read_to_string("/proc/loadavg").ok(),
        "curve": curve,
    });
    println!("{out}");
    Ok(())
}
