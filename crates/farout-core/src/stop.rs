//! A request to stop training cleanly, from outside the run (Ctrl-C in the Python package, or
//! any embedding program). Every training loop checks it where it checks its deadline
//! ([`due`]): a network's run or a skip-gram run stops after the step or sentence it is
//! taking, saves its checkpoint and says how to continue it (`--resume`); a linear solver stops
//! after the labels (or the batch) it is solving and keeps no model, since a partial one
//! would predict only some labels.
//!
//! The request is process-wide, as a signal is: [`request`] sets it, [`clear`] resets it
//! before the next run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Asks the running training to stop after its current step.
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Whether a stop was requested since the last [`clear`].
pub fn requested() -> bool {
    REQUESTED.load(Ordering::Relaxed)
}

/// Forgets a request (call before starting a run).
pub fn clear() {
    REQUESTED.store(false, Ordering::SeqCst);
}

/// Whether a loop with an optional `deadline` should stop now: a stop was requested or the
/// deadline has passed.
pub fn due(deadline: Option<Instant>) -> bool {
    requested() || deadline.is_some_and(|d| Instant::now() >= d)
}
