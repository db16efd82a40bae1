//! `farout vectors --nearest` and `farout index`: nearest words, and an index saved for later.

use super::{farout, stderr};

/// `farout vectors --nearest`: the nearest words by cosine, best first, the word itself left
/// out; a word without a vector and a `--topn` of 0 are errors.
#[test]
fn vectors_nearest_prints_the_nearest_words_by_cosine() {
    let dir = tempfile::tempdir().unwrap();
    let txt = dir.path().join("v.txt");
    // Cosines with `a`: b 0.995, c 0.707 (norm does not count), d 0, e -1.
    std::fs::write(&txt, "5 2\na 1 0\nb 3 0.3\nc 5 5\nd 0 2\ne -1 0\n").unwrap();
    let o = farout(&["vectors", "--vectors", txt.to_str().unwrap(), "--nearest", "a", "--nearest", "e", "--topn", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    let rows: Vec<(&str, &str, f32)> = out
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[0], f[1], f[2].parse().unwrap())
        })
        .collect();
    let names: Vec<(&str, &str)> = rows.iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(names, [("a", "b"), ("a", "c"), ("a", "d"), ("e", "d"), ("e", "c"), ("e", "b")]);
    assert!((rows[0].2 - 3.0 / 9.09f32.sqrt()).abs() < 1e-6 && (rows[1].2 - 0.5f32.sqrt()).abs() < 1e-6);
    let o = farout(&["vectors", "--vectors", txt.to_str().unwrap(), "--nearest", "zz"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--nearest zz") && stderr(&o).contains("\"zz\" is not in the vocabulary"),
        "{}",
        stderr(&o)
    );
    let o = farout(&["vectors", "--vectors", txt.to_str().unwrap(), "--nearest", "a", "--topn", "0"]);
    assert!(!o.status.success() && stderr(&o).contains("--topn"), "{}", stderr(&o));
}

/// `farout index`: the saved index loads without being built again, over the same rows; the
/// output may not replace the vectors.
#[test]
fn index_saves_an_index_that_loads_over_its_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let (npy, out) = (dir.path().join("w.npy"), dir.path().join("w.index"));
    let mut w = farout_core::Matrix::zeros(3_000, 16);
    w.as_mut_slice().iter_mut().enumerate().for_each(|(i, x)| *x = ((i * 7919) % 1000) as f32 / 500.0 - 1.0);
    farout_data::npy::write_f32_matrix(&npy, &w).unwrap();
    let o = farout(&["index", "--vectors", npy.to_str().unwrap(), "--out", out.to_str().unwrap(), "--with-vectors"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((report["kind"].as_str(), report["rows"].as_u64()), (Some("auto"), Some(3_000)));
    let loaded = farout_search::persist::load(&out, Some(&w)).unwrap();
    let fresh = farout_search::BlockIndex::build(&w, &farout_search::IndexConfig::default(), 1);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    loaded.index.search_block(&w, 0, w.row(5), 10, &mut a);
    fresh.search_block(&w, 0, w.row(5), 10, &mut b);
    assert_eq!(a, b);
    assert_eq!(farout_search::persist::load(&out, None).unwrap().rows.unwrap().as_slice(), w.as_slice());
    let o = farout(&["index", "--vectors", npy.to_str().unwrap(), "--out", npy.to_str().unwrap()]);
    assert!(!o.status.success() && stderr(&o).contains("would destroy it"), "{}", stderr(&o));
}
