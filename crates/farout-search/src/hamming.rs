//! SimpleLSH codes ranked by Hamming distance: every row is hashed to one long code, and a query
//! rescores the rows whose codes are nearest its own (the LSH oracle of MEMOIR, Belyy &
//! Sholokhov, "SimpleLSH with Hamming distance").
//!
//! Rows are norm-augmented to unit vectors `x = [w / M, sqrt(1 - |w|^2 / M^2)]` (see
//! `augment.rs`) and hashed to the signs of `b` Gaussian projections `a_j` (`b` = 64 by
//! default): bit j of a row's code is `a_j . x >= 0`, of a query's `a_j[..D] . q >= 0` (its
//! augmented coordinate is 0). For a row at angle θ to the query each bit differs with
//! probability θ/π, so the Hamming distance `h` is a Binomial(b, θ/π) estimate of the angle, and
//! `cos θ` is proportional to `w . q`: the smaller `h`, the larger the inner product is likely
//! to be.
//!
//! A query computes `h` to every row (an XOR and a population count per 64 bits: about a
//! hundredth of an inner product of dimension 128), keeps the `candidate_factor · k` rows of
//! smallest `h` (a counting selection over the b + 1 possible distances; ties at the cut go to
//! the lower row ids) and rescores them exactly. Unlike the bucketed [`crate::SimpleLshIndex`],
//! whose buckets a query probes until it has enough rows, the cost per query does not depend
//! on how the codes are spread: many rows hashed alike (rows near zero all map near the
//! augmentation's pole) cost nothing extra, and refreshing or rebuilding is hashing alone, `b`
//! inner products per row.
//!
//! Why this and not more tables: sorting all K distances is linear and branch-free, so one long
//! code replaces the tables and probe sequences of bucketed LSH, and the candidates are the
//! most likely ones by the binomial estimate rather than the contents of whichever buckets come
//! first.

use crate::augment::NormAugmentation;
use crate::persist::{Dec, Enc, Problem, expect_len, inconsistent};
use crate::{Hit, MipsIndex, Rows};
use farout_core::{ClassId, Matrix, kernels, rng};
use std::cell::RefCell;

/// Parameters of [`HammingIndex`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HammingConfig {
    /// Bits per code b: a multiple of 64, at most 512.
    pub bits: usize,
    /// Rows rescored per result: a query rescores the `candidate_factor * k` rows nearest in
    /// Hamming distance.
    pub candidate_factor: f32,
    /// Norm bound `M = (1 + norm_headroom) * max_k |w_k|` of the augmentation.
    pub norm_headroom: f32,
    /// Seed of the random projections.
    pub seed: u64,
}

impl Default for HammingConfig {
    fn default() -> Self {
        Self { bits: 64, candidate_factor: 20.0, norm_headroom: 0.1, seed: 1 }
    }
}

/// SimpleLSH codes of the rows of `W`, searched by Hamming distance (see the module docs).
pub struct HammingIndex {
    config: HammingConfig,
    /// 64-bit words per code.
    words: usize,
    augmentation: NormAugmentation,
    /// `[bits, D + 1]` projection directions.
    planes: Matrix,
    /// Every row's code, `[rows, words]`.
    codes: Vec<u64>,
    rebuild: bool,
}

#[derive(Default)]
struct Scratch {
    code: Vec<u64>,
    distances: Vec<u16>,
    selection: Selection,
    cand: Vec<Hit>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl HammingIndex {
    /// Hashes every row of `w`.
    pub fn build(w: Rows, config: &HammingConfig) -> Self {
        let (k, d) = (w.len(), w.dim());
        let bits = config.bits.clamp(64, 512) / 64 * 64;
        let mut r = rng::seeded(config.seed, 0x4A33);
        let planes = Matrix::from_vec(bits, d + 1, (0..bits * (d + 1)).map(|_| rng::normal(&mut r)).collect())
            .expect("sizes agree");
        let mut index = Self {
            config: config.clone(),
            words: bits / 64,
            augmentation: NormAugmentation::fit(w, config.norm_headroom),
            planes,
            codes: Vec::new(),
            rebuild: false,
        };
        let all: Vec<ClassId> = (0..k as ClassId).collect();
        index.codes = index.hash_rows(w, &all);
        index
    }

    /// Bits per code b.
    pub fn bits(&self) -> usize {
        self.planes.rows()
    }

    /// Codes of `rows` (`[rows.len(), words]`), computed in parallel.
    fn hash_rows(&self, w: Rows, rows: &[ClassId]) -> Vec<u64> {
        use rayon::prelude::*;
        let d = w.dim();
        let mut out = vec![0u64; rows.len() * self.words];
        out.par_chunks_mut(self.words).zip(rows.par_iter()).for_each_init(
            || vec![0.0f32; d + 1],
            |x, (code, &i)| {
                self.augmentation.augment_row(w.row(i as usize), x);
                self.sign_code(x, code);
            },
        );
        out
    }

    /// ORs into `code` (zeroed, `words` long) bit j = `a_j . x >= 0`, over the first `x.len()`
    /// coordinates of each projection: all D + 1 for an augmented row, D for a query (whose
    /// augmented coordinate is 0).
    fn sign_code(&self, x: &[f32], code: &mut [u64]) {
        for (j, plane) in self.planes.iter_rows().enumerate() {
            code[j / 64] |= ((kernels::dot(&plane[..x.len()], x) >= 0.0) as u64) << (j % 64);
        }
    }
}

/// `out[i]` = Hamming distance between code i of `codes` (`words` 64-bit words each) and `q`.
/// Each code length up to 512 bits has its own loop with the word count known at compile time,
/// which the compiler unrolls and vectorises (a loop over `q.len()` words ran 256-bit codes
/// slower than 512-bit ones).
#[inline(always)]
fn distances_generic(codes: &[u64], q: &[u64], out: &mut [u16]) {
    match q.len() {
        1 => fixed::<1>(codes, q, out),
        2 => fixed::<2>(codes, q, out),
        3 => fixed::<3>(codes, q, out),
        4 => fixed::<4>(codes, q, out),
        5 => fixed::<5>(codes, q, out),
        6 => fixed::<6>(codes, q, out),
        7 => fixed::<7>(codes, q, out),
        8 => fixed::<8>(codes, q, out),
        words => {
            for (o, c) in out.iter_mut().zip(codes.chunks_exact(words)) {
                *o = c.iter().zip(q).map(|(a, b)| (a ^ b).count_ones()).sum::<u32>() as u16;
            }
        }
    }
}

/// [`distances_generic`] for codes of `W` words.
#[inline(always)]
fn fixed<const W: usize>(codes: &[u64], q: &[u64], out: &mut [u16]) {
    let q: &[u64; W] = q.try_into().expect("W words");
    for (o, c) in out.iter_mut().zip(codes.chunks_exact(W)) {
        let mut h = 0;
        for w in 0..W {
            h += (c[w] ^ q[w]).count_ones();
        }
        *o = h as u16;
    }
}

/// [`distances_generic`] compiled for AVX-512 with `vpopcntq` (8 codes per instruction).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "popcnt,avx512f,avx512bw,avx512vpopcntdq")]
fn distances_avx512(codes: &[u64], q: &[u64], out: &mut [u16]) {
    distances_generic(codes, q, out)
}

/// [`distances_generic`] compiled with the `popcnt` instruction (every x86-64 CPU since 2008).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "popcnt")]
fn distances_popcnt(codes: &[u64], q: &[u64], out: &mut [u16]) {
    distances_generic(codes, q, out)
}

/// Hamming distances of every code to `q`, with the widest population count the CPU has (and
/// `FAROUT_SIMD` allows).
fn distances(codes: &[u64], q: &[u64], out: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    {
        use kernels::SimdLevel;
        let level = kernels::simd_in_use();
        if level >= SimdLevel::Avx512 && std::arch::is_x86_feature_detected!("avx512vpopcntdq") {
            // SAFETY: the CPU has the features (checked just above).
            return unsafe { distances_avx512(codes, q, out) };
        }
        if level > SimdLevel::Baseline && std::arch::is_x86_feature_detected!("popcnt") {
            // SAFETY: the CPU has popcnt (checked just above).
            return unsafe { distances_popcnt(codes, q, out) };
        }
    }
    distances_generic(codes, q, out)
}

/// Rows of the sample [`nearest`] estimates its first cut from.
const CUT_SAMPLE: usize = 1024;
/// Distances [`nearest`] skips at once when none is within the cut.
const CHUNK: usize = 32;

/// Scratch of [`nearest`].
#[derive(Default)]
struct Selection {
    counts: Vec<u32>,
    /// `(distance << 32) | position` of the positions within the cut.
    kept: Vec<u64>,
}

/// Calls `keep` with the `budget` positions of smallest `distances` (ties to the lowest
/// positions), nearest first.
///
/// The cut lies far in the low tail (a thousandth of the rows, say), so the distances are not
/// all counted: a histogram of the first [`CUT_SAMPLE`] gives the smallest cut at which about
/// `2 * budget` of all rows are expected, one pass keeps the rows within it (skipping chunks
/// whose smallest distance is beyond it: a vector minimum), and the cut moves out by one until
/// at least `budget` rows are kept. The kept rows, about twice the budget and at most `budget`
/// of them at the cut, are sorted.
fn nearest(distances: &[u16], max_distance: usize, budget: usize, s: &mut Selection, mut keep: impl FnMut(usize)) {
    let n = distances.len();
    let sample = &distances[..n.min(CUT_SAMPLE)];
    s.counts.clear();
    s.counts.resize(4 * (max_distance + 1), 0);
    // Four interleaved histograms: equal distances in a row do not wait on one counter.
    let stride = max_distance + 1;
    let mut quads = sample.chunks_exact(4);
    for q in &mut quads {
        for (j, &h) in q.iter().enumerate() {
            s.counts[j * stride + h as usize] += 1;
        }
    }
    for &h in quads.remainder() {
        s.counts[h as usize] += 1;
    }
    let count = |t: usize| (0..4).map(|j| s.counts[j * stride + t] as u64).sum::<u64>();
    // Expected rows within cut t: n / |sample| * (sampled rows within t).
    let wanted = (2 * budget) as u64 * sample.len() as u64;
    let (mut cut, mut within) = (0, count(0));
    while within * (n as u64) < wanted && cut < max_distance {
        cut += 1;
        within += count(cut);
    }
    s.kept.clear();
    let mut from = 0;
    loop {
        // Rows at distance `from..=limit` are kept. At most `budget` rows at the cut itself
        // (the first ones): rows hashed alike, such as the many rows near zero, can tie there by
        // the thousand; once `budget` are kept the cut's rows are skipped too.
        let (mut limit, mut at_cut) = (cut as i32, 0);
        let mut scan = |start: usize, chunk: &[u16], limit: &mut i32| {
            for (i, &h) in chunk.iter().enumerate() {
                if h as i32 <= *limit && h as usize >= from {
                    s.kept.push((h as u64) << 32 | (start + i) as u64);
                    if h as usize == cut {
                        at_cut += 1;
                        if at_cut == budget {
                            *limit = cut as i32 - 1;
                        }
                    }
                }
            }
        };
        let mut chunks = distances.chunks_exact(CHUNK);
        for (c, chunk) in (&mut chunks).enumerate() {
            if chunk.iter().fold(u16::MAX, |m, &h| m.min(h)) as i32 <= limit {
                scan(c * CHUNK, chunk, &mut limit);
            }
        }
        let rest = chunks.remainder();
        scan(n - rest.len(), rest, &mut limit);
        if s.kept.len() >= budget || cut >= max_distance {
            break;
        }
        from = cut + 1;
        cut += 1;
    }
    s.kept.sort_unstable();
    for &e in s.kept.iter().take(budget) {
        keep(e as u32 as usize);
    }
}

impl HammingIndex {
    /// Writes the parameters, norm bound, projections and codes (`crate::persist`).
    fn save(&self, out: &mut Enc) {
        out.config(&self.config);
        out.u64(self.words as u64);
        out.f32(self.augmentation.bound());
        out.matrix(&self.planes);
        out.u64s(&self.codes);
        out.u8(self.rebuild as u8);
    }

    /// Reads what [`HammingIndex::save`] wrote for the rows `w`.
    pub(crate) fn restore(dec: &mut Dec, w: Rows) -> Result<Self, Problem> {
        let config: HammingConfig = dec.config("hamming")?;
        crate::IndexParams::check(&config).map_err(inconsistent)?;
        let words = dec.usize_at_most(8, "64-bit words per code")?;
        let augmentation = NormAugmentation::with_bound(dec.f32()?).ok_or_else(|| inconsistent("the norm bound"))?;
        let planes = dec.matrix()?;
        if words == 0 || (planes.rows(), planes.cols()) != (64 * words, w.dim() + 1) {
            return Err(inconsistent(format!(
                "{} x {} projections for codes of {words} words",
                planes.rows(),
                planes.cols()
            )));
        }
        let codes = dec.u64s()?;
        expect_len(&codes, w.len() * words, "code words")?;
        let rebuild = dec.u8()? != 0;
        Ok(Self { config, words, augmentation, planes, codes, rebuild })
    }
}

impl MipsIndex for HammingIndex {
    fn name(&self) -> &'static str {
        "hamming"
    }

    fn save_state(&self, out: &mut Enc) -> Result<(), crate::persist::Unsupported> {
        self.save(out);
        Ok(())
    }

    fn search(&self, w: Rows, query: &[f32], k: usize, out: &mut Vec<Hit>) -> usize {
        let n = w.len();
        let budget = ((k as f32 * self.config.candidate_factor).ceil() as usize).max(k);
        SCRATCH.with_borrow_mut(|s| {
            let Scratch { code, distances: dist, selection, cand } = s;
            cand.clear();
            // Inner products besides the rows scored: the query's projections.
            let overhead = if budget >= n {
                cand.extend((0..n).map(|i| Hit { class: i as ClassId, score: kernels::dot(w.row(i), query) }));
                0
            } else {
                code.clear();
                code.resize(self.words, 0);
                self.sign_code(query, code);
                dist.resize(n, 0);
                distances(&self.codes, code, dist);
                nearest(dist, self.bits(), budget, selection, |i| {
                    cand.push(Hit { class: i as ClassId, score: kernels::dot(w.row(i), query) })
                });
                self.bits()
            };
            let scored = cand.len();
            if cand.len() > k {
                cand.select_nth_unstable_by(k, farout_core::topk::by_score);
                cand.truncate(k);
            }
            out.clear();
            out.extend_from_slice(cand);
            scored + overhead
        })
    }

    fn refresh(&mut self, w: Rows, rows: &[ClassId]) {
        self.rebuild |= rows.iter().any(|&i| self.augmentation.outgrown(w.row(i as usize)));
        let codes = self.hash_rows(w, rows);
        for (&i, code) in rows.iter().zip(codes.chunks_exact(self.words)) {
            let at = i as usize * self.words;
            self.codes[at..at + self.words].copy_from_slice(code);
        }
    }

    fn needs_rebuild(&self) -> bool {
        self.rebuild
    }

    fn memory_bytes(&self) -> usize {
        self.planes.bytes() + 8 * self.codes.len()
    }
}

impl crate::IndexParams for HammingConfig {
    fn check(&self) -> Result<(), farout_core::ParamError> {
        if self.bits == 0 || !self.bits.is_multiple_of(64) || self.bits > 512 {
            let reason = "must be a multiple of 64 from 64 to 512";
            return Err(farout_core::ParamError::new("bits", self.bits, reason));
        }
        crate::finite_at_least("candidate_factor", self.candidate_factor, 1.0)?;
        crate::finite_at_least("norm_headroom", self.norm_headroom, 0.0)
    }

    fn build(&self, w: Rows) -> Box<dyn MipsIndex> {
        Box::new(HammingIndex::build(w, self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IndexParams;
    use crate::recall;
    use crate::testutil::{assert_exact_top, clustered, move_rows_onto};

    #[test]
    fn every_population_count_kernel_gives_the_scalar_distances() {
        let mut r = rng::seeded(5, 0);
        for words in 1..=9 {
            let codes: Vec<u64> = (0..1003 * words).map(|_| rng::RngExt::random::<u64>(&mut r)).collect();
            let q: Vec<u64> = (0..words).map(|_| rng::RngExt::random::<u64>(&mut r)).collect();
            let expected: Vec<u16> = codes
                .chunks_exact(words)
                .map(|c| c.iter().zip(&q).map(|(a, b)| (0..64).filter(|&j| (a ^ b) >> j & 1 == 1).count() as u16).sum())
                .collect();
            let mut out = vec![0u16; 1003];
            distances(&codes, &q, &mut out);
            assert_eq!(out, expected, "{words} words");
            distances_generic(&codes, &q, &mut out);
            assert_eq!(out, expected, "{words} words, generic");
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("popcnt") {
                out.fill(0);
                // SAFETY: the CPU has popcnt (checked just above).
                unsafe { distances_popcnt(&codes, &q, &mut out) };
                assert_eq!(out, expected, "{words} words, popcnt");
            }
        }
    }

    #[test]
    fn the_selection_keeps_the_nearest_codes_and_breaks_ties_by_position() {
        let distances = [5u16, 0, 3, 3, 64, 3, 1, 3];
        let mut selection = Selection::default();
        for (budget, expected) in [
            (0, vec![]),
            (1, vec![1]),
            (2, vec![1, 6]),
            (4, vec![1, 2, 3, 6]),
            (6, vec![1, 2, 3, 5, 6, 7]),
            (7, vec![0, 1, 2, 3, 5, 6, 7]),
            (8, vec![0, 1, 2, 3, 4, 5, 6, 7]),
            (20, vec![0, 1, 2, 3, 4, 5, 6, 7]),
        ] {
            let mut kept = Vec::new();
            nearest(&distances, 64, budget, &mut selection, |i| kept.push(i));
            kept.sort_unstable();
            assert_eq!(kept, expected, "budget {budget}");
        }
        // Many rows: the cut estimated from the first rows, moved out when too few are within
        // it (rows sorted by distance, or a far tail only past the sample), against a full sort.
        let mut r = rng::seeded(6, 0);
        let binomial: Vec<u16> =
            (0..50_000).map(|_| (0..64).filter(|_| rng::RngExt::random::<bool>(&mut r)).count() as u16).collect();
        let mut sorted = binomial.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let mut ties = vec![40u16; 50_000];
        ties[..20_000].iter_mut().for_each(|h| *h = 3);
        let mut tail = vec![40u16; 50_000];
        tail[45_000..].iter_mut().enumerate().for_each(|(i, h)| *h = (i % 30) as u16);
        for distances in [&binomial, &sorted, &ties, &tail] {
            for budget in [1, 10, 100, 1000, 49_999] {
                let mut reference: Vec<(u16, usize)> = distances.iter().enumerate().map(|(i, &h)| (h, i)).collect();
                reference.sort_unstable();
                let mut kept = Vec::new();
                nearest(distances, 64, budget, &mut selection, |i| kept.push(i));
                let expected: Vec<usize> = reference[..budget].iter().map(|&(_, i)| i).collect();
                assert_eq!(kept, expected, "budget {budget}");
            }
        }
    }

    #[test]
    fn recall_rises_with_the_candidate_budget_and_the_code_length() {
        // 20,000 rows in 400 clusters, 32-d, top 100 (the test task of the other indexes).
        // Measured: 0.44 / 0.62 / 0.87 at 2 / 5 / 20 candidates per result with 64 bits, 0.92
        // at 5 with 256 bits.
        let (w, q) = clustered(20_000, 32);
        let measure = |bits, f| {
            let config = HammingConfig { bits, candidate_factor: f, ..HammingConfig::default() };
            recall(&HammingIndex::build(Rows::all(&w), &config), Rows::all(&w), &q, 100)
        };
        let by_budget: Vec<f64> = [2.0, 5.0, 20.0].iter().map(|&f| measure(64, f)).collect();
        assert!(by_budget.windows(2).all(|p| p[1] > p[0]), "{by_budget:?}");
        let longer = measure(256, 5.0);
        assert!(longer > by_budget[1], "256 bits {longer} against 64 bits {}", by_budget[1]);
        assert!(by_budget[2] >= 0.85, "{by_budget:?}");
    }

    #[test]
    fn refreshed_rows_are_found_where_they_now_belong() {
        let (mut w, q) = clustered(10_000, 16);
        let mut index = HammingIndex::build(Rows::all(&w), &HammingConfig::default());
        let moved = move_rows_onto(&mut w, q.row(0));
        index.refresh(Rows::all(&w), &moved);
        assert!(!index.needs_rebuild());
        assert_exact_top(&index, &w, q.row(0), 50);
        kernels::scale(10.0, w.row_mut(3));
        index.refresh(Rows::all(&w), &[3]);
        assert!(index.needs_rebuild());
    }

    #[test]
    fn bad_parameters_name_their_key() {
        for bits in [0, 32, 96, 576] {
            let e = HammingConfig { bits, ..HammingConfig::default() }.check().unwrap_err();
            assert_eq!(e.key_and_message().0, "bits", "{bits}");
        }
        assert!(HammingConfig { bits: 128, ..HammingConfig::default() }.check().is_ok());
        let e = HammingConfig { candidate_factor: 0.5, ..HammingConfig::default() }.check().unwrap_err();
        assert_eq!(e.key_and_message().0, "candidate_factor");
    }
}
