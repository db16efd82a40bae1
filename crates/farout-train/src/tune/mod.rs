//! `farout tune`: the best recipe for a config's own data, searched on a validation split
//! within a wall-clock budget.
//!
//! The search never reads the test set: every trial trains on the training rows left after
//! `data.holdout` sets a seeded fraction aside ([`split`]) and is scored on those rows (a
//! skip-gram trial by its held-out objective, or by the analogy or word-pair file its config
//! names). The space is the plug-ins' own ([`space::default_space`]), with a space file's
//! ranges over it. Successive halving ([`search`]) spends the budget, several trials at once
//! where the cores allow ([`jobs`]); every trial goes to
//! `DIR/trials.csv` as it ends ([`trials`]), so `--resume` continues a search. At the end the
//! best setting is written as a complete config (`DIR/best.toml`), retrained on the whole
//! training set and evaluated on the test set once (`DIR/runs/<name>-tuned@0`, which
//! `farout compare --from DIR` reads), and the metric is drawn against the search's time
//! (`DIR/progress.png`, `.svg`).
//!
//! ```text
//! DIR/trials.csv      id, rung, resource, metric, seconds, elapsed, stop, start, settings
//! DIR/best.toml       the base config with the best settings
//! DIR/progress.png    validation metric against search seconds
//! DIR/trials/<id>-r<rung>/       each trial's logs
//! DIR/runs/<name>-tuned@0/       the final run: summary.json, metrics.jsonl, checkpoint/
//! ```

mod jobs;
mod outdir;
mod plot;
mod prune;
pub mod recipe;
pub mod search;
pub mod space;
pub mod split;
pub mod trials;
pub mod warm;

use crate::task::{RunSummary, TaskKind, TrainOptions};
use crate::{Config, Error, io_err};
use farout_core::space::Dim;
pub use jobs::Jobs;
use recipe::{Recipe, Setting};
use search::{ETA, RUNGS_ABOVE, Resource};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;
use trials::{Stop, Trial};

/// What to tune, and how long.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// The base config.
    pub config: PathBuf,
    /// `key=value` overrides of the base config.
    pub set: Vec<String>,
    /// Seconds of search (the final retraining excluded).
    pub budget: f64,
    /// A space file over the plug-ins' spaces.
    pub space: Option<PathBuf>,
    /// Fraction of the training rows set aside for validation.
    pub valid_fraction: f64,
    /// The validation metric (default: `p@1`; skip-gram: the held-out objective).
    pub metric: Option<String>,
    /// Output directory.
    pub out: PathBuf,
    /// Continue the search in `out` from its `trials.csv`.
    pub resume: bool,
    /// Seed of the draws (default: the config's seed).
    pub seed: Option<u64>,
    /// Stop after this many settings (0: as many as the budget allows).
    pub max_settings: usize,
    /// Train every trial from scratch: no warm starts ([`warm`]).
    pub cold: bool,
    /// Trials run at once (0: as many as fit the cores with `train.threads` each; [`Jobs`]).
    pub jobs: usize,
    /// The epochs of the top rung (default: [`search::default_max_epochs`]).
    pub max_epochs: Option<usize>,
    /// Show the progress bar.
    pub progress: bool,
}

impl Default for TuneOptions {
    fn default() -> Self {
        Self {
            config: PathBuf::new(),
            set: Vec::new(),
            budget: 600.0,
            space: None,
            valid_fraction: 0.2,
            metric: None,
            out: PathBuf::from("runs/tune"),
            resume: false,
            seed: None,
            max_settings: 0,
            cold: false,
            jobs: 0,
            max_epochs: None,
            progress: true,
        }
    }
}

/// What a tune found.
#[derive(Clone, Debug)]
pub struct TuneReport {
    /// Every trial.
    pub trials: Vec<Trial>,
    /// The best trial's settings.
    pub best: Vec<Setting>,
    /// The best trial's validation figure.
    pub best_valid: f64,
    /// The final run (the best settings on the whole training set, scored on the test set).
    pub summary: RunSummary,
    /// The trials as a Markdown table.
    pub table: String,
    /// The output directory.
    pub out: PathBuf,
}

/// The validation metric and its direction.
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    /// Its name (`p@1`, `analogy`, `heldout_objective`, ...).
    pub name: String,
    /// Whether higher is better.
    pub higher: bool,
}

const CLASSIFIER_METRICS: [&str; 8] = crate::config::SELECT_METRICS;
const SKIPGRAM_METRICS: [&str; 3] = ["heldout_objective", "analogy", "similarity"];

impl Metric {
    /// The metric `asked` (or the task's default) for `config`, if the task has it and the
    /// config gives what it needs.
    pub fn of(config: &Config, asked: Option<&str>) -> Result<Self, Error> {
        let skip_gram = TaskKind::of(config) == TaskKind::SkipGram;
        let allowed: &[&str] = if skip_gram { &SKIPGRAM_METRICS } else { &CLASSIFIER_METRICS };
        let name = asked.unwrap_or(allowed[0]).to_string();
        if !allowed.contains(&name.as_str()) {
            let msg =
                format!("{name}: a {} config is tuned on one of {}", TaskKind::of(config).name(), allowed.join(", "));
            return Err(Error::Option { name: "metric", msg });
        }
        let e = &config.eval;
        let missing = match name.as_str() {
            "heldout_objective" if e.heldout_pairs == 0 || (e.heldout.is_none() && config.data.corpus.is_some()) => {
                Some(
                    "needs held-out text: set eval.heldout (and eval.heldout_pairs > 0), or tune on analogy or similarity",
                )
            }
            "analogy" if e.analogy.is_none() => Some("needs eval.analogy (analogy questions)"),
            "similarity" if e.similarity.is_none() => Some("needs eval.similarity (word pairs with scores)"),
            _ => None,
        };
        if let Some(msg) = missing {
            return Err(Error::Option { name: "metric", msg: format!("{name} {msg}") });
        }
        Ok(Self { higher: !matches!(name.as_str(), "loss" | "heldout_objective"), name })
    }

    /// The metric's value in a run's summary.
    pub fn value(&self, summary: &RunSummary) -> Option<f64> {
        match summary {
            RunSummary::Classifier(s) => s.metrics.get(&self.name).copied(),
            RunSummary::SkipGram(s) => match self.name.as_str() {
                "analogy" => s.analogy.as_ref().map(|a| a.accuracy),
                "similarity" => s.similarity.as_ref().map(|r| r.spearman),
                _ => s.heldout_objective,
            },
        }
        .filter(|x| x.is_finite())
    }
}

/// Runs the search, writes its files, retrains the best setting and evaluates it on the test
/// set.
pub fn tune(opts: &TuneOptions) -> Result<TuneReport, Error> {
    if !(opts.budget.is_finite() && opts.budget > 0.0) {
        return Err(Error::Option {
            name: "budget",
            msg: format!("{}: give a positive number of seconds", opts.budget),
        });
    }
    if !(opts.valid_fraction > 0.0 && opts.valid_fraction < 1.0) {
        let msg = format!("{}: give a fraction in (0, 1)", opts.valid_fraction);
        return Err(Error::Option { name: "valid-fraction", msg });
    }
    let (recipe, base) = Recipe::load(&opts.config, &opts.set)?;
    let metric = Metric::of(&base, opts.metric.as_deref())?;
    outdir::check(&opts.out, &opts.config, &base)?;
    let mut space = space::default_space(&base);
    let origin = match &opts.space {
        Some(p) => {
            space = space::read_space(p, space)?;
            p.display().to_string()
        }
        None => "the default space".to_string(),
    };
    space::check_space(&space, &recipe, &origin)?;
    let resource = match TaskKind::of(&base) {
        TaskKind::Linear if opts.max_epochs.is_some() => {
            let msg = "a linear solver's trials grow in training rows, not epochs: leave it out".into();
            return Err(Error::Option { name: "max-epochs", msg });
        }
        TaskKind::Linear => Resource::Rows,
        kind => match opts.max_epochs {
            Some(0) => return Err(Error::Option { name: "max-epochs", msg: "0: give at least 1".into() }),
            Some(e) => Resource::Epochs(e),
            None => Resource::Epochs(search::default_max_epochs(kind, base.train.epochs)),
        },
    };
    search::check_resource(&recipe, resource).map_err(|error| Error::Config { path: opts.config.clone(), error })?;
    let trials_path = opts.out.join("trials.csv");
    let earlier = match (trials_path.exists(), opts.resume) {
        (true, true) => search::earlier(trials::read(&trials_path)?),
        (true, false) => {
            let msg = format!(
                "{} holds an earlier search: pass --resume to continue it, or another --out",
                opts.out.display()
            );
            return Err(Error::Option { name: "out", msg });
        }
        (false, _) => Default::default(),
    };
    std::fs::create_dir_all(&opts.out).map_err(io_err(&opts.out))?;
    let seed = opts.seed.unwrap_or(base.seed);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let jobs = Jobs::new(opts.jobs, base.train.threads, cores);
    log::info!("{} trial(s) at once, {} thread(s) each", jobs.jobs, jobs.threads);
    let mut s = Search::new(opts, &recipe, &base, metric, resource, earlier, jobs);
    s.run(&space, seed)?;
    s.finish()
}

/// A search in progress.
struct Search<'a> {
    opts: &'a TuneOptions,
    recipe: &'a Recipe,
    metric: Metric,
    resource: Resource,
    holdout: Option<Setting>,
    kind: TaskKind,
    earlier: std::collections::HashMap<(usize, usize), Trial>,
    clock: Instant,
    /// Search seconds spent before a resume.
    offset: f64,
    bar: indicatif::ProgressBar,
    /// Trials at once, and the threads of each.
    jobs: Jobs,
    /// What the jobs share.
    state: Mutex<Shared>,
    /// Signalled when a trial ends.
    ended: Condvar,
}

/// The trials of a search and what its jobs decide by, under one lock.
#[derive(Default)]
struct Shared {
    /// The trials of the rungs that ended, in trial order.
    trials: Vec<Trial>,
    /// The current rung's trials by their place in it (`None`: not ended).
    slots: Vec<Option<Trial>>,
    /// The place of the rung's next trial to launch.
    next: usize,
    /// A trial did not fit the budget: nothing more is launched.
    out_of_time: bool,
    /// The linear trials' models, the starts of later trials.
    starts: warm::LinearStarts,
    /// The first error of a job; the others stop.
    error: Option<Error>,
}

impl Shared {
    /// The trials that ended, in trial order.
    fn ended(&self) -> Vec<Trial> {
        self.trials.iter().chain(self.slots.iter().flatten()).cloned().collect()
    }
}

impl<'a> Search<'a> {
    fn new(
        opts: &'a TuneOptions,
        recipe: &'a Recipe,
        base: &Config,
        metric: Metric,
        resource: Resource,
        earlier: std::collections::HashMap<(usize, usize), Trial>,
        jobs: Jobs,
    ) -> Self {
        let offset = earlier.values().map(|t| t.elapsed).fold(0.0, f64::max);
        // Skip-gram holds text out through eval.heldout (or scores an eval file); rows are split.
        let holdout = (TaskKind::of(base) != TaskKind::SkipGram)
            .then(|| ("data.holdout".to_string(), format!("{:?}", opts.valid_fraction)));
        let template = "tune [{bar:30}] {pos}/{len} s  {msg}";
        let bar = crate::report::progress_bar(opts.progress, opts.budget.ceil() as u64, template);
        Self {
            opts,
            recipe,
            metric,
            resource,
            holdout,
            kind: TaskKind::of(base),
            earlier,
            clock: Instant::now(),
            offset,
            bar,
            jobs,
            state: Mutex::new(Shared::default()),
            ended: Condvar::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, Shared> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn out_of_time(&mut self) -> bool {
        self.state.get_mut().unwrap_or_else(PoisonError::into_inner).out_of_time
    }

    fn elapsed(&self) -> f64 {
        self.offset + self.clock.elapsed().as_secs_f64()
    }

    /// Brackets of successive halving until the budget (or `max_settings`) is spent.
    fn run(&mut self, space: &[Dim], seed: u64) -> Result<(), Error> {
        let per_bracket = ETA.pow(RUNGS_ABOVE);
        let mut next_id = 0;
        for bracket in 0.. {
            let left = match self.opts.max_settings {
                0 => per_bracket,
                m => m.saturating_sub(next_id).min(per_bracket),
            };
            if left == 0 || self.out_of_time() {
                break;
            }
            let mut alive: Vec<(usize, Vec<Setting>)> = search::draws(space, bracket, seed)
                .into_iter()
                .take(left)
                .enumerate()
                .map(|(i, s)| (next_id + i, s))
                .collect();
            next_id += per_bracket;
            for rung in 0..=RUNGS_ABOVE as usize {
                alive = self.rung(rung, &alive)?;
                if alive.is_empty() || self.out_of_time() {
                    break;
                }
            }
        }
        self.bar.finish_and_clear();
        Ok(())
    }

    /// Trains `alive` at rung `rung` ([`jobs`]); returns the ones promoted to the next rung.
    fn rung(&mut self, rung: usize, alive: &[(usize, Vec<Setting>)]) -> Result<Vec<(usize, Vec<Setting>)>, Error> {
        let ran = self.run_jobs(rung, alive)?;
        let out = self.opts.out.clone();
        let higher = self.metric.higher;
        let s = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        trials::write(&out.join("trials.csv"), &s.trials)?;
        if s.out_of_time {
            return Ok(Vec::new());
        }
        let top = rung == RUNGS_ABOVE as usize;
        let metrics: Vec<Option<f64>> = s.trials[ran.clone()].iter().map(|t| t.metric).collect();
        let promoted = if top { Vec::new() } else { search::promote(&metrics, higher) };
        for (i, t) in s.trials[ran.clone()].iter_mut().enumerate() {
            if t.stop == Stop::Pending {
                t.stop = if top {
                    Stop::Finished
                } else if promoted.contains(&i) {
                    Stop::Promoted
                } else {
                    Stop::Halved
                };
            }
        }
        trials::write(&out.join("trials.csv"), &s.trials)?;
        let slots: Vec<Option<Trial>> = s.trials[ran].iter().cloned().map(Some).collect();
        self.prune(&slots, rung)?;
        Ok(promoted.into_iter().map(|i| alive[i].clone()).collect())
    }

    /// Removes the checkpoints no later trial needs among the trials `slots` of rung `rung`
    /// (by place; `None`: not ended) and the rung below ([`prune`]).
    fn prune(&self, slots: &[Option<Trial>], rung: usize) -> Result<(), Error> {
        let unneeded = match self.kind {
            TaskKind::Classifier => prune::unneeded(slots, rung == RUNGS_ABOVE as usize, self.metric.higher),
            TaskKind::SkipGram => slots.iter().flatten().map(|t| (t.id, t.rung)).collect(),
            // DiSMEC's models are the starts of later trials, until the final run ([`Search::finish`]).
            TaskKind::Linear => Vec::new(),
        };
        for (id, r) in unneeded {
            prune::remove_checkpoints(&warm::trial_dir(&self.opts.out, id, r))?;
        }
        Ok(())
    }

    /// The config of trial `id` at rung `rung`: the settings, the rung's resource, the held-out
    /// rows and selection, logs and checkpoints in the trial's directory (checkpoints only when
    /// later trials may start from them).
    fn trial_config(&self, id: usize, rung: usize, settings: &[Setting]) -> Result<Config, Error> {
        let mut all = search::trial_settings(settings, self.resource, self.resource.at(rung));
        all.extend(self.holdout.clone());
        // A network trial keeps its weights best on the held-out rows by the search's metric.
        all.extend(self.selection(false));
        let mut c = self.recipe.config(&all)?;
        let dir = warm::trial_dir(&self.opts.out, id, rung);
        c.checkpoint.dir = Some(dir.join("checkpoint"));
        c.log.dir = Some(dir);
        let warm = match self.kind {
            TaskKind::Linear => warm::linear_warm(&c),
            _ => warm::network_continues(&c, self.resource),
        };
        (c.checkpoint.enabled, c.log.progress, c.log.tensorboard) = (warm && !self.opts.cold, false, false);
        // A network trial is continued from its end only: no checkpoint at every epoch.
        c.checkpoint.every_steps = u64::MAX;
        Ok(c)
    }

    /// The settings that make a network run keep its weights best on validation by the
    /// search's metric: `train.select_metric`, and `train.select = "best"` for a run without a
    /// budget (`always`, the final run). None for linear solvers and skip-gram.
    fn selection(&self, always: bool) -> Vec<Setting> {
        if self.kind != TaskKind::Classifier {
            return Vec::new();
        }
        let mut s = vec![("train.select_metric".to_string(), format!("{:?}", self.metric.name))];
        if always {
            s.push(("train.select".to_string(), "\"best\"".to_string()));
        }
        s
    }

    /// Shows the best figure of the ended `trials` so far and the time left.
    fn update_bar(&self, trials: &[Trial]) {
        self.bar.set_position((self.elapsed().min(self.opts.budget)) as u64);
        let best = search::best(trials, self.metric.higher)
            .or_else(|| trials.iter().find(|t| t.metric.is_some()))
            .and_then(|t| t.metric);
        let left = (self.opts.budget - self.elapsed()).max(0.0);
        let best = best.map_or("-".into(), |b| format!("{b:.4}"));
        self.bar.set_message(format!("best {} {best} · {} trials · {left:.0} s left", self.metric.name, trials.len()));
    }

    /// Writes best.toml and the plot, retrains the best setting and scores it on the test set.
    fn finish(mut self) -> Result<TuneReport, Error> {
        let out = &self.opts.out;
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        let (trials, starts) = (std::mem::take(&mut state.trials), std::mem::take(&mut state.starts));
        let best = search::best(&trials, self.metric.higher).ok_or(Error::NoData(
            "no trial of the search finished: raise --budget, or see the warnings for why trials failed",
        ))?;
        let (mut settings, best_valid) = (best.settings.clone(), best.metric.expect("best has a figure"));
        log::info!("best validation {} {best_valid:.4} ({})", self.metric.name, best.settings_text());
        // The final network run keeps its weights best on its own validation split, as the
        // trials did on theirs; best.toml says so, so that it runs as the final run did.
        if let Resource::Epochs(_) = self.resource {
            // The epochs the best trial trained: the search's choice of training length.
            settings.push(self.resource.setting(best.resource));
        }
        let mut recipe_settings = settings.clone();
        recipe_settings.extend(self.selection(true));
        write_best(&out.join("best.toml"), self.recipe, &recipe_settings, &self.metric, best_valid)?;
        plot::plot(out, &trials, &self.metric)?;
        let mut c = self.recipe.config(&recipe_settings)?;
        c.log.dir = Some(out.join("runs").join(format!("{}-tuned@0", c.name)));
        // In DIR too when the base config names a checkpoint directory: the final run replaces
        // what its directory holds, and the base run's model is not the tune's to replace.
        c.checkpoint.dir = Some(c.log_dir().join("checkpoint"));
        c.log.progress = self.opts.progress;
        // A linear solver that can starts from the best trial's model: the same fit, sooner.
        let mut options = TrainOptions { overwrite: true, ..Default::default() };
        let start = warm::trial_dir(out, best.id, best.rung).join("checkpoint");
        let warm = !self.opts.cold && starts.has(&start);
        if warm {
            options.warm_start = Some(&start);
        }
        // On `train.threads` threads, as `farout train best.toml` runs (0: the caller's pool).
        let summary = match c.train.threads {
            0 => crate::train(&c, &options, &farout_dist::Local)?,
            t => rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .map_err(|e| Error::Option { name: "jobs", msg: format!("cannot start a pool of {t} threads: {e}") })?
                .install(|| crate::train(&c, &options, &farout_dist::Local))?,
        };
        let path = c.log_dir().join("summary.json");
        std::fs::write(&path, summary.to_json() + "\n").map_err(io_err(&path))?;
        if self.kind == TaskKind::Linear {
            // The final run has started from the best trial's model: the trials' models go.
            for t in &trials {
                prune::remove_checkpoints(&warm::trial_dir(out, t.id, t.rung))?;
            }
        }
        let table = trials::table(&trials, &self.metric.name, self.resource.unit());
        let md = out.join("trials.md");
        std::fs::write(&md, &table).map_err(io_err(&md))?;
        Ok(TuneReport { trials, best: settings, best_valid, summary, table, out: out.clone() })
    }
}

/// Writes the best recipe as a complete config, with what it scored as a comment.
fn write_best(path: &Path, recipe: &Recipe, settings: &[Setting], metric: &Metric, valid: f64) -> Result<(), Error> {
    let table = recipe.table(settings)?;
    let text = format!(
        "# farout tune: validation {} {valid:.4} with {}\n{}",
        metric.name,
        if settings.is_empty() {
            "the base config's own settings".to_string()
        } else {
            settings.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
        },
        toml::to_string(&table).expect("a config tree serialises")
    );
    std::fs::write(path, text).map_err(io_err(path))
}
