//! farout-search: maximum inner product search (MIPS) over the rows of the output layer's `W`.
//!
//! Search-based gradient estimators (LDGS paper, Algorithms 1 and 2) need, for a feature vector
//! `phi`, the classes with the largest scores `W_k . phi` without scoring all K of them. A
//! [`MipsIndex`] answers that query approximately and returns *exact* scores for what it finds.
//!
//! - [`ExactIndex`]: brute force; the recall reference.
//! - [`SphericalIndex`]: spherical clustering (Auvolat et al. 2015, the LDGS paper's choice):
//!   MIPS reduced to cosine search by norm augmentation, spherical k-means with about sqrt(K)
//!   centroids, probing the best centroids until enough candidates, exact rescoring.
//!
//! [`recall`] measures an index against brute force.
#![warn(missing_docs)]

mod exact;
mod spherical;

pub use exact::ExactIndex;
pub use farout_core::topk::Hit;
pub use spherical::{SphericalConfig, SphericalIndex};

use farout_core::{ClassId, Matrix};

/// Top-k maximum inner product search over the rows of a matrix `W` that changes during
/// training.
///
/// Why this shape: the index never owns `W` (the output layer does, and updates it in place
/// every step), so both methods take it; an index stores only what it needs to find candidates
/// (centroids, graphs, hash tables) and always rescores candidates against the current `W`, so
/// returned scores are exact even when the index is stale. Training tells the index which rows
/// changed ([`MipsIndex::refresh`]) instead of rebuilding it; an index whose structure has decayed
/// too far says so ([`MipsIndex::needs_rebuild`]).
pub trait MipsIndex: Send + Sync {
    /// Name used in configs and logs.
    fn name(&self) -> &'static str;

    /// The (approximate) top `k` rows of `w` by inner product with `query`, best first, with
    /// exact scores, into `out` (cleared first).
    fn search(&self, w: &Matrix, query: &[f32], k: usize, out: &mut Vec<Hit>);

    /// Re-indexes `rows` of `w`, which changed since they were last indexed.
    fn refresh(&mut self, w: &Matrix, rows: &[ClassId]);

    /// Whether the index should be rebuilt from scratch (e.g. a row outgrew its norm bound).
    fn needs_rebuild(&self) -> bool {
        false
    }

    /// Bytes held by the index (not counting `W`).
    fn memory_bytes(&self) -> usize;
}

/// Mean overlap `|approx ∩ exact| / |exact|` of an index's top-`k` with brute force over
/// `queries` (rows of a matrix).
pub fn recall(index: &dyn MipsIndex, w: &Matrix, queries: &Matrix, k: usize) -> f64 {
    use rayon::prelude::*;
    let exact = ExactIndex::new();
    let total: f64 = (0..queries.rows())
        .into_par_iter()
        .map_init(
            || (Vec::new(), Vec::new(), Vec::new()),
            |(a, e, seen): &mut (Vec<Hit>, Vec<Hit>, Vec<ClassId>), i| {
                index.search(w, queries.row(i), k, a);
                exact.search(w, queries.row(i), k, e);
                seen.clear();
                seen.extend(e.iter().map(|h| h.class));
                seen.sort_unstable();
                let found = a.iter().filter(|h| seen.binary_search(&h.class).is_ok()).count();
                found as f64 / e.len().max(1) as f64
            },
        )
        .sum();
    total / queries.rows().max(1) as f64
}
