//! Scalar logs: one small trait, a TensorBoard sink and a JSONL sink.
//!
//! tensorboard-rs is unmaintained (and pulls protobuf 2); keeping it behind [`MetricsSink`] lets
//! it be replaced without touching the training loop. It is compiled in by the `tensorboard`
//! feature (on by default); without it, `[log] tensorboard = true` is skipped with a warning.

use crate::Error;
use crate::config::LogConfig;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Receives named scalars at a training step (from whichever thread reports them).
pub trait MetricsSink: Send {
    /// Records `values` at `step`, `wall_seconds` after the start of training.
    fn record(&mut self, step: u64, wall_seconds: f64, values: &[(&str, f64)]) -> Result<(), Error>;
    /// Makes everything recorded so far durable.
    fn flush(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

/// Appends one JSON object per record to `metrics.jsonl`:
/// `{"step": 100, "wall_seconds": 3.2, "train/loss": 1.7, ...}`.
pub struct JsonlSink {
    path: PathBuf,
    w: std::io::BufWriter<std::fs::File>,
}

impl JsonlSink {
    /// Opens `path` for appending (a resumed run continues its file), or empties it first
    /// (`fresh`: a new run under the same name replaces the old run's records).
    pub fn open(path: &Path, fresh: bool) -> Result<Self, Error> {
        let io = |source| Error::Io { path: path.to_path_buf(), source };
        let f = std::fs::OpenOptions::new().create(true).append(!fresh).write(true).truncate(fresh).open(path);
        let f = f.map_err(io)?;
        Ok(Self { path: path.to_path_buf(), w: std::io::BufWriter::new(f) })
    }
}

impl MetricsSink for JsonlSink {
    fn record(&mut self, step: u64, wall_seconds: f64, values: &[(&str, f64)]) -> Result<(), Error> {
        let mut obj = serde_json::Map::new();
        obj.insert("step".into(), step.into());
        obj.insert("wall_seconds".into(), serde_json::Value::from(wall_seconds));
        for (k, v) in values {
            let v = serde_json::Number::from_f64(*v).map_or(serde_json::Value::Null, serde_json::Value::Number);
            obj.insert((*k).into(), v);
        }
        writeln!(self.w, "{}", serde_json::Value::Object(obj))
            .map_err(|source| Error::Io { path: self.path.clone(), source })
    }

    fn flush(&mut self) -> Result<(), Error> {
        self.w.flush().map_err(|source| Error::Io { path: self.path.clone(), source })
    }
}

/// Writes TensorBoard event files into a directory.
#[cfg(feature = "tensorboard")]
pub struct TensorBoardSink {
    w: tensorboard_rs::summary_writer::SummaryWriter,
}

#[cfg(feature = "tensorboard")]
impl TensorBoardSink {
    /// Creates `dir` and an event file in it; `fresh` first removes the event files of an
    /// earlier run there (TensorBoard would draw both).
    pub fn open(dir: &Path, fresh: bool) -> Result<Self, Error> {
        let io = |source| Error::Io { path: dir.to_path_buf(), source };
        std::fs::create_dir_all(dir).map_err(io)?;
        if fresh {
            for entry in std::fs::read_dir(dir).map_err(io)? {
                let path = entry.map_err(io)?.path();
                if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("events.out.tfevents")) {
                    std::fs::remove_file(&path).map_err(|source| Error::Io { path, source })?;
                }
            }
        }
        Ok(Self { w: tensorboard_rs::summary_writer::SummaryWriter::new(dir) })
    }
}

#[cfg(feature = "tensorboard")]
impl MetricsSink for TensorBoardSink {
    fn record(&mut self, step: u64, _wall: f64, values: &[(&str, f64)]) -> Result<(), Error> {
        for (k, v) in values {
            self.w.add_scalar(k, *v as f32, step as usize);
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Error> {
        self.w.flush();
        Ok(())
    }
}

/// Fans records out to several sinks.
#[derive(Default)]
pub struct Sinks(pub Vec<Box<dyn MetricsSink>>);

impl Sinks {
    /// The sinks `[log]` asks for, in `dir`: `metrics.jsonl` and TensorBoard events in `tb/`,
    /// continued by a resumed run and started afresh otherwise (`fresh`).
    pub fn open(dir: &Path, config: &LogConfig, fresh: bool) -> Result<Self, Error> {
        let mut sinks = Sinks::default();
        if config.jsonl {
            sinks.0.push(Box::new(JsonlSink::open(&dir.join("metrics.jsonl"), fresh)?));
        }
        #[cfg(feature = "tensorboard")]
        if config.tensorboard {
            sinks.0.push(Box::new(TensorBoardSink::open(&dir.join("tb"), fresh)?));
        }
        #[cfg(not(feature = "tensorboard"))]
        if config.tensorboard {
            let rest = if config.jsonl { "metrics.jsonl only" } else { "no metrics log" };
            log::warn!("TensorBoard logs need the `tensorboard` feature; writing {rest}");
        }
        Ok(sinks)
    }
}

impl Sinks {
    /// [`Sinks::open`] in `dir` (created) on rank 0 of `comm`, nothing on the other ranks: only
    /// rank 0 logs. Every rank learns if rank 0 could not open them.
    pub fn open_on_root(
        comm: &dyn farout_dist::Collective,
        dir: &Path,
        config: &LogConfig,
        fresh: bool,
    ) -> Result<Self, Error> {
        let sinks = if comm.is_root() {
            std::fs::create_dir_all(dir)
                .map_err(|source| Error::Io { path: dir.to_path_buf(), source })
                .and_then(|()| Self::open(dir, config, fresh))
        } else {
            Ok(Self::default())
        };
        crate::dist::agree(comm, sinks)
    }
}

impl MetricsSink for Sinks {
    fn record(&mut self, step: u64, wall: f64, values: &[(&str, f64)]) -> Result<(), Error> {
        self.0.iter_mut().try_for_each(|s| s.record(step, wall, values))
    }

    fn flush(&mut self) -> Result<(), Error> {
        self.0.iter_mut().try_for_each(|s| s.flush())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_writes_one_object_per_record() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.jsonl");
        let mut s = JsonlSink::open(&p, true).unwrap();
        s.record(3, 1.5, &[("train/loss", 0.25), ("eval/p@1", f64::NAN)]).unwrap();
        s.flush().unwrap();
        let line = std::fs::read_to_string(&p).unwrap();
        let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(
            (v["step"].as_u64(), v["train/loss"].as_f64(), v["eval/p@1"].is_null()),
            (Some(3), Some(0.25), true)
        );
    }

    #[test]
    fn a_resumed_run_continues_the_log_and_a_fresh_run_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.jsonl");
        let steps = || -> Vec<u64> {
            let text = std::fs::read_to_string(&p).unwrap();
            text.lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap())
                .collect()
        };
        for (fresh, step, expected) in [(true, 1, vec![1]), (false, 2, vec![1, 2]), (true, 3, vec![3])] {
            let mut s = JsonlSink::open(&p, fresh).unwrap();
            s.record(step, 0.0, &[("train/loss", 1.0)]).unwrap();
            s.flush().unwrap();
            assert_eq!(steps(), expected, "fresh = {fresh}");
        }
    }

    /// Without the feature, a config asking for TensorBoard logs still runs: JSONL only.
    #[cfg(not(feature = "tensorboard"))]
    #[test]
    fn without_the_feature_tensorboard_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig { tensorboard: true, ..LogConfig::default() };
        let sinks = Sinks::open(dir.path(), &config, true).unwrap();
        assert_eq!(sinks.0.len(), 1);
        assert!(!dir.path().join("tb").exists());
    }

    #[cfg(feature = "tensorboard")]
    #[test]
    fn tensorboard_writes_an_event_file_and_a_fresh_run_removes_the_old_ones() {
        let dir = tempfile::tempdir().unwrap();
        let tb = dir.path().join("tb");
        let files = || std::fs::read_dir(&tb).unwrap().count();
        let mut s = TensorBoardSink::open(&tb, true).unwrap();
        s.record(1, 0.0, &[("train/loss", 1.0)]).unwrap();
        s.flush().unwrap();
        drop(s);
        assert_eq!(files(), 1);
        std::fs::write(tb.join("notes.txt"), "kept").unwrap();
        // Event files are named by the second they were created in: wait for a new name.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        drop(TensorBoardSink::open(&tb, false).unwrap());
        assert_eq!(files(), 3, "a resumed run adds an event file");
        drop(TensorBoardSink::open(&tb, true).unwrap());
        assert_eq!(files(), 2, "a fresh run keeps only its own event file (and other files)");
    }
}
