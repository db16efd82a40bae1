//! Top-k selection of scores.

use crate::{ClassId, kernels};
use std::cmp::Ordering;

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
/// One pass with a small sorted buffer: once it holds `k`, a run of [`TOP_K_RUN`] scores none
/// of which beats the current k-th is rejected by one vector comparison, so the common case
/// costs O(K) at a few scores per cycle with k much smaller than K. NaN scores are skipped.
pub fn top_k(scores: &[f32], k: usize, out: &mut Vec<Hit>) {
    out.clear();
    if k == 0 {
        return;
    }
    let push = |i: usize, s: f32, out: &mut Vec<Hit>| {
        if (out.len() == k && !(s > out[k - 1].score)) || s.is_nan() {
            return;
        }
        // Position after every element >= s keeps ties in index order.
        let pos = out.partition_point(|h| h.score >= s);
        if out.len() == k {
            out.pop();
        }
        out.insert(pos, Hit { class: i as ClassId, score: s });
    };
    let runs = scores.chunks_exact(TOP_K_RUN);
    let tail = runs.remainder();
    for (r, run) in runs.enumerate() {
        // No short circuit, so that the comparisons vectorise.
        if out.len() == k && !run.iter().fold(false, |any, &s| any | (s > out[k - 1].score)) {
            continue;
        }
        run.iter().enumerate().for_each(|(j, &s)| push(r * TOP_K_RUN + j, s, out));
    }
    let start = scores.len() - tail.len();
    tail.iter().enumerate().for_each(|(j, &s)| push(start + j, s, out));
}

/// Scores [`top_k`] rejects with one comparison once its buffer is full.
const TOP_K_RUN: usize = 16;

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

/// Orders hits best first; ties: lower class first.
pub fn by_score(a: &Hit, b: &Hit) -> std::cmp::Ordering {
    b.score.total_cmp(&a.score).then(a.class.cmp(&b.class))
}

/// A key whose ascending order is `score`'s descending order under `f32::total_cmp`, ties by
/// ascending `index`: sorting these integers orders best first, as [`by_score`] does, with
/// cheaper comparisons than a closure that looks scores up.
#[inline]
pub fn descending_key(score: f32, index: u32) -> u64 {
    // Flip the sign bit of positive floats and every bit of negative ones: ascending integers
    // follow `total_cmp`; complementing reverses that.
    let bits = score.to_bits();
    let ascending = if bits >> 31 == 1 { !bits } else { bits | 0x8000_0000 };
    (u64::from(!ascending) << 32) | u64::from(index)
}

/// Samples drawn to place the threshold of [`select_best`].
const THRESHOLD_SAMPLES: usize = 1024;

/// The `n` best of many scored candidates, given as parts `(scores, classes)` of equal lengths
/// (e.g. one per probed cluster), into `out` in no particular order; ties at the cut go to the
/// lower class, as [`by_score`] orders them. Scores that are NaN are never selected.
///
/// For large inputs (tens of thousands of candidates, n in the thousands) a heap or a
/// selection over all of them spends most of its time moving candidates. Instead, a threshold
/// is read off a strided sample of about a thousand scores, placed so that about `1.25 n + 8`
/// candidates pass in expectation; one pass over the scores keeps those at or above it (one
/// comparison each) and a selection finishes on the few kept. If fewer than `n` pass, every
/// candidate is kept, so the result never depends on the sample.
pub fn select_best(parts: &[(&[f32], &[ClassId])], n: usize, sample: &mut Vec<f32>, out: &mut Vec<Hit>) {
    out.clear();
    let total: usize = parts.iter().map(|(s, _)| s.len()).sum();
    let keep_all = |out: &mut Vec<Hit>| {
        out.clear();
        for (scores, classes) in parts {
            out.extend(
                classes
                    .iter()
                    .zip(scores.iter())
                    .filter(|(_, s)| !s.is_nan())
                    .map(|(&class, &score)| Hit { class, score }),
            );
        }
    };
    if n == 0 {
        return;
    }
    match sampled_threshold(parts.iter().map(|(s, _)| *s), total, n, sample) {
        None => keep_all(out),
        Some(threshold) => {
            // Scores above the threshold are kept; those equal to it are only counted, so that
            // a mass of ties (rows that are all equal, e.g. untrained) never fills `out`.
            let mut ties = 0usize;
            for (scores, classes) in parts {
                for (&class, &score) in classes.iter().zip(scores.iter()) {
                    if score >= threshold {
                        // In `by_score`'s order (total_cmp: -0 below +0).
                        match score.total_cmp(&threshold) {
                            Ordering::Greater => out.push(Hit { class, score }),
                            Ordering::Equal => ties += 1,
                            Ordering::Less => {}
                        }
                    }
                }
            }
            if out.len() + ties < n {
                keep_all(out);
            } else if out.len() < n {
                push_lowest_ties(parts, threshold, n - out.len(), out);
            }
        }
    }
    if out.len() > n {
        out.select_nth_unstable_by(n, by_score);
        out.truncate(n);
    }
}

/// Appends to `out` the `need` lowest classes among those scoring exactly `threshold` (ties at
/// the cut go to the lower class), holding at most `need` of them at a time.
fn push_lowest_ties(parts: &[(&[f32], &[ClassId])], threshold: f32, need: usize, out: &mut Vec<Hit>) {
    let mut lowest = std::collections::BinaryHeap::with_capacity(need + 1);
    for (scores, classes) in parts {
        for (&class, &score) in classes.iter().zip(scores.iter()) {
            if score.to_bits() == threshold.to_bits()
                && (lowest.len() < need || lowest.peek().is_some_and(|&top| class < top))
            {
                lowest.push(class);
                if lowest.len() > need {
                    lowest.pop();
                }
            }
        }
    }
    out.extend(lowest.into_iter().map(|class| Hit { class, score: threshold }));
}

/// A threshold about `1.25 n + 8` of the `total` scores in `parts` reach, read off a strided
/// sample of about [`THRESHOLD_SAMPLES`] of them (NaN sorts as the largest under `total_cmp`,
/// then never passes a `>=`: callers fall back to all scores when fewer than `n` pass). `None`
/// when the input is too small for sampling to pay.
fn sampled_threshold<'a>(
    parts: impl Iterator<Item = &'a [f32]>,
    total: usize,
    n: usize,
    sample: &mut Vec<f32>,
) -> Option<f32> {
    if total <= 2 * n || total < 4 * THRESHOLD_SAMPLES {
        return None;
    }
    let stride = total / THRESHOLD_SAMPLES;
    sample.clear();
    let mut skip = 0;
    for scores in parts {
        let mut i = skip;
        while i < scores.len() {
            sample.push(scores[i]);
            i += stride;
        }
        skip = i - scores.len();
    }
    let expect = ((1.25 * n as f64 * sample.len() as f64 / total as f64 + 8.0) as usize).min(sample.len() - 1);
    let (_, &mut threshold, _) = sample.select_nth_unstable_by(expect, |a, b| b.total_cmp(a));
    Some(threshold)
}

/// A lower bound of the `n`-th largest of `scores`, close to it: a value `t` that at least `n`
/// scores reach, within `(max - min) / 2^`[`FLOOR_STEPS`] below the `n`-th largest (minus
/// infinity when fewer than `n` scores are not NaN, plus infinity when `n` is 0). For a floor
/// that only has to stay at or below the `n`-th best: bisection by counting (16 scores per
/// step with AVX-512, [`kernels::count_at_least`]) costs a few passes over the scores and no
/// selection, cheaper on a few thousand scores than finding the `n`-th exactly ([`NthBest::of`]).
pub fn nth_best_floor(scores: &[f32], n: usize) -> f32 {
    floor_by_bisection(scores, n, 0)
}

/// A floor as [`nth_best_floor`] gives, found in fewer passes where a looser one serves: the
/// bisection stops at the first value that at least `n` and at most `n + slack` scores reach
/// (where it never meets one, it ends as [`nth_best_floor`] does). For a caller that keeps the
/// scores reaching the floor and then selects the `n` best of them exactly: `slack` bounds the
/// extra rows it keeps.
pub fn nth_best_floor_within(scores: &[f32], n: usize, slack: usize) -> f32 {
    floor_by_bisection(scores, n, slack.saturating_add(1))
}

/// A value that at least `n` of `scores` (none NaN) reach, found in one pass: the least of the maxima of
/// `n` disjoint groups (group `j` holds every `n`-th score from the `j`-th on), each of which
/// holds a score at or above it (minus infinity when there are fewer than `n` scores, plus
/// infinity when `n` is 0). Looser than [`nth_best_floor`]: on scores in no particular order
/// about `4 n` of 4,096 reach it. For a first floor over a block of scores where the next step
/// keeps what reaches it.
pub fn floor_of_maxima(scores: &[f32], n: usize) -> f32 {
    if n == 0 {
        return f32::INFINITY;
    }
    if scores.len() < n {
        return f32::NEG_INFINITY;
    }
    let mut maxima = scores[..n].to_vec();
    for group in scores[n..].chunks_exact(n) {
        for (m, &s) in maxima.iter_mut().zip(group) {
            // Lane by lane, so that the compiler keeps the maxima in vector registers.
            *m = if s > *m { s } else { *m };
        }
    }
    maxima.iter().fold(f32::INFINITY, |a, &m| a.min(m))
}

/// [`nth_best_floor`], stopping early at a value that `n` to `n + early - 1` scores reach
/// (never with `early` 0).
fn floor_by_bisection(scores: &[f32], n: usize, early: usize) -> f32 {
    if n == 0 {
        return f32::INFINITY;
    }
    let (lo, hi) = range_of(scores);
    if kernels::count_at_least(scores, lo) < n {
        return f32::NEG_INFINITY;
    }
    // Invariant: at least `n` scores reach `lo`, and the `n`-th largest is at most `hi`.
    let (mut lo, mut hi) = (lo, hi);
    for _ in 0..FLOOR_STEPS {
        let mid = lo + 0.5 * (hi - lo);
        if !(mid > lo && mid < hi) {
            break;
        }
        let reach = kernels::count_at_least(scores, mid);
        if reach >= n {
            lo = mid;
            if reach - n < early {
                break;
            }
        } else {
            hi = mid;
        }
    }
    lo
}

/// The smallest and largest of `scores`, NaN ignored (infinities when all are NaN or there
/// are none). Sixteen independent minima and maxima, which the compiler keeps in vector
/// registers, instead of one chain of dependent comparisons.
fn range_of(scores: &[f32]) -> (f32, f32) {
    let (mut lo, mut hi) = ([f32::INFINITY; 16], [f32::NEG_INFINITY; 16]);
    let blocks = scores.chunks_exact(16);
    let tail = blocks.remainder();
    for block in blocks {
        for ((l, h), &s) in lo.iter_mut().zip(&mut hi).zip(block) {
            // `min` and `max` ignore NaN.
            *l = l.min(s);
            *h = h.max(s);
        }
    }
    let init = tail.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &s| (a.min(s), b.max(s)));
    lo.iter().zip(&hi).fold(init, |(a, b), (&l, &h)| (a.min(l), b.max(h)))
}

/// Bisection steps of [`nth_best_floor`]: it ends within 1 / 4,096 of the scores' range below
/// the `n`-th largest.
pub const FLOOR_STEPS: usize = 12;

/// Finds the `n`-th largest of many scores (keeping its buffers between calls).
#[derive(Clone, Debug, Default)]
pub struct NthBest {
    sample: Vec<f32>,
    positions: Vec<u32>,
    kept: Vec<f32>,
}

impl NthBest {
    /// The `n`-th largest score of `parts` taken as one sequence (under `f32::total_cmp`; NaN
    /// scores do not count): exactly `n` scores are at or above it when there are no ties;
    /// minus infinity when fewer than `n` scores are not NaN, plus infinity when `n` is 0.
    ///
    /// Sampling as in [`select_best`] places a first threshold; one pass keeps the scores that
    /// reach it (about `1.25 n`; 16 scores per step with AVX-512, see
    /// [`kernels::keep_at_least`]) and a selection among those finds the `n`-th.
    pub fn of(&mut self, parts: &[&[f32]], n: usize) -> f32 {
        if n == 0 {
            return f32::INFINITY;
        }
        let total = parts.iter().map(|p| p.len()).sum();
        let first = sampled_threshold(parts.iter().copied(), total, n, &mut self.sample);
        self.keep(parts, first.unwrap_or(f32::NEG_INFINITY));
        if self.kept.len() < n && first.is_some() {
            self.keep(parts, f32::NEG_INFINITY);
        }
        if self.kept.len() < n {
            return f32::NEG_INFINITY;
        }
        let (_, &mut nth, _) = self.kept.select_nth_unstable_by(n - 1, |a, b| b.total_cmp(a));
        nth
    }

    /// Keeps the scores of `parts` at or above `threshold`.
    fn keep(&mut self, parts: &[&[f32]], threshold: f32) {
        self.kept.clear();
        for part in parts {
            self.positions.clear();
            kernels::keep_at_least(part, threshold, &mut self.positions, &mut self.kept);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The n best by sorting everything: the reference for `select_best`.
    fn best_by_sorting(parts: &[(Vec<f32>, Vec<ClassId>)], n: usize) -> Vec<Hit> {
        let mut all: Vec<Hit> = parts
            .iter()
            .flat_map(|(s, c)| c.iter().zip(s).map(|(&class, &score)| Hit { class, score }))
            .filter(|h| !h.score.is_nan())
            .collect();
        all.sort_unstable_by(by_score);
        all.truncate(n);
        all
    }

    /// `len` standard normal scores, rounded to quarters (many ties) when `coarse`.
    fn normal_scores(r: &mut crate::Rng, len: usize, coarse: bool) -> Vec<f32> {
        (0..len)
            .map(|_| {
                let x = crate::rng::normal(r);
                if coarse { (x * 4.0).round() / 4.0 } else { x }
            })
            .collect()
    }

    /// The floor is reached by at least `n` scores, is at most the `n`-th largest and within
    /// the bisection's resolution of it, with ties, NaN and constant scores.
    #[test]
    fn nth_best_floor_is_a_close_lower_bound() {
        let mut r = crate::rng::seeded(3, 0);
        for (len, n) in [(1, 1), (50, 1), (50, 50), (1640, 382), (764, 382), (3000, 7), (200, 150)] {
            for coarse in [false, true] {
                let mut scores = normal_scores(&mut r, len, coarse);
                if len > 10 {
                    scores[7] = f32::NAN;
                }
                let valid: Vec<f32> = scores.iter().copied().filter(|s| !s.is_nan()).collect();
                let floor = nth_best_floor(&scores, n);
                if valid.len() < n {
                    assert_eq!(floor, f32::NEG_INFINITY);
                    continue;
                }
                let mut sorted = valid.clone();
                sorted.sort_unstable_by(|a, b| b.total_cmp(a));
                let nth = sorted[n - 1];
                let range = sorted[0] - sorted[sorted.len() - 1];
                assert!(floor <= nth, "len {len}, n {n}: floor {floor} above the n-th best {nth}");
                assert!(valid.iter().filter(|&&s| s >= floor).count() >= n, "len {len}, n {n}");
                assert!(nth - floor <= range / (1 << FLOOR_STEPS) as f32 * 1.01, "len {len}, n {n}: {floor} vs {nth}");
            }
        }
        assert_eq!(nth_best_floor(&[0.5; 10], 10), 0.5, "constant scores");
        assert_eq!(nth_best_floor(&[0.5, f32::NAN], 2), f32::NEG_INFINITY, "NaN does not count");
        assert_eq!(nth_best_floor(&[], 1), f32::NEG_INFINITY);
        assert_eq!(nth_best_floor(&[1.0], 0), f32::INFINITY);
    }

    /// With slack the floor is still reached by at least `n` scores and at most the `n`-th
    /// largest; it is reached by at most `n + slack`, or else it is as close as
    /// [`nth_best_floor`]'s.
    #[test]
    fn nth_best_floor_within_a_slack_bounds_what_reaches_it() {
        let mut r = crate::rng::seeded(4, 0);
        for (len, n, slack) in [(4400, 42, 42), (14000, 250, 250), (3000, 7, 0), (500, 400, 30), (50, 50, 5)] {
            for coarse in [false, true] {
                let scores = normal_scores(&mut r, len, coarse);
                let floor = nth_best_floor_within(&scores, n, slack);
                let mut sorted = scores.clone();
                sorted.sort_unstable_by(|a, b| b.total_cmp(a));
                let (nth, range) = (sorted[n - 1], sorted[0] - sorted[len - 1]);
                let reach = scores.iter().filter(|&&s| s >= floor).count();
                assert!(floor <= nth && reach >= n, "len {len}, n {n}: floor {floor}, n-th {nth}");
                let close = nth - floor <= range / (1 << FLOOR_STEPS) as f32 * 1.01;
                assert!(reach <= n + slack || close, "len {len}, n {n}, slack {slack}: {reach} reach {floor}");
            }
        }
    }

    /// The least of the groups' maxima is reached by at least `n` scores, at most the `n`-th
    /// largest, and on scores in no particular order by a few times `n` of them.
    #[test]
    fn floor_of_maxima_is_reached_by_at_least_n_scores() {
        let mut r = crate::rng::seeded(5, 0);
        for (len, n) in [(4096, 52), (4096, 1), (52, 52), (100, 30), (8500, 40)] {
            for coarse in [false, true] {
                let scores = normal_scores(&mut r, len, coarse);
                let floor = floor_of_maxima(&scores, n);
                let mut sorted = scores.clone();
                sorted.sort_unstable_by(|a, b| b.total_cmp(a));
                let reach = scores.iter().filter(|&&s| s >= floor).count();
                assert!(floor <= sorted[n - 1] && reach >= n, "len {len}, n {n}: floor {floor}, {reach} reach it");
                if !coarse && len >= 64 * n {
                    assert!(reach <= 8 * n, "len {len}, n {n}: {reach} reach {floor}");
                }
            }
        }
        // The best n all in one group (every n-th score): the other groups' maxima are lower.
        let mut scores = vec![0.0f32; 30];
        (0..30).step_by(3).for_each(|i| scores[i] = 1.0);
        assert_eq!(floor_of_maxima(&scores, 3), 0.0);
        assert_eq!(floor_of_maxima(&[1.0, 2.0], 3), f32::NEG_INFINITY);
        assert_eq!(floor_of_maxima(&[1.0], 0), f32::INFINITY);
    }

    #[test]
    fn descending_keys_sort_as_by_score() {
        let scores = [1.5, -0.0, 0.0, -2.0, f32::INFINITY, f32::NEG_INFINITY, 1.5, -1e-30, 1e-30, 3.0, -2.0];
        let mut hits: Vec<Hit> =
            scores.iter().enumerate().map(|(i, &score)| Hit { class: i as ClassId, score }).collect();
        let mut keys: Vec<u64> = hits.iter().map(|h| descending_key(h.score, h.class)).collect();
        hits.sort_unstable_by(by_score);
        keys.sort_unstable();
        let from_keys: Vec<ClassId> = keys.iter().map(|&k| k as ClassId).collect();
        assert_eq!(from_keys, hits.iter().map(|h| h.class).collect::<Vec<_>>());
    }

    #[test]
    fn select_best_equals_sorting_on_large_inputs() {
        let mut r = crate::rng::seeded(11, 0);
        let mut sample = Vec::new();
        let mut out = Vec::new();
        for (case, &(parts, len, n)) in
            [(40, 1000, 2000), (7, 5000, 100), (300, 50, 3000), (1, 20_000, 19_000), (30, 400, 5)].iter().enumerate()
        {
            let mut next = 0;
            let data: Vec<(Vec<f32>, Vec<ClassId>)> = (0..parts)
                .map(|p| {
                    // Part-dependent offsets, coarse values (many ties) and a few NaNs.
                    let s = (0..len)
                        .map(|i| {
                            if (i + p) % 997 == 0 {
                                f32::NAN
                            } else {
                                (crate::rng::normal(&mut r) * 8.0).round() + p as f32 * 0.01
                            }
                        })
                        .collect();
                    let c = (next..next + len as ClassId).collect();
                    next += len as ClassId;
                    (s, c)
                })
                .collect();
            let refs: Vec<(&[f32], &[ClassId])> = data.iter().map(|(s, c)| (&s[..], &c[..])).collect();
            select_best(&refs, n, &mut sample, &mut out);
            out.sort_unstable_by(by_score);
            assert_eq!(out, best_by_sorting(&data, n), "case {case}");
        }
    }

    /// Equal scores everywhere (an untrained layer): the lowest classes, and `out` never holds
    /// more than a few times `n` (it used to grow to every candidate).
    #[test]
    fn select_best_on_ties_keeps_the_lowest_classes_and_little_memory() {
        let (mut sample, mut out) = (Vec::new(), Vec::new());
        // All +0, all -0, and parts of +0 and of -0 (-0 ranks below +0).
        for zeros in [[0.0f32, 0.0], [-0.0, -0.0], [0.0, -0.0]] {
            let data: Vec<(Vec<f32>, Vec<ClassId>)> = (0..8)
                .map(|p| (vec![zeros[p as usize % 2]; 10_000], (0..10_000).map(|i| i * 8 + p).collect()))
                .collect();
            let refs: Vec<(&[f32], &[ClassId])> = data.iter().map(|(s, c)| (&s[..], &c[..])).collect();
            select_best(&refs, 500, &mut sample, &mut out);
            assert!(out.capacity() <= 4 * 500, "capacity {}", out.capacity());
            out.sort_unstable_by(by_score);
            assert_eq!(out, best_by_sorting(&data, 500));
        }
    }

    proptest! {
        #[test]
        fn select_best_equals_sorting(scores in prop::collection::vec(-30i32..30, 0..400), n in 0usize..50, cut in 0usize..400) {
            let scores: Vec<f32> = scores.into_iter().map(|s| s as f32).collect();
            let cut = cut.min(scores.len());
            let classes: Vec<ClassId> = (0..scores.len() as ClassId).rev().collect();
            let data = vec![(scores[..cut].to_vec(), classes[..cut].to_vec()), (scores[cut..].to_vec(), classes[cut..].to_vec())];
            let refs: Vec<(&[f32], &[ClassId])> = data.iter().map(|(s, c)| (&s[..], &c[..])).collect();
            let mut out = Vec::new();
            select_best(&refs, n, &mut Vec::new(), &mut out);
            out.sort_unstable_by(by_score);
            prop_assert_eq!(out, best_by_sorting(&data, n));
        }
    }

    /// `NthBest` against sorting, on inputs large enough to sample (with ties and NaNs), split
    /// into parts, and small ones.
    #[test]
    fn nth_best_equals_sorting() {
        let mut r = crate::rng::seeded(12, 0);
        let mut nth = NthBest::default();
        for (len, n) in
            [(40_000, 2000), (35_000, 100), (15_000, 3000), (20_000, 19_999), (30, 5), (30, 29), (30, 30), (30, 0)]
        {
            let scores: Vec<f32> = (0..len)
                .map(|i| if i % 997 == 0 { f32::NAN } else { (crate::rng::normal(&mut r) * 8.0).round() })
                .collect();
            let mut sorted: Vec<f32> = scores.iter().copied().filter(|s| !s.is_nan()).collect();
            sorted.sort_unstable_by(|a, b| b.total_cmp(a));
            let expect = match n {
                0 => f32::INFINITY,
                n if n > sorted.len() => f32::NEG_INFINITY,
                n => sorted[n - 1],
            };
            // Uneven parts, some empty.
            let mut bounds: Vec<usize> =
                (0..7).map(|_| rand::Rng::random_range(&mut r, 0..=len)).chain([0, 0, len]).collect();
            bounds.sort_unstable();
            let parts: Vec<&[f32]> = bounds.windows(2).map(|b| &scores[b[0]..b[1]]).collect();
            assert_eq!(nth.of(&parts, n), expect, "{len} scores, n {n}");
        }
    }

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

    /// NaN scores are skipped inside the runs the buffer rejects whole and in the tail.
    #[test]
    fn top_k_skips_nan_in_runs_and_tail() {
        let scores: Vec<f32> = (0..101).map(|i| if i % 7 == 3 { f32::NAN } else { ((i * 37) % 50) as f32 }).collect();
        for k in [1, 5, 20] {
            let mut out = Vec::new();
            top_k(&scores, k, &mut out);
            let mut idx: Vec<usize> = (0..scores.len()).filter(|&i| !scores[i].is_nan()).collect();
            idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            let expect: Vec<ClassId> = idx[..k].iter().map(|&i| i as ClassId).collect();
            assert_eq!(out.iter().map(|h| h.class).collect::<Vec<_>>(), expect, "k {k}");
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
