//! Trials in parallel: the trials of a rung run on `jobs` workers at once, each on its own
//! rayon pool of `threads` threads, and end up in `trials.csv` in trial order.
//!
//! What a search does must not depend on which job finishes first. Workers take the rung's
//! trials in order; a trial's result goes to its slot, and the file lists the ended trials in
//! slot order; the rung ends when every launched trial has, and promotion reads the metrics in
//! slot order, as with one job. Two decisions look at other trials when a trial starts:
//!
//! - **The budget.** A trial is launched when the time left fits it (the mean seconds of its
//!   rung's ended trials, [`super::search::expected_seconds`]); once one does not fit, no later
//!   trial of the search is launched (those running finish). Only the time decides, as with one
//!   job; `--max-settings` gives a fixed amount of work.
//! - **A DiSMEC start** ([`super::warm`]): the nearest C among this rung's ended trials. With
//!   `jobs` workers the `jobs - 1` trials launched just before may still run, so they are left
//!   out, and the trial waits until every earlier one has ended: its start is the same however
//!   the jobs interleave (with one job, it is the nearest among all earlier trials, as before).
//!
//! A network trial continues its own run of the rung below, a PPDSparse or MEMOIR trial starts
//! cold: neither depends on other trials. With `train.threads = 1`, a search with N jobs gives
//! the same trials and metrics as with one (DiSMEC's figures, from other starts, agree to its
//! tolerance).

use super::recipe::Setting;
use super::search;
use super::trials::{Start, Stop, Trial};
use super::warm;
use super::{Search, Shared};
use crate::Error;
use crate::config::Config;
use crate::task::{RunSummary, TaskKind, TrainOptions};
use std::ops::Range;
use std::path::PathBuf;
use std::time::Instant;

/// How many trials run at once, and the threads of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Jobs {
    /// Trials at once.
    pub jobs: usize,
    /// Threads of each trial's pool.
    pub threads: usize,
}

impl Jobs {
    /// `asked` jobs (0: as many as fit `cores` with `threads` threads each, at least one; one
    /// when `threads` is 0, every core) of `threads` threads (0: the cores shared among the
    /// jobs, at least one each).
    pub fn new(asked: usize, threads: usize, cores: usize) -> Self {
        let jobs = match (asked, threads) {
            (0, 0) => 1,
            (0, t) => (cores / t).max(1),
            (n, _) => n,
        };
        let threads = if threads > 0 { threads } else { (cores / jobs).max(1) };
        Self { jobs, threads }
    }
}

/// A trial a worker is about to run.
pub(super) struct Job {
    /// Its place in the rung.
    pos: usize,
    id: usize,
    settings: Vec<Setting>,
    config: Config,
    /// Seconds of budget left when it was launched.
    remaining: f64,
    /// Whether it continues its network run of the rung below.
    continues: bool,
    /// The earlier DiSMEC trial whose model it starts from, and that model's directory.
    linear_start: Option<(usize, PathBuf)>,
}

impl Search<'_> {
    /// Runs the trials `alive` of rung `rung` on the jobs; appends those that ended to the
    /// search's trials in order and returns their range.
    pub(super) fn run_jobs(&mut self, rung: usize, alive: &[(usize, Vec<Setting>)]) -> Result<Range<usize>, Error> {
        let s = self.state.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        (s.slots, s.next) = (vec![None; alive.len()], 0);
        let this = &*self;
        std::thread::scope(|scope| {
            for _ in 0..self.jobs.jobs.min(alive.len()).max(1) {
                scope.spawn(|| this.worker(rung, alive));
            }
        });
        let s = self.state.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(e) = s.error.take() {
            return Err(e);
        }
        // Launched trials all end, in a prefix of the rung: no later trial starts once one did not.
        let ended: Vec<Trial> = std::mem::take(&mut s.slots).into_iter().map_while(|t| t).collect();
        let first = s.trials.len();
        s.trials.extend(ended);
        Ok(first..s.trials.len())
    }

    /// One job: takes the rung's next trial until none is left or the budget is spent.
    fn worker(&self, rung: usize, alive: &[(usize, Vec<Setting>)]) {
        let threads = self.jobs.threads;
        let pool = match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
            Ok(p) => p,
            Err(e) => {
                let msg = format!("cannot start a pool of {threads} threads for a trial: {e}");
                return self.fail(Error::Option { name: "jobs", msg });
            }
        };
        loop {
            let job = match self.next_job(rung, alive) {
                Ok(Some(job)) => job,
                Ok(None) => return,
                Err(e) => return self.fail(e),
            };
            let clock = Instant::now();
            let mut start = Start::Scratch;
            let outcome = pool.install(|| self.train_trial(&job, rung, &mut start));
            if let Err(e) = self.record(rung, job, outcome, start, clock.elapsed().as_secs_f64()) {
                return self.fail(e);
            }
        }
    }

    /// Stops every job with the first error.
    fn fail(&self, e: Error) {
        self.state().error.get_or_insert(e);
        self.ended.notify_all();
    }

    /// The rung's next trial to run, or `None` when the rung is done or the budget cannot fit
    /// it; trials reused from an earlier search are taken on the way.
    fn next_job(&self, rung: usize, alive: &[(usize, Vec<Setting>)]) -> Result<Option<Job>, Error> {
        let mut s = self.state();
        loop {
            if s.error.is_some() || s.out_of_time || s.next >= alive.len() {
                return Ok(None);
            }
            let pos = s.next;
            let (id, settings) = (alive[pos].0, &alive[pos].1);
            if let Some(t) = self.reused(&mut s, id, rung, settings)? {
                (s.slots[pos], s.next) = (Some(t), pos + 1);
                continue;
            }
            let config = self.trial_config(id, rung, settings)?;
            let continues = config.checkpoint.enabled && rung > 0 && warm::network_continues(&config, self.resource);
            let remaining = self.opts.budget - self.elapsed();
            let ended = s.ended();
            let expected = search::expected_seconds(&ended, rung, self.resource, continues).unwrap_or(0.0);
            if remaining <= 0.0 || (!ended.is_empty() && expected > remaining) {
                s.out_of_time = true;
                return Ok(None);
            }
            s.next = pos + 1;
            let mut linear_start = None;
            if config.checkpoint.enabled && warm::linear_warm(&config) {
                // Every trial launched before the last `jobs - 1` has ended: they are the starts.
                let settled = (pos + 1).saturating_sub(self.jobs.jobs);
                s = self
                    .ended
                    .wait_while(s, |s| s.error.is_none() && s.slots[..settled].iter().any(Option::is_none))
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let exclude: Vec<usize> = alive[settled..pos].iter().map(|(id, _)| *id).collect();
                linear_start = s.starts.start(id, rung, &config, &exclude).map(|(i, d)| (i, d.to_path_buf()));
            }
            let settings = settings.clone();
            return Ok(Some(Job { pos, id, settings, config, remaining, continues, linear_start }));
        }
    }

    /// The trial `id` of rung `rung` as the earlier search ran it (same settings), if it did;
    /// its model stays a start for later trials.
    fn reused(&self, s: &mut Shared, id: usize, rung: usize, settings: &[Setting]) -> Result<Option<Trial>, Error> {
        let Some(t) = self.earlier.get(&(id, rung)).filter(|t| t.settings == settings) else { return Ok(None) };
        if t.stop != Stop::Failed && !self.opts.cold {
            let c = self.trial_config(id, rung, settings)?;
            s.starts.add(id, rung, &c, &c.checkpoint_dir());
        }
        let stop = if t.stop == Stop::Failed { Stop::Failed } else { Stop::Pending };
        Ok(Some(Trial { stop, ..t.clone() }))
    }

    /// Trains `job` on the calling pool, continuing the rung below's run or starting from an
    /// earlier model where it can ([`warm`]; `start` says which); returns its summary and the
    /// epochs it was given.
    fn train_trial(&self, job: &Job, rung: usize, start: &mut Start) -> Result<(RunSummary, usize), Error> {
        let (id, mut c) = (job.id, job.config.clone());
        c.train.threads = self.jobs.threads;
        let mut options = TrainOptions { overwrite: true, ..Default::default() };
        let mut clock = 0.0;
        if job.continues {
            let below = warm::trial_dir(&self.opts.out, id, rung - 1);
            if let Some(seconds) = warm::continue_network(&below, &c.log_dir())? {
                (options.resume, options.overwrite, clock) = (true, false, seconds);
                *start = Start::Continues(id, rung - 1);
                log::info!("trial {id} (rung {rung}) continues its run of rung {} at {seconds:.1} s", rung - 1);
            }
        }
        if let Some((from, dir)) = &job.linear_start {
            log::info!("trial {id} (rung {rung}) starts from the model in {}", dir.display());
            options.warm_start = Some(dir);
            *start = Start::From(*from, rung);
        }
        if TaskKind::of(&c).takes_budget() {
            // A continued run's clock counts the rung below's training seconds.
            c.train.max_seconds = clock + job.remaining.max(1.0);
        }
        let summary = crate::train(&c, &options, &farout_dist::Local)?;
        Ok((summary, c.train.epochs))
    }

    /// Records the trial `job` ran: its slot, its model as a start for later trials, trials.csv
    /// and the progress bar.
    fn record(
        &self,
        rung: usize,
        job: Job,
        outcome: Result<(RunSummary, usize), Error>,
        start: Start,
        seconds: f64,
    ) -> Result<(), Error> {
        let (id, trained) = (job.id, outcome.is_ok());
        let (metric, stop) = match outcome {
            Ok((summary, epochs)) => {
                let cut = match &summary {
                    RunSummary::Classifier(s) => {
                        let early = s.selection.as_ref().is_some_and(|x| x.stopped_early);
                        s.epochs < epochs && !early && self.resource != search::Resource::Rows
                    }
                    RunSummary::SkipGram(s) => s.epochs < epochs,
                };
                (self.metric.value(&summary), if cut { Stop::Budget } else { Stop::Pending })
            }
            Err(e) => {
                log::warn!("trial {id} (rung {rung}) failed: {e}");
                (None, Stop::Failed)
            }
        };
        let stop = if metric.is_none() { Stop::Failed } else { stop };
        let mut s = self.state();
        if trained && job.config.checkpoint.enabled && self.kind == TaskKind::Linear {
            s.starts.add(id, rung, &job.config, &job.config.checkpoint_dir());
        }
        s.out_of_time |= stop == Stop::Budget;
        let (resource, elapsed, start) = (self.resource.at(rung), self.elapsed(), start.to_string());
        let trial = Trial { id, rung, resource, settings: job.settings, metric, seconds, elapsed, stop, start };
        s.slots[job.pos] = Some(trial);
        self.ended.notify_all();
        let ended = s.ended();
        self.update_bar(&ended);
        super::trials::write(&self.opts.out.join("trials.csv"), &ended)?;
        // Recorded first: a search stopped in between resumes with the checkpoints it needs.
        let slots = s.slots.clone();
        drop(s);
        self.prune(&slots, rung)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_default_to_what_fits_the_cores() {
        assert_eq!(Jobs::new(0, 1, 2), Jobs { jobs: 2, threads: 1 });
        assert_eq!(Jobs::new(0, 2, 2), Jobs { jobs: 1, threads: 2 });
        assert_eq!(Jobs::new(0, 3, 2), Jobs { jobs: 1, threads: 3 }, "at least one job");
        assert_eq!(Jobs::new(0, 0, 8), Jobs { jobs: 1, threads: 8 }, "every core: one job");
        assert_eq!(Jobs::new(2, 0, 8), Jobs { jobs: 2, threads: 4 }, "the cores shared");
        assert_eq!(Jobs::new(3, 0, 2), Jobs { jobs: 3, threads: 1 });
        assert_eq!(Jobs::new(2, 1, 16), Jobs { jobs: 2, threads: 1 });
    }
}
