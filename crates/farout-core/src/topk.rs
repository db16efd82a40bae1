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

/// Streaming top-k over `(class, score)` pushes: a min-heap of the best `k` so far, so a push
/// that does not beat the current k-th best costs one comparison and one that does costs
/// O(log k). Use it when k is large (hundreds to thousands) or scores are not in one slice.
#[derive(Clone, Debug, Default)]
pub struct TopK {
    k: usize,
    heap: std::collections::BinaryHeap<std::cmp::Reverse<Ranked>>,
}

/// Heap entry ordered by score, then by lower class id first (so ties keep index order).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ranked(Hit);

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.score.total_cmp(&other.0.score).then(other.0.class.cmp(&self.0.class))
    }
}

impl TopK {
    /// Starts a selection of the best `k`, keeping the heap's allocation.
    pub fn reset(&mut self, k: usize) {
        self.k = k;
        self.heap.clear();
    }

    /// The score a new entry must beat to enter (minus infinity until k entries are held).
    #[inline]
    pub fn threshold(&self) -> f32 {
        if self.heap.len() < self.k {
            f32::NEG_INFINITY
        } else {
            self.heap.peek().map_or(f32::NEG_INFINITY, |r| r.0.0.score)
        }
    }

    /// Offers `(class, score)`; NaN scores are ignored.
    #[inline]
    pub fn push(&mut self, class: ClassId, score: f32) {
        if self.k == 0 || score.is_nan() {
            return;
        }
        let hit = std::cmp::Reverse(Ranked(Hit { class, score }));
        if self.heap.len() < self.k {
            self.heap.push(hit);
        } else if let Some(mut top) = self.heap.peek_mut()
            && hit < *top
        {
            *top = hit;
        }
    }

    /// Number held.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Writes the selection into `out`, best first (ties: lower class first), and empties it.
    pub fn drain_sorted(&mut self, out: &mut Vec<Hit>) {
        out.clear();
        out.extend(self.heap.drain().map(|r| r.0.0));
        out.sort_unstable_by(|a, b| b.score.total_cmp(&a.score).then(a.class.cmp(&b.class)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn heap_top_k_equals_buffer_top_k(scores in prop::collection::vec(-50i32..50, 0..300), k in 0usize..40) {
            let scores: Vec<f32> = scores.into_iter().map(|s| s as f32).collect();
            let mut a = Vec::new();
            top_k(&scores, k, &mut a);
            let mut t = TopK::default();
            t.reset(k);
            for (i, &s) in scores.iter().enumerate() {
                t.push(i as ClassId, s);
            }
            let mut b = Vec::new();
            t.drain_sorted(&mut b);
            prop_assert_eq!(a, b);
        }
    }

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
