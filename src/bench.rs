//! `farout bench ...`: micro-benchmarks printing one JSON object each.

use anyhow::Result;
use clap::Subcommand;
use farout_core::resources;
use farout_dist::Collective;
use farout_train::bench::{self, EstimatorBench, LayerBench, SearchBench};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// One training step of the output layer (scores, loss gradient, dL/dphi, row updates),
    /// against a plain matrix product of the same shape measured in the same run. Under
    /// `mpirun -np P`: the classes split over the ranks (exact softmax or margin, mips, ldgs or
    /// sampled softmax), with the time spent in collectives and the bytes sent per step.
    Layer {
        /// The gradient estimator: an exact one (`softmax`, `margin`), a sampling one, or `mips`
        /// or `ldgs` over the default index (no bias), with its config defaults
        /// (`output.estimator`).
        #[arg(long, default_value = "softmax")]
        estimator: String,
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
        /// Visit the classes this many at a time (`output.class_chunk`; softmax on the
        /// class-sharded layer, also on one rank); 0 = all at once.
        #[arg(long, default_value_t = 0)]
        class_chunk: usize,
        /// Print JSON (the only output format; kept for scripts that pass it).
        #[arg(long)]
        json: bool,
    },
    /// Top-Q search over the class means of the FaceNet-like generator: recall against brute
    /// force, queries per second of the index and of brute force (same run, same threads),
    /// build time and refresh speed.
    Search {
        /// The index (`index.kind`: spherical, hnsw, simple_lsh, hamming, flat_int8, exact).
        #[arg(long, default_value = "spherical")]
        index: String,
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
        /// Search the rows of this `.npy` file (f32, K x D) instead of the generator's means
        /// (`--k` and `--d` are then the file's); needs `--query-vectors`.
        #[arg(long, value_name = "W.npy", requires = "query_vectors")]
        vectors: Option<PathBuf>,
        /// The queries (`.npy`, f32, n x D) for `--vectors`.
        #[arg(long, value_name = "Q.npy", requires = "vectors")]
        query_vectors: Option<PathBuf>,
        /// Write the rows and the queries searched to DIR/w.npy and DIR/queries.npy, for the
        /// peers' script (benches/peers/search_peers.py).
        #[arg(long, value_name = "DIR")]
        export: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// One estimator against the exact gradient of its loss on a trained-looking layer (W = the
    /// generator's class means, scaled and perturbed; phi = its samples): time per sample of
    /// both (same run), cosine of dL/dphi, relative loss error, classes scored.
    Estimator {
        /// The estimator (`output.estimator`), with its config defaults.
        #[arg(long)]
        estimator: String,
        /// Loss of `mips` / `ldgs` (`output.loss`; default: the config's, margin).
        #[arg(long)]
        loss: Option<String>,
        #[arg(long, default_value_t = 100_000)]
        k: usize,
        #[arg(long, default_value_t = 128)]
        d: usize,
        /// Classes retrieved per block (mips, ldgs: `output.top`) or negatives drawn (sampling:
        /// `output.n_samples`); default: the config's (K / 100; at most 300 for ldgs).
        #[arg(long)]
        top: Option<usize>,
        /// LDGS blocks B (`output.blocks`; default: the config's, D / 64).
        #[arg(long)]
        blocks: Option<usize>,
        /// LDGS message-passing steps T, or fixed_point (`output.iterations`).
        #[arg(long)]
        iterations: Option<String>,
        /// Any other `[output]` key of the estimator, e.g. `--set proposal=uniform` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Index of mips / ldgs (`index.kind`).
        #[arg(long, default_value = "spherical")]
        index: String,
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
    /// DiSMEC from several initialisations on one config's data (loaded once), interleaved:
    /// median train seconds, Newton iterations, CG steps, P@k, model size per init, and the
    /// time ratios to the last init named (`zero/msi`).
    Linear {
        /// A DiSMEC config (`[linear] solver = "dismec"`), e.g. configs/bibtex-dismec.toml.
        config: PathBuf,
        /// Initialisations, comma-separated: zero, bias, msi.
        #[arg(long, default_value = "zero,msi", value_delimiter = ',')]
        inits: Vec<String>,
        /// Runs per initialisation.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Overrides of config keys, `key.path=value` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
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

impl From<MeanStructure> for bench::MeanStructure {
    fn from(m: MeanStructure) -> Self {
        Self { intrinsic_dim: m.intrinsic_dim, mean_clusters: m.mean_clusters }
    }
}

/// Index parameters the benches expose, as `[index]` keys (unset: the config defaults).
#[derive(clap::Args, Clone)]
pub struct IndexParams {
    /// Spherical: centroids (`n_centroids`; 0 = sqrt(K)).
    #[arg(long)]
    centroids: Option<usize>,
    /// Spherical, SimpleLSH, Hamming, HNSW: candidates scored per result (`candidate_factor`; for the
    /// spherical index this replaces the calibration to `--recall`).
    #[arg(long)]
    candidate_factor: Option<f32>,
    /// Spherical: the target recall its probe budget is calibrated to (`recall`, default 0.9).
    #[arg(long)]
    recall: Option<f32>,
    /// SimpleLSH: hash tables (`tables`).
    #[arg(long)]
    tables: Option<usize>,
    /// SimpleLSH: bits per table (`bits`; 0 = log2(K / 32)); Hamming: bits per code.
    #[arg(long)]
    bits: Option<usize>,
    /// HNSW: search list size (`ef_search`; raised to the candidates fetched).
    #[arg(long)]
    ef_search: Option<usize>,
    /// Spherical: score probed rows on f32 copies or on int8 codes (pq4: lone queries on 4-bit
    /// codes), then rescore the best exactly (`scoring`: auto, f32, int8 or pq4; auto is pq4
    /// where the CPU has AVX2).
    #[arg(long)]
    scoring: Option<String>,
    /// Spherical (int8 scoring), flat_int8: rows rescored exactly per result (`rescore`).
    #[arg(long)]
    rescore: Option<f32>,
    /// Any other `[index]` key of the index, e.g. `--index-set iterations=20` (repeatable).
    #[arg(long = "index-set", value_name = "KEY=VALUE")]
    index_set: Vec<String>,
}

impl IndexParams {
    /// The index `kind` with these parameters, read as a config's `[index]` would be.
    pub(crate) fn config(&self, kind: &str) -> Result<farout_search::IndexConfig> {
        let mut settings = vec![format!("kind=\"{}\"", kind.replace('-', "_"))];
        let mut set = |key: &str, value: Option<String>| {
            if let Some(v) = value {
                settings.push(format!("{key}={v}"));
            }
        };
        set("n_centroids", self.centroids.map(|v| v.to_string()));
        set("candidate_factor", self.candidate_factor.map(|v| v.to_string()));
        set("recall", self.recall.map(|v| v.to_string()));
        set("tables", self.tables.map(|v| v.to_string()));
        set("bits", self.bits.map(|v| v.to_string()));
        set("ef_search", self.ef_search.map(|v| v.to_string()));
        set("scoring", self.scoring.as_ref().map(|v| format!("\"{v}\"")));
        set("rescore", self.rescore.map(|v| v.to_string()));
        settings.extend(self.index_set.iter().cloned());
        Ok(farout_train::config::index_from_settings(&settings)?)
    }
}

/// An error, before anything is allocated, if `copies` K x D f32 matrices and `extra` bytes do
/// not fit in the memory available.
fn check_classes(k: usize, d: usize, copies: u64, extra: u128, change: &str) -> Result<()> {
    let needed = resources::array_bytes(&[k as u64, d as u64, copies], 4) + extra;
    let what = format!("a {k} x {d} class matrix ({copies} copies) and its scores");
    Ok(resources::check_memory(needed, what, format!("lower {change}"))?)
}

pub fn run(cmd: BenchCommand, comm: &dyn Collective) -> Result<()> {
    match cmd {
        BenchCommand::Linear { config, inits, repeats, set } => {
            let config = crate::load_config(&config, &set, comm.size())?;
            let inits = inits
                .iter()
                .map(|s| {
                    serde_json::from_value(serde_json::Value::String(s.trim().to_string()))
                        .map_err(|_| anyhow::anyhow!("--inits: `{s}` is not one of zero, bias, msi"))
                })
                .collect::<Result<Vec<farout_linear::InitKind>>>()?;
            crate::emit(format!("{:#}", bench::bench_linear(&bench::LinearBench { config, inits, repeats })?))?;
        }
        BenchCommand::Layer { estimator, k, d, batch, steps, class_chunk, json: _ } => {
            // W, its optimiser state, the reference product's copy of it, and the scores.
            let scores = resources::array_bytes(&[k as u64, batch as u64], 4);
            check_classes(k, d, 3, scores, "--k, --d or --batch")?;
            let b = LayerBench { estimator, k, d, batch, steps, class_chunk };
            if comm.size() > 1 || class_chunk > 0 {
                let json = bench::bench_layer_sharded(&b, comm)?;
                if comm.is_root() {
                    crate::emit(json)?;
                }
            } else {
                crate::emit(bench::bench_layer(&b)?)?;
            }
        }
        BenchCommand::Search { index, k, d, top, queries, means, params, vectors, query_vectors, export, json: _ } => {
            // W, the index's copy of it, and the brute-force reference's scores.
            if vectors.is_none() {
                check_classes(
                    k,
                    d,
                    2,
                    resources::array_bytes(&[k as u64, queries.min(256) as u64], 4),
                    "--k, --d or --queries",
                )?;
            }
            let vectors = vectors.zip(query_vectors);
            let means = means.into();
            let b = SearchBench { index: params.config(&index)?, k, d, top, queries, means, vectors, export };
            crate::emit(bench::bench_search(&b)?)?;
        }
        BenchCommand::Estimator {
            estimator,
            loss,
            k,
            d,
            top,
            blocks,
            iterations,
            mut set,
            index,
            samples,
            means,
            params,
            json: _,
        } => {
            // The shortcuts are `[output]` keys; `--top` counts negatives for sampling estimators.
            let quoted = |v: String| format!("\"{v}\"");
            for (key, value) in [
                ("loss", loss.map(quoted)),
                ("blocks", blocks.map(|b| b.to_string())),
                ("iterations", iterations.map(|t| if t.parse::<usize>().is_ok() { t } else { quoted(t) })),
            ] {
                if let Some(v) = value {
                    set.insert(0, format!("{key}={v}"));
                }
            }
            check_classes(k, d, 3, resources::array_bytes(&[k as u64, samples as u64], 4), "--k, --d or --samples")?;
            let index = params.config(&index)?;
            let b = EstimatorBench { name: estimator, settings: set, top, k, d, samples, index, means: means.into() };
            crate::emit(bench::bench_estimator(&b)?)?;
        }
    }
    Ok(())
}
