//! `farout bench ...`: micro-benchmarks printing one JSON object each.

use anyhow::{Result, bail};
use clap::{Subcommand, ValueEnum};
use farout_core::{Matrix, gemm, kernels, rng};
use farout_data::synth::{FaceGenerator, FaceSpec, Split};
use farout_estimators::{Batch, Exact, GradientEstimator, SmoothedMargin, Softmax};
use farout_layer::{OptimizerConfig, OutputLayer, OutputLayerConfig};
use farout_search::{ExactIndex, Hit, MipsIndex, Rows, SphericalConfig, SphericalIndex};
use rand::Rng as _;
use std::time::Instant;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// One training step of the output layer (scores, loss gradient, dL/dphi, row updates),
    /// against a plain matrix product of the same shape measured in the same run.
    Layer {
        /// The gradient estimator.
        #[arg(long, value_enum, default_value_t = BenchEstimator::Softmax)]
        estimator: BenchEstimator,
        /// Number of classes K.
        #[arg(long, default_value_t = 100_000)]
        k: usize,
        /// Feature dimension D.
        #[arg(long, default_value_t = 128)]
        d: usize,
        /// Batch size.
        #[arg(long, default_value_t = 256)]
        batch: usize,
        /// Timed steps.
        #[arg(long, default_value_t = 10)]
        steps: usize,
        /// Print JSON (the only output format; kept for scripts that pass it).
        #[arg(long)]
        json: bool,
    },
    /// Top-Q search over the class means of the FaceNet-like generator: recall against brute
    /// force, queries per second of the index and of brute force (same run, same threads),
    /// build time and refresh speed.
    Search {
        /// The index.
        #[arg(long, value_enum, default_value_t = BenchIndex::Spherical)]
        index: BenchIndex,
        /// Number of rows (classes) K.
        #[arg(long, default_value_t = 200_000)]
        k: usize,
        /// Dimension D.
        #[arg(long, default_value_t = 128)]
        d: usize,
        /// Results per query Q.
        #[arg(long, default_value_t = 2_000)]
        top: usize,
        /// Number of queries (generator samples).
        #[arg(long, default_value_t = 1_000)]
        queries: usize,
        /// Class-mean clusters of the generator (0 = K / 100).
        #[arg(long, default_value_t = 0)]
        mean_clusters: usize,
        /// Spherical: centroids (0 = sqrt(K)).
        #[arg(long, default_value_t = 0)]
        centroids: usize,
        /// Spherical: candidates scored per result.
        #[arg(long)]
        candidate_factor: Option<f32>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum BenchIndex {
    Exact,
    Spherical,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum BenchEstimator {
    Softmax,
    Margin,
}

fn random_matrix(rows: usize, cols: usize, seed: u64, unit_rows: bool) -> Matrix {
    let mut r = rng::seeded(seed, 0);
    let mut m = Matrix::from_vec(rows, cols, (0..rows * cols).map(|_| rng::normal(&mut r)).collect()).expect("sized");
    if unit_rows {
        m.as_mut_slice().chunks_exact_mut(cols).for_each(|row| {
            kernels::normalize(row);
        });
    }
    m
}

/// Measures the layer step and the reference product; returns the JSON object.
pub fn bench_layer(
    estimator: BenchEstimator,
    k: usize,
    d: usize,
    batch: usize,
    steps: usize,
) -> Result<serde_json::Value> {
    if k == 0 || d == 0 || batch == 0 || steps == 0 {
        bail!("--k, --d, --batch and --steps must be > 0");
    }
    let est: Box<dyn GradientEstimator> = match estimator {
        BenchEstimator::Softmax => Box::new(Exact::new(Softmax)),
        BenchEstimator::Margin => Box::new(Exact::new(SmoothedMargin::new(1.0)?)),
    };
    let opt = OptimizerConfig::Sgd { lr: 0.1, decay: 0.0, l2: 0.0 };
    let mut layer = OutputLayer::new(k, d, &OutputLayerConfig { bias: true, init_std: 0.01 }, &opt, 1)?;
    let phi = random_matrix(batch, d, 2, true);
    let mut r = rng::seeded(3, 0);
    let labels: Vec<Vec<u32>> = (0..batch).map(|_| vec![r.random_range(0..k as u32)]).collect();
    let positives: Vec<&[u32]> = labels.iter().map(|l| l.as_slice()).collect();
    let b = Batch::new(&phi, &positives);
    layer.train_step(est.as_ref(), b, &mut r, true); // warm-up: buffers, thread pool
    let t = Instant::now();
    for _ in 0..steps {
        layer.train_step(est.as_ref(), b, &mut r, true);
    }
    let secs = t.elapsed().as_secs_f64();

    // Reference: Z = Phi W^T with the same shapes, same library, same threads.
    let mut z = vec![0.0f32; batch * k];
    gemm::scores(phi.as_slice(), batch, layer.weights().as_slice(), k, d, &mut z);
    let gemm_reps = 3 * steps; // as many products as the layer step performs
    let t = Instant::now();
    for _ in 0..gemm_reps {
        gemm::scores(phi.as_slice(), batch, layer.weights().as_slice(), k, d, &mut z);
    }
    let gemm_secs = t.elapsed().as_secs_f64();
    let flop_per_pass = 2.0 * k as f64 * d as f64 * batch as f64;
    let gflops = 3.0 * flop_per_pass * steps as f64 / secs / 1e9;
    let gemm_gflops = flop_per_pass * gemm_reps as f64 / gemm_secs / 1e9;
    Ok(serde_json::json!({
        "bench": "layer",
        "estimator": est.name(),
        "k": k,
        "d": d,
        "batch": batch,
        "steps": steps,
        "threads": rayon::current_num_threads(),
        "seconds": secs,
        "samples_per_s": (batch * steps) as f64 / secs,
        "gflops": gflops,
        "gemm_gflops": gemm_gflops,
        "gflops_ratio": gflops / gemm_gflops,
        "flops_counted": "3 passes of 2*K*D per sample: scores, dL/dphi, dL/dW",
    }))
}

/// Queries per call of the batched search (as one training step of 256 samples would issue).
const QUERY_BATCH: usize = 256;

/// Runs the queries through `index`, one by one in parallel and in batches of [`QUERY_BATCH`];
/// returns the batched results and the queries/second of both ways.
fn timed_queries(index: &dyn MipsIndex, w: &Matrix, q: &Matrix, top: usize) -> (Vec<Vec<Hit>>, f64, f64) {
    use rayon::prelude::*;
    let t = Instant::now();
    let _: Vec<Vec<Hit>> = (0..q.rows())
        .into_par_iter()
        .map(|i| {
            let mut h = Vec::with_capacity(top);
            index.search(Rows::all(w), q.row(i), top, &mut h);
            h
        })
        .collect();
    let single_qps = q.rows() as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut out = Vec::with_capacity(q.rows());
    let mut part = Vec::new();
    for start in (0..q.rows()).step_by(QUERY_BATCH) {
        let end = (start + QUERY_BATCH).min(q.rows());
        let chunk = Matrix::from_vec(end - start, q.cols(), q.as_slice()[start * q.cols()..end * q.cols()].to_vec())
            .expect("rows of q");
        index.search_batch(Rows::all(w), &chunk, top, &mut part);
        out.append(&mut part);
    }
    (out, q.rows() as f64 / t.elapsed().as_secs_f64(), single_qps)
}

/// Measures one index against brute force; returns the JSON object.
#[allow(clippy::too_many_arguments)]
pub fn bench_search(
    which: BenchIndex,
    k: usize,
    d: usize,
    top: usize,
    queries: usize,
    mean_clusters: usize,
    centroids: usize,
    candidate_factor: Option<f32>,
) -> Result<serde_json::Value> {
    if k == 0 || d == 0 || top == 0 || queries == 0 {
        bail!("--k, --d, --top and --queries must be > 0");
    }
    let clusters = if mean_clusters > 0 { mean_clusters } else { (k / 100).max(1) };
    let spec = FaceSpec {
        n_classes: k,
        n_samples: 2 * k.max(queries),
        dim: d,
        mean_clusters: clusters,
        cluster_spread: 0.7,
        ..FaceSpec::default()
    };
    let g = FaceGenerator::new(spec)?;
    let mut w = g.means().clone();
    let q = g.features(Split::Train, 0..queries);
    let t = Instant::now();
    let mut index: Box<dyn MipsIndex> = match which {
        BenchIndex::Exact => Box::new(ExactIndex::new()),
        BenchIndex::Spherical => {
            let mut c = SphericalConfig { n_centroids: centroids, ..SphericalConfig::default() };
            if let Some(f) = candidate_factor {
                c.candidate_factor = f;
            }
            Box::new(SphericalIndex::build(Rows::all(&w), &c))
        }
    };
    let build_seconds = t.elapsed().as_secs_f64();
    let (exact, exact_qps, exact_qps_single) = timed_queries(&ExactIndex::new(), &w, &q, top);
    let (found, qps, qps_single) = timed_queries(index.as_ref(), &w, &q, top);
    let recall: f64 = exact
        .iter()
        .zip(&found)
        .map(|(e, f)| {
            let mut truth: Vec<u32> = e.iter().map(|h| h.class).collect();
            truth.sort_unstable();
            f.iter().filter(|h| truth.binary_search(&h.class).is_ok()).count() as f64 / e.len().max(1) as f64
        })
        .sum::<f64>()
        / queries as f64;
    // Refresh: nudge 1% of the rows (as one training step's updates would) and re-index them.
    let mut r = rng::seeded(9, 0);
    let rows: Vec<u32> = (0..(k / 100).max(1)).map(|_| r.random_range(0..k as u32)).collect();
    for &i in &rows {
        let row = w.row_mut(i as usize);
        row.iter_mut().for_each(|x| *x += 0.01 * rng::normal(&mut r));
        kernels::normalize(row);
    }
    let t = Instant::now();
    index.refresh(Rows::all(&w), &rows);
    let refresh_rows_per_s = rows.len() as f64 / t.elapsed().as_secs_f64().max(1e-9);
    Ok(serde_json::json!({
        "bench": "search",
        "index": index.name(),
        "k": k,
        "d": d,
        "top": top,
        "queries": queries,
        "mean_clusters": clusters,
        "threads": rayon::current_num_threads(),
        "recall": recall,
        "qps": qps,
        "exact_qps": exact_qps,
        "speedup": qps / exact_qps,
        "qps_single": qps_single,
        "exact_qps_single": exact_qps_single,
        "query_batch": QUERY_BATCH,
        "build_seconds": build_seconds,
        "refresh_rows_per_s": refresh_rows_per_s,
        "index_bytes": index.memory_bytes(),
        "w_bytes": w.bytes(),
    }))
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Layer { estimator, k, d, batch, steps, json: _ } => {
            println!("{}", bench_layer(estimator, k, d, batch, steps)?);
        }
        BenchCommand::Search { index, k, d, top, queries, mean_clusters, centroids, candidate_factor, json: _ } => {
            println!("{}", bench_search(index, k, d, top, queries, mean_clusters, centroids, candidate_factor)?);
        }
    }
    Ok(())
}
