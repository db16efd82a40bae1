//! The contract every [`MipsIndex`] keeps, checked the same way for every index.
//!
//! Each check is one generic function of the index's [`IndexConfig`] (the index is built as
//! training builds it); [`conformance!`] instantiates all of them for every index, in a module
//! named after the index (`conformance::hnsw::...`), with the index's recall floors:
//!
//! - [`recall_reaches_the_floor`]: recall@[`TOP`] against brute force on a seeded synthetic
//!   matrix, per query and batched; every result has `min(k, K)` distinct rows with exact
//!   scores.
//! - [`refresh_matches_a_fresh_build`]: after rows change, `sync` keeps the scores exact, and
//!   after `refresh` the index reaches the floor a fresh build on the changed matrix reaches
//!   (brute force: the same hits).
//! - [`degenerate_matrices_give_sensible_results`]: no rows, one row, duplicate rows, zero rows
//!   and a zero query: no panic, `min(k, K)` hits, duplicates both returned.
//! - [`k_beyond_the_row_count_returns_every_row`]: `k > K` returns all K rows with exact
//!   scores, over the whole matrix and over a column block.
//!
//! The floors come from measurement with each index's configuration in the list (`cargo test
//! --release -p farout-search -- --ignored --nocapture measure_recall` prints the recalls); each
//! is stated with its measurement where the indexes are listed, a few points below it: HNSW
//! inserts in parallel, so its graph (and recall, by about 0.003) varies from run to run, and
//! the matrix products behind k-means may round differently on other CPUs.

use crate::{
    ExactIndex, FlatInt8Config, HammingConfig, HnswConfig, IndexConfig, MipsIndex, Rows, Scoring, SimpleLshConfig,
    SphericalConfig, recall,
};
use farout_core::rng::{self, RngExt};
use farout_core::topk::{self, Hit};
use farout_core::{ClassId, Matrix, kernels};

/// Rows of the recall checks' matrix: small enough that the HNSW builds (two per refresh check)
/// take a few seconds, large enough that approximate indexes have to search.
const N_ROWS: usize = 5_000;
/// Columns of the recall checks' matrix.
const DIM: usize = 32;
/// Results per query in the recall checks: K / 100, the share the MIPS estimator's configs ask
/// for (`top = 1000` of K = 100,000).
const TOP: usize = 50;
/// Rows the refresh check changes (10%).
const N_CHANGED: usize = 500;
/// Tolerance of batched scores: matrix products and dot kernels sum in other orders (scores
/// here are at most about 1).
const BATCH_ROUNDING: f32 = 1e-5;

/// `n` class means of the FaceNet-like generator (`n / 50` clusters of unit means, seed `seed`)
/// each scaled to a seeded norm in `[0.5, 1]`, so that inner products, not cosines, rank the
/// rows and the norm augmentation matters; and the generator's 200 noisy samples (unit norm) as
/// queries.
fn seeded_matrix(n: usize, d: usize, seed: u64) -> (Matrix, Matrix) {
    use farout_data::synth::{FaceGenerator, FaceSpec, Split};
    let g = FaceGenerator::new(FaceSpec { seed, ..FaceSpec::clustered(n, d) }).expect("valid spec");
    let mut w = g.means().clone();
    let mut r = rng::seeded(seed, 0xC0F);
    for i in 0..n {
        kernels::scale(0.5 + 0.5 * r.random::<f32>(), w.row_mut(i));
    }
    (w, g.features(Split::Train, 0..200))
}

/// Searches `query` and checks the hits: `min(k, K)` distinct rows, scores equal to the dot
/// product with `w`'s row (bit for bit: every index scores what it returns with
/// [`kernels::dot`]). Returns the hits, best first.
fn checked_search(index: &dyn MipsIndex, w: Rows, query: &[f32], k: usize) -> Vec<Hit> {
    let mut out = Vec::new();
    index.search(w, query, k, &mut out);
    check_hits(index.name(), w, query, k, &mut out, 0.0);
    out
}

/// Checks `hits` of `query` as [`checked_search`] does, with scores within `tolerance` of the
/// dot product; sorts them best first.
fn check_hits(name: &str, w: Rows, query: &[f32], k: usize, hits: &mut [Hit], tolerance: f32) {
    assert_eq!(hits.len(), k.min(w.len()), "{name}: min(k = {k}, K = {}) hits", w.len());
    hits.sort_unstable_by(topk::by_score);
    let mut classes: Vec<ClassId> = hits.iter().map(|h| h.class).collect();
    classes.sort_unstable();
    classes.dedup();
    assert_eq!(classes.len(), hits.len(), "{name}: distinct rows");
    for h in hits.iter() {
        let exact = kernels::dot(w.row(h.class as usize), query);
        assert!((h.score - exact).abs() <= tolerance, "{name}: row {} scored {} for {exact}", h.class, h.score);
    }
}

/// Checks every query's hits, per query and batched, and returns the recall of both.
fn checked_recall(index: &dyn MipsIndex, w: Rows, queries: &Matrix) -> (f64, f64) {
    for i in 0..queries.rows() {
        checked_search(index, w, queries.row(i), TOP);
    }
    let mut batch = Vec::new();
    index.search_batch(w, queries, TOP, &mut batch);
    assert_eq!(batch.len(), queries.rows());
    let (exact, mut truth) = (ExactIndex::new(), Vec::new());
    let mut found = 0;
    for (i, hits) in batch.iter_mut().enumerate() {
        check_hits(index.name(), w, queries.row(i), TOP, hits, BATCH_ROUNDING);
        exact.search(w, queries.row(i), TOP, &mut truth);
        found += hits.iter().filter(|h| truth.iter().any(|t| t.class == h.class)).count();
    }
    let batched = found as f64 / (TOP * queries.rows()) as f64;
    (recall(index, w, queries, TOP), batched)
}

/// (a) Recall@[`TOP`] against brute force on [`seeded_matrix`] reaches `floor`, per query and
/// batched, and every result is well formed ([`check_hits`]).
fn recall_reaches_the_floor(config: &IndexConfig, floor: f64) {
    let (w, q) = seeded_matrix(N_ROWS, DIM, 1);
    let index = config.build(Rows::all(&w));
    let (per_query, batched) = checked_recall(index.as_ref(), Rows::all(&w), &q);
    assert!(per_query >= floor, "{}: recall {per_query} < {floor}", index.name());
    assert!(batched >= floor, "{}: batched recall {batched} < {floor}", index.name());
    assert!(!index.needs_rebuild(), "{}: a build asks for no rebuild", index.name());
}

/// Rows per cluster the refresh check moves rows into, as in the generator.
const CLUSTER_SIZE: usize = 50;

/// [`N_CHANGED`] rows of `w` (a seeded choice) moved into `N_CHANGED / 50` new clusters of 50
/// (around new random directions, spread 0.7 as in the generator) at norms in `[0.5, 1]`,
/// within the old bound. Returns the new matrix, the changed rows, and 200 queries: 100 of
/// `queries` and 100 noisy copies of changed rows, whose top [`TOP`] are mostly changed rows:
/// an index that does not re-index them misses most of those queries' results.
fn change_rows(w: &Matrix, queries: &Matrix) -> (Matrix, Vec<ClassId>, Matrix) {
    let (k, d) = (w.rows(), w.cols());
    let scale = 1.0 / (d as f32).sqrt();
    let mut r = rng::seeded(3, 0);
    let mut rows: Vec<ClassId> = (0..k as ClassId).collect();
    rng::shuffle(&mut rows, &mut r);
    rows.truncate(N_CHANGED);
    let mut changed = w.clone();
    for cluster in rows.chunks(CLUSTER_SIZE) {
        let mut centre: Vec<f32> = (0..d).map(|_| rng::normal(&mut r)).collect();
        kernels::normalize(&mut centre);
        for &i in cluster {
            let row = changed.row_mut(i as usize);
            for (x, &c) in row.iter_mut().zip(&centre) {
                *x = c + 0.7 * scale * rng::normal(&mut r);
            }
            kernels::normalize(row);
            kernels::scale(0.5 + 0.5 * r.random::<f32>(), row);
        }
    }
    let mut q = Matrix::zeros(200, d);
    for (i, &row) in rows.iter().take(100).enumerate() {
        q.row_mut(i).copy_from_slice(queries.row(i));
        let target = changed.row(row as usize);
        let noisy = q.row_mut(100 + i);
        for (x, &t) in noisy.iter_mut().zip(target) {
            *x = t + 0.5 * scale * rng::normal(&mut r);
        }
        kernels::normalize(noisy);
    }
    (changed, rows, q)
}

/// (b) After rows change ([`change_rows`]): `sync` alone keeps every returned score exact for
/// the new values; after `refresh` the index reaches `floor` on the changed matrix, as a fresh
/// build on it does (for brute force, `floor` 1: the same hits as the fresh build, query by
/// query).
fn refresh_matches_a_fresh_build(config: &IndexConfig, floor: f64) {
    let (w0, q0) = seeded_matrix(N_ROWS, DIM, 1);
    let mut index = config.build(Rows::all(&w0));
    let (w, rows, q) = change_rows(&w0, &q0);
    let all = Rows::all(&w);
    index.sync(all, &rows);
    for i in 0..q.rows() {
        checked_search(index.as_ref(), all, q.row(i), TOP);
    }
    index.refresh(all, &rows);
    assert!(!index.needs_rebuild(), "{}: the changed rows stay within the norm bound", index.name());
    let fresh = config.build(all);
    let (refreshed, refreshed_batch) = checked_recall(index.as_ref(), all, &q);
    let (rebuilt, _) = checked_recall(fresh.as_ref(), all, &q);
    let name = index.name();
    assert!(rebuilt >= floor, "{name}: a fresh build on the changed rows has recall {rebuilt} < {floor}");
    assert!(refreshed >= floor, "{name}: recall {refreshed} after refresh < {floor} (fresh build: {rebuilt})");
    assert!(refreshed_batch >= floor, "{name}: batched recall {refreshed_batch} after refresh < {floor}");
    if floor == 1.0 {
        for i in 0..q.rows() {
            let a = checked_search(index.as_ref(), all, q.row(i), TOP);
            assert_eq!(a, checked_search(fresh.as_ref(), all, q.row(i), TOP), "{name}: query {i}");
        }
    }
}

/// Builds the index over `w` and checks per-query and batched results for `queries` at several
/// `k` ([`check_hits`]); returns the per-query hits at each `k`, best first.
fn searched(config: &IndexConfig, w: &Matrix, queries: &Matrix, ks: &[usize]) -> Vec<Vec<Vec<Hit>>> {
    let mut index = config.build(Rows::all(w));
    let all = Rows::all(w);
    let name = index.name();
    let results = ks
        .iter()
        .map(|&k| {
            let mut batch = Vec::new();
            index.search_batch(all, queries, k, &mut batch);
            assert_eq!(batch.len(), queries.rows(), "{name}: one result per query");
            (0..queries.rows())
                .map(|i| {
                    check_hits(name, all, queries.row(i), k, &mut batch[i], BATCH_ROUNDING);
                    checked_search(index.as_ref(), all, queries.row(i), k)
                })
                .collect()
        })
        .collect();
    // Maintenance of no rows changes nothing; of every row (unchanged) keeps the index usable
    // (it may ask for a rebuild: HNSW does once half its points are stale versions).
    index.sync(all, &[]);
    index.refresh(all, &[]);
    assert!(!index.needs_rebuild(), "{name}: nothing outgrew the bound");
    let every: Vec<ClassId> = (0..w.rows() as ClassId).collect();
    index.sync(all, &every);
    index.refresh(all, &every);
    for i in 0..queries.rows() {
        checked_search(index.as_ref(), all, queries.row(i), ks[0]);
    }
    let _ = index.memory_bytes();
    results
}

/// (c) No rows, one row, duplicate rows, all rows equal, all rows zero, a zero query: no
/// panic, `min(k, K)` distinct hits with exact scores, and duplicates of the best row both
/// returned.
fn degenerate_matrices_give_sensible_results(config: &IndexConfig) {
    let d = 16;
    let (base, q) = seeded_matrix(1_000, d, 4);
    let queries = Matrix::from_vec(3, d, q.as_slice()[..3 * d].to_vec()).unwrap();
    // No rows: no hits.
    let empty = searched(config, &Matrix::zeros(0, d), &queries, &[1, 5]);
    assert!(empty.iter().flatten().all(Vec::is_empty));
    // One row: found by every query.
    let one = Matrix::from_vec(1, d, base.row(0).to_vec()).unwrap();
    for hits in searched(config, &one, &queries, &[1, 5]).iter().flatten() {
        assert_eq!(hits.iter().map(|h| h.class).collect::<Vec<_>>(), [0]);
    }
    // Two copies of the row that best matches query 0 (its direction at the largest norm, so
    // no other row can reach its score): the top 2 are both copies.
    let mut dup = base.clone();
    let top = 1.0f32.max(dup.iter_rows().map(kernels::norm).fold(0.0, f32::max));
    let best: Vec<f32> = queries.row(0).iter().map(|x| x * top).collect();
    dup.row_mut(10).copy_from_slice(&best);
    dup.row_mut(11).copy_from_slice(&best);
    let found = searched(config, &dup, &queries, &[2, 10]);
    for hits in [&found[0][0], &found[1][0]] {
        assert_eq!(hits[..2].iter().map(|h| h.class).collect::<Vec<_>>(), [10, 11], "both duplicates first");
        assert_eq!(hits[0].score, hits[1].score);
    }
    // Fifty equal rows, and twenty zero rows: any k of them, all equal in score.
    let equal = Matrix::from_vec(50, d, base.row(0).repeat(50)).unwrap();
    let zero = Matrix::zeros(20, d);
    for (w, n) in [(&equal, 50), (&zero, 20)] {
        for (k, hits) in [10, 100].into_iter().zip(searched(config, w, &queries, &[10, 100])) {
            for h in &hits {
                assert_eq!(h.len(), k.min(n));
                assert!(h.iter().all(|x| x.score == h[0].score));
            }
        }
    }
    // A zero query: k hits, all scoring 0.
    let zero_query = Matrix::zeros(1, d);
    for hits in searched(config, &base, &zero_query, &[10]).iter().flatten() {
        assert!(hits.iter().all(|h| h.score == 0.0));
    }
}

/// (d) `k > K` returns all K rows, and sorted by score (indexes return hits in no particular
/// order) they are the brute-force ranking, scores exact; over all columns and over a column
/// block (the LDGS block view).
fn k_beyond_the_row_count_returns_every_row(config: &IndexConfig) {
    let (w, q) = seeded_matrix(300, DIM, 5);
    for (view, cols) in [(Rows::all(&w), 0..DIM), (Rows::block(&w, 8, 24), 8..24)] {
        let index = config.build(view);
        let (mut exact, mut batch) = (Vec::new(), Vec::new());
        let queries = {
            let mut m = Matrix::zeros(20, cols.len());
            for i in 0..20 {
                m.row_mut(i).copy_from_slice(&q.row(i)[cols.clone()]);
            }
            m
        };
        index.search_batch(view, &queries, 500, &mut batch);
        for (i, batched) in batch.iter_mut().enumerate() {
            let hits = checked_search(index.as_ref(), view, queries.row(i), 500);
            ExactIndex::new().search(view, queries.row(i), 500, &mut exact);
            assert_eq!(hits, exact, "{}: query {i}", index.name());
            check_hits(index.name(), view, queries.row(i), 500, batched, BATCH_ROUNDING);
        }
    }
}

/// Instantiates every check for every index: `name => config, recall_floor: a, refresh_floor:
/// b;` makes module `name` with one test per check; `a` is the floor of
/// [`recall_reaches_the_floor`], `b` that of [`refresh_matches_a_fresh_build`] (on other
/// queries: half of them look for the changed rows).
macro_rules! conformance {
    ($($(#[$doc:meta])* $name:ident => $config:expr, recall_floor: $floor:expr, refresh_floor: $refresh:expr;)+) => {$(
        $(#[$doc])*
        mod $name {
            use super::*;

            fn config() -> IndexConfig {
                $config
            }

            #[test]
            fn recall_against_brute_force_reaches_the_floor() {
                recall_reaches_the_floor(&config(), $floor);
            }

            #[test]
            fn refresh_after_changed_rows_matches_a_fresh_build() {
                refresh_matches_a_fresh_build(&config(), $refresh);
            }

            #[test]
            fn degenerate_matrices_give_sensible_results() {
                super::degenerate_matrices_give_sensible_results(&config());
            }

            #[test]
            fn k_beyond_the_row_count_returns_every_row() {
                super::k_beyond_the_row_count_returns_every_row(&config());
            }
        }
    )+};
}

// Measured recall@50 (the configurations below; 5,000 rows, 32 dimensions, 200 queries; the
// refresh columns on the changed matrix and its queries, see `change_rows`):
//
// | index                    | recall      | after refresh | fresh build | sync only, no re-indexing |
// | exact                    | 1           | 1             | 1           | 1                         |
// | spherical f32, factor 5  | 0.878       | 0.764         | 0.876       | 0.557                     |
// | spherical int8, factor 5 | 0.879       | 0.766         | 0.876       | 0.558                     |
// | spherical, calibrated    | 0.933       | 0.885         | 0.925       | 0.620                     |
// | hnsw                     | 0.968-0.969 | 0.985-0.986   | 0.963-0.965 | 0.621-0.622               |
// | simple_lsh               | 0.361       | 0.351         | 0.351       | 0.249                     |
// | hamming                  | 0.959       | 0.944         | 0.944       | 0.686                     |
// | flat_int8                | 1           | 1             | 1           | 1                         |
// | auto                     | 0.914       | 0.905         | 0.913       | 0.597                     |
//
// Batched search measured the same to 0.001. The refresh floors sit between a refresh and a
// sync that re-indexes nothing, so a refresh that stops re-indexing fails them. The spherical
// index keeps its centroids on refresh (it re-indexes rows, the LDGS paper's `k_r C D`): rows
// moved into a region no centroid covers join whichever clusters are nearest and are found
// less often than after a rebuild, whose k-means sees them (0.764 against 0.876); it does not
// ask for a rebuild then. Calibrated, it answers the first 50 queries by brute force, then
// probes 626 rows per query (sample recall 0.912); the refresh moves 10 % of the rows, so the
// calibration is renewed on the next 50 queries. SimpleLSH's floors are low because its default
// budget is (5 candidates per result; its own test measures 0.99 at 100). The Hamming index
// rescores 20 candidates per result, a fifth of the rows here. The int8 brute force rescores 82
// rows for 50 results, and its sync re-quantises rows: its index is the codes. The automatic
// index keeps its spherical index on these rows: it answers by brute force until its sample of
// 256 queries is in, then probes 711 rows per query (sample recall 0.910); `auto.rs` tests the
// choice itself.
conformance! {
    /// Brute force: the reference itself.
    exact => IndexConfig::exact(), recall_floor: 1.0, refresh_floor: 1.0;
    /// Spherical clustering probing a fixed 5 rows per result (f32 scoring).
    spherical_f32 => IndexConfig::Spherical(fixed_budget(Scoring::F32)), recall_floor: 0.85, refresh_floor: 0.72;
    /// Spherical clustering with int8 scoring, probing a fixed 5 rows per result.
    spherical_int8 => IndexConfig::Spherical(fixed_budget(Scoring::Int8)), recall_floor: 0.85, refresh_floor: 0.72;
    /// Spherical clustering calibrated to recall 0.9 (the default) on the first 50 queries.
    spherical_calibrated => IndexConfig::Spherical(calibrated()), recall_floor: 0.85, refresh_floor: 0.85;
    /// HNSW, default configuration.
    hnsw => IndexConfig::Hnsw(HnswConfig::default()), recall_floor: 0.93, refresh_floor: 0.93;
    /// SimpleLSH, default configuration.
    simple_lsh => IndexConfig::SimpleLsh(SimpleLshConfig::default()), recall_floor: 0.32, refresh_floor: 0.31;
    /// Hamming-ranked SimpleLSH codes, default configuration.
    hamming => IndexConfig::Hamming(HammingConfig::default()), recall_floor: 0.93, refresh_floor: 0.92;
    /// Brute force on int8 codes, default configuration.
    flat_int8 => IndexConfig::FlatInt8(FlatInt8Config::default()), recall_floor: 0.99, refresh_floor: 0.99;
    /// The automatic choice, default configuration (the default index).
    auto => IndexConfig::default(), recall_floor: 0.85, refresh_floor: 0.85;
}

/// The spherical index probing a fixed 5 rows per result: the checks see the index itself, not
/// brute force answering while a calibration sample is collected.
fn fixed_budget(scoring: Scoring) -> SphericalConfig {
    SphericalConfig { scoring, candidate_factor: Some(5.0), ..SphericalConfig::default() }
}

/// The spherical index's default configuration, calibrated on the first 50 queries (the recall
/// checks search 200).
fn calibrated() -> SphericalConfig {
    SphericalConfig { calibration_queries: 50, ..SphericalConfig::default() }
}

/// Prints every index's recall in the recall and refresh checks (where the floors come from).
#[test]
#[ignore = "measurement: prints recall per index"]
fn measure_recall() {
    let configs = [
        IndexConfig::exact(),
        IndexConfig::Spherical(fixed_budget(Scoring::F32)),
        IndexConfig::Spherical(fixed_budget(Scoring::Int8)),
        IndexConfig::Spherical(calibrated()),
        IndexConfig::Hnsw(HnswConfig::default()),
        IndexConfig::SimpleLsh(SimpleLshConfig::default()),
        IndexConfig::Hamming(HammingConfig::default()),
        IndexConfig::FlatInt8(FlatInt8Config::default()),
        IndexConfig::default(),
    ];
    let (w0, q0) = seeded_matrix(N_ROWS, DIM, 1);
    let (w, rows, q) = change_rows(&w0, &q0);
    for config in &configs {
        let t = std::time::Instant::now();
        let mut index = config.build(Rows::all(&w0));
        let built = t.elapsed();
        let (a, a_batch) = checked_recall(index.as_ref(), Rows::all(&w0), &q0);
        index.sync(Rows::all(&w), &rows);
        let synced = recall(index.as_ref(), Rows::all(&w), &q, TOP);
        index.refresh(Rows::all(&w), &rows);
        let (refreshed, refreshed_batch) = checked_recall(index.as_ref(), Rows::all(&w), &q);
        let fresh = config.build(Rows::all(&w));
        let (rebuilt, _) = checked_recall(fresh.as_ref(), Rows::all(&w), &q);
        let scoring = match config {
            IndexConfig::Spherical(c) => format!("{:?}", c.scoring),
            _ => String::new(),
        };
        let calibrations = index.calibrations();
        println!(
            "{:<10} {scoring:<4} recall@{TOP} {a:.3} (batched {a_batch:.3}); after refresh {refreshed:.3} (batched \
             {refreshed_batch:.3}), fresh build {rebuilt:.3}, sync only {synced:.3}; build {built:.2?}; calibrations {calibrations:?}",
            index.name(),
        );
    }
}
