//! Skip-gram with negative sampling (Mikolov et al. 2013b), trained word2vec-style: the corpus is
//! cut into byte ranges at line starts (64 per thread), the threads take them in file order and
//! stream them, and update the shared tables lock-free per (context, centre) pair. Taking small
//! ranges in order (rather than one half of the file per thread) keeps the threads on nearby
//! text, as word2vec's and gensim's job queues do, which matters on sorted corpora such as a
//! dictionary (see docs/decisions.md, "skipgram-file-ranges").
//!
//! For a centre word `w_t` and each context word `c` within a window `b ~ U{1..window}` of it,
//! with input vector `u = U[c]` and output vectors `v_k = V[k]`, the pair's loss is
//!
//! `l = -log s(u . v_{w_t}) - sum_{j=1..n} log s(-u . v_{k_j})`, `k_j ~ unigram^alpha`
//!
//! (`s` the logistic function). One SGD step with step size `lr`: for each target `k` with label
//! `y` (1 for the centre, 0 for a negative), `g = lr (y - s(u . v_k))`, `e += g v_k`,
//! `v_k += g u`; then `u += e`. Negatives equal to the centre are skipped, as word2vec does.
//! The step size falls linearly from `lr` to `min_lr` over all the words of all epochs.
//!
//! CBOW (`mode = "cbow"`, Mikolov et al. 2013a) takes one step per centre word instead: the
//! input is the mean `h = (1/|C|) sum_{c in C} U[c]` of the window's input vectors, the loss is
//! the pair loss above with `u = h`, and after the targets' steps every context word gets
//! `U[c] += e`, the whole error as in word2vec's and fastText's CBOW (not divided by |C|).
//!
//! With subwords ([`crate::subwords`]) a word's input vector is the mean of its rows (its own
//! and its n-grams'): skip-gram's `u` is that mean for the context word, CBOW's `h` the mean of
//! all the rows of all the window's words, and the step `e` is added to every one of those
//! rows, as fastText does.
//!
//! Each step draws its negatives before it computes anything and asks the CPU to fetch their
//! output rows (and the centre's) at once, so that the cache misses of rows scattered over a
//! large table overlap instead of following one another; the draws are the same as one by one
//! (see docs/decisions.md, "skipgram-output-prefetch"). Skip-gram goes one pair further: a
//! sentence's pairs are listed first (their windows drawn), then each pair's rows are requested
//! while the pair before it trains (docs/decisions.md, "skipgram-pair-pipeline").

use crate::hogwild::{AtomicRows, HogwildRows, RacyRows};
use crate::pairs::{for_each_pair, for_each_window, subsample};
use crate::subwords::Subwords;
use crate::{Embeddings, Error, Hogwild, Mode, REPORT_INTERVAL, SkipGramConfig};
use farout_core::{AliasTable, Rng, rng};
use farout_data::corpus::{TextSpec, Vocab, for_each_line, split_lines};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// Words a thread processes between updates of the shared word count (step size, progress).
const REPORT_EVERY: u64 = 10_000;
/// The corpus is cut into this many chunks per thread; threads take them in order.
const CHUNKS_PER_THREAD: usize = 64;
/// How often the calling thread looks at the workers, and reports progress.
const POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// One negative-sampling run over a corpus.
pub struct NsJob<'a> {
    /// The corpus (one sentence per line).
    pub corpus: &'a Path,
    /// How it is tokenised.
    pub spec: &'a TextSpec,
    /// Its vocabulary.
    pub vocab: &'a Vocab,
    /// Model parameters.
    pub config: &'a SkipGramConfig,
    /// Negatives per pair.
    pub negatives: usize,
    /// The noise distribution (unigram^alpha).
    pub noise: &'a AliasTable,
    /// Threads (they take the corpus's ranges in turn).
    pub threads: usize,
    /// Seed of subsampling, windows and negatives.
    pub seed: u64,
    /// Epochs of the whole schedule (the step size reaches `min_lr` at their end).
    pub epochs: usize,
    /// Stop when this instant passes (equal-time comparisons).
    pub deadline: Option<Instant>,
    /// The words' input rows when they have n-grams (the input table then has the buckets'
    /// rows after the words'); `None`: one row per word.
    pub subwords: Option<&'a Subwords>,
}

/// What the progress callback sees.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Progress {
    /// Current epoch (0-based).
    pub epoch: usize,
    /// Vocabulary words read so far over all epochs (before subsampling).
    pub words: u64,
    /// Words of the whole schedule.
    pub total_words: u64,
    /// Mean pair loss since the last report, or that report's loss when no pair was sampled
    /// since. Reports during training wait for the first sampled pair, so the loss is NaN only
    /// when the loss itself diverged or an epoch's closing report comes before any pair.
    pub loss: f64,
    /// Current step size.
    pub lr: f32,
    /// The last report of an epoch (the epoch's evaluation follows).
    pub closes_epoch: bool,
}

/// What an epoch did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EpochStats {
    /// The epoch (0-based).
    pub epoch: usize,
    /// Vocabulary words read (before subsampling).
    pub words: u64,
    /// (context, centre) pairs trained.
    pub pairs: u64,
    /// Mean pair loss (estimated on a sample of the pairs).
    pub loss: f64,
    /// Seconds the epoch took.
    pub seconds: f64,
    /// Whether the deadline (or a stop request) ended it early.
    pub stopped: bool,
}

/// State shared by the threads of one epoch.
struct Shared {
    words: AtomicU64,
    pairs: AtomicU64,
    loss: Mutex<(f64, u64)>,
    window_loss: Mutex<(f64, u64)>,
    stop: AtomicBool,
}

impl Shared {
    /// Adds what a thread did since its last flush (`words` read, and the pairs and loss in
    /// `s`, which are reset) to the epoch's counts; returns the words read so far by all
    /// threads and the loss added.
    fn flush(&self, words: u64, s: &mut Scratch) -> (u64, f64) {
        let done = self.words.fetch_add(words, Ordering::Relaxed) + words;
        self.pairs.fetch_add(std::mem::take(&mut s.pairs), Ordering::Relaxed);
        let (l, n) = (std::mem::take(&mut s.loss), std::mem::take(&mut s.loss_n));
        for m in [&self.loss, &self.window_loss] {
            let mut g = m.lock().expect("loss lock");
            g.0 += l;
            g.1 += n;
        }
        (done, l)
    }

    /// The mean pair loss flushed since the last call, or `None` when no pair was sampled since.
    fn take_window_loss(&self) -> Option<f64> {
        let (l, n) = std::mem::take(&mut *self.window_loss.lock().expect("loss lock"));
        (n > 0).then(|| l / n as f64)
    }
}

/// What the threads of one epoch share: the tables, the counts, the corpus' chunks and the
/// next chunk to take.
struct EpochWork<'a, R> {
    epoch: usize,
    /// Words of the whole schedule (for the learning rate).
    total_words: u64,
    input: &'a R,
    output: &'a R,
    shared: &'a Shared,
    /// Each word's probability of being kept by subsampling.
    keep: &'a [f32],
    chunks: &'a [std::ops::Range<u64>],
    next_chunk: &'a AtomicUsize,
}

/// Per-thread buffers: nothing allocates per pair.
struct Scratch {
    sentence: Vec<u32>,
    /// The centre and the negatives of one step.
    targets: Vec<u32>,
    /// Those of the next skip-gram pair (drawn ahead, see `train_pairs`).
    next_targets: Vec<u32>,
    /// The noise-table draws of the pair after it.
    columns: Vec<(u32, f32)>,
    /// A sentence's (context, centre) pairs.
    sentence_pairs: Vec<(u32, u32)>,
    /// The input rows of one step.
    rows: Vec<u32>,
    l1: Vec<f32>,
    err: Vec<f32>,
    loss: f64,
    loss_n: u64,
    pairs: u64,
}

impl NsJob<'_> {
    /// Trains epochs `start_epoch..self.epochs` on worker threads while the calling thread
    /// calls `progress` twice a second; `epoch_end` sees the tables after each epoch (return
    /// `false` to stop).
    pub fn run(
        &self,
        emb: &mut Embeddings,
        start_epoch: usize,
        progress: &mut dyn FnMut(&Progress),
        epoch_end: &mut dyn FnMut(&EpochStats, &Embeddings) -> Result<bool, Error>,
    ) -> Result<Vec<EpochStats>, Error> {
        match self.config.hogwild {
            Hogwild::Racy => self.run_with::<RacyRows>(emb, start_epoch, progress, epoch_end),
            Hogwild::Atomic => self.run_with::<AtomicRows>(emb, start_epoch, progress, epoch_end),
        }
    }

    fn run_with<R: HogwildRows>(
        &self,
        emb: &mut Embeddings,
        start_epoch: usize,
        progress: &mut dyn FnMut(&Progress),
        epoch_end: &mut dyn FnMut(&EpochStats, &Embeddings) -> Result<bool, Error>,
    ) -> Result<Vec<EpochStats>, Error> {
        if self.negatives == 0 {
            return Err(
                farout_core::ParamError::message("output.n_samples", "negative sampling needs >= 1 negative").into()
            );
        }
        let chunks = split_lines(self.corpus, self.threads.max(1) * CHUNKS_PER_THREAD)?;
        let keep = self.vocab.keep_probs(self.spec.subsample, self.spec.t);
        let epoch_words = self.vocab.train_tokens();
        let total_words = epoch_words * self.epochs as u64;
        let mut all = Vec::new();
        if start_epoch >= self.epochs {
            return Ok(all);
        }
        // The loss of the latest report: a report with no pair sampled since the one before
        // (the reporting thread can wake between two flushes of a loaded machine) repeats it
        // rather than saying NaN.
        let mut last_loss = f64::NAN;
        for epoch in start_epoch..self.epochs {
            // The tables are shared by the threads during the epoch, in their own memory (no
            // copy where the layout allows, see `hogwild`), and handed back after it.
            let input = R::from_matrix(std::mem::take(&mut emb.input));
            let output = R::from_matrix(std::mem::take(&mut emb.output));
            let shared = Shared {
                words: AtomicU64::new(epoch_words * epoch as u64),
                pairs: AtomicU64::new(0),
                loss: Mutex::new((0.0, 0)),
                window_loss: Mutex::new((0.0, 0)),
                stop: AtomicBool::new(false),
            };
            let t0 = Instant::now();
            let next_chunk = AtomicUsize::new(0);
            let work = EpochWork {
                epoch,
                total_words,
                input: &input,
                output: &output,
                shared: &shared,
                keep: &keep,
                chunks: &chunks,
                next_chunk: &next_chunk,
            };
            let results: Vec<Result<(), Error>> = std::thread::scope(|s| {
                let work = &work;
                let handles: Vec<_> =
                    (0..self.threads.max(1)).map(|_| s.spawn(move || self.train_chunks(work))).collect();
                // This thread reports progress while the workers train.
                self.report_while_training(&handles, work, &mut last_loss, progress);
                handles.into_iter().map(|h| h.join().expect("training thread panicked")).collect()
            });
            *emb = Embeddings { input: input.into_matrix(), output: output.into_matrix() };
            self.report_epoch_end(&shared, epoch, total_words, &mut last_loss, progress);
            for r in results {
                r?;
            }
            let stats = self.epoch_stats(&shared, epoch, epoch_words, t0);
            all.push(stats);
            if !epoch_end(&stats, emb)? || stats.stopped {
                break;
            }
        }
        Ok(all)
    }

    /// One worker thread of an epoch: trains on the sentences of chunk after chunk until none
    /// is left or the run stops; flushes its counts every `REPORT_EVERY` words, stopping the
    /// run on a non-finite loss (divergence), past the deadline or on a stop request
    /// ([`farout_core::stop`]).
    fn train_chunks<R: HogwildRows>(&self, work: &EpochWork<R>) -> Result<(), Error> {
        let (epoch, total_words, shared, chunks) = (work.epoch, work.total_words, work.shared, work.chunks);
        let (input, output, keep) = (work.input, work.output, work.keep);
        let mut scratch = Scratch::new(self.config.dim);
        let mut unreported = 0u64;
        let mut result = Ok(());
        // Chunks are taken in file order, so the threads move through the
        // corpus side by side (as word2vec's and gensim's job queues do).
        while !shared.stop.load(Ordering::Relaxed) {
            let c = work.next_chunk.fetch_add(1, Ordering::Relaxed);
            let Some(range) = chunks.get(c) else { break };
            // Randomness per chunk: with one thread a run is reproducible.
            let mut rng = rng::seeded(self.seed, (epoch * chunks.len() + c) as u64);
            for_each_line(
                self.corpus,
                range.clone(),
                self.spec.lowercase,
                |_, text| {
                    scratch.sentence.clear();
                    unreported += subsample(text, self.vocab, keep, &mut rng, &mut scratch.sentence);
                    let done = shared.words.load(Ordering::Relaxed);
                    let lr = self.lr_at(done, total_words);
                    self.train_sentence(input, output, lr, &mut scratch, &mut rng);
                    if unreported >= REPORT_EVERY {
                        let (done, l) = shared.flush(std::mem::take(&mut unreported), &mut scratch);
                        if !l.is_finite() {
                            result = Err(Error::Diverged { epoch, words: done });
                            shared.stop.store(true, Ordering::Relaxed);
                        }
                        if farout_core::stop::due(self.deadline) {
                            shared.stop.store(true, Ordering::Relaxed);
                        }
                    }
                    !shared.stop.load(Ordering::Relaxed)
                },
                |_| true,
            )?;
        }
        let (done, l) = shared.flush(unreported, &mut scratch);
        if !l.is_finite() && result.is_ok() {
            result = Err(Error::Diverged { epoch, words: done });
        }
        result
    }

    /// Calls `progress` every `REPORT_INTERVAL` until every worker of `handles` has finished,
    /// with the loss flushed since the last report (`last_loss` again when none was).
    fn report_while_training<R: HogwildRows, T>(
        &self,
        handles: &[std::thread::ScopedJoinHandle<'_, T>],
        work: &EpochWork<R>,
        last_loss: &mut f64,
        progress: &mut dyn FnMut(&Progress),
    ) {
        let (epoch, total_words, shared) = (work.epoch, work.total_words, work.shared);
        let mut last = Instant::now();
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(POLL);
            if last.elapsed() >= REPORT_INTERVAL {
                last = Instant::now();
                let done = shared.words.load(Ordering::Relaxed);
                match shared.take_window_loss() {
                    Some(loss) => *last_loss = loss,
                    None if last_loss.is_nan() => continue, // nothing sampled yet
                    None => {}
                }
                let loss = *last_loss;
                let lr = self.lr_at(done, total_words);
                progress(&Progress { epoch, words: done, total_words, loss, lr, closes_epoch: false });
            }
        }
    }

    /// The report closing epoch `epoch`, after its workers.
    fn report_epoch_end(
        &self,
        shared: &Shared,
        epoch: usize,
        total_words: u64,
        last_loss: &mut f64,
        progress: &mut dyn FnMut(&Progress),
    ) {
        let done = shared.words.load(Ordering::Relaxed);
        if let Some(loss) = shared.take_window_loss() {
            *last_loss = loss;
        }
        let loss = *last_loss;
        let lr = self.lr_at(done, total_words);
        progress(&Progress { epoch, words: done, total_words, loss, lr, closes_epoch: true });
    }

    /// What epoch `epoch`, started at `t0`, did: from the counts its workers flushed to
    /// `shared` (which started at `epoch_words × epoch` words).
    fn epoch_stats(&self, shared: &Shared, epoch: usize, epoch_words: u64, t0: Instant) -> EpochStats {
        let (loss_sum, loss_n) = *shared.loss.lock().expect("loss lock");
        EpochStats {
            epoch,
            words: shared.words.load(Ordering::Relaxed) - epoch_words * epoch as u64,
            pairs: shared.pairs.load(Ordering::Relaxed),
            loss: if loss_n > 0 { loss_sum / loss_n as f64 } else { f64::NAN },
            seconds: t0.elapsed().as_secs_f64(),
            stopped: shared.stop.load(Ordering::Relaxed),
        }
    }

    /// Linear decay from `lr` to `min_lr` over the whole schedule.
    fn lr_at(&self, words: u64, total: u64) -> f32 {
        let c = self.config;
        let frac = 1.0 - words as f64 / (total as f64 + 1.0);
        (c.lr as f64 * frac).max(c.min_lr as f64) as f32
    }

    fn train_sentence<R: HogwildRows>(&self, input: &R, output: &R, lr: f32, s: &mut Scratch, rng: &mut Rng) {
        let sentence = std::mem::take(&mut s.sentence);
        match (self.config.mode, self.subwords) {
            (Mode::SkipGram, None) => {
                let mut pairs = std::mem::take(&mut s.sentence_pairs);
                pairs.clear();
                for_each_pair(&sentence, self.config.window, rng, |_, context, centre| pairs.push((context, centre)));
                self.train_pairs(input, output, &pairs, lr, s, rng);
                s.sentence_pairs = pairs;
            }
            (Mode::SkipGram, Some(sw)) => for_each_pair(&sentence, self.config.window, rng, |rng, context, centre| {
                self.train_mean(input, output, sw.rows(context), centre, lr, s, rng)
            }),
            (Mode::Cbow, _) => for_each_window(&sentence, self.config.window, rng, |rng, contexts, centre| {
                let mut rows = std::mem::take(&mut s.rows);
                rows.clear();
                match self.subwords {
                    Some(sw) => contexts.iter().for_each(|&c| rows.extend_from_slice(sw.rows(c))),
                    None => rows.extend_from_slice(contexts),
                }
                self.train_mean(input, output, &rows, centre, lr, s, rng);
                s.rows = rows;
            }),
        }
        s.sentence = sentence;
    }

    /// One step whose input is the mean of input `rows` (CBOW's window, or a word's subword
    /// rows); every row then gets the whole step `e`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn train_mean<R: HogwildRows>(
        &self,
        input: &R,
        output: &R,
        rows: &[u32],
        centre: u32,
        lr: f32,
        s: &mut Scratch,
        rng: &mut Rng,
    ) {
        mean_rows(input, rows, s);
        self.train_targets(output, centre, lr, s, rng);
        for &r in rows {
            input.axpy(r as usize, 1.0, &s.err);
        }
    }

    /// Skip-gram's steps on a sentence's (context, centre) `pairs`, pipelined in three stages
    /// so that cache misses overlap arithmetic: while pair `j` trains, pair `j + 1`'s
    /// negatives are resolved (their noise-table columns were requested one pair earlier) and
    /// its rows requested (the context's input row, the targets' output rows), and pair
    /// `j + 2`'s randomness is drawn and its noise-table columns requested. Only the draws use
    /// `rng`, in pair order, so the steps are those of [`Self::train_targets`] pair after pair
    /// (tested).
    fn train_pairs<R: HogwildRows>(
        &self,
        input: &R,
        output: &R,
        pairs: &[(u32, u32)],
        lr: f32,
        s: &mut Scratch,
        rng: &mut Rng,
    ) {
        let Some(&(first, centre)) = pairs.first() else { return };
        let (mut next, mut columns) = (std::mem::take(&mut s.next_targets), std::mem::take(&mut s.columns));
        self.draw_columns(rng, &mut columns);
        self.resolve_targets(centre, &columns, &mut s.targets);
        request_rows(input, output, first, &s.targets);
        if pairs.len() > 1 {
            self.draw_columns(rng, &mut columns);
        }
        for (j, &(context, _)) in pairs.iter().enumerate() {
            if let Some(&(c, centre)) = pairs.get(j + 1) {
                self.resolve_targets(centre, &columns, &mut next);
                request_rows(input, output, c, &next);
            }
            if j + 2 < pairs.len() {
                self.draw_columns(rng, &mut columns);
            }
            input.read(context as usize, &mut s.l1);
            self.step_targets(output, lr, s);
            input.axpy(context as usize, 1.0, &s.err);
            std::mem::swap(&mut s.targets, &mut next);
        }
        (s.next_targets, s.columns) = (next, columns);
    }

    /// The randomness of one step's negatives (see [`AliasTable::draw_column`]), their noise
    /// table columns requested.
    #[inline]
    fn draw_columns(&self, rng: &mut Rng, columns: &mut Vec<(u32, f32)>) {
        columns.clear();
        for _ in 0..self.negatives {
            let c = self.noise.draw_column(rng);
            self.noise.prefetch(c.0);
            columns.push(c);
        }
    }

    /// `centre` then the negatives that `columns` draw (those equal to it skipped).
    #[inline]
    fn resolve_targets(&self, centre: u32, columns: &[(u32, f32)], targets: &mut Vec<u32>) {
        targets.clear();
        targets.push(centre);
        targets.extend(columns.iter().map(|&c| self.noise.resolve(c)).filter(|&k| k != centre));
    }

    /// `centre` then the negatives drawn for it (those equal to it skipped, as word2vec does).
    #[inline]
    fn draw_targets(&self, centre: u32, rng: &mut Rng, targets: &mut Vec<u32>) {
        targets.clear();
        targets.push(centre);
        for _ in 0..self.negatives {
            let k = self.noise.sample(rng);
            if k != centre {
                targets.push(k);
            }
        }
    }

    /// The output side of one SGD step on the loss of input `s.l1` and `centre` (module docs):
    /// the centre's and the negatives' vectors move, and `s.err` receives the input's update.
    #[inline]
    fn train_targets<R: HogwildRows>(&self, output: &R, centre: u32, lr: f32, s: &mut Scratch, rng: &mut Rng) {
        // The negatives are drawn first and their rows requested together, so that their cache
        // misses overlap (nothing else draws from `rng` meanwhile: the same draws as one by one).
        self.draw_targets(centre, rng, &mut s.targets);
        for &t in &s.targets {
            output.prefetch(t as usize);
        }
        self.step_targets(output, lr, s);
    }

    /// [`Self::train_targets`]' step on the targets already drawn into `s.targets`.
    #[inline]
    fn step_targets<R: HogwildRows>(&self, output: &R, lr: f32, s: &mut Scratch) {
        s.err.fill(0.0);
        // The loss costs two logarithms per target: estimate it on one pair in 8.
        let track = s.pairs.is_multiple_of(8);
        for j in 0..s.targets.len() {
            let (target, label) = (s.targets[j], if j == 0 { 1.0 } else { 0.0 });
            // g = lr (y - s(u . v_k)), e += g v_k, v_k += g u: one fused step on v_k.
            let mut p = 0.0;
            let step = |f| {
                p = sigmoid(f);
                lr * (label - p)
            };
            output.dot_step(target as usize, &s.l1, step, &mut s.err);
            if track {
                // -log s(f) for the centre, -log s(-f) = -log(1 - s(f)) for a negative.
                // (Clamped so a confident mistake counts 69, but NaN, from overflowed vectors,
                // is kept: it is how divergence is noticed.)
                let q = if label > 0.0 { p } else { 1.0 - p };
                s.loss -= if q.is_nan() { f64::NAN } else { q.max(1e-30).ln() as f64 };
            }
        }
        if track {
            s.loss_n += 1;
        }
        s.pairs += 1;
    }
}

impl Scratch {
    fn new(dim: usize) -> Self {
        Self {
            sentence: Vec::new(),
            targets: Vec::new(),
            next_targets: Vec::new(),
            columns: Vec::new(),
            sentence_pairs: Vec::new(),
            rows: Vec::new(),
            l1: vec![0.0; dim],
            err: vec![0.0; dim],
            loss: 0.0,
            loss_n: 0,
            pairs: 0,
        }
    }
}

/// Starts loading the rows of one skip-gram pair: `context`'s input row, the `targets`' output rows.
#[inline]
fn request_rows<R: HogwildRows>(input: &R, output: &R, context: u32, targets: &[u32]) {
    input.prefetch(context as usize);
    for &t in targets {
        output.prefetch(t as usize);
    }
}

/// `s.l1` = the mean of input `rows` (`s.err` is scratch here).
#[inline]
fn mean_rows<R: HogwildRows>(input: &R, rows: &[u32], s: &mut Scratch) {
    s.l1.fill(0.0);
    for &r in rows {
        input.read(r as usize, &mut s.err);
        s.l1.iter_mut().zip(&s.err).for_each(|(h, x)| *h += x);
    }
    let inv = 1.0 / rows.len() as f32;
    s.l1.iter_mut().for_each(|h| *h *= inv);
}

#[inline]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_core::kernels;
    use farout_data::synth_text::TextGenSpec;

    struct Setup {
        _dir: tempfile::TempDir,
        corpus: std::path::PathBuf,
        spec: TextSpec,
        vocab: Vocab,
        noise: AliasTable,
        generator: TextGenSpec,
    }

    fn setup() -> Setup {
        let generator = TextGenSpec { words: 1000, tokens: 300_000, topics: 10, ..TextGenSpec::default() };
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("corpus.txt");
        generator.write(&corpus, &|_| {}).unwrap();
        let spec = TextSpec { min_count: 1, t: 1e-3, ..TextSpec::default() };
        let vocab = Vocab::build(&corpus, &spec, 2).unwrap();
        let w: Vec<f64> = vocab.counts().iter().map(|&n| (n as f64).powf(0.75)).collect();
        let noise = AliasTable::new(&w).unwrap();
        Setup { _dir: dir, corpus, spec, vocab, noise, generator }
    }

    fn job<'a>(s: &'a Setup, config: &'a SkipGramConfig, threads: usize, epochs: usize) -> NsJob<'a> {
        NsJob {
            corpus: &s.corpus,
            spec: &s.spec,
            vocab: &s.vocab,
            config,
            negatives: 5,
            noise: &s.noise,
            threads,
            seed: 3,
            epochs,
            deadline: None,
            subwords: None,
        }
    }

    fn train(s: &Setup, config: &SkipGramConfig, threads: usize, epochs: usize) -> (Embeddings, Vec<EpochStats>) {
        let mut emb = Embeddings::init(s.vocab.len(), s.vocab.len(), config.dim, 1.0, 3);
        let stats = job(s, config, threads, epochs).run(&mut emb, 0, &mut |_| {}, &mut |_, _| Ok(true)).unwrap();
        (emb, stats)
    }

    /// The fraction of words (ranks 20..420, below the most frequent "function words") whose
    /// nearest neighbour by cosine belongs to the same topic; chance is 1/10.
    fn topic_purity(s: &Setup, emb: &Embeddings) -> f64 {
        let rank = |id: usize| s.vocab.word(id as u32)[1..].parse::<usize>().unwrap();
        let probes: Vec<usize> = (0..s.vocab.len()).filter(|&i| (20..420).contains(&rank(i))).collect();
        let hits = probes
            .iter()
            .filter(|&&i| {
                let best = (0..s.vocab.len())
                    .filter(|&j| j != i)
                    .max_by(|&a, &b| {
                        let c = |j: usize| kernels::cosine(emb.input.row(i), emb.input.row(j));
                        c(a).total_cmp(&c(b))
                    })
                    .unwrap();
                s.generator.topic_of(rank(best)) == s.generator.topic_of(rank(i))
            })
            .count();
        hits as f64 / probes.len() as f64
    }

    #[test]
    fn embeddings_learn_the_topics_with_both_memory_models() {
        let s = setup();
        for hogwild in [Hogwild::Racy, Hogwild::Atomic] {
            let config = SkipGramConfig { dim: 32, hogwild, ..SkipGramConfig::default() };
            let untrained = Embeddings::init(s.vocab.len(), s.vocab.len(), 32, 1.0, 3);
            let (emb, stats) = train(&s, &config, 2, 3);
            assert_eq!(stats.len(), 3);
            assert!(stats.iter().all(|e| e.words == s.vocab.train_tokens() && e.pairs > 0));
            assert!(stats[2].loss < stats[0].loss, "{hogwild:?}: {stats:?}");
            let (before, after) = (topic_purity(&s, &untrained), topic_purity(&s, &emb));
            assert!(before < 0.25 && after > 0.8, "{hogwild:?}: purity {before} -> {after}");
        }
    }

    #[test]
    fn cbow_learns_the_topics() {
        let s = setup();
        let config = SkipGramConfig { dim: 32, mode: Mode::Cbow, ..SkipGramConfig::default() };
        let untrained = Embeddings::init(s.vocab.len(), s.vocab.len(), 32, 1.0, 3);
        let (emb, stats) = train(&s, &config, 2, 3);
        // One step per centre word: fewer steps than skip-gram's pairs, at most one per word.
        assert!(stats.iter().all(|e| e.pairs > 0 && e.pairs <= e.words), "{stats:?}");
        assert!(stats[2].loss < stats[0].loss, "{stats:?}");
        let (before, after) = (topic_purity(&s, &untrained), topic_purity(&s, &emb));
        assert!(before < 0.25 && after > 0.8, "purity {before} -> {after}");
    }

    /// Trains the sentence `[2, 0, 1]` (dim 4, step 0.3) with `j` from random tables of
    /// `input_rows` and 3 output rows, and applies `steps` to copies of them, each written out
    /// by hand: the mean of its input rows against its centre (`j` draws no negatives), the
    /// centre's row moved, the whole step added to every input row. Both end within `tol`.
    fn matches_the_steps_written_out(j: &NsJob, input_rows: usize, seed: u64, steps: &[(Vec<usize>, usize)], tol: f32) {
        let mut r = rng::seeded(seed, 0);
        let rand = |r: &mut Rng, n: usize| -> Vec<f32> { (0..n * 4).map(|_| 0.5 * rng::normal(r)).collect() };
        let (u0, v0) = (rand(&mut r, input_rows), rand(&mut r, 3));
        let input = AtomicRows::from_matrix(farout_core::Matrix::from_vec(input_rows, 4, u0.clone()).unwrap());
        let output = AtomicRows::from_matrix(farout_core::Matrix::from_vec(3, 4, v0.clone()).unwrap());
        let mut scratch = Scratch::new(4);
        scratch.sentence = vec![2, 0, 1];
        let lr = 0.3;
        j.train_sentence(&input, &output, lr, &mut scratch, &mut r);
        let (mut u, mut v) = (u0, v0);
        for (rows, centre) in steps {
            let h: Vec<f32> =
                (0..4).map(|d| rows.iter().map(|&r| u[r * 4 + d]).sum::<f32>() / rows.len() as f32).collect();
            let f: f32 = (0..4).map(|d| h[d] * v[centre * 4 + d]).sum();
            let g = lr * (1.0 - 1.0 / (1.0 + (-f).exp()));
            let e: Vec<f32> = (0..4).map(|d| g * v[centre * 4 + d]).collect();
            (0..4).for_each(|d| v[centre * 4 + d] += g * h[d]);
            for &row in rows {
                (0..4).for_each(|d| u[row * 4 + d] += e[d]);
            }
        }
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < tol);
        assert!(close(input.to_matrix().as_slice(), &u), "{:?} vs {u:?}", input.to_matrix());
        assert!(close(output.to_matrix().as_slice(), &v), "{:?} vs {v:?}", output.to_matrix());
        assert_eq!(scratch.pairs, steps.len() as u64);
    }

    /// One CBOW sentence against the update written out by hand: windows of 1 (the draw from
    /// 1..=1), no negatives, so every step is the centre's; (contexts, centre) per position.
    #[test]
    fn a_cbow_sentence_matches_the_update_written_out() {
        let s = setup();
        let config = SkipGramConfig { dim: 4, window: 1, mode: Mode::Cbow, ..SkipGramConfig::default() };
        let j = NsJob { negatives: 0, ..job(&s, &config, 1, 1) };
        matches_the_steps_written_out(&j, 3, 5, &[(vec![0], 2), (vec![2, 1], 0), (vec![0], 1)], 1e-6);
    }

    /// One subword skip-gram sentence against the update written out by hand: the (context,
    /// centre) pairs in order, each context's input the mean of its rows (found by hand), and
    /// every row gets the whole step.
    #[test]
    fn a_subword_sentence_matches_the_update_written_out() {
        let s = setup();
        let config = SkipGramConfig { dim: 4, window: 1, minn: 2, maxn: 3, buckets: 5, ..SkipGramConfig::default() };
        let words: Vec<String> = ["ab", "abc", "b"].map(String::from).to_vec();
        let sw = Subwords::new(&words, config.ngrams());
        let j = NsJob { negatives: 0, subwords: Some(&sw), ..job(&s, &config, 1, 1) };
        let rows_of = |w: usize| -> Vec<usize> {
            let mut rows = vec![w];
            let padded: Vec<char> = format!("<{}>", words[w]).chars().collect();
            for i in 0..padded.len() {
                for n in 2..=3 {
                    if let Some(g) = padded.get(i..i + n) {
                        let g: String = g.iter().collect();
                        rows.push(3 + (crate::subwords::hash(g.as_bytes()) % 5) as usize);
                    }
                }
            }
            rows
        };
        let steps: Vec<(Vec<usize>, usize)> =
            [(0usize, 2usize), (2, 0), (1, 0), (0, 1)].into_iter().map(|(c, centre)| (rows_of(c), centre)).collect();
        for w in 0..3 {
            assert_eq!(sw.rows(w as u32).iter().map(|&r| r as usize).collect::<Vec<_>>(), rows_of(w));
        }
        matches_the_steps_written_out(&j, 3 + 5, 6, &steps, 1e-5);
    }

    /// Subword skip-gram and CBOW learn the topics too (measured on the words' composed vectors).
    #[test]
    fn subwords_learn_the_topics() {
        let s = setup();
        for mode in [Mode::SkipGram, Mode::Cbow] {
            let config = SkipGramConfig { dim: 32, mode, maxn: 4, buckets: 5000, ..SkipGramConfig::default() };
            let sw = Subwords::new(s.vocab.words(), config.ngrams());
            let mut emb = Embeddings::init(sw.table_rows(), s.vocab.len(), 32, 1.0, 3);
            let untrained = Embeddings { input: sw.word_vectors(&emb.input), output: emb.output.clone() };
            let j = NsJob { subwords: Some(&sw), ..job(&s, &config, 2, 3) };
            let stats = j.run(&mut emb, 0, &mut |_| {}, &mut |_, _| Ok(true)).unwrap();
            assert_eq!(emb.input.rows(), s.vocab.len() + 5000);
            assert!(stats[2].loss < stats[0].loss, "{mode:?}: {stats:?}");
            let trained = Embeddings { input: sw.word_vectors(&emb.input), output: emb.output };
            let (before, after) = (topic_purity(&s, &untrained), topic_purity(&s, &trained));
            assert!(after > 0.8 && after > before + 0.4, "{mode:?}: purity {before} -> {after}");
        }
    }

    /// Skip-gram's pipelined steps (`train_pairs`: each pair's negatives drawn and its rows
    /// requested while the pair before trains) against the same pairs trained one after the
    /// other with `train_targets`: the same draws, so bit for bit the same tables and loss.
    #[test]
    fn pipelined_pairs_match_the_pairs_one_by_one() {
        use farout_core::rng::RngExt;
        let s = setup();
        let config = SkipGramConfig { dim: 12, ..SkipGramConfig::default() };
        let j = job(&s, &config, 1, 1);
        let mut emb = Embeddings::init(s.vocab.len(), s.vocab.len(), 12, 1.0, 3);
        let mut r = rng::seeded(9, 0);
        emb.output.as_mut_slice().iter_mut().for_each(|x| *x = 0.3 * rng::normal(&mut r));
        // Few distinct words, so that consecutive pairs share rows.
        let sentence: Vec<u32> = (0..60).map(|_| r.random_range(0..15u32)).collect();
        let mut pairs = Vec::new();
        for_each_pair(&sentence, 5, &mut r, |_, context, centre| pairs.push((context, centre)));
        let tables = || (AtomicRows::from_matrix(emb.input.clone()), AtomicRows::from_matrix(emb.output.clone()));
        let ((in1, out1), (in2, out2)) = (tables(), tables());
        let (mut s1, mut s2) = (Scratch::new(12), Scratch::new(12));
        j.train_pairs(&in1, &out1, &pairs, 0.2, &mut s1, &mut rng::seeded(5, 0));
        let mut r2 = rng::seeded(5, 0);
        for &(context, centre) in &pairs {
            in2.read(context as usize, &mut s2.l1);
            j.train_targets(&out2, centre, 0.2, &mut s2, &mut r2);
            in2.axpy(context as usize, 1.0, &s2.err);
        }
        let bits = |m: farout_core::Matrix| m.as_slice().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(in1.into_matrix()), bits(in2.into_matrix()));
        assert_eq!(bits(out1.into_matrix()), bits(out2.into_matrix()));
        assert_eq!((s1.pairs, s1.loss.to_bits()), (s2.pairs, s2.loss.to_bits()));
        assert!(s1.pairs > 100 && s1.loss > 0.0);
    }

    #[test]
    fn one_thread_is_deterministic_and_resuming_continues_the_schedule() {
        let s = setup();
        let config = SkipGramConfig { dim: 16, ..SkipGramConfig::default() };
        let (full, _) = train(&s, &config, 1, 2);
        let (again, _) = train(&s, &config, 1, 2);
        assert_eq!(full, again);
        // Stop after the first epoch, then continue from it.
        let mut emb = Embeddings::init(s.vocab.len(), s.vocab.len(), 16, 1.0, 3);
        let j = job(&s, &config, 1, 2);
        let first = j.run(&mut emb, 0, &mut |_| {}, &mut |_, _| Ok(false)).unwrap();
        assert_eq!(first.len(), 1);
        assert_ne!(emb, full);
        j.run(&mut emb, 1, &mut |_| {}, &mut |_, _| Ok(true)).unwrap();
        assert_eq!(emb, full);
    }

    #[test]
    fn the_step_size_falls_linearly_and_progress_is_reported() {
        let s = setup();
        let config = SkipGramConfig { dim: 8, lr: 0.05, min_lr: 0.001, ..SkipGramConfig::default() };
        let j = job(&s, &config, 2, 2);
        let total = 1000;
        assert_eq!(j.lr_at(0, total), 0.05);
        assert!((j.lr_at(500, total) - 0.05 * (1.0 - 500.0 / 1001.0)).abs() < 1e-7);
        assert_eq!(j.lr_at(total, total), 0.001);
        let seen = Mutex::new(Vec::new());
        let mut emb = Embeddings::init(s.vocab.len(), s.vocab.len(), 8, 1.0, 3);
        j.run(&mut emb, 0, &mut |p| seen.lock().unwrap().push(*p), &mut |_, _| Ok(true)).unwrap();
        let seen = seen.into_inner().unwrap();
        assert!(seen.len() >= 2, "at least one report per epoch");
        assert!(seen.windows(2).all(|w| w[1].words >= w[0].words && w[1].lr <= w[0].lr));
        assert!(seen.iter().all(|p| p.total_words == 2 * s.vocab.train_tokens() && p.loss.is_finite()));
    }

    #[test]
    fn divergence_stops_with_an_error() {
        let s = setup();
        let config = SkipGramConfig { dim: 8, lr: 1e30, min_lr: 1e30, ..SkipGramConfig::default() };
        let mut emb = Embeddings::init(s.vocab.len(), s.vocab.len(), 8, 1.0, 3);
        emb.input.as_mut_slice().iter_mut().for_each(|x| *x = 1e30);
        let err = job(&s, &config, 2, 1).run(&mut emb, 0, &mut |_| {}, &mut |_, _| Ok(true)).unwrap_err();
        assert!(matches!(err, Error::Diverged { .. }), "{err}");
    }
}
