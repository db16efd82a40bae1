//! Collective communication for farout: one process, or MPI ranks.
//!
//! farout scales out by sharding the output layer over classes: each of `P` ranks owns every
//! P-th row of W (see [`Strided`]; linear solvers split labels into contiguous [`Shards`]),
//! scores only those, and the ranks combine per-shard partial results with a handful of collectives — the max and the sum of exponentials
//! for softmax ([`Collective::allreduce_max_f32`], [`Collective::allreduce_sum_f64`]), the per-shard
//! top-Q of a search ([`Collective::allgatherv_f32`] / [`Collective::allgatherv_u32`]), the sum
//! of `dL/dphi` ([`Collective::allreduce_sum_f32`]), and a broadcast of bytes for a config hash
//! or checkpoint metadata ([`Collective::broadcast_bytes`]).
//!
//! # Design
//!
//! - **One small, object-safe trait.** Sharded code is written once against
//!   `&dyn Collective` (or a generic `C: Collective`). [`Local`] is the single-process
//!   implementation: every operation is the identity (a reduction over one rank), so the sharded
//!   code is unit-tested without MPI, and a run without `mpirun` takes exactly that path.
//! - **MPI behind the cargo feature `mpi`** (rsmpi 0.8 over the system's Open MPI). The default
//!   build links no MPI and compiles no C. [`detect`] reads the launcher's environment variables
//!   (`OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`) without touching MPI, so a default build started by
//!   `mpirun -np 4` refuses to run four independent copies and says how to rebuild
//!   ([`connect`]).
//! - **Slices in, results in place.** Reductions overwrite their input slice; gathers write into a
//!   caller-owned buffer whose layout ([`Shards::counts`]) every rank knows. Nothing is allocated
//!   per call by [`Local`]; the MPI implementation reuses one scratch buffer per element type.
//! - **Mismatched calls are errors, not panics.** Arguments are checked locally *before* any
//!   communication (counts against buffer lengths, the root against the size, lengths against
//!   MPI's `int` counts), so when every rank makes the same mistake every rank gets the same
//!   [`DistError`] and none is left waiting in a collective. What cannot be checked locally —
//!   ranks calling different collectives, or reductions of different lengths — is a program
//!   bug that MPI reports by aborting the job.
//! - **A rank that dies stops the job.** [`connect`] wraps MPI in [`Watched`]: while a rank
//!   waits in a collective, a thread checks that the ranks on its machine are alive, and a
//!   collective kept waiting [`GRACE`] by a lost rank stops this one with a message naming it
//!   (Open MPI's `mpirun` usually aborts the job first; other launchers may not).
//! - **Threads.** The trait has no `Send`/`Sync` bound: an MPI communicator belongs to the thread
//!   that initialised MPI (`MPI_THREAD_FUNNELED`), and `MpiCollective` is neither `Send` nor
//!   `Sync`, so the compiler keeps collectives on that thread. rayon workers compute; the main
//!   thread communicates.
//!
//! ```
//! use farout_dist::{Collective, Local, Shards};
//!
//! /// log(sum_k exp(z_k)) over classes sharded over the ranks: written once, runs on any `Collective`.
//! fn log_sum_exp(c: &dyn Collective, local_scores: &[f32]) -> Result<f64, farout_dist::DistError> {
//!     let mut m = [local_scores.iter().copied().fold(f32::NEG_INFINITY, f32::max)];
//!     c.allreduce_max_f32(&mut m)?;
//!     let mut s = [local_scores.iter().map(|&z| f64::from(z - m[0]).exp()).sum::<f64>()];
//!     c.allreduce_sum_f64(&mut s)?;
//!     Ok(f64::from(m[0]) + s[0].ln())
//! }
//!
//! let c = Local; // or farout_dist::connect()? under mpirun
//! let scores = [0.5f32, -1.0, 2.0, 0.0];
//! let shards = Shards::even(scores.len(), c.size())?;
//! let lse = log_sum_exp(&c, &scores[shards.range(c.rank())])?;
//! assert!((lse - 2.342_35).abs() < 1e-5);
//! # Ok::<(), farout_dist::DistError>(())
//! ```
//!
//! # Launch
//!
//! `mpirun -np P farout train CONFIG`: [`connect`] sees the launcher's variables and, when built
//! with `--features mpi`, initialises MPI; otherwise (or with `-np 1`) it returns [`Local`]. Only
//! the rank for which [`Collective::is_root`] holds should print progress and summaries.

#![warn(missing_docs)]

mod error;
mod hits;
mod launch;
mod local;
#[cfg(feature = "mpi")]
mod mpi_impl;
mod parts;
mod shards;
mod strided;
mod threads;
mod watchdog;

pub use error::DistError;
pub use hits::{Cuts, Routed, gather_all_hits, merge_top_k, route_cuts, route_top_k};
pub use launch::{Launch, connect, detect, detect_from};
pub use local::Local;
#[cfg(feature = "mpi")]
pub use mpi_impl::{MpiCollective, init};
pub use parts::starts_of;
pub use shards::{Shards, local_index};
pub use strided::Strided;
pub use threads::Threads;
pub use watchdog::{GRACE, Peer, TICK, Watched};

/// Collective operations over the `size()` ranks of one job.
///
/// Every rank must make the same sequence of calls with compatible arguments (same lengths for
/// reductions, same `counts` for gathers, same `root` for broadcasts), as in MPI. Arguments are
/// validated before any communication; a call that fails validation communicates nothing.
pub trait Collective {
    /// This process's rank, in `0..size()`.
    fn rank(&self) -> usize;

    /// Number of ranks in the job (1 for [`Local`]).
    fn size(&self) -> usize;

    /// Whether this is rank 0, the rank that prints, logs and writes checkpoints.
    fn is_root(&self) -> bool {
        self.rank() == 0
    }

    /// Element-wise sum over all ranks, in place.
    fn allreduce_sum_f64(&self, buf: &mut [f64]) -> Result<(), DistError>;

    /// Element-wise sum over all ranks, in place (e.g. `dL/dphi` of a class-sharded layer).
    fn allreduce_sum_f32(&self, buf: &mut [f32]) -> Result<(), DistError>;

    /// Element-wise sum over all ranks, in place (counts: samples, correct predictions).
    fn allreduce_sum_u64(&self, buf: &mut [u64]) -> Result<(), DistError>;

    /// Element-wise maximum over all ranks, in place. NaN handling is the MPI library's (Open MPI
    /// compares with `>`, so a NaN may or may not win): check for NaN before reducing.
    fn allreduce_max_f32(&self, buf: &mut [f32]) -> Result<(), DistError>;

    /// Element-wise maximum over all ranks, in place. Same NaN caveat as
    /// [`allreduce_max_f32`](Collective::allreduce_max_f32).
    fn allreduce_max_f64(&self, buf: &mut [f64]) -> Result<(), DistError>;

    /// Concatenate every rank's `send` into `out`, in rank order: rank `r` contributes
    /// `counts[r]` elements, so `counts.len() == size()`, `send.len() == counts[rank()]` and
    /// `out.len() == counts.iter().sum()`, or nothing is communicated and an error is returned.
    fn allgatherv_f32(&self, send: &[f32], counts: &[usize], out: &mut [f32]) -> Result<(), DistError>;

    /// [`allgatherv_f32`](Collective::allgatherv_f32) for `u32` (class ids of a merged top-Q).
    fn allgatherv_u32(&self, send: &[u32], counts: &[usize], out: &mut [u32]) -> Result<(), DistError>;

    /// Personalised exchange: rank `r` sends `send[..counts[0]]` to rank 0, the next
    /// `counts[1]` elements to rank 1, and so on (`counts.len() == size()`,
    /// `send.len() == counts.iter().sum()`); `out` becomes what every rank sent this one, in rank
    /// order, and `out_counts[r]` how many came from rank `r`. The counts travel first (the
    /// receiver need not know them), so a rank may send each other rank a different amount.
    /// Routes each sample's data to the one rank that works on it (the search hits of a
    /// class-sharded layer) instead of gathering everything everywhere.
    fn alltoallv_u32(
        &self,
        send: &[u32],
        counts: &[usize],
        out: &mut Vec<u32>,
        out_counts: &mut Vec<usize>,
    ) -> Result<(), DistError>;

    /// Replace `buf` on every rank by the bytes `buf` holds on `root`; the length travels too,
    /// so the other ranks may pass any vector (e.g. an empty one).
    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<(), DistError>;

    /// Block until every rank has called `barrier`.
    fn barrier(&self) -> Result<(), DistError>;

    /// Equal-count gather: every rank contributes `send.len()` elements, so
    /// `out.len() == size() * send.len()`.
    fn allgather_f32(&self, send: &[f32], out: &mut [f32]) -> Result<(), DistError> {
        let counts = vec![send.len(); self.size()];
        self.allgatherv_f32(send, &counts, out)
    }

    /// Equal-count gather of `u32`; see [`allgather_f32`](Collective::allgather_f32).
    fn allgather_u32(&self, send: &[u32], out: &mut [u32]) -> Result<(), DistError> {
        let counts = vec![send.len(); self.size()];
        self.allgatherv_u32(send, &counts, out)
    }
}

/// Checks the arguments of an allgatherv on `rank` of `size` ranks; shared by the
/// implementations so that every one rejects the same calls.
pub(crate) fn check_gatherv(
    rank: usize,
    size: usize,
    send_len: usize,
    counts: &[usize],
    out_len: usize,
) -> Result<(), DistError> {
    if counts.len() != size {
        return Err(DistError::CountsLength { got: counts.len(), size });
    }
    if send_len != counts[rank] {
        return Err(DistError::SendLength { rank, send: send_len, count: counts[rank] });
    }
    let total = counts.iter().try_fold(0usize, |acc, &c| acc.checked_add(c));
    match total {
        Some(total) if total == out_len => Ok(()),
        Some(total) => Err(DistError::OutLength { out: out_len, total }),
        None => Err(DistError::TooLarge { len: usize::MAX }),
    }
}

/// Checks the arguments of an alltoallv on `size` ranks (see [`Collective::alltoallv_u32`]).
pub(crate) fn check_alltoallv(size: usize, send_len: usize, counts: &[usize]) -> Result<(), DistError> {
    if counts.len() != size {
        return Err(DistError::CountsLength { got: counts.len(), size });
    }
    match counts.iter().try_fold(0usize, |acc, &c| acc.checked_add(c)) {
        Some(total) if total == send_len => Ok(()),
        Some(total) => Err(DistError::OutLength { out: send_len, total }),
        None => Err(DistError::TooLarge { len: usize::MAX }),
    }
}

/// Checks a broadcast root against the number of ranks.
pub(crate) fn check_root(root: usize, size: usize) -> Result<(), DistError> {
    if root < size { Ok(()) } else { Err(DistError::BadRoot { root, size }) }
}
