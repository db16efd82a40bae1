//! MPI self-test of farout-dist: every collective, on every rank, against the result each rank
//! computes by itself (every rank knows what every rank contributes: rank `r` of `P` contributes
//! values given by a formula of `r`). Exits non-zero if any rank saw a mismatch.
//!
//! ```text
//! cargo build --release -p farout-dist --features mpi
//! mpirun --allow-run-as-root --oversubscribe -np 4 target/release/farout-mpi-selftest
//! ```
//!
//! Rank 0's summary line also gives the mean time of the collectives a training step makes
//! ([`timings`]); `--mca btl tcp,self` measures them over TCP instead of shared memory
//! (docs/scaling.md).
//!
//! With `FAROUT_SELFTEST_BREAK=1` in the environment the last rank contributes one wrong value,
//! and the run must fail (the test of the test).

use std::process::ExitCode;
use std::time::Instant;

use farout_dist::{Collective, DistError, Shards};

/// Failures seen by this rank.
struct Checks {
    rank: usize,
    run: usize,
    failed: Vec<String>,
}

impl Checks {
    fn check(&mut self, name: &str, ok: bool, detail: impl FnOnce() -> String) {
        self.run += 1;
        if !ok {
            self.failed.push(format!("rank {}: {name}: {}", self.rank, detail()));
        }
    }

    fn equal<T: PartialEq + std::fmt::Debug>(&mut self, name: &str, got: &[T], want: &[T]) {
        let first_diff = got.iter().zip(want).position(|(g, w)| g != w);
        self.check(name, got.len() == want.len() && first_diff.is_none(), || match first_diff {
            Some(i) => format!("element {i}: got {:?}, want {:?}", got[i], want[i]),
            None => format!("length {} instead of {}", got.len(), want.len()),
        });
    }

    fn ok(&mut self, name: &str, result: Result<(), DistError>) {
        self.check(name, result.is_ok(), || format!("{:?}", result.err()));
    }

    fn err(&mut self, name: &str, result: Result<(), DistError>, want: &DistError) {
        self.check(name, result.as_ref().err() == Some(want), || format!("got {result:?}, want Err({want:?})"));
    }
}

fn sum_f64(p: usize, i: usize) -> f64 {
    // Small integers and quarters: exact in f64 whatever the reduction order.
    (0..p).map(|q| value_f64(q, i)).sum()
}
fn value_f64(r: usize, i: usize) -> f64 {
    (r + 1) as f64 * (i % 97) as f64 + 0.25 * r as f64
}
fn value_f32(r: usize, i: usize) -> f32 {
    ((r + 1) * (i % 13)) as f32
}
fn value_u64(r: usize, i: usize) -> u64 {
    ((r as u64 + 1) << 40) + i as u64
}
fn max_value(r: usize, i: usize) -> f64 {
    if i == 0 { f64::NEG_INFINITY } else { ((i * 7 + r * 13) % 29) as f64 - 14.0 }
}
/// The global score of class `k` in the sharded-softmax check.
fn score(k: usize) -> f32 {
    ((k * 7919) % 1009) as f32 * 0.02 - 10.0
}

fn run(c: &dyn Collective) -> Checks {
    let (rank, p) = (c.rank(), c.size());
    let mut t = Checks { rank, run: 0, failed: Vec::new() };
    // FAROUT_SELFTEST_BREAK=1 makes the last rank contribute a wrong value to one reduction, to
    // check that the self-test does catch (and report) a mismatch.
    let broken = std::env::var_os("FAROUT_SELFTEST_BREAK").is_some() && rank + 1 == p;
    // Every rank calls the collectives in this order.
    check_detect(&mut t, c);
    check_sums(&mut t, c, broken);
    check_maxima(&mut t, c);
    check_gathers(&mut t, c);
    check_alltoallv(&mut t, c);
    check_broadcasts(&mut t, c);
    check_mismatched_calls(&mut t, c);
    check_sharded_log_sum_exp(&mut t, c);
    check_sharded_top_k(&mut t, c);
    t.ok("barrier", c.barrier());
    t
}

/// The launcher's environment agrees with MPI.
fn check_detect(t: &mut Checks, c: &dyn Collective) {
    let (rank, p) = (c.rank(), c.size());
    match farout_dist::detect() {
        Ok(Some(launch)) => t.check("detect", launch.rank == rank && launch.size == p, || {
            format!("{launch:?} but MPI says rank {rank} of {p}")
        }),
        other => t.check("detect", p == 1, || format!("{other:?} under {p} ranks")),
    }
}

/// Sums of f64 (with one wrong value from the last rank when `broken`), f32 and u64.
fn check_sums(t: &mut Checks, c: &dyn Collective, broken: bool) {
    let (rank, p) = (c.rank(), c.size());
    for n in [0, 1, 1000, 1 << 18] {
        let mut a: Vec<f64> = (0..n).map(|i| value_f64(rank, i)).collect();
        if broken && n > 0 {
            a[n - 1] += 1.0;
        }
        t.ok("allreduce_sum_f64", c.allreduce_sum_f64(&mut a));
        let want: Vec<f64> = (0..n).map(|i| sum_f64(p, i)).collect();
        t.equal(&format!("allreduce_sum_f64 n={n}"), &a, &want);
    }
    let mut a: Vec<f32> = (0..777).map(|i| value_f32(rank, i)).collect();
    t.ok("allreduce_sum_f32", c.allreduce_sum_f32(&mut a));
    let want: Vec<f32> = (0..777).map(|i| (0..p).map(|q| value_f32(q, i)).sum()).collect();
    t.equal("allreduce_sum_f32", &a, &want);
    let mut a: Vec<u64> = (0..50).map(|i| value_u64(rank, i)).collect();
    t.ok("allreduce_sum_u64", c.allreduce_sum_u64(&mut a));
    let want: Vec<u64> = (0..50).map(|i| (0..p).map(|q| value_u64(q, i)).sum()).collect();
    t.equal("allreduce_sum_u64", &a, &want);
}

/// Maxima (with -inf everywhere at index 0).
fn check_maxima(t: &mut Checks, c: &dyn Collective) {
    let (rank, p) = (c.rank(), c.size());
    let mut a: Vec<f64> = (0..300).map(|i| max_value(rank, i)).collect();
    t.ok("allreduce_max_f64", c.allreduce_max_f64(&mut a));
    let want: Vec<f64> = (0..300).map(|i| (0..p).map(|q| max_value(q, i)).fold(f64::NEG_INFINITY, f64::max)).collect();
    t.equal("allreduce_max_f64", &a, &want);
    let mut a: Vec<f32> = (0..300).map(|i| max_value(rank, i) as f32).collect();
    t.ok("allreduce_max_f32", c.allreduce_max_f32(&mut a));
    let want: Vec<f32> = want.iter().map(|&x| x as f32).collect();
    t.equal("allreduce_max_f32", &a, &want);
}

/// allgatherv of f32 and u32 (with empty contributions, rows in global order) and allgather.
fn check_gathers(t: &mut Checks, c: &dyn Collective) {
    let (rank, p) = (c.rank(), c.size());
    // allgatherv: rank r contributes r + 1 values r * 1000 + j.
    let counts: Vec<usize> = (0..p).map(|q| q + 1).collect();
    let send: Vec<f32> = (0..=rank).map(|j| (rank * 1000 + j) as f32).collect();
    let want: Vec<f32> = (0..p).flat_map(|q| (0..=q).map(move |j| (q * 1000 + j) as f32)).collect();
    let mut out = vec![f32::NAN; want.len()];
    t.ok("allgatherv_f32", c.allgatherv_f32(&send, &counts, &mut out));
    t.equal("allgatherv_f32 r+1 values", &out, &want);

    // allgatherv with empty contributions (3 rows over p ranks) and rows in global order.
    for (name, shards) in [
        ("allgatherv_u32 even 3 rows", Shards::even(3, p).unwrap()),
        ("allgatherv_u32 even 1001 rows", Shards::even(1001, p).unwrap()),
        (
            "allgatherv_u32 balanced",
            Shards::balanced(&(0..500u64).map(|k| 1000 / (k + 1)).collect::<Vec<_>>(), p).unwrap(),
        ),
    ] {
        let send: Vec<u32> = shards.range(rank).map(|k| k as u32).collect();
        let mut out = vec![u32::MAX; shards.rows()];
        t.ok(name, c.allgatherv_u32(&send, &shards.counts(), &mut out));
        let want: Vec<u32> = (0..shards.rows() as u32).collect();
        t.equal(name, &out, &want);
    }
    let mut out = vec![0u32; 2 * p];
    t.ok("allgather_u32", c.allgather_u32(&[rank as u32, 7], &mut out));
    let want: Vec<u32> = (0..p as u32).flat_map(|q| [q, 7]).collect();
    t.equal("allgather_u32", &out, &want);
}

/// alltoallv: rank r sends rank q the `(r + 2 q) % 3` values `r * 1000 + q * 10 + j` (none to
/// some ranks), so every rank receives from each rank a count it did not know in advance.
fn check_alltoallv(t: &mut Checks, c: &dyn Collective) {
    let (rank, p) = (c.rank(), c.size());
    let n = |r: usize, q: usize| (r + 2 * q) % 3;
    let value = |r: usize, q: usize, j: usize| (r * 1000 + q * 10 + j) as u32;
    let counts: Vec<usize> = (0..p).map(|q| n(rank, q)).collect();
    let send: Vec<u32> = (0..p).flat_map(|q| (0..n(rank, q)).map(move |j| value(rank, q, j))).collect();
    let (mut out, mut out_counts) = (vec![7u32; 3], Vec::new());
    t.ok("alltoallv_u32", c.alltoallv_u32(&send, &counts, &mut out, &mut out_counts));
    let want: Vec<u32> = (0..p).flat_map(|r| (0..n(r, rank)).map(move |j| value(r, rank, j))).collect();
    t.equal("alltoallv_u32 values", &out, &want);
    t.equal("alltoallv_u32 counts", &out_counts, &(0..p).map(|r| n(r, rank)).collect::<Vec<_>>());
    t.ok("alltoallv_u32 empty", c.alltoallv_u32(&[], &vec![0; p], &mut out, &mut out_counts));
    t.equal("alltoallv_u32 empty", &out, &[]);
}

/// Broadcasts: from the first, the last and a middle rank; receivers start with junk of
/// another length; an empty payload; a large one.
fn check_broadcasts(t: &mut Checks, c: &dyn Collective) {
    let (rank, p) = (c.rank(), c.size());
    let payload = |root: usize, len: usize| -> Vec<u8> { (0..len).map(|i| (i * 31 + root * 7) as u8).collect() };
    for (root, len) in [(0, 32), (p - 1, 100_000), (p / 2, 0)] {
        let mut buf = if rank == root { payload(root, len) } else { vec![0xAA; rank * 3] };
        t.ok("broadcast_bytes", c.broadcast_bytes(root, &mut buf));
        t.equal(&format!("broadcast_bytes root={root} len={len}"), &buf, &payload(root, len));
    }
}

/// Mismatched calls fail on every rank alike, before communicating (so nothing hangs).
fn check_mismatched_calls(t: &mut Checks, c: &dyn Collective) {
    let (rank, p) = (c.rank(), c.size());
    let mut buf = vec![1u8];
    t.err("bad root", c.broadcast_bytes(p, &mut buf), &DistError::BadRoot { root: p, size: p });
    let mut out = vec![0f32; p + 1];
    t.err(
        "counts of the wrong length",
        c.allgatherv_f32(&[1.0], &vec![1; p + 1], &mut out),
        &DistError::CountsLength { got: p + 1, size: p },
    );
    t.err(
        "counts not summing to the output",
        c.allgatherv_f32(&[1.0], &vec![1; p], &mut out),
        &DistError::OutLength { out: p + 1, total: p },
    );
    t.err(
        "send length not this rank's count",
        c.allgatherv_f32(&[1.0, 2.0], &vec![1; p], &mut out[..p]),
        &DistError::SendLength { rank, send: 2, count: 1 },
    );
}

/// Classes of the sharded-softmax checks.
const SHARDED_K: usize = 1001;

/// What the sharded softmax layer will do, part 1: log-sum-exp over K classes sharded over the
/// ranks, against the same computed over all K classes on every rank.
fn check_sharded_log_sum_exp(t: &mut Checks, c: &dyn Collective) {
    let (rank, p, k) = (c.rank(), c.size(), SHARDED_K);
    let shards = Shards::even(k, p).unwrap();
    let local: Vec<f32> = shards.range(rank).map(score).collect();
    let mut m = [local.iter().copied().fold(f32::NEG_INFINITY, f32::max)];
    t.ok("lse max", c.allreduce_max_f32(&mut m));
    let mut s = [local.iter().map(|&z| f64::from(z - m[0]).exp()).sum::<f64>()];
    t.ok("lse sum", c.allreduce_sum_f64(&mut s));
    let lse = f64::from(m[0]) + s[0].ln();
    let all: Vec<f32> = (0..k).map(score).collect();
    let gm = all.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exact = f64::from(gm) + all.iter().map(|&z| f64::from(z - gm).exp()).sum::<f64>().ln();
    t.check("sharded log-sum-exp", (lse - exact).abs() < 1e-9, || format!("{lse} vs {exact}"));
}

/// Part 2: the top-3 over the same sharded classes, from each rank's top-3 gathered and merged.
fn check_sharded_top_k(t: &mut Checks, c: &dyn Collective) {
    let (rank, p, k) = (c.rank(), c.size(), SHARDED_K);
    let shards = Shards::even(k, p).unwrap();
    let top = 3;
    let mut ids: Vec<usize> = shards.range(rank).collect();
    ids.sort_by(|&a, &b| score(b).total_cmp(&score(a)).then(a.cmp(&b)));
    ids.truncate(top);
    let counts: Vec<usize> = (0..p).map(|q| shards.len(q).min(top)).collect();
    let total = counts.iter().sum();
    let (mut scores, mut classes) = (vec![0f32; total], vec![0u32; total]);
    let send_s: Vec<f32> = ids.iter().map(|&i| score(i)).collect();
    let send_c: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
    t.ok("top-k scores", c.allgatherv_f32(&send_s, &counts, &mut scores));
    t.ok("top-k classes", c.allgatherv_u32(&send_c, &counts, &mut classes));
    let mut merged: Vec<(f32, u32)> = scores.into_iter().zip(classes).collect();
    merged.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut want: Vec<usize> = (0..k).collect();
    want.sort_by(|&a, &b| score(b).total_cmp(&score(a)).then(a.cmp(&b)));
    let got: Vec<usize> = merged.iter().take(top).map(|&(_, c)| c as usize).collect();
    t.equal("sharded top-3", &got, &want[..top]);
}

/// Mean seconds of `reps` calls of `op`, after one call to warm up.
fn mean_seconds(reps: u32, mut op: impl FnMut()) -> f64 {
    op();
    let t0 = Instant::now();
    (0..reps).for_each(|_| op());
    t0.elapsed().as_secs_f64() / f64::from(reps)
}

/// The time of an allreduce of one f64 (the latency), of `dL/dphi` at B = 256, D = 128
/// (32,768 f32, 128 KiB) and of the allgather of LDGS's merge at face-synthetic-ldgs.toml's
/// settings (every block's top-Q: 8 B n_b Q = 1.43 MB per rank, as 358,400 f32).
fn timings(c: &dyn Collective) -> String {
    let mut one = [1.0f64];
    let small = mean_seconds(200, || {
        let _ = c.allreduce_sum_f64(&mut one);
    });
    let mut dphi = vec![0.5f32; 256 * 128];
    let reduce = mean_seconds(50, || {
        let _ = c.allreduce_sum_f32(&mut dphi);
    });
    let send = vec![0.25f32; 8 * 256 * 2 * 350 / 4];
    let mut out = vec![0f32; send.len() * c.size()];
    let gather = mean_seconds(20, || {
        let _ = c.allgather_f32(&send, &mut out);
    });
    format!(
        "allreduce(1 f64) {:.1} us; allreduce(32768 f32) {:.1} us; allgather(358400 f32 per rank) {:.1} us",
        small * 1e6,
        reduce * 1e6,
        gather * 1e6
    )
}

fn main() -> ExitCode {
    let start = Instant::now();
    // Default: `init()`, so that even `-np 1` goes through MPI. `--connect`: the path farout's
    // CLI takes, `connect()` (MPI when the launcher started several ranks, `Local` otherwise).
    let via_connect = std::env::args().skip(1).any(|a| a == "--connect");
    let (c, version): (Box<dyn Collective>, String) = if via_connect {
        match farout_dist::connect() {
            Ok(c) => (c, "via connect()".into()),
            Err(e) => {
                eprintln!("farout-mpi-selftest: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        match farout_dist::init() {
            Ok(mpi) => {
                let version = mpi.library_version().lines().next().unwrap_or("").trim().to_owned();
                (Box::new(mpi), version)
            }
            Err(e) => {
                eprintln!("farout-mpi-selftest: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
    let checks = run(&*c);
    for f in &checks.failed {
        eprintln!("FAIL {f}");
    }

    // Times of the collectives a training step makes, and failures summed over the ranks.
    let times = timings(&*c);
    let mut failed = [checks.failed.len() as u64, checks.run as u64];
    let summed = c.allreduce_sum_u64(&mut failed);
    if c.is_root() {
        println!(
            "farout-mpi-selftest: {} ranks, {} checks, {} failed; {times}; {:.3} s; {version}",
            c.size(),
            failed[1],
            failed[0],
            start.elapsed().as_secs_f64(),
        );
    }
    let ok = summed.is_ok() && failed[0] == 0;
    drop(c); // MPI_Finalize before exiting
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
