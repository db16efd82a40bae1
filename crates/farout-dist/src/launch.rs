//! Was this process started by an MPI launcher? Answered from the environment, without MPI.

use crate::{Collective, DistError, Local};

/// What an MPI launcher told this process through its environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// Number of ranks the launcher started.
    pub size: usize,
    /// This process's rank.
    pub rank: usize,
    /// The variable that gave the size (`OMPI_COMM_WORLD_SIZE` or `PMI_SIZE`).
    pub var: &'static str,
}

/// (size variable, rank variable) pairs, in the order they are trusted: Open MPI's `mpirun`
/// sets the first pair; MPICH's and Intel MPI's Hydra (and Slurm's PMI-2) set the second.
const LAUNCHERS: [(&str, &str); 2] = [("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"), ("PMI_SIZE", "PMI_RANK")];

/// Whether this process was started by an MPI launcher (`mpirun`, `mpiexec`), from the
/// variables the launcher exports; links and calls no MPI, so the default build can use it.
/// `Ok(None)` outside a launcher; an error if the variables are there but malformed.
pub fn detect() -> Result<Option<Launch>, DistError> {
    detect_from(|var| std::env::var(var).ok())
}

/// [`detect`] with the environment given as a lookup function (for tests, and for callers that
/// captured the environment elsewhere).
pub fn detect_from(get: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>, DistError> {
    for (size_var, rank_var) in LAUNCHERS {
        let Some(size) = get(size_var) else { continue };
        let size = parse(size_var, &size, "rank count (a positive integer)")?;
        if size == 0 {
            return Err(DistError::BadEnv {
                var: size_var,
                value: "0".into(),
                what: "rank count (a positive integer)",
            });
        }
        let rank = match get(rank_var) {
            Some(rank) => parse(rank_var, &rank, "rank (an integer below the rank count)")?,
            None => {
                return Err(DistError::BadEnv {
                    var: rank_var,
                    value: String::new(),
                    what: "rank (it is unset while the rank count is set)",
                });
            }
        };
        if rank >= size {
            return Err(DistError::BadEnv {
                var: rank_var,
                value: rank.to_string(),
                what: "rank (an integer below the rank count)",
            });
        }
        return Ok(Some(Launch { size, rank, var: size_var }));
    }
    Ok(None)
}

fn parse(var: &'static str, value: &str, what: &'static str) -> Result<usize, DistError> {
    value.trim().parse().map_err(|_| DistError::BadEnv { var, value: value.to_owned(), what })
}

/// The collective a program should use, decided by how it was launched:
///
/// - not under a launcher, or under `mpirun -np 1`: [`Local`];
/// - under a launcher with more than one rank, built with the `mpi` feature: MPI is initialised
///   (the returned box owns it: MPI is finalised when the box is dropped, so keep it alive until
///   the end of `main`), and watched ([`crate::Watched`]: a rank that dies does not leave the
///   others waiting);
/// - the same, built without the feature: [`DistError::NoMpiFeature`], whose message says to
///   rebuild with `--features mpi`. Every rank fails the same way, so nothing hangs.
pub fn connect() -> Result<Box<dyn Collective>, DistError> {
    connect_to(detect()?)
}

pub(crate) fn connect_to(launch: Option<Launch>) -> Result<Box<dyn Collective>, DistError> {
    match launch {
        None | Some(Launch { size: 1, .. }) => Ok(Box::new(Local)),
        Some(launch) => connect_mpi(launch),
    }
}

#[cfg(feature = "mpi")]
fn connect_mpi(launch: Launch) -> Result<Box<dyn Collective>, DistError> {
    let mpi = crate::init()?;
    if mpi.size() != launch.size || mpi.rank() != launch.rank {
        return Err(DistError::Mpi(format!(
            "the launcher announced rank {} of {} ({}), MPI says rank {} of {}",
            launch.rank,
            launch.size,
            launch.var,
            mpi.rank(),
            mpi.size()
        )));
    }
    // A rank that dies must not leave the others waiting forever (see `Watched`).
    Ok(Box::new(crate::Watched::new(mpi)?))
}

#[cfg(not(feature = "mpi"))]
fn connect_mpi(launch: Launch) -> Result<Box<dyn Collective>, DistError> {
    Err(DistError::NoMpiFeature { size: launch.size, var: launch.var })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn no_launcher() {
        assert_eq!(detect_from(env(&[])), Ok(None));
        assert_eq!(detect_from(env(&[("PATH", "/bin")])), Ok(None));
    }

    #[test]
    fn open_mpi_and_hydra() {
        let ompi = env(&[("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_RANK", "3")]);
        assert_eq!(detect_from(ompi), Ok(Some(Launch { size: 4, rank: 3, var: "OMPI_COMM_WORLD_SIZE" })));
        let hydra = env(&[("PMI_SIZE", "2"), ("PMI_RANK", "0")]);
        assert_eq!(detect_from(hydra), Ok(Some(Launch { size: 2, rank: 0, var: "PMI_SIZE" })));
        // Open MPI's variables win when both are present.
        let both =
            env(&[("PMI_SIZE", "8"), ("PMI_RANK", "5"), ("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_RANK", "1")]);
        assert_eq!(detect_from(both).unwrap().unwrap().size, 2);
    }

    #[test]
    fn malformed_variables_are_errors() {
        for bad in [
            env(&[("OMPI_COMM_WORLD_SIZE", "four"), ("OMPI_COMM_WORLD_RANK", "0")]),
            env(&[("OMPI_COMM_WORLD_SIZE", "0"), ("OMPI_COMM_WORLD_RANK", "0")]),
            env(&[("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_RANK", "2")]),
            env(&[("OMPI_COMM_WORLD_SIZE", "2")]),
            env(&[("PMI_SIZE", "-1"), ("PMI_RANK", "0")]),
        ] {
            let err = detect_from(bad).unwrap_err();
            assert!(matches!(err, DistError::BadEnv { .. }), "{err:?}");
        }
    }

    #[test]
    fn single_rank_launch_is_local() {
        let c = connect_to(Some(Launch { size: 1, rank: 0, var: "PMI_SIZE" })).unwrap();
        assert_eq!((c.rank(), c.size()), (0, 1));
        let c = connect_to(None).unwrap();
        assert_eq!((c.rank(), c.size()), (0, 1));
    }

    /// `cargo test` is not run under mpirun, so this is the single-process path; run by hand as
    /// `mpirun -np 2 <test binary> connect_follows` to see the launched path.
    #[test]
    fn connect_follows_the_environment() {
        match detect().unwrap() {
            None | Some(Launch { size: 1, .. }) => {
                let c = connect().unwrap();
                assert_eq!((c.rank(), c.size()), (0, 1));
            }
            Some(launch) if cfg!(feature = "mpi") => {
                let c = connect().unwrap();
                assert_eq!((c.rank(), c.size()), (launch.rank, launch.size));
            }
            Some(_) => {
                let msg = connect().err().unwrap().to_string();
                assert!(msg.contains("rebuild with --features mpi"), "{msg}");
            }
        }
    }

    #[cfg(not(feature = "mpi"))]
    #[test]
    fn several_ranks_without_the_feature_is_a_clear_error() {
        let launch = Launch { size: 4, rank: 2, var: "OMPI_COMM_WORLD_SIZE" };
        let err = connect_to(Some(launch)).err().unwrap();
        assert_eq!(err, DistError::NoMpiFeature { size: 4, var: "OMPI_COMM_WORLD_SIZE" });
        let msg = err.to_string();
        assert!(msg.contains("built without the mpi feature; rebuild with --features mpi"), "{msg}");
        assert!(msg.contains("4 ranks"), "{msg}");
    }
}
