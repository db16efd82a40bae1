//! The `farout` command line: parses arguments, wires the library crates, prints results.

mod bench;
mod datagen;
mod index;
mod repro;
mod tune;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use farout_dist::Collective;
use farout_train::guard::Protected;
use farout_train::report::StderrLogger;
use farout_train::{CompareOptions, Config, Task, TrainOptions};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "farout",
    version,
    about = "Train networks with huge output layers, with sublinear approximate loss gradients"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train the model a config describes; prints a JSON summary at the end.
    Train {
        /// The experiment config (TOML).
        config: PathBuf,
        /// Override a config key, e.g. --set train.epochs=3 (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Also write the JSON summary to this file.
        #[arg(long)]
        summary: Option<PathBuf>,
        /// Continue from the config's checkpoint.
        #[arg(long)]
        resume: bool,
        /// Replace the run already in the config's log and checkpoint directories.
        #[arg(long)]
        overwrite: bool,
        /// Skip-gram: write the input vectors here at the end (word2vec binary for `.bin`,
        /// farout's model with the subword n-gram rows for `.model`, else word2vec text).
        #[arg(long, value_name = "PATH")]
        export_vectors: Option<PathBuf>,
        /// Linear (DiSMEC): start the solver from the model in this checkpoint directory (an
        /// earlier run with another C or fewer rows, same features); the same model, sooner.
        #[arg(long, value_name = "DIR")]
        warm_start: Option<PathBuf>,
    },
    /// Evaluate a checkpoint on the config's test set (P@k, nDCG@k, accuracy, loss), or word
    /// vectors (`eval analogy`, `eval similarity`); prints JSON.
    Eval(EvalArgs),
    /// Write a checkpoint's vectors: a skip-gram model's word (input) or context (output)
    /// vectors, or a network's output-layer rows or features, the two sides of the search its
    /// output layer does (e.g. for `farout bench search --vectors`).
    Export {
        /// The config (skip-gram or network).
        config: PathBuf,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Output file: `.npy` (f32 matrix), or for skip-gram word2vec binary for `.bin`,
        /// farout's model (with the subword n-gram rows) for `.model`, else word2vec text.
        #[arg(long)]
        out: PathBuf,
        /// Which rows. Skip-gram: `input` (the word vectors, default) or `output` (the context
        /// vectors). Network (`.npy` only): `output` (the output layer, one row per class, the
        /// bias as a last column if it has one; default) or `features` (the encoder's features
        /// of the test set or of `--input`, with a trailing 1 if the layer has a bias).
        #[arg(long, value_enum)]
        rows: Option<ExportRows>,
        /// With `--rows features`: the data to encode (default: the config's test set).
        #[arg(long)]
        input: Option<PathBuf>,
        /// A network's last step's weights, not the ones kept as the best on validation.
        #[arg(long)]
        last: bool,
    },
    /// Print the vectors of words, one `word v1 ... v_dim` line each (fastText's
    /// `print-word-vectors`): from a `.model` file, words outside the vocabulary get the mean
    /// of their n-gram rows; words with no vector print zeros and a warning.
    Vectors {
        /// Word vectors (farout model for `.model`, word2vec binary for `.bin`, else text).
        #[arg(long)]
        vectors: PathBuf,
        /// The words; none: read whitespace-separated words from standard input.
        #[arg(conflicts_with = "nearest")]
        words: Vec<String>,
        /// Print the `--topn` nearest words of this word by cosine similarity instead, one
        /// `word neighbour cosine` line each, best first (repeatable). From a `.model` file a
        /// word outside the vocabulary is queried by the mean of its n-gram rows.
        #[arg(long, value_name = "WORD")]
        nearest: Vec<String>,
        /// Neighbours printed per `--nearest` word.
        #[arg(long, default_value_t = 10, requires = "nearest", value_parser = clap::value_parser!(u64).range(1..))]
        topn: u64,
    },
    /// Top-k classes with scores for every sample of a data file (config's format).
    Predict(PredictArgs),
    /// Cut a network's checkpoint, written by P MPI ranks or one process, for another number
    /// of ranks, into a new directory (the old one stays as it is); prints JSON. Continue with
    /// `mpirun -np RANKS farout train CONFIG --resume --set checkpoint.dir="OUT"`.
    Reshard {
        /// The checkpoint directory (the config's `checkpoint.dir`).
        checkpoint: PathBuf,
        /// The number of ranks to cut it for (1: one process).
        #[arg(long)]
        ranks: usize,
        /// The new checkpoint directory; must not exist.
        #[arg(long)]
        out: PathBuf,
    },
    /// Build a search index over the rows of a `.npy` file and save it (loads without being
    /// built again, e.g. by `farout.Index.load`); prints JSON.
    Index(index::IndexArgs),
    /// Generate synthetic data sets.
    Data {
        #[command(subcommand)]
        command: datagen::DataCommand,
    },
    /// Micro-benchmarks printing machine-readable JSON.
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
    /// Train several configs that differ in their estimator; write a table and curves.
    Compare(CompareArgs),
    /// Search a config's settings on a validation split within a time budget; retrain the best.
    Tune(tune::TuneArgs),
    /// Reproduce a paper's experiment; prints one JSON object.
    Repro {
        #[command(subcommand)]
        command: repro::ReproCommand,
    },
}

#[derive(clap::Args)]
struct PredictArgs {
    /// The experiment config.
    config: PathBuf,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Checkpoint directory (default: the config's; for a network that kept its weights best
    /// on validation, those).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Read the last step's weights, not the ones kept as the best on validation.
    #[arg(long, conflicts_with = "checkpoint")]
    last: bool,
    /// Data to predict (default: the config's test set).
    #[arg(long)]
    input: Option<PathBuf>,
    /// Labels of the input for npy/raw data (optional).
    #[arg(long)]
    labels: Option<PathBuf>,
    /// Number of classes per sample.
    #[arg(long, default_value_t = 5)]
    top_k: usize,
    /// Write here instead of standard output.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(clap::Args)]
struct CompareArgs {
    /// Configs to compare; they may differ only in their [output] and [index] blocks.
    configs: Vec<PathBuf>,
    /// Output directory (runs, tables, plots).
    #[arg(long, default_value = "runs/compare")]
    out: PathBuf,
    /// Train every run for this many seconds, however many epochs that takes (equal
    /// wall-clock budgets; evaluation excluded).
    #[arg(long)]
    budget: Option<f64>,
    /// Runs per config, with seeds seed, seed + 1, ...
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Accept configs that differ outside [output] and [index].
    #[arg(long)]
    allow_diff: bool,
    /// Replace an earlier comparison in --out.
    #[arg(long)]
    overwrite: bool,
    /// Override a key in every config, e.g. --set train.epochs=1 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Redraw tables and plots from earlier `compare` output directories, without training.
    #[arg(long, num_args = 1.., value_name = "DIR")]
    from: Vec<PathBuf>,
}

impl From<CompareArgs> for CompareOptions {
    fn from(a: CompareArgs) -> Self {
        let CompareArgs { configs, out, budget, repeats, allow_diff, overwrite, set, from } = a;
        Self { configs, out, budget, repeats, allow_diff, set, from, overwrite }
    }
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct EvalArgs {
    #[command(subcommand)]
    vectors: Option<EvalVectors>,
    /// The experiment config (classifiers).
    config: Option<PathBuf>,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Checkpoint directory (default: the config's; for a network that kept its weights best
    /// on validation, those).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Evaluate the last step's weights, not the ones kept as the best on validation.
    #[arg(long, conflicts_with = "checkpoint")]
    last: bool,
}

#[derive(Subcommand)]
enum EvalVectors {
    /// Analogy accuracy (3CosAdd) per section and in total, with questions skipped.
    Analogy {
        /// Word vectors (farout model for `.model`, word2vec binary for `.bin`, else text).
        #[arg(long)]
        vectors: PathBuf,
        /// Questions (`: section` lines, then `a b c d`).
        #[arg(long)]
        questions: PathBuf,
        /// Candidates: the most frequent words (0 = all).
        #[arg(long, default_value_t = 30_000)]
        restrict: usize,
    },
    /// Spearman correlation between cosine similarity and human scores.
    Similarity {
        /// Word vectors (word2vec binary for `.bin`, else text). A farout `.model` with
        /// subwords gives words outside the vocabulary their n-gram vectors.
        #[arg(long)]
        vectors: PathBuf,
        /// Pairs (`word word score` lines, `#` comments).
        #[arg(long)]
        pairs: PathBuf,
    },
}

/// Word vectors for `eval analogy`, `eval similarity` and `vectors` (the reader refuses NaN and
/// infinite values, naming the first word that holds one).
fn load_vectors(path: &Path) -> Result<farout_skipgram::vectors::Vectors<'static>> {
    use farout_skipgram::vectors::{Format, Vectors};
    Ok(Vectors::load(path, Format::from_path(path))?)
}

/// `farout vectors --nearest`: the `topn` nearest words of each of `words` by cosine, through
/// the default search index (brute force for the few queries of a command line; see
/// `farout_skipgram::nearest`), one `word neighbour cosine` line each.
fn print_nearest(path: &Path, words: &[String], topn: usize) -> Result<()> {
    use farout_skipgram::nearest::{Neighbours, word_query};
    let v = load_vectors(path)?;
    let mut queries = farout_core::Matrix::zeros(words.len(), v.matrix().cols());
    let mut own = Vec::with_capacity(words.len());
    for (i, word) in words.iter().enumerate() {
        let (x, id) = word_query(&v, word).with_context(|| format!("{}: --nearest {word}", path.display()))?;
        queries.row_mut(i).copy_from_slice(&x);
        own.push(id);
    }
    let found = Neighbours::new(v.matrix(), farout_search::IndexConfig::default())?
        .search(&queries, topn, |i| own[i].into_iter().collect());
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for (word, hits) in words.iter().zip(&found) {
        for h in hits {
            writeln!(out, "{word} {} {}", v.words()[h.class as usize], h.score)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// `farout vectors`: one `word v1 ... v_dim` line per word.
fn print_vectors(path: &Path, words: Vec<String>) -> Result<()> {
    use farout_skipgram::vectors::Lookup;
    let v = load_vectors(path)?;
    let mut x = vec![0.0; v.matrix().cols()];
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut missing = Vec::new();
    let mut print = |word: &str| -> Result<()> {
        if v.vector(word, &mut x) == Lookup::Missing {
            missing.push(word.to_string());
        }
        write!(out, "{word}")?;
        for y in &x {
            write!(out, " {y}")?;
        }
        writeln!(out)?;
        Ok(())
    };
    if words.is_empty() {
        for line in std::io::stdin().lock().lines() {
            for w in line.context("reading words from standard input")?.split_whitespace() {
                print(w)?;
            }
        }
    } else {
        words.iter().try_for_each(|w| print(w))?;
    }
    out.flush()?;
    if let Some(first) = missing.first() {
        let why = if v.ngrams().is_some() { "and has no n-gram" } else { "(the file has no n-gram rows)" };
        log::warn!(
            "{} word(s) have no vector, printed as zeros: `{first}` is not in the vocabulary {why}",
            missing.len()
        );
    }
    Ok(())
}

/// Buffers of this size or more are mapped on their own and go back to the system when freed.
const MMAP_THRESHOLD: usize = 16 << 20;
/// Free memory at the top of the heap kept for reuse rather than returned.
const TRIM_THRESHOLD: usize = 64 << 20;

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD`] (and the heap's trim threshold at
/// [`TRIM_THRESHOLD`]). By default glibc raises the mmap threshold to the size of each large
/// buffer freed (up to 32 MiB), after which temporaries of that size are served from the heap
/// and stay resident once freed: a rank of the class-sharded exact softmax at K = 672,000 over
/// 2 ranks peaked 120 MiB above its live heap that way (docs/scaling.md). A lower threshold
/// (4 MiB) mapped and unmapped the per-step buffers of search-based training at every step.
fn return_large_buffers_to_the_system() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int);
    }
}

fn main() -> ExitCode {
    return_large_buffers_to_the_system();
    let cli = Cli::parse();
    // Under `mpirun -np P`, P ranks run this same command; `connect` initialises MPI (builds with
    // `--features mpi`) or says how to rebuild. Only rank 0 prints.
    let comm = match farout_dist::connect() {
        Ok(comm) => comm,
        Err(e) => {
            if farout_dist::detect().ok().flatten().is_none_or(|l| l.rank == 0) {
                eprintln!("error: {e}");
            }
            return ExitCode::FAILURE;
        }
    };
    let rank = comm.rank();
    StderrLogger::install(if rank == 0 { log::LevelFilter::Info } else { log::LevelFilter::Off });
    match run(cli, comm.as_ref()) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of standard output went away (`farout ... | head`): nothing is left to say.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        // Of several ranks, rank 0 prints an error every rank shares; another rank only its own.
        Err(e) if !e.downcast_ref::<farout_train::Error>().map_or(rank == 0, |t| t.printed_by(rank)) => {
            ExitCode::FAILURE
        }
        Err(e) => {
            // Errors that show their cause in their own message also return it as their
            // source: print each cause once.
            let mut msg = if rank > 0 { format!("(rank {rank}) ") } else { String::new() };
            for cause in e.chain().map(|c| c.to_string()) {
                if !msg.contains(&cause) {
                    if !msg.is_empty() && !msg.ends_with(' ') {
                        msg.push_str(": ");
                    }
                    msg.push_str(&cause);
                }
            }
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// Writes `text` and a newline to standard output; unlike `println!`, a closed pipe is an
/// error (which `main` turns into a quiet exit), not a panic.
pub fn emit(text: impl std::fmt::Display) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").and_then(|_| out.flush())?;
    Ok(())
}

/// rayon threads for each of several ranks: the cores shared by the ranks on this node
/// (`OMPI_COMM_WORLD_LOCAL_SIZE`, `MPI_LOCALNRANKS`), at least one.
fn threads_per_rank() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let local = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok())
        .unwrap_or(1);
    (cores / local.max(1)).max(1)
}

/// Runs `f` on a thread of rayon's pool (the calling thread waits). A training step opens
/// several short parallel sections; from a thread outside the pool each one is handed over and
/// waited for through the operating system (a wake-up and a sleep per section), while a thread
/// of the pool splits it with its peers directly.
fn on_pool<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    rayon::join(f, || ()).0
}

/// Loads a config and sizes rayon's pool by `train.threads` (by default one thread per core,
/// shared among the `ranks` of an MPI job on this node).
fn load_config(path: &Path, set: &[String], ranks: usize) -> Result<Config> {
    let config = Config::load(path, set)?;
    let threads = match config.train.threads {
        0 if ranks > 1 => threads_per_rank(),
        n => n,
    };
    if threads > 0 {
        // Ignore the error of a second initialisation (only possible in tests).
        let _ = rank_pool(threads, ranks).build_global();
    }
    Ok(config)
}

/// Rayon's pool of `threads` for a process of an MPI job of `ranks`. A rank makes its MPI calls
/// from the main thread, which is then one of the pool's threads: its step's parallel sections
/// run on it (and the pool's other threads) directly, instead of each being handed to the pool
/// and waited for through the operating system.
fn rank_pool(threads: usize, ranks: usize) -> rayon::ThreadPoolBuilder {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads);
    if ranks > 1 { pool.use_current_thread() } else { pool }
}

/// The rows `farout export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ExportRows {
    /// Skip-gram word (input) vectors.
    Input,
    /// Skip-gram context (output) vectors, or a network's output layer.
    Output,
    /// A network's encoder features.
    Features,
}

impl From<ExportRows> for farout_train::ExportRows {
    fn from(rows: ExportRows) -> Self {
        match rows {
            ExportRows::Input => Self::Input,
            ExportRows::Output => Self::Output,
            ExportRows::Features => Self::Features,
        }
    }
}

/// `farout export`: writes the rows of the config's checkpoint to `out`; returns their number.
fn export(
    config: Config,
    out: &Path,
    rows: Option<ExportRows>,
    input: Option<&Path>,
    last: bool,
    comm: &dyn Collective,
) -> Result<usize> {
    if input.is_some() && rows != Some(ExportRows::Features) {
        anyhow::bail!("--input names the data to encode with --rows features");
    }
    let checkpoint = chosen_checkpoint(&config, None, last);
    let task = open_trained(config, checkpoint.as_deref(), comm)?;
    Ok(task.export(out, rows.map(Into::into), input)?)
}

/// The config's task with its trained model read back from `checkpoint` (default: the config's
/// checkpoint directory).
fn open_trained<'c>(config: Config, checkpoint: Option<&Path>, comm: &'c dyn Collective) -> Result<Box<dyn Task + 'c>> {
    let dir = checkpoint.map_or_else(|| config.checkpoint_dir(), Path::to_path_buf);
    farout_train::task::open_trained(config, checkpoint, comm)
        .with_context(|| format!("loading checkpoint {}", dir.display()))
}

/// Refuses to run `what` as several MPI ranks (each would do the whole job).
fn one_process(comm: &dyn Collective, what: &str) -> Result<()> {
    if comm.size() > 1 {
        anyhow::bail!(
            "{what} runs in one process, but mpirun started {} ranks (each would do the whole job); run it \
             without mpirun. Under mpirun, farout trains, evaluates and predicts with linear configs and with \
             the face head and document encoder (their output layer split over the ranks)",
            comm.size()
        );
    }
    Ok(())
}

/// `farout train`: trains (one process on rayon's pool), and on rank 0 prints the JSON summary
/// and writes it to `summary`.
fn cmd_train(
    path: &Path,
    set: &[String],
    summary: Option<&Path>,
    options: &TrainOptions,
    comm: &dyn Collective,
) -> Result<()> {
    let config = load_config(path, set, comm.size())?;
    let protected = Protected::of_run(path, &config);
    if let Some(out) = options.export_vectors {
        protected.check("export-vectors", out)?;
    }
    if let Some(out) = summary {
        protected.clone().with("--export-vectors", options.export_vectors).check("summary", out)?;
    }
    // One process trains on the pool (with one MPI rank, `Local`'s collectives are
    // what the rank's would be); ranks of a larger job make their MPI calls from the
    // main thread, which is one of the pool's threads (`rank_pool`).
    let trained = if comm.size() == 1 {
        on_pool(|| farout_train::train(&config, options, &farout_dist::Local))
    } else {
        farout_train::train(&config, options, comm)
    };
    let json = trained?.to_json();
    if comm.is_root() {
        emit(&json)?;
        if let Some(p) = summary {
            std::fs::write(p, json + "\n").with_context(|| format!("writing {}", p.display()))?;
        }
    }
    Ok(())
}

/// `farout eval analogy|similarity`, in one process: prints the word vectors' scores.
fn cmd_eval_vectors(what: EvalVectors, comm: &dyn Collective) -> Result<()> {
    one_process(comm, "farout eval analogy|similarity")?;
    let json = match what {
        EvalVectors::Analogy { vectors, questions, restrict } => serde_json::to_string_pretty(
            &farout_skipgram::eval::analogy(&load_vectors(&vectors)?, &questions, restrict)?,
        )?,
        EvalVectors::Similarity { vectors, pairs } => {
            serde_json::to_string_pretty(&farout_skipgram::eval::similarity(&load_vectors(&vectors)?, &pairs)?)?
        }
    };
    emit(&json)
}

/// `farout eval CONFIG`: evaluates the trained model on the config's test set; rank 0 prints
/// the metrics.
fn cmd_eval(
    config: Option<PathBuf>,
    set: &[String],
    checkpoint: Option<PathBuf>,
    last: bool,
    comm: &dyn Collective,
) -> Result<()> {
    let config = config.context("name a config, or use `farout eval analogy|similarity`")?;
    let config = load_config(&config, set, comm.size())?;
    let checkpoint = chosen_checkpoint(&config, checkpoint, last);
    let t = open_trained(config, checkpoint.as_deref(), comm)?;
    let test = t.test().context("the config names no test set (data.test)")?;
    let metrics = t.evaluate(test)?;
    if comm.is_root() {
        emit(serde_json::to_string_pretty(&metrics)?)?;
    }
    Ok(())
}

/// The checkpoint `--checkpoint` names, or with `--last` the config's checkpoint directory (the
/// last step's weights); `None` leaves the task its default (a network's kept best weights).
fn chosen_checkpoint(config: &Config, checkpoint: Option<PathBuf>, last: bool) -> Option<PathBuf> {
    if last { Some(config.checkpoint_dir()) } else { checkpoint }
}

/// `farout predict`: the top-k classes of every sample of `--input` (or of the test set); rank
/// 0 writes them to `--out` (or standard output).
fn cmd_predict(args: PredictArgs, comm: &dyn Collective) -> Result<()> {
    let PredictArgs { config: path, set, checkpoint, last, input, labels, top_k, out } = args;
    let config = load_config(&path, &set, comm.size())?;
    let checkpoint = chosen_checkpoint(&config, checkpoint, last);
    if let Some(o) = &out {
        let p = Protected::of_run(&path, &config).with("--input", input.as_deref()).with("--labels", labels.as_deref());
        p.with_dir("--checkpoint directory", checkpoint.as_deref()).check("out", o)?;
    }
    let t = open_trained(config, checkpoint.as_deref(), comm)?;
    let owned;
    let ds = match &input {
        Some(p) => {
            owned = t.load_input(p, labels.as_deref())?;
            &owned
        }
        None => t.test().context("no --input and the config names no test set")?,
    };
    let preds = t.predict(ds, top_k)?;
    if !comm.is_root() {
        return Ok(());
    }
    let mut w: Box<dyn Write> = match &out {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    for hits in preds {
        let line: Vec<String> = hits.iter().map(|h| format!("{}:{:.6}", h.class, h.score)).collect();
        writeln!(w, "{}", line.join(" "))?;
    }
    w.flush()?;
    Ok(())
}

/// `farout bench layer`, the one benchmark that runs on several ranks.
fn cmd_bench_layer(command: bench::BenchCommand, comm: &dyn Collective) -> Result<()> {
    if comm.size() > 1 {
        // The node's cores shared among its ranks, as `train` shares them.
        let _ = rank_pool(threads_per_rank(), comm.size()).build_global();
    }
    bench::run(command, comm)
}

/// `farout export`: writes the checkpoint's rows to `out`.
fn cmd_export(
    path: &Path,
    set: &[String],
    out: &Path,
    rows: Option<ExportRows>,
    input: Option<&Path>,
    last: bool,
    comm: &dyn Collective,
) -> Result<()> {
    let config = load_config(path, set, comm.size())?;
    Protected::of_run(path, &config).with("--input", input).check("out", out)?;
    let n = export(config, out, rows, input, last, comm)?;
    log::info!("wrote {n} vectors to {}", out.display());
    Ok(())
}

/// `farout compare`: trains (or reads back) the runs on rayon's pool and prints the table.
fn cmd_compare(args: CompareArgs) -> Result<()> {
    let args = args.into();
    emit(on_pool(|| farout_train::compare(&args))?.table.trim_end())
}

/// Runs the command on this rank. Under `mpirun`, train, eval (with a config), predict and
/// bench layer run on every rank; every other command refuses to run on several.
fn run(cli: Cli, comm: &dyn Collective) -> Result<()> {
    match cli.command {
        Command::Train { config: path, set, summary, resume, overwrite, export_vectors, warm_start } => {
            let options = TrainOptions {
                resume,
                overwrite,
                export_vectors: export_vectors.as_deref(),
                warm_start: warm_start.as_deref(),
            };
            cmd_train(&path, &set, summary.as_deref(), &options, comm)?
        }
        Command::Eval(EvalArgs { vectors: Some(what), .. }) => cmd_eval_vectors(what, comm)?,
        Command::Eval(EvalArgs { vectors: None, config, set, checkpoint, last }) => {
            cmd_eval(config, &set, checkpoint, last, comm)?
        }
        Command::Predict(args) => cmd_predict(args, comm)?,
        Command::Bench { command: command @ bench::BenchCommand::Layer { .. } } => cmd_bench_layer(command, comm)?,
        _ if comm.size() > 1 => one_process(comm, "this command")?,
        Command::Export { config: path, set, out, rows, input, last } => {
            cmd_export(&path, &set, &out, rows, input.as_deref(), last, comm)?
        }
        Command::Vectors { vectors, nearest, topn, .. } if !nearest.is_empty() => {
            print_nearest(&vectors, &nearest, topn as usize)?
        }
        Command::Vectors { vectors, words, .. } => print_vectors(&vectors, words)?,
        Command::Reshard { checkpoint, ranks, out } => {
            let done = farout_train::reshard::reshard(&checkpoint, &out, ranks)?;
            log::info!("wrote the checkpoint of step {} for {ranks} rank(s) to {}", done.step, out.display());
            emit(serde_json::to_string_pretty(&done)?)?
        }
        Command::Index(args) => index::run(args)?,
        Command::Data { command } => datagen::run(command)?,
        Command::Bench { command } => bench::run(command, comm)?,
        Command::Repro { command } => repro::run(command)?,
        Command::Compare(args) => cmd_compare(args)?,
        Command::Tune(args) => tune::run(args)?,
    }
    Ok(())
}
