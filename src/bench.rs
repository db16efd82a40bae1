//! `farout bench ...`: micro-benchmarks printing one JSON object each.

use anyhow::{Result, bail};
use clap::{Subcommand, ValueEnum};
use farout_core::{Matrix, gemm, kernels, rng};
use farout_data::synth::{FaceGenerator, FaceSpec, Split};
use farout_estimators::{Batch, Exact, GradientEstimator, SmoothedMargin, Softmax};
use farout_layer::{OptimizerConfig, OutputLayer, OutputLayerConfig};
use farout_search::{ExactIndex, Hit, MipsIndex, Rows, SphericalConfig};
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
        #[command(flatten)]
        means: MeanStructure,
        #[command(flatten)]
        params: IndexParams,
        #[arg(long)]
        json: bool,
    },
    /// One estimator against the exact gradient of its loss on a trained-looking layer (W = the
    /// generator's class means, scaled and perturbed; phi = its samples): time per sample of
    /// both (same run), cosine of dL/dphi, relative loss error, classes scored.
    Estimator {
        #[arg(long, value_enum)]
        estimator: EstimatorName,
        /// Loss of `mips` / `ldgs` (the sampling estimators approximate the softmax).
        #[arg(long, value_enum, default_value_t = LossName::Margin)]
        loss: LossName,
        #[arg(long, default_value_t = 100_000)]
        k: usize,
        #[arg(long, default_value_t = 128)]
        d: usize,
        /// Classes retrieved per block (mips, ldgs) or negatives drawn (sampling); 0 = K / 100.
        #[arg(long, default_value_t = 0)]
        top: usize,
        /// LDGS blocks B (0 = D / 16).
        #[arg(long, default_value_t = 0)]
        blocks: usize,
        /// LDGS message-passing steps T, or fixed-point (lambda = lambda*, the T -> inf limit).
        #[arg(long, default_value = "fixed-point")]
        iterations: farout_estimators::Iterations,
        /// Index of mips / ldgs.
        #[arg(long, value_enum, default_value_t = BenchIndex::Spherical)]
        index: BenchIndex,
        /// Samples measured (in batches of 256).
        #[arg(long, default_value_t = 1024)]
        samples: usize,
        #[command(flatten)]
        means: MeanStructure,
        #[command(flatten)]
        params: IndexParams,
        #[arg(long)]
        json: bool,
    },
}

/// How the generator's class means are arranged (see `FaceSpec`): FaceNet-like (near a
/// low-dimensional subspace, the default), grouped in clusters, or independent.
#[derive(clap::Args, Clone, Copy)]
pub struct MeanStructure {
    /// Dimension of the subspace the class means lie near (0 = independent means).
    #[arg(long, default_value_t = 12)]
    intrinsic_dim: usize,
    /// Group the class means in this many clusters (spread 0.7) instead of a subspace.
    #[arg(long)]
    mean_clusters: Option<usize>,
}

impl MeanStructure {
    /// The generator's parameters for `k` classes of dimension `d` and `n` samples.
    fn spec(self, k: usize, d: usize, n: usize) -> FaceSpec {
        let base = FaceSpec { n_classes: k, n_samples: n, dim: d, ..FaceSpec::default() };
        match self.mean_clusters {
            Some(c) => FaceSpec { mean_clusters: c, cluster_spread: 0.7, ..base },
            None => FaceSpec { intrinsic_dim: self.intrinsic_dim.min(d), ..base },
        }
    }

    fn describe(self, d: usize) -> serde_json::Value {
        match self.mean_clusters {
            Some(c) => serde_json::json!({ "mean_clusters": c, "cluster_spread": 0.7 }),
            None => serde_json::json!({
                "intrinsic_dim": self.intrinsic_dim.min(d),
                "residual": FaceSpec::default().residual,
            }),
        }
    }
}

/// Estimators `bench estimator` measures against the exact gradient of their loss.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EstimatorName {
    Mips,
    Ldgs,
    SampledSoftmax,
    NegativeSampling,
    Ove,
    ArSoftmax,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LossName {
    Margin,
    Softmax,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum BenchIndex {
    Exact,
    Spherical,
    SimpleLsh,
    Hnsw,
}

/// Index parameters the benches expose (the rest are the config defaults).
#[derive(clap::Args, Clone, Copy)]
pub struct IndexParams {
    /// Spherical: centroids (0 = sqrt(K)).
    #[arg(long, default_value_t = 0)]
    centroids: usize,
    /// Spherical, SimpleLSH, HNSW: candidates scored per result.
    #[arg(long)]
    candidate_factor: Option<f32>,
    /// SimpleLSH: hash tables.
    #[arg(long, default_value_t = 16)]
    tables: usize,
    /// SimpleLSH: bits per table (0 = log2(K / 32)).
    #[arg(long, default_value_t = 0)]
    bits: usize,
    /// HNSW: search list size (raised to the candidates fetched).
    #[arg(long, default_value_t = 64)]
    ef_search: usize,
    /// Spherical: score probed rows on f32 copies (the config default) or on int8 codes, then
    /// rescore the best exactly.
    #[arg(long, value_enum, default_value_t = ScoringName::F32)]
    scoring: ScoringName,
    /// Spherical, int8 scoring: rows rescored exactly per result.
    #[arg(long)]
    rescore: Option<f32>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScoringName {
    F32,
    Int8,
}

impl IndexParams {
    /// The index `which` with these parameters.
    fn config(self, which: BenchIndex) -> farout_search::IndexConfig {
        use farout_search::{HnswConfig, IndexConfig, IndexKind, SimpleLshConfig};
        let mut c = IndexConfig {
            kind: match which {
                BenchIndex::Exact => IndexKind::Exact,
                BenchIndex::Spherical => IndexKind::Spherical,
                BenchIndex::SimpleLsh => IndexKind::SimpleLsh,
                BenchIndex::Hnsw => IndexKind::Hnsw,
            },
            spherical: SphericalConfig {
                n_centroids: self.centroids,
                scoring: match self.scoring {
                    ScoringName::F32 => farout_search::Scoring::F32,
                    ScoringName::Int8 => farout_search::Scoring::Int8,
                },
                rescore: self.rescore.unwrap_or(SphericalConfig::default().rescore),
                ..SphericalConfig::default()
            },
            simple_lsh: SimpleLshConfig { tables: self.tables, bits: self.bits, ..SimpleLshConfig::default() },
            hnsw: HnswConfig { ef_search: self.ef_search, ..HnswConfig::default() },
        };
        if let Some(f) = self.candidate_factor {
            (c.spherical.candidate_factor, c.simple_lsh.candidate_factor, c.hnsw.candidate_factor) = (f, f, f);
        }
        c
    }
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

/// Runs the queries through `index`, one by one in parallel and in batches of [`QUERY_BATCH`]
/// (after one untimed batch); returns the batched results and the queries/second of both ways.
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
    let chunks: Vec<Matrix> = (0..q.rows())
        .step_by(QUERY_BATCH)
        .map(|start| {
            let end = (start + QUERY_BATCH).min(q.rows());
            Matrix::from_vec(end - start, q.cols(), q.as_slice()[start * q.cols()..end * q.cols()].to_vec())
                .expect("rows of q")
        })
        .collect();
    // One untimed batch first: the timing is of the steady state (allocator and caches warm),
    // as in training, where every step issues such a batch.
    let mut part = Vec::new();
    index.search_batch(Rows::all(w), &chunks[0], top, &mut part);
    let t = Instant::now();
    let mut out = Vec::with_capacity(q.rows());
    for chunk in &chunks {
        index.search_batch(Rows::all(w), chunk, top, &mut part);
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
    means: MeanStructure,
    params: IndexParams,
) -> Result<serde_json::Value> {
    if k == 0 || d == 0 || top == 0 || queries == 0 {
        bail!("--k, --d, --top and --queries must be > 0");
    }
    let g = FaceGenerator::new(means.spec(k, d, 2 * k.max(queries)))?;
    let mut w = g.means().clone();
    let q = g.features(Split::Train, 0..queries);
    let config = params.config(which);
    let t = Instant::now();
    let mut index = config.build(Rows::all(&w));
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
        "index_config": config,
        "k": k,
        "d": d,
        "top": top,
        "queries": queries,
        "means": means.describe(d),
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

/// Scale of the trained-looking layer: scores `s <W_k, phi>` spread over about `2 s` between a
/// sample's own class and unrelated ones (a trained face layer's logits span ~10-20).
const TRAINED_SCALE: f32 = 8.0;

#[allow(clippy::too_many_arguments)]
pub fn bench_estimator(
    which: EstimatorName,
    loss: LossName,
    k: usize,
    d: usize,
    top: usize,
    blocks: usize,
    iterations: farout_estimators::Iterations,
    index: BenchIndex,
    samples: usize,
    means: MeanStructure,
    params: IndexParams,
) -> Result<serde_json::Value> {
    use farout_estimators::{
        ActiveSet, ArSoftmax, BatchGrad, Ctx, Ldgs, Loss, Mips, NegativeSampling, Ove, Proposal, Rescore,
        SampledSoftmax,
    };
    use farout_search::BlockIndex;
    if k < 2 || d == 0 || samples == 0 {
        bail!("--k must be >= 2, --d and --samples > 0");
    }
    let top = if top > 0 { top } else { (k / 100).max(1) };
    let blocks = match which {
        EstimatorName::Ldgs if blocks > 0 => blocks,
        EstimatorName::Ldgs => (d / 16).max(1),
        _ => 1,
    };
    if !d.is_multiple_of(blocks) {
        bail!("--blocks {blocks} must divide --d {d}");
    }
    let g = FaceGenerator::new(means.spec(k, d, (2 * k).max(samples) + samples))?;
    // Trained-looking W: the class means, perturbed (5% noise) and scaled.
    let mut w = g.means().clone();
    let mut r = rng::seeded(17, 0);
    for x in w.as_mut_slice() {
        *x = TRAINED_SCALE * (*x + 0.05 * rng::normal(&mut r) / (d as f32).sqrt());
    }
    let phi = g.features(Split::Train, 0..samples);
    let labels: Vec<[u32; 1]> = g.labels(Split::Train)[..samples].iter().map(|&c| [c]).collect();
    let refs: Vec<&[u32]> = labels.iter().map(|p| &p[..]).collect();
    let margin = SmoothedMargin::new(1.0)?;
    let uses_margin = loss == LossName::Margin && matches!(which, EstimatorName::Mips | EstimatorName::Ldgs);
    let (reference, loss_fn): (Box<dyn GradientEstimator>, Box<dyn Loss>) = if uses_margin {
        (Box::new(Exact::new(margin)), Box::new(margin))
    } else {
        (Box::new(Exact::new(Softmax)), Box::new(Softmax))
    };
    let est: Box<dyn GradientEstimator> = match (which, uses_margin) {
        (EstimatorName::Mips, true) => Box::new(Mips::new(margin, top)?),
        (EstimatorName::Mips, false) => Box::new(Mips::new(Softmax, top)?),
        (EstimatorName::Ldgs, true) => {
            Box::new(Ldgs::new(margin, top, iterations, ActiveSet::Union, 1e-3, Rescore::Exact)?)
        }
        (EstimatorName::Ldgs, false) => {
            Box::new(Ldgs::new(Softmax, top, iterations, ActiveSet::Union, 1e-3, Rescore::Exact)?)
        }
        (EstimatorName::SampledSoftmax, _) => Box::new(SampledSoftmax::new(top)?),
        (EstimatorName::NegativeSampling, _) => Box::new(NegativeSampling::new(top, Proposal::Uniform)?),
        (EstimatorName::Ove, _) => Box::new(Ove::new(top)?),
        (EstimatorName::ArSoftmax, _) => Box::new(ArSoftmax::new(top, samples)?),
    };
    let t = Instant::now();
    let block_index = est.uses_index().then(|| BlockIndex::build(&w, &params.config(index), blocks));
    let build_seconds = t.elapsed().as_secs_f64();
    let ctx = Ctx { w: &w, bias: None, index: block_index.as_ref() };
    let ids: Vec<usize> = (0..samples).collect();
    // Both estimators over all samples in batches of 256, alternating batch by batch so that
    // both see the same machine (shared machines drift by 2x within a minute): dL/dphi per
    // sample (timed apart: only the estimate is the estimator's cost), seconds, classes scored.
    let mut runs: [(Matrix, f64, usize); 2] = std::array::from_fn(|_| (Matrix::zeros(samples, d), 0.0, 0));
    let (mut bg, mut part) = (BatchGrad::default(), Matrix::default());
    for start in (0..samples).step_by(256) {
        let end = (start + 256).min(samples);
        let chunk = Matrix::from_vec(end - start, d, phi.as_slice()[start * d..end * d].to_vec()).expect("rows");
        for (e, (dphi, seconds, scored)) in [reference.as_ref(), est.as_ref()].into_iter().zip(&mut runs) {
            let batch = Batch::new(&chunk, &refs[start..end]).with_ids(&ids[start..end]);
            let t = Instant::now();
            let tot = e.estimate_batch(&ctx, batch, &mut rng::seeded(5, start as u64), &mut bg);
            *seconds += t.elapsed().as_secs_f64();
            *scored += tot.classes_scored;
            bg.dphi(&w, &mut part);
            dphi.as_mut_slice()[start * d..end * d].copy_from_slice(part.as_slice());
        }
    }
    let [(d_exact, exact_seconds, _), (d_est, seconds, scored)] = runs;
    // Exact losses per sample, for the estimator's loss error (stateless estimates).
    let mut z = vec![0.0f32; k];
    let mut grad = vec![0.0f32; k];
    let mut scratch = farout_estimators::LossScratch::default();
    let (mut cos_sum, mut abs_err, mut abs_loss) = (0.0f64, 0.0f64, 0.0f64);
    let mut est_grad = farout_core::SparseGrad::new();
    for (i, positives) in refs.iter().enumerate() {
        let (a, b) = (d_est.row(i), d_exact.row(i));
        let (na, nb) = (kernels::norm(a), kernels::norm(b));
        cos_sum +=
            if na == 0.0 && nb == 0.0 { 1.0 } else { (kernels::dot(a, b) / (na * nb).max(f32::MIN_POSITIVE)) as f64 };
        kernels::gemv(w.as_slice(), phi.row(i), &mut z);
        let exact_loss = loss_fn.value_and_grad(&z, positives, &mut grad, &mut scratch) as f64;
        let e = est.estimate(&ctx, phi.row(i), positives, &mut rng::seeded(5, i as u64), &mut est_grad).loss as f64;
        abs_err += (e - exact_loss).abs();
        abs_loss += exact_loss.abs();
    }
    let n = samples as f64;
    Ok(serde_json::json!({
        "bench": "estimator",
        "estimator": est.name(),
        "loss": if uses_margin { "margin" } else { "softmax" },
        "k": k,
        "d": d,
        "top": top,
        "blocks": blocks,
        "iterations": iterations.to_string(),
        "index": block_index.as_ref().map(|b| b.block(0).name()),
        "samples": samples,
        "means": means.describe(d),
        "threads": rayon::current_num_threads(),
        "us_per_sample": seconds * 1e6 / n,
        "exact_us_per_sample": exact_seconds * 1e6 / n,
        "speedup": exact_seconds / seconds.max(1e-12),
        "grad_cosine": cos_sum / n,
        // Mean absolute error over mean absolute exact loss (a per-sample ratio would divide by
        // the margin loss's many exact zeros).
        "loss_rel_error": abs_err / abs_loss.max(1e-12),
        "classes_scored_per_sample": scored as f64 / n,
        "index_build_seconds": build_seconds,
        "index_bytes": block_index.as_ref().map_or(0, |b| b.memory_bytes()),
    }))
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Layer { estimator, k, d, batch, steps, json: _ } => {
            println!("{}", bench_layer(estimator, k, d, batch, steps)?);
        }
        BenchCommand::Search { index, k, d, top, queries, means, params, json: _ } => {
            println!("{}", bench_search(index, k, d, top, queries, means, params)?);
        }
        BenchCommand::Estimator {
            estimator,
            loss,
            k,
            d,
            top,
            blocks,
            iterations,
            index,
            samples,
            means,
            params,
            json: _,
        } => {
            println!(
                "{}",
                bench_estimator(estimator, loss, k, d, top, blocks, iterations, index, samples, means, params)?
            );
        }
    }
    Ok(())
}
