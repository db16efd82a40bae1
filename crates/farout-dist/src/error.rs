//! Errors of the communication layer.

/// What can go wrong in farout-dist. Argument errors are detected before any communication.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DistError {
    /// An allgatherv got a `counts` slice whose length is not the number of ranks.
    #[error("allgatherv: {got} counts given for {size} ranks")]
    CountsLength {
        /// Length of `counts`.
        got: usize,
        /// Number of ranks.
        size: usize,
    },
    /// An allgatherv got a send buffer whose length is not this rank's count.
    #[error("allgatherv: rank {rank} sends {send} elements but counts[{rank}] = {count}")]
    SendLength {
        /// This rank.
        rank: usize,
        /// Length of the send buffer.
        send: usize,
        /// `counts[rank]`.
        count: usize,
    },
    /// An allgatherv got an output buffer whose length is not the sum of the counts.
    #[error("allgatherv: output holds {out} elements but the counts sum to {total}")]
    OutLength {
        /// Length of the output buffer.
        out: usize,
        /// Sum of `counts`.
        total: usize,
    },
    /// A broadcast root outside `0..size`.
    #[error("broadcast root {root} is not a rank of a {size}-rank job")]
    BadRoot {
        /// The root asked for.
        root: usize,
        /// Number of ranks.
        size: usize,
    },
    /// A buffer, count or displacement beyond what MPI's `int` counts can address.
    #[error("{len} elements exceed MPI's count limit (i32::MAX)")]
    TooLarge {
        /// The offending length.
        len: usize,
    },
    /// A shard layout that cannot be built (zero ranks, bounds not increasing, ...).
    #[error("shards: {0}")]
    Shards(String),
    /// A launcher variable (`OMPI_COMM_WORLD_SIZE`, ...) that is not a sensible number.
    #[error("environment variable {var}={value:?} is not a valid {what}")]
    BadEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it should have been.
        what: &'static str,
    },
    /// Launched by an MPI launcher with several ranks, but built without MPI.
    #[error(
        "launched by mpirun with {size} ranks ({var}={size}), but farout was built without the \
         mpi feature; rebuild with --features mpi (needs libopenmpi-dev and libclang-dev), or \
         run without mpirun"
    )]
    NoMpiFeature {
        /// Number of ranks the launcher started.
        size: usize,
        /// The variable that told.
        var: &'static str,
    },
    /// MPI could not be initialised (already initialised, or too little thread support).
    #[error("MPI initialisation failed: {0}")]
    Init(String),
    /// MPI and the launcher disagree (e.g. the world size is not what mpirun announced).
    #[error("MPI: {0}")]
    Mpi(String),
}
