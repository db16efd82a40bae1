//! Ranking metrics of extreme classification (P@k, nDCG@k), accuracy, and the exact loss.
//!
//! For a sample with positive set `P` and predicted ranking `r_1, r_2, ...`:
//! - `P@k = |{r_1..r_k} ∩ P| / k`;
//! - `nDCG@k = DCG@k / IDCG@k` with `DCG@k = sum_{i<=k, r_i in P} 1 / log2(i + 1)` and
//!   `IDCG@k = sum_{i <= min(k, |P|)} 1 / log2(i + 1)`.
//!
//! Samples without labels are skipped (they carry no ranking signal), as in the Extreme
//! Classification Repository's evaluation scripts.

use crate::ClassId;
use crate::topk::Hit;
use std::collections::BTreeMap;

/// The cut-offs reported.
pub const KS: [usize; 3] = [1, 3, 5];

/// Running sums of the ranking metrics.
#[derive(Clone, Debug, Default)]
pub struct RankingSums {
    precision: [f64; 3],
    ndcg: [f64; 3],
    loss: f64,
    n: usize,
}

impl RankingSums {
    /// Adds one sample: its ranked predictions (at least 5, best first), its positives, and its
    /// exact loss.
    pub fn add(&mut self, ranked: &[Hit], positives: &[ClassId], loss: f64) {
        if positives.is_empty() {
            return;
        }
        self.n += 1;
        self.loss += loss;
        let mut hits = 0usize;
        let mut dcg = 0.0;
        // Ranks past the end of `ranked` (fewer than 5 classes) count as misses.
        for i in 0..*KS.last().unwrap() {
            if ranked.get(i).is_some_and(|h| positives.contains(&h.class)) {
                hits += 1;
                dcg += 1.0 / ((i + 2) as f64).log2();
            }
            if let Some(at) = KS.iter().position(|&k| k == i + 1) {
                let k = KS[at];
                let idcg: f64 = (0..k.min(positives.len())).map(|j| 1.0 / ((j + 2) as f64).log2()).sum();
                self.precision[at] += hits as f64 / k as f64;
                self.ndcg[at] += dcg / idcg;
            }
        }
    }

    /// Merges another set of sums.
    pub fn merge(&mut self, o: &RankingSums) {
        for i in 0..3 {
            self.precision[i] += o.precision[i];
            self.ndcg[i] += o.ndcg[i];
        }
        self.loss += o.loss;
        self.n += o.n;
    }

    /// Means: `p@k`, `ndcg@k`, `loss`, plus `accuracy` (= P@1) when `multiclass`.
    pub fn finish(&self, multiclass: bool) -> BTreeMap<String, f64> {
        let n = self.n.max(1) as f64;
        let mut m = BTreeMap::new();
        for (i, k) in KS.iter().enumerate() {
            m.insert(format!("p@{k}"), self.precision[i] / n);
            m.insert(format!("ndcg@{k}"), self.ndcg[i] / n);
        }
        m.insert("loss".into(), self.loss / n);
        if multiclass {
            m.insert("accuracy".into(), self.precision[0] / n);
        }
        m.insert("samples".into(), self.n as f64);
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranked(classes: &[u32]) -> Vec<Hit> {
        classes.iter().map(|&c| Hit { class: c, score: 0.0 }).collect()
    }

    #[test]
    fn precision_and_ndcg_on_a_hand_example() {
        let mut s = RankingSums::default();
        // Positives {2, 9}; ranking 2, 5, 9, 1, 0.
        s.add(&ranked(&[2, 5, 9, 1, 0]), &[2, 9], 0.5);
        let m = s.finish(false);
        assert_eq!(m["p@1"], 1.0);
        assert!((m["p@3"] - 2.0 / 3.0).abs() < 1e-12);
        assert!((m["p@5"] - 0.4).abs() < 1e-12);
        let idcg = 1.0 + 1.0 / 3f64.log2();
        assert!((m["ndcg@3"] - (1.0 + 1.0 / 4f64.log2()) / idcg).abs() < 1e-12);
        assert_eq!(m["ndcg@1"], 1.0);
        assert!(!m.contains_key("accuracy"));
    }

    #[test]
    fn fewer_than_five_classes_count_missing_ranks_as_misses() {
        let mut s = RankingSums::default();
        s.add(&ranked(&[1, 0]), &[1], 0.0);
        let m = s.finish(true);
        assert_eq!((m["p@1"], m["p@5"]), (1.0, 0.2));
        assert_eq!(m["ndcg@5"], 1.0);
    }

    #[test]
    fn unlabelled_samples_are_skipped_and_accuracy_is_p_at_1() {
        let mut s = RankingSums::default();
        s.add(&ranked(&[0, 1, 2, 3, 4]), &[0], 1.0);
        s.add(&ranked(&[0, 1, 2, 3, 4]), &[4], 3.0);
        s.add(&ranked(&[0, 1, 2, 3, 4]), &[], 100.0);
        let m = s.finish(true);
        assert_eq!((m["accuracy"], m["loss"], m["samples"]), (0.5, 2.0, 2.0));
    }
}
