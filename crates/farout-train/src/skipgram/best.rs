//! Keeping the epoch best on the held-out objective, in a skip-gram run that selects
//! ([`Config::selects_best`]: `train.select = "best"`, or `"auto"` under a time budget, with
//! held-out text).
//!
//! After each epoch the full-softmax objective on the held-out pairs (lower is better) is
//! compared with the best so far; a strictly lower one writes the vectors (vocabulary, both
//! tables, the state) to `<checkpoint dir>-best`, beside the resume checkpoint, which it never
//! replaces. At the end, when the best epoch is not the last, its vectors are read back: the
//! summary's held-out objective, analogy and similarity are theirs, and so are the vectors
//! `--export-vectors` and `farout export` write; [`SkipGramSelection`] reports the last epoch's
//! objective beside them. A run that selects runs all its epochs (no patience): its learning
//! rate decays linearly to the last one. The held-out text is never trained on, and no test
//! file chooses.

use super::{Session, load_checkpoint};
use crate::Error;
use crate::config::Config;
use farout_skipgram::Embeddings;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The epoch whose vectors are kept, and its held-out objective.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct BestEpoch {
    /// Epochs done when it was reached (from 1).
    pub epoch: usize,
    /// Corpus words read by then.
    pub words: u64,
    /// Its held-out objective.
    pub heldout_objective: f64,
}

/// What a skip-gram run that kept its best epoch reports beside its figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SkipGramSelection {
    /// The kept epoch (from 1).
    pub best_epoch: usize,
    /// Its held-out objective (the summary's `heldout_objective`).
    pub best_heldout_objective: f64,
    /// The last epoch's held-out objective.
    pub last_heldout_objective: f64,
    /// The checkpoint of the kept vectors (`farout export` reads it by default).
    pub checkpoint: PathBuf,
}

/// Whether a skip-gram run of `config` scores held-out text, which selection needs: held-out
/// pairs, and `eval.heldout` (a synthetic corpus generates its own held-out text).
pub fn has_heldout(config: &Config) -> bool {
    config.eval.heldout_pairs > 0 && (config.eval.heldout.is_some() || config.data.corpus.is_none())
}

impl Session<'_> {
    /// Whether this run keeps its best epoch.
    pub(super) fn selects(&self) -> bool {
        self.config.selects_best() && !self.heldout.is_empty()
    }

    /// After an epoch whose held-out objective is `obj`: whether it beats the kept one (it then
    /// becomes the kept one).
    pub(super) fn improves(&self, obj: f64) -> bool {
        let mut st = self.state.borrow_mut();
        if !self.selects() || !obj.is_finite() || st.best.is_some_and(|b| obj >= b.heldout_objective) {
            return false;
        }
        st.best = Some(BestEpoch { epoch: st.epochs_done, words: st.words, heldout_objective: obj });
        true
    }

    /// At the end of a selecting run: the selection report, with the kept vectors read back
    /// when the kept epoch is not the last (`None`: the last epoch is the kept one). `None`
    /// when the run does not select (which removes stale kept vectors, from an earlier part of
    /// a resumed run).
    pub(super) fn kept(&self) -> Result<Option<(SkipGramSelection, Option<Embeddings>)>, Error> {
        let dir = self.config.best_checkpoint_dir();
        if !self.selects() {
            for d in crate::checkpoint::with_siblings(&dir) {
                if d.exists() {
                    std::fs::remove_dir_all(&d).map_err(crate::io_err(&d))?;
                }
            }
            return Ok(None);
        }
        let (best, last) = (self.state.borrow().best, self.last_heldout.get());
        let (Some(best), Some(last)) = (best, last) else { return Ok(None) };
        let selection = SkipGramSelection {
            best_epoch: best.epoch,
            best_heldout_objective: best.heldout_objective,
            last_heldout_objective: last,
            checkpoint: dir.clone(),
        };
        if best.epoch == self.state.borrow().epochs_done {
            return Ok(Some((selection, None)));
        }
        let sg = &self.config.model.skip_gram;
        let (_, _, emb, _) = load_checkpoint(&dir, sg.dim, sg.ngrams())?;
        Ok(Some((selection, Some(emb))))
    }
}
