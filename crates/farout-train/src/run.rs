//! One entry for training: [`train`] takes a loaded config, checks the options against its task,
//! locks the run's directories, opens the task ([`crate::task::open`]) and trains it.

use crate::dist::{agree, check_same_config};
use crate::guard::{RunGuard, Start};
use crate::task::{RunSummary, TaskKind, TrainOptions};
use crate::{Config, Error};
use farout_dist::Collective;

/// Trains the model `config` describes as one of the ranks of `comm` ([`farout_dist::Local`]
/// for one process), with its logs, checkpoints and progress bar. The run's directories are
/// locked while it runs (see [`crate::guard`]). With several ranks every rank must have loaded
/// the same config; rank 0 locks the run's directories and writes logs; each rank trains its
/// share of a linear model's labels (or MEMOIR's classes), or of a network's output layer.
pub fn train(config: &Config, options: &TrainOptions, comm: &dyn Collective) -> Result<RunSummary, Error> {
    check_same_config(comm, config)?;
    let kind = TaskKind::of(config);
    if comm.size() > 1 && !kind.shares_ranks() {
        return Err(Error::NoData(
            "under mpirun, farout trains linear configs (the labels or classes split over the ranks) and the \
             face head and document encoder (the output layer split over the ranks); skip-gram runs in one \
             process: run it without mpirun",
        ));
    }
    let start = match (options.resume, options.overwrite) {
        (true, true) => {
            return Err(Error::Option { name: "overwrite", msg: "cannot be combined with --resume".into() });
        }
        (true, false) => Start::Resume,
        (false, true) => Start::Overwrite,
        (false, false) => Start::Fresh,
    };
    kind.check_options(options)?;
    // Rank 0 holds the lock and replaces a previous run; every rank learns if it failed.
    let guard = if comm.is_root() { RunGuard::acquire(config, start).map(Some) } else { Ok(None) };
    let mut guard = agree(comm, guard)?;
    let mut task = crate::task::open(config.clone(), comm)?;
    agree(comm, guard.as_mut().map_or(Ok(()), RunGuard::clear_previous))?;
    task.train(options)
}
