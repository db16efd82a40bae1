//! Prediction with a [`SparseModel`]: a sample's k best labels.
//!
//! The scores are `s_k = b_k + Σ_{j∈x} x_j W_jk` (eq. 1). [`Predictor`] keeps the transpose of
//! the model, per feature j the labels with W_jk ≠ 0, so a sample walks only its own features.
//!
//! **Labels with equal weights and bias are scored once**, as a group. One-vs-all training gives
//! every label without a positive training sample one shared solve, so on a data set where most
//! labels never occur in training one group holds most labels: a sample then fills and ranks a
//! vector of the distinct labels' scores, not of K.
//!
//! The ranking is [`farout_core::topk::top_k`]'s over every label's score: higher score first,
//! equal scores by lower label first, NaN never ranked.

use crate::model::SparseModel;
use farout_core::group_rows;
use farout_core::topk::Hit;
use rayon::prelude::*;
use std::cmp::Ordering;
use std::collections::HashMap;

/// Feature-major weights for prediction, over groups of labels with equal weights and bias.
#[derive(Clone, Debug, PartialEq)]
pub struct Predictor {
    /// The group of each label.
    group_of: Vec<u32>,
    /// Group g's labels, ascending: `members[member_ptr[g]..member_ptr[g + 1]]`.
    member_ptr: Vec<usize>,
    members: Vec<u32>,
    /// Each group's bias.
    biases: Vec<f32>,
    /// Feature j's groups and weights: `groups[feature_ptr[j]..feature_ptr[j + 1]]`.
    feature_ptr: Vec<usize>,
    groups: Vec<u32>,
    weights: Vec<f32>,
}

impl Predictor {
    /// The feature-major copy of `model`, its labels grouped, sized by the largest feature that
    /// has a weight (not by the header's feature count, which a file does not bound).
    pub fn new(model: &SparseModel) -> Self {
        let (group_of, first_of) = group_labels(model);
        let labels: Vec<u32> = (0..group_of.len() as u32).collect();
        let (member_ptr, members) = group_rows(&labels, first_of.len(), |k| group_of[k as usize] as usize);
        let biases: Vec<f32> = first_of.iter().map(|&k| model.label(k as usize).2).collect();
        let (feature_ptr, groups, weights) = transpose(model, &first_of);
        Self { group_of, member_ptr, members, biases, feature_ptr, groups, weights }
    }

    /// Number of labels K.
    pub fn n_labels(&self) -> usize {
        self.group_of.len()
    }

    /// Number of distinct labels (groups of labels with equal weights and bias).
    pub fn n_distinct_labels(&self) -> usize {
        self.biases.len()
    }

    /// `scores[k] = b_k + Σ_j x_j W_jk` for every label (features beyond the model's are
    /// ignored: they never had a weight). `scores` is resized to K.
    pub fn scores_into(&self, cols: &[u32], vals: &[f32], scores: &mut Vec<f32>) {
        let mut by_group = self.biases.clone();
        self.walk(cols, vals, |g, xw| by_group[g as usize] += xw);
        scores.clear();
        scores.extend(self.group_of.iter().map(|&g| by_group[g as usize]));
    }

    /// Calls `add(group, x_j W_jk)` for every weight the sample's features reach, features in
    /// the sample's order.
    #[inline]
    fn walk(&self, cols: &[u32], vals: &[f32], mut add: impl FnMut(u32, f32)) {
        let n_features = self.feature_ptr.len() - 1;
        for (&j, &x) in cols.iter().zip(vals) {
            if (j as usize) < n_features {
                let r = self.feature_ptr[j as usize]..self.feature_ptr[j as usize + 1];
                for (&g, &w) in self.groups[r.clone()].iter().zip(&self.weights[r]) {
                    add(g, x * w);
                }
            }
        }
    }

    /// The `k` best labels of one sample, best first, into `out`: the labels and scores of
    /// [`farout_core::topk::top_k`] over [`Self::scores_into`], from one score per group
    /// (`scores` is scratch).
    pub fn top_k(&self, cols: &[u32], vals: &[f32], k: usize, scores: &mut Vec<f32>, out: &mut Vec<Hit>) {
        scores.clone_from(&self.biases);
        self.walk(cols, vals, |g, xw| scores[g as usize] += xw);
        out.clear();
        if k == 0 {
            return;
        }
        // The k-th best score once there are k: lower scores (most of them) cost one comparison.
        let mut floor = f32::NEG_INFINITY;
        for (g, &score) in scores.iter().enumerate() {
            if score < floor {
                continue;
            }
            self.push_group(out, k, g as u32, score);
            if out.len() == k {
                floor = out[k - 1].score;
            }
        }
    }

    /// Pushes group g's labels, lowest first, each scoring `score`, while they enter the top k.
    #[inline]
    fn push_group(&self, out: &mut Vec<Hit>, k: usize, g: u32, score: f32) {
        for &class in &self.members[self.member_ptr[g as usize]..self.member_ptr[g as usize + 1]] {
            if !push_ranked(out, k, Hit { class, score }) {
                return;
            }
        }
    }

    /// The `k` best labels of every row, in parallel over rows (per-thread score buffers).
    pub fn predict(&self, x: &farout_data::SparseRows, k: usize) -> Vec<Vec<Hit>> {
        self.predict_first(x, x.n_rows(), k)
    }

    /// [`Self::predict`] for the first `n` rows of `x` only (all of them when `n` is larger).
    pub fn predict_first(&self, x: &farout_data::SparseRows, n: usize, k: usize) -> Vec<Vec<Hit>> {
        (0..n.min(x.n_rows()))
            .into_par_iter()
            .map_init(Vec::new, |scores, i| {
                let (c, v) = x.row(i);
                let mut hits = Vec::with_capacity(k);
                self.top_k(c, v, k, scores, &mut hits);
                hits
            })
            .collect()
    }
}

/// Each label's group, and each group's first (lowest) label: labels are grouped when their
/// features, weights and bias are equal bit for bit.
fn group_labels(model: &SparseModel) -> (Vec<u32>, Vec<u32>) {
    let bits = |w: &[f32]| w.iter().map(|w| w.to_bits()).collect::<Vec<u32>>();
    let mut groups: HashMap<(&[u32], Vec<u32>, u32), u32> = HashMap::new();
    let (mut group_of, mut first_of) = (Vec::with_capacity(model.n_labels()), Vec::new());
    for k in 0..model.n_labels() {
        let (features, weights, bias) = model.label(k);
        let g = *groups.entry((features, bits(weights), bias.to_bits())).or_insert_with(|| {
            first_of.push(k as u32);
            first_of.len() as u32 - 1
        });
        group_of.push(g);
    }
    (group_of, first_of)
}

/// Feature-major (feature_ptr, groups, weights) of the groups' first labels.
fn transpose(model: &SparseModel, first_of: &[u32]) -> (Vec<usize>, Vec<u32>, Vec<f32>) {
    let labels = || first_of.iter().map(|&k| model.label(k as usize));
    let n_features = labels().flat_map(|l| l.0.iter()).max().map_or(0, |&f| f as usize + 1);
    let mut ptr = vec![0usize; n_features + 1];
    labels().flat_map(|l| l.0.iter()).for_each(|&f| ptr[f as usize + 1] += 1);
    (0..n_features).for_each(|j| ptr[j + 1] += ptr[j]);
    let mut fill = ptr.clone();
    let (mut groups, mut weights) = (vec![0u32; ptr[n_features]], vec![0f32; ptr[n_features]]);
    for (g, (f, w, _)) in labels().enumerate() {
        for (&f, &w) in f.iter().zip(w) {
            let at = &mut fill[f as usize];
            groups[*at] = g as u32;
            weights[*at] = w;
            *at += 1;
        }
    }
    (ptr, groups, weights)
}

/// The ranking of [`farout_core::topk::top_k`] on scores that are not NaN: higher score first,
/// equal scores (−0 = +0 included) by lower label first.
fn ranked(score_a: f32, a: u32, score_b: f32, b: u32) -> Ordering {
    match score_b.partial_cmp(&score_a) {
        Some(Ordering::Equal) | None => a.cmp(&b),
        Some(order) => order,
    }
}

/// Inserts `hit` into `out` (at most `k` hits, best first by [`ranked`]); returns whether it
/// entered. NaN scores never enter, as [`farout_core::topk::top_k`] skips them.
fn push_ranked(out: &mut Vec<Hit>, k: usize, hit: Hit) -> bool {
    if k == 0 || hit.score.is_nan() {
        return false;
    }
    if out.len() == k {
        let last = out[k - 1];
        // Lower scores (most of them) are turned away by one comparison.
        if hit.score < last.score || ranked(hit.score, hit.class, last.score, last.class).is_ge() {
            return false;
        }
    }
    let at = out.partition_point(|h| ranked(h.score, h.class, hit.score, hit.class).is_lt());
    if out.len() == k {
        out.pop();
    }
    out.insert(at, hit);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_core::topk::top_k;

    #[test]
    fn the_predictor_is_sized_by_the_features_that_have_weights() {
        let mut m = SparseModel::new(u32::MAX as usize, false);
        m.push_label(&[2], &[1.0], 0.0);
        let p = m.predictor();
        assert_eq!(p.feature_ptr.len(), 4);
        let mut scores = Vec::new();
        p.scores_into(&[2, 4_000_000_000], &[2.0, 7.0], &mut scores);
        assert_eq!(scores, vec![2.0]);
    }

    #[test]
    fn feature_major_scores_equal_per_label_dot_products() {
        let mut m = SparseModel::new(5, true);
        m.push_label(&[0, 3], &[0.5, -1.25], 0.25);
        m.push_label(&[], &[], -0.5);
        m.push_label(&[1, 3, 4], &[2.0, 0.75, -0.125], 0.0);
        let p = m.predictor();
        let (cols, vals) = ([0u32, 3, 4, 7], [1.0f32, 2.0, -1.0, 5.0]);
        let mut scores = Vec::new();
        p.scores_into(&cols, &vals, &mut scores);
        assert_eq!(scores, vec![0.25 + 0.5 - 2.5, -0.5, 1.5 + 0.125]);
        let mut hits = Vec::new();
        p.top_k(&cols, &vals, 2, &mut Vec::new(), &mut hits);
        assert_eq!(hits.iter().map(|h| h.class).collect::<Vec<_>>(), vec![2, 1]);
    }

    #[test]
    fn labels_with_equal_weights_and_bias_are_one_group() {
        let mut m = SparseModel::new(5, true);
        for (f, w, b) in [
            (&[0u32, 3][..], &[0.5f32, -1.0][..], 0.25f32),
            (&[0, 3], &[0.5, -1.0], 0.25),
            (&[0, 3], &[0.5, -1.0], 0.5),
            (&[], &[], 0.25),
            (&[0, 3], &[0.5, -1.0], 0.25),
        ] {
            m.push_label(f, w, b);
        }
        let p = m.predictor();
        assert_eq!((p.n_labels(), p.n_distinct_labels()), (5, 3));
        assert_eq!(p.group_of, vec![0, 0, 1, 2, 0]);
        assert_eq!(p.weights.len(), 4, "one copy of the shared weights");
    }

    proptest::proptest! {
        /// Labels drawn from a few weight vectors and biases, so that many are equal (groups)
        /// and scores tie (also at −0 and +0); rows reaching few or all labels; k up to beyond
        /// K.
        #[test]
        fn top_k_ranks_as_the_dense_scores_do(
            labels in proptest::collection::vec(
                (proptest::collection::btree_map(0u32..6, proptest::sample::select(vec![-1.0f32, -0.5, 0.5, 1.0]), 0..3),
                 proptest::sample::select(vec![-1.0f32, -0.0, 0.0, 0.5, 1.0])), 1..30),
            rows in proptest::collection::vec(
                proptest::collection::btree_map(0u32..8, proptest::sample::select(vec![0.5f32, 1.0, 2.0]), 0..4), 1..6),
            k in 0usize..35,
        ) {
            let mut m = SparseModel::new(6, true);
            for (weights, b) in &labels {
                let (f, w): (Vec<u32>, Vec<f32>) = weights.iter().map(|(a, b)| (*a, *b)).unzip();
                m.push_label(&f, &w, *b);
            }
            let p = m.predictor();
            let (mut scratch, mut scores, mut got, mut want) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for row in &rows {
                let (cols, vals): (Vec<u32>, Vec<f32>) = row.iter().map(|(a, b)| (*a, *b)).unzip();
                p.top_k(&cols, &vals, k, &mut scratch, &mut got);
                p.scores_into(&cols, &vals, &mut scores);
                let dense: Vec<f32> = (0..m.n_labels()).map(|l| {
                    let (f, w, b) = m.label(l);
                    f.iter().zip(w).fold(b, |s, (&j, &wj)| s + row.get(&j).copied().unwrap_or(0.0) * wj)
                }).collect();
                proptest::prop_assert_eq!(&scores, &dense);
                top_k(&scores, k, &mut want);
                proptest::prop_assert_eq!(&got, &want);
            }
        }
    }
}
