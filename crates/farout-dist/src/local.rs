//! The single-process implementation.

use crate::{Collective, DistError, check_alltoallv, check_gatherv, check_root};

/// One rank: every reduction is the identity, a gather copies `send` to `out`, a broadcast
/// leaves the bytes as they are. It validates arguments exactly like the MPI implementation, so
/// a call that is wrong under `mpirun` is already wrong in a unit test.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Local;

impl Collective for Local {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn allreduce_sum_f64(&self, _buf: &mut [f64]) -> Result<(), DistError> {
        Ok(())
    }

    fn allreduce_sum_f32(&self, _buf: &mut [f32]) -> Result<(), DistError> {
        Ok(())
    }

    fn allreduce_sum_u64(&self, _buf: &mut [u64]) -> Result<(), DistError> {
        Ok(())
    }

    fn allreduce_max_f32(&self, _buf: &mut [f32]) -> Result<(), DistError> {
        Ok(())
    }

    fn allreduce_max_f64(&self, _buf: &mut [f64]) -> Result<(), DistError> {
        Ok(())
    }

    fn allgatherv_f32(&self, send: &[f32], counts: &[usize], out: &mut [f32]) -> Result<(), DistError> {
        check_gatherv(0, 1, send.len(), counts, out.len())?;
        out.copy_from_slice(send);
        Ok(())
    }

    fn allgatherv_u32(&self, send: &[u32], counts: &[usize], out: &mut [u32]) -> Result<(), DistError> {
        check_gatherv(0, 1, send.len(), counts, out.len())?;
        out.copy_from_slice(send);
        Ok(())
    }

    fn alltoallv_u32(
        &self,
        send: &[u32],
        counts: &[usize],
        out: &mut Vec<u32>,
        out_counts: &mut Vec<usize>,
    ) -> Result<(), DistError> {
        check_alltoallv(1, send.len(), counts)?;
        out.clear();
        out.extend_from_slice(send);
        out_counts.clear();
        out_counts.push(send.len());
        Ok(())
    }

    fn broadcast_bytes(&self, root: usize, _buf: &mut Vec<u8>) -> Result<(), DistError> {
        check_root(root, 1)
    }

    fn barrier(&self) -> Result<(), DistError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Shards;

    #[test]
    fn rank_and_size() {
        assert_eq!(Local.rank(), 0);
        assert_eq!(Local.size(), 1);
        assert!(Local.is_root());
        Local.barrier().unwrap();
    }

    #[test]
    fn reductions_are_identities() {
        let mut a = [1.5f64, -2.0, f64::NEG_INFINITY];
        Local.allreduce_sum_f64(&mut a).unwrap();
        assert_eq!(a, [1.5, -2.0, f64::NEG_INFINITY]);
        Local.allreduce_max_f64(&mut a).unwrap();
        assert_eq!(a, [1.5, -2.0, f64::NEG_INFINITY]);
        let mut b = [3.0f32, -1.0];
        Local.allreduce_sum_f32(&mut b).unwrap();
        Local.allreduce_max_f32(&mut b).unwrap();
        assert_eq!(b, [3.0, -1.0]);
        let mut c = [7u64, u64::MAX];
        Local.allreduce_sum_u64(&mut c).unwrap();
        assert_eq!(c, [7, u64::MAX]);
        Local.allreduce_sum_f64(&mut []).unwrap();
    }

    #[test]
    fn gathers_copy() {
        let mut out = [0.0f32; 3];
        Local.allgatherv_f32(&[1.0, 2.0, 3.0], &[3], &mut out).unwrap();
        assert_eq!(out, [1.0, 2.0, 3.0]);
        let mut out = [0u32; 2];
        Local.allgatherv_u32(&[4, 5], &[2], &mut out).unwrap();
        assert_eq!(out, [4, 5]);
        let mut out = [0u32; 2];
        Local.allgather_u32(&[6, 7], &mut out).unwrap();
        assert_eq!(out, [6, 7]);
        let mut out = [0.0f32; 0];
        Local.allgather_f32(&[], &mut out).unwrap();
    }

    #[test]
    fn mismatched_gathers_are_errors() {
        let mut out = [0.0f32; 3];
        assert_eq!(
            Local.allgatherv_f32(&[1.0, 2.0, 3.0], &[3, 0], &mut out),
            Err(DistError::CountsLength { got: 2, size: 1 })
        );
        assert_eq!(
            Local.allgatherv_f32(&[1.0, 2.0], &[3], &mut out),
            Err(DistError::SendLength { rank: 0, send: 2, count: 3 })
        );
        let mut short = [0u32; 2];
        assert_eq!(Local.allgatherv_u32(&[1, 2, 3], &[3], &mut short), Err(DistError::OutLength { out: 2, total: 3 }));
        assert_eq!(short, [0, 0], "a rejected call writes nothing");
        assert!(matches!(Local.allgatherv_u32(&[], &[], &mut []), Err(DistError::CountsLength { got: 0, size: 1 })));
    }

    #[test]
    fn broadcast_checks_root() {
        let mut bytes = b"cfg".to_vec();
        Local.broadcast_bytes(0, &mut bytes).unwrap();
        assert_eq!(bytes, b"cfg");
        assert_eq!(Local.broadcast_bytes(1, &mut bytes), Err(DistError::BadRoot { root: 1, size: 1 }));
        let msg = Local.broadcast_bytes(3, &mut bytes).unwrap_err().to_string();
        assert!(msg.contains("root 3"), "{msg}");
    }

    /// The sharded log-sum-exp that the softmax output layer will run: each rank reduces its own
    /// slice of the scores, then two allreduces combine the shards. Over `Local` with one shard it
    /// is the ordinary log-sum-exp.
    fn sharded_logsumexp(c: &dyn Collective, local: &[f32]) -> f64 {
        let mut m = [local.iter().copied().fold(f32::NEG_INFINITY, f32::max)];
        c.allreduce_max_f32(&mut m).unwrap();
        let mut s = [local.iter().map(|&z| (f64::from(z) - f64::from(m[0])).exp()).sum::<f64>()];
        c.allreduce_sum_f64(&mut s).unwrap();
        f64::from(m[0]) + s[0].ln()
    }

    #[test]
    fn the_trait_is_object_safe_and_drives_sharded_code() {
        let scores: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32) * 0.3 - 10.0).collect();
        let exact = {
            let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            m + scores.iter().map(|&z| (z as f64 - m).exp()).sum::<f64>().ln()
        };
        let c: Box<dyn Collective> = Box::new(Local);
        let shards = Shards::even(scores.len(), c.size()).unwrap();
        let got = sharded_logsumexp(&*c, &scores[shards.range(c.rank())]);
        assert!((got - exact).abs() < 1e-9, "{got} vs {exact}");
    }
}
