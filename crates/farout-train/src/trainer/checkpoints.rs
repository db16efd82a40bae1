//! Checkpoints of a classifier run: written atomically after checking the weights are finite,
//! read back with their manifest checked, one directory per rank for a class-sharded layer.

use super::{Encoder, State, Trainer};
use crate::Error;
use farout_dist::Collective;
use std::path::{Path, PathBuf};

/// The name of rank `rank`'s checkpoint directory (inside the config's) in a run on `ranks`.
pub(crate) fn rank_checkpoint(rank: usize, ranks: usize) -> String {
    format!("rank-{rank}-of-{ranks}")
}

/// The file of a class-sharded checkpoint that says how its ranks split the classes (the same
/// in every rank's directory): [`CLASS_LAYOUT`], class c on rank c mod P. A rank's directory
/// without it was written by ranks that held contiguous ranges of classes.
pub(crate) const CLASS_LAYOUT_FILE: &str = "class_layout.json";

/// The contents of [`CLASS_LAYOUT_FILE`].
pub(crate) const CLASS_LAYOUT: &str = "{\"classes\": \"strided\", \"rank_of_class\": \"class mod ranks\"}\n";

/// An error unless the rank checkpoint `dir` splits its classes as this version does
/// ([`CLASS_LAYOUT_FILE`]), saying how to convert one that does not.
pub(crate) fn check_class_layout(dir: &Path, ranks: usize) -> Result<(), Error> {
    let path = dir.join(CLASS_LAYOUT_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) if s == CLASS_LAYOUT => Ok(()),
        Ok(s) => Err(Error::Checkpoint {
            path,
            msg: format!("says the classes are split as {}, which this version does not read", s.trim()),
        }),
        Err(_) => Err(Error::Checkpoint {
            path: dir.to_path_buf(),
            msg: format!(
                "has no {CLASS_LAYOUT_FILE}: its ranks held contiguous ranges of classes (an earlier farout); \
                 `farout reshard CHECKPOINT --ranks {ranks} --out NEW` rewrites it with every rank holding every \
                 {ranks}-th class"
            ),
        }),
    }
}

/// Ranks of the checkpoints inside `dir` (`rank-R-of-P` directories and their save siblings):
/// the distinct P found.
pub(crate) fn checkpoint_rank_counts(dir: &Path) -> Vec<usize> {
    let mut found: Vec<usize> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_prefix("rank-")?;
            let (_, of) = rest.split_once("-of-")?;
            of.split('.').next()?.parse().ok()
        })
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}

/// The lowest and highest of the ranks' `step`.
fn step_range(comm: &dyn Collective, step: u64) -> Result<(u64, u64), Error> {
    let mut steps = [step as f64, -(step as f64)];
    comm.allreduce_max_f64(&mut steps)?;
    Ok((-steps[1] as u64, steps[0] as u64))
}

/// A weight or bias of the output layer larger than this in magnitude means the run has blown
/// up even when its loss looks fine (a margin loss is 0 once every margin is met, however large
/// the weights): at 10^8 the spacing of f32 values is 8 (2^-24 relative), so an update of any
/// sensible size no longer moves the weight, and scores of 10^8 |phi| are far beyond the scale of
/// every loss (a margin of 1; softmax's exp overflows past 88). The check runs at logging steps
/// on the rows the step updated, and on the whole layer before a checkpoint is written.
pub const WEIGHT_LIMIT: f32 = 1e8;

impl Trainer<'_> {
    /// This rank's checkpoint directory: the config's, or with a class-sharded layer its
    /// `rank-R-of-P` directory inside it.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.rank_dir(self.config.checkpoint_dir())
    }

    /// This rank's directory of the checkpoint directory `dir`: `dir` itself, or with a
    /// class-sharded layer its `rank-R-of-P` directory inside it.
    fn rank_dir(&self, dir: PathBuf) -> PathBuf {
        match self.shard {
            Some(s) => dir.join(rank_checkpoint(s.rank(), s.ranks())),
            None => dir,
        }
    }

    /// The checkpoint a trained model is read from by default: the weights kept as the best on
    /// validation (`<checkpoint dir>-best`) when the run kept them, else the last step's.
    pub fn kept_checkpoint_dir(&self) -> PathBuf {
        let best = self.config.best_checkpoint_dir();
        if best.exists() { best } else { self.config.checkpoint_dir() }
    }

    /// [`Trainer::save_checkpoint`] on every rank of `comm` (each its own rows); every rank
    /// learns if one failed.
    pub fn save_checkpoint(&self) -> Result<PathBuf, Error> {
        crate::dist::agree(self.comm, self.write_checkpoint_in(&self.config.checkpoint_dir(), true))
    }

    /// Writes this rank's checkpoint in the checkpoint directory `base` atomically (see
    /// [`crate::checkpoint`]), after checking that the weights are finite: a checkpoint is
    /// never written from a diverged model. The layer's index goes with it `with_index` (for a
    /// checkpoint a run resumes from; one only evaluated reads the weights alone).
    pub(super) fn write_checkpoint_in(&self, base: &Path, with_index: bool) -> Result<PathBuf, Error> {
        let dir = self.rank_dir(base.to_path_buf());
        // A feature-sharded encoder's whole table, joined first: every rank takes part.
        let encoder_table = match &self.encoder {
            Encoder::Doc(e) if e.deal().ranks() > 1 => Some(crate::dist::join_doc_table(self.comm, e)?),
            _ => None,
        };
        if let Err(e) = self.check_weights_finite(&dir) {
            return Err(self.diverged(format!("non-finite weights ({e})")));
        }
        self.check_weight_scale(true)?;
        // The ranks of a sharded layer keep their previous checkpoint too (see load_checkpoint).
        crate::checkpoint::replace_dir_keeping(&dir, self.state.step, self.shard.is_some(), |tmp| {
            self.layer.save(&tmp.join("layer.bin"))?;
            if self.shard.is_some() {
                let path = tmp.join(CLASS_LAYOUT_FILE);
                std::fs::write(&path, CLASS_LAYOUT).map_err(|source| Error::Io { path, source })?;
            }
            if with_index {
                self.layer.save_index(tmp)?;
            }
            match (&self.encoder, &encoder_table) {
                (Encoder::Doc(e), Some((table, state))) => e.save_joined(tmp, table, state)?,
                (Encoder::Doc(e), None) => e.save(tmp)?,
                (Encoder::Face(_), _) => {}
            }
            if let Some(st) = self.estimator.sample_state() {
                crate::checkpoint::write_f32_file(&tmp.join("estimator_state.bin"), &st.to_vec())?;
            }
            let state = serde_json::to_string_pretty(&self.state).expect("state serialises");
            std::fs::write(tmp.join("state.json"), state)
                .map_err(|source| Error::Io { path: tmp.to_path_buf(), source })
        })
    }

    /// An error naming the first non-finite weight of the layer (W, bias) or of the document
    /// encoder (embedding table, hidden bias), as if they were files in `dir`.
    fn check_weights_finite(&self, dir: &Path) -> Result<(), Error> {
        let layer = dir.join("layer.bin");
        crate::checkpoint::check_finite(&layer, "output layer W", self.layer.weights().as_slice())?;
        if let Some(b) = self.layer.bias() {
            crate::checkpoint::check_finite(&layer, "output layer bias", b)?;
        }
        if let Encoder::Doc(e) = &self.encoder {
            crate::checkpoint::check_finite(&dir.join("table.bin"), "encoder embedding table", e.table().as_slice())?;
            crate::checkpoint::check_finite(&dir.join("hidden.bpk"), "encoder hidden bias", &e.hidden_bias())?;
        }
        Ok(())
    }

    /// An error stopping the run when a weight or bias of the layer (`whole`) or of the rows
    /// the last step updated exceeds [`WEIGHT_LIMIT`] in magnitude, or is NaN.
    pub(super) fn check_weight_scale(&self, whole: bool) -> Result<(), Error> {
        let scale = if whole { self.layer.scale() } else { self.layer.updated_scale() };
        if scale <= WEIGHT_LIMIT {
            return Ok(());
        }
        Err(self.diverged(format!(
            "an output-layer weight reaches {scale:.4e}, beyond {WEIGHT_LIMIT:e}, whatever the loss says"
        )))
    }

    /// The error that stops a diverged run: what went wrong, the checkpoint that is kept and
    /// the keys to change.
    pub(super) fn diverged(&self, why: String) -> Error {
        let dir = self.checkpoint_dir();
        let kept = match crate::checkpoint::latest(&dir) {
            Ok(found) => {
                format!("the last good checkpoint (step {}) is kept at {}", found.progress, found.dir.display())
            }
            Err(_) => "no checkpoint had been written yet".into(),
        };
        let keys = match self.encoder {
            Encoder::Doc(_) => "output.optimizer.lr, model.doc_encoder.optimizer.lr",
            Encoder::Face(_) => "output.optimizer.lr",
        };
        Error::Diverged { step: self.state.step, why, kept, keys: keys.into() }
    }

    /// Restores layer (with its index when resuming), encoder and progress from the newest
    /// complete checkpoint in `dir` (or, after a save was interrupted, beside it: see
    /// [`crate::checkpoint`]). Files are checked against the checkpoint's manifest, and NaN or
    /// infinite weights are refused. Evaluation (`resume` false) reads the weights alone: the optimiser the config builds may
    /// differ from the one the run trained with.
    fn load_checkpoint_files(&mut self, dir: &Path, resume: bool) -> Result<(), Error> {
        let dir = &crate::checkpoint::open(dir)?;
        if let Some(s) = self.shard {
            check_class_layout(dir, s.ranks())?;
        }
        let state: State = crate::checkpoint::read_state(dir, "training state")?;
        if resume {
            self.layer.load(&dir.join("layer.bin"))?;
            // The index the run had, when the checkpoint carries one (else built at the next
            // search step).
            self.layer.load_index(dir)?;
        } else {
            self.layer.load_weights(&dir.join("layer.bin"))?;
        }
        if let Encoder::Doc(e) = &mut self.encoder {
            e.load(dir)?;
        }
        if let Some(st) = self.estimator.sample_state() {
            // Per-sample variational state (A&R): its length is fixed by the training set.
            let mut vals = vec![0.0f32; st.len() * st.width()];
            let path = dir.join("estimator_state.bin");
            crate::checkpoint::read_f32_file(&path, &mut vals)?;
            crate::checkpoint::check_finite(&path, "estimator state", &vals)?;
            st.restore(&vals);
        }
        self.check_weights_finite(dir)?;
        self.state = state;
        Ok(())
    }

    /// Loads this rank's checkpoint of `dir` (the config's checkpoint directory by default):
    /// its `rank-R-of-P` directory for a class-sharded layer. A checkpoint written by another
    /// number of ranks, or ranks whose checkpoints are at different steps, are errors on every
    /// rank.
    pub fn load_checkpoint(&mut self, dir: &Path) -> Result<(), Error> {
        self.load_checkpoint_for(dir, false)
    }

    /// [`Self::load_checkpoint`], with the optimiser's state when the run is to be resumed.
    fn load_checkpoint_for(&mut self, dir: &Path, resume: bool) -> Result<(), Error> {
        let comm = self.comm;
        let ranks = comm.size();
        let written = checkpoint_rank_counts(dir);
        let loaded = match (written.as_slice(), ranks) {
            ([], 1) => self.load_checkpoint_files(dir, resume),
            ([p], _) if *p == ranks => {
                self.load_checkpoint_files(&dir.join(rank_checkpoint(comm.rank(), ranks)), resume)
            }
            ([], _) => Err(Error::Checkpoint {
                path: dir.to_path_buf(),
                msg: format!("holds a checkpoint of one process, not of {ranks} MPI ranks: run without mpirun"),
            }),
            (found, _) => Err(Error::Checkpoint {
                path: dir.to_path_buf(),
                msg: format!(
                    "holds the checkpoints of {} MPI ranks; run with that many (mpirun -np {}), not {ranks}",
                    found.iter().map(usize::to_string).collect::<Vec<_>>().join(" and "),
                    found[0]
                ),
            }),
        };
        crate::dist::agree(comm, loaded)?;
        if ranks == 1 {
            return Ok(());
        }
        let (low, high) = step_range(comm, self.state.step)?;
        if low == high {
            return Ok(());
        }
        // A kill between the ranks' saves: the ranks ahead go back to the checkpoint they kept.
        let rank_dir = dir.join(rank_checkpoint(comm.rank(), ranks));
        let back = if self.state.step == low {
            Ok(())
        } else {
            match crate::checkpoint::at_progress(&rank_dir, low) {
                Some(back) => self.load_checkpoint_files(&back, resume),
                None => Err(Error::Checkpoint {
                    path: dir.to_path_buf(),
                    msg: format!(
                        "the ranks' checkpoints are at steps {low} to {high} (a save was interrupted on some \
                         ranks), and rank {} kept none at step {low}",
                        comm.rank()
                    ),
                }),
            }
        };
        crate::dist::agree(comm, back)?;
        log::warn!("the save at step {high} did not finish on every rank: all ranks resume from step {low}");
        let (low, high) = step_range(comm, self.state.step)?;
        if low != high {
            return Err(Error::Checkpoint {
                path: dir.to_path_buf(),
                msg: format!(
                    "the ranks' checkpoints are at steps {low} to {high}: a save was interrupted on some ranks"
                ),
            });
        }
        Ok(())
    }

    /// [`Trainer::resume`] as one of the ranks of `comm`.
    pub fn resume(&mut self) -> Result<(), Error> {
        let dir = self.config.checkpoint_dir();
        self.load_checkpoint_for(&dir, true)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::tiny_face;
    use super::*;
    use farout_dist::Local;

    #[test]
    fn a_saved_checkpoint_reloads_the_same_predictions_and_progress() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = tiny_face(dir.path(), "");
        config.train.epochs = 1;
        let mut t = Trainer::new(config.clone(), &Local).unwrap();
        t.run().unwrap();
        let test = t.data().test.clone().unwrap();
        let mut back = Trainer::new(config, &Local).unwrap();
        assert_ne!(back.predict(&test, 3).unwrap(), t.predict(&test, 3).unwrap());
        back.resume().unwrap();
        assert_eq!(back.step(), t.step());
        assert_eq!(back.state, t.state);
        assert_eq!(back.predict(&test, 3).unwrap(), t.predict(&test, 3).unwrap());
    }

    #[test]
    fn the_rank_counts_of_a_checkpoint_directory_come_from_its_rank_directories() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(checkpoint_rank_counts(dir.path()), Vec::<usize>::new());
        for name in [rank_checkpoint(0, 2), rank_checkpoint(1, 2), format!("{}.old", rank_checkpoint(0, 2))] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        assert_eq!(checkpoint_rank_counts(dir.path()), vec![2]);
        std::fs::create_dir(dir.path().join(rank_checkpoint(3, 4))).unwrap();
        assert_eq!(checkpoint_rank_counts(dir.path()), vec![2, 4]);
    }

    #[test]
    fn a_checkpoint_of_two_ranks_is_refused_by_one_process() {
        let dir = tempfile::tempdir().unwrap();
        let config = tiny_face(dir.path(), "");
        let ck = config.checkpoint_dir();
        std::fs::create_dir_all(ck.join(rank_checkpoint(0, 2))).unwrap();
        let mut t = Trainer::new(config, &Local).unwrap();
        let e = t.load_checkpoint(&ck).unwrap_err().to_string();
        assert!(e.contains("2 MPI ranks") && e.contains("mpirun -np 2"), "{e}");
    }
}
