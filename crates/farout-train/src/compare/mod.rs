//! `farout compare`: train several configs that differ only in their estimator, then write a
//! table (`summary.md`, `summary.csv`) and curves (`curves.png`, `curves.svg`) against training
//! time (log axis) and epochs — the LDGS paper's Figures 1-3: test P@1 for classifiers, the
//! held-out full-softmax objective for skip-gram (Figure 3: GD, GD-MIPS, GD-Decomp-MIPS).

use anyhow::{Context, Result, bail};
use farout_train::config::EncoderKind;
use farout_train::skipgram::SkipGramSummary;
use farout_train::{Config, Summary, Trainer};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct CompareArgs {
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
    /// Override a key in every config, e.g. --set train.epochs=1 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Redraw tables and plots from earlier `compare` output directories, without training.
    #[arg(long, num_args = 1.., value_name = "DIR")]
    from: Vec<PathBuf>,
}

/// One finished run: its method (config name), summary and curve.
struct Run {
    method: String,
    summary: Outcome,
    /// (training seconds, epochs, the kind's metric) at every evaluation.
    curve: Vec<(f64, f64, f64)>,
}

/// What a run reports.
enum Outcome {
    Classifier(Summary),
    SkipGram(SkipGramSummary),
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

impl Outcome {
    fn kind(&self) -> Kind {
        match self {
            Outcome::Classifier(_) => Kind::Classifier,
            Outcome::SkipGram(_) => Kind::SkipGram,
        }
    }

    fn task(&self) -> &str {
        match self {
            Outcome::Classifier(s) => &s.task,
            Outcome::SkipGram(s) => &s.task,
        }
    }

    fn estimator(&self) -> &str {
        match self {
            Outcome::Classifier(s) => &s.estimator,
            Outcome::SkipGram(s) => &s.estimator,
        }
    }

    fn to_json(&self) -> serde_json::Result<String> {
        match self {
            Outcome::Classifier(s) => serde_json::to_string_pretty(s),
            Outcome::SkipGram(s) => serde_json::to_string_pretty(s),
        }
    }
}

pub fn run(args: CompareArgs) -> Result<()> {
    let runs = if args.from.is_empty() {
        train_all(&args)?
    } else {
        if !args.configs.is_empty() {
            bail!("give either configs to train or --from directories to redraw, not both");
        }
        let mut runs = Vec::new();
        for dir in &args.from {
            runs.extend(read_runs(dir)?);
        }
        runs
    };
    if runs.is_empty() {
        bail!("no runs found to compare");
    }
    if runs.iter().any(|r| r.summary.kind() != runs[0].summary.kind()) {
        bail!("skip-gram runs and classifier runs cannot be compared with each other (--from directories)");
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    write_tables(&args.out, &runs)?;
    plot(&args.out, &runs)?;
    eprintln!("wrote {}/summary.md, summary.csv, curves.png, curves.svg ({} runs)", args.out.display(), runs.len());
    print!("{}", std::fs::read_to_string(args.out.join("summary.md"))?);
    Ok(())
}

/// The config as a TOML tree without the blocks a comparison may vary (and the run's name,
/// logs and checkpoints, which are per run).
fn comparable(c: &Config) -> Result<toml::Table> {
    let mut t = toml::Table::try_from(c).context("serialising a config")?;
    for key in ["name", "output", "index", "log", "checkpoint"] {
        t.remove(key);
    }
    Ok(t)
}

/// The first key (dotted path) where two TOML trees differ.
fn first_difference(a: &toml::Value, b: &toml::Value, path: &str) -> Option<String> {
    match (a, b) {
        (toml::Value::Table(x), toml::Value::Table(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => first_difference(u, v, &p),
                    _ => Some(p),
                }
            })
        }
        _ if a == b => None,
        _ => Some(path.to_string()),
    }
}

fn train_all(args: &CompareArgs) -> Result<Vec<Run>> {
    if args.configs.is_empty() {
        bail!("nothing to compare: give one or more configs (or --from DIR ... to redraw earlier runs)");
    }
    if args.repeats == 0 {
        bail!("--repeats must be >= 1");
    }
    let configs: Vec<Config> = args
        .configs
        .iter()
        .map(|p| Config::load(p, &args.set).with_context(|| format!("loading {}", p.display())))
        .collect::<Result<_>>()?;
    let skip_gram = |c: &Config| c.model.encoder == EncoderKind::SkipGram;
    if configs.iter().any(|c| skip_gram(c) != skip_gram(&configs[0])) {
        bail!("skip-gram configs and classifier configs cannot be compared with each other");
    }
    let mut names = std::collections::HashSet::new();
    for (c, p) in configs.iter().zip(&args.configs) {
        if !names.insert(c.name.clone()) {
            bail!("{}: two configs are named `{}`; set a distinct `name` in each", p.display(), c.name);
        }
    }
    if !args.allow_diff {
        let base = toml::Value::Table(comparable(&configs[0])?);
        for (c, p) in configs.iter().zip(&args.configs).skip(1) {
            if let Some(key) = first_difference(&base, &toml::Value::Table(comparable(c)?), "") {
                bail!(
                    "{} and {} differ in `{key}`, outside [output] and [index]: a comparison needs the same \
                     data, model and training settings (pass --allow-diff to compare anyway)",
                    args.configs[0].display(),
                    p.display()
                );
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
            let is_skip_gram = skip_gram(&c);
            if let Some(b) = args.budget {
                c.train.max_seconds = b;
                // The budget ends the run; skip-gram keeps its epochs, on which its step-size
                // schedule depends.
                if !is_skip_gram {
                    c.train.epochs = c.train.epochs.max(1_000_000);
                }
            }
            let estimator = c.output.estimator.name();
            eprintln!("[{}/{total}] {} (estimator {estimator}, seed {})", i * args.repeats + r + 1, c.name, c.seed);
            // Runs share this process: restart the peak-RSS count so each summary has its own
            // (Linux >= 4.0; elsewhere the peak accumulates over runs).
            let _ = std::fs::write("/proc/self/clear_refs", "5");
            let training = || format!("training {}", args.configs[i].display());
            let summary = if is_skip_gram {
                Outcome::SkipGram(farout_train::skipgram::train(&c, false, None).with_context(training)?)
            } else {
                let mut trainer = Trainer::new(c).with_context(|| format!("{}", args.configs[i].display()))?;
                Outcome::Classifier(trainer.run().with_context(training)?)
            };
            std::fs::write(dir.join("summary.json"), summary.to_json()? + "\n")
                .with_context(|| format!("writing {}", dir.join("summary.json").display()))?;
            runs.push(read_run(&dir)?);
        }
    }
    Ok(runs)
}

/// The runs of an earlier `compare` output directory (`DIR/runs/<method>@<repeat>/`).
fn read_runs(dir: &Path) -> Result<Vec<Run>> {
    let runs_dir = dir.join("runs");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&runs_dir)
        .with_context(|| format!("{}: not a `farout compare` output directory", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("summary.json").exists())
        .collect();
    dirs.sort();
    dirs.iter().map(|d| read_run(d)).collect()
}

fn read_run(dir: &Path) -> Result<Run> {
    let text =
        std::fs::read_to_string(dir.join("summary.json")).with_context(|| format!("reading {}", dir.display()))?;
    let what = || format!("{}/summary.json", dir.display());
    let value: serde_json::Value = serde_json::from_str(&text).with_context(what)?;
    // Only skip-gram summaries have a vocabulary.
    let summary = if value.get("vocab").is_some() {
        Outcome::SkipGram(serde_json::from_value(value).with_context(what)?)
    } else {
        Outcome::Classifier(serde_json::from_value(value).with_context(what)?)
    };
    let metric = summary.kind().metric();
    let name = dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let method = name.split('@').next().unwrap_or(&name).to_string();
    let log = dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
    let mut curve = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}:{}: not JSON", log.display(), n + 1))?;
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

const CLASSIFIER_COLUMNS: [&str; 16] = [
    "method",
    "estimator",
    "runs",
    "p@1",
    "p@1_std",
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
            let classifiers: Vec<&Summary> =
                g.iter().filter_map(|r| if let Outcome::Classifier(s) = &r.summary { Some(s) } else { None }).collect();
            let skip_grams: Vec<&SkipGramSummary> =
                g.iter().filter_map(|r| if let Outcome::SkipGram(s) = &r.summary { Some(s) } else { None }).collect();
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
    vec![
        fmt_mean(metric("p@1"), 4),
        format!("{p1_std:.4}"),
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

fn write_tables(out: &Path, runs: &[Run]) -> Result<()> {
    let rows = rows(runs);
    let kind = runs[0].summary.kind();
    let columns = kind.columns();
    let mut csv = columns.join(",") + "\n";
    for r in &rows {
        csv += &(r.join(",") + "\n");
    }
    std::fs::write(out.join("summary.csv"), csv).with_context(|| format!("writing {}/summary.csv", out.display()))?;
    let task = runs[0].summary.task();
    let mut md = format!("# {task}: {} runs\n\n| {} |\n|", runs.len(), columns.join(" | "));
    md += &"---|".repeat(columns.len());
    md.push('\n');
    for r in &rows {
        let _ = writeln!(md, "| {} |", r.join(" | "));
    }
    md += match kind {
        Kind::Classifier => {
            "\nseconds: training only (evaluation excluded); peak_rss_mb: the run's peak resident memory; \
             grad_cosine: mean cosine of the estimator's dL/dphi with the exact one at the end of training \
             (empty for exact estimators).\n"
        }
        Kind::SkipGram => {
            "\nheldout_objective: mean over held-out (context, centre) pairs of log sum_k exp(u_x.v_k) - u_x.v_y \
             after the last epoch (lower is better); seconds: training only, the negative-sampling warm-up \
             included (evaluation excluded); epochs count a partial last epoch by its words.\n"
        }
    };
    std::fs::write(out.join("summary.md"), md).with_context(|| format!("writing {}/summary.md", out.display()))?;
    Ok(())
}

fn plot(out: &Path, runs: &[Run]) -> Result<()> {
    // Text needs a font and the machine may have none: DejaVu Sans is compiled in.
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| anyhow::anyhow!("the embedded DejaVu Sans font failed to load"))?;
    let png = out.join("curves.png");
    let svg = out.join("curves.svg");
    draw(BitMapBackend::new(&png, (1400, 600)).into_drawing_area(), runs)
        .with_context(|| format!("drawing {}", png.display()))?;
    draw(SVGBackend::new(&svg, (1400, 600)).into_drawing_area(), runs)
        .with_context(|| format!("drawing {}", svg.display()))?;
    Ok(())
}

/// Tick labels of the log time axis: as many decimals as the magnitude needs.
fn seconds_label(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.0}")
    } else if x >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.1e}")
    }
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, runs: &[Run]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e}");
    root.fill(&WHITE).map_err(err)?;
    let task = runs[0].summary.task();
    let kind = runs[0].summary.kind();
    let label = kind.metric_label();
    let root = root.titled(&format!("{task}: {label} by method"), ("sans-serif", 24)).map_err(err)?;
    let (left, right) = root.split_horizontally(700);
    let points = runs.iter().flat_map(|r| r.curve.iter());
    let t_last = points.clone().map(|p| p.0).fold(0.0f64, f64::max).max(1e-3);
    let t_max = t_last * 1.3;
    // The first positive training time (infinite when there is none).
    let t_lo = points.clone().map(|p| p.0).filter(|&t| t > 0.0).fold(f64::INFINITY, f64::min);
    // Start the log axis at a power of ten so that it carries at least two labelled decades.
    let t_min = 10f64.powf(t_lo.min(t_max / 10.0).log10().floor());
    let e_max = points.clone().map(|p| p.1).fold(0.0f64, f64::max).max(1e-3) * 1.05;
    // From 0, or from just before the first point when every run resumed late in training.
    let e_first = points.clone().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let e_min = if e_first > 0.5 * e_max { e_first - 0.05 * (e_max - e_first) } else { 0.0 };
    let y_range = match kind {
        Kind::Classifier => 0.0..(points.map(|p| p.2).fold(0.0f64, f64::max) * 1.1).clamp(0.05, 1.0),
        Kind::SkipGram => {
            // An objective: the span of the values with a margin.
            let lo = points.clone().map(|p| p.2).fold(f64::INFINITY, f64::min);
            let hi = points.map(|p| p.2).fold(f64::NEG_INFINITY, f64::max);
            let pad = ((hi - lo) * 0.08).max(1e-3);
            if lo.is_finite() { lo - pad..hi + pad } else { 0.0..1.0 }
        }
    };
    let methods: Vec<&str> = {
        let mut m: Vec<&str> = Vec::new();
        runs.iter().for_each(|r| {
            if !m.contains(&r.method.as_str()) {
                m.push(&r.method)
            }
        });
        m
    };
    let color = |r: &Run| Palette99::pick(methods.iter().position(|m| *m == r.method).unwrap_or(0)).to_rgba();
    // Left: against training seconds, linear when the times span less than a decade (runs
    // resumed from a warm-up checkpoint), else on a log axis (runs from the first steps).
    if t_lo.is_finite() && t_last / t_lo < 10.0 {
        let pad = (t_last - t_lo) * 0.05;
        time_chart(&left, (t_lo - pad)..(t_last + pad), "training seconds", y_range.clone(), runs, kind, &color)?;
    } else {
        time_chart(
            &left,
            (t_min.max(1e-4)..t_max).log_scale(),
            "training seconds (log scale)",
            y_range.clone(),
            runs,
            kind,
            &color,
        )?;
    }
    // Right: against epochs.
    let mut chart = ChartBuilder::on(&right)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(e_min..e_max, y_range)
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(238, 238, 238))
        .x_desc("epochs")
        .y_desc(label)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(err)?;
    for r in runs {
        let c = color(r);
        let pts: Vec<(f64, f64)> = r.curve.iter().map(|p| (p.1, p.2)).collect();
        chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2))).map_err(err)?;
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled()))).map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// The left panel: the kind's metric against training seconds on axis `x`, one line per run.
fn time_chart<DB: DrawingBackend, X>(
    area: &DrawingArea<DB, Shift>,
    x: X,
    x_desc: &str,
    y_range: std::ops::Range<f64>,
    runs: &[Run],
    kind: Kind,
    color: &dyn Fn(&Run) -> RGBAColor,
) -> Result<()>
where
    DB::ErrorType: 'static,
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e}");
    let mut chart = ChartBuilder::on(area)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y_range)
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(238, 238, 238))
        .x_labels(12)
        .x_label_formatter(&|x| seconds_label(*x))
        .x_desc(x_desc)
        .y_desc(kind.metric_label())
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(err)?;
    let mut labelled = Vec::new();
    for r in runs {
        let c = color(r);
        let pts: Vec<(f64, f64)> = r.curve.iter().filter(|p| p.0 > 0.0).map(|p| (p.0, p.2)).collect();
        let series = chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2))).map_err(err)?;
        if !labelled.contains(&r.method) {
            labelled.push(r.method.clone());
            series
                .label(r.method.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
        }
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled()))).map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(match kind {
            Kind::Classifier => SeriesLabelPosition::UpperLeft,
            Kind::SkipGram => SeriesLabelPosition::UpperRight,
        })
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(err)?;
    Ok(())
}
