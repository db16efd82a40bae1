//! 4-bit product-quantisation scoring in [`SphericalIndex`] (`scoring = "pq4"`, what `auto`
//! means where the CPU has AVX2): every cluster also keeps 4-bit codes of its rows' residuals
//! from the cluster's mean ([`crate::pq4`]), on which a query searched alone is scanned, 64
//! bytes a row at D = 128 against 128 of int8 codes; the best `pq4_rescore * k` (at least
//! [`quant::RESCORE_MARGIN`](crate::quant) more than `k`) are then rescored exactly from the
//! copies. A lone query shares its loads with no other query, so the bytes it scans set its
//! speed; a batch shares each cluster's int8 codes between the queries probing it and keeps
//! the int8 scan (see docs/decisions.md, "pq4-single-query"). The more rows rescored cost
//! gathers from memory, and where the two balance depends on the CPU: a calibrated index
//! times its sample searched both ways and keeps the faster
//! ([`SphericalIndex::lone_pq4_depth`]).
//!
//! **Made on first use.** Training searches in batches and syncs the rows every step changed;
//! 4-bit codes would cost every sync a third of its speed and serve no query. So no code is
//! made until the first lone query that would scan them ([`SphericalIndex::pq4_pays`]): it
//! fits the codebook and codes every cluster (0.15-0.3 s per 200,000 rows of 128 values on
//! 2 cores); from then on every sync and refresh keeps them equal to the copies. Lone
//! queries arriving on other threads while the codes are being made scan int8 codes meanwhile
//! rather than wait: waiting inside rayon's pool could deadlock (the thread making the codes
//! may itself run another query's task while it waits for its own).
//!
//! The codebook is fitted once, on a sample of all the clusters' residuals, and each cluster's
//! mean is fixed when its codes are made: a synced or moved row is coded against the codebook
//! and mean it finds. A saved index keeps the codebook and the means when they exist, and
//! loading codes the copies with them again.
//!
//! [`SphericalIndex`]: super::SphericalIndex

use super::SphericalIndex;
use super::cluster::{Cluster, Pq4Codes};
use crate::persist::{Dec, Enc, Problem, expect_len, inconsistent};
use crate::pq4::{self, Codebook};
use crate::{Hit, Rows};
use farout_core::Matrix;
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Whether the clusters have 4-bit codes yet: the codebook they share once they have, and
/// whether some thread is making them.
#[derive(Debug, Default)]
pub(super) struct Pq4State {
    book: OnceLock<Arc<Codebook>>,
    making: AtomicBool,
}

impl Clone for Pq4State {
    /// The codebook, if made (the clusters' codes are cloned with the clusters).
    fn clone(&self) -> Self {
        Self { book: self.book.clone(), making: AtomicBool::new(false) }
    }
}

/// Gives every cluster 4-bit codes of its rows (`d` wide): the clusters' means, a codebook
/// fitted on the residuals of an even sample of the rows (at most [`pq4::TRAIN_ROWS`]), the
/// codes. Returns the codebook. Each cluster's codes are set once: a cluster that has some
/// keeps them.
fn attach(clusters: &[Cluster], d: usize, seed: u64) -> Arc<Codebook> {
    let means: Vec<Vec<f32>> = clusters.par_iter().map(|c| mean_of(&c.rows, d)).collect();
    let n: usize = clusters.iter().map(Cluster::len).sum();
    let step = n.div_ceil(pq4::TRAIN_ROWS).max(1);
    let mut residuals = Vec::with_capacity(n.div_ceil(step) * d);
    let mut at = 0usize;
    for (cluster, mean) in clusters.iter().zip(&means) {
        // Rows `at..at + len` of the clusters in order; the sample takes every `step`-th.
        let first = at.next_multiple_of(step) - at;
        for row in cluster.rows.chunks_exact(d.max(1)).skip(first).step_by(step) {
            residuals.extend(row.iter().zip(mean).map(|(x, m)| x - m));
        }
        at += cluster.len();
    }
    let book = Arc::new(Codebook::fit(&residuals, d, seed));
    clusters.par_iter().zip(means).for_each(|(cluster, mean)| {
        let _ = cluster.pq4.set(Pq4Codes::new(&cluster.rows, mean, Arc::clone(&book)));
    });
    book
}

/// Writes the codebook and every cluster's mean (what [`restore`] codes the copies with), or
/// an empty codebook while no code has been made.
pub(super) fn save(state: &Pq4State, clusters: &[Cluster], out: &mut Enc) {
    let Some(book) = state.book.get() else {
        out.f32s(&[]);
        return;
    };
    out.f32s(book.levels());
    for c in clusters {
        out.f32s(&c.pq4.get().expect("every cluster has codes once the codebook exists").mean);
    }
}

/// Reads what [`save`] wrote and, if it wrote a codebook, codes every cluster's copies (`d`
/// wide) with it.
pub(super) fn restore(dec: &mut Dec, clusters: &[Cluster], d: usize) -> Result<Pq4State, Problem> {
    let levels = dec.f32s()?;
    let state = Pq4State::default();
    if levels.is_empty() {
        return Ok(state);
    }
    let book = Codebook::from_levels(d, levels).ok_or_else(|| inconsistent("the 4-bit codebook"))?;
    let book = Arc::new(book);
    for (j, cluster) in clusters.iter().enumerate() {
        let mean = dec.f32s()?;
        expect_len(&mean, d, "values in a cluster's mean")?;
        if mean.iter().any(|x| !x.is_finite()) {
            return Err(inconsistent(format!("a non-finite value in the mean of cluster {j}")));
        }
        let _ = cluster.pq4.set(Pq4Codes::new(&cluster.rows, mean, Arc::clone(&book)));
    }
    let _ = state.book.set(book);
    Ok(state)
}

/// The mean of `rows` (row-major, `d` wide; zeros for none).
fn mean_of(rows: &[f32], d: usize) -> Vec<f32> {
    let mut mean = vec![0.0f32; d];
    let n = rows.len() / d.max(1);
    for row in rows.chunks_exact(d.max(1)) {
        mean.iter_mut().zip(row).for_each(|(m, x)| *m += x);
    }
    mean.iter_mut().for_each(|m| *m /= n.max(1) as f32);
    mean
}

/// A lone query scans 4-bit codes only where it probes at least this many rows per row it then
/// rescores beyond what int8 scoring rescores: the 4-bit scan saves a little on every probed
/// row (4-6 ns at D = 128), each extra row rescored is a gather of its copy from memory (about
/// 80-90 ns), so they break even near 15-20 rows probed per extra row. Where the break-even
/// lies depends on the CPU: at top 2,000 of K = 1,000,000 (26 rows per extra row) the 4-bit
/// scan ran 1.13x int8 scoring's speed on an AMD EPYC and 0.77x on an Intel Xeon with AMX. So a
/// calibrated index only takes this as the point below which the 4-bit codes are not worth
/// making, and times the two ways on its sample ([`SphericalIndex::pq4_runs_faster`]); an
/// index without a calibration sample and without a choice saved decides by it alone
/// (docs/decisions.md, "pq4-single-query", "pq4-timed-choice").
const PROBED_PER_EXTRA_RESCORED: usize = 20;

/// The share of its calibration's margin (the recall it measured on its sample, with int8 codes,
/// above the target) that a lone query's scan of 4-bit codes may lose. Recall measured on the
/// queries the budget was fitted to overstates what other queries get: at K = 1,000,000, top
/// 100, the sample measured 0.9045 and 1,000 other queries 0.9002, so most of the margin is
/// not there to spend (docs/decisions.md, "pq4-lone-depth").
const LONE_MARGIN_SHARE: f64 = 0.1;

/// Timed passes over the calibration's sample each way, alternated, in
/// [`SphericalIndex::pq4_runs_faster`]: the quickest pass of each way counts.
const TIMED_ROUNDS: usize = 3;

/// The rows rescored after a lone query's 4-bit scan that [`SphericalIndex::fit_lone_depth`]
/// tries, as multiples of the configured depth, in order.
const DEPTH_STEPS: [f32; 7] = [1.0, 1.2, 1.4, 1.7, 2.0, 2.5, 3.0];

impl SphericalIndex {
    /// Rows rescored exactly per query for `k` results on 4-bit codes, as configured.
    pub(super) fn pq4_depth(&self, k: usize) -> usize {
        crate::quant::rescore_depth(k, self.config.pq4_rescore)
    }

    /// Whether a lone query for `k` results probing `budget` rows gains by scanning 4-bit codes
    /// and rescoring `depth` rows (see [`PROBED_PER_EXTRA_RESCORED`]).
    pub(super) fn pq4_pays(&self, k: usize, budget: usize, depth: usize) -> bool {
        let extra = depth.saturating_sub(self.depth(k));
        budget >= PROBED_PER_EXTRA_RESCORED * extra
    }

    /// Rows a lone query for `k` results rescores after scanning 4-bit codes, where the caller
    /// found that the configured depth pays ([`SphericalIndex::pq4_pays`]); `None`: it scans
    /// int8 codes. Fitted once per calibration, by the first lone query
    /// to ask, on the calibration's sample: the fewest rows that keep its recall
    /// ([`SphericalIndex::fit_lone_depth`]), if the sample searched one query at a time that way
    /// runs faster than on int8 codes ([`SphericalIndex::pq4_runs_faster`]); a saved index keeps
    /// the choice. Meanwhile, and without a calibration sample (a fixed `candidate_factor`, or a
    /// calibration read from a saved index before the choice was made), the configured depth.
    pub(super) fn lone_pq4_depth(&self, w: Rows, k: usize, book: &Codebook) -> Option<usize> {
        let configured = Some(self.pq4_depth(k));
        let Some((fit, lone)) = self.calibrations.lone_fit(k) else { return configured };
        if let Some(&depth) = lone.depth.get() {
            return depth;
        }
        let (Some((sample, exact)), Some(budget)) = (&lone.sample, fit.budget) else { return configured };
        if lone.fitting.swap(true, Ordering::Acquire) {
            return configured;
        }
        let depth = self
            .fit_lone_depth(w, (sample, exact), k, budget, (book, fit.recall))
            .filter(|&depth| self.pq4_runs_faster(w, sample, k, budget, (book, depth)));
        // Only the thread that set `fitting` gets here, so this sets it.
        let _ = lone.depth.set(depth);
        depth
    }

    /// The fewest rows of [`DEPTH_STEPS`] whose rescoring after a lone query's 4-bit scan (on
    /// `book`, probing `budget` rows for `k` results) keeps the `recall` the calibration
    /// measured on its `sample`, less [`LONE_MARGIN_SHARE`] of its margin over the target; `None`
    /// if none does. The 4-bit codes are coarser than the int8 codes the calibration searched
    /// with, and how many more rows make up for it depends on the rows and `k` (the configured
    /// depth lost 0.0018 of the sample's recall at K = 1,000,000, top 100, and 0.0002 at top
    /// 500).
    fn fit_lone_depth(
        &self,
        w: Rows,
        sample: (&Matrix, &[Vec<Hit>]),
        k: usize,
        budget: usize,
        (book, recall): (&Codebook, f64),
    ) -> Option<usize> {
        let allowed = LONE_MARGIN_SHARE * (recall - self.config.recall as f64).max(0.0);
        self.lone_depth_steps(k)
            .find(|&depth| self.lone_recall(w, sample, k, budget, (book, depth)) >= recall - allowed)
    }

    /// Whether the calibration's `sample`, searched for `k` results one query at a time probing
    /// `budget` rows, runs faster on the 4-bit codes of `book` rescoring `depth` rows than on
    /// int8 codes: [`TIMED_ROUNDS`] passes each way, alternated, the quickest of each compared.
    /// The passes search as the recall fit's do ([`SphericalIndex::search_alone`]).
    fn pq4_runs_faster(&self, w: Rows, sample: &Matrix, k: usize, budget: usize, pq4: (&Codebook, usize)) -> bool {
        let pass = |pq4: Option<(&Codebook, usize)>| {
            let start = Instant::now();
            self.search_alone(w, sample, k, budget, pq4);
            start.elapsed()
        };
        quicker(|| pass(Some(pq4)), || pass(None), TIMED_ROUNDS)
    }

    /// The depths [`SphericalIndex::fit_lone_depth`] tries for `k` results, in order.
    fn lone_depth_steps(&self, k: usize) -> impl Iterator<Item = usize> {
        let configured = self.pq4_depth(k) as f32;
        DEPTH_STEPS.iter().map(move |&m| (m * configured).ceil() as usize)
    }

    /// The recall of `sample` (its queries and their exact top `k`) searched for `k` results
    /// one query at a time on the 4-bit codes of `book`, probing `budget` rows and rescoring
    /// `depth`.
    fn lone_recall(
        &self,
        w: Rows,
        (sample, exact): (&Matrix, &[Vec<Hit>]),
        k: usize,
        budget: usize,
        (book, depth): (&Codebook, usize),
    ) -> f64 {
        crate::overlap(&self.search_alone(w, sample, k, budget, Some((book, depth))), exact)
    }

    /// The top `k` of every query of `sample`, each searched alone probing `budget` rows, on
    /// 4-bit codes where `pq4` gives their codebook and depth, else on int8 codes; the queries
    /// run on the thread pool.
    fn search_alone(
        &self,
        w: Rows,
        sample: &Matrix,
        k: usize,
        budget: usize,
        pq4: Option<(&Codebook, usize)>,
    ) -> Vec<Vec<Hit>> {
        (0..sample.rows())
            .into_par_iter()
            .map(|q| {
                let mut out = Vec::with_capacity(k);
                self.scan_one(w, sample.row(q), k, budget, pq4, &mut out);
                out
            })
            .collect()
    }

    /// The codebook of every cluster's 4-bit codes, making them first if none are yet (see
    /// the module docs); `None` while another thread makes them, and without `pq4` scoring.
    pub(super) fn pq4_book(&self) -> Option<&Codebook> {
        if self.config.scoring != super::Scoring::Pq4 {
            return None;
        }
        let state = &self.pq4;
        if let Some(book) = state.book.get() {
            return Some(book);
        }
        if state.making.swap(true, Ordering::Acquire) {
            return None;
        }
        let book = state.book.get_or_init(|| attach(&self.clusters, self.centroids_d.cols(), self.config.seed));
        state.making.store(false, Ordering::Release);
        Some(book)
    }

    /// Whether the clusters have 4-bit codes.
    #[cfg(test)]
    pub(super) fn has_pq4_codes(&self) -> bool {
        self.pq4.book.get().is_some()
    }
}

/// Whether `a` takes less time than `b`: each timed `rounds` times, alternated (`b` first), and
/// the quickest run of each compared.
fn quicker(mut a: impl FnMut() -> Duration, mut b: impl FnMut() -> Duration, rounds: usize) -> bool {
    let (mut best_a, mut best_b) = (Duration::MAX, Duration::MAX);
    for _ in 0..rounds {
        best_b = best_b.min(b());
        best_a = best_a.min(a());
    }
    best_a < best_b
}

#[cfg(test)]
mod tests {
    use super::super::{Scoring, SphericalConfig};
    use super::*;
    use crate::testutil::{assert_exact_scores, clustered, move_rows_onto};
    use crate::{MipsIndex, Rows};
    use farout_core::{ClassId, kernels};
    use std::collections::HashSet;

    /// A fixed budget of 10 rows per result, and no more rows rescored after a scan of 4-bit
    /// codes than after one of int8 codes, so that lone queries scan the 4-bit codes.
    fn config(scoring: Scoring) -> SphericalConfig {
        SphericalConfig { scoring, candidate_factor: Some(10.0), pq4_rescore: 1.0, ..SphericalConfig::default() }
    }

    /// Lone queries scan 4-bit codes where the budget is large beside the extra rows rescored,
    /// int8 codes where not.
    #[test]
    fn pq4_scans_where_the_budget_outweighs_the_extra_rescoring() {
        let (w, _) = clustered(5_000, 32);
        let index = SphericalIndex::build(Rows::all(&w), &SphericalConfig { pq4_rescore: 2.5, ..config(Scoring::Pq4) });
        // Top 100: 250 rows rescored against 132, 118 more.
        assert!(index.pq4_pays(100, 118 * PROBED_PER_EXTRA_RESCORED, index.pq4_depth(100)));
        assert!(!index.pq4_pays(100, 118 * PROBED_PER_EXTRA_RESCORED - 1, index.pq4_depth(100)));
        // Top 10: k + 32 rescored either way.
        assert!(index.pq4_pays(10, 1, index.pq4_depth(10)));
    }

    /// Calibrated, a lone query rescores after its 4-bit scan the fewest rows of the steps tried
    /// that keep the calibration's recall on its sample (less a tenth of its margin over the
    /// target), fitted once and kept, or scans int8 codes where those ran the sample faster.
    /// Configured to rescore only `k + 32` rows, the 4-bit scan loses recall here (D = 64,
    /// top 100), and the fitted depth wins it back.
    #[test]
    fn lone_queries_rescore_as_deep_as_keeps_the_calibrated_recall() {
        use farout_data::synth::{FaceGenerator, FaceSpec, Split};
        let g = FaceGenerator::new(FaceSpec::clustered(20_000, 64)).unwrap();
        let (w, sample) = (g.means().clone(), g.features(Split::Train, 0..256));
        let all = Rows::all(&w);
        let config = SphericalConfig { scoring: Scoring::Pq4, pq4_rescore: 1.0, ..SphericalConfig::default() };
        let index = SphericalIndex::build(all, &config);
        let k = 100;
        index.search_batch(all, &sample, k, &mut Vec::new());
        let (fit, lone) = index.calibrations.lone_fit(k).expect("calibrated");
        let budget = fit.budget.expect("probing, not brute force");
        let mut exact = Vec::new();
        crate::ExactIndex::new().search_batch(all, &sample, k, &mut exact);
        let book = index.pq4_book().expect("pq4 codes");
        let recall_at = |depth: usize| index.lone_recall(all, (&sample, &exact), k, budget, (book, depth));
        let floor = fit.recall - LONE_MARGIN_SHARE * (fit.recall - 0.9).max(0.0);
        let configured = index.pq4_depth(k);
        assert!(recall_at(configured) < floor, "the configured depth keeps the recall: nothing to fit");
        let depth = index.fit_lone_depth(all, (&sample, &exact), k, budget, (book, fit.recall)).expect("a depth fits");
        let steps: Vec<usize> = index.lone_depth_steps(k).collect();
        let at = steps.iter().position(|&s| s == depth).expect("one of the steps");
        assert!(recall_at(depth) >= floor, "depth {depth}: {} < {floor}", recall_at(depth));
        assert!(steps[..at].iter().all(|&s| recall_at(s) < floor), "a smaller step than {depth} keeps it");
        // The first lone query fits it and times it against int8 codes; the choice is kept.
        let (mut a, mut b) = (Vec::new(), Vec::new());
        index.search(all, sample.row(3), k, &mut a);
        let chosen = *lone.depth.get().expect("fitted");
        assert!(chosen.is_none() || chosen == Some(depth), "{chosen:?}: neither int8 codes nor depth {depth}");
        // The sample and its exact results kept for the fit count in the index's memory.
        let kept = sample.bytes() + sample.rows() * k * std::mem::size_of::<Hit>();
        assert!(index.calibrations.bytes() >= kept, "{} < {kept}", index.calibrations.bytes());
        // Lone queries use the choice: the same results as a scan that way.
        for q in [3, 7] {
            index.search(all, sample.row(q), k, &mut a);
            index.scan_one(all, sample.row(q), k, budget, chosen.map(|depth| (book, depth)), &mut b);
            assert_eq!(a, b, "query {q}");
        }
    }

    /// The quicker of two timed ways is the one whose quickest run is shorter, each run
    /// alternately as often: a slow first run (a cold cache) does not decide.
    #[test]
    fn the_quicker_way_is_the_one_with_the_quickest_run() {
        let runs = |times: &'static [u64]| {
            let mut at = 0;
            move || {
                at += 1;
                Duration::from_millis(times[at - 1])
            }
        };
        assert!(quicker(runs(&[50, 9, 9]), runs(&[10, 10, 10]), 3));
        assert!(!quicker(runs(&[11, 11, 11]), runs(&[40, 10, 12]), 3));
        assert!(!quicker(runs(&[10, 10, 10]), runs(&[10, 10, 10]), 3), "a tie keeps the second way");
        let (mut a, mut b) = (0, 0);
        quicker(
            || {
                a += 1;
                Duration::ZERO
            },
            || {
                b += 1;
                Duration::ZERO
            },
            3,
        );
        assert_eq!((a, b), (3, 3));
    }

    /// A lone query scanned on 4-bit codes returns exact scores and, probing the same clusters,
    /// at least 98% of what int8 scoring finds in its top 100.
    #[test]
    fn lone_queries_on_pq4_codes_find_what_int8_codes_find() {
        let (w, q) = clustered(20_000, 32);
        let [int8, pq4] = [Scoring::Int8, Scoring::Pq4].map(|s| SphericalIndex::build(Rows::all(&w), &config(s)));
        assert_exact_scores(&pq4, &w, &q);
        assert!(
            pq4.clusters.iter().all(|c| c.pq4.get().is_some()) && int8.clusters.iter().all(|c| c.pq4.get().is_none())
        );
        let (mut a, mut b, mut overlap) = (Vec::new(), Vec::new(), 0);
        for i in 0..q.rows() {
            int8.search(Rows::all(&w), q.row(i), 100, &mut a);
            pq4.search(Rows::all(&w), q.row(i), 100, &mut b);
            let found: HashSet<ClassId> = a.iter().map(|h| h.class).collect();
            overlap += b.iter().filter(|h| found.contains(&h.class)).count();
        }
        let total = 100 * q.rows();
        assert!(overlap as f64 >= 0.98 * total as f64, "{overlap} of {total}");
    }

    /// No 4-bit code exists until a lone query scans them: not after the build, batched
    /// searches, syncs and refreshes, nor after lone queries for which they do not pay. The
    /// first that does makes every cluster's, and from then on lone queries score on them.
    #[test]
    fn codes_are_made_by_the_first_lone_query_that_scans_them() {
        let (mut w, q) = clustered(10_000, 16);
        let config = SphericalConfig { pq4_rescore: 2.5, ..config(Scoring::Pq4) };
        let mut index = SphericalIndex::build(Rows::all(&w), &config);
        let none = |index: &SphericalIndex| index.clusters.iter().all(|c| c.pq4.get().is_none());
        let (mut out, mut batch) = (Vec::new(), Vec::new());
        index.search_batch(Rows::all(&w), &q, 10, &mut batch);
        let moved = move_rows_onto(&mut w, q.row(1));
        index.sync(Rows::all(&w), &moved);
        index.refresh(Rows::all(&w), &moved);
        // Top 500 on a budget of 10 per result: 1,250 rescored against 532, too few probed.
        index.search(Rows::all(&w), q.row(0), 500, &mut out);
        assert!(none(&index) && !index.has_pq4_codes(), "made before a lone query scanned them");
        let bytes = index.memory_bytes();
        index.search(Rows::all(&w), q.row(0), 10, &mut out);
        assert!(index.has_pq4_codes() && index.clusters.iter().all(|c| c.pq4.get().is_some()));
        // 16 dimensions of 4 bits: 8 bytes a row, counted in the index's memory.
        assert!(index.memory_bytes() >= bytes + 8 * w.rows());
        assert_exact_scores(&index, &w, &q);
    }

    /// Lone queries from many threads at once while the codes are being made: every query is
    /// answered, with exact scores, and the codes are made once. Half the queries ask for top
    /// 500, for which 4-bit codes do not pay: their threads finish and take parts of the
    /// making, so that the thread making the codes, waiting for those parts, runs other
    /// queries' tasks meanwhile (which must not wait for the codes it is making).
    #[test]
    fn concurrent_lone_queries_while_the_codes_are_made_all_finish() {
        let (w, q) = clustered(20_000, 32);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(8).build().expect("a pool of 8 threads");
        let top = |i: usize| if i.is_multiple_of(2) { 10 } else { 500 };
        for round in 0..8 {
            let index = SphericalIndex::build(Rows::all(&w), &config(Scoring::Pq4));
            let found: Vec<Vec<crate::Hit>> = pool.install(|| {
                (0..q.rows())
                    .into_par_iter()
                    .map(|i| {
                        let mut out = Vec::new();
                        index.search(Rows::all(&w), q.row(i), top(i), &mut out);
                        out
                    })
                    .collect()
            });
            assert!(index.has_pq4_codes(), "round {round}");
            let book = index.pq4.book.get().expect("a codebook");
            assert!(index.clusters.iter().all(|c| Arc::ptr_eq(&c.pq4.get().expect("codes").book, book)));
            for (i, hits) in found.iter().enumerate() {
                assert_eq!(hits.len(), top(i), "round {round}, query {i}");
                for h in hits {
                    assert!((h.score - kernels::dot(w.row(h.class as usize), q.row(i))).abs() < 1e-4);
                }
            }
        }
    }

    /// A saved index keeps its 4-bit codes when it has them, as they are (the codebook and the
    /// means they were made with, not fitted again to the moved rows), and none when it has
    /// none.
    #[test]
    fn a_saved_index_keeps_its_codes_or_their_absence() {
        let (mut w, q) = clustered(10_000, 16);
        let mut index = SphericalIndex::build(Rows::all(&w), &config(Scoring::Pq4));
        let reload = |index: &SphericalIndex, w: &farout_core::Matrix| {
            let mut enc = Enc::default();
            index.save(&mut enc);
            let bytes = enc.into_bytes();
            SphericalIndex::restore(&mut Dec::new(&bytes), Rows::all(w)).expect("the saved index loads")
        };
        assert!(!reload(&index, &w).has_pq4_codes());
        index.search(Rows::all(&w), q.row(1), 10, &mut Vec::new());
        let moved = move_rows_onto(&mut w, q.row(0));
        index.sync(Rows::all(&w), &moved);
        index.refresh(Rows::all(&w), &moved);
        let loaded = reload(&index, &w);
        assert!(loaded.has_pq4_codes());
        for (j, (a, b)) in index.clusters.iter().zip(&loaded.clusters).enumerate() {
            let (a, b) = (a.pq4.get().expect("codes"), b.pq4.get().expect("codes after loading"));
            assert!(a.book == b.book && a.mean == b.mean, "cluster {j}");
            assert_eq!(a.rows.len(), b.rows.len());
            for at in 0..a.rows.len() {
                assert!((0..a.book.sub_spaces()).all(|s| a.rows.code(at, s) == b.rows.code(at, s)), "cluster {j}");
            }
        }
    }

    /// After rows are synced and moved between clusters, every cluster's 4-bit codes are the
    /// codes of its copies against its mean, and the moved rows are found.
    #[test]
    fn refreshed_rows_keep_the_codes_of_their_copies() {
        let (mut w, q) = clustered(10_000, 16);
        let mut index = SphericalIndex::build(Rows::all(&w), &config(Scoring::Pq4));
        index.search(Rows::all(&w), q.row(1), 10, &mut Vec::new());
        let moved = move_rows_onto(&mut w, q.row(0));
        let nudged: Vec<ClassId> = (0..50).map(|j| j * 191 + 11).filter(|c| !moved.contains(c)).collect();
        for &c in &nudged {
            kernels::scale(1.01, w.row_mut(c as usize));
        }
        index.refresh(Rows::all(&w), &[&moved[..], &nudged[..]].concat());
        for (j, cluster) in index.clusters.iter().enumerate() {
            let p = cluster.pq4.get().expect("pq4 codes");
            let fresh = Pq4Codes::new(&cluster.rows, p.mean.clone(), Arc::clone(&p.book));
            assert_eq!(p.rows.len(), cluster.len(), "cluster {j}");
            for at in 0..cluster.len() {
                for s in 0..p.book.sub_spaces() {
                    assert_eq!(p.rows.code(at, s), fresh.rows.code(at, s), "cluster {j}, member {at}");
                }
            }
        }
        let mut out = Vec::new();
        index.search(Rows::all(&w), q.row(0), 50, &mut out);
        let found: HashSet<ClassId> = out.iter().map(|h| h.class).collect();
        assert!(moved.iter().all(|c| found.contains(c)), "the moved rows are the query's top 50");
    }
}
