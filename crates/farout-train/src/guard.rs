//! What a training run may write to: its directories are locked for the run's lifetime, and a
//! directory that already holds a run is not replaced unless the user says so.
//!
//! The lock is an advisory `flock` on `<log dir>/farout.lock` (and `<checkpoint dir>.lock` when
//! the checkpoint directory lies elsewhere): the operating system releases it when the process
//! ends, however it ends, so a killed run never leaves a stale lock behind.

use crate::{Config, Error, io_err as io};
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};

/// How a run treats what its directories already hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// A new run: refused if the directories hold one.
    Fresh,
    /// Continue the run whose checkpoint is there.
    Resume,
    /// Replace what is there: the old checkpoint and model are removed once the new run is set
    /// up ([`RunGuard::clear_previous`]), logs are started afresh.
    Overwrite,
}

/// Holds the locks of a run's directories until dropped.
#[derive(Debug)]
pub struct RunGuard {
    _locks: Vec<File>,
    /// The checkpoint directory of a run to replace.
    replace: Option<PathBuf>,
}

impl RunGuard {
    /// Locks the config's log (and checkpoint) directory, then checks what they hold against
    /// `start`.
    pub fn acquire(config: &Config, start: Start) -> Result<Self, Error> {
        let log_dir = config.log_dir();
        let ck_dir = config.checkpoint_dir();
        let mut lock_files = vec![log_dir.join("farout.lock")];
        if !ck_dir.starts_with(&log_dir) {
            let mut name = ck_dir.file_name().unwrap_or_default().to_os_string();
            name.push(".lock");
            lock_files.push(ck_dir.with_file_name(name));
        }
        let _locks = lock_files.iter().map(|p| lock(p)).collect::<Result<Vec<_>, _>>()?;
        match (start, previous_run(config)) {
            (Start::Fresh, Some(what)) => Err(Error::RunExists { dir: log_dir, what }),
            (Start::Overwrite, Some(_)) => Ok(Self { _locks, replace: Some(ck_dir) }),
            _ => Ok(Self { _locks, replace: None }),
        }
    }

    /// With [`Start::Overwrite`], removes the previous run's checkpoint and model. Called once
    /// the new run is set up, so that a run failing on its data or config replaces nothing.
    pub fn clear_previous(&mut self) -> Result<(), Error> {
        let Some(ck_dir) = self.replace.take() else { return Ok(()) };
        for dir in crate::checkpoint::with_siblings(&ck_dir) {
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
            }
        }
        log::warn!("replaced the previous run's checkpoint in {}", ck_dir.display());
        Ok(())
    }
}

/// Creates `path` (and its directory) and takes an exclusive lock on it without waiting.
fn lock(path: &Path) -> Result<File, Error> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(io(path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(Error::Locked { path: path.to_path_buf() }),
        Err(TryLockError::Error(e)) => Err(Error::Io { path: path.to_path_buf(), source: e }),
    }
}

/// What a previous run left in the config's directories, if anything: its checkpoint directory
/// (which holds a linear model too) or its metrics log.
fn previous_run(config: &Config) -> Option<String> {
    let metrics = config.log_dir().join("metrics.jsonl");
    let mut found: Vec<PathBuf> = crate::checkpoint::with_siblings(&config.checkpoint_dir()).into();
    found.push(metrics);
    found.retain(|p| p.exists());
    (!found.is_empty()).then(|| found.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))
}
