//! Skip-gram word embeddings from a config (`model.encoder = "skip_gram"`, `data.format =
//! "text"`): vocabulary, negative-sampling epochs with a progress bar (words/s, loss, ETA),
//! TensorBoard and JSONL logs, evaluation and a checkpoint after each epoch, resume, export.
//!
//! The checkpoint directory holds `vocab.txt`, `input.bin` and `output.bin` (both tables, so a
//! resumed run keeps the output vectors; with subwords the input table has the n-gram rows
//! after the words') and `state.json`; the step size continues from where the schedule stopped
//! because it is a function of the words read. A run that selects keeps its epoch best on the
//! held-out objective beside it ([`best`]).

use crate::checkpoint::{check_finite, read_f32_file, replace_dir, write_f32_file};
use crate::config::{Config, ConfigError};
use crate::report::progress_bar;
use crate::sinks::{MetricsSink, Sinks};
use crate::{Error, io_err as io};
use farout_core::{AliasTable, Matrix};
use farout_data::corpus::Vocab;
use farout_data::synth_text::TextGenSpec;
use farout_estimators::NegativeSamplingConfig;
use farout_layer::OutputLayer;
use farout_skipgram::batch::{BatchJob, InputTable};
use farout_skipgram::collapsed::{Cooccurrence, GdJob, SoftmaxPart};
use farout_skipgram::eval::{self, AnalogyReport, SimilarityReport, softmax_objective};
use farout_skipgram::pairs::sample_pairs;
use farout_skipgram::sgns::{EpochStats, NsJob, Progress};
use farout_skipgram::subwords::{NgramSpec, NgramTable, Subwords};
use farout_skipgram::vectors::{Format, Vectors};
use farout_skipgram::{Embeddings, Objective};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::time::Instant;

mod best;
pub use best::{SkipGramSelection, has_heldout};

/// Negatives per pair when `output.n_samples = 0` (word2vec's default).
const DEFAULT_NEGATIVES: usize = 5;

/// Progress saved in a checkpoint.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct State {
    epochs_done: usize,
    corpus_tokens: u64,
    words: u64,
    pairs: u64,
    train_seconds: f64,
    /// The n-gram settings the input table was trained with (`None`: no subwords).
    #[serde(default)]
    ngrams: Option<NgramSpec>,
    /// The epoch kept as the best on the held-out objective ([`best`]).
    #[serde(default)]
    best: Option<best::BestEpoch>,
}

/// What a skip-gram run reports at the end (printed as JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SkipGramSummary {
    /// Run name.
    pub name: String,
    /// `text:<corpus file>`.
    pub task: String,
    /// The estimator.
    pub estimator: String,
    /// Vocabulary size.
    pub vocab: usize,
    /// Tokens of the corpus (in the vocabulary or not).
    pub corpus_tokens: u64,
    /// Tokens in the vocabulary, per epoch (before subsampling).
    pub train_tokens: u64,
    /// Epochs completed.
    pub epochs: usize,
    /// Vocabulary words read over all epochs.
    pub words: u64,
    /// (context, centre) pairs trained.
    pub pairs: u64,
    /// Seconds spent training (vocabulary, evaluation and checkpoints excluded).
    pub train_seconds: f64,
    /// Seconds building the vocabulary.
    pub vocab_seconds: f64,
    /// `words / train_seconds`.
    pub words_per_second: f64,
    /// Mean pair loss of the last epoch (the estimator's own loss).
    pub loss: f64,
    /// Full-softmax objective on held-out pairs of the kept vectors: the last epoch's, or the
    /// best epoch's when the run selects ([`SkipGramSummary::selection`]).
    pub heldout_objective: Option<f64>,
    /// Analogy evaluation of the kept vectors (`eval.analogy`).
    pub analogy: Option<AnalogyTotals>,
    /// Similarity evaluation of the kept vectors (`eval.similarity`).
    pub similarity: Option<SimilarityReport>,
    /// A run that kept its epoch best on the held-out objective: which, and the last epoch's
    /// objective beside it. `None` when the last epoch is the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<SkipGramSelection>,
    /// Where the vectors were exported.
    pub vectors: Option<PathBuf>,
    /// The log directory.
    pub log_dir: PathBuf,
}

/// The totals of an analogy evaluation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AnalogyTotals {
    /// Accuracy over the questions asked.
    pub accuracy: f64,
    /// Questions asked.
    pub asked: usize,
    /// Questions skipped (out of the restricted vocabulary).
    pub skipped: usize,
    /// Candidates (restricted vocabulary).
    pub candidates: usize,
}

impl From<&AnalogyReport> for AnalogyTotals {
    fn from(r: &AnalogyReport) -> Self {
        Self { accuracy: r.accuracy, asked: r.total.asked, skipped: r.total.skipped, candidates: r.candidates }
    }
}

/// The words' input vectors (with subwords, their rows' means) and, with subwords, the n-gram
/// rows that give other words a vector, borrowed from `input` (only the words' means are
/// computed).
pub fn vectors<'m>(vocab: &'m Vocab, subwords: &Subwords, input: &'m Matrix) -> Result<Vectors<'m>, Error> {
    vectors_of(vocab, subwords, word_inputs(subwords, input), input)
}

/// [`vectors`] with the words' vectors already computed ([`word_inputs`]).
fn vectors_of<'m>(
    vocab: &'m Vocab,
    subwords: &Subwords,
    words: Cow<'m, Matrix>,
    input: &'m Matrix,
) -> Result<Vectors<'m>, Error> {
    let v = Vectors::of_vocab(vocab, words)?;
    let spec = subwords.spec();
    if !spec.enabled() {
        return Ok(v);
    }
    let ngrams =
        NgramTable::borrowed(spec.minn, spec.maxn, input.cols(), &input.as_slice()[vocab.len() * input.cols()..]);
    Ok(v.with_ngrams(ngrams)?)
}

/// The words' input vectors as rows of one matrix: `input` itself, or its rows' means with
/// subwords.
fn word_inputs<'m>(subwords: &Subwords, input: &'m Matrix) -> Cow<'m, Matrix> {
    if subwords.spec().enabled() { Cow::Owned(subwords.word_vectors(input)) } else { Cow::Borrowed(input) }
}

/// Evaluates `v` on the config's analogy and similarity files (those it names).
pub fn evaluate(config: &Config, v: &Vectors) -> Result<(Option<AnalogyReport>, Option<SimilarityReport>), Error> {
    let e = &config.eval;
    let analogy = e.analogy.as_ref().map(|p| eval::analogy(v, p, e.analogy_restrict)).transpose()?;
    let similarity = e.similarity.as_ref().map(|p| eval::similarity(v, p)).transpose()?;
    Ok((analogy, similarity))
}

/// Loads the newest complete checkpoint in (or, after an interrupted save, beside) `dir`,
/// checked against its manifest and against the config's n-gram settings; NaN or infinite
/// vectors are refused.
fn load_checkpoint(dir: &Path, dim: usize, ngrams: NgramSpec) -> Result<(Vocab, Subwords, Embeddings, State), Error> {
    let dir = &crate::checkpoint::open(dir)?;
    let state: State = crate::checkpoint::read_state(dir, "skip-gram checkpoint state")?;
    let wanted = ngrams.enabled().then_some(ngrams);
    if state.ngrams != wanted {
        let show = |s: Option<NgramSpec>| match s {
            Some(s) => format!("n-grams of {} to {} characters in {} buckets", s.minn, s.maxn, s.buckets),
            None => "no subwords".to_string(),
        };
        return Err(Error::Checkpoint {
            path: dir.join("state.json"),
            msg: format!(
                "trained with {}, but the config sets {}: set model.skip_gram.minn, maxn and buckets as in training",
                show(state.ngrams),
                show(wanted)
            ),
        });
    }
    let vocab = Vocab::load(&dir.join("vocab.txt"))?;
    let subwords = Subwords::new(vocab.words(), ngrams);
    let mut emb = Embeddings::init(subwords.table_rows(), vocab.len(), dim, 0.0, 0);
    read_f32_file(&dir.join("input.bin"), emb.input.as_mut_slice())?;
    read_f32_file(&dir.join("output.bin"), emb.output.as_mut_slice())?;
    check_finite(&dir.join("input.bin"), "input vectors", emb.input.as_slice())?;
    check_finite(&dir.join("output.bin"), "output vectors", emb.output.as_slice())?;
    Ok((vocab, subwords, emb, state))
}

/// The training corpus and the held-out text: `data.corpus` and `eval.heldout`, or the
/// synthetic corpus of `[data.synthetic]` and a held-out part generated with another seed (1 %
/// of its size, at least 100,000 tokens), both in the log directory and written unless they are
/// there already with the same parameters.
pub fn corpus_paths(config: &Config) -> Result<(PathBuf, Option<PathBuf>), Error> {
    if let Some(p) = &config.data.corpus {
        return Ok((p.clone(), config.eval.heldout.clone()));
    }
    let dir = config.log_dir();
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let train = config.data.synthetic.clone();
    let heldout = TextGenSpec { tokens: (train.tokens / 100).max(100_000), seed: train.seed + 1, ..train.clone() };
    let corpus = write_synthetic(config, &train, &dir.join("corpus.txt"))?;
    let held = match &config.eval.heldout {
        Some(p) => p.clone(),
        None => write_synthetic(config, &heldout, &dir.join("heldout.txt"))?,
    };
    Ok((corpus, Some(held)))
}

fn write_synthetic(config: &Config, spec: &TextGenSpec, path: &Path) -> Result<PathBuf, Error> {
    let spec_path = path.with_extension("json");
    let json = serde_json::to_string_pretty(spec).expect("spec serialises");
    if path.exists() && std::fs::read_to_string(&spec_path).is_ok_and(|s| s == json) {
        return Ok(path.to_path_buf());
    }
    let _ = std::fs::remove_file(&spec_path);
    let change = "lower data.synthetic.tokens or words, or set data.corpus";
    let what = format!("a synthetic corpus of {} tokens", spec.tokens);
    farout_core::resources::check_memory(spec.generator_bytes(), "the synthetic corpus generator", change)?;
    farout_core::resources::check_disk(path, spec.text_bytes(), what, change)?;
    let bar = progress_bar(
        config.log.progress,
        spec.tokens,
        "synthetic corpus [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} tokens",
    );
    spec.write(path, &|n| bar.set_position(n))?;
    bar.finish_and_clear();
    std::fs::write(&spec_path, json).map_err(io(&spec_path))?;
    log::info!("wrote a synthetic corpus of {} tokens to {}", spec.tokens, path.display());
    Ok(path.to_path_buf())
}

/// The checks of a skip-gram config: the corpus's tokenisation, the skip-gram model, estimators
/// that go with its mode and objective, then the training sections every network has.
pub(crate) fn check_config(config: &Config) -> Result<(), ConfigError> {
    config.check_encoder_and_estimator()?;
    let out = &config.output;
    config.data.text.check().map_err(|e| ConfigError::param("data.text", e))?;
    config.model.skip_gram.check().map_err(|e| ConfigError::param("model.skip_gram", e))?;
    if out.warmup_steps > 0 {
        return Err(ConfigError::key(
            "output.warmup_steps",
            "skip-gram warms up with model.skip_gram.ns_warmup_epochs",
        ));
    }
    // What trains with negative sampling only: (in use, its key, what, the other way out).
    let sg = &config.model.skip_gram;
    let ns_only = [
        (sg.mode == farout_skipgram::Mode::Cbow, "model.skip_gram.mode", "\"cbow\" trains", ""),
        (sg.ngrams().enabled(), "model.skip_gram.maxn", "subwords (maxn > 0) train", " or maxn = 0"),
    ];
    for (used, key, what, or) in ns_only {
        if used && out.estimator.negative_sampling().is_none() {
            let found = out.estimator.name();
            return Err(ConfigError::key(
                key,
                format!(
                    "{what} with negative sampling only; set output.estimator = \"negative_sampling\"{or} \
                         (found {found:?})"
                ),
            ));
        }
    }
    if config.model.skip_gram.objective == farout_skipgram::Objective::Collapsed && !out.estimator.estimates_softmax() {
        return Err(ConfigError::key(
            "output.estimator",
            format!(
                "the collapsed objective (eq. 9) is a softmax loss; use \"softmax\" (GD), \"mips\" or \
                     \"ldgs\" with output.loss = \"softmax\" (GD-MIPS, GD-Decomp-MIPS) or \"sampled_softmax\" \
                     (found {:?}{})",
                out.estimator.name(),
                if out.estimator.loss().is_ok_and(|l| !l.is_softmax()) { " with the margin loss" } else { "" }
            ),
        ));
    }
    config.check_training()
}

/// The checkpoint a trained model is read from: the epoch kept as the best on the held-out
/// objective (`<checkpoint dir>-best`) when the run kept one, else the last epoch's.
pub fn kept_checkpoint_dir(config: &Config) -> PathBuf {
    let best = config.best_checkpoint_dir();
    if best.exists() { best } else { config.checkpoint_dir() }
}

/// Which vectors of a skip-gram checkpoint [`export_checkpoint`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipGramRows {
    /// The words' input vectors (with subwords, the means of their rows): the word vectors.
    Input,
    /// The words' output (context) vectors: the rows the skip-gram gradient searches, with an
    /// input vector as the query.
    Output,
}

/// Writes the config's checkpoint's `rows` to `out`: a `.npy` matrix (f32, one row per word,
/// most frequent first, as in the checkpoint's `vocab.txt`), word2vec binary for `.bin`,
/// farout's model with the n-gram rows for `.model` (input vectors only), else word2vec text;
/// returns the number of words.
pub fn export_checkpoint(config: &Config, out: &Path, rows: SkipGramRows) -> Result<usize, Error> {
    let sg = &config.model.skip_gram;
    let (vocab, subwords, emb, _) = load_checkpoint(&config.checkpoint_dir(), sg.dim, sg.ngrams())?;
    let npy = out.extension().is_some_and(|e| e == "npy");
    match rows {
        SkipGramRows::Input if npy => farout_data::npy::write_f32_matrix(out, &word_inputs(&subwords, &emb.input))?,
        SkipGramRows::Input => vectors(&vocab, &subwords, &emb.input)?.save(out, Format::from_path(out))?,
        SkipGramRows::Output if npy => farout_data::npy::write_f32_matrix(out, &emb.output)?,
        SkipGramRows::Output => match Format::from_path(out) {
            Format::Model => {
                return Err(Error::Option {
                    name: "out",
                    msg: "a .model file holds input vectors and their n-gram rows; write output vectors \
                          to .npy, .bin (word2vec binary) or a text file"
                        .into(),
                });
            }
            format => Vectors::of_vocab(&vocab, Cow::Borrowed(&emb.output))?.save(out, format)?,
        },
    }
    Ok(vocab.len())
}

/// What the two training phases share: progress display, the run's state, logs, evaluation
/// and checkpoints. Both callbacks of a training job hold it, hence the cells.
struct Session<'a> {
    config: &'a Config,
    vocab: &'a Vocab,
    /// Each word's input rows.
    subwords: &'a Subwords,
    bar: ProgressBar,
    start: Instant,
    base_seconds: f64,
    base_words: u64,
    /// Seconds spent evaluating and checkpointing (not training).
    eval_seconds: Cell<f64>,
    state: RefCell<State>,
    sinks: RefCell<Sinks>,
    last_loss: Cell<f64>,
    /// Held-out pairs for the full-softmax objective.
    heldout: Vec<(u32, u32)>,
    /// The objective on them at the last evaluation.
    last_heldout: Cell<Option<f64>>,
    /// Training seconds at which the next mid-epoch evaluation is due (`eval.every_seconds`).
    next_eval: Cell<f64>,
    /// Words at the last progress record (a report at the same position adds nothing to the log).
    last_record: Cell<Option<u64>>,
    /// Analogy and similarity after the last epoch (the summary reports them).
    last_eval: RefCell<Option<(Option<AnalogyReport>, Option<SimilarityReport>)>>,
    /// The first error of a callback (training stops; the error is returned).
    failure: RefCell<Option<Error>>,
}

impl<'a> Session<'a> {
    /// Opens the run's logs and progress bar and samples the held-out pairs.
    fn open(
        config: &'a Config,
        vocab: &'a Vocab,
        subwords: &'a Subwords,
        state: State,
        heldout: Option<&Path>,
        resume: bool,
    ) -> Result<Self, Error> {
        let sinks = Sinks::open(&config.log_dir(), &config.log, !resume)?;
        let bar = progress_bar(
            config.log.progress,
            vocab.train_tokens() * config.train.epochs as u64,
            "{prefix} [{elapsed_precise}] {bar:30.cyan/blue} {percent}% words, ETA {eta} | {msg}",
        );
        bar.set_prefix(format!("{} (skip-gram)", config.name));
        bar.set_position(state.words);
        let window = config.model.skip_gram.window;
        let heldout = match (heldout, config.eval.heldout_pairs) {
            (Some(p), n) if n > 0 => sample_pairs(p, &config.data.text, vocab, window, config.seed, n)?,
            _ => Vec::new(),
        };
        Ok(Session {
            config,
            vocab,
            subwords,
            bar,
            start: Instant::now(),
            base_seconds: state.train_seconds,
            base_words: state.words,
            eval_seconds: Cell::new(0.0),
            next_eval: Cell::new(state.train_seconds + config.eval.every_seconds),
            last_record: Cell::new(None),
            state: RefCell::new(state),
            sinks: RefCell::new(sinks),
            last_loss: Cell::new(f64::NAN),
            heldout,
            last_heldout: Cell::new(None),
            last_eval: RefCell::new(None),
            failure: RefCell::new(None),
        })
    }

    /// Epochs finished (before this run too).
    fn epochs_done(&self) -> usize {
        self.state.borrow().epochs_done
    }

    /// The run's summary; evaluates the final vectors if no epoch did, exports them to `export`.
    fn summary(
        &self,
        estimator: String,
        emb: &Embeddings,
        vocab_seconds: f64,
        export: Option<&Path>,
    ) -> Result<SkipGramSummary, Error> {
        let (config, vocab) = (self.config, self.vocab);
        let kept = self.kept()?;
        // The kept epoch's vectors and figures when it is not the last.
        let (emb, last_eval, heldout) = match &kept {
            Some((s, Some(best))) => (best, None, Some(s.best_heldout_objective)),
            _ => (emb, self.last_eval.take(), self.last_heldout.get()),
        };
        let (analogy, similarity) = match last_eval {
            Some(reports) => reports,
            None if self.wants_eval() => evaluate(config, &vectors(vocab, self.subwords, &emb.input)?)?,
            None => (None, None),
        };
        if let Some(p) = export {
            vectors(vocab, self.subwords, &emb.input)?.save(p, Format::from_path(p))?;
        }
        let state = self.state.borrow();
        Ok(SkipGramSummary {
            name: config.name.clone(),
            task: config.task(),
            estimator,
            vocab: vocab.len(),
            corpus_tokens: state.corpus_tokens,
            train_tokens: vocab.train_tokens(),
            epochs: state.epochs_done,
            words: state.words,
            pairs: state.pairs,
            train_seconds: state.train_seconds,
            vocab_seconds,
            words_per_second: state.words as f64 / state.train_seconds.max(1e-9),
            loss: self.last_loss.get(),
            heldout_objective: heldout,
            analogy: analogy.as_ref().map(AnalogyTotals::from),
            similarity,
            selection: kept.map(|(s, _)| s),
            vectors: export.map(Path::to_path_buf),
            log_dir: config.log_dir(),
        })
    }

    /// Whether the config names analogy or similarity files.
    fn wants_eval(&self) -> bool {
        self.config.eval.analogy.is_some() || self.config.eval.similarity.is_some()
    }

    fn train_seconds(&self) -> f64 {
        self.base_seconds + self.start.elapsed().as_secs_f64() - self.eval_seconds.get()
    }

    fn progress(&self, p: &Progress) {
        let rate = (p.words - self.base_words) as f64 / (self.train_seconds() - self.base_seconds).max(1e-9);
        self.bar.set_position(p.words);
        self.bar.set_message(format!("{:.0}k words/s, loss {:.4}, lr {:.5}", rate / 1e3, p.loss, p.lr));
        // The report closing an epoch repeats the position of the last one when that fell on the
        // epoch's last line: its window is empty.
        if self.last_record.replace(Some(p.words)) == Some(p.words) {
            return;
        }
        let values = [("train/loss", p.loss), ("train/lr", p.lr as f64), ("train/words_per_s", rate)];
        let r = self.sinks.borrow_mut().record(p.words, self.train_seconds(), &values);
        self.keep(r);
    }

    /// A minibatch trainer's progress report, with the held-out objective evaluated when
    /// `eval.every_seconds` of training have passed since the last evaluation.
    fn progress_and_eval(&self, p: &Progress, input: &Matrix, output: &Matrix) {
        self.progress(p);
        let (every, train_seconds) = (self.config.eval.every_seconds, self.train_seconds());
        // A report at the epoch's last word is followed by the epoch's own evaluation.
        let epoch_end = (p.epoch as u64 + 1) * self.vocab.train_tokens();
        let due = train_seconds >= self.next_eval.get();
        if every <= 0.0 || p.closes_epoch || p.words >= epoch_end || self.heldout.is_empty() || !due {
            return;
        }
        let t_eval = Instant::now();
        let obj = softmax_objective(input, output, &self.heldout);
        self.last_heldout.set(Some(obj));
        let epochs = self.epochs_at(p.words);
        let values = [("eval/heldout_objective", obj), ("eval/epoch", epochs)];
        let r = self.sinks.borrow_mut().record(p.words, train_seconds, &values);
        self.keep(r);
        log::info!("epoch {epochs:.3}: held-out objective {obj:.4}");
        self.eval_seconds.set(self.eval_seconds.get() + t_eval.elapsed().as_secs_f64());
        self.next_eval.set(self.train_seconds() + every);
    }

    /// Epochs that `words` corpus words stand for (a partial epoch counted by its words).
    fn epochs_at(&self, words: u64) -> f64 {
        words as f64 / self.vocab.train_tokens().max(1) as f64
    }

    /// `true` for `Ok`; the first error is kept for `train` to return (and training stops).
    fn keep(&self, r: Result<(), Error>) -> bool {
        match r {
            Ok(()) => true,
            Err(e) => {
                self.failure.borrow_mut().get_or_insert(e);
                false
            }
        }
    }

    /// Logs, evaluates and checkpoints after an epoch; `extra` writes phase-specific files.
    /// Returns whether training goes on.
    fn end_epoch(
        &self,
        s: &EpochStats,
        input: &Matrix,
        output: &Matrix,
        extra: impl FnOnce(&Path) -> Result<(), Error>,
    ) -> bool {
        let r = self.try_end_epoch(s, input, output, extra);
        self.keep(r) && self.failure.borrow().is_none()
    }

    fn try_end_epoch(
        &self,
        s: &EpochStats,
        input: &Matrix,
        output: &Matrix,
        extra: impl FnOnce(&Path) -> Result<(), Error>,
    ) -> Result<(), Error> {
        if s.pairs == 0 && !s.stopped {
            let corpus = self.config.data.corpus.clone().unwrap_or_else(|| self.config.log_dir().join("corpus.txt"));
            return Err(Error::DataMismatch {
                path: corpus,
                msg: format!(
                    "epoch {} trained no (context, centre) pair: after min_count and subsampling no sentence \
                     keeps two words; use a larger corpus, lower data.text.min_count or set data.text.subsample \
                     = \"none\"",
                    s.epoch + 1
                ),
            });
        }
        let t_eval = Instant::now();
        let train_seconds = self.train_seconds();
        {
            let mut st = self.state.borrow_mut();
            st.epochs_done = s.epoch + 1;
            st.words += s.words;
            st.pairs += s.pairs;
            st.train_seconds = train_seconds;
        }
        self.last_loss.set(s.loss);
        // Epochs so far, a partial one (stopped by a deadline) counted by its words.
        let epochs = self.epochs_at(self.state.borrow().words);
        let mut values = vec![("epoch/loss", s.loss), ("epoch/seconds", s.seconds), ("eval/epoch", epochs)];
        // The words' input vectors (composed with subwords), once for both evaluations.
        let inputs = (!self.heldout.is_empty() || self.wants_eval()).then(|| word_inputs(self.subwords, input));
        let mut line = format!("epoch {}: loss {:.4}, {:.0} words/s", s.epoch + 1, s.loss, s.words as f64 / s.seconds);
        let mut better = false;
        if let (false, Some(inputs)) = (self.heldout.is_empty(), &inputs) {
            let obj = softmax_objective(inputs, output, &self.heldout);
            values.push(("eval/heldout_objective", obj));
            line += &format!(", held-out objective {obj:.4}");
            self.last_heldout.set(Some(obj));
            better = self.improves(obj);
        }
        if let (true, Some(inputs)) = (self.wants_eval(), inputs) {
            let (a, sim) = evaluate(self.config, &vectors_of(self.vocab, self.subwords, inputs, input)?)?;
            if let Some(a) = &a {
                values.push(("eval/analogy", a.accuracy));
                line += &format!(", analogy {:.2}% of {}", 100.0 * a.accuracy, a.total.asked);
            }
            if let Some(sim) = &sim {
                values.push(("eval/similarity_spearman", sim.spearman));
                line += &format!(", similarity {:.3}", sim.spearman);
            }
            *self.last_eval.borrow_mut() = Some((a, sim));
        }
        let words = self.state.borrow().words;
        {
            let mut sinks = self.sinks.borrow_mut();
            sinks.record(words, train_seconds, &values)?;
            sinks.flush()?;
        }
        log::info!("{line}");
        if better {
            // The kept vectors, written whether or not checkpoints are: they are the model.
            self.write_vectors(&self.config.best_checkpoint_dir(), input, output, |_| Ok(()))?;
        }
        if self.config.checkpoint.enabled {
            self.write_vectors(&self.config.checkpoint_dir(), input, output, extra)?;
        }
        self.eval_seconds.set(self.eval_seconds.get() + t_eval.elapsed().as_secs_f64());
        self.next_eval.set(self.train_seconds() + self.config.eval.every_seconds);
        Ok(())
    }

    /// Writes a checkpoint of the vectors (vocabulary, both tables, `extra`'s files, the state)
    /// to `dir` atomically, after checking that they are finite.
    fn write_vectors(
        &self,
        dir: &Path,
        input: &Matrix,
        output: &Matrix,
        extra: impl FnOnce(&Path) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let words = self.state.borrow().words;
        for (name, m) in [("input.bin", input), ("output.bin", output)] {
            if let Err(e) = check_finite(&dir.join(name), "vectors", m.as_slice()) {
                let kept = format!("the previous checkpoint is kept at {}", dir.display());
                let why = format!("non-finite vectors ({e})");
                return Err(Error::Diverged { step: words, why, kept, keys: "model.skip_gram.lr".into() });
            }
        }
        replace_dir(dir, words, |tmp| {
            self.vocab.save(&tmp.join("vocab.txt"))?;
            write_f32_file(&tmp.join("input.bin"), input.as_slice())?;
            write_f32_file(&tmp.join("output.bin"), output.as_slice())?;
            extra(tmp)?;
            let json = serde_json::to_string_pretty(&*self.state.borrow()).expect("state serialises");
            std::fs::write(tmp.join("state.json"), json).map_err(io(tmp))
        })?;
        Ok(())
    }

    /// The error of a run stopped on request, at the end of the epoch it cut short (whose
    /// checkpoint, when checkpoints are on, continues the run at the next epoch).
    fn interrupted(&self) -> Error {
        let state = self.state.borrow();
        let kept = if self.config.checkpoint.enabled {
            format!(
                "the checkpoint in {} (after {} epochs, the last cut short) continues it (--resume)",
                self.config.checkpoint_dir().display(),
                state.epochs_done
            )
        } else {
            "checkpoint.enabled is false, so nothing continues it".into()
        };
        Error::Interrupted { step: state.words, unit: "words", kept }
    }

    /// What a training job returned, with a callback's error first and divergence explained.
    fn outcome<T>(&self, run: Result<T, farout_skipgram::Error>) -> Result<(), Error> {
        if let Some(e) = self.failure.borrow_mut().take() {
            return Err(e);
        }
        match run {
            Ok(_) => Ok(()),
            Err(farout_skipgram::Error::Diverged { words, .. }) => {
                let st = self.state.borrow();
                let kept = if st.epochs_done > 0 && self.config.checkpoint.enabled {
                    format!(
                        "the checkpoint of epoch {} is kept at {}",
                        st.epochs_done,
                        self.config.checkpoint_dir().display()
                    )
                } else {
                    "no checkpoint had been written yet".into()
                };
                let why = "non-finite vectors".into();
                Err(Error::Diverged { step: words, why, kept, keys: "model.skip_gram.lr".into() })
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Trains the config's skip-gram model (continuing from its checkpoint with `resume`) and
/// writes the input vectors to `export` (word2vec binary for `.bin`, else text).
///
/// `negative_sampling` trains lock-free over threads ([`farout_skipgram::sgns`]); every other
/// estimator trains on minibatches of pairs through the output layer
/// ([`farout_skipgram::batch`]), after `model.skip_gram.ns_warmup_epochs` epochs of negative
/// sampling (the LDGS paper starts search-based methods from one).
pub fn train(config: &Config, resume: bool, export: Option<&Path>) -> Result<SkipGramSummary, Error> {
    let log_dir = config.log_dir();
    std::fs::create_dir_all(&log_dir).map_err(io(&log_dir))?;
    let start = Start::open(config, resume)?;
    let Start { corpus, heldout, vocab, subwords, mut emb, state, vocab_seconds } = start;
    let session = Session::open(config, &vocab, &subwords, state, heldout.as_deref(), resume)?;
    let plan = Plan::of(config, session.state.borrow().train_seconds);
    let mut estimator = "negative_sampling".to_string();
    let stopped = train_negative_sampling(&session, &plan, &corpus, &mut emb)?;
    if !plan.ns_only && !stopped && session.epochs_done() < config.train.epochs {
        estimator = train_through_layer(&session, &plan, &corpus, resume, &mut emb)?;
    }
    if crate::stop::requested() {
        session.bar.abandon();
        return Err(session.interrupted());
    }
    session.bar.finish_and_clear();
    session.summary(estimator, &emb, vocab_seconds, export)
}

/// A run's starting point: the corpus, the vocabulary and the tables, counted and initialised
/// or read from the checkpoint.
struct Start {
    corpus: PathBuf,
    heldout: Option<PathBuf>,
    vocab: Vocab,
    subwords: Subwords,
    emb: Embeddings,
    state: State,
    vocab_seconds: f64,
}

impl Start {
    fn open(config: &Config, resume: bool) -> Result<Self, Error> {
        let sg = &config.model.skip_gram;
        // Before a corpus is written or read: the tables of the fewest words a run trains (two),
        // or of every word of a synthetic corpus.
        let fewest = if config.data.corpus.is_none() { config.data.synthetic.words } else { 2 };
        check_table_memory(config, fewest as u64)?;
        let (corpus, heldout) = corpus_paths(config)?;
        let t_vocab = Instant::now();
        let (vocab, subwords, emb, state) = if resume {
            let dir = config.checkpoint_dir();
            let (vocab, subwords, emb, state) = load_checkpoint(&dir, sg.dim, sg.ngrams())?;
            log::info!("resuming after epoch {} ({} words) from {}", state.epochs_done, state.words, dir.display());
            (vocab, subwords, emb, state)
        } else {
            let vocab = Vocab::build(&corpus, &config.data.text, threads(config))?;
            check_table_memory(config, vocab.len() as u64)?;
            let subwords = Subwords::new(vocab.words(), sg.ngrams());
            let rows = subwords.table_rows();
            let emb = Embeddings::init(rows, vocab.len(), sg.dim, sg.init_range, config.seed);
            let ngrams = sg.ngrams().enabled().then_some(sg.ngrams());
            let state = State { corpus_tokens: vocab.corpus_tokens, ngrams, ..State::default() };
            (vocab, subwords, emb, state)
        };
        let vocab_seconds = t_vocab.elapsed().as_secs_f64();
        if vocab.len() < 2 {
            return Err(Error::DataMismatch {
                path: corpus,
                msg: format!(
                    "{} word(s) occur at least data.text.min_count = {} times; skip-gram needs two or more",
                    vocab.len(),
                    config.data.text.min_count
                ),
            });
        }
        if !resume {
            log::info!(
                "vocabulary: {} words (min_count {}), {} of {} tokens, {:.1} s",
                vocab.len(),
                config.data.text.min_count,
                vocab.train_tokens(),
                vocab.corpus_tokens,
                vocab_seconds
            );
            if vocab.skipped_lines > 0 {
                log::warn!("skipped {} line(s) that are not valid UTF-8", vocab.skipped_lines);
            }
        }
        Ok(Self { corpus, heldout, vocab, subwords, emb, state, vocab_seconds })
    }
}

/// An error, before they are allocated, if the input and output tables of `n_words` words and
/// the n-gram rows (`model.skip_gram.buckets`, when subwords are on) do not fit in memory.
fn check_table_memory(config: &Config, n_words: u64) -> Result<(), Error> {
    let sg = &config.model.skip_gram;
    let ngrams = sg.ngrams();
    let buckets = if ngrams.enabled() { ngrams.buckets as u64 } else { 0 };
    let rows = n_words.saturating_mul(2).saturating_add(buckets);
    let bytes = farout_core::resources::array_bytes(&[rows, sg.dim as u64], 4);
    let what =
        format!("the skip-gram tables ({n_words} words in and out, {buckets} n-gram rows, dimension {})", sg.dim);
    let change = "lower model.skip_gram.dim or model.skip_gram.buckets (or data.synthetic.words)";
    Ok(farout_core::resources::check_memory(bytes, what, change)?)
}

/// Training threads: `train.threads`, or every core.
fn threads(config: &Config) -> usize {
    if config.train.threads > 0 {
        config.train.threads
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// How the run's epochs split between its two phases, and when it must stop.
struct Plan {
    /// Negative sampling: the whole run's estimator, or the other estimators' warm-up (word2vec's
    /// unigram^0.75 noise and 5 negatives unless the config sets them).
    ns: NegativeSamplingConfig,
    /// Negative sampling is the run's estimator.
    ns_only: bool,
    /// Epochs of negative sampling.
    ns_epochs: usize,
    /// `train.max_seconds` from now (the seconds trained before a resume count).
    deadline: Option<Instant>,
}

impl Plan {
    fn of(config: &Config, trained_seconds: f64) -> Self {
        let ns = config.output.estimator.negative_sampling().cloned();
        let ns_only = ns.is_some();
        let epochs = config.train.epochs;
        let ns_epochs = if ns_only { epochs } else { config.model.skip_gram.ns_warmup_epochs.min(epochs) };
        let max = config.train.max_seconds;
        let deadline =
            (max > 0.0).then(|| Instant::now() + std::time::Duration::from_secs_f64((max - trained_seconds).max(0.0)));
        Self { ns: ns.unwrap_or_default(), ns_only, ns_epochs, deadline }
    }
}

/// Phase 1: negative sampling, lock-free over threads, up to the plan's NS epochs. Returns
/// whether the deadline stopped it.
fn train_negative_sampling(session: &Session, plan: &Plan, corpus: &Path, emb: &mut Embeddings) -> Result<bool, Error> {
    if session.epochs_done() >= plan.ns_epochs {
        return Ok(false);
    }
    let config = session.config;
    let weights: Vec<f64> = session.vocab.counts().iter().map(|&n| (n as f64).powf(plan.ns.alpha)).collect();
    let noise = AliasTable::new(&weights).expect("counts are positive");
    let job = NsJob {
        corpus,
        spec: &config.data.text,
        vocab: session.vocab,
        config: &config.model.skip_gram,
        negatives: if plan.ns.n_samples > 0 { plan.ns.n_samples } else { DEFAULT_NEGATIVES },
        noise: &noise,
        threads: threads(config),
        seed: config.seed,
        epochs: plan.ns_epochs,
        deadline: plan.deadline,
        subwords: session.subwords.spec().enabled().then_some(session.subwords),
    };
    let mut stopped = false;
    let run = job.run(emb, session.epochs_done(), &mut |p| session.progress(p), &mut |s, e| {
        stopped |= s.stopped;
        Ok(session.end_epoch(s, &e.input, &e.output, |_| Ok(())))
    });
    session.outcome(run)?;
    Ok(stopped)
}

/// The output layer of phase 2 (the output vectors, or on resume the checkpoint's layer), its
/// estimator and index (on resume the checkpoint's, when it has one), and the input table with
/// its optimiser state (restored on resume): `k` words, `counts` their frequencies for
/// proposals that need them.
fn open_layer(
    config: &Config,
    k: usize,
    counts: &dyn Fn() -> Vec<u64>,
    resume: bool,
    emb: &mut Embeddings,
) -> Result<(OutputLayer, farout_estimators::Built, InputTable), Error> {
    let (sg, out, ck_dir) = (&config.model.skip_gram, &config.output, config.checkpoint_dir());
    let mut layer = OutputLayer::new(k, sg.dim, &out.layer, &out.optimizer, config.seed)?;
    let layer_file = ck_dir.join("layer.bin");
    if resume && layer_file.exists() {
        layer.load(&layer_file)?;
    } else {
        layer.set_weights(emb.output.clone())?;
    }
    let problem = farout_estimators::Problem { n_classes: k, n_data: k, dim: sg.dim, label_counts: counts };
    let built = crate::estimators::build(config, &problem)?.built;
    crate::estimators::attach_index(&mut layer, &built, config, k, 1)?;
    if resume && layer_file.exists() {
        layer.load_index(&ck_dir)?;
    }
    let mut input = InputTable { vectors: std::mem::take(&mut emb.input), optimizer: out.optimizer.build(k, sg.dim) };
    let accum_file = ck_dir.join("input_optimizer.bin");
    if resume && accum_file.exists() {
        read_f32_file(&accum_file, input.optimizer.accum_mut())?;
        input.optimizer.set_step(layer.step());
    }
    Ok((layer, built, input))
}

/// The corpus's (context, centre) pairs counted once for the collapsed objective (eq. 9).
fn count_cooccurrences(config: &Config, corpus: &Path, vocab: &Vocab) -> Result<Cooccurrence, Error> {
    let t0 = Instant::now();
    let window = config.model.skip_gram.window;
    let cooc = Cooccurrence::count(corpus, &config.data.text, vocab, window, config.seed, threads(config))?;
    log::info!(
        "co-occurrences: {} pairs, {} distinct, {:.0} MB, {:.1} s",
        cooc.pairs,
        cooc.distinct(),
        cooc.bytes() as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    Ok(cooc)
}

/// Phase 2: the configured estimator on minibatches through the output layer, per pair or on
/// the collapsed objective. Returns the estimator's name as the summary reports it.
fn train_through_layer(
    session: &Session,
    plan: &Plan,
    corpus: &Path,
    resume: bool,
    emb: &mut Embeddings,
) -> Result<String, Error> {
    let (config, vocab) = (session.config, session.vocab);
    let sg = &config.model.skip_gram;
    let (mut layer, built, mut input) = open_layer(config, vocab.len(), &|| vocab.counts().to_vec(), resume, emb)?;
    let mut on_epoch = |s: &EpochStats, input: &InputTable, layer: &OutputLayer| {
        Ok(session.end_epoch(s, &input.vectors, layer.weights(), |tmp| {
            layer.save(&tmp.join("layer.bin"))?;
            layer.save_index(tmp)?;
            write_f32_file(&tmp.join("input_optimizer.bin"), input.optimizer.accum())
        }))
    };
    let mut progress = |p: &Progress, input: &InputTable, layer: &OutputLayer| {
        session.progress_and_eval(p, &input.vectors, layer.weights())
    };
    let (epochs, done) = (config.train.epochs, session.epochs_done());
    let (name, run) = match sg.objective {
        Objective::Pairs => {
            let job = BatchJob {
                corpus,
                spec: &config.data.text,
                vocab,
                config: sg,
                batch_size: config.train.batch_size,
                seed: config.seed,
                epochs,
                deadline: plan.deadline,
            };
            let run = job.run(&mut input, &mut layer, built.estimator.as_ref(), done, &mut progress, &mut on_epoch);
            (built.estimator.name().to_string(), run)
        }
        Objective::Collapsed => {
            let cooc = count_cooccurrences(config, corpus, vocab)?;
            // The exact softmax is GD; any other softmax estimator estimates its part.
            let (name, softmax) = if built.exact {
                ("gd".to_string(), SoftmaxPart::Exact)
            } else {
                (format!("gd_{}", built.estimator.name()), SoftmaxPart::Estimated(built.estimator.as_ref()))
            };
            let job = GdJob {
                cooc: &cooc,
                batch_size: config.train.batch_size,
                seed: config.seed,
                epochs,
                updates: sg.updates,
                deadline: plan.deadline,
                epoch_words: vocab.train_tokens(),
            };
            (name, job.run(&mut input, &mut layer, softmax, done, &mut progress, &mut on_epoch))
        }
    };
    *emb = Embeddings { input: input.vectors, output: layer.weights().clone() };
    session.outcome(run)?;
    Ok(name)
}
