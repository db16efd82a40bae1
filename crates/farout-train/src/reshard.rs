//! `farout reshard`: a network's checkpoint written by P ranks (or one process) cut for
//! another number of ranks, so that a job can continue on a different allocation.
//!
//! A class-sharded run keeps, per rank, `rank-R-of-P/layer.bin` (its rows of W with their bias
//! and optimiser state: every P-th class, [`Strided`]) beside what every rank holds alike: the
//! document encoder, the A&R estimators' per-sample state, the run's progress (`state.json`)
//! and the class layout (`class_layout.json`). Re-sharding joins the P parts of W in class
//! order (the contiguous slices of a checkpoint written before classes were dealt, which has no
//! `class_layout.json`, in rank order), deals them to the P' new ranks and copies the
//! replicated files from rank 0, after checking that every
//! rank's copy is the same (by the CRC-32 its manifest records). No value changes, so the
//! gathered W is the same bit for bit, and P -> P' -> P gives back the same layer files. A
//! rank's saved search index ([`farout_layer::INDEX_FILES`]) covers its own rows only and is
//! left out: the resumed run builds the index of its new rows at its first search step.
//!
//! The new checkpoint goes to a new directory: the old one stays as it was (a job can still go
//! back to P ranks), and the two never share a directory, where a later run could load the
//! wrong one. `state.json` is rank 0's (the ranks' `train_seconds` differ by their own
//! timing; the step, epoch and sample counts are the same on every rank).

use crate::checkpoint::{self, MANIFEST};
use crate::trainer::{CLASS_LAYOUT, CLASS_LAYOUT_FILE, checkpoint_rank_counts, rank_checkpoint};
use crate::{Error, io_err as io};
use farout_dist::Strided;
use farout_layer::{INDEX_FILES, LayerFile};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// What [`reshard`] did (printed as JSON by `farout reshard`).
#[derive(Clone, Debug, Serialize)]
pub struct Resharded {
    /// The checkpoint read.
    pub from: PathBuf,
    /// Ranks that wrote it (1: one process).
    pub from_ranks: usize,
    /// The checkpoint written.
    pub to: PathBuf,
    /// Ranks it is cut for.
    pub to_ranks: usize,
    /// The training step of both.
    pub step: u64,
    /// Classes (rows of W).
    pub classes: usize,
    /// Rows of each new rank.
    pub rows_per_rank: Vec<usize>,
}

/// Writes the checkpoint in `from` (of one process or of P ranks) into the new directory `to`,
/// cut for `ranks` ranks (see the module documentation).
pub fn reshard(from: &Path, to: &Path, ranks: usize) -> Result<Resharded, Error> {
    if ranks == 0 {
        return Err(Error::Option { name: "ranks", msg: "give the number of ranks to cut for, 1 or more".into() });
    }
    check_out(from, to)?;
    let (dirs, step) = rank_dirs(from)?;
    let parts = dirs.iter().map(|d| LayerFile::read(&d.join("layer.bin"))).collect::<Result<Vec<_>, _>>()?;
    let dealt = dirs[0].join(CLASS_LAYOUT_FILE).exists();
    let whole = if dealt { LayerFile::undeal(&parts) } else { LayerFile::concat(&parts) };
    let whole = whole.map_err(|msg| Error::Checkpoint { path: from.to_path_buf(), msg })?;
    if whole.rows < ranks {
        return Err(Error::Option {
            name: "ranks",
            msg: format!("{ranks} ranks for a layer of {} classes: every rank needs one", whole.rows),
        });
    }
    let mut shared = replicated_files(&dirs)?;
    shared.retain(|name| name != CLASS_LAYOUT_FILE);
    std::fs::create_dir(to).map_err(io(to))?;
    let written = (0..ranks).try_for_each(|r| {
        let dir = if ranks == 1 { to.to_path_buf() } else { to.join(rank_checkpoint(r, ranks)) };
        let fill = |tmp: &Path| {
            whole.deal(r, ranks).write(&tmp.join("layer.bin"))?;
            if ranks > 1 {
                let path = tmp.join(CLASS_LAYOUT_FILE);
                std::fs::write(&path, CLASS_LAYOUT).map_err(io(&path))?;
            }
            copy_files(&dirs[0], tmp, &shared)
        };
        if ranks == 1 {
            // `to` itself is the checkpoint: filled in place, its manifest written last.
            fill(to).and_then(|()| checkpoint::write_manifest(to, step))
        } else {
            checkpoint::replace_dir(&dir, step, fill).map(drop)
        }
    });
    if let Err(e) = written {
        // Only what this call created: `to` did not exist before it.
        let _ = std::fs::remove_dir_all(to);
        return Err(e);
    }
    Ok(Resharded {
        from: from.to_path_buf(),
        from_ranks: dirs.len(),
        to: to.to_path_buf(),
        to_ranks: ranks,
        step,
        classes: whole.rows,
        rows_per_rank: Strided::counts(whole.rows, ranks),
    })
}

/// An error unless `to` is a new directory outside `from` (and `from` not inside it).
fn check_out(from: &Path, to: &Path) -> Result<(), Error> {
    if to.exists() {
        return Err(Error::Option {
            name: "out",
            msg: format!("{} already exists: give a new directory (nothing is replaced)", to.display()),
        });
    }
    let from_abs = std::fs::canonicalize(from).map_err(io(from))?;
    let parent = to.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let to_abs = std::fs::canonicalize(parent).map_err(io(parent))?.join(to.file_name().unwrap_or_default());
    if to_abs.starts_with(&from_abs) || from_abs.starts_with(&to_abs) {
        return Err(Error::Option {
            name: "out",
            msg: format!(
                "{} lies inside the checkpoint {} (or holds it): write the new checkpoint beside it",
                to.display(),
                from.display()
            ),
        });
    }
    Ok(())
}

/// The complete checkpoint of every rank in `from` (the directory itself for one process), all
/// at the same step: after a save interrupted on some ranks, the ranks ahead go back to the
/// checkpoint they kept, as a resume does.
fn rank_dirs(from: &Path) -> Result<(Vec<PathBuf>, u64), Error> {
    let bad = |msg: String| Error::Checkpoint { path: from.to_path_buf(), msg };
    let rank_dirs: Vec<PathBuf> = match checkpoint_rank_counts(from).as_slice() {
        [] => vec![from.to_path_buf()],
        [p] => (0..*p).map(|r| from.join(rank_checkpoint(r, *p))).collect(),
        found => {
            let found: Vec<String> = found.iter().map(usize::to_string).collect();
            return Err(bad(format!(
                "holds checkpoints of {} ranks: give a directory of one run",
                found.join(" and ")
            )));
        }
    };
    let latest = rank_dirs.iter().map(|d| checkpoint::latest(d)).collect::<Result<Vec<_>, _>>()?;
    let low = latest.iter().map(|f| f.progress).min().unwrap_or(0);
    let dirs = rank_dirs
        .iter()
        .zip(latest)
        .enumerate()
        .map(|(r, (dir, found))| match found.progress == low {
            true => Ok(found.dir),
            false => checkpoint::at_progress(dir, low).ok_or_else(|| {
                bad(format!(
                    "rank {r}'s checkpoint is at step {}, and it kept none at step {low}, where the others are",
                    found.progress
                ))
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((dirs, low))
}

/// The files of the checkpoint in `dirs[0]` other than the layer, its index and the manifest, after
/// checking that every other rank holds the same ones with the same contents (`state.json`,
/// which holds each rank's own timing, is rank 0's).
fn replicated_files(dirs: &[PathBuf]) -> Result<Vec<String>, Error> {
    let listed = |dir: &PathBuf| -> Result<Vec<(String, u32)>, Error> {
        let m = checkpoint::verify(dir)?;
        let own = |name: &str| name == "layer.bin" || name == MANIFEST || INDEX_FILES.contains(&name);
        Ok(m.files().filter(|(name, _)| !own(name)).map(|(n, c)| (n.to_string(), c)).collect())
    };
    let first = listed(&dirs[0])?;
    for dir in dirs.iter().skip(1) {
        let mine = listed(dir)?;
        let names = |l: &[(String, u32)]| l.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        if names(&mine) != names(&first) {
            return Err(Error::Checkpoint {
                path: dir.clone(),
                msg: format!(
                    "holds the files {:?}, rank 0 {:?}: not the checkpoint of one run",
                    names(&mine),
                    names(&first)
                ),
            });
        }
        if let Some(((name, _), _)) = mine.iter().zip(&first).find(|((n, a), (_, b))| n != "state.json" && a != b) {
            return Err(Error::Checkpoint {
                path: dir.join(name),
                msg: "differs from rank 0's copy, which every rank holds alike: not the checkpoint of one run".into(),
            });
        }
    }
    Ok(first.into_iter().map(|(n, _)| n).collect())
}

/// Copies `names` (paths relative to `from`) into `to`.
fn copy_files(from: &Path, to: &Path, names: &[String]) -> Result<(), Error> {
    for name in names {
        let dst = to.join(name);
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::copy(from.join(name), &dst).map_err(io(&dst))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trainer::testutil::tiny_face;
    use crate::{Config, Trainer};
    use farout_dist::Local;

    /// The tiny face task (with the config lines `extra`) trained one epoch in one process in
    /// `dir`: its config and its checkpoint directory.
    fn one_epoch(dir: &Path, extra: &str) -> (Config, PathBuf) {
        let mut config = tiny_face(dir, extra);
        config.train.epochs = 1;
        Trainer::new(config.clone(), &Local).unwrap().run().unwrap();
        let one = config.checkpoint_dir();
        (config, one)
    }

    /// Every file of the checkpoint in `dir`, by name, with its bytes (the manifest left out).
    fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let m = checkpoint::verify(dir).unwrap();
        m.files()
            .filter(|(n, _)| *n != MANIFEST)
            .map(|(n, _)| (n.to_string(), std::fs::read(dir.join(n)).unwrap()))
            .collect()
    }

    #[test]
    fn one_process_to_three_ranks_and_back_gives_the_same_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let (config, one) = one_epoch(dir.path(), "[output.optimizer]\nkind = \"adagrad\"\nlr = 0.1\n");
        let three = dir.path().join("three");
        let r = reshard(&one, &three, 3).unwrap();
        assert_eq!((r.from_ranks, r.to_ranks, r.classes, r.rows_per_rank.clone()), (1, 3, 40, vec![14, 13, 13]));
        assert!(r.step > 0);
        let whole = LayerFile::read(&one.join("layer.bin")).unwrap();
        for rank in 0..3 {
            let part = three.join(format!("rank-{rank}-of-3"));
            assert_eq!(checkpoint::verify(&part).unwrap().progress, r.step);
            let expected = whole.deal(rank, 3);
            assert_eq!(expected.rows, r.rows_per_rank[rank]);
            assert!(LayerFile::read(&part.join("layer.bin")).unwrap() == expected, "rank {rank}'s rows");
            assert_eq!(std::fs::read_to_string(part.join(CLASS_LAYOUT_FILE)).unwrap(), CLASS_LAYOUT);
        }
        let back = dir.path().join("back");
        let r = reshard(&three, &back, 1).unwrap();
        assert_eq!((r.from_ranks, r.to_ranks), (3, 1));
        assert!(files(&back) == files(&one), "1 -> 3 -> 1 changed the checkpoint");
        // The checkpoint loads and predicts as the one it came from.
        let test = Trainer::new(config.clone(), &Local).unwrap().data().test.clone().unwrap();
        let predict = |ck: &Path| {
            let mut t = Trainer::new(config.clone(), &Local).unwrap();
            t.load_checkpoint(ck).unwrap();
            t.predict(&test, 3).unwrap()
        };
        assert_eq!(predict(&back), predict(&one));
    }

    /// A checkpoint of 2 ranks that held contiguous classes (no class layout file, as an earlier
    /// farout wrote them) is refused by a run, and re-sharded into the checkpoint it came from.
    #[test]
    fn a_checkpoint_of_contiguous_shards_is_refused_and_resharded() {
        let dir = tempfile::tempdir().unwrap();
        let (_, one) = one_epoch(dir.path(), "[output.optimizer]\nkind = \"adagrad\"\nlr = 0.1\n");
        let two = dir.path().join("two");
        let step = reshard(&one, &two, 2).unwrap().step;
        let whole = LayerFile::read(&one.join("layer.bin")).unwrap();
        let d = whole.d;
        let cut = |rows: std::ops::Range<usize>| LayerFile {
            rows: rows.len(),
            w: whole.w[rows.start * d..rows.end * d].to_vec(),
            bias: whole.bias.as_ref().map(|b| b[rows.clone()].to_vec()),
            state_w: whole.state_w[rows.start * d..rows.end * d].to_vec(),
            state_b: whole.state_b[rows.clone()].to_vec(),
            ..whole.clone()
        };
        for (rank, rows) in [(0, 0..20), (1, 20..40)] {
            let r = two.join(format!("rank-{rank}-of-2"));
            cut(rows).write(&r.join("layer.bin")).unwrap();
            std::fs::remove_file(r.join(CLASS_LAYOUT_FILE)).unwrap();
            checkpoint::write_manifest(&r, step).unwrap();
        }
        let e = crate::trainer::check_class_layout(&two.join("rank-1-of-2"), 2).unwrap_err().to_string();
        assert!(e.contains("contiguous ranges") && e.contains("farout reshard"), "{e}");
        let back = dir.path().join("back");
        reshard(&two, &back, 1).unwrap();
        assert!(files(&back) == files(&one), "contiguous 2 -> 1 changed the layer");
    }

    #[test]
    fn nothing_is_replaced_and_the_rank_count_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (_, one) = one_epoch(dir.path(), "");
        let e = reshard(&one, dir.path(), 2).unwrap_err().to_string();
        assert!(e.contains("already exists"), "{e}");
        let e = reshard(&one, &one.join("inside"), 2).unwrap_err().to_string();
        assert!(e.contains("lies inside the checkpoint"), "{e}");
        let e = reshard(&one, &dir.path().join("many"), 41).unwrap_err().to_string();
        assert!(e.contains("41 ranks for a layer of 40 classes"), "{e}");
        assert!(!dir.path().join("many").exists());
        let e = reshard(&one, &dir.path().join("none"), 0).unwrap_err().to_string();
        assert!(e.contains("1 or more"), "{e}");
        let two = dir.path().join("two");
        let step = reshard(&one, &two, 2).unwrap().step;
        // Each rank's own index is left out (the ranks' differ: each covers its own rows).
        for (rank, byte) in [(0, 1u8), (1, 2)] {
            let d = two.join(format!("rank-{rank}-of-2"));
            INDEX_FILES.iter().for_each(|f| std::fs::write(d.join(f), [byte; 8]).unwrap());
            checkpoint::write_manifest(&d, step).unwrap();
        }
        let one_again = dir.path().join("one-again");
        reshard(&two, &one_again, 1).unwrap();
        assert!(files(&one_again) == files(&one));
        // Ranks whose copies of what every rank holds alike differ are not one run.
        for (rank, byte) in [(0, 1u8), (1, 2)] {
            let d = two.join(format!("rank-{rank}-of-2"));
            std::fs::write(d.join("estimator_state.bin"), [byte; 8]).unwrap();
            checkpoint::write_manifest(&d, step).unwrap();
        }
        let e = reshard(&two, &dir.path().join("x"), 1).unwrap_err().to_string();
        assert!(e.contains("rank-1-of-2/estimator_state.bin: differs from rank 0's copy"), "{e}");
        assert!(!dir.path().join("x").exists());
    }
}
