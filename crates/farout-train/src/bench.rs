//! Micro-benchmarks of the output layer, the search indexes and the estimators (`farout
//! bench ...`): each returns one JSON object of figures measured against a reference in the same
//! run (a matrix product of the same shape, brute-force search, the exact gradient), since the
//! machines these run on are shared and their absolute speed drifts.

use crate::Error;
use crate::config::estimator_from_settings;
use farout_core::{Matrix, gemm, kernels, rng};
use farout_data::synth::{FaceGenerator, FaceSpec, Split};
use farout_dist::Collective;
use farout_estimators::{Batch, BatchGrad, Ctx, GradientEstimator, Loss, Problem};
use farout_layer::{IndexUpkeep, OptimizerConfig, OutputLayer, OutputLayerConfig, ShardedLayer, sharded_sparse};
use farout_search::{ExactIndex, Hit, IndexConfig, MipsIndex, Rows};
use rand::Rng as _;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How the generator's class means are arranged (see [`FaceSpec`]): FaceNet-like (near a
/// low-dimensional subspace, the default), grouped in clusters, or independent.
#[derive(Clone, Copy, Debug)]
pub struct MeanStructure {
    /// Dimension of the subspace the class means lie near (0 = independent means).
    pub intrinsic_dim: usize,
    /// Group the class means in this many clusters (spread 0.7) instead of a subspace.
    pub mean_clusters: Option<usize>,
}

impl Default for MeanStructure {
    fn default() -> Self {
        Self { intrinsic_dim: 12, mean_clusters: None }
    }
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

    fn describe(self, d: usize) -> Value {
        match self.mean_clusters {
            Some(c) => serde_json::json!({ "mean_clusters": c, "cluster_spread": 0.7 }),
            None => serde_json::json!({
                "intrinsic_dim": self.intrinsic_dim.min(d),
                "residual": FaceSpec::default().residual,
            }),
        }
    }
}

/// The estimator `name` with `settings` (`[output]` keys), read as a config's `[output]` would be.
fn estimator_config(name: &str, settings: &[String]) -> Result<farout_estimators::EstimatorConfig, Error> {
    // The command line spells names with `-` or `_` (`sampled-softmax`, `sampled_softmax`).
    let mut all = vec![format!("estimator=\"{}\"", name.replace('-', "_"))];
    all.extend(settings.iter().cloned());
    Ok(estimator_from_settings(&all)?)
}

/// An out-of-range command-line option.
fn option(name: &'static str, msg: &str) -> Error {
    Error::Option { name, msg: msg.into() }
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

/// `bench layer`'s choices.
#[derive(Clone, Debug)]
pub struct LayerBench {
    /// The estimator (`output.estimator`) with its defaults: an exact one, a sampling one, or
    /// mips or ldgs over the default index (those on the class-sharded path).
    pub estimator: String,
    /// Classes K.
    pub k: usize,
    /// Feature dimension D.
    pub d: usize,
    /// Batch size.
    pub batch: usize,
    /// Timed steps.
    pub steps: usize,
    /// Classes per pass of the class-sharded softmax (0 = all at once).
    pub class_chunk: usize,
}

/// What `bench layer` steps on, the same with one process and with several ranks (so that their
/// per-step losses compare): the layer's settings, a batch of unit-norm features with one random
/// label each, and the generator that drew the labels.
struct LayerProblem {
    layer: OutputLayerConfig,
    optimizer: OptimizerConfig,
    phi: Matrix,
    labels: Vec<Vec<u32>>,
    rng: rng::Rng,
}

impl LayerBench {
    /// Checks the sizes and draws the problem.
    fn problem(&self) -> Result<LayerProblem, Error> {
        let LayerBench { k, d, batch, steps, .. } = *self;
        for (name, v) in [("k", k), ("d", d), ("batch", batch), ("steps", steps)] {
            if v == 0 {
                return Err(option(name, "must be > 0"));
            }
        }
        let phi = random_matrix(batch, d, 2, true);
        let mut rng = rng::seeded(3, 0);
        let labels = (0..batch).map(|_| vec![rng.random_range(0..k as u32)]).collect();
        Ok(LayerProblem {
            layer: OutputLayerConfig { bias: true, init_std: 0.01, ..Default::default() },
            optimizer: OptimizerConfig::Sgd { lr: 0.1, decay: 0.0, l2: 0.0 },
            phi,
            labels,
            rng,
        })
    }
}

/// The vector instructions the kernels ran with (within `FAROUT_SIMD`): the f32 kernels', the
/// int8 scoring kernel's and the 4-bit scoring kernel's.
fn simd() -> Value {
    let level = format!("{:?}", kernels::simd_in_use()).to_lowercase();
    let int8 = format!("{:?}", farout_search::quant::Kernel::best()).to_lowercase();
    let pq4 = format!("{:?}", farout_search::pq4::Kernel::best()).to_lowercase();
    serde_json::json!({ "f32": level, "int8": int8, "pq4": pq4 })
}

/// One training step of the output layer (scores, loss gradient, dL/dphi, row updates) against
/// a plain matrix product of the same shape measured in the same run.
pub fn bench_layer(b: &LayerBench) -> Result<Value, Error> {
    let LayerBench { ref estimator, k, d, batch, steps, .. } = *b;
    let LayerProblem { layer, optimizer, phi, labels, mut rng } = b.problem()?;
    let config = estimator_config(estimator, &[])?;
    let no_counts = Vec::new;
    let problem = Problem { n_classes: k, n_data: batch, dim: d, label_counts: &no_counts };
    let built = config.build(&problem)?;
    if built.search.is_some() && built.estimator.shard_plan().is_some() {
        // The search estimators step through the class-sharded layer's path on one rank.
        return bench_layer_sharded(b, &farout_dist::Local);
    }
    if built.search.is_some() || built.estimator.sample_state().is_some() {
        let msg = format!(
            "bench layer measures estimators without an index or per-sample state; use bench estimator for `{estimator}`"
        );
        return Err(Error::Option { name: "estimator", msg });
    }
    let est = built.estimator;
    let mut layer = OutputLayer::new(k, d, &layer, &optimizer, 1)?;
    let positives: Vec<&[u32]> = labels.iter().map(|l| l.as_slice()).collect();
    let b = Batch::new(&phi, &positives);
    layer.train_step(est.as_ref(), b, &mut rng, true); // warm-up: buffers, thread pool
    let t = Instant::now();
    let losses: Vec<f64> =
        (0..steps).map(|_| layer.train_step(est.as_ref(), b, &mut rng, true).loss_sum / batch as f64).collect();
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
        "simd": simd(),
        "seconds": secs,
        "samples_per_s": (batch * steps) as f64 / secs,
        "gflops": gflops,
        "gemm_gflops": gemm_gflops,
        "gflops_ratio": gflops / gemm_gflops,
        "flops_counted": "3 passes of 2*K*D per sample: scores, dL/dphi, dL/dW",
        "step_seconds": secs / steps as f64,
        "peak_rss_bytes": crate::trainer::peak_rss_bytes(),
        "losses": losses,
    }))
}

/// `bench layer` on the ranks of `comm`: steps of a class-sharded layer (each rank owns K/P
/// rows; see [`farout_layer::sharded`]) on the same batch, layer and labels as the one-process
/// [`bench_layer`], so the per-step losses of both are comparable: the exact softmax, or a
/// search or sampling estimator ([`farout_layer::sharded_sparse`]; the search estimators with
/// the default index over each rank's rows, no bias). Reports the slowest rank's time, its time
/// in collectives, the bytes each rank sends per step and the largest peak memory of a rank.
pub fn bench_layer_sharded(b: &LayerBench, comm: &dyn Collective) -> Result<Value, Error> {
    let LayerBench { ref estimator, k, d, batch, steps, class_chunk } = *b;
    let LayerProblem { mut layer, optimizer, phi, labels, mut rng } = b.problem()?;
    let no_counts = Vec::new;
    let problem = Problem { n_classes: k, n_data: batch, dim: d, label_counts: &no_counts };
    let built = estimator_config(estimator, &[])?.build(&problem)?;
    let est = built.estimator.as_ref();
    let measured = sharded_sparse::trains_sharded(est) && est.sample_state().is_none();
    if !measured || (class_chunk > 0 && !sharded_sparse::is_exact_softmax(est)) {
        return Err(option(
            "estimator",
            "on several ranks (or with --class-chunk), bench layer measures the class-sharded exact softmax \
             (softmax, which alone takes --class-chunk), the exact margin and the search and sampling \
             estimators without per-sample state (margin, mips, ldgs, sampled_softmax, negative_sampling, ove)",
        ));
    }
    let (rank, ranks) = (comm.rank(), comm.size());
    if built.search.is_some() {
        layer.bias = false; // the indexes search W alone
    }
    let mut layer = ShardedLayer::new(k, rank, ranks, d, &layer, &optimizer, 1)?;
    if let Some(shape) = built.search {
        let index = IndexConfig::default().for_shard(k, ranks);
        layer.layer_mut().attach_index(index, shape.blocks, IndexUpkeep::default())?;
    }
    let positives: Vec<&[u32]> = labels.iter().map(|l| l.as_slice()).collect();
    let mut step =
        |layer: &mut ShardedLayer| layer.step(comm, est, Batch::new(&phi, &positives), &mut rng, true, class_chunk);
    step(&mut layer)?; // warm-up: buffers, thread pool, the index built
    layer.take_comm_seconds();
    layer.take_comm_bytes();
    comm.barrier()?;
    let t = Instant::now();
    let mut losses = Vec::with_capacity(steps);
    let mut classes_scored = 0;
    for _ in 0..steps {
        let stats = step(&mut layer)?;
        losses.push(stats.loss_sum / batch as f64);
        classes_scored += stats.classes_scored;
    }
    let mut slowest =
        [t.elapsed().as_secs_f64(), layer.take_comm_seconds(), crate::trainer::peak_rss_bytes().unwrap_or(0) as f64];
    comm.allreduce_max_f64(&mut slowest)?;
    let [secs, comm_secs, peak_rss] = slowest;
    let rows = layer.shard().len();
    Ok(serde_json::json!({
        "bench": "layer",
        "estimator": est.name(),
        "sharded": true,
        "k": k,
        "d": d,
        "batch": batch,
        "steps": steps,
        "class_chunk": class_chunk,
        "ranks": ranks,
        "rows_of_rank_0": rows,
        "threads_per_rank": rayon::current_num_threads(),
        "seconds": secs,
        "step_seconds": secs / steps as f64,
        "comm_seconds_per_step": comm_secs / steps as f64,
        "comm_bytes_per_step": layer.take_comm_bytes() / steps,
        "classes_scored_per_sample": classes_scored as f64 / (steps * batch) as f64,
        "samples_per_s": (batch * steps) as f64 / secs,
        "gflops": 3.0 * 2.0 * k as f64 * d as f64 * batch as f64 * steps as f64 / secs / 1e9,
        "layer_bytes_of_rank_0": layer.layer().memory_bytes(),
        "peak_rss_bytes_max": peak_rss as u64,
        "losses": losses,
    }))
}

/// Queries per call of the batched search (as one training step of 256 samples would issue).
const QUERY_BATCH: usize = 256;

/// Samples of `bench estimator`'s untimed first batch.
const WARM_UP: usize = 256;

/// Queries timed one at a time: the first this many, as `benches/peers/search_peers.py` times
/// its peers' one-query calls.
const SINGLE_QUERIES: usize = 1_000;

/// Runs the queries through `index` in batches of [`QUERY_BATCH`]; returns every query's
/// results and queries/second. `warm_up` is searched first, untimed, in one batch: the timing
/// is of the steady state (allocator and caches warm, an index calibrated to its target
/// recall), as in training, where every step issues such a batch.
fn timed_batches(index: &dyn MipsIndex, w: &Matrix, q: &Matrix, warm_up: &Matrix, top: usize) -> (Vec<Vec<Hit>>, f64) {
    let mut part = Vec::new();
    index.search_batch(Rows::all(w), warm_up, top, &mut part);
    let chunks: Vec<Matrix> = (0..q.rows())
        .step_by(QUERY_BATCH)
        .map(|start| {
            let end = (start + QUERY_BATCH).min(q.rows());
            Matrix::from_vec(end - start, q.cols(), q.as_slice()[start * q.cols()..end * q.cols()].to_vec())
                .expect("rows of q")
        })
        .collect();
    let t = Instant::now();
    let mut batched = Vec::with_capacity(q.rows());
    for chunk in &chunks {
        index.search_batch(Rows::all(w), chunk, top, &mut part);
        batched.append(&mut part);
    }
    (batched, q.rows() as f64 / t.elapsed().as_secs_f64())
}

/// The results and speed of [`timed_singles`].
struct Singles {
    /// The first [`SINGLE_QUERIES`] queries' results, searched one at a time.
    hits: Vec<Vec<Hit>>,
    /// Queries per second one at a time.
    qps: f64,
    /// Seconds of the first query searched alone, before the others (the spherical index
    /// makes its 4-bit codes for lone queries then).
    first_seconds: f64,
}

/// Runs the first [`SINGLE_QUERIES`] queries through `index` one at a time, one after another
/// on this thread, as a caller issuing one query per call does (and as
/// `benches/peers/search_peers.py` times its peers' one-query calls), after the first of them
/// searched once on its own and timed apart: the timing is of the steady state.
fn timed_singles(index: &dyn MipsIndex, w: &Matrix, q: &Matrix, top: usize) -> Singles {
    let n = q.rows().min(SINGLE_QUERIES);
    // Room for every result, so that the timed calls allocate nothing.
    let mut hits: Vec<Vec<Hit>> = (0..n).map(|_| Vec::with_capacity(top)).collect();
    let t = Instant::now();
    index.search(Rows::all(w), q.row(0), top, &mut hits[0]);
    let first_seconds = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for (i, out) in hits.iter_mut().enumerate() {
        index.search(Rows::all(w), q.row(i), top, out);
    }
    Singles { hits, qps: n as f64 / t.elapsed().as_secs_f64(), first_seconds }
}

/// `bench search`'s choices.
#[derive(Clone, Debug)]
pub struct SearchBench {
    /// The index with its parameters (an `[index]` section).
    pub index: IndexConfig,
    /// Rows (classes) K.
    pub k: usize,
    /// Dimension D.
    pub d: usize,
    /// Results per query Q.
    pub top: usize,
    /// Queries (generator samples).
    pub queries: usize,
    /// The class means searched.
    pub means: MeanStructure,
    /// Search these rows and queries (`.npy` files, f32, rows x D) instead of the generator's.
    pub vectors: Option<(PathBuf, PathBuf)>,
    /// Write the rows and queries searched to `DIR/w.npy` and `DIR/queries.npy` (for peers).
    pub export: Option<PathBuf>,
}

/// The rows and queries of `bench search` read from `.npy` files (`--vectors`), and the first
/// batch of the queries, searched untimed first (see [`timed_queries`]).
fn given_vectors(wp: &Path, qp: &Path) -> Result<(Matrix, Matrix, Matrix), Error> {
    let (w, q) = (farout_data::npy::read_f32_matrix(wp)?, farout_data::npy::read_f32_matrix(qp)?);
    if w.cols() != q.cols() {
        let msg = format!("{} has {} columns, {} has {}", wp.display(), w.cols(), qp.display(), q.cols());
        return Err(option("queries", &msg));
    }
    let n = q.rows().min(QUERY_BATCH);
    let warm_up = Matrix::from_vec(n, q.cols(), q.as_slice()[..n * q.cols()].to_vec()).expect("rows of q");
    Ok((w, q, warm_up))
}

impl SearchBench {
    /// Checks the sizes; the generator's class means (the rows searched), `queries` of its
    /// samples, and [`QUERY_BATCH`] other samples, searched untimed first (see [`timed_queries`]).
    fn generated_vectors(&self) -> Result<(Matrix, Matrix, Matrix), Error> {
        for (name, v) in [("k", self.k), ("d", self.d), ("queries", self.queries)] {
            if v == 0 {
                return Err(option(name, "must be > 0"));
            }
        }
        let g = FaceGenerator::new(self.means.spec(self.k, self.d, 2 * self.k.max(self.queries + QUERY_BATCH)))?;
        let warm_up = g.features(Split::Train, self.queries..self.queries + QUERY_BATCH);
        Ok((g.means().clone(), g.features(Split::Train, 0..self.queries), warm_up))
    }
}

/// Writes the rows and queries searched to `dir/w.npy` and `dir/queries.npy` (`--export`).
fn export_vectors(dir: &Path, w: &Matrix, q: &Matrix) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_path_buf(), source })?;
    farout_data::npy::write_f32_matrix(&dir.join("w.npy"), w)?;
    farout_data::npy::write_f32_matrix(&dir.join("queries.npy"), q)?;
    Ok(())
}

/// The budgets a calibrating index fitted to its target recall, as `bench search` reports them.
fn calibrations_json(index: &dyn MipsIndex) -> Vec<Value> {
    index
        .calibrations()
        .iter()
        .map(|c| {
            serde_json::json!({
                "k": c.k, "budget": c.budget, "probed": c.probed, "probed_per_result": c.per_result(), "recall": c.recall,
                "queries": c.queries,
            })
        })
        .collect()
}

/// Rows per second of `index.refresh` after nudging 1 % of the rows of `w` (as one training
/// step's updates would); with `undo`, the rows are then put back and refreshed again, untimed,
/// so that `w` and the index answer as before.
fn timed_refresh(index: &mut dyn MipsIndex, w: &mut Matrix, undo: bool) -> f64 {
    let k = w.rows();
    let mut r = rng::seeded(9, 0);
    let rows: Vec<u32> = (0..(k / 100).max(1)).map(|_| r.random_range(0..k as u32)).collect();
    let before: Vec<Vec<f32>> = rows.iter().map(|&i| w.row(i as usize).to_vec()).collect();
    for &i in &rows {
        let row = w.row_mut(i as usize);
        row.iter_mut().for_each(|x| *x += 0.01 * rng::normal(&mut r));
        kernels::normalize(row);
    }
    let t = Instant::now();
    index.refresh(Rows::all(w), &rows);
    let rate = rows.len() as f64 / t.elapsed().as_secs_f64().max(1e-9);
    if undo {
        // In reverse, so that a row drawn twice ends with its first values.
        for (&i, row) in rows.iter().zip(&before).rev() {
            w.row_mut(i as usize).copy_from_slice(row);
        }
        index.refresh(Rows::all(w), &rows);
    }
    rate
}

/// Top-Q search over the class means of the FaceNet-like generator, or over given vectors:
/// recall against brute force, queries per second of the index and of brute force (same run,
/// same threads), build time and refresh speed.
pub fn bench_search(b: &SearchBench) -> Result<Value, Error> {
    let SearchBench { index: ref config, top, means, .. } = *b;
    // The warm-up batch (`timed_queries`), on which a calibrating index fits its budget:
    // generator samples other than the queries, or the first batch of given queries.
    let (mut w, q, warm_up) = match &b.vectors {
        Some((wp, qp)) => given_vectors(wp, qp)?,
        None => b.generated_vectors()?,
    };
    let (k, d, queries) = (w.rows(), w.cols(), q.rows());
    for (name, v) in [("vectors", k), ("vectors", d), ("queries", queries), ("top", top)] {
        if v == 0 {
            return Err(option(name, "must be > 0 (an empty file?)"));
        }
    }
    if let Some(dir) = &b.export {
        export_vectors(dir, &w, &q)?;
    }
    let t = Instant::now();
    let mut index = config.build(Rows::all(&w));
    let build_seconds = t.elapsed().as_secs_f64();
    let (exact, exact_qps) = timed_batches(&ExactIndex::new(), &w, &q, &warm_up, top);
    let exact_qps_single = timed_singles(&ExactIndex::new(), &w, &q, top).qps;
    let t = Instant::now();
    let (found, qps) = timed_batches(index.as_ref(), &w, &q, &warm_up, top);
    let calibrations = calibrations_json(index.as_ref());
    let index_seconds = t.elapsed().as_secs_f64();
    let recall = farout_search::overlap(&found, &exact);
    // Refreshed as in training, before any query searched alone (after which the spherical
    // index with `pq4` scoring keeps 4-bit codes up to date too), and again after.
    let refresh_rows_per_s = timed_refresh(index.as_mut(), &mut w, true);
    let single = timed_singles(index.as_ref(), &w, &q, top);
    // One at a time the index may score otherwise (the spherical index's `pq4` scoring).
    let recall_single = farout_search::overlap(&single.hits, &exact[..single.hits.len()]);
    let refresh_after_single = timed_refresh(index.as_mut(), &mut w, false);
    Ok(serde_json::json!({
        "bench": "search",
        "index": index.name(),
        "index_config": config,
        "k": k,
        "d": d,
        "top": top,
        "queries": queries,
        "means": match &b.vectors {
            Some((w, q)) => serde_json::json!({ "vectors": w, "queries": q }),
            None => means.describe(d),
        },
        "threads": rayon::current_num_threads(),
        "simd": simd(),
        "recall": recall,
        "qps": qps,
        "exact_qps": exact_qps,
        "speedup": qps / exact_qps,
        "qps_single": single.qps,
        "first_single_seconds": single.first_seconds,
        "recall_single": recall_single,
        "exact_qps_single": exact_qps_single,
        "query_batch": QUERY_BATCH,
        "build_seconds": build_seconds,
        "calibrations": calibrations,
        "calibrated_on": if b.vectors.is_some() { "the first batch of the queries" } else { "other generator samples" },
        "index_seconds_with_warm_up": index_seconds,
        "refresh_rows_per_s": refresh_rows_per_s,
        "refresh_rows_per_s_after_single": refresh_after_single,
        "index_bytes": index.memory_bytes(),
        "w_bytes": w.bytes(),
    }))
}

/// Scale of the trained-looking layer: scores `s <W_k, phi>` spread over about `2 s` between a
/// sample's own class and unrelated ones (a trained face layer's logits span ~10-20).
const TRAINED_SCALE: f32 = 8.0;

/// `bench estimator`'s choices.
#[derive(Clone, Debug)]
pub struct EstimatorBench {
    /// The estimator (`output.estimator`).
    pub name: String,
    /// `[output]` keys of the estimator (`key=value`).
    pub settings: Vec<String>,
    /// Classes retrieved per block (search estimators: `output.top`) or negatives drawn
    /// (sampling estimators: `output.n_samples`); `None`: the estimator's default.
    pub top: Option<usize>,
    /// Classes K.
    pub k: usize,
    /// Dimension D.
    pub d: usize,
    /// Samples measured (in batches of 256).
    pub samples: usize,
    /// The index of search-based estimators (an `[index]` section).
    pub index: IndexConfig,
    /// The class means of the trained-looking layer.
    pub means: MeanStructure,
}

impl EstimatorBench {
    /// Checks the sizes.
    fn check_sizes(&self) -> Result<(), Error> {
        if self.k < 2 {
            return Err(option("k", "must be >= 2"));
        }
        for (opt, v) in [("d", self.d), ("samples", self.samples)] {
            if v == 0 {
                return Err(option(opt, "must be > 0"));
            }
        }
        Ok(())
    }

    /// `config` with `--top`, when given, set as the key of `problem`'s estimator.
    fn with_top(
        &self,
        config: farout_estimators::EstimatorConfig,
        problem: &Problem,
    ) -> Result<farout_estimators::EstimatorConfig, Error> {
        let Some(top) = self.top else {
            return Ok(config);
        };
        // Search estimators retrieve `top` classes, sampling ones draw `n_samples`.
        let key = if config.build(problem)?.search.is_some() { "top" } else { "n_samples" };
        let with_top: Vec<String> = self.settings.iter().cloned().chain([format!("{key}={top}")]).collect();
        estimator_config(&self.name, &with_top)
    }
}

/// What `bench estimator` measures on: a trained-looking layer `w`, the generator's first
/// samples `phi` with their `labels`, and the generator (for the warm-up batch's samples).
struct TrainedLooking {
    g: FaceGenerator,
    w: Matrix,
    phi: Matrix,
    labels: Vec<[u32; 1]>,
}

/// Per estimator of `bench estimator`: dL/dphi of every sample, seconds, classes scored.
type EstimatorRun = (Matrix, f64, usize);

impl TrainedLooking {
    /// Draws the layer and `samples` samples of `k` classes in dimension `d`.
    fn draw(means: MeanStructure, k: usize, d: usize, samples: usize) -> Result<Self, Error> {
        let g = FaceGenerator::new(means.spec(k, d, (2 * k).max(2 * (samples + WARM_UP)) + samples))?;
        // Trained-looking W: the class means, perturbed (5% noise) and scaled.
        let mut w = g.means().clone();
        let mut r = rng::seeded(17, 0);
        for x in w.as_mut_slice() {
            *x = TRAINED_SCALE * (*x + 0.05 * rng::normal(&mut r) / (d as f32).sqrt());
        }
        let phi = g.features(Split::Train, 0..samples);
        let labels: Vec<[u32; 1]> = g.labels(Split::Train)[..samples].iter().map(|&c| [c]).collect();
        Ok(Self { g, w, phi, labels })
    }

    /// Samples per class of the labels, for the estimators that draw by them (unigram).
    fn label_counts(&self) -> Vec<u64> {
        let mut c = vec![0u64; self.w.rows()];
        self.labels.iter().for_each(|l| c[l[0] as usize] += 1);
        c
    }

    /// One untimed batch of other samples first: an index calibrating its budget to a target
    /// recall does it on the first queries it is asked, as in training's first steps.
    fn warm_up(&self, est: &dyn GradientEstimator, ctx: &Ctx, bg: &mut BatchGrad) {
        let samples = self.phi.rows();
        let warm = self.g.features(Split::Train, samples..samples + WARM_UP);
        let warm_labels: Vec<[u32; 1]> =
            self.g.labels(Split::Train)[samples..samples + WARM_UP].iter().map(|&c| [c]).collect();
        let warm_refs: Vec<&[u32]> = warm_labels.iter().map(|p| &p[..]).collect();
        let warm_ids: Vec<usize> = (samples..samples + WARM_UP).collect();
        let batch = Batch::new(&warm, &warm_refs).with_ids(&warm_ids);
        est.estimate_batch(ctx, batch, &mut rng::seeded(5, u64::MAX), bg);
    }

    /// Runs `estimators` (the reference and the one measured) over the samples, whose
    /// positives are `refs`.
    fn timed_runs(
        &self,
        estimators: [&dyn GradientEstimator; 2],
        ctx: &Ctx,
        refs: &[&[u32]],
        bg: &mut BatchGrad,
    ) -> [EstimatorRun; 2] {
        let (samples, d) = (self.phi.rows(), self.phi.cols());
        let mut part = Matrix::default();
        let ids: Vec<usize> = (0..samples).collect();
        // Both estimators over all samples in batches of 256, alternating batch by batch so that
        // both see the same machine (shared machines drift by 2x within a minute): dL/dphi per
        // sample (timed apart: only the estimate is the estimator's cost), seconds, classes scored.
        let mut runs: [EstimatorRun; 2] = std::array::from_fn(|_| (Matrix::zeros(samples, d), 0.0, 0));
        for start in (0..samples).step_by(256) {
            let end = (start + 256).min(samples);
            let chunk =
                Matrix::from_vec(end - start, d, self.phi.as_slice()[start * d..end * d].to_vec()).expect("rows");
            for (e, (dphi, seconds, scored)) in estimators.into_iter().zip(&mut runs) {
                let batch = Batch::new(&chunk, &refs[start..end]).with_ids(&ids[start..end]);
                let t = Instant::now();
                let tot = e.estimate_batch(ctx, batch, &mut rng::seeded(5, start as u64), bg);
                *seconds += t.elapsed().as_secs_f64();
                *scored += tot.classes_scored;
                bg.dphi(&self.w, &mut part);
                dphi.as_mut_slice()[start * d..end * d].copy_from_slice(part.as_slice());
            }
        }
        runs
    }

    /// Sums over the samples of the cosine between `d_est` and `d_exact` (dL/dphi of the
    /// estimator and of the exact gradient), of the absolute error of `est`'s loss against
    /// `loss_fn`'s and of the absolute exact loss.
    fn accuracy(
        &self,
        est: &dyn GradientEstimator,
        loss_fn: &dyn Loss,
        ctx: &Ctx,
        refs: &[&[u32]],
        (d_est, d_exact): (&Matrix, &Matrix),
    ) -> (f64, f64, f64) {
        let k = self.w.rows();
        // Exact losses per sample, for the estimator's loss error (stateless estimates).
        let mut z = vec![0.0f32; k];
        let mut grad = vec![0.0f32; k];
        let mut scratch = farout_estimators::LossScratch::default();
        let (mut cos_sum, mut abs_err, mut abs_loss) = (0.0f64, 0.0f64, 0.0f64);
        let mut est_grad = farout_core::SparseGrad::new();
        for (i, positives) in refs.iter().enumerate() {
            let (a, b) = (d_est.row(i), d_exact.row(i));
            let (na, nb) = (kernels::norm(a), kernels::norm(b));
            cos_sum += if na == 0.0 && nb == 0.0 {
                1.0
            } else {
                (kernels::dot(a, b) / (na * nb).max(f32::MIN_POSITIVE)) as f64
            };
            kernels::gemv(self.w.as_slice(), self.phi.row(i), &mut z);
            let exact_loss = loss_fn.value_and_grad(&z, positives, &mut grad, &mut scratch) as f64;
            let e =
                est.estimate(ctx, self.phi.row(i), positives, &mut rng::seeded(5, i as u64), &mut est_grad).loss as f64;
            abs_err += (e - exact_loss).abs();
            abs_loss += exact_loss.abs();
        }
        (cos_sum, abs_err, abs_loss)
    }
}

/// One estimator against the exact gradient of its loss on a trained-looking layer (W = the
/// generator's class means, scaled and perturbed; phi = its samples): time per sample of both
/// (same run), cosine of dL/dphi, relative loss error, classes scored.
pub fn bench_estimator(b: &EstimatorBench) -> Result<Value, Error> {
    use farout_search::BlockIndex;
    let EstimatorBench { ref name, ref settings, k, d, samples, index: ref index_config, means, .. } = *b;
    b.check_sizes()?;
    let config = estimator_config(name, settings)?;
    let data = TrainedLooking::draw(means, k, d, samples)?;
    let refs: Vec<&[u32]> = data.labels.iter().map(|p| &p[..]).collect();
    let counts = || data.label_counts();
    let problem = Problem { n_classes: k, n_data: samples, dim: d, label_counts: &counts };
    let config = b.with_top(config, &problem)?;
    let built = config.build(&problem)?;
    let Some(reference) = built.reference() else {
        let msg = format!("`{name}` is exact: bench estimator measures approximate estimators against it");
        return Err(Error::Option { name: "estimator", msg });
    };
    let loss_fn = built.loss.boxed();
    let (top, blocks) = built.search.map_or((None, 1), |s| (Some(s.top), s.blocks));
    let est = built.estimator;
    let t = Instant::now();
    let block_index = est.uses_index().then(|| BlockIndex::build(&data.w, index_config, blocks));
    let build_seconds = t.elapsed().as_secs_f64();
    let ctx = Ctx { w: &data.w, bias: None, index: block_index.as_ref() };
    let mut bg = BatchGrad::default();
    if block_index.is_some() {
        data.warm_up(est.as_ref(), &ctx, &mut bg);
    }
    let runs = data.timed_runs([reference.as_ref(), est.as_ref()], &ctx, &refs, &mut bg);
    let [(d_exact, exact_seconds, _), (d_est, seconds, scored)] = runs;
    let (cos_sum, abs_err, abs_loss) = data.accuracy(est.as_ref(), loss_fn.as_ref(), &ctx, &refs, (&d_est, &d_exact));
    let n = samples as f64;
    Ok(serde_json::json!({
        "bench": "estimator",
        "estimator": est.name(),
        "loss": loss_fn.name(),
        "config": config,
        "k": k,
        "d": d,
        "top": top,
        "blocks": blocks,
        "index": block_index.as_ref().map(|b| b.block(0).name()),
        "samples": samples,
        "means": means.describe(d),
        "threads": rayon::current_num_threads(),
        "simd": simd(),
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

/// `bench linear`'s choices.
#[derive(Clone, Debug)]
pub struct LinearBench {
    /// A DiSMEC config (`[linear] solver = "dismec"`); its data are loaded once.
    pub config: crate::Config,
    /// The initialisations compared (each run from the config's parameters with `init` set).
    pub inits: Vec<farout_linear::InitKind>,
    /// Runs per initialisation, interleaved (init 1, init 2, ..., init 1, ...).
    pub repeats: usize,
}

/// DiSMEC from each initialisation on the same data, interleaved runs in one process: per
/// init the median train seconds, Newton iterations and CG steps (mean, 95% quantile, total),
/// test P@1/3/5 and model size; and the time ratio of every init to the last one named
/// (`zero/msi` for `--inits zero,msi`), per run and of the medians.
pub fn bench_linear(b: &LinearBench) -> Result<Value, Error> {
    use farout_linear::{LinearSolver, Silent, SolverConfig, TrainSet};
    let Some(SolverConfig::Dismec(dismec)) = &b.config.linear else {
        return Err(option("config", "must be a DiSMEC config ([linear] solver = \"dismec\")"));
    };
    if b.inits.is_empty() || b.repeats == 0 {
        return Err(option("inits", "name at least one initialisation, and --repeats must be >= 1"));
    }
    let run = crate::linear::LinearRun::new(b.config.clone())?;
    let data = run.data();
    let train = TrainSet::from_dataset(&data.train)?;
    let test = data.test.as_ref().filter(|t| !t.is_empty()).unwrap_or(&data.train);
    let mut runs: Vec<Vec<Value>> = vec![Vec::new(); b.inits.len()];
    for _ in 0..b.repeats {
        for (i, &init) in b.inits.iter().enumerate() {
            let config = farout_linear::DismecConfig { init, ..dismec.clone() };
            let fitted = config.fit(&train, &Silent)?;
            let s = &fitted.summary;
            let model_bytes = fitted.model.file_len();
            let model = crate::linear::LinearModel::whole(fitted.model);
            let metrics = crate::linear::evaluate(&model, test, 0, &farout_dist::Local)?;
            runs[i].push(serde_json::json!({
                "seconds": s.seconds,
                "p@1": metrics["p@1"], "p@3": metrics["p@3"], "p@5": metrics["p@5"],
                "nnz_after_pruning": s.nnz_after_pruning,
                "model_bytes": model_bytes,
                "stats": s.stats,
            }));
        }
    }
    let median = |v: &[Value], key: &str| {
        let mut x: Vec<f64> = v.iter().filter_map(|r| r[key].as_f64()).collect();
        x.sort_by(f64::total_cmp);
        x.get(x.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let name =
        |init: farout_linear::InitKind| serde_json::to_value(init).ok().and_then(|v| v.as_str().map(String::from));
    let last = b.inits.len() - 1;
    let mut by_init = serde_json::Map::new();
    let mut ratios = serde_json::Map::new();
    for (i, &init) in b.inits.iter().enumerate() {
        let key = name(init).unwrap_or_default();
        by_init
            .insert(key.clone(), serde_json::json!({ "median_seconds": median(&runs[i], "seconds"), "runs": runs[i] }));
        if i != last {
            let per_run: Vec<f64> = runs[i]
                .iter()
                .zip(&runs[last])
                .map(|(a, z)| a["seconds"].as_f64().unwrap_or(f64::NAN) / z["seconds"].as_f64().unwrap_or(f64::NAN))
                .collect();
            let of_medians = median(&runs[i], "seconds") / median(&runs[last], "seconds");
            let other = name(b.inits[last]).unwrap_or_default();
            ratios
                .insert(format!("{key}/{other}"), serde_json::json!({ "per_run": per_run, "of_medians": of_medians }));
        }
    }
    Ok(serde_json::json!({
        "bench": "linear",
        "task": b.config.task(),
        "threads": rayon::current_num_threads(),
        "simd": simd(),
        "n_train": train.n_samples(),
        "n_features": train.n_features(),
        "n_labels": train.n_labels(),
        "by_init": by_init,
        "time_ratio": ratios,
    }))
}
