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
use farout_dist::{Collective, Strided};
use farout_models::{DocEncoder, DocGrads, join_dealt};

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

/// The whole input table of a feature-sharded document encoder and its optimiser state, in
/// feature order, joined from every rank's rows (a collective: every rank of `comm` calls it).
pub fn join_doc_table(comm: &dyn Collective, enc: &DocEncoder) -> Result<(Vec<f32>, Vec<f32>), Error> {
    let (ranks, n, d) = (enc.deal().ranks(), enc.n_features(), enc.d_model());
    let counts: Vec<usize> = Strided::counts(n, ranks).iter().map(|rows| rows * d).collect();
    let join = |part: &[f32]| -> Result<Vec<f32>, Error> {
        let mut parts = vec![0.0; n * d];
        comm.allgatherv_f32(part, &counts, &mut parts)?;
        Ok(join_dealt(&parts, ranks, n, d))
    };
    let table = join(enc.table().as_slice())?;
    // Every rank's optimiser keeps state (AdaGrad) or none (SGD) alike.
    let state = if enc.table_state().is_empty() { Vec::new() } else { join(enc.table_state())? };
    Ok((table, state))
}

/// The sum over the ranks of every rank's encoder gradients `grads`, on every rank: the union
/// of the table rows the ranks' batches used, each row and the bias summed in rank order. Two
/// collectives: the number of rows each rank sends, then one gather of each rank's bias, rows'
/// ids and rows (as `u32`: the floats' bits).
pub fn sum_doc_grads(comm: &dyn Collective, grads: DocGrads) -> Result<DocGrads, Error> {
    if comm.size() == 1 {
        return Ok(grads);
    }
    let d = grads.bias.len();
    let mut n = vec![0u32; comm.size()];
    comm.allgather_u32(&[grads.features.len() as u32], &mut n)?;
    let counts: Vec<usize> = n.iter().map(|&c| d + c as usize * (1 + d)).collect();
    let mut send = Vec::with_capacity(counts[comm.rank()]);
    send.extend(grads.bias.iter().map(|b| b.to_bits()));
    send.extend_from_slice(&grads.features);
    send.extend(grads.rows.as_slice().iter().map(|x| x.to_bits()));
    let mut all = vec![0u32; counts.iter().sum()];
    comm.allgatherv_u32(&send, &counts, &mut all)?;
    let floats = |bits: &[u32]| bits.iter().map(|&b| f32::from_bits(b)).collect::<Vec<f32>>();
    let mut at = 0;
    let parts: Vec<DocGrads> = n
        .iter()
        .map(|&c| {
            let c = c as usize;
            let (bias, ids, rows) = (at..at + d, at + d..at + d + c, at + d + c..at + d + c * (1 + d));
            at = rows.end;
            DocGrads {
                features: all[ids].to_vec(),
                rows: Matrix::from_vec(c, d, floats(&all[rows])).expect("c rows of d"),
                bias: floats(&all[bias]),
            }
        })
        .collect();
    Ok(DocGrads::add(&parts))
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

    /// Rank r's gradients: rows of features r, r + 2 and 7 (shared by every rank), a bias of its own.
    fn rank_grads(r: usize, d: usize) -> DocGrads {
        let features = vec![r as u32, r as u32 + 2, 7];
        let rows = (0..3 * d).map(|i| (r * 100 + i) as f32 * 0.25 - 3.0).collect();
        DocGrads { features, rows: Matrix::from_vec(3, d, rows).unwrap(), bias: vec![r as f32 + 0.5; d] }
    }

    #[test]
    fn the_ranks_encoder_gradients_sum_to_those_of_all_their_rows() {
        let d = 4;
        for ranks in [2, 3] {
            let want = DocGrads::add(&(0..ranks).map(|r| rank_grads(r, d)).collect::<Vec<_>>());
            let got = farout_dist::Threads::run(ranks, |c| sum_doc_grads(c, rank_grads(c.rank(), d)).unwrap());
            for g in &got {
                assert_eq!(g.features, want.features, "{ranks} ranks");
                assert_eq!(g.rows.as_slice(), want.rows.as_slice(), "{ranks} ranks");
                assert_eq!(g.bias, want.bias, "{ranks} ranks");
            }
        }
    }
}
