//! `farout bench ...`: micro-benchmarks printing one JSON object each.

use anyhow::{Result, bail};
use clap::{Subcommand, ValueEnum};
use farout_core::{Matrix, gemm, kernels, rng};
use farout_estimators::{Batch, Exact, GradientEstimator, SmoothedMargin, Softmax};
use farout_layer::{OptimizerConfig, OutputLayer, OutputLayerConfig};
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
    let b = Batch { phi: &phi, positives: &positives };
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

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Layer { estimator, k, d, batch, steps, json: _ } => {
            println!("{}", bench_layer(estimator, k, d, batch, steps)?);
        }
    }
    Ok(())
}
