//! Checkpoint directories that are either complete and verified or not used at all.
//!
//! A checkpoint is a directory of files plus `manifest.json`, written last, which lists every
//! file with its size and CRC-32 and the run's progress (steps or words). A directory without a
//! manifest, or whose files do not match it, is incomplete or corrupt and is never loaded.
//!
//! Saving rotates three directories: the files go into `<dir>.tmp`, the manifest is written and
//! synced, then `<dir>` becomes `<dir>.old`, `<dir>.tmp` becomes `<dir>` and `<dir>.old` is
//! removed. Whatever instant the process dies at, one of the three holds a complete checkpoint
//! (once one has been written), and [`latest`] finds the most advanced of them; the next save
//! first puts that one back at `<dir>` ([`settle`]), so a failing save never removes it.
//!
//! The ranks of an MPI run each save their own directory, so a kill can leave some ranks at
//! the new checkpoint and others at the one before. They save with
//! [`replace_dir_keeping`]`(.., true, ..)`, which keeps the checkpoint it replaces as
//! `<dir>.prev` ([`previous`]), and a resume takes the ranks that got ahead back to the step
//! of the others ([`at_progress`]: the kept one, or the one a kill left at `<dir>.old`).

use crate::{Error, io_err as io};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The file that makes a checkpoint directory complete.
pub const MANIFEST: &str = "manifest.json";
const FORMAT: &str = "farout-checkpoint";
const VERSION: u32 = 1;

/// What `manifest.json` records.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    format: String,
    version: u32,
    /// The run's progress when the checkpoint was written (steps, or words for skip-gram).
    pub progress: u64,
    files: Vec<FileEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct FileEntry {
    name: String,
    bytes: u64,
    crc32: u32,
}

impl Manifest {
    /// The files it lists (paths relative to the checkpoint directory), with their CRC-32.
    pub fn files(&self) -> impl Iterator<Item = (&str, u32)> {
        self.files.iter().map(|f| (f.name.as_str(), f.crc32))
    }
}

/// A complete checkpoint found by [`latest`].
#[derive(Clone, Debug)]
pub struct Found {
    /// The directory to load from: `<dir>`, or `<dir>.tmp`/`<dir>.old` after an interrupted save.
    pub dir: PathBuf,
    /// Its progress.
    pub progress: u64,
}

/// The two directories a rotation passes through.
fn siblings(dir: &Path) -> (PathBuf, PathBuf) {
    let with = |ext: &str| {
        let mut name = dir.file_name().unwrap_or_default().to_os_string();
        name.push(ext);
        dir.with_file_name(name)
    };
    (with(".tmp"), with(".old"))
}

/// `dir` and the two directories a save passes through.
pub fn with_siblings(dir: &Path) -> [PathBuf; 3] {
    let (tmp, old) = siblings(dir);
    [dir.to_path_buf(), tmp, old]
}

/// `<dir>.prev`: the checkpoint that [`replace_dir_keeping`] kept when it replaced it.
pub fn previous(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".prev");
    dir.with_file_name(name)
}

/// Calls `fill` on an empty temporary directory, writes its manifest with `progress`, then
/// swaps it in for `dir` (see the module documentation).
pub fn replace_dir(dir: &Path, progress: u64, fill: impl FnOnce(&Path) -> Result<(), Error>) -> Result<PathBuf, Error> {
    replace_dir_keeping(dir, progress, false, fill)
}

/// [`replace_dir`]; with `keep_previous`, the checkpoint it replaces is kept at
/// [`previous`]`(dir)` (and the one kept before is removed).
pub fn replace_dir_keeping(
    dir: &Path,
    progress: u64,
    keep_previous: bool,
    fill: impl FnOnce(&Path) -> Result<(), Error>,
) -> Result<PathBuf, Error> {
    let (tmp, old) = siblings(dir);
    settle(dir)?;
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    fill(&tmp)?;
    write_manifest(&tmp, progress)?;
    if dir.exists() {
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(io(&old))?;
        }
        std::fs::rename(dir, &old).map_err(io(dir))?;
    }
    std::fs::rename(&tmp, dir).map_err(io(&tmp))?;
    if old.exists() {
        let prev = previous(dir);
        if keep_previous && verify(&old).is_ok() {
            if prev.exists() {
                std::fs::remove_dir_all(&prev).map_err(io(&prev))?;
            }
            std::fs::rename(&old, &prev).map_err(io(&old))?;
        } else {
            std::fs::remove_dir_all(&old).map_err(io(&old))?;
        }
    }
    Ok(dir.to_path_buf())
}

/// Brings the directories an interrupted save left back to one checkpoint at `dir`: the most
/// advanced complete one is moved there, the others are removed only once it is in place.
pub fn settle(dir: &Path) -> Result<(), Error> {
    let (tmp, old) = siblings(dir);
    let Ok(best) = latest(dir) else { return Ok(()) };
    if best.dir != dir {
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(io(dir))?;
        }
        std::fs::rename(&best.dir, dir).map_err(io(&best.dir))?;
        log::warn!(
            "moved the checkpoint at {} (progress {}) back to {}",
            best.dir.display(),
            best.progress,
            dir.display()
        );
    }
    for p in [tmp, old] {
        if p.exists() {
            std::fs::remove_dir_all(&p).map_err(io(&p))?;
        }
    }
    Ok(())
}

/// A complete checkpoint of `dir` at exactly `progress`, wherever a save left it: `<dir>` or
/// its rotation siblings (a kill between `<dir>` becoming `<dir>.old` and `<dir>.tmp` becoming
/// `<dir>` leaves the one before in `<dir>.old`), or the kept [`previous`] one and its siblings.
pub fn at_progress(dir: &Path, progress: u64) -> Option<PathBuf> {
    let prev = previous(dir);
    with_siblings(dir)
        .into_iter()
        .chain(with_siblings(&prev))
        .find(|p| p.exists() && verify(p).is_ok_and(|m| m.progress == progress))
}

/// The most advanced complete checkpoint among `dir`, `<dir>.tmp` and `<dir>.old`; `dir` wins
/// ties. The error says, for each of them, why it cannot be used.
pub fn latest(dir: &Path) -> Result<Found, Error> {
    let (tmp, old) = siblings(dir);
    let mut best: Option<Found> = None;
    let mut reasons = Vec::new();
    for p in [dir.to_path_buf(), tmp, old] {
        if !p.exists() {
            continue;
        }
        match verify(&p) {
            Ok(m) if best.as_ref().is_none_or(|b| m.progress > b.progress) => {
                best = Some(Found { dir: p, progress: m.progress })
            }
            Ok(_) => {}
            Err(e) => reasons.push(e.to_string()),
        }
    }
    best.ok_or_else(|| Error::Checkpoint {
        path: dir.to_path_buf(),
        msg: if reasons.is_empty() {
            "no checkpoint here".into()
        } else {
            format!("no complete checkpoint here: {}", reasons.join("; "))
        },
    })
}

/// The directory to load the checkpoint of `dir` from: the newest complete one ([`latest`]),
/// with a warning when an interrupted save left it beside `dir`.
pub fn open(dir: &Path) -> Result<PathBuf, Error> {
    let found = latest(dir)?;
    if found.dir != dir {
        log::warn!(
            "{} holds no complete checkpoint; loading {} (progress {}), left by an interrupted save",
            dir.display(),
            found.dir.display(),
            found.progress
        );
    }
    Ok(found.dir)
}

/// The run state `state.json` of the checkpoint in `dir`; `what` names the state in the error.
pub fn read_state<T: serde::de::DeserializeOwned>(dir: &Path, what: &str) -> Result<T, Error> {
    let path = dir.join("state.json");
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    serde_json::from_str(&text).map_err(|e| Error::Checkpoint { path, msg: format!("not a {what}: {e}") })
}

/// Reads `dir`'s manifest and checks every file it lists against its size and CRC-32.
pub fn verify(dir: &Path) -> Result<Manifest, Error> {
    let path = dir.join(MANIFEST);
    let bad = |path: &Path, msg: String| Error::Checkpoint { path: path.to_path_buf(), msg };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let linear = [crate::linear::MODEL_FILE, "linear.shards.json"].into_iter().find(|f| dir.join(f).exists());
            let msg = match linear {
                Some(f) => format!(
                    "missing: {} holds a linear model ({f}), not a network's checkpoint; evaluate it with the \
                     [linear] config that trained it",
                    dir.display()
                ),
                None => "missing: the checkpoint is incomplete or was written by an older farout".into(),
            };
            return Err(bad(&path, msg));
        }
        Err(e) => return Err(bad(&path, e.to_string())),
    };
    let m: Manifest = serde_json::from_str(&text).map_err(|e| bad(&path, format!("not a checkpoint manifest: {e}")))?;
    if m.format != FORMAT || m.version != VERSION {
        return Err(bad(
            &path,
            format!("format {} version {}, expected {FORMAT} version {VERSION}", m.format, m.version),
        ));
    }
    for f in &m.files {
        let p = dir.join(&f.name);
        let (bytes, crc) = checksum(&p)?;
        if bytes != f.bytes {
            return Err(bad(
                &p,
                format!("{bytes} bytes, the manifest says {}: the file is truncated or replaced", f.bytes),
            ));
        }
        if crc != f.crc32 {
            return Err(bad(&p, format!("CRC-32 {crc:08x}, the manifest says {:08x}: the file is corrupt", f.crc32)));
        }
    }
    Ok(m)
}

/// Lists the files of `dir` (recursively, sorted) in a synced manifest.
pub(crate) fn write_manifest(dir: &Path, progress: u64) -> Result<(), Error> {
    let mut names = Vec::new();
    list_files(dir, Path::new(""), &mut names)?;
    names.sort();
    let mut files = Vec::with_capacity(names.len());
    for name in names {
        let p = dir.join(&name);
        std::fs::File::open(&p).and_then(|f| f.sync_all()).map_err(io(&p))?;
        let (bytes, crc32) = checksum(&p)?;
        files.push(FileEntry { name: name.to_string_lossy().into_owned(), bytes, crc32 });
    }
    let m = Manifest { format: FORMAT.into(), version: VERSION, progress, files };
    let path = dir.join(MANIFEST);
    let json = serde_json::to_string_pretty(&m).expect("manifests serialise");
    std::fs::write(&path, json).map_err(io(&path))?;
    std::fs::File::open(&path).and_then(|f| f.sync_all()).map_err(io(&path))
}

fn list_files(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    let here = root.join(rel);
    for entry in std::fs::read_dir(&here).map_err(io(&here))? {
        let entry = entry.map_err(io(&here))?;
        let rel = rel.join(entry.file_name());
        if entry.file_type().map_err(io(&here))?.is_dir() {
            list_files(root, &rel, out)?;
        } else if rel != Path::new(MANIFEST) {
            out.push(rel);
        }
    }
    Ok(())
}

/// Length and CRC-32 of a file, read in 1 MiB blocks.
fn checksum(path: &Path) -> Result<(u64, u32), Error> {
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok((bytes, hasher.finalize()))
}

/// Writes `values` as little-endian f32 to `path`.
pub fn write_f32_file(path: &Path, values: &[f32]) -> Result<(), Error> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io(path))?);
    farout_core::binio::write_f32s(&mut f, values).and_then(|_| std::io::Write::flush(&mut f)).map_err(io(path))
}

/// Reads exactly `out.len()` little-endian f32 from `path`.
pub fn read_f32_file(path: &Path, out: &mut [f32]) -> Result<(), Error> {
    let len = std::fs::metadata(path).map_err(io(path))?.len();
    if len != out.len() as u64 * 4 {
        return Err(Error::Checkpoint {
            path: path.to_path_buf(),
            msg: format!("{len} bytes, expected {} ({} f32 values)", out.len() * 4, out.len()),
        });
    }
    let mut f = std::io::BufReader::new(std::fs::File::open(path).map_err(io(path))?);
    farout_core::binio::read_f32s(&mut f, out).map_err(io(path))
}

/// An error unless every value is finite: a checkpoint never holds, and never loads, NaN or
/// infinite weights. `what` names them in the message.
pub fn check_finite(path: &Path, what: &str, values: &[f32]) -> Result<(), Error> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::Checkpoint {
            path: path.to_path_buf(),
            msg: format!("{what}: value {i} of {} is {}", values.len(), values[i]),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save(dir: &Path, progress: u64, value: f32) {
        replace_dir(dir, progress, |t| write_f32_file(&t.join("a.bin"), &[value, value])).unwrap();
    }

    fn value_in(dir: &Path) -> f32 {
        let mut back = [0.0; 2];
        read_f32_file(&dir.join("a.bin"), &mut back).unwrap();
        back[0]
    }

    #[test]
    fn a_failed_fill_keeps_the_old_checkpoint() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ck");
        save(&dir, 1, 1.0);
        let err = replace_dir(&dir, 2, |_| Err(Error::NoData("boom")));
        assert!(err.is_err());
        let found = latest(&dir).unwrap();
        assert_eq!((found.dir.as_path(), found.progress), (dir.as_path(), 1));
        assert_eq!(value_in(&dir), 1.0);
        assert!(read_f32_file(&dir.join("a.bin"), &mut [0.0; 3]).unwrap_err().to_string().contains("expected 12"));
    }

    /// Saves that keep the previous checkpoint keep exactly the one they replaced; other saves
    /// keep none.
    #[test]
    fn the_previous_checkpoint_is_kept_when_asked() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("rank-0-of-2");
        let prev = previous(&dir);
        assert_eq!(prev, root.path().join("rank-0-of-2.prev"));
        let keep = |progress: u64, value: f32| {
            replace_dir_keeping(&dir, progress, true, |t| write_f32_file(&t.join("a.bin"), &[value, value])).unwrap();
        };
        keep(8, 1.0);
        assert!(!prev.exists(), "nothing to keep after the first save");
        keep(16, 2.0);
        assert_eq!((latest(&prev).unwrap().progress, value_in(&prev)), (8, 1.0));
        keep(24, 3.0);
        assert_eq!((latest(&prev).unwrap().progress, value_in(&prev)), (16, 2.0));
        assert_eq!((latest(&dir).unwrap().progress, value_in(&dir)), (24, 3.0));
        let other = root.path().join("ck");
        save(&other, 1, 1.0);
        save(&other, 2, 2.0);
        assert!(!previous(&other).exists());
    }

    /// A rank that got ahead of the others finds the checkpoint at their step wherever its
    /// last save left it: kept as `.prev`, or still at `.old` when the kill came between the
    /// renames (its newest then at `.tmp`).
    #[test]
    fn the_checkpoint_at_a_given_step_is_found_in_any_rotation_state() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("rank-0-of-2");
        let (tmp, old) = siblings(&dir);
        let prev = previous(&dir);
        let put = |p: &Path, progress: u64| {
            let scratch = root.path().join("scratch");
            save(&scratch, progress, progress as f32);
            std::fs::rename(&scratch, p).unwrap();
        };
        // Killed between `dir` -> `.old` and `.tmp` -> `dir` of the save at step 24.
        put(&prev, 8);
        put(&old, 16);
        put(&tmp, 24);
        assert_eq!(latest(&dir).unwrap().progress, 24);
        for (step, at) in [(24, &tmp), (16, &old), (8, &prev)] {
            assert_eq!(at_progress(&dir, step).as_ref(), Some(at), "step {step}");
            assert_eq!(value_in(at), step as f32);
        }
        assert_eq!(at_progress(&dir, 12), None);
        // An incomplete one is never taken.
        std::fs::remove_file(old.join(MANIFEST)).unwrap();
        assert_eq!(at_progress(&dir, 16), None);
    }

    /// Every state a kill can leave during a save, rebuilt by hand: the newest complete
    /// checkpoint is found, and the next save starts from it.
    #[test]
    fn a_kill_at_any_instant_of_a_save_leaves_a_complete_checkpoint() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ck");
        let (tmp, old) = siblings(&dir);
        // (directory, progress, complete)
        type Saved<'a> = (&'a Path, u64, bool);
        let rebuild = |states: &[Saved]| {
            for p in [&dir, &tmp, &old] {
                let _ = std::fs::remove_dir_all(p);
            }
            for &(p, progress, complete) in states {
                let scratch = root.path().join("scratch");
                save(&scratch, progress, progress as f32);
                if !complete {
                    std::fs::remove_file(scratch.join(MANIFEST)).unwrap();
                }
                std::fs::rename(&scratch, p).unwrap();
            }
        };
        // (what exists, the progress that must be found)
        let cases: Vec<(Vec<Saved>, u64)> = vec![
            (vec![(&dir, 1, true), (&tmp, 2, false)], 1), // killed while filling
            (vec![(&dir, 1, true), (&tmp, 2, true)], 2),  // killed before the first rename
            (vec![(&old, 1, true), (&tmp, 2, true)], 2),  // killed between the renames
            (vec![(&old, 1, true), (&dir, 2, true)], 2),  // killed before removing .old
            (vec![(&old, 1, true), (&tmp, 2, false)], 1), // an earlier kill, then a killed fill
        ];
        for (states, want) in cases {
            rebuild(&states);
            let found = latest(&dir).unwrap();
            assert_eq!(found.progress, want, "{states:?}");
            assert_eq!(value_in(&found.dir), want as f32);
            // A save that then fails still leaves that checkpoint, now at `dir`.
            assert!(replace_dir(&dir, 3, |_| Err(Error::NoData("boom"))).is_err());
            let after = latest(&dir).unwrap();
            assert_eq!((after.dir.as_path(), after.progress), (dir.as_path(), want), "{states:?}");
            save(&dir, 3, 3.0);
            assert!(!tmp.exists() && !old.exists());
            assert_eq!(latest(&dir).unwrap().progress, 3);
        }
    }

    #[test]
    fn corrupt_truncated_and_incomplete_checkpoints_are_rejected() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ck");
        assert!(latest(&dir).unwrap_err().to_string().contains("no checkpoint here"));
        save(&dir, 5, 1.5);
        let file = dir.join("a.bin");
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[3] ^= 0x10;
        std::fs::write(&file, &bytes).unwrap();
        let e = latest(&dir).unwrap_err().to_string();
        assert!(e.contains("a.bin") && e.contains("corrupt"), "{e}");
        std::fs::write(&file, &bytes[..6]).unwrap();
        let e = latest(&dir).unwrap_err().to_string();
        assert!(e.contains("6 bytes, the manifest says 8"), "{e}");
        std::fs::remove_file(dir.join(MANIFEST)).unwrap();
        let e = latest(&dir).unwrap_err().to_string();
        assert!(e.contains("manifest.json: missing"), "{e}");
    }

    #[test]
    fn non_finite_values_are_named() {
        assert!(check_finite(Path::new("w.bin"), "W", &[1.0, 2.0]).is_ok());
        let e = check_finite(Path::new("w.bin"), "W", &[1.0, f32::NAN]).unwrap_err().to_string();
        assert!(e.contains("w.bin") && e.contains("value 1 of 2 is NaN"), "{e}");
    }
}
