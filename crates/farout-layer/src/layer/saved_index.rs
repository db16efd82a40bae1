//! The attached index in a checkpoint: a resumed run continues with the index it had, rather
//! than building one again (minutes at a million classes), and with the same upkeep schedule,
//! so that it takes the steps an uninterrupted run would have taken.
//!
//! Two files: `index.bin`, the index in [`farout_search::persist`]'s format without the rows
//! (they are W, in `layer.bin`; the file's fingerprint of them is checked on load), and
//! `index.json`, what the upkeep has counted (steps since the last refresh and build, builds,
//! the rows changed since the last refresh, a pending rebuild).

use super::{Attached, OutputLayer};
use crate::Error;
use farout_core::{ClassId, Matrix};
use farout_search::{BlockIndex, persist};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The index's file in a checkpoint directory.
const INDEX_FILE: &str = "index.bin";
/// Its upkeep's counters beside it.
const UPKEEP_FILE: &str = "index.json";
/// The files [`OutputLayer::save_index`] writes: they describe one layer's own rows (one
/// rank's, for a class-sharded layer), so a checkpoint cut for other rows leaves them out.
pub const INDEX_FILES: [&str; 2] = [INDEX_FILE, UPKEEP_FILE];

/// What [`Attached`] has counted since its index was built.
#[derive(Serialize, Deserialize)]
struct Upkeep {
    steps_since_refresh: u64,
    steps_since_build: u64,
    rebuilds: u64,
    dirty_rows: Vec<ClassId>,
    rebuild_requested: bool,
    norm_floors: Vec<f32>,
}

impl OutputLayer {
    /// Writes the attached index, once built, and its upkeep's counters into the checkpoint
    /// directory `dir`. Returns whether it did: nothing is written without a built index, or for
    /// an `hnsw` index, which cannot be saved (a resumed run then builds its index again); an
    /// index saved earlier into `dir` is then removed, since it no longer fits W.
    pub fn save_index(&self, dir: &Path) -> Result<bool, Error> {
        let written = match self.attached.as_ref().and_then(|a| Some((a, a.index.as_ref()?))) {
            Some((a, index)) => write_index(dir, a, index, &self.w)?,
            None => false,
        };
        if !written {
            for stale in INDEX_FILES.map(|f| dir.join(f)) {
                match std::fs::remove_file(&stale) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(Error::Checkpoint { path: stale, msg: e.to_string() });
                    }
                    _ => {}
                }
            }
        }
        Ok(written)
    }

    /// Restores the index [`Self::save_index`] wrote into `dir`, over the layer's current W
    /// (loaded first), when the checkpoint holds one and an index is attached. Returns whether
    /// it did; without one the index is built at the next search step, as after any load. An
    /// index file that does not fit W (another layer's, or damaged) is an error.
    pub fn load_index(&mut self, dir: &Path) -> Result<bool, Error> {
        let (path, upkeep_path) = (dir.join(INDEX_FILE), dir.join(UPKEEP_FILE));
        let Some(a) = &mut self.attached else { return Ok(false) };
        if !path.exists() {
            return Ok(false);
        }
        let loaded = persist::load(&path, Some(&self.w)).map_err(|e| Error::Checkpoint {
            path: path.clone(),
            msg: format!("{e}; delete {} to build the index again", path.display()),
        })?;
        let text = std::fs::read_to_string(&upkeep_path)
            .map_err(|e| Error::Checkpoint { path: upkeep_path.clone(), msg: e.to_string() })?;
        let upkeep: Upkeep = serde_json::from_str(&text).map_err(|e| Error::Checkpoint {
            path: upkeep_path.clone(),
            msg: format!("not the index's counters: {e}"),
        })?;
        check_upkeep(&upkeep, a, loaded.index.n_blocks(), &upkeep_path)?;
        a.index = Some(loaded.index);
        a.dirty.fill(false);
        upkeep.dirty_rows.iter().for_each(|&r| a.dirty[r as usize] = true);
        (a.steps_since_refresh, a.steps_since_build, a.rebuilds) =
            (upkeep.steps_since_refresh, upkeep.steps_since_build, upkeep.rebuilds);
        (a.dirty_rows, a.rebuild_requested, a.norm_floors) =
            (upkeep.dirty_rows, upkeep.rebuild_requested, upkeep.norm_floors);
        Ok(true)
    }
}

/// Writes `index` (attached as `a`, over the rows `w`) and its upkeep's counters into `dir`;
/// `false` for an index that cannot be saved.
fn write_index(dir: &Path, a: &Attached, index: &BlockIndex, w: &Matrix) -> Result<bool, Error> {
    let path = dir.join(INDEX_FILE);
    match persist::save(&path, index, Some(&a.config), w, false) {
        Ok(()) => {}
        Err(persist::FileError::Unsupported { .. }) => return Ok(false),
        Err(e) => return Err(Error::Checkpoint { path, msg: e.to_string() }),
    }
    let upkeep = Upkeep {
        steps_since_refresh: a.steps_since_refresh,
        steps_since_build: a.steps_since_build,
        rebuilds: a.rebuilds,
        dirty_rows: a.dirty_rows.clone(),
        rebuild_requested: a.rebuild_requested,
        norm_floors: a.norm_floors.clone(),
    };
    let path = dir.join(UPKEEP_FILE);
    let json = serde_json::to_string(&upkeep).expect("counters serialise");
    std::fs::write(&path, json).map_err(|e| Error::Checkpoint { path, msg: e.to_string() })?;
    Ok(true)
}

/// An error unless the counters' rows exist in the layer, each once, and the saved index has
/// the attached index's number of blocks.
fn check_upkeep(upkeep: &Upkeep, a: &Attached, n_blocks: usize, path: &Path) -> Result<(), Error> {
    let bad = |msg: String| Err(Error::Checkpoint { path: path.to_path_buf(), msg });
    if n_blocks != a.n_blocks {
        return bad(format!("the saved index has {n_blocks} blocks, the config's output.blocks {}", a.n_blocks));
    }
    let mut seen = vec![false; a.dirty.len()];
    for &r in &upkeep.dirty_rows {
        match seen.get_mut(r as usize) {
            Some(s) if !*s => *s = true,
            _ => return bad(format!("changed row {r} is repeated or not one of the layer's {} rows", a.dirty.len())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::OptimizerConfig;
    use crate::{IndexUpkeep, OutputLayerConfig};
    use farout_core::{Matrix, rng};
    use farout_estimators::{Batch, Mips, Softmax};
    use farout_search::{IndexConfig, SphericalConfig};

    fn layer() -> OutputLayer {
        let cfg = OutputLayerConfig { bias: false, init_std: 0.3, ..Default::default() };
        let opt = OptimizerConfig::Adagrad { lr: 0.05, eps: 1e-8, l2: 0.0 };
        let mut layer = OutputLayer::new(20_000, 16, &cfg, &opt, 5).unwrap();
        // A low recall, so that what the search finds depends on the index's clusters.
        let spherical = SphericalConfig { exact_below: 0, recall: 0.3, n_centroids: 400, ..SphericalConfig::default() };
        let index = IndexConfig::Spherical(spherical);
        layer.attach_index(index, 1, IndexUpkeep { refresh_every: 3, rebuild_every: 5 }).unwrap();
        layer
    }

    /// Steps `from..to` of a fixed stream of batches (each step's batch depends on its number).
    fn steps(layer: &mut OutputLayer, from: u64, to: u64) {
        let est = Mips::new(Softmax, 20).unwrap();
        for t in from..to {
            let mut r = rng::seeded(11, t);
            let phi = Matrix::from_vec(16, 16, (0..256).map(|_| rng::normal(&mut r)).collect()).unwrap();
            let pos: Vec<Vec<u32>> = (0..16).map(|i| vec![((t * 131 + i * 17) % 20_000) as u32]).collect();
            let refs: Vec<&[u32]> = pos.iter().map(|p| p.as_slice()).collect();
            layer.train_step(&est, Batch::new(&phi, &refs), &mut rng::seeded(3, t), false);
        }
    }

    /// A layer resumed from a checkpoint with its index takes the steps of the layer that went
    /// on without stopping, bit for bit: same index, same rows waiting for their refresh, same
    /// schedule.
    #[test]
    fn a_resumed_layer_continues_with_its_index_as_if_never_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = layer();
        // Built before step 0 and rebuilt before step 5; at the checkpoint the rows changed by
        // steps 5 and 6 wait for the refresh after step 7.
        steps(&mut a, 0, 7);
        a.save(&dir.path().join("layer.bin")).unwrap();
        assert!(a.save_index(dir.path()).unwrap());
        let mut b = layer();
        b.load(&dir.path().join("layer.bin")).unwrap();
        assert!(b.load_index(dir.path()).unwrap());
        assert!(b.index().is_some() && b.index_builds() == a.index_builds());
        let bytes = |l: &OutputLayer| persist::to_bytes(l.index().unwrap(), None, l.weights(), false).unwrap();
        // Up to the next rebuild (before step 10), then past it: same weights, same index.
        for (from, to) in [(7, 10), (10, 14)] {
            steps(&mut a, from, to);
            steps(&mut b, from, to);
            assert_eq!(a.weights().as_slice(), b.weights().as_slice(), "after step {to}");
            assert_eq!(a.index_builds(), b.index_builds(), "after step {to}");
            assert!(bytes(&a) == bytes(&b), "the indexes differ after step {to}");
        }
    }

    #[test]
    fn an_index_file_of_other_rows_or_damaged_counters_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = layer();
        assert!(!a.save_index(dir.path()).unwrap(), "nothing to save before the index is built");
        steps(&mut a, 0, 2);
        a.save(&dir.path().join("layer.bin")).unwrap();
        a.save_index(dir.path()).unwrap();
        // Another layer's W: the index's fingerprint of its rows does not match.
        let mut other = layer();
        let e = other.load_index(dir.path()).unwrap_err().to_string();
        assert!(e.contains("index.bin") && e.contains("to build the index again"), "{e}");
        // Counters naming a row the layer does not have.
        let mut b = layer();
        b.load(&dir.path().join("layer.bin")).unwrap();
        std::fs::write(dir.path().join(UPKEEP_FILE), r#"{"steps_since_refresh":0,"steps_since_build":0,"rebuilds":1,"dirty_rows":[50000],"rebuild_requested":false,"norm_floors":[]}"#).unwrap();
        let e = b.load_index(dir.path()).unwrap_err().to_string();
        assert!(e.contains("index.json") && e.contains("50000"), "{e}");
        // Without an index file, nothing is loaded (built at the next search step); a layer
        // without a built index removes the files an earlier save left in its directory.
        assert!(!layer().save_index(dir.path()).unwrap());
        assert!(!dir.path().join(INDEX_FILE).exists() && !dir.path().join(UPKEEP_FILE).exists());
        assert!(!b.load_index(dir.path()).unwrap());
    }
}
