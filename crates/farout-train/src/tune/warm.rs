//! Warm starts: a trial begins where an earlier trial's weights left off instead of from
//! nothing, when that gives the same figure as training from scratch.
//!
//! - **A promoted network trial continues** its own run of the rung below: the trial's
//!   directory (logs, resume checkpoint, kept-best checkpoint) is copied to the new rung's and
//!   the run resumes with the rung's epochs. A classifier's step-size schedules depend on the
//!   step alone (SGD's `lr / (1 + decay t)`, A&R's), its batches on the seed and the epoch, and
//!   the resume checkpoint holds the optimiser state, the index and the validation record
//!   (best figure, evaluations since it, for `train.patience`), so the continued run is the
//!   longer run from scratch: the same steps, the same validation figures, the same kept
//!   weights. It needs validation at epoch ends (`eval.every_steps = 0`, the default): with
//!   evaluation every N steps, the shorter run's final step adds an evaluation the longer run
//!   does not make, so such trials train from scratch. Skip-gram's learning rate decays
//!   linearly over all of the run's epochs, so a shorter run is not the start of a longer one:
//!   skip-gram trials train from scratch.
//! - **A linear solver starts from an earlier model** where it allows it
//!   ([`farout_linear::LinearSolver::warm_starts`]: DiSMEC): a trial from the model of the
//!   nearest earlier C (in log C) trained on the same rows (the same rung) with the same data
//!   settings, and the final run from the best trial's model. The solution is the cold fit's to
//!   the solver's tolerance ([`farout_linear::FromModel`]); only the time changes. A promoted
//!   trial does not start from its own model of the rung below: fitted on a third of the rows,
//!   it was no better a start than DiSMEC's mean-separating one (docs/decisions.md,
//!   "tune-warm-starts").

use super::search::Resource;
use crate::config::Config;
use crate::{Error, io_err};
use std::path::{Path, PathBuf};

/// The directory of trial `id` at rung `rung`: `DIR/trials/<id>-r<rung>`.
pub fn trial_dir(out: &Path, id: usize, rung: usize) -> PathBuf {
    out.join("trials").join(format!("{id}-r{rung}"))
}

/// Whether a trial of `config` can continue its run of the rung below (see the module docs).
pub fn network_continues(config: &Config, resource: Resource) -> bool {
    crate::task::TaskKind::of(config) == crate::task::TaskKind::Classifier
        && matches!(resource, Resource::Epochs(_))
        && config.eval.every_steps == 0
}

/// Copies the run of the rung below (`from`) to `to`, replacing what `to` holds, when `from`
/// holds a resume checkpoint; returns that checkpoint's training seconds (the continued run's
/// clock starts there), or `None` when there is nothing to continue.
pub fn continue_network(from: &Path, to: &Path) -> Result<Option<f64>, Error> {
    let Ok(found) = crate::checkpoint::latest(&from.join("checkpoint")) else { return Ok(None) };
    let state: serde_json::Value = crate::checkpoint::read_state(&found.dir, "training state")?;
    let Some(seconds) = state.get("train_seconds").and_then(serde_json::Value::as_f64) else {
        return Ok(None);
    };
    if to.exists() {
        std::fs::remove_dir_all(to).map_err(io_err(to))?;
    }
    copy_dir(from, to)?;
    Ok(Some(seconds))
}

/// Copies the directory tree `from` to `to` (files and directories; the lock file too, which
/// is only a name to lock).
fn copy_dir(from: &Path, to: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(to).map_err(io_err(to))?;
    for entry in std::fs::read_dir(from).map_err(io_err(from))? {
        let entry = entry.map_err(io_err(from))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type().map_err(io_err(&src))?.is_dir() {
            copy_dir(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).map_err(io_err(&src))?;
        }
    }
    Ok(())
}

/// A linear trial's saved model, a possible start for later trials.
#[derive(Clone, Debug)]
struct Fit {
    id: usize,
    rung: usize,
    /// The trial's `[data]` settings (its preprocessing and rows), as text.
    data: String,
    /// ln C (DiSMEC).
    log_c: f64,
    /// The checkpoint directory holding its model.
    dir: PathBuf,
}

/// The models of the linear trials so far, and which one a new trial starts from.
#[derive(Clone, Debug, Default)]
pub struct LinearStarts {
    fits: Vec<Fit>,
}

/// Whether a linear trial of `config` may start from an earlier trial's model (DiSMEC).
pub fn linear_warm(config: &Config) -> bool {
    log_c(config).is_some()
}

/// ln C of a config whose solver warm-starts, or `None`.
fn log_c(config: &Config) -> Option<f64> {
    match config.linear.as_ref()? {
        farout_linear::SolverConfig::Dismec(d) => Some(d.c.ln()),
        _ => None,
    }
}

impl LinearStarts {
    /// Records the model trial `id` of rung `rung` (trained with `config`) saved in `dir`.
    pub fn add(&mut self, id: usize, rung: usize, config: &Config, dir: &Path) {
        let model = dir.join(crate::linear::MODEL_FILE);
        if let (Some(log_c), true) = (log_c(config), model.exists()) {
            let data = format!("{:?}", config.data);
            self.fits.push(Fit { id, rung, data, log_c, dir: dir.to_path_buf() });
        }
    }

    /// Whether the checkpoint directory `dir` holds a recorded model.
    pub fn has(&self, dir: &Path) -> bool {
        self.fits.iter().any(|f| f.dir == dir)
    }

    /// The trial trial `id` of rung `rung` (with `config`) starts from and its checkpoint
    /// directory: the model of the nearest C (ties: the earlier trial) among this rung's trials
    /// with the same data settings, other than those in `exclude`; `None` for a cold start.
    /// (Parallel jobs exclude the `jobs - 1` trials launched just before this one, which may
    /// still run, so that the start does not depend on which job finishes first.)
    pub fn start(&self, id: usize, rung: usize, config: &Config, exclude: &[usize]) -> Option<(usize, &Path)> {
        let log_c = log_c(config)?;
        let data = format!("{:?}", config.data);
        let same =
            self.fits.iter().filter(|f| f.rung == rung && f.data == data && f.id != id && !exclude.contains(&f.id));
        same.min_by(|a, b| (a.log_c - log_c).abs().total_cmp(&(b.log_c - log_c).abs())).map(|f| (f.id, f.dir.as_path()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dismec(c: f64, tfidf: bool, fraction: f64) -> Config {
        let text = format!(
            "[data]\nformat = \"synthetic_xmc\"\ntfidf = {tfidf}\ntrain_fraction = {fraction:?}\n\
             [linear]\nsolver = \"dismec\"\nc = {c:?}\n"
        );
        Config::parse(&text, &[]).unwrap()
    }

    #[test]
    fn a_linear_trial_starts_from_the_nearest_c_on_the_same_rows_with_the_same_data() {
        let dir = tempfile::tempdir().unwrap();
        let saved = |name: &str| {
            let d = dir.path().join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(crate::linear::MODEL_FILE), b"").unwrap();
            d
        };
        let mut starts = LinearStarts::default();
        let (a, b, c, e) = (saved("a"), saved("b"), saved("c"), saved("e"));
        starts.add(0, 0, &dismec(1.0, true, 0.1), &a);
        starts.add(1, 0, &dismec(5.0, true, 0.1), &b);
        starts.add(2, 0, &dismec(3.0, false, 0.1), &c);
        starts.add(3, 0, &dismec(3.0, true, 0.1), &dir.path().join("no-model"));
        starts.add(4, 1, &dismec(3.0, true, 0.3), &e);
        // C = 3 is nearer 5 than 1 in log C; the trial with other data settings is not a start.
        assert_eq!(starts.start(5, 0, &dismec(3.0, true, 0.1), &[]), Some((1, b.as_path())));
        assert_eq!(starts.start(5, 0, &dismec(3.0, true, 0.1), &[1]), Some((0, a.as_path())), "1 excluded");
        assert_eq!(starts.start(5, 0, &dismec(1.5, true, 0.1), &[]), Some((0, a.as_path())));
        assert_eq!(starts.start(5, 0, &dismec(1.5, false, 0.1), &[]), Some((2, c.as_path())));
        // Only models of the same rows: a promoted trial starts from its rung's earlier trials.
        assert_eq!(starts.start(1, 1, &dismec(5.0, true, 0.3), &[]), Some((4, e.as_path())));
        assert_eq!(starts.start(4, 2, &dismec(3.0, true, 1.0), &[]), None, "nothing at the top rung yet");
        assert_eq!(starts.start(1, 1, &dismec(5.0, false, 0.3), &[]), None, "nor with other data settings");
        let ppd = Config::parse("[data]\nformat = \"synthetic_xmc\"\n[linear]\nsolver = \"ppdsparse\"\n", &[]).unwrap();
        assert_eq!(starts.start(5, 1, &ppd, &[]), None, "PPDSparse starts cold");
    }
}
