//! Top-k selection of scores.

use crate::ClassId;

/// A scored class.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hit {
    /// The class.
    pub class: ClassId,
    /// Its score.
    pub score: f32,
}

/// The `k` largest entries of `scores`, best first (ties: lower index first), into `out`.
///
/// One pass with a small sorted buffer: a score below the current k-th is rejected by one
/// comparison, so the common case costs O(K) with k much smaller than K. NaN scores are skipped.
pub fn top_k(scores: &[f32], k: usize, out: &mut Vec<Hit>) {
    out.clear();
    if k == 0 {
        return;
    }
    for (i, &s) in scores.iter().enumerate() {
        if out.len() == k && !(s > out[k - 1].score) {
            continue;
        }
        if s.is_nan() {
            continue;
        }
        // Position after every element >= s keeps ties in index order.
        let pos = out.partition_point(|h| h.score >= s);
        if out.len() == k {
            out.pop();
        }
        out.insert(pos, Hit { class: i as ClassId, score: s });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn top_k_equals_sorting(scores in prop::collection::vec(-100i32..100, 0..200), k in 0usize..20) {
            let scores: Vec<f32> = scores.into_iter().map(|s| s as f32).collect();
            let mut out = Vec::new();
            top_k(&scores, k, &mut out);
            let mut idx: Vec<usize> = (0..scores.len()).collect();
            idx.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap().then(a.cmp(&b)));
            idx.truncate(k);
            let expect: Vec<u32> = idx.into_iter().map(|i| i as u32).collect();
            let got: Vec<u32> = out.iter().map(|h| h.class).collect();
            prop_assert_eq!(got, expect);
        }
    }
}
