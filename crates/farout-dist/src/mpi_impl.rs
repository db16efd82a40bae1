//! The MPI implementation (rsmpi over the system MPI library), behind the `mpi` feature.

use std::cell::RefCell;

use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::datatype::{Equivalence, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};

use crate::{Collective, DistError, check_alltoallv, check_gatherv, check_root};

/// Collectives over `MPI_COMM_WORLD`. It owns the MPI universe: dropping it calls
/// `MPI_Finalize`, after which MPI cannot be initialised again in this process, so create it
/// once (with [`init`]) near the top of `main` and keep it alive until the end.
///
/// Neither `Send` nor `Sync`: MPI is initialised with `MPI_THREAD_FUNNELED`, which allows MPI
/// calls only from the initialising thread, and the compiler now enforces that.
pub struct MpiCollective {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    threading: Threading,
    // Reductions have no in-place form in rsmpi 0.8: the input is copied here first. One buffer
    // per element type, reused across calls (no allocation once warm).
    scratch_f32: RefCell<Vec<f32>>,
    scratch_f64: RefCell<Vec<f64>>,
    scratch_u64: RefCell<Vec<u64>>,
    // Declared last so that it is dropped last: finalises MPI.
    _universe: Universe,
}

impl std::fmt::Debug for MpiCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiCollective")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("threading", &self.threading)
            .finish_non_exhaustive()
    }
}

/// Initialises MPI (`MPI_Init_thread` with `MPI_THREAD_FUNNELED`) and returns the collective
/// over all ranks, which owns the MPI universe (see [`MpiCollective`]).
///
/// Errors if MPI was already initialised in this process, or if the library cannot give
/// `MPI_THREAD_FUNNELED` (farout computes on rayon threads while the main thread communicates).
/// A process that was not started by `mpirun` becomes a one-rank "singleton" job. Note that MPI
/// libraries handle a failure *inside* `MPI_Init` by aborting the process with their own
/// message; that cannot be turned into an error here.
pub fn init() -> Result<MpiCollective, DistError> {
    let (universe, threading) = mpi::initialize_with_threading(Threading::Funneled).ok_or_else(|| {
        DistError::Init(
            "MPI is already initialised in this process (farout_dist::init may be called \
                 only once)"
                .into(),
        )
    })?;
    if threading == Threading::Single {
        return Err(DistError::Init(
            "the MPI library provides only MPI_THREAD_SINGLE; farout needs MPI_THREAD_FUNNELED".into(),
        ));
    }
    let world = universe.world();
    let rank = usize::try_from(world.rank()).map_err(|_| DistError::Mpi("negative rank".into()))?;
    let size = usize::try_from(world.size()).map_err(|_| DistError::Mpi("negative size".into()))?;
    Ok(MpiCollective {
        world,
        rank,
        size,
        threading,
        scratch_f32: RefCell::default(),
        scratch_f64: RefCell::default(),
        scratch_u64: RefCell::default(),
        _universe: universe,
    })
}

impl MpiCollective {
    /// The MPI library's own version string (e.g. "Open MPI v4.1.4, ..."), for logs.
    pub fn library_version(&self) -> String {
        mpi::environment::library_version().unwrap_or_else(|e| format!("(unreadable: {e})"))
    }

    /// The thread support level the library granted (Funneled or better).
    pub fn threading(&self) -> Threading {
        self.threading
    }

    /// The underlying world communicator, for operations the trait does not cover.
    pub fn world(&self) -> &SimpleCommunicator {
        &self.world
    }

    fn reduce<T: Equivalence + Copy>(
        &self,
        scratch: &RefCell<Vec<T>>,
        buf: &mut [T],
        op: SystemOperation,
    ) -> Result<(), DistError> {
        mpi_count(buf.len())?;
        if buf.is_empty() {
            // Same length on every rank by contract, so every rank skips (see `broadcast_bytes`).
            return Ok(());
        }
        let mut send = scratch.borrow_mut();
        send.clear();
        send.extend_from_slice(buf);
        self.world.all_reduce_into(&send[..], buf, op);
        Ok(())
    }

    fn gatherv<T: Equivalence>(&self, send: &[T], counts: &[usize], out: &mut [T]) -> Result<(), DistError> {
        check_gatherv(self.rank, self.size, send.len(), counts, out.len())?;
        // Checked on every rank alike before any communication: the counts are the same
        // everywhere, so either every rank fails here or none does.
        mpi_count(out.len())?;
        if out.is_empty() {
            // All counts are 0 (on every rank: they are the same everywhere): nothing to send.
            return Ok(());
        }
        let counts: Vec<mpi::Count> = counts.iter().map(|&c| mpi_count(c)).collect::<Result<_, _>>()?;
        // Cannot overflow: the total fits (checked above).
        let displs = crate::starts_of(&counts);
        let mut partition = PartitionMut::new(out, &counts[..], &displs[..]);
        self.world.all_gather_varcount_into(send, &mut partition);
        Ok(())
    }
}

fn mpi_count(len: usize) -> Result<mpi::Count, DistError> {
    mpi::Count::try_from(len).map_err(|_| DistError::TooLarge { len })
}

impl Collective for MpiCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn allreduce_sum_f64(&self, buf: &mut [f64]) -> Result<(), DistError> {
        self.reduce(&self.scratch_f64, buf, SystemOperation::sum())
    }

    fn allreduce_sum_f32(&self, buf: &mut [f32]) -> Result<(), DistError> {
        self.reduce(&self.scratch_f32, buf, SystemOperation::sum())
    }

    fn allreduce_sum_u64(&self, buf: &mut [u64]) -> Result<(), DistError> {
        self.reduce(&self.scratch_u64, buf, SystemOperation::sum())
    }

    fn allreduce_max_f32(&self, buf: &mut [f32]) -> Result<(), DistError> {
        self.reduce(&self.scratch_f32, buf, SystemOperation::max())
    }

    fn allreduce_max_f64(&self, buf: &mut [f64]) -> Result<(), DistError> {
        self.reduce(&self.scratch_f64, buf, SystemOperation::max())
    }

    fn allgatherv_f32(&self, send: &[f32], counts: &[usize], out: &mut [f32]) -> Result<(), DistError> {
        self.gatherv(send, counts, out)
    }

    fn allgatherv_u32(&self, send: &[u32], counts: &[usize], out: &mut [u32]) -> Result<(), DistError> {
        self.gatherv(send, counts, out)
    }

    fn alltoallv_u32(
        &self,
        send: &[u32],
        counts: &[usize],
        out: &mut Vec<u32>,
        out_counts: &mut Vec<usize>,
    ) -> Result<(), DistError> {
        check_alltoallv(self.size, send.len(), counts)?;
        let counts: Vec<mpi::Count> = counts.iter().map(|&c| mpi_count(c)).collect::<Result<_, _>>()?;
        // The counts first: each rank learns how much every other sends it.
        let mut got: Vec<mpi::Count> = vec![0; self.size];
        self.world.all_to_all_into(&counts[..], &mut got[..]);
        let total = got.iter().try_fold(0usize, |acc, &c| acc.checked_add(c as usize));
        let total = total.ok_or(DistError::TooLarge { len: usize::MAX })?;
        mpi_count(total)?;
        // An empty Vec's dangling pointer is Open MPI's MPI_IN_PLACE (see `broadcast_bytes`):
        // empty buffers are passed as one unused element.
        let one = [0u32];
        let send = if send.is_empty() { &one[..] } else { send };
        out.clear();
        out.resize(total.max(1), 0);
        out_counts.clear();
        out_counts.extend(got.iter().map(|&c| c as usize));
        // The displacements fit: the totals do (checked above and by check_alltoallv).
        let (send_displs, got_displs) = (crate::starts_of(&counts), crate::starts_of(&got));
        let send_part = mpi::datatype::Partition::new(send, &counts[..], &send_displs[..]);
        let mut got_part = PartitionMut::new(&mut out[..], &got[..], &got_displs[..]);
        self.world.all_to_all_varcount_into(&send_part, &mut got_part);
        out.truncate(total);
        Ok(())
    }

    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<(), DistError> {
        check_root(root, self.size)?;
        let root_process = self.world.process_at_rank(mpi_count(root)?);
        // The length first, so the receivers can size their buffers and every rank sees the same
        // length (and so the same error, if it is too large for MPI).
        let mut len = [buf.len() as u64];
        root_process.broadcast_into(&mut len[..]);
        let len = usize::try_from(len[0]).map_err(|_| DistError::TooLarge { len: usize::MAX })?;
        mpi_count(len)?;
        if self.rank != root {
            buf.clear();
            buf.resize(len, 0);
        }
        if len == 0 {
            // Every rank knows the length: skip the data. Calling MPI with an empty `Vec<u8>`
            // would pass Rust's dangling pointer 0x1, which is Open MPI's MPI_IN_PLACE, and
            // MPI_Bcast rejects it (MPI_ERR_ARG, fatal).
            return Ok(());
        }
        root_process.broadcast_into(&mut buf[..]);
        Ok(())
    }

    fn barrier(&self) -> Result<(), DistError> {
        self.world.barrier();
        Ok(())
    }
}
