//! The one-vs-all driver shared by the per-label solvers (DiSMEC, PPDSparse).
//!
//! Labels are handed to rayon sorted by |P|, largest first, so the long problems start early
//! and the small ones fill the gaps at the end, one label per rayon job. Each worker keeps one
//! scratch value in its own slot ([`Scratches`]), so the label loop allocates only the pruned
//! result. A label's computation never
//! depends on the thread that runs it, so the model is bit-identical for any number of threads.
//!
//! Labels without a positive sample all pose the same problem (every sample a negative), so it
//! is solved once, for the first such label of the whole data set (the same on every rank of a
//! label-parallel run), and the others get its solution ([`LabelStat::shared_as`]). Data with
//! many labels and few samples has mostly such labels (the K = 100,000 synthetic set: 85 %).

use crate::contract::Progress;
use crate::data::TrainSet;
use crate::model::SparseModel;
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Checks that `labels` is a range of the `n_labels` labels (a shard may be empty).
pub fn check_label_range(labels: &Range<usize>, n_labels: usize) -> crate::Result<()> {
    if labels.start > labels.end || labels.end > n_labels {
        return Err(crate::Error::Shape { what: "label shard", detail: format!("labels {labels:?} of {n_labels}") });
    }
    Ok(())
}

/// One label's pruned weights: sorted features, their weights, the bias, and the solver's
/// statistics of the label.
pub type LabelResult<S> = (Vec<u32>, Vec<f32>, f32, S);

/// A solver's statistics of one label.
pub trait LabelStat: Clone + Send + Sync {
    /// The statistics of `label` when it takes, without solving, the solution these statistics
    /// describe (labels without positives share one, see the module docs).
    fn shared_as(&self, label: usize) -> Self;
}

/// One scratch per rayon worker of the current pool, made on the worker's first label.
/// (`map_init` would make one per rayon job, which is one per label at one label per job.)
struct Scratches<T>(Vec<Mutex<Option<T>>>);

impl<T> Scratches<T> {
    fn new() -> Self {
        Self((0..rayon::current_num_threads()).map(|_| Mutex::new(None)).collect())
    }

    /// `work` on the calling worker's scratch, or on a new one if that one is in use (a worker
    /// that runs another label while waiting inside a label).
    fn with<R>(&self, make: impl Fn() -> T, work: impl FnOnce(&mut T) -> R) -> R {
        let at = rayon::current_thread_index().unwrap_or(0) % self.0.len();
        match self.0[at].try_lock() {
            Ok(mut slot) => work(slot.get_or_insert_with(make)),
            Err(_) => work(&mut make()),
        }
    }
}

/// The first label of `data` without a positive sample, if `labels` holds any such label.
fn first_empty_label(data: &TrainSet, labels: &Range<usize>) -> Option<usize> {
    let empty = |j: &usize| data.labels.positives(*j).is_empty();
    labels.clone().find(empty).and_then(|_| (0..data.n_labels()).find(empty))
}

/// Solves the labels `labels` of `data` (all of them, or one rank's shard) with
/// `solve(scratch, label)` on the current rayon pool (`scratch()` makes one scratch per worker),
/// advancing `progress` by one per label, and assembles the model of those labels (its label
/// `i` is label `labels.start + i` of `data`) and their statistics, in label order. Labels
/// without positives share one solve (module docs). A stop request ([`farout_core::stop`]) ends
/// it after the labels being solved, with [`crate::Error::Interrupted`].
pub fn one_vs_all<T: Send, S: LabelStat>(
    data: &TrainSet,
    labels: Range<usize>,
    bias: bool,
    progress: &dyn Progress,
    scratch: impl Fn() -> T + Sync + Send,
    solve: impl Fn(&mut T, usize) -> LabelResult<S> + Sync + Send,
) -> crate::Result<(SparseModel, Vec<S>)> {
    debug_assert!(labels.end <= data.n_labels());
    let (first, k) = (labels.start, labels.len());
    let scratches = Scratches::new();
    let shared_empty = first_empty_label(data, &labels).map(|j| scratches.with(&scratch, |t| solve(t, j)));
    let mut order: Vec<usize> = labels.collect();
    order.sort_by_key(|&j| (std::cmp::Reverse(data.labels.positives(j).len()), j));
    progress.begin(k as u64, "labels");
    let done = AtomicUsize::new(0);
    // `None` for a label met after a stop request: collecting into an `Option` ends the loop.
    // One label per rayon job: the labels' costs fall steeply along `order` (largest first, the
    // shared empty labels free), and rayon's adaptive split would leave most of the costly head
    // to one thread.
    let solved: Option<Vec<LabelResult<S>>> = order
        .par_iter()
        .with_max_len(1)
        .map(|&j| {
            if farout_core::stop::requested() {
                return None;
            }
            let out = match &shared_empty {
                Some((f, w, b, st)) if data.labels.positives(j).is_empty() => {
                    (f.clone(), w.clone(), *b, st.shared_as(j))
                }
                _ => scratches.with(&scratch, |t| solve(t, j)),
            };
            done.fetch_add(1, Ordering::Relaxed);
            progress.advance(1);
            Some(out)
        })
        .collect();
    let Some(solved) = solved else {
        return Err(crate::Error::Interrupted { done: done.into_inner(), total: k, unit: "labels" });
    };
    let mut slot = vec![0usize; k];
    order.iter().enumerate().for_each(|(at, &j)| slot[j - first] = at);
    let mut model = SparseModel::new(data.n_features(), bias);
    let mut stats = Vec::with_capacity(k);
    for &at in &slot {
        let (f, w, b, st) = &solved[at];
        model.push_label(f, w, *b);
        stats.push(st.clone());
    }
    Ok((model, stats))
}
