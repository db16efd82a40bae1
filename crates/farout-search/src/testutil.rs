//! Fixtures shared by the indexes' tests.

use crate::{Hit, MipsIndex, Rows};
use farout_core::{ClassId, Matrix, kernels};
use farout_data::synth::{FaceGenerator, FaceSpec, Split};

/// `k` class means of the FaceNet-like generator in `k / 50` clusters, and 200 of its samples
/// (noise 0.5) as queries.
pub fn clustered(k: usize, d: usize) -> (Matrix, Matrix) {
    let g = FaceGenerator::new(FaceSpec::clustered(k, d)).unwrap();
    (g.means().clone(), g.features(Split::Train, 0..200))
}

/// Moves 50 rows onto the (unit) query `q`, scaled to norms in (1.085, 1.09] — within the
/// default norm bound 1.1 — so that they become its top 50; returns them.
pub fn move_rows_onto(w: &mut Matrix, q: &[f32]) -> Vec<ClassId> {
    move_these_rows_onto(w, q, (0..50).map(|j| j * 193 + 7).collect())
}

/// [`move_rows_onto`] for the rows `moved` (50 of them).
pub fn move_these_rows_onto(w: &mut Matrix, q: &[f32], moved: Vec<ClassId>) -> Vec<ClassId> {
    for (j, &r) in moved.iter().enumerate() {
        let row: Vec<f32> = q.iter().map(|x| x * (1.09 - 0.0001 * j as f32)).collect();
        w.row_mut(r as usize).copy_from_slice(&row);
    }
    moved
}

/// Asserts that `index` returns 50 distinct results per query with exact scores.
pub fn assert_exact_scores(index: &dyn MipsIndex, w: &Matrix, q: &Matrix) {
    let mut out: Vec<Hit> = Vec::new();
    for i in 0..20 {
        index.search(Rows::all(w), q.row(i), 50, &mut out);
        assert_eq!(out.len(), 50);
        let mut classes: Vec<ClassId> = out.iter().map(|h| h.class).collect();
        classes.sort_unstable();
        classes.dedup();
        assert_eq!(classes.len(), 50, "distinct classes");
        for h in &out {
            assert_eq!(h.score, kernels::dot(w.row(h.class as usize), q.row(i)));
        }
    }
}

/// Asserts that `index` returns the exact top `k` of query `q` (classes and scores), and returns
/// them best first.
pub fn assert_exact_top(index: &dyn MipsIndex, w: &Matrix, q: &[f32], k: usize) -> Vec<Hit> {
    let (mut out, mut exact) = (Vec::new(), Vec::new());
    index.search(Rows::all(w), q, k, &mut out);
    crate::ExactIndex.search(Rows::all(w), q, k, &mut exact);
    out.sort_unstable_by(farout_core::topk::by_score);
    exact.sort_unstable_by(farout_core::topk::by_score);
    assert_eq!(out, exact);
    out
}
