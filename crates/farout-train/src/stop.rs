//! A request to stop training cleanly, from outside the run (Ctrl-C in the Python package, or
//! any embedding program): a network's run stops after the step it is taking, saves its
//! checkpoint and returns [`crate::Error::Interrupted`]; `--resume` continues it.
//!
//! The request is process-wide, as a signal is: [`request`] sets it, [`clear`] resets it
//! before the next run.

use std::sync::atomic::{AtomicBool, Ordering};

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
