//! DiSMEC on Bibtex (tf-idf + L2 rows) against PPDSparse's Table 2 and MSI against the zero start.

use crate::public_data;
use farout_core::topk::Hit;
use farout_data::{Features, LabelSets, SparseRows, xmc};
use farout_linear::{Dismec, DismecConfig, FeatureTransform, InitKind, TrainSet, Trained};
use std::path::Path;

/// DiSMEC's P@1/3/5 on Bibtex in Yen et al. (PPDSparse, KDD'17), Table 2, in percent.
const DISMEC_TABLE_2: [f64; 3] = [63.69, 38.80, 28.30];

fn read(path: &Path) -> (SparseRows, LabelSets) {
    let ds = xmc::read(path).unwrap();
    let Features::Sparse(x) = ds.features else { panic!("{}: dense features", path.display()) };
    (x, ds.labels)
}

/// P@1, P@3, P@5 in percent over the samples with labels.
fn precision(predicted: &[Vec<Hit>], labels: &LabelSets) -> [f64; 3] {
    let mut p = [0.0; 3];
    let mut n = 0.0;
    for (i, hits) in predicted.iter().enumerate() {
        let pos = labels.get(i);
        if pos.is_empty() {
            continue;
        }
        n += 1.0;
        for (at, k) in [1, 3, 5].into_iter().enumerate() {
            p[at] += hits[..k].iter().filter(|h| pos.contains(&h.class)).count() as f64 / k as f64;
        }
    }
    p.map(|v| 100.0 * v / n)
}

#[test]
fn dismec_on_tfidf_bibtex_matches_table_2_and_msi_matches_zero_with_fewer_cg_steps() {
    let Some(dir) = public_data("dismec_on_tfidf_bibtex", "xmc/bibtex") else { return };
    let (mut train_x, train_y) = read(&dir.join("train.txt"));
    let (mut test_x, test_y) = read(&dir.join("test.txt"));
    let transform = FeatureTransform { tfidf: true, normalize_rows: true }.fit(&train_x);
    transform.apply(&mut train_x).unwrap();
    transform.apply(&mut test_x).unwrap();
    let data = TrainSet::new(train_x, &train_y).unwrap();
    let run = |init| -> (Trained, [f64; 3]) {
        let trained = Dismec::new(&DismecConfig { init, ..Default::default() }).unwrap().train(&data).unwrap();
        let p = precision(&trained.model.predictor().predict(&test_x, 5), &test_y);
        (trained, p)
    };
    let (zero, p_zero) = run(InitKind::Zero);
    let (msi, p_msi) = run(InitKind::Msi);
    for at in 0..3 {
        assert!((p_msi[at] - DISMEC_TABLE_2[at]).abs() <= 1.0, "MSI P@k {p_msi:?} vs Table 2 {DISMEC_TABLE_2:?}");
        assert!((p_msi[at] - p_zero[at]).abs() <= 0.2, "MSI P@k {p_msi:?} vs zero {p_zero:?}");
    }
    let cg = |t: &Trained| t.report.labels.iter().map(|s| s.cg_steps as u64).sum::<u64>();
    let newton = |t: &Trained| t.report.labels.iter().map(|s| s.newton_iters as f64).sum::<f64>() / 159.0;
    assert!(cg(&msi) * 4 < cg(&zero) * 3, "CG steps: msi {} vs zero {}", cg(&msi), cg(&zero));
    // [M] Figs. 6-8: with MSI the mean number of Newton iterations stays below 8.
    assert!(newton(&msi) < 8.0, "mean Newton iterations with MSI: {}", newton(&msi));
}
