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
        for dir in run_checkpoints(&ck_dir) {
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

/// The directories of a run whose checkpoint directory is `ck_dir`: it, the directories a save
/// passes through, and the same for the weights kept as the best on validation
/// (`<checkpoint dir>-best`, [`Config::best_checkpoint_dir`]).
fn run_checkpoints(ck_dir: &Path) -> Vec<PathBuf> {
    let mut best = ck_dir.file_name().unwrap_or_default().to_os_string();
    best.push("-best");
    let best = ck_dir.with_file_name(best);
    crate::checkpoint::with_siblings(ck_dir).into_iter().chain(crate::checkpoint::with_siblings(&best)).collect()
}

/// What a previous run left in the config's directories, if anything: its checkpoint directory
/// (which holds a linear model too), its kept best weights or its metrics log.
fn previous_run(config: &Config) -> Option<String> {
    let metrics = config.log_dir().join("metrics.jsonl");
    let mut found: Vec<PathBuf> = run_checkpoints(&config.checkpoint_dir());
    found.push(metrics);
    found.retain(|p| p.exists());
    (!found.is_empty()).then(|| found.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))
}

/// What a command reads or owns, against which every file it writes is checked, in one place:
/// the config, the files it names (data, test set, corpus, evaluation files), the command's own
/// inputs, and the run's files (its checkpoint directory and the copies beside it, where the
/// trained model lives, its log, lock and generated corpus). Writing onto any of them would
/// destroy it.
#[derive(Clone, Debug, Default)]
pub struct Protected {
    /// Single files, each with what it is (`"config"`, `"data.train"`, `"--input"`).
    files: Vec<(String, PathBuf)>,
    /// Directories no output may enter, each with what it holds.
    dirs: Vec<(String, PathBuf)>,
}

/// Files of a run's log directory that the run writes itself.
const RUN_FILES: [&str; 6] =
    ["farout.lock", "metrics.jsonl", "corpus.txt", "corpus.json", "heldout.txt", "heldout.json"];

impl Protected {
    /// The config at `config_path`, the files `config` reads and the run's own files.
    pub fn of_run(config_path: &Path, config: &Config) -> Self {
        let (d, e) = (&config.data, &config.eval);
        let mut p = Self::default().with("config", Some(config_path));
        let named = [
            ("data.train", &d.train),
            ("data.test", &d.test),
            ("data.train_labels", &d.train_labels),
            ("data.test_labels", &d.test_labels),
            ("data.corpus", &d.corpus),
            ("eval.heldout", &e.heldout),
            ("eval.analogy", &e.analogy),
            ("eval.similarity", &e.similarity),
        ];
        for (what, path) in named {
            p = p.with(what, path.as_deref());
        }
        let log = config.log_dir();
        for name in RUN_FILES {
            p = p.with(&format!("run's {name}"), Some(&log.join(name)));
        }
        p.dirs.push(("run's TensorBoard log".into(), log.join("tb")));
        let ck = config.checkpoint_dir();
        let best = config.best_checkpoint_dir();
        let previous = [crate::checkpoint::previous(&ck), crate::checkpoint::previous(&best)];
        for dir in run_checkpoints(&ck).into_iter().chain(previous) {
            p.dirs.push(("checkpoint directory (the trained model)".into(), dir));
        }
        p
    }

    /// These and `path` (if given), described as `what`.
    pub fn with(mut self, what: &str, path: Option<&Path>) -> Self {
        self.files.extend(path.map(|p| (what.to_string(), p.to_path_buf())));
        self
    }

    /// These and the directory `dir` (if given), holding `what`.
    pub fn with_dir(mut self, what: &str, dir: Option<&Path>) -> Self {
        self.dirs.extend(dir.map(|d| (what.to_string(), d.to_path_buf())));
        self
    }

    /// An error naming both paths if `out`, written for the option `--option`, is one of the
    /// protected files or lies in a protected directory.
    pub fn check(&self, option: &'static str, out: &Path) -> Result<(), Error> {
        let target = resolve(out);
        let clash = |msg: String| Error::Option { name: option, msg };
        for (what, p) in &self.files {
            if resolve(p) == target {
                let same = if p == out { String::new() } else { format!(" ({})", p.display()) };
                return Err(clash(format!(
                    "{} is the {what} file{same}: writing there would destroy it",
                    out.display()
                )));
            }
        }
        for (what, dir) in &self.dirs {
            if target.starts_with(resolve(dir)) {
                return Err(clash(format!(
                    "{} lies in the {what} {}: writing there would destroy it; write elsewhere",
                    out.display(),
                    dir.display()
                )));
            }
        }
        Ok(())
    }
}

/// `p` made absolute, `.` and `..` taken lexically, links resolved as far as it exists (a file
/// to be written does not exist yet: its nearest existing ancestor is resolved and the rest
/// appended).
fn resolve(p: &Path) -> PathBuf {
    use std::path::Component;
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let mut lexical = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                lexical.pop();
            }
            c => lexical.push(c),
        }
    }
    let mut existing = lexical.as_path();
    let mut rest = Vec::new();
    while !existing.try_exists().unwrap_or(false) {
        let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else { return lexical };
        rest.push(name.to_os_string());
        existing = parent;
    }
    let mut out = std::fs::canonicalize(existing).unwrap_or_else(|_| existing.to_path_buf());
    out.extend(rest.iter().rev());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_onto_the_config_the_data_or_into_the_checkpoint_are_refused_naming_both_paths() {
        let dir = tempfile::tempdir().unwrap();
        let mut config =
            Config::parse("[data]\nformat = \"synthetic_xmc\"\n[linear]\nsolver = \"dismec\"\n", &[]).unwrap();
        let train = dir.path().join("train.txt");
        std::fs::write(&train, "1 1 1\n0 0:1\n").unwrap();
        config.data.train = Some(train.clone());
        config.log.dir = Some(dir.path().join("run"));
        let config_path = dir.path().join("c.toml");
        std::fs::write(&config_path, "").unwrap();
        let p = Protected::of_run(&config_path, &config).with("--input", Some(Path::new("in.txt")));
        let e = p.check("out", &dir.path().join("sub/../c.toml")).unwrap_err().to_string();
        assert!(e.starts_with("--out: ") && e.contains("is the config file ("), "{e}");
        let e = p.check("summary", &train).unwrap_err().to_string();
        assert!(e.contains("is the data.train file: writing there would destroy it"), "{e}");
        let manifest = dir.path().join("run/checkpoint/manifest.json");
        let e = p.check("summary", &manifest).unwrap_err().to_string();
        assert!(e.contains("lies in the checkpoint directory (the trained model)"), "{e}");
        assert!(e.contains(&dir.path().join("run/checkpoint").display().to_string()), "{e}");
        assert!(p.check("out", &dir.path().join("run/checkpoint.tmp/layer.bin")).is_err());
        assert!(p.check("out", &dir.path().join("run/checkpoint-best/layer.bin")).is_err(), "the kept best weights");
        assert!(p.check("out", &dir.path().join("run/metrics.jsonl")).is_err());
        assert!(p.check("out", Path::new("in.txt")).is_err());
        assert!(p.check("out", &dir.path().join("run/predictions.txt")).is_ok());
        assert!(p.check("out", &dir.path().join("checkpoint-copy.txt")).is_ok());
    }
}
