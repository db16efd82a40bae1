//! Skip-gram word embeddings from a config (`model.encoder = "skip_gram"`, `data.format =
//! "text"`): vocabulary, negative-sampling epochs with a progress bar (words/s, loss, ETA),
//! TensorBoard and JSONL logs, evaluation and a checkpoint after each epoch, resume, export.
//!
//! The checkpoint directory holds `vocab.txt`, `input.bin` and `output.bin` (both tables, so a
//! resumed run keeps the output vectors) and `state.json`; the step size continues from where
//! the schedule stopped because it is a function of the words read.

use crate::Error;
use crate::checkpoint::{read_f32_file, replace_dir, write_f32_file};
use crate::config::Config;
use crate::log::{JsonlSink, MetricsSink, Sinks, TensorBoardSink};
use farout_core::AliasTable;
use farout_data::corpus::Vocab;
use farout_skipgram::eval::{self, AnalogyReport, SimilarityReport};
use farout_skipgram::sgns::{EpochStats, NsJob, Progress};
use farout_skipgram::vectors::{Format, Vectors};
use farout_skipgram::{Embeddings, SkipGramConfig};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

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
    /// Mean pair loss of the last epoch.
    pub loss: f64,
    /// Analogy evaluation of the final vectors (`eval.analogy`).
    pub analogy: Option<AnalogyTotals>,
    /// Similarity evaluation of the final vectors (`eval.similarity`).
    pub similarity: Option<SimilarityReport>,
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

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}

/// The input vectors with their words.
pub fn vectors(vocab: &Vocab, emb: &Embeddings) -> Result<Vectors, Error> {
    Ok(Vectors::new(vocab.words().to_vec(), emb.input.clone())?)
}

/// Evaluates `v` on the config's analogy and similarity files (those it names).
pub fn evaluate(config: &Config, v: &Vectors) -> Result<(Option<AnalogyReport>, Option<SimilarityReport>), Error> {
    let e = &config.eval;
    let analogy = e.analogy.as_ref().map(|p| eval::analogy(v, p, e.analogy_restrict)).transpose()?;
    let similarity = e.similarity.as_ref().map(|p| eval::similarity(v, p)).transpose()?;
    Ok((analogy, similarity))
}

fn save_checkpoint(dir: &Path, vocab: &Vocab, emb: &Embeddings, state: &State) -> Result<PathBuf, Error> {
    replace_dir(dir, |tmp| {
        vocab.save(&tmp.join("vocab.txt"))?;
        write_f32_file(&tmp.join("input.bin"), emb.input.as_slice())?;
        write_f32_file(&tmp.join("output.bin"), emb.output.as_slice())?;
        let json = serde_json::to_string_pretty(state).expect("state serialises");
        std::fs::write(tmp.join("state.json"), json).map_err(io(tmp))
    })
}

fn load_checkpoint(dir: &Path, dim: usize) -> Result<(Vocab, Embeddings, State), Error> {
    let state_path = dir.join("state.json");
    let text = std::fs::read_to_string(&state_path).map_err(io(&state_path))?;
    let state: State = serde_json::from_str(&text)
        .map_err(|e| Error::Mismatch(format!("{}: not a skip-gram checkpoint state: {e}", state_path.display())))?;
    let vocab = Vocab::load(&dir.join("vocab.txt"))?;
    let mut emb = Embeddings::init(vocab.len(), dim, 0);
    read_f32_file(&dir.join("input.bin"), emb.input.as_mut_slice())?;
    read_f32_file(&dir.join("output.bin"), emb.output.as_mut_slice())?;
    Ok((vocab, emb, state))
}

/// `data.corpus`, or the synthetic corpus of `[data.synthetic]` in the log directory (written
/// unless it is there already with the same parameters).
pub fn corpus_path(config: &Config) -> Result<PathBuf, Error> {
    if let Some(p) = &config.data.corpus {
        return Ok(p.clone());
    }
    let dir = config.log_dir();
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let (path, spec_path) = (dir.join("corpus.txt"), dir.join("corpus.json"));
    let spec = serde_json::to_string_pretty(&config.data.synthetic).expect("spec serialises");
    if path.exists() && std::fs::read_to_string(&spec_path).is_ok_and(|s| s == spec) {
        return Ok(path);
    }
    let _ = std::fs::remove_file(&spec_path);
    let bar = if config.log.progress {
        ProgressBar::new(config.data.synthetic.tokens)
    } else {
        ProgressBar::with_draw_target(Some(config.data.synthetic.tokens), ProgressDrawTarget::hidden())
    };
    bar.set_style(
        ProgressStyle::with_template("synthetic corpus [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} tokens")
            .expect("static template"),
    );
    config.data.synthetic.write(&path, &|n| bar.set_position(n))?;
    bar.finish_and_clear();
    std::fs::write(&spec_path, spec).map_err(io(&spec_path))?;
    eprintln!("wrote a synthetic corpus of {} tokens to {}", config.data.synthetic.tokens, path.display());
    Ok(path)
}

/// Writes the input vectors of the config's checkpoint to `out` (word2vec binary for `.bin`,
/// else text); returns the number of words.
pub fn export_checkpoint(config: &Config, out: &Path) -> Result<usize, Error> {
    let (vocab, emb, _) = load_checkpoint(&config.checkpoint_dir(), config.model.skip_gram.dim)?;
    vectors(&vocab, &emb)?.save(out, Format::from_path(out))?;
    Ok(vocab.len())
}

/// Trains the config's skip-gram model (continuing from its checkpoint with `resume`) and
/// writes the input vectors to `export` (word2vec binary for `.bin`, else text).
pub fn train(config: &Config, resume: bool, export: Option<&Path>) -> Result<SkipGramSummary, Error> {
    let sg: &SkipGramConfig = &config.model.skip_gram;
    let threads = if config.train.threads > 0 {
        config.train.threads
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    };
    let log_dir = config.log_dir();
    std::fs::create_dir_all(&log_dir).map_err(io(&log_dir))?;
    let ck_dir = config.checkpoint_dir();
    let corpus = &corpus_path(config)?;
    let t_vocab = Instant::now();
    let (vocab, mut emb, mut state) = if resume {
        let (vocab, emb, state) = load_checkpoint(&ck_dir, sg.dim)?;
        eprintln!("resuming after epoch {} ({} words) from {}", state.epochs_done, state.words, ck_dir.display());
        (vocab, emb, state)
    } else {
        let vocab = Vocab::build(corpus, &config.data.text, threads)?;
        let emb = Embeddings::init(vocab.len(), sg.dim, config.seed);
        let state = State { corpus_tokens: vocab.corpus_tokens, ..State::default() };
        (vocab, emb, state)
    };
    let vocab_seconds = t_vocab.elapsed().as_secs_f64();
    if vocab.len() < 2 {
        return Err(Error::Mismatch(format!(
            "{}: {} word(s) occur at least data.text.min_count = {} times; skip-gram needs two or more",
            corpus.display(),
            vocab.len(),
            config.data.text.min_count
        )));
    }
    if !resume {
        eprintln!(
            "vocabulary: {} words (min_count {}), {} of {} tokens, {:.1} s",
            vocab.len(),
            config.data.text.min_count,
            vocab.train_tokens(),
            vocab.corpus_tokens,
            vocab_seconds
        );
        if vocab.skipped_lines > 0 {
            eprintln!("skipped {} line(s) that are not valid UTF-8", vocab.skipped_lines);
        }
    }
    let weights: Vec<f64> = vocab.counts().iter().map(|&n| (n as f64).powf(config.output.alpha)).collect();
    let noise = AliasTable::new(&weights).expect("counts are positive");
    let negatives = if config.output.n_samples > 0 { config.output.n_samples } else { DEFAULT_NEGATIVES };
    let remaining = (config.train.max_seconds > 0.0).then(|| (config.train.max_seconds - state.train_seconds).max(0.0));
    let job = NsJob {
        corpus,
        spec: &config.data.text,
        vocab: &vocab,
        config: sg,
        negatives,
        noise: &noise,
        threads,
        seed: config.seed,
        epochs: config.train.epochs,
        deadline: remaining.map(|s| Instant::now() + std::time::Duration::from_secs_f64(s)),
    };

    let mut sinks = Sinks::default();
    if config.log.jsonl {
        sinks.0.push(Box::new(JsonlSink::open(&log_dir.join("metrics.jsonl"))?));
    }
    if config.log.tensorboard {
        sinks.0.push(Box::new(TensorBoardSink::open(&log_dir.join("tb"))?));
    }
    let total_words = vocab.train_tokens() * config.train.epochs as u64;
    let bar = if config.log.progress {
        ProgressBar::new(total_words)
    } else {
        ProgressBar::with_draw_target(Some(total_words), ProgressDrawTarget::hidden())
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] {bar:30.cyan/blue} {percent}% words, ETA {eta} | {msg}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    bar.set_prefix(format!("{} (skip-gram, negative_sampling)", config.name));
    bar.set_position(state.words);

    // Progress comes from a training thread; records wait here for the main thread's sinks.
    let pending: Mutex<Vec<(u64, f64, [f64; 3])>> = Mutex::new(Vec::new());
    let start = Instant::now();
    let base_seconds = state.train_seconds;
    let base_words = state.words;
    let on_progress = |p: &Progress| {
        let secs = start.elapsed().as_secs_f64();
        let rate = (p.words - base_words) as f64 / secs.max(1e-9);
        bar.set_position(p.words);
        bar.set_message(format!("{:.0}k words/s, loss {:.4}, lr {:.5}", rate / 1e3, p.loss, p.lr));
        pending.lock().expect("pending lock").push((p.words, base_seconds + secs, [p.loss, p.lr as f64, rate]));
    };
    let mut eval_seconds = 0.0;
    let mut last_loss = f64::NAN;
    let mut failure: Option<Error> = None;
    let start_epoch = state.epochs_done;
    let mut on_epoch = |s: &EpochStats, emb: &Embeddings| -> Result<bool, farout_skipgram::Error> {
        let result = (|| -> Result<(), Error> {
            for (words, wall, [loss, lr, rate]) in pending.lock().expect("pending lock").drain(..) {
                sinks.record(words, wall, &[("train/loss", loss), ("train/lr", lr), ("train/words_per_s", rate)])?;
            }
            state.epochs_done = s.epoch + 1;
            state.words += s.words;
            state.pairs += s.pairs;
            state.train_seconds = base_seconds + start.elapsed().as_secs_f64() - eval_seconds;
            last_loss = s.loss;
            let t_eval = Instant::now();
            let mut values = vec![("epoch/loss", s.loss), ("epoch/seconds", s.seconds)];
            let mut line =
                format!("epoch {}: loss {:.4}, {:.0} words/s", s.epoch + 1, s.loss, s.words as f64 / s.seconds);
            if config.eval.analogy.is_some() || config.eval.similarity.is_some() {
                let (a, sim) = evaluate(config, &vectors(&vocab, emb)?)?;
                if let Some(a) = a {
                    values.push(("eval/analogy", a.accuracy));
                    line += &format!(", analogy {:.2}% of {}", 100.0 * a.accuracy, a.total.asked);
                }
                if let Some(sim) = sim {
                    values.push(("eval/similarity_spearman", sim.spearman));
                    line += &format!(", similarity {:.3}", sim.spearman);
                }
            }
            sinks.record(state.words, state.train_seconds, &values)?;
            sinks.flush()?;
            bar.println(line);
            if config.checkpoint.enabled {
                save_checkpoint(&ck_dir, &vocab, emb, &state)?;
            }
            eval_seconds += t_eval.elapsed().as_secs_f64();
            Ok(())
        })();
        // Stop training on a failed evaluation or checkpoint; the error is returned below.
        Ok(result.map_err(|e| failure = Some(e)).is_ok())
    };
    let run = job.run(&mut emb, start_epoch, &on_progress, &mut on_epoch);
    bar.finish_and_clear();
    if let Some(e) = failure {
        return Err(e);
    }
    match run {
        Err(farout_skipgram::Error::Diverged { words, .. }) => {
            let kept = if state.epochs_done > 0 && config.checkpoint.enabled {
                format!("the checkpoint of epoch {} is kept at {}", state.epochs_done, ck_dir.display())
            } else {
                "no checkpoint had been written yet; lower model.skip_gram.lr".into()
            };
            return Err(Error::Diverged { step: words, loss: f64::NAN, kept });
        }
        Err(e) => return Err(e.into()),
        Ok(_) => {}
    }
    let v = vectors(&vocab, &emb)?;
    let (analogy, similarity) = evaluate(config, &v)?;
    if let Some(p) = export {
        v.save(p, Format::from_path(p))?;
    }
    Ok(SkipGramSummary {
        name: config.name.clone(),
        task: config.task(),
        estimator: "negative_sampling".into(),
        vocab: vocab.len(),
        corpus_tokens: state.corpus_tokens,
        train_tokens: vocab.train_tokens(),
        epochs: state.epochs_done,
        words: state.words,
        pairs: state.pairs,
        train_seconds: state.train_seconds,
        vocab_seconds,
        words_per_second: state.words as f64 / state.train_seconds.max(1e-9),
        loss: last_loss,
        analogy: analogy.as_ref().map(AnalogyTotals::from),
        similarity,
        vectors: export.map(Path::to_path_buf),
        log_dir,
    })
}
