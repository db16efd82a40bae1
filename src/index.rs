//! `farout index`: builds a search index over the rows of a `.npy` file and saves it, so that
//! `farout.Index.load` (Python) or a later command loads it without building it again.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Arguments of `farout index`.
#[derive(clap::Args)]
pub struct IndexArgs {
    /// The rows to index (`.npy`, f32, K x D; the reader refuses NaN and infinite values).
    #[arg(long, value_name = "W.npy")]
    vectors: PathBuf,
    /// The index file to write (farout's checksummed index format; replaced atomically).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// The index (`index.kind`: auto, spherical, flat_int8, simple_lsh, hamming, exact; hnsw
    /// cannot be saved).
    #[arg(long, default_value = "auto")]
    index: String,
    #[command(flatten)]
    params: crate::bench::IndexParams,
    /// Store the rows in the file too, as `farout.Index.save` does (a file without them loads
    /// only beside the same rows).
    #[arg(long)]
    with_vectors: bool,
}

/// Builds and saves the index; prints what was written as JSON.
pub fn run(args: IndexArgs) -> Result<()> {
    let config = args.params.config(&args.index)?;
    refuse_input(&args.out, &args.vectors)?;
    let w = farout_data::npy::read_f32_matrix(&args.vectors)?;
    anyhow::ensure!(w.rows() > 0 && w.cols() > 0, "{}: no rows to index", args.vectors.display());
    let start = Instant::now();
    let index = farout_search::BlockIndex::build(&w, &config, 1);
    let build_seconds = start.elapsed().as_secs_f64();
    farout_search::persist::save(&args.out, &index, Some(&config), &w, args.with_vectors)?;
    let bytes = std::fs::metadata(&args.out).with_context(|| format!("reading {}", args.out.display()))?.len();
    let report = serde_json::json!({
        "kind": index.block(0).name(),
        "rows": w.rows(),
        "dim": w.cols(),
        "build_seconds": build_seconds,
        "with_vectors": args.with_vectors,
        "file": args.out,
        "bytes": bytes,
    });
    crate::emit(format!("{report:#}"))
}

/// An error if `out` is the vectors file (through links and relative paths): writing there
/// would destroy it.
fn refuse_input(out: &Path, vectors: &Path) -> Result<()> {
    let same = match (std::fs::canonicalize(out), std::fs::canonicalize(vectors)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    anyhow::ensure!(!same, "--out {} is the --vectors file: writing there would destroy it", out.display());
    Ok(())
}
