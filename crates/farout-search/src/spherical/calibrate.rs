//! How many rows [`SphericalIndex`] probes: calibrated to a target recall on the queries it is
//! asked (`recall`, the default), or a fixed `candidate_factor * k`.
//!
//! **Why calibrate.** The recall of a probe budget depends on the rows, on the queries and on
//! `k`, so no fixed factor is right for all of them (see docs/decisions.md,
//! "index-calibration").
//!
//! **How.** For each `k` the index keeps a budget, fitted on a sample of the queries it is
//! asked (the first `calibration_queries` of them; until they are in, it answers by brute
//! force). For every sample query the clusters are ranked as the search ranks them, and each
//! of its exact top `k` (brute force) needs the rows of every cluster ranked before its own,
//! plus one, to be probed: the query's recall at budget `b` is the share of its top `k` that
//! needs at most `b`. The budget is the smallest `b` whose mean recall over the sample, less
//! two standard errors, reaches the target (so that it holds on queries the sample did not
//! see); the index then searches the sample with it and keeps the recall it measured
//! ([`Calibrated`]). When the clusters that budget probes hold a quarter of the rows or more
//! ([`BRUTE_FORCE_SHARE`]), the index answers that `k` by brute force, also when the rows sit
//! in a few large clusters (as when the index was built on an untrained layer's equal rows).
//!
//! **When it is renewed.** Rows move between clusters as training refreshes the index, and the
//! queries drift: a calibration is renewed on fresh queries after
//! [`RENEW_AFTER_QUERIES`] searches or once [`RENEW_AFTER_REASSIGNED`] of the rows have
//! changed cluster; until the fresh sample is in, the old budget serves. A renewal that finds
//! the budget unchanged doubles the searches until the next (up to [`RENEW_AFTER_QUERIES_MAX`]),
//! one that moves it starts again from [`RENEW_AFTER_QUERIES`]: each renewal searches the rows
//! by brute force for its sample, and once training has settled the budgets barely move (see
//! docs/decisions.md, "calibration-renewal"). A budget counts as unchanged within
//! [`STABLE_BUDGET`] of the last one, or when the fresh sample's recall at the last budget is
//! within the noise of two samples' fits of its recall at the new one: where the recall grows
//! slowly with the budget, sampling alone moves the budget by more than a few percent.
//!
//! [`SphericalIndex`]: super::SphericalIndex

use super::SphericalIndex;
use crate::persist::{Dec, Enc, Problem, inconsistent};
use crate::quant::QuantQueries;
use crate::{ExactIndex, Hit, MipsIndex, Rows};
#[cfg(test)]
use farout_core::ClassId;
use farout_core::{Matrix, topk};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

/// Budgets whose clusters hold this share of the rows or more are answered by brute force:
/// the clusters then separate little, and brute force is exact at a small multiple of the
/// cost (see docs/decisions.md, "index-brute-force-share").
const BRUTE_FORCE_SHARE: f64 = 0.25;

/// Searches after which a calibration is renewed on fresh queries, at first and after a
/// renewal that moved the budget.
const RENEW_AFTER_QUERIES: usize = 50_000;

/// The most searches between renewals, reached by doubling while the budget stays stable.
const RENEW_AFTER_QUERIES_MAX: usize = 16 * RENEW_AFTER_QUERIES;

/// A renewed budget within this share of the last one counts as stable.
const STABLE_BUDGET: f64 = 0.05;

/// Share of the rows reassigned to another cluster after which a calibration is renewed.
const RENEW_AFTER_REASSIGNED: f64 = 0.05;

/// The probe budget of one `k`, fitted to the target recall, and what it measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibrated {
    /// The number of results it is for.
    pub k: usize,
    /// The budget: clusters are probed until this many rows are scanned; `None` = brute force
    /// (the budget would scan a quarter of the rows or more).
    pub budget: Option<usize>,
    /// Rows scanned per query of the sample with that budget, on average (whole clusters are
    /// scanned; all rows for brute force).
    pub probed: f64,
    /// Recall measured on the calibration sample with that budget.
    pub recall: f64,
    /// Queries in the calibration sample.
    pub queries: usize,
}

impl Calibrated {
    /// Rows scanned per result (`probed / k`).
    pub fn per_result(&self) -> f64 {
        self.probed / self.k.max(1) as f64
    }
}

/// `factor * k` rows, rounded up, at least `k` (a factor below 1, or NaN, counts as 1).
fn per_result(k: usize, factor: f32) -> usize {
    ((k as f32 * factor).ceil() as usize).max(k)
}

/// What a search does for its `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// Probe clusters until this many rows are scored.
    Probe(usize),
    /// Score every row.
    BruteForce,
}

/// A calibration in force, with the counters it was made at.
#[derive(Clone, Debug)]
struct Entry {
    fit: Calibrated,
    lone: Arc<LoneFit>,
    at_queries: usize,
    at_reassigned: usize,
    /// Searches after `at_queries` at which it is renewed.
    renew_after: usize,
}

/// What a lone query's scan of 4-bit codes rescores for one calibrated `k` (`pq4.rs`): fitted
/// on the calibration's sample, kept with pq4 scoring only, once the codes exist.
#[derive(Debug, Default)]
pub(super) struct LoneFit {
    /// The calibration's sample queries and their exact top `k`; `None` where not kept (other
    /// scorings, or a calibration read from a saved index).
    pub(super) sample: Option<(Matrix, Vec<Vec<Hit>>)>,
    /// Rows rescored per query, once fitted; a fitted `None` means no depth tried keeps the
    /// recall or int8 codes ran the sample faster, and lone queries scan int8 codes.
    pub(super) depth: OnceLock<Option<usize>>,
    /// A thread is fitting `depth` (others use the configured `pq4_rescore` meanwhile).
    pub(super) fitting: AtomicBool,
}

impl Entry {
    /// The searches until the renewal after `fit` (fitted on the sample of `curve`), which
    /// replaces `last` (if any).
    fn renew_after(last: Option<&Entry>, fit: &Calibrated, curve: &RecallCurve) -> usize {
        let Some(last) = last else { return RENEW_AFTER_QUERIES };
        match (last.fit.budget, fit.budget) {
            (Some(a), Some(b)) if curve.same_budget(a, b) => (2 * last.renew_after).min(RENEW_AFTER_QUERIES_MAX),
            _ => RENEW_AFTER_QUERIES,
        }
    }
}

/// The calibrations of one index (shared by concurrent searches; see the module docs).
#[derive(Debug, Default)]
pub(super) struct Calibrations {
    state: RwLock<State>,
    /// Queries searched since the index was built.
    queries: AtomicUsize,
    /// Rows reassigned to another cluster since the index was built.
    reassigned: AtomicUsize,
}

#[derive(Clone, Debug, Default)]
struct State {
    entries: Vec<Entry>,
    /// Queries collected for the next calibration (row-major, the index's dimension).
    sample: Vec<f32>,
    /// A thread is fitting a calibration (others keep the old budget or brute force).
    busy: bool,
}

impl Clone for Calibrations {
    fn clone(&self) -> Self {
        Self {
            state: RwLock::new(self.state.read().unwrap_or_else(|e| e.into_inner()).clone()),
            queries: AtomicUsize::new(self.queries.load(Ordering::Relaxed)),
            reassigned: AtomicUsize::new(self.reassigned.load(Ordering::Relaxed)),
        }
    }
}

impl Calibrations {
    /// Counts `n` rows moved to another cluster by a refresh.
    pub(super) fn count_reassigned(&self, n: usize) {
        self.reassigned.fetch_add(n, Ordering::Relaxed);
    }

    /// The calibrations in force, one per `k` asked.
    pub(super) fn fitted(&self) -> Vec<Calibrated> {
        self.state.read().unwrap_or_else(|e| e.into_inner()).entries.iter().map(|e| e.fit).collect()
    }

    /// Bytes held: the sample being collected and the samples kept for lone queries' fits.
    pub(super) fn bytes(&self) -> usize {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        let kept = |e: &Entry| {
            e.lone.sample.as_ref().map_or(0, |(q, exact)| {
                q.bytes() + exact.iter().map(|h| h.capacity() * std::mem::size_of::<Hit>()).sum::<usize>()
            })
        };
        4 * state.sample.capacity() + state.entries.iter().map(kept).sum::<usize>()
    }

    /// The calibration in force for `k`, with its lone queries' 4-bit depth fit.
    pub(super) fn lone_fit(&self, k: usize) -> Option<(Calibrated, Arc<LoneFit>)> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        state.entries.iter().find(|e| e.fit.k == k).map(|e| (e.fit, Arc::clone(&e.lone)))
    }
}

impl Calibrations {
    /// Writes the budgets in force, their counters and what their lone queries scan, and the
    /// sample being collected (`crate::persist`).
    pub(super) fn save(&self, out: &mut Enc) {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        out.u64(self.queries.load(Ordering::Relaxed) as u64);
        out.u64(self.reassigned.load(Ordering::Relaxed) as u64);
        out.u64(state.entries.len() as u64);
        for e in &state.entries {
            save_fit(out, &e.fit);
            [e.at_queries, e.at_reassigned, e.renew_after].iter().for_each(|&v| out.u64(v as u64));
            out.u64(match e.lone.depth.get() {
                None => NOT_FITTED,
                Some(None) => INT8_CODES,
                Some(Some(depth)) => *depth as u64,
            });
        }
        out.f32s(&state.sample);
    }

    /// Reads what [`Calibrations::save`] wrote, for an index of `dim` columns.
    pub(super) fn restore(dec: &mut Dec, dim: usize) -> Result<Self, Problem> {
        let (queries, reassigned) = (dec.usize_at_most(usize::MAX, "queries")?, dec.usize_at_most(usize::MAX, "rows")?);
        let n = dec.usize_at_most(MAX_SAVED_ENTRIES, "calibrations")?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let fit = restore_fit(dec)?;
            let at_queries = dec.usize_at_most(queries, "a calibration's query counter")?;
            let at_reassigned = dec.usize_at_most(reassigned, "a calibration's row counter")?;
            let renew_after = dec.usize_at_most(usize::MAX, "renew_after")?;
            // What lone queries scan (format version 2 on; before, still to be fitted).
            let lone = LoneFit::default();
            if dec.version() >= 2 {
                match dec.u64()? {
                    NOT_FITTED => {}
                    INT8_CODES => lone.depth.set(None).expect("a new fit"),
                    depth => {
                        let depth = usize::try_from(depth).ok().filter(|&d| d >= fit.k).ok_or_else(|| {
                            inconsistent(format!("lone queries rescore {depth} rows for {} results", fit.k))
                        })?;
                        lone.depth.set(Some(depth)).expect("a new fit");
                    }
                }
            }
            entries.push(Entry { fit, lone: Arc::new(lone), at_queries, at_reassigned, renew_after });
        }
        let sample = dec.f32s()?;
        if dim == 0 || !sample.len().is_multiple_of(dim) {
            return Err(inconsistent("the calibration sample is not whole queries"));
        }
        Ok(Self {
            state: RwLock::new(State { entries, sample, busy: false }),
            queries: AtomicUsize::new(queries),
            reassigned: AtomicUsize::new(reassigned),
        })
    }
}

/// What a saved calibration's lone queries scan: still to be fitted ([`NOT_FITTED`]), int8 codes
/// ([`INT8_CODES`]), or any other value: 4-bit codes, rescoring that many rows.
const NOT_FITTED: u64 = u64::MAX;
/// See [`NOT_FITTED`].
const INT8_CODES: u64 = u64::MAX - 1;

/// Most calibrations (one per `k` searched) a saved index may hold: a bound on what a damaged
/// file can make the reader allocate, far above the handful of `k` a run searches.
const MAX_SAVED_ENTRIES: usize = 1 << 16;

/// Writes one calibration (the budget `None` as `u64::MAX`).
pub(crate) fn save_fit(out: &mut Enc, fit: &Calibrated) {
    out.u64(fit.k as u64);
    out.u64(fit.budget.map_or(u64::MAX, |b| b as u64));
    out.f64(fit.probed);
    out.f64(fit.recall);
    out.u64(fit.queries as u64);
}

/// Reads what [`save_fit`] wrote.
pub(crate) fn restore_fit(dec: &mut Dec) -> Result<Calibrated, Problem> {
    let k = dec.usize_at_most(u32::MAX as usize, "a calibration's k")?;
    let budget = match dec.u64()? {
        u64::MAX => None,
        b => Some(usize::try_from(b).map_err(|_| inconsistent("a budget overflows"))?),
    };
    let (probed, recall) = (dec.f64()?, dec.f64()?);
    let queries = dec.usize_at_most(usize::MAX, "calibration queries")?;
    if !(probed.is_finite() && recall.is_finite()) {
        return Err(inconsistent("a calibration's figures are not finite"));
    }
    Ok(Calibrated { k, budget, probed, recall, queries })
}

impl SphericalIndex {
    /// What a search of `queries` (row-major, `w.dim()` wide) for `k` results does: probe the
    /// fixed `candidate_factor * k` rows, the calibrated budget, or brute force while the
    /// calibration sample is being collected (and fitting it when it is complete).
    pub(super) fn plan(&self, w: Rows, queries: &[f32], k: usize) -> Plan {
        if let Some(factor) = self.config.candidate_factor {
            return Plan::Probe(per_result(k, factor));
        }
        let cal = &self.calibrations;
        let d = w.dim();
        let searched = cal.queries.fetch_add(queries.len() / d.max(1), Ordering::Relaxed);
        let reassigned = cal.reassigned.load(Ordering::Relaxed);
        let stale = |e: &Entry| {
            searched - e.at_queries >= e.renew_after
                || (reassigned - e.at_reassigned) as f64 >= RENEW_AFTER_REASSIGNED * w.len() as f64
        };
        let current = {
            let state = cal.state.read().unwrap_or_else(|e| e.into_inner());
            let entry = state.entries.iter().find(|e| e.fit.k == k);
            match entry {
                Some(e) if !stale(e) => return plan_of(&e.fit),
                Some(e) => plan_of(&e.fit),
                None => Plan::BruteForce,
            }
        };
        // Missing or stale: collect these queries; fit once the sample is complete.
        let wanted = self.config.calibration_queries * d;
        let sample = {
            let mut state = cal.state.write().unwrap_or_else(|e| e.into_inner());
            if state.busy {
                return current;
            }
            let take = (wanted - state.sample.len().min(wanted)).min(queries.len());
            state.sample.extend_from_slice(&queries[..take]);
            if state.sample.len() < wanted {
                return current;
            }
            state.busy = true;
            std::mem::take(&mut state.sample)
        };
        // Fitted without holding the lock: the fit runs parallel work, whose threads may search
        // this index meanwhile.
        let sample = Matrix::from_vec(sample.len() / d, d, sample).expect("whole rows");
        let (fit, exact, curve) = self.fit(w, &sample, k);
        let keep = self.config.scoring == super::Scoring::Pq4 && fit.budget.is_some();
        let lone = Arc::new(LoneFit { sample: keep.then_some((sample, exact)), ..LoneFit::default() });
        let mut state = cal.state.write().unwrap_or_else(|e| e.into_inner());
        let renew_after = Entry::renew_after(state.entries.iter().find(|e| e.fit.k == k), &fit, &curve);
        state.entries.retain(|e| e.fit.k != k);
        state.entries.push(Entry { fit, lone, at_queries: searched, at_reassigned: reassigned, renew_after });
        state.busy = false;
        plan_of(&fit)
    }

    /// The calibration of `k` on `sample` (see the module docs), the sample's exact top `k` and
    /// its recall curve.
    fn fit(&self, w: Rows, sample: &Matrix, k: usize) -> (Calibrated, Vec<Vec<Hit>>, RecallCurve) {
        let n = sample.rows();
        let mut exact = Vec::new();
        ExactIndex::new().search_batch(w, sample, k, &mut exact);
        // Rank the clusters as the search does (on the centroids' codes with int8 scoring).
        let codes = self.centroid_codes.as_ref().map(|_| QuantQueries::new(sample.as_slice(), w.dim()));
        let (scores, stride) = self.centroid_scores(sample, codes.as_ref());
        let c = self.clusters.len();
        // Per query: for each of its exact top k, the budget that probes its cluster (sorted);
        // and the rows probed so far after each cluster in probing order.
        let (needs, ends): (Vec<Vec<usize>>, Vec<Vec<usize>>) = (0..n)
            .into_par_iter()
            .map(|q| {
                let row = &scores[q * stride..q * stride + c];
                let mut keys: Vec<u64> =
                    row.iter().enumerate().map(|(j, &s)| topk::descending_key(s, j as u32)).collect();
                keys.sort_unstable();
                let (mut before, mut ends) = (vec![0usize; c], Vec::with_capacity(c));
                let mut rows = 0;
                for &key in &keys {
                    let j = key as u32 as usize;
                    before[j] = rows;
                    rows += self.clusters[j].len();
                    ends.push(rows);
                }
                let mut need: Vec<usize> =
                    exact[q].iter().map(|h: &Hit| before[self.assign[h.class as usize] as usize] + 1).collect();
                need.sort_unstable();
                (need, ends)
            })
            .unzip();
        let curve = RecallCurve(needs);
        let budget = curve.smallest_budget(self.config.recall as f64);
        // The search probes whole clusters: the rows it scans for this budget, on average.
        let scanned = |ends: &Vec<usize>| ends.get(ends.partition_point(|&e| e < budget)).or(ends.last()).copied();
        let probed = ends.iter().map(|e| scanned(e).unwrap_or(0) as f64).sum::<f64>() / n.max(1) as f64;
        if probed >= BRUTE_FORCE_SHARE * w.len() as f64 {
            return (Calibrated { k, budget: None, probed: w.len() as f64, recall: 1.0, queries: n }, exact, curve);
        }
        // The recall of that budget, measured by searching the sample with it.
        let mut found = Vec::new();
        self.search_batched_with(w, sample, k, budget, &mut found);
        let recall = crate::overlap(&found, &exact);
        (Calibrated { k, budget: Some(budget), probed, recall, queries: n }, exact, curve)
    }
}

fn plan_of(fit: &Calibrated) -> Plan {
    fit.budget.map_or(Plan::BruteForce, Plan::Probe)
}

/// A calibration sample's recall as a function of the budget: per query, the sorted budgets at
/// which each of its exact top `k` is found.
struct RecallCurve(Vec<Vec<usize>>);

impl RecallCurve {
    /// The mean recall over the queries at budget `b`, and its standard error (queries with no
    /// results are left out; `None` without any).
    fn at(&self, b: usize) -> Option<(f64, f64)> {
        let recalls =
            self.0.iter().filter(|n| !n.is_empty()).map(|n| n.partition_point(|&x| x <= b) as f64 / n.len() as f64);
        let (mut count, mut sum, mut sq) = (0.0, 0.0, 0.0);
        for r in recalls {
            (count, sum, sq) = (count + 1.0, sum + r, sq + r * r);
        }
        if count == 0.0 {
            return None;
        }
        let mean = sum / count;
        Some((mean, ((sq / count - mean * mean).max(0.0) / count).sqrt()))
    }

    /// The smallest budget whose mean recall, less two standard errors, reaches `target`.
    fn smallest_budget(&self, target: f64) -> usize {
        let reaches = |b: usize| self.at(b).is_none_or(|(mean, stderr)| mean - 2.0 * stderr >= target);
        let mut candidates: Vec<usize> = self.0.iter().flatten().copied().collect();
        candidates.sort_unstable();
        candidates.dedup();
        // Recall grows with the budget: the first candidate that reaches the target.
        let at = candidates.partition_point(|&b| !reaches(b));
        candidates.get(at).or(candidates.last()).copied().unwrap_or(1)
    }

    /// Whether the last budget `last` and the budget `new` fitted on this sample are the same
    /// up to sampling: within [`STABLE_BUDGET`] of each other, or with recalls on this sample
    /// that differ by at most two standard errors of the difference between two samples' mean
    /// recalls (2√2 of one sample's): each fit puts its budget where its own sample's mean
    /// recall, which is off by about a standard error, meets the target.
    fn same_budget(&self, last: usize, new: usize) -> bool {
        if (new as f64 - last as f64).abs() <= STABLE_BUDGET * last as f64 {
            return true;
        }
        match (self.at(last), self.at(new)) {
            (Some((then, _)), Some((now, stderr))) => (then - now).abs() <= 2.0 * std::f64::consts::SQRT_2 * stderr,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::SphericalConfig;
    use super::*;
    use farout_data::synth::{FaceGenerator, FaceSpec, Split};

    /// 20,000 class means in 400 natural clusters, D = 32, and 1,256 of the generator's samples:
    /// the first 256 calibrate, the other 1,000 are held out.
    fn rows_and_queries() -> (Matrix, Matrix, Matrix) {
        let g = FaceGenerator::new(FaceSpec::clustered(20_000, 32)).unwrap();
        (g.means().clone(), g.features(Split::Train, 0..256), g.features(Split::Train, 256..1_256))
    }

    /// Calibrated on one sample, the index reaches the target recall on queries it has not
    /// seen, at every k, probing far fewer rows than brute force; the sample's recall is
    /// reported.
    #[test]
    fn calibrated_budget_reaches_the_target_recall_on_held_out_queries() {
        let (w, sample, held_out) = rows_and_queries();
        let all = Rows::all(&w);
        for scoring in [super::super::Scoring::F32, super::super::Scoring::Int8, super::super::Scoring::Pq4] {
            let config = SphericalConfig { scoring, ..SphericalConfig::default() };
            let index = SphericalIndex::build(all, &config);
            let mut out = Vec::new();
            for k in [10, 30, 100] {
                index.search_batch(all, &sample, k, &mut out);
                let fit = index.calibrations().into_iter().find(|c| c.k == k).expect("calibrated");
                assert!(fit.budget.is_some(), "{scoring:?} k {k}: brute force, {fit:?}");
                assert!(fit.recall >= 0.9 && fit.queries == 256, "{scoring:?} k {k}: {fit:?}");
                assert!(fit.probed < w.rows() as f64 / 4.0, "{scoring:?} k {k}: {fit:?}");
                // Held out: the recall of a sample mean, within 0.02 of the target.
                let r = crate::recall(&index, all, &held_out, k);
                assert!(r >= 0.88, "{scoring:?} k {k}: held-out recall {r}, calibration {fit:?}");
            }
        }
    }

    /// Until the sample is complete the index answers by brute force; a `k` whose budget would
    /// probe a quarter of the rows or more stays with brute force.
    #[test]
    fn brute_force_before_the_sample_and_where_the_index_cannot_gain() {
        let (w, sample, _) = rows_and_queries();
        let all = Rows::all(&w);
        let index = SphericalIndex::build(all, &SphericalConfig::default());
        let mut out = Vec::new();
        let half = Matrix::from_vec(128, 32, sample.as_slice()[..128 * 32].to_vec()).unwrap();
        assert_eq!(index.search_batch(all, &half, 100, &mut out), 128 * 20_000, "brute force");
        assert!(index.calibrations().is_empty());
        // The other half completes the sample.
        let rest = Matrix::from_vec(128, 32, sample.as_slice()[128 * 32..].to_vec()).unwrap();
        index.search_batch(all, &rest, 100, &mut out);
        assert!(index.calibrations()[0].budget.is_some());
        // Top 10,000 of 20,000 rows.
        index.search_batch(all, &sample, 10_000, &mut out);
        let fit = index.calibrations().into_iter().find(|c| c.k == 10_000).unwrap();
        assert_eq!((fit.budget, fit.probed, fit.recall), (None, 20_000.0, 1.0));
        assert_eq!(index.search_batch(all, &sample, 10_000, &mut out), 256 * 20_000);
    }

    /// Built on equal rows (an untrained layer), every row sits in one cluster: any budget scans
    /// them all, so the calibration says brute force, not a budget of one row.
    #[test]
    fn an_index_of_equal_rows_calibrates_to_brute_force() {
        let (_, sample, _) = rows_and_queries();
        let w = Matrix::from_vec(5_000, 32, vec![0.01; 5_000 * 32]).unwrap();
        let index = SphericalIndex::build(Rows::all(&w), &SphericalConfig::default());
        let mut out = Vec::new();
        index.search_batch(Rows::all(&w), &sample, 20, &mut out);
        let fit = index.calibrations()[0];
        assert_eq!((fit.budget, fit.probed), (None, 5_000.0), "{fit:?}");
    }

    /// A calibration is renewed on fresh queries once enough rows have changed cluster.
    #[test]
    fn calibration_is_renewed_after_rows_move() {
        let (mut w, sample, _) = rows_and_queries();
        let mut index = SphericalIndex::build(Rows::all(&w), &SphericalConfig::default());
        let mut out = Vec::new();
        index.search_batch(Rows::all(&w), &sample, 100, &mut out);
        let first = index.calibrations()[0];
        // Swap the rows of two halves of the classes: 10,000 rows change cluster.
        for i in 0..10_000 {
            let (a, b) = (w.row(i).to_vec(), w.row(i + 10_000).to_vec());
            w.row_mut(i).copy_from_slice(&b);
            w.row_mut(i + 10_000).copy_from_slice(&a);
        }
        let both: Vec<ClassId> = (0..20_000).collect();
        index.refresh(Rows::all(&w), &both);
        // Stale: the old budget serves while the fresh sample comes in, then a new fit.
        index.search_batch(Rows::all(&w), &sample, 100, &mut out);
        let renewed = index.calibrations()[0];
        assert_ne!(renewed, first, "renewed");
        assert!(renewed.recall >= 0.9, "{renewed:?}");
    }

    /// Saved, each calibration keeps what its lone queries scan (still to be fitted, int8 codes,
    /// or 4-bit codes rescoring a number of rows); a version 1 file, which does not hold it,
    /// loads with it still to be fitted; a depth below `k` is refused.
    #[test]
    fn saved_calibrations_keep_what_lone_queries_scan() {
        let entry = |k, depth: Option<Option<usize>>| {
            let lone = LoneFit::default();
            if let Some(depth) = depth {
                lone.depth.set(depth).unwrap();
            }
            let fit = Calibrated { k, budget: Some(4_000), probed: 4_100.0, recall: 0.91, queries: 256 };
            Entry { fit, lone: Arc::new(lone), at_queries: 3, at_reassigned: 0, renew_after: RENEW_AFTER_QUERIES }
        };
        let saved = |entries: Vec<Entry>| {
            let calibrations = Calibrations::default();
            calibrations.state.write().unwrap().entries = entries;
            calibrations.queries.store(10, Ordering::Relaxed);
            let mut out = Enc::default();
            calibrations.save(&mut out);
            out.into_bytes()
        };
        let kept = [None, Some(None), Some(Some(250))];
        let bytes = saved(kept.iter().enumerate().map(|(i, &d)| entry(10 * (i + 1), d)).collect());
        let loaded = Calibrations::restore(&mut Dec::new(&bytes), 32).unwrap();
        for (i, want) in kept.iter().enumerate() {
            let (_, lone) = loaded.lone_fit(10 * (i + 1)).expect("the calibration");
            assert_eq!(lone.depth.get(), want.as_ref(), "k = {}", 10 * (i + 1));
        }
        // Version 1: the same fields without what lone queries scan.
        let mut v1 = Enc::default();
        [10u64, 0, 1].iter().for_each(|&v| v1.u64(v));
        save_fit(&mut v1, &entry(10, None).fit);
        [3u64, 0, RENEW_AFTER_QUERIES as u64].iter().for_each(|&v| v1.u64(v));
        v1.f32s(&[]);
        let v1 = v1.into_bytes();
        let loaded = Calibrations::restore(&mut Dec::written_in(&v1, 1), 32).unwrap();
        assert_eq!(loaded.lone_fit(10).expect("the calibration").1.depth.get(), None);
        // Rescoring fewer rows than results is no fit.
        let bad = saved(vec![entry(100, Some(Some(99)))]);
        assert!(Calibrations::restore(&mut Dec::new(&bad), 32).is_err());
    }

    /// A calibration in force since the first search, renewed after `renew_after` searches.
    fn entry_of(fit: Calibrated, renew_after: usize) -> Entry {
        Entry { fit, lone: Arc::default(), at_queries: 0, at_reassigned: 0, renew_after }
    }

    /// Renewals that keep the budget within 5 % double the searches until the next, up to 16
    /// times the first interval; one that moves it, or a switch to brute force, starts over.
    #[test]
    fn stable_budgets_are_renewed_less_and_less_often() {
        let fit = |budget| Calibrated { k: 10, budget, probed: 0.0, recall: 0.9, queries: 256 };
        let entry = |budget, renew_after| entry_of(fit(budget), renew_after);
        // Identical queries whose results come in steadily between budgets 850 and 1,150: no
        // sampling noise, every budget outside 5 % gives another recall.
        let steep = RecallCurve(vec![(0..31).map(|i| 850 + 10 * i).collect(); 50]);
        let renew = |last: Option<&Entry>, budget| Entry::renew_after(last, &fit(budget), &steep);
        let first = RENEW_AFTER_QUERIES;
        assert_eq!(renew(None, Some(1_000)), first);
        assert_eq!(renew(Some(&entry(Some(1_000), first)), Some(1_050)), 2 * first);
        assert_eq!(renew(Some(&entry(Some(1_000), 2 * first)), Some(950)), 4 * first);
        assert_eq!(renew(Some(&entry(Some(1_000), 16 * first)), Some(1_000)), 16 * first);
        assert_eq!(renew(Some(&entry(Some(1_000), 8 * first)), Some(1_060)), first);
        assert_eq!(renew(Some(&entry(Some(1_000), 8 * first)), Some(900)), first);
        assert_eq!(renew(Some(&entry(None, 8 * first)), Some(1_000)), first);
        assert_eq!(renew(Some(&entry(Some(1_000), 8 * first)), None), first);
    }

    /// Where the recall barely grows between two budgets, a renewal that moves the budget by more
    /// than 5 % but changes the sample's recall by less than its noise counts as stable; one
    /// whose recall moves by more does not.
    #[test]
    fn budgets_apart_by_less_than_sampling_noise_count_as_stable() {
        // 100 queries of 10 results: half found by budget 10, half only after 5,000 (mean
        // recall 0.5 at budget 1,000, standard error 0.05); one query finds `extra` of its
        // results at budget 1,100.
        let curve = |extra: usize| {
            let mut needs: Vec<Vec<usize>> =
                (0..100).map(|q| if q < 50 { (1..=10).collect() } else { (5_001..=5_010).collect() }).collect();
            needs[99][..extra].fill(1_100);
            needs[99].sort_unstable();
            RecallCurve(needs)
        };
        let (then, stderr) = curve(1).at(1_000).unwrap();
        assert!((then - 0.5).abs() < 1e-12 && (stderr - 0.05).abs() < 1e-12, "{then} {stderr}");
        assert!(curve(1).same_budget(1_000, 1_200), "recall 0.500 -> 0.501");
        assert!(curve(1).same_budget(1_200, 1_000));
        // All ten: 0.5 -> 0.51 (2√2 standard errors = 0.141), still stable; half the queries
        // finding theirs in between (0 -> 0.5) is a change.
        assert!(curve(10).same_budget(1_000, 1_200));
        let many = RecallCurve((0..100).map(|q| if q < 50 { vec![1_100; 10] } else { vec![5_001; 10] }).collect());
        assert!(!many.same_budget(1_000, 1_200), "recall 0 -> 0.5");
        // No queries with results: nothing says the budgets agree beyond 5 %.
        assert!(!RecallCurve(vec![vec![]; 3]).same_budget(1_000, 1_200));
        assert!(RecallCurve(vec![vec![]; 3]).same_budget(1_000, 1_040));
        // Renewed on such a sample, the interval doubles.
        let fit = Calibrated { k: 10, budget: Some(1_200), probed: 0.0, recall: 0.9, queries: 100 };
        let last = entry_of(Calibrated { budget: Some(1_000), ..fit }, RENEW_AFTER_QUERIES);
        assert_eq!(Entry::renew_after(Some(&last), &fit, &curve(1)), 2 * RENEW_AFTER_QUERIES);
    }

    #[test]
    fn smallest_budget_reaches_the_target_less_two_standard_errors() {
        // Two queries, four results each: query 0 finds them at budgets 1, 2, 3, 4; query 1 at
        // 5, 6, 7, 8. At budget 4 the recalls are 1 and 0 (mean 0.5, standard error 0.35); at 5,
        // 1 and 0.25 (mean 0.625, standard error 0.27); at 8, 1 and 1.
        let needs = RecallCurve(vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]]);
        assert_eq!(needs.smallest_budget(1.0), 8);
        assert_eq!(needs.smallest_budget(0.05), 5);
        // Identical queries: no spread, the plain quantile.
        let same = RecallCurve(vec![vec![10, 20, 30, 40]; 5]);
        assert_eq!(same.smallest_budget(0.75), 30);
        assert_eq!(same.smallest_budget(0.7), 30);
        assert_eq!(same.smallest_budget(0.5), 20);
        // A target no budget reaches: everything found is all it can do.
        assert_eq!(RecallCurve(vec![vec![3, 9]]).smallest_budget(1.5), 9);
    }
}
