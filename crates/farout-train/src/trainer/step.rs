//! The training loop: one epoch's batches in a seeded order, one optimisation step per batch
//! (encoder forward, the estimator's sparse gradient and the layer update, encoder backward),
//! logs, recall, evaluation and checkpoints when due, and divergence checks.

use super::{Encoder, Summary, Trainer, gather_rows_into, peak_rss_bytes};
use crate::Error;
use crate::report::progress_bar;
use crate::sinks::{MetricsSink, Sinks};
use farout_core::{ClassId, Matrix, rng};
use farout_data::Features;
use farout_dist::{Collective, Strided};
use farout_estimators::{Batch, GradientEstimator};
use farout_layer::OutputLayer;
use farout_layer::sharded_sparse::{self, CommCost, Phases};
use farout_models::{DocEncoder, EncoderRanks, bridge};
use indicatif::ProgressBar;
use std::time::Instant;

/// A step whose mean loss per sample exceeds this many times the first step's, and at least
/// this many times 1 (the scale of a margin), has blown up: its loss is finite but its weights
/// are ruined. The run stops as on a NaN.
const BLOWUP: f64 = 100.0;

/// One step of a class-sharded layer (or of one process's layer in class chunks): the classes
/// `shard` of a layer on the ranks of `comm`.
struct ShardedStep<'a> {
    layer: &'a mut OutputLayer,
    shard: Strided,
    comm: &'a dyn Collective,
    class_chunk: usize,
}

/// A document encoder's batch: the documents (sparse rows), their sample ids and positives.
#[derive(Clone, Copy)]
struct DocBatch<'a> {
    docs: &'a [(&'a [u32], &'a [f32])],
    idx: &'a [usize],
    positives: &'a [&'a [ClassId]],
}

impl ShardedStep<'_> {
    /// The step of `estimator` (checked by [`check_sharded_estimator`]) on `batch`, the same on
    /// every rank, with `dL/dphi` summed over the ranks when `want_dphi`.
    fn step(
        &mut self,
        estimator: &dyn GradientEstimator,
        batch: Batch,
        rng: &mut rng::Rng,
        want_dphi: bool,
    ) -> Result<(farout_layer::StepStats, CommCost), Error> {
        let ShardedStep { layer, shard, comm, class_chunk } = self;
        Ok(sharded_sparse::estimator_step(layer, shard, *comm, estimator, batch, rng, want_dphi, *class_chunk)?)
    }

    /// The document encoder on the whole batch at every rank (dropout drawn from the step's
    /// generator `rng`, the same on every rank), each rank taking its part of one process's
    /// encoder step from the summed `dL/dphi`. Replicated (`model.doc_encoder.ranks =
    /// "replicated"`, or a whole encoder), every rank encodes with the whole table and updates
    /// it all. Feature-sharded (`"features"`, a dealt encoder), each rank sums its features'
    /// rows into every document's bag, the ranks sum the bags (one allreduce of `B x D`), and
    /// each rank updates its own rows and, like every other rank, the bias.
    fn doc_whole_batch(
        &mut self,
        enc: &mut DocEncoder,
        b: DocBatch,
        estimator: &dyn GradientEstimator,
        rng: &mut rng::Rng,
    ) -> Result<(farout_layer::StepStats, StepTimes), Error> {
        let comm = self.comm;
        let t_encoder = Instant::now();
        let fwd = if enc.deal().ranks() > 1 {
            enc.forward_summed(b.docs, rng, |bags| comm.allreduce_sum_f32(bags))?
        } else {
            enc.forward(b.docs, rng)
        };
        let phi = bridge::to_matrix(fwd.phi.clone());
        let forward = t_encoder.elapsed().as_secs_f64();
        let (stats, cost) = self.step(estimator, Batch::new(&phi, b.positives).with_ids(b.idx), rng, true)?;
        let t_backward = Instant::now();
        if stats.loss_sum.is_finite() {
            enc.backward(fwd, self.layer.dphi());
        }
        let encoder = forward + t_backward.elapsed().as_secs_f64();
        Ok((stats, StepTimes { phases: cost.phases, comm: cost.seconds, encoder }))
    }

    /// The document encoder data parallel (`model.doc_encoder.ranks = "data"`): each rank
    /// encodes its share of the batch (dropout from `dropout_rng`, the rank's own), the ranks
    /// gather the features (into `phi`) for the class-sharded layer, and each backpropagates its
    /// rows of `dL/dphi`; the encoder's gradients are summed over the ranks, so every rank's copy
    /// of the encoder takes the same step.
    fn doc_data_parallel(
        &mut self,
        enc: &mut DocEncoder,
        b: DocBatch,
        phi: &mut Matrix,
        estimator: &dyn GradientEstimator,
        rng: &mut rng::Rng,
        mut dropout_rng: rng::Rng,
    ) -> Result<(farout_layer::StepStats, StepTimes), Error> {
        let comm = self.comm;
        let (ranks, rank, n) = (comm.size(), comm.rank(), b.idx.len());
        let t_encoder = Instant::now();
        let part = |r: usize| n * r / ranks..n * (r + 1) / ranks;
        let mine = part(rank);
        let fwd = enc.forward(&b.docs[mine.clone()], &mut dropout_rng);
        let d = enc.d_model();
        let counts: Vec<usize> = (0..ranks).map(|r| part(r).len() * d).collect();
        phi.reshape_for_overwrite(n, d);
        comm.allgatherv_f32(bridge::to_matrix(fwd.phi.clone()).as_slice(), &counts, phi.as_mut_slice())?;
        let forward = t_encoder.elapsed().as_secs_f64();
        let (stats, cost) = self.step(estimator, Batch::new(phi, b.positives).with_ids(b.idx), rng, true)?;
        let t_backward = Instant::now();
        if stats.loss_sum.is_finite() {
            let rows = &self.layer.dphi().as_slice()[mine.start * d..mine.end * d];
            let grads = enc.gradients(fwd, &Matrix::from_vec(mine.len(), d, rows.to_vec()).expect("rows of D"));
            enc.apply(&crate::dist::sum_doc_grads(comm, grads)?);
        }
        let encoder = forward + t_backward.elapsed().as_secs_f64();
        Ok((stats, StepTimes { phases: cost.phases, comm: cost.seconds, encoder }))
    }
}

/// Where a class-sharded step's time went on this rank, in seconds.
#[derive(Clone, Copy, Default)]
struct StepTimes {
    /// The layer's phases ([`Phases`]).
    phases: Phases,
    /// In the layer's collectives (part of the phases).
    comm: f64,
    /// The document encoder's forward pass with the features' gather, and its backward pass
    /// with the sum of its gradients over the ranks.
    encoder: f64,
}

impl StepTimes {
    fn add(&mut self, other: &StepTimes) {
        self.phases.add(&other.phases);
        self.comm += other.comm;
        self.encoder += other.encoder;
    }
}

/// What one optimisation step did.
struct StepResult {
    /// Sum of the per-sample losses.
    loss_sum: f64,
    samples: u64,
    classes_scored: u64,
    rows_updated: u64,
    /// Wall time of the step.
    seconds: f64,
    /// Its parts, for a class-sharded step.
    times: Option<StepTimes>,
}

/// Sums over the steps since the last log record.
#[derive(Default)]
struct Window {
    loss_sum: f64,
    samples: u64,
    classes_scored: u64,
    rows_updated: u64,
    seconds: f64,
    /// The sharded steps' times, summed, and how many steps they are.
    times: StepTimes,
    timed_steps: u64,
}

impl Window {
    fn add(&mut self, s: &StepResult) {
        self.loss_sum += s.loss_sum;
        self.samples += s.samples;
        self.classes_scored += s.classes_scored;
        self.rows_updated += s.rows_updated;
        self.seconds += s.seconds;
        if let Some(t) = &s.times {
            self.times.add(t);
            self.timed_steps += 1;
        }
    }

    /// The mean milliseconds per step of the sharded steps' phases, collectives and encoder
    /// (`train/phase_<name>_ms`, `train/comm_ms`; none without sharded steps).
    fn phase_ms(&self, with_encoder: bool) -> Vec<(String, f64)> {
        if self.timed_steps == 0 {
            return Vec::new();
        }
        let ms = |s: f64| 1e3 * s / self.timed_steps as f64;
        let t = &self.times;
        let mut out: Vec<(String, f64)> =
            Phases::NAMES.iter().zip(t.phases.seconds()).map(|(n, s)| (format!("train/phase_{n}_ms"), ms(s))).collect();
        if with_encoder {
            out.push(("train/phase_encoder_ms".into(), ms(t.encoder)));
        }
        out.push(("train/comm_ms".into(), ms(t.comm)));
        out
    }
}

/// The logs and display of a run in progress.
struct RunLog {
    sinks: Sinks,
    bar: ProgressBar,
    /// Steps at which the run ends (epochs, capped by `train.max_steps`).
    total_steps: u64,
    steps_per_epoch: u64,
    window: Window,
    /// The step of the last log record.
    window_start: u64,
    /// The last test P@1, shown on the progress bar.
    last_eval: String,
}

impl Trainer<'_> {
    /// [`Trainer::run`] as one of the ranks of `comm`: every rank takes the same steps on the
    /// same batches; rank 0 logs, shows progress and writes the metrics.
    pub fn run(&mut self) -> Result<Summary, Error> {
        let mut run = self.open_run()?;
        while self.state.epoch < self.config.train.epochs && !self.stopped(&run) {
            let order = self.epoch_order();
            let batches: Vec<&[usize]> = order.chunks(self.config.train.batch_size).collect();
            while self.state.batch_in_epoch < batches.len() && !self.stopped(&run) {
                let idx = batches[self.state.batch_in_epoch];
                let step = self.train_batch(idx)?;
                self.after_step(&mut run, idx, &step)?;
            }
            if self.state.batch_in_epoch == batches.len() {
                self.end_epoch(&mut run)?;
            }
        }
        if crate::stop::requested() {
            run.bar.abandon();
            let checkpoint = self.save_checkpoint()?;
            let kept = format!("the checkpoint in {} continues it (--resume)", checkpoint.display());
            return Err(Error::Interrupted { step: self.state.step, unit: "steps", kept });
        }
        self.finish(run)
    }

    /// Opens the logs (rank 0's) and the progress bar of a run starting (or resuming) at the
    /// current step.
    fn open_run(&self) -> Result<RunLog, Error> {
        let comm = self.comm;
        let cfg = &self.config;
        let log_dir = cfg.log_dir();
        let sinks = Sinks::open_on_root(comm, &log_dir, &cfg.log, self.state.step == 0)?;
        let steps_per_epoch = self.steps_per_epoch();
        let mut total_steps = steps_per_epoch * cfg.train.epochs as u64;
        if cfg.train.max_steps > 0 {
            total_steps = total_steps.min(cfg.train.max_steps);
        }
        let bar = progress_bar(
            cfg.log.progress && comm.is_root(),
            total_steps,
            "{prefix} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} steps, ETA {eta} | {msg}",
        );
        bar.set_prefix(format!("{} ({})", cfg.name, self.estimator.name()));
        bar.set_position(self.state.step);
        Ok(RunLog {
            sinks,
            bar,
            total_steps,
            steps_per_epoch,
            window: Window::default(),
            window_start: self.state.step,
            last_eval: String::new(),
        })
    }

    /// Optimisation steps in one epoch.
    pub(super) fn steps_per_epoch(&self) -> u64 {
        self.data.train.len().div_ceil(self.config.train.batch_size) as u64
    }

    /// Whether the run is over: all steps taken, the time budget spent, or the validation
    /// figure no better for `train.patience` evaluations.
    fn stopped(&self, run: &RunLog) -> bool {
        let max_seconds = self.config.train.max_seconds;
        self.state.step >= run.total_steps
            || (max_seconds > 0.0 && self.state.train_seconds >= max_seconds)
            || self.patience_spent()
            || crate::stop::requested()
    }

    /// The current epoch's sample order (a function of the seed and the epoch, so a resumed
    /// run sees the same batches).
    fn epoch_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.data.train.len()).collect();
        rng::shuffle(&mut order, &mut rng::seeded(self.config.seed, 1 + self.state.epoch as u64));
        order
    }

    /// One optimisation step on the training samples `idx`: encoder forward, the estimator's
    /// gradient and the layer update, encoder backward. Stops the run (keeping the last
    /// checkpoint) if the loss is not finite.
    fn train_batch(&mut self, idx: &[usize]) -> Result<StepResult, Error> {
        let comm = self.comm;
        let t0 = Instant::now();
        let positives: Vec<&[ClassId]> = idx.iter().map(|&i| self.data.train.labels.get(i)).collect();
        let class_chunk = self.config.output.class_chunk;
        // The same generator on every rank: sampling estimators draw the same classes.
        let mut step_rng = rng::seeded(self.config.seed ^ 0xE57, self.state.step);
        let estimator: &dyn GradientEstimator = match &self.warmup {
            Some(w) if self.state.step < self.config.output.warmup_steps => w.as_ref(),
            _ => self.estimator.as_ref(),
        };
        let sharded = self.shard.is_some() || class_chunk > 0;
        let shard = self.shard.unwrap_or(Strided::whole(self.data.n_classes));
        let encoder_ranks = self.config.model.doc_encoder.ranks;
        let mut times = None;
        let stats = match (&mut self.encoder, &self.data.train.features) {
            (Encoder::Face(_), Features::Dense(m)) => {
                gather_rows_into(m, idx, &mut self.phi);
                if sharded {
                    let (layer, phi) = (&mut self.layer, &self.phi);
                    let mut on = ShardedStep { layer, shard, comm, class_chunk };
                    let (stats, cost) =
                        on.step(estimator, Batch::new(phi, &positives).with_ids(idx), &mut step_rng, false)?;
                    times = Some(StepTimes { phases: cost.phases, comm: cost.seconds, encoder: 0.0 });
                    stats
                } else {
                    let batch = Batch::new(&self.phi, &positives).with_ids(idx);
                    self.layer.train_step(estimator, batch, &mut step_rng, false)
                }
            }
            (Encoder::Doc(enc), Features::Sparse(s)) if sharded => {
                let docs: Vec<_> = idx.iter().map(|&i| s.row(i)).collect();
                let batch = DocBatch { docs: &docs, idx, positives: &positives };
                let mut on = ShardedStep { layer: &mut self.layer, shard, comm, class_chunk };
                let (stats, t) = match encoder_ranks {
                    // `features` at several ranks deals the encoder when it is built; one
                    // process's layer in class chunks keeps it whole.
                    EncoderRanks::Replicated | EncoderRanks::Features => {
                        on.doc_whole_batch(enc, batch, estimator, &mut step_rng)?
                    }
                    EncoderRanks::Data => {
                        let seed = rng::seeded(
                            self.config.seed ^ 0xD20,
                            self.state.step * comm.size() as u64 + comm.rank() as u64,
                        );
                        on.doc_data_parallel(enc, batch, &mut self.phi, estimator, &mut step_rng, seed)?
                    }
                };
                times = Some(t);
                stats
            }
            (Encoder::Doc(enc), Features::Sparse(s)) => {
                let docs: Vec<_> = idx.iter().map(|&i| s.row(i)).collect();
                let fwd = enc.forward(&docs, &mut step_rng);
                let phi = bridge::to_matrix(fwd.phi.clone());
                let batch = Batch::new(&phi, &positives).with_ids(idx);
                let stats = self.layer.train_step(estimator, batch, &mut step_rng, true);
                if stats.loss_sum.is_finite() {
                    enc.backward(fwd, self.layer.dphi());
                }
                stats
            }
            _ => unreachable!("config check pairs encoders with their data"),
        };
        let mut step = self.step_result(idx, stats, t0)?;
        step.times = times;
        Ok(step)
    }

    /// What a step on `idx` did, from its statistics; stops the run on divergence.
    fn step_result(&mut self, idx: &[usize], stats: farout_layer::StepStats, t0: Instant) -> Result<StepResult, Error> {
        if !stats.loss_sum.is_finite() {
            return Err(self.diverged(format!("loss = {}", stats.loss_sum)));
        }
        let mean = stats.loss_sum / idx.len().max(1) as f64;
        if self.state.step == 0 {
            self.state.initial_loss = mean;
        }
        let reference = self.state.initial_loss.max(1.0);
        if mean > BLOWUP * reference {
            return Err(self.diverged(format!(
                "mean loss {mean:.4e} is more than {BLOWUP} times the first step's {:.4}, or {BLOWUP}",
                self.state.initial_loss
            )));
        }
        Ok(StepResult {
            loss_sum: stats.loss_sum,
            samples: idx.len() as u64,
            classes_scored: stats.classes_scored as u64,
            rows_updated: stats.rows_updated as u64,
            seconds: t0.elapsed().as_secs_f64(),
            times: None,
        })
    }

    /// Counts a step, then logs, measures recall, evaluates and checkpoints when they are due.
    fn after_step(&mut self, run: &mut RunLog, idx: &[usize], step: &StepResult) -> Result<(), Error> {
        let comm = self.comm;
        let s = &mut self.state;
        s.step += 1;
        s.batch_in_epoch += 1;
        s.train_seconds += step.seconds;
        s.samples += step.samples;
        s.classes_scored += step.classes_scored;
        run.window.add(step);
        let step_no = s.step;
        let (index, eval, ck) = (&self.config.index, &self.config.eval, &self.config.checkpoint);
        let due = |every: u64| every > 0 && step_no.is_multiple_of(every);
        let (log_due, recall_due) =
            (due(self.config.train.log_every) || step_no == run.total_steps, due(index.recall_every));
        let (eval_due, checkpoint_due) = (due(eval.every_steps), ck.enabled && due(ck.every_steps));
        // The run's time is its slowest rank's: under a time budget every rank must stop at the
        // same step, so the ranks agree on it every step; otherwise only where it is recorded
        // (logs, evaluations, checkpoints, the epoch's end), which saves every other step a
        // meeting of the ranks.
        let epoch_ends = s.batch_in_epoch as u64 == run.steps_per_epoch;
        let recorded = log_due || recall_due || eval_due || checkpoint_due || epoch_ends;
        if comm.size() > 1 && (self.config.train.max_seconds > 0.0 || recorded) {
            let mut t = [s.train_seconds];
            comm.allreduce_max_f64(&mut t)?;
            s.train_seconds = t[0];
        }
        let (recall_queries, eval_samples) = (index.recall_queries, eval.max_samples);
        if log_due {
            crate::dist::agree(comm, self.check_weight_scale(false))?;
            self.log_window(run)?;
        }
        run.bar.set_position(step_no);
        if recall_due && self.layer.index().is_some() {
            self.measure_recall(run, &idx[..idx.len().min(recall_queries)])?;
        }
        if eval_due {
            run.last_eval = self.log_eval(&mut run.sinks, eval_samples)? + &self.validate(&mut run.sinks)?;
        }
        if checkpoint_due {
            self.save_checkpoint()?;
        }
        Ok(())
    }

    /// Records the means over the steps since the last record and shows them on the progress bar.
    fn log_window(&self, run: &mut RunLog) -> Result<(), Error> {
        let w = &run.window;
        let loss = w.loss_sum / w.samples as f64;
        let samples_per_s = w.samples as f64 / w.seconds.max(1e-9);
        let steps = (self.state.step - run.window_start) as f64;
        let epoch = self.state.epoch as f64 + self.state.batch_in_epoch as f64 / run.steps_per_epoch as f64;
        let phases = w.phase_ms(matches!(self.encoder, Encoder::Doc(_)));
        let mut values = vec![
            ("train/loss", loss),
            ("train/samples_per_s", samples_per_s),
            ("train/lr", self.layer.lr() as f64),
            ("train/classes_scored_per_sample", w.classes_scored as f64 / w.samples as f64),
            ("train/rows_updated_per_step", w.rows_updated as f64 / steps),
            ("train/epoch", epoch),
        ];
        values.extend(phases.iter().map(|(name, ms)| (name.as_str(), *ms)));
        run.sinks.record(self.state.step, self.state.train_seconds, &values)?;
        // Every record reaches the file now: a killed run keeps its log up to its last window.
        run.sinks.flush()?;
        run.bar.set_message(format!("loss {loss:.4} | {samples_per_s:.0} samples/s{}", run.last_eval));
        run.window = Window::default();
        run.window_start = self.state.step;
        Ok(())
    }

    /// Measures the index's recall against brute force on the features of training samples
    /// `idx` and records it.
    fn measure_recall(&mut self, run: &mut RunLog, idx: &[usize]) -> Result<(), Error> {
        let queries = self.features(&self.data.train, idx)?;
        if let Some(r) = self.layer.index_recall(&queries, self.search_top) {
            self.last_recall = Some(r);
            let builds = self.layer.index_builds() as f64;
            let mut values = vec![("index/recall", r), ("index/builds", builds)];
            if let Some(probed) = self.layer.index_probes(self.search_top) {
                values.push(("index/probed", probed));
            }
            run.sinks.record(self.state.step, self.state.train_seconds, &values)?;
        }
        Ok(())
    }

    /// Closes an epoch: evaluates (unless evaluation is per step, or this was the last epoch,
    /// which [`Self::finish`] evaluates) and checkpoints.
    fn end_epoch(&mut self, run: &mut RunLog) -> Result<(), Error> {
        self.state.epoch += 1;
        self.state.batch_in_epoch = 0;
        let cfg = &self.config;
        if cfg.eval.every_steps == 0 && self.state.epoch < cfg.train.epochs {
            run.last_eval = self.log_eval(&mut run.sinks, cfg.eval.max_samples)?;
            run.last_eval += &self.validate(&mut run.sinks)?;
        }
        let cfg = &self.config;
        if cfg.checkpoint.enabled && cfg.checkpoint.every_steps == 0 {
            self.save_checkpoint()?;
        }
        Ok(())
    }

    /// The final evaluation (test set, or the training set without one), checkpoint and summary;
    /// a run that selects scores its last step on validation first, and reports the kept
    /// weights' test metrics with the last step's beside them.
    fn finish(&mut self, mut run: RunLog) -> Result<Summary, Error> {
        let comm = self.comm;
        run.bar.finish();
        self.validate(&mut run.sinks)?;
        let final_samples = self.config.eval.final_max_samples;
        let test = self.data.test.as_ref().filter(|t| !t.is_empty()).unwrap_or(&self.data.train);
        let metrics = self.evaluate_and_log(test, final_samples, &mut run.sinks)?;
        if self.config.checkpoint.enabled {
            self.save_checkpoint()?;
        }
        let mut summary = self.summary(metrics);
        summary.grad_cosine = self.gradient_fidelity(256);
        summary.peak_rss_bytes = peak_rss_bytes();
        if comm.size() > 1 {
            // The layer's bytes add up over the ranks; the peak memory is the largest rank's.
            let mut bytes = [summary.model_bytes as u64];
            comm.allreduce_sum_u64(&mut bytes)?;
            let mut peak = [summary.peak_rss_bytes.unwrap_or(0) as f64];
            comm.allreduce_max_f64(&mut peak)?;
            summary.model_bytes = bytes[0] as usize;
            summary.peak_rss_bytes = summary.peak_rss_bytes.map(|_| peak[0] as u64);
        }
        // The kept weights replace the last ones in the trainer: what `Task::evaluate` scores.
        self.keep_best(final_samples, &mut summary)?;
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::tiny_face;
    use super::*;
    use farout_dist::Local;

    #[test]
    fn an_epoch_order_is_a_permutation_fixed_by_the_seed_and_the_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = Trainer::new(tiny_face(dir.path(), ""), &Local).unwrap();
        let first = t.epoch_order();
        let mut sorted = first.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..t.data().train.len()).collect::<Vec<_>>());
        assert_eq!(t.epoch_order(), first, "the same epoch, the same order (a resumed run's batches)");
        t.state.epoch = 1;
        assert_ne!(t.epoch_order(), first);
    }

    #[test]
    fn a_step_far_above_the_first_steps_loss_stops_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = Trainer::new(tiny_face(dir.path(), ""), &Local).unwrap();
        let idx: Vec<usize> = (0..4).collect();
        let stats = |loss_sum| farout_layer::StepStats { loss_sum, classes_scored: 160, rows_updated: 4 };
        let first = t.step_result(&idx, stats(8.0), Instant::now()).unwrap();
        assert_eq!((first.samples, first.classes_scored), (4, 160));
        assert_eq!(t.state.initial_loss, 2.0);
        t.state.step = 1; // after_step counts the step
        // The threshold is BLOWUP times max(first mean, 1) = 200 per sample.
        assert!(t.step_result(&idx, stats(4.0 * 150.0), Instant::now()).is_ok());
        let e = t.step_result(&idx, stats(4.0 * 250.0), Instant::now()).err().expect("a blow-up").to_string();
        assert!(e.contains("training diverged") && e.contains("100 times"), "{e}");
        let e = t.step_result(&idx, stats(f64::NAN), Instant::now()).err().expect("NaN stops").to_string();
        assert!(e.contains("loss = NaN"), "{e}");
    }

    #[test]
    fn a_run_takes_every_step_of_its_epochs_and_lowers_the_loss() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = Trainer::new(tiny_face(dir.path(), "[checkpoint]\nenabled = false"), &Local).unwrap();
        let before = t.evaluate(t.data().test.as_ref().unwrap(), 0).unwrap()["loss"];
        let summary = t.run().unwrap();
        assert_eq!(summary.epochs, 2);
        assert_eq!(summary.steps, 2 * t.steps_per_epoch());
        assert!(summary.metrics["loss"] < before, "{} against {before}", summary.metrics["loss"]);
        assert!(dir.path().join("metrics.jsonl").exists());
    }
}
