//! Seeded tiny problems for the unit tests.

use farout_core::rng::{self, RngExt};
use farout_data::{LabelSets, SparseRows};

/// Random sparse rows (each feature present with probability 0.4, values in [0.1, 2)) and
/// positives (each sample with probability 0.3).
pub fn random_problem(seed: u64, n: usize, d: usize) -> (SparseRows, Vec<u32>) {
    let (x, labels) = random_dataset(seed, n, d, 1);
    let positives = (0..n as u32).filter(|&i| !labels.get(i as usize).is_empty()).collect();
    (x, positives)
}

/// Random sparse rows as in [`random_problem`] and `k` labels, label j on a sample with
/// probability 0.3/(j + 1) (a small power law).
pub fn random_dataset(seed: u64, n: usize, d: usize, k: usize) -> (SparseRows, LabelSets) {
    let mut r = rng::seeded(seed, 0);
    let mut x = SparseRows::new(d);
    let mut labels = LabelSets::new(k);
    let (mut cols, mut vals, mut ls) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        cols.clear();
        vals.clear();
        ls.clear();
        for j in 0..d as u32 {
            if r.random::<f64>() < 0.4 {
                cols.push(j);
                vals.push(r.random_range(0.1f32..2.0));
            }
        }
        for j in 0..k as u32 {
            if r.random::<f64>() < 0.3 / (j + 1) as f64 {
                ls.push(j);
            }
        }
        x.push_row(&cols, &vals);
        labels.push(&ls);
    }
    (x, labels)
}

/// Dense f64 rows, with the bias feature 1 appended when `bias`.
pub fn dense_rows(x: &SparseRows, bias: bool) -> Vec<Vec<f64>> {
    (0..x.n_rows())
        .map(|i| {
            let mut row = vec![0.0; x.n_cols + bias as usize];
            let (c, v) = x.row(i);
            c.iter().zip(v).for_each(|(&c, &v)| row[c as usize] += v as f64);
            if bias {
                row[x.n_cols] = 1.0;
            }
            row
        })
        .collect()
}
