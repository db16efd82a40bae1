//! Hits (class, score) that every rank found among its own rows, gathered over the ranks: the
//! merged top-k of a class-sharded prediction or search, ties to the lower class as one process
//! breaks them.

use crate::{Collective, DistError, starts_of};
use farout_core::topk::{Hit, descending_key};
use rayon::prelude::*;

/// Rows whose per-rank hits travel in one exchange, at most (bounds the buffers of
/// [`merge_top_k`] and [`gather_all_hits`]) ...
const MERGE_ROWS: usize = 16_384;
/// ... and hits per rank in one exchange, about (at least one row).
const MERGE_VALUES: usize = 1 << 22;

/// Every rank's top-k per row (`local[i]`: at most `k` hits, global ids) merged into the top-k
/// over all ranks, on every rank; ties go to the lower class, as
/// [`top_k`](farout_core::topk::top_k) breaks them over all
/// scores, so the result equals a one-process prediction. Every rank must pass as many rows.
pub fn merge_top_k(comm: &dyn Collective, local: Vec<Vec<Hit>>, k: usize) -> Result<Vec<Vec<Hit>>, DistError> {
    gather_hits(comm, local, k, Keep::Sorted(k))
}

/// Each rank's top-k of a row sent only to the rank that works on the row, with other values
/// for each rank ([`route_top_k`]).
#[derive(Debug, Default, PartialEq)]
pub struct Routed {
    /// The `k` best hits over all ranks of each row this rank works on (ascending row order),
    /// the hits [`merge_top_k`] keeps, in no particular order.
    pub rows: Vec<Vec<Hit>>,
    /// The `extra` values every rank sent this one, in rank order ...
    pub extra: Vec<u32>,
    /// ... `extra_counts[r]` of them from rank `r`.
    pub extra_counts: Vec<usize>,
}

/// Every rank's top-k per row (`local[i]`: at most `k` hits, global ids; every rank passes as
/// many rows) sent to the rank `dest[i]` that works on row `i`, which keeps the `k` best of the
/// row over all ranks (ties to the lower class, as [`merge_top_k`]; in no particular order):
/// one exchange in which a rank sends each row's hits once, to one rank, and merges only its
/// rows, instead of every rank gathering and merging every row. `extra[q]` (one vector per
/// rank) travels to rank `q` in the same exchange. On one rank, `local` as it is.
pub fn route_top_k(
    comm: &dyn Collective,
    local: Vec<Vec<Hit>>,
    dest: &[usize],
    k: usize,
    extra: &[Vec<u32>],
) -> Result<Routed, DistError> {
    let (ranks, me) = (comm.size(), comm.rank());
    if ranks == 1 {
        let extra = extra.first().cloned().unwrap_or_default();
        return Ok(Routed { rows: local, extra_counts: vec![extra.len()], extra });
    }
    let mine = dest.iter().filter(|&&d| d == me).count();
    let (all, all_counts) = exchange_rows(comm, &local, &|c| c, dest, k, extra)?;
    let starts = starts_of(&all_counts);
    let rows = (0..mine)
        .into_par_iter()
        .map_init(
            || (Vec::new(), Vec::new()),
            |(keys, from), i| {
                row_keys(&all, &starts, k, i, keys, from);
                best_keys(keys, Keep::Selected(k));
                keys.iter().map(|&key| hit_of_key(key)).collect()
            },
        )
        .collect();
    let width = 2 * k;
    let mut extra = Vec::new();
    let extra_counts = starts
        .iter()
        .zip(&all_counts)
        .map(|(&at, &n)| {
            extra.extend_from_slice(&all[at + mine * width..at + n]);
            n - mine * width
        })
        .collect();
    Ok(Routed { rows, extra, extra_counts })
}

/// What the rank working on a row learns from [`route_cuts`], per row of its rows.
#[derive(Debug, Default, PartialEq)]
pub struct Cuts {
    /// The [`descending_key`] of the row's `k`-th best hit over what the ranks sent
    /// (`u64::MAX` when they sent fewer than `k` together) ...
    pub cuts: Vec<u64>,
    /// ... and the ranks that sent `kept` hits of the row, all better than that cut: they may
    /// hold more, so the cut is the row's over all ranks only once they send their top `k`.
    pub ask: Vec<Vec<usize>>,
}

/// Every rank's best `kept` hits of each of its rows' top `k` (`local[i]`: at most `kept` hits,
/// of the classes `class(h.class)` over all ranks; every rank passes as many rows) sent to the
/// rank `dest[i]` that works on row `i`, which learns each of its rows' cut (ascending row
/// order): the [`descending_key`] of the `k`-th best hit over all ranks, as a hit is among the
/// `k` that [`route_top_k`] keeps exactly when its key is at most the cut, so its rank can tell
/// its own surviving hits from the cut alone. With `kept < k` a rank sends only the head of its
/// list (where a rank holds `1 / P` of the row's best in expectation): the cut is exact unless
/// [`Cuts::ask`] names a rank for the row. On one rank, `local`'s own.
pub fn route_cuts(
    comm: &dyn Collective,
    local: &[Vec<Hit>],
    class: &(dyn Fn(u32) -> u32 + Sync),
    dest: &[usize],
    k: usize,
    kept: usize,
) -> Result<Cuts, DistError> {
    // A row's keys from every rank (`from[r]..from[r + 1]` from rank r) -> its cut and the
    // ranks whose list may stop short of it (`full`: scratch, the ranks that sent `kept`).
    let cut = |keys: &mut Vec<u64>, from: &[usize], full: &mut Vec<(usize, u64)>| {
        full.clear();
        if kept < k {
            let sent = |r: usize| &keys[from[r]..from[r + 1]];
            let worst = |r: usize| sent(r).iter().copied().max().unwrap_or(0);
            full.extend((0..from.len() - 1).filter(|&r| sent(r).len() == kept).map(|r| (r, worst(r))));
        }
        let cut = match keys.len() >= k && k > 0 {
            true => *keys.select_nth_unstable(k - 1).1,
            false => u64::MAX,
        };
        (cut, full.iter().filter(|&&(_, worst)| worst < cut).map(|&(r, _)| r).collect::<Vec<_>>())
    };
    let mut out = Cuts::default();
    if comm.size() == 1 {
        let (mut keys, mut full) = (Vec::new(), Vec::new());
        for hits in local {
            keys.clear();
            keys.extend(hits.iter().map(|h| descending_key(h.score, class(h.class))));
            let from = [0, keys.len()];
            let (c, ask) = cut(&mut keys, &from, &mut full);
            out.cuts.push(c);
            out.ask.push(ask);
        }
        return Ok(out);
    }
    let mine = dest.iter().filter(|&&d| d == comm.rank()).count();
    let (all, all_counts) = exchange_rows(comm, local, class, dest, kept, &[])?;
    let starts = starts_of(&all_counts);
    (out.cuts, out.ask) = (0..mine)
        .into_par_iter()
        .map_init(
            || (Vec::new(), Vec::new(), Vec::new()),
            |(keys, from, full), i| {
                row_keys(&all, &starts, kept, i, keys, from);
                cut(keys, from, full)
            },
        )
        .unzip();
    Ok(out)
}

/// The one exchange of [`route_top_k`] and [`route_cuts`]: row `i`'s hits (at most `k`, of the
/// classes `class(h.class)`) as keys padded to `k` to rank `dest[i]`, then `extra[q]` to rank
/// `q`. Returns what this rank received and how much from each rank.
fn exchange_rows(
    comm: &dyn Collective,
    local: &[Vec<Hit>],
    class: &(dyn Fn(u32) -> u32 + Sync),
    dest: &[usize],
    k: usize,
    extra: &[Vec<u32>],
) -> Result<(Vec<u32>, Vec<usize>), DistError> {
    let ranks = comm.size();
    let width = 2 * k; // a padded row: k keys of two u32
    let extras: usize = extra.iter().take(ranks).map(Vec::len).sum();
    let (mut send, mut counts) = (Vec::with_capacity(local.len() * width + extras), Vec::with_capacity(ranks));
    for q in 0..ranks {
        let at = send.len();
        for hits in local.iter().zip(dest).filter(|(_, d)| **d == q).map(|(h, _)| h) {
            // Padded to `k` (PAD, PAD: the key u64::MAX): a rank may hold fewer hits.
            let row = send.len();
            send.resize(row + width, PAD);
            for (pair, h) in send[row..].chunks_exact_mut(2).zip(hits.iter().take(k)) {
                let key = descending_key(h.score, class(h.class));
                pair.copy_from_slice(&[key as u32, (key >> 32) as u32]);
            }
        }
        send.extend_from_slice(extra.get(q).map_or(&[][..], Vec::as_slice));
        counts.push(send.len() - at);
    }
    let (mut all, mut all_counts) = (Vec::new(), Vec::new());
    comm.alltoallv_u32(&send, &counts, &mut all, &mut all_counts)?;
    Ok((all, all_counts))
}

/// Row `i` of this rank's rows, as every rank sent it in [`exchange_rows`], into `keys`, rank
/// `r`'s from `from[r]` to `from[r + 1]`.
fn row_keys(all: &[u32], starts: &[usize], k: usize, i: usize, keys: &mut Vec<u64>, from: &mut Vec<usize>) {
    let width = 2 * k;
    keys.clear();
    from.clear();
    for &at in starts {
        from.push(keys.len());
        let pairs = all[at + i * width..at + (i + 1) * width].chunks_exact(2).take_while(|p| p[0] != PAD);
        keys.extend(pairs.map(|p| u64::from(p[0]) | (u64::from(p[1]) << 32)));
    }
    from.push(keys.len());
}

/// Every rank's hits per row (global ids) gathered on every rank: each row's hits over all
/// ranks, best first (ties to the lower class); on one rank, `local` as it is. Every rank must
/// pass as many rows. Also returns the hits each rank sent per row (the most any rank holds).
pub fn gather_all_hits(comm: &dyn Collective, local: Vec<Vec<Hit>>) -> Result<(Vec<Vec<Hit>>, usize), DistError> {
    let mut width = [local.iter().map(Vec::len).max().unwrap_or(0) as f64];
    if comm.size() == 1 {
        return Ok((local, width[0] as usize));
    }
    comm.allreduce_max_f64(&mut width)?;
    let width = width[0] as usize;
    Ok((gather_hits(comm, local, width, Keep::Sorted(usize::MAX))?, width))
}

/// Which of a row's gathered hits [`gather_hits`] and [`route_top_k`] keep.
#[derive(Clone, Copy)]
enum Keep {
    /// The best `n`, best first.
    Sorted(usize),
    /// The best `n`, in no particular order (the same on every rank).
    Selected(usize),
}

/// Every rank's at most `width` hits per row gathered on every rank, cut to what `keep` says.
///
/// A hit travels as its key `descending_key(score, class)` (two `u32`: the class, then the
/// score's half of the key), whose ascending order is
/// [`by_score`](farout_core::topk::by_score)'s: a row's hits over the
/// ranks are cut by selecting on integers, and sorted (when `keep` asks) by sorting them.
fn gather_hits(
    comm: &dyn Collective,
    local: Vec<Vec<Hit>>,
    width: usize,
    keep: Keep,
) -> Result<Vec<Vec<Hit>>, DistError> {
    let ranks = comm.size();
    if ranks == 1 || width == 0 {
        return Ok(local);
    }
    let mut merged = Vec::with_capacity(local.len());
    let (mut send, mut all) = (Vec::new(), Vec::new());
    // Rows per exchange: at most MERGE_ROWS, and about MERGE_VALUES values from each rank.
    let rows = (MERGE_VALUES / (2 * width)).clamp(1, MERGE_ROWS);
    for chunk in local.chunks(rows) {
        send.clear();
        for hits in chunk {
            // Padded to `width`: a rank may hold fewer hits.
            let keys = hits.iter().map(|h| descending_key(h.score, h.class)).chain(std::iter::repeat(u64::MAX));
            send.extend(keys.take(width).flat_map(|key| [key as u32, (key >> 32) as u32]));
        }
        all.resize(send.len() * ranks, 0);
        comm.allgather_u32(&send, &mut all)?;
        let (per_rank, all) = (send.len(), &all);
        let rows_merged: Vec<Vec<Hit>> = (0..chunk.len())
            .into_par_iter()
            .map_init(Vec::new, |keys, i| {
                keys.clear();
                for r in 0..ranks {
                    let at = r * per_rank + 2 * i * width;
                    let pairs = all[at..at + 2 * width].chunks_exact(2).take_while(|p| p[0] != PAD);
                    keys.extend(pairs.map(|p| u64::from(p[0]) | (u64::from(p[1]) << 32)));
                }
                best_keys(keys, keep);
                keys.iter().map(|&key| hit_of_key(key)).collect()
            })
            .collect();
        merged.extend(rows_merged);
    }
    Ok(merged)
}

/// The class that pads a rank's list of a row to the common width (no class has it).
const PAD: u32 = u32::MAX;

/// Cuts `keys` (a row's hits as keys) to the best of `keep`, sorted if it asks.
fn best_keys(keys: &mut Vec<u64>, keep: Keep) {
    let (Keep::Sorted(n) | Keep::Selected(n)) = keep;
    if keys.len() > n {
        if n > 0 {
            keys.select_nth_unstable(n - 1);
        }
        keys.truncate(n);
    }
    if let Keep::Sorted(_) = keep {
        keys.sort_unstable();
    }
}

/// The hit whose [`descending_key`] is `key`.
fn hit_of_key(key: u64) -> Hit {
    // descending_key keeps the class in the low half and the complement of the score's
    // ascending bits in the high half: a set top bit of those marks a positive score.
    let ascending = !((key >> 32) as u32);
    let bits = if ascending >> 31 == 1 { ascending & 0x7fff_ffff } else { !ascending };
    Hit { class: key as u32, score: f32::from_bits(bits) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Local, Threads};
    use farout_core::topk::by_score;

    /// The hits of ranks that hold every third class: each rank's top-k over its own classes.
    fn rank_hits(rank: usize, ranks: usize, scores: &[Vec<f32>], k: usize) -> Vec<Vec<Hit>> {
        scores
            .iter()
            .map(|row| {
                let own = row.iter().enumerate().filter(|(c, _)| c % ranks == rank);
                let mut hits: Vec<Hit> = own.map(|(c, &score)| Hit { class: c as u32, score }).collect();
                hits.sort_unstable_by(by_score);
                hits.truncate(k);
                hits
            })
            .collect()
    }

    #[test]
    fn a_hit_travels_as_its_key() {
        for score in
            [0.0, -0.0, 1.5, -2.25, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE, -1e-30, f32::NAN, -f32::NAN]
        {
            let h = Hit { class: 77, score };
            assert_eq!(hit_of_key(descending_key(score, 77)).score.to_bits(), h.score.to_bits(), "{score}");
            assert_eq!(hit_of_key(descending_key(score, 77)).class, 77);
        }
    }

    #[test]
    fn the_merged_top_k_of_the_ranks_is_the_top_k_of_all_classes() {
        // Few distinct scores, so that ties between ranks are common.
        let scores: Vec<Vec<f32>> = (0..50).map(|i| (0..40).map(|c| ((i * 7 + c * 13) % 5) as f32).collect()).collect();
        let k = 6;
        let want = rank_hits(0, 1, &scores, k);
        assert_eq!(merge_top_k(&Local, want.clone(), k).unwrap(), want);
        for ranks in [2, 3] {
            let got = Threads::run(ranks, |c| merge_top_k(c, rank_hits(c.rank(), ranks, &scores, k), k).unwrap());
            assert!(got.iter().all(|g| g == &want), "{ranks} ranks");
            let all = Threads::run(ranks, |c| gather_all_hits(c, rank_hits(c.rank(), ranks, &scores, 40)).unwrap());
            assert!(all.iter().all(|(g, _)| g == &rank_hits(0, 1, &scores, 40)), "{ranks} ranks, every hit");
        }
    }

    /// Routed, each row's merged hits reach only the rank that works on it: the hits of the
    /// ordered merge (ties at the cut included), whatever order the ranks' lists come in, with
    /// each rank's extra values.
    #[test]
    fn routed_rows_reach_their_rank_with_the_top_k_of_all_classes() {
        let scores: Vec<Vec<f32>> = (0..50).map(|i| (0..40).map(|c| ((i * 7 + c * 13) % 5) as f32).collect()).collect();
        for k in [1, 6, 25] {
            let want = rank_hits(0, 1, &scores, k);
            let one = route_top_k(&Local, want.clone(), &[0; 50], k, &[vec![9]]).unwrap();
            assert_eq!(one, Routed { rows: want.clone(), extra: vec![9], extra_counts: vec![1] });
            for ranks in [2, 3] {
                // Row i goes to rank (i / 7) % ranks; rank r sends rank q the values [r, q].
                let dest: Vec<usize> = (0..50).map(|i| (i / 7) % ranks).collect();
                let got = Threads::run(ranks, |c| {
                    let mut mine = rank_hits(c.rank(), ranks, &scores, k);
                    mine.iter_mut().for_each(|hits| hits.reverse());
                    let extra: Vec<Vec<u32>> = (0..ranks).map(|q| vec![c.rank() as u32, q as u32]).collect();
                    route_top_k(c, mine, &dest, k, &extra).unwrap()
                });
                for (q, routed) in got.iter().enumerate() {
                    let at = format!("{ranks} ranks, k {k}, rank {q}");
                    let rows = (0..50).filter(|&i| dest[i] == q);
                    let mut sorted = routed.rows.clone();
                    sorted.iter_mut().for_each(|hits| hits.sort_unstable_by(by_score));
                    assert_eq!(sorted, rows.map(|i| want[i].clone()).collect::<Vec<_>>(), "{at}");
                    let extra: Vec<u32> = (0..ranks as u32).flat_map(|r| [r, q as u32]).collect();
                    assert_eq!((&routed.extra, &routed.extra_counts), (&extra, &vec![2; ranks]), "{at}");
                }
            }
        }
    }

    /// A row's cut is the key of its k-th best hit over all ranks (none below k hits), on the
    /// rank working on it, whatever order the ranks' lists come in; each rank sending only its
    /// best `kept`, a cut is that unless the rows name a rank to ask for more.
    #[test]
    fn routed_cuts_are_the_kth_best_key_of_all_classes_or_ask_for_more() {
        let scores: Vec<Vec<f32>> = (0..50).map(|i| (0..40).map(|c| ((i * 7 + c * 13) % 5) as f32).collect()).collect();
        for (k, kept) in [(1, 1), (6, 6), (25, 25), (41, 41), (6, 2), (25, 9), (41, 12)] {
            let all = rank_hits(0, 1, &scores, k);
            let want: Vec<u64> =
                all.iter().map(|hits| hits.get(k - 1).map_or(u64::MAX, |h| descending_key(h.score, h.class))).collect();
            if kept == k {
                let one = route_cuts(&Local, &all, &|c| c, &[0; 50], k, kept).unwrap();
                assert_eq!(one, Cuts { cuts: want.clone(), ask: vec![vec![]; 50] }, "k {k}");
            }
            for ranks in [2, 3] {
                let dest: Vec<usize> = (0..50).map(|i| (i / 7) % ranks).collect();
                let got = Threads::run(ranks, |c| {
                    // Each rank's best `kept`, as its local ids (global = local * ranks + rank).
                    let mut mine = rank_hits(c.rank(), ranks, &scores, kept);
                    mine.iter_mut().flatten().for_each(|h| h.class /= ranks as u32);
                    mine.iter_mut().for_each(|hits| hits.reverse());
                    let (ranks32, me) = (ranks as u32, c.rank() as u32);
                    let global = move |l: u32| l * ranks32 + me;
                    route_cuts(c, &mine, &global, &dest, k, kept).unwrap()
                });
                let mut asked = 0;
                for (q, got) in got.iter().enumerate() {
                    let rows: Vec<usize> = (0..50).filter(|&i| dest[i] == q).collect();
                    for (n, &i) in rows.iter().enumerate() {
                        let at = format!("{ranks} ranks, k {k}, kept {kept}, row {i}");
                        // Every rank holding more than `kept` of the row's best k is asked (no
                        // rank is when each sent its whole top k) ...
                        let holds = |r: usize| all[i].iter().filter(|h| h.class as usize % ranks == r).count();
                        let short: Vec<usize> = (0..ranks).filter(|&r| holds(r) > kept).collect();
                        assert!(short.iter().all(|r| got.ask[n].contains(r)), "{at}: {short:?}, {:?}", got.ask[n]);
                        assert!(kept < k || got.ask[n].is_empty(), "{at}: asks {:?}", got.ask[n]);
                        // ... and where none is, the cut is the row's.
                        if got.ask[n].is_empty() {
                            assert_eq!(got.cuts[n], want[i], "{at}");
                        }
                        asked += got.ask[n].len();
                    }
                }
                assert!(kept == k || asked > 0, "{ranks} ranks, k {k}, kept {kept}: some row asks for more");
            }
        }
    }
}
