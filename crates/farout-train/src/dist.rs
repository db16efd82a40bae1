//! Running one job as several MPI ranks: agreeing on failures and on the config.
//!
//! Every rank runs the same program on the same config; collectives must be reached by all of
//! them. A rank that fails alone (a file it cannot read, a directory it cannot write) would
//! leave the others waiting in their next collective, so each step that can fail on one rank
//! ends in [`agree`]: an allgather of one flag per rank, after which every rank knows who
//! failed and returns an error. The failing rank keeps its own message; the others name it.
//! With one process ([`farout_dist::Local`]) both functions cost nothing and change nothing.

use crate::{Config, Error};
use farout_core::Matrix;
use farout_dist::Collective;
use farout_models::DocGrads;

/// Whether any rank's `result` is an error: on every rank, `Ok` only if no rank failed.
/// When every rank failed, each returns its own error; otherwise a failing rank returns its
/// error wrapped with the list of failed ranks, and the other ranks [`Error::OtherRanks`].
pub fn agree<T>(comm: &dyn Collective, result: Result<T, Error>) -> Result<T, Error> {
    if comm.size() == 1 {
        return result;
    }
    let mut flags = vec![0u32; comm.size()];
    comm.allgather_u32(&[u32::from(result.is_err())], &mut flags)?;
    let failed: Vec<usize> = (0..comm.size()).filter(|&r| flags[r] != 0).collect();
    match result {
        Ok(v) if failed.is_empty() => Ok(v),
        Ok(_) => Err(Error::OtherRanks { failed, own: None }),
        // Every rank failed the same step: its error, which rank 0 prints.
        Err(e) if failed.len() == comm.size() => Err(e),
        Err(e) => Err(Error::OtherRanks { failed, own: Some(Box::new(e)) }),
    }
}

/// Checks that every rank loaded the same config (the same file, the same `--set` overrides):
/// rank 0 broadcasts a hash of its config, and any rank whose config differs makes every rank
/// return [`Error::ConfigMismatch`].
pub fn check_same_config(comm: &dyn Collective, config: &Config) -> Result<(), Error> {
    if comm.size() == 1 {
        return Ok(());
    }
    let json = serde_json::to_string(config).expect("configs serialise");
    let mine = crc32fast::hash(json.as_bytes());
    let mut root = mine.to_le_bytes().to_vec();
    comm.broadcast_bytes(0, &mut root)?;
    let differs = root.as_slice() != mine.to_le_bytes();
    let mut flags = vec![0u32; comm.size()];
    comm.allgather_u32(&[u32::from(differs)], &mut flags)?;
    let ranks: Vec<usize> = (0..comm.size()).filter(|&r| flags[r] != 0).collect();
    if ranks.is_empty() { Ok(()) } else { Err(Error::ConfigMismatch { ranks }) }
}

/// The sum over the ranks of every rank's encoder gradients `grads`, on every rank: the union
/// of the table rows the ranks' batches used (ids and rows gathered), and the bias gradients
/// summed.
pub fn sum_doc_grads(comm: &dyn Collective, grads: DocGrads) -> Result<DocGrads, Error> {
    if comm.size() == 1 {
        return Ok(grads);
    }
    let d = grads.bias.len();
    let mut n = vec![0u32; comm.size()];
    comm.allgather_u32(&[grads.features.len() as u32], &mut n)?;
    let counts: Vec<usize> = n.iter().map(|&c| c as usize).collect();
    let mut features = vec![0u32; counts.iter().sum()];
    comm.allgatherv_u32(&grads.features, &counts, &mut features)?;
    let row_counts: Vec<usize> = counts.iter().map(|c| c * d).collect();
    let mut rows = vec![0f32; features.len() * d];
    comm.allgatherv_f32(grads.rows.as_slice(), &row_counts, &mut rows)?;
    let mut bias = grads.bias;
    comm.allreduce_sum_f32(&mut bias)?;
    let mut at = 0;
    let parts: Vec<DocGrads> = counts
        .iter()
        .map(|&c| {
            let part = DocGrads {
                features: features[at..at + c].to_vec(),
                rows: Matrix::from_vec(c, d, rows[at * d..(at + c) * d].to_vec()).expect("c rows of d"),
                bias: vec![0.0; d],
            };
            at += c;
            part
        })
        .collect();
    Ok(DocGrads { bias, ..DocGrads::add(&parts) })
}

/// Every rank's `bytes`, in rank order, on every rank (one broadcast per rank: for small
/// records such as per-rank statistics, not for bulk data).
pub fn allgather_bytes(comm: &dyn Collective, bytes: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
    (0..comm.size())
        .map(|root| {
            let mut buf = if root == comm.rank() { bytes.to_vec() } else { Vec::new() };
            comm.broadcast_bytes(root, &mut buf)?;
            Ok(buf)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use farout_dist::Local;

    #[test]
    fn one_process_passes_results_through() {
        assert_eq!(agree(&Local, Ok::<_, Error>(3)).unwrap(), 3);
        let e = agree::<()>(&Local, Err(Error::NoData("x"))).unwrap_err();
        assert!(matches!(e, Error::NoData("x")), "{e:?}");
        assert_eq!(allgather_bytes(&Local, b"abc").unwrap(), vec![b"abc".to_vec()]);
        check_same_config(
            &Local,
            &Config::parse("[data]\nformat = \"synthetic_xmc\"\n[linear]\nsolver = \"dismec\"\n", &[]).unwrap(),
        )
        .unwrap();
    }
}
