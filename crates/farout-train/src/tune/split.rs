//! The validation split: rows of the training set set aside, so that a search never looks at
//! the test set.
//!
//! `data.holdout = F` carves a seeded random `F` of the training rows out as the set a run
//! evaluates on (the test file is then not read at all), and `data.train_fraction = G` trains
//! on a seeded `G` of the rows that remain (the growing data of successive halving for the
//! linear solvers). Both draws are fixed by `seed`, so every trial of a search sees the same
//! validation rows, and a larger fraction holds every row of a smaller one.

use farout_core::rng::{self, shuffle};
use farout_data::{Dataset, Features, LabelSets, SparseRows};

/// Stream of the row permutation within the config's seed (apart from every other draw).
const SPLIT_STREAM: u64 = 0x5EED_5917;

/// The rows of an `n`-row training set that train (`.0`) and that validate (`.1`), each in
/// increasing order: `round(holdout * n)` validation rows (at least one, and at least one
/// training row, when `holdout > 0`), then `train_fraction` of the rest, rounded up.
pub fn rows(n: usize, holdout: f64, train_fraction: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut order: Vec<usize> = (0..n).collect();
    shuffle(&mut order, &mut rng::seeded(seed, SPLIT_STREAM));
    let n_valid = if holdout > 0.0 && n >= 2 { ((holdout * n as f64).round() as usize).clamp(1, n - 1) } else { 0 };
    let (valid, rest) = order.split_at(n_valid);
    let n_train = ((train_fraction * rest.len() as f64).ceil() as usize).clamp(rest.len().min(1), rest.len());
    let (mut train, mut valid) = (rest[..n_train].to_vec(), valid.to_vec());
    train.sort_unstable();
    valid.sort_unstable();
    (train, valid)
}

/// The samples `rows` of `ds`, in that order.
pub fn select(ds: &Dataset, rows: &[usize]) -> Dataset {
    let mut labels = LabelSets::new(ds.labels.n_labels);
    rows.iter().for_each(|&i| labels.push(ds.labels.get(i)));
    let features = match &ds.features {
        Features::Sparse(s) => {
            let mut out = SparseRows::new(s.n_cols);
            for &i in rows {
                let (c, v) = s.row(i);
                out.push_row(c, v);
            }
            Features::Sparse(out)
        }
        Features::Dense(m) => {
            let data = rows.iter().flat_map(|&i| m.row(i).iter().copied()).collect();
            Features::Dense(farout_core::Matrix::from_vec(rows.len(), m.cols(), data).expect("rows x cols values"))
        }
    };
    Dataset { features, labels }
}

/// Splits `train` by [`rows`]: the training part and the validation part.
pub fn split(train: &Dataset, holdout: f64, train_fraction: f64, seed: u64) -> (Dataset, Dataset) {
    let (t, v) = rows(train.len(), holdout, train_fraction, seed);
    (select(train, &t), select(train, &v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_and_training_rows_are_disjoint_and_seeded() {
        let (t, v) = rows(1000, 0.2, 1.0, 7);
        assert_eq!((t.len(), v.len()), (800, 200));
        let all: std::collections::BTreeSet<usize> = t.iter().chain(&v).copied().collect();
        assert_eq!(all.len(), 1000, "every row is in exactly one part");
        assert_eq!(rows(1000, 0.2, 1.0, 7), (t.clone(), v.clone()), "same seed, same split");
        assert_ne!(rows(1000, 0.2, 1.0, 8).1, v, "another seed, another split");
    }

    #[test]
    fn a_smaller_training_fraction_is_a_subset_of_a_larger_one_with_the_same_validation_rows() {
        let (full, v) = rows(500, 0.1, 1.0, 3);
        let (half, v2) = rows(500, 0.1, 0.5, 3);
        let (quarter, _) = rows(500, 0.1, 0.25, 3);
        assert_eq!(v, v2);
        assert_eq!(half.len(), 225);
        assert!(quarter.iter().all(|r| half.binary_search(r).is_ok()));
        assert!(half.iter().all(|r| full.binary_search(r).is_ok()));
    }

    /// The first feature of every row (each test row's is unique to it).
    fn first_features(ds: &Dataset) -> Vec<u32> {
        let Features::Sparse(s) = &ds.features else { panic!("sparse") };
        (0..s.n_rows()).map(|i| s.row(i).0[0]).collect()
    }

    #[test]
    fn the_validation_split_never_contains_test_rows_and_never_reads_the_test_file() {
        let dir = tempfile::tempdir().unwrap();
        let row = |f: usize| format!("{} {f}:1\n", f % 3);
        let train: String = (0..40).map(row).collect();
        let test: String = (100..120).map(row).collect();
        std::fs::write(dir.path().join("train.txt"), format!("40 200 3\n{train}")).unwrap();
        std::fs::write(dir.path().join("test.txt"), format!("20 200 3\n{test}")).unwrap();
        let text = |test: &str| {
            format!(
                "[data]\nformat = \"xmc\"\ntrain = \"{}\"\ntest = \"{}\"\nholdout = 0.25\n\
                 [model]\nencoder = \"doc_encoder\"\n[output]\nestimator = \"softmax\"\n",
                dir.path().join("train.txt").display(),
                dir.path().join(test).display()
            )
        };
        let config = crate::Config::parse(&text("test.txt"), &[]).unwrap();
        let data = crate::data::load(&config).unwrap();
        let valid = first_features(data.test.as_ref().unwrap());
        let kept = first_features(&data.train);
        assert_eq!(valid.len(), 10);
        assert!(valid.iter().all(|&f| f < 40), "validation rows come from the training file: {valid:?}");
        assert!(valid.iter().all(|f| !kept.contains(f)), "and are not trained on");
        assert_eq!(kept.len() + valid.len(), 40);
        // A test file that does not exist is not an error: the split never opens it.
        let config = crate::Config::parse(&text("missing.txt"), &[]).unwrap();
        assert_eq!(first_features(crate::data::load(&config).unwrap().test.as_ref().unwrap()), valid);
    }

    #[test]
    fn tiny_sets_keep_a_row_on_each_side() {
        assert_eq!(rows(2, 0.01, 1.0, 1).1.len(), 1);
        assert_eq!(rows(2, 0.99, 1.0, 1).0.len(), 1);
        assert_eq!(rows(5, 0.0, 1.0, 1), ((0..5).collect(), vec![]));
    }
}
