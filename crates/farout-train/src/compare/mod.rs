//! `farout compare`: train several configs that differ only in their estimator, then write a
//! table (`summary.md`, `summary.csv`) and curves (`curves.png`, `curves.svg`) against training
//! time (log axis) and epochs — the LDGS paper's Figures 1-3: test P@1 for classifiers, the
//! held-out full-softmax objective for skip-gram (Figure 3: GD, GD-MIPS, GD-Decomp-MIPS).
//! `--from` also reads a `farout tune` directory: its tuned run beside the others.

mod plot;

use crate::config::first_difference;
use crate::skipgram::SkipGramSummary;
use crate::task::TaskKind;
use crate::trainer::Selection;
use crate::{Config, Error, RunSummary, Summary, io_err};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// What to compare, and where the results go.
#[derive(Clone, Debug)]
pub struct CompareOptions {
    /// Configs to compare; they may differ only in their [output] and [index] blocks.
    pub configs: Vec<PathBuf>,
    /// Output directory (runs, tables, plots).
    pub out: PathBuf,
    /// Train every run for this many seconds, however many epochs that takes (equal
    /// wall-clock budgets; evaluation excluded).
    pub budget: Option<f64>,
    /// Runs per config, with seeds seed, seed + 1, ...
    pub repeats: usize,
    /// Accept configs that differ outside [output] and [index].
    pub allow_diff: bool,
    /// `key=value` overrides applied to every config.
    pub set: Vec<String>,
    /// Redraw tables and plots from earlier `compare` output directories, without training.
    pub from: Vec<PathBuf>,
    /// Replace an earlier comparison in `out` (without it, that is an error).
    pub overwrite: bool,
}

impl Default for CompareOptions {
    fn default() -> Self {
        Self {
            configs: Vec::new(),
            out: PathBuf::from("runs/compare"),
            budget: None,
            repeats: 1,
            allow_diff: false,
            set: Vec::new(),
            from: Vec::new(),
            overwrite: false,
        }
    }
}

/// What a comparison wrote.
#[derive(Clone, Debug)]
pub struct CompareReport {
    /// Runs compared.
    pub runs: usize,
    /// The output directory: `summary.md`, `summary.csv`, `curves.png`, `curves.svg`, `runs/`.
    pub out: PathBuf,
    /// The table of `summary.md` (Markdown).
    pub table: String,
}

/// Why a comparison cannot be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompareError {
    /// Neither configs nor earlier runs were given.
    #[error("nothing to compare: give one or more configs (or --from DIR ... to redraw earlier runs)")]
    Nothing,
    /// Configs and `--from` directories were both given.
    #[error("give either configs to train or --from directories to redraw, not both")]
    ConfigsAndFrom,
    /// The `--from` directories hold no runs.
    #[error("no runs found to compare")]
    NoRuns,
    /// `--repeats 0`.
    #[error("--repeats must be >= 1")]
    NoRepeats,
    /// `--budget` is not a positive number of seconds.
    #[error("--budget {0}: give a positive, finite number of seconds")]
    BadBudget(f64),
    /// `--out` holds an earlier comparison.
    #[error("{}: holds an earlier comparison; pass --overwrite to replace it or choose another --out", .0.display())]
    OutExists(PathBuf),
    /// Skip-gram and classifier runs were mixed.
    #[error("skip-gram runs and classifier runs cannot be compared with each other")]
    MixedKinds,
    /// Two configs have the same `name` (their runs would share a directory).
    #[error("{}: two configs are named `{name}`; set a distinct `name` in each", path.display())]
    DuplicateName {
        /// The second config of that name.
        path: PathBuf,
        /// The name.
        name: String,
    },
    /// Two configs differ outside `[output]` and `[index]`.
    #[error(
        "{} and {} differ in `{key}`, outside [output] and [index]: a comparison needs the same data, \
         model and training settings (pass --allow-diff to compare anyway)",
        first.display(),
        other.display()
    )]
    ConfigsDiffer {
        /// The first config.
        first: PathBuf,
        /// The config that differs from it.
        other: PathBuf,
        /// The first differing key (dotted path).
        key: String,
    },
    /// A directory is not the output of `farout compare`.
    #[error("{}: not a `farout compare` output directory ({source})", path.display())]
    NotACompareDir {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A run's `summary.json` or `metrics.jsonl` is not what farout writes.
    #[error("{}{}: {source}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Json {
        /// The file.
        path: PathBuf,
        /// The line (JSONL files).
        line: Option<usize>,
        /// What the parser said.
        source: serde_json::Error,
    },
    /// A run failed; `source` says why.
    #[error("training {}: {source}", config.display())]
    Run {
        /// The run's config file.
        config: PathBuf,
        /// Why it failed.
        source: Box<Error>,
    },
    /// A plot could not be drawn.
    #[error("drawing {}: {msg}", path.display())]
    Plot {
        /// The image file.
        path: PathBuf,
        /// What the plotting library said.
        msg: String,
    },
}

/// One finished run: its method (config name), summary and curve.
struct Run {
    method: String,
    summary: RunSummary,
    /// (training seconds, epochs, the kind's metric) at every evaluation.
    curve: Vec<(f64, f64, f64)>,
}

/// The two kinds of run a comparison can hold (one kind per comparison).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Classifier,
    SkipGram,
}

impl Kind {
    /// The metrics.jsonl key of the curve.
    fn metric(self) -> &'static str {
        match self {
            Kind::Classifier => "eval/p@1",
            Kind::SkipGram => "eval/heldout_objective",
        }
    }

    fn metric_label(self) -> &'static str {
        match self {
            Kind::Classifier => "test P@1",
            Kind::SkipGram => "held-out full-softmax objective",
        }
    }

    fn columns(self) -> &'static [&'static str] {
        match self {
            Kind::Classifier => &CLASSIFIER_COLUMNS,
            Kind::SkipGram => &SKIPGRAM_COLUMNS,
        }
    }
}

impl RunSummary {
    fn kind(&self) -> Kind {
        match self {
            RunSummary::Classifier(_) => Kind::Classifier,
            RunSummary::SkipGram(_) => Kind::SkipGram,
        }
    }

    fn task(&self) -> &str {
        match self {
            RunSummary::Classifier(s) => &s.task,
            RunSummary::SkipGram(s) => &s.task,
        }
    }

    fn estimator(&self) -> &str {
        match self {
            RunSummary::Classifier(s) => &s.estimator,
            RunSummary::SkipGram(s) => &s.estimator,
        }
    }
}

/// Trains the configs (or reads earlier runs with `from`) and writes the tables and curves.
pub fn compare(args: &CompareOptions) -> Result<CompareReport, Error> {
    let runs = if args.from.is_empty() {
        train_all(args)?
    } else {
        if !args.configs.is_empty() {
            return Err(CompareError::ConfigsAndFrom.into());
        }
        let mut runs = Vec::new();
        for dir in &args.from {
            runs.extend(read_runs(dir)?);
        }
        runs
    };
    if runs.is_empty() {
        return Err(CompareError::NoRuns.into());
    }
    if runs.iter().any(|r| r.summary.kind() != runs[0].summary.kind()) {
        return Err(CompareError::MixedKinds.into());
    }
    std::fs::create_dir_all(&args.out).map_err(io_err(&args.out))?;
    let table = write_tables(&args.out, &runs)?;
    plot::plot(&args.out, &runs)?;
    log::info!("wrote {}/summary.md, summary.csv, curves.png, curves.svg ({} runs)", args.out.display(), runs.len());
    Ok(CompareReport { runs: runs.len(), out: args.out.clone(), table })
}

/// The config as a TOML tree without the blocks a comparison may vary (and the run's name,
/// logs and checkpoints, which are per run). When linear and network configs are compared
/// (`any_linear`), the learner is what varies: only the data, evaluation and seed remain.
fn comparable(c: &Config, any_linear: bool) -> toml::Table {
    let mut t = toml::Table::try_from(c).expect("a loaded config serialises");
    for key in ["name", "output", "index", "log", "checkpoint", "linear"] {
        t.remove(key);
    }
    if any_linear {
        t.remove("model");
        t.remove("train");
    }
    t
}

fn train_all(args: &CompareOptions) -> Result<Vec<Run>, Error> {
    if args.configs.is_empty() {
        return Err(CompareError::Nothing.into());
    }
    if args.repeats == 0 {
        return Err(CompareError::NoRepeats.into());
    }
    if let Some(b) = args.budget.filter(|b| !(b.is_finite() && *b > 0.0)) {
        return Err(CompareError::BadBudget(b).into());
    }
    let runs_dir = args.out.join("runs");
    if runs_dir.exists() || args.out.join("summary.csv").exists() {
        if !args.overwrite {
            return Err(CompareError::OutExists(args.out.clone()).into());
        }
        if runs_dir.exists() {
            std::fs::remove_dir_all(&runs_dir).map_err(io_err(&runs_dir))?;
        }
    }
    let configs: Vec<Config> = args.configs.iter().map(|p| Config::load(p, &args.set)).collect::<Result<_, _>>()?;
    let skip_gram = |c: &Config| TaskKind::of(c) == TaskKind::SkipGram;
    if configs.iter().any(|c| skip_gram(c) != skip_gram(&configs[0])) {
        return Err(CompareError::MixedKinds.into());
    }
    let mut names = std::collections::HashSet::new();
    for (c, p) in configs.iter().zip(&args.configs) {
        if !names.insert(c.name.clone()) {
            return Err(CompareError::DuplicateName { path: p.clone(), name: c.name.clone() }.into());
        }
    }
    if !args.allow_diff {
        let any_linear = configs.iter().any(|c| TaskKind::of(c) == TaskKind::Linear);
        let base = toml::Value::Table(comparable(&configs[0], any_linear));
        for (c, p) in configs.iter().zip(&args.configs).skip(1) {
            if let Some(key) = first_difference(&base, &toml::Value::Table(comparable(c, any_linear)), "") {
                let (first, other) = (args.configs[0].clone(), p.clone());
                return Err(CompareError::ConfigsDiffer { first, other, key }.into());
            }
        }
    }
    let total = configs.len() * args.repeats;
    let mut runs = Vec::with_capacity(total);
    for (i, config) in configs.iter().enumerate() {
        for r in 0..args.repeats {
            let mut c = config.clone();
            let dir = args.out.join("runs").join(format!("{}@{r}", c.name));
            c.seed += r as u64;
            c.log.dir = Some(dir.clone());
            c.checkpoint.enabled = false;
            let kind = TaskKind::of(&c);
            // A linear solver runs to convergence: a time budget does not apply to it.
            if let Some(b) = args.budget.filter(|_| kind.takes_budget()) {
                c.train.max_seconds = b;
                // The budget ends the run; skip-gram keeps its epochs, on which its step-size
                // schedule depends.
                if !kind.keeps_epochs_under_budget() {
                    c.train.epochs = c.train.epochs.max(1_000_000);
                }
            }
            let method = match &c.linear {
                Some(solver) => format!("solver {}", solver.name()),
                None => format!("estimator {}", c.output.estimator.name()),
            };
            log::info!("[{}/{total}] {} ({method}, seed {})", i * args.repeats + r + 1, c.name, c.seed);
            // Runs share this process: restart the peak-RSS count so each summary has its own
            // (Linux >= 4.0; elsewhere the peak accumulates over runs).
            let _ = std::fs::write("/proc/self/clear_refs", "5");
            let failed = |e: Error| CompareError::Run { config: args.configs[i].clone(), source: Box::new(e) };
            // The comparison owns its run directories (`--overwrite` was checked on `--out`).
            let options = crate::TrainOptions { overwrite: true, ..Default::default() };
            let summary = crate::train(&c, &options, &farout_dist::Local).map_err(failed)?;
            let path = dir.join("summary.json");
            std::fs::write(&path, summary.to_json() + "\n").map_err(io_err(&path))?;
            runs.push(read_run(&dir)?);
        }
    }
    Ok(runs)
}

/// The runs of an earlier `compare` or `tune` output directory (`DIR/runs/<method>@<repeat>/`;
/// a tune's final run is `<name>-tuned@0`, and its method names the trials it chose from).
fn read_runs(dir: &Path) -> Result<Vec<Run>, Error> {
    let mut runs = read_run_dirs(dir)?;
    let trials = dir.join("trials.csv");
    if trials.exists() {
        let n = crate::tune::trials::read(&trials)?.len();
        runs.iter_mut().for_each(|r| r.method = format!("{} (tuned, {n} trials)", r.method));
    }
    Ok(runs)
}

fn read_run_dirs(dir: &Path) -> Result<Vec<Run>, Error> {
    let runs_dir = dir.join("runs");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&runs_dir)
        .map_err(|source| CompareError::NotACompareDir { path: dir.to_path_buf(), source })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("summary.json").exists())
        .collect();
    dirs.sort();
    dirs.iter().map(|d| read_run(d)).collect()
}

fn read_run(dir: &Path) -> Result<Run, Error> {
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
    let json = |line| move |source| CompareError::Json { path: path.clone(), line, source };
    let summary = RunSummary::from_json(&text).map_err(json(None))?;
    let metric = summary.kind().metric();
    let name = dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let method = name.split('@').next().unwrap_or(&name).to_string();
    let log = dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&log).map_err(io_err(&log))?;
    let mut curve = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|source| CompareError::Json {
            path: log.clone(),
            line: Some(n + 1),
            source,
        })?;
        if let (Some(m), Some(t), Some(e)) = (v[metric].as_f64(), v["wall_seconds"].as_f64(), v["eval/epoch"].as_f64())
        {
            curve.push((t, e, m));
        }
    }
    Ok(Run { method, summary, curve })
}

/// Mean and (population) standard deviation.
fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len().max(1) as f64;
    let m = xs.iter().sum::<f64>() / n;
    (m, (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n).sqrt())
}

const CLASSIFIER_COLUMNS: [&str; 19] = [
    "method",
    "estimator",
    "runs",
    "p@1",
    "p@1_std",
    "last_p@1",
    "best_epoch",
    "best_seconds",
    "p@3",
    "p@5",
    "accuracy",
    "test_loss",
    "train_seconds",
    "seconds_per_epoch",
    "samples_per_s",
    "classes_scored_per_sample",
    "peak_rss_mb",
    "index_recall",
    "grad_cosine",
];

const SKIPGRAM_COLUMNS: [&str; 11] = [
    "method",
    "estimator",
    "runs",
    "heldout_objective",
    "heldout_objective_std",
    "analogy",
    "similarity_spearman",
    "epochs",
    "train_seconds",
    "seconds_per_epoch",
    "words_per_s",
];

/// One row per method (repeats averaged), in first-seen order.
fn rows(runs: &[Run]) -> Vec<Vec<String>> {
    let mut order: Vec<&str> = Vec::new();
    let mut groups: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for r in runs {
        if !groups.contains_key(r.method.as_str()) {
            order.push(&r.method);
        }
        groups.entry(&r.method).or_default().push(r);
    }
    order
        .iter()
        .map(|m| {
            let g = &groups[m];
            let mut row = vec![m.to_string(), g[0].summary.estimator().to_string(), g.len().to_string()];
            let classifiers: Vec<&Summary> = g
                .iter()
                .filter_map(|r| if let RunSummary::Classifier(s) = &r.summary { Some(s) } else { None })
                .collect();
            let skip_grams: Vec<&SkipGramSummary> = g
                .iter()
                .filter_map(|r| if let RunSummary::SkipGram(s) = &r.summary { Some(s) } else { None })
                .collect();
            if skip_grams.is_empty() {
                row.extend(classifier_row(&classifiers));
            } else {
                row.extend(skipgram_row(&skip_grams));
            }
            row
        })
        .collect()
}

/// The mean of `xs` with `digits` decimals (empty when there is nothing to average).
fn fmt_mean(xs: Vec<f64>, digits: usize) -> String {
    if xs.is_empty() { String::new() } else { format!("{:.*}", digits, mean_std(&xs).0) }
}

/// The classifier columns after method, estimator and runs.
fn classifier_row(g: &[&Summary]) -> Vec<String> {
    let metric = |k: &str| -> Vec<f64> { g.iter().filter_map(|s| s.metrics.get(k).copied()).collect() };
    let each = |f: &dyn Fn(&Summary) -> Option<f64>| -> Vec<f64> { g.iter().filter_map(|s| f(s)).collect() };
    let (_, p1_std) = mean_std(&metric("p@1"));
    let kept = |f: &dyn Fn(&Selection) -> Option<f64>| each(&|s| s.selection.as_ref().and_then(f));
    vec![
        fmt_mean(metric("p@1"), 4),
        format!("{p1_std:.4}"),
        fmt_mean(kept(&|x| x.last_metrics.get("p@1").copied()), 4),
        fmt_mean(kept(&|x| Some(x.best_epoch)), 1),
        fmt_mean(kept(&|x| Some(x.best_seconds)), 1),
        fmt_mean(metric("p@3"), 4),
        fmt_mean(metric("p@5"), 4),
        fmt_mean(metric("accuracy"), 4),
        fmt_mean(metric("loss"), 4),
        fmt_mean(each(&|s| Some(s.train_seconds)), 1),
        fmt_mean(each(&|s| (s.samples_per_s > 0.0).then(|| s.n_train as f64 / s.samples_per_s)), 1),
        fmt_mean(each(&|s| Some(s.samples_per_s)), 0),
        fmt_mean(each(&|s| Some(s.classes_scored_per_sample)), 1),
        fmt_mean(each(&|s| s.peak_rss_bytes.map(|b| b as f64 / 1048576.0)), 0),
        fmt_mean(each(&|s| s.index_recall), 3),
        fmt_mean(each(&|s| s.grad_cosine), 4),
    ]
}

/// The skip-gram columns after method, estimator and runs.
fn skipgram_row(g: &[&SkipGramSummary]) -> Vec<String> {
    let each = |f: &dyn Fn(&SkipGramSummary) -> Option<f64>| -> Vec<f64> { g.iter().filter_map(|s| f(s)).collect() };
    // Epochs trained, counting a partial last one (a budget may stop it) by its words.
    let epochs = |s: &SkipGramSummary| s.words as f64 / s.train_tokens.max(1) as f64;
    let objective = each(&|s| s.heldout_objective);
    let std = if objective.is_empty() { String::new() } else { format!("{:.4}", mean_std(&objective).1) };
    vec![
        fmt_mean(objective, 4),
        std,
        fmt_mean(each(&|s| s.analogy.as_ref().map(|a| a.accuracy)), 4),
        fmt_mean(each(&|s| s.similarity.as_ref().map(|r| r.spearman)), 4),
        fmt_mean(each(&|s| Some(epochs(s))), 2),
        fmt_mean(each(&|s| Some(s.train_seconds)), 1),
        fmt_mean(each(&|s| (epochs(s) > 0.0).then(|| s.train_seconds / epochs(s))), 1),
        fmt_mean(each(&|s| Some(s.words_per_second)), 0),
    ]
}

/// Writes `summary.csv` and `summary.md`; returns the Markdown.
fn write_tables(out: &Path, runs: &[Run]) -> Result<String, Error> {
    let rows = rows(runs);
    let kind = runs[0].summary.kind();
    let columns = kind.columns();
    let mut csv = columns.join(",") + "\n";
    for r in &rows {
        csv += &(r.join(",") + "\n");
    }
    let csv_path = out.join("summary.csv");
    std::fs::write(&csv_path, csv).map_err(io_err(&csv_path))?;
    let task = runs[0].summary.task();
    let mut md = format!("# {task}: {} runs\n\n| {} |\n|", runs.len(), columns.join(" | "));
    md += &"---|".repeat(columns.len());
    md.push('\n');
    for r in &rows {
        let _ = writeln!(md, "| {} |", r.join(" | "));
    }
    md += match kind {
        Kind::Classifier => {
            "\np@k: test figures of the kept weights (the best on validation when the run selects them, \
             else the last step's); last_p@1: the last step's, best_epoch and best_seconds: where the kept \
             weights were reached (empty when the run keeps its last step); \
             seconds: training only (evaluation excluded); peak_rss_mb: the run's peak resident memory; \
             grad_cosine: mean cosine of the estimator's dL/dphi with the exact one at the end of training \
             (empty for exact estimators).\n"
        }
        Kind::SkipGram => {
            "\nheldout_objective: mean over held-out (context, centre) pairs of log sum_k exp(u_x.v_k) - u_x.v_y \
             after the last epoch (lower is better); seconds: training only, the negative-sampling warm-up \
             included (evaluation excluded); epochs count a partial last epoch by its words.\n"
        }
    };
    let md_path = out.join("summary.md");
    std::fs::write(&md_path, &md).map_err(io_err(&md_path))?;
    Ok(md)
}
